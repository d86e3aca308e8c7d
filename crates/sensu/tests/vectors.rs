//! Every Sensu golden vector (real Sensu Go 6.12 bytes) decodes with our
//! codec to the field values the backend's own Go types decoded; our upgrade
//! request matches the real agent's; validation matches the backend's.

use crate::common::*;
use agent_sim_sensu::codec::{self, Encoding};
use agent_sim_sensu::session::upgrade_request;
use agent_sim_sensu::{SensuConfig, codec::validate_event};

/// Keys of `expected_decoded_fields` that describe the backend's reaction,
/// not a decoded field.
const REACTION_KEYS: &[&str] = &["backend_error", "connection_closed"];

#[test]
fn every_sensu_frame_decodes_to_the_expected_fields() {
    let mut frames = 0;
    let mut fields = 0;
    for e in sensu_manifest() {
        let file = e["file"].as_str().unwrap();
        if !file.ends_with(".bin") {
            continue;
        }
        let bytes = read(file);
        assert_eq!(
            bytes.len() as u64,
            e["size"].as_u64().unwrap(),
            "{file} size"
        );
        let mt = e["message_type"].as_str().unwrap();
        let want = e["expected_decoded_fields"].as_object().unwrap();
        if mt == "ws_ping" || mt == "ws_pong" {
            assert!(bytes.is_empty(), "{file}: control frame payload");
            assert_eq!(want["payload_len"], 0, "{file}");
            continue;
        }
        let (kind, d) = decode(&bytes, mt, encoding_of(file));
        let kind_from_name = match &d {
            Decoded::Event(_) if mt.contains("keepalive") => codec::KIND_KEEPALIVE,
            Decoded::Event(_) => codec::KIND_EVENT,
            Decoded::CheckRequest(_) => codec::KIND_CHECK_REQUEST,
            Decoded::EntityConfig(_) => codec::KIND_ENTITY_CONFIG,
        };
        assert_eq!(kind, kind_from_name, "{file}: frame kind");
        for (key, v) in want {
            if REACTION_KEYS.contains(&key.as_str()) {
                continue;
            }
            let got = field(&d, key).unwrap_or_else(|| panic!("{file}: unmapped key {key}"));
            assert_eq!(got, expected(v, &got), "{file}: {key}");
            fields += 1;
        }
        frames += 1;
    }
    // 2 sessions x 25 non-control frames + 2 rejected frames.
    assert_eq!(frames, 52);
    assert!(fields >= 700, "{fields}");
}

#[test]
fn real_agent_frames_pass_validation() {
    for e in sensu_manifest() {
        let file = e["file"].as_str().unwrap();
        let mt = e["message_type"].as_str().unwrap();
        if !file.ends_with(".bin") || !mt.starts_with("corev2.Event") || file.contains("rejected") {
            continue;
        }
        let (kind, d) = decode(&read(file), mt, encoding_of(file));
        let Decoded::Event(ev) = d else {
            unreachable!()
        };
        assert_eq!(ev.id.len(), 16, "{file}");
        assert_eq!(
            validate_event(&ev, kind == codec::KIND_KEEPALIVE),
            Ok(()),
            "{file}"
        );
    }
}

#[test]
fn rejected_keepalive_is_rejected_and_control_accepted() {
    let (_, d) = decode(
        &read("sensu/rejected/keepalive-timestamp-0.protobuf.bin"),
        "corev2.Event (keepalive)",
        Encoding::Protobuf,
    );
    let Decoded::Event(bad) = d else {
        unreachable!()
    };
    assert_eq!(validate_event(&bad, true), Err("invalid_timestamp"));
    let (_, d) = decode(
        &read("sensu/rejected/keepalive-valid-control.protobuf.bin"),
        "corev2.Event (keepalive)",
        Encoding::Protobuf,
    );
    let Decoded::Event(good) = d else {
        unreachable!()
    };
    assert_eq!(validate_event(&good, true), Ok(()));
}

/// Header name → value of an HTTP header block (first occurrence).
fn headers(text: &str) -> (String, Vec<(String, String)>) {
    let mut lines = text.split("\r\n");
    let start = lines.next().unwrap().to_owned();
    let hs = lines
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.to_owned()))
        .collect();
    (start, hs)
}

fn vector_cfg(enc: Encoding) -> SensuConfig {
    SensuConfig {
        subscriptions: vec!["vectors".into()],
        encoding: enc,
        ..Default::default()
    }
}

#[test]
fn upgrade_request_matches_the_real_agent() {
    for (file, name, enc, port) in [
        (
            "sensu/upgrade-request.txt",
            "vec-pb-1",
            Encoding::Protobuf,
            18081,
        ),
        (
            "sensu/json/upgrade-request.txt",
            "vec-json-1",
            Encoding::Json,
            18082,
        ),
    ] {
        let text = String::from_utf8(read(file)).unwrap();
        let (start, real) = headers(&text);
        let url: http::Uri = format!("ws://127.0.0.1:{port}/").parse().unwrap();
        let ours = upgrade_request(&vector_cfg(enc), &url, name).unwrap();
        assert_eq!(
            start,
            format!("{} {} HTTP/1.1", ours.method(), ours.uri().path())
        );
        for (k, v) in &real {
            match k.as_str() {
                // Random per connection, or Go's client name.
                "sec-websocket-key" | "user-agent" => continue,
                _ => {}
            }
            let got = ours
                .headers()
                .get(k.as_str())
                .unwrap_or_else(|| panic!("{file}: our request lacks {k}"));
            assert_eq!(got.to_str().unwrap(), v, "{file}: {k}");
        }
        // Nothing the real agent does not send (JSON: no Accept).
        for k in ours.headers().keys() {
            assert!(
                real.iter().any(|(rk, _)| rk == k.as_str()),
                "{file}: we send {k} and the real agent does not"
            );
        }
        // And the manifest's own view of it.
        let entry = sensu_manifest()
            .into_iter()
            .find(|e| e["file"] == file)
            .unwrap();
        for (k, v) in entry["expected_decoded_fields"].as_object().unwrap() {
            match k.as_str() {
                "method" => assert_eq!(ours.method().as_str(), v),
                "path" => assert_eq!(ours.uri().path(), v),
                _ => {
                    let got = ours.headers().get(k.as_str()).map(|h| h.to_str().unwrap());
                    assert_eq!(got, v.as_str(), "{file}: {k}");
                }
            }
        }
    }
}

#[test]
fn upgrade_responses_carry_the_chosen_content_type() {
    for (file, enc) in [
        ("sensu/upgrade-response.txt", Encoding::Protobuf),
        ("sensu/json/upgrade-response.txt", Encoding::Json),
    ] {
        let text = String::from_utf8(read(file)).unwrap();
        let (start, hs) = headers(&text);
        assert!(start.starts_with("HTTP/1.1 101"));
        let ct = hs.iter().find(|(k, _)| k == "content-type").unwrap();
        assert_eq!(ct.1, enc.content_type());
    }
}
