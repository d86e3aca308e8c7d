//! Read endpoints that tests, `agent-sim cleanup` and agents' anti-entropy
//! use: `/v1/catalog/nodes`, `/v1/catalog/node/:node`,
//! `/v1/catalog/service/:name`, `/v1/session/list`, `/v1/session/node/:node`,
//! `/v1/coordinate/nodes`, shaped as Consul 1.20 prints them (an unknown
//! node is `200 null`).

use std::collections::BTreeMap;

use hyper::{Response, StatusCode};
use serde_json::{Value, json};

use super::{Body, json_response, text, with_index};
use crate::consul::ConsulState;
use crate::consul::render::{instance_entries, node_json, service_json};
use crate::consul::sessions::Session;

/// `node-meta=key:value` filters of a query string (all must match).
fn node_meta_filters(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter_map(|kv| kv.strip_prefix("node-meta="))
        .map(|v| {
            let v = percent_decode(v);
            match v.split_once(':') {
                Some((k, val)) => (k.to_owned(), val.to_owned()),
                None => (v, String::new()),
            }
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    super::kv::unescape(s, false)
}

fn meta_matches(meta: &BTreeMap<String, String>, filters: &[(String, String)]) -> bool {
    filters
        .iter()
        .all(|(k, v)| meta.get(k).is_some_and(|m| m == v))
}

pub(super) fn catalog_nodes(state: &ConsulState, query: &str) -> Response<Body> {
    let filters = node_meta_filters(query);
    let store = state.store();
    let mut names: Vec<&String> = store
        .nodes
        .iter()
        .filter(|(_, n)| meta_matches(&n.def.meta, &filters))
        .map(|(k, _)| k)
        .collect();
    names.sort();
    let out: Vec<Value> = names
        .into_iter()
        .map(|name| node_json(&store, name, &store.nodes[name]))
        .collect();
    let index = store.raft_index;
    drop(store);
    with_index(json_response(StatusCode::OK, &out), index)
}

pub(super) fn catalog_node(state: &ConsulState, name: &str) -> Response<Body> {
    if name.is_empty() {
        return text(StatusCode::BAD_REQUEST, "Missing node name");
    }
    let store = state.store();
    let out = match store.nodes.get(name) {
        None => Value::Null,
        Some(n) => json!({
            "Node": node_json(&store, name, n),
            "Services": n.services.iter()
                .map(|(id, s)| (id.clone(), service_json(s)))
                .collect::<serde_json::Map<String, Value>>(),
        }),
    };
    let index = store.raft_index;
    drop(store);
    with_index(json_response(StatusCode::OK, &out), index)
}

pub(super) fn catalog_service(state: &ConsulState, name: &str) -> Response<Body> {
    let store = state.store();
    let mut out = Vec::new();
    for (key, n, s) in instance_entries(&store, name) {
        out.push(json!({
            "ID": n.def.id,
            "Node": key.0,
            "Address": n.def.address,
            "Datacenter": store.datacenter,
            "NodeMeta": n.def.meta,
            "ServiceKind": s.def.kind,
            "ServiceID": s.def.id,
            "ServiceName": s.def.service,
            "ServiceTags": s.def.tags,
            "ServiceAddress": s.def.address,
            "ServiceMeta": s.def.meta,
            "ServicePort": s.def.port,
            "ServiceProxy": s.def.proxy.clone().unwrap_or_else(|| json!({})),
            "CreateIndex": s.create_index,
            "ModifyIndex": s.modify_index,
        }));
    }
    let index = store.raft_index;
    drop(store);
    with_index(json_response(StatusCode::OK, &out), index)
}

/// `/v1/session/list` (no node) or `/v1/session/node/:node`.
pub(super) fn session_list(state: &ConsulState, node: Option<&str>) -> Response<Body> {
    let index = state.raft_index();
    let sessions = state.sessions();
    let mut out: Vec<&Session> = sessions
        .iter()
        .filter(|s| node.is_none_or(|n| s.node == n))
        .collect();
    out.sort_by_key(|s| s.create_index);
    let r = json_response(StatusCode::OK, &out);
    drop(sessions);
    with_index(r, index)
}

/// `/v1/coordinate/nodes`: every node's last coordinate (nodes that never
/// sent one are not listed, as Consul lists them).
pub(super) fn coordinate_nodes(state: &ConsulState) -> Response<Body> {
    let store = state.store();
    let list: Vec<Value> = store
        .nodes
        .iter()
        .filter_map(|(name, n)| {
            let coord = n.coord.as_ref()?;
            Some(json!({"Node": name, "Segment": "", "Partition": "", "Coord": coord}))
        })
        .collect();
    let index = store.raft_index;
    drop(store);
    with_index(json_response(StatusCode::OK, &list), index)
}
