//! The agents' gossip membership (`--gossip`, on with the client wire):
//! the run's [`agent_sim_gossip::Pool`], started by the first agent that
//! needs it, and what an agent asks of it (its member, its catalog address,
//! its coordinate). The pool's first push-pull checks the join address
//! once: when the default one (each target host, port 8301) does not
//! answer as a gossip port, gossip is off for the run with one warning,
//! rather than every agent's join failing.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use agent_sim_gossip::{
    ExchangeError, Keyring, News, Pool, PoolConfig, Security, ServerNews, Timings,
};
use agent_sim_metrics::{ErrorKindSpec, Metrics};

/// The gossip settings of a fleet.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GossipConfig {
    /// The servers' serf LAN addresses (`HOST:PORT`, resolved when the
    /// agents are built).
    pub join: Vec<String>,
    /// Whether `join` was given (`--gossip-join`) rather than derived from
    /// the targets: a given one that refuses is an error, a derived one a
    /// warning that turns gossip off.
    pub join_given: bool,
    /// Where the members listen (UDP and TCP: `IP` or `IP:PORT`); empty:
    /// the local address that routes to the first server, any port.
    pub bind: Vec<String>,
    /// `--gossip-key`: the cluster's `encrypt` keys, the primary first.
    pub keys: Vec<String>,
    /// `--gossip-label`.
    pub label: String,
    /// memberlist's intervals the pool runs on: a client agent's LAN
    /// defaults (no flag sets them; tests change them).
    pub timings: Timings,
}

/// Serf's LAN port, where a derived join address points.
pub const SERF_LAN_PORT: u16 = 8301;

/// Nothing answered on the derived join address.
pub const GOSSIP_OFF: ErrorKindSpec = ErrorKindSpec {
    kind: "gossip_off",
    hint: "nothing listens on the servers' serf LAN port where agent-sim looked (each target \
           host, port 8301): the agents are not gossip members in this run, and the servers \
           see less than real agents cost them; name the port with --gossip-join HOST:PORT, \
           or say --gossip off",
    heals: false,
    said_by: agent_sim_metrics::Speaker::Local,
};

/// Why the gossip settings cannot be used: one variant per mistake, in
/// the flag's words.
#[derive(Debug, thiserror::Error)]
pub enum GossipError {
    /// A key that is not one of the cluster's `encrypt` keys.
    #[error("--gossip-key: {0}")]
    Key(#[source] agent_sim_gossip::WireError),
    /// A label over 255 bytes.
    #[error("--gossip-label: at most 255 bytes")]
    Label,
    /// A join address that does not resolve.
    #[error("--gossip-join {join}: {source}")]
    Join {
        /// The address as given.
        join: String,
        /// What the resolver said.
        source: std::io::Error,
    },
    /// A join address that resolves to no address.
    #[error("--gossip-join {0}: no address")]
    JoinNoAddress(String),
    /// No join address at all.
    #[error("gossip: no server to join (--gossip-join)")]
    NoJoin,
    /// A bind address that is not an IP or IP:PORT.
    #[error("--gossip-bind {0}: not an IP or IP:PORT")]
    Bind(String),
}

impl GossipConfig {
    /// Checks the keys (a wrong one is refused in plain words before any
    /// agent starts).
    pub fn security(&self) -> Result<Security, GossipError> {
        let keyring = if self.keys.is_empty() {
            None
        } else {
            Some(Keyring::from_base64(&self.keys).map_err(GossipError::Key)?)
        };
        if self.label.len() > 255 {
            return Err(GossipError::Label);
        }
        Ok(Security {
            label: self.label.clone(),
            keyring,
        })
    }

    /// The join addresses, resolved.
    pub fn join_addrs(&self) -> Result<Vec<SocketAddr>, GossipError> {
        use std::net::ToSocketAddrs;
        self.join
            .iter()
            .map(|j| {
                j.to_socket_addrs()
                    .map_err(|source| GossipError::Join {
                        join: j.clone(),
                        source,
                    })?
                    .next()
                    .ok_or_else(|| GossipError::JoinNoAddress(j.clone()))
            })
            .collect()
    }

    /// The addresses to listen on: the given ones, or the local address
    /// that routes to the first server.
    pub fn bind_addrs(&self, join: &[SocketAddr]) -> Result<Vec<SocketAddr>, GossipError> {
        if !self.bind.is_empty() {
            return self
                .bind
                .iter()
                .map(|b| {
                    b.parse::<SocketAddr>()
                        .or_else(|_| b.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 0)))
                        .map_err(|_| GossipError::Bind(b.clone()))
                })
                .collect();
        }
        let ip = join
            .first()
            .and_then(|j| {
                let s = std::net::UdpSocket::bind((unspecified(j.ip()), 0)).ok()?;
                s.connect(j).ok()?;
                Some(s.local_addr().ok()?.ip())
            })
            .unwrap_or(IpAddr::from([127, 0, 0, 1]));
        Ok(vec![SocketAddr::new(ip, 0)])
    }
}

/// The join addresses derived from the agents' targets: each host on
/// serf's LAN port.
pub fn derived_join(targets: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for t in targets {
        let host = match t.rsplit_once(':') {
            Some((h, p)) if p.parse::<u16>().is_ok() => h,
            _ => t.as_str(),
        };
        let j = format!("{host}:{SERF_LAN_PORT}");
        if !out.contains(&j) {
            out.push(j);
        }
    }
    out
}

fn unspecified(like: IpAddr) -> IpAddr {
    match like {
        IpAddr::V4(_) => IpAddr::from([0, 0, 0, 0]),
        IpAddr::V6(_) => IpAddr::from([0u16; 8]),
    }
}

/// The run's gossip: settings, and the pool once started.
pub(crate) struct Gossip {
    cfg: GossipConfig,
    /// The agents' RPC targets: a derived join must find them among the
    /// pool's servers.
    rpc: Vec<SocketAddr>,
    security: Security,
    join: Vec<SocketAddr>,
    bind: Vec<SocketAddr>,
    datacenter: String,
    pool: tokio::sync::OnceCell<Membership>,
    metrics: Metrics,
}

/// What became of the run's gossip when its pool started.
enum Membership {
    /// The agents are members.
    Pool(Pool),
    /// Off for the run (the derived join address did not answer as a
    /// gossip port, or a given one failed): the agents run without it.
    Off,
    /// The servers' gossip security is not the run's (another key, or
    /// label): a real agent so set up never learns its servers, and no
    /// agent of the run holds a session (the kind and the words).
    Refused(&'static str, String),
}

impl Gossip {
    pub(crate) fn new(
        cfg: GossipConfig,
        rpc: Vec<SocketAddr>,
        datacenter: &str,
        metrics: Metrics,
    ) -> Result<Self, GossipError> {
        let security = cfg.security()?;
        let join = cfg.join_addrs()?;
        if join.is_empty() {
            return Err(GossipError::NoJoin);
        }
        let bind = cfg.bind_addrs(&join)?;
        Ok(Gossip {
            cfg,
            rpc,
            security,
            join,
            bind,
            datacenter: datacenter.into(),
            pool: tokio::sync::OnceCell::new(),
            metrics,
        })
    }

    /// The address agent `index` advertises, and so registers in the
    /// catalog (the leader's reconcile writes the member's address).
    pub(crate) fn address(&self, index: u64) -> IpAddr {
        self.bind[(index % self.bind.len() as u64) as usize].ip()
    }

    /// The pool, started on first use; `None` when gossip is off for the
    /// run (the derived join address refused).
    pub(crate) async fn pool(&self) -> Option<&Pool> {
        match self.pool.get_or_init(|| self.start()).await {
            Membership::Pool(p) => Some(p),
            _ => None,
        }
    }

    /// Why no agent may hold a session: the servers' gossip security is
    /// not the run's (the kind and the words), once the pool tried.
    pub(crate) async fn refused(&self) -> Option<(&'static str, &str)> {
        match self.pool.get_or_init(|| self.start()).await {
            Membership::Refused(kind, words) => Some((kind, words)),
            _ => None,
        }
    }

    async fn start(&self) -> Membership {
        let Some(&first) = self.join.first() else {
            return Membership::Off;
        };
        let cfg = PoolConfig {
            bind: self.bind.clone(),
            join: self.join.clone(),
            security: self.security.clone(),
            tags: agent_sim_gossip::serf::client_tags(&self.datacenter),
            timings: self.cfg.timings,
        };
        match Pool::start(cfg, self.metrics.clone()).await {
            Ok(p) if !self.cfg.join_given && !self.same_cluster(&p) => {
                p.stop();
                self.metrics.warn(
                    GOSSIP_OFF.kind,
                    Some(&format!(
                        "the gossip pool at {first} (the default join address) lists no server \
                         at the agents' targets {:?}: another cluster's; gossip is off for this run",
                        self.rpc
                    )),
                );
                Membership::Off
            }
            Ok(p) => Membership::Pool(p),
            Err(e) if let Some(k) = e.security() => {
                // Each agent's session counts it (none can hold one).
                let words = match e {
                    agent_sim_gossip::PoolError::Hello(ExchangeError::Closed { to }) => format!(
                        "gossip: {to} closed our first push-pull unanswered, as memberlist \
                         closes one it cannot open: the cluster's gossip key or label is not \
                         this run's"
                    ),
                    e => e.to_string(),
                };
                Membership::Refused(k.kind, words)
            }
            Err(e) if !self.cfg.join_given => {
                self.metrics.warn(
                    GOSSIP_OFF.kind,
                    Some(&format!(
                        "{e} (the default join address {first}): gossip is off for this run"
                    )),
                );
                Membership::Off
            }
            Err(e) => {
                let words = e.to_string();
                self.metrics
                    .error_said(e.kind(), Some(&words), Some(e.said_by()));
                Membership::Off
            }
        }
    }

    /// Whether a server of the pool is one the agents call: its address
    /// and its `port` tag (the RPC port) are a target's.
    fn same_cluster(&self, pool: &Pool) -> bool {
        pool.servers().iter().any(|(addr, tags)| {
            let port = tags
                .iter()
                .find(|(k, _)| k == "port")
                .map(|(_, v)| v.as_str());
            self.rpc
                .iter()
                .any(|t| t.ip() == addr.ip() && port == Some(&t.port().to_string()))
        })
    }

    /// Leaves every member still in and stops the pool (the end of the
    /// run); with `keep`, the members stop without leaving (the servers
    /// mark them failed, as after a killed agent, and the nodes stay).
    pub(crate) async fn close(&self, keep: bool) {
        if let Some(Membership::Pool(p)) = self.pool.get() {
            if keep {
                p.stop();
            } else {
                p.close().await;
            }
        }
    }
}

/// Consul's `retry_interval`: a failed join is tried again this much later.
pub const RETRY_JOIN: Duration = Duration::from_secs(30);

impl Gossip {
    /// The pool, if it has started.
    pub(crate) fn started(&self) -> Option<&Pool> {
        match self.pool.get() {
            Some(Membership::Pool(p)) => Some(p),
            _ => None,
        }
    }

    /// The servers of `news` the agents call, by their index in the run's
    /// targets (a server of the pool at no target is none of the agents'
    /// business: they cannot dial it).
    pub(crate) fn targets<'n>(
        &self,
        news: &'n News,
    ) -> impl Iterator<Item = (usize, &'n ServerNews)> + use<'n, '_> {
        news.servers
            .iter()
            .filter_map(|s| Some((self.rpc.iter().position(|t| *t == s.rpc)?, s)))
    }
}
