//! gRPC plumbing of a sidecar: method paths, its profile of the shared codec
//! (`agent_sim_proto::codec`: small buffers), the outbox that feeds the ADS
//! request stream, and the bootstrap request.
//!
//! Requests on the ADS stream are encoded once (prost) into [`Bytes`] and
//! written as they are ([`AdsCodec`]): the outbox then holds a few refcounted
//! buffers instead of whole request structs. No I/O here.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use agent_sim_proto::codec::{self, Buffers, PreEncoded, Profile, SizedEncoder, SmallDecoder};
use agent_sim_proto::consul::dataplane::{
    GetEnvoyBootstrapParamsRequest, get_envoy_bootstrap_params_request::NodeSpec,
};
use bytes::Bytes;
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryResponse;
use futures_util::Stream;
use tonic::codec::Codec;
use tonic_prost::ProstEncoder;

/// `DataplaneService/GetEnvoyBootstrapParams`.
pub const BOOTSTRAP_PATH: &str =
    "/hashicorp.consul.dataplane.DataplaneService/GetEnvoyBootstrapParams";
/// `ServerDiscoveryService/WatchServers`.
pub const WATCH_SERVERS_PATH: &str =
    "/hashicorp.consul.serverdiscovery.ServerDiscoveryService/WatchServers";
/// Envoy's Delta ADS method (the only xDS flavour Consul serves).
pub const ADS_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";
/// The ACL token's gRPC metadata key.
pub const TOKEN_HEADER: &str = "x-consul-token";

/// The sidecar's codec buffers: a request is a few hundred bytes (512 to
/// encode); the decode buffer starts at 1 KiB and grows for a large CDS
/// response.
pub const BUFFERS: Buffers = Buffers::new(512, 1024);

/// The sidecar's codec profile: [`BUFFERS`], no look at the responses.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sidecar;

impl Profile for Sidecar {
    fn buffers(&self) -> Buffers {
        BUFFERS
    }
}

/// A prost codec with the sidecar's buffers for unary and server-streaming
/// calls (requests `E`, responses `D`).
pub type SmallCodec<E, D> = codec::SmallCodec<ProstEncoder<E>, D, Sidecar>;

/// The ADS codec: writes pre-encoded requests, decodes responses (a unit
/// value, as the sessions pass it).
#[derive(Debug, Default, Clone, Copy)]
pub struct AdsCodec;

impl Codec for AdsCodec {
    type Encode = Bytes;
    type Decode = DeltaDiscoveryResponse;
    type Encoder = PreEncoded;
    type Decoder = SmallDecoder<DeltaDiscoveryResponse, Sidecar>;

    fn encoder(&mut self) -> PreEncoded {
        PreEncoded::with_settings(BUFFERS.encode_settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        SmallDecoder::new(Sidecar)
    }
}

#[derive(Debug, Default)]
struct OutboxInner {
    queue: VecDeque<Bytes>,
    waker: Option<Waker>,
    closed: bool,
}

/// The sending half of a request stream: [`Outbox::push`] queues an encoded
/// request; the paired [`OutboxStream`] is the body of the ADS call. Far
/// smaller than a channel (the queue is empty but for a moment).
#[derive(Debug, Clone, Default)]
pub struct Outbox(Arc<Mutex<OutboxInner>>);

impl Outbox {
    /// A new outbox and the stream it feeds.
    pub fn new() -> (Outbox, OutboxStream) {
        let o = Outbox::default();
        (o.clone(), OutboxStream(o))
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, OutboxInner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues one encoded request.
    pub fn push(&self, req: Bytes) {
        let mut i = self.inner();
        i.queue.push_back(req);
        if let Some(w) = i.waker.take() {
            w.wake();
        }
    }

    /// Ends the request stream (half-close).
    pub fn close(&self) {
        let mut i = self.inner();
        i.closed = true;
        if let Some(w) = i.waker.take() {
            w.wake();
        }
    }
}

/// The request stream of an [`Outbox`].
#[derive(Debug)]
pub struct OutboxStream(Outbox);

impl Stream for OutboxStream {
    type Item = Bytes;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        let mut i = self.0.inner();
        if let Some(b) = i.queue.pop_front() {
            if i.queue.is_empty() && i.queue.capacity() > 4 {
                i.queue = VecDeque::new();
            }
            return Poll::Ready(Some(b));
        }
        if i.closed {
            return Poll::Ready(None);
        }
        match &i.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => i.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

/// The bootstrap request consul-dataplane sends for proxy `proxy_id` on
/// `node` (both the old `service_id` and the new `proxy_id` field).
pub fn bootstrap_request(proxy_id: &str, node: &str) -> GetEnvoyBootstrapParamsRequest {
    GetEnvoyBootstrapParamsRequest {
        node_spec: Some(NodeSpec::NodeName(node.to_owned())),
        service_id: proxy_id.to_owned(),
        proxy_id: proxy_id.to_owned(),
        partition: String::new(),
        namespace: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;

    #[tokio::test]
    async fn the_outbox_streams_what_is_pushed_then_ends() {
        let (o, mut s) = Outbox::new();
        o.push(Bytes::from_static(b"a"));
        o.push(Bytes::from_static(b"b"));
        assert_eq!(s.next().await.unwrap(), "a");
        assert_eq!(s.next().await.unwrap(), "b");
        let later = tokio::spawn(async move { s.next().await });
        tokio::task::yield_now().await;
        o.push(Bytes::from_static(b"c"));
        assert_eq!(later.await.unwrap().unwrap(), "c");
        let (o, mut s) = Outbox::new();
        o.close();
        assert!(s.next().await.is_none());
    }

    #[test]
    fn bootstrap_request_names_the_proxy_both_ways() {
        use prost::Message;
        let r = bootstrap_request("web-sidecar-proxy", "sim-node-1");
        let back = GetEnvoyBootstrapParamsRequest::decode(&*r.encode_to_vec()).unwrap();
        assert_eq!(back.service_id, "web-sidecar-proxy");
        assert_eq!(back.proxy_id, "web-sidecar-proxy");
        assert_eq!(
            back.node_spec,
            Some(NodeSpec::NodeName("sim-node-1".into()))
        );
    }
}
