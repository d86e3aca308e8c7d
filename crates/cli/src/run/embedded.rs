//! The embedded reference backends of a demo run (no `--target`): bound on
//! 127.0.0.1:0 in this process, the fleets pointed at them, stopped and
//! their counters read at the end.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use agent_sim_server::consul::{ConsulState, ConsulTargetConfig};
use agent_sim_server::sensu::{CheckSpec, SensuTargetConfig, SensuTargetStats};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::RunError;
use crate::plan::{Protocol, RunConfig};

/// The in-process backends of a demo run.
pub(super) struct Embedded {
    token: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    sensu_stats: Option<Arc<SensuTargetStats>>,
    consul_state: Option<ConsulState>,
    /// The embedded Consul's HTTP API and public gRPC port, once started.
    consul_http: Option<SocketAddr>,
    consul_grpc: Option<SocketAddr>,
}

pub(super) async fn start(cfg: &mut RunConfig) -> Result<Embedded, RunError> {
    let token = CancellationToken::new();
    let mut emb = Embedded {
        token: token.clone(),
        tasks: Vec::new(),
        sensu_stats: None,
        consul_state: None,
        consul_http: None,
        consul_grpc: None,
    };
    let local: SocketAddr = ([127, 0, 0, 1], 0).into();
    let cfg_check_interval = cfg.embedded_check_interval;
    let bind = |what: &str| {
        agent_sim_server::listen::bind(local, false)
            .map_err(|e| RunError::Io(format!("embedded {what} target: bind 127.0.0.1: {e}")))
    };
    for plan in cfg.fleets.iter_mut().filter(|p| p.embedded) {
        match &mut plan.protocol {
            Protocol::Sensu(s) => {
                let listener = bind("sensu")?;
                let addr = listener
                    .local_addr()
                    .map_err(|e| RunError::Io(e.to_string()))?;
                let tcfg = SensuTargetConfig {
                    namespaces: vec![s.namespace.clone()],
                    user: s.user.clone(),
                    password: s.password.clone(),
                    checks: vec![CheckSpec {
                        name: "agent-sim-check".into(),
                        command: "!sensu_test_check!".into(),
                        interval: cfg_check_interval,
                        subscriptions: s.subscriptions.clone(),
                    }],
                    ..SensuTargetConfig::default()
                };
                let stats = Arc::new(SensuTargetStats::default());
                emb.sensu_stats = Some(stats.clone());
                let t = token.clone();
                emb.tasks.push(tokio::spawn(async move {
                    if let Err(e) = agent_sim_server::sensu::serve(listener, tcfg, stats, t).await {
                        eprintln!("agent-sim: embedded sensu target: {e}");
                    }
                }));
                s.targets = vec![format!("ws://{addr}/")];
            }
            Protocol::Consul(c) => {
                let state = emb
                    .consul_state
                    .get_or_insert_with(|| ConsulState::new(ConsulTargetConfig::default()))
                    .clone();
                let rpc = bind("consul rpc")?;
                let http = bind("consul http")?;
                let rpc_addr = rpc.local_addr().map_err(|e| RunError::Io(e.to_string()))?;
                let http_addr = http.local_addr().map_err(|e| RunError::Io(e.to_string()))?;
                let (t1, t2, s2) = (token.clone(), token.clone(), state.clone());
                emb.tasks.push(tokio::spawn(async move {
                    if let Err(e) = agent_sim_server::consul::serve_rpc(rpc, state, t1).await {
                        eprintln!("agent-sim: embedded consul rpc target: {e}");
                    }
                }));
                emb.tasks.push(tokio::spawn(async move {
                    if let Err(e) = agent_sim_server::consul::serve_http(http, s2, t2).await {
                        eprintln!("agent-sim: embedded consul http target: {e}");
                    }
                }));
                c.conn.targets = vec![rpc_addr.to_string()];
                c.conn.http_target = http_addr.to_string();
                emb.consul_http.get_or_insert(http_addr);
            }
            Protocol::Dataplane(d) => {
                let state = emb
                    .consul_state
                    .get_or_insert_with(|| ConsulState::new(ConsulTargetConfig::default()))
                    .clone();
                if emb.consul_http.is_none() {
                    let http = bind("consul http")?;
                    emb.consul_http =
                        Some(http.local_addr().map_err(|e| RunError::Io(e.to_string()))?);
                    let (t, s) = (token.clone(), state.clone());
                    emb.tasks.push(tokio::spawn(async move {
                        if let Err(e) = agent_sim_server::consul::serve_http(http, s, t).await {
                            eprintln!("agent-sim: embedded consul http target: {e}");
                        }
                    }));
                }
                if emb.consul_grpc.is_none() {
                    let grpc = bind("consul grpc")?;
                    emb.consul_grpc =
                        Some(grpc.local_addr().map_err(|e| RunError::Io(e.to_string()))?);
                    let t = token.clone();
                    emb.tasks.push(tokio::spawn(async move {
                        if let Err(e) = agent_sim_server::consul::serve_grpc(grpc, state, t).await {
                            eprintln!("agent-sim: embedded consul grpc target: {e}");
                        }
                    }));
                }
                if let (Some(h), Some(g)) = (emb.consul_http, emb.consul_grpc) {
                    d.conn.targets = vec![g.to_string()];
                    d.conn.http_target = h.to_string();
                }
            }
        }
    }
    Ok(emb)
}

/// What the embedded backends counted.
pub(super) type Counts = (
    Option<agent_sim_server::sensu::SensuTargetSnapshot>,
    Option<agent_sim_server::consul::ConsulTargetSnapshot>,
);

impl Embedded {
    /// Stops the backends (bounded) and returns what they counted.
    pub(super) async fn stop(self) -> Counts {
        self.token.cancel();
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(3), t).await;
        }
        (
            self.sensu_stats.as_ref().map(|s| s.snapshot()),
            self.consul_state.as_ref().map(|s| s.stats()),
        )
    }
}
