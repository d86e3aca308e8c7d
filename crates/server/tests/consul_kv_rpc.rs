//! `KVS.*` on the embedded target's multiplexed RPC port (`0x04`, yamux,
//! msgpack net/rpc), as a client agent forwards them: `KVS.Apply`,
//! `KVS.Get`, `KVS.List` (blocking on `MinQueryIndex`), `KVS.ListKeys`,
//! field names from Consul's `agent/structs`. Bounded, on `127.0.0.1:0`.
#![cfg(feature = "consul")]

use std::net::SocketAddr;

use agent_sim_server::consul::ConsulTargetConfig;
use agent_sim_testkit::bounded::until;
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

use crate::common;

use crate::common::{BOUND, start};

/// One call on its own connection: the error words and the body.
async fn call<A: Serialize>(addr: SocketAddr, method: &str, args: &A) -> (String, Vec<u8>) {
    common::rpc_call(addr, method, args).await
}

/// Go's `[]byte` as a 1.20.1 server writes it: a msgpack str (bin
/// taken too).
#[derive(Debug, Default, PartialEq)]
struct Bin(Vec<u8>);

impl<'de> Deserialize<'de> for Bin {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Bin;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("bin")
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Bin, E> {
                Ok(Bin(v.to_vec()))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Bin, E> {
                Ok(Bin(v.as_bytes().to_vec()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Bin, E> {
                Ok(Bin(Vec::new()))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Deserialize)]
struct Entry {
    #[serde(rename = "Key")]
    key: String,
    #[serde(rename = "Value")]
    value: Bin,
    #[serde(rename = "Flags")]
    flags: u64,
    #[serde(rename = "Session")]
    session: String,
    #[serde(rename = "LockIndex")]
    lock_index: u64,
    #[serde(rename = "ModifyIndex")]
    modify_index: u64,
}

#[derive(Debug, Deserialize)]
struct Entries {
    #[serde(rename = "Entries")]
    entries: Option<Vec<Entry>>,
    #[serde(rename = "Index")]
    index: u64,
    #[serde(rename = "KnownLeader")]
    known_leader: bool,
}

#[derive(Debug, Deserialize)]
struct Keys {
    #[serde(rename = "Keys")]
    keys: Option<Vec<String>>,
    #[serde(rename = "Index")]
    index: u64,
}

/// A `KVSRequest` as a client agent forwards one (a Go agent's field
/// order, `Value` as a str).
#[derive(Serialize)]
struct Apply<'a> {
    #[serde(rename = "Datacenter")]
    datacenter: &'a str,
    #[serde(rename = "Op")]
    op: &'a str,
    #[serde(rename = "DirEnt")]
    dir_ent: DirEnt<'a>,
    #[serde(rename = "Token")]
    token: &'a str,
}

#[derive(Serialize)]
struct DirEnt<'a> {
    #[serde(rename = "LockIndex")]
    lock_index: u64,
    #[serde(rename = "Key")]
    key: &'a str,
    #[serde(rename = "Flags")]
    flags: u64,
    #[serde(rename = "Value", with = "serde_bin")]
    value: &'a [u8],
    #[serde(rename = "Session")]
    session: &'a str,
    #[serde(rename = "CreateIndex")]
    create_index: u64,
    #[serde(rename = "ModifyIndex")]
    modify_index: u64,
}

/// As a Go agent writes `[]byte`: a str (bin when not UTF-8).
mod serde_bin {
    pub fn serialize<S: serde::Serializer>(v: &&[u8], s: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(v) {
            Ok(text) => s.serialize_str(text),
            Err(_) => s.serialize_bytes(v),
        }
    }
}

fn apply<'a>(op: &'a str, key: &'a str, value: &'a [u8], session: &'a str, cas: u64) -> Apply<'a> {
    Apply {
        datacenter: "dc1",
        op,
        dir_ent: DirEnt {
            lock_index: 0,
            key,
            flags: 7,
            value,
            session,
            create_index: 0,
            modify_index: cas,
        },
        token: "",
    }
}

/// A `KeyRequest` with its `QueryOptions` (fields in another order than
/// Go writes them: decoding goes by name).
#[derive(Serialize)]
struct KeyRequest<'a> {
    #[serde(rename = "MaxQueryTime")]
    max_query_time: u64,
    #[serde(rename = "MinQueryIndex")]
    min_query_index: u64,
    #[serde(rename = "Key")]
    key: &'a str,
    #[serde(rename = "Datacenter")]
    datacenter: &'a str,
    #[serde(rename = "AllowStale")]
    allow_stale: bool,
}

fn key_request(key: &str, min: u64) -> KeyRequest<'_> {
    KeyRequest {
        max_query_time: 5_000_000_000,
        min_query_index: min,
        key,
        datacenter: "dc1",
        allow_stale: true,
    }
}

#[tokio::test]
async fn kvs_apply_and_reads_answer_in_consuls_shapes() {
    let t = start(ConsulTargetConfig::default()).await;
    tokio::time::timeout(BOUND, async {
        let (err, body) = call(t.rpc, "KVS.Apply", &apply("set", "v/a", b"one", "", 0)).await;
        assert_eq!(err, "");
        // A set's FSM answer is no bool: the reply stays false.
        assert!(!agent_sim_proto::msgpack::decode::<bool>(&body).unwrap());
        let (err, body) = call(t.rpc, "KVS.Get", &key_request("v/a", 0)).await;
        assert_eq!(err, "");
        let got: Entries = agent_sim_proto::msgpack::decode(&body).unwrap();
        let e = &got.entries.as_ref().unwrap()[0];
        assert_eq!(
            (e.key.as_str(), &e.value.0[..], e.flags),
            ("v/a", &b"one"[..], 7)
        );
        assert_eq!(got.index, e.modify_index);
        assert!(got.known_leader);
        // CAS: the right index wins once.
        let cas = apply("cas", "v/a", b"two", "", e.modify_index);
        let (_, body) = call(t.rpc, "KVS.Apply", &cas).await;
        assert!(agent_sim_proto::msgpack::decode::<bool>(&body).unwrap());
        let (_, body) = call(t.rpc, "KVS.Apply", &cas).await;
        assert!(!agent_sim_proto::msgpack::decode::<bool>(&body).unwrap());
        // An absent key: no entries, the table's index (the last KV
        // change: the lost CAS took a raft index but changed nothing).
        let (_, body) = call(t.rpc, "KVS.Get", &key_request("v/a", 0)).await;
        let last = agent_sim_proto::msgpack::decode::<Entries>(&body)
            .unwrap()
            .index;
        assert_eq!(last + 1, t.state.stats().raft_index);
        let (_, body) = call(t.rpc, "KVS.Get", &key_request("v/none", 0)).await;
        let got: Entries = agent_sim_proto::msgpack::decode(&body).unwrap();
        assert!(got.entries.is_none());
        assert_eq!(got.index, last);
        // Byte for byte the layout a 1.20.1 server answered: a fixmap of 8,
        // keys sorted, `ConsistencyLevel` "", `Entries` nil.
        let mut want = vec![0x88];
        let key = |w: &mut Vec<u8>, k: &str| {
            w.push(0xa0 | k.len() as u8);
            w.extend_from_slice(k.as_bytes());
        };
        key(&mut want, "Backend");
        want.push(0);
        key(&mut want, "ConsistencyLevel");
        want.push(0xa0);
        key(&mut want, "Entries");
        want.push(0xc0);
        key(&mut want, "Index");
        want.push(last as u8);
        key(&mut want, "KnownLeader");
        want.push(0xc3);
        key(&mut want, "LastContact");
        want.push(0);
        key(&mut want, "NotModified");
        want.push(0xc2);
        key(&mut want, "ResultsFilteredByACLs");
        want.push(0xc2);
        assert_eq!(body, want);
        call(t.rpc, "KVS.Apply", &apply("set", "v/b/c", b"", "", 0)).await;
        #[derive(Serialize)]
        struct ListKeys<'a> {
            #[serde(rename = "Prefix")]
            prefix: &'a str,
            #[serde(rename = "Seperator")]
            separator: &'a str,
        }
        let lk = ListKeys {
            prefix: "v/",
            separator: "/",
        };
        let (_, body) = call(t.rpc, "KVS.ListKeys", &lk).await;
        let keys: Keys = agent_sim_proto::msgpack::decode(&body).unwrap();
        assert_eq!(keys.keys.unwrap(), vec!["v/a", "v/b/"]);
        assert!(keys.index > 0);
        // Errors in Consul's words.
        let (err, _) = call(t.rpc, "KVS.Apply", &apply("lock", "v/a", b"", "nope", 0)).await;
        assert_eq!(err, "raft apply failed: invalid session \"nope\"");
        let (err, _) = call(t.rpc, "KVS.Apply", &apply("bogus", "v/a", b"", "", 0)).await;
        assert_eq!(err, "unknown KV operation: bogus");
        let (err, _) = call(t.rpc, "KVS.Apply", &apply("set", "", b"", "", 0)).await;
        assert_eq!(err, "Must provide key");
        let calls = t.state.stats().rpc_calls;
        assert_eq!(calls.get("KVS.Apply"), Some(&7));
        assert_eq!(calls.get("KVS.Get"), Some(&3));
    })
    .await
    .expect("bounded");
}

#[tokio::test]
async fn a_blocking_kvs_list_wakes_when_its_prefix_changes() {
    let t = start(ConsulTargetConfig::default()).await;
    tokio::time::timeout(BOUND, async {
        call(t.rpc, "KVS.Apply", &apply("set", "w/a", b"1", "", 0)).await;
        let (_, body) = call(t.rpc, "KVS.List", &key_request("w/", 0)).await;
        let first: Entries = agent_sim_proto::msgpack::decode(&body).unwrap();
        assert_eq!(first.entries.as_ref().unwrap().len(), 1);
        let addr = t.rpc;
        let min = first.index;
        let held =
            tokio::spawn(async move { call(addr, "KVS.List", &key_request("w/", min)).await });
        until(BOUND, "the list held", async || {
            t.state.stats().blocking_queries_held == 1
        })
        .await;
        call(t.rpc, "KVS.Apply", &apply("set", "elsewhere", b"x", "", 0)).await;
        assert_eq!(
            t.state.stats().blocking_queries_held,
            1,
            "not woken by another prefix"
        );
        call(t.rpc, "KVS.Apply", &apply("set", "w/b", b"2", "", 0)).await;
        let (err, body) = held.await.unwrap();
        assert_eq!(err, "");
        let next: Entries = agent_sim_proto::msgpack::decode(&body).unwrap();
        assert!(next.index > min);
        let entries = next.entries.unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].session, "");
        assert_eq!(entries[0].lock_index, 0);
    })
    .await
    .expect("bounded");
}

#[derive(Serialize)]
struct TxnReq<'a> {
    #[serde(rename = "Datacenter")]
    datacenter: &'a str,
    #[serde(rename = "Ops")]
    ops: Vec<TxnOpReq<'a>>,
}

#[derive(Serialize)]
struct TxnOpReq<'a> {
    #[serde(rename = "KV")]
    kv: TxnKvReq<'a>,
}

#[derive(Serialize)]
struct TxnKvReq<'a> {
    #[serde(rename = "Verb")]
    verb: &'a str,
    #[serde(rename = "DirEnt")]
    dir_ent: DirEnt<'a>,
}

fn txn_op<'a>(verb: &'a str, key: &'a str, value: &'a [u8]) -> TxnOpReq<'a> {
    TxnOpReq {
        kv: TxnKvReq {
            verb,
            dir_ent: apply(verb, key, value, "", 0).dir_ent,
        },
    }
}

#[derive(Debug, Deserialize)]
struct TxnResp {
    #[serde(rename = "Results")]
    results: Option<Vec<TxnRes>>,
    #[serde(rename = "Errors")]
    errors: Option<Vec<TxnErr>>,
    #[serde(rename = "Index", default)]
    index: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct TxnRes {
    #[serde(rename = "KV")]
    kv: Option<Entry>,
    #[serde(rename = "Node")]
    node: Option<()>,
}

#[derive(Debug, Deserialize)]
struct TxnErr {
    #[serde(rename = "OpIndex")]
    op_index: u64,
    #[serde(rename = "What")]
    what: String,
}

/// `Txn.Apply` and `Txn.Read` in the layout a 1.20.1 server answered the
/// same calls with: `{Errors, Results}` (a read's with its `QueryMeta`),
/// each result `{Check: nil, KV, Node: nil, Service: nil}`, keys sorted.
#[tokio::test]
async fn txn_apply_and_read_answer_as_a_real_server_does() {
    let t = start(ConsulTargetConfig::default()).await;
    tokio::time::timeout(BOUND, async {
        let w = TxnReq {
            datacenter: "dc1",
            ops: vec![txn_op("set", "tx/a", b"one"), txn_op("get", "tx/a", b"")],
        };
        let (err, body) = call(t.rpc, "Txn.Apply", &w).await;
        assert_eq!(err, "");
        let mut head = vec![0x82, 0xa6];
        head.extend_from_slice(b"Errors");
        head.extend_from_slice(&[0xc0, 0xa7]);
        head.extend_from_slice(b"Results");
        head.extend_from_slice(&[0x92, 0x84, 0xa5]);
        head.extend_from_slice(b"Check");
        head.extend_from_slice(&[0xc0, 0xa2]);
        head.extend_from_slice(b"KV");
        assert_eq!(&body[..head.len()], &head[..]);
        let resp: TxnResp = agent_sim_proto::msgpack::decode(&body).unwrap();
        let results = resp.results.unwrap();
        let (set, got) = (
            results[0].kv.as_ref().unwrap(),
            results[1].kv.as_ref().unwrap(),
        );
        assert!(set.value.0.is_empty(), "a write's result has no value");
        assert_eq!(got.value.0, b"one");
        assert!(results[0].node.is_none());
        // Reads only: the query meta beside; an absent key is its op's error.
        let r = TxnReq {
            datacenter: "dc1",
            ops: vec![txn_op("get", "tx/a", b""), txn_op("get", "tx/none", b"")],
        };
        let (err, body) = call(t.rpc, "Txn.Read", &r).await;
        assert_eq!(err, "");
        let resp: TxnResp = agent_sim_proto::msgpack::decode(&body).unwrap();
        assert!(resp.results.is_none());
        let e = &resp.errors.unwrap()[0];
        assert_eq!(
            (e.op_index, e.what.as_str()),
            (1, "key \"tx/none\" doesn't exist")
        );
        assert_eq!(resp.index, Some(1));
        let b = TxnReq {
            datacenter: "dc1",
            ops: vec![txn_op("bogus", "tx/a", b"")],
        };
        let (_, body) = call(t.rpc, "Txn.Apply", &b).await;
        let resp: TxnResp = agent_sim_proto::msgpack::decode(&body).unwrap();
        assert_eq!(resp.errors.unwrap()[0].what, "unknown KV operation: bogus");
        let calls = t.state.stats().rpc_calls;
        assert_eq!(
            (calls.get("Txn.Apply"), calls.get("Txn.Read")),
            (Some(&2), Some(&1))
        );
    })
    .await
    .expect("bounded");
}
