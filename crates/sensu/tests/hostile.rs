//! Hostile input never hurts an agent: every decoder of a backend's bytes
//! (WebSocket frames with our limits, the `<kind>\n<body>` split, protobuf
//! and JSON bodies, the unknown-field scan) is run on arbitrary bytes and on
//! damaged copies of the captured 6.12 frames. None panics, none allocates
//! beyond its bound, a message over the limit is refused before it is
//! decoded, and what the encoders write decodes back to what they were given.

use std::io::Cursor;

use agent_sim_proto::sensu::{v2, v3};
use agent_sim_sensu::codec::{self, CodecError, Encoding};
use agent_sim_sensu::session::ws_config;
use agent_sim_testkit::alloc::{ALLOC_SLACK, CountingAlloc, decode_bound, peak_during};
use agent_sim_testkit::hostile::{mutated, sensu_frames};
use proptest::collection::vec;
use proptest::prelude::*;
use tokio_tungstenite::tungstenite::Error as WsError;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocket};

use crate::receive;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

fn seeds() -> Vec<Vec<u8>> {
    sensu_frames().into_iter().map(|(_, b)| b).collect()
}

/// A protobuf body prefixed with one of the frame kinds.
fn framed(body: Vec<u8>, kind: u8) -> Vec<u8> {
    let kind = [
        codec::KIND_CHECK_REQUEST,
        codec::KIND_ENTITY_CONFIG,
        codec::KIND_EVENT,
    ][kind as usize % 3];
    codec::encode_frame(kind, &body)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_payloads_never_panic_and_stay_bounded(
        body in vec(any::<u8>(), 0..1024),
        kind in any::<u8>(),
    ) {
        for payload in [framed(body.clone(), kind), body] {
            let ((), peak) = peak_during(|| receive::message(&payload));
            prop_assert!(peak <= decode_bound(payload.len()), "{peak} bytes for {} input bytes", payload.len());
        }
    }

    #[test]
    fn damaged_captured_frames_never_panic_and_stay_bounded(payload in mutated(seeds())) {
        let ((), peak) = peak_during(|| receive::message(&payload));
        prop_assert!(peak <= decode_bound(payload.len()), "{peak} bytes for {} input bytes", payload.len());
    }

    /// The WebSocket layer with the session's limits: whatever bytes a
    /// backend sends, reading ends in messages within the limit or an error.
    #[test]
    fn websocket_reads_of_arbitrary_bytes_stay_within_the_limits(
        bytes in prop_oneof![
            vec(any::<u8>(), 0..512),
            mutated(vec![
                ws_frame(&codec::encode_frame("check_request", b"\x20\x01")),
                ws_frame(&vec![b'x'; 300]),
            ]),
        ],
    ) {
        let ((), peak) = peak_during(|| receive::socket(&bytes));
        prop_assert!(peak <= 2 * codec::MAX_MESSAGE + ALLOC_SLACK, "{peak}");
    }
}

/// One unmasked binary frame as a backend sends it.
fn ws_frame(payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0x82];
    match payload.len() {
        n if n < 126 => out.push(n as u8),
        n if n <= 0xffff => {
            out.push(126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(payload);
    out
}

#[test]
fn huge_websocket_length_fields_are_refused_before_buffering() {
    // A frame header announcing 2^62 bytes, then a few.
    let mut wire = vec![0x82, 127];
    wire.extend_from_slice(&(1u64 << 62).to_be_bytes());
    wire.extend_from_slice(&[0; 64]);
    let mut ws = WebSocket::from_raw_socket(Cursor::new(wire), Role::Client, Some(ws_config()));
    let (r, peak) = peak_during(|| ws.read());
    assert!(matches!(r, Err(WsError::Capacity(_))), "{r:?}");
    assert!(peak < 8 * 1024, "{peak}");
    // One byte over the message limit, in one frame.
    let over = ws_frame(&vec![b'a'; codec::MAX_MESSAGE + 1]);
    let mut ws = WebSocket::from_raw_socket(Cursor::new(over), Role::Client, Some(ws_config()));
    assert!(matches!(ws.read(), Err(WsError::Capacity(_))));
}

#[test]
fn over_limit_messages_are_refused_without_decoding() {
    let mut payload = codec::encode_frame(codec::KIND_CHECK_REQUEST, &[]);
    payload.resize(codec::MAX_MESSAGE + 1, 0x0a);
    let (r, peak) = peak_during(|| codec::split_frame(&payload).map(|_| ()));
    assert!(matches!(r, Err(CodecError::TooLarge { .. })), "{r:?}");
    assert_eq!(peak, 0);
    for enc in [Encoding::Protobuf, Encoding::Json] {
        assert!(matches!(
            codec::decode_check_request(&payload, enc),
            Err(CodecError::TooLarge { .. })
        ));
    }
}

#[test]
fn the_worst_protobuf_amplification_is_within_the_bound() {
    // A check request that is nothing but empty `assets` entries.
    let mut body = Vec::new();
    while body.len() + 2 <= codec::MAX_MESSAGE - 32 {
        body.extend_from_slice(&[0x12, 0x00]);
    }
    let (r, peak) = peak_during(|| codec::decode_check_request(&body, Encoding::Protobuf));
    assert_eq!(r.unwrap().assets.len(), body.len() / 2);
    assert!(
        peak <= decode_bound(body.len()),
        "{peak} for {}",
        body.len()
    );
    println!(
        "{} bytes of empty assets: peak {peak} bytes ({}x)",
        body.len(),
        peak / body.len()
    );
}

#[test]
fn json_nesting_beyond_the_depth_limit_is_an_error_not_a_crash() {
    let depth = codec::JSON_MAX_DEPTH + 1;
    let mut body = String::from("{\"config\":");
    body.push_str(&"[".repeat(depth));
    body.push_str(&"]".repeat(depth));
    body.push('}');
    assert!(codec::decode_check_request(body.as_bytes(), Encoding::Json).is_err());
    // Within the limit, the same shape parses as far as the types allow.
    let ok = format!("{{\"x\":{}{}}}", "[".repeat(100), "]".repeat(100));
    assert!(codec::decode_check_request(ok.as_bytes(), Encoding::Json).is_ok());
}

#[test]
fn captured_frames_have_no_unknown_fields_and_extras_are_named() {
    for (name, payload) in sensu_frames() {
        let f = codec::split_frame(&payload).unwrap();
        let enc = if name.starts_with("sensu/json") {
            Encoding::Json
        } else {
            Encoding::Protobuf
        };
        assert_eq!(codec::unknown_fields(f.kind, f.body, enc), None, "{name}");
    }
    let req = std::fs::read(
        agent_sim_testkit::hostile::vectors_dir()
            .join("sensu/protobuf/003-backend-check_request.bin"),
    )
    .unwrap();
    let mut body = codec::split_frame(&req).unwrap().body.to_vec();
    body.extend_from_slice(&[0x9a, 0x06, 0x00, 0xf8, 0x06, 0x01]); // fields 99 and 111
    let u = codec::unknown_fields(codec::KIND_CHECK_REQUEST, &body, Encoding::Protobuf).unwrap();
    assert_eq!(u.first, "field 99 (wire type 2)");
    assert_eq!(u.count, 2);
    let json = br#"{"config":{},"issued":3,"hook_assets":{},"future":1,"other":[2]}"#;
    let u = codec::unknown_fields(codec::KIND_CHECK_REQUEST, json, Encoding::Json).unwrap();
    assert_eq!(u.first, "key \"future\"");
    assert_eq!(u.count, 2);
    assert_eq!(
        codec::unknown_fields(codec::KIND_KEEPALIVE, &body, Encoding::Protobuf),
        None
    );
}

// ---------------------------------------------------------------- round trips

fn text() -> impl Strategy<Value = String> {
    vec(any::<char>(), 0..8).prop_map(String::from_iter)
}

fn texts() -> impl Strategy<Value = Vec<String>> {
    vec(text(), 0..4)
}

fn meta() -> impl Strategy<Value = v2::ObjectMeta> {
    (
        text(),
        text(),
        proptest::collection::hash_map(text(), text(), 0..3),
        text(),
    )
        .prop_map(|(name, namespace, labels, created_by)| v2::ObjectMeta {
            name,
            namespace,
            annotations: labels.clone(),
            labels,
            created_by,
        })
}

fn check_config() -> impl Strategy<Value = v2::CheckConfig> {
    (
        (text(), texts(), any::<u32>(), any::<u32>(), any::<bool>()),
        (texts(), texts(), text(), any::<i64>(), any::<u32>()),
        (meta(), any::<i64>(), any::<bool>(), text(), texts()),
    )
        .prop_map(
            |(
                (command, handlers, interval, timeout, publish),
                (runtime_assets, subscriptions, cron, ttl, high),
                (metadata, max_output_size, stdin, output_metric_format, env_vars),
            )| v2::CheckConfig {
                command,
                handlers,
                interval,
                timeout,
                publish,
                runtime_assets,
                subscriptions,
                cron,
                ttl,
                high_flap_threshold: high,
                metadata: Some(metadata),
                max_output_size,
                stdin,
                output_metric_format,
                env_vars,
                ..Default::default()
            },
        )
}

fn check_request() -> impl Strategy<Value = v2::CheckRequest> {
    (
        check_config(),
        vec(meta(), 0..3),
        vec(meta(), 0..3),
        any::<i64>(),
    )
        .prop_map(|(config, assets, hooks, issued)| v2::CheckRequest {
            config: Some(config),
            assets: assets
                .into_iter()
                .map(|m| v2::AssetRef { metadata: Some(m) })
                .collect(),
            hooks: hooks
                .into_iter()
                .map(|m| v2::HookRef { metadata: Some(m) })
                .collect(),
            issued,
        })
}

fn entity_config() -> impl Strategy<Value = v3::EntityConfig> {
    (
        meta(),
        text(),
        text(),
        texts(),
        any::<bool>(),
        text(),
        texts(),
        texts(),
    )
        .prop_map(
            |(metadata, entity_class, user, subscriptions, deregister, handler, kh, redact)| {
                v3::EntityConfig {
                    metadata: Some(metadata),
                    entity_class,
                    user,
                    subscriptions,
                    deregister,
                    deregistration: Some(v2::Deregistration { handler }),
                    keepalive_handlers: kh,
                    redact,
                }
            },
        )
}

fn event() -> impl Strategy<Value = v2::Event> {
    (
        any::<i64>(),
        meta(),
        texts(),
        (text(), any::<u32>(), 0u32..40_000, any::<i64>(), text()),
        any::<[u8; 16]>(),
        any::<i64>(),
    )
        .prop_map(
            |(
                timestamp,
                emeta,
                subscriptions,
                (output, status, quarter_ms, executed, cmd),
                id,
                sequence,
            )| {
                v2::Event {
                    timestamp,
                    entity: Some(v2::Entity {
                        entity_class: "agent".into(),
                        system: Some(v2::System {
                            hostname: emeta.name.clone(),
                            network: Some(v2::Network::default()),
                            ..Default::default()
                        }),
                        subscriptions,
                        metadata: Some(emeta.clone()),
                        deregistration: Some(v2::Deregistration::default()),
                        ..Default::default()
                    }),
                    check: Some(v2::Check {
                        command: cmd,
                        output,
                        status,
                        // Quarter milliseconds: exact in binary and decimal.
                        duration: f64::from(quarter_ms) / 4000.0,
                        executed,
                        metadata: Some(emeta),
                        ..Default::default()
                    }),
                    metadata: Some(v2::ObjectMeta::default()),
                    id: id.to_vec(),
                    sequence,
                    metrics: None,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn check_requests_round_trip(r in check_request()) {
        let pb = codec::encode_check_request(&r, Encoding::Protobuf).unwrap();
        prop_assert_eq!(&codec::decode_check_request(&pb, Encoding::Protobuf).unwrap(), &r);
        prop_assert_eq!(codec::unknown_fields(codec::KIND_CHECK_REQUEST, &pb, Encoding::Protobuf), None);
        let json = codec::encode_check_request(&r, Encoding::Json).unwrap();
        prop_assert_eq!(codec::unknown_fields(codec::KIND_CHECK_REQUEST, &json, Encoding::Json), None);
        // JSON carries the fields a check config has in JSON: exactly these.
        prop_assert_eq!(&codec::decode_check_request(&json, Encoding::Json).unwrap(), &r);
    }

    #[test]
    fn entity_configs_round_trip(c in entity_config()) {
        for enc in [Encoding::Protobuf, Encoding::Json] {
            let body = codec::encode_entity_config(&c, enc).unwrap();
            prop_assert_eq!(&codec::decode_entity_config(&body, enc).unwrap(), &c);
            prop_assert_eq!(codec::unknown_fields(codec::KIND_ENTITY_CONFIG, &body, enc), None);
        }
    }

    #[test]
    fn events_round_trip(e in event()) {
        for enc in [Encoding::Protobuf, Encoding::Json] {
            let body = codec::encode_event(&e, enc).unwrap();
            prop_assert_eq!(&codec::decode_event(&body, enc).unwrap(), &e);
        }
    }
}
