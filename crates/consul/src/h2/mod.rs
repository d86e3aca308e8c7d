//! A lean HTTP/2 client for the gRPC streams simulated agents hold: a
//! Consul client agent's Subscribe calls on its streaming connection (the
//! RPC port after `0x08`, each server-streaming) and a dataplane sidecar's
//! calls on the gRPC port (a unary bootstrap call, the bidirectional Delta
//! xDS stream, the server-streaming `WatchServers`).
//!
//! Why not hyper and h2: their connection costs ≈39 KiB per agent before a
//! stream carries a byte (h2's 16 KiB write buffer, an 8 KiB read buffer,
//! the HPACK tables, the tasks hyper spawns; measured with heaptrack at
//! 2,000 agents, BENCHMARKS.md), more than the rest of the agent together.
//! [`Conn`] holds no buffer while idle: bytes read are parsed where they
//! lie and kept only while a frame is incomplete, writes are gathered for
//! one flush and freed with it, and the server's header tables are
//! announced as 0 octets. It runs inside the session's own task (polled
//! by the session loop), so it spawns nothing and needs no timer of its
//! own: the keepalive's deadline is the loop's ([`Conn::keepalive_due`]).
//!
//! What it does: the preface and settings, calls with request metadata,
//! a call's requests as gRPC messages (one and half-closed for a unary or
//! server-streaming call; any number on an open stream for a bidirectional
//! one, `send`), the server's messages split from DATA frames (several per
//! frame, or one over many frames), flow control both ways (a window update
//! once a quarter of a window is read; requests framed to the server's
//! stream and connection windows and its initial window setting, held
//! only while a window is closed), the response's headers and trailers
//! (grpc-status, grpc-message), resets both ways, PING answers and
//! keepalive pings, GOAWAY. What it is not: a general client. No server
//! push (it is refused in the settings), no priorities, no compression.
//!
//! Parts: [`frame`] (bytes of frames), [`hpack`] (header blocks),
//! `huffman` (HPACK's string code), `recv` (what the server's frames do),
//! `send` (opening calls and framing their requests to the windows).

pub mod frame;
pub mod hpack;
mod huffman;
mod recv;
mod send;
#[cfg(test)]
mod tests;

use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;
use tonic::Status;

/// What the connection brought, for the call tagged `usize` (the caller's
/// own number for the call, given to [`Conn::start`]).
#[derive(Debug)]
pub enum Got<T> {
    /// The server answered the call with its headers (status 200).
    Started(usize),
    /// One message of the call, as the decoder made it.
    Message(usize, T),
    /// The call ended: the server's status (OK for a clean end), or a
    /// reset (a status with a source: [`StreamReset`]).
    Ended(usize, Status),
    /// The connection ended; every call on it with it.
    Closed(ConnError),
}

/// Why the connection ended.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    /// The server closed the connection.
    #[error("the server closed the connection")]
    Eof,
    /// The server said GOAWAY (and closed, or broke the protocol after).
    #[error("the server sent GOAWAY ({}{})", frame::reason(*.code), debug_words(.debug))]
    GoAway {
        /// Its error code.
        code: u32,
        /// Its debug data.
        debug: String,
    },
    /// Reading or writing the socket failed.
    #[error("the connection failed: {0}")]
    Io(#[source] std::io::Error),
    /// A frame over the largest size the client allows.
    #[error("the server sent a frame of {len} octets (type {kind}), over {max}", max = frame::MAX_FRAME)]
    FrameSize {
        /// Its type.
        kind: u8,
        /// Its payload length.
        len: usize,
    },
    /// A frame the protocol does not allow here (a push, a continuation
    /// out of place, data or headers on stream 0, a malformed frame).
    #[error("the server broke HTTP/2: {0}")]
    Protocol(&'static str),
    /// A header block the decoder refused.
    #[error(transparent)]
    Hpack(#[from] hpack::HpackError),
    /// A keepalive ping went unanswered.
    #[error("no answer to a keepalive ping in {0:?}")]
    KeepaliveTimeout(Duration),
}

fn debug_words(debug: &str) -> String {
    if debug.is_empty() {
        String::new()
    } else {
        format!(": {debug}")
    }
}

impl ConnError {
    /// The kind a session counts: `conn_closed` (the server closed, or
    /// went away without an error), `keepalive_timeout`, else `conn_error`.
    pub fn kind(&self) -> &'static str {
        match self {
            ConnError::Eof | ConnError::GoAway { code: 0, .. } => "conn_closed",
            ConnError::KeepaliveTimeout(_) => "keepalive_timeout",
            _ => "conn_error",
        }
    }
}

/// The server reset a stream: the source of the status a reset ends a
/// call with (so it reads as the transport's, not as an answer).
#[derive(Debug, thiserror::Error)]
#[error("the server reset the stream ({})", frame::reason(*.0))]
pub struct StreamReset(pub u32);

/// The `user-agent` of every call.
pub const USER_AGENT: &str = concat!("agent-sim/", env!("CARGO_PKG_VERSION"));

/// Keepalive: a ping once nothing was read for `interval` while calls are
/// open, the connection lost when its answer takes over `timeout`.
#[derive(Debug, Clone, Copy)]
pub struct Keepalive {
    /// Idle time before a ping.
    pub interval: Duration,
    /// How long a ping's answer may take.
    pub timeout: Duration,
}

/// One call on the connection.
#[derive(Debug)]
struct Stream {
    id: u32,
    tag: usize,
    /// The response headers came.
    started: bool,
    /// Octets read on it since the last window update.
    unacked: u32,
    /// A message split over frames, while it is incomplete (its 5-octet
    /// prefix first).
    msg: Vec<u8>,
    /// What the server's windows let the client send on it.
    send_window: i64,
    /// Requests (framed as gRPC messages) waiting for a window; empty, and
    /// holding nothing, while the windows are open.
    out: Vec<u8>,
    /// The client's requests are over: END_STREAM once `out` is sent.
    closing: bool,
    /// END_STREAM went out.
    end_sent: bool,
}

/// The rest of a DATA frame being split into messages: its stream, where
/// its payload lies in the read buffer, whether it ends the stream.
#[derive(Debug, Clone, Copy)]
struct Data {
    id: u32,
    at: usize,
    end: usize,
    end_stream: bool,
}

/// A header block waiting for its CONTINUATION frames.
#[derive(Debug)]
struct Continued {
    id: u32,
    end_stream: bool,
    block: Vec<u8>,
}

/// Ping payload of the client's keepalive.
const PING_OPAQUE: [u8; 8] = *b"agentsim";
/// A window update is sent once this much of a window was read.
const UPDATE_AT: u32 = frame::INITIAL_WINDOW / 4;
/// Largest header block (headers or trailers) accepted, as announced:
/// 16 KiB, hyper's client default. Consul's are a few hundred octets.
pub const MAX_HEADER_LIST: u32 = 16 * 1024;
/// Octets read from the socket at once (on the stack: only what is left
/// of an incomplete frame is kept).
const READ_CHUNK: usize = 8192;

/// One client connection. Poll it with [`Conn::poll_next`] for anything
/// to happen (writes go out there too).
pub struct Conn<IO> {
    io: IO,
    /// Bytes read and not yet parsed (from `rpos`); empty when idle.
    rbuf: Vec<u8>,
    rpos: usize,
    /// Bytes to write (from `wpos`); empty when idle.
    wbuf: Vec<u8>,
    wpos: usize,
    /// Written and not yet flushed.
    unflushed: bool,
    hpack: hpack::Decoder,
    streams: Vec<Stream>,
    next_id: u32,
    data: Option<Data>,
    continued: Option<Box<Continued>>,
    conn_unacked: u32,
    /// What the server's connection window lets the client send.
    send_window: i64,
    /// The server's SETTINGS_INITIAL_WINDOW_SIZE: a new call's window.
    peer_window: u32,
    keepalive: Keepalive,
    last_read: Instant,
    ping_sent: Option<Instant>,
    /// What the server's GOAWAY said (the connection's end, once it closes).
    going_away: Option<ConnError>,
    /// Calls that end at once (refused before they were sent).
    refused: Vec<(usize, Status)>,
    /// The connection's end, once known.
    ended: Option<ConnError>,
    /// The end was told to the caller.
    told: bool,
    max_message: usize,
    /// `:authority` of the calls.
    authority: Box<str>,
}

impl<IO> std::fmt::Debug for Conn<IO> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("streams", &self.streams.len())
            .field("next_id", &self.next_id)
            .finish()
    }
}

impl<IO> Conn<IO> {
    /// A connection on `io`; the preface and the client's settings go out
    /// with the first poll. Messages over `max_message` octets end their
    /// call.
    pub fn new(io: IO, authority: &str, keepalive: Keepalive, max_message: usize) -> Self {
        let mut wbuf = Vec::with_capacity(frame::PREFACE.len() + 9 + 18);
        wbuf.extend_from_slice(frame::PREFACE);
        frame::put_settings(
            &mut wbuf,
            &[
                (frame::SETTINGS_HEADER_TABLE_SIZE, 0),
                (frame::SETTINGS_ENABLE_PUSH, 0),
                (frame::SETTINGS_MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST),
            ],
        );
        Conn {
            io,
            rbuf: Vec::new(),
            rpos: 0,
            wbuf,
            wpos: 0,
            unflushed: false,
            hpack: hpack::Decoder::default(),
            streams: Vec::new(),
            next_id: 1,
            data: None,
            continued: None,
            conn_unacked: 0,
            send_window: i64::from(frame::INITIAL_WINDOW),
            peer_window: frame::INITIAL_WINDOW,
            keepalive,
            last_read: Instant::now(),
            ping_sent: None,
            going_away: None,
            refused: Vec::new(),
            ended: None,
            told: false,
            max_message,
            authority: authority.into(),
        }
    }

    /// Starts a call of `path` tagged `tag` with one request message,
    /// `encode` appending its bytes, the requests ended with it (a unary or
    /// server-streaming call); a call of the same tag still open is
    /// cancelled. A connection going away refuses the call (it ends with
    /// `UNAVAILABLE` at the next poll).
    pub fn start(&mut self, tag: usize, path: &str, encode: impl FnOnce(&mut Vec<u8>)) {
        self.start_with(tag, path, &[], encode);
    }

    /// [`Conn::start`] with `metadata` (see [`Conn::open`]).
    pub fn start_with(
        &mut self,
        tag: usize,
        path: &str,
        metadata: &[(&str, &str)],
        encode: impl FnOnce(&mut Vec<u8>),
    ) {
        if self.open(tag, path, metadata) {
            self.push(tag, encode, true);
        }
    }

    /// Cancels the open call tagged `tag`, if any (RST_STREAM CANCEL).
    pub fn cancel(&mut self, tag: usize) {
        if let Some(i) = self.streams.iter().position(|s| s.tag == tag) {
            let s = self.remove(i);
            frame::put_word(&mut self.wbuf, frame::RST_STREAM, s.id, frame::CANCEL);
        }
    }

    /// Takes call `i` off the connection, and the rest of its DATA frame
    /// if one is in hand.
    fn remove(&mut self, i: usize) -> Stream {
        let s = self.streams.swap_remove(i);
        if self.data.is_some_and(|d| d.id == s.id) {
            self.data = None;
        }
        s
    }

    /// When the keepalive needs the loop's timer: a ping due, or the
    /// answer's deadline (`None` with no call open).
    pub fn keepalive_due(&self) -> Option<Instant> {
        if self.streams.is_empty() || self.ended.is_some() {
            return None;
        }
        Some(match self.ping_sent {
            Some(at) => at + self.keepalive.timeout,
            None => self.last_read + self.keepalive.interval,
        })
    }

    /// The loop's timer fired at `now`: ping, or give up on the ping.
    pub fn on_timer(&mut self, now: Instant) {
        let Some(due) = self.keepalive_due() else {
            return;
        };
        if now < due {
            return;
        }
        match self.ping_sent {
            Some(_) => self.ended = Some(ConnError::KeepaliveTimeout(self.keepalive.timeout)),
            None => {
                frame::put_ping(&mut self.wbuf, false, PING_OPAQUE);
                self.ping_sent = Some(now);
            }
        }
    }

    /// Octets held by the connection's buffers (tests and benchmarks).
    pub fn held(&self) -> usize {
        let calls: usize = self
            .streams
            .iter()
            .map(|s| s.msg.capacity() + s.out.capacity())
            .sum();
        self.rbuf.capacity() + self.wbuf.capacity() + calls
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> Conn<IO> {
    /// Writes the preface and settings now (the connect step: a socket
    /// that fails here fails the connect).
    pub async fn handshake(&mut self) -> Result<(), std::io::Error> {
        std::future::poll_fn(|cx| self.poll_write_all(cx)).await
    }

    /// The next thing the connection brought, `decode` making each message
    /// of a call. After [`Got::Closed`] it stays pending.
    pub fn poll_next<T>(
        &mut self,
        cx: &mut Context<'_>,
        decode: &mut impl FnMut(usize, &[u8]) -> T,
    ) -> Poll<Got<T>> {
        loop {
            if self.told {
                return Poll::Pending;
            }
            if let Some((tag, status)) = self.refused.pop() {
                return Poll::Ready(Got::Ended(tag, status));
            }
            if let Poll::Ready(Err(e)) = self.poll_write_all(cx) {
                self.ended.get_or_insert(ConnError::Io(e));
            }
            if let Some(e) = self.ended.take() {
                self.told = true;
                return Poll::Ready(Got::Closed(e));
            }
            if let Some(got) = self.next_message(decode) {
                return Poll::Ready(got);
            }
            match self.next_frame() {
                Ok(recv::Step::Got(got)) => return Poll::Ready(got),
                Ok(recv::Step::Handled) => continue,
                Ok(recv::Step::NeedBytes) => {}
                Err(e) => {
                    self.ended = Some(e);
                    continue;
                }
            }
            match self.poll_fill(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => self.ended = Some(e),
            }
        }
    }

    /// Reads once from the socket into the buffer (after dropping what was
    /// parsed). End of file is the connection's end.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnError>> {
        let mut chunk = [0u8; READ_CHUNK];
        let mut rb = ReadBuf::new(&mut chunk);
        if self.rpos == self.rbuf.len() {
            // Nothing left to parse: an idle connection keeps no buffer.
            self.rbuf = Vec::new();
            self.rpos = 0;
        }
        match Pin::new(&mut self.io).poll_read(cx, &mut rb) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(e)) => Poll::Ready(Err(ConnError::Io(e))),
            Poll::Ready(Ok(())) if rb.filled().is_empty() => {
                Poll::Ready(Err(self.going_away.take().unwrap_or(ConnError::Eof)))
            }
            Poll::Ready(Ok(())) => {
                self.last_read = Instant::now();
                self.ping_sent = None;
                if self.rpos > 0 {
                    self.rbuf.drain(..self.rpos);
                    self.rpos = 0;
                }
                self.rbuf.extend_from_slice(rb.filled());
                Poll::Ready(Ok(()))
            }
        }
    }

    /// Writes what is queued, then flushes; the buffer is freed once
    /// written.
    fn poll_write_all(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), std::io::Error>> {
        while self.wpos < self.wbuf.len() {
            match Pin::new(&mut self.io).poll_write(cx, &self.wbuf[self.wpos..]) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(n)) => self.wpos += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            }
        }
        if !self.wbuf.is_empty() {
            self.wbuf = Vec::new();
            self.wpos = 0;
            self.unflushed = true;
        }
        if self.unflushed {
            ready!(Pin::new(&mut self.io).poll_flush(cx))?;
            self.unflushed = false;
        }
        Poll::Ready(Ok(()))
    }
}
