//! KV operations in `/v1/txn`, as a Consul 1.20.1 agent takes them: the
//! op's JSON (`Verb`, `Key`, `Value` in base64, `Flags`, `Index`,
//! `Session`), the checks made before anything is applied (a value over
//! `kv_max_value_size` is a 413; an unknown verb, a missing key or a lock
//! within its lock-delay is the op's error), the ops applied in order
//! inside one raft index with every failing op listed (then nothing is
//! kept), and the results: the entry a write stored without its value,
//! what a `get` or `get-tree` read with it.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use hyper::header::HeaderValue;
use hyper::{Response, StatusCode};
use serde::Serialize;
use serde_json::Value;
use tokio::time::Instant;

use super::kv::EntryJson;
use super::{Body, json_response, text};
use crate::consul::ConsulState;
use crate::consul::kv::{self, DirEntry, KvRequest, KvStore, Verb};
use crate::consul::sessions::Sessions;

/// A KV op as parsed: the op, or its error (listed with its index).
pub(super) type Parsed = Result<(Verb, KvRequest), String>;

/// Reads one `{"KV": {...}}` op. `Err` is an answer for the whole txn:
/// a 413 for a value over `kv_max_value_size`, a 400 for a value that is
/// not base64 (Go fails the body's decoding on it).
pub(super) fn parse(state: &ConsulState, v: &Value) -> Result<Parsed, Box<Response<Body>>> {
    let s = |name: &str| v[name].as_str().unwrap_or_default().to_owned();
    let n = |name: &str| v[name].as_u64().unwrap_or(0);
    let key = s("Key");
    let value = match v["Value"].as_str() {
        None => Bytes::new(),
        Some(b64) => match STANDARD.decode(b64) {
            Ok(b) => Bytes::from(b),
            Err(e) => {
                let at = match e {
                    base64::DecodeError::InvalidByte(i, _)
                    | base64::DecodeError::InvalidLastSymbol(i, _) => i,
                    _ => b64.len() / 4 * 4,
                };
                return Err(Box::new(text(
                    StatusCode::BAD_REQUEST,
                    format!("Failed to parse body: illegal base64 data at input byte {at}"),
                )));
            }
        },
    };
    let max = state.inner.cfg.kv_max_value_size;
    if value.len() > max {
        return Err(Box::new(text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "Value for key {key:?} is too large ({} > {max} bytes)",
                value.len()
            ),
        )));
    }
    let verb_name = s("Verb");
    let req = KvRequest {
        key,
        flags: n("Flags"),
        value,
        session: s("Session"),
        index: n("Index"),
    };
    let Some(verb) = Verb::parse(&verb_name) else {
        return Ok(Err(format!("unknown KV operation: {verb_name}")));
    };
    if req.key.is_empty() && verb != Verb::DeleteTree {
        return Ok(Err("Must provide key".into()));
    }
    Ok(Ok((verb, req)))
}

/// `kvsPreApply`'s lock-delay check, made before the txn is applied.
pub(super) fn pre_check(kv: &KvStore, verb: Verb, req: &KvRequest, now: Instant) -> Option<String> {
    (verb == Verb::Lock && kv.lock_delayed(&req.key, now))
        .then(|| format!("failed to lock key {:?} due to lock delay", req.key))
}

/// One result of a txn, printed in Consul's field order.
#[derive(Serialize)]
#[serde(untagged)]
pub(super) enum TxnResult {
    Kv {
        #[serde(rename = "KV")]
        kv: EntryJson,
    },
    /// A catalog op's result.
    Other(Value),
}

/// One failed op.
#[derive(Serialize)]
pub(super) struct TxnError {
    #[serde(rename = "OpIndex")]
    pub(super) op_index: usize,
    #[serde(rename = "What")]
    pub(super) what: String,
}

/// `Txn.Read`'s query meta (a txn of reads only prints it in its body).
#[derive(Serialize)]
struct ReadMeta {
    #[serde(rename = "Index")]
    index: u64,
    #[serde(rename = "LastContact")]
    last_contact: u64,
    #[serde(rename = "KnownLeader")]
    known_leader: bool,
    #[serde(rename = "ConsistencyLevel")]
    consistency_level: &'static str,
    #[serde(rename = "NotModified")]
    not_modified: bool,
    #[serde(rename = "Backend")]
    backend: u64,
    #[serde(rename = "ResultsFilteredByACLs")]
    results_filtered_by_acls: bool,
}

#[derive(Serialize)]
struct TxnAnswer {
    #[serde(rename = "Results")]
    results: Option<Vec<TxnResult>>,
    #[serde(rename = "Errors")]
    errors: Option<Vec<TxnError>>,
    #[serde(flatten)]
    meta: Option<ReadMeta>,
}

/// Applies one KV op of a txn: its results (entries in the txn's JSON),
/// or its error. Counts reads and writes.
pub(super) fn run(
    state: &ConsulState,
    kv: &mut KvStore,
    sessions: &Sessions,
    idx: u64,
    verb: Verb,
    req: &KvRequest,
) -> Result<Vec<TxnResult>, String> {
    let c = &state.inner.counters;
    c.bump(if verb.is_write() {
        &c.kv_writes
    } else {
        &c.kv_reads
    });
    let applied = kv::apply(kv, sessions, idx, verb, req)?;
    if !applied.ok {
        return Err(match verb {
            Verb::Cas => format!("failed to set key {:?}, index is stale", req.key),
            Verb::DeleteCas => format!("failed to delete key {:?}, index is stale", req.key),
            Verb::Lock => {
                c.bump(&c.kv_lock_refused);
                format!("failed to lock key {:?}, lock is already held", req.key)
            }
            _ => format!(
                "failed to unlock key {:?}, lock isn't held, or is held by another session",
                req.key
            ),
        });
    }
    if verb == Verb::Lock {
        c.bump(&c.kv_lock_acquires);
    }
    let with_value = matches!(verb, Verb::Get | Verb::GetOrEmpty | Verb::GetTree);
    Ok(applied
        .entries
        .into_iter()
        .map(|mut e: DirEntry| {
            if !with_value {
                e.value = Bytes::new();
            }
            if verb == Verb::GetOrEmpty && e.modify_index == 0 {
                e.flags = 0;
            }
            TxnResult::Kv {
                kv: EntryJson::of(&e),
            }
        })
        .collect())
}

/// The txn's answer: 200 with its results, or 409 with its errors (and
/// no results). A txn of reads only prints its query meta in the body and
/// carries the leader headers, as `Txn.Read` answers; a write has neither
/// (nor an index header).
pub(super) fn answer(
    read_only: bool,
    outcome: Result<Vec<TxnResult>, Vec<TxnError>>,
) -> Response<Body> {
    let (status, results, errors) = match outcome {
        Ok(r) => (StatusCode::OK, Some(r), None),
        Err(e) => (StatusCode::CONFLICT, None, Some(e)),
    };
    let meta = read_only.then_some(ReadMeta {
        index: 1,
        last_contact: 0,
        known_leader: true,
        consistency_level: "",
        not_modified: false,
        backend: 0,
        results_filtered_by_acls: false,
    });
    let mut r = json_response(
        status,
        &TxnAnswer {
            results,
            errors,
            meta,
        },
    );
    if read_only {
        let h = r.headers_mut();
        h.insert("X-Consul-Knownleader", HeaderValue::from_static("true"));
        h.insert("X-Consul-Lastcontact", HeaderValue::from_static("0"));
    }
    r
}
