//! KV operations in `/v1/txn`, as a Consul 1.20.1 agent takes them: the
//! op's JSON (`Verb`, `Key`, `Value` in base64, `Flags`, `Index`,
//! `Session`; a value over `kv_max_value_size` is a 413), and the txn's
//! answer in Consul's field order (results: the entry a write stored
//! without its value, what a `get` or `get-tree` read with it). The ops'
//! checks and their application are `kv::txn`'s.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use hyper::header::HeaderValue;
use hyper::{Response, StatusCode};
use serde::Serialize;
use serde_json::Value;

use super::kv::EntryJson;
use super::{Body, json_response, text};
use crate::consul::ConsulState;
use crate::consul::kv::KvRequest;

/// A KV op as parsed: its verb's name and its arguments.
pub(super) type Parsed = (String, KvRequest);

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
    Ok((verb_name, req))
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
