//! The embedded reference backends of a demo run (no `--target`): bound on
//! 127.0.0.1:0 in this process, `--embedded-servers` of them per protocol
//! (a Consul cluster's servers share one catalog, as its replicated state;
//! Sensu backends share nothing), the fleets pointed at all of them,
//! stopped and their counters read at the end. A `--server-down` stops one
//! for a while as a real server's connections close, and starts it again
//! on the same ports.

use std::net::SocketAddr;
use std::time::Duration;

use agent_sim_server::backend::{Backend, BackendConfig, ConsulAddrs};
use agent_sim_server::consul::{ConsulState, ConsulTargetConfig, SerfConfig};
use agent_sim_server::faults::RestartState;
use agent_sim_server::sensu::{CheckSpec, SensuTargetConfig};
use tokio::task::JoinHandle;

use super::RunError;
use crate::plan::{Protocol, RunConfig};
use crate::values::ServerDown;

/// The in-process backends of a demo run.
pub(super) struct Embedded {
    sensu: Vec<Backend>,
    consul: Vec<Backend>,
    /// The scheduled `--server-down`s.
    downs: Vec<JoinHandle<()>>,
}

fn any() -> SocketAddr {
    ([127, 0, 0, 1], 0).into()
}

fn io(what: &'static str) -> impl Fn(std::io::Error) -> RunError {
    move |source| RunError::EmbeddedBind { what, source }
}

/// `n` Sensu backends for a fleet of `s`'s settings.
async fn sensu_backends(
    s: &agent_sim_sensu::SensuConfig,
    check_interval: Duration,
    password_cost: Option<u32>,
    n: usize,
) -> Result<Vec<Backend>, RunError> {
    let tcfg = SensuTargetConfig {
        namespaces: vec![s.namespace.clone()],
        user: s.user.clone(),
        password: s.password.clone(),
        checks: vec![CheckSpec {
            name: "agent-sim-check".into(),
            command: "!sensu_test_check!".into(),
            interval: check_interval,
            subscriptions: s.subscriptions.clone(),
        }],
        password_cost,
        ..SensuTargetConfig::default()
    };
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let cfg = BackendConfig {
            sensu: Some((any(), tcfg.clone())),
            ..BackendConfig::default()
        };
        out.push(Backend::start(cfg).await.map_err(io("sensu"))?);
    }
    Ok(out)
}

/// `n` Consul servers sharing one catalog (with their public gRPC ports),
/// each a gossip member on a serf LAN port of its own when the agents
/// gossip (with their key and label).
async fn consul_servers(
    n: usize,
    gossip: Option<&agent_sim_consul::gossip::GossipConfig>,
) -> Result<Vec<Backend>, RunError> {
    let state = ConsulState::new(ConsulTargetConfig::default());
    let serf = match gossip {
        Some(g) => Some(SerfConfig {
            bind: any(),
            security: g.security()?,
            ..SerfConfig::default()
        }),
        None => None,
    };
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let cfg = BackendConfig {
            consul: Some(ConsulAddrs {
                rpc: any(),
                http: any(),
                grpc: Some(any()),
                cfg: ConsulTargetConfig {
                    serf: serf.clone(),
                    ..ConsulTargetConfig::default()
                },
                state: Some(state.clone()),
            }),
            ..BackendConfig::default()
        };
        out.push(Backend::start(cfg).await.map_err(io("consul"))?);
    }
    Ok(out)
}

pub(super) async fn start(cfg: &mut RunConfig) -> Result<Embedded, RunError> {
    let n = cfg.embedded_servers.max(1);
    let mut emb = Embedded {
        sensu: Vec::new(),
        consul: Vec::new(),
        downs: Vec::new(),
    };
    let check_interval = cfg.embedded_check_interval;
    for plan in cfg.fleets.iter_mut().filter(|p| p.embedded) {
        match &mut plan.protocol {
            Protocol::Sensu(s) => {
                if emb.sensu.is_empty() {
                    emb.sensu =
                        sensu_backends(s, check_interval, cfg.embedded_password_cost, n).await?;
                }
                s.targets = emb
                    .sensu
                    .iter()
                    .filter_map(Backend::sensu_addr)
                    .map(|a| format!("ws://{a}/"))
                    .collect();
            }
            Protocol::Consul(c) => {
                if emb.consul.is_empty() {
                    emb.consul = consul_servers(n, c.gossip.as_ref()).await?;
                }
                if let Some(g) = &mut c.gossip {
                    // The agents join the embedded servers' serf ports.
                    g.join = emb
                        .consul
                        .iter()
                        .filter_map(Backend::consul_serf_addr)
                        .map(|a| a.to_string())
                        .collect();
                    g.join_given = true;
                }
                let addrs: Vec<_> = emb
                    .consul
                    .iter()
                    .filter_map(Backend::consul_addrs)
                    .collect();
                c.conn.targets = addrs.iter().map(|(rpc, _)| rpc.to_string()).collect();
                if let Some((_, http)) = addrs.first() {
                    c.conn.http_target = http.to_string();
                }
            }
            Protocol::Dataplane(d) => {
                if emb.consul.is_empty() {
                    emb.consul = consul_servers(n, None).await?;
                }
                d.conn.targets = emb
                    .consul
                    .iter()
                    .filter_map(Backend::consul_grpc_addr)
                    .map(|a| a.to_string())
                    .collect();
                if let Some((_, http)) = emb.consul.first().and_then(Backend::consul_addrs) {
                    d.conn.http_target = http.to_string();
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
    /// Schedules the run's `--server-down`s, times from `started`: the
    /// server (of every protocol's set) stops, stays down, starts again.
    pub(super) fn schedule_downs(&mut self, downs: &[ServerDown], started: tokio::time::Instant) {
        for d in downs {
            let servers = [&self.sensu, &self.consul]
                .into_iter()
                .filter_map(|set| set.get(d.server).cloned());
            for b in servers {
                let (at, down) = (d.at, d.down);
                self.downs.push(tokio::spawn(async move {
                    tokio::time::sleep_until(started + at).await;
                    if let Err(e) = b.restart(down, RestartState::Keep).await {
                        eprintln!("agent-sim: --server-down: starting the server again: {e}");
                    }
                }));
            }
        }
    }

    /// Stops the backends (bounded) and returns what they counted.
    pub(super) async fn stop(self) -> Counts {
        for d in self.downs {
            d.abort();
        }
        for b in self.sensu.iter().chain(&self.consul) {
            b.stop().await;
        }
        let sensu = self
            .sensu
            .iter()
            .filter_map(Backend::sensu_stats)
            .reduce(|a, b| a.add(&b));
        // One catalog: every Consul server reports the same counters.
        let consul = self.consul.first().and_then(Backend::consul_stats);
        (sensu, consul)
    }
}
