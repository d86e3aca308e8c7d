//! The Consul HTTP API subset the fleet uses (catalog, txn, sessions,
//! config entries): [`HttpApi`], one client shared by the fleet on the
//! project's pooled HTTP/1 client ([`agent_sim_net::http::Pool`]: at most
//! [`MAX_HTTP_CONNS`] requests, hence connections, at once), and what a
//! failed call counts as.
//!
//! - [`body`]: the names of what a run creates and the request bodies.
//! - [`answer`]: the answers the agents read.
//!
//! Failures become short error kinds (`http_429`, `http_5xx`, `http_io`, ...)
//! for the error counters; nothing here panics or retries.

pub mod answer;
pub mod body;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ::http::{HeaderValue, Method, Request};
use agent_sim_net::http::{self as net_http, Dest, Peer, Pool, PoolLimits};
use bytes::Bytes;
use http_body_util::Full;
use rustls::pki_types::ServerName;

use crate::ConsulError;
use crate::conn::ByteCounters;

pub use agent_sim_net::http::error_chain;
pub use answer::{
    EntryHead, SessionCreated, SessionEntry, TxnOpError, TxnResponse, node_in_sync, parse_bool,
};
pub use body::{
    Expected, META_PREFIX, Meta, PROBE_ENDPOINT, PROBE_NODE, PROBE_SOURCE, Registration, check_id,
    check_status_body, deregistration_op, expected_services, instance_id, intentions_body,
    marked_by, node_address, node_deregister_body, node_name, probe_change_body,
    probe_deregister_body, probe_instance_id, probe_node, probe_register_body, registration_ops,
    session_create_body,
};

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
/// How long a new pooled connection's TCP connect may take.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(5);
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
/// Read buffer limit of the HTTP/1 client (every connection of the
/// project's client has it): the response head must fit (Consul's are
/// < 1 KiB), bodies stream through it in pieces.
pub const HTTP1_MAX_BUF: usize = net_http::MAX_BUF;

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

    /// A refusal answered with `status` and `body`, kinded by what the
    /// server said.
    pub fn answered(status: u16, body: Bytes) -> Self {
        HttpError {
            kind: answer_kind(status, &body),
            status: Some(status),
            body,
            detail: None,
        }
    }

    /// The server's words: `HTTP <status>: <body>` (bounded), when there
    /// was a reply; else what the transport said, if anything.
    pub fn words(&self) -> Option<String> {
        match self.status {
            Some(status) => Some(net_http::status_words(status, &self.body)),
            None => self.detail.clone(),
        }
    }
}

impl From<net_http::Error> for HttpError {
    /// The kind a failed call of the shared client counts as.
    fn from(e: net_http::Error) -> Self {
        use net_http::Error as E;
        match e {
            E::Status { status, body } => HttpError::answered(status.as_u16(), body),
            E::TooLarge { .. } => HttpError::transport("http_body_too_large", e.to_string()),
            E::Timeout(_) => HttpError::transport("http_timeout", e.to_string()),
            E::Closed => HttpError::io("http_closed"),
            E::Request(_) => HttpError::io("http_request"),
            e => HttpError::transport("http_io", e.cause_words()),
        }
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

/// TLS of the HTTP API: the client config and the name to verify.
pub type ApiTls = (Arc<rustls::ClientConfig>, ServerName<'static>);

/// Shared client for a server's HTTP API.
pub struct HttpApi {
    pool: Pool<ByteCounters>,
    base: String,
    dc_query: String,
    token: Option<HeaderValue>,
}

impl std::fmt::Debug for HttpApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpApi").field("base", &self.base).finish()
    }
}

/// What every HTTP API client of this crate holds (the agents'
/// [`HttpApi`], the Vault servers' `vault::client`): a pool to `addr` (over
/// TLS when `tls` is given), its base URL and the token's header.
pub(crate) struct ApiConn {
    pub(crate) pool: Pool<ByteCounters>,
    pub(crate) base: String,
    pub(crate) token: Option<HeaderValue>,
}

/// Opens an [`ApiConn`] with `limits`.
pub(crate) fn api_conn(
    addr: SocketAddr,
    tls: Option<ApiTls>,
    token: Option<&str>,
    bytes: Option<ByteCounters>,
    limits: PoolLimits,
) -> Result<ApiConn, ConsulError> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let peer = Peer {
        dest: Dest::Addr(addr),
        bind: None,
        tls: tls.map(|(cfg, name)| (tokio_rustls::TlsConnector::from(cfg), name)),
    };
    let token = match token {
        Some(t) if !t.is_empty() => Some(HeaderValue::from_str(t).map_err(ConsulError::Token)?),
        _ => None,
    };
    Ok(ApiConn {
        pool: Pool::new(peer, bytes, limits),
        base: format!("{scheme}://{addr}"),
        token,
    })
}

impl HttpApi {
    /// A plain HTTP client for `addr` (resolved once), with token and
    /// datacenter.
    pub fn new(
        addr: SocketAddr,
        token: Option<&str>,
        datacenter: &str,
    ) -> Result<Self, ConsulError> {
        Self::with_tls(addr, None, token, datacenter)
    }

    /// A client for `addr`, over TLS when `tls` is given (HTTPS).
    pub fn with_tls(
        addr: SocketAddr,
        tls: Option<ApiTls>,
        token: Option<&str>,
        datacenter: &str,
    ) -> Result<Self, ConsulError> {
        Self::counted(addr, tls, token, datacenter, None)
    }

    /// [`HttpApi::with_tls`], the bytes of its connections counted.
    pub fn counted(
        addr: SocketAddr,
        tls: Option<ApiTls>,
        token: Option<&str>,
        datacenter: &str,
        bytes: Option<ByteCounters>,
    ) -> Result<Self, ConsulError> {
        let c = api_conn(
            addr,
            tls,
            token,
            bytes,
            PoolLimits {
                // Bound: MAX_HTTP_CONNS calls (and connections) at once, each
                // reading at most MAX_BODY (or its own limit).
                max_conns: MAX_HTTP_CONNS,
                idle: POOL_IDLE,
                dial_timeout: DIAL_TIMEOUT,
                timeout: HTTP_TIMEOUT,
            },
        )?;
        let dc_query = if datacenter.is_empty() {
            String::new()
        } else {
            format!("dc={datacenter}")
        };
        Ok(HttpApi {
            pool: c.pool,
            base: c.base,
            dc_query,
            token: c.token,
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
        Ok(self.pool.send(req, limit).await?.ok()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An agent's call is part of its session's future while it runs.
    #[tokio::test]
    async fn a_calls_future_stays_as_small_as_before_the_shared_client() {
        let api = HttpApi::new("127.0.0.1:1".parse().unwrap(), None, "").unwrap();
        let call = api.put("/v1/session/create", Bytes::new());
        let size = std::mem::size_of_val(&call);
        // hyper-util's client called inline: 1,064 bytes.
        assert!(size <= 1064, "call future {size} bytes");
    }
}
