//! One agent connection: TLS when the port has it, the upgrade (`upgrade`:
//! headers, credentials or client certificate, encoding) and the session loop
//! (entity_config, validation, check requests, close).

use std::future::pending;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use agent_sim_net::MaybeTls;
use agent_sim_proto::sensu::{v2, v3};
use agent_sim_sensu::codec;
use bytes::Bytes;
use futures_util::stream::{SelectAll, Stream};
use futures_util::{SinkExt as _, StreamExt as _};
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::error::Error as WsError;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_util::sync::CancellationToken;

use super::inbound::Inbound;
use super::stats::{ActiveGuard, inc};
use super::tls::{self, AgentConn as _};
use super::upgrade::{self, Hello, Way, Ws};
use super::{Publication, Shared, frame_index};
use crate::faults::{self, Action, Kill, OVERSIZED_WS, STALL_LIMIT, Target};

/// After shutdown, how long a session waits for its close frame to go out and the
/// peer's close to come back.
const CLOSE_GRACE: Duration = Duration::from_millis(1500);

/// Runs one connection to its end.
pub(super) async fn run(stream: TcpStream, shared: Arc<Shared>, shutdown: CancellationToken) {
    let io = shared.faults.io(stream);
    let mut injected = None;
    if let Some(hit) = shared.faults.pick(Target::SensuUpgrade, None) {
        match hit.action {
            Action::Delay(d) => {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(d) => {}
                }
            }
            Action::Stall => return io.stall(STALL_LIMIT, &shutdown).await,
            Action::Drop => return io.refuse(Kill::Drop).await,
            Action::Reset => return io.refuse(Kill::Reset).await,
            Action::Status(code) => injected = Some(code),
            _ => {}
        }
    }
    let conn = match &shared.tls {
        // Boxed, as the upgrade: rustls's handshake state must not stay
        // inside the session future.
        Some(cfg) => {
            let accept = tls::accept(io, cfg.clone(), &shared.stats, &shutdown);
            match Box::pin(accept).await {
                Some(conn) => conn,
                None => return,
            }
        }
        None => MaybeTls::Plain(io),
    };
    // Boxed: the handshake state machine must not stay inside the session future.
    let upgrade = upgrade::handshake(conn, &shared, &shutdown, injected);
    let Some((mut ws, hello)) = Box::pin(upgrade).await else {
        return;
    };
    inc(&shared.stats.upgrades_accepted);
    inc(match hello.way {
        Way::Password => &shared.stats.accepted_password,
        Way::Certificate => &shared.stats.accepted_certificate,
    });
    session_fault(&shared, &mut ws);
    let _active = ActiveGuard::new(&shared.stats.sessions_active);
    let _held = shared.faults.hold(faults::Load::SensuSessions);
    let feeds = Feeds::new(&shared, &hello.subscriptions);
    let mut session = Session {
        shared: &shared,
        hello,
        feeds,
        registered: false,
    };
    session.run(ws, &shutdown).await;
}

/// A `sensu.session` fault decided when the session starts: listed for
/// faults at a time, and hit `after` into its life by a fault with a rate.
fn session_fault(shared: &Shared, ws: &mut Ws) {
    let faults = &shared.faults;
    faults.enlist(ws.get_mut().fault_io_mut(), Target::SensuSession);
    let Some(hit) = faults.draw(Target::SensuSession, None) else {
        return;
    };
    let kill = faults::kill_of(&hit.action);
    let Some(ctl) = ws.get_ref().fault_io().ctl() else {
        return;
    };
    let ctl = std::sync::Arc::downgrade(&ctl);
    let faults = faults.clone();
    tokio::spawn(async move {
        tokio::time::sleep(hit.after).await;
        // Counted only if the session is still there to be hit.
        if let Some(ctl) = ctl.upgrade()
            && faults.confirm(hit.idx)
        {
            ctl.kill(kill);
        }
    });
}

/// The check channels a session listens to.
// Bound: one watch receiver per configured check (a watch channel holds
// only the latest publication), whatever the agent subscribes to.
enum Feeds {
    None,
    /// The common case: one matching check, no allocation.
    One(watch::Receiver<Option<Arc<Publication>>>),
    Many(SelectAll<Pin<Box<dyn Stream<Item = Arc<Publication>> + Send>>>),
}

impl Feeds {
    fn new(shared: &Shared, subscriptions: &[String]) -> Self {
        let mut receivers: Vec<_> = shared
            .checks
            .iter()
            .filter(|c| {
                c.spec
                    .subscriptions
                    .iter()
                    .any(|s| subscriptions.contains(s))
            })
            .map(|c| c.tx.subscribe())
            .collect();
        match receivers.len() {
            0 => Self::None,
            1 => Self::One(receivers.pop().expect("one receiver")),
            _ => Self::Many(
                receivers
                    .into_iter()
                    .map(|rx| {
                        let s = futures_util::stream::unfold(rx, |mut rx| async move {
                            let p = next_publication(&mut rx).await?;
                            Some((p, rx))
                        });
                        Box::pin(s) as Pin<Box<dyn Stream<Item = _> + Send>>
                    })
                    .collect(),
            ),
        }
    }

    /// The next publication of any matching check (cancel-safe; pending forever if
    /// there is none).
    async fn next(&mut self) -> Arc<Publication> {
        let next = match self {
            Self::None => None,
            Self::One(rx) => next_publication(rx).await,
            Self::Many(all) => all.next().await,
        };
        match next {
            Some(p) => p,
            None => {
                // Channels closed (shutdown): stop polling them.
                *self = Self::None;
                pending().await
            }
        }
    }
}

/// The next publication on `rx`; `None` once the sender is gone.
async fn next_publication(
    rx: &mut watch::Receiver<Option<Arc<Publication>>>,
) -> Option<Arc<Publication>> {
    loop {
        rx.changed().await.ok()?;
        let p = rx.borrow_and_update().clone();
        if p.is_some() {
            return p;
        }
    }
}

/// Why the session loop stopped.
enum End {
    /// Peer closed or the connection failed: nothing more to send.
    Closed,
    /// Shutdown: send close 1001.
    Shutdown,
}

struct Session<'a> {
    shared: &'a Shared,
    hello: Hello,
    feeds: Feeds,
    /// A valid keepalive was received (the updated `entity_config` was sent).
    registered: bool,
}

impl Session<'_> {
    async fn run(&mut self, mut ws: Ws, shutdown: &CancellationToken) {
        if let End::Shutdown = self.serve(&mut ws, shutdown).await {
            close(&mut ws).await;
        }
    }

    async fn serve(&mut self, ws: &mut Ws, shutdown: &CancellationToken) -> End {
        let stats = &self.shared.stats;
        let placeholder =
            self.shared.placeholders[frame_index(self.hello.ns, self.hello.enc)].clone();
        if let Err(end) = send_frame(ws, placeholder, self.shared, shutdown).await {
            return end;
        }
        inc(&stats.entity_configs_sent);
        loop {
            let out = tokio::select! {
                biased;
                () = shutdown.cancelled() => return End::Shutdown,
                msg = ws.next() => match msg {
                    Some(Ok(Message::Binary(payload))) => self.on_payload(&payload),
                    Some(Ok(Message::Text(payload))) => self.on_payload(payload.as_bytes()),
                    Some(Ok(Message::Ping(_))) => {
                        // tungstenite queued the pong; write it out now.
                        if ws.flush().await.is_err() {
                            return End::Closed;
                        }
                        None
                    }
                    // After a close, tungstenite answers it; the next read ends the stream.
                    Some(Ok(Message::Pong(_) | Message::Close(_) | Message::Frame(_))) => None,
                    Some(Err(e)) => {
                        if !matches!(e, WsError::ConnectionClosed | WsError::AlreadyClosed) {
                            inc(&stats.session_errors);
                        }
                        return End::Closed;
                    }
                    None => return End::Closed,
                },
                p = self.feeds.next() => {
                    let frame = p.frames[frame_index(self.hello.ns, self.hello.enc)].clone();
                    if let Err(end) = send_frame(ws, frame, self.shared, shutdown).await {
                        return end;
                    }
                    inc(&stats.check_requests_sent);
                    continue;
                }
            };
            if let Some(frame) = out {
                if let Err(end) = send_frame(ws, frame, self.shared, shutdown).await {
                    return end;
                }
                inc(&stats.entity_configs_sent);
            }
        }
    }

    /// Handles one data message; returns a frame to send back (the updated
    /// `entity_config` after the first valid keepalive).
    fn on_payload(&mut self, payload: &[u8]) -> Option<Bytes> {
        let stats = &self.shared.stats;
        stats
            .bytes_received
            .fetch_add(payload.len() as u64, Ordering::Relaxed);
        let (is_keepalive, event) = match super::inbound::classify(payload, self.hello.enc) {
            Inbound::Keepalive(e) => (true, e),
            Inbound::Event(e) => (false, e),
            Inbound::Invalid => {
                inc(&stats.frames_invalid);
                return None;
            }
            Inbound::Rejected(reason) => {
                stats.reject(reason);
                return None;
            }
        };
        let check = event.check.as_ref();
        let check_name = check
            .and_then(|c| c.metadata.as_ref())
            .map_or("", |m| m.name.as_str());
        if is_keepalive {
            inc(&stats.keepalives_received);
            if !self.registered {
                self.registered = true;
                return self.entity_config(&event);
            }
        } else {
            inc(&stats.events_received);
            if let Some(idx) = self.shared.check_index(check_name) {
                inc(&stats.check_replies_received);
                let issued = check.map_or(0, |c| c.issued);
                if issued == self.shared.checks[idx].last_issued.load(Ordering::Relaxed) {
                    inc(&stats.check_replies_current);
                }
            }
        }
        None
    }

    /// The `entity_config` the backend pushes once the entity is registered.
    fn entity_config(&mut self, keepalive: &v2::Event) -> Option<Bytes> {
        let entity = keepalive.entity.as_ref();
        let hello = &mut self.hello;
        let name = if hello.name.is_empty() {
            entity
                .and_then(|e| e.metadata.as_ref())
                .map_or_else(String::new, |m| m.name.clone())
        } else {
            hello.name.clone()
        };
        let user = if hello.user.is_empty() {
            entity.map_or_else(String::new, |e| e.user.clone())
        } else {
            std::mem::take(&mut hello.user)
        };
        let config = v3::EntityConfig {
            metadata: Some(v2::ObjectMeta {
                name,
                namespace: self.shared.namespaces[hello.ns].clone(),
                ..Default::default()
            }),
            entity_class: "agent".to_owned(),
            user,
            // Needed only for this frame: give the memory back.
            subscriptions: std::mem::take(&mut hello.subscriptions),
            deregister: entity.is_some_and(|e| e.deregister),
            deregistration: Some(
                entity
                    .and_then(|e| e.deregistration.clone())
                    .unwrap_or_default(),
            ),
            ..Default::default()
        };
        match codec::encode_entity_config(&config, hello.enc) {
            Ok(body) => Some(Bytes::from(codec::encode_frame(
                codec::KIND_ENTITY_CONFIG,
                &body,
            ))),
            Err(_) => {
                inc(&self.shared.stats.frames_invalid);
                None
            }
        }
    }
}

/// Writes one frame of the backend, after what a `sensu.frame` fault does
/// to it: a delay, a garbage message before it, an oversized message before
/// it, or (truncated) half of it in a frame that announces all of it, then
/// the connection dropped.
async fn send_frame(
    ws: &mut Ws,
    frame: Bytes,
    shared: &Shared,
    shutdown: &CancellationToken,
) -> Result<(), End> {
    let stats = &shared.stats;
    if let Some(hit) = shared.faults.pick(Target::SensuFrame, None) {
        match hit.action {
            Action::Delay(d) => {
                tokio::select! {
                    () = shutdown.cancelled() => return Err(End::Shutdown),
                    () = tokio::time::sleep(d) => {}
                }
            }
            Action::Garbage => {
                let junk = faults::garbage(fastrand::u64(..), 32);
                send(ws, Bytes::from(junk), shutdown, stats).await?;
            }
            Action::Oversized => {
                let mut raw = server_frame_header(OVERSIZED_WS);
                raw.resize(raw.len() + OVERSIZED_WS, 0);
                write_raw(ws, &raw).await?;
            }
            Action::Truncated => {
                let mut raw = server_frame_header(frame.len());
                raw.extend_from_slice(&frame[..frame.len() / 2]);
                let _ = write_raw(ws, &raw).await;
                ws.get_ref().fault_io().kill(Kill::Drop);
                return Err(End::Closed);
            }
            _ => {}
        }
    }
    send(ws, frame, shutdown, stats).await
}

/// The header of one final, unmasked binary frame (a server's) of `len`
/// payload bytes (RFC 6455 §5.2).
fn server_frame_header(len: usize) -> Vec<u8> {
    let mut h = vec![0x82];
    if len < 126 {
        h.push(len as u8);
    } else if let Ok(n) = u16::try_from(len) {
        h.push(126);
        h.extend_from_slice(&n.to_be_bytes());
    } else {
        h.push(127);
        h.extend_from_slice(&(len as u64).to_be_bytes());
    }
    h
}

/// Writes bytes past tungstenite (after flushing what it holds).
async fn write_raw(ws: &mut Ws, raw: &[u8]) -> Result<(), End> {
    ws.flush().await.map_err(|_| End::Closed)?;
    ws.get_mut().write_all(raw).await.map_err(|_| End::Closed)
}

/// Writes one binary message, giving up on shutdown.
async fn send(
    ws: &mut Ws,
    frame: Bytes,
    shutdown: &CancellationToken,
    stats: &super::SensuTargetStats,
) -> Result<(), End> {
    tokio::select! {
        biased;
        () = shutdown.cancelled() => Err(End::Shutdown),
        r = ws.send(Message::Binary(frame)) => r.map_err(|e| {
            if !matches!(e, WsError::ConnectionClosed | WsError::AlreadyClosed) {
                inc(&stats.session_errors);
            }
            End::Closed
        }),
    }
}

/// Sends close 1001 and waits (bounded) for the peer's close.
async fn close(ws: &mut Ws) {
    let _ = tokio::time::timeout(CLOSE_GRACE, async {
        let frame = CloseFrame {
            code: CloseCode::Away,
            reason: "backend shutting down".into(),
        };
        if ws.close(Some(frame)).await.is_ok() {
            while let Some(Ok(_)) = ws.next().await {}
        }
    })
    .await;
}
