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

/// Whether a series is kept for `kind` (its defaults, the extra names
/// asked for, either as exposed or as normalized).
pub fn kept(kind: ServerKind, name: &str, extra: &[String]) -> bool {
    PROCESS.contains(&name)
        || defaults(kind).contains(&name)
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
        assert!(!kept(ServerKind::Consul, "consul_raft_apply", &[]));
        assert!(kept(
            ServerKind::Consul,
            "consul_raft_apply",
            &["consul_raft_apply".into()]
        ));
        assert!(kept(ServerKind::Other, "x_y", &["x_y".into()]));
    }
}
