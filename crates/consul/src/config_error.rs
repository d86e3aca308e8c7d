//! Why a Consul fleet's configuration is refused ([`ConfigError`]): one
//! variant per rule [`crate::config`] checks, each saying which field. A
//! leaf: it imports only the leaves whose values it names.
//!
//! [`ConsulConfig`]: crate::config::ConsulConfig
//! [`Connection`]: crate::config::Connection

use std::time::Duration;

use agent_sim_fleet::Rate;

use crate::modes::{KV_MAX_PREFIXES, SeedService, go_duration};
use crate::pattern::PatternError;
use crate::proxy::ProxyConfigError;
use crate::vault_config::VaultConfigError;

/// Why a [`ConsulConfig`](crate::config::ConsulConfig) (or the
/// [`Connection`](crate::config::Connection) a dataplane fleet shares) is
/// refused: one variant per rule, its words without the field
/// ([`ConfigError::field`] names it; [`crate::ConsulError::Invalid`] says
/// both).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// No target to dial; the words say which port.
    #[error("{0}")]
    NoTarget(&'static str),
    /// A target or the HTTP API that is not `host:port`.
    #[error("{value:?}: expected host:port")]
    NotHostPort {
        /// `targets` or `http_target`.
        field: &'static str,
        /// The value as given.
        value: String,
    },
    /// A name that does not resolve.
    #[error("{value:?}: {source}")]
    Unresolved {
        /// `targets` or `http_target`.
        field: &'static str,
        /// The value as given.
        value: String,
        /// What the resolver said.
        source: std::io::Error,
    },
    /// A name that resolves to no address.
    #[error("{value:?}: no address")]
    NoAddress {
        /// `targets` or `http_target`.
        field: &'static str,
        /// The value as given.
        value: String,
    },
    /// An `https://` HTTP API without TLS settings.
    #[error("https:// needs TLS settings (a CA file or insecure verification)")]
    HttpsWithoutTls,
    /// A name prefix that is empty or holds `/` or a space.
    #[error("{0:?}: empty or has '/' or ' '")]
    NamePrefix(String),
    /// A keepalive ping interval the server answers with GOAWAY.
    #[error("{0:?}: below the server's 15s MinTime (GOAWAY too_many_pings)")]
    KeepaliveTime(Duration),
    /// A keepalive timeout of zero.
    #[error("must be positive")]
    KeepaliveTimeout,
    /// TLS without the servers' CA (nor insecure verification).
    #[error(
        "TLS to Consul needs the CA that signed the servers' certificates (or insecure \
         verification)"
    )]
    NoCa,
    /// A client certificate without its key, or a key without its
    /// certificate.
    #[error("a client certificate needs both a certificate file and a key file")]
    HalfClientCert,
    /// Per-agent tokens with a wire that batches registrations (one token
    /// per request, not per agent).
    #[error(
        "per-agent tokens need the client agent wire (--consul-agent client): the HTTP wire \
         batches many agents' registrations in one request under one token"
    )]
    AclTokensWire,
    /// A token create rate out of (0, 100000] per second.
    #[error("{0}/s: must be above 0 and at most 100000/s")]
    AclTokenRate(f64),
    /// A Vault setting.
    #[error(transparent)]
    Vault(#[from] VaultConfigError),
    /// A setting of the proxies behind the agents.
    #[error(transparent)]
    Proxies(#[from] ProxyConfigError),
    /// An upstream pattern that does not parse.
    #[error(transparent)]
    Upstream(PatternError),
    /// Registration without a service name.
    #[error("empty service name")]
    ServiceName,
    /// Registration of no instance.
    #[error("must be at least 1")]
    NoServices,
    /// More instances than one `/v1/txn` holds.
    #[error(
        "{services} services per agent{} need {ops} txn operations; at most {max}",
        if *sidecars { " with sidecars" } else { "" }
    )]
    TxnOps {
        /// Instances per agent.
        services: u32,
        /// With a sidecar each.
        sidecars: bool,
        /// The operations they take.
        ops: usize,
        /// The most one transaction holds.
        max: usize,
    },
    /// A session TTL under 1 s.
    #[error("{0:?}: must be at least 1s (servers accept 10s..24h by default)")]
    SessionTtl(Duration),
    /// An anti-entropy interval under 1 s.
    #[error("{0:?}: must be at least 1s")]
    AntiEntropy(Duration),
    /// A flap rate out of (0, 100/s].
    #[error("{0}: must be in (0, 100/s] per agent")]
    FlapRate(Rate),
    /// Flapping without registered checks.
    #[error("flapping needs registered services (register = true)")]
    FlapUnregistered,
    /// A blocking wait out of 1 s to 10 min.
    #[error(
        "{}: between 1s and 10m (a server holds a query at most max_query_time, 10 min)",
        go_duration(*.0)
    )]
    BlockingWait(Duration),
    /// The intentions probe on a watch that is not a Subscribe stream.
    #[error(
        "intentions are watched on Subscribe streams only: --probe catalog with --watch \
         blocking or http"
    )]
    IntentionsNotStreaming,
    /// `--change-every` without the catalog probe.
    #[error("--change-every changes the probe's own catalog instance: it needs --probe catalog")]
    ChangeEveryNotCatalog,
    /// A seeded service no agent watches.
    #[error("{0}: no agent watches it (name it in --upstreams or --probe-service)")]
    SeedUnwatched(SeedService),
    /// A probe interval under 1 s.
    #[error("must be at least 1s")]
    ProbeEvery,
    /// A probe timeout of zero.
    #[error("must be positive")]
    ProbeTimeoutZero,
    /// A probe timeout longer than the probe interval.
    #[error("{timeout:?} must not exceed the probe interval {every:?} (one probe at a time)")]
    ProbeTimeoutOver {
        /// The timeout in force.
        timeout: Duration,
        /// The probe interval.
        every: Duration,
    },
    /// A probe timeout longer than half the interval with two probe kinds.
    #[error(
        "{timeout:?} must not exceed half the probe interval {every:?} with two probe kinds (the \
         intentions change comes half an interval after the catalog change)"
    )]
    ProbeTimeoutOverHalf {
        /// The timeout in force.
        timeout: Duration,
        /// The probe interval.
        every: Duration,
    },
    /// A probe service that is a per-agent pattern.
    #[error("must be one shared service, not a per-agent pattern")]
    ProbeServicePattern,
    /// An empty probe service name.
    #[error("empty service name")]
    ProbeServiceEmpty,
    /// A probe kind that is not one.
    #[error("probe kind {0:?}: expected catalog, intentions or kv")]
    ProbeKind(String),
    /// Probe kinds that do not combine.
    #[error("probe kinds {0:?}: one kind, or catalog,intentions")]
    ProbeKinds(String),
    /// More KV prefixes than an agent watches.
    #[error("{0} prefixes: at most {KV_MAX_PREFIXES} per agent")]
    KvPrefixes(usize),
    /// A KV prefix with characters a KV path does not take.
    #[error("prefix {0:?}: no '?', '#' or space in a KV path")]
    KvPrefixChars(String),
    /// A KV prefix pattern that does not parse.
    #[error("prefix {prefix:?}: {source}")]
    KvPrefix {
        /// The prefix as given.
        prefix: String,
        /// Why it does not parse.
        source: PatternError,
    },
    /// `--probe kv` whose key no watched prefix holds.
    #[error(
        "--probe kv changes {key}, outside every watched prefix ({watched}): watch one that \
         holds it, the same for every agent (e.g. --watch-kv {own})"
    )]
    KvProbeUnwatched {
        /// The probe key.
        key: String,
        /// The watched prefixes, joined.
        watched: String,
        /// The run's own prefix.
        own: String,
    },
    /// `--probe kv` in a sharded run's other processes.
    #[error(
        "--probe kv is timed by the process that writes the key: not in a sharded run's other \
         processes yet"
    )]
    KvProbeSharded,
}

impl ConfigError {
    /// The [`ConsulConfig`](crate::config::ConsulConfig) field refused (as
    /// named in the struct, `probe.every` for nested ones).
    pub fn field(&self) -> &'static str {
        use ConfigError as E;
        match self {
            E::NoTarget(_) => "targets",
            E::NotHostPort { field, .. }
            | E::Unresolved { field, .. }
            | E::NoAddress { field, .. } => field,
            E::HttpsWithoutTls => "http_target",
            E::NamePrefix(_) => "name_prefix",
            E::KeepaliveTime(_) => "keepalive_time",
            E::KeepaliveTimeout => "keepalive_timeout",
            E::NoCa => "tls",
            E::HalfClientCert => "tls.cert_file",
            E::Vault(v) => v.field(),
            E::Proxies(p) => p.field(),
            E::Upstream(_) => "upstreams",
            E::ServiceName => "service_name",
            E::NoServices | E::TxnOps { .. } => "services_per_agent",
            E::SessionTtl(_) => "session_ttl",
            E::AntiEntropy(_) => "anti_entropy",
            E::FlapRate(_) | E::FlapUnregistered => "flap_rate",
            E::BlockingWait(_) => "blocking_wait",
            E::IntentionsNotStreaming
            | E::ChangeEveryNotCatalog
            | E::ProbeKind(_)
            | E::ProbeKinds(_) => "probe",
            E::SeedUnwatched(_) => "seed_service",
            E::AclTokensWire => "acl_tokens",
            E::AclTokenRate(_) => "acl_token_rate",
            E::ProbeEvery => "probe.every",
            E::ProbeTimeoutZero | E::ProbeTimeoutOver { .. } | E::ProbeTimeoutOverHalf { .. } => {
                "probe.timeout"
            }
            E::ProbeServicePattern | E::ProbeServiceEmpty => "probe.service",
            E::KvPrefixes(_)
            | E::KvPrefixChars(_)
            | E::KvPrefix { .. }
            | E::KvProbeUnwatched { .. }
            | E::KvProbeSharded => "watch_kv",
        }
    }
}
