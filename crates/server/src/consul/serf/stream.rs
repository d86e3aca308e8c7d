//! The TCP side of the serf port. An accepted stream carries one message
//! (after the label header a dialer writes): a push-pull (answered with
//! this server's whole state as `answer` keeps it encoded, then the peer's
//! merged; closed unanswered past memberlist's bound), a ping (an ack) or
//! a serf message. The server dials too: its own push-pulls and the TCP
//! pings of a probe whose UDP ping went unanswered.
//!
//! Bounds: streams handled at once (`max_tcp_handlers`; more are closed at
//! accept), a stream's whole life (`tcp_timeout`), the bytes of its
//! message (`max_stream_bytes`, an encrypted one refused from its length
//! header), and the members a push-pull may claim (`max_members`, from its
//! header, before anything is allocated for them).

use std::net::SocketAddr;
use std::sync::Arc;

use agent_sim_gossip::serf::SerfState;
use agent_sim_gossip::wire::msgs::{Ack, Ping, PushPull, PushPullHeader, decode_user_stream};
use agent_sim_gossip::wire::read::Reader;
use agent_sim_gossip::wire::{kind, split_label};
use agent_sim_gossip::{Security, WireError};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::Serf;
use super::answer::Sealed;
use super::event::state_user_events;
use super::stats::SerfCounters;

/// Bytes read from a stream at a time.
const READ_CHUNK: usize = 64 * 1024;

/// Why a stream was given up: a counter's cause.
type Cause = &'static str;

fn wire(e: WireError) -> Cause {
    e.cause()
}

/// Handles one accepted stream (bounded in number and in time).
pub(super) async fn accepted(serf: Arc<Serf>, mut stream: TcpStream) {
    let c = &serf.counters;
    c.bump(&c.tcp_accepted);
    let Ok(_slot) = serf.tcp_slots.clone().try_acquire_owned() else {
        return c.bad("busy");
    };
    let _ = stream.set_nodelay(true);
    handle(&serf, &mut stream).await;
}

/// Answers the one message of a stream within the stream timeout; what
/// went wrong is counted.
pub(super) async fn handle<S: AsyncRead + AsyncWrite + Unpin>(serf: &Serf, stream: &mut S) {
    let c = &serf.counters;
    match tokio::time::timeout(serf.cfg.tcp_timeout, answer(serf, stream)).await {
        Err(_) => c.bad("timeout"),
        Ok(Err(cause)) => c.bad(cause),
        Ok(Ok(())) => {}
    }
}

async fn answer<S: AsyncRead + AsyncWrite + Unpin>(
    serf: &Serf,
    stream: &mut S,
) -> Result<(), Cause> {
    let sec = &serf.cfg.security;
    let c = &serf.counters;
    let msg = read_message(stream, sec, serf.cfg.max_stream_bytes, true, c).await?;
    c.received(msg[0], msg.len());
    let body = &msg[1..];
    let reply = match msg[0] {
        kind::PUSH_PULL => {
            // As memberlist: pending from here until merged; too many
            // pending, closed without an answer; the answer, then the merge.
            let Some(_pending) = serf.push_pull_slot() else {
                return Ok(());
            };
            let join = header(body, serf.cfg.max_members)?.join;
            let state = serf.push_pull_state(join).await;
            write_sealed(stream, sec, &state, false, c).await?;
            c.bump(&c.push_pulls_answered);
            return serf.merge_push_pull(body);
        }
        kind::PING => {
            let p = Ping::decode(body).map_err(wire)?;
            if !p.node.is_empty() && p.node != &*serf.me {
                return Err("unexpected_node");
            }
            let mut ack = Vec::with_capacity(16);
            Ack {
                seq: p.seq,
                payload: &[],
            }
            .encode(&mut ack);
            ack
        }
        kind::USER => {
            // memberlist hands a stream's user message to serf at once
            // (no handler queue).
            let user = decode_user_stream(body).map_err(wire)?;
            return serf.on_user(user, Instant::now()).map_err(wire);
        }
        other => return Err(wire(WireError::Unknown(other))),
    };
    write_message(stream, sec, &reply, false, c).await
}

/// A push-pull's header, its member count checked against `max_members`.
fn header(body: &[u8], max_members: usize) -> Result<PushPullHeader, Cause> {
    let h = PushPullHeader::read(&mut Reader::new(body)).map_err(wire)?;
    if h.nodes > max_members {
        return Err("too_many_members");
    }
    Ok(h)
}

impl Serf {
    /// Merges a peer's push-pull (body after the type byte).
    pub(super) fn merge_push_pull(&self, body: &[u8]) -> Result<(), Cause> {
        header(body, self.cfg.max_members)?;
        let pp = PushPull::decode(body).map_err(wire)?;
        let (serf, events) = match pp.user_state {
            [] => (None, Vec::new()),
            s => match SerfState::decode(s).and_then(|st| Ok((st, state_user_events(s)?))) {
                Ok((st, events)) => (Some(st), events),
                Err(e) => {
                    self.counters.bad(e.cause());
                    (None, Vec::new())
                }
            },
        };
        let now = Instant::now();
        let merged = self.with_table(|t| {
            let merged = t.merge(&pp, serf.as_ref(), now);
            // serf's `MergeRemoteState`: the peer's recent events, taken
            // (not passed on), unless the state was refused whole.
            if merged.is_ok() {
                for ev in &events {
                    t.take_event(ev);
                }
            }
            merged
        });
        match merged {
            Ok(refused) => {
                for r in refused {
                    self.counters.bad(r.cause());
                }
                Ok(())
            }
            Err(r) => Err(r.cause()),
        }
    }

    /// This server's push-pull with `to`: its state sent, the peer's merged.
    pub(super) async fn push_pull_with(&self, to: SocketAddr) -> Result<(), Cause> {
        let c = &self.counters;
        let sec = &self.cfg.security;
        let exchange = async {
            let mut stream = TcpStream::connect(to).await.map_err(|_| "connect")?;
            c.bump(&c.tcp_dialed);
            let _ = stream.set_nodelay(true);
            let mine = self.push_pull_state(false).await;
            write_sealed(&mut stream, sec, &mine, true, c).await?;
            let reply = read_message(&mut stream, sec, self.cfg.max_stream_bytes, false, c).await?;
            c.received(reply[0], reply.len());
            match reply[0] {
                kind::PUSH_PULL => self.merge_push_pull(&reply[1..]),
                kind::ERR => Err("remote_error"),
                other => Err(wire(WireError::Unknown(other))),
            }
        };
        tokio::time::timeout(self.cfg.tcp_timeout, exchange)
            .await
            .unwrap_or(Err("timeout"))
    }

    /// A probe's TCP ping: `true` when the member acked `seq` by `deadline`.
    pub(super) async fn tcp_ping(
        &self,
        to: SocketAddr,
        ping: &[u8],
        seq: u32,
        deadline: Instant,
    ) -> bool {
        let c = &self.counters;
        let sec = &self.cfg.security;
        let exchange = async {
            let mut stream = TcpStream::connect(to).await.map_err(|_| "connect")?;
            c.bump(&c.tcp_dialed);
            write_message(&mut stream, sec, ping, true, c).await?;
            let reply = read_message(&mut stream, sec, 64 * 1024, false, c).await?;
            c.received(reply[0], reply.len());
            if reply[0] != kind::ACK {
                return Err("unknown_type");
            }
            let ack = Ack::decode(&reply[1..]).map_err(wire)?;
            Ok::<_, Cause>(ack.seq == seq)
        };
        matches!(
            tokio::time::timeout_at(deadline, exchange).await,
            Ok(Ok(true))
        )
    }
}

/// Writes one message (type byte first) sealed as the pool's streams are,
/// after the label header when this end dialed.
async fn write_message<W: AsyncWrite + Unpin>(
    w: &mut W,
    sec: &Security,
    msg: &[u8],
    dialed: bool,
    c: &SerfCounters,
) -> Result<(), Cause> {
    let mut out = if dialed {
        sec.stream_preamble()
    } else {
        Vec::new()
    };
    out.extend_from_slice(&sec.seal_stream(msg));
    w.write_all(&out).await.map_err(|_| "io")?;
    let _ = w.flush().await;
    c.add(&c.tcp_bytes_sent, out.len());
    c.sent(msg[0], msg.len());
    Ok(())
}

/// Writes this server's push-pull state as sealed once for every stream,
/// after the label header when this end dialed.
async fn write_sealed<W: AsyncWrite + Unpin>(
    w: &mut W,
    sec: &Security,
    state: &Sealed,
    dialed: bool,
    c: &SerfCounters,
) -> Result<(), Cause> {
    let preamble = if dialed {
        sec.stream_preamble()
    } else {
        Vec::new()
    };
    if !preamble.is_empty() {
        w.write_all(&preamble).await.map_err(|_| "io")?;
    }
    w.write_all(&state.bytes).await.map_err(|_| "io")?;
    let _ = w.flush().await;
    c.add(&c.tcp_bytes_sent, preamble.len() + state.bytes.len());
    c.sent(kind::PUSH_PULL, state.len);
    Ok(())
}

/// Reads one message from a stream: the label header first when the peer
/// dialed (checked against the pool's), then the message, decrypted and
/// decompressed (type byte first), at most `max` bytes of it.
// Bound: `max_stream_bytes` per message (8 MiB), read in READ_CHUNK pieces;
// `max_tcp_handlers` streams at once, each for `tcp_timeout` at most.
pub(super) async fn read_message<R: AsyncRead + Unpin>(
    r: &mut R,
    sec: &Security,
    max: usize,
    dialed_by_peer: bool,
    c: &SerfCounters,
) -> Result<Vec<u8>, Cause> {
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut start = (!dialed_by_peer).then_some(0);
    loop {
        if start.is_none() && !buf.is_empty() {
            start = label_end(&buf, sec)?;
        }
        if let Some(s) = start {
            let rest = &buf[s..];
            if rest.first() == Some(&kind::ENCRYPT) && rest.len() >= 5 {
                let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
                if len.saturating_add(5) > max {
                    return Err("oversized");
                }
            }
            if let Some((msg, _)) = sec.open_stream(rest).map_err(wire)? {
                if msg.is_empty() {
                    return Err("truncated");
                }
                return Ok(msg);
            }
        }
        if buf.len() >= max {
            return Err("oversized");
        }
        let have = buf.len();
        let want = READ_CHUNK.min(max - have);
        buf.resize(have + want, 0);
        let n = r.read(&mut buf[have..]).await.map_err(|_| "io")?;
        buf.truncate(have + n);
        if n == 0 {
            return Err("truncated");
        }
        c.add(&c.tcp_bytes_received, n);
    }
}

/// Where the message starts after a stream's label header, once the
/// header is whole (`None` before); a label other than the pool's is
/// refused.
fn label_end(buf: &[u8], sec: &Security) -> Result<Option<usize>, Cause> {
    if buf[0] != kind::HAS_LABEL {
        if !sec.label.is_empty() {
            return Err("label");
        }
        return Ok(Some(0));
    }
    match buf.get(1) {
        Some(&n) if buf.len() >= 2 + usize::from(n) => {}
        _ => return Ok(None),
    }
    let (label, rest) = split_label(buf).map_err(wire)?;
    if label != sec.label {
        return Err("label");
    }
    Ok(Some(buf.len() - rest.len()))
}
