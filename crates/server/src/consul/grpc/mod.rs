//! The public gRPC port (Consul's `ports.grpc`, 8502; TLS `grpc_tls`, 8503)
//! that consul-dataplanes connect to: plain h2c (or TLS) from the first
//! byte, hyper's HTTP/2 server with a hand-written router (as `rpc`), and
//! four methods, each served apart:
//!
//! - `dataplane`: `DataplaneService/GetEnvoyBootstrapParams` (the proxy
//!   looked up on its node in the catalog, `node not found`, `Service not
//!   found` as Consul says them; its destination service, datacenter,
//!   node) and `DataplaneService/GetSupportedDataplaneFeatures`.
//! - `discovery`: `ServerDiscoveryService/WatchServers`: this server, then
//!   silence.
//! - `ads`: Envoy's `DeltaAggregatedResources`, served like Consul's delta
//!   server (one stream's loop: requests, catalog changes, coalescing and
//!   pacing, faults); `delta` holds what each resource type keeps and the
//!   response that brings a proxy up to date; `pacer` the server-wide pacing
//!   of proxy updates ([`Pacer`], Consul's `xds.update_max_per_second`).
//!
//! This module accepts, routes by method path, checks ACL tokens
//! ([`authorize`]) and gives every method its codec (small buffers,
//! unknown request fields counted). Hostile input: requests are decoded
//! within `ads::MAX_XDS_REQUEST` (Delta xDS) and [`MAX_REQUEST_MESSAGE`]
//! (the others); HTTP/2 header blocks within the bound of `conn`; top-level
//! fields the API does not define are counted (`grpc_unknown_fields`) and
//! ignored.

mod ads;
mod dataplane;
mod delta;
mod discovery;
mod pacer;

use std::convert::Infallible;
use std::future::{Future, ready};
use std::io;
use std::pin::Pin;
use std::sync::Arc;

use agent_sim_proto::codec::{Buffers, Profile, SmallCodec};
use agent_sim_proto::consul::dataplane::{
    GetEnvoyBootstrapParamsRequest, GetEnvoyBootstrapParamsResponse,
    GetSupportedDataplaneFeaturesRequest, GetSupportedDataplaneFeaturesResponse,
};
use agent_sim_proto::consul::serverdiscovery::{WatchServersRequest, WatchServersResponse};
use agent_sim_proto::fields;
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tonic::server::Grpc;
use tonic::{Status, metadata::MetadataMap};
use tonic_prost::ProstEncoder;

use super::conn::{accept_loop, drive_connection, h2_builder, tls_accept};
use super::{ConsulState, lock};
use crate::faults::ConnCtl;
use ads::{Ads, AdsCodec, MAX_XDS_REQUEST};
use dataplane::{Bootstrap, Features};
use discovery::WatchServers;

pub(crate) use pacer::Pacer;

const BOOTSTRAP_PATH: &str = "/hashicorp.consul.dataplane.DataplaneService/GetEnvoyBootstrapParams";
const FEATURES_PATH: &str =
    "/hashicorp.consul.dataplane.DataplaneService/GetSupportedDataplaneFeatures";
const WATCH_SERVERS_PATH: &str =
    "/hashicorp.consul.serverdiscovery.ServerDiscoveryService/WatchServers";
const ADS_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";
const SOTW_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
/// Largest bootstrap-params, features or `WatchServers` request decoded
/// (they are tens of bytes).
pub const MAX_REQUEST_MESSAGE: usize = 64 * 1024;

/// Serves the public gRPC port until `shutdown` is cancelled.
pub async fn serve_grpc(
    listener: TcpListener,
    state: ConsulState,
    shutdown: CancellationToken,
) -> io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        *lock(&state.inner.grpc_addr) = Some(addr);
    }
    let builder = h2_builder();
    let conns = state.clone();
    // One server's pacing of proxy updates: each server of a cluster (the
    // servers sharing a state) paces its own streams, as each Consul
    // server's proxycfg manager does.
    let pacer: SharedPacer = Arc::new(std::sync::Mutex::new(Pacer::new(
        state.inner.cfg.xds_update_rate,
    )));
    accept_loop(listener, &state, shutdown.clone(), move |stream| {
        grpc_connection(
            stream,
            conns.clone(),
            pacer.clone(),
            builder.clone(),
            shutdown.clone(),
        )
    })
    .await
}

/// A server's pacer, shared by its streams.
pub(super) type SharedPacer = Arc<std::sync::Mutex<Pacer>>;

async fn grpc_connection(
    stream: TcpStream,
    state: ConsulState,
    pacer: SharedPacer,
    builder: Arc<http2::Builder<TokioExecutor>>,
    shutdown: CancellationToken,
) {
    let _ = stream.set_nodelay(true);
    // With faults armed, the connection has a kill switch (a `consul.xds`
    // reset of a stream resets the connection carrying it).
    let stream = state.faults().io(stream);
    let ctl = stream.ctl();
    match state.inner.cfg.tls.clone() {
        None => serve(stream, state, pacer, builder, shutdown, ctl).await,
        Some(tls) => {
            if let Some(Ok(tls)) = tls_accept(stream, tls, &shutdown).await {
                serve(tls, state, pacer, builder, shutdown, ctl).await;
            }
        }
    }
}

async fn serve<I>(
    io: I,
    state: ConsulState,
    pacer: SharedPacer,
    builder: Arc<http2::Builder<TokioExecutor>>,
    shutdown: CancellationToken,
    ctl: Option<Arc<ConnCtl>>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = Router {
        state,
        pacer,
        shutdown: shutdown.clone(),
        ctl,
    };
    let conn = builder.serve_connection(TokioIo::new(io), svc);
    drive_connection(conn, &shutdown, |c| c.graceful_shutdown()).await;
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

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

#[derive(Clone)]
struct Router {
    state: ConsulState,
    /// The server's pacing of proxy updates.
    pacer: SharedPacer,
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
                let (ctl, pacer) = (self.ctl.clone(), self.pacer.clone());
                Box::pin(async move {
                    let codec = AdsCodec::new(UnknownFields {
                        state: state.clone(),
                        known: fields::DELTA_DISCOVERY_REQUEST,
                    });
                    let mut g = Grpc::new(codec).max_decoding_message_size(MAX_XDS_REQUEST);
                    Ok(g.streaming(
                        Ads {
                            state,
                            pacer,
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

/// The ACL check of a call's `x-consul-token`, in Consul's words: any
/// token the server holds passes (its rules are not applied to what the
/// dataplane sees), no token is denied, an unknown one is `ACL not found`.
fn authorize(state: &ConsulState, md: &MetadataMap) -> Result<(), Status> {
    let token = md
        .get("x-consul-token")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    match state.acl(token) {
        Ok(a) if a.is_anonymous() => Err(Status::permission_denied(
            "Permission denied: anonymous token lacks permission 'service:read'",
        )),
        Ok(_) => Ok(()),
        Err(_) => Err(Status::unauthenticated("ACL not found")),
    }
}
