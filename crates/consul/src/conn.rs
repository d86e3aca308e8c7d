//! The RPC-port connection of one agent: TCP (optionally from a chosen
//! source address), the `0x08` byte that switches a Consul server's RPC
//! port to gRPC (after `0x03` + TLS for the TLS variant), then HTTP/2. A
//! client agent's Subscribe streams ride the lean client of [`crate::h2`]
//! ([`Dialer::connect_streams`]: no buffer held while idle, no task of its
//! own), and so do the dataplane sidecars' xDS streams: the same dialer
//! reaches a server's public gRPC port (8502, TLS 8503) without the prefix
//! bytes ([`Port::Grpc`]), what consul-dataplane connects to.
//! What this is not: the subscription logic (see `agent`).

use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use agent_sim_net::{MaybeTlsStream, RxStamp, StampedTcp, Tally};
use rustls::pki_types::ServerName;
use tokio::io::AsyncWriteExt;
use tokio_rustls::TlsConnector;

use crate::ConsulError;
use crate::config::ConsulTls;

/// How long a session's connect (TCP, TLS, prefix, HTTP/2 handshake) may
/// take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// First byte on a Consul RPC connection: switch to gRPC (`pool.RPCGRPC`).
pub const RPC_GRPC: u8 = 0x08;
/// First byte on a Consul RPC connection: TLS follows (`pool.RPCTLS`).
pub const RPC_TLS: u8 = 0x03;

/// A plaintext or TLS socket to a server's RPC port.
pub type RpcIo = MaybeTlsStream<StampedTcp>;

/// Largest header block (response headers or trailers, which carry
/// `grpc-message`) an agent or a sidecar accepts
/// ([`crate::h2::MAX_HEADER_LIST`], hyper's client default).
pub const MAX_HEADER_LIST: u32 = crate::h2::MAX_HEADER_LIST;

/// How many of the server's first bytes are kept.
pub const SNIFF_LEN: usize = 64;

/// What the first read on a connection gave: the server's first bytes, or
/// the error (a TLS alert, a reset) when it failed before any byte.
#[derive(Debug)]
pub enum FirstRead {
    /// Up to [`SNIFF_LEN`] bytes.
    Bytes(Box<[u8]>),
    /// The TLS session failed (e.g. the server's alert), rustls's error.
    Tls(rustls::Error),
    /// The read failed otherwise (a reset, an end of file).
    Error(std::io::ErrorKind),
}

impl FirstRead {
    /// What a failed first read says: rustls's error when the TLS layer
    /// failed (tokio-rustls wraps it in the `io::Error`), else its kind.
    pub fn of_error(e: &std::io::Error) -> Self {
        match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
            Some(tls) => FirstRead::Tls(tls.clone()),
            None => FirstRead::Error(e.kind()),
        }
    }
}

/// The first read on a connection, set once.
pub type FirstBytes = Arc<std::sync::OnceLock<FirstRead>>;

/// Where a connection's bytes are counted: the run's `bytes_received`
/// and `bytes_sent`.
#[derive(Debug, Clone)]
pub struct ByteCounters {
    /// The run's metrics.
    pub metrics: agent_sim_metrics::Metrics,
    /// Bytes read.
    pub rx: agent_sim_metrics::CounterId,
    /// Bytes written.
    pub tx: agent_sim_metrics::CounterId,
    /// The same again for a class of connections (the watches'), if any.
    pub class: Option<(agent_sim_metrics::CounterId, agent_sim_metrics::CounterId)>,
}

impl Tally for ByteCounters {
    fn read(&self, n: u64) {
        self.metrics.add(self.rx, n);
        if let Some((rx, _)) = self.class {
            self.metrics.add(rx, n);
        }
    }

    fn wrote(&self, n: u64) {
        self.metrics.add(self.tx, n);
        if let Some((_, tx)) = self.class {
            self.metrics.add(tx, n);
        }
    }
}

/// A socket whose bytes in and out are counted into a run's counters (an
/// atomic add per read and per write; nothing when no counters are given).
pub type Counted<S> = agent_sim_net::Counted<S, ByteCounters>;

/// The socket under HTTP/2, keeping the first bytes the server sends.
pub struct Sniff {
    io: Counted<RpcIo>,
    first: FirstBytes,
}

impl tokio::io::AsyncRead for Sniff {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if self.first.get().is_none() {
            match &r {
                Poll::Ready(Ok(())) => {
                    let new = &buf.filled()[before..];
                    if !new.is_empty() {
                        let _ = self
                            .first
                            .set(FirstRead::Bytes(new[..new.len().min(SNIFF_LEN)].into()));
                    }
                }
                Poll::Ready(Err(e)) => {
                    let _ = self.first.set(FirstRead::of_error(e));
                }
                Poll::Pending => {}
            }
        }
        r
    }
}

impl tokio::io::AsyncWrite for Sniff {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// What answered on a connection whose session failed before the server
/// answered a call: the kind and the words that say so, if the first bytes
/// tell (`None`: nothing to add to the failure).
pub fn what_answered(first: &FirstBytes) -> Option<(&'static str, String)> {
    let closed = || {
        Some((
            "rpc_closed_at_once",
            "the server closed the connection right after accepting it, without sending a byte"
                .to_string(),
        ))
    };
    let b = match first.get() {
        None => return closed(),
        // A TLS alert: the server refused the TLS session (e.g. no client
        // certificate where it verifies clients).
        Some(FirstRead::Tls(e @ rustls::Error::AlertReceived(_))) => {
            return Some(("tls_refused", format!("TLS: {e}")));
        }
        Some(FirstRead::Tls(_) | FirstRead::Error(_)) => return closed(),
        Some(FirstRead::Bytes(b)) => b,
    };
    match b {
        b if b.starts_with(b"HTTP/") => {
            let line = String::from_utf8_lossy(b);
            let line = line.lines().next().unwrap_or_default().to_string();
            Some((
                "wrong_port_http",
                format!("the port answered HTTP/1: {line}"),
            ))
        }
        // An HTTP/2 SETTINGS frame (type 4) and then a reset: a gRPC port
        // that does not take the 0x08 byte.
        b if b.len() >= 9 && b[3] == 0x04 => Some((
            "rpc_reset_after_settings",
            "the port sent HTTP/2 settings and then reset the connection".into(),
        )),
        _ => None,
    }
}

/// Why a connection could not be made, each step's error kept; counted
/// by [`ConnectError::kind`].
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The TCP connect failed (the OS's words).
    #[error(transparent)]
    Dial(std::io::Error),
    /// The TLS handshake failed.
    #[error(transparent)]
    Tls(std::io::Error),
    /// Writing the port's prefix byte failed.
    #[error(transparent)]
    Prefix(std::io::Error),
    /// Writing the HTTP/2 preface and settings failed.
    #[error("writing the HTTP/2 preface: {0}")]
    Preface(std::io::Error),
    /// Writing the HTTP/2 preface failed, and what the server did tells
    /// why ([`what_answered`]: it closed at once, a TLS alert).
    #[error("{words} (writing the HTTP/2 preface: {source})")]
    PrefaceAnswered {
        /// The kind [`what_answered`] gives.
        kind: &'static str,
        /// What it says answered.
        words: String,
        /// The write's error.
        source: std::io::Error,
    },
}

impl ConnectError {
    /// The error kind counted: `connect_refused` and the other dial kinds
    /// of [`agent_sim_net::dial_error_kind`], `tls_handshake`,
    /// `connect_prefix`, `h2_handshake`, or what answered.
    pub fn kind(&self) -> &'static str {
        match self {
            ConnectError::Dial(e) => agent_sim_net::dial_error_kind(e),
            ConnectError::Tls(_) => "tls_handshake",
            ConnectError::Prefix(_) => "connect_prefix",
            ConnectError::Preface(_) => "h2_handshake",
            ConnectError::PrefaceAnswered { kind, .. } => kind,
        }
    }

    /// Whose words the error is, from the error it keeps: the OS's for a
    /// socket's, the server's for a TLS alert it sent, agent-sim's for its
    /// TLS library refusing the server's certificate; `None` where what the
    /// server did tells (the kind's own speaker then).
    pub fn said_by(&self) -> Option<agent_sim_net::Speaker> {
        match self {
            ConnectError::Dial(e)
            | ConnectError::Tls(e)
            | ConnectError::Prefix(e)
            | ConnectError::Preface(e) => agent_sim_net::speaker_of(e),
            ConnectError::PrefaceAnswered { .. } => None,
        }
    }
}

/// Which server port a [`Dialer`] reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    /// The server RPC port (8300): `0x08`, or `0x03` + TLS + `0x08`, then gRPC.
    Rpc,
    /// The public gRPC port (8502 plaintext h2c, 8503 TLS with ALPN `h2`).
    Grpc,
}

/// Everything needed to dial one server (shared by the agents using it).
#[derive(Clone)]
pub struct Dialer {
    /// The port's handshake.
    pub port: Port,
    /// Server RPC address.
    pub addr: SocketAddr,
    /// TLS client config and the name to verify.
    pub tls: Option<(TlsConnector, ServerName<'static>)>,
    /// HTTP/2 keepalive ping interval.
    pub keepalive_time: Duration,
    /// HTTP/2 keepalive timeout.
    pub keepalive_timeout: Duration,
}

impl std::fmt::Debug for Dialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dialer")
            .field("addr", &self.addr)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl Dialer {
    /// A dialer for the RPC port at `addr`; `host` is the target's host part
    /// (TLS name default).
    pub fn new(
        addr: SocketAddr,
        host: &str,
        tls: Option<&ConsulTls>,
        keepalive_time: Duration,
        keepalive_timeout: Duration,
    ) -> Result<Self, ConsulError> {
        Self::for_port(
            Port::Rpc,
            addr,
            host,
            tls,
            keepalive_time,
            keepalive_timeout,
        )
    }

    /// A dialer for `port` at `addr` (see [`Dialer::new`]).
    pub fn for_port(
        port: Port,
        addr: SocketAddr,
        host: &str,
        tls: Option<&ConsulTls>,
        keepalive_time: Duration,
        keepalive_timeout: Duration,
    ) -> Result<Self, ConsulError> {
        let tls = match tls {
            None => None,
            Some(t) => {
                let config = match port {
                    Port::Rpc => tls_client_config(t)?,
                    // grpc-go servers ask for ALPN h2 on their TLS port.
                    Port::Grpc => grpc_tls_client_config(t)?,
                };
                Some((TlsConnector::from(config), server_name(t, host)?))
            }
        };
        Ok(Dialer {
            port,
            addr,
            tls,
            keepalive_time,
            keepalive_timeout,
        })
    }

    /// Dials and writes the prefix bytes: `prefix` after `0x03` + TLS for
    /// the TLS variant (the public gRPC port takes none). Reads record the
    /// kernel's receive time when it stamps.
    pub async fn open(
        &self,
        bind: Option<IpAddr>,
        prefix: u8,
    ) -> Result<(RpcIo, Option<RxStamp>), ConnectError> {
        let tcp = agent_sim_net::dial(self.addr, bind)
            .await
            .map_err(ConnectError::Dial)?;
        // Reads record the kernel's receive time (arrivals are timed there).
        let mut tcp = StampedTcp::new(tcp);
        let stamp = tcp.enabled().then(|| tcp.stamp());
        let io = match (&self.tls, self.port) {
            (None, Port::Grpc) => RpcIo::Plain(tcp),
            (Some((connector, name)), Port::Grpc) => RpcIo::Tls(Box::new(
                connector
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(ConnectError::Tls)?,
            )),
            (None, Port::Rpc) => {
                tcp.write_all(&[prefix])
                    .await
                    .map_err(ConnectError::Prefix)?;
                RpcIo::Plain(tcp)
            }
            (Some((connector, name)), Port::Rpc) => {
                tcp.write_all(&[RPC_TLS])
                    .await
                    .map_err(ConnectError::Prefix)?;
                let mut tls = connector
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(ConnectError::Tls)?;
                tls.write_all(&[prefix])
                    .await
                    .map_err(ConnectError::Prefix)?;
                tls.flush().await.map_err(ConnectError::Prefix)?;
                RpcIo::Tls(Box::new(tls))
            }
        };
        Ok((io, stamp))
    }
}

/// An agent's streaming connection: the lean HTTP/2 client on the
/// counted socket ([`crate::h2`]).
pub type StreamConn = crate::h2::Conn<Sniff>;

/// An established streaming connection (see [`Dialer::connect_streams`]).
pub struct Streaming {
    /// The connection; its calls start with [`crate::h2::Conn::start`].
    /// Boxed: a session's future then holds a pointer in every state.
    pub conn: Box<StreamConn>,
    /// The first bytes the server sent (see [`RpcConn::first_bytes`]).
    pub first_bytes: FirstBytes,
    /// Kernel receive time of the latest bytes read.
    pub stamp: Option<RxStamp>,
}

impl Dialer {
    /// Dials, writes the prefix byte(s) and the HTTP/2 preface: the
    /// connection a client agent's Subscribe streams ride.
    pub async fn connect_streams(
        &self,
        bind: Option<IpAddr>,
        bytes: Option<ByteCounters>,
    ) -> Result<Streaming, ConnectError> {
        let (io, stamp) = self.open(bind, RPC_GRPC).await?;
        let first_bytes = FirstBytes::default();
        let io = Sniff {
            io: Counted::new(io, bytes),
            first: first_bytes.clone(),
        };
        let keepalive = crate::h2::Keepalive {
            interval: self.keepalive_time,
            timeout: self.keepalive_timeout,
        };
        let authority = self.addr.to_string();
        let mut conn = Box::new(crate::h2::Conn::new(
            io,
            &authority,
            keepalive,
            crate::codec::MAX_EVENT_MESSAGE,
        ));
        conn.handshake()
            .await
            .map_err(|source| match what_answered(&first_bytes) {
                Some((kind, words)) => ConnectError::PrefaceAnswered {
                    kind,
                    words,
                    source,
                },
                None => ConnectError::Preface(source),
            })?;
        Ok(Streaming {
            conn,
            first_bytes,
            stamp,
        })
    }
}

/// A session's connect step: bounded by [`CONNECT_TIMEOUT`] and the
/// session's cancellation, failures as the session's end. `connect` is
/// boxed before the returned future exists, so a session's future holds a
/// pointer, not the connect state machine (freed once connected).
pub fn within_session<'a, T: 'a>(
    cx: &'a agent_sim_fleet::SessionCx,
    connect: impl std::future::Future<Output = Result<T, ConnectError>> + Send + 'a,
) -> impl std::future::Future<Output = Result<T, agent_sim_fleet::SessionEnd>> + 'a {
    use agent_sim_fleet::SessionEnd;
    let connect: Pin<Box<dyn std::future::Future<Output = _> + Send + 'a>> =
        Box::pin(tokio::time::timeout(CONNECT_TIMEOUT, connect));
    async move {
        let conn = tokio::select! {
            r = connect => r,
            _ = cx.cancel.cancelled() => return Err(SessionEnd::Shutdown),
        };
        match conn {
            Err(_) => Err(SessionEnd::lost("connect_timeout")),
            Ok(Err(e)) => Err(SessionEnd::Lost(agent_sim_fleet::Failure {
                kind: e.kind(),
                detail: Some(e.to_string()),
                said_by: e.said_by(),
            })),
            Ok(Ok(c)) => Ok(c),
        }
    }
}

/// rustls client config (ring provider, no ALPN, the client certificate
/// when given), see [`agent_sim_net::tls`]. Consul servers use a private CA:
/// without `insecure_skip_verify` a CA file is required (the platform's trust
/// store is not tried).
pub fn tls_client_config(t: &ConsulTls) -> Result<Arc<rustls::ClientConfig>, ConsulError> {
    client_config(t, &[])
}

/// [`tls_client_config`] offering ALPN `h2` (the public gRPC TLS port).
pub fn grpc_tls_client_config(t: &ConsulTls) -> Result<Arc<rustls::ClientConfig>, ConsulError> {
    client_config(t, &[b"h2"])
}

fn client_config(t: &ConsulTls, alpn: &[&[u8]]) -> Result<Arc<rustls::ClientConfig>, ConsulError> {
    if t.ca_file.is_none() && !t.insecure_skip_verify {
        return Err(ConsulError::NoCaFile);
    }
    Ok(agent_sim_net::client_config(&t.client(), alpn)?)
}

/// The name to verify on a TLS connection to `host`.
pub fn server_name(t: &ConsulTls, host: &str) -> Result<ServerName<'static>, ConsulError> {
    let name = t.server_name.clone().unwrap_or_else(|| host.to_owned());
    ServerName::try_from(name.clone()).map_err(|source| ConsulError::ServerName { name, source })
}

/// A stable error kind for a gRPC status (for error counters).
pub fn status_kind(code: tonic::Code) -> &'static str {
    use tonic::Code as C;
    match code {
        C::Ok => "grpc_ok",
        C::Cancelled => "grpc_cancelled",
        C::Unknown => "grpc_unknown",
        C::InvalidArgument => "grpc_invalid_argument",
        C::DeadlineExceeded => "grpc_deadline_exceeded",
        C::NotFound => "grpc_not_found",
        C::AlreadyExists => "grpc_already_exists",
        C::PermissionDenied => "grpc_permission_denied",
        C::ResourceExhausted => "grpc_resource_exhausted",
        C::FailedPrecondition => "grpc_failed_precondition",
        C::Aborted => "grpc_aborted",
        C::OutOfRange => "grpc_out_of_range",
        C::Unimplemented => "grpc_unimplemented",
        C::Internal => "grpc_internal",
        C::Unavailable => "grpc_unavailable",
        C::DataLoss => "grpc_data_loss",
        C::Unauthenticated => "grpc_unauthenticated",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[test]
    fn a_tls_alert_before_any_byte_is_told_in_rustls_words() {
        let first = |e: std::io::Error| {
            let f = FirstBytes::default();
            let _ = f.set(FirstRead::of_error(&e));
            what_answered(&f)
        };
        let alert = rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired);
        let (kind, words) = first(std::io::Error::new(std::io::ErrorKind::InvalidData, alert))
            .expect("an alert says who refused");
        assert_eq!(kind, "tls_refused");
        assert_eq!(words, "TLS: received fatal alert: CertificateRequired");
        let reset = first(std::io::ErrorKind::ConnectionReset.into());
        assert_eq!(reset.map(|(k, _)| k), Some("rpc_closed_at_once"));
    }

    #[tokio::test]
    async fn tls_variant_writes_0x03_then_a_client_hello() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let tls = ConsulTls {
            insecure_skip_verify: true,
            server_name: Some("server.dc1.consul".into()),
            ..ConsulTls::default()
        };
        let d = Dialer::new(
            addr,
            "127.0.0.1",
            Some(&tls),
            Duration::from_secs(30),
            Duration::from_secs(10),
        )
        .unwrap();
        let client = tokio::spawn(async move {
            d.connect_streams(None, None)
                .await
                .map(|_| ())
                .map_err(|e| e.kind())
        });
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut b = [0u8; 2];
        sock.read_exact(&mut b).await.unwrap();
        // RPCTLS, then a TLS handshake record (ClientHello).
        assert_eq!(b, [RPC_TLS, 0x16]);
        drop(sock);
        assert_eq!(client.await.unwrap().unwrap_err(), "tls_handshake");
    }

    #[test]
    fn a_tls_config_needs_a_readable_ca() {
        let t = ConsulTls {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..ConsulTls::default()
        };
        assert!(matches!(tls_client_config(&t), Err(ConsulError::Tls(_))));
    }
}
