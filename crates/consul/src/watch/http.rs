//! What a tool that long-polls the servers' HTTP API does (consul-template,
//! Prometheus `consul_sd_configs`, Vault, Nomad): `GET
//! /v1/health/service/<svc>?index=N&wait=<wait>` on a connection of its own,
//! kept alive for the next poll, with `Accept-Encoding: gzip` as Go's HTTP
//! transport sends it (Consul then gzips the answer; the bytes counted are
//! those on the wire). The new index is in `X-Consul-Index`. The connection
//! is the project's HTTP/1 client's ([`agent_sim_net::http::Conn`]).

use std::pin::Pin;

use agent_sim_net::http::{self as net_http, Conn, Peer};
use agent_sim_net::{RxStamp, StampedTcp};
use bytes::Bytes;
use http_body_util::Empty;

use super::digest::Digest;
use super::msgpack::Csn;
use super::rpc::Answer;
use crate::conn::{ByteCounters, CONNECT_TIMEOUT, Counted};
use crate::http::HttpError;
use crate::http::answer::{Gunzip, gunzip};
use crate::rpc::mux::{CallError, MAX_ANSWER};

/// A kept-alive HTTP/1 connection to the API.
pub struct HttpWatch {
    conn: Conn<Empty<Bytes>>,
    host: String,
}

impl std::fmt::Debug for HttpWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpWatch")
            .field("host", &self.host)
            .finish()
    }
}

impl HttpWatch {
    /// A connection of its own to the API at `peer` (from the session's
    /// source address, `peer.bind`), `host` its `Host` header, the bytes
    /// counted into `bytes`: dial, TLS and the HTTP handshake together
    /// within [`CONNECT_TIMEOUT`]. With it, the socket's kernel receive
    /// stamp when the kernel stamps.
    pub async fn connect(
        peer: Peer,
        host: String,
        bytes: Option<ByteCounters>,
    ) -> Result<(Self, Option<RxStamp>), CallError> {
        let open = async {
            let mut stamp = None;
            let io = peer
                .open_with(|tcp| {
                    let tcp = StampedTcp::new(tcp);
                    stamp = tcp.enabled().then(|| tcp.stamp());
                    tcp
                })
                .await?;
            let conn = Conn::handshake(Counted::new(io, bytes)).await?;
            Ok((HttpWatch { conn, host }, stamp))
        };
        tokio::time::timeout(CONNECT_TIMEOUT, open)
            .await
            .unwrap_or(Err(net_http::Error::ConnectTimeout))
            .map_err(connect_failed)
    }
}

/// The kind of a failed connect, as every session's connect step counts it.
fn connect_failed(e: net_http::Error) -> CallError {
    use net_http::Error as E;
    let kind = match &e {
        E::Dial { source, .. } => agent_sim_net::dial_error_kind(source),
        E::Tls(_) => "tls_handshake",
        E::ConnectTimeout => "connect_timeout",
        _ => "http_io",
    };
    CallError {
        kind,
        detail: e.cause_words(),
        said_by: agent_sim_net::speaker_of(&e),
    }
}

/// A poll's future: the connection comes back for the next poll unless the
/// poll broke it.
pub type PollFuture = Pin<
    Box<dyn std::future::Future<Output = (Option<HttpWatch>, Result<Answer, CallError>)> + Send>,
>;

/// The path of one poll.
pub fn path(service: &str, datacenter: &str, index: u64, wait_s: u64) -> String {
    let mut p = format!("/v1/health/service/{service}?index={index}&wait={wait_s}s");
    if !datacenter.is_empty() {
        p.push_str("&dc=");
        p.push_str(datacenter);
    }
    p
}

/// Decodes an answer body (gunzipped when the server gzipped it).
pub fn decode(index: u64, body: &[u8], gzipped: bool) -> Result<Digest, CallError> {
    let bad = |what: String| CallError {
        kind: "decode_answer",
        detail: what,
        said_by: None,
    };
    let plain;
    let json: &[u8] = if gzipped {
        plain = gunzip_answer(body, MAX_ANSWER)?;
        &plain
    } else {
        body
    };
    let nodes: Vec<Csn<'_>> =
        serde_json::from_slice(json).map_err(|e| bad(format!("the answer: {e}")))?;
    Ok(Digest {
        index,
        items: nodes.iter().map(Csn::item).collect(),
    })
}

/// A GET of `path` on `w`'s server, gzip accepted as Go's transport asks.
fn get_request(
    w: &HttpWatch,
    path: &str,
    token: Option<&str>,
) -> Result<::http::Request<Empty<Bytes>>, ::http::Error> {
    let mut req = ::http::Request::get(path)
        .header(::http::header::HOST, w.host.as_str())
        .header(::http::header::ACCEPT_ENCODING, "gzip");
    if let Some(t) = token {
        req = req.header("X-Consul-Token", t);
    }
    req.body(Empty::new())
}

/// One poll on `w`.
pub fn poll(mut w: HttpWatch, path: String, token: Option<String>) -> PollFuture {
    Box::pin(async move {
        let req = match get_request(&w, &path, token.as_deref()) {
            Ok(r) => r,
            Err(e) => {
                return (
                    Some(w),
                    Err(CallError {
                        kind: "http_io",
                        detail: e.to_string(),
                        said_by: None,
                    }),
                );
            }
        };
        let answer = match w.conn.send(req, MAX_ANSWER).await {
            Ok(a) => a,
            // The connection is of no further use.
            Err(e) => {
                return (
                    None,
                    Err(CallError {
                        kind: "http_io",
                        detail: e.cause_words(),
                        said_by: None,
                    }),
                );
            }
        };
        let status = answer.status;
        let bytes = answer.body.len();
        if !status.is_success() {
            // Kind and words as every other HTTP call of the agents has them.
            let refused = HttpError::answered(status.as_u16(), answer.body);
            return (
                Some(w),
                Err(CallError {
                    kind: refused.kind,
                    detail: refused.words().unwrap_or_default(),
                    said_by: None,
                }),
            );
        }
        let index = answer
            .headers
            .get("X-Consul-Index")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let Some(index) = index else {
            return (
                Some(w),
                Err(CallError {
                    kind: "decode_answer",
                    detail: "an answer without X-Consul-Index".into(),
                    said_by: None,
                }),
            );
        };
        let gzipped = answer
            .headers
            .get(::http::header::CONTENT_ENCODING)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"gzip"));
        let result = decode(index, &answer.body, gzipped);
        (Some(w), Ok(Answer { result, bytes }))
    })
}

/// What a plain GET on a watch connection brought: its status, index
/// (`X-Consul-Index`, when sent), body as sent and whether it is gzipped.
#[derive(Debug)]
pub struct Got {
    /// HTTP status.
    pub status: u16,
    /// `X-Consul-Index`.
    pub index: Option<u64>,
    /// The body as on the wire.
    pub body: Bytes,
    /// `Content-Encoding: gzip`.
    pub gzipped: bool,
}

/// A GET's future: the connection comes back unless the GET broke it.
pub type GetFuture =
    Pin<Box<dyn std::future::Future<Output = (Option<HttpWatch>, Result<Got, CallError>)> + Send>>;

/// One GET of `path` on `w` (gzip accepted, as Go's transport asks), its
/// body read up to `max` bytes; the caller reads status and body (other
/// long polls than the health one: KV).
pub fn get(mut w: HttpWatch, path: String, token: Option<String>, max: usize) -> GetFuture {
    Box::pin(async move {
        let req = match get_request(&w, &path, token.as_deref()) {
            Ok(r) => r,
            Err(e) => return (Some(w), Err(CallError::new("http_io", e.to_string()))),
        };
        let answer = match w.conn.send(req, max).await {
            Ok(a) => a,
            Err(e) => return (None, Err(CallError::new(io_kind(&e), e.cause_words()))),
        };
        let header = |name: &str| answer.headers.get(name).and_then(|v| v.to_str().ok());
        let got = Got {
            status: answer.status.as_u16(),
            index: header("X-Consul-Index").and_then(|v| v.parse().ok()),
            gzipped: header("Content-Encoding").is_some_and(|v| v.eq_ignore_ascii_case("gzip")),
            body: answer.body,
        };
        (Some(w), Ok(got))
    })
}

/// The kind of a failed exchange: a body past the bound is refused as
/// such, anything else is the connection's failure.
fn io_kind(e: &net_http::Error) -> &'static str {
    match e {
        net_http::Error::TooLarge { .. } => "answer_too_large",
        _ => "http_io",
    }
}

/// Gunzips `body` up to `max` bytes ([`gunzip`]), failures as a call's.
pub fn gunzip_answer(body: &[u8], max: usize) -> Result<Vec<u8>, CallError> {
    gunzip(body, max).map_err(|e| match e {
        Gunzip::TooLarge => CallError::new(
            "answer_too_large",
            format!("an answer over {} KiB once unzipped", max >> 10),
        ),
        Gunzip::Bad(why) => CallError::new("decode_answer", format!("gzip: {why}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A watched service always has a poll in flight: its future is what
    /// each one costs while the server holds the query.
    #[tokio::test]
    async fn a_polls_future_stays_as_small_as_before_the_shared_client() {
        let addr = "127.0.0.1:1".parse().unwrap();
        let connect = HttpWatch::connect(Peer::plain(addr), "h".into(), None);
        let connect_size = std::mem::size_of_val(&connect);
        // HTTP/1's handshake writes nothing: a pipe with no server will do.
        let (io, _server) = tokio::io::duplex(64);
        let w = HttpWatch {
            conn: Conn::handshake(io).await.unwrap(),
            host: "h".into(),
        };
        let poll = poll(w, "/v1/health/service/web?index=1".into(), None);
        let poll_size = std::mem::size_of_val(&*poll);
        // The hand-made client's: 464 and 1,472 bytes.
        assert!(poll_size <= 464, "poll future {poll_size} bytes");
        assert!(connect_size <= 1472, "connect future {connect_size} bytes");
    }
}
