//! `KVS.*` on the multiplexed RPC port, as a Consul 1.20 server answers
//! the calls a client agent forwards for consul-template or Vault:
//! `KVS.Get` and `KVS.List` (`KeyRequest` → `IndexedDirEntries`),
//! `KVS.ListKeys` (`KeyListRequest` → `IndexedKeyList`), each a blocking
//! query on `MinQueryIndex`/`MaxQueryTime`, `KVS.Apply` (`KVSRequest`
//! → a bool), and `Txn.Apply` / `Txn.Read` with KV ops (`TxnRequest` →
//! `TxnResponse`, what an agent forwards for `/v1/txn`). Requests are decoded by field name (any order, unknown
//! fields ignored, a `Value` as msgpack bin or str); answers are written
//! as a 1.20.1 server writes them (checked against one): keys sorted,
//! `Value` as a msgpack str, `Entries`/`Keys` nil when empty, the
//! `QueryMeta` beside the result.

use std::time::Duration;

use agent_sim_proto::msgpack::Writer;
use bytes::Bytes;
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use tokio_util::sync::CancellationToken;

use super::kv::Error;
use super::kv::{DirEntry, KvRequest, Query, Verb, txn, wait};
use crate::consul::ConsulState;
use crate::consul::acl::{Access, Authz, Denied, Resource, vet};
use crate::consul::fields::nullable;
use crate::consul::rpc_error::RpcError;
use crate::consul::timing::TxnTimer;

/// `KeyRequest` and `KeyListRequest` (the fields this server reads).
#[derive(Deserialize, Default)]
#[serde(default)]
struct KeyRequest {
    #[serde(rename = "Datacenter", deserialize_with = "nullable")]
    datacenter: String,
    #[serde(rename = "Key", deserialize_with = "nullable")]
    key: String,
    #[serde(rename = "Prefix", deserialize_with = "nullable")]
    prefix: String,
    /// Consul's spelling.
    #[serde(rename = "Seperator", deserialize_with = "nullable")]
    separator: String,
    #[serde(rename = "Token", deserialize_with = "nullable")]
    token: String,
    #[serde(rename = "MinQueryIndex", deserialize_with = "nullable")]
    min_query_index: u64,
    /// Nanoseconds (Go's `time.Duration`).
    #[serde(rename = "MaxQueryTime", deserialize_with = "nullable")]
    max_query_time: u64,
}

/// `KVSRequest`.
#[derive(Deserialize, Default)]
#[serde(default)]
struct KvsRequest {
    #[serde(rename = "Datacenter", deserialize_with = "nullable")]
    datacenter: String,
    #[serde(rename = "Op", deserialize_with = "nullable")]
    op: String,
    #[serde(rename = "DirEnt", deserialize_with = "nullable")]
    dir_ent: DirEnt,
    #[serde(rename = "Token", deserialize_with = "nullable")]
    token: String,
}

/// `DirEntry` as a request carries it.
#[derive(Deserialize, Default)]
#[serde(default)]
struct DirEnt {
    #[serde(rename = "Key", deserialize_with = "nullable")]
    key: String,
    #[serde(rename = "Flags", deserialize_with = "nullable")]
    flags: u64,
    #[serde(rename = "Value", deserialize_with = "bin_or_str")]
    value: Vec<u8>,
    #[serde(rename = "Session", deserialize_with = "nullable")]
    session: String,
    #[serde(rename = "ModifyIndex", deserialize_with = "nullable")]
    modify_index: u64,
}

/// `TxnRequest` / `TxnReadRequest` (the fields this server reads).
#[derive(Deserialize, Default)]
#[serde(default)]
struct TxnRequest {
    #[serde(rename = "Datacenter", deserialize_with = "nullable")]
    datacenter: String,
    #[serde(rename = "Ops", deserialize_with = "nullable")]
    ops: Vec<TxnOp>,
    #[serde(rename = "Token", deserialize_with = "nullable")]
    token: String,
}

/// `TxnOp`: a KV op is served; any other kind is named only.
#[derive(Deserialize, Default)]
#[serde(default)]
struct TxnOp {
    #[serde(rename = "KV")]
    kv: Option<TxnKvOp>,
}

/// `TxnKVOp`.
#[derive(Deserialize, Default)]
#[serde(default)]
struct TxnKvOp {
    #[serde(rename = "Verb", deserialize_with = "nullable")]
    verb: String,
    #[serde(rename = "DirEnt", deserialize_with = "nullable")]
    dir_ent: DirEnt,
}

impl DirEnt {
    fn request(self) -> KvRequest {
        KvRequest {
            key: self.key,
            flags: self.flags,
            value: Bytes::from(self.value),
            session: self.session,
            index: self.modify_index,
        }
    }
}

/// Go's `[]byte`: msgpack bin (or str, or nil).
fn bin_or_str<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Vec<u8>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("bytes")
        }
        fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
            Ok(v.to_vec())
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Vec<u8>, E> {
            Ok(v.as_bytes().to_vec())
        }
        fn visit_unit<E: de::Error>(self) -> Result<Vec<u8>, E> {
            Ok(Vec::new())
        }
        fn visit_none<E: de::Error>(self) -> Result<Vec<u8>, E> {
            Ok(Vec::new())
        }
        fn visit_some<D2: Deserializer<'de>>(self, d: D2) -> Result<Vec<u8>, D2::Error> {
            d.deserialize_any(V)
        }
        fn visit_seq<A: de::SeqAccess<'de>>(self, mut a: A) -> Result<Vec<u8>, A::Error> {
            let mut out = Vec::new();
            while let Some(b) = a.next_element::<u8>()? {
                out.push(b);
            }
            Ok(out)
        }
    }
    d.deserialize_any(V)
}

/// One `DirEntry` as a 1.20.1 server writes it: keys sorted (Consul's
/// codec is canonical), `[]byte` as the old spec's raw (str) type (seen on
/// a real server: `Value` arrives as str, not bin), nil when empty.
fn write_entry(w: &mut Writer<'_>, e: &DirEntry) {
    w.map(7);
    w.kv_uint("CreateIndex", e.create_index);
    w.kv_uint("Flags", e.flags);
    w.kv_str("Key", &e.key);
    w.kv_uint("LockIndex", e.lock_index);
    w.kv_uint("ModifyIndex", e.modify_index);
    w.kv_str("Session", &e.session);
    w.str("Value");
    if e.value.is_empty() {
        w.nil();
    } else {
        w.raw(&e.value);
    }
}

/// `IndexedDirEntries` or `IndexedKeyList`: `QueryMeta` and the result
/// under `name` (`Entries` or `Keys`, written by `result`), keys sorted.
fn indexed(index: u64, name: &str, result: impl FnOnce(&mut Writer<'_>)) -> Bytes {
    let mut buf = Vec::with_capacity(256);
    let mut w = Writer(&mut buf);
    w.map(8);
    w.kv_uint("Backend", 0);
    w.kv_str("ConsistencyLevel", "");
    // Sorted: "Entries" < "Index" < "Keys" < "KnownLeader".
    if name == "Entries" {
        w.str(name);
        result(&mut w);
        w.kv_uint("Index", index);
    } else {
        w.kv_uint("Index", index);
        w.str(name);
        result(&mut w);
    }
    w.kv_bool("KnownLeader", true);
    w.kv_uint("LastContact", 0);
    w.kv_bool("NotModified", false);
    w.kv_bool("ResultsFilteredByACLs", false);
    Bytes::from(buf)
}

fn encode_bool(v: bool) -> Bytes {
    Bytes::from_static(if v { &[0xc3] } else { &[0xc2] })
}

fn decode<T: for<'de> Deserialize<'de>>(args: &[u8]) -> Result<T, RpcError> {
    Ok(agent_sim_proto::msgpack::decode(args)?)
}

/// The token and datacenter checks every call makes first: what the
/// token may do.
fn admitted(state: &ConsulState, token: &str, dc: &str) -> Result<Authz, RpcError> {
    let authz = state.acl(token)?;
    if !dc.is_empty() && dc != state.store().datacenter {
        return Err(RpcError::NoPathToDatacenter);
    }
    Ok(authz)
}

/// Answers a `KVS.*` call; `None` for a method this server lacks.
pub(crate) async fn answer(
    state: &ConsulState,
    method: &str,
    args: &[u8],
    shutdown: &CancellationToken,
) -> Option<Result<Bytes, RpcError>> {
    Some(match method {
        "KVS.Get" | "KVS.List" | "KVS.ListKeys" => read(state, method, args, shutdown).await,
        "KVS.Apply" => apply(state, args),
        "Txn.Apply" | "Txn.Read" => txn(state, method, args),
        _ => return None,
    })
}

async fn read(
    state: &ConsulState,
    method: &str,
    args: &[u8],
    shutdown: &CancellationToken,
) -> Result<Bytes, RpcError> {
    let req: KeyRequest = decode(args)?;
    let authz = admitted(state, &req.token, &req.datacenter)?;
    let wait_for = Duration::from_nanos(req.max_query_time);
    let q = match method {
        "KVS.Get" => Query::Key(&req.key),
        "KVS.List" => Query::Prefix(&req.key),
        _ => Query::Prefix(&req.prefix),
    };
    wait(state, q, req.min_query_index, wait_for, Some(shutdown)).await;
    state.kv_read();
    let fault = state.kv_read_fault(match q {
        Query::Key(k) | Query::Prefix(k) => k,
    });
    // Reads need key:read: a key's is checked, a listing drops the rest.
    let readable = |k: &str| authz.allows(Resource::Key, Access::Read, k);
    if method == "KVS.Get" {
        authz.check(Resource::Key, Access::Read, &req.key)?;
    }
    let store = state.store();
    let kv = &store.kv;
    match method {
        "KVS.Get" => {
            let (index, e) = kv.get_index(&req.key);
            let e = e.map(|e| fault.entry(e).unwrap_or_else(|| e.clone()));
            let index = fault.index(index);
            Ok(indexed(index, "Entries", |w| match &e {
                Some(e) => write_entry(w.array(1), e),
                None => {
                    w.nil();
                }
            }))
        }
        "KVS.List" => {
            let index = fault.index(kv.list_index(&req.key));
            let mut entries: Vec<&DirEntry> =
                kv.range(&req.key).filter(|e| readable(&e.key)).collect();
            let huge = entries.first().and_then(|e| fault.entry(e));
            if let Some(h) = &huge {
                entries[0] = h;
            }
            Ok(indexed(index, "Entries", |w| {
                if entries.is_empty() {
                    w.nil();
                } else {
                    w.array(entries.len() as u32);
                    for e in entries {
                        write_entry(w, e);
                    }
                }
            }))
        }
        _ => {
            let index = fault.index(kv.list_index(&req.prefix));
            let mut keys = kv.list_keys(&req.prefix, &req.separator);
            keys.retain(|k| readable(k));
            Ok(indexed(index, "Keys", |w| {
                if keys.is_empty() {
                    w.nil();
                } else {
                    w.array(keys.len() as u32);
                    for k in &keys {
                        w.str(k);
                    }
                }
            }))
        }
    }
}

/// `KVS.Apply`: the op's bool (`false` for a set or delete, whose FSM
/// answer is no bool), or its error in Consul's words.
fn apply(state: &ConsulState, args: &[u8]) -> Result<Bytes, RpcError> {
    let req: KvsRequest = decode(args)?;
    let authz = admitted(state, &req.token, &req.datacenter)?;
    let Some(verb) = Verb::parse(&req.op) else {
        return Err(Error::UnknownOp(req.op).into());
    };
    if req.dir_ent.key.is_empty() && verb != Verb::DeleteTree {
        return Err(Error::NoKey.into());
    }
    vet::kv_op(&authz, &req.op, &req.dir_ent.key)?;
    if !verb.is_write() {
        return Err(RpcError::NotAWrite(req.op));
    }
    let r = req.dir_ent.request();
    let ok = state.kv_apply(verb, &r).map_err(RpcError::RaftApply)?;
    // The FSM answers a bool only for the ops that may lose; a set or a
    // delete leaves the reply `false`.
    let answers = matches!(
        verb,
        Verb::Cas | Verb::Lock | Verb::Unlock | Verb::DeleteCas
    );
    Ok(encode_bool(answers && ok))
}

/// `Txn.Apply` (a raft write, whatever its ops) and `Txn.Read` (reads
/// only): `TxnResponse` (`Results`, `Errors`), the read's with its
/// `QueryMeta`. Only KV ops are served; another kind is that op's error.
fn txn(state: &ConsulState, method: &str, args: &[u8]) -> Result<Bytes, RpcError> {
    let req: TxnRequest = decode(args)?;
    let authz = admitted(state, &req.token, &req.datacenter)?;
    let read = method == "Txn.Read";
    // Ops the token may not do: the answer's errors, nothing applied.
    let denied: Vec<(usize, Denied)> = req
        .ops
        .iter()
        .enumerate()
        .filter_map(|(i, op)| {
            let kv = op.kv.as_ref()?;
            vet::txn_kv_op(&authz, &kv.verb, &kv.dir_ent.key)
                .err()
                .map(|d| (i, d))
        })
        .collect();
    if !denied.is_empty() {
        return Ok(txn_response::<Denied>(read, &Err(denied)));
    }
    let mut ops = Vec::with_capacity(req.ops.len());
    let mut errors = Vec::new();
    for (i, op) in req.ops.into_iter().enumerate() {
        let Some(kv) = op.kv else {
            errors.push((i, Error::NotKv));
            continue;
        };
        let r = kv.dir_ent.request();
        match txn::check(&kv.verb, &r) {
            Ok(verb) if read && verb.is_write() => {
                errors.push((i, Error::ReadOnly(kv.verb)));
            }
            Ok(verb) => ops.push((i, verb, r)),
            Err(what) => errors.push((i, what)),
        }
    }
    let writes = !read;
    let _timer = TxnTimer::start(state, writes);
    let mut store = state.store();
    let now = tokio::time::Instant::now();
    if errors.is_empty() {
        errors = ops
            .iter()
            .filter_map(|(i, verb, r)| txn::delayed(&store.kv, *verb, r, now).map(|w| (*i, w)))
            .collect();
    }
    let outcome = if errors.is_empty() {
        let idx = if read {
            store.raft_index
        } else {
            store.next_index()
        };
        let sessions = state.sessions();
        let kv_ops = ops.iter().map(|(i, verb, r)| (*i, *verb, r));
        let applied = txn::apply_all(state, &mut store.kv, &sessions, idx, kv_ops);
        drop(sessions);
        applied
    } else {
        Err(errors)
    };
    drop(store);
    if outcome.is_ok() {
        let c = &state.inner.counters;
        c.bump(&c.kv_txns);
    }
    Ok(txn_response(read, &outcome))
}

/// A txn's results, or its ops' errors (each op's index and error).
type TxnOutcome<E> = Result<Vec<(usize, DirEntry)>, Vec<(usize, E)>>;

/// `TxnResponse` (and `TxnReadResponse`, its `QueryMeta` beside it),
/// keys sorted.
fn txn_response<E: std::fmt::Display>(read: bool, outcome: &TxnOutcome<E>) -> Bytes {
    let mut buf = Vec::with_capacity(256);
    let mut w = Writer(&mut buf);
    w.map(if read { 9 } else { 2 });
    if read {
        w.kv_uint("Backend", 0);
        w.kv_str("ConsistencyLevel", "");
    }
    w.str("Errors");
    match outcome {
        Err(errors) => {
            w.array(errors.len() as u32);
            for (i, what) in errors {
                let what = what.to_string();
                w.map(2).kv_uint("OpIndex", *i as u64).kv_str("What", &what);
            }
        }
        Ok(_) => {
            w.nil();
        }
    }
    if read {
        w.kv_uint("Index", 1);
        w.kv_bool("KnownLeader", true);
        w.kv_uint("LastContact", 0);
        w.kv_bool("NotModified", false);
    }
    w.str("Results");
    match outcome {
        Ok(results) => {
            w.array(results.len() as u32);
            // Every kind's field is written, the others nil (as a real
            // server writes a `TxnResult`).
            for (_, e) in results {
                w.map(4).str("Check").nil().str("KV");
                write_entry(&mut w, e);
                w.str("Node").nil().str("Service").nil();
            }
        }
        Err(_) => {
            w.nil();
        }
    }
    if read {
        w.kv_bool("ResultsFilteredByACLs", false);
    }
    Bytes::from(buf)
}
