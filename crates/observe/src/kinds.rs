//! Kinds of servers, the series each keeps by default, and their units.
//!
//! The default lists were chosen from what real servers expose under load
//! (captured expositions in `testdata/vectors/*/metrics/`): a Consul 1.20.1
//! server with 1,000 agents and a Sensu Go 6.12.0 backend with 500.
//! Every kind also keeps the process's CPU (`process_cpu_seconds_total`),
//! RSS, open fds, the Go heap and goroutines when exposed.
//!
//! Units: Consul's go-metrics summaries and Sensu's `sensu_go_*_duration`
//! summaries are in **milliseconds**; etcd's histograms (and anything named
//! `*_seconds`) in seconds. Latencies are kept in microseconds.

use std::fmt;

use agent_sim_metrics::storm::{Count, Queue};

/// What kind of server a target is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerKind {
    /// A Consul server (`consul_*` series).
    Consul,
    /// A Sensu Go backend (`sensu_go_*` series).
    Sensu,
    /// An `agent-sim serve` (`agent_sim_serve_*` series).
    AgentSim,
    /// A process read from `/proc` (`--observe-pid`).
    Process,
    /// Any other Prometheus endpoint.
    Other,
}

impl fmt::Display for ServerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ServerKind::Consul => "consul",
            ServerKind::Sensu => "sensu",
            ServerKind::AgentSim => "agent-sim",
            ServerKind::Process => "process",
            ServerKind::Other => "prometheus",
        })
    }
}

/// The kind a scrape's series names tell.
pub fn detect<'a>(names: impl IntoIterator<Item = &'a str>) -> ServerKind {
    let mut kind = ServerKind::Other;
    for n in names {
        if n.starts_with("consul_") || n.starts_with("consul.") {
            return ServerKind::Consul;
        }
        if n.starts_with("sensu_go_") {
            kind = ServerKind::Sensu;
        } else if n.starts_with("agent_sim_serve_") && kind == ServerKind::Other {
            kind = ServerKind::AgentSim;
        }
    }
    kind
}

/// CPU seconds of the process (a counter: its rate is cores).
pub const CPU: &str = "process_cpu_seconds_total";
/// Resident memory (bytes).
pub const RSS: &str = "process_resident_memory_bytes";
/// Open file descriptors.
pub const FDS: &str = "process_open_fds";
/// OS threads (`/proc` only).
pub const THREADS: &str = "process_threads";
/// Go heap in use (bytes).
pub const HEAP: &str = "go_memstats_heap_alloc_bytes";
/// Goroutines.
pub const GOROUTINES: &str = "go_goroutines";

/// The process series every kind keeps (their own fields of a sample).
pub const PROCESS: &[&str] = &[CPU, RSS, FDS, THREADS, HEAP, GOROUTINES];

/// Series kept by default for each kind, besides [`PROCESS`].
pub fn defaults(kind: ServerKind) -> &'static [&'static str] {
    match kind {
        ServerKind::Consul => &[
            "consul_raft_commitTime",
            "consul_raft_leader_dispatchLog",
            "consul_rpc_request",
            "consul_rpc_request_error",
            "consul_rpc_queries_blocking",
            "consul_grpc_server_streams",
            "consul_grpc_server_connections",
            "consul_catalog_register",
            "consul_session_ttl_active",
            // What writes move (KV, txn, sessions, leaf certificates), as
            // a 1.20.1 server names them: the endpoint's time, the state
            // machine's apply per kind, and the rate limiters' refusals.
            "consul_kvs_apply",
            "consul_txn_apply",
            "consul_txn_read",
            "consul_session_apply",
            "consul_session_ttl_invalidate",
            "consul_raft_fsm_apply",
            "consul_fsm_kvs",
            "consul_fsm_txn",
            "consul_fsm_session",
            "consul_fsm_ca_leaf",
            "consul_rpc_rate_limit_exceeded",
            // Raft transactions (a counter: its rate is transactions per
            // second, the figure HashiCorp's 10,000-node benchmark gives).
            "consul_raft_apply",
        ],
        ServerKind::Sensu => &[
            "sensu_go_keepalives",
            "sensu_go_events_processed",
            "sensu_go_eventd_update_event_duration",
            "sensu_go_pipeline_duration",
            "etcd_disk_wal_fsync_duration_seconds",
            "etcd_disk_backend_commit_duration_seconds",
            "etcd_server_proposals_pending",
            "etcd_mvcc_db_total_size_in_bytes",
        ],
        // Everything an `agent-sim serve` exposes is its own.
        ServerKind::AgentSim | ServerKind::Process | ServerKind::Other => &[],
    }
}

/// The counters of a Consul server's storm figures, as a 1.20.1 server
/// names them: memberlist's and serf's go-metrics keys under `consul_`
/// (their label sets, `network="lan"` and `"wan"`, added up). A counter
/// the server has not moved for its `prometheus_retention_time` may leave
/// the exposition, and come back from zero. A colon in a name reads as `_`
/// (`consul_serf_events_consul:new_leader`, see [`crate::reading`]). The
/// handler queue's drops are the embedded server's own series: a real one
/// only logs them.
pub const STORM_COUNTERS: [(&str, Count); 13] = [
    // memberlist's net transport: the bytes of every UDP packet.
    ("consul_memberlist_udp_received", Count::GossipBytesIn),
    ("consul_memberlist_udp_sent", Count::GossipBytesOut),
    // memberlist's stream listener: one per TCP connection (push-pulls).
    ("consul_memberlist_tcp_accept", Count::TcpAccepts),
    // memberlist's state: one per alive, suspect, dead message applied.
    ("consul_memberlist_msg_alive", Count::AliveMsgs),
    ("consul_memberlist_msg_suspect", Count::SuspectMsgs),
    ("consul_memberlist_msg_dead", Count::DeadMsgs),
    // A probe begun while the health score had stretched its interval.
    ("consul_memberlist_degraded_probe", Count::DegradedProbes),
    // serf's member events, `serf.member.<status>` on a leave or failure.
    ("consul_serf_member_join", Count::MemberJoins),
    ("consul_serf_member_failed", Count::MemberFailed),
    ("consul_serf_member_left", Count::MemberLeft),
    // serf's user events, all and by name.
    ("consul_serf_events", Count::SerfEvents),
    (
        "consul_serf_events_consul_new_leader",
        Count::NewLeaderEvents,
    ),
    (
        "agent_sim_memberlist_handler_queue_dropped",
        Count::HandlerDrops,
    ),
];

/// The queue depths of the storm figures: summaries of serf's samples of
/// each queue (every 30 s, its `QueueCheckInterval`) and memberlist's of
/// its broadcasts, in messages.
pub const STORM_QUEUES: [(&str, Queue); 4] = [
    ("consul_memberlist_queue_broadcasts", Queue::Broadcasts),
    ("consul_serf_queue_Intent", Queue::Intent),
    ("consul_serf_queue_Event", Queue::Event),
    ("consul_serf_queue_Query", Queue::Query),
];

/// Serf's messages received: a summary of their sizes, whose count is the
/// messages.
pub const SERF_MSGS: &str = "consul_serf_msgs_received";

/// The server's RPC calls: a summary of their times (milliseconds) per
/// label set, `method` among the labels; its count per method is calls.
pub const RPC_CALLS: &str = "consul_rpc_server_call";

/// The reads of a client agent's anti-entropy sync (`Catalog.NodeServiceList`
/// for its services, `Health.NodeChecks` for its checks).
pub const AE_METHODS: [&str; 2] = ["Catalog.NodeServiceList", "Health.NodeChecks"];

/// Whether a series is one of the storm figures' (a counter with or
/// without `_total`).
pub fn storm(name: &str) -> bool {
    let base = name.strip_suffix("_total").unwrap_or(name);
    STORM_COUNTERS.iter().any(|(n, _)| *n == base)
        || STORM_QUEUES.iter().any(|(n, _)| *n == name)
        || name == SERF_MSGS
        || name == RPC_CALLS
}

/// Whether a series is kept for `kind` (its defaults, the storm figures',
/// the extra names asked for, either as exposed or as normalized).
pub fn kept(kind: ServerKind, name: &str, extra: &[String]) -> bool {
    PROCESS.contains(&name)
        || defaults(kind).contains(&name)
        || storm(name)
        || (kind == ServerKind::AgentSim && name.starts_with("agent_sim_serve_"))
        || extra.iter().any(|e| e == name || *e == normalize(name))
}

/// A latency's unit: microseconds per unit of the server's value, and its
/// name; `None` when the name does not tell (kept as plain values).
pub fn latency_unit(name: &str) -> Option<(f64, &'static str)> {
    if name.ends_with("_seconds") {
        Some((1e6, "s"))
    } else if name.ends_with("_milliseconds") || name.ends_with("_ms") {
        Some((1e3, "ms"))
    } else if name.ends_with("_microseconds") || name.ends_with("_us") {
        Some((1.0, "us"))
    } else if name.starts_with("consul_") || name.starts_with("sensu_go_") {
        // go-metrics' and Sensu's summaries observe milliseconds.
        Some((1e3, "ms"))
    } else {
        None
    }
}

/// The name a series has in the summary and in assertions: lower snake
/// case (`consul_raft_commitTime` → `consul_raft_commit_time`, Consul's
/// JSON `consul.raft.commitTime` the same).
pub fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    let mut prev_lower = false;
    for c in name.chars() {
        if c == '.' || c == '-' {
            out.push('_');
            prev_lower = false;
        } else if c.is_ascii_uppercase() {
            if prev_lower {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
            prev_lower = false;
        } else {
            out.push(c);
            prev_lower = c.is_ascii_lowercase() || c.is_ascii_digit();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_normalized_to_snake_case() {
        assert_eq!(
            normalize("consul_raft_commitTime"),
            "consul_raft_commit_time"
        );
        assert_eq!(
            normalize("consul.raft.commitTime"),
            "consul_raft_commit_time"
        );
        assert_eq!(
            normalize("consul_raft_leader_dispatchLog"),
            "consul_raft_leader_dispatch_log"
        );
        assert_eq!(normalize("go_goroutines"), "go_goroutines");
        assert_eq!(
            normalize("etcd_disk_wal_fsync_duration_seconds"),
            "etcd_disk_wal_fsync_duration_seconds"
        );
    }

    #[test]
    fn units_follow_the_names_and_the_servers_conventions() {
        assert_eq!(latency_unit("consul_raft_commitTime"), Some((1e3, "ms")));
        assert_eq!(
            latency_unit("sensu_go_pipeline_duration"),
            Some((1e3, "ms"))
        );
        assert_eq!(
            latency_unit("etcd_disk_wal_fsync_duration_seconds"),
            Some((1e6, "s"))
        );
        assert_eq!(latency_unit("http_request_duration"), None);
    }

    #[test]
    fn the_kind_is_told_by_the_series() {
        assert_eq!(
            detect(["go_goroutines", "consul_rpc_request"]),
            ServerKind::Consul
        );
        assert_eq!(
            detect(["etcd_server_proposals_pending", "sensu_go_keepalives"]),
            ServerKind::Sensu
        );
        assert_eq!(
            detect(["agent_sim_serve_sensu_sessions_active"]),
            ServerKind::AgentSim
        );
        assert_eq!(detect(["node_cpu_seconds_total"]), ServerKind::Other);
        assert!(kept(ServerKind::Consul, "consul_raft_commitTime", &[]));
        assert!(!kept(ServerKind::Consul, "consul_raft_barrier", &[]));
        assert!(kept(
            ServerKind::Consul,
            "consul_raft_barrier",
            &["consul_raft_barrier".into()]
        ));
        assert!(kept(ServerKind::Other, "x_y", &["x_y".into()]));
    }

    #[test]
    fn the_storm_series_are_kept_for_any_kind_with_or_without_total() {
        for name in [
            "consul_memberlist_udp_received",
            "consul_serf_queue_Intent",
            "consul_serf_msgs_received",
            "consul_rpc_server_call",
            "consul_serf_events_consul_new_leader",
            "agent_sim_memberlist_handler_queue_dropped",
            "agent_sim_memberlist_handler_queue_dropped_total",
        ] {
            assert!(kept(ServerKind::Consul, name, &[]), "{name}");
            assert!(kept(ServerKind::AgentSim, name, &[]), "{name}");
        }
        assert!(!storm("consul_serf_queue_Intent_total"));
        assert!(!storm("consul_memberlist_gossip"));
    }
}
