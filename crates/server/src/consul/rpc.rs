//! The RPC port: a `0x08` byte, then h2c gRPC serving
//! `subscribe.StateChangeSubscription/Subscribe` (or `0x04`, then yamux
//! and blocking queries: [`super::blocking`]; or `0x07`, then TLS and
//! `AutoEncrypt.Sign`: [`super::auto_encrypt`]).
//!
//! Each accepted socket gets one task: it reads the prefix byte (5 s budget),
//! then hands the same socket to hyper's HTTP/2 server with a tiny hand-written
//! service (one route) instead of tonic's `Server`, which keeps per-connection
//! state to hyper/h2's own and lets shutdown close every connection within a
//! bounded grace. The server never sends keepalive pings.
//!
//! Events travel pre-encoded ([`Bytes`] from [`super::events`]): the codec
//! writes them as they are, so a live event is encoded once for all
//! subscribers. A [`Subscription`] stream sends its snapshot, then what the
//! topic's broadcast channel carries; if it lags behind the channel it sends
//! `NewSnapshotToFollow` and a fresh snapshot, as the real server does.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::{Future, ready};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tonic::server::{Grpc, ServerStreamingService};

use agent_sim_proto::codec::{Buffers, PreEncoded, SmallCodec};
use agent_sim_proto::consul::subscribe::{SubscribeRequest, Topic, subscribe_request::Subject};

use super::acl::{Access, Resource};
use super::auto_encrypt::{RPC_TLS_INSECURE, serve_insecure};
use super::conn::{accept_loop, drive_connection, h2_builder, tls_accept};
use super::mux::{RPC_MULTIPLEX_V2, serve_mux};
use super::state::{Start, TopicKey};
use super::{ConsulState, Gauge, events};
use crate::faults::{
    ABORTED_WORDS, Action, Kill, OVERSIZED_GRPC, Order, RETRY_ELSEWHERE, RETRY_LATER, STALL_LIMIT,
    Target, next_order,
};

/// `pool.RPCGRPC`: the byte that switches a Consul RPC connection to gRPC.
pub(crate) const RPC_GRPC: u8 = 0x08;
/// First byte of a TLS RPC connection (`pool.RPCTLS`).
pub(crate) const RPC_TLS: u8 = 0x03;
/// `limits.rpc_handshake_timeout` default.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// What Consul 1.20 ends open streams with when it shuts down (code Unknown).
const SHUTTING_DOWN: &str = "subscription closed by server, server is shutting down";
const SUBSCRIBE_PATH: &str = "/subscribe.StateChangeSubscription/Subscribe";
/// Small codec buffers: messages here are a few hundred bytes, and there may
/// be 20,000 streams.
const BUFFERS: Buffers = Buffers::new(512, 512);
/// Largest `SubscribeRequest` accepted: a topic, a key, a token, a
/// datacenter and an index are well under 1 KiB; anything over 64 KiB ends
/// the call with `OUT_OF_RANGE` before it is buffered.
pub(crate) const MAX_REQUEST_MESSAGE: usize = 64 * 1024;

/// Serves the RPC port until `shutdown` is cancelled, then gives open
/// connections a short grace (streams end with `UNAVAILABLE`) and returns.
pub async fn serve_rpc(
    listener: TcpListener,
    state: ConsulState,
    shutdown: CancellationToken,
) -> io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        state.set_rpc_addr(addr);
    }
    state.faults().start();
    let builder = h2_builder();
    let conns = state.clone();
    accept_loop(listener, &state, shutdown.clone(), move |stream| {
        rpc_connection(stream, conns.clone(), builder.clone(), shutdown.clone())
    })
    .await
}

async fn rpc_connection(
    stream: TcpStream,
    state: ConsulState,
    builder: Arc<http2::Builder<TokioExecutor>>,
    shutdown: CancellationToken,
) {
    let counters = &state.inner.counters;
    // Over the per-client cap: closed at once, before reading a byte, as
    // Consul does ("rejecting RPC conn ... rpc_max_conns_per_client exceeded").
    let Some(_slot) = stream
        .peer_addr()
        .ok()
        .and_then(|peer| state.rpc_slot(peer.ip()))
    else {
        counters.bump(&counters.rpc_rejected_conn_cap);
        return;
    };
    let _ = stream.set_nodelay(true);
    let faults = state.faults();
    let mut stream = faults.wrap(stream, Target::ConsulRpc);
    if let Some(hit) = faults.pick(Target::ConsulRpc, None) {
        match hit.action {
            Action::Delay(d) => {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    () = tokio::time::sleep(d) => {}
                }
            }
            Action::Stall => return stream.stall(STALL_LIMIT, &shutdown).await,
            Action::Drop => return stream.refuse(Kill::Drop).await,
            Action::Reset => return stream.refuse(Kill::Reset).await,
            _ => {}
        }
    }
    let first = tokio::select! {
        _ = shutdown.cancelled() => return,
        r = tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.read_u8()) => r,
    };
    match (first, state.inner.cfg.tls.clone()) {
        (Ok(Ok(RPC_GRPC)), _) => serve_grpc(stream, state, builder, shutdown).await,
        // AutoEncrypt.Sign: TLS of its own, whatever the port's TLS.
        (Ok(Ok(RPC_TLS_INSECURE)), _) => serve_insecure(stream, state, shutdown).await,
        (Ok(Ok(RPC_MULTIPLEX_V2)), _) => serve_mux(stream, state, shutdown).await,
        (Ok(Ok(RPC_TLS)), Some(tls)) => {
            let mut tls = match tls_accept(stream, tls, &shutdown).await {
                None => return,
                Some(Ok(tls)) => tls,
                Some(Err(_)) => {
                    counters.bump(&counters.rpc_rejected_tls);
                    return;
                }
            };
            // TLS, then 0x08 (gRPC) or 0x04 (yamux) inside it.
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.read_u8()).await {
                Ok(Ok(RPC_GRPC)) => serve_grpc(tls, state, builder, shutdown).await,
                Ok(Ok(RPC_MULTIPLEX_V2)) => serve_mux(tls, state, shutdown).await,
                _ => counters.bump(&counters.rpc_rejected_no_prefix),
            }
        }
        _ => {
            counters.bump(&counters.rpc_rejected_no_prefix);
            // dropping the socket closes it
        }
    }
}

/// gRPC over an accepted RPC connection (after its prefix bytes).
async fn serve_grpc<I>(
    io: I,
    state: ConsulState,
    builder: Arc<http2::Builder<TokioExecutor>>,
    shutdown: CancellationToken,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let counters = &state.inner.counters;
    counters.bump(&counters.rpc_connections);
    let _open = Gauge::up(&state, |c| &c.rpc_connections_open);
    let svc = GrpcService {
        state: state.clone(),
        shutdown: shutdown.clone(),
    };
    let conn = builder.serve_connection(TokioIo::new(io), svc);
    drive_connection(conn, &shutdown, |c| c.graceful_shutdown()).await;
}

/// The per-connection HTTP/2 service: one gRPC route.
#[derive(Clone)]
struct GrpcService {
    state: ConsulState,
    shutdown: CancellationToken,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl hyper::service::Service<Request<Incoming>> for GrpcService {
    type Response = Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        if req.uri().path() != SUBSCRIBE_PATH {
            let status =
                Status::unimplemented(format!("unknown service or method {}", req.uri().path()));
            return Box::pin(ready(Ok(status.into_http())));
        }
        // A truncated frame needs the response body: the stream raises the
        // flag and ends, the body then sends half a frame and no trailers.
        let truncate = self
            .state
            .faults()
            .targets(Target::ConsulFrame)
            .then(|| Arc::new(AtomicBool::new(false)));
        let handler = SubscribeHandler {
            state: self.state.clone(),
            shutdown: self.shutdown.clone(),
            truncate: truncate.clone(),
        };
        Box::pin(async move {
            let mut grpc = Grpc::new(SubscribeCodec::new(BUFFERS))
                .max_decoding_message_size(MAX_REQUEST_MESSAGE);
            let resp = grpc.server_streaming(handler, req).await;
            Ok(match truncate {
                Some(flag) => resp.map(|b| tonic::body::Body::new(Truncating::new(b, flag))),
                None => resp,
            })
        })
    }
}

/// Decodes `SubscribeRequest` with prost; writes events encoded once for
/// every subscriber as they are.
type SubscribeCodec = SmallCodec<PreEncoded, SubscribeRequest, Buffers>;

type EventStream = Pin<Box<dyn Stream<Item = Result<Bytes, Status>> + Send>>;

struct SubscribeHandler {
    state: ConsulState,
    shutdown: CancellationToken,
    /// Set by the stream when a fault truncates its next frame.
    truncate: Option<Arc<AtomicBool>>,
}

/// A Subscribe status of a fault, in Consul's words.
fn fault_status(action: &Action) -> Option<Status> {
    Some(match action {
        Action::Aborted => Status::aborted(ABORTED_WORDS),
        Action::Unavailable => Status::unavailable(RETRY_LATER),
        Action::ResourceExhausted => Status::resource_exhausted(RETRY_ELSEWHERE),
        _ => return None,
    })
}

impl ServerStreamingService<SubscribeRequest> for SubscribeHandler {
    type Response = Bytes;
    type ResponseStream = EventStream;
    type Future =
        Pin<Box<dyn Future<Output = Result<tonic::Response<EventStream>, Status>> + Send>>;

    /// Answers (response headers) only with the first message, as grpc-go
    /// does: a resumed stream stays silent until the topic's next event,
    /// and an error before any message is the call's only answer.
    fn call(&mut self, request: tonic::Request<SubscribeRequest>) -> Self::Future {
        // A fault answers the call (as a rate limiter does, before the
        // handler), or cuts the snapshot this call starts.
        let faults = self.state.faults();
        let mut cut = None;
        if let Some(hit) = faults.draw(Target::ConsulSubscribe, None) {
            match fault_status(&hit.action) {
                Some(status) if faults.confirm(hit.idx) => {
                    return Box::pin(ready(Err(status)));
                }
                Some(_) => {}
                None => cut = Some(hit.idx),
            }
        }
        let opened =
            Subscription::open(&self.state, request.into_inner(), &self.shutdown).map(|mut sub| {
                sub.truncate = self.truncate.clone();
                sub.orders = faults.orders(Target::ConsulSubscribe);
                if let Some(idx) = cut {
                    sub.cut_snapshot(idx);
                }
                sub
            });
        Box::pin(async move {
            let mut sub = opened?;
            let first = match sub.next().await {
                Some(Ok(b)) => b,
                Some(Err(status)) => return Err(status),
                // Cut or truncated before any message: an empty stream.
                None if sub.faulted => {
                    let empty = futures_util::stream::empty();
                    return Ok(tonic::Response::new(Box::pin(empty) as EventStream));
                }
                None => return Err(Status::unknown(SHUTTING_DOWN)),
            };
            let rest = sub.into_stream();
            let stream = futures_util::stream::once(ready(Ok(first))).chain(rest);
            Ok(tonic::Response::new(Box::pin(stream) as EventStream))
        })
    }
}

/// Resolves the request's subject into a topic key.
fn topic_key(req: &SubscribeRequest) -> Result<TopicKey, Status> {
    let topic = match Topic::try_from(req.topic) {
        Ok(t @ (Topic::ServiceHealth | Topic::ServiceHealthConnect | Topic::ServiceIntentions)) => {
            t
        }
        _ => {
            return Err(Status::invalid_argument(format!(
                "unsupported topic {}",
                req.topic
            )));
        }
    };
    let key = match &req.subject {
        Some(Subject::NamedSubject(s)) => s.key.as_str(),
        Some(Subject::WildcardSubject(_)) => {
            return Err(Status::invalid_argument(
                "wildcard subjects are not supported by this target",
            ));
        }
        None => req.key.as_str(),
    };
    if key.is_empty() {
        return Err(Status::invalid_argument("a subject key is required"));
    }
    Ok(TopicKey::new(topic, key))
}

/// One Subscribe stream.
struct Subscription {
    state: ConsulState,
    key: TopicKey,
    // Bound: one snapshot (the topic's instances, bounded by the store) plus
    // two markers; given back once sent.
    pending: VecDeque<Bytes>,
    rx: broadcast::Receiver<Bytes>,
    abort: watch::Receiver<u64>,
    shutdown: CancellationToken,
    done: bool,
    _active: Gauge,
    /// Orders of timed `consul.subscribe` faults.
    orders: Option<watch::Receiver<Order>>,
    /// The response body's flag for a truncated frame.
    truncate: Option<Arc<AtomicBool>>,
    /// Messages left before the stream ends (a cut snapshot).
    end_after: Option<usize>,
    /// The stream was ended by a fault (cut or truncated).
    faulted: bool,
    /// The token may not read the service: snapshots empty, events
    /// dropped.
    blind: bool,
}

enum Wake {
    Shutdown,
    Abort,
    Order,
    Event(Result<Bytes, broadcast::error::RecvError>),
}

impl Subscription {
    fn open(
        state: &ConsulState,
        req: SubscribeRequest,
        shutdown: &CancellationToken,
    ) -> Result<Self, Status> {
        let counters = &state.inner.counters;
        counters.bump(&counters.subscribe_calls);
        let key = topic_key(&req)?;
        // A token that may not read the topic's service (the anonymous
        // one under default-deny) sees nothing: an empty snapshot and no
        // events, not an error (Consul filters a stream's events by ACL).
        let blind = match state.acl(&req.token) {
            Ok(a) => !a.allows(Resource::Service, Access::Read, &key.key),
            // As Consul 1.20: code Unknown, the bare text.
            Err(_) => return Err(Status::unknown("ACL not found")),
        };
        let mut store = state.store();
        if !store.room_for_topic(&key) {
            return Err(Status::resource_exhausted(super::write_error::CATALOG_FULL));
        }
        let (start, rx) = store.subscribe(&key, req.index);
        drop(store);
        let mut sub = Self {
            state: state.clone(),
            key,
            pending: VecDeque::new(),
            rx,
            abort: state.inner.abort.subscribe(),
            shutdown: shutdown.clone(),
            done: false,
            _active: Gauge::up(state, |c| &c.subscriptions_active),
            orders: None,
            truncate: None,
            end_after: None,
            faulted: false,
            blind,
        };
        sub.start(start, false);
        Ok(sub)
    }

    /// A `cut` fault: the stream ends (status OK) after half the items of
    /// the snapshot it starts with, counted when armed; a resumed stream has
    /// no snapshot to cut (not counted).
    fn cut_snapshot(&mut self, idx: usize) {
        if self.pending.is_empty() {
            return;
        }
        // [NewSnapshotToFollow], items..., EndOfSnapshot
        let nstf = usize::from(self.pending.front() == Some(&events::new_snapshot_to_follow()));
        let items = self.pending.len() - 1 - nstf;
        if self.state.faults().confirm(idx) {
            self.end_after = Some(nstf + items / 2);
        }
    }

    fn start(&mut self, mut start: Start, force_new_snapshot: bool) {
        if let (true, Start::Snapshot { payloads, .. }) = (self.blind, &mut start) {
            *payloads = Default::default();
        }
        let counters = &self.state.inner.counters;
        match start {
            Start::Resume => counters.bump(&counters.resumes_served),
            Start::Snapshot {
                new_snapshot_to_follow,
                index,
                payloads,
            } => {
                counters.bump(&counters.snapshots_sent);
                let mut pending = VecDeque::with_capacity(payloads.len() + 2);
                if new_snapshot_to_follow || force_new_snapshot {
                    pending.push_back(events::new_snapshot_to_follow());
                }
                pending.extend(payloads.iter().map(|p| events::event(index, p)));
                pending.push_back(events::end_of_snapshot(index));
                self.pending = pending;
            }
        }
    }

    /// The subscriber fell behind the topic buffer: start over with a new
    /// snapshot (and a fresh receiver), as the real server does.
    fn resnapshot(&mut self) {
        let (start, rx) = self.state.store().subscribe(&self.key, 0);
        self.rx = rx;
        self.start(start, true);
    }

    fn into_stream(self) -> impl Stream<Item = Result<Bytes, Status>> + Send {
        futures_util::stream::unfold(self, |mut sub| async move {
            let item = sub.next().await?;
            Some((item, sub))
        })
    }

    async fn next(&mut self) -> Option<Result<Bytes, Status>> {
        loop {
            if self.done {
                return None;
            }
            if self.end_after == Some(0) {
                // A cut snapshot: end here, status OK.
                self.done = true;
                self.faulted = true;
                return None;
            }
            if let Some(b) = self.pending.pop_front() {
                if self.pending.is_empty() {
                    self.pending = VecDeque::new(); // give the snapshot's memory back
                }
                return self.emit(b).await;
            }
            let wake = tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => Wake::Shutdown,
                _ = self.abort.changed() => Wake::Abort,
                () = next_order(&mut self.orders) => Wake::Order,
                r = self.rx.recv() => Wake::Event(r),
            };
            match wake {
                Wake::Shutdown => {
                    self.done = true;
                    return Some(Err(Status::unknown(SHUTTING_DOWN)));
                }
                Wake::Abort => {
                    self.done = true;
                    return Some(Err(Status::aborted(ABORTED_WORDS)));
                }
                Wake::Order => {
                    let order = self.orders.as_mut().map(|rx| *rx.borrow_and_update());
                    let faults = self.state.faults().clone();
                    if let Some(status) = order
                        .and_then(|o| faults.obey(o))
                        .and_then(|a| fault_status(&a))
                    {
                        self.done = true;
                        return Some(Err(status));
                    }
                }
                Wake::Event(Ok(_)) if self.blind => {}
                Wake::Event(Ok(b)) => return self.emit(b).await,
                Wake::Event(Err(_lagged_or_closed)) => self.resnapshot(),
            }
        }
    }

    /// Writes `b`, after what a `consul.frame` fault does: a delay; or a
    /// garbage or oversized message instead of it, or a truncated frame,
    /// each ending the stream.
    async fn emit(&mut self, b: Bytes) -> Option<Result<Bytes, Status>> {
        let faults = self.state.faults().clone();
        if let Some(hit) = faults.pick(Target::ConsulFrame, None) {
            match hit.action {
                Action::Delay(d) => {
                    tokio::select! {
                        _ = self.shutdown.cancelled() => {
                            self.done = true;
                            return Some(Err(Status::unknown(SHUTTING_DOWN)));
                        }
                        () = tokio::time::sleep(d) => {}
                    }
                }
                // No client reads past a message it cannot take: the
                // stream ends after it (status OK, never read).
                Action::Garbage => {
                    self.done = true;
                    let junk = crate::faults::garbage(fastrand::u64(..), 32);
                    return Some(Ok(Bytes::from(junk)));
                }
                Action::Oversized => {
                    self.done = true;
                    return Some(Ok(oversized()));
                }
                Action::Truncated => {
                    if let Some(flag) = &self.truncate {
                        flag.store(true, Ordering::Release);
                        self.done = true;
                        self.faulted = true;
                        return None;
                    }
                }
                _ => {}
            }
        }
        if let Some(n) = &mut self.end_after {
            *n = n.saturating_sub(1);
        }
        let counters = &self.state.inner.counters;
        counters.bump(&counters.events_sent);
        Some(Ok(b))
    }
}

/// One message larger than gRPC clients accept by default (shared bytes).
fn oversized() -> Bytes {
    static BYTES: std::sync::OnceLock<Bytes> = std::sync::OnceLock::new();
    BYTES
        .get_or_init(|| Bytes::from(vec![0u8; OVERSIZED_GRPC]))
        .clone()
}

/// The response body of a Subscribe call that a fault may truncate: once
/// the stream raised the flag and ended, instead of the trailers it sends a
/// gRPC frame header announcing 64 bytes and 10 of them, then ends (no
/// trailers): the client is left with half a message at the end of the
/// stream.
struct Truncating {
    inner: tonic::body::Body,
    flag: Arc<AtomicBool>,
    done: bool,
}

impl Truncating {
    fn new(inner: tonic::body::Body, flag: Arc<AtomicBool>) -> Self {
        Truncating {
            inner,
            flag,
            done: false,
        }
    }

    fn half_frame() -> Bytes {
        let mut b = Vec::with_capacity(15);
        b.push(0);
        b.extend_from_slice(&64u32.to_be_bytes());
        b.extend_from_slice(&[0x0a; 10]);
        Bytes::from(b)
    }
}

impl hyper::body::Body for Truncating {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Status>>> {
        use std::task::Poll;
        if self.done {
            return Poll::Ready(None);
        }
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        let ending = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(f))) => f.is_trailers(),
            _ => false,
        };
        if ending && self.flag.load(Ordering::Acquire) {
            self.done = true;
            return Poll::Ready(Some(Ok(hyper::body::Frame::data(Self::half_frame()))));
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_sim_proto::consul::subscribe::NamedSubject;
    use prost::Message;

    #[tokio::test]
    async fn a_lagging_subscriber_gets_a_new_snapshot() {
        use crate::consul::ConsulTargetConfig;
        use crate::consul::state::{NodeDef, ServiceDef, Touched};
        use agent_sim_proto::consul::subscribe::{Event, event::Payload};

        let state = ConsulState::new(ConsulTargetConfig {
            topic_buffer: 2,
            ..ConsulTargetConfig::default()
        });
        let write = |port: i32| {
            let mut store = state.store();
            let idx = store.next_index();
            let mut t = Touched::default();
            store.ensure_node("n1", NodeDef::default(), idx, &mut t);
            let svc = ServiceDef {
                id: "web-1".into(),
                service: "web".into(),
                port,
                ..ServiceDef::default()
            };
            store.ensure_service("n1", svc, idx, &mut t).unwrap();
            store.commit(idx, t);
        };
        write(1);
        let shutdown = CancellationToken::new();
        let req = SubscribeRequest {
            topic: Topic::ServiceHealth as i32,
            key: "web".into(),
            ..Default::default()
        };
        let mut sub = Subscription::open(&state, req, &shutdown).unwrap();
        let decode = |b: Bytes| Event::decode(b).unwrap();
        assert!(matches!(
            decode(sub.next().await.unwrap().unwrap()).payload,
            Some(Payload::ServiceHealth(_))
        ));
        assert!(matches!(
            decode(sub.next().await.unwrap().unwrap()).payload,
            Some(Payload::EndOfSnapshot(true))
        ));
        for port in 2..=5 {
            write(port); // 4 events into a buffer of 2
        }
        let e = decode(sub.next().await.unwrap().unwrap());
        assert_eq!(e.payload, Some(Payload::NewSnapshotToFollow(true)));
        let e = decode(sub.next().await.unwrap().unwrap());
        let Some(Payload::ServiceHealth(h)) = e.payload else {
            panic!("snapshot item expected")
        };
        assert_eq!(h.check_service_node.unwrap().service.unwrap().port, 5);
        let e = decode(sub.next().await.unwrap().unwrap());
        assert_eq!(e.index, state.raft_index());
        assert_eq!(e.payload, Some(Payload::EndOfSnapshot(true)));
        assert_eq!(state.stats().snapshots_sent, 2);
        shutdown.cancel();
        // As Consul 1.20 ends streams when it shuts down.
        let end = sub.next().await.unwrap().unwrap_err();
        assert_eq!(end.code(), tonic::Code::Unknown);
        assert_eq!(end.message(), SHUTTING_DOWN);
        assert!(sub.next().await.is_none());
    }

    #[test]
    fn topic_key_from_named_subject_or_legacy_key() {
        let req =
            SubscribeRequest::decode(&[0x08, 0x01, 0x52, 0x05, 0x0a, 0x03, b'w', b'e', b'b'][..])
                .unwrap();
        assert_eq!(
            topic_key(&req).unwrap(),
            TopicKey::new(Topic::ServiceHealth, "web")
        );
        let legacy = SubscribeRequest {
            topic: Topic::ServiceIntentions as i32,
            key: "api".into(),
            ..Default::default()
        };
        assert_eq!(
            topic_key(&legacy).unwrap(),
            TopicKey::new(Topic::ServiceIntentions, "api")
        );
        let empty = SubscribeRequest {
            topic: Topic::ServiceHealth as i32,
            subject: Some(Subject::NamedSubject(NamedSubject::default())),
            ..Default::default()
        };
        assert_eq!(
            topic_key(&empty).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        let mesh = SubscribeRequest {
            topic: Topic::MeshConfig as i32,
            key: "x".into(),
            ..Default::default()
        };
        assert_eq!(
            topic_key(&mesh).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }
}
