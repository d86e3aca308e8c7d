//! `GET /v1/agent/members`: the LAN pool as this server sees it, itself
//! included, shaped as Consul 1.20 prints serf's members (`Name`, `Addr`,
//! `Port`, `Tags`, `Status`, protocol and delegate versions). With ACLs on,
//! an unknown token is `ACL not found`, and no token sees no member (the
//! anonymous token may not read nodes).

use hyper::{Response, StatusCode};

use super::{Body, json_response, text};
use crate::consul::{ConsulState, SerfMember};

/// The members, sorted by name.
pub(super) fn agent_members(state: &ConsulState, token: &str) -> Response<Body> {
    match state.acl_check(token) {
        Ok(()) => json_response(StatusCode::OK, &state.serf_members()),
        Err(None) => json_response(StatusCode::OK, &Vec::<SerfMember>::new()),
        Err(Some(())) => text(StatusCode::FORBIDDEN, "ACL not found"),
    }
}
