//! `GET /v1/kv/PREFIX?recurse&index=N&wait=Ws` on a connection of its own,
//! kept alive for the next read: what consul-template (Consul's Go API
//! client, `KV().List`) sends its local agent, and what `--watch http` and
//! API agents send the servers' HTTP API. The answer is a JSON array of
//! entries (`Value` in base64, `null` for an empty value); a prefix that
//! holds no key answers `404` with its `X-Consul-Index` (seen on 1.20.1),
//! which the API client reads as an empty result, as here.

use serde::Deserialize;

use super::rpc::{KvAnswer, ReadFuture};
use super::{DigestBuilder, KvDigest, probe_value};
use crate::http::HttpError;
use crate::rpc::mux::CallError;
use crate::watch::http::{self as watch_http, Got, HttpWatch};

/// The path of one read: `wait` in whole seconds as the API client
/// writes it, `stale` when reads may go to any server.
pub fn path(prefix: &str, datacenter: &str, index: u64, wait_s: u64, stale: bool) -> String {
    let mut p = format!("/v1/kv/{prefix}?recurse&index={index}&wait={wait_s}s");
    if stale {
        p.push_str("&stale");
    }
    if !datacenter.is_empty() {
        p.push_str("&dc=");
        p.push_str(datacenter);
    }
    p
}

#[derive(Deserialize)]
struct Entry<'a> {
    #[serde(rename = "Key", borrow)]
    key: std::borrow::Cow<'a, str>,
    #[serde(rename = "ModifyIndex", default)]
    modify: u64,
    #[serde(rename = "Value", default, borrow)]
    value: Option<std::borrow::Cow<'a, str>>,
}

/// Decodes a JSON answer at `index`; `probe_key`'s value is read.
pub fn decode(index: u64, json: &[u8], probe_key: Option<&str>) -> Result<KvDigest, CallError> {
    let entries: Vec<Entry<'_>> = serde_json::from_slice(json)
        .map_err(|e| CallError::new("decode_answer", format!("the KV answer: {e}")))?;
    let mut d = DigestBuilder::new(index, probe_key);
    for e in &entries {
        d.entry(&e.key, e.modify, || {
            use base64::Engine as _;
            let v = e.value.as_deref()?;
            let raw = base64::engine::general_purpose::STANDARD.decode(v).ok()?;
            probe_value(&raw)
        });
    }
    Ok(d.finish())
}

/// What a read's answer means: a result (a 404 is an empty one), or the
/// server's refusal in its words.
pub fn answer(got: Got, probe_key: Option<&str>, max: usize) -> KvAnswer {
    let bytes = got.body.len();
    let result = (|| {
        let index = got.index.ok_or_else(|| {
            CallError::new(
                "decode_answer",
                format!("HTTP {} without X-Consul-Index", got.status),
            )
        });
        match got.status {
            404 => Ok(KvDigest {
                index: index?,
                ..KvDigest::default()
            }),
            200..=299 => {
                let index = index?;
                if got.gzipped {
                    decode(
                        index,
                        &watch_http::gunzip_answer(&got.body, max)?,
                        probe_key,
                    )
                } else {
                    decode(index, &got.body, probe_key)
                }
            }
            status => {
                let refused = HttpError::answered(status, got.body);
                Err(CallError::new(
                    refused.kind,
                    refused.words().unwrap_or_default(),
                ))
            }
        }
    })();
    KvAnswer { result, bytes }
}

/// One read on `w`, answered within `deadline` (see
/// [`super::read_deadline`]) or lost.
pub fn read(
    w: HttpWatch,
    path: String,
    token: Option<String>,
    probe_key: Option<std::sync::Arc<str>>,
    max: usize,
    deadline: std::time::Duration,
) -> ReadFuture<HttpWatch> {
    let get = watch_http::get(w, path, token, max);
    Box::pin(super::bounded(deadline, async move {
        let (w, got) = get.await;
        match got {
            Ok(got) => (w, Ok(answer(got, probe_key.as_deref(), max))),
            Err(e) => (w, Err(e)),
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn got(status: u16, index: Option<u64>, body: &'static str) -> Got {
        Got {
            status,
            index,
            body: Bytes::from_static(body.as_bytes()),
            gzipped: false,
        }
    }

    #[test]
    fn paths_are_the_api_clients() {
        assert_eq!(
            path("run/", "", 22, 300, false),
            "/v1/kv/run/?recurse&index=22&wait=300s"
        );
        assert_eq!(
            path("run", "dc1", 0, 5, true),
            "/v1/kv/run?recurse&index=0&wait=5s&stale&dc=dc1"
        );
    }

    #[test]
    fn answers_as_1_20_1_gives_them() {
        // The body 1.20.1 answered through the client agent (captured).
        let body = r#"[{"LockIndex":0,"Key":"kvw/a","Flags":0,"Value":"dmFsdWUtYQ==","CreateIndex":20,"ModifyIndex":20},{"LockIndex":0,"Key":"kvw/probe","Flags":0,"Value":"Nw==","CreateIndex":24,"ModifyIndex":24},{"LockIndex":0,"Key":"kvw/e","Flags":0,"Value":null,"CreateIndex":25,"ModifyIndex":25}]"#;
        let a = answer(got(200, Some(25), body), Some("kvw/probe"), 1 << 20);
        let d = a.result.unwrap();
        assert_eq!((d.index, d.keys, d.probe), (25, 3, Some(7)));
        assert_eq!(a.bytes, body.len());
        let empty = answer(got(404, Some(24), ""), None, 1 << 20)
            .result
            .unwrap();
        assert_eq!((empty.index, empty.keys), (24, 0));
        let e = answer(got(500, None, "No path to datacenter"), None, 1 << 20)
            .result
            .unwrap_err();
        assert!(e.detail.contains("No path to datacenter"), "{}", e.detail);
        let e = answer(got(200, None, "[]"), None, 1 << 20)
            .result
            .unwrap_err();
        assert_eq!(e.kind, "decode_answer");
        let e = answer(got(200, Some(3), "[{"), None, 1 << 20)
            .result
            .unwrap_err();
        assert_eq!(e.kind, "decode_answer");
    }
}
