//! `KVS.List` on the agent's RPC connection: what a Consul 1.20.1 client
//! agent sends its server when a local client (consul-template, `curl
//! /v1/kv/PREFIX?recurse&index=&wait=`) reads a prefix, byte for byte the
//! requests captured from one (`testdata/vectors/consul/agent-rpc/041`–
//! `052`): net/rpc's header, then `structs.KeyRequest` with its
//! `QueryOptions` and the empty `EnterpriseMeta` flattened, fields sorted
//! (14 of them: a fixmap). `MaxQueryTime` is the `wait` as given (the agent
//! adds nothing) and `Key` the prefix as given. The answer is
//! `IndexedDirEntries`: `Entries` (nil when the prefix holds no key) and
//! `Index`; only each entry's `Key`, `ModifyIndex` and (for the probe key)
//! `Value` are read. A call the server answered with an error closes the
//! stream, as the agent's pool does after a failed call.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use agent_sim_proto::msgpack::Writer;
use serde::Deserialize;

use super::{DigestBuilder, KvDigest, probe_value};
use crate::rpc::mux::{CallError, exchange};
use crate::rpc::request_header;

/// The method a KV watcher calls.
pub const KVS_LIST: &str = "KVS.List";

/// What one `KVS.List` call asks.
#[derive(Debug, Clone, Copy)]
pub struct ListArgs<'a> {
    /// Datacenter (a client agent sends its own: `dc1`).
    pub datacenter: &'a str,
    /// The prefix read.
    pub key: &'a str,
    /// Answer once the result's index is past this (0: at once).
    pub min_index: u64,
    /// Longest the server holds the call, in ns (0: its default).
    pub max_query_time_ns: u64,
    /// Reads from any server (`?stale`).
    pub allow_stale: bool,
    /// ACL token.
    pub token: &'a str,
}

/// net/rpc's request header and the `KeyRequest`, as one yamux data
/// frame's payload.
pub fn encode_list(seq: u64, a: &ListArgs<'_>, out: &mut Vec<u8>) {
    request_header(out, seq, KVS_LIST);
    Writer(out)
        .map(14)
        .kv_bool("AllowNotModifiedResponse", false)
        .kv_bool("AllowStale", a.allow_stale)
        .kv_str("Datacenter", a.datacenter)
        .kv_str("Filter", "")
        .kv_str("Key", a.key)
        .kv_uint("MaxAge", 0)
        .kv_uint("MaxQueryTime", a.max_query_time_ns)
        .kv_uint("MaxStaleDuration", 0)
        .kv_uint("MinQueryIndex", a.min_index)
        .kv_bool("MustRevalidate", false)
        .kv_bool("RequireConsistent", false)
        .kv_uint("StaleIfError", 0)
        .kv_str("Token", a.token)
        .kv_bool("UseCache", false);
}

#[derive(Deserialize)]
struct Entry<'a> {
    #[serde(rename = "Key", borrow)]
    key: std::borrow::Cow<'a, str>,
    #[serde(rename = "ModifyIndex", default)]
    modify: u64,
    #[serde(rename = "Value", default, borrow)]
    value: Option<&'a [u8]>,
}

#[derive(Deserialize)]
struct Indexed<'a> {
    #[serde(rename = "Entries", default, borrow)]
    entries: Option<Vec<Entry<'a>>>,
    #[serde(rename = "Index", default)]
    index: u64,
}

/// Decodes an `IndexedDirEntries` body; `probe_key`'s value is read.
pub fn decode_list(body: &[u8], probe_key: Option<&str>) -> Result<KvDigest, CallError> {
    let r: Indexed<'_> = agent_sim_proto::msgpack::decode(body)
        .map_err(|e| CallError::new("decode_answer", format!("KVS.List answer: {e}")))?;
    let mut d = DigestBuilder::new(r.index, probe_key);
    for e in r.entries.iter().flatten() {
        d.entry(&e.key, e.modify, || e.value.and_then(probe_value));
    }
    Ok(d.finish())
}

/// What one read brought back.
#[derive(Debug)]
pub struct KvAnswer {
    /// The result, or the error the server answered with (its words).
    pub result: Result<KvDigest, CallError>,
    /// The answer's size (RPC: header and body; HTTP: the body as sent).
    pub bytes: usize,
}

/// A read's future: the stream (or HTTP connection) comes back for the
/// next read unless the read broke it or the server answered an error.
pub type ReadFuture<S> =
    Pin<Box<dyn Future<Output = (Option<S>, Result<KvAnswer, CallError>)> + Send>>;

/// One `KVS.List` call on `stream` (sequence `seq`), its answer read up to
/// `max` bytes.
pub fn call(
    stream: yamux::Stream,
    seq: u64,
    args: ListArgs<'_>,
    probe_key: Option<std::sync::Arc<str>>,
    max: usize,
) -> ReadFuture<yamux::Stream> {
    let mut req = Vec::with_capacity(256);
    encode_list(seq, &args, &mut req);
    let call = exchange(stream, seq, req, max);
    let deadline = super::read_deadline(Duration::from_nanos(args.max_query_time_ns));
    Box::pin(super::bounded(deadline, async move {
        let (stream, reply) = call.await;
        let reply = match reply {
            Ok(r) => r,
            Err(e) => return (None, Err(e)),
        };
        let bytes = reply.bytes;
        if !reply.header.error.is_empty() {
            let kind = crate::http::cause_kind(&reply.header.error).unwrap_or("rpc_error");
            let result = Err(CallError::new(kind, reply.header.error));
            // The agent's pool closes a stream whose call failed.
            return (None, Ok(KvAnswer { result, bytes }));
        }
        match decode_list(&reply.body, probe_key.as_deref()) {
            Ok(d) => (
                stream,
                Ok(KvAnswer {
                    result: Ok(d),
                    bytes,
                }),
            ),
            Err(e) => (None, Err(e)),
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nil_entries_answer_is_an_empty_result_at_its_index() {
        let mut b = Vec::new();
        Writer(&mut b).map(2).kv_nil("Entries").kv_uint("Index", 1);
        let d = decode_list(&b, Some("p/probe/kv")).unwrap();
        assert_eq!((d.index, d.keys, d.probe), (1, 0, None));
    }

    #[test]
    fn garbage_is_a_decode_error_not_a_panic() {
        let e = decode_list(&[0xc1, 0x00], None).unwrap_err();
        assert_eq!(e.kind, "decode_answer");
        let e = decode_list(&[0x91, 0x01], None).unwrap_err();
        assert_eq!(e.kind, "decode_answer");
    }
}
