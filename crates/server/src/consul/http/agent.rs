//! `GET /v1/agent/members`: the LAN pool as this server sees it, itself
//! included, shaped as Consul 1.20 prints serf's members (`Name`, `Addr`,
//! `Port`, `Tags`, `Status`, protocol and delegate versions). With ACLs on,
//! an unknown token is `ACL not found`, and a token sees the members it
//! may read (`node:read`; the anonymous token none). `GET /v1/agent/metrics`: the KV
//! and txn apply summaries (`consul::timing`) and, in Prometheus text, the
//! gossip series of the serf port under a real server's names
//! (`consul::serf`'s exposition).

use hyper::{Response, StatusCode};

use super::{Body, acl_refused, json_response, text};
use crate::consul::acl::{Access, Resource};
use crate::consul::{ConsulState, SerfMember, lock};

/// `/v1/agent/metrics`: the KV and txn apply summaries and the serf port's
/// gossip series, in Prometheus text with `?format=prometheus`; else the
/// apply summaries as the JSON `Samples` (no gauges, points or counters:
/// the rest of a real server's metrics is not kept).
pub(super) fn agent_metrics(state: &ConsulState, query: &str) -> Response<Body> {
    let timings = lock(&state.inner.timings);
    if query.split('&').any(|kv| kv == "format=prometheus") {
        let mut exposition = timings.prometheus();
        drop(timings);
        state.serf().prometheus(&mut exposition);
        let mut r = text(StatusCode::OK, exposition);
        r.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        );
        return r;
    }
    let body = serde_json::json!({
        "Timestamp": "",
        "Gauges": [],
        "Points": [],
        "Counters": [],
        "Samples": timings.samples(),
    });
    json_response(StatusCode::OK, &body)
}

/// The members the token may read (`node:read` on each), sorted by name.
pub(super) fn agent_members(state: &ConsulState, token: &str) -> Response<Body> {
    match state.acl(token) {
        Ok(a) => {
            let mut members: Vec<SerfMember> = state.serf_members();
            members.retain(|m| a.allows(Resource::Node, Access::Read, &m.name));
            json_response(StatusCode::OK, &members)
        }
        Err(e) => acl_refused(&e),
    }
}
