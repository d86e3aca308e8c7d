//! Our own frames decode with the same codec, pass the backend's validation,
//! and our reply to the real check request (vector 003) carries the same
//! values as the real agent's reply (vector 004).

use std::sync::Arc;

use crate::common::*;
use agent_sim_sensu::SensuConfig;
use agent_sim_sensu::codec::{self, Encoding, validate_event};
use agent_sim_sensu::messages::{self, MessageBuilder, Templates};

/// Fields that legitimately differ from the capture: clocks and the host.
const VARIES: &[&str] = &["timestamp", "check.executed", "entity.system.hostname"];

fn builder(enc: Encoding, name: &str) -> MessageBuilder {
    let cfg = SensuConfig {
        subscriptions: vec!["vectors".into()],
        encoding: enc,
        agent_version: "(devel)".into(),
        ..Default::default()
    };
    MessageBuilder::new(Arc::new(Templates::new(&cfg)), name.into(), 1)
}

fn dir(enc: Encoding) -> &'static str {
    match enc {
        Encoding::Protobuf => "sensu/protobuf",
        Encoding::Json => "sensu/json",
    }
}

fn manifest_entry(file: &str) -> serde_json::Value {
    sensu_manifest()
        .into_iter()
        .find(|e| e["file"] == file)
        .unwrap_or_else(|| panic!("{file} not in manifest"))
}

#[test]
fn our_keepalives_and_events_decode_and_validate() {
    for enc in [Encoding::Protobuf, Encoding::Json] {
        let b = builder(enc, "agent-sim-42");
        let mut out = Vec::new();
        b.write_keepalive_frame(&mut out, 1_795_300_844, [3; 16], 1)
            .unwrap();
        let (kind, d) = decode(&out, "corev2.Event (keepalive)", enc);
        assert_eq!(kind, codec::KIND_KEEPALIVE);
        let Decoded::Event(ev) = d else {
            unreachable!()
        };
        assert_eq!(validate_event(&ev, true), Ok(()), "{enc}");
        assert_eq!(ev, b.keepalive(1_795_300_844, [3; 16], 1), "{enc}");
        for (k, v) in [
            ("check.name", "keepalive".into()),
            ("check.interval", 20.into()),
            ("check.timeout", 120.into()),
            ("check.ttl", 0.into()),
            ("entity.entity_class", "agent".into()),
            ("entity.name", "agent-sim-42".into()),
            ("namespace", "default".into()),
            ("sequence", 1.into()),
        ] {
            assert_eq!(field(&Decoded::Event(ev.clone()), k), Some(v), "{enc} {k}");
        }
        assert!(ev.metadata.unwrap().name.is_empty());

        let check = b.agent_event_check(1_795_300_850);
        b.write_event_frame(&mut out, check, 1_795_300_850, [4; 16], 7)
            .unwrap();
        let (kind, d) = decode(&out, "corev2.Event", enc);
        assert_eq!(kind, codec::KIND_EVENT);
        let Decoded::Event(ev) = d else {
            unreachable!()
        };
        assert_eq!(validate_event(&ev, false), Ok(()), "{enc}");
        assert_eq!(ev.check.unwrap().output.len(), 256);
    }
}

#[test]
fn our_check_reply_matches_the_real_agent() {
    for enc in [Encoding::Protobuf, Encoding::Json] {
        let (name, suffix) = match enc {
            Encoding::Protobuf => ("vec-pb-1", "pb"),
            Encoding::Json => ("vec-json-1", "json"),
        };
        let mut b = builder(enc, name);
        // The session's real entity config (vector 002) applies first.
        let (_, d) = decode(
            &read(&format!("{}/002-backend-entity_config.bin", dir(enc))),
            "corev3.EntityConfig",
            enc,
        );
        let Decoded::EntityConfig(ec) = d else {
            unreachable!()
        };
        assert!(b.apply_entity_config(ec));

        let (_, d) = decode(
            &read(&format!("{}/003-backend-check_request.bin", dir(enc))),
            "corev2.CheckRequest",
            enc,
        );
        let Decoded::CheckRequest(req) = d else {
            unreachable!()
        };
        let now = 1_795_300_999;
        let check = b.check_result(&req, now);
        let mut out = Vec::new();
        b.write_event_frame(&mut out, check, now, [5; 16], 1)
            .unwrap();
        let (kind, d) = decode(&out, "corev2.Event", enc);
        assert_eq!(kind, codec::KIND_EVENT);
        let Decoded::Event(ours) = &d else {
            unreachable!()
        };
        assert_eq!(validate_event(ours, false), Ok(()));
        let c = ours.check.clone().unwrap();
        assert_eq!(c.processed_by, name);
        assert_eq!(c.executed, now);

        let real_file = format!("{}/004-agent-event.bin", dir(enc));
        let want = manifest_entry(&real_file);
        let mut compared = 0;
        for (k, v) in want["expected_decoded_fields"].as_object().unwrap() {
            if VARIES.contains(&k.as_str()) {
                continue;
            }
            let got = field(&d, k).unwrap();
            assert_eq!(got, expected(v, &got), "{suffix}: {k}");
            compared += 1;
        }
        assert!(compared >= 15, "{compared}");

        // Beyond the manifest: every check field the real agent copies.
        let (_, real) = decode(&read(&real_file), "corev2.Event", enc);
        let Decoded::Event(real) = real else {
            unreachable!()
        };
        let mut rc = real.check.unwrap();
        let mut oc = c;
        // Our own text, but as large as the real agent's canned output.
        assert_eq!(oc.output.len(), rc.output.len(), "{suffix}: output size");
        assert!(oc.output.starts_with(messages::CHECK_OUTPUT));
        for ch in [&mut rc, &mut oc] {
            ch.executed = 0;
            ch.output.clear();
        }
        assert_eq!(oc, rc, "{suffix}: check");
    }
}
