//! The catalog and session writes that both doors of the server share: the
//! HTTP API (JSON) and the agents' RPCs (msgpack) decode the same request
//! bodies (Consul's field names; Go's nulls read as empty) and apply them
//! here, refused in Consul 1.20's words.
//!
//! What it is not: no transport, no encoding of answers.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use tokio::time::Instant;

use super::sessions::{self, Renewal, Session};
use super::state::{CheckDef, NodeDef, SERF_HEALTH, ServiceDef, Store, Touched};
use super::write_error::WriteError;
use super::{ConsulState, kv, lock};

pub(crate) use super::fields::nullable;

#[derive(Deserialize, Default)]
#[serde(default)]
pub(crate) struct RegisterBody {
    #[serde(rename = "ID", deserialize_with = "nullable")]
    pub(crate) id: String,
    #[serde(rename = "Node", deserialize_with = "nullable")]
    pub(crate) node: String,
    #[serde(rename = "Address", deserialize_with = "nullable")]
    pub(crate) address: String,
    #[serde(rename = "TaggedAddresses", deserialize_with = "nullable")]
    pub(crate) tagged_addresses: BTreeMap<String, String>,
    #[serde(rename = "NodeMeta", deserialize_with = "nullable")]
    pub(crate) node_meta: BTreeMap<String, String>,
    #[serde(rename = "Service")]
    pub(crate) service: Option<ServiceBody>,
    #[serde(rename = "Check")]
    pub(crate) check: Option<CheckBody>,
    #[serde(rename = "Checks", deserialize_with = "nullable")]
    pub(crate) checks: Vec<CheckBody>,
    #[serde(rename = "SkipNodeUpdate", deserialize_with = "nullable")]
    pub(crate) skip_node_update: bool,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(crate) struct ServiceBody {
    #[serde(rename = "ID", deserialize_with = "nullable")]
    pub(crate) id: String,
    #[serde(rename = "Service", deserialize_with = "nullable")]
    pub(crate) service: String,
    #[serde(rename = "Kind", deserialize_with = "nullable")]
    pub(crate) kind: String,
    #[serde(rename = "Tags", deserialize_with = "nullable")]
    pub(crate) tags: Vec<String>,
    #[serde(rename = "Address", deserialize_with = "nullable")]
    pub(crate) address: String,
    #[serde(rename = "Port", deserialize_with = "nullable")]
    pub(crate) port: i32,
    #[serde(rename = "Meta", deserialize_with = "nullable")]
    pub(crate) meta: BTreeMap<String, String>,
    #[serde(rename = "Proxy")]
    pub(crate) proxy: Option<Value>,
    #[serde(rename = "Connect")]
    pub(crate) connect: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(crate) struct CheckBody {
    #[serde(rename = "Node", deserialize_with = "nullable")]
    pub(crate) node: String,
    #[serde(rename = "CheckID", deserialize_with = "nullable")]
    pub(crate) check_id: String,
    #[serde(rename = "Name", deserialize_with = "nullable")]
    pub(crate) name: String,
    #[serde(rename = "Status", deserialize_with = "nullable")]
    pub(crate) status: String,
    #[serde(rename = "Notes", deserialize_with = "nullable")]
    pub(crate) notes: String,
    #[serde(rename = "Output", deserialize_with = "nullable")]
    pub(crate) output: String,
    #[serde(rename = "ServiceID", deserialize_with = "nullable")]
    pub(crate) service_id: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(crate) struct DeregisterBody {
    #[serde(rename = "Node", deserialize_with = "nullable")]
    pub(crate) node: String,
    #[serde(rename = "ServiceID", deserialize_with = "nullable")]
    pub(crate) service_id: String,
    #[serde(rename = "CheckID", deserialize_with = "nullable")]
    pub(crate) check_id: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(crate) struct NodeBody {
    #[serde(rename = "ID", deserialize_with = "nullable")]
    pub(crate) id: String,
    #[serde(rename = "Node", deserialize_with = "nullable")]
    pub(crate) node: String,
    #[serde(rename = "Address", deserialize_with = "nullable")]
    pub(crate) address: String,
    #[serde(rename = "TaggedAddresses", deserialize_with = "nullable")]
    pub(crate) tagged_addresses: BTreeMap<String, String>,
    #[serde(rename = "Meta", deserialize_with = "nullable")]
    pub(crate) meta: BTreeMap<String, String>,
}

/// The first upstream of a proxy's `Upstreams` that repeats an earlier
/// one (same type, service, datacenter and peer), as Consul prints its key.
fn duplicate_upstream(proxy: &Value) -> Option<String> {
    let ups = proxy.get("Upstreams")?.as_array()?;
    let text = |u: &Value, k: &str| u.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    let mut seen = std::collections::BTreeSet::new();
    ups.iter().find_map(|u| {
        let kind = match text(u, "DestinationType").as_str() {
            "" => "service".to_owned(),
            t => t.to_owned(),
        };
        let key = (
            kind,
            text(u, "DestinationName"),
            text(u, "DestinationPeer"),
            text(u, "Datacenter"),
        );
        let printed = format!(
            "[type={:?}, name={:?}, partition=\"\", namespace=\"\", peer={:?}, datacenter={:?}]",
            key.0, key.1, key.2, key.3
        );
        (!seen.insert(key)).then_some(printed)
    })
}

pub(crate) fn node_def(
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

pub(crate) fn service_def(b: ServiceBody) -> Result<ServiceDef, WriteError> {
    if b.service.is_empty() {
        return Err(WriteError::NoServiceName);
    }
    if b.kind == "connect-proxy"
        && let Some(key) = b.proxy.as_ref().and_then(duplicate_upstream)
    {
        return Err(WriteError::DuplicateUpstream(key));
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

pub(crate) fn check_def(b: CheckBody) -> Result<CheckDef, WriteError> {
    let check_id = if b.check_id.is_empty() {
        b.name.clone()
    } else {
        b.check_id
    };
    if check_id.is_empty() {
        return Err(WriteError::NoCheckId);
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

/// `Catalog.Register` (`PUT /v1/catalog/register`): the node (unless
/// `SkipNodeUpdate` and it exists), the service, the checks, in one index.
pub(crate) fn register(state: &ConsulState, b: RegisterBody) -> Result<(), WriteError> {
    if b.node.is_empty() {
        return Err(WriteError::NoNode);
    }
    if b.address.is_empty() && !b.skip_node_update {
        return Err(WriteError::NoAddress);
    }
    let service = b.service.map(service_def).transpose()?;
    let mut checks = Vec::new();
    for c in b.check.into_iter().chain(b.checks) {
        if !c.node.is_empty() && c.node != b.node {
            return Err(WriteError::CheckNodeMismatch);
        }
        let c = check_def(c)?;
        // Gossip health of a node that is no gossip member: accepted, never stored.
        if c.check_id != SERF_HEALTH {
            checks.push(c);
        }
    }

    let mut store = state.store();
    let node_exists = store.nodes.contains_key(&b.node);
    let write_node = !(b.skip_node_update && node_exists);
    if !write_node && b.address.is_empty() && !node_exists {
        return Err(WriteError::MissingNode);
    }
    for c in &checks {
        let own = service.as_ref().is_some_and(|s| s.id == c.service_id);
        let known = store
            .nodes
            .get(&b.node)
            .is_some_and(|n| n.services.contains_key(&c.service_id));
        if !c.service_id.is_empty() && !own && !known {
            return Err(WriteError::MissingService);
        }
    }
    if write_node && !store.room_for_node(&b.node) {
        return Err(WriteError::Full);
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
    applied?;
    let c = &state.inner.counters;
    c.bump(&c.registrations);
    Ok(())
}

/// `Catalog.Deregister` (`PUT /v1/catalog/deregister`): a service, a check,
/// or (neither named) the whole node with its sessions.
pub(crate) fn deregister(state: &ConsulState, b: DeregisterBody) -> Result<(), WriteError> {
    if b.node.is_empty() {
        return Err(WriteError::NoNode);
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
        // A node's sessions die with it, and their locks.
        let gone = state.sessions().remove_node(&b.node);
        state.sessions_gone(&mut store, &gone, Some(idx));
    }
    drop(store);
    let c = &state.inner.counters;
    c.bump(&c.deregistrations);
    Ok(())
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(crate) struct SessionBody {
    #[serde(rename = "Node", deserialize_with = "nullable")]
    pub(crate) node: String,
    #[serde(rename = "Name", deserialize_with = "nullable")]
    pub(crate) name: String,
    #[serde(rename = "TTL", deserialize_with = "nullable")]
    pub(crate) ttl: String,
    #[serde(rename = "Behavior", deserialize_with = "nullable")]
    pub(crate) behavior: String,
    #[serde(rename = "LockDelay")]
    pub(crate) lock_delay: Option<Value>,
    #[serde(rename = "NodeChecks")]
    pub(crate) node_checks: Option<Vec<String>>,
    #[serde(rename = "Checks")]
    pub(crate) checks: Option<Vec<String>>,
    #[serde(rename = "ServiceChecks")]
    pub(crate) service_checks: Option<Value>,
}

/// Why a `LockDelay` could not be read, in the words Consul answers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum LockDelayError {
    /// A string that is no Go duration.
    #[error(transparent)]
    Duration(#[from] sessions::DurationError),
    /// Neither a number nor a string (the JSON value as sent).
    #[error("invalid LockDelay {0}")]
    NotDuration(Value),
}

/// `LockDelay` as Consul reads it: nanoseconds or a duration string, values
/// under 1000 taken as seconds.
pub(crate) fn lock_delay(v: Option<&Value>) -> Result<Duration, LockDelayError> {
    let d = match v {
        None | Some(Value::Null) => return Ok(sessions::DEFAULT_LOCK_DELAY),
        Some(Value::String(s)) => sessions::parse_go_duration(s)?,
        Some(Value::Number(n)) => Duration::from_nanos(n.as_f64().unwrap_or(0.0).max(0.0) as u64),
        Some(other) => return Err(LockDelayError::NotDuration(other.clone())),
    };
    Ok(if d.as_nanos() < 1000 {
        Duration::from_secs(d.as_nanos() as u64)
    } else {
        d
    })
}

/// `Session.Apply` create (`PUT /v1/session/create`): the new session's ID.
/// `lock_delay` as the caller read it (the API's units differ by door).
pub(crate) fn create_session(
    state: &ConsulState,
    b: SessionBody,
    lock_delay: Duration,
) -> Result<String, WriteError> {
    let cfg = &state.inner.cfg;
    let mut ttl_duration = None;
    if !b.ttl.is_empty() {
        let ttl = match sessions::parse_go_duration(&b.ttl) {
            Ok(d) => d,
            Err(source) => {
                return Err(WriteError::BadTtl {
                    ttl: b.ttl.clone(),
                    source,
                });
            }
        };
        if !ttl.is_zero() {
            if ttl < cfg.session_ttl_min || ttl > sessions::SESSION_TTL_MAX {
                return Err(WriteError::TtlRange {
                    nanos: ttl.as_nanos(),
                    min: sessions::format_go_duration(cfg.session_ttl_min),
                    max: sessions::format_go_duration(sessions::SESSION_TTL_MAX),
                });
            }
            ttl_duration = Some(ttl);
        }
    }
    let behavior = match b.behavior.as_str() {
        "" => "release".to_owned(),
        "release" | "delete" => b.behavior.clone(),
        other => return Err(WriteError::BadBehavior(other.to_owned())),
    };
    let node = if b.node.is_empty() {
        cfg.node_name.clone()
    } else {
        b.node
    };
    let node_checks = b
        .node_checks
        .or(b.checks)
        .unwrap_or_else(|| vec![SERF_HEALTH.to_owned()]);
    let service_check_ids: Vec<String> = match &b.service_checks {
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|i| i.get("ID").and_then(Value::as_str).map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    };

    let mut store = state.store();
    let Some(n) = store.nodes.get(&node) else {
        return Err(WriteError::MissingNode);
    };
    if lock(&state.inner.sessions).len() >= sessions::MAX_SESSIONS {
        return Err(WriteError::Full);
    }
    for id in node_checks.iter().chain(&service_check_ids) {
        match n.checks.get(id) {
            None => return Err(WriteError::MissingCheck(id.clone())),
            Some(c) if c.def.status == "critical" => {
                return Err(WriteError::CriticalCheck(id.clone()));
            }
            Some(_) => {}
        }
    }
    let idx = store.next_index();
    let mut session = Session {
        id: sessions::uuid(),
        name: b.name,
        node,
        lock_delay: lock_delay.as_nanos() as u64,
        behavior,
        ttl: b.ttl,
        node_checks: Some(node_checks),
        service_checks: b.service_checks.filter(|v| !v.is_null()),
        create_index: idx,
        modify_index: idx,
        ttl_duration,
        deadline: None,
    };
    session.touch(Instant::now());
    let id = session.id.clone();
    lock(&state.inner.sessions).insert(session);
    drop(store);
    let c = &state.inner.counters;
    c.bump(&c.sessions_created);
    Ok(id)
}

/// `Session.Renew`: the session renewed, or `None` when it expired or never
/// existed (an expiry found here is counted).
pub(crate) fn renew_session(state: &ConsulState, id: &str) -> Option<Session> {
    match state.sessions().renew(id, Instant::now()) {
        Renewal::Renewed(s) => {
            let c = &state.inner.counters;
            c.bump(&c.sessions_renewed);
            Some(*s)
        }
        Renewal::Expired(s) => {
            state.sessions_expired(vec![*s]);
            None
        }
        Renewal::NotFound => None,
    }
}

/// `Session.Apply` destroy: the session is gone (it may never have been),
/// its locks released or its keys deleted at the destroy's index.
pub(crate) fn destroy_session(state: &ConsulState, id: &str) {
    let mut store = state.store();
    let gone = state.sessions().remove(id);
    match gone {
        Some(s) => state.sessions_gone(&mut store, &[s], None),
        None => {
            store.next_index();
        }
    }
}

impl ConsulState {
    /// Invalidates sessions already removed from the session table, their
    /// keys released or deleted (`kv::invalidate`), KV readers woken: at
    /// `idx` (the write that removed them, a node's deregistration), or at
    /// a raft index of each one's own (a destroy, an expiry).
    pub(crate) fn sessions_gone(&self, store: &mut Store, gone: &[Session], idx: Option<u64>) {
        let now = Instant::now();
        for s in gone {
            let at = idx.unwrap_or_else(|| store.next_index());
            kv::invalidate(&mut store.kv, at, s, now);
        }
        store.kv.notify();
    }

    /// Counts expired sessions, already out of the session table; each
    /// expiry is a raft write that releases (or deletes) the keys the
    /// session held.
    pub(crate) fn sessions_expired(&self, gone: Vec<Session>) {
        if gone.is_empty() {
            return;
        }
        let c = &self.inner.counters;
        c.sessions_expired
            .fetch_add(gone.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let mut store = self.store();
        self.sessions_gone(&mut store, &gone, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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

    #[test]
    fn a_proxy_naming_one_upstream_twice_is_refused_in_consuls_words() {
        let proxy = |ups: Value| ServiceBody {
            service: "web-sidecar-proxy".into(),
            kind: "connect-proxy".into(),
            proxy: Some(json!({"DestinationServiceName": "web", "Upstreams": ups})),
            ..Default::default()
        };
        let twice = json!([
            {"DestinationName": "db", "LocalBindPort": 9191},
            {"DestinationName": "api", "LocalBindPort": 9192},
            {"DestinationName": "db", "LocalBindPort": 9193}
        ]);
        let e = service_def(proxy(twice)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "1 error occurred:\n\t* upstreams cannot contain duplicates of [type=\"service\", \
             name=\"db\", partition=\"\", namespace=\"\", peer=\"\", datacenter=\"\"]\n\n"
        );
        // Another datacenter's service of that name is another upstream.
        let apart = json!([
            {"DestinationName": "db", "LocalBindPort": 9191},
            {"DestinationName": "db", "Datacenter": "dc2", "LocalBindPort": 9192}
        ]);
        assert!(service_def(proxy(apart)).is_ok());
    }

    #[test]
    fn lock_delay_units() {
        assert_eq!(lock_delay(None), Ok(Duration::from_secs(15)));
        assert_eq!(lock_delay(Some(&json!(5))), Ok(Duration::from_secs(5)));
        assert_eq!(lock_delay(Some(&json!("15s"))), Ok(Duration::from_secs(15)));
        assert_eq!(
            lock_delay(Some(&json!(15_000_000_000u64))),
            Ok(Duration::from_secs(15))
        );
    }
}
