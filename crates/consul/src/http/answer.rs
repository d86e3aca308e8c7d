//! What the HTTP API answers that the agents read: sessions, txn results,
//! config entry heads, `true`/`false` replies, and whether a node's catalog
//! entry holds what an agent registered (anti-entropy).
//!
//! What it is not: no I/O and no request bodies ([`crate::http::body`]).

use serde::Deserialize;

use crate::http::body::{Expected, Meta};

/// Body of `PUT /v1/session/create`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct SessionCreated {
    /// The new session's ID.
    #[serde(rename = "ID")]
    pub id: String,
}

/// One session as `/v1/session/renew/:id` (an array of one) returns it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct SessionEntry {
    /// Session ID.
    #[serde(rename = "ID")]
    pub id: String,
    /// Session name.
    #[serde(default)]
    pub name: String,
    /// Node the session belongs to.
    #[serde(default)]
    pub node: String,
    /// Lock delay in nanoseconds.
    #[serde(default)]
    pub lock_delay: u64,
    /// `release` or `delete`.
    #[serde(default)]
    pub behavior: String,
    /// TTL as a Go duration string.
    #[serde(rename = "TTL", default)]
    pub ttl: String,
    /// Node checks the session depends on.
    #[serde(default)]
    pub node_checks: Option<Vec<String>>,
    /// Raft index of creation.
    #[serde(default)]
    pub create_index: u64,
    /// Raft index of the last change.
    #[serde(default)]
    pub modify_index: u64,
}

/// Body of `/v1/txn` (200 and 409).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct TxnResponse {
    /// One result per op on success.
    #[serde(default)]
    pub results: Option<Vec<serde_json::Value>>,
    /// Failed ops on rollback.
    #[serde(default)]
    pub errors: Option<Vec<TxnOpError>>,
}

/// One failed op of a rolled-back txn.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct TxnOpError {
    /// Position of the op in the request.
    pub op_index: usize,
    /// Reason.
    #[serde(default)]
    pub what: String,
}

/// Parses a `true`/`false` reply (catalog register/deregister, config set).
pub fn parse_bool(body: &[u8]) -> Result<bool, &'static str> {
    serde_json::from_slice(body).map_err(|_| "http_decode")
}

/// What a run needs of a config entry (`GET /v1/config/:kind/:name`): the
/// index to check-and-set against, and its meta (whose is it).
#[derive(Debug, Deserialize)]
pub struct EntryHead {
    /// `ModifyIndex`.
    #[serde(rename = "ModifyIndex", default)]
    pub modify_index: u64,
    /// `Meta`.
    #[serde(rename = "Meta", default)]
    pub meta: Meta,
}

#[derive(Deserialize)]
struct NodeServicesBody {
    #[serde(rename = "Node")]
    node: NodeInfo,
    #[serde(rename = "Services", default)]
    services: Option<std::collections::HashMap<String, ServiceInfo>>,
}

#[derive(Deserialize)]
struct NodeInfo {
    #[serde(rename = "Address", default)]
    address: String,
}

#[derive(Deserialize)]
struct ServiceInfo {
    #[serde(rename = "Service", default)]
    service: String,
    #[serde(rename = "Port", default)]
    port: i64,
}

/// Whether `GET /v1/catalog/node/:node` (`body`) shows the node at
/// `address` with every expected instance (name and port); `null` (an
/// unknown node) is not in sync. Services the catalog has beyond these are
/// left alone.
pub fn node_in_sync(
    body: &[u8],
    address: &str,
    expected: &[Expected],
) -> Result<bool, &'static str> {
    let v: Option<NodeServicesBody> = serde_json::from_slice(body).map_err(|_| "http_decode")?;
    let Some(v) = v else { return Ok(false) };
    if v.node.address != address {
        return Ok(false);
    }
    let services = v.services.unwrap_or_default();
    Ok(expected.iter().all(|e| {
        services
            .get(&e.id)
            .is_some_and(|s| s.service == e.service && s.port == i64::from(e.port))
    }))
}

/// Why a gzipped answer could not be read ([`gunzip`]).
#[derive(Debug, thiserror::Error)]
pub enum Gunzip {
    /// It unzips past the caller's bound.
    #[error("it unzips past the bound")]
    TooLarge,
    /// It is not gzip, in the decoder's words.
    #[error(transparent)]
    Bad(std::io::Error),
}

/// A gzipped answer body unzipped, up to `max` bytes. Consul gzips every
/// answer to a client that sends `Accept-Encoding: gzip`, as Go's HTTP
/// transport does for Vault's and consul-template's clients.
pub fn gunzip(body: &[u8], max: usize) -> Result<Vec<u8>, Gunzip> {
    use std::io::Read as _;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(body)
        .take(max as u64 + 1)
        .read_to_end(&mut out)
        .map_err(Gunzip::Bad)?;
    if out.len() > max {
        return Err(Gunzip::TooLarge);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn node_sync_compares_address_and_instances() {
        let e = vec![Expected {
            id: "app-1-0".into(),
            service: "app".into(),
            port: 8080,
        }];
        let body = |addr: &str, port: u32| {
            json!({"Node": {"Node": "n", "Address": addr},
                   "Services": {"app-1-0": {"ID": "app-1-0", "Service": "app", "Port": port},
                                "other": {"ID": "other", "Service": "x", "Port": 1}}})
            .to_string()
        };
        assert_eq!(node_in_sync(b"null", "10.0.0.1", &e), Ok(false));
        assert_eq!(
            node_in_sync(body("10.0.0.1", 8080).as_bytes(), "10.0.0.1", &e),
            Ok(true)
        );
        assert_eq!(
            node_in_sync(body("10.0.0.2", 8080).as_bytes(), "10.0.0.1", &e),
            Ok(false)
        );
        assert_eq!(
            node_in_sync(body("10.0.0.1", 9).as_bytes(), "10.0.0.1", &e),
            Ok(false)
        );
        let no_services = json!({"Node": {"Address": "10.0.0.1"}, "Services": null}).to_string();
        assert_eq!(
            node_in_sync(no_services.as_bytes(), "10.0.0.1", &e),
            Ok(false)
        );
        assert!(node_in_sync(b"{", "10.0.0.1", &e).is_err());
    }
}
