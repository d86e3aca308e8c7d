//! Consul's RPC in msgpack: net/rpc's header and the arguments of
//! `Health.ServiceNodes` written as Consul's own client writes them
//! (go-msgpack with `structs.MsgpackHandle`: structs as maps, keys in
//! sorted order, integers in their smallest form; byte for byte the request
//! captured from Consul's `agent/pool`), the length of one msgpack value
//! in a buffer (where a message ends on a yamux stream), and the response
//! reduced to what a watcher keeps.
//!
//! Encoding uses the tree's msgpack [`Writer`] (go-msgpack's forms: the
//! smallest integer, str16 past 31 bytes); decoding reads into borrowed
//! structs that name only the fields a watcher reads (every other field of
//! a ~1.3 KB `CheckServiceNode` is skipped, nothing is copied).

use std::borrow::Cow;

use agent_sim_proto::msgpack::Writer;
use serde::Deserialize;

use super::digest::{Digest, Item};
use crate::codec::{Health, instance_key};

/// The method a blocking watcher calls.
pub const SERVICE_NODES: &str = "Health.ServiceNodes";

/// What a `Health.ServiceNodes` call asks.
#[derive(Debug, Clone, Copy)]
pub struct ServiceNodesArgs<'a> {
    /// Datacenter (empty: the server's own, as Consul's client sends it).
    pub datacenter: &'a str,
    /// The service watched.
    pub service: &'a str,
    /// Answer once the result's index is past this (0: at once).
    pub min_index: u64,
    /// Longest the server holds the call (Consul adds up to 1/16).
    pub max_query_time_ns: u64,
    /// ACL token.
    pub token: &'a str,
}

/// net/rpc's request header and the `ServiceSpecificRequest`, as one yamux
/// data frame's payload.
pub fn encode_request(seq: u64, a: &ServiceNodesArgs<'_>, out: &mut Vec<u8>) {
    let mut w = Writer(out);
    w.map(2)
        .kv_uint("Seq", seq)
        .kv_str("ServiceMethod", SERVICE_NODES);
    // Every field of ServiceSpecificRequest (QueryOptions and the empty
    // EnterpriseMeta inlined), in go-msgpack's sorted order.
    w.map(27)
        .falses(&["AllowNotModifiedResponse", "AllowStale", "Connect"])
        .kv_str("Datacenter", a.datacenter)
        .kv_str("Filter", "")
        .kv_uint("HealthFilterType", 0)
        .falses(&["Ingress"])
        .kv_uint("MaxAge", 0)
        .kv_uint("MaxQueryTime", a.max_query_time_ns)
        .kv_uint("MaxStaleDuration", 0)
        .falses(&["MergeCentralConfig"])
        .kv_uint("MinQueryIndex", a.min_index)
        .falses(&["MustRevalidate"])
        .kv_nil("NodeMetaFilters")
        .kv_str("PeerName", "")
        .falses(&["RequireConsistent"])
        .empties(&["SamenessGroup", "ServiceAddress", "ServiceKind"])
        .kv_str("ServiceName", a.service)
        .kv_str("ServiceTag", "")
        .kv_nil("ServiceTags")
        .str("Source")
        .map(6)
        .kv_str("Datacenter", "")
        .kv_bool("DisableNode", false)
        .empties(&["Ip", "Node", "NodePartition", "Segment"])
        .kv_uint("StaleIfError", 0)
        .falses(&["TagFilter"])
        .kv_str("Token", a.token)
        .falses(&["UseCache"]);
}

pub use agent_sim_proto::msgpack::{MsgpackError, Scanner, value_len};

pub use crate::rpc::ResponseHeader;

#[derive(Deserialize)]
struct Indexed<'a> {
    #[serde(rename = "Index", default)]
    index: u64,
    #[serde(rename = "Nodes", borrow, default)]
    nodes: Option<Vec<Csn<'a>>>,
}

/// A `CheckServiceNode` as a watcher reads it (from msgpack or JSON).
#[derive(Deserialize)]
pub(crate) struct Csn<'a> {
    #[serde(rename = "Node", borrow)]
    node: Option<NodeRef<'a>>,
    #[serde(rename = "Service", borrow)]
    service: Option<ServiceRef<'a>>,
    #[serde(rename = "Checks", borrow, default)]
    checks: Option<Vec<CheckRef<'a>>>,
}

#[derive(Deserialize)]
struct NodeRef<'a> {
    #[serde(rename = "Node", borrow, default)]
    node: Cow<'a, str>,
    #[serde(rename = "ModifyIndex", default)]
    modify: u64,
}

#[derive(Deserialize)]
struct ServiceRef<'a> {
    #[serde(rename = "ID", borrow, default)]
    id: Cow<'a, str>,
    #[serde(rename = "ModifyIndex", default)]
    modify: u64,
}

#[derive(Deserialize)]
struct CheckRef<'a> {
    #[serde(rename = "Status", borrow, default)]
    status: Cow<'a, str>,
    #[serde(rename = "ModifyIndex", default)]
    modify: u64,
}

impl Csn<'_> {
    /// The instance as a view keeps it: its key, its worst check, and the
    /// last raft index that touched node, service or a check.
    pub(crate) fn item(&self) -> Item {
        let node = self.node.as_ref().map_or("", |n| n.node.as_ref());
        let id = self.service.as_ref().map_or("", |s| s.id.as_ref());
        let checks = self.checks.as_deref().unwrap_or(&[]);
        let health = checks
            .iter()
            .map(|c| Health::from_status(&c.status))
            .max()
            .unwrap_or_default();
        let modify = checks
            .iter()
            .map(|c| c.modify)
            .chain(self.node.as_ref().map(|n| n.modify))
            .chain(self.service.as_ref().map(|s| s.modify))
            .max()
            .unwrap_or(0);
        Item {
            key: instance_key(node, id),
            health,
            modify,
        }
    }
}

/// Decodes a response: its header and, when it carries no error, the
/// result as a [`Digest`].
pub fn decode_response(
    header: &[u8],
    body: &[u8],
) -> Result<(ResponseHeader, Option<Digest>), MsgpackError> {
    let h = crate::rpc::decode_header(header)?;
    if !h.error.is_empty() {
        return Ok((h, None));
    }
    Ok((h, Some(decode_body(body)?)))
}

/// Decodes an answer's body (`IndexedCheckServiceNodes`) as a [`Digest`].
pub fn decode_body(body: &[u8]) -> Result<Digest, MsgpackError> {
    let r: Indexed<'_> = agent_sim_proto::msgpack::decode_as("response body", body)?;
    let items = r.nodes.unwrap_or_default().iter().map(Csn::item).collect();
    Ok(Digest {
        index: r.index,
        items,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_lengths_of_every_shape() {
        let mut b = Vec::new();
        Writer(&mut b).map(2).str("a").array(3).uint(1).uint(70_000);
        // bin8 of 3 bytes (the Writer writes the old spec's raw, not bin).
        b.extend_from_slice(&[0xc4, 3, 1, 2, 3]);
        Writer(&mut b).str("b").f64(1.5);
        let n = b.len();
        b.extend_from_slice(&[0xc0, 0xc0]);
        assert_eq!(value_len(&b).unwrap(), Some(n));
        for cut in 0..n {
            assert_eq!(value_len(&b[..cut]).unwrap(), None, "cut at {cut}");
        }
        // Fed a byte at a time, the scanner finds the same end.
        let mut sc = Scanner::default();
        for cut in 0..n {
            assert_eq!(sc.scan(&b[..cut]).unwrap(), None, "resumed at {cut}");
        }
        assert_eq!(sc.scan(&b).unwrap(), Some(n));
        assert!(matches!(
            value_len(&[0xc1]),
            Err(MsgpackError::ReservedMarker { at: 0 })
        ));
        let deep = vec![0x91u8; agent_sim_proto::msgpack::MAX_DEPTH + 2];
        assert!(matches!(value_len(&deep), Err(MsgpackError::TooDeep)));
    }
}
