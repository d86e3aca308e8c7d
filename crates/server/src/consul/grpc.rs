//! The public gRPC port (Consul's `ports.grpc`, 8502; TLS `grpc_tls`, 8503)
//! that consul-dataplanes connect to: plain h2c (or TLS) from the first
//! byte, hyper's HTTP/2 server with a hand-written router (as `rpc`), and
//! four methods:
//!
//! - `DataplaneService/GetEnvoyBootstrapParams`: the proxy looked up on its
//!   node in the catalog (`node not found`, `Service not found` as Consul
//!   says them), its destination service, datacenter, node.
//! - `DataplaneService/GetSupportedDataplaneFeatures`.
//! - `ServerDiscoveryService/WatchServers`: this server, then silence.
//! - Envoy's `DeltaAggregatedResources`, served like Consul's delta server:
//!   the first request must carry a type URL; `node.id` names the proxy and
//!   `node.metadata.node_name` its node; CDS wildcard and EDS by name; each
//!   type keeps what the proxy ACKed (`initial_resource_versions` on a new
//!   stream), sends only what differs, one response in flight (nothing more
//!   until it is ACKed or NACKed; a NACK is not retried until the catalog
//!   changes), in Consul's order (cluster upserts, endpoint upserts, cluster
//!   removals, endpoint removals); catalog changes of the proxy's upstreams
//!   are coalesced for [`super::ConsulTargetConfig::xds_coalesce`] and paced
//!   server-wide ([`Pacer`], Consul's `xds.update_max_per_second`) before the
//!   resources are rebuilt, the first configuration of a stream too; over
//!   `xds_max_streams` a stream is refused with `RESOURCE_EXHAUSTED`.
//!
//! Hostile input: requests are decoded within [`MAX_XDS_REQUEST`] (Delta
//! xDS) and [`MAX_REQUEST_MESSAGE`] (the others); a stream holds at most
//! [`MAX_NAMES_PER_TYPE`] resource names per type; top-level fields the API
//! does not define and xDS types this server does not serve are counted
//! (`grpc_unknown_fields`, `xds_unknown_types`) and ignored. Faults
//! (`consul.xds`): a stream refused or ended with `RESOURCE_EXHAUSTED` or
//! its connection reset; a response delayed, replaced by garbage, or sent
//! with a resource that does not parse.

use std::collections::{BTreeSet, HashMap};
use std::convert::Infallible;
use std::future::{Future, ready};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use agent_sim_proto::codec::{Buffers, Profile, SizedEncoder, SmallCodec};
use agent_sim_proto::consul::dataplane::{
    DataplaneFeatureSupport, DataplaneFeatures, GetEnvoyBootstrapParamsRequest,
    GetEnvoyBootstrapParamsResponse, GetSupportedDataplaneFeaturesRequest,
    GetSupportedDataplaneFeaturesResponse, ServiceKind,
    get_envoy_bootstrap_params_request::NodeSpec,
};
use agent_sim_proto::consul::serverdiscovery::{Server, WatchServersRequest, WatchServersResponse};
use agent_sim_proto::consul::subscribe::Topic;
use agent_sim_proto::fields;
use bytes::{BufMut, Bytes};
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::core::v3::node::UserAgentVersionType;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource,
};
use envoy_types::pb::google::protobuf::value::Kind;
use futures_util::Stream;
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use prost::Message as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::broadcast;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::codec::{BufferSettings, EncodeBuf, Encoder, Streaming};
use tonic::server::{Grpc, ServerStreamingService, StreamingService, UnaryService};
use tonic::{Status, metadata::MetadataMap};
use tonic_prost::ProstEncoder;

use super::state::TopicKey;
use super::xds::{self, CLUSTER_TYPE, ENDPOINT_TYPE, ProxyResources};
use super::{ConsulState, Gauge, lock};
use crate::faults::{Action, BAD_RESOURCE, ConnCtl, Kill, Order, Target};

const BOOTSTRAP_PATH: &str = "/hashicorp.consul.dataplane.DataplaneService/GetEnvoyBootstrapParams";
const FEATURES_PATH: &str =
    "/hashicorp.consul.dataplane.DataplaneService/GetSupportedDataplaneFeatures";
const WATCH_SERVERS_PATH: &str =
    "/hashicorp.consul.serverdiscovery.ServerDiscoveryService/WatchServers";
const ADS_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";
const SOTW_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// A stream whose proxy is not in the catalog looks again after this.
const LOOKUP_RETRY: Duration = Duration::from_secs(1);
/// The version `WatchServers` reports.
const VERSION: &str = "1.20.1";
/// Oldest Envoy minor version served (Consul 1.20 supports 1.26 .. 1.29).
const ENVOY_MIN: (u32, u32) = (1, 26);
/// What Consul says over its xDS stream cap (and when it drains streams to
/// rebalance them, `errOverwhelmed`).
pub(crate) const TOO_MANY_STREAMS: &str =
    "this server has too many xDS streams open, please try another";
/// Largest Delta xDS request decoded. Consul's public gRPC server accepts
/// 50 MiB (`grpc.MaxRecvMsgSize`); the requests of a sidecar are a few
/// hundred bytes but for `initial_resource_versions` after a reconnect
/// (≈150 bytes per resource held), so 4 MiB holds the versions of
/// [`MAX_NAMES_PER_TYPE`] resources with room, and bounds what one stream
/// makes this backend reserve (tonic reserves on the length prefix).
pub const MAX_XDS_REQUEST: usize = 4 * 1024 * 1024;
/// Largest bootstrap-params, features or `WatchServers` request decoded
/// (they are tens of bytes).
pub const MAX_REQUEST_MESSAGE: usize = 64 * 1024;
/// Most resource names a stream holds per type (subscribed, or offered in
/// `initial_resource_versions`): far above the clusters of one proxy
/// (one per upstream), and ≈ 2 MiB of names and versions at most; a request
/// that would go beyond it ends the stream with `RESOURCE_EXHAUSTED`.
pub const MAX_NAMES_PER_TYPE: usize = 16_384;
/// HTTP/2 header block accepted on the gRPC port (a call's metadata is a
/// few hundred bytes).
const MAX_HEADER_LIST: u32 = 16 * 1024;

/// Consul's pacing of proxy updates (`proxycfg.Manager`'s rate limiter,
/// `xds.update_max_per_second`): ONE token bucket for the whole server,
/// burst 1, refilled at `rate` per second. Each proxy update reserves a
/// token when it is scheduled and waits `max(token delay, coalesce)`, so
/// an endpoint change that reaches N proxies at once is delivered to them
/// over `N / rate` seconds (200 sidecars at 250/s: from 200 ms to ≈ 800 ms,
/// p50 ≈ 400 ms, as a real Consul 1.20 server does).
#[derive(Debug)]
pub(crate) struct Pacer {
    /// Tokens per second (`0`, negative or not finite: no limit).
    rate: f64,
    /// Tokens in the bucket at `last` (≤ 1; negative: reserved ahead).
    tokens: f64,
    last: Option<Instant>,
}

impl Pacer {
    pub(crate) fn new(rate: f64) -> Pacer {
        Pacer {
            rate,
            tokens: 1.0,
            last: None,
        }
    }

    /// Reserves one token at `now`: how long until it is there (golang's
    /// `rate.Limiter.Reserve().Delay()` with burst 1).
    pub(crate) fn reserve(&mut self, now: Instant) -> Duration {
        if !(self.rate.is_finite() && self.rate > 0.0) {
            return Duration::ZERO;
        }
        let elapsed = self
            .last
            .map_or(Duration::ZERO, |l| now.saturating_duration_since(l));
        self.tokens = (self.tokens + elapsed.as_secs_f64() * self.rate).min(1.0);
        self.last = Some(now);
        self.tokens -= 1.0;
        if self.tokens < 0.0 {
            Duration::from_secs_f64(-self.tokens / self.rate)
        } else {
            Duration::ZERO
        }
    }
}

/// Serves the public gRPC port until `shutdown` is cancelled.
pub async fn serve_grpc(
    listener: TcpListener,
    state: ConsulState,
    shutdown: CancellationToken,
) -> io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        *lock(&state.inner.grpc_addr) = Some(addr);
    }
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .keep_alive_interval(None)
        .max_header_list_size(MAX_HEADER_LIST)
        .max_concurrent_streams(1024);
    let builder = Arc::new(builder);
    let conns = state.clone();
    super::accept_loop(listener, &state, shutdown.clone(), move |stream| {
        grpc_connection(stream, conns.clone(), builder.clone(), shutdown.clone())
    })
    .await
}

async fn grpc_connection(
    stream: TcpStream,
    state: ConsulState,
    builder: Arc<http2::Builder<TokioExecutor>>,
    shutdown: CancellationToken,
) {
    let _ = stream.set_nodelay(true);
    // With faults armed, the connection has a kill switch (a `consul.xds`
    // reset of a stream resets the connection carrying it).
    let stream = state.faults().io(stream);
    let ctl = stream.ctl();
    match state.inner.cfg.tls.clone() {
        None => serve(stream, state, builder, shutdown, ctl).await,
        Some(tls) => {
            let accepted = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = tokio::time::timeout(
                    HANDSHAKE_TIMEOUT,
                    tokio_rustls::TlsAcceptor::from(tls).accept(stream),
                ) => r,
            };
            if let Ok(Ok(tls)) = accepted {
                serve(tls, state, builder, shutdown, ctl).await;
            }
        }
    }
}

async fn serve<I>(
    io: I,
    state: ConsulState,
    builder: Arc<http2::Builder<TokioExecutor>>,
    shutdown: CancellationToken,
    ctl: Option<Arc<ConnCtl>>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = Router {
        state,
        shutdown: shutdown.clone(),
        ctl,
    };
    let conn = builder.serve_connection(TokioIo::new(io), svc);
    super::drive_connection(conn, &shutdown, |c| c.graceful_shutdown()).await;
}

/// The port's codec buffers: requests and answers are small (a bootstrap
/// answer, one server, a proxy's clusters); a buffer grows for a larger one.
const BUFFERS: Buffers = Buffers::new(1024, 512);

/// The port's codec profile: [`BUFFERS`], and requests with top-level
/// fields outside `known` counted (`grpc_unknown_fields`).
#[derive(Clone)]
struct UnknownFields {
    state: ConsulState,
    known: &'static [u32],
}

impl Profile for UnknownFields {
    fn buffers(&self) -> Buffers {
        BUFFERS
    }

    /// A scan of the request's top-level fields (`agent_sim_proto::scan`:
    /// no allocation).
    fn inspect(&self, msg: &[u8]) {
        if agent_sim_proto::scan::unknown_fields(msg, self.known).is_some() {
            let c = &self.state.inner.counters;
            c.bump(&c.grpc_unknown_fields);
        }
    }
}

/// The codec of a unary or server-streaming method (answers `E`,
/// requests `D` whose known fields are `known`).
fn small<E, D>(
    state: &ConsulState,
    known: &'static [u32],
) -> SmallCodec<ProstEncoder<E>, D, UnknownFields> {
    SmallCodec::new(UnknownFields {
        state: state.clone(),
        known,
    })
}

/// What an ADS stream writes: a response, or (a `consul.xds=garbage`
/// fault) bytes that are none.
enum AdsOut {
    Response(Box<DeltaDiscoveryResponse>),
    Raw(Bytes),
}

/// Encodes [`AdsOut`].
struct AdsEncoder(BufferSettings);

impl Encoder for AdsEncoder {
    type Item = AdsOut;
    type Error = Status;

    fn encode(&mut self, item: AdsOut, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        match item {
            AdsOut::Response(r) => r
                .encode(dst)
                .map_err(|e| Status::internal(format!("encoding a response: {e}"))),
            AdsOut::Raw(b) => {
                dst.put_slice(&b);
                Ok(())
            }
        }
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0
    }
}

impl SizedEncoder for AdsEncoder {
    fn with_settings(settings: BufferSettings) -> Self {
        AdsEncoder(settings)
    }
}

/// The Delta ADS codec: [`AdsOut`] out, scanned `DeltaDiscoveryRequest`s in.
type AdsCodec = SmallCodec<AdsEncoder, DeltaDiscoveryRequest, UnknownFields>;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

#[derive(Clone)]
struct Router {
    state: ConsulState,
    shutdown: CancellationToken,
    /// The connection's kill switch (faults armed only).
    ctl: Option<Arc<ConnCtl>>,
}

impl hyper::service::Service<Request<Incoming>> for Router {
    type Response = Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let state = self.state.clone();
        let shutdown = self.shutdown.clone();
        match req.uri().path() {
            BOOTSTRAP_PATH => Box::pin(async move {
                let codec = small::<GetEnvoyBootstrapParamsResponse, GetEnvoyBootstrapParamsRequest>(
                    &state,
                    fields::BOOTSTRAP_REQUEST,
                );
                let mut g = Grpc::new(codec).max_decoding_message_size(MAX_REQUEST_MESSAGE);
                Ok(g.unary(Bootstrap(state), req).await)
            }),
            FEATURES_PATH => Box::pin(async move {
                let codec = small::<
                    GetSupportedDataplaneFeaturesResponse,
                    GetSupportedDataplaneFeaturesRequest,
                >(&state, &[]);
                let mut g = Grpc::new(codec).max_decoding_message_size(MAX_REQUEST_MESSAGE);
                Ok(g.unary(Features, req).await)
            }),
            WATCH_SERVERS_PATH => Box::pin(async move {
                let codec = small::<WatchServersResponse, WatchServersRequest>(
                    &state,
                    fields::WATCH_SERVERS_REQUEST,
                );
                let mut g = Grpc::new(codec).max_decoding_message_size(MAX_REQUEST_MESSAGE);
                Ok(g.server_streaming(WatchServers(state, shutdown), req).await)
            }),
            ADS_PATH => {
                let ctl = self.ctl.clone();
                Box::pin(async move {
                    let codec = AdsCodec::new(UnknownFields {
                        state: state.clone(),
                        known: fields::DELTA_DISCOVERY_REQUEST,
                    });
                    let mut g = Grpc::new(codec).max_decoding_message_size(MAX_XDS_REQUEST);
                    Ok(g.streaming(
                        Ads {
                            state,
                            shutdown,
                            ctl,
                        },
                        req,
                    )
                    .await)
                })
            }
            SOTW_PATH => {
                let s = Status::unimplemented("method StreamAggregatedResources not implemented");
                Box::pin(ready(Ok(s.into_http())))
            }
            path => {
                let service = path.trim_start_matches('/').split('/').next().unwrap_or("");
                let s = Status::unimplemented(format!("unknown service {service}"));
                Box::pin(ready(Ok(s.into_http())))
            }
        }
    }
}

/// The ACL check of a call's `x-consul-token`, in Consul's words.
fn authorize(state: &ConsulState, md: &MetadataMap) -> Result<(), Status> {
    let token = md
        .get("x-consul-token")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    match state.acl_check(token) {
        Ok(()) => Ok(()),
        Err(Some(())) => Err(Status::unauthenticated("ACL not found")),
        Err(None) => Err(Status::permission_denied(
            "Permission denied: anonymous token lacks permission 'service:read'",
        )),
    }
}

struct Bootstrap(ConsulState);

impl UnaryService<GetEnvoyBootstrapParamsRequest> for Bootstrap {
    type Response = GetEnvoyBootstrapParamsResponse;
    type Future = BoxFuture<Result<tonic::Response<Self::Response>, Status>>;

    fn call(&mut self, req: tonic::Request<GetEnvoyBootstrapParamsRequest>) -> Self::Future {
        let state = self.0.clone();
        Box::pin(async move {
            authorize(&state, req.metadata())?;
            let r = req.into_inner();
            let proxy_id = if r.service_id.is_empty() {
                r.proxy_id
            } else {
                r.service_id
            };
            let store = state.store();
            let node = match r.node_spec {
                Some(NodeSpec::NodeName(n)) => n,
                Some(NodeSpec::NodeId(id)) => store
                    .nodes
                    .iter()
                    .find(|(_, n)| n.def.id == id)
                    .map(|(name, _)| name.clone())
                    .ok_or_else(|| Status::not_found("node not found"))?,
                None => return Err(Status::invalid_argument("Node ID or name required")),
            };
            let n = store
                .nodes
                .get(&node)
                .ok_or_else(|| Status::not_found("node not found"))?;
            let svc = n
                .services
                .get(&proxy_id)
                .ok_or_else(|| Status::not_found("Service not found"))?;
            let (kind, service) = match svc.def.connect_destination() {
                Some(dest) => (ServiceKind::ConnectProxy, dest.to_owned()),
                None => (ServiceKind::Typical, svc.def.service.clone()),
            };
            let resp = GetEnvoyBootstrapParamsResponse {
                service_kind: kind as i32,
                service,
                namespace: "default".into(),
                partition: "default".into(),
                datacenter: store.datacenter.clone(),
                node_id: n.def.id.clone(),
                node_name: node,
            };
            drop(store);
            let c = &state.inner.counters;
            c.bump(&c.xds_bootstraps);
            Ok(tonic::Response::new(resp))
        })
    }
}

struct Features;

impl UnaryService<GetSupportedDataplaneFeaturesRequest> for Features {
    type Response = GetSupportedDataplaneFeaturesResponse;
    type Future = BoxFuture<Result<tonic::Response<Self::Response>, Status>>;

    fn call(&mut self, _: tonic::Request<GetSupportedDataplaneFeaturesRequest>) -> Self::Future {
        let f = |feature: DataplaneFeatures| DataplaneFeatureSupport {
            feature_name: feature as i32,
            supported: true,
        };
        Box::pin(ready(Ok(tonic::Response::new(
            GetSupportedDataplaneFeaturesResponse {
                supported_dataplane_features: vec![
                    f(DataplaneFeatures::WatchServers),
                    f(DataplaneFeatures::EdgeCertificateManagement),
                    f(DataplaneFeatures::EnvoyBootstrapConfiguration),
                ],
            },
        ))))
    }
}

type ServerStream = Pin<Box<dyn Stream<Item = Result<WatchServersResponse, Status>> + Send>>;

struct WatchServers(ConsulState, CancellationToken);

impl ServerStreamingService<WatchServersRequest> for WatchServers {
    type Response = WatchServersResponse;
    type ResponseStream = ServerStream;
    type Future = BoxFuture<Result<tonic::Response<ServerStream>, Status>>;

    fn call(&mut self, req: tonic::Request<WatchServersRequest>) -> Self::Future {
        let (state, shutdown) = (self.0.clone(), self.1.clone());
        Box::pin(async move {
            authorize(&state, req.metadata())?;
            let addr = lock(&state.inner.grpc_addr)
                .map(|a| a.ip().to_string())
                .unwrap_or_else(|| "127.0.0.1".into());
            let list = WatchServersResponse {
                servers: vec![Server {
                    id: state.inner.cfg.node_name.clone(),
                    address: addr,
                    version: VERSION.into(),
                }],
            };
            // The list once; then nothing until the server goes away.
            let stream = futures_util::stream::unfold(Some(list), move |first| {
                let shutdown = shutdown.clone();
                async move {
                    match first {
                        Some(l) => Some((Ok(l), None)),
                        None => {
                            shutdown.cancelled().await;
                            None
                        }
                    }
                }
            });
            Ok(tonic::Response::new(Box::pin(stream) as ServerStream))
        })
    }
}

/// One resource type's state on a stream (what Consul's delta server keeps).
#[derive(Default)]
struct TypeState {
    registered: bool,
    wildcard: bool,
    sent_once: bool,
    subscriptions: BTreeSet<String>,
    /// What the proxy has ACKed: name → version.
    versions: HashMap<String, String>,
    /// Sent, not yet ACKed: nonce → (name, version or `None` for a removal).
    pending: HashMap<String, Vec<(String, Option<String>)>>,
}

impl TypeState {
    fn subscribed(&self, name: &str) -> bool {
        self.wildcard || self.subscriptions.contains(name)
    }

    /// The response that brings the proxy to `current` (upserts and/or
    /// removals), Consul's `createDeltaResponse`; `None` when nothing is due.
    fn delta(
        &mut self,
        type_url: &str,
        current: &xds::Resources,
        upsert: bool,
        remove: bool,
        nonce: &mut u64,
    ) -> Option<DeltaDiscoveryResponse> {
        if !self.registered || current.is_empty() {
            return None;
        }
        let mut relevant = false;
        let mut updates: Vec<(String, Option<String>)> = Vec::new();
        for (name, held) in &self.versions {
            if !self.subscribed(name) {
                continue;
            }
            match current.get(name) {
                None if self.wildcard => {
                    relevant |= remove;
                    updates.push((name.clone(), None));
                }
                None => {}
                Some(b) if b.version != *held => {
                    relevant |= upsert;
                    updates.push((name.clone(), Some(b.version.clone())));
                }
                Some(_) => {}
            }
        }
        for (name, b) in current {
            if self.versions.contains_key(name) || !self.subscribed(name) {
                continue;
            }
            relevant |= upsert;
            updates.push((name.clone(), Some(b.version.clone())));
        }
        if !relevant && self.sent_once {
            return None;
        }
        let mut resp = DeltaDiscoveryResponse {
            type_url: type_url.to_owned(),
            ..Default::default()
        };
        let mut real = Vec::new();
        for (name, version) in updates {
            match version {
                None if remove => {
                    resp.removed_resources.push(name.clone());
                    real.push((name, None));
                }
                Some(v) if upsert => {
                    resp.resources.push(Resource {
                        name: name.clone(),
                        version: v.clone(),
                        resource: Some(current[&name].any.clone()),
                        ..Default::default()
                    });
                    real.push((name, Some(v)));
                }
                _ => {}
            }
        }
        resp.resources.sort_by(|a, b| a.name.cmp(&b.name));
        *nonce += 1;
        resp.nonce = format!("{:08x}", *nonce);
        self.pending.insert(resp.nonce.clone(), real);
        Some(resp)
    }

    /// Applies an ACK; returns the names upserted (their children must be
    /// sent again).
    fn ack(&mut self, nonce: &str) -> Vec<String> {
        let Some(updates) = self.pending.remove(nonce) else {
            return Vec::new();
        };
        self.sent_once = true;
        let mut upserted = Vec::new();
        for (name, version) in updates {
            match version {
                None => {
                    self.versions.remove(&name);
                }
                Some(v) => {
                    self.versions.insert(name.clone(), v);
                    upserted.push(name);
                }
            }
        }
        upserted
    }
}

type AdsStream = Pin<Box<dyn Stream<Item = Result<AdsOut, Status>> + Send>>;

struct Ads {
    state: ConsulState,
    shutdown: CancellationToken,
    ctl: Option<Arc<ConnCtl>>,
}

/// `consul.xds` actions that hit a stream (the others hit a response).
fn stream_action(a: &Action) -> bool {
    matches!(a, Action::Reset | Action::ResourceExhausted)
}

impl StreamingService<DeltaDiscoveryRequest> for Ads {
    type Response = AdsOut;
    type ResponseStream = AdsStream;
    type Future = BoxFuture<Result<tonic::Response<AdsStream>, Status>>;

    fn call(&mut self, req: tonic::Request<Streaming<DeltaDiscoveryRequest>>) -> Self::Future {
        let (state, shutdown, ctl) = (self.state.clone(), self.shutdown.clone(), self.ctl.clone());
        Box::pin(async move {
            authorize(&state, req.metadata())?;
            let c = &state.inner.counters;
            let cap = state.inner.cfg.xds_max_streams;
            if cap > 0
                && c.xds_streams_active
                    .load(std::sync::atomic::Ordering::Relaxed)
                    >= cap as u64
            {
                c.bump(&c.xds_streams_refused);
                return Err(Status::resource_exhausted(TOO_MANY_STREAMS));
            }
            let faults = state.faults();
            if let Some(hit) = faults.pick_if(Target::ConsulXds, stream_action) {
                match hit.action {
                    Action::Reset => {
                        // The connection carrying the stream is reset.
                        if let Some(ctl) = &ctl {
                            ctl.kill(Kill::Reset);
                        }
                        return Err(Status::unavailable("connection reset (fault)"));
                    }
                    _ => return Err(Status::resource_exhausted(TOO_MANY_STREAMS)),
                }
            }
            c.bump(&c.xds_streams);
            let s = AdsSession {
                gauge: Gauge::up(&state, |c| &c.xds_streams_active),
                orders: faults.orders(Target::ConsulXds),
                state,
                inbound: req.into_inner(),
                shutdown,
                ctl,
                node: None,
                proxy: None,
                types: [TypeState::default(), TypeState::default()],
                nonce: 0,
                current: None,
                watches: Vec::new(),
                coalesce_at: None,
                lookup_at: None,
                hold: false,
                done: false,
                first_request: true,
            };
            let stream = futures_util::stream::unfold(s, |mut s| async move {
                let item = s.next().await?;
                Some((item, s))
            });
            Ok(tonic::Response::new(Box::pin(stream) as AdsStream))
        })
    }
}

/// One Delta ADS stream.
struct AdsSession {
    state: ConsulState,
    inbound: Streaming<DeltaDiscoveryRequest>,
    shutdown: CancellationToken,
    #[allow(dead_code)]
    gauge: Gauge,
    /// The connection's kill switch (faults armed only).
    ctl: Option<Arc<ConnCtl>>,
    /// Orders of timed `consul.xds` faults.
    orders: Option<tokio::sync::watch::Receiver<Order>>,
    node: Option<Node>,
    /// (node name, proxy service ID), once found in the catalog.
    proxy: Option<(String, String)>,
    /// Clusters, endpoints.
    types: [TypeState; 2],
    nonce: u64,
    current: Option<ProxyResources>,
    // Bound: one receiver per upstream of the proxy (its `Upstreams`, part
    // of a bounded catalog entry) plus its own service.
    watches: Vec<broadcast::Receiver<Bytes>>,
    /// When the next (coalesced, paced) rebuild is due.
    coalesce_at: Option<Instant>,
    lookup_at: Option<Instant>,
    /// A NACK came: send nothing until the next request or catalog change
    /// (the same resources would be refused again), as Consul does.
    hold: bool,
    done: bool,
    /// No request yet on this stream.
    first_request: bool,
}

enum Wake {
    Shutdown,
    Request(Result<Option<Box<DeltaDiscoveryRequest>>, Status>),
    Rebuild,
    Lookup,
    Changed,
    Order,
}

/// Resolves when any receiver has a message (or lagged); never with none.
async fn any_change(watches: &mut [broadcast::Receiver<Bytes>]) {
    if watches.is_empty() {
        return std::future::pending().await;
    }
    let _ = futures_util::future::select_all(watches.iter_mut().map(|r| Box::pin(r.recv()))).await;
    for w in watches.iter_mut() {
        while !matches!(
            w.try_recv(),
            Err(broadcast::error::TryRecvError::Empty | broadcast::error::TryRecvError::Closed)
        ) {}
    }
}

/// Waits for the next order, or forever without a channel.
async fn next_order(orders: &mut Option<tokio::sync::watch::Receiver<Order>>) {
    match orders {
        Some(rx) => {
            if rx.changed().await.is_err() {
                *orders = None;
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

fn type_index(type_url: &str) -> Option<usize> {
    match type_url {
        CLUSTER_TYPE => Some(0),
        ENDPOINT_TYPE => Some(1),
        _ => None,
    }
}

const TYPE_URLS: [&str; 2] = [CLUSTER_TYPE, ENDPOINT_TYPE];

/// Consul's order of operations: upserts of clusters, then endpoints, then
/// removals of clusters, then endpoints.
const ORDER: [(usize, bool, bool); 4] = [
    (0, true, false),
    (1, true, false),
    (0, false, true),
    (1, false, true),
];

/// The Envoy version a node announces, if any.
fn envoy_version(node: &Node) -> Option<(u32, u32, u32)> {
    match &node.user_agent_version_type {
        Some(UserAgentVersionType::UserAgentBuildVersion(b)) => {
            let v = b.version.as_ref()?;
            Some((v.major_number, v.minor_number, v.patch))
        }
        _ => None,
    }
}

fn metadata_str<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    match &node.metadata.as_ref()?.fields.get(key)?.kind {
        Some(Kind::StringValue(s)) if !s.is_empty() => Some(s),
        _ => None,
    }
}

/// The words of a stream ended for holding too many names.
fn too_many_names(type_url: &str) -> Status {
    Status::resource_exhausted(format!(
        "agent-sim serve: a stream holds at most {MAX_NAMES_PER_TYPE} resource names of type \
         {type_url}"
    ))
}

impl AdsSession {
    async fn next(&mut self) -> Option<Result<AdsOut, Status>> {
        loop {
            if self.done {
                return None;
            }
            if let Some(resp) = self.due() {
                return self.emit(resp).await;
            }
            let far = Instant::now() + Duration::from_secs(3600);
            let wake = tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => Wake::Shutdown,
                r = self.inbound.message() => Wake::Request(r.map(|o| o.map(Box::new))),
                () = next_order(&mut self.orders) => Wake::Order,
                _ = tokio::time::sleep_until(self.coalesce_at.unwrap_or(far)),
                    if self.coalesce_at.is_some() => Wake::Rebuild,
                _ = tokio::time::sleep_until(self.lookup_at.unwrap_or(far)),
                    if self.lookup_at.is_some() => Wake::Lookup,
                _ = any_change(&mut self.watches) => Wake::Changed,
            };
            match wake {
                Wake::Shutdown => {
                    self.done = true;
                    return Some(Err(Status::unavailable("server is shutting down")));
                }
                Wake::Request(Ok(Some(req))) => {
                    if let Err(s) = self.on_request(*req) {
                        self.done = true;
                        return Some(Err(s));
                    }
                }
                Wake::Request(Ok(None)) => return None,
                Wake::Request(Err(s)) => {
                    // A request that did not decode, or over the limit
                    // (tonic's words); a client that went away ends here
                    // too, without a request.
                    let refused = match s.code() {
                        tonic::Code::OutOfRange => true,
                        tonic::Code::Internal => s.message().contains("failed to decode"),
                        _ => false,
                    };
                    if refused {
                        let c = &self.state.inner.counters;
                        c.bump(&c.xds_requests_refused);
                    }
                    self.done = true;
                    return Some(Err(s));
                }
                Wake::Rebuild => {
                    self.coalesce_at = None;
                    self.hold = false;
                    self.rebuild();
                }
                Wake::Lookup => {
                    self.lookup_at = None;
                    self.lookup();
                }
                Wake::Changed => {
                    if self.coalesce_at.is_none() {
                        self.schedule();
                    }
                }
                Wake::Order => {
                    let order = self.orders.as_mut().map(|rx| *rx.borrow_and_update());
                    let faults = self.state.faults().clone();
                    match order.and_then(|o| faults.obey(o)) {
                        Some(Action::Reset) => {
                            if let Some(ctl) = &self.ctl {
                                ctl.kill(Kill::Reset);
                            }
                            self.done = true;
                            return None;
                        }
                        Some(Action::ResourceExhausted) => {
                            // Consul drains streams to rebalance them
                            // (`errOverwhelmed`), in these words.
                            self.done = true;
                            return Some(Err(Status::resource_exhausted(TOO_MANY_STREAMS)));
                        }
                        _ => {}
                    }
                }
            }
        }
    }

    /// Schedules the next rebuild: after the coalescing delay, or later when
    /// the server-wide pacing says so (a token reserved now).
    fn schedule(&mut self) {
        let now = Instant::now();
        let paced = lock(&self.state.inner.xds_pacer).reserve(now);
        self.coalesce_at = Some(now + paced.max(self.state.inner.cfg.xds_coalesce));
    }

    /// Sends `resp`, after what a `consul.xds` fault on responses does: a
    /// delay; garbage instead of it (then the stream ends, as no client
    /// reads past a message it cannot decode); or one of its resources
    /// replaced by bytes that do not parse (a response without resources
    /// is no unit of this fault).
    async fn emit(&mut self, mut resp: DeltaDiscoveryResponse) -> Option<Result<AdsOut, Status>> {
        let faults = self.state.faults().clone();
        if let Some(hit) = faults.draw_if(Target::ConsulXds, None, |a| !stream_action(a)) {
            match hit.action {
                Action::Delay(d) if faults.confirm(hit.idx) => {
                    tokio::select! {
                        _ = self.shutdown.cancelled() => {
                            self.done = true;
                            return Some(Err(Status::unavailable("server is shutting down")));
                        }
                        () = tokio::time::sleep(d) => {}
                    }
                }
                Action::Garbage if faults.confirm(hit.idx) => {
                    self.done = true;
                    let junk = crate::faults::garbage(fastrand::u64(..), 32);
                    return Some(Ok(AdsOut::Raw(Bytes::from(junk))));
                }
                Action::BadResource if !resp.resources.is_empty() && faults.confirm(hit.idx) => {
                    if let Some(any) = resp.resources[0].resource.as_mut() {
                        any.value = BAD_RESOURCE.to_vec();
                    }
                }
                _ => {}
            }
        }
        let c = &self.state.inner.counters;
        c.bump(&c.xds_responses);
        Some(Ok(AdsOut::Response(Box::new(resp))))
    }

    fn on_request(&mut self, req: DeltaDiscoveryRequest) -> Result<(), Status> {
        if req.type_url.is_empty() {
            return Err(Status::invalid_argument("type URL is required for ADS"));
        }
        let counters = self.state.inner.counters.clone();
        let c = &*counters;
        if std::mem::take(&mut self.first_request) && !req.initial_resource_versions.is_empty() {
            c.bump(&c.xds_streams_resumed);
        }
        if self.node.is_none()
            && let Some(node) = req.node.clone()
        {
            if let Some((major, minor, patch)) = envoy_version(&node)
                && (major, minor) < ENVOY_MIN
            {
                return Err(Status::invalid_argument(format!(
                    "Envoy {major}.{minor}.{patch} is too old and is not supported by Consul"
                )));
            }
            self.node = Some(node);
            self.lookup();
        }
        let Some(t) = type_index(&req.type_url) else {
            // A type this server has no handler for (listeners, routes,
            // secrets, ...): ignored, as Consul does.
            c.bump(&c.xds_unknown_types);
            return Ok(());
        };
        let [clusters, endpoints] = &mut self.types;
        let (ty, child) = if t == 0 {
            (clusters, Some(endpoints))
        } else {
            (endpoints, None)
        };
        let first = !ty.registered;
        if first {
            ty.wildcard = req.resource_names_subscribe.is_empty();
            ty.registered = true;
        }
        if !req.response_nonce.is_empty() {
            if req.error_detail.is_none() {
                c.bump(&c.xds_acks);
                // Endpoints live in their cluster: an upserted cluster
                // needs its endpoints again.
                let upserted = ty.ack(&req.response_nonce);
                if let Some(child) = child {
                    for name in upserted {
                        if child.versions.contains_key(&name) && child.subscribed(&name) {
                            child.versions.insert(name, String::new());
                        }
                    }
                }
            } else {
                c.bump(&c.xds_nacks);
                ty.pending.remove(&req.response_nonce);
                self.hold = true;
                return Ok(());
            }
        }
        self.hold = false;
        let names = |ty: &TypeState, more: usize| {
            ty.subscriptions.len().max(ty.versions.len()) + more > MAX_NAMES_PER_TYPE
        };
        if first && !req.initial_resource_versions.is_empty() {
            if names(ty, req.initial_resource_versions.len()) {
                c.bump(&c.xds_requests_refused);
                return Err(too_many_names(&req.type_url));
            }
            if !ty.wildcard {
                ty.subscriptions
                    .extend(req.initial_resource_versions.keys().cloned());
            }
            ty.versions = req.initial_resource_versions;
        }
        if !ty.wildcard {
            if names(ty, req.resource_names_subscribe.len()) {
                c.bump(&c.xds_requests_refused);
                return Err(too_many_names(&req.type_url));
            }
            for name in req.resource_names_subscribe {
                if let Some(v) = ty.versions.get_mut(&name) {
                    v.clear();
                }
                ty.subscriptions.insert(name);
            }
            for name in &req.resource_names_unsubscribe {
                ty.subscriptions.remove(name);
            }
        }
        Ok(())
    }

    /// Finds the proxy (`node.id` on `metadata.node_name`, else on the
    /// server's own node) and schedules its first configuration (coalesced
    /// and paced like every update, as Consul's proxycfg delivers a new
    /// proxy's first snapshot).
    fn lookup(&mut self) {
        let Some(node) = &self.node else { return };
        let node_name = metadata_str(node, "node_name")
            .unwrap_or(&self.state.inner.cfg.node_name)
            .to_owned();
        let key = (node_name, node.id.clone());
        let found = self
            .state
            .store()
            .service(&key)
            .is_some_and(|s| s.def.connect_destination().is_some());
        if found {
            self.proxy = Some(key);
            if self.coalesce_at.is_none() {
                self.schedule();
            }
        } else {
            self.lookup_at = Some(Instant::now() + LOOKUP_RETRY);
        }
    }

    /// Rebuilds the resources from the catalog (and the watches, when the
    /// upstreams changed).
    fn rebuild(&mut self) {
        let Some(key) = &self.proxy else { return };
        let trust = self.state.trust_domain().to_owned();
        let mut store = self.state.store();
        let Some(def) = store.service(key).map(|s| s.def.clone()) else {
            // The proxy is gone: keep what it has until it comes back.
            drop(store);
            self.lookup_at = Some(Instant::now() + LOOKUP_RETRY);
            self.proxy = None;
            return;
        };
        let built = xds::build(&store, &trust, &def);
        let ups = xds::upstreams(&def);
        let want = ups.len() + 1;
        if self.watches.len() != want || self.current.is_none() {
            let mut keys: Vec<TopicKey> = ups
                .iter()
                .map(|u| TopicKey::new(Topic::ServiceHealthConnect, u))
                .collect();
            keys.push(TopicKey::new(Topic::ServiceHealth, &def.service));
            self.watches = keys.iter().map(|k| store.watch(k)).collect();
        }
        drop(store);
        self.current = built;
    }

    /// The next response to send, if one is due and none is in flight.
    fn due(&mut self) -> Option<DeltaDiscoveryResponse> {
        if self.hold {
            return None;
        }
        let current = self.current.as_ref()?;
        if self.types.iter().any(|t| !t.pending.is_empty()) {
            return None;
        }
        for (t, upsert, remove) in ORDER {
            let url = TYPE_URLS[t];
            let res = current.of_type(url)?;
            if let Some(r) = self.types[t].delta(url, res, upsert, remove, &mut self.nonce) {
                return Some(r);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_pacer_spaces_reservations_by_one_over_the_rate() {
        let mut p = Pacer::new(250.0);
        let t0 = Instant::now();
        let delays: Vec<Duration> = (0..4).map(|_| p.reserve(t0)).collect();
        let ms = |n| Duration::from_millis(n);
        assert_eq!(delays, vec![ms(0), ms(4), ms(8), ms(12)]);
        // The bucket refills at the rate, to one token at most.
        let later = t0 + Duration::from_secs(1);
        assert_eq!(p.reserve(later), Duration::ZERO);
        assert_eq!(p.reserve(later), ms(4));
        let mut off = Pacer::new(0.0);
        assert_eq!(off.reserve(t0), Duration::ZERO);
        assert_eq!(off.reserve(t0), Duration::ZERO);
    }

    #[test]
    fn n_updates_at_once_take_n_over_the_rate_and_no_rate_is_no_limit() {
        let t0 = Instant::now();
        let mut p = Pacer::new(50.0);
        let last = (0..100).map(|_| p.reserve(t0)).last().unwrap();
        assert_eq!(last, Duration::from_secs_f64(99.0 / 50.0));
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let mut p = Pacer::new(rate);
            assert!((0..1000).all(|_| p.reserve(t0).is_zero()), "{rate}");
        }
    }
}
