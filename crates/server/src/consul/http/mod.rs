//! The HTTP API subset (HTTP/1.1 keep-alive, hyper): catalog, txn, sessions,
//! config entries, health (of services and nodes), leader and the LAN
//! members. Bodies and error texts follow Consul
//! 1.20: `true` for writes, pretty-printed JSON (4-space indent, no trailing
//! newline, as a `-dev` agent prints it), errors as `text/plain` with the
//! status Consul uses (RPC errors are 500). One [`sweep_sessions`] task per
//! server expires sessions.
//!
//! This module accepts, routes, holds blocking reads (`consul::blocking`)
//! and answers ACL checks and faults; it also holds the response helpers
//! the endpoint families share. The families live apart: `catalog`
//! (register, deregister, health), `read` (catalog and session listings),
//! `txn`, `session_api` (create, renew, destroy), `config` (config
//! entries), `agent` (`/v1/agent/members`) and `acl` (tokens and
//! policies). The JSON views of the catalog are `consul::render`'s.
//! With ACLs on, writes are vetted for the request's token here
//! (`consul::acl::vet`), and reads of a service's instances come back
//! empty (marked filtered) when it may not read the service.

mod acl;
mod agent;
mod catalog;
mod config;
mod kv;
mod read;
mod session_api;
mod txn;
mod txn_kv;

use std::convert::Infallible;
use std::io;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::{Deserialize, Serialize};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use agent::{agent_members, agent_metrics};
use catalog::{catalog_deregister, catalog_register, health_node, health_service, health_state};
use config::{config_delete, config_get, config_put};
use read::{catalog_node, catalog_nodes, catalog_service, coordinate_nodes, session_list};
use session_api::{session_create, session_destroy, session_renew};
use txn::txn;

use super::ConsulState;
use super::acl::{Access, AclError, Resource, vet};
use super::blocking::block;
use super::conn::{accept_loop, drive_connection, tls_accept};
use super::render::pretty;
use super::sessions::Session;
use super::write_error::WriteError;
use super::writes::{DeregisterBody, RegisterBody, SessionBody};
use crate::faults::{self, Action, ConnCtl, INJECTED_WORDS, RETRY_ELSEWHERE, RETRY_LATER, Target};

/// Consul's `txn_max_req_len` default; used as the body limit everywhere.
const MAX_BODY: usize = 512 * 1024;
/// Most operations in one `/v1/txn` (`maxTxnOps`).
const MAX_TXN_OPS: usize = 128;
/// Most bytes of a KV `PUT` body read without a `Content-Length` (a real
/// agent checks `kv_max_value_size` against the header only, and took a
/// chunked 8 MiB value).
const MAX_KV_BODY: usize = 16 * 1024 * 1024;

type Body = Full<Bytes>;

/// Serves the HTTP API until `shutdown` is cancelled; also runs the session
/// expiry sweeper for `state`.
pub async fn serve_http(
    listener: TcpListener,
    state: ConsulState,
    shutdown: CancellationToken,
) -> io::Result<()> {
    state.faults().start();
    let sweeper = tokio::spawn(sweep_sessions(state.clone(), shutdown.clone()));
    let conns = state.clone();
    let result = accept_loop(listener, &state, shutdown.clone(), move |stream| {
        http_connection(stream, conns.clone(), shutdown.clone())
    })
    .await;
    let _ = sweeper.await;
    result
}

async fn http_connection(stream: TcpStream, state: ConsulState, shutdown: CancellationToken) {
    let _ = stream.set_nodelay(true);
    let stream = state.faults().wrap(stream, Target::ConsulHttp);
    let ctl = stream.ctl();
    match state.inner.cfg.tls.clone() {
        None => serve_http1(stream, state, shutdown, ctl).await,
        Some(tls) => {
            if let Some(Ok(tls)) = tls_accept(stream, tls, &shutdown).await {
                serve_http1(tls, state, shutdown, ctl).await;
            }
        }
    }
}

async fn serve_http1<I>(
    io: I,
    state: ConsulState,
    shutdown: CancellationToken,
    ctl: Option<std::sync::Arc<ConnCtl>>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = service_fn(move |req| {
        let state = state.clone();
        let ctl = ctl.clone();
        async move { Ok::<_, Infallible>(handle(&state, req, ctl.as_deref()).await) }
    });
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).keep_alive(true);
    let conn = builder.serve_connection(TokioIo::new(io), svc);
    drive_connection(conn, &shutdown, |c| c.graceful_shutdown()).await;
}

/// Expires sessions 2 × TTL after their last renewal. One task, ticking at a
/// quarter of `session_ttl_min` (10 ms ..= 1 s); renewals also check the
/// deadline, so an expired session is never renewed late.
async fn sweep_sessions(state: ConsulState, shutdown: CancellationToken) {
    let period = (state.inner.cfg.session_ttl_min / 4)
        .clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let expired = state.sessions().sweep(Instant::now());
        state.sessions_expired(expired);
    }
}

// ---------------------------------------------------------------- responses

fn json_response<T: Serialize + ?Sized>(status: StatusCode, v: &T) -> Response<Body> {
    json_bytes(status, Bytes::from(pretty(v)))
}

/// A response of JSON already encoded.
fn json_bytes(status: StatusCode, body: Bytes) -> Response<Body> {
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn ok_true() -> Response<Body> {
    json_response(StatusCode::OK, &true)
}

fn text(status: StatusCode, msg: impl Into<String>) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(msg.into())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn server_error(msg: impl Into<String>) -> Response<Body> {
    text(StatusCode::INTERNAL_SERVER_ERROR, msg)
}

impl From<WriteError> for Response<Body> {
    fn from(e: WriteError) -> Self {
        server_error(e.to_string())
    }
}

fn with_index(mut r: Response<Body>, index: u64) -> Response<Body> {
    r.headers_mut()
        .insert("X-Consul-Index", HeaderValue::from(index));
    r
}

// ---------------------------------------------------------------- routing

/// The request's ACL token (`X-Consul-Token`, or `Authorization: Bearer`).
fn token_of(req: &Request<Incoming>) -> String {
    let h = req.headers();
    h.get("x-consul-token")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| {
            h.get(hyper::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::to_owned)
        })
        .unwrap_or_default()
}

/// A refusal of the request's token: `ACL not found` and denials are 403
/// text (Consul's words), a deregister of what the node lacks a 500.
pub(super) fn acl_refused(e: &AclError) -> Response<Body> {
    match e {
        AclError::NotFound | AclError::Denied(_) => text(StatusCode::FORBIDDEN, e.to_string()),
        _ => server_error(e.to_string()),
    }
}

/// With ACLs on: the write (`head`/`tail` of its path, its `body`) vetted
/// as Consul vets it for the request's token (`acl::vet`): refused with
/// [`acl_refused`], or, for a txn, 409 with each denied op's error.
/// A body that does not decode is the write's to refuse.
fn acl_write(
    state: &ConsulState,
    token: &str,
    head: &str,
    tail: &str,
    body: &[u8],
) -> Result<(), Box<Response<Body>>> {
    let refuse = |e: AclError| Box::new(acl_refused(&e));
    let authz = state.acl(token).map_err(refuse)?;
    if authz.is_all() {
        return Ok(());
    }
    let checked: Result<(), AclError> = match (head, tail) {
        ("txn", _) => {
            let ops: Vec<serde_json::Value> = serde_json::from_slice(body).unwrap_or_default();
            let denied = vet::txn_ops(&authz, &ops);
            if denied.is_empty() {
                return Ok(());
            }
            let errors: Vec<serde_json::Value> = denied
                .iter()
                .map(|(i, d)| serde_json::json!({"OpIndex": i, "What": d.to_string()}))
                .collect();
            let body = serde_json::json!({ "Results": null, "Errors": errors });
            return Err(Box::new(json_response(StatusCode::CONFLICT, &body)));
        }
        ("catalog", "register") => match decode::<RegisterBody>(body) {
            Ok(b) => vet::register(state, &authz, &b).map_err(AclError::from),
            Err(_) => Ok(()),
        },
        ("catalog", _) => match decode::<DeregisterBody>(body) {
            Ok(b) => vet::deregister(state, &authz, &b),
            Err(_) => Ok(()),
        },
        ("session", "create") => match decode::<SessionBody>(body) {
            Ok(b) => vet::session_create(state, &authz, &b.node).map_err(AclError::from),
            Err(_) => Ok(()),
        },
        ("session", t) => {
            let id = t.split_once('/').map_or("", |(_, id)| id);
            vet::session_of(state, &authz, id).map_err(AclError::from)
        }
        _ => {
            // A config entry: its kind and name.
            let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
            let field = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
            vet::config_entry(&authz, &field("Kind"), &field("Name")).map_err(AclError::from)
        }
    };
    checked.map_err(refuse)
}

/// What a `consul.http` fault does to a request: `Some` answer instead of
/// the real one (a status in Consul's words, or one nobody will read after
/// a drop, reset or stall of the connection), after an optional delay.
async fn http_fault(
    state: &ConsulState,
    path: &str,
    ctl: Option<&ConnCtl>,
) -> Option<Response<Body>> {
    let hit = state.faults().pick(Target::ConsulHttp, Some(path))?;
    match hit.action {
        Action::Delay(d) => {
            tokio::time::sleep(d).await;
            None
        }
        Action::Status(code) => {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
            let words = match code {
                429 => RETRY_ELSEWHERE,
                503 => RETRY_LATER,
                _ => INJECTED_WORDS,
            };
            Some(text(status, words))
        }
        a @ (Action::Drop | Action::Reset | Action::Stall) => {
            if let Some(ctl) = ctl {
                ctl.kill(faults::kill_of(&a));
            }
            Some(text(StatusCode::SERVICE_UNAVAILABLE, INJECTED_WORDS))
        }
        _ => None,
    }
}

async fn handle(
    state: &ConsulState,
    req: Request<Incoming>,
    ctl: Option<&ConnCtl>,
) -> Response<Body> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    if let Some(answer) = http_fault(state, &path, ctl).await {
        return answer;
    }
    let query = req.uri().query().unwrap_or("").to_owned();
    let token = token_of(&req);
    // A blocking read (`?index=N`): held until the service's (or the KV
    // key's or prefix's) index passes N or the wait ends.
    if method == Method::GET
        && let Some(min) = query_param(&query, "index").and_then(|v| v.parse::<u64>().ok())
    {
        let wait = query_param(&query, "wait")
            .and_then(go_duration)
            .unwrap_or(Duration::ZERO);
        if let Some(service) = path.strip_prefix("/v1/health/service/") {
            block(state, service, min, wait, None).await;
        } else if let Some(key) = path.strip_prefix("/v1/kv/") {
            kv::hold(state, key, &query, min, wait).await;
        }
    }
    if method == Method::GET && path == "/v1/connect/ca/roots" {
        state.ca().wait_http(&query).await;
    }
    let is_kv_put = method == Method::PUT && path.starts_with("/v1/kv/");
    if (is_kv_put || path == "/v1/txn")
        && let Some(refused) = kv::too_large(state, &req)
    {
        return refused;
    }
    // Bound: a request body is read up to MAX_BODY (a KV value up to
    // MAX_KV_BODY), then refused (413).
    let limit = if is_kv_put { MAX_KV_BODY } else { MAX_BODY };
    let body = if method == Method::PUT || method == Method::POST {
        match read_body(req.into_body(), limit).await {
            Ok(b) => b,
            Err(r) => return r.into(),
        }
    } else {
        Bytes::new()
    };
    dispatch(
        state,
        &ApiRequest {
            method: &method,
            path: &path,
            query: &query,
            token: &token,
            body: &body,
        },
    )
}

/// The value of `name` in a query string.
fn query_param<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
}

/// A Go duration as `?wait=` carries it (`300s`, `5m`, `1500ms`; a bare
/// number is seconds, as Consul reads it).
fn go_duration(v: &str) -> Option<Duration> {
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    humantime::parse_duration(v).ok()
}

/// One HTTP API request, its body already read: what [`dispatch`] answers.
#[derive(Debug, Clone, Copy)]
pub struct ApiRequest<'a> {
    /// Method.
    pub method: &'a Method,
    /// Path (`/v1/...`).
    pub path: &'a str,
    /// Query string without `?`.
    pub query: &'a str,
    /// ACL token (`X-Consul-Token` or `Authorization: Bearer`).
    pub token: &'a str,
    /// Body (read up to 512 KiB).
    pub body: &'a [u8],
}

/// Routes and answers one request against `state`: pure (no socket), so
/// the property tests and the `consul_server_http` fuzz target drive the
/// same code a connection does. Never panics on any input.
pub fn dispatch(state: &ConsulState, req: &ApiRequest<'_>) -> Response<Body> {
    let c = &state.inner.counters;
    c.bump(&c.http_requests);
    let Some(route) = req.path.strip_prefix("/v1/") else {
        return not_found();
    };
    let (head, tail) = route.split_once('/').unwrap_or((route, ""));
    let get = *req.method == Method::GET;
    match head {
        "catalog" => catalog_route(state, req, tail),
        "session" => session_route(state, req, tail),
        "config" => config_route(state, req, tail),
        "health" => health_route(state, req, tail),
        "kv" => kv::kv_endpoint(state, req, tail),
        "acl" => acl::acl_route(state, req, tail),
        "txn" if tail.is_empty() => body_write(state, req, (head, tail), txn),
        "connect" if tail.starts_with("ca/") => {
            let write = is_write(req.method);
            match state.ca().http(write, &tail["ca/".len()..], req.body) {
                Ok(v) => json_response(StatusCode::OK, &v),
                Err(e) => text(e.status(), e.to_string()),
            }
        }
        "coordinate" if tail == "nodes" && get => coordinate_nodes(state),
        "agent" if tail == "members" && get => agent_members(state, req.token),
        "agent" if tail == "metrics" && get => agent_metrics(state, req.query),
        "status" if tail == "leader" => {
            if !get {
                return not_allowed(req.method);
            }
            json_response(StatusCode::OK, &state.leader_addr().to_string())
        }
        _ => not_found(),
    }
}

/// A PUT or POST.
fn is_write(method: &Method) -> bool {
    method == Method::PUT || method == Method::POST
}

/// The answer to a path this API does not have.
fn not_found() -> Response<Body> {
    text(StatusCode::NOT_FOUND, "404 page not found\n")
}

/// The answer to a method a path does not take.
fn not_allowed(method: &Method) -> Response<Body> {
    text(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("method {method} not allowed"),
    )
}

/// A write route (`route`: head and tail of its path): refused unless a
/// PUT or POST whose token may write (`body` is what the ACL check
/// reads), else answered by `answer`.
fn guarded_write(
    state: &ConsulState,
    req: &ApiRequest<'_>,
    route: (&str, &str),
    body: &[u8],
    answer: impl FnOnce() -> Response<Body>,
) -> Response<Body> {
    if !is_write(req.method) {
        return not_allowed(req.method);
    }
    if let Err(refused) = acl_write(state, req.token, route.0, route.1, body) {
        return *refused;
    }
    answer()
}

/// A write route answered from its body alone (checked as
/// [`guarded_write`] checks).
fn body_write(
    state: &ConsulState,
    req: &ApiRequest<'_>,
    route: (&str, &str),
    answer: fn(&ConsulState, &[u8]) -> Response<Body>,
) -> Response<Body> {
    guarded_write(state, req, route, req.body, || answer(state, req.body))
}

/// `/v1/catalog/...`.
fn catalog_route(state: &ConsulState, req: &ApiRequest<'_>, tail: &str) -> Response<Body> {
    let get = *req.method == Method::GET;
    let route = ("catalog", tail);
    match tail {
        "register" => body_write(state, req, route, catalog_register),
        "deregister" => body_write(state, req, route, catalog_deregister),
        "nodes" if get => catalog_nodes(state, req.query),
        "datacenters" if get => json_response(StatusCode::OK, &[&state.inner.cfg.datacenter]),
        t if get && t.starts_with("node/") => catalog_node(state, &t["node/".len()..]),
        t if get && t.starts_with("service/") => {
            let name = &t["service/".len()..];
            service_read(state, req.token, name).unwrap_or_else(|| catalog_service(state, name))
        }
        _ => not_found(),
    }
}

/// `/v1/session/...`.
fn session_route(state: &ConsulState, req: &ApiRequest<'_>, tail: &str) -> Response<Body> {
    let get = *req.method == Method::GET;
    let route = ("session", tail);
    match tail {
        "create" => body_write(state, req, route, session_create),
        t if t.starts_with("renew/") || t.starts_with("destroy/") => {
            guarded_write(state, req, route, b"", || {
                let (op, id) = t.split_once('/').expect("checked prefix");
                if id.is_empty() {
                    text(StatusCode::BAD_REQUEST, "Missing session")
                } else if op == "renew" {
                    session_renew(state, id)
                } else {
                    session_destroy(state, id)
                }
            })
        }
        "list" if get => session_list(state, None),
        t if get && t.starts_with("node/") => session_list(state, Some(&t["node/".len()..])),
        t if t.starts_with("info/") => {
            if !get {
                return not_allowed(req.method);
            }
            let id = &t["info/".len()..];
            let found: Vec<Session> = state.sessions().get(id).cloned().into_iter().collect();
            json_response(StatusCode::OK, &found)
        }
        _ => not_found(),
    }
}

/// `/v1/config` (a PUT) and `/v1/config/<kind>/<name>`.
fn config_route(state: &ConsulState, req: &ApiRequest<'_>, tail: &str) -> Response<Body> {
    if tail.is_empty() {
        return guarded_write(state, req, ("config", tail), req.body, || {
            config_put(state, req.body, req.query)
        });
    }
    let Some((kind, name)) = tail.split_once('/') else {
        return not_found();
    };
    match *req.method {
        Method::DELETE => {
            let vetted = state
                .acl(req.token)
                .and_then(|a| vet::config_entry(&a, kind, name).map_err(AclError::from));
            match vetted {
                Ok(()) => config_delete(state, kind, name, req.query),
                Err(e) => acl_refused(&e),
            }
        }
        Method::GET => config_get(state, kind, name),
        _ => not_allowed(req.method),
    }
}

/// A read of a service's instances: `None` when the token may read the
/// service, else `ACL not found`, or an empty list marked as filtered
/// (Consul drops what a token may not read).
fn service_read(state: &ConsulState, token: &str, service: &str) -> Option<Response<Body>> {
    match state.acl(token) {
        Err(e) => Some(acl_refused(&e)),
        Ok(a) if a.allows(Resource::Service, Access::Read, service) => None,
        Ok(_) => {
            let mut r = json_response(StatusCode::OK, &Vec::<serde_json::Value>::new());
            r.headers_mut().insert(
                "X-Consul-Results-Filtered-By-ACLs",
                HeaderValue::from_static("true"),
            );
            Some(with_index(r, state.raft_index()))
        }
    }
}

/// `/v1/health/...` (reads only).
fn health_route(state: &ConsulState, req: &ApiRequest<'_>, tail: &str) -> Response<Body> {
    let get = *req.method == Method::GET;
    if let Some(service) = tail.strip_prefix("service/") {
        if !get {
            return not_allowed(req.method);
        }
        let passing = req
            .query
            .split('&')
            .any(|kv| kv == "passing" || kv.starts_with("passing="));
        return service_read(state, req.token, service)
            .unwrap_or_else(|| health_service(state, service, passing));
    }
    match tail {
        t if get && t.starts_with("node/") => health_node(state, &t["node/".len()..]),
        t if get && t.starts_with("state/") => health_state(state, &t["state/".len()..]),
        _ => not_found(),
    }
}

/// A refused request: status and `text/plain` body.
struct Reject(StatusCode, String);

impl From<Reject> for Response<Body> {
    fn from(r: Reject) -> Self {
        text(r.0, r.1)
    }
}

async fn read_body(body: Incoming, limit: usize) -> Result<Bytes, Reject> {
    match Limited::new(body, limit).collect().await {
        Ok(b) => Ok(b.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(Reject(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("Request body too large, max size: {limit} bytes"),
        )),
        Err(e) => Err(Reject(
            StatusCode::BAD_REQUEST,
            format!("Failed to read body: {e}"),
        )),
    }
}

fn decode<T: for<'de> Deserialize<'de> + Default>(body: &[u8]) -> Result<T, Reject> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|e| {
        Reject(
            StatusCode::BAD_REQUEST,
            format!("Request decode failed: {e}"),
        )
    })
}

// ---------------------------------------------------------------- request bodies
