//! The catalog as Consul 1.20 prints it in JSON: pretty-printed bytes
//! ([`pretty`], the `-dev` agent's layout), the views of nodes, services
//! and checks, and the `CheckServiceNode`s of a service
//! ([`health_entries`]).
//!
//! Below both users: the HTTP API (`http`) answers with these views, and
//! the blocking queries (`blocking`) encode [`health_entries`] once per
//! change for every watcher. Pure: no locks taken here, no sockets.

use serde::Serialize;
use serde_json::{Value, json};

use super::state::{CheckEntry, InstanceKey, NodeEntry, ServiceEntry, Store};

/// `v` as the dev agent prints it: 4-space indent, no trailing newline.
pub(crate) fn pretty<T: Serialize + ?Sized>(v: &T) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    let fmt = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
    v.serialize(&mut ser).expect("JSON values serialize");
    out
}

/// A node as `/v1/catalog/node` and the health endpoints print it.
pub(crate) fn node_json(store: &Store, name: &str, n: &NodeEntry) -> Value {
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

/// A service instance (`AgentService`-shaped, as the catalog prints it).
pub(crate) fn service_json(s: &ServiceEntry) -> Value {
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

/// A check of `node`.
pub(crate) fn check_json(node: &str, c: &CheckEntry) -> Value {
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

/// The instances of service `name` with their node entries.
pub(crate) fn instance_entries<'a>(
    store: &'a Store,
    name: &str,
) -> impl Iterator<Item = (&'a InstanceKey, &'a NodeEntry, &'a ServiceEntry)> {
    store.instances(name).filter_map(|key| {
        let n = store.nodes.get(&key.0)?;
        Some((key, n, n.services.get(&key.1)?))
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pretty_json_matches_the_dev_agent_layout() {
        let body = pretty(&json!({"ID": "003f28ee-cd88-2631-0c91-50469e4ac804"}));
        assert_eq!(
            String::from_utf8(body).unwrap(),
            "{\n    \"ID\": \"003f28ee-cd88-2631-0c91-50469e4ac804\"\n}"
        );
        assert_eq!(pretty(&true), b"true");
    }
}
