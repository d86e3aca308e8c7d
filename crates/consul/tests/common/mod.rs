//! Helpers of the Consul integration tests: the embedded target on
//! 127.0.0.1 (restartable on the same ports), configs, metrics and
//! one-session runs (states are waited for with `testkit::bounded::until`).

#![allow(dead_code)]

pub mod agent_rpc;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use agent_sim_consul::gossip::GossipConfig;
use agent_sim_consul::http::HttpApi;
use agent_sim_consul::{ConsulConfig, ConsulFactory, ProbeConfig, ProbeKind, metrics_spec};
use agent_sim_fleet::{Agent, FleetConfig, FleetReport, FleetStatus, SessionCx, SessionEnd};
use agent_sim_metrics::{Metrics, ProbeSummary};
use agent_sim_server::backend::{Backend, BackendConfig, ConsulAddrs};
use agent_sim_server::consul::{
    ConsulState, ConsulTargetConfig, SerfConfig, serve_http, serve_rpc,
};
use bytes::Bytes;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub struct Target {
    pub state: ConsulState,
    pub rpc: SocketAddr,
    pub http: SocketAddr,
    pub stop: CancellationToken,
    tasks: Vec<JoinHandle<std::io::Result<()>>>,
}

impl Drop for Target {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Target {
    /// Serves `state` on `rpc` / `http` (port 0: any).
    pub async fn serve(state: ConsulState, rpc: SocketAddr, http: SocketAddr) -> Target {
        let rpc_l = TcpListener::bind(rpc).await.unwrap();
        let http_l = TcpListener::bind(http).await.unwrap();
        let stop = CancellationToken::new();
        let rpc = rpc_l.local_addr().unwrap();
        let http = http_l.local_addr().unwrap();
        let tasks = vec![
            tokio::spawn(serve_rpc(rpc_l, state.clone(), stop.clone())),
            tokio::spawn(serve_http(http_l, state.clone(), stop.clone())),
        ];
        Target {
            state,
            rpc,
            http,
            stop,
            tasks,
        }
    }

    /// Stops the server (its connections close) and starts a new one with
    /// an empty catalog on the same ports: a restart that lost its state.
    pub async fn restart_empty(mut self) -> Target {
        self.stop.cancel();
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
        let state = ConsulState::new(ConsulTargetConfig::default());
        Target::serve(state, self.rpc, self.http).await
    }

    /// An HTTP client of this server.
    pub fn api(&self) -> HttpApi {
        HttpApi::new(self.http, None, "").unwrap()
    }
}

pub async fn start_target() -> Target {
    start_with(ConsulTargetConfig::default()).await
}

/// A target with `cfg`, holding upstream instances web-1, web-2 and api-1.
pub async fn start_with(cfg: ConsulTargetConfig) -> Target {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let t = Target::serve(ConsulState::new(cfg), any, any).await;
    // Upstream instances the agents will see.
    let api = HttpApi::new(t.http, None, "").unwrap();
    for (node, id, svc, n) in [
        ("sim-node-1", "web-1", "web", 1),
        ("sim-node-2", "web-2", "web", 2),
        ("sim-node-3", "api-1", "api", 3),
    ] {
        let body = serde_json::json!({
            "Node": node, "Address": format!("10.9.0.{n}"),
            "Service": {"ID": id, "Service": svc, "Port": 8080},
            "Check": {"CheckID": format!("{id}-ttl"), "Name": "ttl", "ServiceID": id,
                      "Status": "passing"}});
        api.put("/v1/catalog/register", Bytes::from(body.to_string()))
            .await
            .unwrap();
    }
    t
}

/// The embedded backend on 127.0.0.1 with its RPC and HTTP ports and the
/// serf LAN port of `serf` (its `bind` taken as any free port).
pub async fn serf_backend(serf: SerfConfig) -> Backend {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    Backend::start(BackendConfig {
        consul: Some(ConsulAddrs {
            rpc: any,
            http: any,
            grpc: None,
            cfg: ConsulTargetConfig {
                serf: Some(SerfConfig { bind: any, ..serf }),
                ..ConsulTargetConfig::default()
            },
            state: None,
        }),
        ..BackendConfig::default()
    })
    .await
    .unwrap()
}

/// Agents of `b` that gossip with its serf port from 127.0.0.1, with
/// `gossip`'s keys and timings.
pub fn gossiping(b: &Backend, gossip: GossipConfig) -> ConsulConfig {
    let (rpc, http) = b.consul_addrs().unwrap();
    ConsulConfig {
        conn: agent_sim_consul::Connection {
            targets: vec![rpc.to_string()],
            http_target: http.to_string(),
            ..agent_sim_consul::Connection::to(&[])
        },
        gossip: Some(GossipConfig {
            join: vec![b.consul_serf_addr().unwrap().to_string()],
            join_given: true,
            bind: vec!["127.0.0.1".into()],
            ..gossip
        }),
        ..ConsulConfig::default()
    }
}

pub fn config(t: &Target) -> ConsulConfig {
    ConsulConfig {
        conn: agent_sim_consul::Connection {
            targets: vec![t.rpc.to_string()],
            http_target: t.http.to_string(),
            ..agent_sim_consul::Connection::to(&[])
        },
        ..ConsulConfig::default()
    }
}

/// A probe of `kind` every `every`, each change given up after `timeout`.
pub fn probe(kind: ProbeKind, every: Duration, timeout: Duration) -> ProbeConfig {
    ProbeConfig {
        kind: Some(kind),
        every,
        timeout: Some(timeout),
        ..ProbeConfig::default()
    }
}

/// `agents` agents started at `per_second` (`None`: all at once), the run
/// ending after `run`.
pub fn fleet_of(agents: u64, per_second: Option<f64>, run: Duration) -> FleetConfig {
    FleetConfig {
        agents,
        ramp: per_second.map(agent_sim_fleet::Rate::per_second),
        duration: Some(run),
        ..FleetConfig::default()
    }
}

/// `config(t)` for an agent that only subscribes: no registration, no
/// TTL session.
pub fn subscriber(t: &Target) -> ConsulConfig {
    ConsulConfig {
        register: false,
        session_ttl: None,
        ..config(t)
    }
}

pub fn metrics() -> Metrics {
    Metrics::new(&metrics_spec().merge(&agent_sim_fleet::metrics_spec()), 4)
}

pub fn counter(m: &Metrics, name: &str) -> u64 {
    m.snapshot().counter(name)
}

/// Runs one session of `agent` while `script` runs; `script` gets the
/// session's token and must cancel it (or the session must end) to finish.
pub async fn with_session<A, F, Fut>(agent: &mut A, m: &Metrics, script: F) -> SessionEnd
where
    A: Agent,
    F: FnOnce(CancellationToken) -> Fut,
    Fut: Future<Output = ()>,
{
    let token = CancellationToken::new();
    let cx = SessionCx::standalone(0, m.clone(), token.clone());
    let session = agent.run_session(&cx);
    let (end, ()) = tokio::join!(session, script(token));
    end
}

/// Runs one session of `agent` until `cond` holds (within `limit`), then
/// ends it.
pub async fn session_until<A: Agent>(
    agent: &mut A,
    m: &Metrics,
    (limit, what): (Duration, &str),
    cond: impl AsyncFnMut() -> bool,
) -> SessionEnd {
    with_session(agent, m, |token| async move {
        agent_sim_testkit::bounded::until(limit, what, cond).await;
        token.cancel();
    })
    .await
}

/// Runs a fleet of `cfg` (and its probe runner, if any) to the end of `f`;
/// returns the fleet report and the probes measured.
pub async fn run_fleet(
    cfg: ConsulConfig,
    f: FleetConfig,
    m: &Metrics,
) -> (FleetReport, Vec<ProbeSummary>) {
    let factory = ConsulFactory::new(cfg, m.clone()).unwrap();
    let stop = CancellationToken::new();
    let probes: Vec<_> = factory
        .probe_runners()
        .into_iter()
        .map(|r| tokio::spawn(r.run(stop.clone())))
        .collect();
    let report = agent_sim_fleet::run(
        f,
        std::sync::Arc::new(factory),
        m.clone(),
        std::sync::Arc::new(FleetStatus::default()),
        CancellationToken::new(),
    )
    .await;
    stop.cancel();
    let mut out = Vec::new();
    for p in probes {
        out.extend(p.await.unwrap());
    }
    (report, out)
}

/// The nodes a run with prefix `agent-sim` registered (by its node meta).
pub async fn run_nodes(t: &Target) -> Vec<serde_json::Value> {
    let path = "/v1/catalog/nodes?node-meta=agent-sim-prefix:agent-sim";
    let body = t
        .api()
        .call(http::Method::GET, path, Bytes::new())
        .await
        .unwrap();
    serde_json::from_slice(&body).unwrap()
}
