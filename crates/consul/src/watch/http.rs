//! What a tool that long-polls the servers' HTTP API does (consul-template,
//! Prometheus `consul_sd_configs`, Vault, Nomad): `GET
//! /v1/health/service/<svc>?index=N&wait=<wait>` on a connection of its own,
//! kept alive for the next poll, with `Accept-Encoding: gzip` as Go's HTTP
//! transport sends it (Consul then gzips the answer; the bytes counted are
//! those on the wire). The new index is in `X-Consul-Index`.

use std::io::Read as _;
use std::pin::Pin;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;

use super::digest::Digest;
use super::msgpack::Csn;
use super::rpc::{Answer, CallError, MAX_ANSWER};

/// A kept-alive HTTP/1 connection to the API, with its driver.
pub struct HttpWatch {
    send: http1::SendRequest<Empty<Bytes>>,
    driver: tokio::task::JoinHandle<()>,
    host: String,
}

impl std::fmt::Debug for HttpWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpWatch")
            .field("host", &self.host)
            .finish()
    }
}

impl Drop for HttpWatch {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl HttpWatch {
    /// HTTP/1 on an open socket (plain or TLS) to the API at `host`.
    pub async fn handshake<S>(io: S, host: String) -> Result<Self, CallError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (send, conn) = http1::Builder::new()
            .max_buf_size(crate::http::HTTP1_MAX_BUF.max(64 * 1024))
            .handshake(TokioIo::new(io))
            .await
            .map_err(|e| CallError {
                kind: "http_io",
                detail: e.to_string(),
            })?;
        let driver = tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(HttpWatch { send, driver, host })
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
    };
    let plain;
    let json: &[u8] = if gzipped {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(body)
            .take(MAX_ANSWER as u64 + 1)
            .read_to_end(&mut out)
            .map_err(|e| bad(format!("gzip: {e}")))?;
        if out.len() > MAX_ANSWER {
            return Err(CallError {
                kind: "answer_too_large",
                detail: format!("an answer over {} MiB", MAX_ANSWER >> 20),
            });
        }
        plain = out;
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

/// One poll on `w`.
pub fn poll(mut w: HttpWatch, path: String, token: Option<String>) -> PollFuture {
    Box::pin(async move {
        let mut req = http::Request::get(path.as_str())
            .header(http::header::HOST, w.host.as_str())
            .header(
                http::header::USER_AGENT,
                concat!("agent-sim/", env!("CARGO_PKG_VERSION")),
            )
            .header(http::header::ACCEPT_ENCODING, "gzip");
        if let Some(t) = token.as_deref() {
            req = req.header("X-Consul-Token", t);
        }
        let req = match req.body(Empty::new()) {
            Ok(r) => r,
            Err(e) => {
                return (
                    Some(w),
                    Err(CallError {
                        kind: "http_io",
                        detail: e.to_string(),
                    }),
                );
            }
        };
        let io_err = |e: &dyn std::fmt::Display| CallError {
            kind: "http_io",
            detail: e.to_string(),
        };
        if let Err(e) = w.send.ready().await {
            return (None, Err(io_err(&e)));
        }
        let resp = match w.send.send_request(req).await {
            Ok(r) => r,
            Err(e) => return (None, Err(io_err(&crate::http::error_chain(&e)))),
        };
        let status = resp.status();
        let index = resp
            .headers()
            .get("X-Consul-Index")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let gzipped = resp
            .headers()
            .get(http::header::CONTENT_ENCODING)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"gzip"));
        let body = match Limited::new(resp.into_body(), MAX_ANSWER).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => return (None, Err(io_err(&e))),
        };
        let bytes = body.len();
        if !status.is_success() {
            // Kind and words as every other HTTP call of the agents has them.
            let refused = crate::http::HttpError {
                kind: crate::http::answer_kind(status.as_u16(), &body),
                status: Some(status.as_u16()),
                body,
                detail: None,
            };
            return (
                Some(w),
                Err(CallError {
                    kind: refused.kind,
                    detail: refused.words().unwrap_or_default(),
                }),
            );
        }
        let Some(index) = index else {
            return (
                Some(w),
                Err(CallError {
                    kind: "decode_answer",
                    detail: "an answer without X-Consul-Index".into(),
                }),
            );
        };
        let result = decode(index, &body, gzipped);
        (Some(w), Ok(Answer { result, bytes }))
    })
}
