//! The upgrade of one agent connection: the request read (bounded), who the
//! agent is (a verified client certificate, else its Basic credentials,
//! checked without blocking the thread: a bcrypt check takes a core for
//! tens of milliseconds), then the checks a Sensu 6.12 backend makes in its
//! order (authentication 401, namespace 404) and the `101` with the
//! backend's headers, or the refusal in Go's `http.Error` words.
//!
//! tungstenite builds the `101` (`create_response`) and parses the request;
//! the read and the answer are ours, because the credentials check awaits.

use std::time::Duration;

use agent_sim_sensu::codec::Encoding;
use base64::Engine as _;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue, StatusCode};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::error::{CapacityError, Error as WsError, ProtocolError};
use tokio_tungstenite::tungstenite::handshake::machine::TryParse as _;
use tokio_tungstenite::tungstenite::handshake::server::{
    ErrorResponse, Request, Response, create_response, write_response,
};
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::auth::common_name;
use super::stats::inc;
use super::tls::{AgentConn as _, Conn};
use crate::faults::INJECTED_WORDS;

/// An upgrade that sends no complete request (or cannot be answered)
/// within this is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest upgrade request (request line and headers), tungstenite's own
/// limit; its 124-header limit holds too (its parser).
const MAX_REQUEST: usize = 64 << 10;

const OCTET_STREAM: &str = "application/octet-stream";
const JSON: &str = "application/json";

/// An agent's WebSocket.
pub(super) type Ws = WebSocketStream<Conn>;

/// How an agent got in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Way {
    /// Its Basic credentials.
    Password,
    /// A client certificate signed by the agent CA (no password check).
    Certificate,
}

/// Who the agent is, before the upgrade is answered.
enum Who {
    /// A verified client certificate with this CN.
    Certificate(String),
    /// The right user and password.
    Password,
    /// No `Authorization: Basic` header.
    Missing,
    /// A wrong user or password.
    Wrong,
}

/// What the upgrade request told us.
pub(super) struct Hello {
    /// `Sensu-AgentName` (may be empty).
    pub(super) name: String,
    /// `Sensu-User`, or the CN of the agent's certificate.
    pub(super) user: String,
    /// Index into the configured namespaces.
    pub(super) ns: usize,
    pub(super) enc: Encoding,
    /// Header subscriptions plus `entity:<name>`.
    pub(super) subscriptions: Vec<String>,
    /// How the agent got in.
    pub(super) way: Way,
}

/// Upgrades `conn`; `None` if the request was refused or failed (counted:
/// refusals in `upgrades_rejected`, the rest in `handshake_errors`), or at
/// shutdown. `injected`: the status a fault answers with instead.
pub(super) async fn handshake(
    mut conn: Conn,
    shared: &Shared,
    shutdown: &CancellationToken,
    injected: Option<u16>,
) -> Option<(Ws, Hello)> {
    let stats = &shared.stats;
    let read = tokio::time::timeout(HANDSHAKE_TIMEOUT, read_request(&mut conn));
    let request = tokio::select! {
        () = shutdown.cancelled() => return None,
        r = read => r.ok().and_then(Result::ok),
    };
    // Not a WebSocket upgrade: closed without an answer, as tungstenite does.
    let Some((req, resp)) = request.and_then(|req| create_response(&req).ok().map(|r| (req, r)))
    else {
        inc(&stats.handshake_errors);
        return None;
    };
    let answer = match injected {
        Some(code) => Err(injected_response(code)),
        None => {
            let who = tokio::select! {
                () = shutdown.cancelled() => return None,
                who = identify(shared, &conn, req.headers()) => who,
            };
            check_upgrade(shared, &req, resp, who)
        }
    };
    let bytes = match &answer {
        Ok((resp, _)) => head_bytes(resp, None),
        Err(refusal) => head_bytes(refusal, refusal.body().as_deref()),
    };
    let refused = answer.is_err();
    let send = async {
        conn.write_all(&bytes?).await?;
        conn.flush().await?;
        if refused {
            // `Connection: close`: the close (TLS close_notify too) follows.
            conn.shutdown().await?;
        }
        Ok::<_, WsError>(())
    };
    let sent = tokio::select! {
        () = shutdown.cancelled() => return None,
        r = tokio::time::timeout(HANDSHAKE_TIMEOUT, send) => matches!(r, Ok(Ok(()))),
    };
    match answer {
        Ok((_, hello)) if sent => {
            let ws =
                WebSocketStream::from_raw_socket(conn, Role::Server, Some(shared.ws_config)).await;
            Some((ws, hello))
        }
        Ok(_) => {
            inc(&stats.handshake_errors);
            None
        }
        // Counted by `check_upgrade` or by the fault.
        Err(_) => None,
    }
}

/// Reads the upgrade request: the whole head and nothing after it (an
/// agent waits for the `101` before it sends a frame; gorilla refuses
/// early data too).
async fn read_request(conn: &mut Conn) -> Result<Request, WsError> {
    let mut buf = Vec::with_capacity(1024);
    loop {
        if conn.read_buf(&mut buf).await? == 0 {
            return Err(WsError::Protocol(ProtocolError::HandshakeIncomplete));
        }
        if let Some((size, req)) = Request::try_parse(&buf)? {
            if size != buf.len() {
                return Err(WsError::Protocol(ProtocolError::JunkAfterRequest));
            }
            return Ok(req);
        }
        if buf.len() > MAX_REQUEST {
            return Err(WsError::Capacity(CapacityError::MessageTooLong {
                size: buf.len(),
                max_size: MAX_REQUEST,
            }));
        }
    }
}

/// The status line and headers of an answer, then `body`.
fn head_bytes<T>(resp: &http::Response<T>, body: Option<&str>) -> Result<Vec<u8>, WsError> {
    let mut out = Vec::with_capacity(256);
    write_response(&mut out, resp)?;
    if let Some(body) = body {
        out.extend_from_slice(body.as_bytes());
    }
    Ok(out)
}

/// Who the agent is: the CN of the certificate it presented (rustls has
/// verified it against the agent CA), else its Basic credentials.
async fn identify(shared: &Shared, conn: &Conn, headers: &HeaderMap) -> Who {
    if let Some(cn) = conn.peer_certificate().and_then(common_name) {
        return Who::Certificate(cn);
    }
    let Some((user, password)) = basic_auth(headers) else {
        return Who::Missing;
    };
    if shared
        .passwords
        .check(&user, &password, &shared.stats)
        .await
    {
        Who::Password
    } else {
        Who::Wrong
    }
}

/// The checks after who the agent is: credentials (401), namespace (404),
/// encoding; adds the `Backend-ID`, `Accept` (twice) and `Content-Type`
/// headers to the `101`.
#[allow(clippy::result_large_err)] // tungstenite's `ErrorResponse`
fn check_upgrade(
    shared: &Shared,
    req: &Request,
    mut resp: Response,
    who: Who,
) -> Result<(Response, Hello), ErrorResponse> {
    let headers = req.headers();
    let stats = &shared.stats;
    // The real backend's order: authentication (401), then authorization
    // (403), then the namespace (404); bodies as Go's http.Error writes them.
    let (way, cn) = match who {
        Who::Certificate(cn) => (Way::Certificate, Some(cn)),
        Who::Password => (Way::Password, None),
        Who::Missing | Who::Wrong => {
            inc(&stats.upgrades_rejected);
            inc(&stats.rejected_credentials);
            let words = match who {
                Who::Missing => "missing credentials\n",
                _ => "bad credentials\n",
            };
            return Err(error_response(StatusCode::UNAUTHORIZED, words));
        }
    };
    let asked = header_str(headers, "sensu-namespace").unwrap_or_default();
    let ns = shared
        .namespaces
        .iter()
        .position(|n| n == asked)
        .filter(|_| tokio::time::Instant::now() >= shared.namespaces_ready_at);
    let Some(ns) = ns else {
        inc(&stats.upgrades_rejected);
        inc(&stats.rejected_namespace);
        return Err(error_response(
            StatusCode::NOT_FOUND,
            &format!("namespace {asked:?} not found\n"),
        ));
    };
    let enc = if headers
        .get_all(ACCEPT)
        .iter()
        .any(|v| v.to_str().is_ok_and(|v| v.contains(OCTET_STREAM)))
    {
        Encoding::Protobuf
    } else {
        Encoding::Json
    };
    let name = header_str(headers, "sensu-agentname")
        .unwrap_or_default()
        .to_owned();
    let user = cn.unwrap_or_else(|| {
        header_str(headers, "sensu-user")
            .unwrap_or_default()
            .to_owned()
    });
    // Bound: the upgrade request is at most 64 KiB (MAX_REQUEST), and the
    // list is dropped after the first entity_config.
    let mut subscriptions: Vec<String> = header_str(headers, "sensu-subscriptions")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    if !name.is_empty() {
        let entity = format!("entity:{name}");
        if !subscriptions.contains(&entity) {
            subscriptions.push(entity);
        }
    }
    subscriptions.shrink_to_fit();

    let h = resp.headers_mut();
    h.insert("backend-id", shared.backend_id.clone());
    h.append(ACCEPT, HeaderValue::from_static(OCTET_STREAM));
    h.append(ACCEPT, HeaderValue::from_static(JSON));
    h.insert(CONTENT_TYPE, HeaderValue::from_static(enc.content_type()));
    let hello = Hello {
        name,
        user,
        ns,
        enc,
        subscriptions,
        way,
    };
    Ok((resp, hello))
}

/// The answer to an upgrade refused by a fault: the status, and a body
/// saying who refused it.
fn injected_response(code: u16) -> ErrorResponse {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    error_response(status, &format!("{INJECTED_WORDS}\n"))
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// `(user, password)` of an `Authorization: Basic` header, like Go's `Request.BasicAuth`.
fn basic_auth(headers: &HeaderMap) -> Option<(String, String)> {
    let value = headers.get(AUTHORIZATION)?.as_bytes();
    let (scheme, rest) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"basic ") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(rest)
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (user, password) = decoded.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

fn error_response(status: StatusCode, body: &str) -> ErrorResponse {
    let mut resp = ErrorResponse::new(Some(body.to_owned()));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    h.insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(auth: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, HeaderValue::from_str(auth).unwrap());
        h
    }

    #[test]
    fn basic_auth_parses_like_go() {
        // base64("agent:P@ssw0rd!")
        let h = headers("Basic YWdlbnQ6UEBzc3cwcmQh");
        assert_eq!(
            basic_auth(&h),
            Some(("agent".to_owned(), "P@ssw0rd!".to_owned()))
        );
        assert_eq!(
            basic_auth(&headers("basic YWdlbnQ6UEBzc3cwcmQh")).map(|c| c.0),
            Some("agent".to_owned())
        );
        assert_eq!(basic_auth(&headers("Bearer abc")), None);
        assert_eq!(basic_auth(&headers("Basic !!!")), None);
        assert_eq!(basic_auth(&headers("Basic")), None);
        assert_eq!(basic_auth(&HeaderMap::new()), None);
        // base64("nocolon")
        assert_eq!(basic_auth(&headers("Basic bm9jb2xvbg==")), None);
    }

    #[test]
    fn a_refusal_is_its_status_line_headers_and_body() {
        let r = error_response(StatusCode::UNAUTHORIZED, "bad credentials\n");
        let bytes = head_bytes(&r, r.body().as_deref()).unwrap();
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.starts_with("HTTP/1.1 401 Unauthorized\r\n"), "{text}");
        assert!(text.contains("content-length: 16\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\nbad credentials\n"), "{text}");
    }
}
