//! Envoy's `DeltaAggregatedResources`, served like Consul's delta server:
//! the first request must carry a type URL; `node.id` names the proxy and
//! `node.metadata.node_name` its node; CDS wildcard and EDS by name; each
//! type keeps what the proxy ACKed (`initial_resource_versions` on a new
//! stream), sends only what differs, one response in flight (nothing more
//! until it is ACKed or NACKed; a NACK is not retried until the catalog
//! changes), in Consul's order (`super::delta`); catalog changes of the
//! proxy's upstreams are coalesced for
//! [`crate::consul::ConsulTargetConfig::xds_coalesce`] and paced
//! server-wide (`super::pacer`) before the resources are rebuilt, the first
//! configuration of a stream too; over `xds_max_streams` a stream is
//! refused with `RESOURCE_EXHAUSTED`.
//!
//! Parts: [`Ads`] (the method: ACL, stream cap, stream faults), and
//! `AdsSession` (one stream: a select loop, then `on_wake`, `on_request`,
//! `emit`). Hostile input: requests are decoded within
//! [`MAX_XDS_REQUEST`]; a stream holds at most [`MAX_NAMES_PER_TYPE`]
//! resource names per type; xDS types this server does not serve are
//! counted (`xds_unknown_types`) and ignored. Faults (`consul.xds`): a
//! stream refused or ended with `RESOURCE_EXHAUSTED` or its connection
//! reset; a response delayed, replaced by garbage, or sent with a resource
//! that does not parse.

use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use agent_sim_proto::codec::{SizedEncoder, SmallCodec};
use agent_sim_proto::consul::subscribe::Topic;
use bytes::{BufMut, Bytes};
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::core::v3::node::UserAgentVersionType;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use envoy_types::pb::google::protobuf::value::Kind;
use futures_util::Stream;
use prost::Message as _;
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tonic::codec::{BufferSettings, EncodeBuf, Encoder, Streaming};
use tonic::server::StreamingService;

use super::delta::{ORDER, TYPE_URLS, TypeState, type_index};
use super::{BoxFuture, UnknownFields, authorize};
use crate::consul::state::TopicKey;
use crate::consul::xds::{self, ProxyResources};
use crate::consul::{ConsulState, Gauge, lock};
use crate::faults::{Action, BAD_RESOURCE, ConnCtl, Kill, Order, Target, next_order};

/// A stream whose proxy is not in the catalog looks again after this.
const LOOKUP_RETRY: Duration = Duration::from_secs(1);
/// Oldest Envoy minor version served (Consul 1.20 supports 1.26 .. 1.29).
const ENVOY_MIN: (u32, u32) = (1, 26);
/// What Consul says over its xDS stream cap (and when it drains streams to
/// rebalance them, `errOverwhelmed`).
const TOO_MANY_STREAMS: &str = "this server has too many xDS streams open, please try another";
/// Largest Delta xDS request decoded. Consul's public gRPC server accepts
/// 50 MiB (`grpc.MaxRecvMsgSize`); the requests of a sidecar are a few
/// hundred bytes but for `initial_resource_versions` after a reconnect
/// (≈150 bytes per resource held), so 4 MiB holds the versions of
/// [`MAX_NAMES_PER_TYPE`] resources with room, and bounds what one stream
/// makes this backend reserve (tonic reserves on the length prefix).
pub const MAX_XDS_REQUEST: usize = 4 * 1024 * 1024;
/// Most resource names a stream holds per type (subscribed, or offered in
/// `initial_resource_versions`): far above the clusters of one proxy
/// (one per upstream), and ≈ 2 MiB of names and versions at most; a request
/// that would go beyond it ends the stream with `RESOURCE_EXHAUSTED`.
pub const MAX_NAMES_PER_TYPE: usize = 16_384;

/// What an ADS stream writes: a response, or (a `consul.xds=garbage`
/// fault) bytes that are none.
pub(super) enum AdsOut {
    Response(Box<DeltaDiscoveryResponse>),
    Raw(Bytes),
}

/// Encodes [`AdsOut`].
pub(super) struct AdsEncoder(BufferSettings);

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
pub(super) type AdsCodec = SmallCodec<AdsEncoder, DeltaDiscoveryRequest, UnknownFields>;

type AdsStream = Pin<Box<dyn Stream<Item = Result<AdsOut, Status>> + Send>>;

pub(super) struct Ads {
    pub(super) state: ConsulState,
    pub(super) pacer: super::SharedPacer,
    pub(super) shutdown: CancellationToken,
    pub(super) ctl: Option<Arc<ConnCtl>>,
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
        let pacer = self.pacer.clone();
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
                _held: faults.hold(crate::faults::Load::XdsStreams),
                orders: faults.orders(Target::ConsulXds),
                state,
                pacer,
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
    /// The server's pacing of proxy updates (one per server).
    pacer: super::SharedPacer,
    inbound: Streaming<DeltaDiscoveryRequest>,
    shutdown: CancellationToken,
    #[allow(dead_code)]
    gauge: Gauge,
    /// Counted for `past:` faults while the stream lives.
    _held: crate::faults::Held,
    /// The connection's kill switch (faults armed only).
    ctl: Option<Arc<ConnCtl>>,
    /// Orders of timed `consul.xds` faults.
    orders: Option<watch::Receiver<Order>>,
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

/// What a stream yields next: a message or status, or its end (`None`).
type Next = Option<Result<AdsOut, Status>>;

impl AdsSession {
    /// The stream's next item: a response that is due, else whatever the
    /// next wake-up brings.
    async fn next(&mut self) -> Next {
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
            if let ControlFlow::Break(next) = self.on_wake(wake) {
                return next;
            }
        }
    }

    /// Acts on a wake-up: `Break` with what the stream yields, or
    /// `Continue` to wait again.
    fn on_wake(&mut self, wake: Wake) -> ControlFlow<Next> {
        match wake {
            Wake::Shutdown => {
                self.done = true;
                ControlFlow::Break(Some(Err(Status::unavailable("server is shutting down"))))
            }
            Wake::Request(Ok(Some(req))) => match self.on_request(*req) {
                Ok(()) => ControlFlow::Continue(()),
                Err(s) => {
                    self.done = true;
                    ControlFlow::Break(Some(Err(s)))
                }
            },
            Wake::Request(Ok(None)) => ControlFlow::Break(None),
            Wake::Request(Err(s)) => {
                // A request that did not decode, or over the limit (tonic's
                // words); a client that went away ends here too, without a
                // request.
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
                ControlFlow::Break(Some(Err(s)))
            }
            Wake::Rebuild => {
                self.coalesce_at = None;
                self.hold = false;
                self.rebuild();
                ControlFlow::Continue(())
            }
            Wake::Lookup => {
                self.lookup_at = None;
                self.lookup();
                ControlFlow::Continue(())
            }
            Wake::Changed => {
                if self.coalesce_at.is_none() {
                    self.schedule();
                }
                ControlFlow::Continue(())
            }
            Wake::Order => self.on_order(),
        }
    }

    /// A timed `consul.xds` fault: the stream's connection reset, or the
    /// stream ended as Consul drains streams to rebalance them
    /// (`errOverwhelmed`, in its words).
    fn on_order(&mut self) -> ControlFlow<Next> {
        let order = self.orders.as_mut().map(|rx| *rx.borrow_and_update());
        let faults = self.state.faults().clone();
        match order.and_then(|o| faults.obey(o)) {
            Some(Action::Reset) => {
                if let Some(ctl) = &self.ctl {
                    ctl.kill(Kill::Reset);
                }
                self.done = true;
                ControlFlow::Break(None)
            }
            Some(Action::ResourceExhausted) => {
                self.done = true;
                ControlFlow::Break(Some(Err(Status::resource_exhausted(TOO_MANY_STREAMS))))
            }
            _ => ControlFlow::Continue(()),
        }
    }

    /// Schedules the next rebuild: after the coalescing delay, or later when
    /// the server-wide pacing says so (a token reserved now).
    fn schedule(&mut self) {
        let now = Instant::now();
        let paced = lock(&self.pacer).reserve(now);
        self.coalesce_at = Some(now + paced.max(self.state.inner.cfg.xds_coalesce));
    }

    /// Sends `resp`, after what a `consul.xds` fault on responses does: a
    /// delay; garbage instead of it (then the stream ends, as no client
    /// reads past a message it cannot decode); or one of its resources
    /// replaced by bytes that do not parse (a response without resources
    /// is no unit of this fault).
    async fn emit(&mut self, mut resp: DeltaDiscoveryResponse) -> Next {
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
