//! Catalog endpoints: register, deregister (applied by `consul::writes`,
//! which the RPC port shares), and the health of a service.

use hyper::{Response, StatusCode};

use super::{Body, decode, json_bytes, ok_true, with_index};
use crate::consul::ConsulState;
use crate::consul::blocking::{Encoding, result};
use crate::consul::writes::{self, DeregisterBody, RegisterBody};

// ---------------------------------------------------------------- catalog

pub(super) fn catalog_register(state: &ConsulState, body: &[u8]) -> Response<Body> {
    match decode::<RegisterBody>(body) {
        Ok(b) => writes::register(state, b).map_or_else(Into::into, |()| ok_true()),
        Err(r) => r.into(),
    }
}

pub(super) fn catalog_deregister(state: &ConsulState, body: &[u8]) -> Response<Body> {
    match decode::<DeregisterBody>(body) {
        Ok(b) => writes::deregister(state, b).map_or_else(Into::into, |()| ok_true()),
        Err(r) => r.into(),
    }
}

pub(super) fn health_service(
    state: &ConsulState,
    name: &str,
    passing_only: bool,
) -> Response<Body> {
    let (index, body) = result(state, name, passing_only, Encoding::Json);
    with_index(json_bytes(StatusCode::OK, body), index)
}
