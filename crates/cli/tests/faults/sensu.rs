//! Sensu rows of the fault matrix: what the backend does to upgrades,
//! sessions and frames, and what the agents do and report.

use std::time::Duration;

use agent_sim_fleet::FleetReport;
use agent_sim_metrics::Metrics;
use agent_sim_sensu::{SensuConfig, SensuFactory};
use agent_sim_server::backend::Backend;

use super::*;

const INJECTED: &str = "injected by agent-sim serve --faults";

/// Sensu agents through the protocol crate (for the settings the command
/// line does not expose: handshake timeout, ping and pong).
async fn fleet(
    b: &Backend,
    agents: u64,
    secs: f64,
    tweak: impl FnOnce(&mut SensuConfig),
) -> (FleetReport, Metrics) {
    let mut cfg = SensuConfig {
        targets: vec![format!("ws://{}/", b.sensu_addr().unwrap())],
        ..SensuConfig::default()
    };
    tweak(&mut cfg);
    let m = metrics(&agent_sim_sensu::metrics_spec());
    let factory = SensuFactory::new(cfg, m.clone()).unwrap();
    (fleet_run(factory, &m, agents, secs).await, m)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrades_answered_429_500_503_are_retried_and_reported_in_the_servers_words() {
    bounded(Duration::from_secs(20), async {
        let b = backend(
            true,
            false,
            &[
                "sensu.upgrade=429@100%,max:5",
                "sensu.upgrade=500@100%,max:5",
                "sensu.upgrade=503@100%,max:5",
            ],
        )
        .await;
        let s = &complete(&b, sensu_run(&b, 20, 2.5)).await;
        let f = b.fault_stats();
        assert_eq!(f.injected, 15);
        let e429 = error(s, "upgrade_429");
        assert_eq!(e429.count, f.count("sensu.upgrade=429@100%,max:5"));
        assert_eq!(
            e429.sample.as_deref(),
            Some(format!("HTTP 429 Too Many Requests: {INJECTED}").as_str())
        );
        assert!(e429.heals && e429.hint.as_deref().unwrap().contains("--ramp"));
        let e5xx = error(s, "upgrade_5xx");
        assert_eq!(e5xx.count, 10);
        assert!(e5xx.heals);
        assert!(s.counters["reconnect_attempts"] >= 15);

        // At a rate: the run counts exactly what the backend injected.
        let b = backend(true, false, &["sensu.upgrade=503@25%"]).await;
        let s = complete(&b, sensu_run(&b, 40, 2.5)).await;
        let injected = b.fault_stats().count("sensu.upgrade=503@25%");
        assert!(injected > 0);
        assert_eq!(error(&s, "upgrade_5xx").count, injected);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_upgrades_and_frames_connect_late_without_errors() {
    bounded(Duration::from_secs(20), async {
        let b = backend(true, false, &["sensu.upgrade=delay:400ms@100%"]).await;
        let s = &complete(&b, sensu_run(&b, 10, 1.5)).await;
        assert!(s.errors.is_empty(), "{:#?}", s.errors);
        assert_eq!(b.fault_stats().injected, 10);
        assert!(
            s.latency_us["connect"].min >= 400_000,
            "{:?}",
            s.latency_us["connect"]
        );

        // The entity_config comes 600 ms late: connected then, not before.
        let b = backend(true, false, &["sensu.frame=delay:600ms@100%,max:10"]).await;
        let s = complete(&b, sensu_run(&b, 10, 1.5)).await;
        assert_eq!(b.fault_stats().injected, 10);
        let ready = &s.latency_us["session_ready"];
        assert!(ready.min >= 600_000, "{ready:?}");
        assert!(s.errors.is_empty(), "{:#?}", s.errors);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_dropped_and_reset_upgrades_have_their_own_kinds() {
    bounded(Duration::from_secs(20), async {
        let b = backend(
            true,
            false,
            &[
                "sensu.upgrade=stall@100%,max:3",
                "sensu.upgrade=drop@100%,max:3",
                "sensu.upgrade=reset@100%,max:3",
            ],
        )
        .await;
        let (report, m) = fleet(&b, 12, 3.0, |c| {
            c.handshake_timeout = Duration::from_millis(500);
        })
        .await;
        b.stop().await;
        assert_eq!(report.connected_at_end, 12, "{:#?}", m.error_report());
        assert_eq!(b.fault_stats().injected, 9);
        let stalled = reported(&m, "handshake_timeout");
        assert_eq!(stalled.stat.count, 3);
        assert!(stalled.stat.sample.as_deref().unwrap().contains("500ms"));
        let dropped = reported(&m, "upgrade_closed");
        assert_eq!(dropped.stat.count, 3, "{dropped:?}");
        assert!(dropped.heals && dropped.hint.is_some());
        let reset = reported(&m, "upgrade_reset");
        assert_eq!(reset.stat.count, 3, "{reset:?}");
        assert!(
            reset.stat.sample.as_deref().unwrap().contains("reset"),
            "{reset:?}"
        );
        assert_eq!(m.error_report().len(), 3, "{:#?}", m.error_report());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_and_reset_sessions_are_lost_counted_and_back() {
    bounded(Duration::from_secs(20), async {
        let b = backend(
            true,
            false,
            &[
                "sensu.session=drop@100%,after:300ms,max:4",
                "sensu.session=reset@100%,after:300ms,max:4",
            ],
        )
        .await;
        let s = &complete(&b, sensu_run(&b, 10, 3.0)).await;
        let f = b.fault_stats();
        assert_eq!(f.injected, 8);
        assert_eq!(s.sessions_lost["ws_dropped"], 4, "{:?}", s.sessions_lost);
        assert_eq!(s.sessions_lost["ws_reset"], 4, "{:?}", s.sessions_lost);
        assert_eq!(s.counters["agents_reconnected"], 8);
        let reset = error(s, "ws_reset");
        assert!(
            reset.sample.as_deref().unwrap().contains("reset"),
            "{reset:?}"
        );
        assert!(
            error(s, "ws_dropped")
                .hint
                .as_deref()
                .unwrap()
                .contains("FIN")
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_session_is_dropped_by_the_agents_pong_timeout() {
    bounded(Duration::from_secs(20), async {
        let b = backend(true, false, &["sensu.session=stall@100%,after:200ms,max:3"]).await;
        let (report, m) = fleet(&b, 6, 2.5, |c| {
            c.ping_interval = Duration::from_millis(200);
            c.pong_timeout = Duration::from_millis(300);
        })
        .await;
        b.stop().await;
        assert_eq!(report.connected_at_end, 6);
        assert_eq!(b.fault_stats().injected, 3);
        assert_eq!(report.sessions_lost.get("pong_timeout"), Some(&3));
        assert_eq!(reported(&m, "pong_timeout").stat.count, 3);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_hit_at_a_time_are_every_live_session() {
    bounded(Duration::from_secs(20), async {
        let b = backend(true, false, &["sensu.session=reset@at:1500ms"]).await;
        let s = &complete(&b, sensu_run(&b, 25, 3.5)).await;
        assert_eq!(b.fault_stats().injected, 25);
        assert_eq!(s.sessions_lost["ws_reset"], 25, "{:?}", s.sessions_lost);
        assert_eq!(s.counters["agents_reconnected"], 25);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_truncated_and_oversized_frames() {
    bounded(Duration::from_secs(20), async {
        let b = backend(
            true,
            false,
            &[
                "sensu.frame=garbage@100%,max:5",
                "sensu.frame=truncated@100%,max:4",
                "sensu.frame=oversized@100%,max:3",
            ],
        )
        .await;
        let s = &complete(&b, sensu_run(&b, 15, 3.0)).await;
        assert_eq!(b.fault_stats().injected, 12);
        // Garbage is counted and skipped: the session goes on.
        let garbage = error(s, "decode_frame");
        assert_eq!(garbage.count, 5);
        assert!(
            garbage
                .sample
                .as_deref()
                .unwrap()
                .starts_with("32 bytes without a type line: 07"),
            "{garbage:?}"
        );
        // A frame cut short ends the connection: a drop to the agent.
        assert_eq!(error(s, "ws_dropped").count, 4);
        // A message over 64 KiB: the agent drops the session.
        let big = error(s, "message_too_large");
        assert_eq!(big.count, 3);
        assert!(big.sample.as_deref().unwrap().contains("65537"), "{big:?}");
        let lost: u64 = s.sessions_lost.values().sum();
        assert!(
            lost <= 7,
            "only truncated and oversized frames lose sessions: {lost}"
        );
    })
    .await;
}
