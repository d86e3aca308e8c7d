//! `/v1/txn`: catalog and KV operations (`txn_kv`) applied whole or not
//! at all.

use std::collections::{HashMap, HashSet};

use hyper::{Response, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};

use super::kv::EntryJson;
use super::txn_kv::{self, TxnError, TxnResult};
use super::{Body, MAX_TXN_OPS, json_response, text, with_index};
use crate::consul::ConsulState;
use crate::consul::kv::txn as kv_txn;
use crate::consul::kv::{self, KvRequest, Verb};
use crate::consul::render::{check_json, node_json, service_json};
use crate::consul::state::{CheckDef, NodeDef, SERF_HEALTH, ServiceDef, Store, Touched};
use crate::consul::timing::TxnTimer;
use crate::consul::write_error::WriteError;
use crate::consul::writes::{
    CheckBody, NodeBody, ServiceBody, check_def, node_def, nullable, service_def,
};

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct TxnOpBody {
    #[serde(rename = "KV")]
    pub(super) kv: Option<Value>,
    #[serde(rename = "Node")]
    pub(super) node: Option<TxnNodeOp>,
    #[serde(rename = "Service")]
    pub(super) service: Option<TxnServiceOp>,
    #[serde(rename = "Check")]
    pub(super) check: Option<TxnCheckOp>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct TxnNodeOp {
    #[serde(rename = "Verb", deserialize_with = "nullable")]
    pub(super) verb: String,
    #[serde(rename = "Node")]
    pub(super) node: NodeBody,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct TxnServiceOp {
    #[serde(rename = "Verb", deserialize_with = "nullable")]
    pub(super) verb: String,
    #[serde(rename = "Node", deserialize_with = "nullable")]
    pub(super) node: String,
    #[serde(rename = "Service")]
    pub(super) service: ServiceBody,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct TxnCheckOp {
    #[serde(rename = "Verb", deserialize_with = "nullable")]
    pub(super) verb: String,
    #[serde(rename = "Check")]
    pub(super) check: CheckBody,
}

// ---------------------------------------------------------------- txn

/// Why an op of a txn failed: its `What`, in Consul's words (byte for
/// byte, as a real server's), each cause its own variant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum OpError {
    /// A KV op refused (its verb, key, lock-delay, or the store's check).
    #[error(transparent)]
    Kv(#[from] kv::Error),
    /// A catalog op refused as a catalog write is.
    #[error(transparent)]
    Write(#[from] WriteError),
    /// A node op without a node name.
    #[error("Must provide node")]
    NoNode,
    /// A verb the op's kind does not have.
    #[error("unknown {kind} verb {verb:?}")]
    UnknownVerb {
        /// `node`, `service` or `check`.
        kind: &'static str,
        /// The verb as sent.
        verb: String,
    },
    /// An op of no kind.
    #[error("operation has no KV, Node, Service or Check")]
    NoKind,
    /// A node `get` of a node that does not exist.
    #[error("node {0:?} doesn't exist")]
    NoSuchNode(String),
    /// A service `get` of a service that does not exist.
    #[error("service {id:?} on node {node:?} doesn't exist")]
    NoSuchService {
        /// The node named.
        node: String,
        /// The service ID named.
        id: String,
    },
}

/// A failed op: its index in the txn and why.
type Failed = (usize, OpError);

/// The answer refusing a whole txn before its ops are checked.
type Refusal = Box<Response<Body>>;

impl OpError {
    /// The txn's error entry for the op at `op_index`.
    fn entry(&self, op_index: usize) -> TxnError {
        TxnError {
            op_index,
            what: self.to_string(),
        }
    }
}

pub(super) enum Op {
    NodeSet(String, NodeDef),
    NodeGet(String),
    NodeDelete(String),
    ServiceSet(String, ServiceDef),
    ServiceGet(String, String),
    ServiceDelete(String, String),
    CheckSet(String, CheckDef),
    CheckGet(String, String),
    CheckDelete(String, String),
    Kv(Verb, KvRequest),
}

impl Op {
    fn is_write(&self) -> bool {
        match self {
            Op::Kv(verb, _) => verb.is_write(),
            o => !matches!(o, Op::NodeGet(_) | Op::ServiceGet(..) | Op::CheckGet(..)),
        }
    }
}

pub(super) fn parse_op(body: TxnOpBody) -> Result<Op, OpError> {
    let unknown = |kind, verb: &str| OpError::UnknownVerb {
        kind,
        verb: verb.to_owned(),
    };
    if let Some(n) = body.node {
        let name = n.node.node.clone();
        if name.is_empty() {
            return Err(OpError::NoNode);
        }
        return match n.verb.as_str() {
            "set" | "cas" => Ok(Op::NodeSet(
                name,
                node_def(
                    n.node.id,
                    n.node.address,
                    n.node.meta,
                    n.node.tagged_addresses,
                ),
            )),
            "get" => Ok(Op::NodeGet(name)),
            "delete" | "delete-cas" => Ok(Op::NodeDelete(name)),
            v => Err(unknown("node", v)),
        };
    }
    if let Some(s) = body.service {
        let node = s.node;
        return match s.verb.as_str() {
            "set" | "cas" => service_def(s.service)
                .map(|mut d| {
                    // Consul 1.20's txn keeps a proxy's destination but not
                    // its upstreams or config (seen on a real server).
                    if let Some(serde_json::Value::Object(p)) = &mut d.proxy {
                        p.remove("Upstreams");
                        p.remove("Config");
                    }
                    Op::ServiceSet(node, d)
                })
                .map_err(OpError::from),
            "get" => Ok(Op::ServiceGet(node, s.service.id)),
            "delete" | "delete-cas" => Ok(Op::ServiceDelete(node, s.service.id)),
            v => Err(unknown("service", v)),
        };
    }
    if let Some(c) = body.check {
        let node = c.check.node.clone();
        return match c.verb.as_str() {
            "set" | "cas" => check_def(c.check)
                .map(|d| Op::CheckSet(node, d))
                .map_err(OpError::from),
            "get" => Ok(Op::CheckGet(node, c.check.check_id)),
            "delete" | "delete-cas" => Ok(Op::CheckDelete(node, c.check.check_id)),
            v => Err(unknown("check", v)),
        };
    }
    Err(OpError::NoKind)
}

/// Replays the ops' effect on existence, so that a txn either applies whole
/// or not at all.
pub(super) fn validate(store: &Store, ops: &[Op]) -> Vec<Failed> {
    let mut nodes: HashMap<&str, bool> = HashMap::new();
    let mut services: HashMap<(&str, &str), bool> = HashMap::new();
    let mut deleted: HashSet<&str> = HashSet::new();
    let mut errors = Vec::new();
    let node_exists = |nodes: &HashMap<&str, bool>, n: &str| {
        nodes
            .get(n)
            .copied()
            .unwrap_or_else(|| store.nodes.contains_key(n))
    };
    let service_exists = |nodes: &HashMap<&str, bool>,
                          services: &HashMap<(&str, &str), bool>,
                          deleted: &HashSet<&str>,
                          n: &str,
                          id: &str| {
        node_exists(nodes, n)
            && services.get(&(n, id)).copied().unwrap_or_else(|| {
                !deleted.contains(n)
                    && store
                        .nodes
                        .get(n)
                        .is_some_and(|x| x.services.contains_key(id))
            })
    };
    for (i, op) in ops.iter().enumerate() {
        let problem =
            match op {
                Op::NodeSet(n, _) if !store.room_for_node(n) => Some(WriteError::Full.into()),
                Op::NodeSet(n, _) => {
                    nodes.insert(n, true);
                    None
                }
                Op::NodeDelete(n) => {
                    nodes.insert(n, false);
                    deleted.insert(n);
                    services.retain(|(sn, _), _| sn != n);
                    None
                }
                Op::NodeGet(n) => (!node_exists(&nodes, n)).then(|| OpError::NoSuchNode(n.clone())),
                Op::ServiceSet(n, d) => {
                    if node_exists(&nodes, n) {
                        services.insert((n, &d.id), true);
                        None
                    } else {
                        Some(WriteError::MissingNode.into())
                    }
                }
                Op::ServiceDelete(n, id) => {
                    services.insert((n, id), false);
                    None
                }
                Op::ServiceGet(n, id) => (!service_exists(&nodes, &services, &deleted, n, id))
                    .then(|| OpError::NoSuchService {
                        node: n.clone(),
                        id: id.clone(),
                    }),
                Op::CheckSet(n, d) => {
                    if !node_exists(&nodes, n) {
                        Some(WriteError::MissingNode.into())
                    } else if !d.service_id.is_empty()
                        && !service_exists(&nodes, &services, &deleted, n, &d.service_id)
                    {
                        Some(WriteError::MissingService.into())
                    } else {
                        None
                    }
                }
                Op::CheckDelete(..) | Op::CheckGet(..) | Op::Kv(..) => None,
            };
        if let Some(what) = problem {
            errors.push((i, what));
        }
    }
    errors
}

/// `PUT /v1/txn`: the ops parsed, checked against the store (existence,
/// lock-delays), then applied whole (KV ops first, in order, then the
/// catalog's) or not at all (409 with every failing op).
pub(super) fn txn(state: &ConsulState, body: &[u8]) -> Response<Body> {
    let raw = match decode_ops(body) {
        Ok(raw) => raw,
        Err(answer) => return *answer,
    };
    let has_kv = raw.iter().any(|r| r.kv.is_some());
    let (ops, mut errors) = match parse_ops(state, raw) {
        Ok(parsed) => parsed,
        Err(answer) => return *answer,
    };
    let writes = ops.iter().any(Op::is_write);
    let _timer = TxnTimer::start(state, writes);
    let mut store = state.store();
    if errors.is_empty() {
        errors = validate(&store, &ops);
    }
    if errors.is_empty() {
        errors = lock_delayed(&store, &ops);
    }
    if !errors.is_empty() {
        drop(store);
        return refused(has_kv, writes, &errors);
    }
    let idx = if writes {
        store.next_index()
    } else {
        store.raft_index
    };
    let mut results: Vec<(usize, TxnResult)> = Vec::new();
    if has_kv {
        match kv_pass(state, &mut store, &ops, idx) {
            Ok(r) => results = r,
            Err(errors) => return txn_kv::answer(!writes, Err(errors)),
        }
    }
    results.extend(catalog_pass(state, &mut store, ops, idx, writes));
    drop(store);
    let c = &state.inner.counters;
    c.bump(&c.txns);
    if has_kv {
        c.bump(&c.kv_txns);
    }
    answered(has_kv, writes, results, idx)
}

/// The body as a list of ops, or the answer refusing it (not JSON: 400;
/// too many ops: 413).
fn decode_ops(body: &[u8]) -> Result<Vec<TxnOpBody>, Refusal> {
    let raw: Vec<TxnOpBody> = serde_json::from_slice(body).map_err(|e| {
        Box::new(text(
            StatusCode::BAD_REQUEST,
            format!("Failed to parse body: {e}"),
        ))
    })?;
    if raw.len() > MAX_TXN_OPS {
        return Err(Box::new(text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "Transaction contains too many operations ({} > {MAX_TXN_OPS})",
                raw.len()
            ),
        )));
    }
    Ok(raw)
}

/// Each op parsed: the ops, and the failing ones by op index; or the
/// answer refusing the whole txn (a KV op's value that does not decode).
fn parse_ops(state: &ConsulState, raw: Vec<TxnOpBody>) -> Result<(Vec<Op>, Vec<Failed>), Refusal> {
    let mut ops = Vec::with_capacity(raw.len());
    let mut errors = Vec::new();
    for (i, mut r) in raw.into_iter().enumerate() {
        let parsed = match r.kv.take() {
            Some(kv) => match txn_kv::parse(state, &kv) {
                Ok((verb_name, req)) => kv_txn::check(&verb_name, &req)
                    .map(|v| Op::Kv(v, req))
                    .map_err(OpError::from),
                Err(answer) => return Err(answer),
            },
            None => parse_op(r),
        };
        match parsed {
            Ok(op) => ops.push(op),
            Err(what) => errors.push((i, what)),
        }
    }
    Ok((ops, errors))
}

/// `kvsPreApply`'s lock-delay check of every KV lock, by op index.
fn lock_delayed(store: &Store, ops: &[Op]) -> Vec<Failed> {
    let now = tokio::time::Instant::now();
    ops.iter()
        .enumerate()
        .filter_map(|(i, op)| match op {
            Op::Kv(verb, req) => kv_txn::delayed(&store.kv, *verb, req, now).map(|w| (i, w.into())),
            _ => None,
        })
        .collect()
}

/// The 409 of a txn refused before anything applied: a txn with KV ops
/// answers as `Txn.Apply`/`Txn.Read` do, a catalog-only one as the
/// catalog's.
fn refused(has_kv: bool, writes: bool, errors: &[Failed]) -> Response<Body> {
    if has_kv {
        let errors = errors.iter().map(|(i, e)| e.entry(*i)).collect();
        return txn_kv::answer(!writes, Err(errors));
    }
    let errors: Vec<Value> = errors
        .iter()
        .map(|(i, what)| json!({"OpIndex": i, "What": what.to_string()}))
        .collect();
    json_response(
        StatusCode::CONFLICT,
        &json!({"Results": Value::Null, "Errors": errors}),
    )
}

/// The 200 of an applied txn: its results in op order.
fn answered(
    has_kv: bool,
    writes: bool,
    mut results: Vec<(usize, TxnResult)>,
    idx: u64,
) -> Response<Body> {
    if has_kv {
        results.sort_by_key(|(i, _)| *i);
        let results = results.into_iter().map(|(_, r)| r).collect();
        return txn_kv::answer(!writes, Ok(results));
    }
    let results: Vec<Value> = results
        .into_iter()
        .filter_map(|(_, r)| match r {
            TxnResult::Other(v) => Some(v),
            TxnResult::Kv { .. } => None,
        })
        .collect();
    let results = if results.is_empty() {
        Value::Null
    } else {
        Value::Array(results)
    };
    with_index(
        json_response(
            StatusCode::OK,
            &json!({"Results": results, "Errors": Value::Null}),
        ),
        idx,
    )
}

/// The txn's KV ops, applied in order at `idx`: their results by op
/// index, or every failing op (and nothing kept).
fn kv_pass(
    state: &ConsulState,
    store: &mut Store,
    ops: &[Op],
    idx: u64,
) -> Result<Vec<(usize, TxnResult)>, Vec<TxnError>> {
    let sessions = state.sessions();
    let kv_ops = ops.iter().enumerate().filter_map(|(i, op)| match op {
        Op::Kv(verb, req) => Some((i, *verb, req)),
        _ => None,
    });
    let applied = kv_txn::apply_all(state, &mut store.kv, &sessions, idx, kv_ops);
    drop(sessions);
    match applied {
        Ok(entries) => Ok(entries
            .into_iter()
            .map(|(i, e)| {
                let kv = EntryJson::of(&e);
                (i, TxnResult::Kv { kv })
            })
            .collect()),
        Err(errors) => Err(errors
            .into_iter()
            .map(|(i, e)| OpError::from(e).entry(i))
            .collect()),
    }
}

/// The txn's catalog ops (validated), applied at `idx`: their results by
/// op index.
fn catalog_pass(
    state: &ConsulState,
    store: &mut Store,
    ops: Vec<Op>,
    idx: u64,
    writes: bool,
) -> Vec<(usize, TxnResult)> {
    let mut t = Touched::default();
    let mut results = Vec::new();
    let (mut registered, mut deregistered) = (0u64, 0u64);
    let mut removed_nodes = Vec::new();
    for (i, op) in ops.into_iter().enumerate() {
        let result = match op {
            Op::NodeSet(n, def) => {
                store.ensure_node(&n, def, idx, &mut t);
                let e = &store.nodes[&n];
                Some(json!({"Node": node_json(store, &n, e)}))
            }
            Op::NodeGet(n) => store
                .nodes
                .get(&n)
                .map(|e| json!({"Node": node_json(store, &n, e)})),
            Op::NodeDelete(n) => {
                if store.delete_node(&n, &mut t) {
                    removed_nodes.push(n);
                }
                deregistered += 1;
                None
            }
            Op::ServiceSet(n, def) => {
                let id = def.id.clone();
                // Validated above: the node exists.
                let _ = store.ensure_service(&n, def, idx, &mut t);
                registered += 1;
                store
                    .service(&(n, id))
                    .map(|s| json!({"Service": service_json(s)}))
            }
            Op::ServiceGet(n, id) => store
                .service(&(n, id))
                .map(|s| json!({"Service": service_json(s)})),
            Op::ServiceDelete(n, id) => {
                store.delete_service(&n, &id, &mut t);
                deregistered += 1;
                None
            }
            Op::CheckSet(n, def) => {
                if def.check_id == SERF_HEALTH {
                    None
                } else {
                    let id = def.check_id.clone();
                    let _ = store.ensure_check(&n, def, idx, &mut t);
                    store
                        .nodes
                        .get(&n)
                        .and_then(|e| e.checks.get(&id))
                        .map(|c| json!({"Check": check_json(&n, c)}))
                }
            }
            Op::CheckGet(n, id) => store
                .nodes
                .get(&n)
                .and_then(|e| e.checks.get(&id))
                .map(|c| json!({"Check": check_json(&n, c)})),
            Op::Kv(..) => None,
            Op::CheckDelete(n, id) => {
                store.delete_check(&n, &id, &mut t);
                None
            }
        };
        results.extend(result.map(|v| (i, TxnResult::Other(v))));
    }
    if writes {
        store.commit(idx, t);
    }
    if !removed_nodes.is_empty() {
        let mut gone = Vec::new();
        let mut sessions = state.sessions();
        for n in &removed_nodes {
            gone.extend(sessions.remove_node(n));
        }
        drop(sessions);
        state.sessions_gone(store, &gone, Some(idx));
    }
    let c = &state.inner.counters;
    let ord = std::sync::atomic::Ordering::Relaxed;
    c.registrations.fetch_add(registered, ord);
    c.deregistrations.fetch_add(deregistered, ord);
    results
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn txn_validation_is_all_or_nothing() {
        let mut store = Store::new("dc1".into(), 4);
        let ops = vec![
            Op::NodeSet("n1".into(), NodeDef::default()),
            Op::ServiceSet(
                "n1".into(),
                ServiceDef {
                    id: "a".into(),
                    service: "a".into(),
                    ..Default::default()
                },
            ),
            Op::ServiceSet(
                "n2".into(),
                ServiceDef {
                    id: "b".into(),
                    service: "b".into(),
                    ..Default::default()
                },
            ),
        ];
        let errors = validate(&store, &ops);
        assert_eq!(errors, vec![(2, WriteError::MissingNode.into())]);
        assert_eq!(errors[0].1.to_string(), "Missing node registration");
        let mut t = Touched::default();
        store.ensure_node("n2", NodeDef::default(), 1, &mut t);
        assert!(validate(&store, &ops).is_empty());
        let ops = vec![
            Op::NodeDelete("n2".into()),
            Op::CheckSet(
                "n2".into(),
                CheckDef {
                    check_id: "c".into(),
                    ..Default::default()
                },
            ),
        ];
        assert_eq!(validate(&store, &ops).len(), 1);
    }
}
