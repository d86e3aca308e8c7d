//! Hostile input never hurts an agent: gRPC frames of the Subscribe stream
//! (tonic's framing with our limit and our decoder), `subscribe.Event`
//! bodies, the views they feed and the HTTP answers agents parse, on
//! arbitrary bytes and on damaged copies of the captured Consul 1.20.1
//! bytes. None panics, none allocates beyond its bound, and what we encode
//! decodes back. A server streaming unknown payloads and an over-limit
//! message is counted and survived (the session ends and is retried). An
//! RPC port answering an agent's own calls with garbage, another call's
//! answer, a string where a struct is due, an endless answer or nothing is
//! counted with its cause, and the agent calls again after its backoff.

use crate::common;
use crate::receive;

use std::time::Duration;

use agent_sim_consul::codec::{
    EVENT_FIELDS, MAX_EVENT_MESSAGE, subscribe_request, unknown_event_fields,
};
use agent_sim_consul::h2::{frame, hpack};
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

    /// A sidecar's bidirectional call: whatever windows a server grants
    /// and whenever it answers, the requests never go past the call's or
    /// the connection's window nor over a 16 KiB frame, and every request
    /// goes out once the windows hold it.
    #[test]
    fn bidirectional_requests_keep_to_the_servers_windows(
        initial in 0u32..100_000,
        items in server_items(),
        requests in vec(0usize..30_000, 1..6),
        chunk in prop_oneof![Just(usize::MAX), 1usize..64],
    ) {
        let (raw, (call, conn)) = bidi_server(initial, &items);
        let b = receive::bidi(raw, chunk, &requests);
        // The first request goes out with the preface, before the server's
        // SETTINGS are read: within the default window (RFC 9113 6.9.2; the
        // call's window goes below 0 when the SETTINGS shrink it).
        let early = (requests[0] + 5).min(frame::INITIAL_WINDOW as usize);
        let granted = (call.min(conn) as usize).max(early);
        prop_assert!(b.sent <= granted, "{} sent, {granted} granted: {b:?}", b.sent);
        prop_assert!(!b.oversized_frame, "{b:?}");
        let asked = requests.len().min(b.messages + 1);
        let wanted: usize = requests[..asked].iter().map(|n| n + 5).sum();
        if granted >= wanted {
            prop_assert_eq!(b.sent, wanted, "{:?}", b);
        }
        prop_assert!(b.ended.call.is_none(), "{:?}", b);
    }

    /// The same call on noise and on damaged server bytes: it ends by
    /// itself, holding no more than its requests and one message's limit.
    #[test]
    fn bidirectional_calls_on_damaged_bytes_end_within_the_limit(
        raw in prop_oneof![
            vec(any::<u8>(), 0..512),
            mutated(vec![bidi_server(70_000, &[
                ServerItem::Message(40),
                ServerItem::Window(true, 20_000),
                ServerItem::Message(3),
            ]).0]),
        ],
        requests in vec(0usize..20_000, 1..4),
        chunk in 1usize..64,
    ) {
        let held: usize = requests.iter().map(|n| 2 * (n + 5 + 9)).sum();
        let (_, peak) = peak_during(|| receive::bidi(raw.clone(), chunk, &requests));
        prop_assert!(peak <= MAX_EVENT_MESSAGE + decode_bound(raw.len()) + held, "{peak}");
    }

    /// The HTTP/2 connection: whatever bytes a server sends (a real
    /// server's capture, damaged, or noise), read in pieces of any size,
    /// the connection ends by itself, never holding more than one
    /// message's limit.
    #[test]
    fn damaged_http2_connections_end_within_the_limit(
        raw in prop_oneof![
            vec(any::<u8>(), 0..512),
            mutated(vec![real_stream()]),
        ],
        chunk in 1usize..64,
    ) {
        let (_, peak) = peak_during(|| receive::connection(raw.clone(), chunk));
        prop_assert!(peak <= MAX_EVENT_MESSAGE + decode_bound(raw.len()), "{peak}");
    }
}

/// What a real Consul 1.20.1 server sent on a Subscribe stream
/// (`testdata/vectors/consul/h2/`).
/// What a server sends on a sidecar's bidirectional call, item by item.
#[derive(Debug, Clone)]
enum ServerItem {
    /// WINDOW_UPDATE on the connection (`false`) or on the call (`true`).
    Window(bool, u32),
    /// One gRPC message of `n` octets on the call.
    Message(usize),
}

/// A server's bytes for [`receive::bidi`]: its SETTINGS with an initial
/// window of `initial`, the call's headers, then `items`. The windows it
/// grants the call's requests: (the call's, the connection's).
fn bidi_server(initial: u32, items: &[ServerItem]) -> (Vec<u8>, (u64, u64)) {
    let mut raw = Vec::new();
    frame::put_settings(&mut raw, &[(frame::SETTINGS_INITIAL_WINDOW_SIZE, initial)]);
    frame::put_head(&mut raw, 1, frame::HEADERS, frame::END_HEADERS, 1);
    hpack::put_indexed(&mut raw, 8); // :status 200
    let (mut call, mut conn) = (u64::from(initial), u64::from(frame::INITIAL_WINDOW));
    for item in items {
        match *item {
            ServerItem::Window(on_call, by) => {
                frame::put_word(&mut raw, frame::WINDOW_UPDATE, u32::from(on_call), by);
                *(if on_call { &mut call } else { &mut conn }) += u64::from(by);
            }
            ServerItem::Message(n) => {
                let body = grpc_frames(&[vec![7; n]]);
                frame::put_head(&mut raw, body.len(), frame::DATA, 0, 1);
                raw.extend_from_slice(&body);
            }
        }
    }
    (raw, (call, conn))
}

fn server_items() -> impl Strategy<Value = Vec<ServerItem>> {
    vec(
        prop_oneof![
            (any::<bool>(), 1u32..40_000).prop_map(|(c, by)| ServerItem::Window(c, by)),
            (0usize..200).prop_map(ServerItem::Message),
        ],
        0..24,
    )
}

fn real_stream() -> Vec<u8> {
    vectors("consul/h2", "subscribe-s2c.bin").remove(0).1
}

#[test]
fn a_real_servers_stream_reads_the_same_in_pieces_of_any_size() {
    for chunk in [1, 2, 5, 9, 10, 100, 8192] {
        let (events, ended) = receive::connection(real_stream(), chunk);
        assert_eq!(events.len(), 5, "read {chunk} at a time");
        assert!(ended.call.is_none(), "{ended:?}");
        assert_eq!(ended.conn.kind(), "conn_closed", "{ended:?}");
    }
}

#[test]
fn grpc_length_prefixes_over_the_limit_are_refused_before_buffering() {
    let mut body = vec![0];
    body.extend_from_slice(&((MAX_EVENT_MESSAGE + 1) as u32).to_be_bytes());
    body.extend_from_slice(&[0; 32]);
    let ((_, ended), peak) = peak_during(|| receive::stream(body));
    let status = ended.call.expect("the call ended");
    assert_eq!(status.code(), tonic::Code::OutOfRange);
    // The words the session maps to `message_too_large`.
    assert!(
        status.message().contains("message length too large"),
        "{}",
        status.message()
    );
    assert!(peak < 64 * 1024, "{peak}");
    // Bytes that are not an Event: prost's words for `decode_event`.
    let (_, ended) = receive::stream(grpc_frames(&[vec![0xff, 0xff]]));
    let status = ended.call.expect("the call ended");
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
        let call = end.call.expect("the body ended the call");
        prop_assert!(call.message().contains("without trailers"), "{call:?}");
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

/// An agent of one RPC port and no HTTP API (a closed port): one upstream,
/// no session, no probe.
fn one_port(rpc: std::net::SocketAddr) -> ConsulConfig {
    ConsulConfig {
        conn: agent_sim_consul::Connection {
            targets: vec![rpc.to_string()],
            http_target: "127.0.0.1:9".into(),
            ..agent_sim_consul::Connection::to(&[])
        },
        upstreams: vec!["web".into()],
        session_ttl: None,
        probe: ProbeConfig {
            kind: None,
            ..ProbeConfig::default()
        },
        ..ConsulConfig::default()
    }
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
        register: false,
        anti_entropy: None,
        // This server speaks only the streaming port (0x08).
        agent: agent_sim_consul::modes::AgentWire::Api,
        ..one_port(rpc)
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

// ------------------------------------------------ the agent's own RPC port

/// How a hostile RPC port answers every call made on it.
#[derive(Debug, Clone, Copy)]
enum Answer {
    /// Bytes that are no msgpack (0xc1 is never used).
    Garbage,
    /// A well-formed answer to another call.
    WrongSeq,
    /// A header, then a string that says it is 2 GiB long, sent until the
    /// client stops reading.
    Endless,
    /// The header, then a string where the method's struct is due.
    StringForStruct,
    /// Nothing at all.
    Silent,
    /// An error in the server's words for every call, as a server without a
    /// leader answers.
    Refuse,
}

/// A server on 127.0.0.1 that reads `0x04`, speaks yamux and answers each
/// of the agent's own calls as `answer` says (blocking queries are held).
async fn hostile_rpc_port(answer: Answer) -> std::net::SocketAddr {
    use tokio::io::AsyncReadExt as _;
    use tokio_util::compat::TokioAsyncReadCompatExt as _;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = l.accept().await {
            tokio::spawn(async move {
                if tcp.read_u8().await.ok() != Some(0x04) {
                    return;
                }
                let mut conn = yamux::Connection::new(
                    tcp.compat(),
                    yamux::Config::default(),
                    yamux::Mode::Server,
                );
                let mut calls = tokio::task::JoinSet::new();
                while let Some(Ok(stream)) =
                    std::future::poll_fn(|cx| conn.poll_next_inbound(cx)).await
                {
                    calls.spawn(answer_calls(stream, answer));
                }
            });
        }
    });
    addr
}

/// net/rpc's request header, as much of it as the hostile port reads.
#[derive(serde::Deserialize)]
struct CallHeader {
    #[serde(rename = "ServiceMethod")]
    method: String,
    #[serde(rename = "Seq")]
    seq: u64,
}

/// Reads each call of `stream` (a header and its arguments) and answers it
/// as `answer` says.
async fn answer_calls(mut stream: yamux::Stream, answer: Answer) {
    use agent_sim_proto::msgpack::{MessageScan, write::Writer};
    use futures_util::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let mut scan = MessageScan::default();
        let (h, end) = loop {
            match scan.scan(&buf) {
                Ok(Some(done)) => break done,
                Ok(None) if buf.len() < 1 << 20 => {}
                _ => return,
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let call: CallHeader = agent_sim_proto::msgpack::decode(&buf[..h]).unwrap();
        buf.drain(..end);
        if call.method == "Health.ServiceNodes" {
            // A blocking query is held, as a server does with no change:
            // what is counted comes from the agent's own calls.
            let _ = stream.read(&mut chunk).await;
            return;
        }
        let mut out = Vec::new();
        let header = |out: &mut Vec<u8>, seq: u64| {
            Writer(out)
                .map(3)
                .kv_str("ServiceMethod", &call.method)
                .kv_uint("Seq", seq)
                .kv_str("Error", "");
        };
        match answer {
            Answer::Garbage => out.extend_from_slice(&[0xc1; 64]),
            Answer::WrongSeq => {
                header(&mut out, call.seq + 1000);
                Writer(&mut out).nil();
            }
            Answer::StringForStruct => {
                header(&mut out, call.seq);
                Writer(&mut out).str("Permission denied");
            }
            Answer::Endless => {
                header(&mut out, call.seq);
                out.push(0xdb);
                out.extend_from_slice(&0x7fff_ffffu32.to_be_bytes());
                if stream.write_all(&out).await.is_err() {
                    return;
                }
                // Until the client resets the stream (or 64 MiB: the test's
                // own bound).
                let filler = [b'a'; 16 * 1024];
                for _ in 0..4096 {
                    if stream.write_all(&filler).await.is_err() {
                        return;
                    }
                }
                return;
            }
            Answer::Refuse => {
                Writer(&mut out)
                    .map(3)
                    .kv_str("ServiceMethod", &call.method)
                    .kv_uint("Seq", call.seq)
                    .kv_str("Error", "No cluster leader");
                // net/rpc answers an error with an empty struct.
                Writer(&mut out).map(0);
            }
            Answer::Silent => {
                // Holds the stream open, answering nothing.
                let _ = stream.read(&mut chunk).await;
                return;
            }
        }
        if stream.write_all(&out).await.is_err() || stream.flush().await.is_err() {
            return;
        }
    }
}

/// One client agent's session (blocking watches share its RPC connection)
/// against a hostile port, until `kind` is counted `times`; what was
/// counted.
async fn agent_against(
    answer: Answer,
    kind: &'static str,
    times: u64,
) -> (SessionEnd, agent_sim_metrics::Metrics) {
    let rpc = hostile_rpc_port(answer).await;
    let cfg = ConsulConfig {
        anti_entropy: Some(Duration::from_secs(60)),
        watch: agent_sim_consul::watch::WatchMode::Blocking,
        agent: agent_sim_consul::modes::AgentWire::Client,
        ..one_port(rpc)
    };
    let m = common::metrics();
    let factory = ConsulFactory::new(cfg, m.clone()).unwrap();
    let mut agent = factory.create(0);
    let what = format!("{answer:?}: {kind} counted {times} times");
    let end = common::session_until(
        &mut agent,
        &m,
        (Duration::from_secs(30), &what),
        async || m.snapshot().errors.get(kind).is_some_and(|&n| n >= times),
    )
    .await;
    (end, m)
}

#[tokio::test]
async fn an_rpc_port_answering_garbage_or_the_wrong_call_or_forever_is_counted_and_survived() {
    // Twice: the call after a broken one is made on a new stream of the
    // same connection (once for the silent port: 10 s per call).
    let cases = [
        (Answer::Garbage, "decode_answer", "msgpack", 2),
        (Answer::WrongSeq, "decode_answer", "an answer to call", 2),
        (
            Answer::StringForStruct,
            "decode_answer",
            "the answer did not decode",
            2,
        ),
        (Answer::Endless, "answer_too_large", "over 256 KiB", 2),
        (Answer::Silent, "rpc_timeout", "no answer within 10s", 1),
    ];
    let runs = cases.map(|(answer, kind, words, times)| async move {
        let (end, m) = agent_against(answer, kind, times).await;
        (answer, kind, words, end, m)
    });
    for (answer, kind, words, end, m) in futures_util::future::join_all(runs).await {
        // The session went on through the bad answers until the test ended it.
        assert_eq!(end, SessionEnd::Shutdown, "{answer:?}: {end:?}");
        let s = m.snapshot();
        let sample = m.error_sample(kind).unwrap_or_default();
        assert!(sample.contains(words), "{answer:?}: {kind} said {sample:?}");
        // A failed call waits the backoff: no storm of retries.
        let total: u64 = s.errors.values().sum();
        assert!(total <= 12, "{answer:?}: {:?}", s.errors);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_refusing_every_call_is_left_for_the_next_after_a_failed_call() {
    // Two servers: one answers every call with an error, the other is a
    // cluster. Agents whose router puts the first in front register there,
    // fail, and (as Consul's client moves a failed server to the end of
    // its list) make their next calls on the other; their watches stay.
    let refusing = hostile_rpc_port(Answer::Refuse).await;
    let t = common::start_target().await;
    let cfg = ConsulConfig {
        conn: agent_sim_consul::Connection {
            targets: vec![refusing.to_string(), t.rpc.to_string()],
            http_target: t.http.to_string(),
            ..agent_sim_consul::Connection::to(&[])
        },
        watch: agent_sim_consul::watch::WatchMode::Http,
        agent: agent_sim_consul::modes::AgentWire::Client,
        ..one_port(refusing)
    };
    let m = common::metrics();
    let fleet = agent_sim_fleet::FleetConfig {
        agents: 20,
        ramp: Some(agent_sim_fleet::Rate::per_second(1000.0)),
        duration: Some(Duration::from_secs(6)),
        grace: Duration::from_secs(5),
        ..agent_sim_fleet::FleetConfig::default()
    };
    let (report, _) = common::run_fleet(cfg, fleet, &m).await;
    assert_eq!(report.connected_at_end, 20, "{:?}", report.missing);
    assert_eq!(common::counter(&m, "registrations"), 20);
    // Each agent fails at most its first call there (20 agents: some start
    // on each server), and none of its sessions was lost for it.
    let refused = m.snapshot().errors.values().sum::<u64>();
    assert!((1..=20).contains(&refused), "{:?}", m.snapshot().errors);
    assert!(
        report.sessions_lost.is_empty(),
        "{:?}",
        report.sessions_lost
    );
}
