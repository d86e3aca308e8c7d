//! A follower's RPC port (`serve --consul-leader`): the agents' RPC
//! connections end here and what they carry goes on to the leader's RPC
//! port, the way a Consul follower forwards its clients' calls to the
//! leader over a connection pool of its own. A yamux stream an agent opens
//! (`0x04`) becomes a stream on one of a few yamux links to the leader, its
//! bytes copied both ways; a gRPC request (`0x08`, a Subscribe) becomes a
//! request on one of a few HTTP/2 links, its answer streamed back as it
//! comes. So the leader holds a few connections for thousands of agents,
//! and one catalog serves more agents than one process has descriptors
//! for: each follower holds its own agents' two connections.
//!
//! Bounds: a link carries at most [`RelayConfig::streams_per_link`]
//! streams at once (a new link is dialled past that, one dial at a time);
//! a dial to the leader waits at most [`DIAL_TIMEOUT`]; what the leader
//! cannot be reached for is refused (the agent's stream closed, its gRPC
//! call answered `UNAVAILABLE`) and counted, never retried here.
//! Not relayed: TLS (`0x03`), auto-encrypt (`0x07`), the HTTP API and the
//! serf port (agents join the leader's).

use std::future::{Future, poll_fn};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, Uri};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http2 as client_h2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use serde::Serialize;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio_util::compat::{FuturesAsyncReadCompatExt as _, TokioAsyncReadCompatExt as _};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::conn::{drive_connection, h2_builder};
use super::mux::RPC_MULTIPLEX_V2;
use super::rpc::RPC_GRPC;

/// How long a dial to the leader may take before the call it is for is
/// refused.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an agent's connection gets to send its first byte.
const PREFIX_TIMEOUT: Duration = Duration::from_secs(10);
/// Streams an agent's yamux connection may hold at once (the leader's own
/// bound per connection).
const AGENT_STREAMS: usize = 1024;
/// Each direction's buffer of a relayed stream: calls and their answers
/// are ≈0.1-2 KiB, and a relay holds one stream per agent.
const COPY_BUF: usize = 4 * 1024;
/// How long the relay waits for its connections after shutdown.
const GRACE: Duration = Duration::from_secs(2);

/// What a follower relays to.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// The leader's RPC port.
    pub leader: SocketAddr,
    /// Most streams one link to the leader carries at once; the leader
    /// takes up to 1,024 on a connection.
    pub streams_per_link: usize,
}

impl RelayConfig {
    /// Relays to `leader`, at most 512 streams a link.
    pub fn new(leader: SocketAddr) -> Self {
        Self {
            leader,
            streams_per_link: 512,
        }
    }
}

/// The relay's counters (totals, and the `_open` levels).
#[derive(Debug, Default)]
pub struct RelayCounters {
    accept_errors: AtomicU64,
    connections: AtomicU64,
    connections_open: AtomicU64,
    refused_prefix: AtomicU64,
    mux_streams: AtomicU64,
    grpc_requests: AtomicU64,
    links_opened: AtomicU64,
    links_open: AtomicU64,
    link_failures: AtomicU64,
}

/// A snapshot of [`RelayCounters`].
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct RelaySnapshot {
    /// Agents' connections accepted.
    pub connections: u64,
    /// Of them, open now.
    pub connections_open: u64,
    /// Connections closed for a first byte that is not `0x04` or `0x08`
    /// (TLS and auto-encrypt are not relayed).
    pub refused_prefix: u64,
    /// yamux streams relayed (one per call an agent makes).
    pub mux_streams: u64,
    /// gRPC requests relayed (Subscribe streams).
    pub grpc_requests: u64,
    /// Links to the leader dialled (yamux and HTTP/2).
    pub links_opened: u64,
    /// Of them, open now.
    pub links_open: u64,
    /// Streams and requests refused because the leader could not be
    /// reached (a dial that failed or timed out, a link that broke).
    pub link_failures: u64,
    /// Accepts that failed.
    pub accept_errors: u64,
}

impl RelayCounters {
    /// What the counters say now.
    pub fn snapshot(&self) -> RelaySnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        RelaySnapshot {
            connections: get(&self.connections),
            connections_open: get(&self.connections_open),
            refused_prefix: get(&self.refused_prefix),
            mux_streams: get(&self.mux_streams),
            grpc_requests: get(&self.grpc_requests),
            links_opened: get(&self.links_opened),
            links_open: get(&self.links_open),
            link_failures: get(&self.link_failures),
            accept_errors: get(&self.accept_errors),
        }
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// One level of [`RelayCounters`] held up while this lives.
struct Level {
    counters: Arc<RelayCounters>,
    pick: fn(&RelayCounters) -> &AtomicU64,
}

impl Level {
    fn up(counters: &Arc<RelayCounters>, pick: fn(&RelayCounters) -> &AtomicU64) -> Self {
        bump(pick(counters));
        Self {
            counters: counters.clone(),
            pick,
        }
    }
}

impl Drop for Level {
    fn drop(&mut self) {
        (self.pick)(&self.counters).fetch_sub(1, Ordering::Relaxed);
    }
}

/// A link to the leader that can tell whether it still works.
trait Link: Send + Sync + 'static {
    fn alive(&self) -> bool;
}

/// A link and the streams it carries now.
struct Held<L> {
    link: L,
    streams: AtomicUsize,
}

/// A stream's place on a link, given back when dropped.
struct Lease<L: Link> {
    held: Arc<Held<L>>,
}

impl<L: Link> Drop for Lease<L> {
    fn drop(&mut self) {
        self.held.streams.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The links of one kind to the leader: filled one after another, a new
/// one dialled when every live one is full. One dial at a time: callers
/// wait for it rather than each dialling.
struct Pool<L> {
    links: tokio::sync::Mutex<Vec<Arc<Held<L>>>>,
    per_link: usize,
}

impl<L: Link> Pool<L> {
    fn new(per_link: usize) -> Self {
        Self {
            links: tokio::sync::Mutex::new(Vec::new()),
            per_link: per_link.max(1),
        }
    }

    /// A place on a live link with room, or on a new one from `dial`.
    async fn lease<F, Fut>(&self, dial: F) -> io::Result<Lease<L>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = io::Result<L>>,
    {
        let mut links = self.links.lock().await;
        links.retain(|h| h.link.alive());
        if let Some(held) = links
            .iter()
            .find(|h| h.streams.load(Ordering::Relaxed) < self.per_link)
        {
            held.streams.fetch_add(1, Ordering::Relaxed);
            return Ok(Lease { held: held.clone() });
        }
        let held = Arc::new(Held {
            link: tokio::time::timeout(DIAL_TIMEOUT, dial())
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "dial to the leader"))??,
            streams: AtomicUsize::new(1),
        });
        links.push(held.clone());
        Ok(Lease { held })
    }
}

/// The follower's side: the leader's address, the two pools, the counters.
struct Relay {
    leader: SocketAddr,
    mux: Pool<MuxLink>,
    grpc: Pool<GrpcLink>,
    counters: Arc<RelayCounters>,
    shutdown: CancellationToken,
}

/// Serves `listener` as a follower's RPC port relaying to `cfg.leader`
/// until `shutdown`; then waits (bounded) for its connections.
pub async fn serve_relay(
    listener: TcpListener,
    cfg: RelayConfig,
    counters: Arc<RelayCounters>,
    shutdown: CancellationToken,
) {
    let relay = Arc::new(Relay {
        leader: cfg.leader,
        mux: Pool::new(cfg.streams_per_link),
        grpc: Pool::new(cfg.streams_per_link),
        counters: counters.clone(),
        shutdown: shutdown.clone(),
    });
    let tracker = TaskTracker::new();
    crate::listen::serve_tracked(
        listener,
        tracker,
        &shutdown,
        &counters.accept_errors,
        GRACE,
        |stream| agent_connection(stream, relay.clone()),
    )
    .await;
}

/// One agent's connection: its first byte says what it speaks.
async fn agent_connection(mut stream: TcpStream, relay: Arc<Relay>) {
    let _ = stream.set_nodelay(true);
    let prefix = tokio::select! {
        _ = relay.shutdown.cancelled() => return,
        r = tokio::time::timeout(PREFIX_TIMEOUT, stream.read_u8()) => r,
    };
    let counters = &relay.counters;
    match prefix {
        Ok(Ok(RPC_MULTIPLEX_V2)) => {
            bump(&counters.connections);
            let _open = Level::up(counters, |c| &c.connections_open);
            relay_mux(stream, &relay).await;
        }
        Ok(Ok(RPC_GRPC)) => {
            bump(&counters.connections);
            let _open = Level::up(counters, |c| &c.connections_open);
            relay_grpc(stream, &relay).await;
        }
        // TLS, auto-encrypt, raft or nothing: closed.
        _ => bump(&counters.refused_prefix),
    }
}

/// A yamux link to the leader: a task drives the connection and opens
/// streams on it for whoever asks.
struct MuxLink {
    opens: mpsc::Sender<oneshot::Sender<Result<yamux::Stream, yamux::ConnectionError>>>,
}

impl Link for MuxLink {
    fn alive(&self) -> bool {
        !self.opens.is_closed()
    }
}

/// A connection to the leader's RPC port, its first byte (what it will
/// speak) written.
async fn dial(relay: &Relay, prefix: u8) -> io::Result<TcpStream> {
    let mut tcp = TcpStream::connect(relay.leader).await?;
    tcp.set_nodelay(true)?;
    tcp.write_all(&[prefix]).await?;
    Ok(tcp)
}

/// Dials the leader's RPC port for yamux (`0x04`).
async fn dial_mux(relay: &Relay) -> io::Result<MuxLink> {
    let tcp = dial(relay, RPC_MULTIPLEX_V2).await?;
    let mut cfg = yamux::Config::default();
    cfg.set_max_num_streams(AGENT_STREAMS);
    let io = agent_sim_net::Coalesced::new(tcp).compat();
    let conn = yamux::Connection::new(io, cfg, yamux::Mode::Client);
    let (opens, asks) = mpsc::channel(64);
    bump(&relay.counters.links_opened);
    let open = Level::up(&relay.counters, |c| &c.links_open);
    tokio::spawn(drive_mux_link(conn, asks, relay.shutdown.clone(), open));
    Ok(MuxLink { opens })
}

/// Drives a yamux link until it breaks, every handle to it is gone, or
/// shutdown: opens the streams asked for, in order.
async fn drive_mux_link<T>(
    mut conn: yamux::Connection<T>,
    mut asks: mpsc::Receiver<oneshot::Sender<Result<yamux::Stream, yamux::ConnectionError>>>,
    shutdown: CancellationToken,
    _open: Level,
) where
    T: futures_util::AsyncRead + futures_util::AsyncWrite + Unpin,
{
    let mut waiting = std::collections::VecDeque::new();
    let mut closing = false;
    let ended = poll_fn(|cx| {
        while !closing {
            match asks.poll_recv(cx) {
                Poll::Ready(Some(ask)) => waiting.push_back(ask),
                Poll::Ready(None) => closing = true,
                Poll::Pending => break,
            }
        }
        while !waiting.is_empty() {
            match conn.poll_new_outbound(cx) {
                Poll::Ready(r) => {
                    let failed = r.is_err();
                    if let Some(ask) = waiting.pop_front() {
                        let _ = ask.send(r);
                    }
                    if failed {
                        return Poll::Ready(());
                    }
                }
                Poll::Pending => break,
            }
        }
        loop {
            match conn.poll_next_inbound(cx) {
                // The leader opens no streams: one it opens is dropped.
                Poll::Ready(Some(Ok(_))) => {}
                Poll::Ready(Some(Err(_)) | None) => return Poll::Ready(()),
                Poll::Pending => break,
            }
        }
        if closing && waiting.is_empty() {
            return Poll::Ready(());
        }
        Poll::Pending
    });
    tokio::select! {
        () = ended => {}
        _ = shutdown.cancelled() => {}
    }
}

/// A new stream on a leader link with room.
async fn leader_stream(relay: &Relay) -> io::Result<(yamux::Stream, Lease<MuxLink>)> {
    let lease = relay.mux.lease(|| dial_mux(relay)).await?;
    let (tx, rx) = oneshot::channel();
    let broken = || io::Error::new(io::ErrorKind::BrokenPipe, "link to the leader closed");
    lease.held.link.opens.send(tx).await.map_err(|_| broken())?;
    let stream = rx.await.map_err(|_| broken())?.map_err(io::Error::other)?;
    Ok((stream, lease))
}

/// An agent's yamux connection: each stream it opens is copied to and from
/// a stream on a leader link.
async fn relay_mux(stream: TcpStream, relay: &Arc<Relay>) {
    let mut cfg = yamux::Config::default();
    cfg.set_max_num_streams(AGENT_STREAMS);
    let io = agent_sim_net::Coalesced::new(stream).compat();
    let mut conn = yamux::Connection::new(io, cfg, yamux::Mode::Server);
    // Bound: at most AGENT_STREAMS streams (yamux refuses more), one task each.
    let mut streams = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = relay.shutdown.cancelled() => break,
            next = poll_fn(|cx| conn.poll_next_inbound(cx)) => match next {
                Some(Ok(s)) => {
                    bump(&relay.counters.mux_streams);
                    streams.spawn(relay_stream(s, relay.clone()));
                }
                Some(Err(_)) | None => break,
            },
            Some(_) = streams.join_next(), if !streams.is_empty() => {}
        }
    }
}

/// One agent stream, copied both ways until both sides are done.
async fn relay_stream(agent: yamux::Stream, relay: Arc<Relay>) {
    let (up, _lease) = match leader_stream(&relay).await {
        Ok(s) => s,
        Err(_) => {
            bump(&relay.counters.link_failures);
            return;
        }
    };
    let (mut agent, mut up) = (agent.compat(), up.compat());
    tokio::select! {
        _ = relay.shutdown.cancelled() => {}
        _ = tokio::io::copy_bidirectional_with_sizes(&mut agent, &mut up, COPY_BUF, COPY_BUF) => {}
    }
}

/// An HTTP/2 link to the leader.
struct GrpcLink {
    send: client_h2::SendRequest<Incoming>,
}

impl Link for GrpcLink {
    fn alive(&self) -> bool {
        !self.send.is_closed()
    }
}

/// Dials the leader's RPC port for gRPC (`0x08`, then h2c).
async fn dial_grpc(relay: &Relay) -> io::Result<GrpcLink> {
    let tcp = dial(relay, RPC_GRPC).await?;
    let (send, conn) = client_h2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .handshake(TokioIo::new(tcp))
        .await
        .map_err(io::Error::other)?;
    bump(&relay.counters.links_opened);
    let open = Level::up(&relay.counters, |c| &c.links_open);
    let shutdown = relay.shutdown.clone();
    tokio::spawn(async move {
        let _open = open;
        tokio::select! {
            _ = conn => {}
            _ = shutdown.cancelled() => {}
        }
    });
    Ok(GrpcLink { send })
}

/// An agent's gRPC connection, served by hyper: each request goes on to the
/// leader on a link with room.
async fn relay_grpc(stream: TcpStream, relay: &Arc<Relay>) {
    let svc = RelayService {
        relay: relay.clone(),
    };
    let conn = h2_builder().serve_connection(TokioIo::new(stream), svc);
    drive_connection(conn, &relay.shutdown, |c| c.graceful_shutdown()).await;
}

#[derive(Clone)]
struct RelayService {
    relay: Arc<Relay>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl hyper::service::Service<Request<Incoming>> for RelayService {
    type Response = Response<RelayBody>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let relay = self.relay.clone();
        Box::pin(async move {
            bump(&relay.counters.grpc_requests);
            Ok(match forward(&relay, req).await {
                Ok(resp) => resp,
                Err(_) => {
                    bump(&relay.counters.link_failures);
                    unavailable()
                }
            })
        })
    }
}

/// `req` sent on a leader link with room; its answer streams back with the
/// link's place held until the body ends.
async fn forward(relay: &Relay, mut req: Request<Incoming>) -> io::Result<Response<RelayBody>> {
    let lease = relay.grpc.lease(|| dial_grpc(relay)).await?;
    let mut send = lease.held.link.send.clone();
    send.ready().await.map_err(io::Error::other)?;
    if req.uri().scheme().is_none() || req.uri().authority().is_none() {
        let path = req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        *req.uri_mut() = Uri::builder()
            .scheme("http")
            .authority(relay.leader.to_string())
            .path_and_query(path)
            .build()
            .map_err(io::Error::other)?;
    }
    let resp = send.send_request(req).await.map_err(io::Error::other)?;
    Ok(resp.map(|body| RelayBody {
        inner: Some(body),
        _lease: Some(lease),
    }))
}

/// A trailers-only `UNAVAILABLE` answer, as a gRPC server gives when it
/// cannot serve the call.
fn unavailable() -> Response<RelayBody> {
    let mut resp = Response::new(RelayBody {
        inner: None,
        _lease: None,
    });
    let h = resp.headers_mut();
    h.insert("content-type", HeaderValue::from_static("application/grpc"));
    h.insert("grpc-status", HeaderValue::from_static("14"));
    h.insert(
        "grpc-message",
        HeaderValue::from_static("follower: the leader cannot be reached"),
    );
    resp
}

/// The leader's answer body, holding its link's place until it ends; or
/// nothing (a trailers-only answer).
struct RelayBody {
    inner: Option<Incoming>,
    _lease: Option<Lease<GrpcLink>>,
}

impl Body for RelayBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.inner.as_mut() {
            Some(b) => Pin::new(b).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A relay whose leader refuses every dial; its counters.
    async fn relay_to_nowhere() -> (SocketAddr, Arc<RelayCounters>, CancellationToken) {
        // A port bound and closed again: nothing listens there.
        let gone = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let leader = gone.local_addr().unwrap();
        drop(gone);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let counters = Arc::new(RelayCounters::default());
        let stop = CancellationToken::new();
        tokio::spawn(serve_relay(
            listener,
            RelayConfig::new(leader),
            counters.clone(),
            stop.clone(),
        ));
        (addr, counters, stop)
    }

    #[tokio::test]
    async fn a_subscribe_the_leader_cannot_take_is_answered_unavailable() {
        let (addr, counters, stop) = relay_to_nowhere().await;
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(&[RPC_GRPC]).await.unwrap();
        let (mut send, conn) = client_h2::Builder::new(TokioExecutor::new())
            .handshake::<_, http_body_util::Empty<Bytes>>(TokioIo::new(tcp))
            .await
            .unwrap();
        tokio::spawn(conn);
        let req = Request::post("http://consul/subscribe.StateChangeSubscription/Subscribe")
            .header("content-type", "application/grpc")
            .body(http_body_util::Empty::new())
            .unwrap();
        let resp = tokio::time::timeout(DIAL_TIMEOUT * 2, send.send_request(req))
            .await
            .expect("answered within the dial's bound")
            .unwrap();
        assert_eq!(resp.headers()["grpc-status"], "14");
        let snap = counters.snapshot();
        assert_eq!((snap.grpc_requests, snap.link_failures), (1, 1), "{snap:?}");
        assert_eq!(snap.links_opened, 0);
        stop.cancel();
    }

    #[tokio::test]
    async fn a_call_the_leader_cannot_take_ends_its_stream_and_a_foreign_byte_is_closed() {
        use futures_util::{AsyncReadExt as _, AsyncWriteExt as _};
        let (addr, counters, stop) = relay_to_nowhere().await;
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(&[RPC_MULTIPLEX_V2]).await.unwrap();
        let mut conn =
            yamux::Connection::new(tcp.compat(), yamux::Config::default(), yamux::Mode::Client);
        let mut stream = poll_fn(|cx| conn.poll_new_outbound(cx)).await.unwrap();
        // The connection runs beside the stream.
        let driver = tokio::spawn(async move {
            while let Some(Ok(_)) = poll_fn(|cx| conn.poll_next_inbound(cx)).await {}
        });
        stream.write_all(b"\x82").await.unwrap();
        let mut got = Vec::new();
        let read = tokio::time::timeout(DIAL_TIMEOUT * 2, stream.read_to_end(&mut got)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
        let snap = counters.snapshot();
        assert_eq!((snap.mux_streams, snap.link_failures), (1, 1), "{snap:?}");
        driver.abort();

        // TLS (0x03) is not relayed: the connection is closed unread.
        let mut tls = TcpStream::connect(addr).await.unwrap();
        tls.write_all(&[0x03]).await.unwrap();
        let mut buf = [0u8; 1];
        assert_eq!(tls.read(&mut buf).await.unwrap(), 0);
        assert_eq!(counters.snapshot().refused_prefix, 1);
        stop.cancel();
    }
}
