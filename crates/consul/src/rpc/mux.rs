//! The agent's RPC connection: ONE connection opened with the multiplex
//! byte `0x04` (after `0x03` + TLS for the TLS variant), yamux on it, and
//! each call on a yamux stream as net/rpc with Consul's msgpack codec. A
//! client agent keeps one stream for its own calls and one per blocking
//! query, reusing each for the next call, as Consul's `agent/pool` keeps
//! idle streams.
//!
//! The multiplexer is the `yamux` crate (libp2p's; the protocol hashicorp's
//! yamux defined and Consul speaks): maintained, window management done, no
//! task of its own (the session polls its connection). [`exchange`] is one
//! call on a stream: the request written, the whole answer read (bounded)
//! and split into its header and body.
//!
//! The session wakes for many things (a delivery on a stream, a timer);
//! the connection is driven only when it asked to be ([`Nudge`]: its
//! socket, a call's frames to send). Driven on every wake, the crate would
//! also send its round-trip ping (every 10 s while the connection is
//! polled) in the middle of a burst of deliveries, each a write and, on
//! loopback, the server's processing of it on the load box's core.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;
use futures_util::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_util::compat::{Compat, TokioAsyncReadCompatExt as _};

use super::{MessageScan, ResponseHeader, decode_header};
use crate::conn::{Counted, RpcIo};

/// First byte on a Consul RPC connection: yamux follows
/// (`pool.RPCMultiplexV2`).
pub const RPC_MULTIPLEX_V2: u8 = 0x04;

/// Largest answer read (a 5,000-instance result is 6.8 MiB of msgpack).
pub const MAX_ANSWER: usize = 64 << 20;

/// Streams one connection holds at most: the agent's own, and one per
/// watched service.
const MAX_STREAMS: usize = 64;

/// The socket under yamux (counted when the session counts bytes), its
/// writes gathered until yamux flushes: the crate writes a frame's header
/// and body apart, which would be two syscalls and two TCP segments a
/// frame where Consul's yamux sends one.
pub type MuxIo = Compat<agent_sim_net::Coalesced<Counted<RpcIo>>>;

/// yamux over the RPC connection.
pub struct Mux {
    conn: yamux::Connection<MuxIo>,
    /// The waker the connection is driven with.
    nudge: Arc<Nudge>,
}

/// The waker yamux is given: it notes that the connection asked to be
/// driven, then wakes the task that drives it.
#[derive(Debug)]
struct Nudge {
    asked: AtomicBool,
    task: AtomicWaker,
}

impl Nudge {
    /// Notes that the connection is to be driven at the next poll.
    fn ask(&self) {
        self.asked.store(true, Ordering::Release);
    }
}

impl Wake for Nudge {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.ask();
        self.task.wake();
    }
}

impl std::fmt::Debug for Mux {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Mux")
    }
}

/// How a call or the connection failed: a stable kind, and words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallError {
    /// Error kind (`rpc_error`, `conn_closed`, `answer_too_large`, ...).
    pub kind: &'static str,
    /// What happened, in the server's words when it said any.
    pub detail: String,
    /// Whose words `detail` is when the error itself tells (the OS's for a
    /// socket's error); `None`: as the kind declares.
    pub said_by: Option<agent_sim_net::Speaker>,
}

impl CallError {
    /// A failure of `kind`.
    pub fn new(kind: &'static str, detail: impl Into<String>) -> Self {
        CallError {
            kind,
            detail: detail.into(),
            said_by: None,
        }
    }

    /// A failure of `kind` in words that begin with `context` (may be
    /// empty) and end with `e`'s, whose they are told from `e`.
    pub fn of(kind: &'static str, context: &str, e: &(dyn std::error::Error + 'static)) -> Self {
        CallError {
            kind,
            detail: format!("{context}{e}"),
            said_by: agent_sim_net::speaker_of(e),
        }
    }
}

impl Mux {
    /// yamux in client mode on a connection whose `0x04` was written.
    pub fn client(io: Counted<RpcIo>) -> Self {
        let mut cfg = yamux::Config::default();
        cfg.set_max_num_streams(MAX_STREAMS);
        Mux {
            conn: yamux::Connection::new(
                agent_sim_net::Coalesced::new(io).compat(),
                cfg,
                yamux::Mode::Client,
            ),
            nudge: Arc::new(Nudge {
                asked: AtomicBool::new(true),
                task: AtomicWaker::new(),
            }),
        }
    }

    /// Drives the connection (frames in and out, window updates) when it
    /// asked to be since it was last driven (and the first time), waking
    /// `cx` when it next asks; `Ready` when it closed or failed. A stream
    /// the server opens is not expected and is dropped.
    pub fn poll_driver(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), CallError>> {
        self.nudge.task.register(cx.waker());
        if !self.nudge.asked.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        let waker = Waker::from(self.nudge.clone());
        let mut driven = Context::from_waker(&waker);
        loop {
            match self.conn.poll_next_inbound(&mut driven) {
                Poll::Ready(Some(Ok(_unexpected))) => continue,
                Poll::Ready(Some(Err(e))) => {
                    return Poll::Ready(Err(CallError::of("conn_error", "", &e)));
                }
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Opens a stream (lazily: its SYN goes with the first frame written).
    pub fn poll_open(&mut self, cx: &mut Context<'_>) -> Poll<Result<yamux::Stream, CallError>> {
        let opened = self.conn.poll_new_outbound(cx);
        if let Poll::Ready(Ok(_)) = &opened {
            // The driver takes a new stream's frames in only once polled:
            // yamux opens streams from the task that drives it.
            self.nudge.ask();
        }
        opened.map_err(|e| CallError::of("conn_error", "", &e))
    }

    /// A stream now, if the connection has room for one (a new stream is
    /// ready at once: its SYN goes with the first frame).
    pub fn open_now(&mut self) -> Option<Result<yamux::Stream, CallError>> {
        let waker = futures_util::task::noop_waker();
        match self.poll_open(&mut Context::from_waker(&waker)) {
            Poll::Ready(r) => Some(r),
            Poll::Pending => None,
        }
    }
}

/// A whole answer: its header, and its body's bytes.
#[derive(Debug)]
pub struct Reply {
    /// net/rpc's header (its `Error` is the server's words when not empty).
    pub header: ResponseHeader,
    /// The body (an empty struct when the server answered an error).
    pub body: Vec<u8>,
    /// The answer's size on the stream (header and body).
    pub bytes: usize,
}

/// One call's future: the stream comes back for the next call unless the
/// call broke it.
pub type Exchange =
    Pin<Box<dyn Future<Output = (Option<yamux::Stream>, Result<Reply, CallError>)> + Send>>;

/// Writes `request` (a header and arguments, the call `seq`) on `stream`
/// and reads the whole answer, at most `max` bytes. An answer to another
/// call, or bytes after it, break the stream.
pub fn exchange(mut stream: yamux::Stream, seq: u64, request: Vec<u8>, max: usize) -> Exchange {
    Box::pin(async move {
        if let Err(e) = async {
            stream.write_all(&request).await?;
            stream.flush().await
        }
        .await
        {
            let e = CallError::of("conn_error", "writing the call: ", &e);
            return (None, Err(e));
        }
        drop(request);
        match read_answer(&mut stream, seq, max).await {
            Ok((reply, clean)) => (clean.then_some(stream), Ok(reply)),
            Err(e) => (None, Err(e)),
        }
    })
}

/// Reads one answer to call `seq` (on a yamux stream, or on a connection
/// of its own: `AutoEncrypt.Sign`'s); whether the stream ended with it.
pub async fn read_answer<S: futures_util::AsyncRead + Unpin>(
    stream: &mut S,
    seq: u64,
    max: usize,
) -> Result<(Reply, bool), CallError> {
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 4 * 1024];
    let mut scan = MessageScan::default();
    loop {
        match scan.scan(&buf) {
            Err(e) => return Err(CallError::new(e.kind(), e.to_string())),
            Ok(Some((h, end))) => {
                let header = decode_header(&buf[..h])
                    .map_err(|e| CallError::new(e.kind(), e.to_string()))?;
                if header.seq != seq {
                    return Err(CallError::new(
                        "decode_answer",
                        format!("an answer to call {} where {seq} was asked", header.seq),
                    ));
                }
                // Bytes after the answer would belong to no call.
                let clean = end == buf.len();
                buf.truncate(end);
                let body = buf.split_off(h);
                return Ok((
                    Reply {
                        header,
                        body,
                        bytes: end,
                    },
                    clean,
                ));
            }
            Ok(None) => {}
        }
        if buf.len() > max {
            return Err(CallError::new(
                "answer_too_large",
                format!("an answer over {} KiB", max >> 10),
            ));
        }
        match stream.read(&mut chunk).await {
            Ok(0) => {
                return Err(CallError::new(
                    "stream_end",
                    "the server closed the call's stream",
                ));
            }
            Ok(n) => {
                if buf.is_empty() && n == chunk.len() {
                    // A big answer: read it in bigger pieces.
                    chunk.resize(16 * 1024, 0);
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            Err(e) => return Err(CallError::of("conn_error", "", &e)),
        }
    }
}
