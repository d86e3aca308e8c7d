//! What the memory measurements of the Consul agents (`memory.rs`) and of
//! the dataplane sidecars (`crates/dataplane/tests/memory.rs`, through
//! `#[path]`) share: the server half's backend, the fleet they measure, and
//! how RSS is read.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use agent_sim_fleet::{AgentFactory, FleetConfig, FleetReport, FleetStatus};
use agent_sim_metrics::Metrics;
use agent_sim_server::backend::{Backend, BackendConfig, ConsulAddrs};
use agent_sim_server::consul::ConsulTargetConfig;
use tokio_util::sync::CancellationToken;

/// This process's resident memory in KiB.
pub fn rss_kib() -> u64 {
    agent_sim_metrics::process::rss_bytes() / 1024
}

/// `n` agents of `factory` started at 2,000/s, until `stop`.
pub fn run_fleet<F: AgentFactory>(
    n: u64,
    factory: F,
    m: &Metrics,
    status: &Arc<FleetStatus>,
    stop: &CancellationToken,
) -> impl Future<Output = FleetReport> + use<F> {
    let fleet = FleetConfig {
        agents: n,
        ramp: Some(agent_sim_fleet::Rate::per_second(2000.0)),
        duration: None,
        grace: Duration::from_secs(10),
        ..FleetConfig::default()
    };
    agent_sim_fleet::run(
        fleet,
        Arc::new(factory),
        m.clone(),
        status.clone(),
        stop.clone(),
    )
}

/// The embedded Consul server on 127.0.0.1:0 (with its public gRPC port).
pub async fn backend(grpc: bool) -> Backend {
    let any = || "127.0.0.1:0".parse().unwrap();
    let consul = ConsulAddrs {
        rpc: any(),
        http: any(),
        grpc: grpc.then(any),
        cfg: ConsulTargetConfig::default(),
        state: None,
    };
    let cfg = BackendConfig {
        consul: Some(consul),
        ..BackendConfig::default()
    };
    Backend::start(cfg).await.unwrap()
}
