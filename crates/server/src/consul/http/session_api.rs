//! Session endpoints: create, renew, destroy.

use std::time::Duration;

use hyper::{Response, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::{Body, decode, json_response, nullable, ok_true, server_error, text};
use crate::consul::sessions::{self, Renewal, Session};
use crate::consul::state::{CATALOG_FULL, SERF_HEALTH, WriteError};
use crate::consul::{ConsulState, lock};

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct SessionBody {
    #[serde(rename = "Node", deserialize_with = "nullable")]
    pub(super) node: String,
    #[serde(rename = "Name", deserialize_with = "nullable")]
    pub(super) name: String,
    #[serde(rename = "TTL", deserialize_with = "nullable")]
    pub(super) ttl: String,
    #[serde(rename = "Behavior", deserialize_with = "nullable")]
    pub(super) behavior: String,
    #[serde(rename = "LockDelay")]
    pub(super) lock_delay: Option<Value>,
    #[serde(rename = "NodeChecks")]
    pub(super) node_checks: Option<Vec<String>>,
    #[serde(rename = "Checks")]
    pub(super) checks: Option<Vec<String>>,
    #[serde(rename = "ServiceChecks")]
    pub(super) service_checks: Option<Value>,
}

/// `LockDelay` as Consul reads it: nanoseconds or a duration string, values
/// under 1000 taken as seconds.
pub(super) fn lock_delay(v: Option<&Value>) -> Result<Duration, String> {
    let d = match v {
        None | Some(Value::Null) => return Ok(sessions::DEFAULT_LOCK_DELAY),
        Some(Value::String(s)) => sessions::parse_go_duration(s)?,
        Some(Value::Number(n)) => Duration::from_nanos(n.as_f64().unwrap_or(0.0).max(0.0) as u64),
        Some(other) => return Err(format!("invalid LockDelay {other}")),
    };
    Ok(if d.as_nanos() < 1000 {
        Duration::from_secs(d.as_nanos() as u64)
    } else {
        d
    })
}

pub(super) fn session_create(state: &ConsulState, body: &[u8]) -> Response<Body> {
    let b: SessionBody = match decode(body) {
        Ok(b) => b,
        Err(r) => return r.into(),
    };
    let cfg = &state.inner.cfg;
    let mut ttl_duration = None;
    if !b.ttl.is_empty() {
        let ttl = match sessions::parse_go_duration(&b.ttl) {
            Ok(d) => d,
            Err(e) => return server_error(format!("Session TTL '{}' invalid: {e}", b.ttl)),
        };
        if !ttl.is_zero() {
            if ttl < cfg.session_ttl_min || ttl > sessions::SESSION_TTL_MAX {
                return server_error(format!(
                    "Invalid Session TTL '{}', must be between [{}={}]",
                    ttl.as_nanos(),
                    sessions::format_go_duration(cfg.session_ttl_min),
                    sessions::format_go_duration(sessions::SESSION_TTL_MAX),
                ));
            }
            ttl_duration = Some(ttl);
        }
    }
    let behavior = match b.behavior.as_str() {
        "" => "release".to_owned(),
        "release" | "delete" => b.behavior.clone(),
        other => return server_error(format!("Invalid Behavior setting '{other}'")),
    };
    let lock_delay = match lock_delay(b.lock_delay.as_ref()) {
        Ok(d) => d,
        Err(e) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("Request decode failed: {e}"),
            );
        }
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
        return WriteError::missing_node().into();
    };
    if lock(&state.inner.sessions).len() >= sessions::MAX_SESSIONS {
        return server_error(CATALOG_FULL);
    }
    for id in node_checks.iter().chain(&service_check_ids) {
        match n.checks.get(id) {
            None => return server_error(format!("Missing check '{id}' registration")),
            Some(c) if c.def.status == "critical" => {
                return server_error(format!("Check '{id}' is in critical state"));
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
    json_response(StatusCode::OK, &json!({"ID": id}))
}

pub(super) fn session_renew(state: &ConsulState, id: &str) -> Response<Body> {
    let renewal = state.sessions().renew(id, Instant::now());
    match renewal {
        Renewal::Renewed(s) => {
            let c = &state.inner.counters;
            c.bump(&c.sessions_renewed);
            json_response(StatusCode::OK, &[*s])
        }
        Renewal::Expired | Renewal::NotFound => {
            if matches!(renewal, Renewal::Expired) {
                state.sessions_expired(1);
            }
            text(
                StatusCode::NOT_FOUND,
                format!("Session id '{id}' not found"),
            )
        }
    }
}

pub(super) fn session_destroy(state: &ConsulState, id: &str) -> Response<Body> {
    let mut store = state.store();
    store.next_index();
    state.sessions().remove(id);
    drop(store);
    ok_true()
}

#[cfg(test)]
mod tests {
    use super::*;

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
