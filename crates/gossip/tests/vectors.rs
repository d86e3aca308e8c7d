//! Golden vectors: packets and streams captured with tcpdump from a real
//! Consul 1.20.1 server and three real client agents on loopback, plain and
//! with gossip encryption (`testdata/vectors/consul/gossip`, manifest with
//! what a decoder must recover). Every one is opened through its layers, its
//! messages decoded to the manifest's values, and every message this crate
//! writes is written again byte for byte as the real agent wrote it.

use crate::golden;

use crate::golden::{dir, security};
use agent_sim_gossip::coordinate::Coord;
use agent_sim_gossip::serf::event::{self, UserEvent};
use agent_sim_gossip::serf::{self, SerfState};
use agent_sim_gossip::wire::msgs::{Ack, Alive, IndirectPing, Nack, Ping, PushPull, Verdict};
use agent_sim_gossip::wire::{each_message, kind};
use serde_json::Value;

fn manifest() -> Value {
    golden::manifest("consul/gossip")
}

/// The manifest's leaf messages of an entry, in order: `(type, fields)`.
fn leaves(v: &Value, out: &mut Vec<(u64, Value)>) {
    match v {
        Value::Object(m) => {
            if let (Some(t), Some(name)) = (m.get("type").and_then(Value::as_u64), m.get("name"))
                && name != "compound"
            {
                // serf's messages keep theirs one level down.
                let fields = m
                    .get("fields")
                    .or_else(|| m.get("serf").and_then(|s| s.get("fields")))
                    .cloned()
                    .unwrap_or(Value::Null);
                out.push((t, fields));
                return;
            }
            for k in ["inner", "parts"] {
                if let Some(x) = m.get(k) {
                    leaves(x, out);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| leaves(x, out)),
        _ => {}
    }
}

fn ip(b: &[u8]) -> String {
    b.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(".")
}

/// One message checked against the manifest's fields, and written again.
fn check(file: &str, t: u8, body: &[u8], want: &Value) {
    let mut again = Vec::new();
    let f = |k: &str| want.get(k).cloned().unwrap_or(Value::Null);
    match t {
        kind::PING => {
            let p = Ping::decode(body).unwrap();
            assert_eq!(Value::from(p.node), f("Node"), "{file}");
            assert_eq!(Value::from(p.seq), f("SeqNo"), "{file}");
            p.encode(&mut again);
        }
        kind::INDIRECT_PING => {
            let p = IndirectPing::decode(body).unwrap();
            assert_eq!(Value::from(p.node), f("Node"), "{file}");
            assert_eq!(Value::from(ip(p.target)), f("Target"), "{file}");
            p.encode(&mut again);
        }
        kind::ACK => {
            let a = Ack::decode(body).unwrap();
            assert_eq!(Value::from(a.seq), f("SeqNo"), "{file}");
            if !a.payload.is_empty() {
                let c = Coord::from_ack_payload(a.payload).unwrap();
                let mut p = Vec::new();
                c.ack_payload(&mut p);
                assert_eq!(p, a.payload, "{file}: the coordinate written again");
            }
            a.encode(&mut again);
        }
        kind::NACK => Nack::decode(body).unwrap().encode(&mut again),
        kind::SUSPECT | kind::DEAD => {
            let v = Verdict::decode(body).unwrap();
            assert_eq!(Value::from(v.node), f("Node"), "{file}");
            assert_eq!(Value::from(v.from), f("From"), "{file}");
            assert_eq!(Value::from(v.incarnation), f("Incarnation"), "{file}");
            v.encode(t, &mut again);
        }
        kind::ALIVE => {
            let a = Alive::decode(body).unwrap();
            assert_eq!(Value::from(a.node), f("Node"), "{file}");
            assert_eq!(Value::from(ip(a.addr)), f("Addr"), "{file}");
            assert_eq!(Value::from(a.port), f("Port"), "{file}");
            assert_eq!(a.vsn, &[1, 5, 2, 2, 5, 4], "{file}");
            let tags: serde_json::Map<String, Value> = serf::decode_tags(a.meta)
                .unwrap()
                .into_iter()
                .map(|(k, v)| (k, Value::from(v)))
                .collect();
            assert_eq!(Value::Object(tags), f("Meta"), "{file}");
            a.encode(&mut again);
        }
        kind::USER => {
            // serf's intents and user events: both read, the events
            // written again.
            if let Some((_, ltime, node)) = serf::decode_intent(body).unwrap() {
                assert_eq!(Value::from(node), f("Node"), "{file}");
                assert_eq!(Value::from(ltime), f("LTime"), "{file}");
                return;
            }
            let e = UserEvent::decode(body).unwrap().expect(file);
            assert_eq!(Value::from(e.ltime), f("LTime"), "{file}");
            assert_eq!(Value::from(e.name), f("Name"), "{file}");
            let payload = std::str::from_utf8(e.payload).unwrap();
            assert_eq!(Value::from(payload), f("Payload"), "{file}");
            assert_eq!(Value::from(e.cc), f("CC"), "{file}");
            e.encode(&mut again);
            assert_eq!(&again[1..], body, "{file}: the user event written again");
            return;
        }
        other => panic!("{file}: message type {other}"),
    }
    assert_eq!(&again[1..], body, "{file}: type {t} written again");
}

#[test]
fn every_captured_packet_and_stream_decodes_to_the_manifest() {
    let m = manifest();
    let files = m.as_array().unwrap();
    assert!(files.len() >= 80, "{} vectors", files.len());
    let (mut messages, mut streams) = (0, 0);
    for e in files {
        let file = e["file"].as_str().unwrap();
        let bytes = std::fs::read(dir().join(file)).unwrap();
        let encrypted = e["wrappers"][0].as_str().unwrap().starts_with("encrypt");
        let sec = security(
            encrypted,
            e["gossip_key_base64"].as_str().unwrap_or_default(),
        );
        let mut want = Vec::new();
        leaves(&e["decoded"], &mut want);
        if e["transport"] == "udp" {
            let plain = sec.open_packet(&bytes).unwrap();
            let mut got: Vec<(u8, Vec<u8>)> = Vec::new();
            each_message(&plain, &mut |t, b| got.push((t, b.to_vec()))).unwrap();
            let types: Vec<u64> = got.iter().map(|(t, _)| u64::from(*t)).collect();
            let want_types: Vec<u64> = want.iter().map(|(t, _)| *t).collect();
            assert_eq!(types, want_types, "{file}");
            for ((t, body), (_, fields)) in got.iter().zip(&want) {
                check(file, *t, body, fields);
                messages += 1;
            }
        } else {
            let (msg, used) = sec.open_stream(&bytes).unwrap().expect(file);
            assert!(used <= bytes.len(), "{file}");
            assert_eq!(u64::from(msg[0]), want[0].0, "{file}");
            if msg[0] == kind::PUSH_PULL {
                check_push_pull(file, &msg[1..], &e["decoded"]);
            } else {
                check(file, msg[0], &msg[1..], &want[0].1);
            }
            streams += 1;
        }
    }
    assert!(
        messages >= 120 && streams >= 20,
        "{messages} messages, {streams} streams"
    );
}

/// The push-pull's header, nodes and serf state, as the manifest has them.
fn check_push_pull(file: &str, body: &[u8], decoded: &Value) {
    let mut inner = decoded;
    while inner.get("header").is_none() {
        inner = &inner["inner"];
    }
    let pp = PushPull::decode(body).unwrap();
    assert_eq!(Value::from(pp.join), inner["header"]["Join"], "{file}");
    assert_eq!(
        pp.nodes.len() as u64,
        inner["header"]["Nodes"].as_u64().unwrap(),
        "{file}"
    );
    for (n, w) in pp.nodes.iter().zip(inner["nodes"].as_array().unwrap()) {
        assert_eq!(Value::from(n.name), w["Name"], "{file}");
        assert_eq!(Value::from(n.state), w["State"], "{file}");
        assert_eq!(Value::from(n.incarnation), w["Incarnation"], "{file}");
    }
    let s = SerfState::decode(pp.user_state).unwrap();
    let f = &inner["user_state"]["fields"];
    assert_eq!(Value::from(s.ltime), f["LTime"], "{file}");
    assert_eq!(
        s.status.len(),
        f["StatusLTimes"].as_object().unwrap().len(),
        "{file}"
    );
    for (name, t) in &s.status {
        assert_eq!(Value::from(*t), f["StatusLTimes"][*name], "{file}");
    }
    // The event buffer's kept slots (the new leader's event, in the
    // servers' answers).
    let kept = event::state_events(pp.user_state).unwrap();
    let want = f["Events"]["non_nil"].as_object();
    assert_eq!(kept.len(), want.map_or(0, |w| w.len()), "{file}");
    for (ltime, evs) in &kept {
        let w = &f["Events"]["non_nil"][ltime.to_string()];
        assert_eq!(Value::from(*ltime), w["LTime"], "{file}");
        for ((name, payload), we) in evs.iter().zip(w["Events"].as_array().unwrap()) {
            assert_eq!(Value::from(*name), we["Name"], "{file}");
            let payload = std::str::from_utf8(payload).unwrap();
            assert_eq!(Value::from(payload), we["Payload"], "{file}");
        }
    }
}

#[test]
fn a_joining_members_push_pull_is_shaped_as_a_real_agents() {
    // The real agent's join push-pull: header, its one node, serf's state
    // with a 512-entry event buffer of nils.
    let m = manifest();
    let e = m
        .as_array()
        .unwrap()
        .iter()
        .find(|e| {
            e["file"]
                .as_str()
                .unwrap()
                .contains("pushpull-join-from-initiator")
        })
        .unwrap();
    let bytes = std::fs::read(dir().join(e["file"].as_str().unwrap())).unwrap();
    let (msg, _) = agent_sim_gossip::wire::Security::default()
        .open_stream(&bytes)
        .unwrap()
        .unwrap();
    let real = PushPull::decode(&msg[1..]).unwrap();
    let s = SerfState::decode(real.user_state).unwrap();
    let mut ours = Vec::new();
    SerfState {
        ltime: s.ltime,
        status: s.status.clone(),
        left: s.left.clone(),
        event_ltime: s.event_ltime,
        query_ltime: s.query_ltime,
    }
    .encode(&mut ours);
    assert_eq!(ours, real.user_state, "serf's state written again");
    let mut again = Vec::new();
    real.encode(&mut again);
    assert_eq!(again, msg, "the whole push-pull written again");
}
