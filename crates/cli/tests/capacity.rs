//! Stepped runs (`--steps`) against a backend that degrades past a size
//! (`--faults ...,past:N`): the search finds exactly the step where it
//! did, names the SLO that failed, and ends the run there. Short steps
//! (1-2 s windows), real sockets, bounded.

use std::time::Duration;

use agent_sim::{Kind, Ramp, RunBuilder};
use agent_sim_metrics::capacity::{CapacitySummary, Limit, StepVerdict};
use agent_sim_server::backend::{Backend, BackendConfig, ConsulAddrs};
use agent_sim_server::consul::ConsulTargetConfig;
use agent_sim_server::sensu::SensuTargetConfig;

use agent_sim_testkit::bounded::{CHILD_LIMIT, OutputWithin};

use crate::common::temp_path;
use crate::faults::{bounded, specs};

fn any() -> std::net::SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

async fn consul_backend(faults: &[&str], grpc: bool) -> Backend {
    Backend::start(BackendConfig {
        consul: Some(ConsulAddrs {
            rpc: any(),
            http: any(),
            grpc: grpc.then(any),
            cfg: ConsulTargetConfig::default(),
            state: None,
        }),
        faults: specs(faults),
        ..BackendConfig::default()
    })
    .await
    .unwrap()
}

/// Steps of `steps` agents, all at once, settled 1 s and held `hold`.
fn stepped(run: RunBuilder, steps: &[u64], hold: &str) -> RunBuilder {
    let steps = steps.to_vec();
    let hold = hold.parse().unwrap();
    run.agents(*steps.last().unwrap())
        .ramp(Ramp::All)
        .args(move |a| {
            a.duration = None;
            a.steps = steps;
            a.step_hold = Some(hold);
            a.step_settle = Some("1s".parse().unwrap());
            a.reconnect_min = Some("50ms".parse().unwrap());
            a.reconnect_max = Some("500ms".parse().unwrap());
        })
}

fn capacity(o: &agent_sim::run::RunOutcome) -> &CapacitySummary {
    o.summary
        .capacity
        .as_ref()
        .expect("a stepped run's capacity")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_events_slowed_once_8_agents_are_held_break_the_step_of_8_on_propagation() {
    bounded(Duration::from_secs(60), async {
        let b = consul_backend(&["consul.frame=delay:1500ms@100%,past:8"], false).await;
        let (rpc, http) = b.consul_addrs().unwrap();
        let run = RunBuilder::new(Kind::Consul)
            .target(rpc.to_string())
            .args(move |a| {
                a.http_target = Some(http.to_string());
                a.upstreams = Some("web".parse().unwrap());
                // A probe's deliveries are recorded as its timeout ends.
                a.probe_every = Some("2s".parse().unwrap());
                a.slos = vec!["propagation.p99 < 1s".parse().unwrap()];
            });
        let o = stepped(run, &[4, 8, 12, 16], "5s").run().await.unwrap();
        b.stop().await;
        let c = capacity(&o);
        let verdicts: Vec<_> = c.steps.iter().map(|s| (s.agents, s.verdict)).collect();
        assert_eq!(
            verdicts,
            [(4, StepVerdict::Held), (8, StepVerdict::Failed)],
            "{}",
            c.table()
        );
        assert_eq!(
            (c.capacity, c.broke_at, c.limit),
            (Some(4), Some(8), Limit::Server)
        );
        let failed = c.steps[1].first_failed().unwrap();
        assert_eq!(failed.slo, "propagation.p99 < 1s");
        assert!(failed.over.unwrap() >= 1.4, "{failed:?}");
        assert!(
            c.answer.contains("broke at 8 agents: propagation.p99 < 1s"),
            "{}",
            c.answer
        );
        // A found knee is a result: the run ended there, exit 0.
        assert_eq!(o.exit_code, 0, "{:?}", o.summary.outcome);
        assert!(o.summary.duration_s < 20.0, "{}", o.summary.duration_s);
        regression_gate(&o.summary);
    })
    .await;
}

/// `report compare A B --threshold`: this run against itself holds (exit
/// 0); against one whose knee came a step earlier it fails (exit 3).
fn regression_gate(a: &agent_sim_metrics::Summary) {
    let dir = temp_path("capacity-gate");
    std::fs::create_dir_all(&dir).unwrap();
    let (pa, pb) = (dir.join("a.json"), dir.join("b.json"));
    a.write(&pa).unwrap();
    // B's first window as slow as A's second: a report re-judges the
    // steps from their windows, so B's knee is a step earlier.
    let mut b = a.clone();
    b.step_windows[0] = a.step_windows[1].clone();
    b.step_windows[0].agents.requested = 4;
    b.write(&pb).unwrap();
    let compare = |x: &std::path::Path, y: &std::path::Path| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_agent-sim"))
            .args(["report", "compare"])
            .arg(x)
            .arg(y)
            .args(["--threshold", "capacity.agents -0%"])
            .args(["--threshold", "errors.total +0"])
            .output_within(CHILD_LIMIT);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, text) = compare(&pa, &pa);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("2 of 2 thresholds held"), "{text}");
    assert!(text.contains("capacity (agents)"), "{text}");
    let (code, text) = compare(&pa, &pb);
    assert_eq!(code, Some(3), "{text}");
    assert!(text.contains("FAIL capacity.agents -0%"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sensu_upgrades_refused_once_6_sessions_are_held_break_the_step_of_9_and_one_more_is_shown()
{
    bounded(Duration::from_secs(60), async {
        let b = Backend::start(BackendConfig {
            sensu: Some((any(), SensuTargetConfig::default())),
            faults: specs(&["sensu.upgrade=503@100%,past:6"]),
            ..BackendConfig::default()
        })
        .await
        .unwrap();
        let run = RunBuilder::new(Kind::Sensu)
            .target(format!("ws://{}/", b.sensu_addr().unwrap()))
            .args(|a| {
                a.keepalive_interval = Some("1s".parse().unwrap());
                a.steps_past = Some(1);
                // Not errors.total: on a loaded box a session the backend
                // still counts can make a reconnect in the held step meet
                // the refusal too (as on a real server at its limit).
                a.slos = vec!["agents.connected == requested".parse().unwrap()];
            });
        let o = stepped(run, &[3, 6, 9, 12, 15], "3s").run().await.unwrap();
        b.stop().await;
        let c = capacity(&o);
        let verdicts: Vec<_> = c.steps.iter().map(|s| (s.agents, s.verdict)).collect();
        use StepVerdict::*;
        assert_eq!(
            verdicts,
            [(3, Held), (6, Held), (9, Failed), (12, Failed)],
            "{}",
            c.table()
        );
        assert_eq!((c.capacity, c.broke_at), (Some(6), Some(9)));
        let broke = &c.steps[2];
        assert_eq!(broke.connected, 6);
        assert_eq!(
            broke.first_failed().unwrap().slo,
            "agents.connected == requested"
        );
        assert_eq!(broke.top_error.as_deref(), Some("upgrade_5xx"), "{broke:?}");
        assert_eq!(o.exit_code, 0, "{:?}", o.summary.outcome);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecar_streams_refused_once_5_are_held_break_the_step_of_8() {
    bounded(Duration::from_secs(60), async {
        let b = consul_backend(&["consul.xds=resource-exhausted@100%,past:5"], true).await;
        let (_, http) = b.consul_addrs().unwrap();
        let grpc = b.consul_grpc_addr().unwrap();
        let run = RunBuilder::new(Kind::ConsulDataplane)
            .target(grpc.to_string())
            .args(move |a| {
                a.http_target = Some(http.to_string());
                a.probe_every = Some("1500ms".parse().unwrap());
                a.slos = vec![
                    "agents.connected == requested".parse().unwrap(),
                    "propagation_xds.p99 < 1s".parse().unwrap(),
                ];
            });
        let o = stepped(run, &[3, 5, 8], "4s").run().await.unwrap();
        b.stop().await;
        let c = capacity(&o);
        let verdicts: Vec<_> = c.steps.iter().map(|s| (s.agents, s.verdict)).collect();
        use StepVerdict::*;
        assert_eq!(
            verdicts,
            [(3, Held), (5, Held), (8, Failed)],
            "{}",
            c.table()
        );
        assert_eq!(
            (c.capacity, c.broke_at, c.limit),
            (Some(5), Some(8), Limit::Server)
        );
        assert!(
            c.slos.contains(&"propagation_xds.p99 < 1s".to_string()),
            "{:?}",
            c.slos
        );
        assert_eq!(c.steps[2].connected, 5, "{}", c.table());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_shards_run_every_step_and_merge_to_the_knee_of_one_process() {
    bounded(Duration::from_secs(90), async {
        let b = consul_backend(&["consul.frame=delay:1500ms@100%,past:8"], false).await;
        let (rpc, http) = b.consul_addrs().unwrap();
        let shard = |i: u64| {
            let run = RunBuilder::new(Kind::Consul)
                .target(rpc.to_string())
                .args(move |a| {
                    a.http_target = Some(http.to_string());
                    a.upstreams = Some("web".parse().unwrap());
                    a.probe_every = Some("2s".parse().unwrap());
                    a.shard = Some(format!("{i}/2").parse().unwrap());
                    a.slos = vec!["propagation.p99 < 1s".parse().unwrap()];
                });
            stepped(run, &[4, 8, 12], "5s").run()
        };
        let (zero, one) = tokio::join!(shard(0), shard(1));
        b.stop().await;
        let parts = [zero.unwrap().summary, one.unwrap().summary];
        // Each shard ran every step: it sees its share alone.
        for p in &parts {
            assert_eq!(
                p.step_windows.len(),
                3,
                "{}",
                p.capacity.as_ref().unwrap().table()
            );
        }
        let merged = agent_sim_metrics::merge::merge_summaries(&parts).unwrap();
        let c = merged.capacity.as_ref().unwrap();
        let verdicts: Vec<_> = c.steps.iter().map(|s| (s.agents, s.verdict)).collect();
        use StepVerdict::*;
        assert_eq!(
            verdicts,
            [(4, Held), (8, Failed), (12, Failed)],
            "{}",
            c.table()
        );
        assert_eq!(
            (c.capacity, c.broke_at, c.limit),
            (Some(4), Some(8), Limit::Server)
        );
        // The merged windows hold both shards' agents.
        assert_eq!(merged.step_windows[1].agents.requested, 8);
        assert_eq!(c.steps[0].connected, 4);
    })
    .await;
}
