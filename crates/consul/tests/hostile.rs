//! Hostile input never hurts an agent: gRPC frames of the Subscribe stream
//! (tonic's framing with our limit and our decoder), `subscribe.Event`
//! bodies, the views they feed and the HTTP answers agents parse, on
//! arbitrary bytes and on damaged copies of the captured Consul 1.20.1
//! bytes. None panics, none allocates beyond its bound, and what we encode
//! decodes back. A server streaming unknown payloads and an over-limit
//! message is counted and survived (the session ends and is retried).

mod common;
mod receive;

use std::time::Duration;

use agent_sim_consul::codec::{
    EVENT_FIELDS, MAX_EVENT_MESSAGE, subscribe_request, unknown_event_fields,
};
use agent_sim_consul::view::{MAX_VIEW_ENTRIES, View, ViewKind};
use agent_sim_consul::{ConsulConfig, ConsulFactory, ProbeConfig};
use agent_sim_fleet::{AgentFactory as _, SessionEnd};
use agent_sim_proto::consul::subscribe::{
    CatalogOp, CheckServiceNode, Event, EventBatch, HealthCheck, Node, NodeService,
    ServiceHealthUpdate, Topic, event::Payload,
};
use agent_sim_testkit::alloc::{CountingAlloc, decode_bound, peak_during};
use agent_sim_testkit::bounded::until;
use agent_sim_testkit::hostile::{mutated, vectors};
use bytes::{BufMut, Bytes, BytesMut};
use proptest::collection::vec;
use proptest::prelude::*;
use prost::Message as _;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

fn event_seeds() -> Vec<Vec<u8>> {
    vectors("consul/subscribe", ".bin")
        .into_iter()
        .map(|(_, b)| b)
        .collect()
}

/// gRPC length-prefixed messages, as a server streams them.
fn grpc_frames(msgs: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for m in msgs {
        out.push(0);
        out.extend_from_slice(&(m.len() as u32).to_be_bytes());
        out.extend_from_slice(m);
    }
    out
}

fn http_seeds() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = vectors("consul/http", ".json")
        .into_iter()
        .chain(vectors("consul/http", ".txt"))
        .map(|(_, b)| b)
        .collect();
    v.push(br#"{"Node":{"Node":"n","Address":"10.0.0.1"},"Services":{"app-1-0":{"Service":"app","Port":8080}}}"#.to_vec());
    v.push(br#"{"Results":null,"Errors":[{"OpIndex":0,"What":"Permission denied"}]}"#.to_vec());
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_event_bytes_never_panic_and_stay_bounded(msg in vec(any::<u8>(), 0..1024)) {
        let ((), peak) = peak_during(|| receive::event(&msg));
        prop_assert!(peak <= decode_bound(msg.len()), "{peak} for {}", msg.len());
    }

    #[test]
    fn damaged_captured_events_never_panic_and_stay_bounded(msg in mutated(event_seeds())) {
        let ((), peak) = peak_during(|| receive::event(&msg));
        prop_assert!(peak <= decode_bound(msg.len()), "{peak} for {}", msg.len());
    }

    /// What answered on a connection that failed, from its first bytes.
    #[test]
    fn first_bytes_of_any_server_are_named_or_not(b in vec(any::<u8>(), 0..80)) {
        if let Some((kind, words)) = receive::first_bytes(&b) {
            prop_assert!(!kind.is_empty() && words.len() < 400);
        }
    }

    #[test]
    fn arbitrary_http_answers_never_panic(body in vec(any::<u8>(), 0..512)) {
        let ((), peak) = peak_during(|| receive::http_answer(&body));
        prop_assert!(peak <= decode_bound(body.len()), "{peak} for {}", body.len());
    }

    #[test]
    fn damaged_http_answers_never_panic(body in mutated(http_seeds())) {
        let ((), peak) = peak_during(|| receive::http_answer(&body));
        prop_assert!(peak <= decode_bound(body.len()), "{peak} for {}", body.len());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The gRPC framing: whatever a server streams, reading ends in events
    /// or an error, never holding more than one message's limit.
    #[test]
    fn grpc_streams_of_damaged_frames_stay_within_the_limit(
        body in prop_oneof![
            vec(any::<u8>(), 0..512),
            mutated(vec![grpc_frames(&event_seeds())]),
        ],
    ) {
        let (_, peak) = peak_during(|| receive::stream(body.clone()));
        prop_assert!(peak <= MAX_EVENT_MESSAGE + decode_bound(body.len()), "{peak}");
    }
}

#[test]
fn grpc_length_prefixes_over_the_limit_are_refused_before_buffering() {
    let mut body = vec![0];
    body.extend_from_slice(&((MAX_EVENT_MESSAGE + 1) as u32).to_be_bytes());
    body.extend_from_slice(&[0; 32]);
    let ((_, status), peak) = peak_during(|| receive::stream(body));
    assert_eq!(status.code(), tonic::Code::OutOfRange);
    // The words the session maps to `message_too_large`.
    assert!(
        status.message().contains("message length too large"),
        "{}",
        status.message()
    );
    assert!(peak < 64 * 1024, "{peak}");
    // Bytes that are not an Event: tonic's words for `decode_event`.
    let (_, status) = receive::stream(grpc_frames(&[vec![0xff, 0xff]]));
    assert_eq!(status.code(), tonic::Code::Internal);
    assert!(status.message().contains("failed to decode Protobuf"));
}

#[test]
fn captured_events_have_no_unknown_fields_and_new_payloads_are_named() {
    for (name, msg) in vectors("consul/subscribe", ".bin") {
        if name.contains("request") {
            continue;
        }
        assert_eq!(unknown_event_fields(&msg), None, "{name}");
    }
    // A newer server's payload oneof (field 12), then EndOfSnapshot.
    let msg = [0x08, 0x05, 0x62, 0x00, 0x10, 0x01];
    assert_eq!(
        unknown_event_fields(&msg).as_deref(),
        Some("Event field 12 (wire type 2)")
    );
    let ev = Event::decode(&msg[..]).unwrap();
    assert_eq!(ev.payload, Some(Payload::EndOfSnapshot(true)));
    assert!(!EVENT_FIELDS.contains(&12));
}

#[test]
fn views_keep_at_most_their_bound() {
    let mut v = View::new(ViewKind::Health);
    let reg = |i: usize| Event {
        index: 1,
        payload: Some(Payload::ServiceHealth(ServiceHealthUpdate {
            op: CatalogOp::Register as i32,
            check_service_node: Some(CheckServiceNode {
                node: Some(Node {
                    node: format!("n{i}"),
                    ..Default::default()
                }),
                service: Some(NodeService {
                    id: "web".into(),
                    ..Default::default()
                }),
                checks: vec![],
            }),
        })),
    };
    for i in 0..MAX_VIEW_ENTRIES + 3 {
        v.apply(&reg(i), &mut |_| {});
    }
    assert_eq!(v.len(), MAX_VIEW_ENTRIES);
    assert_eq!(v.take_dropped(), 3);
    assert_eq!(v.take_dropped(), 0);
    // An instance already held is still updated.
    v.apply(&reg(0), &mut |_| {});
    assert_eq!(v.take_dropped(), 0);
}

// ---------------------------------------------------------------- round trips

fn text() -> impl Strategy<Value = String> {
    vec(any::<char>(), 0..10).prop_map(String::from_iter)
}

fn csn() -> impl Strategy<Value = CheckServiceNode> {
    (text(), text(), text(), any::<i32>(), vec(text(), 0..3)).prop_map(
        |(node, id, service, port, statuses)| CheckServiceNode {
            node: Some(Node {
                node,
                ..Default::default()
            }),
            service: Some(NodeService {
                id,
                service,
                port,
                ..Default::default()
            }),
            checks: statuses
                .into_iter()
                .map(|status| HealthCheck {
                    status,
                    ..Default::default()
                })
                .collect(),
        },
    )
}

fn health_event() -> impl Strategy<Value = Event> {
    (any::<u64>(), any::<bool>(), csn()).prop_map(|(index, dereg, csn)| Event {
        index,
        payload: Some(Payload::ServiceHealth(ServiceHealthUpdate {
            op: if dereg {
                CatalogOp::Deregister
            } else {
                CatalogOp::Register
            } as i32,
            check_service_node: Some(csn),
        })),
    })
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        health_event(),
        any::<u64>().prop_map(|index| Event {
            index,
            payload: Some(Payload::EndOfSnapshot(true)),
        }),
        (any::<u64>(), vec(health_event(), 0..4)).prop_map(|(index, events)| Event {
            index,
            payload: Some(Payload::EventBatch(EventBatch { events })),
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn events_round_trip_through_the_stream(evs in vec(event(), 1..4)) {
        let msgs: Vec<Vec<u8>> = evs.iter().map(|e| e.encode_to_vec()).collect();
        for m in &msgs {
            prop_assert_eq!(unknown_event_fields(m), None);
        }
        let (got, end) = receive::stream(grpc_frames(&msgs));
        prop_assert_eq!(got, evs);
        prop_assert!(end.message().contains("missing grpc-status trailer"), "{end:?}");
    }

    #[test]
    fn subscribe_requests_round_trip(key in text(), index in any::<u64>(), token in text()) {
        let r = subscribe_request(Topic::ServiceHealth, &key, index, &token, "dc1");
        let back = agent_sim_proto::consul::subscribe::SubscribeRequest::decode(
            &r.encode_to_vec()[..],
        )
        .unwrap();
        prop_assert_eq!(back, r);
    }
}

// ---------------------------------------------------------------- a session

/// A server on 127.0.0.1 that reads the 0x08 byte, speaks h2c and answers
/// every Subscribe with the given raw response body (gRPC frames).
async fn raw_rpc_server(body: Vec<u8>) -> std::net::SocketAddr {
    use hyper::server::conn::http2;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use tokio::io::AsyncReadExt as _;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = l.accept().await {
            let body = Bytes::from(body.clone());
            tokio::spawn(async move {
                if tcp.read_u8().await.ok() != Some(0x08) {
                    return;
                }
                let svc = hyper::service::service_fn(move |_req| {
                    let body = body.clone();
                    async move {
                        let mut frames = BytesMut::new();
                        frames.put_slice(&body);
                        let resp = ::http::Response::builder()
                            .header("content-type", "application/grpc")
                            .body(http_body_util::Full::new(frames.freeze()))
                            .unwrap();
                        Ok::<_, std::convert::Infallible>(resp)
                    }
                });
                let _ = http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_server_streaming_unknown_payloads_and_an_oversized_message_is_survived() {
    // A snapshot end carrying a newer payload field, an event with only an
    // unknown payload, then a length prefix over the limit.
    let mut body = grpc_frames(&[
        vec![0x08, 0x05, 0x62, 0x00, 0x10, 0x01],
        vec![0x08, 0x06, 0x62, 0x00],
    ]);
    body.push(0);
    body.extend_from_slice(&((MAX_EVENT_MESSAGE + 1) as u32).to_be_bytes());
    let rpc = raw_rpc_server(body).await;
    let cfg = ConsulConfig {
        conn: agent_sim_consul::Connection {
            targets: vec![rpc.to_string()],
            http_target: "127.0.0.1:9".into(),
            ..agent_sim_consul::Connection::to(&[])
        },
        upstreams: vec!["web".into()],
        register: false,
        session_ttl: None,
        anti_entropy: None,
        probe: ProbeConfig {
            kind: None,
            ..ProbeConfig::default()
        },
        // This server speaks only the streaming port (0x08).
        agent: agent_sim_consul::modes::AgentWire::Api,
        ..ConsulConfig::default()
    };
    let m = common::metrics();
    let factory = ConsulFactory::new(cfg, m.clone()).unwrap();
    let mut agent = factory.create(0);
    // The oversized message fails its stream only (a real agent's
    // materializer subscribes again on the same connection): the session
    // goes on until the test ends it.
    let end = tokio::time::timeout(
        Duration::from_secs(20),
        common::with_session(&mut agent, &m, |t| {
            let m = m.clone();
            async move {
                until(Duration::from_secs(20), "message_too_large", async || {
                    m.snapshot().errors.contains_key("message_too_large")
                })
                .await;
                t.cancel();
            }
        }),
    )
    .await
    .expect("the stream fails and the test ends the session");
    assert_eq!(end, SessionEnd::Shutdown, "the session survived: {end:?}");
    let s = m.snapshot();
    let at_least = |map: &std::collections::BTreeMap<String, u64>, k: &str, n: u64| {
        map.get(k).is_some_and(|&c| c >= n)
    };
    assert!(
        at_least(&s.errors, "message_too_large", 1),
        "{:?}",
        s.errors
    );
    // Each subscription of the stream met the same two unknown payloads.
    assert!(
        at_least(&s.warnings, "unknown_fields", 2),
        "{:?}",
        s.warnings
    );
    assert!(
        at_least(&s.warnings, "unknown_events", 1),
        "{:?}",
        s.warnings
    );
    let sample = |k: &str| m.warning_sample(k).unwrap_or_default();
    assert!(sample("unknown_fields").contains("Event field 12"));
    assert!(sample("unknown_events").contains("Health"));
    assert!(s.counter("snapshots") >= 1);
}
