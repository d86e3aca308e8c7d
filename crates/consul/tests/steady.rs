//! The guard on what our agents cost a server in steady state, without a
//! real server: 100 gossiping agents that watch nothing (as the real client
//! agents of the comparison) against the embedded server with its serf
//! port set as a `-dev` Consul's (probes and gossip every 100 ms), joined on
//! real time, then twenty minutes of steady state on paused time. What the
//! server counted over the window, per agent and minute, is held within
//! ±25 % of what a real Consul 1.20.1 server counted for 100 real client
//! agents (`testdata/fidelity/consul-1.20.1-steady-100.json`, with the
//! command and the date that produced it): the RPCs by method, the
//! members' push-pulls, the gossip bytes they send, the connections and
//! streams they hold, and no member event. A
//! change to the agents' wire that makes the server work harder fails here.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::common::{counter, gossiping, metrics, serf_backend};
use agent_sim_consul::gossip::GossipConfig;
use agent_sim_consul::{ConsulConfig, ConsulFactory};
use agent_sim_fleet::{FleetConfig, FleetStatus};
use agent_sim_gossip::Timings;
use agent_sim_server::backend::Backend;
use agent_sim_server::consul::{ConsulTargetSnapshot, SerfConfig};
use agent_sim_testkit::bounded::until;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

/// What the real server counted, captured once (the file says how).
const BASELINE: &str = include_str!("../../../testdata/fidelity/consul-1.20.1-steady-100.json");

/// The agents of the comparison.
const AGENTS: u64 = 100;
/// After the joins, before the window (the real runs': 45 s).
const WARMUP: Duration = Duration::from_secs(60);
/// The window: long enough for the rare events (a member's push-pull with
/// the server comes about once in 90 s at this size; paused time makes it
/// cheap).
const WINDOW: Duration = Duration::from_secs(1200);
/// How far a rate may be from the real server's.
const TOLERANCE: f64 = 0.25;

#[derive(Debug, Deserialize)]
struct Baseline {
    agents: u64,
    /// Rates per agent and minute, by name (see [`rates`]).
    per_agent_minute: BTreeMap<String, f64>,
    /// Rates of the whole fleet per minute.
    per_minute: BTreeMap<String, f64>,
    /// What is held at the window's end, per agent.
    held_per_agent: BTreeMap<String, f64>,
}

/// The embedded server as a `-dev` Consul: its serf port probes a member
/// and gossips every 100 ms.
async fn dev_server() -> Backend {
    serf_backend(SerfConfig {
        probe_interval: Duration::from_millis(100),
        // Dev's is the interval itself; this server wants room for the
        // indirect probes after it.
        probe_timeout: Duration::from_millis(90),
        gossip_interval: Duration::from_millis(100),
        suspicion_mult: 3,
        ..SerfConfig::default()
    })
    .await
}

/// Agents as the comparison's real ones: one service each, no session, no
/// watch, gossiping with the server.
fn like_real(b: &Backend) -> ConsulConfig {
    ConsulConfig {
        upstreams: Vec::new(),
        session_ttl: None,
        services_per_agent: 1,
        ..gossiping(b, GossipConfig::default())
    }
}

/// The server's counters over the window, in the baseline's names.
fn rates(a: &ConsulTargetSnapshot, b: &ConsulTargetSnapshot) -> Baseline {
    let minutes = WINDOW.as_secs_f64() / 60.0;
    let per_agent = |v: u64| v as f64 / AGENTS as f64 / minutes;
    let call = |s: &ConsulTargetSnapshot, m: &str| s.rpc_calls.get(m).copied().unwrap_or(0);
    let calls = |m: &str| per_agent(call(b, m) - call(a, m));
    let (sa, sb) = (&a.serf, &b.serf);
    let events = (sb.serf_joins + sb.serf_failures + sb.serf_leaves + sb.serf_suspicions)
        - (sa.serf_joins + sa.serf_failures + sa.serf_leaves + sa.serf_suspicions);
    Baseline {
        agents: AGENTS,
        per_agent_minute: BTreeMap::from([
            ("Coordinate.Update".into(), calls("Coordinate.Update")),
            (
                "Catalog.NodeServiceList".into(),
                calls("Catalog.NodeServiceList"),
            ),
            ("Health.NodeChecks".into(), calls("Health.NodeChecks")),
            (
                "gossip_udp_bytes_in".into(),
                per_agent(sb.serf_udp_bytes_received - sa.serf_udp_bytes_received),
            ),
        ]),
        per_minute: BTreeMap::from([
            (
                "member_push_pulls".into(),
                (sb.serf_tcp_streams_accepted - sa.serf_tcp_streams_accepted) as f64 / minutes,
            ),
            ("member_events".into(), events as f64 / minutes),
        ]),
        held_per_agent: BTreeMap::from([
            (
                "streams".into(),
                b.subscriptions_active as f64 / AGENTS as f64,
            ),
            (
                "rpc_connections".into(),
                b.rpc_connections_open as f64 / AGENTS as f64,
            ),
        ]),
    }
}

/// Each rate of `got` not within the tolerance of the baseline's (a zero
/// there must be a zero here), in words.
fn outside(got: &Baseline, real: &Baseline) -> Vec<String> {
    let mut out = Vec::new();
    for (what, theirs, ours) in [
        (
            "per agent-minute",
            &real.per_agent_minute,
            &got.per_agent_minute,
        ),
        ("per minute", &real.per_minute, &got.per_minute),
        ("held per agent", &real.held_per_agent, &got.held_per_agent),
    ] {
        for (name, &r) in theirs {
            let g = ours.get(name).copied().unwrap_or(f64::NAN);
            let ok = if r == 0.0 {
                g == 0.0
            } else {
                (g / r - 1.0).abs() <= TOLERANCE
            };
            if !ok {
                out.push(format!(
                    "{name} {what}: {g:.3} here, {r:.3} on the real server ({:.2}x)",
                    g / r
                ));
            }
        }
    }
    out
}

/// 100 agents as the real ones but for `change`, joined, then the server's
/// counters over the steady window.
async fn steady_rates(change: impl FnOnce(&mut ConsulConfig)) -> Baseline {
    let b = dev_server().await;
    let mut cfg = like_real(&b);
    change(&mut cfg);
    let m = metrics();
    let stop = CancellationToken::new();
    let fleet = FleetConfig {
        agents: AGENTS,
        duration: None,
        grace: Duration::from_secs(30),
        label: "consul",
        ..FleetConfig::default()
    };
    let run = tokio::spawn(agent_sim_fleet::run(
        fleet,
        Arc::new(ConsulFactory::new(cfg, m.clone()).unwrap()),
        m.clone(),
        Arc::new(FleetStatus::default()),
        stop.clone(),
    ));
    let mm = m.clone();
    until(
        Duration::from_secs(60),
        "every agent a member and registered",
        async move || {
            counter(&mm, "gossip_joins") == AGENTS && counter(&mm, "registrations") == AGENTS
        },
    )
    .await;
    // The rest on paused time: loopback delivers each packet before the
    // clock moves on.
    tokio::time::pause();
    tokio::time::sleep(WARMUP).await;
    let start = b.consul_stats().unwrap();
    tokio::time::sleep(WINDOW).await;
    let end = b.consul_stats().unwrap();
    stop.cancel();
    let report = run.await.unwrap();
    assert_eq!(report.connected_at_end, AGENTS);
    assert!(m.snapshot().errors.is_empty(), "{:?}", m.snapshot().errors);
    b.stop().await;
    rates(&start, &end)
}

fn baseline() -> Baseline {
    let real: Baseline = serde_json::from_str(BASELINE).unwrap();
    assert_eq!(real.agents, AGENTS);
    real
}

#[tokio::test(flavor = "current_thread")]
async fn a_server_pays_for_100_of_ours_what_a_real_one_paid_for_100_real_agents() {
    let got = steady_rates(|_| {}).await;
    let off = outside(&got, &baseline());
    assert!(off.is_empty(), "{}\n{got:#?}", off.join("\n"));
}

#[tokio::test(flavor = "current_thread")]
async fn members_that_push_pull_twice_as_often_fail_the_guard() {
    let got = steady_rates(|c| {
        let t: &mut Timings = &mut c.gossip.as_mut().unwrap().timings;
        t.push_pull_interval /= 2;
    })
    .await;
    let off = outside(&got, &baseline());
    assert!(
        off.len() == 1 && off[0].starts_with("member_push_pulls per minute"),
        "{off:#?}"
    );
}

/// The other periodic cost: each agent's anti-entropy (its node's services
/// and checks read back from the catalog) twice as often.
#[tokio::test(flavor = "current_thread")]
async fn agents_that_sync_twice_as_often_fail_the_guard() {
    let got = steady_rates(|c| c.anti_entropy = c.anti_entropy.map(|d| d / 2)).await;
    let mut off = outside(&got, &baseline());
    off.sort();
    assert!(
        off.len() == 2
            && off[0].starts_with("Catalog.NodeServiceList per agent-minute")
            && off[1].starts_with("Health.NodeChecks per agent-minute"),
        "{off:#?}"
    );
}
