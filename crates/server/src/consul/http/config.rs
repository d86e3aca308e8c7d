//! Config entry endpoints (service-intentions): set, get, delete.

use hyper::{Response, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Body, json_response, ok_true, server_error, text, with_index};
use crate::consul::ConsulState;
use crate::consul::write_error::CATALOG_FULL;
use crate::consul::writes::nullable;

#[derive(Deserialize)]
pub(super) struct SourceBody {
    #[serde(rename = "Name", default, deserialize_with = "nullable")]
    pub(super) name: String,
    #[serde(rename = "Action", default, deserialize_with = "nullable")]
    pub(super) action: String,
    #[serde(rename = "Description", default, deserialize_with = "nullable")]
    pub(super) description: String,
}

/// The `cas` query value: `Some(index)` for a check-and-set write.
fn cas_of(query: &str) -> Result<Option<u64>, Box<Response<Body>>> {
    match query.split('&').find_map(|kv| kv.strip_prefix("cas=")) {
        None => Ok(None),
        Some(v) => v.parse().map(Some).map_err(|e: std::num::ParseIntError| {
            Box::new(server_error(format!(
                "strconv.ParseUint: parsing {v:?}: {e}"
            )))
        }),
    }
}

/// `PUT /v1/config[?cas=N]`: `true`, or `false` when a check-and-set
/// finds the entry changed (`cas=0`: it exists already).
pub(super) fn config_put(state: &ConsulState, body: &[u8], query: &str) -> Response<Body> {
    let cas = match cas_of(query) {
        Ok(c) => c,
        Err(r) => return *r,
    };
    let v: Value = match serde_json::from_slice(body) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => {
            return text(
                StatusCode::BAD_REQUEST,
                "Request decoding failed: not an object",
            );
        }
        Err(e) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("Request decoding failed: {e}"),
            );
        }
    };
    let field = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    let (kind, name) = (field("Kind").to_ascii_lowercase(), field("Name"));
    if kind.is_empty() {
        return text(
            StatusCode::BAD_REQUEST,
            "Request decoding failed: Kind is required",
        );
    }
    if name.is_empty() {
        return server_error("Name is required");
    }
    let sources = if kind == "service-intentions" {
        let raw = v.get("Sources").cloned().unwrap_or(Value::Null);
        let raw: Vec<SourceBody> = match serde_json::from_value(raw) {
            Ok(s) => s,
            Err(_) if v.get("Sources").is_none_or(Value::is_null) => Vec::new(),
            Err(e) => {
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("Request decoding failed: {e}"),
                );
            }
        };
        let mut sources = Vec::with_capacity(raw.len());
        for (i, s) in raw.into_iter().enumerate() {
            let allow = match s.action.to_ascii_lowercase().as_str() {
                "allow" => true,
                "deny" => false,
                _ => {
                    return server_error(format!(
                        "Sources[{i}].Action must be set to 'allow' or 'deny'"
                    ));
                }
            };
            sources.push((s.name, allow, s.description));
        }
        Some(sources)
    } else {
        None
    };
    let mut store = state.store();
    if let Some(cas) = cas {
        let current = store
            .config
            .get(&(kind.clone(), name.clone()))
            .map(|e| e.modify_index);
        if current.unwrap_or(0) != cas {
            return json_response(StatusCode::OK, &false);
        }
    }
    if !store.room_for_config(&kind, &name) {
        return server_error(CATALOG_FULL);
    }
    let idx = store.next_index();
    store.put_config(&kind, &name, v, sources, idx);
    drop(store);
    let c = &state.inner.counters;
    c.bump(&c.config_entries_written);
    ok_true()
}

/// `DELETE /v1/config/:kind/:name[?cas=N]`: `{}`; with `cas`, whether it
/// was deleted (`false` when the entry changed since index `N`).
pub(super) fn config_delete(
    state: &ConsulState,
    kind: &str,
    name: &str,
    query: &str,
) -> Response<Body> {
    let cas = match cas_of(query) {
        Ok(c) => c,
        Err(r) => return *r,
    };
    let kind = kind.to_ascii_lowercase();
    let mut store = state.store();
    if let Some(cas) = cas {
        let current = store
            .config
            .get(&(kind.clone(), name.to_owned()))
            .map(|e| e.modify_index);
        if current != Some(cas) {
            return json_response(StatusCode::OK, &false);
        }
    }
    let idx = store.next_index();
    store.delete_config(&kind, name, idx);
    drop(store);
    let c = &state.inner.counters;
    c.bump(&c.config_entries_written);
    match cas {
        Some(_) => json_response(StatusCode::OK, &true),
        None => json_response(StatusCode::OK, &json!({})),
    }
}

pub(super) fn config_get(state: &ConsulState, kind: &str, name: &str) -> Response<Body> {
    let store = state.store();
    let kind = kind.to_ascii_lowercase();
    match store.config.get(&(kind.clone(), name.to_owned())) {
        Some(e) => {
            let mut body = e.body.clone();
            if let Value::Object(m) = &mut body {
                m.insert("CreateIndex".into(), e.create_index.into());
                m.insert("ModifyIndex".into(), e.modify_index.into());
            }
            with_index(json_response(StatusCode::OK, &body), e.modify_index)
        }
        None => text(
            StatusCode::NOT_FOUND,
            format!("Config entry not found for {kind:?} / {name:?}"),
        ),
    }
}
