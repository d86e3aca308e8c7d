//! Watchers without streaming (`--watch blocking|http`) against the
//! embedded server on paused time: a blocking query comes back on a change
//! and is asked again past the new index, a wait that ends with no change
//! is asked again without a delivery, an index that went backwards starts
//! the watch over as Consul's client does, and the probe reaches every
//! watcher in every mode.

use crate::common::*;
use agent_sim_testkit::bounded::until;

use std::time::Duration;

use agent_sim_consul::watch::WatchMode;
use agent_sim_consul::{ConsulConfig, ConsulFactory, ProbeConfig, ProbeKind};
use agent_sim_fleet::{AgentFactory, FleetConfig, Rate, SessionEnd};
use bytes::Bytes;

fn watching(t: &Target, mode: WatchMode, wait: Duration) -> ConsulConfig {
    ConsulConfig {
        watch: mode,
        blocking_wait: wait,
        upstreams: vec!["web".into()],
        session_ttl: None,
        ..config(t)
    }
}

async fn register(t: &Target, node: &str, id: &str, n: u8) {
    let body = serde_json::json!({
        "Node": node, "Address": format!("10.9.1.{n}"),
        "Service": {"ID": id, "Service": "web", "Port": 8080}});
    t.api()
        .put("/v1/catalog/register", Bytes::from(body.to_string()))
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_blocking_query_returns_on_a_change_and_is_asked_past_its_index() {
    for mode in [WatchMode::Blocking, WatchMode::Http] {
        let t = start_target().await;
        let m = metrics();
        let factory =
            ConsulFactory::new(watching(&t, mode, Duration::from_secs(60)), m.clone()).unwrap();
        let mut agent = factory.create(0);
        let (mm, tt) = (m.clone(), &t);
        let end = with_session(&mut agent, &m, move |stop| async move {
            until(Duration::from_secs(5), "the first result", async || {
                counter(&mm, "watch_results_changed") == 1
                    && tt.state.stats().blocking_queries_held == 1
            })
            .await;
            let calls = counter(&mm, "watch_calls");
            assert_eq!(calls, 2, "{mode}: the snapshot's call, then one held");
            register(tt, "sim-node-9", "web-9", 9).await;
            until(Duration::from_secs(5), "the change", async || {
                counter(&mm, "watch_results_changed") == 2
                    && tt.state.stats().blocking_queries_held == 1
            })
            .await;
            // Asked again past the new index: held, not answered at once.
            tokio::time::sleep(Duration::from_secs(30)).await;
            assert_eq!(counter(&mm, "watch_calls"), 3, "{mode}");
            assert_eq!(counter(&mm, "watch_responses"), 2, "{mode}");
            assert_eq!(tt.state.stats().blocking_queries_held, 1);
            stop.cancel();
        })
        .await;
        assert!(matches!(end, SessionEnd::Shutdown), "{mode}: {end:?}");
        let s = m.snapshot();
        assert!(s.errors.is_empty(), "{mode}: {:?}", s.errors);
        assert!(counter(&m, "watch_bytes_received") > 0);
        assert!(counter(&m, "watch_bytes_sent") > 0);
        assert!(counter(&m, "bytes_received") >= counter(&m, "watch_bytes_received"));
    }
}

#[tokio::test(start_paused = true)]
async fn a_wait_that_ends_unchanged_is_asked_again_without_a_delivery() {
    for mode in [WatchMode::Blocking, WatchMode::Http] {
        let t = start_target().await;
        let m = metrics();
        let factory =
            ConsulFactory::new(watching(&t, mode, Duration::from_secs(10)), m.clone()).unwrap();
        let mut agent = factory.create(0);
        let mm = m.clone();
        with_session(&mut agent, &m, move |stop| async move {
            until(Duration::from_secs(5), "the first result", async || {
                counter(&mm, "watch_results_changed") == 1
            })
            .await;
            // Three waits of 10 s (plus up to 1/16) end with nothing new.
            tokio::time::sleep(Duration::from_secs(33)).await;
            assert_eq!(counter(&mm, "watch_responses"), 4, "{mode}");
            assert_eq!(counter(&mm, "watch_calls"), 5, "{mode}");
            stop.cancel();
        })
        .await;
        assert_eq!(
            counter(&m, "watch_results_changed"),
            1,
            "{mode}: no delivery"
        );
        assert_eq!(counter(&m, "snapshots"), 1, "{mode}");
        assert!(m.snapshot().errors.is_empty(), "{mode}");
    }
}

#[tokio::test(start_paused = true)]
async fn an_index_that_went_backwards_starts_the_watch_over() {
    let t = start_target().await;
    let m = metrics();
    let cfg = watching(&t, WatchMode::Blocking, Duration::from_secs(5));
    let factory = ConsulFactory::new(cfg, m.clone()).unwrap();
    let mut agent = factory.create(0);
    // Raise web's index well past what an empty server starts at.
    for i in 0..20u8 {
        register(
            &t,
            &format!("sim-node-{}", 20 + i),
            &format!("web-x{i}"),
            20 + i,
        )
        .await;
    }
    with_session(&mut agent, &m, |stop| async move {
        tokio::time::sleep(Duration::from_secs(3)).await;
        stop.cancel();
    })
    .await;
    assert_eq!(counter(&m, "watch_results_changed"), 1);

    // The server comes back empty: its indexes start over.
    let t = t.restart_empty().await;
    register(&t, "sim-node-1", "web-1", 1).await;
    with_session(&mut agent, &m, |stop| async move {
        tokio::time::sleep(Duration::from_secs(12)).await;
        stop.cancel();
    })
    .await;
    let s = m.snapshot();
    // The query at the old index waited its 5 s, came back with a lower
    // index: the watch started over at 0 and took the new result whole.
    assert_eq!(s.warnings.get("watch_index_reset"), Some(&1), "{s:?}");
    assert_eq!(counter(&m, "snapshots"), 2);
    assert!(s.errors.is_empty(), "{:?}", s.errors);
}

#[tokio::test(start_paused = true)]
async fn the_probe_reaches_every_watcher_in_every_mode() {
    for mode in [WatchMode::Streaming, WatchMode::Blocking, WatchMode::Http] {
        let t = start_target().await;
        let m = metrics();
        let cfg = ConsulConfig {
            probe: ProbeConfig {
                kind: Some(ProbeKind::Catalog),
                every: Duration::from_secs(2),
                timeout: Some(Duration::from_secs(1)),
                ..ProbeConfig::default()
            },
            ..watching(&t, mode, Duration::from_secs(60))
        };
        let f = FleetConfig {
            agents: 20,
            ramp: Some(Rate::per_second(1000.0)),
            duration: Some(Duration::from_secs(9)),
            grace: Duration::from_secs(5),
            ..FleetConfig::default()
        };
        let (report, probes) = run_fleet(cfg, f, &m).await;
        assert_eq!(report.ever_connected, 20, "{mode}");
        assert!(probes.len() >= 3, "{mode}: {probes:?}");
        for p in &probes {
            assert_eq!((p.delivered, p.expected), (20, 20), "{mode}: {p:?}");
        }
        let s = m.snapshot();
        assert!(s.errors.is_empty(), "{mode}: {:?}", s.errors);
        if mode == WatchMode::Streaming {
            assert_eq!(counter(&m, "watch_calls"), 0);
        } else {
            assert!(counter(&m, "watch_results_changed") >= 20 * 2 + 20 * probes.len() as u64);
        }
        // The run leaves the catalog as it found it.
        assert!(run_nodes(&t).await.is_empty(), "{mode}");
    }
}
