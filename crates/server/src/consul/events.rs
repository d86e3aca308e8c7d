//! Pure encoding of `subscribe.Event` messages (no I/O, no state).
//!
//! Payloads (`ServiceHealthUpdate`, `ConfigEntryUpdate`) are encoded once per
//! change with prost and kept as [`Bytes`]; an `Event` around them is framed by
//! hand ([`event`], [`batch`]) so that a snapshot sent to 10,000 subscribers
//! re-encodes nothing but a few header bytes, and a live event is encoded once
//! and shared (refcounted) by every subscriber's stream.

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};

use agent_sim_proto::consul::subscribe::{
    CatalogOp, CheckServiceNode, ConfigEntry, ConfigEntryKind, ConfigEntryUpdate, HealthCheck,
    IntentionsEntry, Node, NodeService, RaftIndex, ServiceHealthUpdate, SourceIntention,
    config_entry, config_entry_update,
};

/// `Event.EndOfSnapshot` field number.
const TAG_END_OF_SNAPSHOT: u32 = 2;
/// `Event.NewSnapshotToFollow` field number.
const TAG_NEW_SNAPSHOT: u32 = 3;
/// `Event.EventBatch` field number.
const TAG_BATCH: u32 = 4;
/// `Event.ServiceHealth` field number.
pub(crate) const TAG_SERVICE_HEALTH: u32 = 10;
/// `Event.ConfigEntry` field number.
pub(crate) const TAG_CONFIG_ENTRY: u32 = 11;

/// One encoded `Event` payload: the oneof field number and the message bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Payload {
    pub tag: u32,
    pub bytes: Bytes,
}

impl Payload {
    pub(crate) fn service_health(update: &ServiceHealthUpdate) -> Self {
        Self {
            tag: TAG_SERVICE_HEALTH,
            bytes: update.encode_to_vec().into(),
        }
    }

    pub(crate) fn config_entry(update: &ConfigEntryUpdate) -> Self {
        Self {
            tag: TAG_CONFIG_ENTRY,
            bytes: update.encode_to_vec().into(),
        }
    }

    fn encoded_len(&self) -> usize {
        key_len(self.tag) + encoded_len_varint(self.bytes.len() as u64) + self.bytes.len()
    }

    fn encode(&self, buf: &mut BytesMut) {
        encode_key(self.tag, WireType::LengthDelimited, buf);
        encode_varint(self.bytes.len() as u64, buf);
        buf.put_slice(&self.bytes);
    }
}

fn index_len(index: u64) -> usize {
    if index == 0 {
        0
    } else {
        key_len(1) + encoded_len_varint(index)
    }
}

fn encode_index(index: u64, buf: &mut BytesMut) {
    // proto3: a zero scalar is omitted on the wire.
    if index != 0 {
        encode_key(1, WireType::Varint, buf);
        encode_varint(index, buf);
    }
}

/// `Event{Index, <payload>}`.
pub(crate) fn event(index: u64, payload: &Payload) -> Bytes {
    let mut buf = BytesMut::with_capacity(index_len(index) + payload.encoded_len());
    encode_index(index, &mut buf);
    payload.encode(&mut buf);
    buf.freeze()
}

/// `Event{Index, EventBatch{Events: [Event{Index, p} for p in payloads]}}`.
pub(crate) fn batch(index: u64, payloads: &[Payload]) -> Bytes {
    let inner_len = |p: &Payload| index_len(index) + p.encoded_len();
    let batch_len: usize = payloads
        .iter()
        .map(|p| {
            let n = inner_len(p);
            key_len(1) + encoded_len_varint(n as u64) + n
        })
        .sum();
    let mut buf = BytesMut::with_capacity(
        index_len(index) + key_len(TAG_BATCH) + encoded_len_varint(batch_len as u64) + batch_len,
    );
    encode_index(index, &mut buf);
    encode_key(TAG_BATCH, WireType::LengthDelimited, &mut buf);
    encode_varint(batch_len as u64, &mut buf);
    for p in payloads {
        encode_key(1, WireType::LengthDelimited, &mut buf);
        encode_varint(inner_len(p) as u64, &mut buf);
        encode_index(index, &mut buf);
        p.encode(&mut buf);
    }
    buf.freeze()
}

/// One event for a raft index: a single payload as is, several as a batch.
pub(crate) fn for_index(index: u64, payloads: &[Payload]) -> Bytes {
    match payloads {
        [one] => event(index, one),
        many => batch(index, many),
    }
}

fn flag(index: u64, tag: u32) -> Bytes {
    let mut buf = BytesMut::with_capacity(index_len(index) + 2);
    encode_index(index, &mut buf);
    encode_key(tag, WireType::Varint, &mut buf);
    encode_varint(1, &mut buf);
    buf.freeze()
}

/// `Event{Index, EndOfSnapshot: true}`.
pub(crate) fn end_of_snapshot(index: u64) -> Bytes {
    flag(index, TAG_END_OF_SNAPSHOT)
}

/// `Event{Index: 0, NewSnapshotToFollow: true}`.
pub(crate) fn new_snapshot_to_follow() -> Bytes {
    flag(0, TAG_NEW_SNAPSHOT)
}

/// What a catalog instance looks like to the payload builders.
pub(crate) struct InstanceView<'a> {
    pub datacenter: &'a str,
    pub node_id: &'a str,
    pub node: &'a str,
    pub node_address: &'a str,
    pub node_meta: &'a std::collections::BTreeMap<String, String>,
    pub node_index: (u64, u64),
    pub kind: &'a str,
    pub service_id: &'a str,
    pub service: &'a str,
    pub tags: &'a [String],
    pub service_address: &'a str,
    pub port: i32,
    pub service_index: (u64, u64),
}

/// A checks entry for [`register`]: (check id, name, status, service id, service name).
pub(crate) type CheckView<'a> = (&'a str, &'a str, &'a str, &'a str, &'a str);

fn raft(i: (u64, u64)) -> Option<RaftIndex> {
    Some(RaftIndex {
        create_index: i.0,
        modify_index: i.1,
    })
}

fn node_service(v: &InstanceView<'_>) -> NodeService {
    NodeService {
        kind: v.kind.to_owned(),
        id: v.service_id.to_owned(),
        service: v.service.to_owned(),
        tags: v.tags.to_vec(),
        address: v.service_address.to_owned(),
        port: v.port,
        raft_index: raft(v.service_index),
    }
}

/// `ServiceHealthUpdate{Op: Register}` with the full `CheckServiceNode`.
pub(crate) fn register<'a>(
    v: &InstanceView<'_>,
    checks: impl Iterator<Item = CheckView<'a>>,
) -> Payload {
    let node = Node {
        id: v.node_id.to_owned(),
        node: v.node.to_owned(),
        address: v.node_address.to_owned(),
        datacenter: v.datacenter.to_owned(),
        meta: v
            .node_meta
            .iter()
            .map(|(k, val)| (k.clone(), val.clone()))
            .collect(),
        raft_index: raft(v.node_index),
    };
    let checks = checks
        .map(|(id, name, status, sid, sname)| HealthCheck {
            node: v.node.to_owned(),
            check_id: id.to_owned(),
            name: name.to_owned(),
            status: status.to_owned(),
            service_id: sid.to_owned(),
            service_name: sname.to_owned(),
        })
        .collect();
    Payload::service_health(&ServiceHealthUpdate {
        op: CatalogOp::Register as i32,
        check_service_node: Some(CheckServiceNode {
            node: Some(node),
            service: Some(node_service(v)),
            checks,
        }),
    })
}

/// `ServiceHealthUpdate{Op: Deregister}`: node name and service fields only
/// (no node address, no checks), as the real server sends it.
pub(crate) fn deregister(v: &InstanceView<'_>) -> Payload {
    Payload::service_health(&ServiceHealthUpdate {
        op: CatalogOp::Deregister as i32,
        check_service_node: Some(CheckServiceNode {
            node: Some(Node {
                node: v.node.to_owned(),
                raft_index: Some(RaftIndex::default()),
                ..Node::default()
            }),
            service: Some(node_service(v)),
            checks: Vec::new(),
        }),
    })
}

/// `ConfigEntryUpdate` for a `service-intentions` entry; `sources` as
/// (name, allow) pairs. `None` sources means a delete.
pub(crate) fn intentions(
    name: &str,
    sources: Option<&[(String, bool, String)]>,
    index: (u64, u64),
) -> Payload {
    let (op, entry) = match sources {
        Some(sources) => (
            config_entry_update::UpdateOp::Upsert,
            Some(config_entry::Entry::ServiceIntentions(IntentionsEntry {
                sources: sources
                    .iter()
                    .map(|(n, allow, description)| SourceIntention {
                        name: n.clone(),
                        action: i32::from(*allow),
                        description: description.clone(),
                    })
                    .collect(),
                meta: Default::default(),
            })),
        ),
        None => (config_entry_update::UpdateOp::Delete, None),
    };
    Payload::config_entry(&ConfigEntryUpdate {
        op: op as i32,
        config_entry: Some(ConfigEntry {
            kind: ConfigEntryKind::KindServiceIntentions as i32,
            name: name.to_owned(),
            raft_index: raft(index),
            entry,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_sim_proto::consul::subscribe::{Event, event::Payload as P};

    fn vector(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/../../testdata/vectors/consul/subscribe/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(path).unwrap()
    }

    #[test]
    fn flags_match_the_captured_bytes() {
        assert_eq!(&new_snapshot_to_follow()[..], &[0x18, 0x01]);
        assert_eq!(
            &new_snapshot_to_follow()[..],
            &vector("006-resume-new-snapshot-to-follow.bin")[..]
        );
        assert_eq!(
            &end_of_snapshot(30)[..],
            &vector("002-end-of-snapshot.bin")[..]
        );
        assert_eq!(
            &end_of_snapshot(33)[..],
            &vector("009-end-of-snapshot.bin")[..]
        );
    }

    fn view<'a>(meta: &'a std::collections::BTreeMap<String, String>) -> InstanceView<'a> {
        InstanceView {
            datacenter: "dc1",
            node_id: "",
            node: "sim-node-2",
            node_address: "10.0.0.2",
            node_meta: meta,
            node_index: (28, 28),
            kind: "",
            service_id: "web-2",
            service: "web",
            tags: &[],
            service_address: "10.0.0.2",
            port: 8080,
            service_index: (30, 30),
        }
    }

    #[test]
    fn register_and_batch_decode_as_events() {
        let meta = Default::default();
        let v = view(&meta);
        let p = register(
            &v,
            [("web-2-ttl", "web ttl", "passing", "web-2", "web")].into_iter(),
        );
        let one = Event::decode(event(31, &p)).unwrap();
        assert_eq!(one.index, 31);
        let Some(P::ServiceHealth(sh)) = one.payload else {
            panic!("not service health")
        };
        let csn = sh.check_service_node.unwrap();
        assert_eq!(csn.node.unwrap().address, "10.0.0.2");
        assert_eq!(csn.checks[0].status, "passing");
        assert_eq!(csn.checks[0].node, "sim-node-2");

        let b = Event::decode(batch(40, &[p.clone(), deregister(&v)])).unwrap();
        assert_eq!(b.index, 40);
        let Some(P::EventBatch(batch)) = b.payload else {
            panic!("not a batch")
        };
        assert_eq!(batch.events.len(), 2);
        assert!(batch.events.iter().all(|e| e.index == 40));
        assert_eq!(for_index(40, std::slice::from_ref(&p)), event(40, &p));
    }

    #[test]
    fn deregister_matches_the_captured_shape() {
        // 003: web-2 Deregister at 31: node name only, service fields, no checks.
        let captured =
            Event::decode(&vector("003-service-health-deregister-web-2.bin")[..]).unwrap();
        let meta = Default::default();
        let ours = Event::decode(event(31, &deregister(&view(&meta)))).unwrap();
        assert_eq!(ours, captured);
    }

    #[test]
    fn intentions_upsert_and_delete() {
        let sources = vec![("web".to_owned(), true, String::new())];
        let e = Event::decode(event(5, &intentions("api", Some(&sources), (5, 5)))).unwrap();
        let Some(P::ConfigEntry(ce)) = e.payload else {
            panic!("not a config entry")
        };
        assert_eq!(ce.op, config_entry_update::UpdateOp::Upsert as i32);
        let entry = ce.config_entry.unwrap();
        assert_eq!(entry.name, "api");
        let Some(config_entry::Entry::ServiceIntentions(i)) = entry.entry else {
            panic!("no intentions")
        };
        assert_eq!(i.sources[0].action, 1);
        let d = Event::decode(event(6, &intentions("api", None, (5, 6)))).unwrap();
        let Some(P::ConfigEntry(ce)) = d.payload else {
            panic!("not a config entry")
        };
        assert_eq!(ce.op, config_entry_update::UpdateOp::Delete as i32);
    }
}
