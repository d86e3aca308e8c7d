//! Catalog endpoints: register, deregister, and the health of a service;
//! the request bodies of nodes, services and checks and their definitions
//! in the store (the JSON views live in `consul::render`).

use std::collections::BTreeMap;

use hyper::{Response, StatusCode};
use serde::Deserialize;
use serde_json::Value;

use super::{Body, decode, json_bytes, nullable, ok_true, server_error, with_index};
use crate::consul::ConsulState;
use crate::consul::blocking::{Encoding, result};
use crate::consul::state::{
    CATALOG_FULL, CheckDef, NodeDef, SERF_HEALTH, ServiceDef, Touched, WriteError,
};

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct RegisterBody {
    #[serde(rename = "ID", deserialize_with = "nullable")]
    pub(super) id: String,
    #[serde(rename = "Node", deserialize_with = "nullable")]
    pub(super) node: String,
    #[serde(rename = "Address", deserialize_with = "nullable")]
    pub(super) address: String,
    #[serde(rename = "TaggedAddresses", deserialize_with = "nullable")]
    pub(super) tagged_addresses: BTreeMap<String, String>,
    #[serde(rename = "NodeMeta", deserialize_with = "nullable")]
    pub(super) node_meta: BTreeMap<String, String>,
    #[serde(rename = "Service")]
    pub(super) service: Option<ServiceBody>,
    #[serde(rename = "Check")]
    pub(super) check: Option<CheckBody>,
    #[serde(rename = "Checks", deserialize_with = "nullable")]
    pub(super) checks: Vec<CheckBody>,
    #[serde(rename = "SkipNodeUpdate", deserialize_with = "nullable")]
    pub(super) skip_node_update: bool,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct ServiceBody {
    #[serde(rename = "ID", deserialize_with = "nullable")]
    pub(super) id: String,
    #[serde(rename = "Service", deserialize_with = "nullable")]
    pub(super) service: String,
    #[serde(rename = "Kind", deserialize_with = "nullable")]
    pub(super) kind: String,
    #[serde(rename = "Tags", deserialize_with = "nullable")]
    pub(super) tags: Vec<String>,
    #[serde(rename = "Address", deserialize_with = "nullable")]
    pub(super) address: String,
    #[serde(rename = "Port", deserialize_with = "nullable")]
    pub(super) port: i32,
    #[serde(rename = "Meta", deserialize_with = "nullable")]
    pub(super) meta: BTreeMap<String, String>,
    #[serde(rename = "Proxy")]
    pub(super) proxy: Option<Value>,
    #[serde(rename = "Connect")]
    pub(super) connect: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct CheckBody {
    #[serde(rename = "Node", deserialize_with = "nullable")]
    pub(super) node: String,
    #[serde(rename = "CheckID", deserialize_with = "nullable")]
    pub(super) check_id: String,
    #[serde(rename = "Name", deserialize_with = "nullable")]
    pub(super) name: String,
    #[serde(rename = "Status", deserialize_with = "nullable")]
    pub(super) status: String,
    #[serde(rename = "Notes", deserialize_with = "nullable")]
    pub(super) notes: String,
    #[serde(rename = "Output", deserialize_with = "nullable")]
    pub(super) output: String,
    #[serde(rename = "ServiceID", deserialize_with = "nullable")]
    pub(super) service_id: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct DeregisterBody {
    #[serde(rename = "Node", deserialize_with = "nullable")]
    pub(super) node: String,
    #[serde(rename = "ServiceID", deserialize_with = "nullable")]
    pub(super) service_id: String,
    #[serde(rename = "CheckID", deserialize_with = "nullable")]
    pub(super) check_id: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct NodeBody {
    #[serde(rename = "ID", deserialize_with = "nullable")]
    pub(super) id: String,
    #[serde(rename = "Node", deserialize_with = "nullable")]
    pub(super) node: String,
    #[serde(rename = "Address", deserialize_with = "nullable")]
    pub(super) address: String,
    #[serde(rename = "TaggedAddresses", deserialize_with = "nullable")]
    pub(super) tagged_addresses: BTreeMap<String, String>,
    #[serde(rename = "Meta", deserialize_with = "nullable")]
    pub(super) meta: BTreeMap<String, String>,
}

pub(super) fn node_def(
    id: String,
    address: String,
    meta: BTreeMap<String, String>,
    tagged: BTreeMap<String, String>,
) -> NodeDef {
    NodeDef {
        id,
        address,
        meta,
        tagged_addresses: tagged,
    }
}

pub(super) fn service_def(b: ServiceBody) -> Result<ServiceDef, WriteError> {
    if b.service.is_empty() {
        return Err(WriteError(
            "Must provide service name (Service.Service)".into(),
        ));
    }
    Ok(ServiceDef {
        id: if b.id.is_empty() {
            b.service.clone()
        } else {
            b.id
        },
        service: b.service,
        kind: b.kind,
        tags: b.tags,
        address: b.address,
        port: b.port,
        meta: b.meta,
        proxy: b.proxy.filter(|p| !p.is_null()),
        connect_native: b
            .connect
            .as_ref()
            .and_then(|c| c.get("Native"))
            .and_then(Value::as_bool)
            .unwrap_or(false),
    })
}

pub(super) fn check_def(b: CheckBody) -> Result<CheckDef, WriteError> {
    let check_id = if b.check_id.is_empty() {
        b.name.clone()
    } else {
        b.check_id
    };
    if check_id.is_empty() {
        return Err(WriteError("Must provide a check ID or name".into()));
    }
    Ok(CheckDef {
        check_id,
        name: b.name,
        status: b.status,
        notes: b.notes,
        output: b.output,
        service_id: b.service_id,
        service_name: String::new(),
    })
}

// ---------------------------------------------------------------- catalog

pub(super) fn catalog_register(state: &ConsulState, body: &[u8]) -> Response<Body> {
    let b: RegisterBody = match decode(body) {
        Ok(b) => b,
        Err(r) => return r.into(),
    };
    if b.node.is_empty() {
        return server_error("Must provide node");
    }
    if b.address.is_empty() && !b.skip_node_update {
        return server_error("Must provide address if SkipNodeUpdate is not set");
    }
    let service = match b.service.map(service_def).transpose() {
        Ok(s) => s,
        Err(e) => return e.into(),
    };
    let mut checks = Vec::new();
    for c in b.check.into_iter().chain(b.checks) {
        if !c.node.is_empty() && c.node != b.node {
            return server_error("Check node must match the registration node");
        }
        match check_def(c) {
            // Gossip health of a node that is no gossip member: accepted, never stored.
            Ok(c) if c.check_id == SERF_HEALTH => {}
            Ok(c) => checks.push(c),
            Err(e) => return e.into(),
        }
    }

    let mut store = state.store();
    let node_exists = store.nodes.contains_key(&b.node);
    let write_node = !(b.skip_node_update && node_exists);
    if !write_node && b.address.is_empty() && !node_exists {
        return WriteError::missing_node().into();
    }
    for c in &checks {
        let own = service.as_ref().is_some_and(|s| s.id == c.service_id);
        let known = store
            .nodes
            .get(&b.node)
            .is_some_and(|n| n.services.contains_key(&c.service_id));
        if !c.service_id.is_empty() && !own && !known {
            return server_error("Missing service registration");
        }
    }
    if write_node && !store.room_for_node(&b.node) {
        return server_error(CATALOG_FULL);
    }
    let idx = store.next_index();
    let mut t = Touched::default();
    if write_node {
        let def = node_def(b.id, b.address, b.node_meta, b.tagged_addresses);
        store.ensure_node(&b.node, def, idx, &mut t);
    }
    let applied = service
        .into_iter()
        .try_for_each(|s| store.ensure_service(&b.node, s, idx, &mut t))
        .and_then(|()| {
            checks
                .into_iter()
                .try_for_each(|c| store.ensure_check(&b.node, c, idx, &mut t))
        });
    store.commit(idx, t);
    drop(store);
    match applied {
        Ok(()) => {
            let c = &state.inner.counters;
            c.bump(&c.registrations);
            ok_true()
        }
        Err(e) => e.into(),
    }
}

pub(super) fn catalog_deregister(state: &ConsulState, body: &[u8]) -> Response<Body> {
    let b: DeregisterBody = match decode(body) {
        Ok(b) => b,
        Err(r) => return r.into(),
    };
    if b.node.is_empty() {
        return server_error("Must provide node");
    }
    let mut store = state.store();
    let idx = store.next_index();
    let mut t = Touched::default();
    let mut node_removed = false;
    if !b.service_id.is_empty() {
        store.delete_service(&b.node, &b.service_id, &mut t);
    }
    if !b.check_id.is_empty() {
        store.delete_check(&b.node, &b.check_id, &mut t);
    }
    if b.service_id.is_empty() && b.check_id.is_empty() {
        node_removed = store.delete_node(&b.node, &mut t);
    }
    store.commit(idx, t);
    if node_removed {
        // A node's sessions die with it.
        state.sessions().remove_node(&b.node);
    }
    drop(store);
    let c = &state.inner.counters;
    c.bump(&c.deregistrations);
    ok_true()
}

pub(super) fn health_service(
    state: &ConsulState,
    name: &str,
    passing_only: bool,
) -> Response<Body> {
    let (index, body) = result(state, name, passing_only, Encoding::Json);
    with_index(json_bytes(StatusCode::OK, body), index)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_body_accepts_go_nulls() {
        let b: RegisterBody = serde_json::from_str(
            r#"{"Node":"n","Address":"a","NodeMeta":null,"Service":{"Service":"web","Tags":null,"Proxy":null},"Checks":null}"#,
        )
        .unwrap();
        assert_eq!(b.node, "n");
        let s = service_def(b.service.unwrap()).unwrap();
        assert_eq!(s.id, "web");
        assert!(s.proxy.is_none());
    }
}
