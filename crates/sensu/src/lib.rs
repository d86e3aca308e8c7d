//! Simulated Sensu Go agents: tens of thousands of WebSocket sessions against
//! a real (or the embedded) Sensu backend, each behaving like a 6.x agent.
//!
//! Main parts:
//! - [`codec`]: the frame (`<kind>\n<body>`) and message codec, protobuf and
//!   JSON (`json.rs`), plus the backend's event validation rules. Pure bytes.
//! - [`messages`]: entity, keepalive, check-result and agent-side event
//!   builders, with a pre-encoded protobuf fast path for keepalives.
//! - [`session`]: one agent session: the connect step (`connect`: dial,
//!   TLS, upgrade), then wait for `entity_config`, keepalives, check
//!   replies, pings, polite close.
//! - [`SensuFactory`] / [`SensuAgent`]: the [`agent_sim_fleet`] glue.
//!
//! What it is not: it parses no CLI flags (the `cli` crate fills
//! [`SensuConfig`]) and runs no backend (that is `agent-sim-server`).

pub mod codec;
mod connect;
mod grid;
mod json;
pub mod messages;
pub mod session;
mod upgrade;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agent_sim_fleet::servers::Rotation;
use agent_sim_fleet::units::Rate;
use agent_sim_fleet::{Agent, AgentFactory, BoxFuture, SessionCx, SessionEnd};
use agent_sim_metrics::{CounterId, ErrorKindSpec, LatencyId, Metrics, MetricsSpec};

pub use codec::{CodecError, Encoding};
use connect::Target;
use messages::{MessageBuilder, Templates};
use session::CheckState;

/// Everything a user can tune about the simulated Sensu agents.
#[derive(Debug, Clone)]
pub struct SensuConfig {
    /// Backends: `host:port` (plain WebSocket), `ws://host:port/` or
    /// `wss://host:port/` URLs; agent i uses `targets[i % len]`.
    pub targets: Vec<String>,
    /// Sensu namespace (`Sensu-Namespace`).
    pub namespace: String,
    /// Agent user (`Sensu-User`, basic auth).
    pub user: String,
    /// Agent password (basic auth).
    pub password: String,
    /// Subscriptions (`Sensu-Subscriptions`, entity subscriptions).
    pub subscriptions: Vec<String>,
    /// Body encoding.
    pub encoding: Encoding,
    /// Keepalive interval (`check.interval` of keepalives).
    pub keepalive_interval: Duration,
    /// Keepalive warning timeout (`check.timeout` of keepalives).
    pub keepalive_warning_timeout: u32,
    /// Keepalive critical timeout (`check.ttl` of keepalives; 0 = off).
    pub keepalive_critical_timeout: u32,
    /// Entity names are `<prefix>-<index>` (plain decimal index).
    pub name_prefix: String,
    /// Ask the backend to delete the entity when keepalives stop.
    pub deregister: bool,
    /// Agent-side events per agent (Poisson schedule), if any.
    pub event_rate: Option<Rate>,
    /// Output bytes of each agent-side event.
    pub event_output_size: usize,
    /// PEM file of CA certificates for `wss://` targets.
    pub ca_file: Option<PathBuf>,
    /// Accept any server certificate on `wss://` targets.
    pub insecure_skip_tls_verify: bool,
    /// PEM client certificate presented on `wss://` targets.
    pub cert_file: Option<PathBuf>,
    /// PEM key of `cert_file`.
    pub key_file: Option<PathBuf>,
    /// WebSocket ping interval.
    pub ping_interval: Duration,
    /// Drop the session when no pong arrived this long after a ping.
    pub pong_timeout: Duration,
    /// How long to wait for the first `entity_config` before sending anyway.
    pub entity_config_timeout: Duration,
    /// Bound on TCP connect + TLS + WebSocket upgrade.
    pub handshake_timeout: Duration,
    /// `sensu_agent_version` of the entity.
    pub agent_version: String,
    /// Handlers put on check result events (empty: the check's own handlers).
    pub handlers: Vec<String>,
    /// Step of the fleet's shared timer grid: a session's keepalives, pings
    /// and other timers fire on its points, so the agents due within one
    /// step are woken (and write) together; each agent's schedule is
    /// anchored on a point, its intervals unchanged. Zero: every timer at
    /// its own instant (one process wakeup per message). At most 1 s.
    pub timer_tick: Duration,
}

impl Default for SensuConfig {
    fn default() -> Self {
        SensuConfig {
            targets: vec!["ws://127.0.0.1:8081/".into()],
            namespace: "default".into(),
            user: "agent".into(),
            password: "P@ssw0rd!".into(),
            subscriptions: vec!["linux".into()],
            encoding: Encoding::Protobuf,
            keepalive_interval: Duration::from_secs(20),
            keepalive_warning_timeout: 120,
            keepalive_critical_timeout: 0,
            name_prefix: "agent-sim".into(),
            deregister: false,
            event_rate: None,
            event_output_size: 256,
            ca_file: None,
            insecure_skip_tls_verify: false,
            cert_file: None,
            key_file: None,
            ping_interval: Duration::from_secs(30),
            pong_timeout: Duration::from_secs(45),
            entity_config_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(60),
            agent_version: "6.12.0".into(),
            handlers: Vec::new(),
            timer_tick: DEFAULT_TIMER_TICK,
        }
    }
}

/// Default [`SensuConfig::timer_tick`]: a session's schedule starts less
/// than 50 ms after the real agent's would, and the process wakes at most
/// 20 times a second for its agents' timers.
pub const DEFAULT_TIMER_TICK: Duration = Duration::from_millis(50);

/// How a real sensu-agent 6.12 waits between connection attempts, the
/// default of a Sensu fleet: its `--retry-min 1s --retry-max 120s
/// --retry-multiplier 2`, each wait after the first with up to 100 % added
/// at random, and the first attempt after a held session at once
/// ([`agent_sim_fleet::ReconnectPolicy::SensuAgent`]).
pub fn real_agent_backoff() -> agent_sim_fleet::Backoff {
    agent_sim_fleet::Backoff::with_policy(
        agent_sim_fleet::ReconnectPolicy::SensuAgent,
        Duration::from_secs(1),
        Duration::from_secs(120),
    )
}

/// Errors of this crate (configuration and setup; session failures are
/// counted outcomes, see [`SessionEnd`]).
#[derive(Debug, thiserror::Error)]
pub enum SensuError {
    /// A setting of [`SensuConfig`] is invalid: the field (as named in the
    /// struct) and why, in one line.
    #[error("{field}: {reason}")]
    Invalid {
        /// The [`SensuConfig`] field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A request could not be built from the configuration.
    #[error("sensu config: {0}")]
    Config(String),
    /// TLS setup failed (CA file unreadable or invalid).
    #[error("sensu tls: {0}")]
    Tls(String),
    /// An I/O error.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A frame or message could not be encoded or decoded.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// A request could not be built.
    #[error("sensu request: {0}")]
    Http(#[from] http::Error),
}

pub(crate) const C_KEEPALIVES_SENT: &str = "keepalives_sent";
pub(crate) const C_EVENTS_SENT: &str = "events_sent";
pub(crate) const C_CHECK_REQUESTS_RECEIVED: &str = "check_requests_received";
pub(crate) const C_CHECK_REQUESTS_DROPPED: &str = "check_requests_dropped";
pub(crate) const C_CHECK_REPLIES_SENT: &str = "check_replies_sent";
pub(crate) const C_AGENT_EVENTS_SENT: &str = "agent_events_sent";
pub(crate) const C_ENTITY_CONFIGS_RECEIVED: &str = "entity_configs_received";
pub(crate) const C_FRAMES_RECEIVED: &str = "frames_received";
pub(crate) const C_BYTES_SENT: &str = "bytes_sent";
pub(crate) const C_BYTES_RECEIVED: &str = "bytes_received";
/// Sessions whose upgrade the backend accepted (each one a credentials
/// check on a real backend: bcrypt, ~50-80 ms of its CPU).
pub(crate) const C_CONNECTS: &str = "connects";

/// Counters whose per-second rate means something: steady activity of the
/// sessions (keepalives, events, checks, traffic), not one-off counts such
/// as sessions established. The run reports `rates_per_s` for these only.
pub const RATED_COUNTERS: &[&str] = &[
    C_KEEPALIVES_SENT,
    C_EVENTS_SENT,
    C_CHECK_REQUESTS_RECEIVED,
    C_CHECK_REPLIES_SENT,
    C_AGENT_EVENTS_SENT,
    C_FRAMES_RECEIVED,
    C_BYTES_SENT,
    C_BYTES_RECEIVED,
    C_CONNECTS,
];

pub(crate) const L_CONNECT: &str = "connect";
pub(crate) const L_SESSION_READY: &str = "session_ready";
pub(crate) const L_KEEPALIVE_LATENESS: &str = "keepalive_lateness";
pub(crate) const L_CHECK_TURNAROUND: &str = "check_turnaround";

/// Counter and latency names the Sensu agents record.
pub fn metrics_spec() -> MetricsSpec {
    MetricsSpec {
        counters: vec![
            C_KEEPALIVES_SENT,
            C_EVENTS_SENT,
            C_CHECK_REQUESTS_RECEIVED,
            C_CHECK_REQUESTS_DROPPED,
            C_CHECK_REPLIES_SENT,
            C_AGENT_EVENTS_SENT,
            C_ENTITY_CONFIGS_RECEIVED,
            C_FRAMES_RECEIVED,
            C_BYTES_SENT,
            C_BYTES_RECEIVED,
            C_CONNECTS,
        ],
        latencies: vec![
            L_CONNECT,
            L_SESSION_READY,
            L_KEEPALIVE_LATENESS,
            L_CHECK_TURNAROUND,
        ],
        errors: ERROR_KINDS.to_vec(),
    }
}

/// The error kinds of a Sensu session, with what to check.
const ERROR_KINDS: &[ErrorKindSpec] = &[
    ErrorKindSpec {
        kind: "upgrade_401",
        hint: "--user / --password (AGENT_SIM_SENSU_PASSWORD): the backend refused the agent's \
               credentials (a fresh backend's agent user is agent / P@ssw0rd!)",
        heals: false,
        said_by: agent_sim_metrics::Speaker::Server,
    },
    ErrorKindSpec {
        kind: "upgrade_403",
        hint: "--user: the user may not connect agents in this namespace (RBAC)",
        heals: false,
        said_by: agent_sim_metrics::Speaker::Server,
    },
    ErrorKindSpec {
        kind: "upgrade_404",
        hint: "--namespace: the backend does not know it (one created seconds ago is refused until \
               the backend's cache catches up); or --target is not the agent port (8081)",
        heals: false,
        said_by: agent_sim_metrics::Speaker::Server,
    },
    ErrorKindSpec {
        kind: "upgrade_5xx",
        hint: "the backend failed to set the session up (overloaded, etcd trouble); lower --ramp",
        heals: true,
        said_by: agent_sim_metrics::Speaker::Server,
    },
    ErrorKindSpec {
        kind: "upgrade_4xx",
        hint: "the backend refused the upgrade: is --target the agent WebSocket port (8081)?",
        heals: true,
        said_by: agent_sim_metrics::Speaker::Server,
    },
    ErrorKindSpec {
        kind: "upgrade_protocol",
        hint: "the port did not answer like a Sensu agent endpoint: is --target the agent port \
               (8081), and ws:// vs wss:// right?",
        heals: false,
        said_by: agent_sim_metrics::Speaker::Server,
    },
    ErrorKindSpec {
        kind: "tls",
        hint: "TLS handshake failed: wss:// needs TLS on the backend's agent port; check --ca-file \
               or --insecure-skip-tls-verify, or use ws:// for a plain port",
        heals: false,
        said_by: agent_sim_metrics::Speaker::Server,
    },
    ErrorKindSpec {
        kind: "tls_client_cert",
        hint: "the backend refused the agent's client certificate in the TLS handshake (its alert \
               in the sample): --cert-file / --key-file must be a certificate signed by the CA \
               the backend trusts for agents, and --ca-file the CA of the backend's own \
               certificate; a backend that requires one refuses agents without --cert-file",
        heals: false,
        said_by: agent_sim_metrics::Speaker::Server,
    },
    ErrorKindSpec {
        kind: "handshake_timeout",
        hint: "the backend took longer than the handshake timeout to accept the session \
               (overloaded: lower --ramp; after a storm or restart, keep --reconnect jittered \
               or lower --max-dialing)",
        heals: true,
        said_by: agent_sim_metrics::Speaker::Local,
    },
    ErrorKindSpec {
        kind: "pong_timeout",
        hint: "no pong within 45 s of a ping: the backend or the network stalls",
        heals: true,
        said_by: agent_sim_metrics::Speaker::Local,
    },
    ErrorKindSpec {
        kind: "ws_closed",
        hint: "the backend closed the session with a close frame (the sample has its code and \
               reason): a restart, or it dropped the agent",
        heals: true,
        said_by: agent_sim_metrics::Speaker::Server,
    },
    ErrorKindSpec {
        kind: "message_too_large",
        hint: "the backend sent a WebSocket message over 64 KiB (real backend messages are under \
               1 KiB): the session was dropped and is retried; is --target a Sensu agent port?",
        heals: true,
        said_by: agent_sim_metrics::Speaker::Server,
    },
    ErrorKindSpec {
        kind: "unknown_messages",
        hint: "the backend sent a message type a 6.x agent does not handle (sample: its type); \
               ignored, as the real agent does. A newer backend?",
        heals: true,
        said_by: agent_sim_metrics::Speaker::Server,
    },
    ErrorKindSpec {
        kind: "unknown_fields",
        hint: "a backend message carried top-level fields Sensu Go 6.x does not define (sample: \
               the first); ignored. A newer backend?",
        heals: true,
        said_by: agent_sim_metrics::Speaker::Server,
    },
    ErrorKindSpec {
        kind: "checks_forgotten",
        hint: "the backend scheduled more distinct checks on one agent than it remembers (64); \
               the oldest check's last `issued` was forgotten",
        heals: true,
        said_by: agent_sim_metrics::Speaker::Server,
    },
    ErrorKindSpec {
        kind: "entity_config_timeout",
        hint: "the backend sent no entity_config within the wait; a real agent logs this and \
               carries on",
        heals: true,
        said_by: agent_sim_metrics::Speaker::Server,
    },
    // What a failing or faulty backend (or `agent-sim serve --faults`) makes
    // agents see; every one is retried with backoff.
    ErrorKindSpec {
        kind: "upgrade_429",
        hint: "the backend (or a proxy in front of it) rate-limits upgrades: lower --ramp, raise \
               --reconnect-min",
        heals: true,
        said_by: agent_sim_metrics::Speaker::Server,
    },
    ErrorKindSpec {
        kind: "upgrade_reset",
        hint: "the connection was reset during the upgrade (RST): a backend or proxy refusing \
               connections under load, or restarting",
        heals: true,
        said_by: agent_sim_metrics::Speaker::Os,
    },
    ErrorKindSpec {
        kind: "upgrade_closed",
        hint: "the backend closed the connection before answering the upgrade: overloaded, \
               restarting, or a proxy dropping it",
        heals: true,
        said_by: agent_sim_metrics::Speaker::Server,
    },
    ErrorKindSpec {
        kind: "upgrade_io",
        hint: "the upgrade failed on the socket; the sample says how",
        heals: true,
        said_by: agent_sim_metrics::Speaker::Os,
    },
    ErrorKindSpec {
        kind: "ws_dropped",
        hint: "the backend's TCP connection ended without a WebSocket close (FIN): a crash, a \
               kill, an idle timeout in a proxy, or a frame cut short",
        heals: true,
        said_by: agent_sim_metrics::Speaker::Server,
    },
    ErrorKindSpec {
        kind: "ws_reset",
        hint: "the session's connection was reset (RST) by the backend, a proxy or the network",
        heals: true,
        said_by: agent_sim_metrics::Speaker::Os,
    },
    ErrorKindSpec {
        kind: "ws_capacity",
        hint: "the backend sent a message larger than an agent accepts (64 KiB): the session is \
               dropped, as a real agent's would be",
        heals: true,
        said_by: agent_sim_metrics::Speaker::Server,
    },
    ErrorKindSpec {
        kind: "ws_protocol",
        hint: "the backend broke the WebSocket protocol (a bad frame); the sample says which rule",
        heals: true,
        said_by: agent_sim_metrics::Speaker::Server,
    },
    ErrorKindSpec {
        kind: "ws_io",
        hint: "the session failed on the socket; the sample says how",
        heals: true,
        said_by: agent_sim_metrics::Speaker::Os,
    },
    ErrorKindSpec {
        kind: "decode_frame",
        hint: "the backend sent a message without a `type\\n` prefix: counted and skipped, the \
               session goes on",
        heals: true,
        said_by: agent_sim_metrics::Speaker::Server,
    },
];

/// Metric ids resolved once per factory.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ids {
    pub keepalives_sent: CounterId,
    pub events_sent: CounterId,
    pub check_requests_received: CounterId,
    pub check_requests_dropped: CounterId,
    pub check_replies_sent: CounterId,
    pub agent_events_sent: CounterId,
    pub entity_configs_received: CounterId,
    pub frames_received: CounterId,
    pub bytes_sent: CounterId,
    pub bytes_received: CounterId,
    pub connects: CounterId,
    pub connect: LatencyId,
    pub session_ready: LatencyId,
    pub keepalive_lateness: LatencyId,
    pub check_turnaround: LatencyId,
}

impl Ids {
    fn resolve(m: &Metrics) -> Self {
        Ids {
            keepalives_sent: m.counter(C_KEEPALIVES_SENT),
            events_sent: m.counter(C_EVENTS_SENT),
            check_requests_received: m.counter(C_CHECK_REQUESTS_RECEIVED),
            check_requests_dropped: m.counter(C_CHECK_REQUESTS_DROPPED),
            check_replies_sent: m.counter(C_CHECK_REPLIES_SENT),
            agent_events_sent: m.counter(C_AGENT_EVENTS_SENT),
            entity_configs_received: m.counter(C_ENTITY_CONFIGS_RECEIVED),
            frames_received: m.counter(C_FRAMES_RECEIVED),
            bytes_sent: m.counter(C_BYTES_SENT),
            bytes_received: m.counter(C_BYTES_RECEIVED),
            connects: m.counter(C_CONNECTS),
            connect: m.latency(L_CONNECT),
            session_ready: m.latency(L_SESSION_READY),
            keepalive_lateness: m.latency(L_KEEPALIVE_LATENESS),
            check_turnaround: m.latency(L_CHECK_TURNAROUND),
        }
    }
}

/// What every agent of a factory shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub cfg: SensuConfig,
    pub targets: Vec<Target>,
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub metrics: Metrics,
    pub ids: Ids,
    pub templates: Arc<Templates>,
    /// The timer grid every session of this factory shares.
    pub grid: grid::TimerGrid,
}

/// Creates [`SensuAgent`]s sharing one validated configuration, TLS client
/// config, resolved targets and message templates.
#[derive(Debug)]
pub struct SensuFactory {
    shared: Arc<Shared>,
}

/// The shared rustls client config for `wss://` targets (see
/// [`agent_sim_net::tls`]: CA file, else the platform's trust store, or no
/// verification with `insecure_skip_tls_verify`; a client certificate when
/// given).
fn tls_client_config(cfg: &SensuConfig) -> Result<Arc<rustls::ClientConfig>, SensuError> {
    use agent_sim_net::{ClientTls, TlsError, client_config};
    let t = ClientTls {
        ca_file: cfg.ca_file.clone(),
        insecure_skip_verify: cfg.insecure_skip_tls_verify,
        cert_file: cfg.cert_file.clone(),
        key_file: cfg.key_file.clone(),
    };
    client_config(&t, &[]).map_err(|e| match e {
        TlsError::NoSystemRoots => SensuError::Tls(
            "wss:// target without --ca-file and no system CA bundle found \
             (use --ca-file or --insecure-skip-tls-verify)"
                .into(),
        ),
        e => SensuError::Tls(e.to_string()),
    })
}

impl SensuFactory {
    /// Validates `cfg` (URLs, names, durations, TLS material) and builds what
    /// every agent shares. `metrics` must include [`metrics_spec`].
    pub fn new(cfg: SensuConfig, metrics: Metrics) -> Result<Self, SensuError> {
        cfg.validate()?;
        let targets = cfg
            .targets
            .iter()
            .map(|t| Target::parse(t))
            .collect::<Result<Vec<_>, _>>()?;
        let tls = if targets.iter().any(|t| t.tls) {
            Some(tls_client_config(&cfg)?)
        } else {
            None
        };
        let ids = Ids::resolve(&metrics);
        let templates = Arc::new(Templates::new(&cfg));
        let cfg_tick = cfg.timer_tick;
        Ok(SensuFactory {
            shared: Arc::new(Shared {
                cfg,
                targets,
                tls,
                metrics,
                ids,
                templates,
                grid: grid::TimerGrid::new(tokio::time::Instant::now(), cfg_tick),
            }),
        })
    }

    /// The validated configuration.
    pub fn config(&self) -> &SensuConfig {
        &self.shared.cfg
    }
}

impl SensuConfig {
    /// Checks every setting against what a Sensu 6.x backend accepts (the
    /// backend's own validation rules where it has them), without opening a
    /// socket or reading a file. The first problem is returned as
    /// [`SensuError::Invalid`] naming the field.
    pub fn validate(&self) -> Result<(), SensuError> {
        let bad = |field: &'static str, reason: String| Err(SensuError::Invalid { field, reason });
        if self.targets.is_empty() {
            return bad("targets", "at least one target is required".into());
        }
        for t in &self.targets {
            Target::parse(t)?;
        }
        if self.namespace.is_empty() {
            return bad("namespace", "must not be empty".into());
        }
        if !codec::valid_name(&format!("{}-0", self.name_prefix)) {
            return bad(
                "name_prefix",
                format!(
                    "{:?}: use letters, digits, '_', '.', '-', ':' (Sensu entity name rules)",
                    self.name_prefix
                ),
            );
        }
        for s in &self.subscriptions {
            if !codec::valid_name(s) {
                return bad(
                    "subscriptions",
                    format!("{s:?} is not a valid subscription name ([A-Za-z0-9_.:-]+)"),
                );
            }
        }
        if self.keepalive_interval < Duration::from_secs(1) {
            return bad("keepalive_interval", "must be at least 1s".into());
        }
        let interval = u64::from(messages::interval_secs(self.keepalive_interval));
        let ttl = u64::from(self.keepalive_critical_timeout);
        if ttl != 0 && (ttl <= interval || ttl < 5) {
            return bad(
                "keepalive_critical_timeout",
                format!(
                    "{ttl} must be 0 (off) or greater than the keepalive interval ({interval}s) \
                     and at least 5 (backend rule)"
                ),
            );
        }
        for (field, d) in [
            ("ping_interval", self.ping_interval),
            ("pong_timeout", self.pong_timeout),
            ("entity_config_timeout", self.entity_config_timeout),
            ("handshake_timeout", self.handshake_timeout),
        ] {
            if d.is_zero() {
                return bad(field, "must be greater than zero".into());
            }
        }
        if self.timer_tick > Duration::from_secs(1) {
            return bad("timer_tick", "must be at most 1s".into());
        }
        if self.cert_file.is_some() != self.key_file.is_some() {
            return bad(
                "cert_file",
                "a client certificate needs both a certificate file and a key file".into(),
            );
        }
        if self.event_output_size > MAX_EVENT_OUTPUT {
            return bad(
                "event_output_size",
                format!("must be at most {MAX_EVENT_OUTPUT} bytes"),
            );
        }
        for (field, v) in [
            ("namespace", &self.namespace),
            ("user", &self.user),
            ("password", &self.password),
        ] {
            if v.chars().any(|c| c.is_control()) {
                return bad(field, "contains control characters".into());
            }
        }
        Ok(())
    }
}

/// Largest output of an agent-side event.
pub const MAX_EVENT_OUTPUT: usize = 32 * 1024;

impl AgentFactory for SensuFactory {
    type Agent = SensuAgent;

    fn create(&self, index: u64) -> SensuAgent {
        let name = messages::agent_name(&self.shared.cfg.name_prefix, index);
        SensuAgent {
            builder: MessageBuilder::new(self.shared.templates.clone(), name, index),
            // Shuffled once per agent, as sensu-go's backend selector does.
            backends: Rotation::new(
                self.shared.targets.len(),
                index.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            ),
            shared: self.shared.clone(),
            checks: CheckState::default(),
        }
    }
}

/// One simulated Sensu agent (state kept across its sessions).
#[derive(Debug)]
pub struct SensuAgent {
    shared: Arc<Shared>,
    builder: MessageBuilder,
    checks: CheckState,
    /// The backends in this agent's order: the next on every attempt.
    backends: Rotation,
}

impl Agent for SensuAgent {
    fn run_session<'a>(&'a mut self, cx: &'a SessionCx) -> BoxFuture<'a, SessionEnd> {
        Box::pin(session::run(
            &self.shared,
            &mut self.builder,
            &mut self.checks,
            self.backends.take(),
            cx,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics() -> Metrics {
        Metrics::new(&metrics_spec(), 1)
    }

    #[test]
    fn default_config_is_valid() {
        SensuFactory::new(SensuConfig::default(), metrics()).unwrap();
    }

    #[test]
    fn bad_configs_are_rejected() {
        let cases: Vec<fn(&mut SensuConfig)> = vec![
            |c| c.targets = vec!["http://x:1/".into()],
            |c| c.targets = vec!["ws://".into()],
            |c| c.targets.clear(),
            |c| c.namespace.clear(),
            |c| c.name_prefix = "a b".into(),
            |c| c.keepalive_critical_timeout = 10,
            |c| c.subscriptions = vec!["a,b".into()],
            |c| c.timer_tick = Duration::from_millis(1001),
            |c| {
                c.targets = vec!["wss://127.0.0.1:8081/".into()];
                c.ca_file = Some("/nonexistent/ca.pem".into());
            },
        ];
        for (i, f) in cases.iter().enumerate() {
            let mut c = SensuConfig::default();
            f(&mut c);
            assert!(SensuFactory::new(c, metrics()).is_err(), "case {i}");
        }
    }

    #[test]
    fn wss_with_insecure_verification_builds() {
        let c = SensuConfig {
            targets: vec!["wss://localhost:8081/".into()],
            insecure_skip_tls_verify: true,
            ..Default::default()
        };
        SensuFactory::new(c, metrics()).unwrap();
    }

    /// The per-agent state and the session future stay small (the boxed
    /// handshake is not part of the session future).
    #[test]
    fn agent_and_session_future_are_small() {
        let m = Metrics::new(&agent_sim_fleet::metrics_spec().merge(&metrics_spec()), 1);
        let f = SensuFactory::new(SensuConfig::default(), m.clone()).unwrap();
        let mut agent = f.create(1);
        let cx = SessionCx::standalone(1, m, tokio_util::sync::CancellationToken::new());
        let agent_size = std::mem::size_of_val(&agent);
        let fut = session::run(&agent.shared, &mut agent.builder, &mut agent.checks, 0, &cx);
        let fut_size = std::mem::size_of_val(&fut);
        println!(
            "agent {agent_size} B, session future {fut_size} B, ws {} B",
            connect::WS_SIZE
        );
        assert!(agent_size <= 128, "{agent_size}");
        // ≈0.9 KiB (the WebSocket, the schedule and the wait; the handlers
        // are boxed): 896 bytes in debug builds.
        assert!(fut_size <= 1024, "{fut_size}");
    }
}
