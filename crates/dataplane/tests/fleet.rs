//! Simulated sidecars against the embedded Consul target in-process on
//! 127.0.0.1:0: 200 sidecars through a full deregister/register probe, one
//! probe timed at Subscribe agents and sidecars alike, a storm inside a
//! probe's window, the catalog left as found, adopting existing proxies, and
//! the stream cap moving sidecars to another server.

use std::time::Duration;

use agent_sim_consul::{ConsulConfig, ConsulFactory, ProbeConfig, ProbeKind};
use agent_sim_dataplane::{Adopt, DataplaneConfig, DataplaneFactory};
use agent_sim_fleet::{FleetConfig, FleetReport, Rate};
use agent_sim_metrics::{Metrics, ProbeSummary};
use agent_sim_server::consul::ConsulTargetConfig;
use tokio_util::sync::CancellationToken;

use crate::common::*;

fn probe() -> ProbeConfig {
    ProbeConfig {
        kind: Some(ProbeKind::Catalog),
        every: Duration::from_secs(2),
        timeout: Some(Duration::from_millis(1500)),
        ..ProbeConfig::default()
    }
}

fn fleet(agents: u64, duration: Duration) -> FleetConfig {
    FleetConfig {
        agents,
        ramp: Some(Rate::per_second(2000.0)),
        duration: Some(duration),
        grace: Duration::from_secs(5),
        ..FleetConfig::default()
    }
}

async fn run(
    f: DataplaneFactory,
    fc: FleetConfig,
    m: &Metrics,
) -> (FleetReport, Vec<ProbeSummary>) {
    let stop = CancellationToken::new();
    let probes = f.probe_runner().map(|r| tokio::spawn(r.run(stop.clone())));
    let report = run_fleet(f, fc, m).await;
    stop.cancel();
    let probes = match probes {
        Some(p) => p.await.unwrap(),
        None => Vec::new(),
    };
    (report, probes)
}

#[tokio::test(start_paused = true)]
async fn sidecars_get_clusters_and_endpoints_and_a_full_probe_reaches_all() {
    let t = start().await;
    let before = t.nodes().await;
    let m = metrics();
    let cfg = DataplaneConfig {
        probe: probe(),
        watch_servers: true,
        ..config(&t)
    };
    let f = DataplaneFactory::new(cfg, m.clone()).unwrap();
    // Two probes: the deregister at 2 s, the register at 4 s.
    let (report, probes) = run(f, fleet(200, Duration::from_millis(5800)), &m).await;
    let s = m.snapshot();
    assert_eq!(report.ever_connected, 200, "{s:?}");
    assert_eq!(report.connected_at_end, 200);
    assert!(s.errors.is_empty(), "errors: {:?}", s.errors);
    assert_eq!(s.counter("registrations"), 200);
    assert_eq!(s.counter("deregistrations"), 200);
    assert_eq!(s.counter("xds_bootstraps"), 200);
    assert_eq!(s.counter("xds_streams"), 200);
    assert_eq!(s.counter("server_lists"), 200);
    assert_eq!(s.counter("xds_nacks"), 0);
    assert_eq!(s.counter("xds_acks"), s.counter("xds_responses"));
    // CDS + EDS at the start, two probe EDS updates each.
    assert!(s.counter("eds_updates") >= 600, "{s:?}");

    assert_eq!(probes.len(), 2, "{probes:?}");
    for (p, kind) in probes.iter().zip(["deregister", "register"]) {
        assert_eq!(p.kind, kind);
        assert_eq!(p.fleet.as_deref(), Some("consul-dataplane"));
        assert_eq!((p.delivered, p.expected), (200, 200), "{p:?}");
        // Every update waited for the server's 200 ms coalescing delay
        // (virtual time here; kernel stamps, taken in real time, pull
        // arrivals a few ms earlier).
        assert!(p.latency_us.min >= 150_000, "{p:?}");
        assert!(p.time_to_99pct_us.is_some());
    }
    m.collect();
    assert_eq!(m.cumulative_of("propagation_xds").unwrap().len(), 400);

    // Nothing of the run is left.
    assert_eq!(t.nodes().await, before);
    let st = t.state.stats();
    assert_eq!(st.xds_nacks, 0);
    assert!(st.xds_acks >= 800, "{st:?}");
}

/// A storm takes half the sidecars down just after a probe's write and
/// before its update reaches them: those back inside the probe's window
/// have the change in their first EDS answer and still count (the probe
/// expected them); the next probe expects only the sidecars live when it is
/// armed, and no probe counts more deliveries than it expected.
#[tokio::test(start_paused = true)]
async fn a_storm_inside_a_probes_window_counts_the_sidecars_it_expected() {
    use agent_sim_fleet::scenario::{Phase, Scenario};
    let t = start().await;
    let m = metrics();
    let f = DataplaneFactory::new(
        DataplaneConfig {
            probe: probe(),
            ..config(&t)
        },
        m.clone(),
    )
    .unwrap();
    let fc = FleetConfig {
        // Back 1 s to 2 s after the storm (jittered first delay).
        backoff: agent_sim_fleet::Backoff::new(Duration::from_secs(2), Duration::from_secs(30)),
        scenario: Scenario {
            phases: vec![Phase::Storm {
                at: Duration::from_millis(2_100),
                share: 0.5,
            }],
        },
        ..fleet(200, Duration::from_millis(5_800))
    };
    let (report, probes) = run(f, fc, &m).await;
    assert_eq!(report.connected_at_end, 200);
    assert_eq!(report.sessions_lost["scenario_storm"], 100);
    assert_eq!(probes.len(), 2, "{probes:?}");
    let (first, second) = (&probes[0], &probes[1]);
    // Written at 2 s, delivered after the server's 200 ms coalescing: the
    // stormed half had not had it; some were back before 3.5 s.
    assert_eq!(first.expected, 200, "{first:?}");
    assert!(
        first.delivered > 100 && first.delivered < 200,
        "the stormed sidecars back in the window count: {first:?}"
    );
    assert!(
        second.expected >= 100 && second.expected <= 200,
        "{second:?}"
    );
    assert_eq!(second.delivered, second.expected, "{second:?}");
}

#[tokio::test(start_paused = true)]
async fn one_probe_is_timed_at_subscribe_agents_and_at_sidecars() {
    let t = start().await;
    let m = metrics();
    let consul = ConsulFactory::new(
        ConsulConfig {
            conn: agent_sim_consul::Connection {
                targets: vec![t.rpc.to_string()],
                http_target: t.http.to_string(),
                ..agent_sim_consul::Connection::to(&[])
            },
            probe: probe(),
            session_ttl: None,
            ..ConsulConfig::default()
        },
        m.clone(),
    )
    .unwrap();
    let dp = DataplaneFactory::new(
        DataplaneConfig {
            probe: probe(),
            ..config(&t)
        },
        m.clone(),
    )
    .unwrap();
    let runner = dp.attach_to_consul(&consul).expect("same probe service");
    let stop = CancellationToken::new();
    let probes = tokio::spawn(runner.run(stop.clone()));
    let end = Duration::from_millis(3800);
    let (a, b) = tokio::join!(
        run_fleet(consul, fleet(50, end), &m),
        run_fleet(dp, fleet(50, end), &m)
    );
    stop.cancel();
    let probes = probes.await.unwrap();
    assert_eq!((a.connected_at_end, b.connected_at_end), (50, 50));
    assert_eq!(probes.len(), 2, "{probes:?}");
    let (sub, xds) = (&probes[0], &probes[1]);
    assert_eq!((sub.id, xds.id), (1, 1), "one change");
    assert_eq!(sub.t0, xds.t0);
    assert_eq!(sub.fleet, None);
    assert_eq!(xds.fleet.as_deref(), Some("consul-dataplane"));
    assert_eq!((sub.delivered, sub.expected), (50, 50), "{sub:?}");
    assert_eq!((xds.delivered, xds.expected), (50, 50), "{xds:?}");
    // Subscribe streams get the change at once; proxies after the
    // coalescing delay.
    assert!(sub.latency_us.max < 200_000, "{sub:?}");
    assert!(xds.latency_us.min >= 150_000, "{xds:?}");
}

#[tokio::test(start_paused = true)]
async fn adopted_proxies_are_served_and_left_in_place() {
    let t = start().await;
    for i in 0..3u8 {
        register_proxy(
            &t,
            &format!("node-{i}"),
            i + 1,
            "web",
            &format!("web-{i}"),
            &["api"],
        )
        .await;
    }
    register_proxy(&t, "node-api", 9, "api", "api-1", &[]).await;
    let before = t.nodes().await;
    let m = metrics();
    let cfg = DataplaneConfig {
        adopt: Some(Adopt {
            proxy_id: "web-{i}-sidecar-proxy".into(),
            node: "node-{i}".into(),
        }),
        ..config(&t)
    };
    let f = DataplaneFactory::new(cfg, m.clone()).unwrap();
    let (report, _) = run(f, fleet(3, Duration::from_secs(2)), &m).await;
    let s = m.snapshot();
    assert_eq!(report.connected_at_end, 3, "{s:?}");
    assert_eq!(s.counter("registrations"), 0);
    assert_eq!(s.counter("deregistrations"), 0);
    // api (one endpoint) and local_app per proxy.
    assert_eq!(s.counter("eds_updates"), 3);
    assert_eq!(
        t.nodes().await,
        before,
        "adopting registers and removes nothing"
    );
}

#[tokio::test(start_paused = true)]
async fn a_server_at_its_stream_cap_sends_sidecars_to_the_next_one() {
    let capped = start_with(ConsulTargetConfig {
        xds_max_streams: 1,
        ..ConsulTargetConfig::default()
    })
    .await;
    let other = start().await;
    let m = metrics();
    // Both gRPC ports; registration through the capped server's HTTP API
    // (the two embedded servers do not share a catalog: the second one
    // gets the sidecars' registrations through adoption below).
    for i in 0..4u8 {
        for t in [&capped, &other] {
            register_proxy(
                t,
                &format!("node-{i}"),
                i + 1,
                "web",
                &format!("web-{i}"),
                &[],
            )
            .await;
        }
    }
    let cfg = DataplaneConfig {
        conn: agent_sim_consul::Connection {
            targets: vec![capped.grpc.to_string(), other.grpc.to_string()],
            http_target: capped.http.to_string(),
            ..agent_sim_consul::Connection::to(&[])
        },
        adopt: Some(Adopt {
            proxy_id: "web-{i}-sidecar-proxy".into(),
            node: "node-{i}".into(),
        }),
        ..DataplaneConfig::default()
    };
    let f = DataplaneFactory::new(cfg, m.clone()).unwrap();
    let mut fc = fleet(4, Duration::from_secs(8));
    fc.backoff = agent_sim_fleet::Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
    let (report, _) = run(f, fc, &m).await;
    let s = m.snapshot();
    assert_eq!(report.connected_at_end, 4, "{s:?}");
    assert_eq!(capped.state.stats().xds_streams, 1);
    assert!(capped.state.stats().xds_streams_refused >= 1);
    assert_eq!(other.state.stats().xds_streams, 3);
    let e = &s.errors;
    assert!(e.get("xds_stream_cap").copied().unwrap_or(0) >= 1, "{e:?}");
    let sample = m
        .error_report()
        .into_iter()
        .find(|k| k.kind == "xds_stream_cap")
        .and_then(|k| k.stat.sample)
        .unwrap();
    assert!(sample.contains("too many xDS streams"), "{sample}");
}
