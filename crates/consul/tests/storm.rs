//! A full storm of 1,000 Consul agents against the embedded server (real
//! sockets, real time): every agent comes back with its streams resynced
//! and its registration confirmed by its staggered sync, the comeback
//! spread over the backoff window, and the registrations never left the
//! catalog. The cluster is declared as 100 nodes so that the sync after a
//! reconnect is staggered over 3 s (1,000 nodes would scale it to 12 s).

use crate::common::*;
use agent_sim_testkit::bounded::until;

use std::time::Duration;

use std::sync::Arc;

use agent_sim_consul::{ConsulConfig, ConsulFactory};
use agent_sim_fleet::scenario::{Phase, Scenario};
use agent_sim_fleet::{Backoff, FleetConfig, FleetStatus, Rate};
use agent_sim_metrics::disruption::spread;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_storm_of_1000_consul_agents_recovers_with_reconvergence_figures() {
    let t = start_target().await;
    let m = metrics();
    let n = 1000;
    let cfg = ConsulConfig {
        upstreams: vec!["web".into()],
        session_ttl: Some(Duration::from_secs(30)),
        cluster_size: 100,
        ..config(&t)
    };
    let fleet = FleetConfig {
        agents: n,
        ramp: Some(Rate::per_second(2000.0)),
        // Until every agent is back (or a minute, and the test fails).
        duration: None,
        grace: Duration::from_secs(10),
        backoff: Backoff::new(Duration::from_secs(2), Duration::from_secs(30)),
        scenario: Scenario {
            phases: vec![Phase::Storm {
                at: Duration::from_secs(6),
                share: 1.0,
            }],
        },
        label: "consul",
        ..FleetConfig::default()
    };
    let stop = CancellationToken::new();
    let (mm, s) = (m.clone(), stop.clone());
    tokio::spawn(async move {
        // Ends the run once every agent is back, or after a minute.
        let _end = s.drop_guard();
        until(
            Duration::from_secs(60),
            "every agent back",
            async move || mm.disruptions().live().iter().any(|d| d.back == n),
        )
        .await;
    });
    let report = agent_sim_fleet::run(
        fleet,
        Arc::new(ConsulFactory::new(cfg, m.clone()).unwrap()),
        m.clone(),
        Arc::new(FleetStatus::default()),
        stop,
    )
    .await;
    assert_eq!(report.connected_at_end, n);
    assert_eq!(report.sessions_lost["scenario_storm"], n);
    let d = m.disruptions().summaries();
    assert_eq!(d.len(), 1, "{d:#?}");
    let d = &d[0];
    assert_eq!((d.cause.as_str(), d.fleet.as_str()), ("storm", "consul"));
    assert_eq!((d.sessions_lost, d.back, d.attempts), (n, n, n));
    assert!(d.missing_at_end.is_empty());
    // Back = the jittered first delay ([1 s, 2 s]) + resubscribe + the
    // staggered sync that confirms the registration (≤ 3 s), spread over
    // that window (how far past it depends on the test machine's load).
    let l = &d.reconnect_us;
    assert!(l.min >= 1_000_000, "{l:?}");
    assert!(spread(l).unwrap() >= 1_000_000, "{l:?}");
    let b = &d.back_after_s;
    assert!(
        b.p50.unwrap() >= 1.0 && b.p50 <= b.p90 && b.p99 <= b.p100,
        "{b:?}"
    );
    // Every agent's stream resynced; the server kept its state and nothing
    // changed, so each resubscribe at its index resumed silently (taken as
    // live once the agent's sync was answered).
    assert_eq!(
        (d.snapshots, d.resumes, d.resumes_silent),
        (0, 0, n),
        "{d:?}"
    );
    // A storm is a network blip, not a leave: nothing was registered again.
    assert_eq!(counter(&m, "registrations"), n);
    assert_eq!(counter(&m, "reregistrations"), 0);
    assert!(m.snapshot().errors.is_empty(), "{:?}", m.snapshot().errors);
}
