//! Simulated Consul client agents for agent-sim: each agent holds what a real
//! client agent with `use_streaming_backend` holds against a server — ONE
//! HTTP/2 connection to the RPC port (`0x08` byte, or `0x03` + TLS + `0x08`)
//! carrying one `subscribe.StateChangeSubscription/Subscribe` stream per
//! upstream — plus its catalog registration and a TTL session through the
//! HTTP API, and times how long a catalog change takes to reach every view.
//! With `watch = blocking` it watches as an agent with streaming off
//! (`0x04`, yamux, `Health.ServiceNodes` blocking queries); with `http`, as
//! a tool that long-polls the HTTP API.
//!
//! Main parts:
//! - [`config`]: [`ConsulConfig`] and its validation; [`pattern`]: per-agent
//!   names (`svc-{i}`, `app/{i%10}/`).
//! - [`codec`]: `SubscribeRequest` building, a small-buffer prost codec, keys.
//! - [`view`]: the materialized view of one subscription (pure state).
//! - [`conn`]: dial, prefix byte(s), TLS; the agents' streaming connection
//!   and the sidecars' gRPC connection on [`h2`] (a lean HTTP/2 client for
//!   every stream an agent or a sidecar holds);
//!   [`ended`]: how a session's connection or call ended, as kinds.
//! - [`http`]: the HTTP API subset (catalog, txn, sessions, config entries)
//!   on the project's pooled HTTP/1 client (`agent_sim_net::http`).
//! - [`txn`]: the shared registration batcher (`/v1/txn`, ≤128 ops).
//! - [`watch`]: blocking queries over yamux and msgpack, HTTP long polls,
//!   and the digest of a whole result a view compares.
//! - [`modes`]: the watch mode and the seeded service (a leaf);
//!   [`seed`]: registering and removing that service.
//! - [`probe`]: the propagation probe ([`ProbeRunner`] in the controller
//!   process, [`ProbeObserver`] in the others, [`probe::ProbeBoard`]);
//!   [`proxy`]: the Connect proxies behind each agent and when proxycfg
//!   hands them an update (`--proxies-per-agent`).
//! - [`ConsulFactory`] / [`ConsulAgent`]: the `agent_sim_fleet` agent.
//! - [`cleanup`]: removes what a killed run left (`agent-sim cleanup`).
//! - [`vault`]: simulated Vault servers storing in the cluster
//!   ([`vault::VaultRunner`], `--vault-nodes`).
//!
//! What it is not: a Consul server (see `agent-sim-server`), nor a CLI; it
//! prints nothing.

pub mod acl;
pub mod ca_rotation;
pub mod chain;
pub mod cleanup;
pub mod codec;
pub mod config;
mod config_error;
pub mod conn;
pub mod connect;
pub mod ended;
pub mod gossip;
pub mod h2;
pub mod http;
pub mod kv;
pub mod modes;
pub mod pattern;
pub mod probe;
pub mod proxy;
pub mod rpc;
pub mod seed;
pub mod txn;
pub mod vault;
pub mod vault_config;
pub mod view;
pub mod watch;

mod agent;

pub use agent::{ConsulAgent, ConsulFactory, api_client, http_api};
pub use config::{
    ConfigError, Connection, ConsulConfig, ConsulTls, ProbeConfig, ProbeKind, ProbeKinds,
};
pub use probe::{ProbeObserver, ProbeRunner};

use agent_sim_metrics::MetricsSpec;

/// Errors of this crate (configuration time only: agent failures are
/// counted outcomes, not errors).
#[derive(Debug, thiserror::Error)]
pub enum ConsulError {
    /// A setting of [`ConsulConfig`] is invalid: the field (as named in the
    /// struct, `probe.every` for nested ones) and why, in one line.
    #[error("{field}: {0}", field = .0.field())]
    Invalid(#[from] config::ConfigError),
    /// The gossip settings cannot be used (keys, join or bind addresses).
    #[error("consul: {0}")]
    Gossip(#[from] gossip::GossipError),
    /// The TLS settings cannot be used.
    #[error("consul TLS: {0}")]
    Tls(#[from] agent_sim_net::TlsError),
    /// TLS without a CA file (and without `insecure_skip_verify`): Consul
    /// servers use a private CA.
    #[error("consul TLS: no CA file")]
    NoCaFile,
    /// The name to verify is not a DNS name or an IP address.
    #[error("consul TLS: server name {name:?}: {source}")]
    ServerName {
        /// The name.
        name: String,
        /// Why it is not one.
        source: rustls::pki_types::InvalidDnsNameError,
    },
    /// The ACL token cannot be sent as a header value.
    #[error("consul: token is not a valid header value")]
    Token(#[source] ::http::header::InvalidHeaderValue),
    /// The metrics recorder lacks a name of [`metrics_spec`].
    #[error("consul metrics: {0}")]
    Metrics(#[from] Undeclared),
}

/// A name of a crate's [`MetricsSpec`](agent_sim_metrics::MetricsSpec) the
/// run's recorder lacks (it was built from another spec).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Undeclared {
    /// A counter.
    #[error("counter {0:?} not declared")]
    Counter(&'static str),
    /// A latency histogram.
    #[error("latency {0:?} not declared")]
    Latency(&'static str),
}

/// Checks that `m` records every counter and latency of `spec` (the
/// agents resolve their ids once, from names that must exist).
pub fn check_declared(
    m: &agent_sim_metrics::Metrics,
    spec: &agent_sim_metrics::MetricsSpec,
) -> Result<(), Undeclared> {
    let snap = m.snapshot();
    if let Some(c) = spec
        .counters
        .iter()
        .find(|c| !snap.counters.iter().any(|(n, _)| n == *c))
    {
        return Err(Undeclared::Counter(c));
    }
    let names = m.latency_names();
    match spec.latencies.iter().find(|l| !names.contains(l)) {
        Some(l) => Err(Undeclared::Latency(l)),
        None => Ok(()),
    }
}

impl From<vault_config::VaultConfigError> for ConsulError {
    fn from(e: vault_config::VaultConfigError) -> Self {
        ConsulError::Invalid(e.into())
    }
}

/// Metric names this crate records.
pub mod names {
    /// Subscribe calls made.
    pub const SUBSCRIPTIONS: &str = "subscriptions";
    /// Snapshots completed (`EndOfSnapshot`).
    pub const SNAPSHOTS: &str = "snapshots";
    /// Subscriptions resumed from an index: the first event after the
    /// resubscribe came without `NewSnapshotToFollow`.
    pub const RESUMES: &str = "resumes";
    /// Resubscribes still silent when the server answered the agent's sync:
    /// taken as live (resumed with no change since), not yet proved by an
    /// event (the first event then counts in `resumes`).
    pub const RESUMES_SILENT: &str = "resumes_silent";
    /// Streams ended by the server with `ABORTED`.
    pub const ABORTS: &str = "aborts";
    /// Stream events received.
    pub const EVENTS_RECEIVED: &str = "events_received";
    /// TTL sessions created.
    pub const SESSIONS_CREATED: &str = "sessions_created";
    /// TTL session renewals that succeeded.
    pub const SESSIONS_RENEWED: &str = "sessions_renewed";
    /// Renewals answered 404 (session gone).
    pub const SESSIONS_EXPIRED: &str = "sessions_expired";
    /// Agents registered (node + instances).
    pub const REGISTRATIONS: &str = "registrations";
    /// Agents deregistered at shutdown.
    pub const DEREGISTRATIONS: &str = "deregistrations";
    /// Anti-entropy syncs answered (the catalog's view of the node read and
    /// compared).
    pub const ANTI_ENTROPY_SYNCS: &str = "anti_entropy_syncs";
    /// Registrations made again because a sync found the node or an
    /// instance missing or different.
    pub const REREGISTRATIONS: &str = "reregistrations";
    /// `/v1/txn` requests sent.
    pub const TXN_REQUESTS: &str = "txn_requests";
    /// Check status flips sent.
    pub const FLAPS: &str = "flaps";
    /// Probes cut short by the end of the run (not reported: their window
    /// was incomplete while agents were already closing).
    pub const PROBES_INTERRUPTED: &str = "probes_interrupted";
    /// TCP + prefix + HTTP/2 handshake.
    pub const CONNECT: &str = "connect";
    /// Subscribe call to `EndOfSnapshot`.
    pub const SUBSCRIBE_SNAPSHOT: &str = "subscribe_snapshot";
    /// TTL session renew round trip.
    pub const SESSION_RENEW: &str = "session_renew";
    /// Probe deliveries: kernel arrival at the agent's socket − T0 (the
    /// instant the change's write was sent).
    pub const PROPAGATION: &str = "propagation";
    /// Probe deliveries at the proxies behind the agents
    /// (`--proxies-per-agent`): the instant proxycfg hands the change to a
    /// proxy's xDS stream (after its coalescing window and the agent's
    /// update limiter) − T0; one per proxy of each agent that had it.
    pub const PROPAGATION_PROXY: &str = "propagation_proxy";
    /// The intentions probe's deliveries when it runs beside the catalog
    /// probe (`--probe catalog,intentions`), timed as `propagation`.
    pub const PROPAGATION_INTENTIONS: &str = "propagation_intentions";
    /// Those at the proxies behind the agents, as `propagation_proxy`.
    pub const PROPAGATION_INTENTIONS_PROXY: &str = "propagation_intentions_proxy";
    /// Config snapshots proxycfg sends the proxies' xDS streams, one per
    /// proxy and coalescing window (counted when the send is scheduled).
    pub const PROXY_UPDATES: &str = "proxy_updates";
    /// The simulator's own delay per probe delivery: the agent processed
    /// the event − the kernel received its bytes (runtime queueing, decode).
    pub const PROBE_OVERHEAD: &str = "probe_overhead";
    /// The probe change's write round trip (request sent → answer).
    pub const PROBE_WRITE: &str = "probe_write";
    /// Probe deliveries timed in user space: the socket had no kernel
    /// receive timestamps.
    pub const ARRIVALS_USER_TIME: &str = "arrivals_user_time";
    /// Blocking queries (or HTTP long polls) sent (`--watch blocking|http`).
    pub const WATCH_CALLS: &str = "watch_calls";
    /// Their answers: each a whole result, decoded in full.
    pub const WATCH_RESPONSES: &str = "watch_responses";
    /// Answers that changed the view (the rest ended their wait).
    pub const WATCH_RESULTS_CHANGED: &str = "watch_results_changed";
    /// Bytes read on every Consul connection of the agents (RPC, watch and
    /// HTTP API connections; TLS included as on the wire).
    pub const BYTES_RECEIVED: &str = "bytes_received";
    /// Bytes written on them.
    pub const BYTES_SENT: &str = "bytes_sent";
    /// Of `bytes_received`, those on the connections that watch (the RPC
    /// connection: Subscribe streams or blocking queries; the HTTP long
    /// polls' connections): what watching costs, without the catalog and
    /// session calls.
    pub const WATCH_BYTES_RECEIVED: &str = "watch_bytes_received";
    /// Of `bytes_sent`, those on the watching connections.
    pub const WATCH_BYTES_SENT: &str = "watch_bytes_sent";
    /// KV watch reads sent (`--watch-kv`: `KVS.List` or `GET /v1/kv`).
    pub const KV_WATCH_CALLS: &str = "kv_watch_calls";
    /// Their answers (a result, or the server's error).
    pub const KV_WATCH_ANSWERS: &str = "kv_watch_answers";
    /// Answers whose result changed (a new index and other keys or modify
    /// indexes; consul-template renders on these).
    pub const KV_WATCH_CHANGED: &str = "kv_watch_results_changed";
    /// Bytes of the KV answers (RPC: header and body; HTTP: body as sent).
    pub const KV_WATCH_BYTES: &str = "kv_watch_bytes";
    /// `Coordinate.Update` calls answered (`--consul-agent client`).
    pub const COORDINATE_UPDATES: &str = "coordinate_updates";
    /// The router's `Status.Ping` calls answered, one per rebalance.
    pub const ROUTER_PINGS: &str = "router_pings";
    /// Rebalances that found the server they would move to not answering
    /// (client wire: it goes to the end of the list and the next is
    /// checked, as Consul's router does; the agent stays where it is).
    pub const ROUTER_SKIPS: &str = "router_skips";
    /// Full anti-entropy syncs gossip triggered (Consul's `ServerUp`): a
    /// server joined or came back, or a new leader's `consul:new-leader`
    /// event; each waits its stagger before it runs.
    pub const SYNCS_SERVER_UP: &str = "anti_entropy_server_up";
    /// Servers an agent took off its router's list because gossip said
    /// they failed or left (Consul's `RemoveServer`).
    pub const ROUTER_REMOVES: &str = "router_removes";
    /// Servers an agent put back at the end of its list when gossip saw
    /// them join again (Consul's `AddServer`).
    pub const ROUTER_ADDS: &str = "router_adds";
    /// A client agent's own RPCs, each method timed from the call written
    /// to its whole answer read (`--consul-agent client`).
    pub const RPC_LATENCIES: [&str; 8] = [
        "rpc_catalog_register",
        "rpc_node_services",
        "rpc_node_checks",
        "rpc_session_apply",
        "rpc_session_renew",
        "rpc_coordinate_update",
        "rpc_status_ping",
        LEAF_SIGN,
    ];
    /// `ConnectCA.Sign` calls answered, rate-limited ones included (the
    /// client wire, agents with sidecars).
    pub const LEAF_SIGN: &str = "leaf_sign";
    /// Time from the run's first dial to each agent's first certificate
    /// (its maximum: every proxy holds one).
    pub const LEAF_BOOT: &str = "leaf_boot";
    /// Time from the run's CA rotation to each agent's certificate of the
    /// new root.
    pub const LEAF_ROTATION: &str = "leaf_rotation";
    /// First leaf certificates signed.
    pub const LEAF_CERTS_ISSUED: &str = "leaf_certs_issued";
    /// Leaf certificates signed again (renewal, rotation).
    pub const LEAF_CERTS_RENEWED: &str = "leaf_certs_renewed";
    /// Signs the servers answered with their rate limit.
    pub const LEAF_RATE_LIMITED: &str = "leaf_rate_limited";
    /// `--auto-encrypt`: per agent, its first `AutoEncrypt.Sign` round to
    /// its certificate (the waits between rounds included).
    pub const AUTO_ENCRYPT: &str = "auto_encrypt";
    /// `AutoEncrypt.Sign` calls the servers answered with their rate limit.
    pub const AUTO_ENCRYPT_RATE_LIMITED: &str = "auto_encrypt_rate_limited";
}

/// Counters whose per-second rate means something: the steady traffic of
/// running agents (stream events, session renewals, catalog writes, flaps,
/// anti-entropy syncs), not one-off counts such as subscriptions or
/// registrations. The run reports `rates_per_s` for these only.
pub const RATED_COUNTERS: &[&str] = &[
    names::EVENTS_RECEIVED,
    names::SESSIONS_RENEWED,
    names::TXN_REQUESTS,
    names::FLAPS,
    names::ANTI_ENTROPY_SYNCS,
    names::WATCH_RESPONSES,
    names::BYTES_RECEIVED,
    names::BYTES_SENT,
    names::WATCH_BYTES_RECEIVED,
    names::COORDINATE_UPDATES,
    names::KV_WATCH_ANSWERS,
    names::KV_WATCH_BYTES,
    names::PROXY_UPDATES,
];

/// Counters and latencies this crate records; merge into the run's spec.
pub fn metrics_spec() -> MetricsSpec {
    MetricsSpec {
        counters: vec![
            names::SUBSCRIPTIONS,
            names::SNAPSHOTS,
            names::RESUMES,
            names::RESUMES_SILENT,
            names::ABORTS,
            names::EVENTS_RECEIVED,
            names::SESSIONS_CREATED,
            names::SESSIONS_RENEWED,
            names::SESSIONS_EXPIRED,
            names::REGISTRATIONS,
            names::DEREGISTRATIONS,
            names::ANTI_ENTROPY_SYNCS,
            names::REREGISTRATIONS,
            names::TXN_REQUESTS,
            names::FLAPS,
            names::PROBES_INTERRUPTED,
            names::ARRIVALS_USER_TIME,
            names::WATCH_CALLS,
            names::WATCH_RESPONSES,
            names::WATCH_RESULTS_CHANGED,
            names::BYTES_RECEIVED,
            names::BYTES_SENT,
            names::WATCH_BYTES_RECEIVED,
            names::WATCH_BYTES_SENT,
            names::COORDINATE_UPDATES,
            names::ROUTER_PINGS,
            names::ROUTER_SKIPS,
            names::SYNCS_SERVER_UP,
            names::ROUTER_REMOVES,
            names::ROUTER_ADDS,
            names::LEAF_CERTS_ISSUED,
            names::LEAF_CERTS_RENEWED,
            names::LEAF_RATE_LIMITED,
            names::AUTO_ENCRYPT_RATE_LIMITED,
            names::KV_WATCH_CALLS,
            names::KV_WATCH_ANSWERS,
            names::KV_WATCH_CHANGED,
            names::KV_WATCH_BYTES,
            names::PROXY_UPDATES,
        ],
        latencies: [
            names::CONNECT,
            names::SUBSCRIBE_SNAPSHOT,
            names::SESSION_RENEW,
            names::PROPAGATION,
            names::PROPAGATION_PROXY,
            names::PROPAGATION_INTENTIONS,
            names::PROPAGATION_INTENTIONS_PROXY,
            names::PROBE_OVERHEAD,
            names::PROBE_WRITE,
            names::LEAF_BOOT,
            names::LEAF_ROTATION,
            names::AUTO_ENCRYPT,
        ]
        .into_iter()
        .chain(names::RPC_LATENCIES)
        .collect(),
        errors: ERROR_KINDS.to_vec(),
    }
    .merge(&agent_sim_gossip::metrics_spec())
    .merge(&MetricsSpec {
        errors: vec![gossip::GOSSIP_OFF],
        ..MetricsSpec::default()
    })
}

/// `probe_overhead` p99 above this makes the run warn that the load box
/// was saturated.
pub const PROBE_OVERHEAD_WARN: std::time::Duration = std::time::Duration::from_millis(10);

/// Warns (`probe_overhead_high`) when the simulator's own delay on probe
/// deliveries had a p99 above [`PROBE_OVERHEAD_WARN`]; call once at the end
/// with the run's cumulative histograms.
pub fn check_overhead(metrics: &agent_sim_metrics::Metrics) {
    let cum = metrics.cumulative();
    let Some((_, h)) = cum.iter().find(|(n, _)| *n == names::PROBE_OVERHEAD) else {
        return;
    };
    if h.is_empty() {
        return;
    }
    let p99 = h.value_at_quantile(0.99);
    let limit = PROBE_OVERHEAD_WARN.as_micros() as u64;
    if p99 > limit {
        metrics.warn(
            "probe_overhead_high",
            Some(&format!(
                "probe_overhead p99 {:.1} ms over {} deliveries (warned above {} ms)",
                p99 as f64 / 1000.0,
                h.len(),
                limit / 1000
            )),
        );
    }
}

/// An ACL token the server does not know (the dataplane sidecars count it
/// alike).
pub const ACL_NOT_FOUND: agent_sim_metrics::ErrorKindSpec = agent_sim_metrics::ErrorKindSpec {
    kind: "acl_not_found",
    hint: "--token (CONSUL_HTTP_TOKEN) or --acl-tokens: the server does not know this ACL \
           token (mistyped, deleted or expired, or another cluster's)",
    heals: false,
    said_by: agent_sim_metrics::Speaker::Server,
};

/// The load box was too busy to time probe deliveries ([`check_overhead`];
/// the dataplane sidecars' probes are timed alike).
pub const PROBE_OVERHEAD_HIGH: agent_sim_metrics::ErrorKindSpec =
    agent_sim_metrics::ErrorKindSpec {
        kind: "probe_overhead_high",
        hint: "the simulator took long to process probe events after the kernel received \
               them (probe_overhead p99): the load box is saturated and propagation figures \
               are suspect; use fewer agents per process or more cores",
        heals: true,
        said_by: agent_sim_metrics::Speaker::Local,
    };

/// A registration transaction rolled back (the dataplane sidecars register
/// through the same batcher).
pub const TXN_ROLLBACK: agent_sim_metrics::ErrorKindSpec = agent_sim_metrics::ErrorKindSpec {
    kind: "txn_rollback",
    hint: "a catalog transaction was rolled back; the sample names the failing op",
    heals: true,
    said_by: agent_sim_metrics::Speaker::Server,
};

/// The HTTP/2 handshake failed and the first bytes told nothing more
/// ([`conn::ConnectError::Preface`]; the dataplane sidecars dial alike).
pub const H2_HANDSHAKE: agent_sim_metrics::ErrorKindSpec = agent_sim_metrics::ErrorKindSpec {
    kind: "h2_handshake",
    hint: "the HTTP/2 handshake failed and the server's first bytes say nothing more (the \
           sample is the HTTP/2 client's words): check that --target is the port the fleet \
           dials and that TLS matches it; agents reconnect with backoff",
    heals: true,
    said_by: agent_sim_metrics::Speaker::Local,
};

/// The error kinds of a Consul agent, with what to check.
const ERROR_KINDS: &[agent_sim_metrics::ErrorKindSpec] = {
    use agent_sim_metrics::ErrorKindSpec as K;
    &[
        ACL_NOT_FOUND,
        K {
            kind: "acl_denied",
            hint: "--token or --acl-tokens: the token lacks what agents need (node:write on \
                   their node, service:write on their service, session:write on their node \
                   with sessions, service:read on the upstreams); the sample names what it \
                   lacked and on what",
            heals: false,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "missing_node_registration",
            hint: "the server lost this node's registration (restarted without its state); a \
                   real agent's anti-entropy registers it again",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "no_cluster_leader",
            hint: "the server has no leader yet (6-10 s after a restart); calls are retried",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "server_shutting_down",
            hint: "the server closed streams as it shut down (a restart or a leaving server); \
                   agents reconnect, resubscribe and sync their registration",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "session_ttl_invalid",
            hint: "--session-ttl is outside what the server accepts (session_ttl_min, 10s by \
                   default, up to 24h); the server's words give its bounds",
            heals: false,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "probe_entry_exists",
            hint: "the intentions probe's service already has a service-intentions entry this \
                   run did not create: it is left as it is and no intentions probe runs; name \
                   another --probe-service",
            heals: false,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        PROBE_OVERHEAD_HIGH,
        agent::AUTO_ENCRYPT_REFUSED,
        agent::AUTO_ENCRYPT_RATE_LIMITED,
        K {
            kind: "rpc_error",
            hint: "the server answered an RPC with an error; the sample is its words (an \
                   ACL, a datacenter name, a server overloaded or restarting)",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "rpc_timeout",
            hint: "an agent's own RPC got no answer within 10 s: the server is stalled or \
                   overloaded; the call's stream is dropped and the next call opens another",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Local,
        },
        K {
            kind: "decode_answer",
            hint: "an RPC answer did not decode as Consul's msgpack (or answered another call): \
                   is --target a Consul 1.20 server RPC port? The stream is opened again",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Local,
        },
        K {
            kind: "answer_too_large",
            hint: "an RPC answer was over its size limit (docs/hardening.md); a blocking \
                   query's service may be too big to watch this way",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "watch_index_reset",
            hint: "a blocking query's index went backwards (the server restarted without its \
                   state, or another server answered): the watch starts over from 0, as \
                   Consul's agent does",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "http_decode",
            hint: "an HTTP API answer did not decode as Consul's JSON: is --http-target the \
                   Consul HTTP API?",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "wrong_port_http",
            hint: "--target is the HTTP API (8500/8501): agents subscribe on the server RPC port \
                   8300",
            heals: false,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "wrong_port_grpc",
            hint: "--target is the gRPC port (8502, for dataplanes): Subscribe is served on the \
                   server RPC port 8300",
            heals: false,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "rpc_reset_after_settings",
            hint: "the port answered HTTP/2 and then reset: is --target the gRPC port 8502 instead \
                   of the server RPC port 8300?",
            heals: false,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "rpc_closed_at_once",
            hint: "the server drops RPC connections beyond limits.rpc_max_conns_per_client \
                   (default 100 per client IP): raise it (0 = no cap) or spread agents with \
                   --source-addr; or --target is not a Consul RPC port",
            heals: false,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "tls_handshake",
            hint: "TLS to the RPC port failed: --ca-file (the CA of the servers' certificates), \
                   --tls-server-name (usually server.<dc>.consul), --cert-file/--key-file when \
                   the server verifies clients; or the port is not TLS",
            heals: false,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        H2_HANDSHAKE,
        K {
            kind: "connect_prefix",
            hint: "writing the port's first byte (0x08 gRPC, 0x04 multiplexed RPC, 0x03 before \
                   TLS) failed: the server closed or reset the connection as soon as it took \
                   it (a per-client connection cap, or not a Consul RPC port); the agent \
                   reconnects with backoff",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Os,
        },
        K {
            kind: "csr_failed",
            hint: "a leaf certificate's CSR could not be made: no CA roots yet (the roots \
                   watch has not answered; signed once it does), or the key or CSR did not \
                   build (the sample says which)",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Local,
        },
        K {
            kind: "tls_refused",
            hint: "the server refused the TLS session: with verify_incoming it wants a client \
                   certificate signed by its CA (--cert-file, --key-file)",
            heals: false,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "http_429",
            hint: "the server caps HTTP connections per client IP \
                   (limits.http_max_conns_per_client, default 200)",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        TXN_ROLLBACK,
        K {
            kind: "grpc_resource_exhausted",
            hint: "the server rate-limits requests (limits.request_limits; \"try a different \
                   server\"): the stream is subscribed again at once, then with backoff",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        // What a failing or faulty server (or `agent-sim serve --faults`)
        // makes agents see; every one is retried as a real agent does.
        K {
            kind: "grpc_unavailable",
            hint: "the server refused the Subscribe call (a rate limit: \"try again later\", or \
                   no leader): the stream is subscribed again at once, then with backoff",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "grpc_internal",
            hint: "a Subscribe stream broke: an event that does not decode, or a message cut \
                   short; the stream is subscribed again (a snapshot in progress is discarded)",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "grpc_out_of_range",
            hint: "the server sent a message larger than a gRPC client accepts (4 MiB); the \
                   stream is subscribed again",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "grpc_unknown",
            hint: "a Subscribe call or stream failed with the server's own words (the sample); \
                   the stream is subscribed again",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "stream_end",
            hint: "the server ended a Subscribe stream without an error (never done by a healthy \
                   server); a snapshot in progress is discarded and the stream subscribed again",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "session_expired",
            hint: "a TTL session renew answered 404 in the server's words (the sample): the \
                   session expired or the server lost it; the agent checks its registration \
                   and creates a new session",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "subscription_aborted",
            hint: "the server reset subscriptions (ABORTED: an ACL change, a snapshot restore): \
                   views dropped and subscribed again at index 0, at once the first time",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "conn_closed",
            hint: "the server closed the RPC connection: every stream is lost; the agent \
                   reconnects with backoff and resubscribes at its indexes",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "conn_error",
            hint: "the RPC connection failed (reset, or an HTTP/2 error: the sample says which); \
                   the agent reconnects with backoff",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "keepalive_timeout",
            hint: "the server stopped answering HTTP/2 pings on the RPC connection (stalled, \
                   overloaded, or packets lost); the agent reconnects",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "http_5xx",
            hint: "the HTTP API failed the call (the sample has the server's words); it is \
                   retried with backoff",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "http_io",
            hint: "an HTTP API call got no answer: the connection was closed or reset",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Os,
        },
        K {
            kind: "http_timeout",
            hint: "an HTTP API call got no answer within 10 s: the server stalls or is overloaded",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Local,
        },
        K {
            kind: "message_too_large",
            hint: "the server announced a Subscribe message over 4 MiB (grpc-go's limit, which \
                   real agents have too): that stream failed and is subscribed again on its \
                   connection; is --target a Consul server RPC port?",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "decode_event",
            hint: "a Subscribe message did not decode as subscribe.Event (garbage on the \
                   stream): that stream failed and is subscribed again on its connection (a \
                   snapshot in progress is discarded)",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "http_body_too_large",
            hint: "an HTTP API answer was larger than agent-sim reads (4 MiB per agent call, \
                   64 MiB for cleanup's lists); the call failed and is retried",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "unknown_fields",
            hint: "the server streamed Event fields (payload kinds) Consul 1.20 agents of \
                   agent-sim do not decode (sample: the first); skipped. A newer server?",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "unknown_events",
            hint: "a Subscribe event this stream's view does not apply (sample: what it was); \
                   ignored, the stream goes on",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "view_full",
            hint: "a subscribed service has more instances (or an intentions entry more \
                   sources) than one agent's view keeps (65,536); the rest are not tracked",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Local,
        },
    ]
};
