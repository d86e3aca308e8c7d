//! Helpers shared by the integration tests: the golden vectors of
//! `testdata/vectors` and field extraction in the manifest's key language.

#![allow(dead_code)]

use agent_sim_proto::sensu::{v2, v3};
use agent_sim_sensu::codec::{self, Encoding};
use serde_json::{Value, json};

pub use agent_sim_testkit::hostile::vectors_dir;

/// The manifest entries of the Sensu vectors.
pub fn sensu_manifest() -> Vec<Value> {
    let text = std::fs::read_to_string(vectors_dir().join("manifest.json")).unwrap();
    let all: Vec<Value> = serde_json::from_str(&text).unwrap();
    all.into_iter().filter(|e| e["system"] == "sensu").collect()
}

/// Reads a vector file by its manifest path.
pub fn read(file: &str) -> Vec<u8> {
    std::fs::read(vectors_dir().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// The body encoding of a vector file.
pub fn encoding_of(file: &str) -> Encoding {
    if file.starts_with("sensu/json/") {
        Encoding::Json
    } else {
        Encoding::Protobuf
    }
}

/// A decoded Sensu message.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // test helper, short-lived values
pub enum Decoded {
    Event(v2::Event),
    CheckRequest(v2::CheckRequest),
    EntityConfig(v3::EntityConfig),
}

/// Decodes a whole frame payload of the given manifest message type.
pub fn decode(payload: &[u8], message_type: &str, enc: Encoding) -> (String, Decoded) {
    let f = codec::split_frame(payload).unwrap();
    let d = if message_type.starts_with("corev2.Event") {
        Decoded::Event(codec::decode_event(f.body, enc).unwrap())
    } else if message_type == "corev2.CheckRequest" {
        Decoded::CheckRequest(codec::decode_check_request(f.body, enc).unwrap())
    } else if message_type == "corev3.EntityConfig" {
        Decoded::EntityConfig(codec::decode_entity_config(f.body, enc).unwrap())
    } else {
        panic!("unknown message type {message_type}")
    };
    (f.kind.to_owned(), d)
}

fn list(v: &[String]) -> Value {
    json!(v)
}

fn meta(m: &Option<v2::ObjectMeta>) -> v2::ObjectMeta {
    m.clone().unwrap_or_default()
}

/// The value of a manifest key (`check.name`, `entity.name`, `namespace`,
/// `config.name`, `assets_len`, ...) in a decoded message; `None` when the key
/// does not name a decoded field.
pub fn field(d: &Decoded, key: &str) -> Option<Value> {
    Some(match d {
        Decoded::Event(e) => {
            let c = e.check.clone().unwrap_or_default();
            let en = e.entity.clone().unwrap_or_default();
            match key {
                "timestamp" => json!(e.timestamp),
                "sequence" => json!(e.sequence),
                "namespace" => json!(meta(&e.metadata).namespace),
                "check.command" => json!(c.command),
                "check.executed" => json!(c.executed),
                "check.interval" => json!(c.interval),
                "check.issued" => json!(c.issued),
                "check.name" => json!(meta(&c.metadata).name),
                "check.status" => json!(c.status),
                "check.subscriptions" => list(&c.subscriptions),
                "check.timeout" => json!(c.timeout),
                "check.ttl" => json!(c.ttl),
                "entity.entity_class" => json!(en.entity_class),
                "entity.name" => json!(meta(&en.metadata).name),
                "entity.namespace" => json!(meta(&en.metadata).namespace),
                "entity.sensu_agent_version" => json!(en.sensu_agent_version),
                "entity.subscriptions" => list(&en.subscriptions),
                "entity.system.hostname" => json!(en.system.unwrap_or_default().hostname),
                "entity.user" => json!(en.user),
                _ => return None,
            }
        }
        Decoded::CheckRequest(r) => {
            let c = r.config.clone().unwrap_or_default();
            match key {
                "assets_len" => json!(r.assets.len()),
                "hooks_len" => json!(r.hooks.len()),
                "issued" => json!(r.issued),
                "config.command" => json!(c.command),
                "config.interval" => json!(c.interval),
                "config.name" => json!(meta(&c.metadata).name),
                "config.namespace" => json!(meta(&c.metadata).namespace),
                "config.publish" => json!(c.publish),
                "config.subscriptions" => list(&c.subscriptions),
                _ => return None,
            }
        }
        Decoded::EntityConfig(c) => match key {
            "deregister" => json!(c.deregister),
            "entity_class" => json!(c.entity_class),
            "metadata.name" => json!(meta(&c.metadata).name),
            "metadata.namespace" => json!(meta(&c.metadata).namespace),
            "subscriptions" => list(&c.subscriptions),
            "user" => json!(c.user),
            _ => return None,
        },
    })
}

/// Normalizes an expected value: `null` for a repeated field means empty.
pub fn expected(v: &Value, actual: &Value) -> Value {
    if v.is_null() && actual.is_array() {
        json!([])
    } else {
        v.clone()
    }
}
