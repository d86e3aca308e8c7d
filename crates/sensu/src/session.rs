//! One simulated agent session: the transport side (socket, TLS, WebSocket,
//! timers). Message bytes come from `messages` and `codec`.
//!
//! Life of a session (`run`):
//! 1. Connect (`connect`, boxed, so its state is freed after the
//!    handshake): resolve, dial, TLS, the WebSocket upgrade with the Sensu
//!    headers ([`upgrade_request`]), bounded by `handshake_timeout`.
//! 2. Send nothing until the first `entity_config` (or `entity_config_timeout`),
//!    then a keepalive at the next point of the fleet's timer grid
//!    (`grid`: the agents due within one `timer_tick` share one wakeup) and
//!    every `keepalive_interval`, lateness measured from the intended
//!    schedule.
//! 3. Answer every `check_request` (6.x rule: drop a request whose `issued` is
//!    not newer than the last one of that check), send agent-side events on a
//!    Poisson schedule, ping every `ping_interval` and drop the session when no
//!    pong came within `pong_timeout`.
//! 4. On cancellation (the end of the run, or the scenario ending this
//!    session: a storm, churn, the max session length, a ramp-down): close
//!    1001 "bye", wait ≤ 1 s for the close handshake.
//!
//! The steady state is the loop every kind runs (`agent_sim_fleet::wake`:
//! cancellation, the WebSocket, the timer) and one handler per wake: a
//! message (`Steady::on_message`) or the timer (`Steady::on_timer`).
//!
//! Every failure ends the session with a stable snake_case kind
//! ([`SessionEnd::Lost`], retried by the engine; [`SessionEnd::Fatal`] only
//! for a session that cannot be attempted); nothing here panics on
//! network data.

use std::io;
use std::pin::{Pin, pin};
use std::task::Context;
use std::time::Duration;

use agent_sim_fleet::wake::{self, NoCall, Woke};
use agent_sim_fleet::{SessionCx, SessionEnd};
use futures_util::{SinkExt as _, Stream as _, StreamExt as _};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{self, Message};

use crate::SensuConfig;
use crate::Shared;
use crate::codec::{self, KIND_CHECK_REQUEST, KIND_ENTITY_CONFIG};
use crate::connect::{Ws, connect};
pub use crate::connect::{upgrade_request, ws_config};
use crate::messages::{
    AGENT_EVENT_CHECK, KEEPALIVE_FRAME_CAPACITY, MessageBuilder, new_id, unix_now,
};

/// How long a closing session waits for the backend's close reply.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

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

/// Exponential inter-arrival time with the given mean (a Poisson process).
fn exp_interval(mean: Duration) -> Duration {
    let u = fastrand::f64();
    mean.mul_f64(-(1.0 - u).ln()).min(mean * 100)
}

/// Runs one session to its end on backend `server` (see the module docs).
pub(crate) async fn run(
    shared: &Shared,
    builder: &mut MessageBuilder,
    checks: &mut CheckState,
    server: usize,
    cx: &SessionCx,
) -> SessionEnd {
    let t0 = Instant::now();
    cx.on_server(server);
    // Boxed: the handshake state machine is freed once the session is up.
    let ws = match Box::pin(connect(shared, builder.name(), server, cx)).await {
        Ok(ws) => ws,
        Err(end) => {
            // Refused for its credentials: beside the error, never a success.
            if let Some(f) = end.failure()
                && matches!(f.kind, "upgrade_401" | "upgrade_403" | "tls_client_cert")
            {
                shared.metrics.denied("agent websocket");
            }
            return end;
        }
    };
    shared
        .metrics
        .record(shared.ids.connect, cx.shard_key(), t0.elapsed());
    shared.metrics.incr(shared.ids.connects);
    checks.new_session();
    let mut steady = Steady {
        shared,
        builder,
        checks,
        cx,
        ws,
        t0,
        // On the fleet's timer grid: pings (and the wait for the entity
        // config) fall on its points.
        sched: Schedule::new(&shared.cfg, shared.grid.snap(Instant::now())),
    };
    steady.run().await
}

/// What the session does on its own, and when: keepalives, pings and
/// agent-side events, none of them before the session is ready.
struct Schedule {
    /// An `entity_config` came, or the wait for it ended: sending starts.
    ready: bool,
    /// The end of the wait for the first `entity_config`.
    ec_deadline: Instant,
    next_keepalive: Option<Instant>,
    keepalive_seq: i64,
    next_ping: Instant,
    /// A ping not answered yet, sent then.
    ping_since: Option<Instant>,
    next_event: Option<Instant>,
    /// Mean time between agent-side events, if any.
    event_mean: Option<Duration>,
}

impl Schedule {
    fn new(cfg: &SensuConfig, start: Instant) -> Self {
        Schedule {
            ready: false,
            ec_deadline: start + cfg.entity_config_timeout,
            next_keepalive: None,
            keepalive_seq: 0,
            next_ping: start + cfg.ping_interval,
            ping_since: None,
            next_event: None,
            event_mean: cfg.event_rate.map(|r| r.interval()),
        }
    }

    /// The next instant something is due.
    fn next_due(&self, cfg: &SensuConfig) -> Instant {
        let mut due = self.next_ping;
        if !self.ready {
            due = due.min(self.ec_deadline);
        }
        for t in [
            self.next_keepalive,
            self.ping_since.map(|t| t + cfg.pong_timeout),
            self.next_event,
        ]
        .into_iter()
        .flatten()
        {
            due = due.min(t);
        }
        due
    }

    /// A ping went out at `now`: the next one is an interval later (from
    /// now, when the timer was that late).
    fn pinged(&mut self, now: Instant, interval: Duration) {
        self.ping_since.get_or_insert(now);
        self.next_ping += interval;
        if self.next_ping <= now {
            self.next_ping = now + interval;
        }
    }

    /// The session is ready at `at`: the first keepalive is due then, the
    /// first agent event a random wait after it.
    fn start(&mut self, at: Instant) {
        self.ready = true;
        self.next_keepalive = Some(at);
        self.next_event = self.event_mean.map(|mean| at + exp_interval(mean));
    }
}

struct Steady<'a> {
    shared: &'a Shared,
    builder: &'a mut MessageBuilder,
    checks: &'a mut CheckState,
    cx: &'a SessionCx,
    ws: Ws,
    /// When the session began (before the connect step).
    t0: Instant,
    sched: Schedule,
}

impl Steady<'_> {
    /// The steady state: one wait over cancellation, the WebSocket and the
    /// timer, then the handler of what woke it, until the session ends.
    async fn run(&mut self) -> SessionEnd {
        let cx = self.cx;
        let mut timer = pin!(tokio::time::sleep_until(self.sched.ec_deadline));
        loop {
            let due = self.sched.next_due(&self.shared.cfg);
            wake::arm(timer.as_mut(), self.shared.grid.snap(due));
            let woke = {
                // A new wait on the token each turn: nothing of it is held
                // while a handler sends.
                let cancel = pin!(cx.cancel.cancelled());
                let ws = &mut self.ws;
                let io = |tcx: &mut Context<'_>| Pin::new(&mut *ws).poll_next(tcx);
                wake::next(cancel, io, &mut None::<NoCall>, Some(timer.as_mut())).await
            };
            // Boxed: the session idles in the wait above, and its future
            // (one per agent) is as large as its largest await. A handler's
            // state lives only while it runs (a message, a timer: a few a
            // minute), so it takes an allocation then instead of ~230 bytes
            // of every idle session.
            let handled = match woke {
                Woke::Cancelled => return Box::pin(self.close()).await,
                Woke::Io(None) => return SessionEnd::lost("ws_closed"),
                Woke::Io(Some(Err(e))) => return ws_lost(&e),
                Woke::Io(Some(Ok(msg))) => Box::pin(self.on_message(msg)).await,
                Woke::Call(never) => match never {},
                Woke::Timer => Box::pin(self.on_timer()).await,
            };
            if let Err(end) = handled {
                return end;
            }
        }
    }

    /// A message from the backend: pings and pongs, a close, or a frame
    /// (`entity_config`, `check_request`, or a type a 6.x agent ignores).
    async fn on_message(&mut self, msg: Message) -> Result<(), SessionEnd> {
        let received = Instant::now();
        let data = match msg {
            Message::Binary(b) => b,
            Message::Text(t) => t.into(),
            // tungstenite queued the pong: flush it now.
            Message::Ping(_) => return self.ws.flush().await.map_err(|e| ws_lost(&e)),
            Message::Pong(_) => {
                self.sched.ping_since = None;
                return Ok(());
            }
            Message::Close(frame) => {
                let words = close_words(frame.as_ref());
                // Our close reply is queued; push it out, briefly.
                let _ = Box::pin(tokio::time::timeout(CLOSE_WAIT, self.ws.flush())).await;
                return Err(SessionEnd::lost_with("ws_closed", words));
            }
            Message::Frame(_) => return Ok(()),
        };
        let sh = self.shared;
        sh.metrics.incr(sh.ids.frames_received);
        sh.metrics.add(sh.ids.bytes_received, data.len() as u64);
        let Ok(frame) = codec::split_frame(&data) else {
            sh.metrics
                .error_with("decode_frame", Some(&bytes_sample(&data)));
            return Ok(());
        };
        if matches!(frame.kind, KIND_ENTITY_CONFIG | KIND_CHECK_REQUEST)
            && let Some(u) = codec::unknown_fields(frame.kind, frame.body, sh.cfg.encoding)
        {
            let words = format!("{}: {} ({} unknown)", frame.kind, u.first, u.count);
            sh.metrics.warn("unknown_fields", Some(&words));
        }
        match frame.kind {
            KIND_ENTITY_CONFIG => self.on_entity_config(frame.body, received),
            KIND_CHECK_REQUEST => {
                sh.metrics.incr(sh.ids.check_requests_received);
                // Built in a sync fn: the request is not held across the send.
                let Some(out) = self.check_reply(frame.body, self.sched.ready) else {
                    return Ok(());
                };
                self.send(out).await?;
                // Taken again: a reference held across the send would grow
                // every session's future.
                let sh = self.shared;
                sh.metrics.incr(sh.ids.check_replies_sent);
                sh.metrics.incr(sh.ids.events_sent);
                sh.metrics.record(
                    sh.ids.check_turnaround,
                    self.cx.shard_key(),
                    received.elapsed(),
                );
            }
            // As the real agent: "no handler for message type", logged,
            // and the session goes on.
            other => {
                let shown: String = other.chars().take(KIND_SAMPLE_CHARS).collect();
                sh.metrics
                    .warn("unknown_messages", Some(&format!("type {shown:?}")));
            }
        }
        Ok(())
    }

    /// The backend's `entity_config`: applied to the entity; the first
    /// makes the session ready (keepalives start at `received`).
    fn on_entity_config(&mut self, body: &[u8], received: Instant) {
        let (m, ids) = (&self.shared.metrics, &self.shared.ids);
        let ec = match codec::decode_entity_config(body, self.shared.cfg.encoding) {
            Ok(ec) => ec,
            Err(_) => {
                m.error("decode_entity_config");
                return;
            }
        };
        m.incr(ids.entity_configs_received);
        self.builder.apply_entity_config(ec);
        // The backend has answered: the agent is connected (also when the
        // entity config came after the wait).
        if !self.cx.is_established() {
            m.record(ids.session_ready, self.cx.shard_key(), self.t0.elapsed());
            self.cx.established();
        }
        if !self.sched.ready {
            // Keepalives start at the next point of the timer grid.
            self.sched.start(self.shared.grid.snap(received));
        }
    }

    /// What is due: a pong overdue ends the session; then the end of the
    /// wait for `entity_config`, a ping, a keepalive, an agent event.
    async fn on_timer(&mut self) -> Result<(), SessionEnd> {
        let sh = self.shared;
        let now = Instant::now();
        if self
            .sched
            .ping_since
            .is_some_and(|since| now >= since + sh.cfg.pong_timeout)
        {
            return Err(SessionEnd::lost("pong_timeout"));
        }
        if !self.sched.ready && now >= self.sched.ec_deadline {
            // As the real agent: log it and proceed without an entity
            // config. Not "connected" yet: that needs an answer from the
            // backend.
            sh.metrics.warn(
                "entity_config_timeout",
                Some("no entity_config from the backend within the wait; keepalives start anyway"),
            );
            self.cx.release_dial_slot();
            // From the end of the wait (a point of the grid), not from
            // when the timer's turn came.
            self.sched.start(self.sched.ec_deadline);
        }
        if now >= self.sched.next_ping {
            let ping = Message::Ping(Default::default());
            self.ws.send(ping).await.map_err(|e| ws_lost(&e))?;
            self.sched.pinged(now, sh.cfg.ping_interval);
        }
        if let Some(due) = self.sched.next_keepalive.filter(|t| now >= *t) {
            if let Some(out) = self.keepalive_frame(due) {
                self.send(out).await?;
                sh.metrics.incr(sh.ids.keepalives_sent);
            }
            if self.sched.next_keepalive == Some(due) {
                self.sched.next_keepalive = Some(due + sh.cfg.keepalive_interval);
            }
        }
        if let (Some(due), Some(mean)) = (
            self.sched.next_event.filter(|t| now >= *t),
            self.sched.event_mean,
        ) {
            self.sched.next_event = Some(due + exp_interval(mean));
            if let Some(out) = self.agent_event_frame() {
                self.send(out).await?;
                sh.metrics.incr(sh.ids.agent_events_sent);
                sh.metrics.incr(sh.ids.events_sent);
            }
        }
        Ok(())
    }

    /// The frame of the keepalive due at `due`, from the pre-encoded
    /// template (written once by the caller). Its lateness is timed from
    /// the intended time, and a slot missed entirely still counts, from
    /// its own due time; the next one is due at the first slot not passed.
    fn keepalive_frame(&mut self, due: Instant) -> Option<Vec<u8>> {
        let (m, ids) = (&self.shared.metrics, &self.shared.ids);
        self.sched.keepalive_seq += 1;
        let mut out = Vec::with_capacity(KEEPALIVE_FRAME_CAPACITY);
        let wall = unix_now();
        if self
            .builder
            .write_keepalive_frame(&mut out, wall, new_id(), self.sched.keepalive_seq)
            .is_err()
        {
            m.error("encode_keepalive");
            return None;
        }
        let sent_at = Instant::now();
        let mut slot = due;
        while slot <= sent_at {
            m.record(ids.keepalive_lateness, self.cx.shard_key(), sent_at - slot);
            slot += self.shared.cfg.keepalive_interval;
        }
        self.sched.next_keepalive = Some(slot);
        Some(out)
    }

    /// The frame of one agent-side event.
    fn agent_event_frame(&mut self) -> Option<Vec<u8>> {
        let seq = self.checks.next_sequence(AGENT_EVENT_CHECK);
        let wall = unix_now();
        let check = self.builder.agent_event_check(wall);
        let mut out = Vec::new();
        if self
            .builder
            .write_event_frame(&mut out, check, wall, new_id(), seq)
            .is_err()
        {
            self.shared.metrics.error("encode_event");
            return None;
        }
        Some(out)
    }

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
