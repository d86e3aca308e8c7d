//! The HTTP API subset (HTTP/1.1 keep-alive, hyper): catalog, txn, sessions,
//! config entries, health and leader. Bodies and error texts follow Consul
//! 1.20: `true` for writes, pretty-printed JSON (4-space indent, no trailing
//! newline, as a `-dev` agent prints it), errors as `text/plain` with the
//! status Consul uses (RPC errors are 500). One [`sweep_sessions`] task per
//! server expires sessions.

use std::collections::{BTreeMap, HashMap, HashSet};
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
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::sessions::{self, Renewal, Session};
use super::state::{
    CheckDef, CheckEntry, NodeDef, NodeEntry, SERF_HEALTH, ServiceDef, ServiceEntry, Store,
    Touched, WriteError,
};
use super::{ConsulState, lock};

/// Consul's `txn_max_req_len` default; used as the body limit everywhere.
const MAX_BODY: usize = 512 * 1024;
/// Most operations in one `/v1/txn`.
const MAX_TXN_OPS: usize = 128;

type Body = Full<Bytes>;

/// Serves the HTTP API until `shutdown` is cancelled; also runs the session
/// expiry sweeper for `state`.
pub async fn serve_http(
    listener: TcpListener,
    state: ConsulState,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let sweeper = tokio::spawn(sweep_sessions(state.clone(), shutdown.clone()));
    let result = super::accept_loop(listener, shutdown.clone(), move |stream| {
        http_connection(stream, state.clone(), shutdown.clone())
    })
    .await;
    let _ = sweeper.await;
    result
}

async fn http_connection(stream: TcpStream, state: ConsulState, shutdown: CancellationToken) {
    let _ = stream.set_nodelay(true);
    match state.inner.cfg.tls.clone() {
        None => serve_http1(stream, state, shutdown).await,
        Some(tls) => {
            let accepted = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = tokio::time::timeout(
                    TLS_HANDSHAKE_TIMEOUT,
                    tokio_rustls::TlsAcceptor::from(tls).accept(stream),
                ) => r,
            };
            if let Ok(Ok(tls)) = accepted {
                serve_http1(tls, state, shutdown).await;
            }
        }
    }
}

/// How long an HTTPS client gets for its TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

async fn serve_http1<I>(io: I, state: ConsulState, shutdown: CancellationToken)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = service_fn(move |req| {
        let state = state.clone();
        async move { Ok::<_, Infallible>(handle(&state, req).await) }
    });
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).keep_alive(true);
    let conn = builder.serve_connection(TokioIo::new(io), svc);
    super::drive_connection(conn, &shutdown, |c| c.graceful_shutdown()).await;
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

impl ConsulState {
    /// Counts `n` expired sessions; each expiry is a raft write.
    fn sessions_expired(&self, n: usize) {
        if n == 0 {
            return;
        }
        let c = &self.inner.counters;
        c.sessions_expired
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        let mut store = self.store();
        for _ in 0..n {
            store.next_index();
        }
    }
}

// ---------------------------------------------------------------- responses

fn pretty<T: Serialize + ?Sized>(v: &T) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    let fmt = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
    v.serialize(&mut ser).expect("JSON values serialize");
    out
}

fn json_response<T: Serialize + ?Sized>(status: StatusCode, v: &T) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(pretty(v))));
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
        server_error(e.0)
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

/// With ACLs on: a write without a token is denied and an unknown token is
/// `ACL not found`, in Consul 1.20's words (403 text; a txn answers 409 with
/// the denial as the failing op's error).
fn acl_write(
    state: &ConsulState,
    token: &str,
    head: &str,
    tail: &str,
    body: &[u8],
) -> Result<(), Box<Response<Body>>> {
    match state.acl_check(token) {
        Ok(()) => Ok(()),
        Err(Some(())) => Err(Box::new(text(StatusCode::FORBIDDEN, "ACL not found"))),
        Err(None) => {
            let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
            let node = |v: &serde_json::Value| v["Node"].as_str().unwrap_or_default().to_owned();
            let (perm, name) = match (head, tail) {
                ("txn", _) => {
                    // Every op is denied, each with its own error.
                    let errors: Vec<serde_json::Value> = v
                        .as_array()
                        .map(Vec::as_slice)
                        .unwrap_or_default()
                        .iter()
                        .enumerate()
                        .map(|(i, op)| {
                            let op_node = op["Node"]["Node"]["Node"]
                                .as_str()
                                .or(op["Service"]["Node"].as_str())
                                .or(op["Check"]["Check"]["Node"].as_str())
                                .unwrap_or_default();
                            serde_json::json!({
                                "OpIndex": i,
                                "What": format!(
                                    "Permission denied: anonymous token lacks permission \
                                     'node:write' on \"{op_node}\". The anonymous token is used \
                                     implicitly when a request does not specify a token."
                                ),
                            })
                        })
                        .collect();
                    let body = serde_json::json!({ "Results": null, "Errors": errors });
                    return Err(Box::new(json_response(StatusCode::CONFLICT, &body)));
                }
                ("catalog", "register") => (
                    "service:write",
                    v["Service"]["Service"]
                        .as_str()
                        .map(str::to_owned)
                        .unwrap_or_else(|| node(&v)),
                ),
                ("session", _) => ("session:write", node(&v)),
                _ => ("node:write", node(&v)),
            };
            Err(Box::new(text(
                StatusCode::FORBIDDEN,
                format!(
                    "Permission denied: anonymous token lacks permission '{perm}' on \"{name}\". \
                     The anonymous token is used implicitly when a request does not specify a \
                     token."
                ),
            )))
        }
    }
}

async fn handle(state: &ConsulState, req: Request<Incoming>) -> Response<Body> {
    let c = &state.inner.counters;
    c.bump(&c.http_requests);
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let write = method == Method::PUT || method == Method::POST;
    let Some(route) = path.strip_prefix("/v1/") else {
        return text(StatusCode::NOT_FOUND, "404 page not found\n");
    };
    let not_allowed = || {
        text(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("method {method} not allowed"),
        )
    };
    let (head, tail) = match route.find('/') {
        Some(i) => (&route[..i], &route[i + 1..]),
        None => (route, ""),
    };
    match (head, tail) {
        ("catalog", "register")
        | ("catalog", "deregister")
        | ("txn", "")
        | ("session", "create")
        | ("config", "") => {
            if !write {
                return not_allowed();
            }
            let token = token_of(&req);
            let body = match read_body(req.into_body()).await {
                Ok(b) => b,
                Err(r) => return r.into(),
            };
            if let Err(refused) = acl_write(state, &token, head, tail, &body) {
                return *refused;
            }
            match (head, tail) {
                ("catalog", "register") => catalog_register(state, &body),
                ("catalog", "deregister") => catalog_deregister(state, &body),
                ("txn", _) => txn(state, &body),
                ("session", _) => session_create(state, &body),
                _ => config_put(state, &body),
            }
        }
        ("session", t) if t.starts_with("renew/") || t.starts_with("destroy/") => {
            if !write {
                return not_allowed();
            }
            if let Err(refused) = acl_write(state, &token_of(&req), head, t, b"") {
                return *refused;
            }
            let (op, id) = t.split_once('/').expect("checked prefix");
            if id.is_empty() {
                return text(StatusCode::BAD_REQUEST, "Missing session");
            }
            if op == "renew" {
                session_renew(state, id)
            } else {
                session_destroy(state, id)
            }
        }
        ("session", t) if t.starts_with("info/") => {
            if method != Method::GET {
                return not_allowed();
            }
            let id = &t["info/".len()..];
            let found: Vec<Session> = state.sessions().get(id).cloned().into_iter().collect();
            json_response(StatusCode::OK, &found)
        }
        ("config", t) if t.contains('/') => {
            let (kind, name) = t.split_once('/').expect("checked");
            match method {
                Method::DELETE => config_delete(state, kind, name),
                Method::GET => config_get(state, kind, name),
                _ => not_allowed(),
            }
        }
        ("health", t) if t.starts_with("service/") => {
            if method != Method::GET {
                return not_allowed();
            }
            let passing = query
                .split('&')
                .any(|kv| kv == "passing" || kv.starts_with("passing="));
            health_service(state, &t["service/".len()..], passing)
        }
        ("status", "leader") => {
            if method != Method::GET {
                return not_allowed();
            }
            json_response(StatusCode::OK, &state.leader_addr().to_string())
        }
        _ => text(StatusCode::NOT_FOUND, "404 page not found\n"),
    }
}

/// A refused request: status and `text/plain` body.
struct Reject(StatusCode, String);

impl From<Reject> for Response<Body> {
    fn from(r: Reject) -> Self {
        text(r.0, r.1)
    }
}

async fn read_body(body: Incoming) -> Result<Bytes, Reject> {
    match Limited::new(body, MAX_BODY).collect().await {
        Ok(b) => Ok(b.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(Reject(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("Request body too large, max size: {MAX_BODY} bytes"),
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

/// `null` → `T::default()` (Go marshals nil maps and slices as `null`).
fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RegisterBody {
    #[serde(rename = "ID", deserialize_with = "nullable")]
    id: String,
    #[serde(rename = "Node", deserialize_with = "nullable")]
    node: String,
    #[serde(rename = "Address", deserialize_with = "nullable")]
    address: String,
    #[serde(rename = "TaggedAddresses", deserialize_with = "nullable")]
    tagged_addresses: BTreeMap<String, String>,
    #[serde(rename = "NodeMeta", deserialize_with = "nullable")]
    node_meta: BTreeMap<String, String>,
    #[serde(rename = "Service")]
    service: Option<ServiceBody>,
    #[serde(rename = "Check")]
    check: Option<CheckBody>,
    #[serde(rename = "Checks", deserialize_with = "nullable")]
    checks: Vec<CheckBody>,
    #[serde(rename = "SkipNodeUpdate", deserialize_with = "nullable")]
    skip_node_update: bool,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ServiceBody {
    #[serde(rename = "ID", deserialize_with = "nullable")]
    id: String,
    #[serde(rename = "Service", deserialize_with = "nullable")]
    service: String,
    #[serde(rename = "Kind", deserialize_with = "nullable")]
    kind: String,
    #[serde(rename = "Tags", deserialize_with = "nullable")]
    tags: Vec<String>,
    #[serde(rename = "Address", deserialize_with = "nullable")]
    address: String,
    #[serde(rename = "Port", deserialize_with = "nullable")]
    port: i32,
    #[serde(rename = "Meta", deserialize_with = "nullable")]
    meta: BTreeMap<String, String>,
    #[serde(rename = "Proxy")]
    proxy: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct CheckBody {
    #[serde(rename = "Node", deserialize_with = "nullable")]
    node: String,
    #[serde(rename = "CheckID", deserialize_with = "nullable")]
    check_id: String,
    #[serde(rename = "Name", deserialize_with = "nullable")]
    name: String,
    #[serde(rename = "Status", deserialize_with = "nullable")]
    status: String,
    #[serde(rename = "Notes", deserialize_with = "nullable")]
    notes: String,
    #[serde(rename = "Output", deserialize_with = "nullable")]
    output: String,
    #[serde(rename = "ServiceID", deserialize_with = "nullable")]
    service_id: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct DeregisterBody {
    #[serde(rename = "Node", deserialize_with = "nullable")]
    node: String,
    #[serde(rename = "ServiceID", deserialize_with = "nullable")]
    service_id: String,
    #[serde(rename = "CheckID", deserialize_with = "nullable")]
    check_id: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct NodeBody {
    #[serde(rename = "ID", deserialize_with = "nullable")]
    id: String,
    #[serde(rename = "Node", deserialize_with = "nullable")]
    node: String,
    #[serde(rename = "Address", deserialize_with = "nullable")]
    address: String,
    #[serde(rename = "TaggedAddresses", deserialize_with = "nullable")]
    tagged_addresses: BTreeMap<String, String>,
    #[serde(rename = "Meta", deserialize_with = "nullable")]
    meta: BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct TxnOpBody {
    #[serde(rename = "KV")]
    kv: Option<Value>,
    #[serde(rename = "Node")]
    node: Option<TxnNodeOp>,
    #[serde(rename = "Service")]
    service: Option<TxnServiceOp>,
    #[serde(rename = "Check")]
    check: Option<TxnCheckOp>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct TxnNodeOp {
    #[serde(rename = "Verb", deserialize_with = "nullable")]
    verb: String,
    #[serde(rename = "Node")]
    node: NodeBody,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct TxnServiceOp {
    #[serde(rename = "Verb", deserialize_with = "nullable")]
    verb: String,
    #[serde(rename = "Node", deserialize_with = "nullable")]
    node: String,
    #[serde(rename = "Service")]
    service: ServiceBody,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct TxnCheckOp {
    #[serde(rename = "Verb", deserialize_with = "nullable")]
    verb: String,
    #[serde(rename = "Check")]
    check: CheckBody,
}

fn node_def(
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

fn service_def(b: ServiceBody) -> Result<ServiceDef, WriteError> {
    if b.service.is_empty() {
        return Err(WriteError(
            "Must provide service name (Service.Service)".into(),
        ));
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
    })
}

fn check_def(b: CheckBody) -> Result<CheckDef, WriteError> {
    let check_id = if b.check_id.is_empty() {
        b.name.clone()
    } else {
        b.check_id
    };
    if check_id.is_empty() {
        return Err(WriteError("Must provide a check ID or name".into()));
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

// ---------------------------------------------------------------- JSON views

fn node_json(store: &Store, name: &str, n: &NodeEntry) -> Value {
    json!({
        "ID": n.def.id,
        "Node": name,
        "Address": n.def.address,
        "Datacenter": store.datacenter,
        "TaggedAddresses": if n.def.tagged_addresses.is_empty() { Value::Null } else { json!(n.def.tagged_addresses) },
        "Meta": n.def.meta,
        "CreateIndex": n.create_index,
        "ModifyIndex": n.modify_index,
    })
}

fn service_json(s: &ServiceEntry) -> Value {
    json!({
        "Kind": s.def.kind,
        "ID": s.def.id,
        "Service": s.def.service,
        "Tags": s.def.tags,
        "Address": s.def.address,
        "Meta": s.def.meta,
        "Port": s.def.port,
        "Proxy": s.def.proxy.clone().unwrap_or_else(|| json!({})),
        "CreateIndex": s.create_index,
        "ModifyIndex": s.modify_index,
    })
}

fn check_json(node: &str, c: &CheckEntry) -> Value {
    json!({
        "Node": node,
        "CheckID": c.def.check_id,
        "Name": c.def.name,
        "Status": c.def.status,
        "Notes": c.def.notes,
        "Output": c.def.output,
        "ServiceID": c.def.service_id,
        "ServiceName": c.def.service_name,
        "CreateIndex": c.create_index,
        "ModifyIndex": c.modify_index,
    })
}

// ---------------------------------------------------------------- catalog

fn catalog_register(state: &ConsulState, body: &[u8]) -> Response<Body> {
    let b: RegisterBody = match decode(body) {
        Ok(b) => b,
        Err(r) => return r.into(),
    };
    if b.node.is_empty() {
        return server_error("Must provide node");
    }
    if b.address.is_empty() && !b.skip_node_update {
        return server_error("Must provide address if SkipNodeUpdate is not set");
    }
    let service = match b.service.map(service_def).transpose() {
        Ok(s) => s,
        Err(e) => return e.into(),
    };
    let mut checks = Vec::new();
    for c in b.check.into_iter().chain(b.checks) {
        if !c.node.is_empty() && c.node != b.node {
            return server_error("Check node must match the registration node");
        }
        match check_def(c) {
            // Gossip health of a node that is no gossip member: accepted, never stored.
            Ok(c) if c.check_id == SERF_HEALTH => {}
            Ok(c) => checks.push(c),
            Err(e) => return e.into(),
        }
    }

    let mut store = state.store();
    let node_exists = store.nodes.contains_key(&b.node);
    let write_node = !(b.skip_node_update && node_exists);
    if !write_node && b.address.is_empty() && !node_exists {
        return WriteError::missing_node().into();
    }
    for c in &checks {
        let own = service.as_ref().is_some_and(|s| s.id == c.service_id);
        let known = store
            .nodes
            .get(&b.node)
            .is_some_and(|n| n.services.contains_key(&c.service_id));
        if !c.service_id.is_empty() && !own && !known {
            return server_error("Missing service registration");
        }
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
    match applied {
        Ok(()) => {
            let c = &state.inner.counters;
            c.bump(&c.registrations);
            ok_true()
        }
        Err(e) => e.into(),
    }
}

fn catalog_deregister(state: &ConsulState, body: &[u8]) -> Response<Body> {
    let b: DeregisterBody = match decode(body) {
        Ok(b) => b,
        Err(r) => return r.into(),
    };
    if b.node.is_empty() {
        return server_error("Must provide node");
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
        // A node's sessions die with it.
        state.sessions().remove_node(&b.node);
    }
    drop(store);
    let c = &state.inner.counters;
    c.bump(&c.deregistrations);
    ok_true()
}

// ---------------------------------------------------------------- txn

enum Op {
    NodeSet(String, NodeDef),
    NodeGet(String),
    NodeDelete(String),
    ServiceSet(String, ServiceDef),
    ServiceGet(String, String),
    ServiceDelete(String, String),
    CheckSet(String, CheckDef),
    CheckGet(String, String),
    CheckDelete(String, String),
}

impl Op {
    fn is_write(&self) -> bool {
        !matches!(self, Op::NodeGet(_) | Op::ServiceGet(..) | Op::CheckGet(..))
    }
}

fn parse_op(body: TxnOpBody) -> Result<Op, String> {
    if body.kv.is_some() {
        return Err("KV operations are not supported by this target".into());
    }
    if let Some(n) = body.node {
        let name = n.node.node.clone();
        if name.is_empty() {
            return Err("Must provide node".into());
        }
        return match n.verb.as_str() {
            "set" | "cas" => Ok(Op::NodeSet(
                name,
                node_def(
                    n.node.id,
                    n.node.address,
                    n.node.meta,
                    n.node.tagged_addresses,
                ),
            )),
            "get" => Ok(Op::NodeGet(name)),
            "delete" | "delete-cas" => Ok(Op::NodeDelete(name)),
            v => Err(format!("unknown node verb {v:?}")),
        };
    }
    if let Some(s) = body.service {
        let node = s.node;
        return match s.verb.as_str() {
            "set" | "cas" => service_def(s.service)
                .map(|d| Op::ServiceSet(node, d))
                .map_err(|e| e.0),
            "get" => Ok(Op::ServiceGet(node, s.service.id)),
            "delete" | "delete-cas" => Ok(Op::ServiceDelete(node, s.service.id)),
            v => Err(format!("unknown service verb {v:?}")),
        };
    }
    if let Some(c) = body.check {
        let node = c.check.node.clone();
        return match c.verb.as_str() {
            "set" | "cas" => check_def(c.check)
                .map(|d| Op::CheckSet(node, d))
                .map_err(|e| e.0),
            "get" => Ok(Op::CheckGet(node, c.check.check_id)),
            "delete" | "delete-cas" => Ok(Op::CheckDelete(node, c.check.check_id)),
            v => Err(format!("unknown check verb {v:?}")),
        };
    }
    Err("operation has no KV, Node, Service or Check".into())
}

/// Replays the ops' effect on existence, so that a txn either applies whole
/// or not at all.
fn validate(store: &Store, ops: &[Op]) -> Vec<(usize, String)> {
    let mut nodes: HashMap<&str, bool> = HashMap::new();
    let mut services: HashMap<(&str, &str), bool> = HashMap::new();
    let mut deleted: HashSet<&str> = HashSet::new();
    let mut errors = Vec::new();
    let node_exists = |nodes: &HashMap<&str, bool>, n: &str| {
        nodes
            .get(n)
            .copied()
            .unwrap_or_else(|| store.nodes.contains_key(n))
    };
    let service_exists = |nodes: &HashMap<&str, bool>,
                          services: &HashMap<(&str, &str), bool>,
                          deleted: &HashSet<&str>,
                          n: &str,
                          id: &str| {
        node_exists(nodes, n)
            && services.get(&(n, id)).copied().unwrap_or_else(|| {
                !deleted.contains(n)
                    && store
                        .nodes
                        .get(n)
                        .is_some_and(|x| x.services.contains_key(id))
            })
    };
    for (i, op) in ops.iter().enumerate() {
        let problem = match op {
            Op::NodeSet(n, _) => {
                nodes.insert(n, true);
                None
            }
            Op::NodeDelete(n) => {
                nodes.insert(n, false);
                deleted.insert(n);
                services.retain(|(sn, _), _| sn != n);
                None
            }
            Op::NodeGet(n) => {
                (!node_exists(&nodes, n)).then(|| format!("node {n:?} doesn't exist"))
            }
            Op::ServiceSet(n, d) => {
                if node_exists(&nodes, n) {
                    services.insert((n, &d.id), true);
                    None
                } else {
                    Some(WriteError::missing_node().0)
                }
            }
            Op::ServiceDelete(n, id) => {
                services.insert((n, id), false);
                None
            }
            Op::ServiceGet(n, id) => (!service_exists(&nodes, &services, &deleted, n, id))
                .then(|| format!("service {id:?} on node {n:?} doesn't exist")),
            Op::CheckSet(n, d) => {
                if !node_exists(&nodes, n) {
                    Some(WriteError::missing_node().0)
                } else if !d.service_id.is_empty()
                    && !service_exists(&nodes, &services, &deleted, n, &d.service_id)
                {
                    Some("Missing service registration".into())
                } else {
                    None
                }
            }
            Op::CheckDelete(..) | Op::CheckGet(..) => None,
        };
        if let Some(what) = problem {
            errors.push((i, what));
        }
    }
    errors
}

fn txn(state: &ConsulState, body: &[u8]) -> Response<Body> {
    let raw: Vec<TxnOpBody> = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("Failed to parse body: {e}"),
            );
        }
    };
    if raw.len() > MAX_TXN_OPS {
        return text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "Transaction contains too many operations ({} > {MAX_TXN_OPS})",
                raw.len()
            ),
        );
    }
    let mut ops = Vec::with_capacity(raw.len());
    let mut errors = Vec::new();
    for (i, r) in raw.into_iter().enumerate() {
        match parse_op(r) {
            Ok(op) => ops.push(op),
            Err(what) => errors.push((i, what)),
        }
    }
    let mut store = state.store();
    if errors.is_empty() {
        errors = validate(&store, &ops);
    }
    if !errors.is_empty() {
        drop(store);
        let errors: Vec<Value> = errors
            .into_iter()
            .map(|(i, what)| json!({"OpIndex": i, "What": what}))
            .collect();
        return json_response(
            StatusCode::CONFLICT,
            &json!({"Results": Value::Null, "Errors": errors}),
        );
    }
    let writes = ops.iter().any(Op::is_write);
    let idx = if writes {
        store.next_index()
    } else {
        store.raft_index
    };
    let mut t = Touched::default();
    let mut results = Vec::new();
    let (mut registered, mut deregistered) = (0u64, 0u64);
    let mut removed_nodes = Vec::new();
    for op in ops {
        let result = match op {
            Op::NodeSet(n, def) => {
                store.ensure_node(&n, def, idx, &mut t);
                let e = &store.nodes[&n];
                Some(json!({"Node": node_json(&store, &n, e)}))
            }
            Op::NodeGet(n) => store
                .nodes
                .get(&n)
                .map(|e| json!({"Node": node_json(&store, &n, e)})),
            Op::NodeDelete(n) => {
                if store.delete_node(&n, &mut t) {
                    removed_nodes.push(n);
                }
                deregistered += 1;
                None
            }
            Op::ServiceSet(n, def) => {
                let id = def.id.clone();
                // Validated above: the node exists.
                let _ = store.ensure_service(&n, def, idx, &mut t);
                registered += 1;
                store
                    .service(&(n, id))
                    .map(|s| json!({"Service": service_json(s)}))
            }
            Op::ServiceGet(n, id) => store
                .service(&(n, id))
                .map(|s| json!({"Service": service_json(s)})),
            Op::ServiceDelete(n, id) => {
                store.delete_service(&n, &id, &mut t);
                deregistered += 1;
                None
            }
            Op::CheckSet(n, def) => {
                if def.check_id == SERF_HEALTH {
                    None
                } else {
                    let id = def.check_id.clone();
                    let _ = store.ensure_check(&n, def, idx, &mut t);
                    store
                        .nodes
                        .get(&n)
                        .and_then(|e| e.checks.get(&id))
                        .map(|c| json!({"Check": check_json(&n, c)}))
                }
            }
            Op::CheckGet(n, id) => store
                .nodes
                .get(&n)
                .and_then(|e| e.checks.get(&id))
                .map(|c| json!({"Check": check_json(&n, c)})),
            Op::CheckDelete(n, id) => {
                store.delete_check(&n, &id, &mut t);
                None
            }
        };
        results.extend(result);
    }
    if writes {
        store.commit(idx, t);
    }
    if !removed_nodes.is_empty() {
        let mut sessions = state.sessions();
        for n in &removed_nodes {
            sessions.remove_node(n);
        }
    }
    drop(store);
    let c = &state.inner.counters;
    c.bump(&c.txns);
    let ord = std::sync::atomic::Ordering::Relaxed;
    c.registrations.fetch_add(registered, ord);
    c.deregistrations.fetch_add(deregistered, ord);
    let results = if results.is_empty() {
        Value::Null
    } else {
        Value::Array(results)
    };
    with_index(
        json_response(
            StatusCode::OK,
            &json!({"Results": results, "Errors": Value::Null}),
        ),
        idx,
    )
}

// ---------------------------------------------------------------- sessions

#[derive(Deserialize, Default)]
#[serde(default)]
struct SessionBody {
    #[serde(rename = "Node", deserialize_with = "nullable")]
    node: String,
    #[serde(rename = "Name", deserialize_with = "nullable")]
    name: String,
    #[serde(rename = "TTL", deserialize_with = "nullable")]
    ttl: String,
    #[serde(rename = "Behavior", deserialize_with = "nullable")]
    behavior: String,
    #[serde(rename = "LockDelay")]
    lock_delay: Option<Value>,
    #[serde(rename = "NodeChecks")]
    node_checks: Option<Vec<String>>,
    #[serde(rename = "Checks")]
    checks: Option<Vec<String>>,
    #[serde(rename = "ServiceChecks")]
    service_checks: Option<Value>,
}

/// `LockDelay` as Consul reads it: nanoseconds or a duration string, values
/// under 1000 taken as seconds.
fn lock_delay(v: Option<&Value>) -> Result<Duration, String> {
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

fn session_create(state: &ConsulState, body: &[u8]) -> Response<Body> {
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

fn session_renew(state: &ConsulState, id: &str) -> Response<Body> {
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

fn session_destroy(state: &ConsulState, id: &str) -> Response<Body> {
    let mut store = state.store();
    store.next_index();
    state.sessions().remove(id);
    drop(store);
    ok_true()
}

// ---------------------------------------------------------------- config entries

#[derive(Deserialize)]
struct SourceBody {
    #[serde(rename = "Name", default, deserialize_with = "nullable")]
    name: String,
    #[serde(rename = "Action", default, deserialize_with = "nullable")]
    action: String,
    #[serde(rename = "Description", default, deserialize_with = "nullable")]
    description: String,
}

fn config_put(state: &ConsulState, body: &[u8]) -> Response<Body> {
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
    let idx = store.next_index();
    store.put_config(&kind, &name, v, sources, idx);
    drop(store);
    let c = &state.inner.counters;
    c.bump(&c.config_entries_written);
    ok_true()
}

fn config_delete(state: &ConsulState, kind: &str, name: &str) -> Response<Body> {
    let mut store = state.store();
    let idx = store.next_index();
    store.delete_config(&kind.to_ascii_lowercase(), name, idx);
    drop(store);
    let c = &state.inner.counters;
    c.bump(&c.config_entries_written);
    ok_true()
}

fn config_get(state: &ConsulState, kind: &str, name: &str) -> Response<Body> {
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

// ---------------------------------------------------------------- health

fn health_service(state: &ConsulState, name: &str, passing_only: bool) -> Response<Body> {
    let store = state.store();
    let mut out = Vec::new();
    for key in store.instances(name) {
        let Some(n) = store.nodes.get(&key.0) else {
            continue;
        };
        let Some(s) = n.services.get(&key.1) else {
            continue;
        };
        let checks: Vec<&CheckEntry> = n
            .checks
            .values()
            .filter(|c| c.def.service_id.is_empty() || c.def.service_id == key.1)
            .collect();
        if passing_only && checks.iter().any(|c| c.def.status != "passing") {
            continue;
        }
        out.push(json!({
            "Node": node_json(&store, &key.0, n),
            "Service": service_json(s),
            "Checks": checks.iter().map(|c| check_json(&key.0, c)).collect::<Vec<_>>(),
        }));
    }
    let index = store.raft_index;
    drop(store);
    with_index(json_response(StatusCode::OK, &out), index)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pretty_json_matches_the_dev_agent_layout() {
        let body = pretty(&json!({"ID": "003f28ee-cd88-2631-0c91-50469e4ac804"}));
        assert_eq!(
            String::from_utf8(body).unwrap(),
            "{\n    \"ID\": \"003f28ee-cd88-2631-0c91-50469e4ac804\"\n}"
        );
        assert_eq!(pretty(&true), b"true");
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
    fn txn_validation_is_all_or_nothing() {
        let mut store = Store::new("dc1".into(), 4);
        let ops = vec![
            Op::NodeSet("n1".into(), NodeDef::default()),
            Op::ServiceSet(
                "n1".into(),
                ServiceDef {
                    id: "a".into(),
                    service: "a".into(),
                    ..Default::default()
                },
            ),
            Op::ServiceSet(
                "n2".into(),
                ServiceDef {
                    id: "b".into(),
                    service: "b".into(),
                    ..Default::default()
                },
            ),
        ];
        let errors = validate(&store, &ops);
        assert_eq!(errors, vec![(2, "Missing node registration".to_owned())]);
        let mut t = Touched::default();
        store.ensure_node("n2", NodeDef::default(), 1, &mut t);
        assert!(validate(&store, &ops).is_empty());
        let ops = vec![
            Op::NodeDelete("n2".into()),
            Op::CheckSet(
                "n2".into(),
                CheckDef {
                    check_id: "c".into(),
                    ..Default::default()
                },
            ),
        ];
        assert_eq!(validate(&store, &ops).len(), 1);
    }
}
