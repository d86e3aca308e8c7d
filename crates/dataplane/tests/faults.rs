//! The `consul.xds` rows of the fault matrix (TESTING.md): faults the
//! embedded server injects on Delta ADS streams and responses, against a
//! small sidecar fleet in-process on 127.0.0.1:0 (paused time: the
//! coalescing delay, backoffs and injected delays pass at once), with the
//! count injected compared with what the sidecars report.

use std::time::Duration;

use agent_sim_dataplane::DataplaneFactory;
use agent_sim_fleet::{Backoff, FleetConfig, FleetReport, Rate};
use agent_sim_metrics::Metrics;
use agent_sim_server::consul::ConsulTargetConfig;
use agent_sim_server::faults::Faults;

use crate::common::*;

/// The embedded target with `specs` armed (seed 7), its clock started.
async fn faulty(specs: &[&str]) -> (Target, Faults) {
    let specs = specs.iter().map(|s| s.parse().unwrap()).collect();
    let faults = Faults::new(specs, 7);
    let t = start_with(ConsulTargetConfig {
        faults: faults.clone(),
        ..ConsulTargetConfig::default()
    })
    .await;
    faults.start();
    (t, faults)
}

/// `agents` sidecars of `t` for `secs`, reconnecting after 100 ms .. 1 s.
async fn run(t: &Target, agents: u64, secs: u64, m: &Metrics) -> FleetReport {
    let f = DataplaneFactory::new(config(t), m.clone()).unwrap();
    let fc = FleetConfig {
        agents,
        ramp: Some(Rate::per_second(2000.0)),
        duration: Some(Duration::from_secs(secs)),
        grace: Duration::from_secs(5),
        backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(1)),
        ..FleetConfig::default()
    };
    run_fleet(f, fc, m).await
}

fn errors(m: &Metrics, kind: &str) -> u64 {
    m.snapshot().errors.get(kind).copied().unwrap_or(0)
}

fn sample(m: &Metrics, kind: &str) -> String {
    m.error_report()
        .into_iter()
        .find(|k| k.kind == kind)
        .and_then(|k| k.stat.sample)
        .unwrap_or_else(|| panic!("no {kind} sample"))
}

#[tokio::test(start_paused = true)]
async fn bad_resources_are_nacked_and_sent_again_after_a_catalog_change() {
    let spec = "consul.xds=bad-resource@100%,max:3";
    let (t, faults) = faulty(&[spec]).await;
    let m = metrics();
    // A NACKed proxy gets nothing more until its upstreams change (as
    // Consul does): an instance of `web` comes at 1 s.
    let change = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        register_proxy(&t, "up-0", 1, "web", "web-0", &[]).await;
    };
    let (report, ()) = tokio::join!(run(&t, 10, 3, &m), change);
    let s = m.snapshot();
    assert_eq!(faults.snapshot().count(spec), 3);
    assert_eq!(s.counter("xds_nacks"), 3, "{s:?}");
    assert_eq!(t.state.stats().xds_nacks, 3);
    assert_eq!(errors(&m, "xds_nack"), 3);
    assert!(sample(&m, "xds_nack").contains("wire type"));
    // A NACK ends no stream; every sidecar is configured in the end.
    assert_eq!(report.connected_at_end, 10, "{report:?} {s:?}");
    assert!(report.sessions_lost.is_empty(), "{report:?}");
    assert_eq!(t.state.stats().xds_streams, 10);
}

#[tokio::test(start_paused = true)]
async fn streams_refused_or_reset_at_open_are_retried_with_backoff() {
    let reset = "consul.xds=reset@100%,max:2";
    let exhausted = "consul.xds=resource-exhausted@100%,max:2";
    let (t, faults) = faulty(&[reset, exhausted]).await;
    let m = metrics();
    let report = run(&t, 4, 3, &m).await;
    let f = faults.snapshot();
    assert_eq!((f.count(reset), f.count(exhausted)), (2, 2));
    assert_eq!(report.connected_at_end, 4, "{report:?} {:?}", m.snapshot());
    assert_eq!(errors(&m, "xds_stream_cap"), 2);
    assert!(sample(&m, "xds_stream_cap").contains("too many xDS streams"));
    // A reset connection: the open call fails in tonic's words for a call
    // whose connection went away (or, should the connection's driver
    // notice first, as the connection's error).
    let s = m.snapshot();
    let (unknown, conn) = (errors(&m, "grpc_unknown"), errors(&m, "conn_error"));
    assert_eq!(unknown + conn, 2, "{:?}", s.errors);
    if unknown > 0 {
        assert_eq!(sample(&m, "grpc_unknown"), "gRPC Unknown: connection error");
    }
    assert_eq!(s.errors.values().sum::<u64>(), 4, "{:?}", s.errors);
    // 4 streams refused, then one stream each.
    assert_eq!(t.state.stats().xds_streams, 4);
    assert_eq!(s.counter("xds_streams"), 8);
}

#[tokio::test(start_paused = true)]
async fn live_streams_reset_or_drained_at_a_time_come_back_and_resume() {
    let reset = "consul.xds=reset@at:1s";
    let drained = "consul.xds=resource-exhausted@at:2s";
    let (t, faults) = faulty(&[reset, drained]).await;
    let m = metrics();
    let report = run(&t, 5, 4, &m).await;
    let f = faults.snapshot();
    assert_eq!((f.count(reset), f.count(drained)), (5, 5));
    assert_eq!(report.connected_at_end, 5, "{report:?}");
    assert_eq!(report.sessions_lost.values().sum::<u64>(), 10, "{report:?}");
    // The resets (the connection's error; tonic's words for the stream
    // should the stream notice first).
    let lost = |k| report.sessions_lost.get(k).copied().unwrap_or(0);
    assert_eq!(lost("conn_error") + lost("grpc_unknown"), 5, "{report:?}");
    assert_eq!(report.sessions_lost.get("xds_stream_cap"), Some(&5));
    let st = t.state.stats();
    assert_eq!(st.xds_streams, 15);
    // Each stream after a loss offers the versions it held.
    assert_eq!(st.xds_streams_resumed, 10, "{st:?}");
}

#[tokio::test(start_paused = true)]
async fn garbage_is_a_decode_error_of_that_stream_and_the_sidecar_comes_back() {
    let spec = "consul.xds=garbage@100%,max:2";
    let (t, faults) = faulty(&[spec]).await;
    let m = metrics();
    let report = run(&t, 4, 3, &m).await;
    assert_eq!(faults.snapshot().count(spec), 2);
    assert_eq!(errors(&m, "xds_decode"), 2, "{:?}", m.snapshot().errors);
    assert!(sample(&m, "xds_decode").contains("failed to decode Protobuf"));
    assert_eq!(report.connected_at_end, 4, "{report:?}");
    assert_eq!(t.state.stats().xds_streams, 6);
}

#[tokio::test(start_paused = true)]
async fn delayed_responses_make_the_first_configuration_late() {
    let spec = "consul.xds=delay:500ms@100%";
    let (t, faults) = faulty(&[spec]).await;
    let m = metrics();
    let report = run(&t, 4, 3, &m).await;
    assert_eq!(report.connected_at_end, 4, "{report:?}");
    assert!(m.snapshot().errors.is_empty(), "{:?}", m.snapshot().errors);
    // Clusters, then endpoints, each 500 ms late, after the 200 ms
    // coalescing delay.
    let injected = faults.snapshot().count(spec);
    assert!(injected >= 8, "{injected}");
    m.collect();
    let initial = m.cumulative_of("xds_initial").unwrap();
    assert_eq!(initial.len(), 4);
    // (Microseconds, at the histogram's 3 significant figures.)
    let floor = initial.lowest_equivalent(1_200_000);
    assert!(initial.min() >= floor, "{}", initial.min());
    assert!(initial.max() < 1_500_000, "{}", initial.max());
}
