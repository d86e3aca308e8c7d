//! The connect step of a session: resolve the target (once per factory),
//! dial from the agent's source address, TLS for `wss://`, the WebSocket
//! upgrade with the Sensu headers ([`upgrade_request`]; the upgrade itself
//! is `upgrade`, which keeps no handshake buffer), all bounded by
//! `handshake_timeout` and cancellation. Also the parsed backend URL
//! ([`Target`]) and the WebSocket's buffer sizes ([`ws_config`]).
//!
//! Every failure is a session end with a stable kind (a refused upgrade
//! keeps the backend's status line and body as its words); nothing here
//! panics on network data.

use std::io;
use std::net::SocketAddr;

use agent_sim_fleet::{SessionCx, SessionEnd};
use agent_sim_net::{MaybeTlsStream, dial, dial_error_kind};
use base64::Engine as _;
use http::HeaderValue;
use rustls_pki_types::ServerName;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use crate::codec::{self, Encoding};
use crate::{SensuConfig, SensuError, Shared};

/// An established session's WebSocket.
pub(crate) type Ws = WebSocketStream<MaybeTlsStream>;

/// A parsed backend URL, its addresses resolved once on first use.
#[derive(Debug)]
pub(crate) struct Target {
    pub url: http::Uri,
    pub tls: bool,
    host: String,
    port: u16,
    server_name: ServerName<'static>,
    addrs: tokio::sync::OnceCell<Vec<SocketAddr>>,
}

impl Target {
    /// Parses and checks a `ws://` / `wss://` URL.
    pub(crate) fn parse(s: &str) -> Result<Target, SensuError> {
        let bad = |why: &str| SensuError::Invalid {
            field: "targets",
            reason: format!("{s:?}: {why}"),
        };
        let s = s.trim();
        let url: http::Uri = if s.contains("://") {
            s.parse().map_err(|_| bad("not a URL"))?
        } else {
            // `host:port`: a plain WebSocket on that port (no default port:
            // the agent port is usually 8081).
            match s.rsplit_once(':') {
                Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok() => {}
                _ => return Err(bad("expected host:port (the agent port is usually 8081)")),
            }
            format!("ws://{s}/")
                .parse()
                .map_err(|_| bad("expected host:port (the agent port is usually 8081)"))?
        };
        let tls = match url.scheme_str() {
            Some("ws") => false,
            Some("wss") => true,
            _ => return Err(bad("scheme must be ws:// or wss://")),
        };
        let host = url
            .host()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| bad("no host"))?;
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = url.port_u16().unwrap_or(if tls { 443 } else { 80 });
        let server_name =
            ServerName::try_from(host.clone()).map_err(|_| bad("host is not a valid TLS name"))?;
        // Normalize to an explicit path ("ws://h:8081" → "ws://h:8081/").
        let url = if url.path_and_query().is_none_or(|p| p.as_str().is_empty()) {
            let mut parts = url.into_parts();
            parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
            http::Uri::from_parts(parts).map_err(|_| bad("not a URL"))?
        } else {
            url
        };
        Ok(Target {
            url,
            tls,
            host,
            port,
            server_name,
            addrs: tokio::sync::OnceCell::new(),
        })
    }

    async fn addr(&self, index: u64) -> Result<SocketAddr, SessionEnd> {
        let addrs = self
            .addrs
            .get_or_try_init(|| async {
                tokio::net::lookup_host((self.host.as_str(), self.port))
                    .await
                    .map(|it| it.collect::<Vec<_>>())
            })
            .await
            .map_err(|_| SessionEnd::lost("resolve"))?;
        if addrs.is_empty() {
            return Err(SessionEnd::lost("resolve"));
        }
        Ok(addrs[(index as usize) % addrs.len()])
    }
}

/// The WebSocket upgrade request a real agent sends: `GET <path>` with the
/// standard WebSocket headers plus `Sensu-Namespace`, `Sensu-AgentName`,
/// `Sensu-User`, `Sensu-Subscriptions` (comma-joined), `Authorization: Basic`
/// and, for protobuf, `Accept: application/octet-stream`.
pub fn upgrade_request(
    cfg: &SensuConfig,
    url: &http::Uri,
    agent_name: &str,
) -> Result<http::Request<()>, SensuError> {
    let mut req = url
        .clone()
        .into_client_request()
        .map_err(|e| SensuError::Config(format!("target {url}: {e}")))?;
    let value = |s: &str| HeaderValue::from_str(s).map_err(http::Error::from);
    let auth =
        base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", cfg.user, cfg.password));
    let h = req.headers_mut();
    h.insert("Sensu-Namespace", value(&cfg.namespace)?);
    h.insert("Sensu-AgentName", value(agent_name)?);
    h.insert("Sensu-User", value(&cfg.user)?);
    h.insert("Sensu-Subscriptions", value(&cfg.subscriptions.join(","))?);
    h.insert(
        http::header::AUTHORIZATION,
        value(&format!("Basic {auth}"))?,
    );
    if cfg.encoding == Encoding::Protobuf {
        h.insert(
            http::header::ACCEPT,
            HeaderValue::from_static("application/octet-stream"),
        );
    }
    Ok(req)
}

/// WebSocket buffers sized for tens of thousands of small sessions.
///
/// The read buffer is allocated per session up front, kept for the whole
/// session (idle included) and zero-filled before every read, each read at
/// most its size: backend frames (entity_config, check_request) are ~100
/// bytes (76 on average from `agent-sim serve`), so 256 bytes read any of
/// them at once; a larger frame grows the buffer to its size (tungstenite
/// reserves a frame's whole length once its header is read) and takes a
/// read per 256 bytes.
///
/// Bound: a message or frame over [`codec::MAX_MESSAGE`] ends the session
/// (kind `message_too_large`) before it is buffered; our own writes bypass
/// the write buffer, which only ever holds control frames (≤ 16 KiB).
pub fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(256)
        .write_buffer_size(0)
        .max_write_buffer_size(16 * 1024)
        .max_message_size(Some(codec::MAX_MESSAGE))
        .max_frame_size(Some(codec::MAX_FRAME))
}

/// The session end of a failed upgrade: every answer is retried with
/// backoff (as a real agent does); the status line and body the backend
/// sent are kept as the server's words, and what the transport said when
/// it did not answer.
fn upgrade_error_kind(e: &tungstenite::Error, with_cert: bool) -> SessionEnd {
    use tungstenite::error::ProtocolError;
    match e {
        tungstenite::Error::Http(resp) => {
            let status = resp.status();
            let kind = match status.as_u16() {
                401 => "upgrade_401",
                403 => "upgrade_403",
                404 => "upgrade_404",
                429 => "upgrade_429",
                500..=599 => "upgrade_5xx",
                _ => "upgrade_4xx",
            };
            let body = resp
                .body()
                .as_deref()
                .map(|b| String::from_utf8_lossy(b).trim().to_string())
                .unwrap_or_default();
            let mut words = format!(
                "HTTP {} {}",
                status.as_u16(),
                status.canonical_reason().unwrap_or("")
            );
            if !body.is_empty() {
                words.push_str(": ");
                words.push_str(&body);
            }
            SessionEnd::lost_with(kind, words)
        }
        tungstenite::Error::Io(e) if e.kind() == io::ErrorKind::TimedOut => {
            SessionEnd::lost("handshake_timeout")
        }
        // TLS 1.3: the client's side of the handshake ends before the
        // server reads its certificate, so a refusal comes on the first read.
        tungstenite::Error::Io(io_err) if client_cert_refused(io_err, with_cert) => {
            SessionEnd::lost_with("tls_client_cert", io_err.to_string())
        }
        tungstenite::Error::Io(io_err) => match io_err.kind() {
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe => SessionEnd::lost_with("upgrade_reset", e.to_string()),
            io::ErrorKind::UnexpectedEof => SessionEnd::lost_with("upgrade_closed", e.to_string()),
            _ => SessionEnd::lost_with("upgrade_io", e.to_string()),
        },
        // The connection ended before a whole answer came.
        tungstenite::Error::ConnectionClosed
        | tungstenite::Error::AlreadyClosed
        | tungstenite::Error::Protocol(ProtocolError::HandshakeIncomplete) => {
            SessionEnd::lost_with("upgrade_closed", e.to_string())
        }
        tungstenite::Error::Protocol(p) => SessionEnd::lost_with("upgrade_protocol", p.to_string()),
        e => SessionEnd::lost_with("upgrade_error", e.to_string()),
    }
}

/// Whether a TLS error is the server's alert refusing the agent's client
/// certificate (or the lack of one). Only a server sends these about a
/// certificate: a client that refuses the server's reports it locally. A
/// `decrypt_error` is one too when the agent presented a certificate: it is
/// what a certificate whose issuer has the CA's name but not its key gets
/// (a bad signature).
fn client_cert_refused(e: &io::Error, with_cert: bool) -> bool {
    use rustls::AlertDescription as A;
    match e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) {
        Some(rustls::Error::AlertReceived(alert)) => match alert {
            A::BadCertificate
            | A::UnsupportedCertificate
            | A::CertificateRevoked
            | A::CertificateExpired
            | A::CertificateUnknown
            | A::UnknownCA
            | A::CertificateRequired
            | A::AccessDenied => true,
            A::DecryptError => with_cert,
            _ => false,
        },
        _ => false,
    }
}

/// TCP + TLS + upgrade, bounded by the handshake timeout and cancellation.
pub(crate) async fn connect(
    shared: &Shared,
    name: &str,
    server: usize,
    cx: &SessionCx,
) -> Result<Ws, SessionEnd> {
    let cfg = &shared.cfg;
    let target = &shared.targets[server % shared.targets.len()];
    let with_cert = cfg.cert_file.is_some();
    let handshake = async {
        let addr = target.addr(cx.index).await?;
        let tcp = dial(addr, cx.bind_addr)
            .await
            .map_err(|e| SessionEnd::lost_with(dial_error_kind(&e), e.to_string()))?;
        let stream = match (&shared.tls, target.tls) {
            (Some(tls), true) => {
                let tls = tokio_rustls::TlsConnector::from(tls.clone())
                    .connect(target.server_name.clone(), tcp)
                    .await
                    .map_err(|e| match e.kind() {
                        _ if client_cert_refused(&e, with_cert) => {
                            SessionEnd::lost_with("tls_client_cert", e.to_string())
                        }
                        io::ErrorKind::ConnectionReset | io::ErrorKind::UnexpectedEof => {
                            SessionEnd::lost_of("tls_reset", &e)
                        }
                        // rustls' verdict on the backend's certificate, or
                        // the backend's alert: the error tells which.
                        _ => SessionEnd::lost_of("tls", &e),
                    })?;
                MaybeTlsStream::Tls(Box::new(tls))
            }
            (None, true) => return Err(SessionEnd::fatal("tls_not_configured")),
            (_, false) => MaybeTlsStream::Plain(tcp),
        };
        let req = upgrade_request(cfg, &target.url, name)
            .map_err(|_| SessionEnd::fatal("bad_upgrade_request"))?;
        let (ws, resp) = crate::upgrade::upgrade(stream, req, ws_config())
            .await
            // A 429 is retried like any refused handshake: sensu-go's agent
            // has a branch that would double its backoff, but gorilla's
            // dialer fails every non-101 answer before it is reached.
            .map_err(|e| upgrade_error_kind(&e, with_cert))?;
        // The backend answers in the encoding it chose; a mismatch would make
        // every frame undecodable.
        if resp
            .headers()
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|ct| ct.as_bytes() != cfg.encoding.content_type().as_bytes())
        {
            return Err(SessionEnd::lost_with(
                "upgrade_content_type",
                format!(
                    "Content-Type {:?}, asked for {}",
                    resp.headers()
                        .get(http::header::CONTENT_TYPE)
                        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                        .unwrap_or_default(),
                    cfg.encoding.content_type()
                ),
            ));
        }
        Ok(ws)
    };
    tokio::select! {
        r = tokio::time::timeout(cfg.handshake_timeout, handshake) => {
            r.unwrap_or_else(|_| Err(SessionEnd::lost_with(
                "handshake_timeout",
                format!(
                    "connect, TLS and upgrade not answered within {:?}",
                    cfg.handshake_timeout
                ),
            )))
        }
        _ = cx.cancel.cancelled() => Err(SessionEnd::Shutdown),
    }
}

/// Size of the WebSocket stream type (for the memory-budget test).
#[cfg(test)]
pub(crate) const WS_SIZE: usize = std::mem::size_of::<Ws>();

#[cfg(test)]
mod tests {
    use super::*;

    fn io_alert(alert: rustls::AlertDescription) -> tungstenite::Error {
        tungstenite::Error::Io(io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(alert),
        ))
    }

    #[test]
    fn a_refused_client_certificate_is_a_kind_that_does_not_heal() {
        let end = upgrade_error_kind(&io_alert(rustls::AlertDescription::UnknownCA), false);
        let f = end.failure().unwrap();
        assert_eq!(f.kind, "tls_client_cert");
        assert!(f.detail.as_deref().unwrap().contains("UnknownCA"), "{f:?}");
        let spec = crate::ERROR_KINDS
            .iter()
            .find(|k| k.kind == "tls_client_cert")
            .unwrap();
        assert!(!spec.heals);
        for flag in ["--cert-file", "--key-file", "--ca-file"] {
            assert!(spec.hint.contains(flag), "{}", spec.hint);
        }
        // A bad signature on the certificate (its issuer named as the CA,
        // another key) is a decrypt_error: the certificate's fault only
        // when the agent presented one.
        let bad_signature = io_alert(rustls::AlertDescription::DecryptError);
        let kind = |e, with_cert| upgrade_error_kind(e, with_cert).failure().unwrap().kind;
        assert_eq!(kind(&bad_signature, true), "tls_client_cert");
        assert_eq!(kind(&bad_signature, false), "upgrade_io");
        // An alert about something else is no verdict on the certificate.
        let other = io_alert(rustls::AlertDescription::HandshakeFailure);
        assert_eq!(kind(&other, true), "upgrade_io");
    }
}
