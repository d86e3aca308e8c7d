//! The fault matrix of TESTING.md: every fault `agent-sim serve --faults`
//! injects, against agents of the protocol it hits, with the count injected
//! compared with what the run reports (summary or metrics). Each test
//! starts its own backend in-process on 127.0.0.1:0 (real sockets, real
//! time, bounded), most with `max:N` so that counts are exact.
//!
//! - `sensu.rs`: upgrade, session and frame faults against Sensu agents.
//! - `consul.rs`: RPC, Subscribe, frame and HTTP faults against Consul agents.
//! - `restart.rs`: backend restarts with and without state, both fleets.
//! - `serve.rs`: the `agent-sim serve --faults` command itself.
//!
//! The `consul.xds` rows (Delta ADS streams and responses) are tested
//! against sidecars on paused time in `crates/dataplane/tests/faults.rs`.

use crate::common;
mod consul;
mod late;
mod restart;
mod sensu;
mod serve;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use agent_sim::{Kind, Ramp, RunBuilder};
use agent_sim_fleet::{AgentFactory, Backoff, FleetConfig, FleetReport, FleetStatus};
use agent_sim_metrics::summary::KindEntry;
use agent_sim_metrics::{KindReport, Metrics, MetricsSpec, Summary};
use agent_sim_server::backend::{Backend, BackendConfig, ConsulAddrs};
use agent_sim_server::consul::ConsulTargetConfig;
use agent_sim_server::faults::FaultSpec;
use agent_sim_server::sensu::SensuTargetConfig;
use tokio_util::sync::CancellationToken;

/// Every test body runs under this bound.
pub async fn bounded<T>(limit: Duration, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, f)
        .await
        .expect("the test exceeded its bound")
}

pub fn specs(faults: &[&str]) -> Vec<FaultSpec> {
    faults.iter().map(|s| s.parse().unwrap()).collect()
}

fn any() -> std::net::SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// A backend on 127.0.0.1:0 serving Sensu and/or Consul with `faults`.
pub async fn backend(sensu: bool, consul: bool, faults: &[&str]) -> Backend {
    Backend::start(BackendConfig {
        sensu: sensu.then(|| (any(), SensuTargetConfig::default())),
        consul: consul.then(|| ConsulAddrs {
            rpc: any(),
            http: any(),
            grpc: None,
            cfg: ConsulTargetConfig::default(),
            state: None,
        }),
        faults: specs(faults),
        faults_seed: 11,
        ..BackendConfig::default()
    })
    .await
    .unwrap()
}

/// A Sensu run of `agents` against `b` for `secs`, retrying fast.
pub fn sensu_run(b: &Backend, agents: u64, secs: f64) -> RunBuilder {
    RunBuilder::new(Kind::Sensu)
        .agents(agents)
        .ramp(Ramp::All)
        .target(format!("ws://{}/", b.sensu_addr().unwrap()))
        .duration(Duration::from_secs_f64(secs))
        .args(|a| {
            a.reconnect_min = Some("50ms".parse().unwrap());
            a.reconnect_max = Some("500ms".parse().unwrap());
        })
}

/// A Consul run of `agents` (upstream `web`, no probe) against `b`.
pub fn consul_run(b: &Backend, agents: u64, secs: f64) -> RunBuilder {
    let (rpc, http) = b.consul_addrs().unwrap();
    RunBuilder::new(Kind::Consul)
        .agents(agents)
        .ramp(Ramp::All)
        .target(rpc.to_string())
        .duration(Duration::from_secs_f64(secs))
        .args(move |a| {
            a.http_target = Some(http.to_string());
            a.upstreams = Some("web".parse().unwrap());
            a.probe = Some("off".parse().unwrap());
            a.reconnect_min = Some("50ms".parse().unwrap());
            a.reconnect_max = Some("500ms".parse().unwrap());
        })
}

/// [`consul_run`] with the agents on the HTTP API (`--consul-agent api`):
/// the rows of the matrix about that API's calls, and those that count one
/// RPC connection per agent.
pub fn consul_api_run(b: &Backend, agents: u64, secs: f64) -> RunBuilder {
    consul_run(b, agents, secs).args(|a| a.consul_agent = Some("api".parse().unwrap()))
}

/// A recorder for the engine's names and a protocol's `spec`.
pub fn metrics(spec: &MetricsSpec) -> Metrics {
    Metrics::new(&agent_sim_fleet::metrics_spec().merge(spec), 4)
}

/// `agents` agents of `factory` (recording into `m`) for `secs`, all at
/// once and retrying fast, through the fleet engine itself: for the
/// protocol settings the command line does not expose (timeouts, pings).
pub async fn fleet_run<F: AgentFactory>(
    factory: F,
    m: &Metrics,
    agents: u64,
    secs: f64,
) -> FleetReport {
    agent_sim_fleet::run(
        FleetConfig {
            agents,
            ramp: None,
            backoff: Backoff::new(Duration::from_millis(50), Duration::from_millis(500)),
            duration: Some(Duration::from_secs_f64(secs)),
            grace: Duration::from_secs(2),
            ..FleetConfig::default()
        },
        Arc::new(factory),
        m.clone(),
        Arc::new(FleetStatus::default()),
        CancellationToken::new(),
    )
    .await
}

/// The error kind `kind` a recorder counted (panics with every kind it
/// counted when it is missing).
pub fn reported(m: &Metrics, kind: &str) -> KindReport {
    m.error_report()
        .into_iter()
        .find(|k| k.kind == kind)
        .unwrap_or_else(|| panic!("no {kind} in {:#?}", m.error_report()))
}

/// The error kind `kind` of a summary (panics with the summary's errors
/// when it is missing).
pub fn error<'a>(s: &'a Summary, kind: &str) -> &'a KindEntry {
    s.errors
        .get(kind)
        .unwrap_or_else(|| panic!("no {kind} in {:#?}", s.errors))
}

/// Asserts the run ended complete: every requested agent connected, exit 0.
pub fn assert_complete(o: &agent_sim::run::RunOutcome) {
    let s = &o.summary;
    assert_eq!(o.exit_code, 0, "{:?} errors {:#?}", s.outcome, s.errors);
    assert_eq!(s.agents.connected, s.agents.requested, "{:?}", s.outcome);
    // Every kind the faults made counted comes with what to check.
    common::assert_hinted(s);
}

/// Runs `run` to its end, stops `b` and asserts the run ended complete;
/// the run's summary.
pub async fn complete(b: &Backend, run: RunBuilder) -> Summary {
    let o = run.run().await.unwrap();
    b.stop().await;
    assert_complete(&o);
    o.summary
}

/// Registers `n` instances of `web` (nodes `up-<i>`) on a Consul backend.
pub async fn web_instances(b: &Backend, n: usize) {
    let (_, http) = b.consul_addrs().unwrap();
    let api = agent_sim_consul::http::HttpApi::new(http, None, "").unwrap();
    for i in 0..n {
        let body = serde_json::json!({
            "Node": format!("up-{i}"), "Address": format!("10.8.0.{i}"),
            "Service": {"ID": format!("web-{i}"), "Service": "web", "Port": 8080}});
        api.put("/v1/catalog/register", bytes::Bytes::from(body.to_string()))
            .await
            .unwrap();
    }
}
