//! `KVS.*` on the multiplexed RPC port, as a Consul 1.20 server answers
//! the calls a client agent forwards for consul-template or Vault:
//! `KVS.Get` and `KVS.List` (`KeyRequest` → `IndexedDirEntries`),
//! `KVS.ListKeys` (`KeyListRequest` → `IndexedKeyList`), each a blocking
//! query on `MinQueryIndex`/`MaxQueryTime`, and `KVS.Apply` (`KVSRequest`
//! → a bool). Requests are decoded by field name (any order, unknown
//! fields ignored, a `Value` as msgpack bin or str); answers are written
//! as a 1.20.1 server writes them (checked against one): keys sorted,
//! `Value` as a msgpack str, `Entries`/`Keys` nil when empty, the
//! `QueryMeta` beside the result.

use std::time::Duration;

use bytes::Bytes;
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use tokio_util::sync::CancellationToken;

use super::{DirEntry, KvRequest, Query, Verb, wait};
use crate::consul::ConsulState;
use crate::consul::writes::nullable;

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

/// The msgpack a 1.20.1 server writes, by hand: maps with their keys in
/// sorted order (Consul's codec is canonical) and `[]byte` as a str
/// (seen on a real server: `Value` arrives as str, not bin).
#[derive(Default)]
struct Pack(Vec<u8>);

impl Pack {
    fn map(&mut self, n: u8) -> &mut Self {
        // Every map here has fewer than 16 keys: a fixmap.
        self.0.push(0x80 | n);
        self
    }

    fn array(&mut self, n: usize) -> &mut Self {
        match n {
            0..=15 => self.0.push(0x90 | n as u8),
            16..=0xffff => {
                self.0.push(0xdc);
                self.0.extend_from_slice(&(n as u16).to_be_bytes());
            }
            _ => {
                self.0.push(0xdd);
                self.0.extend_from_slice(&(n as u32).to_be_bytes());
            }
        }
        self
    }

    fn str(&mut self, b: &[u8]) -> &mut Self {
        let n = b.len();
        match n {
            0..=31 => self.0.push(0xa0 | n as u8),
            32..=0xff => self.0.extend_from_slice(&[0xd9, n as u8]),
            0x100..=0xffff => {
                self.0.push(0xda);
                self.0.extend_from_slice(&(n as u16).to_be_bytes());
            }
            _ => {
                self.0.push(0xdb);
                self.0.extend_from_slice(&(n as u32).to_be_bytes());
            }
        }
        self.0.extend_from_slice(b);
        self
    }

    fn uint(&mut self, v: u64) -> &mut Self {
        match v {
            0..=0x7f => self.0.push(v as u8),
            0x80..=0xff => self.0.extend_from_slice(&[0xcc, v as u8]),
            0x100..=0xffff => {
                self.0.push(0xcd);
                self.0.extend_from_slice(&(v as u16).to_be_bytes());
            }
            0x1_0000..=0xffff_ffff => {
                self.0.push(0xce);
                self.0.extend_from_slice(&(v as u32).to_be_bytes());
            }
            _ => {
                self.0.push(0xcf);
                self.0.extend_from_slice(&v.to_be_bytes());
            }
        }
        self
    }

    fn bool(&mut self, v: bool) -> &mut Self {
        self.0.push(if v { 0xc3 } else { 0xc2 });
        self
    }

    fn nil(&mut self) -> &mut Self {
        self.0.push(0xc0);
        self
    }

    fn key(&mut self, k: &str) -> &mut Self {
        self.str(k.as_bytes())
    }

    /// One `DirEntry` (`Value` nil when empty, as Go's nil slice).
    fn entry(&mut self, e: &DirEntry) -> &mut Self {
        self.map(7);
        self.key("CreateIndex").uint(e.create_index);
        self.key("Flags").uint(e.flags);
        self.key("Key").str(e.key.as_bytes());
        self.key("LockIndex").uint(e.lock_index);
        self.key("ModifyIndex").uint(e.modify_index);
        self.key("Session").str(e.session.as_bytes());
        self.key("Value");
        if e.value.is_empty() {
            self.nil()
        } else {
            self.str(&e.value)
        }
    }

    /// `IndexedDirEntries` or `IndexedKeyList`: `QueryMeta` and the result
    /// under `name`, written by `result`, in sorted key order.
    fn indexed(index: u64, name: &str, result: impl FnOnce(&mut Pack)) -> Bytes {
        let mut p = Pack::default();
        p.map(8);
        p.key("Backend").uint(0);
        p.key("ConsistencyLevel").str(b"");
        // Sorted: "Entries" < "Index" < "Keys" < "KnownLeader".
        if name == "Entries" {
            p.key(name);
            result(&mut p);
            p.key("Index").uint(index);
        } else {
            p.key("Index").uint(index);
            p.key(name);
            result(&mut p);
        }
        p.key("KnownLeader").bool(true);
        p.key("LastContact").uint(0);
        p.key("NotModified").bool(false);
        p.key("ResultsFilteredByACLs").bool(false);
        Bytes::from(p.0)
    }
}

fn encode_bool(v: bool) -> Bytes {
    Bytes::from_static(if v { &[0xc3] } else { &[0xc2] })
}

fn decode<T: for<'de> Deserialize<'de>>(args: &[u8]) -> Result<T, String> {
    rmp_serde::from_slice(args).map_err(|e| format!("rpc: decoding the request: {e}"))
}

/// The token and datacenter checks every call makes first.
fn admitted(state: &ConsulState, token: &str, dc: &str) -> Result<(), String> {
    if state.acl_check(token) == Err(Some(())) {
        return Err("ACL not found".into());
    }
    if !dc.is_empty() && dc != state.store().datacenter {
        return Err("No path to datacenter".into());
    }
    Ok(())
}

/// Answers a `KVS.*` call; `None` for a method this server lacks.
pub(crate) async fn answer(
    state: &ConsulState,
    method: &str,
    args: &[u8],
    shutdown: &CancellationToken,
) -> Option<Result<Bytes, String>> {
    Some(match method {
        "KVS.Get" | "KVS.List" | "KVS.ListKeys" => read(state, method, args, shutdown).await,
        "KVS.Apply" => apply(state, args),
        _ => return None,
    })
}

async fn read(
    state: &ConsulState,
    method: &str,
    args: &[u8],
    shutdown: &CancellationToken,
) -> Result<Bytes, String> {
    let req: KeyRequest = decode(args)?;
    admitted(state, &req.token, &req.datacenter)?;
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
    let store = state.store();
    let kv = &store.kv;
    match method {
        "KVS.Get" => {
            let (index, e) = kv.get_index(&req.key);
            let e = e.map(|e| fault.entry(e).unwrap_or_else(|| e.clone()));
            let index = fault.index(index);
            Ok(Pack::indexed(index, "Entries", |p| match &e {
                Some(e) => {
                    p.array(1).entry(e);
                }
                None => {
                    p.nil();
                }
            }))
        }
        "KVS.List" => {
            let index = fault.index(kv.list_index(&req.key));
            let mut entries: Vec<&DirEntry> = kv.range(&req.key).collect();
            let huge = entries.first().and_then(|e| fault.entry(e));
            if let Some(h) = &huge {
                entries[0] = h;
            }
            Ok(Pack::indexed(index, "Entries", |p| {
                if entries.is_empty() {
                    p.nil();
                } else {
                    p.array(entries.len());
                    for e in entries {
                        p.entry(e);
                    }
                }
            }))
        }
        _ => {
            let index = fault.index(kv.list_index(&req.prefix));
            let keys = kv.list_keys(&req.prefix, &req.separator);
            Ok(Pack::indexed(index, "Keys", |p| {
                if keys.is_empty() {
                    p.nil();
                } else {
                    p.array(keys.len());
                    for k in &keys {
                        p.str(k.as_bytes());
                    }
                }
            }))
        }
    }
}

/// `KVS.Apply`: the op's bool (`false` for a set or delete, whose FSM
/// answer is no bool), or its error in Consul's words.
fn apply(state: &ConsulState, args: &[u8]) -> Result<Bytes, String> {
    let req: KvsRequest = decode(args)?;
    admitted(state, &req.token, &req.datacenter)?;
    if state.acl_check(&req.token).is_err() {
        return Err(format!(
            "Permission denied: anonymous token lacks permission 'key:write' on {:?}. The \
             anonymous token is used implicitly when a request does not specify a token.",
            req.dir_ent.key
        ));
    }
    let Some(verb) = Verb::parse(&req.op) else {
        return Err(format!("unknown KV operation: {}", req.op));
    };
    if req.dir_ent.key.is_empty() && verb != Verb::DeleteTree {
        return Err("Must provide key".into());
    }
    if !verb.is_write() {
        return Err(format!(
            "raft apply failed: Invalid KVS operation '{}'",
            req.op
        ));
    }
    let d = req.dir_ent;
    let r = KvRequest {
        key: d.key,
        flags: d.flags,
        value: Bytes::from(d.value),
        session: d.session,
        index: d.modify_index,
    };
    let ok = state
        .kv_apply(verb, &r)
        .map_err(|e| format!("raft apply failed: {e}"))?;
    // The FSM answers a bool only for the ops that may lose; a set or a
    // delete leaves the reply `false`.
    let answers = matches!(
        verb,
        Verb::Cas | Verb::Lock | Verb::Unlock | Verb::DeleteCas
    );
    Ok(encode_bool(answers && ok))
}
