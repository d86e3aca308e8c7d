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
//!   are coalesced for [`super::ConsulTargetConfig::xds_coalesce`] before the
//!   resources are rebuilt; over `xds_max_streams` a stream is refused with
//!   `RESOURCE_EXHAUSTED`.

use std::collections::{BTreeSet, HashMap};
use std::convert::Infallible;
use std::future::{Future, ready};
use std::io;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use agent_sim_proto::consul::dataplane::{
    DataplaneFeatureSupport, DataplaneFeatures, GetEnvoyBootstrapParamsRequest,
    GetEnvoyBootstrapParamsResponse, GetSupportedDataplaneFeaturesRequest,
    GetSupportedDataplaneFeaturesResponse, ServiceKind,
    get_envoy_bootstrap_params_request::NodeSpec,
};
use agent_sim_proto::consul::serverdiscovery::{Server, WatchServersRequest, WatchServersResponse};
use agent_sim_proto::consul::subscribe::Topic;
use bytes::Bytes;
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
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::broadcast;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::codec::{BufferSettings, Codec, Streaming};
use tonic::server::{Grpc, ServerStreamingService, StreamingService, UnaryService};
use tonic::{Status, metadata::MetadataMap};
use tonic_prost::{ProstDecoder, ProstEncoder};

use super::state::TopicKey;
use super::xds::{self, CLUSTER_TYPE, ENDPOINT_TYPE, ProxyResources};
use super::{ConsulState, Gauge, lock};

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
/// What Consul says over its xDS stream cap.
pub(crate) const TOO_MANY_STREAMS: &str =
    "this server has too many xDS streams open, please try another";

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
        .max_concurrent_streams(1024);
    let builder = Arc::new(builder);
    super::accept_loop(listener, shutdown.clone(), move |stream| {
        grpc_connection(stream, state.clone(), builder.clone(), shutdown.clone())
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
    match state.inner.cfg.tls.clone() {
        None => serve(stream, state, builder, shutdown).await,
        Some(tls) => {
            let accepted = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = tokio::time::timeout(
                    HANDSHAKE_TIMEOUT,
                    tokio_rustls::TlsAcceptor::from(tls).accept(stream),
                ) => r,
            };
            if let Ok(Ok(tls)) = accepted {
                serve(tls, state, builder, shutdown).await;
            }
        }
    }
}

async fn serve<I>(
    io: I,
    state: ConsulState,
    builder: Arc<http2::Builder<TokioExecutor>>,
    shutdown: CancellationToken,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = Router {
        state,
        shutdown: shutdown.clone(),
    };
    let conn = builder.serve_connection(TokioIo::new(io), svc);
    super::drive_connection(conn, &shutdown, |c| c.graceful_shutdown()).await;
}

/// A prost codec with small buffers (server side: encodes `E`, decodes `D`).
struct Small<E, D>(PhantomData<fn(D) -> E>);

impl<E, D> Default for Small<E, D> {
    fn default() -> Self {
        Small(PhantomData)
    }
}

impl<E, D> Codec for Small<E, D>
where
    E: prost::Message + Send + 'static,
    D: prost::Message + Default + Send + 'static,
{
    type Encode = E;
    type Decode = D;
    type Encoder = ProstEncoder<E>;
    type Decoder = ProstDecoder<D>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::new(1024, 32 * 1024))
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::new(BufferSettings::new(512, 32 * 1024))
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

#[derive(Clone)]
struct Router {
    state: ConsulState,
    shutdown: CancellationToken,
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
                let mut g = Grpc::new(Small::<
                    GetEnvoyBootstrapParamsResponse,
                    GetEnvoyBootstrapParamsRequest,
                >::default());
                Ok(g.unary(Bootstrap(state), req).await)
            }),
            FEATURES_PATH => Box::pin(async move {
                let mut g = Grpc::new(Small::<
                    GetSupportedDataplaneFeaturesResponse,
                    GetSupportedDataplaneFeaturesRequest,
                >::default());
                Ok(g.unary(Features, req).await)
            }),
            WATCH_SERVERS_PATH => Box::pin(async move {
                let mut g =
                    Grpc::new(Small::<WatchServersResponse, WatchServersRequest>::default());
                Ok(g.server_streaming(WatchServers(state, shutdown), req).await)
            }),
            ADS_PATH => Box::pin(async move {
                let mut g =
                    Grpc::new(Small::<DeltaDiscoveryResponse, DeltaDiscoveryRequest>::default());
                Ok(g.streaming(Ads(state, shutdown), req).await)
            }),
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

type AdsStream = Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

struct Ads(ConsulState, CancellationToken);

impl StreamingService<DeltaDiscoveryRequest> for Ads {
    type Response = DeltaDiscoveryResponse;
    type ResponseStream = AdsStream;
    type Future = BoxFuture<Result<tonic::Response<AdsStream>, Status>>;

    fn call(&mut self, req: tonic::Request<Streaming<DeltaDiscoveryRequest>>) -> Self::Future {
        let (state, shutdown) = (self.0.clone(), self.1.clone());
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
            c.bump(&c.xds_streams);
            let s = AdsSession {
                gauge: Gauge::up(&state, |c| &c.xds_streams_active),
                state,
                inbound: req.into_inner(),
                shutdown,
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
    node: Option<Node>,
    /// (node name, proxy service ID), once found in the catalog.
    proxy: Option<(String, String)>,
    /// Clusters, endpoints.
    types: [TypeState; 2],
    nonce: u64,
    current: Option<ProxyResources>,
    watches: Vec<broadcast::Receiver<Bytes>>,
    coalesce_at: Option<Instant>,
    lookup_at: Option<Instant>,
    /// A NACK came: send nothing until the next request or catalog change
    /// (the same resources would be refused again), as Consul does.
    hold: bool,
    done: bool,
}

enum Wake {
    Shutdown,
    Request(Result<Option<Box<DeltaDiscoveryRequest>>, Status>),
    Rebuild,
    Lookup,
    Changed,
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

impl AdsSession {
    async fn next(&mut self) -> Option<Result<DeltaDiscoveryResponse, Status>> {
        loop {
            if self.done {
                return None;
            }
            if let Some(resp) = self.due() {
                let c = &self.state.inner.counters;
                c.bump(&c.xds_responses);
                return Some(Ok(resp));
            }
            let far = Instant::now() + Duration::from_secs(3600);
            let wake = tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => Wake::Shutdown,
                r = self.inbound.message() => Wake::Request(r.map(|o| o.map(Box::new))),
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
                Wake::Request(_) => return None,
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
                        self.coalesce_at = Some(Instant::now() + self.state.inner.cfg.xds_coalesce);
                    }
                }
            }
        }
    }

    fn on_request(&mut self, req: DeltaDiscoveryRequest) -> Result<(), Status> {
        if req.type_url.is_empty() {
            return Err(Status::invalid_argument("type URL is required for ADS"));
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
            return Ok(());
        };
        let c = &self.state.inner.counters;
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
        if first && !req.initial_resource_versions.is_empty() {
            if !ty.wildcard {
                ty.subscriptions
                    .extend(req.initial_resource_versions.keys().cloned());
            }
            ty.versions = req.initial_resource_versions;
        }
        if !ty.wildcard {
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
    /// server's own node) and starts watching what its resources depend on.
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
            self.rebuild();
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
