//! The Consul HTTP API subset the fleet uses (catalog, txn, sessions,
//! config entries): one shared hyper HTTP/1 client with a small pool
//! (at most [`MAX_HTTP_CONNS`] requests — hence connections — at once),
//! the request bodies, and the response types.
//!
//! Failures become short error kinds (`http_429`, `http_5xx`, `http_io`, ...)
//! for the error counters; nothing here panics or retries.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ::http::{HeaderValue, Method, Request, StatusCode};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use agent_sim_net::MaybeTlsStream;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::Semaphore;

/// Most HTTP requests (and so pooled connections) in flight at once.
pub const MAX_HTTP_CONNS: usize = 64;
/// How long a pooled keep-alive connection may sit idle before the client
/// drops it: less than the 30 s after which `agent-sim serve` (hyper's
/// header read timeout) and many proxies close one. With the same 30 s on
/// both sides, a request sent as the server closed its connection failed
/// with `connection closed before message completed` (`http_io`, once in a
/// 5-minute soak of 27,000 reconnects).
pub const POOL_IDLE: Duration = Duration::from_secs(20);
/// Per-request timeout.
pub const HTTP_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest response body an agent's call reads. Agents read small answers
/// (`true`, a session ID, one node's services, a txn reply that echoes at
/// most 128 ops ≈ 100 KiB); 4 MiB is far above them and bounds what a
/// broken server can make one call buffer (64 calls at once: 256 MiB at
/// worst). Over it: kind `http_body_too_large`.
pub const MAX_BODY: usize = 4 << 20;
/// Largest list body `agent-sim cleanup` reads (`/v1/catalog/nodes`,
/// `/v1/session/list` of a whole cluster: ≈400 bytes per node as a `-dev`
/// server prints it, so 64 MiB holds ≈150,000 nodes). One call at a time.
pub const MAX_LIST_BODY: usize = 64 << 20;
/// Read buffer limit of the HTTP/1 client: the response head must fit
/// (Consul's are < 1 KiB), bodies stream through it in pieces.
pub const HTTP1_MAX_BUF: usize = 64 * 1024;

/// Node name of the probe controller's instance.
pub const PROBE_NODE: &str = "agent-sim-probe";
/// Source name in probe intentions.
pub const PROBE_SOURCE: &str = "agent-sim-probe";

/// A failed HTTP call: the counted kind, and status/body when there was a reply.
#[derive(Debug, Clone)]
pub struct HttpError {
    /// Error kind for the counters.
    pub kind: &'static str,
    /// Response status, if any.
    pub status: Option<u16>,
    /// Response body, if any.
    pub body: Bytes,
    /// Without a reply: what the transport said (one line).
    pub detail: Option<String>,
}

impl HttpError {
    pub(crate) fn io(kind: &'static str) -> Self {
        HttpError {
            kind,
            status: None,
            body: Bytes::new(),
            detail: None,
        }
    }

    fn transport(kind: &'static str, detail: String) -> Self {
        HttpError {
            detail: Some(detail),
            ..Self::io(kind)
        }
    }

    /// The server's words: `HTTP <status>: <body>` (bounded), when there
    /// was a reply; else what the transport said, if anything.
    pub fn words(&self) -> Option<String> {
        let Some(status) = self.status else {
            return self.detail.clone();
        };
        let body = String::from_utf8_lossy(&self.body[..self.body.len().min(512)]);
        let body = body.trim();
        Some(if body.is_empty() {
            format!("HTTP {status}")
        } else {
            format!("HTTP {status}: {body}")
        })
    }
}

/// A failed operation as the agents count it: the kind, and the server's
/// words when it answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Error kind.
    pub kind: &'static str,
    /// What the server said.
    pub words: Option<String>,
}

impl Refusal {
    /// A refusal without words.
    pub fn kind(kind: &'static str) -> Self {
        Refusal { kind, words: None }
    }
}

impl From<HttpError> for Refusal {
    fn from(e: HttpError) -> Self {
        Refusal {
            kind: e.kind,
            words: e.words(),
        }
    }
}

/// Error kind of an answer, from what the server said where that names the
/// cause better than the status (as Consul 1.20 words it).
pub fn answer_kind(status: u16, body: &[u8]) -> &'static str {
    let text = String::from_utf8_lossy(&body[..body.len().min(4096)]);
    cause_kind(&text).unwrap_or_else(|| status_kind(status))
}

/// The kind of a cause Consul names in its words, if any (HTTP bodies, txn
/// errors and gRPC status messages use the same texts).
pub fn cause_kind(text: &str) -> Option<&'static str> {
    if text.contains("ACL not found") {
        Some("acl_not_found")
    } else if text.contains("Permission denied") {
        Some("acl_denied")
    } else if text.contains("Missing node registration") {
        Some("missing_node_registration")
    } else if text.contains("No cluster leader") {
        Some("no_cluster_leader")
    } else if text.contains("server is shutting down") {
        Some("server_shutting_down")
    } else if text.contains("Invalid Session TTL") {
        Some("session_ttl_invalid")
    } else {
        None
    }
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.kind)?;
        if let Some(s) = self.status {
            write!(f, " ({s}: {})", String::from_utf8_lossy(&self.body))?;
        }
        Ok(())
    }
}

/// An error and its sources in one line (`a: b: c`), each said once.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let t = s.to_string();
        if !out.contains(&t) {
            out.push_str(": ");
            out.push_str(&t);
        }
        src = s.source();
    }
    out
}

/// Error kind of a non-success status.
pub fn status_kind(status: u16) -> &'static str {
    match status {
        400 => "http_400",
        403 => "http_403",
        404 => "http_404",
        409 => "http_409",
        429 => "http_429",
        500..=599 => "http_5xx",
        _ => "http_4xx",
    }
}

/// Dials the HTTP API for hyper-util's pool: TCP to the one resolved
/// address, then TLS when the target is `https://`.
#[derive(Clone)]
struct ApiConnector {
    addr: SocketAddr,
    tls: Option<(tokio_rustls::TlsConnector, ServerName<'static>)>,
    bytes: Option<crate::conn::ByteCounters>,
}

/// The pooled connection: plain or TLS.
struct ApiStream(crate::conn::Counted<MaybeTlsStream>);

impl Connection for ApiStream {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl tokio::io::AsyncRead for ApiStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for ApiStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

type ConnectFuture =
    Pin<Box<dyn Future<Output = Result<TokioIo<ApiStream>, std::io::Error>> + Send>>;

impl tower_service::Service<::http::Uri> for ApiConnector {
    type Response = TokioIo<ApiStream>;
    type Error = std::io::Error;
    type Future = ConnectFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: ::http::Uri) -> ConnectFuture {
        let this = self.clone();
        Box::pin(async move {
            let tcp =
                tokio::time::timeout(Duration::from_secs(5), agent_sim_net::dial(this.addr, None))
                    .await
                    .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
            let io = match this.tls {
                None => MaybeTlsStream::Plain(tcp),
                Some((connector, name)) => {
                    MaybeTlsStream::Tls(Box::new(connector.connect(name, tcp).await?))
                }
            };
            Ok(TokioIo::new(ApiStream(crate::conn::Counted::new(
                io, this.bytes,
            ))))
        })
    }
}

/// TLS of the HTTP API: the client config and the name to verify.
pub type ApiTls = (Arc<rustls::ClientConfig>, ServerName<'static>);

/// Shared client for a server's HTTP API.
pub struct HttpApi {
    client: Client<ApiConnector, Full<Bytes>>,
    base: String,
    dc_query: String,
    token: Option<HeaderValue>,
    gate: Arc<Semaphore>,
}

impl std::fmt::Debug for HttpApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpApi").field("base", &self.base).finish()
    }
}

impl HttpApi {
    /// A plain HTTP client for `addr` (resolved once), with token and
    /// datacenter.
    pub fn new(addr: SocketAddr, token: Option<&str>, datacenter: &str) -> Result<Self, String> {
        Self::with_tls(addr, None, token, datacenter)
    }

    /// A client for `addr`, over TLS when `tls` is given (HTTPS).
    pub fn with_tls(
        addr: SocketAddr,
        tls: Option<ApiTls>,
        token: Option<&str>,
        datacenter: &str,
    ) -> Result<Self, String> {
        Self::counted(addr, tls, token, datacenter, None)
    }

    /// [`HttpApi::with_tls`], the bytes of its connections counted.
    pub fn counted(
        addr: SocketAddr,
        tls: Option<ApiTls>,
        token: Option<&str>,
        datacenter: &str,
        bytes: Option<crate::conn::ByteCounters>,
    ) -> Result<Self, String> {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let conn = ApiConnector {
            addr,
            tls: tls.map(|(cfg, name)| (tokio_rustls::TlsConnector::from(cfg), name)),
            bytes,
        };
        let client = Client::builder(TokioExecutor::new())
            .http1_max_buf_size(HTTP1_MAX_BUF)
            .pool_max_idle_per_host(MAX_HTTP_CONNS)
            .pool_idle_timeout(POOL_IDLE)
            .build(conn);
        let token = match token {
            Some(t) if !t.is_empty() => {
                Some(HeaderValue::from_str(t).map_err(|_| "token is not a valid header value")?)
            }
            _ => None,
        };
        let dc_query = if datacenter.is_empty() {
            String::new()
        } else {
            format!("dc={datacenter}")
        };
        Ok(HttpApi {
            client,
            base: format!("{scheme}://{addr}"),
            dc_query,
            token,
            // Bound: MAX_HTTP_CONNS calls (and connections) at once, each
            // reading at most MAX_BODY (or its own limit).
            gate: Arc::new(Semaphore::new(MAX_HTTP_CONNS)),
        })
    }

    /// `PUT path` with a body; `Ok(body)` on 200.
    pub async fn put(&self, path: &str, body: Bytes) -> Result<Bytes, HttpError> {
        self.call(Method::PUT, path, body).await
    }

    /// One request; at most [`MAX_HTTP_CONNS`] run at once; the answer is
    /// read up to [`MAX_BODY`].
    pub async fn call(&self, method: Method, path: &str, body: Bytes) -> Result<Bytes, HttpError> {
        self.call_limited(method, path, body, MAX_BODY).await
    }

    /// [`HttpApi::call`] reading an answer of up to `limit` bytes.
    pub async fn call_limited(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
        limit: usize,
    ) -> Result<Bytes, HttpError> {
        let _permit = self
            .gate
            .acquire()
            .await
            .map_err(|_| HttpError::io("http_closed"))?;
        let sep = if path.contains('?') { '&' } else { '?' };
        let uri = if self.dc_query.is_empty() {
            format!("{}{}", self.base, path)
        } else {
            format!("{}{}{}{}", self.base, path, sep, self.dc_query)
        };
        let mut req = Request::builder().method(method).uri(uri);
        if let Some(t) = &self.token {
            req = req.header("X-Consul-Token", t.clone());
        }
        if !body.is_empty() {
            req = req.header(::http::header::CONTENT_TYPE, "application/json");
        }
        let req = req
            .body(Full::new(body))
            .map_err(|_| HttpError::io("http_request"))?;
        let fut = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| HttpError::transport("http_io", error_chain(&e)))?;
            let status = resp.status();
            let body = http_body_util::Limited::new(resp.into_body(), limit)
                .collect()
                .await
                .map_err(|e| {
                    if e.is::<http_body_util::LengthLimitError>() {
                        HttpError::transport(
                            "http_body_too_large",
                            format!("HTTP {status}: answer over the {limit}-byte limit"),
                        )
                    } else {
                        HttpError::transport("http_io", error_chain(&*e))
                    }
                })?
                .to_bytes();
            Ok::<_, HttpError>((status, body))
        };
        let (status, body) = tokio::time::timeout(HTTP_TIMEOUT, fut)
            .await
            .map_err(|_| {
                HttpError::transport(
                    "http_timeout",
                    format!("no answer within {}s", HTTP_TIMEOUT.as_secs()),
                )
            })??;
        if status == StatusCode::OK {
            Ok(body)
        } else {
            Err(HttpError {
                kind: answer_kind(status.as_u16(), &body),
                status: Some(status.as_u16()),
                body,
                detail: None,
            })
        }
    }
}

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

/// Node name of agent `index`.
pub fn node_name(prefix: &str, index: u64) -> String {
    format!("{prefix}-{index}")
}

/// A unique 10.x.y.z address for agent `index`.
pub fn node_address(index: u64) -> String {
    format!(
        "10.{}.{}.{}",
        (index >> 16) & 0xff,
        (index >> 8) & 0xff,
        index & 0xff
    )
}

/// Service ID of instance `k` of agent `index`.
pub fn instance_id(service: &str, index: u64, k: u32) -> String {
    format!("{service}-{index}-{k}")
}

/// Check ID of an instance's health check.
pub fn check_id(service_id: &str) -> String {
    format!("service:{service_id}")
}

/// Service ID of the probe controller's instance.
pub fn probe_instance_id(prefix: &str) -> String {
    format!("{PROBE_NODE}-{prefix}")
}

/// The node the catalog probe registers its instance on.
pub fn probe_node(prefix: &str) -> String {
    format!("{prefix}-probe")
}

/// Node meta key naming the run's `name_prefix` on every node (and config
/// entry) a run creates: what `agent-sim cleanup` selects on.
pub const META_PREFIX: &str = "agent-sim-prefix";

/// Node or config-entry meta, as the API prints it (absent or `null`: none).
pub type Meta = Option<std::collections::HashMap<String, String>>;

/// Whether `meta` marks an object as created by runs with name `prefix`.
pub fn marked_by(meta: &Meta, prefix: &str) -> bool {
    meta.as_ref()
        .and_then(|m| m.get(META_PREFIX))
        .is_some_and(|p| p == prefix)
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

/// What one agent registers.
#[derive(Debug, Clone)]
pub struct Registration<'a> {
    /// Node name.
    pub node: &'a str,
    /// Node address.
    pub address: &'a str,
    /// Agent index.
    pub index: u64,
    /// Service name of the instances.
    pub service: &'a str,
    /// Instances.
    pub instances: u32,
    /// With a connect-proxy sidecar per instance.
    pub sidecars: bool,
    /// Upstreams of the sidecars.
    pub upstreams: &'a [String],
    /// The run's name prefix (node meta [`META_PREFIX`]).
    pub prefix: &'a str,
}

/// One service instance as registered: ID, service name, port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    /// Service ID.
    pub id: String,
    /// Service name.
    pub service: String,
    /// Port.
    pub port: u32,
}

/// The instances (and sidecars) [`registration_ops`] registers.
pub fn expected_services(r: &Registration<'_>) -> Vec<Expected> {
    let mut out = Vec::new();
    for k in 0..r.instances {
        let id = instance_id(r.service, r.index, k);
        if r.sidecars {
            out.push(Expected {
                id: format!("{id}-sidecar-proxy"),
                service: format!("{}-sidecar-proxy", r.service),
                port: 21000 + k,
            });
        }
        out.push(Expected {
            id,
            service: r.service.to_owned(),
            port: 8080 + k,
        });
    }
    out
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

/// Txn ops (JSON, one per element) that register an agent's node, its
/// instances with one passing check each, and optional sidecars. Never a
/// `serfHealth` check.
pub fn registration_ops(r: &Registration<'_>) -> Vec<String> {
    let mut ops = Vec::with_capacity(1 + r.instances as usize * 3);
    ops.push(
        json!({"Node": {"Verb": "set", "Node": {
            "Node": r.node, "Address": r.address,
            "Meta": {"agent-sim": "1", META_PREFIX: r.prefix}}}})
        .to_string(),
    );
    for k in 0..r.instances {
        let id = instance_id(r.service, r.index, k);
        let port = 8080 + k;
        ops.push(
            json!({"Service": {"Verb": "set", "Node": r.node, "Service": {
                "ID": id, "Service": r.service, "Port": port, "Address": r.address,
                "Tags": ["agent-sim"]}}})
            .to_string(),
        );
        ops.push(
            json!({"Check": {"Verb": "set", "Check": {
                "Node": r.node, "CheckID": check_id(&id), "Name": format!("{} health", r.service),
                "Status": "passing", "ServiceID": id, "ServiceName": r.service}}})
            .to_string(),
        );
        if r.sidecars {
            let upstreams: Vec<_> = r
                .upstreams
                .iter()
                .enumerate()
                .map(|(j, u)| json!({"DestinationName": u, "LocalBindPort": 9191 + j}))
                .collect();
            ops.push(
                json!({"Service": {"Verb": "set", "Node": r.node, "Service": {
                    "ID": format!("{id}-sidecar-proxy"),
                    "Service": format!("{}-sidecar-proxy", r.service),
                    "Kind": "connect-proxy", "Port": 21000 + k, "Address": r.address,
                    "Proxy": {"DestinationServiceName": r.service, "DestinationServiceID": id,
                              "LocalServiceAddress": "127.0.0.1", "LocalServicePort": port,
                              "Upstreams": upstreams}}}})
                .to_string(),
            );
        }
    }
    ops
}

/// Txn op that removes a node with its services and checks.
pub fn deregistration_op(node: &str) -> String {
    json!({"Node": {"Verb": "delete", "Node": {"Node": node}}}).to_string()
}

/// `PUT /v1/catalog/register` body that sets one check's status only.
pub fn check_status_body(
    node: &str,
    address: &str,
    service_id: &str,
    service: &str,
    status: &str,
) -> String {
    json!({"Node": node, "Address": address, "SkipNodeUpdate": true, "Check": {
        "Node": node, "CheckID": check_id(service_id), "Name": format!("{service} health"),
        "Status": status, "ServiceID": service_id, "ServiceName": service}})
    .to_string()
}

/// `PUT /v1/session/create` body: a TTL session on a catalog-only node.
pub fn session_create_body(node: &str, ttl: &str) -> String {
    json!({"Node": node, "Name": "agent-sim", "TTL": ttl, "Behavior": "release",
           "NodeChecks": []})
    .to_string()
}

/// Address and port of the probe instance: the endpoint dataplane sidecars
/// see appear and disappear in the probe service's EDS cluster.
pub const PROBE_ENDPOINT: (&str, u32) = ("127.0.0.1", 1);

/// `PUT /v1/catalog/register` body of the probe instance, on the run's
/// own probe node. It is Connect-native, so it is also an endpoint of the
/// probe service's Envoy cluster (what dataplane sidecars watch).
pub fn probe_register_body(prefix: &str, service: &str, instance_id: &str) -> String {
    probe_change_body(prefix, service, instance_id, None)
}

/// [`probe_register_body`] with change number `change` in the instance's
/// metadata (`agent-sim-change`): each number is a new version of the
/// instance, the change `--change-every` makes.
pub fn probe_change_body(
    prefix: &str,
    service: &str,
    instance_id: &str,
    change: Option<u64>,
) -> String {
    let meta = match change {
        Some(n) => json!({"agent-sim-change": n.to_string()}),
        None => json!({}),
    };
    json!({"Node": probe_node(prefix), "Address": PROBE_ENDPOINT.0,
           "NodeMeta": {"agent-sim": "probe", META_PREFIX: prefix},
           "Service": {"ID": instance_id, "Service": service, "Port": PROBE_ENDPOINT.1,
                       "Address": PROBE_ENDPOINT.0, "Tags": ["agent-sim-probe"],
                       "Meta": meta, "Connect": {"Native": true}}})
    .to_string()
}

/// `PUT /v1/catalog/deregister` body of the probe instance.
pub fn probe_deregister_body(prefix: &str, instance_id: &str) -> String {
    json!({"Node": probe_node(prefix), "ServiceID": instance_id}).to_string()
}

/// `PUT /v1/catalog/deregister` body that removes a whole node (its
/// services, checks and sessions go with it).
pub fn node_deregister_body(node: &str) -> String {
    json!({ "Node": node }).to_string()
}

/// `PUT /v1/config` body of the probe's service-intentions entry, marked
/// as the run's own (`Meta`).
pub fn intentions_body(prefix: &str, service: &str, allow: bool) -> String {
    json!({"Kind": "service-intentions", "Name": service,
           "Meta": {"agent-sim": "probe", META_PREFIX: prefix},
           "Sources": [
        {"Name": PROBE_SOURCE, "Action": if allow { "allow" } else { "deny" }}]})
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration_has_no_serf_health_and_counts_ops() {
        let ups = vec!["web".to_string(), "api".to_string()];
        let r = Registration {
            node: "agent-sim-7",
            address: &node_address(7),
            index: 7,
            service: "app",
            instances: 2,
            sidecars: true,
            upstreams: &ups,
            prefix: "agent-sim",
        };
        let ops = registration_ops(&r);
        assert_eq!(ops.len(), 7);
        assert!(ops.iter().all(|o| !o.contains("serfHealth")));
        let v: serde_json::Value = serde_json::from_str(&ops[0]).unwrap();
        assert_eq!(v["Node"]["Node"]["Address"], "10.0.0.7");
        let v: serde_json::Value = serde_json::from_str(&ops[3]).unwrap();
        assert_eq!(v["Service"]["Service"]["Kind"], "connect-proxy");
        assert_eq!(
            v["Service"]["Service"]["Proxy"]["Upstreams"][1]["DestinationName"],
            "api"
        );
        let v: serde_json::Value = serde_json::from_str(&ops[2]).unwrap();
        assert_eq!(v["Check"]["Check"]["CheckID"], "service:app-7-0");

        // What anti-entropy expects is what the ops register.
        let mut registered: Vec<Expected> = ops
            .iter()
            .filter_map(|o| {
                let v: serde_json::Value = serde_json::from_str(o).unwrap();
                let s = v.get("Service")?.get("Service")?.clone();
                Some(Expected {
                    id: s["ID"].as_str()?.to_owned(),
                    service: s["Service"].as_str()?.to_owned(),
                    port: s["Port"].as_u64()? as u32,
                })
            })
            .collect();
        let mut expected = expected_services(&r);
        registered.sort_by(|a, b| a.id.cmp(&b.id));
        expected.sort_by(|a, b| a.id.cmp(&b.id));
        assert_eq!(registered, expected);
    }

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

    #[test]
    fn bodies_have_the_documented_shape() {
        let v: serde_json::Value = serde_json::from_str(&session_create_body("n", "30s")).unwrap();
        assert_eq!(v["NodeChecks"], json!([]));
        assert_eq!(v["TTL"], "30s");
        let v: serde_json::Value =
            serde_json::from_str(&check_status_body("n", "10.0.0.1", "s-1", "s", "warning"))
                .unwrap();
        assert_eq!(v["SkipNodeUpdate"], true);
        assert_eq!(v["Check"]["Status"], "warning");
        assert_eq!(status_kind(429), "http_429");
        assert_eq!(status_kind(503), "http_5xx");
        assert_eq!(node_address(70000), "10.1.17.112");
    }
}
