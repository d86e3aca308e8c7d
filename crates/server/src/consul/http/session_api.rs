//! Session endpoints: create, renew, destroy (applied by `consul::writes`,
//! which the RPC port shares).

use hyper::{Response, StatusCode};
use serde_json::json;

use super::{Body, decode, json_response, ok_true, text};
use crate::consul::ConsulState;
use crate::consul::writes::{self, SessionBody, lock_delay};

pub(super) fn session_create(state: &ConsulState, body: &[u8]) -> Response<Body> {
    let b: SessionBody = match decode(body) {
        Ok(b) => b,
        Err(r) => return r.into(),
    };
    let delay = match lock_delay(b.lock_delay.as_ref()) {
        Ok(d) => d,
        Err(e) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("Request decode failed: {e}"),
            );
        }
    };
    match writes::create_session(state, b, delay) {
        Ok(id) => json_response(StatusCode::OK, &json!({"ID": id})),
        Err(e) => e.into(),
    }
}

pub(super) fn session_renew(state: &ConsulState, id: &str) -> Response<Body> {
    match writes::renew_session(state, id) {
        Some(s) => json_response(StatusCode::OK, &[s]),
        None => text(
            StatusCode::NOT_FOUND,
            format!("Session id '{id}' not found"),
        ),
    }
}

pub(super) fn session_destroy(state: &ConsulState, id: &str) -> Response<Body> {
    writes::destroy_session(state, id);
    ok_true()
}
