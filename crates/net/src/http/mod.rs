//! The project's one HTTP/1 client, on hyper.
//!
//! - [`Peer`]: where a connection goes (an address, or a host name tried
//!   address by address), the source address it is dialed from, and TLS.
//! - [`Conn`]: one kept-alive connection, for callers that hold a
//!   connection of their own (a long poll per watched service, a scrape).
//! - [`Pool`]: connections shared by many callers, at most so many calls at
//!   once, idle ones dropped after a while.
//! - [`Error`]: why a call failed, each cause with its own variant and its
//!   source kept (dial, TLS, handshake, exchange, body, size, time, status).
//!
//! Every request carries [`USER_AGENT`]; every answer is read up to the
//! caller's limit. Bytes can be counted on any connection ([`crate::Counted`]).
//!
//! Why hyper: short HTTP/1 calls to a server's HTTP API (registrations,
//! probes, blocking watches, scrapes) are a general-purpose client's job.
//! The long-lived gRPC streams agents and sidecars hold ride
//! `agent_sim_consul::h2` instead (no buffer held while a stream is idle).
//!
//! What it is not: no retries, no redirects, no knowledge of the APIs it
//! calls (callers name their error kinds).

mod conn;
mod pool;

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt as _;
use http::header::{HeaderValue, USER_AGENT as USER_AGENT_HEADER};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, LengthLimitError, Limited};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::dial::{MaybeTlsStream, dial};

pub use conn::Conn;
pub use pool::{Pool, PoolLimits};

/// What every request of agent-sim says it is.
pub const USER_AGENT: &str = concat!("agent-sim/", env!("CARGO_PKG_VERSION"));

/// Read buffer limit of a connection: the response head must fit (the
/// servers' are < 1 KiB), bodies stream through it in pieces.
// Bound: MAX_BUF (64 KiB) of read buffer per connection; a longer head fails the call.
pub const MAX_BUF: usize = 64 * 1024;

/// TLS of a client connection: the connector (its shared config) and the
/// name to verify.
pub type TlsClient = (TlsConnector, ServerName<'static>);

/// An error of any kind, boxed (what hyper's body readers return).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why an HTTP call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request could not be built (a header value that is not one).
    #[error("request: {0}")]
    Request(#[from] http::Error),
    /// TCP connect failed (or a host name gave no address).
    #[error("connect {to}: {source}")]
    Dial {
        /// Where, as the caller named it.
        to: String,
        /// What the socket said.
        source: io::Error,
    },
    /// The TLS handshake failed.
    #[error("TLS: {0}")]
    Tls(#[source] io::Error),
    /// Dial, TLS and handshake took longer than the caller's budget.
    #[error("no connection within the connect budget")]
    ConnectTimeout,
    /// The HTTP/1 handshake failed.
    #[error("HTTP: {0}")]
    Handshake(#[source] hyper::Error),
    /// The exchange failed on the connection (closed, reset, not HTTP).
    #[error("HTTP: {0}")]
    Exchange(#[source] hyper::Error),
    /// A pooled exchange failed (making its connection included).
    #[error(transparent)]
    Pool(hyper_util::client::legacy::Error),
    /// Reading the answer's body failed.
    #[error("reading the answer: {0}")]
    Body(#[source] BoxError),
    /// The answer's body is over the caller's limit.
    #[error("HTTP {}: answer over the {limit}-byte limit", status.as_u16())]
    TooLarge {
        /// The answer's status.
        status: StatusCode,
        /// The limit.
        limit: usize,
    },
    /// No answer within the caller's time.
    #[error("no answer within {}s", .0.as_secs())]
    Timeout(Duration),
    /// A status the caller does not take, with the body it came with.
    #[error("{}", status_words(status.as_u16(), body))]
    Status {
        /// The status.
        status: StatusCode,
        /// The body (read up to the caller's limit).
        body: Bytes,
    },
    /// The client was closed.
    #[error("the client is closed")]
    Closed,
}

impl Error {
    /// What the failing layer itself said, its causes after it (`a: b: c`):
    /// the error's words without this client's framing ("HTTP: ",
    /// "reading the answer: ").
    pub fn cause_words(&self) -> String {
        match self {
            Error::Dial { source: e, .. } | Error::Tls(e) => error_chain(e),
            Error::Handshake(e) | Error::Exchange(e) => error_chain(e),
            Error::Body(e) => error_chain(&**e),
            e => error_chain(e),
        }
    }
}

/// A status and what its body says: `HTTP <status>: <body>` (the first
/// 512 bytes, trimmed), or `HTTP <status>` for an empty body.
pub fn status_words(status: u16, body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(512)]);
    let text = text.trim();
    if text.is_empty() {
        format!("HTTP {status}")
    } else {
        format!("HTTP {status}: {text}")
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

/// What a call brought back, whatever its status.
#[derive(Debug)]
pub struct Answer {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The body (at most the caller's limit).
    pub body: Bytes,
}

impl Answer {
    /// The body of a 200; any other status as [`Error::Status`].
    pub fn ok(self) -> Result<Bytes, Error> {
        if self.status == StatusCode::OK {
            Ok(self.body)
        } else {
            Err(Error::Status {
                status: self.status,
                body: self.body,
            })
        }
    }
}

/// Names the client on `req` (unless the caller did).
fn identify<B>(req: &mut Request<B>) {
    req.headers_mut()
        .entry(USER_AGENT_HEADER)
        .or_insert(HeaderValue::from_static(USER_AGENT));
}

/// Reads an answer's body up to `limit` bytes. Built as combinators, not
/// an `async fn`: a future holds its arguments beside its own state, and
/// a long poll waits inside this future for as long as the server holds it.
fn read<B>(resp: Response<B>, limit: usize) -> impl Future<Output = Result<Answer, Error>>
where
    B: hyper::body::Body,
    B::Error: Into<BoxError>,
{
    let (head, body) = resp.into_parts();
    let (status, headers) = (head.status, head.headers);
    Limited::new(body, limit).collect().map(move |r| match r {
        Ok(body) => Ok(Answer {
            status,
            headers,
            body: body.to_bytes(),
        }),
        Err(e) if e.is::<LengthLimitError>() => Err(Error::TooLarge { status, limit }),
        Err(e) => Err(Error::Body(e)),
    })
}

/// Where a client connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dest {
    /// One resolved address.
    Addr(SocketAddr),
    /// A host name (or an IP literal, without brackets) and a port: each
    /// address it resolves to is tried in turn at each dial.
    Host(String, u16),
}

impl std::fmt::Display for Dest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dest::Addr(a) => write!(f, "{a}"),
            Dest::Host(h, p) if h.contains(':') => write!(f, "[{h}]:{p}"),
            Dest::Host(h, p) => write!(f, "{h}:{p}"),
        }
    }
}

/// Where connections go, from where, and over TLS or not.
#[derive(Clone)]
pub struct Peer {
    /// The server.
    pub dest: Dest,
    /// Source address to dial from (`None`: the kernel's choice).
    pub bind: Option<IpAddr>,
    /// TLS (`None`: plain HTTP).
    pub tls: Option<TlsClient>,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer")
            .field("dest", &self.dest)
            .field("bind", &self.bind)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl Peer {
    /// Plain HTTP to `addr`, from the kernel's choice of source address.
    pub fn plain(addr: SocketAddr) -> Self {
        Peer {
            dest: Dest::Addr(addr),
            bind: None,
            tls: None,
        }
    }

    /// TCP to the server (`TCP_NODELAY`, from `bind` when set).
    pub async fn dial(&self) -> Result<TcpStream, Error> {
        let tcp = match &self.dest {
            Dest::Addr(a) => dial(*a, self.bind).await,
            // Boxed: resolving is rare (an observed URL), and the connect
            // futures of agents, which dial addresses, stay small.
            Dest::Host(host, port) => Box::pin(dial_host(host, *port, self.bind)).await,
        };
        tcp.map_err(|source| Error::Dial {
            to: self.dest.to_string(),
            source,
        })
    }

    /// The TLS handshake on `io` when the peer has TLS; `io` as it is when not.
    pub async fn secure<S>(&self, io: S) -> Result<MaybeTlsStream<S>, Error>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        match &self.tls {
            None => Ok(MaybeTlsStream::Plain(io)),
            // Boxed: the handshake's state is large, and plain connections
            // should not carry room for it in their connect futures.
            Some((connector, name)) => Ok(MaybeTlsStream::Tls(Box::new(
                Box::pin(connector.connect(name.clone(), io))
                    .await
                    .map_err(Error::Tls)?,
            ))),
        }
    }

    /// [`Peer::dial`], `wrap` on the TCP socket (e.g. kernel receive
    /// stamps), then [`Peer::secure`].
    pub async fn open_with<S>(
        &self,
        wrap: impl FnOnce(TcpStream) -> S,
    ) -> Result<MaybeTlsStream<S>, Error>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let tcp = self.dial().await?;
        self.secure(wrap(tcp)).await
    }
}

/// Each address `host` resolves to in turn (as `TcpStream::connect`
/// does), through [`dial`]; the last failure if none connects.
async fn dial_host(host: &str, port: u16, bind: Option<IpAddr>) -> io::Result<TcpStream> {
    let mut last = None;
    for a in tokio::net::lookup_host((host, port)).await? {
        match dial(a, bind).await {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "could not resolve to any address",
        )
    }))
}

#[cfg(test)]
mod tests;
