//! What a validated run asks of the host: file descriptors, sessions per
//! source address and destination, TCP connections (conntrack entries),
//! memory from the measured per-agent figures, handshakes in flight (the
//! listen backlog of an in-process target); and the numbers in words.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

use crate::plan::{Protocol, RunConfig};

/// File descriptors the process keeps for itself (runtime, listeners, files).
pub(super) const FD_OVERHEAD: u64 = 64;

/// Client memory per Sensu session, all-in (README, BENCHMARKS: 4.54–4.56
/// KiB measured at 19,000 sessions; rounded up).
pub const SENSU_AGENT_BYTES: u64 = 4_710; // 4.6 KiB
/// Client memory per Consul agent with two subscriptions and a TTL session
/// (BENCHMARKS: 35–36.8 KiB, the last from 40.76 KiB with three; the upper
/// figure).
pub const CONSUL_AGENT_BYTES: u64 = 37_684; // 36.8 KiB
/// Each subscription beyond two adds about this much (40 KiB with three).
pub const CONSUL_STREAM_BYTES: u64 = 4 * 1024;
/// Client memory per dataplane sidecar with a WatchServers stream and three
/// EDS clusters (BENCHMARKS: 47.3–47.4 KiB at 5,000 in a release build; the
/// upper figure).
pub const DATAPLANE_AGENT_BYTES: u64 = 48_538; // 47.4 KiB
/// Server side of the in-process gRPC port, per sidecar (a tonic server
/// connection with two streams, as for Consul).
pub const DATAPLANE_SERVER_BYTES: u64 = 32 * 1024;
/// Server side of the in-process Sensu endpoint, per session
/// (a WebSocket server with tuned buffers: ≈7 KiB).
pub const SENSU_SERVER_BYTES: u64 = 7 * 1024;
/// Server side of the in-process Consul target, per agent connection
/// (≈32 KiB per HTTP/2 connection with two streams).
pub const CONSUL_SERVER_BYTES: u64 = 32 * 1024;
/// The process itself before any agent (runtime, metrics, histograms).
pub const BASE_BYTES: u64 = 48 << 20;

/// What a run asks of the host (this process's share when sharded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Needs {
    /// Agents this process runs, over every fleet.
    pub agents: u64,
    /// File descriptors (both ends when the target is in-process).
    pub fds: u64,
    /// Most sessions one source address opens to one destination.
    pub worst_pair: u64,
    /// Sessions to the destination of that pair (before source addresses).
    pub worst_destination: u64,
    /// That destination, when it is not in this process (`host:port`).
    pub worst_target: Option<String>,
    /// The source addresses of that pair's fleet (empty: the OS chooses).
    pub worst_sources: Vec<IpAddr>,
    /// Source addresses in use (0: the OS chooses one).
    pub sources: u64,
    /// Whether the destination of that pair is a loopback address.
    pub loopback: bool,
    /// TCP connections the run holds (conntrack entries).
    pub connections: u64,
    /// Memory estimate in bytes, and how it was made.
    pub memory: u64,
    /// The terms of the memory estimate, in words.
    pub memory_terms: Vec<String>,
    /// Whether a target runs in this process.
    pub embedded: bool,
    /// Handshakes in flight at most (the in-process listener's backlog).
    pub max_dialing: u64,
    /// Shards of the run (1 when not sharded).
    pub shards: u64,
}

/// Connections one Consul fleet's HTTP pool may open.
fn consul_http_pool() -> u64 {
    agent_sim_consul::http::MAX_HTTP_CONNS as u64
}

/// Connections an agent holds to its server: a Consul client agent two
/// (streaming, and its own calls; one when blocking queries share the
/// calls' connection), every other kind one.
fn conns_per_agent(p: &Protocol) -> u64 {
    use agent_sim_consul::modes::AgentWire;
    use agent_sim_consul::watch::WatchMode;
    match p {
        Protocol::Consul(c) if c.agent == AgentWire::Client && c.watch == WatchMode::Streaming => 2,
        _ => 1,
    }
}

/// What `cfg` asks of the host.
pub fn needs(cfg: &RunConfig) -> Needs {
    let mut n = Needs {
        agents: 0,
        fds: FD_OVERHEAD,
        worst_pair: 0,
        worst_destination: 0,
        worst_target: None,
        worst_sources: Vec::new(),
        sources: 0,
        loopback: false,
        connections: 0,
        memory: BASE_BYTES,
        memory_terms: vec![format!("{} process", bytes(BASE_BYTES))],
        embedded: cfg.embedded(),
        max_dialing: 0,
        shards: cfg.shard.map_or(1, |s| s.count),
    };
    for plan in &cfg.fleets {
        let agents = plan.fleet.agents;
        let target_names: Vec<&str> = match &plan.protocol {
            Protocol::Sensu(s) => s.targets.iter().map(String::as_str).collect(),
            Protocol::Consul(c) => c.conn.targets.iter().map(String::as_str).collect(),
            Protocol::Dataplane(d) => d.conn.targets.iter().map(String::as_str).collect(),
        };
        let conns = conns_per_agent(&plan.protocol);
        let (targets, extra, per_agent, server, what) = match &plan.protocol {
            Protocol::Sensu(s) => (
                s.targets.len().max(1) as u64,
                0,
                SENSU_AGENT_BYTES,
                SENSU_SERVER_BYTES,
                "Sensu".to_string(),
            ),
            Protocol::Consul(c) => {
                let streams = c.upstreams.len() as u64
                    + u64::from(c.probe.kind.is_some())
                    + u64::from(c.probe.also.is_some());
                let per = (CONSUL_AGENT_BYTES + CONSUL_STREAM_BYTES * streams)
                    .saturating_sub(2 * CONSUL_STREAM_BYTES);
                (
                    c.conn.targets.len().max(1) as u64,
                    consul_http_pool(),
                    per,
                    CONSUL_SERVER_BYTES,
                    format!("Consul ({streams} subscriptions)"),
                )
            }
            Protocol::Dataplane(d) => (
                d.conn.targets.len().max(1) as u64,
                consul_http_pool(),
                DATAPLANE_AGENT_BYTES,
                DATAPLANE_SERVER_BYTES,
                "dataplane sidecar".to_string(),
            ),
        };
        // Gossip: a UDP socket and a listener per endpoint, the joins in
        // flight and the servers' streams (a few).
        let gossip = match &plan.protocol {
            Protocol::Consul(c) if agents > 0 => c.gossip.as_ref().map_or(0, |g| {
                2 * g.bind.len().max(1) as u64 + agent_sim_gossip::pool::JOINS_AT_ONCE as u64 + 8
            }),
            _ => 0,
        };
        let client = agents * conns + extra + gossip;
        n.agents += agents;
        n.connections += client;
        // The in-process target holds the other end of every connection.
        n.fds += if plan.embedded { client * 2 } else { client };
        let per_target = (agents * conns).div_ceil(targets);
        let sources = plan.fleet.source_addrs.len() as u64;
        let pair = per_target.div_ceil(sources.max(1));
        if pair > n.worst_pair {
            n.worst_pair = pair;
            n.worst_destination = per_target;
            n.worst_target = (!plan.embedded)
                .then(|| target_names.first().map(|t| t.to_string()))
                .flatten();
            n.worst_sources = plan.fleet.source_addrs.clone();
            n.sources = sources;
            n.loopback = plan.embedded || target_names.iter().all(|t| is_loopback(t));
        }
        n.memory += agents * per_agent;
        n.memory_terms
            .push(format!("{agents} {what} agents × {}", bytes(per_agent)));
        if plan.embedded {
            n.memory += agents * server;
            n.memory_terms
                .push(format!("in-process target {agents} × {}", bytes(server)));
        }
        n.max_dialing = n.max_dialing.max(plan.fleet.max_dialing as u64);
    }
    n
}

/// Whether a target (`host:port`, `ws://host:port/`) names a loopback host.
pub(crate) fn is_loopback(target: &str) -> bool {
    let rest = target.split("://").last().unwrap_or(target);
    let authority = rest.split('/').next().unwrap_or(rest);
    let host = authority
        .rsplit_once(':')
        .map_or(authority, |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The address of a target (`host:port`, `ws://host:port/`), resolved.
pub(crate) fn target_addr(target: &str) -> Option<SocketAddr> {
    let rest = target.split("://").last().unwrap_or(target);
    let authority = rest.split('/').next().unwrap_or(rest);
    authority.to_socket_addrs().ok()?.next()
}

/// 20000 → "20,000".
pub(crate) fn count(v: u64) -> String {
    if v == u64::MAX {
        return "unlimited".into();
    }
    let s = v.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Bytes in KiB/MiB/GiB, one decimal.
pub(super) fn bytes(v: u64) -> String {
    const K: f64 = 1024.0;
    let f = v as f64;
    if f >= K * K * K {
        format!("{:.1} GiB", f / (K * K * K))
    } else if f >= K * K {
        format!("{:.1} MiB", f / (K * K))
    } else {
        format!("{:.1} KiB", f / K)
    }
}
