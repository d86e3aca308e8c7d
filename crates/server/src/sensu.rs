//! The Sensu agent endpoint: a Sensu Go 6.x–compatible backend port (`ws://HOST:8081/`)
//! for tens of thousands of simulated agents in one process.
//!
//! Main parts:
//! - [`serve`]: the listener (the accept loop every server shares, `crate::listen`) and
//!   the check schedulers. Each connection is its own task: TLS when the port has it
//!   ([`tls`], `wss://`), a boxed WebSocket handshake (`upgrade`: headers, namespace,
//!   client certificate or Basic credentials, encoding choice), then a small session
//!   loop (`session`).
//! - `auth`: the password check, plain or with bcrypt at a cost as the real backend's
//!   (counted with its CPU time), and the CN of a verified client certificate.
//! - `session`: sends the `entity_config` placeholder first, validates every
//!   `keepalive` / `event` the way the backend does (invalid frames are counted by
//!   reason and the connection stays open), pushes the updated `entity_config` after the
//!   first valid keepalive, forwards published `check_request`s, counts replies, answers
//!   pings, and sends close 1001 on shutdown.
//! - `schedule`: one task per [`CheckSpec`] that builds one `CheckRequest` per interval,
//!   encodes it once per namespace and encoding, and publishes it on a
//!   `tokio::sync::watch` channel; every session whose subscriptions match awaits that
//!   channel and writes the shared [`bytes::Bytes`] (no per-session timers or copies).
//! - [`SensuTargetStats`]: atomic counters, [`SensuTargetStats::snapshot`] copies them.
//! - Faults ([`SensuTargetConfig::faults`]): an upgrade delayed, stalled, dropped, reset
//!   or answered with an HTTP status; a session dropped, reset or stalled; a frame
//!   delayed, replaced by garbage, truncated or oversized (counted by the faults).
//!
//! Sizing: `WebSocketConfig` with a 4 KiB read buffer, no write buffering and a 64 KiB
//! message limit, and the handshake boxed so that its state machine does not stay in the
//! session future (≈7 KiB per connection is the reference figure).
//!
//! What it is not: a Sensu backend. No storage, no etcd, no REST API, no
//! `/health` route, no entity or keepalive bookkeeping beyond counters; a stored entity
//! never overrides the header subscriptions.

mod auth;
pub mod inbound;
mod schedule;
mod session;
mod stats;
pub mod tls;
mod upgrade;

use std::io;
use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::Duration;

use agent_sim_proto::sensu::{v2, v3};
use agent_sim_sensu::codec::{self, Encoding};
use bytes::Bytes;
use http::HeaderValue;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use auth::PASSWORD_COSTS;
pub use stats::{SensuTargetSnapshot, SensuTargetStats};

use crate::faults::Faults;
use crate::listen;

/// The command of the default check: agents answer it with canned output, no execution.
pub const TEST_CHECK_COMMAND: &str = "!sensu_test_check!";

/// How long [`serve`] waits for sessions to end after shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// One scheduled check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckSpec {
    /// Check name (`metadata.name` of the request's config); replies are matched on it.
    pub name: String,
    /// Command sent to agents; [`TEST_CHECK_COMMAND`] asks for canned output.
    pub command: String,
    /// Publication period (must be > 0). The wire `interval` field is this in whole
    /// seconds, at least 1.
    pub interval: Duration,
    /// A session receives the check if one of these is among its subscriptions
    /// (header `Sensu-Subscriptions` plus `entity:<agent name>`).
    pub subscriptions: Vec<String>,
}

/// Configuration of [`serve`].
#[derive(Debug, Clone)]
pub struct SensuTargetConfig {
    /// Accepted `Sensu-Namespace` values; a missing or unknown namespace gets
    /// HTTP 404 `namespace "X" not found` (after the credentials check, as
    /// Sensu 6.12 does).
    pub namespaces: Vec<String>,
    /// Agent user for `Authorization: Basic` (missing → 401 `missing
    /// credentials`).
    pub user: String,
    /// Agent password (wrong user or password → 401 `bad credentials`).
    pub password: String,
    /// Check the password with bcrypt at this cost ([`PASSWORD_COSTS`]; a
    /// real backend's hash is cost 10) on every connect, as a real backend
    /// does; `None`: compare it as text (no CPU cost).
    pub password_cost: Option<u32>,
    /// TLS of the agent port (`wss://`), from [`tls::server_config`]; with
    /// an agent CA in it, a verified client certificate lets an agent in
    /// without the password check. `None`: plain `ws://`.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Checks to schedule.
    pub checks: Vec<CheckSpec>,
    /// Value of the `Backend-ID` header of the `101` response.
    pub backend_id: String,
    /// Namespaces are unknown (HTTP 404 `namespace "X" not found`) until
    /// this long after [`serve`] starts, as on a real backend whose
    /// namespace cache has not caught up with a namespace just created
    /// (seen for up to ~5 s after `sensu-backend init`).
    pub namespaces_ready_after: Duration,
    /// Faults to inject (`sensu.upgrade`, `sensu.session`, `sensu.frame`);
    /// none by default.
    pub faults: Faults,
}

impl Default for SensuTargetConfig {
    fn default() -> Self {
        Self {
            namespaces: vec!["default".to_owned()],
            user: "agent".to_owned(),
            password: "P@ssw0rd!".to_owned(),
            password_cost: None,
            tls: None,
            checks: vec![CheckSpec {
                name: "agent-sim-check".to_owned(),
                command: TEST_CHECK_COMMAND.to_owned(),
                interval: Duration::from_secs(10),
                subscriptions: vec!["linux".to_owned()],
            }],
            backend_id: "agent-sim".to_owned(),
            namespaces_ready_after: Duration::ZERO,
            faults: Faults::default(),
        }
    }
}

/// Serves Sensu agent WebSocket sessions on `listener` until `shutdown` is cancelled.
///
/// Each connection runs on its own task. Check `i` is first published one
/// `checks[i].interval` after this call (the first tick is skipped), then every interval;
/// `issued` is the unix time in seconds, or the previous value + 1 if that second was
/// already used (so with sub-second intervals it runs ahead of the clock).
///
/// On shutdown: stops accepting, sends close 1001 to every session and returns once all
/// sessions have ended, after at most ~2 s. Errors: only an invalid configuration
/// (`InvalidInput`: zero check interval, `backend_id` not a header value, a password
/// cost outside [`PASSWORD_COSTS`]); failed accepts
/// are counted (`accept_errors`) and retried after a pause that doubles
/// from 5 ms to 1 s ([`agent_sim_net::accept`]).
pub async fn serve(
    listener: TcpListener,
    cfg: SensuTargetConfig,
    stats: Arc<SensuTargetStats>,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let passwords =
        auth::Passwords::new(cfg.user.clone(), cfg.password.clone(), cfg.password_cost).await?;
    let shared = Arc::new(Shared::new(cfg, stats, passwords)?);
    shared.faults.start();
    let tracker = TaskTracker::new();
    for idx in 0..shared.checks.len() {
        tracker.spawn(schedule::run(shared.clone(), idx, shutdown.clone()));
    }
    // Sessions bound their own close handshake; the grace is the backstop.
    let accept_errors = &shared.stats.accept_errors;
    listen::serve_tracked(
        listener,
        tracker,
        &shutdown,
        accept_errors,
        SHUTDOWN_GRACE,
        |stream| {
            let _ = stream.set_nodelay(true);
            session::run(stream, shared.clone(), shutdown.clone())
        },
    )
    .await;
    Ok(())
}

/// The endpoint's WebSocket settings: a 4 KiB read buffer, no write
/// buffering (each frame is one shared `Bytes`), at most 64 KiB of frames
/// queued for a slow agent, and the agent protocol's message limit.
///
/// Bound: an agent message or frame over [`codec::MAX_MESSAGE`] ends that
/// session (counted in `session_errors`) before it is buffered; an upgrade
/// request is bounded by tungstenite (64 KiB of headers, 124 headers).
pub fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(4096)
        .write_buffer_size(0)
        .max_write_buffer_size(64 << 10)
        .max_message_size(Some(codec::MAX_MESSAGE))
        .max_frame_size(Some(codec::MAX_FRAME))
}

/// State shared by the accept loop, the schedulers and every session.
struct Shared {
    namespaces: Vec<String>,
    /// Before this instant every namespace is unknown (404).
    namespaces_ready_at: tokio::time::Instant,
    /// The agent user and the check of its password.
    passwords: auth::Passwords,
    /// TLS of the port, if any.
    tls: Option<Arc<rustls::ServerConfig>>,
    backend_id: HeaderValue,
    ws_config: WebSocketConfig,
    checks: Vec<ScheduledCheck>,
    /// The `entity_config` placeholder frame, indexed by [`frame_index`].
    placeholders: Box<[Bytes]>,
    stats: Arc<SensuTargetStats>,
    faults: Faults,
}

/// A check and the channel its publications go out on.
struct ScheduledCheck {
    spec: CheckSpec,
    /// Wire `interval` (whole seconds, ≥ 1).
    interval_secs: u32,
    tx: watch::Sender<Option<Arc<Publication>>>,
    /// `issued` of the latest publication (0 before the first).
    last_issued: AtomicI64,
}

/// One publication of a check: the `check_request` frame, encoded once for every
/// namespace and encoding, indexed by [`frame_index`].
struct Publication {
    frames: Box<[Bytes]>,
}

/// Index of a pre-encoded frame for namespace `ns` and encoding `enc`.
fn frame_index(ns: usize, enc: Encoding) -> usize {
    ns * 2
        + match enc {
            Encoding::Protobuf => 0,
            Encoding::Json => 1,
        }
}

/// The two encodings, in [`frame_index`] order.
const ENCODINGS: [Encoding; 2] = [Encoding::Protobuf, Encoding::Json];

impl Shared {
    fn new(
        cfg: SensuTargetConfig,
        stats: Arc<SensuTargetStats>,
        passwords: auth::Passwords,
    ) -> io::Result<Self> {
        let invalid = |msg: String| io::Error::new(io::ErrorKind::InvalidInput, msg);
        let backend_id = HeaderValue::from_str(&cfg.backend_id).map_err(|_| {
            invalid(format!(
                "backend_id {:?} is not a header value",
                cfg.backend_id
            ))
        })?;
        let mut checks = Vec::with_capacity(cfg.checks.len());
        for spec in cfg.checks {
            if spec.interval.is_zero() {
                return Err(invalid(format!(
                    "check {:?}: interval must be > 0",
                    spec.name
                )));
            }
            let interval_secs = u32::try_from(spec.interval.as_secs())
                .unwrap_or(u32::MAX)
                .max(1);
            checks.push(ScheduledCheck {
                spec,
                interval_secs,
                tx: watch::Sender::new(None),
                last_issued: AtomicI64::new(0),
            });
        }
        let mut placeholders = Vec::with_capacity(cfg.namespaces.len() * 2);
        for ns in &cfg.namespaces {
            let placeholder = v3::EntityConfig {
                metadata: Some(v2::ObjectMeta {
                    name: "not found".to_owned(),
                    namespace: ns.clone(),
                    ..Default::default()
                }),
                entity_class: "agent".to_owned(),
                deregistration: Some(v2::Deregistration::default()),
                ..Default::default()
            };
            for enc in ENCODINGS {
                let body = codec::encode_entity_config(&placeholder, enc)
                    .map_err(|e| invalid(format!("encoding entity_config: {e}")))?;
                placeholders.push(Bytes::from(codec::encode_frame(
                    codec::KIND_ENTITY_CONFIG,
                    &body,
                )));
            }
        }
        let ws_config = ws_config();
        Ok(Self {
            namespaces: cfg.namespaces,
            namespaces_ready_at: tokio::time::Instant::now() + cfg.namespaces_ready_after,
            passwords,
            tls: cfg.tls,
            backend_id,
            ws_config,
            checks,
            placeholders: placeholders.into_boxed_slice(),
            stats,
            faults: cfg.faults,
        })
    }

    /// Index of the scheduled check named `name`.
    fn check_index(&self, name: &str) -> Option<usize> {
        self.checks.iter().position(|c| c.spec.name == name)
    }
}
