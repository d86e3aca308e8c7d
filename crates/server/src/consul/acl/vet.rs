//! What each catalog, session and txn write needs of a token, checked in
//! the order Consul 1.20's endpoints check it (`servicePreApply`, then
//! `vetRegisterWithACL`; `vetDeregisterWithACL`; `Session.Apply`; the
//! txn's `preCheck`), for both doors: the HTTP API and the RPC port
//! decode the same bodies (`consul::writes`) and vet them here before the
//! write.
//!
//! What it is not: no filtering of reads (the endpoints filter), no
//! writes.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{Access, AclError, Authz, Denied, Resource};
use crate::consul::ConsulState;
use crate::consul::writes::{DeregisterBody, RegisterBody, ServiceBody};

/// `servicePreApply`: write on the service, and on a proxy's destination.
fn service_pre_apply(authz: &Authz, s: &ServiceBody) -> Result<(), Denied> {
    if s.service != "consul" {
        authz.check(Resource::Service, Access::Write, &s.service)?;
    }
    if s.kind == "connect-proxy" {
        let dest = s
            .proxy
            .as_ref()
            .and_then(|p| p.get("DestinationServiceName"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        authz.check(Resource::Service, Access::Write, dest)?;
    }
    Ok(())
}

/// What the catalog holds of a node, as a register compares it.
struct Existing {
    id: String,
    address: String,
    meta: BTreeMap<String, String>,
    tagged: BTreeMap<String, String>,
    /// Service ID → name.
    services: BTreeMap<String, String>,
}

fn existing(state: &ConsulState, node: &str) -> Option<Existing> {
    let store = state.store();
    let n = store.nodes.get(node)?;
    Some(Existing {
        id: n.def.id.clone(),
        address: n.def.address.clone(),
        meta: n.def.meta.clone(),
        tagged: n.def.tagged_addresses.clone(),
        services: n
            .services
            .iter()
            .map(|(id, s)| (id.clone(), s.def.service.clone()))
            .collect(),
    })
}

/// Consul's `ChangesNode`: whether a register rewrites the node's part.
fn changes_node(b: &RegisterBody, n: Option<&Existing>) -> bool {
    let Some(n) = n else { return true };
    if b.skip_node_update {
        return false;
    }
    b.id != n.id
        || b.address != n.address
        || b.node_meta != n.meta
        || b.tagged_addresses != n.tagged
}

/// `Catalog.Register` (and `PUT /v1/catalog/register`).
pub(crate) fn register(state: &ConsulState, authz: &Authz, b: &RegisterBody) -> Result<(), Denied> {
    if authz.is_all() {
        return Ok(());
    }
    if let Some(s) = &b.service {
        service_pre_apply(authz, s)?;
    }
    let n = existing(state, &b.node);
    if changes_node(b, n.as_ref()) {
        authz.check(Resource::Node, Access::Write, &b.node)?;
    }
    let service_id = b.service.as_ref().map(|s| {
        if s.id.is_empty() {
            s.service.as_str()
        } else {
            s.id.as_str()
        }
    });
    if let Some(s) = &b.service {
        authz.check(Resource::Service, Access::Write, &s.service)?;
        // Overwriting another service of that ID takes write on it too.
        if let Some(other) = n
            .as_ref()
            .and_then(|n| n.services.get(service_id.unwrap_or_default()))
        {
            authz.check(Resource::Service, Access::Write, other)?;
        }
    }
    for c in b.check.iter().chain(&b.checks) {
        if c.service_id.is_empty() {
            authz.check(Resource::Node, Access::Write, &b.node)?;
        } else if Some(c.service_id.as_str()) != service_id {
            // A check of another service of the node (an unknown one is
            // the write's to refuse).
            if let Some(other) = n.as_ref().and_then(|n| n.services.get(&c.service_id)) {
                authz.check(Resource::Service, Access::Write, other)?;
            }
        }
    }
    Ok(())
}

/// `Catalog.Deregister` (and `PUT /v1/catalog/deregister`): node write
/// allows all; else write on the service (or the check's service).
pub(crate) fn deregister(
    state: &ConsulState,
    authz: &Authz,
    b: &DeregisterBody,
) -> Result<(), AclError> {
    let node_write = authz.check(Resource::Node, Access::Write, &b.node);
    if node_write.is_ok() {
        return Ok(());
    }
    let store = state.store();
    let n = store.nodes.get(&b.node);
    if !b.service_id.is_empty() {
        let s = n.and_then(|n| n.services.get(&b.service_id));
        let Some(s) = s else {
            return Err(AclError::UnknownServiceId(b.service_id.clone()));
        };
        authz.check(Resource::Service, Access::Write, &s.def.service)?;
        return Ok(());
    }
    if !b.check_id.is_empty() {
        let c = n.and_then(|n| n.checks.get(&b.check_id));
        let Some(c) = c else {
            return Err(AclError::UnknownCheckId(b.check_id.clone()));
        };
        if !c.def.service_id.is_empty() {
            authz.check(Resource::Service, Access::Write, &c.def.service_name)?;
            return Ok(());
        }
    }
    node_write.map_err(AclError::from)
}

/// `Session.Apply` create (`node`: the session's, the server's own when
/// the body names none).
pub(crate) fn session_create(state: &ConsulState, authz: &Authz, node: &str) -> Result<(), Denied> {
    let node = if node.is_empty() {
        state.inner.cfg.node_name.as_str()
    } else {
        node
    };
    authz.check(Resource::Session, Access::Write, node)
}

/// `Session.Apply` destroy and `Session.Renew`: write on the session's
/// node (a session that does not exist needs nothing).
pub(crate) fn session_of(state: &ConsulState, authz: &Authz, id: &str) -> Result<(), Denied> {
    if authz.is_all() {
        return Ok(());
    }
    let node = state.sessions().get(id).map(|s| s.node.clone());
    match node {
        Some(node) => authz.check(Resource::Session, Access::Write, &node),
        None => Ok(()),
    }
}

/// What a KV verb needs of its key (Consul's `kvsPreApply`): `None` for
/// reads that are filtered on the way out, and for verbs it does not know
/// (the op's own error).
pub(crate) fn kv_op(authz: &Authz, verb: &str, key: &str) -> Result<(), Denied> {
    match verb {
        "delete-tree" => authz.check_key_write_prefix(key),
        "check-session" | "check-index" => authz.check(Resource::Key, Access::Read, key),
        "check-not-exists" | "unlock" | "lock" | "cas" | "delete-cas" | "delete" | "set" => {
            authz.check(Resource::Key, Access::Write, key)
        }
        _ => Ok(()),
    }
}

/// A txn's KV op: as [`kv_op`], and a `get`/`get-tree` needs `key:read`
/// (Consul filters what a txn's gets read; here such a get is that op's
/// error, so nothing unreadable is answered).
pub(crate) fn txn_kv_op(authz: &Authz, verb: &str, key: &str) -> Result<(), Denied> {
    match verb {
        "get" | "get-tree" => authz.check(Resource::Key, Access::Read, key),
        _ => kv_op(authz, verb, key),
    }
}

/// A catalog op of a txn: its kind (`Node`, `Service`, `Check`) and body.
fn txn_catalog_op(authz: &Authz, kind: &str, op: &Value) -> Result<(), Denied> {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    // A get reads (Consul filters its results; here it is the op's error).
    let need = match op["Verb"].as_str() {
        Some("get") | None => Access::Read,
        Some(_) => Access::Write,
    };
    match kind {
        "Node" => authz.check(Resource::Node, need, &s(&op["Node"]["Node"])),
        "Service" if need == Access::Read => {
            authz.check(Resource::Service, need, &s(&op["Service"]["Service"]))
        }
        "Service" => {
            let body: ServiceBody =
                serde_json::from_value(op["Service"].clone()).unwrap_or_default();
            service_pre_apply(authz, &body)
        }
        _ => {
            let c = &op["Check"];
            if need == Access::Read || s(&c["ServiceID"]).is_empty() {
                authz.check(Resource::Node, need, &s(&c["Node"]))
            } else {
                authz.check(Resource::Service, need, &s(&c["ServiceName"]))
            }
        }
    }
}

/// A `/v1/txn` body's ops vetted as Consul's `preCheck` vets them: each
/// denied op's index and denial.
pub(crate) fn txn_ops(authz: &Authz, ops: &[Value]) -> Vec<(usize, Denied)> {
    if authz.is_all() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let r = if let Some(kv) = op.get("KV") {
            let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
            txn_kv_op(authz, &s(&kv["Verb"]), &s(&kv["Key"]))
        } else if let Some((kind, body)) = ["Node", "Service", "Check"]
            .into_iter()
            .find_map(|k| op.get(k).map(|b| (k, b)))
        {
            txn_catalog_op(authz, kind, body)
        } else {
            Ok(())
        };
        if let Err(d) = r {
            out.push((i, d));
        }
    }
    out
}

/// A config entry write or delete (Consul's `CanWrite`): a service's
/// entries need write on the service, its intentions `intentions:write`,
/// the mesh-wide kinds `mesh:write`.
pub(crate) fn config_entry(authz: &Authz, kind: &str, name: &str) -> Result<(), Denied> {
    match kind.to_ascii_lowercase().as_str() {
        "service-defaults" | "service-resolver" | "service-router" | "service-splitter" => {
            authz.check(Resource::Service, Access::Write, name)
        }
        "service-intentions" => authz.check(Resource::Intentions, Access::Write, name),
        _ => authz.check_unnamed(Resource::Mesh, Access::Write),
    }
}
