//! Behaving like real agents towards a shared cluster, against the embedded
//! Consul server on paused time: anti-entropy repairs a server that lost
//! its state, probes leave the catalog and config entries exactly as they
//! were, and the intentions probe never touches an entry it did not create.

use crate::common::*;
use agent_sim_testkit::bounded::until;

use std::sync::Arc;
use std::time::Duration;

use agent_sim_consul::{ConsulConfig, ConsulFactory, ProbeConfig, ProbeKind};
use agent_sim_fleet::{FleetConfig, FleetReport, FleetStatus, Rate};
use agent_sim_metrics::Metrics;
use agent_sim_server::consul::ConsulTargetConfig;
use bytes::Bytes;
use http::Method;
use tokio_util::sync::CancellationToken;

fn fleet(agents: u64, duration: Duration) -> FleetConfig {
    FleetConfig {
        agents,
        ramp: Some(Rate::per_second(1000.0)),
        duration: Some(duration),
        grace: Duration::from_secs(5),
        ..FleetConfig::default()
    }
}

/// Runs a fleet (and its probe, if any) to the end.
async fn run(cfg: ConsulConfig, f: FleetConfig, m: &Metrics) -> FleetReport {
    run_fleet(cfg, f, m).await.0
}

/// Everything a run could have touched, as the server prints it: the node
/// list, every node with its services, every session, and the given
/// `service-intentions` entries (or their 404).
async fn dump(t: &Target, intentions: &[&str]) -> Vec<String> {
    let api = t.api();
    let get = |path: String| {
        let api = &api;
        async move {
            match api.call(Method::GET, &path, Bytes::new()).await {
                Ok(b) => format!("{path}: {}", String::from_utf8_lossy(&b)),
                Err(e) => format!("{path}: {e}"),
            }
        }
    };
    let mut out = vec![get("/v1/catalog/nodes".into()).await];
    let nodes: Vec<serde_json::Value> = serde_json::from_slice(
        &api.call(Method::GET, "/v1/catalog/nodes", Bytes::new())
            .await
            .unwrap(),
    )
    .unwrap();
    for n in nodes {
        let name = n["Node"].as_str().unwrap().to_owned();
        out.push(get(format!("/v1/catalog/node/{name}")).await);
    }
    out.push(get("/v1/session/list".into()).await);
    for name in intentions {
        out.push(get(format!("/v1/config/service-intentions/{name}")).await);
    }
    out
}

/// A target where someone else keeps intentions on a real service (`web`:
/// frontend allow, * deny).
async fn with_their_intentions() -> Target {
    let t = start_target().await;
    let theirs = r#"{"Kind":"service-intentions","Name":"web","Sources":[
        {"Name":"frontend","Action":"allow"},{"Name":"*","Action":"deny"}]}"#;
    t.api()
        .put("/v1/config", Bytes::from(theirs))
        .await
        .unwrap();
    t
}

#[tokio::test(start_paused = true)]
async fn a_server_that_lost_its_state_is_repaired_by_anti_entropy() {
    let t = start_target().await;
    let m = metrics();
    let cfg = ConsulConfig {
        session_ttl: Some(Duration::from_secs(10)),
        anti_entropy: Some(Duration::from_secs(60)),
        cluster_size: 20,
        ..config(&t)
    };
    let factory = ConsulFactory::new(cfg, m.clone()).unwrap();
    let status = Arc::new(FleetStatus::default());
    let fleet_run = tokio::spawn(agent_sim_fleet::run(
        fleet(20, Duration::from_secs(120)),
        Arc::new(factory),
        m.clone(),
        status,
        CancellationToken::new(),
    ));
    until(
        Duration::from_secs(10),
        "20 registered with sessions",
        async || {
            let s = t.state.stats();
            counter(&m, "registrations") == 20 && s.sessions_active == 20
        },
    )
    .await;
    let before = counter(&m, "sessions_established");
    assert_eq!(before, 20);

    // The server restarts without its catalog and sessions.
    let t = t.restart_empty().await;
    let restarted = tokio::time::Instant::now();
    assert!(
        t.api()
            .call(Method::GET, "/v1/catalog/node/agent-sim-0", Bytes::new())
            .await
            .unwrap()
            == "null"
    );

    // Within one interval every node, instance and session is back.
    until(Duration::from_secs(60), "all repaired", async || {
        let s = t.state.stats();
        counter(&m, "reregistrations") == 20 && s.sessions_active == 20
    })
    .await;
    let took = restarted.elapsed();
    let nodes = run_nodes(&t).await;
    assert_eq!(nodes.len(), 20, "{nodes:?}");
    let app: Vec<serde_json::Value> = serde_json::from_slice(
        &t.api()
            .call(Method::GET, "/v1/catalog/service/app", Bytes::new())
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(app.len(), 20);
    // Every agent is connected again, its resubscribes answered with a new
    // snapshot (the server's indexes started over), none taken as resumed.
    until(Duration::from_secs(5), "all reconnected", async || {
        counter(&m, "sessions_established") == 40
    })
    .await;
    assert_eq!(counter(&m, "resumes"), 0);
    assert_eq!(counter(&m, "resumes_silent"), 0);
    assert_eq!(
        counter(&m, "registrations"),
        20,
        "repairs are counted apart"
    );
    assert!(counter(&m, "anti_entropy_syncs") >= 20);
    assert!(took <= Duration::from_secs(60), "repaired after {took:?}");

    let report = fleet_run.await.unwrap();
    assert_eq!(report.connected_at_end, 20);
    // The restart is reported as a detected disruption: every session lost
    // at once and back, each agent's streams resynced by a new snapshot.
    let d = m.disruptions().summaries();
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(
        (d[0].cause.as_str(), d[0].sessions_lost, d[0].back),
        ("backend", 20, 20)
    );
    assert!(d[0].missing_at_end.is_empty());
    assert!(d[0].snapshots >= 20 && d[0].resumes == 0, "{:?}", d[0]);
    assert!(
        d[0].back_after_s
            .p100
            .is_some_and(|s| s <= took.as_secs_f64() + 0.1)
    );
    // The run's exit removed what it registered again.
    let left = run_nodes(&t).await;
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(t.state.stats().sessions_active, 0);
}

#[tokio::test(start_paused = true)]
async fn probes_leave_the_catalog_and_config_entries_as_found() {
    let t = with_their_intentions().await;
    let watched = ["web", "agent-sim-probe"];
    let before = dump(&t, &watched).await;

    for kind in [ProbeKind::Catalog, ProbeKind::Intentions] {
        let m = metrics();
        let cfg = ConsulConfig {
            probe: ProbeConfig {
                kind: Some(kind),
                every: Duration::from_secs(2),
                timeout: Some(Duration::from_secs(1)),
                ..ProbeConfig::default()
            },
            ..config(&t)
        };
        let report = run(cfg, fleet(30, Duration::from_secs(9)), &m).await;
        assert_eq!(report.ever_connected, 30);
        assert!(
            m.snapshot().errors.is_empty(),
            "{kind:?}: {:?}",
            m.snapshot().errors
        );
        assert_eq!(counter(&m, "deregistrations"), 30);
        assert_eq!(dump(&t, &watched).await, before, "{kind:?} left a trace");
    }
}

#[tokio::test(start_paused = true)]
async fn the_intentions_probe_never_touches_an_entry_it_did_not_create() {
    let t = with_their_intentions().await;
    let before = dump(&t, &["web"]).await;
    let m = metrics();
    let cfg = ConsulConfig {
        probe: ProbeConfig {
            kind: Some(ProbeKind::Intentions),
            service: Some("web".into()),
            every: Duration::from_secs(2),
            timeout: Some(Duration::from_secs(1)),
            ..ProbeConfig::default()
        },
        ..config(&t)
    };
    run(cfg, fleet(5, Duration::from_secs(7)), &m).await;
    let errors = m.error_report();
    let refused = errors
        .iter()
        .find(|e| e.kind == "probe_entry_exists")
        .unwrap_or_else(|| panic!("{errors:?}"));
    assert!(
        refused
            .stat
            .sample
            .as_deref()
            .unwrap_or("")
            .contains("not created by this run"),
        "{refused:?}"
    );
    assert_eq!(dump(&t, &["web"]).await, before);
}

#[tokio::test(start_paused = true)]
async fn a_failed_run_removes_the_nodes_it_registered() {
    // Only 3 RPC connections per client IP: most agents never connect.
    let t = start_with(ConsulTargetConfig {
        rpc_max_conns_per_client: 3,
        ..ConsulTargetConfig::default()
    })
    .await;
    let before = dump(&t, &[]).await;
    let m = metrics();
    let f = FleetConfig {
        fail_fast: true,
        ..fleet(10, Duration::from_secs(30))
    };
    let report = run(config(&t), f, &m).await;
    assert!(report.ever_connected < 10);
    assert_eq!(dump(&t, &[]).await, before);
}

/// Three servers of one cluster (one state), as `--embedded-servers 3`.
async fn three_servers() -> [Target; 3] {
    let first = start_target().await;
    let any: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    let second = Target::serve(first.state.clone(), any, any).await;
    let third = Target::serve(first.state.clone(), any, any).await;
    [first, second, third]
}

#[tokio::test(start_paused = true)]
async fn a_failover_keeps_the_state_and_a_rebalance_checks_a_server_before_moving() {
    let [first, second, third] = three_servers().await;
    let mut cfg = config(&first);
    cfg.conn.targets = [&first, &second, &third]
        .map(|t| t.rpc.to_string())
        .to_vec();
    cfg.rebalance_min = Duration::from_secs(5);
    let m = metrics();
    let factory = ConsulFactory::new(cfg, m.clone()).unwrap();
    let status = Arc::new(FleetStatus::default());
    let mut f = fleet(60, Duration::from_secs(40));
    f.servers = [&first, &second, &third]
        .map(|t| t.rpc.to_string())
        .to_vec();
    let fleet_run = tokio::spawn(agent_sim_fleet::run(
        f,
        Arc::new(factory),
        m.clone(),
        status,
        CancellationToken::new(),
    ));
    until(Duration::from_secs(10), "60 connected", async || {
        counter(&m, "sessions_established") == 60
    })
    .await;
    // The third server goes away for good: its agents go to the next
    // server of their lists, and rebalances that put it in front find it
    // silent and keep their agents where they are.
    third.stop.cancel();
    until(
        Duration::from_secs(10),
        "every agent served again",
        async || {
            m.disruptions()
                .summaries()
                .first()
                .is_some_and(|d| d.sessions_lost > 0 && d.back == d.sessions_lost)
        },
    )
    .await;
    let report = fleet_run.await.unwrap();
    assert_eq!(report.connected_at_end, 60);
    let held = report.servers.expect("three servers").held;
    assert_eq!(held[2], 0, "{held:?}");
    assert_eq!(held.iter().sum::<u64>(), 60, "{held:?}");
    let s = m.snapshot();
    assert!(
        !s.errors.contains_key("connect_refused"),
        "no move onto the dead server: {:?}",
        s.errors
    );
    assert!(counter(&m, "router_skips") > 0);
    // The cluster kept every agent's state: no sync after the failover
    // (the periodic one is a minute away), the move confirmed by a ping.
    assert_eq!(counter(&m, "anti_entropy_syncs"), 0);
    assert_eq!(counter(&m, "reregistrations"), 0);
    let d = &m.disruptions().summaries()[0];
    assert!(
        d.back_after_s.p100.is_some_and(|s| s < 3.0),
        "back at once, not after a staggered sync: {d:?}"
    );
}
