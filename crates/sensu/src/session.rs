//! One simulated agent session: the transport side (socket, TLS, WebSocket,
//! timers). Message bytes come from `messages` and `codec`.
//!
//! Life of a session ([`run`]):
//! 1. Connect (boxed, so its state is freed after the handshake): resolve the
//!    target once per factory, dial from the agent's source address, TLS for
//!    `wss://`, WebSocket upgrade with the Sensu headers ([`upgrade_request`];
//!    the upgrade itself in `upgrade`, which keeps no handshake buffer).
//!    TCP + TLS + upgrade are bounded by `handshake_timeout`.
//! 2. Send nothing until the first `entity_config` (or `entity_config_timeout`),
//!    then a keepalive at once and every `keepalive_interval`, lateness
//!    measured from the intended schedule.
//! 3. Answer every `check_request` (6.x rule: drop a request whose `issued` is
//!    not newer than the last one of that check), send agent-side events on a
//!    Poisson schedule, ping every `ping_interval` and drop the session when no
//!    pong came within `pong_timeout`.
//! 4. On cancellation (the end of the run, or the scenario ending this
//!    session: a storm, churn, the max session length, a ramp-down): close
//!    1001 "bye", wait ≤ 1 s for the close handshake.
//!
//! Every failure ends the session with a stable snake_case kind
//! ([`SessionEnd::Lost`], retried by the engine; [`SessionEnd::Fatal`] only
//! for a session that cannot be attempted); nothing here panics on
//! network data.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use agent_sim_fleet::{SessionCx, SessionEnd};
use agent_sim_metrics::Metrics;
use agent_sim_net::{MaybeTlsStream, dial, dial_error_kind};
use base64::Engine as _;
use futures_util::{SinkExt as _, StreamExt as _};
use http::HeaderValue;
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::time::Instant;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{self, Message};

use crate::codec::{self, Encoding, KIND_CHECK_REQUEST, KIND_ENTITY_CONFIG};
use crate::messages::{
    AGENT_EVENT_CHECK, KEEPALIVE_FRAME_CAPACITY, MessageBuilder, Templates, new_id, unix_now,
};
use crate::{Ids, SensuConfig, SensuError};

/// How long a closing session waits for the backend's close reply.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// What every agent of a factory shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub cfg: SensuConfig,
    pub targets: Vec<Target>,
    pub tls: Option<Arc<ClientConfig>>,
    pub metrics: Metrics,
    pub ids: Ids,
    pub templates: Arc<Templates>,
}

/// A parsed backend URL, its addresses resolved once on first use.
#[derive(Debug)]
pub(crate) struct Target {
    pub url: http::Uri,
    pub tls: bool,
    host: String,
    port: u16,
    server_name: ServerName<'static>,
    addrs: tokio::sync::OnceCell<Vec<SocketAddr>>,
}

impl Target {
    /// Parses and checks a `ws://` / `wss://` URL.
    pub(crate) fn parse(s: &str) -> Result<Target, SensuError> {
        let bad = |why: &str| SensuError::Invalid {
            field: "targets",
            reason: format!("{s:?}: {why}"),
        };
        let s = s.trim();
        let url: http::Uri = if s.contains("://") {
            s.parse().map_err(|_| bad("not a URL"))?
        } else {
            // `host:port`: a plain WebSocket on that port (no default port:
            // the agent port is usually 8081).
            match s.rsplit_once(':') {
                Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok() => {}
                _ => return Err(bad("expected host:port (the agent port is usually 8081)")),
            }
            format!("ws://{s}/")
                .parse()
                .map_err(|_| bad("expected host:port (the agent port is usually 8081)"))?
        };
        let tls = match url.scheme_str() {
            Some("ws") => false,
            Some("wss") => true,
            _ => return Err(bad("scheme must be ws:// or wss://")),
        };
        let host = url
            .host()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| bad("no host"))?;
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = url.port_u16().unwrap_or(if tls { 443 } else { 80 });
        let server_name =
            ServerName::try_from(host.clone()).map_err(|_| bad("host is not a valid TLS name"))?;
        // Normalize to an explicit path ("ws://h:8081" → "ws://h:8081/").
        let url = if url.path_and_query().is_none_or(|p| p.as_str().is_empty()) {
            let mut parts = url.into_parts();
            parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
            http::Uri::from_parts(parts).map_err(|_| bad("not a URL"))?
        } else {
            url
        };
        Ok(Target {
            url,
            tls,
            host,
            port,
            server_name,
            addrs: tokio::sync::OnceCell::new(),
        })
    }

    async fn addr(&self, index: u64) -> Result<SocketAddr, SessionEnd> {
        let addrs = self
            .addrs
            .get_or_try_init(|| async {
                tokio::net::lookup_host((self.host.as_str(), self.port))
                    .await
                    .map(|it| it.collect::<Vec<_>>())
            })
            .await
            .map_err(|_| SessionEnd::lost("resolve"))?;
        if addrs.is_empty() {
            return Err(SessionEnd::lost("resolve"));
        }
        Ok(addrs[(index as usize) % addrs.len()])
    }
}

/// The WebSocket upgrade request a real agent sends: `GET <path>` with the
/// standard WebSocket headers plus `Sensu-Namespace`, `Sensu-AgentName`,
/// `Sensu-User`, `Sensu-Subscriptions` (comma-joined), `Authorization: Basic`
/// and, for protobuf, `Accept: application/octet-stream`.
pub fn upgrade_request(
    cfg: &SensuConfig,
    url: &http::Uri,
    agent_name: &str,
) -> Result<http::Request<()>, SensuError> {
    let mut req = url
        .clone()
        .into_client_request()
        .map_err(|e| SensuError::Config(format!("target {url}: {e}")))?;
    let value = |s: &str| HeaderValue::from_str(s).map_err(http::Error::from);
    let auth =
        base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", cfg.user, cfg.password));
    let h = req.headers_mut();
    h.insert("Sensu-Namespace", value(&cfg.namespace)?);
    h.insert("Sensu-AgentName", value(agent_name)?);
    h.insert("Sensu-User", value(&cfg.user)?);
    h.insert("Sensu-Subscriptions", value(&cfg.subscriptions.join(","))?);
    h.insert(
        http::header::AUTHORIZATION,
        value(&format!("Basic {auth}"))?,
    );
    if cfg.encoding == Encoding::Protobuf {
        h.insert(
            http::header::ACCEPT,
            HeaderValue::from_static("application/octet-stream"),
        );
    }
    Ok(req)
}

/// WebSocket buffers sized for tens of thousands of small sessions.
///
/// The read buffer is allocated per session up front and zero-filled before
/// every read: backend frames (entity_config, check_request) are ~100 bytes,
/// so 1 KiB holds any of them (larger frames grow the buffer as needed) and
/// each read zero-fills 1 KiB instead of 4.
///
/// Bound: a message or frame over [`codec::MAX_MESSAGE`] ends the session
/// (kind `message_too_large`) before it is buffered; our own writes bypass
/// the write buffer, which only ever holds control frames (≤ 16 KiB).
pub fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(1024)
        .write_buffer_size(0)
        .max_write_buffer_size(16 * 1024)
        .max_message_size(Some(codec::MAX_MESSAGE))
        .max_frame_size(Some(codec::MAX_FRAME))
}

/// Most checks whose last `issued` one agent remembers. A real backend
/// schedules a handful per subscription; a backend naming a new check in
/// every request must not grow an agent without end, so beyond this the
/// check heard from longest ago is forgotten (warning `checks_forgotten`).
pub const MAX_CHECKS_PER_AGENT: usize = 64;

/// Longest message type quoted in an `unknown_messages` sample.
const KIND_SAMPLE_CHARS: usize = 64;

/// Per-agent check bookkeeping: last `issued` per check (kept across
/// sessions) and event sequence numbers (restarting at 1 every session).
#[derive(Debug, Default)]
pub(crate) struct CheckState {
    // Bound: at most MAX_CHECKS_PER_AGENT slots (see `slot`).
    slots: Vec<CheckSlot>,
    /// Slots dropped to stay within the bound, not yet reported.
    forgotten: u32,
}

#[derive(Debug)]
struct CheckSlot {
    name: Box<str>,
    last_issued: i64,
    sequence: i64,
}

impl CheckState {
    fn slot(&mut self, name: &str) -> &mut CheckSlot {
        let i = match self.slots.iter().position(|s| &*s.name == name) {
            Some(i) => i,
            None => {
                if self.slots.len() >= MAX_CHECKS_PER_AGENT {
                    // Forget the check heard from longest ago.
                    if let Some(oldest) =
                        (0..self.slots.len()).min_by_key(|&i| self.slots[i].last_issued)
                    {
                        self.slots.swap_remove(oldest);
                        self.forgotten += 1;
                    }
                }
                self.slots.push(CheckSlot {
                    name: name.into(),
                    last_issued: i64::MIN,
                    sequence: 0,
                });
                self.slots.len() - 1
            }
        };
        &mut self.slots[i]
    }

    /// Records a request; false when it is not newer than the last one.
    fn accept(&mut self, name: &str, issued: i64) -> bool {
        let s = self.slot(name);
        if issued <= s.last_issued {
            return false;
        }
        s.last_issued = issued;
        true
    }

    fn next_sequence(&mut self, name: &str) -> i64 {
        let s = self.slot(name);
        s.sequence += 1;
        s.sequence
    }

    /// Slots forgotten since the last call.
    fn take_forgotten(&mut self) -> u32 {
        std::mem::take(&mut self.forgotten)
    }

    pub(crate) fn new_session(&mut self) {
        for s in &mut self.slots {
            s.sequence = 0;
        }
    }
}

type Ws = WebSocketStream<MaybeTlsStream>;

/// The session end of a failed upgrade: every answer is retried with
/// backoff (as a real agent does); the status line and body the backend
/// sent are kept as the server's words, and what the transport said when
/// it did not answer.
fn upgrade_error_kind(e: &tungstenite::Error) -> SessionEnd {
    use tungstenite::error::ProtocolError;
    match e {
        tungstenite::Error::Http(resp) => {
            let status = resp.status();
            let kind = match status.as_u16() {
                401 => "upgrade_401",
                403 => "upgrade_403",
                404 => "upgrade_404",
                429 => "upgrade_429",
                500..=599 => "upgrade_5xx",
                _ => "upgrade_4xx",
            };
            let body = resp
                .body()
                .as_deref()
                .map(|b| String::from_utf8_lossy(b).trim().to_string())
                .unwrap_or_default();
            let mut words = format!(
                "HTTP {} {}",
                status.as_u16(),
                status.canonical_reason().unwrap_or("")
            );
            if !body.is_empty() {
                words.push_str(": ");
                words.push_str(&body);
            }
            SessionEnd::lost_with(kind, words)
        }
        tungstenite::Error::Io(e) if e.kind() == io::ErrorKind::TimedOut => {
            SessionEnd::lost("handshake_timeout")
        }
        tungstenite::Error::Io(io_err) => match io_err.kind() {
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe => SessionEnd::lost_with("upgrade_reset", e.to_string()),
            io::ErrorKind::UnexpectedEof => SessionEnd::lost_with("upgrade_closed", e.to_string()),
            _ => SessionEnd::lost_with("upgrade_io", e.to_string()),
        },
        // The connection ended before a whole answer came.
        tungstenite::Error::ConnectionClosed
        | tungstenite::Error::AlreadyClosed
        | tungstenite::Error::Protocol(ProtocolError::HandshakeIncomplete) => {
            SessionEnd::lost_with("upgrade_closed", e.to_string())
        }
        tungstenite::Error::Protocol(p) => SessionEnd::lost_with("upgrade_protocol", p.to_string()),
        e => SessionEnd::lost_with("upgrade_error", e.to_string()),
    }
}

/// One final binary WebSocket frame as a client sends it (RFC 6455 §5.2):
/// FIN + opcode 2, the mask bit with the payload length, the masking key,
/// and the payload XORed with the key.
pub fn masked_binary_frame(payload: &[u8], key: [u8; 4]) -> Vec<u8> {
    let len = payload.len();
    let mut out = Vec::with_capacity(len + 14);
    out.push(0x82);
    if len < 126 {
        out.push(0x80 | len as u8);
    } else if len <= u16::MAX as usize {
        out.push(0x80 | 126);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(0x80 | 127);
        out.extend_from_slice(&(len as u64).to_be_bytes());
    }
    out.extend_from_slice(&key);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i & 3]));
    out
}

/// Error kind of a failure on an established WebSocket.
fn ws_error_kind(e: &tungstenite::Error) -> &'static str {
    use tungstenite::error::ProtocolError;
    match e {
        tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed => "ws_closed",
        tungstenite::Error::Io(e) => match e.kind() {
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe => "ws_reset",
            io::ErrorKind::UnexpectedEof => "ws_dropped",
            io::ErrorKind::TimedOut => "ws_timeout",
            _ => "ws_io",
        },
        // The TCP connection ended without a close frame (a FIN).
        tungstenite::Error::Protocol(ProtocolError::ResetWithoutClosingHandshake) => "ws_dropped",
        tungstenite::Error::Protocol(_) => "ws_protocol",
        tungstenite::Error::Capacity(_) => "message_too_large",
        tungstenite::Error::WriteBufferFull(_) => "ws_capacity",
        _ => "ws_error",
    }
}

/// A session lost to a WebSocket failure: its kind, and what tungstenite
/// or the socket said; an over-limit message says its size and the limit.
fn ws_lost(e: &tungstenite::Error) -> SessionEnd {
    match e {
        tungstenite::Error::Capacity(c) => SessionEnd::lost_with(
            "message_too_large",
            format!("{c} (a WebSocket message or frame from the backend over the limit)"),
        ),
        e => SessionEnd::lost_with(ws_error_kind(e), e.to_string()),
    }
}
/// The words of a close frame: `close 1001 (Away): backend shutting down`.
fn close_words(frame: Option<&CloseFrame>) -> String {
    match frame {
        Some(f) if f.reason.is_empty() => format!("close {} ({:?})", u16::from(f.code), f.code),
        Some(f) => format!("close {} ({:?}): {}", u16::from(f.code), f.code, f.reason),
        None => "close frame without a code".to_owned(),
    }
}

/// A few bytes of a message that is no frame, for a sample.
fn bytes_sample(data: &[u8]) -> String {
    let head: String = data.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!(
        "{} bytes without a type line: {head}{}",
        data.len(),
        if data.len() > 16 { "…" } else { "" }
    )
}

/// TCP + TLS + upgrade, bounded by the handshake timeout and cancellation.
async fn connect(shared: &Shared, name: &str, cx: &SessionCx) -> Result<Ws, SessionEnd> {
    let cfg = &shared.cfg;
    let target = &shared.targets[(cx.index as usize) % shared.targets.len()];
    let handshake = async {
        let addr = target.addr(cx.index).await?;
        let tcp = dial(addr, cx.bind_addr)
            .await
            .map_err(|e| SessionEnd::lost_with(dial_error_kind(&e), e.to_string()))?;
        let stream = match (&shared.tls, target.tls) {
            (Some(tls), true) => {
                let tls = tokio_rustls::TlsConnector::from(tls.clone())
                    .connect(target.server_name.clone(), tcp)
                    .await
                    .map_err(|e| match e.kind() {
                        io::ErrorKind::ConnectionReset | io::ErrorKind::UnexpectedEof => {
                            SessionEnd::lost_with("tls_reset", e.to_string())
                        }
                        _ => SessionEnd::lost_with("tls", e.to_string()),
                    })?;
                MaybeTlsStream::Tls(Box::new(tls))
            }
            (None, true) => return Err(SessionEnd::fatal("tls_not_configured")),
            (_, false) => MaybeTlsStream::Plain(tcp),
        };
        let req = upgrade_request(cfg, &target.url, name)
            .map_err(|_| SessionEnd::fatal("bad_upgrade_request"))?;
        let (ws, resp) = crate::upgrade::upgrade(stream, req, ws_config())
            .await
            .map_err(|e| upgrade_error_kind(&e))?;
        // The backend answers in the encoding it chose; a mismatch would make
        // every frame undecodable.
        if resp
            .headers()
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|ct| ct.as_bytes() != cfg.encoding.content_type().as_bytes())
        {
            return Err(SessionEnd::lost_with(
                "upgrade_content_type",
                format!(
                    "Content-Type {:?}, asked for {}",
                    resp.headers()
                        .get(http::header::CONTENT_TYPE)
                        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                        .unwrap_or_default(),
                    cfg.encoding.content_type()
                ),
            ));
        }
        Ok(ws)
    };
    tokio::select! {
        r = tokio::time::timeout(cfg.handshake_timeout, handshake) => {
            r.unwrap_or_else(|_| Err(SessionEnd::lost_with(
                "handshake_timeout",
                format!(
                    "connect, TLS and upgrade not answered within {:?}",
                    cfg.handshake_timeout
                ),
            )))
        }
        _ = cx.cancel.cancelled() => Err(SessionEnd::Shutdown),
    }
}

/// Exponential inter-arrival time with the given mean (a Poisson process).
fn exp_interval(mean: Duration) -> Duration {
    let u = fastrand::f64();
    mean.mul_f64(-(1.0 - u).ln()).min(mean * 100)
}

/// Size of the WebSocket stream type (for the memory-budget test).
#[cfg(test)]
pub(crate) const WS_SIZE: usize = std::mem::size_of::<Ws>();

/// Runs one session to its end (see the module docs).
pub(crate) async fn run(
    shared: &Shared,
    builder: &mut MessageBuilder,
    checks: &mut CheckState,
    cx: &SessionCx,
) -> SessionEnd {
    let t0 = Instant::now();
    // Boxed: the handshake state machine is freed once the session is up.
    let ws = match Box::pin(connect(shared, builder.name(), cx)).await {
        Ok(ws) => ws,
        Err(end) => return end,
    };
    shared
        .metrics
        .record(shared.ids.connect, cx.shard_key(), t0.elapsed());
    checks.new_session();
    let mut steady = Steady {
        shared,
        builder,
        checks,
        cx,
        ws,
    };
    steady.run(t0).await
}

struct Steady<'a> {
    shared: &'a Shared,
    builder: &'a mut MessageBuilder,
    checks: &'a mut CheckState,
    cx: &'a SessionCx,
    ws: Ws,
}

impl Steady<'_> {
    /// Sends one binary message. Data frames are masked and written here
    /// rather than through tungstenite's write buffer, which keeps the
    /// capacity of the largest frame ever sent for the rest of the session
    /// (a 1.2 KiB check reply would pin 1.2 KiB per agent); control frames
    /// (ping, pong, close) still go through tungstenite.
    async fn send(&mut self, payload: Vec<u8>) -> Result<(), SessionEnd> {
        use tokio::io::AsyncWriteExt as _;
        let n = payload.len() as u64;
        // A pong tungstenite queued while reading goes out first.
        self.ws.flush().await.map_err(|e| ws_lost(&e))?;
        let wire = masked_binary_frame(&payload, fastrand::u32(..).to_be_bytes());
        drop(payload);
        self.ws
            .get_mut()
            .write_all(&wire)
            .await
            .map_err(|e| ws_lost(&tungstenite::Error::Io(e)))?;
        self.shared.metrics.add(self.shared.ids.bytes_sent, n);
        Ok(())
    }

    /// Decodes a check request and builds the reply frame; `None` when the
    /// request is undecodable or dropped (counted either way).
    fn check_reply(&mut self, body: &[u8], ready: bool) -> Option<Vec<u8>> {
        let m = &self.shared.metrics;
        let ids = &self.shared.ids;
        let req = match codec::decode_check_request(body, self.shared.cfg.encoding) {
            Ok(r) => r,
            Err(_) => {
                m.error("decode_check_request");
                return None;
            }
        };
        let name = req
            .config
            .as_ref()
            .and_then(|c| c.metadata.as_ref())
            .map(|m| m.name.as_str())
            .unwrap_or("");
        // Nothing is sent before the session is ready.
        let accepted = ready && self.checks.accept(name, req.issued);
        for _ in 0..self.checks.take_forgotten() {
            m.warn(
                "checks_forgotten",
                Some("the backend named more checks than an agent remembers"),
            );
        }
        if !accepted {
            m.incr(ids.check_requests_dropped);
            return None;
        }
        let seq = self.checks.next_sequence(name);
        let now = unix_now();
        let check = self.builder.check_result(&req, now);
        let mut out = Vec::new();
        if self
            .builder
            .write_event_frame(&mut out, check, now, new_id(), seq)
            .is_err()
        {
            m.error("encode_event");
            return None;
        }
        Some(out)
    }

    async fn close(&mut self) -> SessionEnd {
        let _ = tokio::time::timeout(CLOSE_WAIT, async {
            let bye = CloseFrame {
                code: CloseCode::Away,
                reason: "bye".into(),
            };
            if self.ws.send(Message::Close(Some(bye))).await.is_err() {
                return;
            }
            // Read until the backend's close reply ends the stream.
            while let Some(Ok(_)) = self.ws.next().await {}
        })
        .await;
        SessionEnd::Shutdown
    }

    async fn run(&mut self, t0: Instant) -> SessionEnd {
        let shared = self.shared;
        let cfg = &shared.cfg;
        let ids = &shared.ids;
        let m = &shared.metrics;
        let key = self.cx.shard_key();
        let start = Instant::now();

        let mut ready = false;
        let ec_deadline = start + cfg.entity_config_timeout;
        let mut next_keepalive: Option<Instant> = None;
        let mut keepalive_seq: i64 = 0;
        let mut next_ping = start + cfg.ping_interval;
        let mut ping_since: Option<Instant> = None;
        let mut next_event: Option<Instant> = None;
        let event_mean = cfg.event_rate.map(|r| r.interval());

        let sleep = tokio::time::sleep_until(ec_deadline);
        tokio::pin!(sleep);

        loop {
            let mut wake = next_ping;
            if !ready {
                wake = wake.min(ec_deadline);
            }
            for t in [
                next_keepalive,
                ping_since.map(|t| t + cfg.pong_timeout),
                next_event,
            ]
            .into_iter()
            .flatten()
            {
                wake = wake.min(t);
            }
            if sleep.deadline() != wake {
                sleep.as_mut().reset(wake);
            }

            let woke = tokio::select! {
                biased;
                _ = self.cx.cancel.cancelled() => Wake::Cancel,
                msg = self.ws.next() => Wake::Msg(msg),
                _ = &mut sleep => Wake::Timer,
            };

            match woke {
                // Boxed: rare paths must not grow the steady-state future.
                Wake::Cancel => return Box::pin(self.close()).await,
                Wake::Msg(None) => return SessionEnd::lost("ws_closed"),
                Wake::Msg(Some(Err(e))) => return ws_lost(&e),
                Wake::Msg(Some(Ok(msg))) => {
                    let received = Instant::now();
                    let data = match msg {
                        Message::Binary(b) => b,
                        Message::Text(t) => t.into(),
                        Message::Ping(_) => {
                            // tungstenite queued the pong: flush it now.
                            if let Err(e) = self.ws.flush().await {
                                return ws_lost(&e);
                            }
                            continue;
                        }
                        Message::Pong(_) => {
                            ping_since = None;
                            continue;
                        }
                        Message::Close(frame) => {
                            let words = close_words(frame.as_ref());
                            // Our close reply is queued; push it out, briefly.
                            let _ =
                                Box::pin(tokio::time::timeout(CLOSE_WAIT, self.ws.flush())).await;
                            return SessionEnd::lost_with("ws_closed", words);
                        }
                        Message::Frame(_) => continue,
                    };
                    m.incr(ids.frames_received);
                    m.add(ids.bytes_received, data.len() as u64);
                    let frame = match codec::split_frame(&data) {
                        Ok(f) => f,
                        Err(_) => {
                            m.error_with("decode_frame", Some(&bytes_sample(&data)));
                            continue;
                        }
                    };
                    if matches!(frame.kind, KIND_ENTITY_CONFIG | KIND_CHECK_REQUEST)
                        && let Some(u) = codec::unknown_fields(frame.kind, frame.body, cfg.encoding)
                    {
                        m.warn(
                            "unknown_fields",
                            Some(&format!(
                                "{}: {} ({} unknown)",
                                frame.kind, u.first, u.count
                            )),
                        );
                    }
                    match frame.kind {
                        KIND_ENTITY_CONFIG => {
                            let ec = match codec::decode_entity_config(frame.body, cfg.encoding) {
                                Ok(ec) => ec,
                                Err(_) => {
                                    m.error("decode_entity_config");
                                    continue;
                                }
                            };
                            m.incr(ids.entity_configs_received);
                            self.builder.apply_entity_config(ec);
                            // The backend has answered: the agent is connected
                            // (also when the entity config came after the wait).
                            if !self.cx.is_established() {
                                m.record(ids.session_ready, key, t0.elapsed());
                                self.cx.established();
                            }
                            if !ready {
                                ready = true;
                                next_keepalive = Some(received);
                                next_event = event_mean.map(|mean| received + exp_interval(mean));
                            }
                        }
                        KIND_CHECK_REQUEST => {
                            m.incr(ids.check_requests_received);
                            // Built in a sync fn: the request is not held across the send.
                            let Some(out) = self.check_reply(frame.body, ready) else {
                                continue;
                            };
                            if let Err(end) = self.send(out).await {
                                return end;
                            }
                            m.incr(ids.check_replies_sent);
                            m.incr(ids.events_sent);
                            m.record(ids.check_turnaround, key, received.elapsed());
                        }
                        // As the real agent: "no handler for message type",
                        // logged, and the session goes on.
                        other => {
                            let shown: String = other.chars().take(KIND_SAMPLE_CHARS).collect();
                            m.warn("unknown_messages", Some(&format!("type {shown:?}")));
                        }
                    }
                }
                Wake::Timer => {
                    let now = Instant::now();
                    if ping_since.is_some_and(|since| now >= since + cfg.pong_timeout) {
                        return SessionEnd::lost("pong_timeout");
                    }
                    if !ready && now >= ec_deadline {
                        // As the real agent: log it and proceed without an
                        // entity config. Not "connected" yet: that needs an
                        // answer from the backend.
                        m.warn(
                            "entity_config_timeout",
                            Some("no entity_config from the backend within the wait; keepalives start anyway"),
                        );
                        ready = true;
                        self.cx.release_dial_slot();
                        next_keepalive = Some(now);
                        next_event = event_mean.map(|mean| now + exp_interval(mean));
                    }
                    if now >= next_ping {
                        if let Err(e) = self.ws.send(Message::Ping(Default::default())).await {
                            return ws_lost(&e);
                        }
                        ping_since.get_or_insert(now);
                        next_ping += cfg.ping_interval;
                        if next_ping <= now {
                            next_ping = now + cfg.ping_interval;
                        }
                    }
                    if let Some(due) = next_keepalive.filter(|t| now >= *t) {
                        keepalive_seq += 1;
                        let mut out = Vec::with_capacity(KEEPALIVE_FRAME_CAPACITY);
                        let wall = unix_now();
                        if self
                            .builder
                            .write_keepalive_frame(&mut out, wall, new_id(), keepalive_seq)
                            .is_err()
                        {
                            m.error("encode_keepalive");
                        } else {
                            // Lateness from the intended time; a slot missed
                            // entirely still counts, from its own due time.
                            let sent_at = Instant::now();
                            let mut slot = due;
                            while slot <= sent_at {
                                m.record(ids.keepalive_lateness, key, sent_at - slot);
                                slot += cfg.keepalive_interval;
                            }
                            next_keepalive = Some(slot);
                            if let Err(end) = self.send(out).await {
                                return end;
                            }
                            m.incr(ids.keepalives_sent);
                        }
                        if next_keepalive == Some(due) {
                            next_keepalive = Some(due + cfg.keepalive_interval);
                        }
                    }
                    if let (Some(due), Some(mean)) = (next_event.filter(|t| now >= *t), event_mean)
                    {
                        next_event = Some(due + exp_interval(mean));
                        let seq = self.checks.next_sequence(AGENT_EVENT_CHECK);
                        let wall = unix_now();
                        let check = self.builder.agent_event_check(wall);
                        let mut out = Vec::new();
                        if self
                            .builder
                            .write_event_frame(&mut out, check, wall, new_id(), seq)
                            .is_err()
                        {
                            m.error("encode_event");
                        } else {
                            if let Err(end) = self.send(out).await {
                                return end;
                            }
                            m.incr(ids.agent_events_sent);
                            m.incr(ids.events_sent);
                        }
                    }
                }
            }
        }
    }
}

enum Wake {
    Cancel,
    Msg(Option<Result<Message, tungstenite::Error>>),
    Timer,
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_tungstenite::tungstenite::protocol::{Role, WebSocket};

    /// A server-role tungstenite socket reading from `bytes`.
    fn server_reads(bytes: Vec<u8>) -> Message {
        let mut ws = WebSocket::from_raw_socket(std::io::Cursor::new(bytes), Role::Server, None);
        ws.read().expect("a valid masked client frame")
    }

    #[test]
    fn our_masked_frames_parse_as_client_binary_messages() {
        for len in [0usize, 1, 125, 126, 127, 1252, 65_535, 65_536, 70_000] {
            let payload: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let wire = masked_binary_frame(&payload, [0xde, 0xad, 0xbe, 0xef]);
            assert_eq!(wire[0], 0x82);
            assert_eq!(wire[1] & 0x80, 0x80, "client frames are masked");
            match server_reads(wire) {
                Message::Binary(b) => assert_eq!(&b[..], &payload[..], "len {len}"),
                other => panic!("len {len}: {other:?}"),
            }
        }
    }

    #[test]
    fn frame_header_lengths_follow_rfc_6455() {
        assert_eq!(masked_binary_frame(&[0; 125], [0; 4]).len(), 2 + 4 + 125);
        assert_eq!(masked_binary_frame(&[0; 126], [0; 4]).len(), 4 + 4 + 126);
        assert_eq!(
            masked_binary_frame(&[0; 65_536], [0; 4]).len(),
            10 + 4 + 65_536
        );
    }
}
