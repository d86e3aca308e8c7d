//! Pure message helpers for `subscribe.StateChangeSubscription/Subscribe`:
//! building [`SubscribeRequest`]s, decoding an event ([`decode_event`]),
//! and the compact keys and health values the views store.
//!
//! Hostile input: a Subscribe message over [`MAX_EVENT_MESSAGE`] is refused
//! by the agent's HTTP/2 client (`crate::h2`) from its length prefix
//! (before any buffer is reserved), and the decoder names top-level `Event`
//! fields outside [`EVENT_FIELDS`] (payload oneofs this agent does not
//! know) in the warning `unknown_fields`.
//!
//! No I/O here: everything is tested on the captured bytes in
//! `testdata/vectors/consul/subscribe/`.

use agent_sim_metrics::Metrics;
use agent_sim_proto::consul::subscribe::{
    CheckServiceNode, Event, NamedSubject, SubscribeRequest, Topic, subscribe_request::Subject,
};

/// gRPC path of the Subscribe method.
pub const SUBSCRIBE_PATH: &str = "/subscribe.StateChangeSubscription/Subscribe";

/// Largest Subscribe message (one `Event`) an agent accepts: grpc-go's
/// default receive limit, which Consul's own client agents run with, so a
/// server sends nothing larger to a real agent. Events are ≈0.3–2 KiB (one
/// CheckServiceNode); an `EventBatch` of a 128-op txn stays far below.
/// The agent's HTTP/2 client checks it against the 5-byte length prefix
/// before it reserves a buffer, so a huge length costs nothing; an
/// over-limit message ends its call (`message_too_large`, the stream
/// reset) and the agent subscribes again on the same connection.
pub const MAX_EVENT_MESSAGE: usize = 4 * 1024 * 1024;

/// Top-level field numbers of `subscribe.Event` agent-sim decodes: Index 1
/// and the payloads EndOfSnapshot 2, NewSnapshotToFollow 3, EventBatch 4,
/// ServiceHealth 10 and ConfigEntry 11. Anything else (another payload
/// oneof a newer server streams) is skipped by prost and counted.
pub const EVENT_FIELDS: &[u32] = &[1, 2, 3, 4, 10, 11];

/// A `SubscribeRequest` for `topic` and a named subject.
pub fn subscribe_request(
    topic: Topic,
    key: &str,
    index: u64,
    token: &str,
    datacenter: &str,
) -> SubscribeRequest {
    SubscribeRequest {
        topic: topic as i32,
        key: String::new(),
        token: token.to_owned(),
        index,
        datacenter: datacenter.to_owned(),
        subject: Some(Subject::NamedSubject(NamedSubject {
            key: key.to_owned(),
            namespace: String::new(),
            partition: String::new(),
            peer_name: String::new(),
        })),
    }
}

/// One Subscribe message as an `Event`: its unknown top-level fields are
/// warned to `metrics` (`unknown_fields`: a scan of the event's top-level
/// fields, a few nanoseconds and no allocation), and bytes that are not an
/// `Event` fail with prost's words (`failed to decode Protobuf message`,
/// code `INTERNAL`: the session counts `decode_event`).
pub fn decode_event(msg: &[u8], metrics: Option<&Metrics>) -> Result<Event, tonic::Status> {
    if let Some(m) = metrics
        && let Some(words) = unknown_event_fields(msg)
    {
        m.warn("unknown_fields", Some(&words));
    }
    prost::Message::decode(msg)
        .map_err(|e: prost::DecodeError| tonic::Status::internal(e.to_string()))
}

/// The unknown top-level fields of an encoded `Event`, in words
/// (`Event field 12 (wire type 2)`, and how many when several).
pub fn unknown_event_fields(msg: &[u8]) -> Option<String> {
    let (n, wire, count) = agent_sim_proto::scan::unknown_fields(msg, EVENT_FIELDS)?;
    Some(if count > 1 {
        format!("Event field {n} (wire type {wire}), {count} unknown fields")
    } else {
        format!("Event field {n} (wire type {wire})")
    })
}

/// 64-bit key of an instance: FNV-1a over `node \0 service_id`. The view
/// stores this instead of the strings.
pub fn instance_key(node: &str, service_id: &str) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    for b in node
        .bytes()
        .chain(std::iter::once(0))
        .chain(service_id.bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(PRIME);
    }
    h
}

/// Key of the instance a `CheckServiceNode` describes.
pub fn csn_key(csn: &CheckServiceNode) -> u64 {
    let node = csn.node.as_ref().map(|n| n.node.as_str()).unwrap_or("");
    let id = csn.service.as_ref().map(|s| s.id.as_str()).unwrap_or("");
    instance_key(node, id)
}

/// Aggregated health of an instance: the worst of its checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
#[repr(u8)]
pub enum Health {
    /// All checks passing (or no checks).
    #[default]
    Passing = 0,
    /// At least one check warning.
    Warning = 1,
    /// At least one check critical (or an unknown status).
    Critical = 2,
}

impl Health {
    /// From a Consul check status string.
    pub fn from_status(s: &str) -> Health {
        match s {
            "passing" => Health::Passing,
            "warning" => Health::Warning,
            _ => Health::Critical,
        }
    }

    /// The worst status over all checks of `csn`.
    pub fn of(csn: &CheckServiceNode) -> Health {
        csn.checks
            .iter()
            .map(|c| Health::from_status(&c.status))
            .max()
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn request_for_web_matches_the_protocol_notes() {
        let r = subscribe_request(Topic::ServiceHealth, "web", 0, "", "");
        assert_eq!(
            r.encode_to_vec(),
            [0x08, 0x01, 0x52, 0x05, 0x0a, 0x03, b'w', b'e', b'b']
        );
        let r = subscribe_request(Topic::ServiceHealth, "web", 26, "", "");
        assert_eq!(
            r.encode_to_vec(),
            [
                0x08, 0x01, 0x20, 0x1a, 0x52, 0x05, 0x0a, 0x03, b'w', b'e', b'b'
            ]
        );
    }

    #[test]
    fn keys_separate_node_and_service() {
        assert_ne!(instance_key("ab", "c"), instance_key("a", "bc"));
        assert_eq!(instance_key("n", "s"), instance_key("n", "s"));
    }

    #[test]
    fn health_is_the_worst_check() {
        assert_eq!(Health::from_status("passing"), Health::Passing);
        assert_eq!(Health::from_status("warning"), Health::Warning);
        assert_eq!(Health::from_status("critical"), Health::Critical);
        assert_eq!(Health::from_status("maintenance"), Health::Critical);
    }
}
