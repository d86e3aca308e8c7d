//! `/v1/kv/<key>` as a Consul 1.20 agent answers it: `GET` (one key,
//! `?recurse`, `?keys` with `?separator=`, `?raw`; a blocking read with
//! `?index=&wait=` is held by `handle` before this runs), `PUT` (`?flags=`,
//! `?cas=`, `?acquire=`, `?release=`; `true`/`false`) and `DELETE`
//! (`?recurse`, `?cas=`). Reads carry the query-meta headers; an absent
//! key is a `404` with an empty body and the index; errors are the real
//! server's words and statuses (observed on a 1.20.1 dev agent, see
//! `tests/consul_kv.rs`).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Method, Response, StatusCode};
use serde::Serialize;

use super::{ApiRequest, Body, acl_refused, json_bytes, json_response, server_error, text};
use crate::consul::ConsulState;
use crate::consul::acl::{Access, Authz, Resource};
use crate::consul::kv::{self, DirEntry, KvRequest, Verb};
use crate::consul::render::pretty;

/// A `DirEntry` as the HTTP API prints it (`Value` in base64, `null` when
/// empty; `Session` only when held).
#[derive(Serialize)]
pub(crate) struct EntryJson {
    #[serde(rename = "LockIndex")]
    lock_index: u64,
    #[serde(rename = "Key")]
    key: String,
    #[serde(rename = "Flags")]
    flags: u64,
    #[serde(rename = "Value")]
    value: Option<String>,
    #[serde(rename = "Session", skip_serializing_if = "String::is_empty")]
    session: String,
    #[serde(rename = "CreateIndex")]
    create_index: u64,
    #[serde(rename = "ModifyIndex")]
    modify_index: u64,
}

impl EntryJson {
    pub(crate) fn of(e: &DirEntry) -> Self {
        Self {
            lock_index: e.lock_index,
            key: e.key.clone(),
            flags: e.flags,
            value: (!e.value.is_empty()).then(|| STANDARD.encode(&e.value)),
            session: e.session.clone(),
            create_index: e.create_index,
            modify_index: e.modify_index,
        }
    }
}

/// The query string as Go's `url.Values`: decoded pairs, in order; a name
/// without `=` has an empty value (and is present).
pub(super) struct Params(Vec<(String, String)>);

impl Params {
    pub(super) fn parse(query: &str) -> Self {
        // Bound: one pair per `&` of a query the request line carried.
        Self(
            query
                .split('&')
                .filter(|kv| !kv.is_empty())
                .map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                    (unescape(k, true), unescape(v, true))
                })
                .collect(),
        )
    }

    pub(super) fn has(&self, name: &str) -> bool {
        self.0.iter().any(|(k, _)| k == name)
    }

    /// The first value of `name` ("" when absent), as `Values.Get`.
    pub(super) fn get(&self, name: &str) -> &str {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map_or("", |(_, v)| v.as_str())
    }

    /// `Values.Encode`: sorted by name, each pair escaped.
    fn encode(&self) -> String {
        let mut pairs: Vec<&(String, String)> = self.0.iter().collect();
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        pairs
            .iter()
            .map(|(k, v)| format!("{}={}", escape(k), escape(v)))
            .collect::<Vec<_>>()
            .join("&")
    }

    /// Go's `ParseUint` of `name`, its error in Go's words.
    fn uint(&self, name: &str) -> Result<u64, ParseUintError> {
        let v = self.get(name);
        if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
            return Err(ParseUintError::Syntax(v.to_owned()));
        }
        v.parse().map_err(|_| ParseUintError::Range(v.to_owned()))
    }
}

/// Why a query value is no `uint64`, in Go's `strconv.ParseUint` words
/// (Consul answers them as its 500 body).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum ParseUintError {
    /// Not digits only (or empty).
    #[error("strconv.ParseUint: parsing {0:?}: invalid syntax")]
    Syntax(String),
    /// Digits past `u64::MAX`.
    #[error("strconv.ParseUint: parsing {0:?}: value out of range")]
    Range(String),
}

/// Percent-decoding (`+` as a space in a query); a `%` not followed by
/// two hex digits is kept as it is.
pub(super) fn unescape(s: &str, query: bool) -> String {
    let b = s.as_bytes();
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && let (Some(&h), Some(&l)) = (b.get(i + 1), b.get(i + 2))
            && let (Some(h), Some(l)) = (hex(h), hex(l))
        {
            out.push(h << 4 | l);
            i += 3;
            continue;
        }
        out.push(if query && b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Go's `url.QueryEscape`.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The headers a KV read carries (a leader answering, as a dev agent).
fn query_meta(mut r: Response<Body>, index: u64) -> Response<Body> {
    let h = r.headers_mut();
    h.insert("X-Consul-Index", HeaderValue::from(index));
    h.insert("X-Consul-Knownleader", HeaderValue::from_static("true"));
    h.insert("X-Consul-Lastcontact", HeaderValue::from_static("0"));
    h.insert(
        "X-Consul-Query-Backend",
        HeaderValue::from_static("blocking-query"),
    );
    r
}

fn not_found(index: u64) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = StatusCode::NOT_FOUND;
    query_meta(r, index)
}

fn bad_request(words: &str) -> Response<Body> {
    text(StatusCode::BAD_REQUEST, words)
}

/// `conflictingFlags`: more than one of `flags` present.
fn conflicting(p: &Params, flags: &[&str]) -> Option<Response<Body>> {
    (flags.iter().filter(|f| p.has(f)).count() > 1)
        .then(|| bad_request(&format!("Conflicting flags: {}\n", p.encode())))
}

/// Routes `/v1/kv/<key>`; `key` still percent-encoded.
pub(super) fn kv_endpoint(state: &ConsulState, req: &ApiRequest<'_>, key: &str) -> Response<Body> {
    let key = unescape(key, false);
    let p = Params::parse(req.query);
    match *req.method {
        Method::GET if p.has("keys") => kv_keys(state, &key, &p, req.token),
        Method::GET => kv_get(state, &key, &p, req.token),
        Method::PUT => kv_put(state, &key, &p, req),
        Method::DELETE => kv_delete(state, &key, &p, req.token),
        ref m => {
            let mut r = text(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("method {m} not allowed"),
            );
            r.headers_mut().insert(
                hyper::header::ALLOW,
                HeaderValue::from_static("OPTIONS,GET,PUT,DELETE"),
            );
            r
        }
    }
}

/// `need` on `key` (Consul's `kvsPreApply` checks), or the denial (403).
fn acl_key(authz: &Authz, need: Access, key: &str) -> Option<Response<Body>> {
    authz
        .check(Resource::Key, need, key)
        .err()
        .map(|d| acl_refused(&d.into()))
}

fn kv_get(state: &ConsulState, key: &str, p: &Params, token: &str) -> Response<Body> {
    let recurse = p.has("recurse");
    if !recurse && key.is_empty() {
        return bad_request("Missing key name");
    }
    state.kv_read();
    let authz = match state.acl(token) {
        Ok(a) => a,
        Err(e) => return acl_refused(&e),
    };
    if !recurse && let Some(r) = acl_key(&authz, Access::Read, key) {
        return r;
    }
    let readable = |e: &&DirEntry| authz.allows(Resource::Key, Access::Read, &e.key);
    let fault = state.kv_read_fault(key);
    let store = state.store();
    let (index, mut entries): (u64, Vec<&DirEntry>) = if recurse {
        // A listing filters what the token may not read.
        (
            store.kv.list_index(key),
            store.kv.range(key).filter(readable).collect(),
        )
    } else {
        let (i, e) = store.kv.get_index(key);
        (i, e.into_iter().collect())
    };
    let index = fault.index(index);
    if entries.is_empty() {
        return not_found(index);
    }
    let huge = fault.entry(entries[0]);
    if let Some(h) = &huge {
        entries[0] = h;
    }
    if p.has("raw") && !recurse {
        let mut r = Response::new(Full::new(entries[0].value.clone()));
        let h = r.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        h.insert(
            "X-Content-Type-Options",
            HeaderValue::from_static("nosniff"),
        );
        h.insert(
            "Content-Security-Policy",
            HeaderValue::from_static("sandbox"),
        );
        return query_meta(r, index);
    }
    let body = pretty(&entries.iter().map(|e| EntryJson::of(e)).collect::<Vec<_>>());
    drop(store);
    query_meta(json_bytes(StatusCode::OK, Bytes::from(body)), index)
}

fn kv_keys(state: &ConsulState, prefix: &str, p: &Params, token: &str) -> Response<Body> {
    // `separator` wins over the old spelling `seperator`.
    let sep = if p.has("separator") {
        p.get("separator")
    } else {
        p.get("seperator")
    };
    state.kv_read();
    let authz = match state.acl(token) {
        Ok(a) => a,
        Err(e) => return acl_refused(&e),
    };
    let fault = state.kv_read_fault(prefix);
    let store = state.store();
    let index = fault.index(store.kv.list_index(prefix));
    let mut keys = store.kv.list_keys(prefix, sep);
    drop(store);
    keys.retain(|k| authz.allows(Resource::Key, Access::Read, k));
    if keys.is_empty() && !prefix.is_empty() {
        return not_found(index);
    }
    query_meta(json_response(StatusCode::OK, &keys), index)
}

fn kv_put(state: &ConsulState, key: &str, p: &Params, req: &ApiRequest<'_>) -> Response<Body> {
    if key.is_empty() {
        return bad_request("Missing key name");
    }
    if let Some(r) = conflicting(p, &["cas", "acquire", "release"]) {
        return r;
    }
    let mut r = KvRequest {
        key: key.to_owned(),
        value: Bytes::copy_from_slice(req.body),
        ..KvRequest::default()
    };
    let mut verb = Verb::Set;
    if p.has("flags") {
        match p.uint("flags") {
            Ok(f) => r.flags = f,
            Err(e) => return server_error(e.to_string()),
        }
    }
    if p.has("cas") {
        match p.uint("cas") {
            Ok(i) => r.index = i,
            Err(e) => return server_error(e.to_string()),
        }
        verb = Verb::Cas;
    }
    if p.has("acquire") {
        r.session = p.get("acquire").to_owned();
        verb = Verb::Lock;
    }
    if p.has("release") {
        r.session = p.get("release").to_owned();
        verb = Verb::Unlock;
    }
    let vetted = state
        .acl(req.token)
        .and_then(|a| Ok(a.check(Resource::Key, Access::Write, key)?));
    if let Err(e) = vetted {
        return acl_refused(&e);
    }
    match state.kv_apply(verb, &r) {
        Ok(ok) => json_response(StatusCode::OK, &(ok || verb == Verb::Set)),
        Err(e) => server_error(format!("raft apply failed: {e}")),
    }
}

fn kv_delete(state: &ConsulState, key: &str, p: &Params, token: &str) -> Response<Body> {
    if let Some(r) = conflicting(p, &["recurse", "cas"]) {
        return r;
    }
    let mut r = KvRequest {
        key: key.to_owned(),
        ..KvRequest::default()
    };
    let mut verb = Verb::Delete;
    if p.has("recurse") {
        verb = Verb::DeleteTree;
    } else if key.is_empty() {
        return bad_request("Missing key name");
    }
    if p.has("cas") {
        match p.uint("cas") {
            Ok(i) => r.index = i,
            Err(e) => return server_error(e.to_string()),
        }
        verb = Verb::DeleteCas;
    }
    let authz = match state.acl(token) {
        Ok(a) => a,
        Err(e) => return acl_refused(&e),
    };
    let vetted = if verb == Verb::DeleteTree {
        authz.check_key_write_prefix(key)
    } else {
        authz.check(Resource::Key, Access::Write, key)
    };
    if let Err(d) = vetted {
        return acl_refused(&d.into());
    }
    match state.kv_apply(verb, &r) {
        Ok(ok) => json_response(StatusCode::OK, &(ok || verb != Verb::DeleteCas)),
        Err(e) => server_error(format!("raft apply failed: {e}")),
    }
}

/// Holds a blocking `GET /v1/kv/<key>?index=N` (`?recurse` and `?keys`
/// wait on the prefix, a single key on the key).
pub(super) async fn hold(
    state: &ConsulState,
    key: &str,
    query: &str,
    min: u64,
    wait: std::time::Duration,
) {
    let key = unescape(key, false);
    let p = Params::parse(query);
    let q = if p.has("recurse") || p.has("keys") {
        kv::Query::Prefix(&key)
    } else {
        kv::Query::Key(&key)
    };
    kv::wait(state, q, min, wait, None).await;
}

/// A KV `PUT` whose `Content-Length` is over `kv_max_value_size`, or a
/// `/v1/txn` whose is over `txn_max_req_len` (512 KiB, or the KV limit
/// when larger): 413 in the agent's words, the connection closed (the
/// body is not read).
pub(super) fn too_large(
    state: &ConsulState,
    req: &hyper::Request<hyper::body::Incoming>,
) -> Option<Response<Body>> {
    let kv_max = state.inner.cfg.kv_max_value_size;
    let (max, setting) = if req.uri().path() == "/v1/txn" {
        (kv_max.max(super::MAX_BODY), "txn_max_req_len")
    } else {
        (kv_max, "kv_max_value_size")
    };
    let len: u64 = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()?;
    if len <= max as u64 {
        return None;
    }
    let mut r = text(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "Request body({len} bytes) too large, max size: {max} bytes. See \
             https://www.consul.io/docs/agent/config/config-files#{setting}."
        ),
    );
    r.headers_mut()
        .insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
    Some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_decode_and_encode_as_go_does() {
        let p = Params::parse("recurse&cas=3&acquire=a%20b+c&x=%zz&y=%aé");
        assert!(p.has("recurse") && !p.has("keys"));
        assert_eq!(p.get("acquire"), "a b c");
        assert_eq!(p.get("x"), "%zz");
        assert_eq!(p.get("y"), "%aé");
        assert_eq!(
            p.encode(),
            "acquire=a+b+c&cas=3&recurse=&x=%25zz&y=%25a%C3%A9"
        );
        assert_eq!(p.uint("cas"), Ok(3));
        assert_eq!(
            p.uint("recurse").unwrap_err().to_string(),
            "strconv.ParseUint: parsing \"\": invalid syntax"
        );
        let big = Params::parse("cas=99999999999999999999");
        assert_eq!(
            big.uint("cas").unwrap_err().to_string(),
            "strconv.ParseUint: parsing \"99999999999999999999\": value out of range"
        );
        assert_eq!(unescape("a%2Fb%", false), "a/b%");
    }
}
