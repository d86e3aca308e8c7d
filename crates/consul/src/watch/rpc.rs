//! What a Consul client agent with streaming off does on the server RPC
//! port: ONE connection opened with the multiplex byte `0x04` (after
//! `0x03` + TLS for the TLS variant), yamux on it, and each call a yamux
//! stream carrying net/rpc with Consul's msgpack codec. An agent keeps one
//! stream per watched service and reuses it for the next call, as Consul's
//! `agent/pool` keeps idle streams.
//!
//! The multiplexer is the `yamux` crate (libp2p's; the protocol hashicorp's
//! yamux defined and Consul speaks): maintained, window management and
//! pings done, no task of its own (the session polls its connection).
//! Msgpack is `rmp`/`rmp-serde` (see [`super::msgpack`]).

use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_util::compat::{Compat, TokioAsyncReadCompatExt as _};

use super::digest::Digest;
use super::msgpack::{self, ServiceNodesArgs};
use crate::conn::RpcIo;

/// First byte on a Consul RPC connection: yamux follows
/// (`pool.RPCMultiplexV2`).
pub const RPC_MULTIPLEX_V2: u8 = 0x04;

/// Largest answer read (a 5,000-instance result is 6.8 MiB of msgpack).
pub const MAX_ANSWER: usize = 64 << 20;

/// The socket under yamux (counted when the session counts bytes).
pub type MuxIo = Compat<crate::conn::Counted<RpcIo>>;

/// yamux over the RPC connection.
pub struct Mux {
    conn: yamux::Connection<MuxIo>,
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
}

impl CallError {
    fn new(kind: &'static str, detail: impl Into<String>) -> Self {
        CallError {
            kind,
            detail: detail.into(),
        }
    }
}

impl Mux {
    /// yamux in client mode on a connection whose `0x04` was written.
    pub fn client(io: crate::conn::Counted<RpcIo>) -> Self {
        let mut cfg = yamux::Config::default();
        // One stream per watched service, a few in flight at most.
        cfg.set_max_num_streams(64);
        Mux {
            conn: yamux::Connection::new(io.compat(), cfg, yamux::Mode::Client),
        }
    }

    /// Drives the connection (frames in and out, window updates, pings);
    /// `Ready` when it closed or failed. A stream the server opens is
    /// not expected and is dropped.
    pub fn poll_driver(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), CallError>> {
        loop {
            match self.conn.poll_next_inbound(cx) {
                Poll::Ready(Some(Ok(_unexpected))) => continue,
                Poll::Ready(Some(Err(e))) => {
                    return Poll::Ready(Err(CallError::new("conn_error", e.to_string())));
                }
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Opens a stream (lazily: its SYN goes with the first frame written).
    pub fn poll_open(&mut self, cx: &mut Context<'_>) -> Poll<Result<yamux::Stream, CallError>> {
        self.conn
            .poll_new_outbound(cx)
            .map_err(|e| CallError::new("conn_error", e.to_string()))
    }
}

/// What one call brought back.
#[derive(Debug)]
pub struct Answer {
    /// The result, or the error the server answered with.
    pub result: Result<Digest, CallError>,
    /// The answer's size (its msgpack: header and body).
    pub bytes: usize,
}

/// A call's future: the stream comes back for the next call unless the
/// call broke it.
pub type CallFuture = Pin<
    Box<
        dyn std::future::Future<Output = (Option<yamux::Stream>, Result<Answer, CallError>)> + Send,
    >,
>;

/// One `Health.ServiceNodes` call on `stream` with sequence number `seq`.
pub fn call(mut stream: yamux::Stream, seq: u64, args: ServiceNodesArgs<'_>) -> CallFuture {
    let mut req = Vec::with_capacity(512);
    msgpack::encode_request(seq, &args, &mut req);
    Box::pin(async move {
        if let Err(e) = async {
            stream.write_all(&req).await?;
            stream.flush().await
        }
        .await
        {
            return (
                None,
                Err(CallError::new(
                    "conn_error",
                    format!("writing the call: {e}"),
                )),
            );
        }
        drop(req);
        let mut buf: Vec<u8> = Vec::new();
        let mut chunk = vec![0u8; 16 * 1024];
        // Where the header ends, once known; both scans resume per chunk.
        let mut header_end = None;
        let mut head = msgpack::Scanner::default();
        let mut body = msgpack::Scanner::default();
        loop {
            let mut complete = || -> Result<Option<usize>, msgpack::MsgpackError> {
                let h = match header_end {
                    Some(h) => h,
                    None => match head.scan(&buf)? {
                        Some(h) => {
                            header_end = Some(h);
                            h
                        }
                        None => return Ok(None),
                    },
                };
                Ok(body.scan(&buf[h..])?.map(|b| h + b))
            };
            let complete = complete();
            match complete {
                Err(e) => return (None, Err(CallError::new("decode_answer", e.to_string()))),
                Ok(Some(end)) => {
                    let h = header_end.unwrap_or(end);
                    let bytes = end;
                    let result = match msgpack::decode_response(&buf[..h], &buf[h..end]) {
                        Err(e) => {
                            return (None, Err(CallError::new("decode_answer", e.to_string())));
                        }
                        Ok((hdr, _)) if hdr.seq != seq => {
                            return (
                                None,
                                Err(CallError::new(
                                    "decode_answer",
                                    format!("an answer to call {} where {seq} was asked", hdr.seq),
                                )),
                            );
                        }
                        Ok((hdr, None)) => Err(CallError::new(
                            crate::http::cause_kind(&hdr.error).unwrap_or("rpc_error"),
                            hdr.error,
                        )),
                        Ok((_, Some(d))) => Ok(d),
                    };
                    // Bytes after the answer would belong to no call.
                    let stream = (end == buf.len()).then_some(stream);
                    return (stream, Ok(Answer { result, bytes }));
                }
                Ok(None) => {}
            }
            if buf.len() > MAX_ANSWER {
                return (
                    None,
                    Err(CallError::new(
                        "answer_too_large",
                        format!("an answer over {} MiB", MAX_ANSWER >> 20),
                    )),
                );
            }
            match stream.read(&mut chunk).await {
                Ok(0) => {
                    return (
                        None,
                        Err(CallError::new(
                            "stream_end",
                            "the server closed the call's stream",
                        )),
                    );
                }
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) => return (None, Err(CallError::new("conn_error", e.to_string()))),
            }
        }
    })
}
