//! The agent's RPC connection in a session: what a client agent's pool
//! holds toward its server (`0x04`, yamux), shared by the agent's own calls
//! (one stream they take turns on, as the pool reuses an idle stream) and
//! its blocking queries (a stream each). The session's loop drives the
//! connection; the calls of the upkeep borrow the call stream for one call
//! at a time ([`CallLine`]).

use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;

use agent_sim_fleet::{BoxFuture, SessionCx, SessionEnd};
use agent_sim_net::RxStamp;
use tokio::time::Instant;

use super::{ConsulAgent, Shared};
use crate::conn::{self, Counted};
use crate::rpc::mux::{CallError, Exchange, Mux, RPC_MULTIPLEX_V2, Reply, exchange};

/// Largest answer to an agent's own call: a node's services and checks
/// (≈1 KiB each as Consul writes them; 256 KiB is a node with ~100
/// sidecars). Over it: `answer_too_large`.
pub(super) const MAX_AGENT_ANSWER: usize = 256 << 10;

/// Longest an agent's own call waits for its answer (none of them blocks
/// on the server): a connection that went silent fails the call instead of
/// holding the upkeep, as a real agent's pool gives up on a dead one.
pub(super) const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The stream of the agent's own calls, their sequence numbers, and
/// whether the server ever answered one on this connection.
#[derive(Default)]
pub(super) struct Line {
    stream: Option<yamux::Stream>,
    /// A call holds the stream (a new one opened meanwhile would be
    /// dropped unused when it comes back: a reset for a stream the server
    /// never saw).
    busy: bool,
    seq: u64,
    answered: bool,
}

/// Shared by the session (which opens the stream) and the call in flight
/// (which borrows it).
pub(super) type CallLine = Arc<Mutex<Line>>;

/// The RPC connection of one session.
pub(super) struct Link {
    pub(super) mux: Mux,
    pub(super) line: CallLine,
    /// Kernel receive stamps of the connection.
    pub(super) stamp: Option<RxStamp>,
    /// The server it is connected to.
    pub(super) server: usize,
}

impl Link {
    /// `call` on this connection while no session drives it (a rebalance's
    /// check of a server): the connection polled beside the call.
    pub(super) async fn driving<T>(
        &mut self,
        call: impl Future<Output = Result<T, CallError>>,
    ) -> Result<T, CallError> {
        let mut call = std::pin::pin!(call);
        std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = call.as_mut().poll(cx) {
                return Poll::Ready(r);
            }
            self.mux.poll_driver(cx).map(|r| {
                r.and(Err(CallError::new(
                    "conn_closed",
                    "the connection closed under the call",
                )))
            })
        })
        .await
    }

    /// Gives the call line a stream when it has none (the first call, or
    /// after a call broke its stream).
    pub(super) fn refill(&mut self) -> Result<(), CallError> {
        let mut line = self.line.lock().unwrap_or_else(PoisonError::into_inner);
        if line.stream.is_none()
            && !line.busy
            && let Some(opened) = self.mux.open_now()
        {
            line.stream = Some(opened?);
        }
        Ok(())
    }
}

/// The next call on `line`: `request` written by `encode` with the call's
/// sequence number; `None` while no stream is there (the session opens
/// one before the next turn).
pub(super) fn call(line: &CallLine, encode: impl FnOnce(u64, &mut Vec<u8>)) -> Option<Exchange> {
    let (stream, seq) = {
        let mut l = line.lock().unwrap_or_else(PoisonError::into_inner);
        let stream = l.stream.take()?;
        l.busy = true;
        l.seq += 1;
        (stream, l.seq)
    };
    let mut req = Vec::with_capacity(512);
    encode(seq, &mut req);
    Some(exchange(stream, seq, req, MAX_AGENT_ANSWER))
}

/// Puts a stream a call gave back where the next call finds it (none: the
/// call broke it, and the session opens another).
pub(super) fn give_back(line: &CallLine, stream: Option<yamux::Stream>) {
    let mut l = line.lock().unwrap_or_else(PoisonError::into_inner);
    l.busy = false;
    if stream.is_some() {
        l.stream = stream;
    }
}

/// The agent's own methods, each timed in a latency of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Rpc {
    Register,
    NodeServices,
    NodeChecks,
    SessionApply,
    SessionRenew,
    CoordinateUpdate,
    StatusPing,
    ConnectSign,
}

impl Rpc {
    /// The method as the server names it.
    pub(super) fn method(self) -> &'static str {
        use crate::rpc::{catalog, connect_ca, coordinate, session};
        match self {
            Rpc::Register => catalog::REGISTER,
            Rpc::NodeServices => catalog::NODE_SERVICE_LIST,
            Rpc::NodeChecks => catalog::NODE_CHECKS,
            Rpc::SessionApply => session::APPLY,
            Rpc::SessionRenew => session::RENEW,
            Rpc::CoordinateUpdate => coordinate::UPDATE,
            Rpc::StatusPing => crate::rpc::PING,
            Rpc::ConnectSign => connect_ca::SIGN,
        }
    }
}

/// Counts a call the server refused for the caller's token (beside the
/// error the caller counts).
pub(super) fn count_denial(metrics: &agent_sim_metrics::Metrics, kind: &str, method: &str) {
    if matches!(kind, "acl_denied" | "acl_not_found") {
        metrics.denied(method);
    }
}

/// The next sequence number of the connection's calls (a call on a
/// stream of its own counts in the same sequence, as the agent's pool
/// numbers them).
pub(super) fn next_seq(line: &CallLine) -> u64 {
    let mut l = line.lock().unwrap_or_else(PoisonError::into_inner);
    l.seq += 1;
    l.seq
}

/// Who calls on the line: the fleet's shared state (metrics) and the
/// agent's shard key.
pub(super) struct Caller {
    pub(super) line: CallLine,
    pub(super) sh: Arc<Shared>,
    pub(super) key: usize,
}

impl Caller {
    /// A connection that broke before the server answered any call on it
    /// was closed at once: what a server's per-client connection cap does.
    fn closed_at_once(&self, e: CallError) -> CallError {
        let answered = self
            .line
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .answered;
        match e.kind {
            "conn_error" | "stream_end" | "conn_closed" if !answered => CallError::new(
                "rpc_closed_at_once",
                format!(
                    "the server closed the connection right after accepting it, without \
                     sending a byte ({}: {})",
                    e.kind, e.detail
                ),
            ),
            _ => e,
        }
    }

    /// A call to its end, timed under its method: the answer, the server's
    /// error words as a failure of their kind, or what broke.
    pub(super) async fn call(
        &self,
        method: Rpc,
        encode: impl FnOnce(u64, &mut Vec<u8>),
    ) -> Result<Reply, CallError> {
        let Some(call) = call(&self.line, encode) else {
            return Err(CallError::new("conn_closed", "no stream for the call"));
        };
        let start = Instant::now();
        let Ok((stream, reply)) = tokio::time::timeout(CALL_TIMEOUT, call).await else {
            // The stream went with the call: the next call opens another.
            give_back(&self.line, None);
            return Err(CallError::new(
                "rpc_timeout",
                format!("no answer within {}s", CALL_TIMEOUT.as_secs()),
            ));
        };
        give_back(&self.line, stream);
        let reply = reply.map_err(|e| self.closed_at_once(e))?;
        self.line
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .answered = true;
        self.sh
            .metrics
            .record(self.sh.ids.rpc[method as usize], self.key, start.elapsed());
        if reply.header.error.is_empty() {
            Ok(reply)
        } else {
            let kind = crate::http::cause_kind(&reply.header.error).unwrap_or("rpc_error");
            count_denial(&self.sh.metrics, kind, method.method());
            Err(CallError::new(kind, reply.header.error))
        }
    }
}

impl ConsulAgent {
    /// Dials the agent's server's RPC port with `0x04` and starts yamux on
    /// it (within the session's connect budget); its bytes count as the
    /// watches' when blocking queries share it (`watching`). After a
    /// rebalance, the connection it checked the server on. Boxed, as the
    /// connect step is: the session future stays small.
    pub(super) fn open_link<'a>(
        &'a mut self,
        cx: &'a SessionCx,
        server: usize,
        watching: bool,
    ) -> BoxFuture<'a, Result<Box<Link>, SessionEnd>> {
        if let Some(checked) = self.moved_link.take()
            && checked.server == server
        {
            return Box::pin(std::future::ready(Ok(checked)));
        }
        Box::pin(self.link_of(cx, server, watching))
    }

    async fn link_of(
        &self,
        cx: &SessionCx,
        server: usize,
        watching: bool,
    ) -> Result<Box<Link>, SessionEnd> {
        let sh = &self.shared;
        let t = Instant::now();
        let (io, stamp) =
            conn::within_session(cx, sh.dialers[server].open(cx.bind_addr, RPC_MULTIPLEX_V2))
                .await?;
        sh.metrics
            .record(sh.ids.connect, self.index as usize, t.elapsed());
        new_link(sh, io, stamp, watching, server)
            .map_err(|e| SessionEnd::lost_with(e.kind, e.detail))
    }

    /// The RPC connection dialed again inside a session (a client agent's
    /// pool dials when a call needs a connection): to the server in front
    /// of the router (the session's, unless a failed call moved it), within
    /// the connect budget, from the session's source address.
    pub(super) fn redial(
        &self,
        bind: Option<std::net::IpAddr>,
    ) -> BoxFuture<'static, Result<Box<Link>, CallError>> {
        self.dial_link(self.router.current(), bind, false)
    }

    /// The RPC connection to `server`, dialed from `bind` within the
    /// connect budget; its bytes count as the watches' when blocking
    /// queries will share it (`watching`).
    pub(super) fn dial_link(
        &self,
        server: usize,
        bind: Option<std::net::IpAddr>,
        watching: bool,
    ) -> BoxFuture<'static, Result<Box<Link>, CallError>> {
        let sh = self.shared.clone();
        let key = self.index as usize;
        Box::pin(async move {
            let t = Instant::now();
            let dial = sh.dialers[server].open(bind, RPC_MULTIPLEX_V2);
            let (io, stamp) = match tokio::time::timeout(conn::CONNECT_TIMEOUT, dial).await {
                Err(_) => return Err(CallError::new("connect_timeout", "no RPC connection")),
                Ok(Err(e)) => {
                    return Err(CallError {
                        said_by: e.said_by(),
                        ..CallError::new(e.kind(), e.to_string())
                    });
                }
                Ok(Ok(c)) => c,
            };
            sh.metrics.record(sh.ids.connect, key, t.elapsed());
            new_link(&sh, io, stamp, watching, server)
        })
    }
}

/// yamux on a dialed RPC connection to `server`, with a stream for the
/// agent's calls.
fn new_link(
    sh: &Shared,
    io: crate::conn::RpcIo,
    stamp: Option<RxStamp>,
    watching: bool,
    server: usize,
) -> Result<Box<Link>, CallError> {
    let mut link = Box::new(Link {
        mux: Mux::client(Counted::new(io, Some(sh.bytes(watching)))),
        line: CallLine::default(),
        stamp,
        server,
    });
    link.refill()?;
    Ok(link)
}
