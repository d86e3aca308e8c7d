//! Catalog endpoints: register, deregister, and the health of a service;
//! the request bodies and the JSON of nodes, services and checks.

use super::*;

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

// ---------------------------------------------------------------- JSON views

pub(super) fn node_json(store: &Store, name: &str, n: &NodeEntry) -> Value {
    json!({
        "ID": n.def.id,
        "Node": name,
        "Address": n.def.address,
        "Datacenter": store.datacenter,
        "TaggedAddresses": if n.def.tagged_addresses.is_empty() { Value::Null } else { json!(n.def.tagged_addresses) },
        "Meta": n.def.meta,
        "CreateIndex": n.create_index,
        "ModifyIndex": n.modify_index,
    })
}

pub(super) fn service_json(s: &ServiceEntry) -> Value {
    json!({
        "Kind": s.def.kind,
        "ID": s.def.id,
        "Service": s.def.service,
        "Tags": s.def.tags,
        "Address": s.def.address,
        "Meta": s.def.meta,
        "Port": s.def.port,
        "Proxy": s.def.proxy.clone().unwrap_or_else(|| json!({})),
        "CreateIndex": s.create_index,
        "ModifyIndex": s.modify_index,
    })
}

pub(super) fn check_json(node: &str, c: &CheckEntry) -> Value {
    json!({
        "Node": node,
        "CheckID": c.def.check_id,
        "Name": c.def.name,
        "Status": c.def.status,
        "Notes": c.def.notes,
        "Output": c.def.output,
        "ServiceID": c.def.service_id,
        "ServiceName": c.def.service_name,
        "CreateIndex": c.create_index,
        "ModifyIndex": c.modify_index,
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
        return server_error(super::super::state::CATALOG_FULL);
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

/// The instances of service `name` with their node entries.
pub(super) fn instance_entries<'a>(
    store: &'a Store,
    name: &str,
) -> impl Iterator<
    Item = (
        &'a super::super::state::InstanceKey,
        &'a NodeEntry,
        &'a ServiceEntry,
    ),
> {
    store.instances(name).filter_map(|key| {
        let n = store.nodes.get(&key.0)?;
        Some((key, n, n.services.get(&key.1)?))
    })
}

pub(super) fn health_service(
    state: &ConsulState,
    name: &str,
    passing_only: bool,
) -> Response<Body> {
    use crate::consul::blocking::{Encoding, result};
    let (index, body) = result(state, name, passing_only, Encoding::Json);
    with_index(json_bytes(StatusCode::OK, body), index)
}

/// The `CheckServiceNode`s of service `name` (with `passing_only`, those
/// whose checks all pass), as `/v1/health/service` lists them.
pub(crate) fn health_entries(store: &Store, name: &str, passing_only: bool) -> Vec<Value> {
    let mut out = Vec::new();
    for (key, n, s) in instance_entries(store, name) {
        let checks: Vec<&CheckEntry> = n
            .checks
            .values()
            .filter(|c| c.def.service_id.is_empty() || c.def.service_id == key.1)
            .collect();
        if passing_only && checks.iter().any(|c| c.def.status != "passing") {
            continue;
        }
        out.push(json!({
            "Node": node_json(store, &key.0, n),
            "Service": service_json(s),
            "Checks": checks.iter().map(|c| check_json(&key.0, c)).collect::<Vec<_>>(),
        }));
    }
    out
}
