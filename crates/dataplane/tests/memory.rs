//! Memory per simulated sidecar (client RSS only: the embedded target runs
//! in a child process). Ignored by default; run it with
//! `cargo test -p agent-sim-dataplane --release --test memory -- --ignored --nocapture memory_per_sidecar`
//! (`AGENT_SIM_MEM_AGENTS` = number of sidecars, default 2000).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use agent_sim_consul::{ProbeConfig, ProbeKind};
use agent_sim_dataplane::{DataplaneConfig, DataplaneFactory};
use agent_sim_fleet::FleetStatus;
use agent_sim_testkit::child;
use tokio_util::sync::CancellationToken;

mod common;
#[path = "../../consul/tests/measure/mod.rs"]
mod measure;
use measure::{backend, rss_kib, run_fleet};

const SERVE_ENV: &str = "AGENT_SIM_DATAPLANE_MEMORY_SERVE";

/// The server half of [`memory_per_sidecar`], in its child process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn serve_helper() {
    child::only_as_child(SERVE_ENV, "serve_helper", "memory_per_sidecar");
    let b = backend(true).await;
    let (ga, (_, ha)) = (b.consul_grpc_addr().unwrap(), b.consul_addrs().unwrap());
    child::serve_for_parent(&[ga, ha]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn memory_per_sidecar() {
    let n = child::mem_agents(2000);
    let server = child::ChildServer::spawn(SERVE_ENV, "serve_helper");
    let (grpc, http) = (server.addrs[0].clone(), server.addrs[1].clone());
    let m = common::metrics();
    // Upstreams web, api and the probe service: three EDS clusters and
    // local_app per sidecar, and the WatchServers stream.
    let cfg = DataplaneConfig {
        conn: agent_sim_consul::Connection {
            targets: vec![grpc],
            http_target: http,
            ..agent_sim_consul::Connection::to(&[])
        },
        watch_servers: true,
        probe: ProbeConfig {
            kind: Some(ProbeKind::Catalog),
            every: Duration::from_secs(3600),
            ..ProbeConfig::default()
        },
        ..DataplaneConfig::default()
    };
    let factory = DataplaneFactory::new(cfg, m.clone()).unwrap();
    let status = Arc::new(FleetStatus::default());
    let stop = CancellationToken::new();
    let start = || tokio::spawn(run_fleet(n, factory, &m, &status, &stop));
    let (run, base, up) = child::rss_around(rss_kib, start, async || {
        status.ever_connected.load(Ordering::Relaxed) >= n
    })
    .await;
    let s = m.snapshot();
    let per = up.saturating_sub(base) as f64 / n as f64;
    println!(
        "{n} sidecars: RSS {base} KiB → {up} KiB = {per:.1} KiB per sidecar (eds updates {}, \
         acks {}, errors {:?})",
        s.counter("eds_updates"),
        s.counter("xds_acks"),
        s.errors
    );
    stop.cancel();
    let _ = run.await;
    drop(server);
    assert!(per <= BUDGET_KIB, "{per:.1} KiB per sidecar");
}

/// The budget of one sidecar (one HTTP/2 connection, the ADS and
/// WatchServers streams, its xDS state), set from the measurement: 52.9
/// KiB per sidecar at 1,000 sidecars in a debug build (2026-11-23).
const BUDGET_KIB: f64 = 60.0;
