//! The pool's packets and streams: binding endpoints, the UDP loop that
//! answers probes and takes in gossip, the TCP loop that answers
//! push-pulls and fallback pings, and the exchanges the pool starts (its
//! hello, a member's join, its answer read by `answer`; `tick` and `close`
//! start theirs by `exchange`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::time::Instant;

use super::answer::{self, Reply};
use super::view::{Phase, Shown, Who};
use super::{ExchangeError, Inner, JoinError, PoolError, probe, user};
use crate::serf;
use crate::wire::msgs::{Ack, Alive, IndirectPing, Nack, Ping, PushPull, Verdict};
use crate::wire::{self, MAX_STATE_BYTES, UDP_BUFFER, kind, socket_addr};

/// Binds UDP and TCP on each address (port 0: the first bound port is
/// tried on the others).
pub(super) async fn bind(
    addrs: &[SocketAddr],
) -> Result<(Vec<UdpSocket>, Vec<TcpListener>, Vec<SocketAddr>), PoolError> {
    let (mut udp, mut tcp, mut eps) = (Vec::new(), Vec::new(), Vec::new());
    let mut port = 0u16;
    for a in addrs {
        let mut want = *a;
        if want.port() == 0 && port != 0 {
            want.set_port(port);
        }
        let err = |source| PoolError::Bind { addr: want, source };
        // TCP first: its port is then taken for UDP too.
        let l = match TcpListener::bind(want).await {
            Ok(l) => l,
            Err(_) if a.port() == 0 && want.port() != 0 => {
                TcpListener::bind(*a).await.map_err(err)?
            }
            Err(e) => return Err(err(e)),
        };
        let local = l.local_addr().map_err(err)?;
        let u = UdpSocket::bind(local).await.map_err(err)?;
        port = local.port();
        udp.push(u);
        tcp.push(l);
        eps.push(local);
    }
    Ok((udp, tcp, eps))
}

/// Sends a message to `to` from endpoint `ep`, with broadcasts for that
/// member piggybacked when it is a server (as memberlist fills any packet).
pub(super) fn send(inner: &Inner, ep: usize, to: SocketAddr, msg: &[u8]) {
    let extra = {
        let mut v = inner.lock();
        match v.remotes.iter().position(|r| r.server && r.addr == to) {
            Some(s) => v.take_broadcasts(s, UDP_BUFFER.saturating_sub(msg.len() + 2)),
            None => Vec::new(),
        }
    };
    let packet = if extra.is_empty() {
        inner.cfg.security.seal_packet(msg)
    } else {
        let mut parts: Vec<&[u8]> = vec![msg];
        parts.extend(extra.iter().map(|m| &m[..]));
        inner.cfg.security.seal_packet(&wire::compound(&parts))
    };
    let sock = &inner.udp[ep % inner.udp.len()];
    if sock.try_send_to(&packet, to).is_ok() {
        inner.metrics.incr(inner.ids.packets_tx);
        inner.metrics.add(inner.ids.bytes_tx, packet.len() as u64);
    }
}

/// Counts bytes that could not be read as a cause; `packet`, the datagram
/// they came in, is named in the sample (its size and first bytes) so that
/// a reader can tell what the sender sent.
fn bad(inner: &Inner, e: &wire::WireError, from: SocketAddr, packet: Option<&[u8]>) {
    let kind = match e {
        wire::WireError::Crypt(_) | wire::WireError::Key(_) => crate::BAD_KEY.kind,
        wire::WireError::Label { .. } => crate::BAD_LABEL.kind,
        wire::WireError::Cut { .. } | wire::WireError::Hungup(_) => crate::STREAM_CUT.kind,
        _ => crate::BAD_PACKET.kind,
    };
    let mut sample = format!("{} from {from}: {e}", e.cause());
    if let Some(p) = packet {
        sample.push_str(&datagram_words(p));
    }
    inner.metrics.error_with(kind, Some(&sample));
}

/// How many of a datagram's first bytes a sample shows.
const SHOWN_BYTES: usize = 24;

/// " (a datagram of N bytes: xx xx ...)", its first [`SHOWN_BYTES`] in hex.
fn datagram_words(p: &[u8]) -> String {
    let head: Vec<String> = p
        .iter()
        .take(SHOWN_BYTES)
        .map(|b| format!("{b:02x}"))
        .collect();
    let more = if p.len() > SHOWN_BYTES { " ..." } else { "" };
    format!(
        " (a datagram of {} bytes: {}{more})",
        p.len(),
        head.join(" ")
    )
}

/// The UDP loop of endpoint `ep`.
pub(super) async fn packets(inner: Arc<Inner>, ep: usize, sock: Arc<UdpSocket>) {
    let mut buf = vec![0u8; 65_536];
    agent_sim_net::stamp_udp(&sock);
    loop {
        let r = tokio::select! {
            r = agent_sim_net::recv_from_stamped(&sock, &mut buf) => r,
            () = inner.stop.cancelled() => return,
        };
        let Ok((n, from, kernel)) = r else { continue };
        // When the packet came: the kernel's stamp where it stamps
        // packets, else the moment it was read.
        let now = Instant::now();
        let arrived = kernel.map_or(now, |at| agent_sim_net::stamp_instant(at, now));
        inner.metrics.incr(inner.ids.packets_rx);
        inner.metrics.add(inner.ids.bytes_rx, n as u64);
        let msg = match inner.cfg.security.open_packet(&buf[..n]) {
            Ok(m) => m.into_owned(),
            Err(e) => {
                bad(&inner, &e, from, Some(&buf[..n]));
                continue;
            }
        };
        let mut parts: Vec<(u8, Vec<u8>)> = Vec::new();
        let walked = wire::each_message(&msg, &mut |t, b| parts.push((t, b.to_vec())));
        if let Err(e) = walked {
            bad(&inner, &e, from, Some(&msg));
        }
        for (t, body) in parts {
            if let Err(e) = on_message(&inner, (ep, arrived), from, t, &body) {
                bad(&inner, &e, from, Some(&msg));
            }
        }
    }
}

/// The server (remote index) a packet came from, if it is one.
fn server_at(inner: &Inner, from: SocketAddr) -> Option<usize> {
    inner
        .lock()
        .remotes
        .iter()
        .position(|r| r.server && r.addr == from)
}

/// One message of a packet.
fn on_message(
    inner: &Inner,
    (ep, arrived): (usize, Instant),
    from: SocketAddr,
    t: u8,
    body: &[u8],
) -> Result<(), wire::WireError> {
    let limit = inner
        .lock()
        .retransmit_limit(inner.cfg.timings.retransmit_mult);
    match t {
        kind::PING => {
            let p = Ping::decode(body)?;
            let to = socket_addr(p.source_addr, p.source_port).unwrap_or(from);
            if let Some(out) = ack_for(inner, p.node, p.seq) {
                send(inner, ep, to, &out);
                acked(inner, p.seq, arrived);
            }
        }
        kind::INDIRECT_PING => indirect(inner, (ep, arrived), from, &IndirectPing::decode(body)?),
        kind::ACK => {
            if let Some(o) = probe::on_ack(inner, &Ack::decode(body)?) {
                send(inner, o.ep, o.to, &o.msg);
            }
        }
        kind::NACK => {
            Nack::decode(body)?;
        }
        kind::ALIVE => {
            let a = Alive::decode(body)?;
            let s = server_at(inner, from);
            inner.lock().on_alive(&a, s, limit);
        }
        kind::SUSPECT | kind::DEAD => {
            let v = Verdict::decode(body)?;
            let s = server_at(inner, from);
            inner.lock().on_verdict(t, &v, s, limit);
        }
        kind::USER => on_user(inner, from, body, limit)?,
        other => return Err(wire::WireError::Unknown(other)),
    }
    Ok(())
}

/// A serf message: an intent goes to the view, the others (events,
/// queries, relays) to `user`.
fn on_user(inner: &Inner, from: SocketAddr, body: &[u8], limit: u8) -> Result<(), wire::WireError> {
    let Some((leave, ltime, node)) = serf::decode_intent(body)? else {
        return user::take(inner, body, limit);
    };
    let s = server_at(inner, from);
    let mut raw = Vec::with_capacity(body.len() + 1);
    raw.push(kind::USER);
    raw.extend_from_slice(body);
    inner.lock().on_intent((leave, ltime), node, &raw, s, limit);
    Ok(())
}

/// The ack member `node` sends for probe `seq`, if it is one of ours. A
/// member answers from the moment its join went out (a real agent's
/// memberlist is up before its join completes) until the pool stops (a
/// server that still probes a member after its leave has not heard of the
/// leave yet; a real agent waits for its leave to travel before it stops).
fn ack_for(inner: &Inner, node: &str, seq: u32) -> Option<Vec<u8>> {
    let v = inner.lock();
    let Some(Who::Local(slot)) = v.names.get(node).copied() else {
        return None;
    };
    let l = &v.locals[slot];
    let mut payload = Vec::with_capacity(100);
    l.vivaldi.coord().ack_payload(&mut payload);
    drop(v);
    let mut out = Vec::with_capacity(120);
    Ack {
        seq,
        payload: &payload,
    }
    .encode(&mut out);
    inner.metrics.incr(inner.ids.acks_sent);
    Some(out)
}

/// A probe's ack sent: how long after its ping came, recorded; one past
/// the probe's timeout is warned (the server counted it late, or missed).
fn acked(inner: &Inner, seq: u32, arrived: Instant) {
    let took = arrived.elapsed();
    inner
        .metrics
        .record(inner.ids.ack_delay, seq as usize, took);
    let timeout = inner.cfg.timings.probe_timeout;
    if took > timeout {
        let said = format!(
            "a member acked a server's probe {} ms after the ping came (the server waits {} ms)",
            took.as_millis(),
            timeout.as_millis()
        );
        inner.metrics.warn(crate::ACKED_LATE.kind, Some(&said));
    }
}

/// "Probe `node` for me": a member of ours answers at once (it is as alive
/// as the pool is); another member is probed and its ack relayed.
fn indirect(
    inner: &Inner,
    (ep, arrived): (usize, Instant),
    from: SocketAddr,
    ind: &IndirectPing<'_>,
) {
    let reply_to = socket_addr(ind.source_addr, ind.source_port).unwrap_or(from);
    let who = inner.lock().names.get(ind.node).copied();
    match who {
        Some(Who::Local(_)) => {
            if ack_for(inner, ind.node, ind.seq).is_some() {
                let mut out = Vec::new();
                Ack {
                    seq: ind.seq,
                    payload: &[],
                }
                .encode(&mut out);
                send(inner, ep, reply_to, &out);
                acked(inner, ind.seq, arrived);
            } else if ind.nack {
                let mut out = Vec::new();
                Nack { seq: ind.seq }.encode(&mut out);
                send(inner, ep, reply_to, &out);
            }
        }
        _ => {
            let Some(target) = socket_addr(ind.target, ind.port) else {
                return;
            };
            let seq = inner.next_seq();
            let me = inner.lock().endpoints[ep % inner.udp.len()];
            let ip = wire::ip_bytes(me.ip());
            let mut out = Vec::new();
            Ping {
                seq,
                node: ind.node,
                source_addr: &ip,
                source_port: me.port(),
                source_node: "",
            }
            .encode(&mut out);
            probe::wait_relay(inner, seq, reply_to, ind.seq, ind.nack);
            send(inner, ep, target, &out);
        }
    }
}

/// How long the TCP loop rests after a failed accept (out of descriptors
/// or similar: nothing to be notified of, and retrying at once would spin).
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// The TCP loop of one endpoint.
pub(super) async fn streams(inner: Arc<Inner>, l: TcpListener) {
    loop {
        let r = tokio::select! {
            r = l.accept() => r,
            () = inner.stop.cancelled() => return,
        };
        let Ok((conn, from)) = r else {
            // Out of descriptors or similar: do not spin.
            tokio::time::sleep(ACCEPT_RETRY).await;
            continue;
        };
        let inner2 = inner.clone();
        tokio::spawn(async move {
            // Bound: STREAMS_AT_ONCE; memberlist drops streams past its bound too.
            let Ok(_permit) = inner2.streams.try_acquire() else {
                return;
            };
            let t = inner2.cfg.timings.tcp_timeout;
            if let Ok(Err(e)) = tokio::time::timeout(t, serve_stream(&inner2, conn)).await {
                bad(&inner2, &e, from, None);
            }
        });
    }
}

/// Reads one whole stream message (after the label preamble): at most
/// [`MAX_STATE_BYTES`] and a little.
async fn read_msg(
    inner: &Inner,
    conn: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> Result<Vec<u8>, wire::WireError> {
    read_frame(inner, conn, buf).await?.message()
}

/// [`read_msg`], the message left compressed (a join's answer is read off
/// the wire and decompressed only when it is merged).
async fn read_frame(
    inner: &Inner,
    conn: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> Result<wire::Frame, wire::WireError> {
    let mut chunk = vec![0u8; 64 * 1024];
    let mut tried_at = 0usize;
    loop {
        if buf.len() >= tried_at {
            if let Some((msg, used)) = inner.cfg.security.open_stream_frame(buf)? {
                buf.drain(..used);
                return Ok(msg);
            }
            // Parse again once half as much again has come.
            tried_at = buf.len() + buf.len() / 2;
        }
        let n = conn
            .read(&mut chunk)
            .await
            .map_err(|e| wire::WireError::Hungup(e.kind()))?;
        if n == 0 {
            return inner
                .cfg
                .security
                .open_stream_frame(buf)?
                .map(|(m, _)| m)
                .ok_or(wire::WireError::Cut { got: buf.len() });
        }
        inner.metrics.add(inner.ids.bytes_rx, n as u64);
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_STATE_BYTES + 64 * 1024 {
            return Err(wire::WireError::TooLarge(MAX_STATE_BYTES));
        }
    }
}

/// Reads until `buf` holds `need` bytes (a peer that closes first sent a
/// truncated message).
async fn read_at_least(
    conn: &mut TcpStream,
    buf: &mut Vec<u8>,
    need: usize,
) -> Result<(), wire::WireError> {
    let mut chunk = [0u8; 512];
    while buf.len() < need {
        let n = conn
            .read(&mut chunk)
            .await
            .map_err(|e| wire::WireError::Hungup(e.kind()))?;
        if n == 0 {
            return Err(wire::WireError::Cut { got: buf.len() });
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(())
}

/// Strips and checks a stream's label header.
async fn preamble(
    inner: &Inner,
    conn: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> Result<(), wire::WireError> {
    read_at_least(conn, buf, 2).await?;
    if buf[0] == kind::HAS_LABEL {
        read_at_least(conn, buf, 2 + usize::from(buf[1])).await?;
    }
    let (label, rest) = wire::split_label(buf)?;
    if label != inner.cfg.security.label {
        return Err(wire::WireError::Label {
            got: label.into(),
            want: inner.cfg.security.label.clone(),
        });
    }
    let used = buf.len() - rest.len();
    buf.drain(..used);
    Ok(())
}

/// Writes `msg` sealed (after the label preamble when it is the stream's
/// `first`).
async fn write_msg(
    inner: &Inner,
    conn: &mut TcpStream,
    msg: &[u8],
    first: bool,
) -> std::io::Result<()> {
    let mut out = if first {
        inner.cfg.security.stream_preamble()
    } else {
        Vec::new()
    };
    out.extend_from_slice(&inner.cfg.security.seal_stream(msg));
    conn.write_all(&out).await?;
    inner.metrics.add(inner.ids.bytes_tx, out.len() as u64);
    Ok(())
}

/// A stream a server opened: a push-pull, a fallback ping or a user message.
async fn serve_stream(inner: &Inner, mut conn: TcpStream) -> Result<(), wire::WireError> {
    let mut buf = Vec::new();
    preamble(inner, &mut conn, &mut buf).await?;
    let msg = read_msg(inner, &mut conn, &mut buf).await?;
    let (&t, body) = msg.split_first().ok_or(wire::WireError::Truncated)?;
    let from = conn.peer_addr().ok();
    match t {
        kind::PUSH_PULL => {
            let pp = PushPull::decode(body)?;
            let reply = inner.lock().push_pull(pp.join, Shown::Intents);
            // A peer that hangs up before our answer: its exchange is cut short.
            write_msg(inner, &mut conn, &reply, true)
                .await
                .map_err(|e| wire::WireError::Hungup(e.kind()))?;
            inner.metrics.incr(inner.ids.push_pulls);
            let limit = inner
                .lock()
                .retransmit_limit(inner.cfg.timings.retransmit_mult);
            let s = from.and_then(|f| server_by_ip(inner, f));
            inner.lock().merge(&pp, s, limit);
        }
        kind::PING => {
            let p = Ping::decode(body)?;
            if let Some(out) = ack_for(inner, p.node, p.seq) {
                let mut plain = Vec::new();
                Ack::decode(&out[1..])?.encode(&mut plain);
                write_msg(inner, &mut conn, &plain, true)
                    .await
                    .map_err(|e| wire::WireError::Hungup(e.kind()))?;
            }
        }
        kind::USER => {
            let mut r = wire::read::Reader::new(body);
            r.skip()?;
            let limit = inner
                .lock()
                .retransmit_limit(inner.cfg.timings.retransmit_mult);
            on_user(
                inner,
                from.unwrap_or(([0, 0, 0, 0], 0).into()),
                r.rest(),
                limit,
            )?;
        }
        other => return Err(wire::WireError::Unknown(other)),
    }
    Ok(())
}

/// A server a stream came from (streams come from any port of its host).
fn server_by_ip(inner: &Inner, from: SocketAddr) -> Option<usize> {
    inner
        .lock()
        .remotes
        .iter()
        .position(|r| r.server && r.addr.ip() == from.ip())
}

/// A push-pull with `to`: sends `msg`, reads the whole answer (a
/// push-pull, type byte first; or an error in the server's words).
pub(super) async fn exchange(
    inner: &Inner,
    to: SocketAddr,
    msg: &[u8],
) -> Result<Vec<u8>, ExchangeError> {
    exchange_frame(inner, to, msg)
        .await?
        .message()
        .map_err(|source| ExchangeError::Answer { to, source })
}

/// A push-pull with `to`: sends `msg`, reads the answer (a push-pull,
/// still compressed if it came so; or an error in the server's words),
/// within `tcp_timeout`.
async fn exchange_frame(
    inner: &Inner,
    to: SocketAddr,
    msg: &[u8],
) -> Result<wire::Frame, ExchangeError> {
    let after = inner.cfg.timings.tcp_timeout;
    tokio::time::timeout(after, push_pull_with(inner, to, msg))
        .await
        .unwrap_or(Err(ExchangeError::Timeout { to, after }))
}

/// [`exchange_frame`] without its deadline.
async fn push_pull_with(
    inner: &Inner,
    to: SocketAddr,
    msg: &[u8],
) -> Result<wire::Frame, ExchangeError> {
    let mut conn = open(inner, to, msg).await?;
    let mut buf = Vec::new();
    let answer = read_frame(inner, &mut conn, &mut buf)
        .await
        .map_err(|e| unreadable(to, e))?;
    let reply = answer::reply_of(&answer).map_err(|source| ExchangeError::Answer { to, source })?;
    refused(to, reply).map(|()| answer)
}

/// A push-pull with `to` sent: the stream it is to be answered on.
async fn open(inner: &Inner, to: SocketAddr, msg: &[u8]) -> Result<TcpStream, ExchangeError> {
    let mut conn = TcpStream::connect(to)
        .await
        .map_err(|source| ExchangeError::Connect { to, source })?;
    write_msg(inner, &mut conn, msg, true)
        .await
        .map_err(|source| ExchangeError::Send { to, source })?;
    Ok(conn)
}

/// An answer that could not be read: cut short (the server closed it), or
/// bytes that are not what they should be.
fn unreadable(to: SocketAddr, e: wire::WireError) -> ExchangeError {
    match e {
        wire::WireError::Truncated | wire::WireError::Cut { .. } | wire::WireError::Hungup(_) => {
            ExchangeError::Closed { to }
        }
        source => ExchangeError::Answer { to, source },
    }
}

/// An answer that is not a push-pull: the server's error, or another
/// message.
fn refused(to: SocketAddr, reply: Reply) -> Result<(), ExchangeError> {
    match reply {
        Reply::PushPull => Ok(()),
        Reply::Error(said) => Err(ExchangeError::Refused { to, said }),
        Reply::Other => Err(ExchangeError::NotPushPull { to }),
    }
}

/// Member `me`'s join push-pull with `to`: sends `msg`, reads the answer
/// as it arrives, counted and never held whole (`answer`), within
/// `tcp_timeout`; what it taught the member.
async fn join_exchange(
    inner: &Inner,
    me: &str,
    to: SocketAddr,
    msg: &[u8],
) -> Result<answer::Learnt, ExchangeError> {
    let after = inner.cfg.timings.tcp_timeout;
    let exchange = async {
        let mut conn = open(inner, to, msg).await?;
        let mut count = |n: usize| {
            inner.metrics.add(inner.ids.bytes_rx, n as u64);
            inner.metrics.add(inner.ids.join_answer_bytes, n as u64);
        };
        let memo = &inner.join_memo;
        let (reply, learnt) =
            answer::read_reply(&inner.cfg.security, me, &mut conn, &mut count, memo)
                .await
                .map_err(|e| unreadable(to, e))?;
        refused(to, reply).map(|()| learnt)
    };
    tokio::time::timeout(after, exchange)
        .await
        .unwrap_or(Err(ExchangeError::Timeout { to, after }))
}

/// The pool's first exchange, before any member joins: a push-pull with
/// no node (as a member that knows no one) with the first server, which
/// answers with the whole cluster: the servers are known, and the
/// datacenter when none was given (a member of another one is refused).
pub(super) async fn hello(inner: &Inner) -> Result<(), PoolError> {
    let to = inner.cfg.join[0];
    let msg = inner.lock().push_pull(false, Shown::Intents);
    let answer = exchange(inner, to, &msg).await.map_err(PoolError::Hello)?;
    let pp = PushPull::decode(&answer[1..])
        .map_err(|source| PoolError::Hello(ExchangeError::Answer { to, source }))?;
    let mut v = inner.lock();
    // Consul joins with ignoreOld: the events before the join are not news.
    if let Ok(s) = serf::SerfState::decode(pp.user_state) {
        v.seen.ignore_before(s.event_ltime);
    }
    v.merge(&pp, None, 1);
    v.queues.clear();
    let server_dc = v.remotes.iter().filter(|r| r.server).find_map(|r| {
        serf::decode_tags(&r.meta)
            .ok()?
            .into_iter()
            .find(|(k, _)| k == "dc")
            .map(|(_, dc)| dc)
    });
    if let (Some(dc), Some(t)) = (server_dc, v.tags.iter_mut().find(|(k, _)| k == "dc"))
        && t.1.is_empty()
    {
        t.1 = dc;
    }
    if v.live_servers().is_empty() {
        return Err(PoolError::NoServer { to });
    }
    inner.metrics.incr(inner.ids.push_pulls);
    Ok(())
}

/// A member's join (none starts once the pool is closing): what its
/// answer taught the member, when the join made it a member.
pub(super) async fn join(inner: &Inner, slot: usize) -> Result<Option<answer::Learnt>, JoinError> {
    if inner.closing.is_cancelled() {
        return Err(JoinError::Closing);
    }
    // The semaphore is never closed; a closing pool holds every permit
    // while it leaves, and a join let through after it sees `closing`.
    let _permit = inner
        .joins
        .acquire()
        .await
        .map_err(|_| JoinError::Closing)?;
    let to = inner.cfg.join[slot % inner.cfg.join.len()];
    let (msg, me) = {
        let v = inner.lock();
        (v.join_push_pull(slot), v.locals[slot].name.clone())
    };
    if inner.closing.is_cancelled() {
        return Err(JoinError::Closing);
    }
    let learnt = match join_exchange(inner, &me, to, &msg).await {
        Ok(learnt) => learnt,
        Err(e) => {
            let e = JoinError::failed(e, inner.joined.load(Ordering::Relaxed));
            if let Some(kind) = e.kind() {
                let words = e.to_string();
                inner
                    .metrics
                    .error_said(kind, Some(&words), Some(e.said_by()));
            }
            return Err(e);
        }
    };
    // Every join brings the server's whole member list, read as it arrives
    // and counted, not held: the pool learnt the cluster at its hello and
    // keeps learning it from its periodic push-pulls, and a node of a
    // member's name the servers still hold was outrun when it was added.
    let mut v = inner.lock();
    v.refresh_size();
    let limit = v.retransmit_limit(inner.cfg.timings.retransmit_mult);
    let fresh = v.locals[slot].phase == Phase::Joining;
    if fresh {
        v.joined(slot, limit);
    }
    inner.joined.fetch_add(1, Ordering::Relaxed);
    inner.metrics.incr(inner.ids.joins);
    inner.metrics.incr(inner.ids.push_pulls);
    Ok(fresh.then_some(learnt))
}
