//! The embedded server's Delta ADS, driven by hand on a raw stream: the
//! delta rules of a Consul server (one response in flight, ACK/NACK, a
//! NACK not retried until the catalog changes, `initial_resource_versions`
//! on a new stream, the coalescing delay), its refusals in Consul's words,
//! and hostile requests (unknown fields and types counted and ignored,
//! undecodable requests and too many names refused). The client side of
//! the same rules is `agent_sim_dataplane::xds`.

use std::time::Duration;

use agent_sim_dataplane::xds::{self, CLUSTER_TYPE, ENDPOINT_TYPE, NodeInfo, XdsState};
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use tonic::Code;

use crate::common::*;

const SEC: Duration = Duration::from_secs(1);

fn node(envoy: Option<(u32, u32, u32)>) -> NodeInfo {
    NodeInfo {
        id: "web-0-sidecar-proxy".into(),
        cluster: "web".into(),
        node_name: "node-0".into(),
        namespace: "default".into(),
        partition: "default".into(),
        envoy_version: envoy,
    }
}

fn first(x: &mut XdsState) -> DeltaDiscoveryRequest {
    x.stream_start(node(Some((1, 29, 7))).node()).remove(0)
}

async fn target_with_web_and_api() -> Target {
    let t = start().await;
    register_proxy(&t, "node-0", 1, "web", "web-0", &["api"]).await;
    register_proxy(&t, "node-api-1", 2, "api", "api-1", &[]).await;
    t
}

#[tokio::test(start_paused = true)]
async fn a_nack_is_counted_and_not_retried_until_the_catalog_changes() {
    let t = target_with_web_and_api().await;
    let mut x = XdsState::new(None);
    let mut ads = RawAds::open(t.grpc, first(&mut x)).await.unwrap();
    let cds = ads.next(SEC).await;
    assert_eq!(cds.type_url, CLUSTER_TYPE);
    assert_eq!(cds.nonce, "00000001");
    let h = x.handle(&cds);
    for r in &h.requests {
        ads.send(r);
    }
    let eds = ads.next(SEC).await;
    assert_eq!(eds.type_url, ENDPOINT_TYPE);
    // NACK the endpoints: nothing is sent again for them.
    ads.send(&xds::nack(ENDPOINT_TYPE, &eds.nonce, "bad endpoints"));
    assert!(ads.quiet_for(5 * SEC).await, "a NACK is not retried");
    assert_eq!(t.state.stats().xds_nacks, 1);
    // A change of the upstream: the endpoints come again (after the
    // coalescing delay), with the second api instance.
    register_proxy(&t, "node-api-2", 3, "api", "api-2", &[]).await;
    let again = ads.next(SEC).await;
    assert_eq!(again.type_url, ENDPOINT_TYPE);
    assert_eq!(again.nonce, "00000003");
    let h = x.handle(&again);
    assert!(h.nacked.is_none());
    let cla = envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment::decode_from(
        &again.resources[0],
    );
    assert_eq!(xds::endpoints(&cla).len(), 2);
}

trait DecodeFrom {
    fn decode_from(r: &envoy_types::pb::envoy::service::discovery::v3::Resource) -> Self;
}

impl DecodeFrom for envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment {
    fn decode_from(r: &envoy_types::pb::envoy::service::discovery::v3::Resource) -> Self {
        use prost::Message;
        Self::decode(&*r.resource.as_ref().unwrap().value).unwrap()
    }
}

#[tokio::test(start_paused = true)]
async fn one_response_in_flight_until_it_is_acked() {
    let t = target_with_web_and_api().await;
    let mut x = XdsState::new(None);
    let mut ads = RawAds::open(t.grpc, first(&mut x)).await.unwrap();
    let cds = ads.next(SEC).await;
    // Subscribe to EDS without ACKing CDS: nothing comes.
    ads.send(&xds::eds_subscribe(
        vec![
            cds.resources
                .iter()
                .find(|r| r.name.starts_with("api."))
                .unwrap()
                .name
                .clone(),
        ],
        vec![],
    ));
    assert!(ads.quiet_for(2 * SEC).await, "CDS is still in flight");
    ads.send(&xds::ack(CLUSTER_TYPE, &cds.nonce));
    let eds = ads.next(SEC).await;
    assert_eq!(eds.type_url, ENDPOINT_TYPE);
    assert_eq!(t.state.stats().xds_acks, 1);
}

#[tokio::test(start_paused = true)]
async fn a_new_stream_with_the_versions_held_gets_only_what_changed() {
    let t = target_with_web_and_api().await;
    let mut x = XdsState::new(None);
    let mut ads = RawAds::open(t.grpc, first(&mut x)).await.unwrap();
    for _ in 0..2 {
        let r = ads.next(SEC).await;
        for req in x.handle(&r).requests {
            ads.send(&req);
        }
    }
    assert!(x.ready());
    drop(ads);
    // Reconnect with the versions held: the clusters are unchanged, so the
    // CDS answer is empty; the endpoints subscribed again are sent again
    // (a subscribe always gets an answer).
    let start = x.stream_start(node(Some((1, 29, 7))).node());
    assert_eq!(start.len(), 2);
    assert_eq!(start[0].initial_resource_versions.len(), 2);
    let mut ads = RawAds::open(t.grpc, start[0].clone()).await.unwrap();
    ads.send(&start[1]);
    let cds = ads.next(SEC).await;
    assert_eq!(cds.type_url, CLUSTER_TYPE);
    assert!(cds.resources.is_empty(), "{cds:?}");
    for req in x.handle(&cds).requests {
        ads.send(&req);
    }
    let eds = ads.next(SEC).await;
    assert_eq!(eds.type_url, ENDPOINT_TYPE);
    assert_eq!(eds.resources.len(), 1);
    assert!(x.ready());
}

#[tokio::test(start_paused = true)]
async fn refusals_in_consuls_words() {
    let t = target_with_web_and_api().await;
    // No type URL on the first request.
    let mut bare = RawAds::open(t.grpc, DeltaDiscoveryRequest::default())
        .await
        .unwrap();
    let e = bare.next_item(SEC).await.unwrap().unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(e.message(), "type URL is required for ADS");
    // An Envoy this Consul does not support.
    let mut x = XdsState::new(None);
    let old = x.stream_start(node(Some((1, 20, 0))).node()).remove(0);
    let mut old = RawAds::open(t.grpc, old).await.unwrap();
    let e = old.next_item(SEC).await.unwrap().unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("1.20.0"), "{e:?}");
    // A proxy the catalog does not hold: nothing is sent.
    let mut ghost = node(None);
    ghost.id = "ghost-sidecar-proxy".into();
    let mut x = XdsState::new(None);
    let req = x.stream_start(ghost.node()).remove(0);
    let mut ads = RawAds::open(t.grpc, req).await.unwrap();
    assert!(ads.quiet_for(3 * SEC).await);
}

/// The status a raw stream ends with (panics on a response or no end).
async fn ended(ads: &mut RawAds) -> tonic::Status {
    ads.next_item(SEC)
        .await
        .expect("an end in time")
        .expect_err("an error, not a response")
}

#[tokio::test(start_paused = true)]
async fn unknown_fields_and_types_are_counted_and_ignored_bad_requests_refused() {
    let t = target_with_web_and_api().await;
    let mut x = XdsState::new(None);
    let mut ads = RawAds::open(t.grpc, first(&mut x)).await.unwrap();
    let cds = ads.next(SEC).await;
    // The sidecar's answer (ACK, endpoints subscribed) with a field of a
    // newer API in each request (12, length-delimited): counted, and the
    // requests work as without it.
    let h = x.handle(&cds);
    for r in &h.requests {
        let mut b = xds::encode(r).to_vec();
        b.extend_from_slice(&[0x62, 0x01, 0x00]);
        ads.push(b.into());
    }
    let sent = h.requests.len() as u64;
    let eds = ads.next(SEC).await;
    assert_eq!(eds.type_url, ENDPOINT_TYPE);
    assert_eq!(t.state.stats().grpc_unknown_fields, sent);
    for r in &x.handle(&eds).requests {
        ads.send(r);
    }
    // Listeners: no handler here, as in Consul; the stream goes on.
    ads.send(&DeltaDiscoveryRequest {
        type_url: "type.googleapis.com/envoy.config.listener.v3.Listener".into(),
        ..DeltaDiscoveryRequest::default()
    });
    assert!(ads.quiet_for(SEC).await);
    let st = t.state.stats();
    assert_eq!((st.xds_unknown_types, st.xds_acks), (1, 2), "{st:?}");
    assert_eq!(st.xds_requests_refused, 0);
    // Bytes that are no request: the stream ends in tonic's words.
    ads.push(bytes::Bytes::from_static(&[0x07, 0xba, 0xd0]));
    let e = ended(&mut ads).await;
    assert_eq!(e.code(), Code::Internal, "{e:?}");
    assert!(e.message().contains("failed to decode"), "{e:?}");
    assert_eq!(t.state.stats().xds_requests_refused, 1);

    // More endpoint names than a stream holds.
    let mut x = XdsState::new(None);
    let mut ads = RawAds::open(t.grpc, first(&mut x)).await.unwrap();
    let _ = ads.next(SEC).await;
    ads.send(&DeltaDiscoveryRequest {
        type_url: ENDPOINT_TYPE.into(),
        resource_names_subscribe: (0..16_385).map(|i| format!("c{i}")).collect(),
        ..DeltaDiscoveryRequest::default()
    });
    let e = ended(&mut ads).await;
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().contains("at most 16384 resource names"),
        "{e:?}"
    );
    assert_eq!(t.state.stats().xds_requests_refused, 2);
    assert_eq!(t.state.stats().xds_streams_resumed, 0);
}
