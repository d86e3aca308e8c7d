//! Catalog endpoints: register, deregister (applied by `consul::writes`,
//! which the RPC port shares), and the health of a service, of a node
//! (its checks, `serfHealth` among them) and of every check in a state.

use hyper::{Response, StatusCode};

use serde_json::Value;

use super::{Body, decode, json_bytes, json_response, ok_true, text, with_index};
use crate::consul::ConsulState;
use crate::consul::blocking::{Encoding, result};
use crate::consul::render::check_json;
use crate::consul::writes::{self, DeregisterBody, RegisterBody};

// ---------------------------------------------------------------- catalog

pub(super) fn catalog_register(state: &ConsulState, body: &[u8]) -> Response<Body> {
    match decode::<RegisterBody>(body) {
        Ok(b) => writes::register(state, b).map_or_else(Into::into, |()| ok_true()),
        Err(r) => r.into(),
    }
}

pub(super) fn catalog_deregister(state: &ConsulState, body: &[u8]) -> Response<Body> {
    match decode::<DeregisterBody>(body) {
        Ok(b) => writes::deregister(state, b).map_or_else(Into::into, |()| ok_true()),
        Err(r) => r.into(),
    }
}

pub(super) fn health_service(
    state: &ConsulState,
    name: &str,
    passing_only: bool,
) -> Response<Body> {
    let (index, body) = result(state, name, passing_only, Encoding::Json);
    with_index(json_bytes(StatusCode::OK, body), index)
}

/// `GET /v1/health/node/:node`: the node's checks (`[]` for an unknown node).
pub(super) fn health_node(state: &ConsulState, node: &str) -> Response<Body> {
    let store = state.store();
    let checks: Vec<Value> = store
        .nodes
        .get(node)
        .map(|n| n.checks.values().map(|c| check_json(node, c)).collect())
        .unwrap_or_default();
    with_index(json_response(StatusCode::OK, &checks), store.raft_index)
}

/// `GET /v1/health/state/:state` (`any`, `passing`, `warning`,
/// `critical`): every check in that state, by node. A `?filter=` is not
/// applied (callers such as `--observe` filter the answer themselves).
pub(super) fn health_state(state: &ConsulState, wanted: &str) -> Response<Body> {
    if !matches!(wanted, "any" | "passing" | "warning" | "critical") {
        return text(StatusCode::BAD_REQUEST, "Invalid check state");
    }
    let store = state.store();
    let mut nodes: Vec<_> = store.nodes.iter().collect();
    nodes.sort_unstable_by(|a, b| a.0.cmp(b.0));
    let checks: Vec<Value> = nodes
        .into_iter()
        .flat_map(|(name, n)| {
            n.checks
                .values()
                .filter(|c| wanted == "any" || c.def.status == wanted)
                .map(|c| check_json(name, c))
        })
        .collect();
    with_index(json_response(StatusCode::OK, &checks), store.raft_index)
}
