//! The embedded server's gossip in a storm, over loopback on paused time:
//! it fires `consul:new-leader` when it serves and again after a restart,
//! where it also gossips itself alive at a higher incarnation; a burst of
//! alive messages past memberlist's handler queue (1,024) is dropped,
//! counted and logged once a second; and `/v1/agent/metrics?format=
//! prometheus` shows its gossip under a real 1.20.1 server's names and
//! types. Each test starts its own backend on `127.0.0.1:0`.
#![cfg(feature = "consul")]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::gossip_member::{Member, VSN};
use agent_sim_gossip::Security;
use agent_sim_gossip::serf::intent;
use agent_sim_gossip::wire::msgs::{Alive, PushPull};
use agent_sim_gossip::wire::read::Reader;
use agent_sim_gossip::wire::{compound, compress_msg, kind};
use agent_sim_server::backend::{Backend, BackendConfig, ConsulAddrs};
use agent_sim_server::consul::{ConsulTargetConfig, SerfConfig, SerfSnapshot};
use agent_sim_server::faults::RestartState;
use agent_sim_testkit::bounded::until;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpStream, UdpSocket};

/// Paused time a test may take to see what it waits for.
const LIMIT: Duration = Duration::from_secs(60);
/// The server's name.
const SERVER: &str = "agent-sim-server";

/// Log lines the server wrote.
type Lines = Arc<Mutex<Vec<String>>>;

/// A backend serving Consul with the serf port on, its log kept.
async fn start(serf: SerfConfig) -> (Backend, Lines) {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let lines = Lines::default();
    let kept = lines.clone();
    Backend::start(BackendConfig {
        consul: Some(ConsulAddrs {
            rpc: any,
            http: any,
            grpc: None,
            cfg: ConsulTargetConfig {
                serf: Some(serf),
                ..ConsulTargetConfig::default()
            },
            state: None,
        }),
        log: Some(Arc::new(move |l| kept.lock().unwrap().push(l))),
        ..BackendConfig::default()
    })
    .await
    .map(|b| (b, lines))
    .unwrap()
}

fn serf_stats(b: &Backend) -> SerfSnapshot {
    b.consul_stats().unwrap().serf
}

/// The leader events a member heard: (Lamport time, payload).
fn leader_events(m: &Member) -> Vec<(u64, String)> {
    let heard = m.heard.lock().unwrap();
    heard
        .iter()
        .filter(|(t, body)| *t == kind::USER && body.first() == Some(&3))
        .filter_map(|(_, body)| {
            let (mut ltime, mut name, mut payload) = (0, "", "");
            Reader::new(&body[1..])
                .fields(|k, r| {
                    match k {
                        "LTime" => ltime = r.uint()?,
                        "Name" => name = r.str()?,
                        "Payload" => payload = r.str()?,
                        _ => r.skip()?,
                    }
                    Ok(())
                })
                .ok()?;
            (name == "consul:new-leader").then(|| (ltime, payload.to_owned()))
        })
        .collect()
}

/// The incarnations of the alive messages about the server a member heard.
fn server_alive(m: &Member) -> Vec<u32> {
    let heard = m.heard.lock().unwrap();
    heard
        .iter()
        .filter(|(t, _)| *t == kind::ALIVE)
        .filter_map(|(_, b)| Alive::decode(b).ok().filter(|a| a.node == SERVER))
        .map(|a| a.incarnation)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn the_leader_s_event_at_start_and_a_return_after_a_restart() {
    let (b, _) = start(SerfConfig::default()).await;
    let serf = b.consul_serf_addr().unwrap();
    let m = Member::start("agent-1", Security::default()).await;
    let answer = m.push_pull(serf, true).await.expect("an answer");
    let pp = PushPull::decode(&answer[1..]).unwrap();
    let before = pp
        .nodes
        .iter()
        .find(|n| n.name == SERVER)
        .unwrap()
        .incarnation;
    // The event fired at start waited in the queue for someone to tell.
    until(LIMIT, "the leader's event gossiped", async || {
        leader_events(&m) == vec![(1, SERVER.to_owned())]
    })
    .await;
    assert_eq!(serf_stats(&b).serf_user_events, 1);

    b.restart(Duration::from_secs(20), RestartState::Keep)
        .await
        .unwrap();
    until(
        LIMIT,
        "the server back at a higher incarnation",
        async || server_alive(&m).iter().any(|i| *i > before),
    )
    .await;
    until(LIMIT, "a new leader's event", async || {
        leader_events(&m).contains(&(2, SERVER.to_owned()))
    })
    .await;
    assert_eq!(serf_stats(&b).serf_user_events, 2);
    b.stop().await;
}

#[tokio::test(start_paused = true)]
async fn failed_probes_stretch_the_next_ones_which_count_as_degraded() {
    let (b, _) = start(SerfConfig::default()).await;
    let m = Member::start("agent-1", Security::default()).await;
    m.push_pull(b.consul_serf_addr().unwrap(), true)
        .await
        .expect("an answer");
    until(LIMIT, "probes answered", async || {
        serf_stats(&b).serf_probes_sent >= 3
    })
    .await;
    assert_eq!(serf_stats(&b).serf_degraded_probes, 0, "all answered");
    m.mute();
    until(LIMIT, "the silent member failed", async || {
        serf_stats(&b).serf_members_failed == 1
    })
    .await;
    // No peer to nack for it: each failed probe raised the score by one.
    let s = serf_stats(&b);
    assert!(s.serf_probes_failed >= 2, "{s:?}");
    assert!(s.serf_degraded_probes >= 1, "{s:?}");
    let text = exposition(&b).await;
    let ours = parse(&text);
    let score = ours.samples["consul_memberlist_health_score{network=\"lan\"}"];
    assert!(score >= 2.0, "{text}");
    b.stop().await;
}

/// One alive message about a new member `i`.
fn alive(i: usize) -> Vec<u8> {
    let name = format!("n{i}");
    let mut out = Vec::new();
    Alive {
        incarnation: 1,
        node: &name,
        addr: &[127, 0, 0, 2],
        port: 9,
        meta: &[],
        vsn: &VSN,
    }
    .encode(&mut out);
    out
}

/// `n` alive messages in one packet: compounds of at most 255 in one
/// compound, compressed.
fn burst(from: usize, n: usize) -> Vec<u8> {
    let msgs: Vec<Vec<u8>> = (from..from + n).map(alive).collect();
    let parts: Vec<Vec<u8>> = msgs
        .chunks(255)
        .map(|c| compound(&c.iter().map(Vec::as_slice).collect::<Vec<_>>()))
        .collect();
    compress_msg(&compound(
        &parts.iter().map(Vec::as_slice).collect::<Vec<_>>(),
    ))
}

#[tokio::test(start_paused = true)]
async fn a_burst_past_the_handler_queue_is_dropped_counted_and_logged() {
    let (b, lines) = start(SerfConfig::default()).await;
    let to = b.consul_serf_addr().unwrap();
    let udp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let from = udp.local_addr().unwrap();
    udp.send_to(&burst(0, 1100), to).await.unwrap();
    until(LIMIT, "the burst handled", async || {
        let s = serf_stats(&b);
        s.serf_msg_alive == 1024 && s.serf_handler_queue_dropped == 76
    })
    .await;
    let warn = format!("[WARN] memberlist: handler queue full, dropping message (4) from={from}");
    assert_eq!(lines.lock().unwrap().clone(), vec![warn.clone()], "once");
    // A second later, a second burst: one more line, with the count held.
    tokio::time::sleep(Duration::from_secs(1)).await;
    udp.send_to(&burst(2000, 1030), to).await.unwrap();
    until(LIMIT, "the second burst handled", async || {
        let s = serf_stats(&b);
        s.serf_msg_alive == 2048 && s.serf_handler_queue_dropped == 82
    })
    .await;
    let second = format!("{warn} (75 more since the last such line)");
    assert_eq!(lines.lock().unwrap().last(), Some(&second));
    b.stop().await;
}

/// `/v1/agent/metrics?format=prometheus` of the backend.
async fn exposition(b: &Backend) -> String {
    let addr = b.consul_addrs().unwrap().1;
    let s = TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get("/v1/agent/metrics?format=prometheus")
        .header("host", addr.to_string())
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

/// Prometheus text read: each family's type, and each sample's value by
/// its series (`name{labels}`).
#[derive(Debug, Default)]
struct Parsed {
    types: BTreeMap<String, String>,
    samples: BTreeMap<String, f64>,
}

fn parse(text: &str) -> Parsed {
    let mut p = Parsed::default();
    for line in text.lines() {
        if let Some(t) = line.strip_prefix("# TYPE ") {
            let (name, kind) = t.split_once(' ').unwrap();
            p.types.insert(name.into(), kind.into());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap();
        let v = match value {
            "NaN" => f64::NAN,
            v => v.parse().unwrap_or_else(|_| panic!("a value: {line}")),
        };
        let family = series.split('{').next().unwrap();
        let base = ["_sum", "_count"]
            .iter()
            .find_map(|s| family.strip_suffix(s))
            .filter(|b| p.types.contains_key(*b))
            .unwrap_or(family);
        assert!(p.types.contains_key(base), "typed before use: {line}");
        p.samples.insert(series.into(), v);
    }
    p
}

#[tokio::test(start_paused = true)]
async fn the_gossip_series_are_a_real_server_s() {
    let (b, _) = start(SerfConfig::default()).await;
    let to = b.consul_serf_addr().unwrap();
    let m = Member::start("agent-1", Security::default()).await;
    m.push_pull(to, true).await.expect("an answer");
    let mut join = Vec::new();
    intent(false, 3, "agent-1", &mut join);
    m.send(to, &join).await;
    until(LIMIT, "the intent handled", async || {
        serf_stats(&b).serf_received_by_type.get("user") == Some(&1)
    })
    .await;
    // Past serf's and memberlist's queue check (30 s).
    tokio::time::sleep(Duration::from_secs(31)).await;
    let ours = parse(&exposition(&b).await);
    let v = |s: &str| {
        ours.samples
            .get(&format!("{s}{{network=\"lan\"}}"))
            .copied()
    };
    assert!(v("consul_memberlist_udp_received") > Some(0.0));
    assert!(v("consul_memberlist_udp_sent") > Some(0.0));
    assert_eq!(v("consul_memberlist_tcp_accept"), Some(1.0));
    assert_eq!(v("consul_memberlist_msg_alive"), Some(1.0));
    assert_eq!(v("consul_memberlist_msg_suspect"), Some(0.0));
    assert_eq!(v("consul_memberlist_msg_dead"), Some(0.0));
    assert_eq!(v("consul_memberlist_degraded_probe"), Some(0.0));
    assert_eq!(v("consul_serf_member_join"), Some(1.0));
    assert_eq!(v("consul_serf_member_failed"), Some(0.0));
    assert_eq!(v("consul_serf_member_left"), Some(0.0));
    assert_eq!(v("consul_serf_events"), Some(1.0));
    assert_eq!(v("consul_serf_events_consul:new_leader"), Some(1.0));
    assert_eq!(v("agent_sim_memberlist_handler_queue_dropped"), Some(0.0));
    assert_eq!(v("consul_serf_msgs_received_count"), Some(1.0));
    assert!(v("consul_serf_msgs_received_sum") > Some(0.0));
    for q in ["Intent", "Event", "Query"] {
        assert_eq!(v(&format!("consul_serf_queue_{q}_count")), Some(1.0), "{q}");
    }
    let quantile = ours
        .samples
        .get("consul_serf_queue_Query{network=\"lan\",quantile=\"0.5\"}");
    assert_eq!(quantile, Some(&0.0));
    // Each family a real 1.20.1 server exports has its type there.
    let real = parse(
        &std::fs::read_to_string(
            agent_sim_testkit::hostile::vectors_dir()
                .join("consul/metrics/server-1.20.1-1000-agents.prom"),
        )
        .unwrap(),
    );
    let mut shared = 0;
    for (family, kind) in &ours.types {
        if let Some(real_kind) = real.types.get(family) {
            assert_eq!(kind, real_kind, "{family}");
            shared += 1;
        }
    }
    assert!(shared >= 8, "{shared} families shared with a real server");
    b.stop().await;
}
