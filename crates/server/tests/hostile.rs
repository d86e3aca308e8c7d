//! Hostile input never hurts the embedded backend: what an agent sends the
//! Sensu endpoint (WebSocket frames with the endpoint's limits, then the
//! frame decision `inbound::classify`) and what a client sends the Consul
//! HTTP API (`dispatch`, every route, on a live catalog) is run on arbitrary
//! bytes and on damaged copies of the captured requests: nothing panics,
//! decoding stays within its heap bound, the catalog stays consistent, and a
//! Subscribe request of any bytes decodes or fails cleanly.

use std::io::Cursor;

use agent_sim_proto::consul::subscribe::SubscribeRequest;
use agent_sim_sensu::codec::{self, Encoding};
use agent_sim_server::consul::{ApiRequest, ConsulState, dispatch};
use agent_sim_server::sensu::{inbound, ws_config};
use agent_sim_testkit::alloc::{CountingAlloc, decode_bound, peak_during};
use agent_sim_testkit::hostile::{mutated, sensu_frames, vectors};
use http::Method;
use proptest::collection::vec;
use proptest::prelude::*;
use prost::Message as _;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocket};

use crate::receive;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

fn agent_frames() -> Vec<Vec<u8>> {
    sensu_frames()
        .into_iter()
        .filter(|(n, _)| n.contains("-agent-") || n.contains("rejected"))
        .map(|(_, b)| b)
        .collect()
}

/// One masked client frame, as an agent sends it.
fn client_frame(payload: &[u8]) -> Vec<u8> {
    agent_sim_sensu::session::masked_binary_frame(payload, [1, 2, 3, 4])
}

/// Bodies of the write routes, captured and typical.
fn request_bodies() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = vectors("consul/http", ".request.txt")
        .into_iter()
        .filter_map(|(_, b)| {
            let at = b
                .windows(4)
                .position(|w| w == b"\r\n\r\n" || w.starts_with(b"\n\n"))?;
            Some(
                b[at..]
                    .iter()
                    .copied()
                    .skip_while(|c| c.is_ascii_whitespace())
                    .collect(),
            )
        })
        .collect();
    v.push(br#"[{"Node":{"Verb":"set","Node":{"Node":"n1","Address":"10.0.0.1","Meta":{"agent-sim-prefix":"x"}}}},{"Service":{"Verb":"set","Node":"n1","Service":{"ID":"app-1","Service":"app","Port":8080}}},{"Check":{"Verb":"set","Check":{"Node":"n1","CheckID":"service:app-1","Name":"h","Status":"passing","ServiceID":"app-1"}}}]"#.to_vec());
    v.push(
        br#"{"Kind":"service-intentions","Name":"web","Sources":[{"Name":"a","Action":"allow"}]}"#
            .to_vec(),
    );
    v.push(br#"{"Node":"sim-node-1","ServiceID":"web-1"}"#.to_vec());
    v.push(
        br#"[{"KV":{"Verb":"set","Key":"app/t","Value":"eA=="}},{"KV":{"Verb":"get-tree","Key":"app/"}},{"KV":{"Verb":"lock","Key":"app/l","Session":"x"}}]"#
            .to_vec(),
    );
    v
}

/// Sends `body` to every write route, reading everything back after each.
fn api_round(state: &ConsulState, body: &[u8]) {
    for route in 0..receive::WRITE_ROUTES.len() {
        receive::write_then_read(state, route, body);
    }
}

/// The seeded catalog with the captured and typical writes on top.
fn seeded_state() -> ConsulState {
    let state = receive::seeded();
    for b in request_bodies() {
        api_round(&state, &b);
    }
    state
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_agent_payloads_never_panic_and_stay_bounded(p in vec(any::<u8>(), 0..1024)) {
        let ((), peak) = peak_during(|| receive::agent_message(&p));
        prop_assert!(peak <= decode_bound(p.len()), "{peak} for {}", p.len());
    }

    #[test]
    fn damaged_agent_frames_never_panic_and_stay_bounded(p in mutated(agent_frames())) {
        let ((), peak) = peak_during(|| receive::agent_message(&p));
        prop_assert!(peak <= decode_bound(p.len()), "{peak} for {}", p.len());
    }

    #[test]
    fn websocket_reads_on_the_endpoint_stay_within_the_limits(
        bytes in prop_oneof![
            vec(any::<u8>(), 0..512),
            mutated(agent_frames().iter().map(|f| client_frame(f)).collect()),
        ],
    ) {
        let ((), peak) = peak_during(|| receive::endpoint_socket(&bytes));
        prop_assert!(peak <= 2 * codec::MAX_MESSAGE + decode_bound(bytes.len()), "{peak}");
    }

    #[test]
    fn subscribe_requests_of_any_bytes_decode_or_fail_cleanly(b in vec(any::<u8>(), 0..256)) {
        let (_, peak) = peak_during(|| SubscribeRequest::decode(&b[..]));
        prop_assert!(peak <= decode_bound(b.len()));
    }
}

proptest! {
    // Each case runs every route on a live catalog: fewer cases.
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn the_http_api_answers_damaged_requests_without_panicking(
        bodies in vec(prop_oneof![mutated(request_bodies()), vec(any::<u8>(), 0..256)], 1..4),
    ) {
        let state = seeded_state();
        for b in &bodies {
            api_round(&state, b);
        }
        // The catalog is still whole: every node it lists can be read.
        let nodes = dispatch(&state, &ApiRequest {
            method: &Method::GET, path: "/v1/catalog/nodes", query: "", token: "", body: b"",
        });
        prop_assert_eq!(nodes.status().as_u16(), 200);
    }
}

#[test]
fn over_limit_agent_messages_are_invalid_without_decoding() {
    let mut p = codec::encode_frame(codec::KIND_KEEPALIVE, &[]);
    p.resize(codec::MAX_MESSAGE + 1, 0);
    let (r, peak) = peak_during(|| inbound::classify(&p, Encoding::Protobuf));
    assert!(matches!(r, inbound::Inbound::Invalid));
    assert_eq!(peak, 0);
    // And the socket refuses such a frame before buffering it.
    let mut ws = WebSocket::from_raw_socket(
        Cursor::new(client_frame(&p)),
        Role::Server,
        Some(ws_config()),
    );
    assert!(ws.read().is_err());
}

#[test]
fn captured_agent_frames_classify_as_the_backend_did() {
    let mut keepalives = 0;
    for (name, p) in vectors("sensu/protobuf", ".bin") {
        if name.contains("-agent-keepalive") {
            assert!(
                matches!(
                    inbound::classify(&p, Encoding::Protobuf),
                    inbound::Inbound::Keepalive(_)
                ),
                "{name}"
            );
            keepalives += 1;
        }
    }
    assert!(keepalives >= 4);
    let bad = std::fs::read(
        agent_sim_testkit::hostile::vectors_dir()
            .join("sensu/rejected/keepalive-timestamp-0.protobuf.bin"),
    )
    .unwrap();
    assert!(matches!(
        inbound::classify(&bad, Encoding::Protobuf),
        inbound::Inbound::Rejected("invalid_timestamp")
    ));
}
