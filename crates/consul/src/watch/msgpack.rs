//! Consul's RPC in msgpack: net/rpc's header and the arguments of
//! `Health.ServiceNodes` written as Consul's own client writes them
//! (go-msgpack with `structs.MsgpackHandle`: structs as maps, keys in
//! sorted order, integers in their smallest form; byte for byte the request
//! captured from Consul's `agent/pool`), the length of one msgpack value
//! in a buffer (where a message ends on a yamux stream), and the response
//! reduced to what a watcher keeps.
//!
//! Encoding uses the `rmp` crate's writers (the msgpack spec's smallest
//! forms, which are go-msgpack's); decoding uses `rmp-serde` into borrowed
//! structs that name only the fields a watcher reads (every other field of
//! a ~1.3 KB `CheckServiceNode` is skipped, nothing is copied).

use std::borrow::Cow;

use rmp::encode::{write_bool, write_map_len, write_nil, write_str, write_uint};
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

fn w_str(out: &mut Vec<u8>, s: &str) {
    // Writing into a Vec cannot fail.
    let _ = write_str(out, s);
}

fn w_uint(out: &mut Vec<u8>, v: u64) {
    let _ = write_uint(out, v);
}

fn w_bool(out: &mut Vec<u8>, v: bool) {
    let _ = write_bool(out, v);
}

/// net/rpc's request header and the `ServiceSpecificRequest`, as one yamux
/// data frame's payload.
pub fn encode_request(seq: u64, a: &ServiceNodesArgs<'_>, out: &mut Vec<u8>) {
    let _ = write_map_len(out, 2);
    w_str(out, "Seq");
    w_uint(out, seq);
    w_str(out, "ServiceMethod");
    w_str(out, SERVICE_NODES);
    // Every field of ServiceSpecificRequest (QueryOptions and the empty
    // EnterpriseMeta inlined), in go-msgpack's sorted order.
    let _ = write_map_len(out, 27);
    let falses = |out: &mut Vec<u8>, keys: &[&str]| {
        for k in keys {
            w_str(out, k);
            w_bool(out, false);
        }
    };
    falses(out, &["AllowNotModifiedResponse", "AllowStale", "Connect"]);
    w_str(out, "Datacenter");
    w_str(out, a.datacenter);
    w_str(out, "Filter");
    w_str(out, "");
    w_str(out, "HealthFilterType");
    w_uint(out, 0);
    falses(out, &["Ingress"]);
    w_str(out, "MaxAge");
    w_uint(out, 0);
    w_str(out, "MaxQueryTime");
    w_uint(out, a.max_query_time_ns);
    w_str(out, "MaxStaleDuration");
    w_uint(out, 0);
    falses(out, &["MergeCentralConfig"]);
    w_str(out, "MinQueryIndex");
    w_uint(out, a.min_index);
    falses(out, &["MustRevalidate"]);
    w_str(out, "NodeMetaFilters");
    let _ = write_nil(out);
    w_str(out, "PeerName");
    w_str(out, "");
    falses(out, &["RequireConsistent"]);
    for k in ["SamenessGroup", "ServiceAddress", "ServiceKind"] {
        w_str(out, k);
        w_str(out, "");
    }
    w_str(out, "ServiceName");
    w_str(out, a.service);
    w_str(out, "ServiceTag");
    w_str(out, "");
    w_str(out, "ServiceTags");
    let _ = write_nil(out);
    w_str(out, "Source");
    let _ = write_map_len(out, 6);
    w_str(out, "Datacenter");
    w_str(out, "");
    w_str(out, "DisableNode");
    w_bool(out, false);
    for k in ["Ip", "Node", "NodePartition", "Segment"] {
        w_str(out, k);
        w_str(out, "");
    }
    w_str(out, "StaleIfError");
    w_uint(out, 0);
    falses(out, &["TagFilter"]);
    w_str(out, "Token");
    w_str(out, a.token);
    falses(out, &["UseCache"]);
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
    let r: Indexed<'_> =
        rmp_serde::from_slice(body).map_err(|e| MsgpackError::decode("response body", e))?;
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
        let _ = write_map_len(&mut b, 2);
        w_str(&mut b, "a");
        let _ = rmp::encode::write_array_len(&mut b, 3);
        w_uint(&mut b, 1);
        w_uint(&mut b, 70_000);
        let _ = rmp::encode::write_bin(&mut b, &[1, 2, 3]);
        w_str(&mut b, "b");
        let _ = rmp::encode::write_f64(&mut b, 1.5);
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
