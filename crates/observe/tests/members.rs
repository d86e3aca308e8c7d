//! The server's view of the run's gossip members: a real Consul 1.20.1
//! server's `/v1/agent/members` and `/v1/health/state/critical`, captured
//! while agent-sim runs of three prefixes were on it
//! (`testdata/vectors/consul/members/`), counted by prefix; and the
//! observer polling a stand-in server on 127.0.0.1 through a run: the
//! baseline's stale members left out, a member that failed counted with its
//! time, the warning given.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use agent_sim_metrics::{Metrics, MetricsSpec};
use agent_sim_observe::members::{GossipWatch, Status, parse_critical, parse_members};
use agent_sim_observe::{Endpoint, ObserveConfig, Observer, RunView, Target, warning_kinds};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

fn vector(path: &str) -> Vec<u8> {
    let dir = agent_sim_testkit::hostile::vectors_dir();
    std::fs::read(dir.join(path)).unwrap()
}

fn watch(prefixes: &[&str]) -> GossipWatch {
    GossipWatch {
        prefixes: prefixes.iter().map(|p| p.to_string()).collect(),
        expect_left: true,
    }
}

fn count(members: &[(String, Status)], s: Status) -> usize {
    members.iter().filter(|(_, x)| *x == s).count()
}

#[test]
fn a_real_servers_members_counted_by_prefix() {
    let body = vector("consul/members/agent-members-1.20.1.json");
    // A run whose agents stopped without leaving, seconds before: 2 of its
    // 10 members already declared failed, the others still alive.
    let mix = parse_members(&body, &watch(&["mbrmix"])).unwrap();
    assert_eq!(mix.len(), 10);
    assert_eq!(
        (count(&mix, Status::Alive), count(&mix, Status::Failed)),
        (8, 2)
    );
    let failed: Vec<&str> = mix
        .iter()
        .filter(|(_, s)| *s == Status::Failed)
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(failed, vec!["mbrmix-2", "mbrmix-5"]);
    // A run that left cleanly; one whose members all failed (3 kept of 20).
    let left = parse_members(&body, &watch(&["mbrleft"])).unwrap();
    assert_eq!((left.len(), count(&left, Status::Left)), (5, 5));
    let gone = parse_members(&body, &watch(&["mbrfail"])).unwrap();
    assert_eq!((gone.len(), count(&gone, Status::Failed)), (3, 3));
    // The server itself (srv201) and a prefix without its dash are not members.
    assert!(
        parse_members(&body, &watch(&["srv", "mbr"]))
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        parse_members(&body, &watch(&["mbrmix", "mbrleft", "mbrfail"]))
            .unwrap()
            .len(),
        18
    );
}

#[test]
fn a_real_servers_critical_serf_health_by_prefix() {
    let body = vector("consul/members/health-state-critical-1.20.1.json");
    // Read a moment after the members: mbrmix-6 had failed since.
    let mut mix = parse_critical(&body, &watch(&["mbrmix"])).unwrap();
    mix.sort();
    assert_eq!(mix, vec!["mbrmix-2", "mbrmix-5", "mbrmix-6"]);
    assert_eq!(
        parse_critical(&body, &watch(&["mbrfail"])).unwrap().len(),
        3
    );
    assert!(
        parse_critical(&body, &watch(&["mbrleft"]))
            .unwrap()
            .is_empty()
    );
}

/// A stand-in Consul HTTP API: metrics always; members and critical
/// checks that change with each poll of theirs (the first is the baseline).
async fn stand_in(polls: Arc<AtomicUsize>, polled: Arc<Notify>) -> std::net::SocketAddr {
    let checks = Arc::new(AtomicUsize::new(0));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let (polls, polled, checks) = (polls.clone(), polled.clone(), checks.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).to_string();
                let path = head.split(' ').nth(1).unwrap_or("/").to_string();
                let members = |states: &[(&str, u8)]| {
                    let items: Vec<String> = states
                        .iter()
                        .map(|(n, st)| format!(r#"{{"Name":"{n}","Tags":{{}},"Status":{st}}}"#))
                        .chain([r#"{"Name":"srv1","Status":1}"#.to_string()])
                        .collect();
                    format!("[{}]", items.join(","))
                };
                let body = if path.starts_with("/v1/agent/members") {
                    let k = polls.fetch_add(1, Ordering::SeqCst);
                    polled.notify_waiters();
                    match k {
                        // An earlier run left r-0 and lost r-5.
                        0 => members(&[("r-0", 3), ("r-5", 4)]),
                        1 => members(&[("r-0", 1), ("r-1", 1), ("r-5", 4)]),
                        2 => members(&[("r-0", 1), ("r-1", 4), ("r-5", 4)]),
                        _ => members(&[("r-0", 3), ("r-1", 3), ("r-5", 4)]),
                    }
                } else if path.starts_with("/v1/health/state/critical") {
                    match checks.fetch_add(1, Ordering::SeqCst) {
                        2 => r#"[{"Node":"r-1","CheckID":"serfHealth","Status":"critical"},
                                 {"Node":"r-5","CheckID":"serfHealth","Status":"critical"}]"#
                            .to_string(),
                        _ => r#"[{"Node":"r-5","CheckID":"serfHealth","Status":"critical"}]"#
                            .to_string(),
                    }
                } else {
                    "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1\n\
                     # TYPE consul_rpc_request counter\nconsul_rpc_request 5\n"
                        .to_string()
                };
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(answer.as_bytes()).await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_observer_polls_the_members_and_warns_of_the_failed() {
    let (polls, polled) = (Arc::new(AtomicUsize::new(0)), Arc::new(Notify::new()));
    let addr = stand_in(polls.clone(), polled.clone()).await;
    let metrics = Metrics::new(
        &MetricsSpec {
            errors: warning_kinds(),
            ..MetricsSpec::default()
        },
        1,
    );
    let view = RunView {
        started: Instant::now(),
        agents: Arc::new(|| 2),
        ramp_done: Arc::new(|| true),
        end: CancellationToken::new(),
    };
    let cfg = ObserveConfig {
        targets: vec![Target::Http(Endpoint::consul(
            &addr.to_string(),
            None,
            None,
        ))],
        every: Duration::from_millis(500),
        extra: Vec::new(),
        gossip: Some(watch(&["r"])),
    };
    let observer = Observer::start(cfg, metrics.clone(), view).await.unwrap();
    // The baseline and two polls during the run, then the end.
    tokio::time::timeout(Duration::from_secs(20), async {
        while polls.load(Ordering::SeqCst) < 3 {
            let woken = polled.notified();
            if polls.load(Ordering::SeqCst) >= 3 {
                break;
            }
            woken.await;
        }
    })
    .await
    .expect("three members polls within 20 s");
    let servers = observer.finish().await;
    let g = servers[0].gossip.as_ref().expect("a gossip part");
    assert_eq!(g.prefixes, vec!["r"]);
    // A tick may have polled once more before the end: the same answer.
    assert!(g.polls >= 4, "{g:?}");
    assert_eq!((g.failed_polls, g.stale), (0, 2));
    let counts: Vec<(u64, u64, u64, u64)> = g
        .samples
        .iter()
        .map(|x| (x.alive, x.left, x.failed, x.critical))
        .collect();
    assert_eq!(counts[..2], [(2, 0, 0, 0), (1, 0, 1, 1)]);
    assert!(counts[2..].iter().all(|c| *c == (0, 2, 0, 0)), "{counts:?}");
    assert_eq!((g.failed_ever, g.critical_ever), (1, 1));
    assert_eq!(g.first_failed_s, Some(g.samples[1].t_s));
    assert_eq!(g.stat("not_left_at_end"), Some(0));
    let words = metrics.warning_sample("gossip_members_failed").unwrap();
    assert!(
        words.starts_with("the server marked 1 members failed (first at "),
        "{words}"
    );
    assert!(metrics.warning_sample("observe_failed").is_none());
}
