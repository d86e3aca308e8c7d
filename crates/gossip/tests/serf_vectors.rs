//! Golden vectors of serf's user events, queries and query answers:
//! datagrams captured from a real Consul 1.20.1 server and a real client
//! agent while `consul event` and `consul keyring` ran, plain and encrypted
//! (`testdata/vectors/consul/serf`). Each is opened through its layers with
//! the key the manifest names, its serf messages decoded to the manifest's
//! fields, and what a simulated member writes (its answers, the keyring's
//! answer inside them, the events it passes on) written again byte for
//! byte as the real agent wrote it.

use crate::golden;

use std::time::Duration;

use crate::golden::{dir, security};
use agent_sim_gossip::serf::event::UserEvent;
use agent_sim_gossip::serf::keys::{self, KeyResponse};
use agent_sim_gossip::serf::kind_serf;
use agent_sim_gossip::serf::query::{Query, QueryResponse};
use agent_sim_gossip::wire::{each_message, kind};
use serde_json::Value;

/// The serf objects of an entry's decoded tree, in order.
fn serf_parts<'v>(v: &'v Value, out: &mut Vec<&'v Value>) {
    match v {
        Value::Object(m) => {
            if let Some(s) = m.get("serf") {
                out.push(s);
                return;
            }
            for k in ["inner", "parts"] {
                if let Some(x) = m.get(k) {
                    serf_parts(x, out);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| serf_parts(x, out)),
        _ => {}
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A byte field as the manifest gives it: text, or hex when named in
/// `hex_fields`; nil as `null`.
fn bytes_field(serf: &Value, name: &str, b: &[u8]) -> Value {
    let hexed = serf["hex_fields"]
        .as_array()
        .is_some_and(|h| h.iter().any(|f| f == name));
    if hexed {
        Value::from(hex(b))
    } else if b.is_empty() && serf["fields"][name].is_null() {
        Value::Null
    } else {
        Value::from(std::str::from_utf8(b).unwrap())
    }
}

/// One serf message checked against the manifest; what kind it was.
fn check(file: &str, body: &[u8], serf: &Value) -> u8 {
    let f = &serf["fields"];
    let t = body[0];
    assert_eq!(Value::from(t), serf["serf_type"], "{file}");
    let mut again = vec![];
    match t {
        kind_serf::JOIN | kind_serf::LEAVE => {
            let (_, ltime, node) = agent_sim_gossip::serf::decode_intent(body)
                .unwrap()
                .unwrap();
            assert_eq!(Value::from(ltime), f["LTime"], "{file}");
            assert_eq!(Value::from(node), f["Node"], "{file}");
            return t;
        }
        kind_serf::USER_EVENT => {
            let e = UserEvent::decode(body).unwrap().unwrap();
            assert_eq!(Value::from(e.ltime), f["LTime"], "{file}");
            assert_eq!(Value::from(e.name), f["Name"], "{file}");
            assert_eq!(Value::from(e.cc), f["CC"], "{file}");
            assert_eq!(
                bytes_field(serf, "Payload", e.payload),
                f["Payload"],
                "{file}"
            );
            e.encode(&mut again);
        }
        kind_serf::QUERY => {
            let q = Query::decode(body).unwrap().unwrap();
            assert_eq!(Value::from(q.ltime), f["LTime"], "{file}");
            assert_eq!(Value::from(q.id), f["ID"], "{file}");
            assert_eq!(bytes_field(serf, "Addr", q.addr), f["Addr"], "{file}");
            assert_eq!(
                q.reply_to().unwrap().ip().to_string(),
                serf["Addr_ip"].as_str().unwrap(),
                "{file}"
            );
            assert_eq!(Value::from(q.port), f["Port"], "{file}");
            assert_eq!(Value::from(q.source_node), f["SourceNode"], "{file}");
            assert!(q.filters.is_empty() && f["Filters"].is_null(), "{file}");
            assert_eq!(Value::from(q.flags), f["Flags"], "{file}");
            assert_eq!(Value::from(q.relay_factor), f["RelayFactor"], "{file}");
            assert_eq!(
                q.timeout,
                Duration::from_nanos(f["Timeout"].as_u64().unwrap()),
                "{file}"
            );
            assert_eq!(Value::from(q.name), f["Name"], "{file}");
            assert_eq!(
                bytes_field(serf, "Payload", q.payload),
                f["Payload"],
                "{file}"
            );
            if q.name.starts_with("_serf_") && q.name != keys::PING && q.name != keys::CONFLICT {
                // The keyring's request: the key's raw bytes, none to list.
                let key = keys::decode_key_request(q.payload).unwrap();
                let listing = q.name == keys::LIST_KEYS;
                assert_eq!(key.is_empty(), listing, "{file}");
                let mut req = Vec::new();
                keys::encode_key_request(key, &mut req);
                assert_eq!(req, q.payload, "{file}: the request written again");
            }
            // Only read: members answer queries, they never ask them.
            return t;
        }
        kind_serf::QUERY_RESPONSE => {
            let r = QueryResponse::decode(body).unwrap().unwrap();
            assert_eq!(Value::from(r.ltime), f["LTime"], "{file}");
            assert_eq!(Value::from(r.id), f["ID"], "{file}");
            assert_eq!(Value::from(r.from), f["From"], "{file}");
            assert_eq!(Value::from(r.flags), f["Flags"], "{file}");
            assert_eq!(
                bytes_field(serf, "Payload", r.payload),
                f["Payload"],
                "{file}"
            );
            let want = &serf["Payload_decoded"]["value"];
            let k = KeyResponse::decode(r.payload).unwrap();
            assert_eq!(Value::from(k.result), want["Result"], "{file}");
            assert_eq!(Value::from(k.message.as_str()), want["Message"], "{file}");
            assert_eq!(
                Value::from(k.primary.as_str()),
                want["PrimaryKey"],
                "{file}"
            );
            let keys_want: Vec<String> = want["Keys"]
                .as_array()
                .map(|a| a.iter().map(|k| k.as_str().unwrap().into()).collect())
                .unwrap_or_default();
            assert_eq!(k.keys, keys_want, "{file}");
            let mut payload = Vec::new();
            k.encode(&mut payload);
            assert_eq!(
                payload, r.payload,
                "{file}: the keyring's answer written again"
            );
            r.encode(&mut again);
        }
        other => panic!("{file}: serf type {other}"),
    }
    assert_eq!(&again[1..], body, "{file}: serf type {t} written again");
    t
}

#[test]
fn every_captured_event_query_and_answer_decodes_and_answers_write_again() {
    let m = golden::manifest("consul/serf");
    let entries = m.as_array().unwrap();
    assert!(entries.len() >= 50, "{} vectors", entries.len());
    let mut seen = [0usize; 6];
    for e in entries {
        let file = e["file"].as_str().unwrap();
        let bytes = std::fs::read(dir().join(file)).unwrap();
        let encrypted = e["wrappers"][0].as_str().unwrap().starts_with("encrypt");
        let sec = security(
            encrypted,
            e["gossip_key_base64"].as_str().unwrap_or_default(),
        );
        let plain = sec.open_packet(&bytes).unwrap();
        let mut users: Vec<Vec<u8>> = Vec::new();
        each_message(&plain, &mut |t, b| {
            if t == kind::USER {
                users.push(b.to_vec());
            }
        })
        .unwrap();
        let mut want = Vec::new();
        serf_parts(&e["decoded"], &mut want);
        assert_eq!(users.len(), want.len(), "{file}");
        for (body, serf) in users.iter().zip(want) {
            seen[usize::from(check(file, body, serf))] += 1;
        }
    }
    let (events, queries, answers) = (
        seen[usize::from(kind_serf::USER_EVENT)],
        seen[usize::from(kind_serf::QUERY)],
        seen[usize::from(kind_serf::QUERY_RESPONSE)],
    );
    assert!(
        events >= 10 && queries >= 10 && answers >= 5,
        "{events} events, {queries} queries, {answers} answers"
    );
}
