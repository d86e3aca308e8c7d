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
use crate::consul::kv::{KvRequest, Verb};
use crate::consul::render::{check_json, node_json, service_json};
use crate::consul::state::{
    CATALOG_FULL, CheckDef, NodeDef, SERF_HEALTH, ServiceDef, Store, Touched, WriteError,
};
use crate::consul::timing::TxnTimer;
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

pub(super) fn parse_op(body: TxnOpBody) -> Result<Op, String> {
    if let Some(n) = body.node {
        let name = n.node.node.clone();
        if name.is_empty() {
            return Err("Must provide node".into());
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
            v => Err(format!("unknown node verb {v:?}")),
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
                .map_err(|e| e.0),
            "get" => Ok(Op::ServiceGet(node, s.service.id)),
            "delete" | "delete-cas" => Ok(Op::ServiceDelete(node, s.service.id)),
            v => Err(format!("unknown service verb {v:?}")),
        };
    }
    if let Some(c) = body.check {
        let node = c.check.node.clone();
        return match c.verb.as_str() {
            "set" | "cas" => check_def(c.check)
                .map(|d| Op::CheckSet(node, d))
                .map_err(|e| e.0),
            "get" => Ok(Op::CheckGet(node, c.check.check_id)),
            "delete" | "delete-cas" => Ok(Op::CheckDelete(node, c.check.check_id)),
            v => Err(format!("unknown check verb {v:?}")),
        };
    }
    Err("operation has no KV, Node, Service or Check".into())
}

/// Replays the ops' effect on existence, so that a txn either applies whole
/// or not at all.
pub(super) fn validate(store: &Store, ops: &[Op]) -> Vec<(usize, String)> {
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
        let problem = match op {
            Op::NodeSet(n, _) if !store.room_for_node(n) => Some(CATALOG_FULL.to_owned()),
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
            Op::NodeGet(n) => {
                (!node_exists(&nodes, n)).then(|| format!("node {n:?} doesn't exist"))
            }
            Op::ServiceSet(n, d) => {
                if node_exists(&nodes, n) {
                    services.insert((n, &d.id), true);
                    None
                } else {
                    Some(WriteError::missing_node().0)
                }
            }
            Op::ServiceDelete(n, id) => {
                services.insert((n, id), false);
                None
            }
            Op::ServiceGet(n, id) => (!service_exists(&nodes, &services, &deleted, n, id))
                .then(|| format!("service {id:?} on node {n:?} doesn't exist")),
            Op::CheckSet(n, d) => {
                if !node_exists(&nodes, n) {
                    Some(WriteError::missing_node().0)
                } else if !d.service_id.is_empty()
                    && !service_exists(&nodes, &services, &deleted, n, &d.service_id)
                {
                    Some("Missing service registration".into())
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

pub(super) fn txn(state: &ConsulState, body: &[u8]) -> Response<Body> {
    let raw: Vec<TxnOpBody> = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("Failed to parse body: {e}"),
            );
        }
    };
    if raw.len() > MAX_TXN_OPS {
        return text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "Transaction contains too many operations ({} > {MAX_TXN_OPS})",
                raw.len()
            ),
        );
    }
    let mut ops = Vec::with_capacity(raw.len());
    let mut errors = Vec::new();
    let has_kv = raw.iter().any(|r| r.kv.is_some());
    for (i, mut r) in raw.into_iter().enumerate() {
        let parsed = match r.kv.take() {
            Some(kv) => match txn_kv::parse(state, &kv) {
                Ok((verb_name, req)) => kv_txn::check(&verb_name, &req).map(|v| Op::Kv(v, req)),
                Err(answer) => return *answer,
            },
            None => parse_op(r),
        };
        match parsed {
            Ok(op) => ops.push(op),
            Err(what) => errors.push((i, what)),
        }
    }
    let writes = ops.iter().any(Op::is_write);
    let _timer = TxnTimer::start(state, writes);
    let mut store = state.store();
    if errors.is_empty() {
        errors = validate(&store, &ops);
    }
    if errors.is_empty() {
        let now = tokio::time::Instant::now();
        errors = ops
            .iter()
            .enumerate()
            .filter_map(|(i, op)| match op {
                Op::Kv(verb, req) => kv_txn::delayed(&store.kv, *verb, req, now).map(|w| (i, w)),
                _ => None,
            })
            .collect();
    }
    if !errors.is_empty() {
        drop(store);
        if has_kv {
            let errors = errors
                .into_iter()
                .map(|(op_index, what)| TxnError { op_index, what })
                .collect();
            return txn_kv::answer(!writes, Err(errors));
        }
        let errors: Vec<Value> = errors
            .into_iter()
            .map(|(i, what)| json!({"OpIndex": i, "What": what}))
            .collect();
        return json_response(
            StatusCode::CONFLICT,
            &json!({"Results": Value::Null, "Errors": errors}),
        );
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
            .map(|(op_index, what)| TxnError { op_index, what })
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
        assert_eq!(errors, vec![(2, "Missing node registration".to_owned())]);
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
