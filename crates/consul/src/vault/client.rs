//! The Consul HTTP calls a Vault server's `storage "consul"` backend makes
//! (KV get, keys, txn, sessions, acquire/release), on a pool of its own:
//! Vault's `max_parallel` permit pool bounds the storage calls, the lock's
//! blocking reads take the extra connections, and every call has a
//! timeout (a blocking read: its wait plus [`CALL_TIMEOUT`]).
//!
//! Answers are checked as a client that must not trust them: a missing or
//! unparsable `X-Consul-Index` is an error, bodies are read up to
//! [`MAX_ANSWER`], a value is at most [`MAX_VALUE`] bytes decoded.
//!
//! What it is not: no retries and no Vault logic ([`super::node`]).

use std::net::SocketAddr;
use std::time::Duration;

use ::http::{HeaderValue, Method, Request};
use agent_sim_net::http::{Answer, Pool, PoolLimits};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use http_body_util::Full;
use serde::Deserialize;

use crate::ConsulError;
use crate::conn::ByteCounters;
use crate::http::answer::{Gunzip, gunzip};
use crate::http::api_conn;
use crate::http::{ApiTls, HttpError, Refusal};

/// Timeout of a call that does not block (Consul's own write timeout is
/// in this range; Vault's calls carry the request's context).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest answer body read (a `keys` list of the run's path included).
pub const MAX_ANSWER: usize = 16 << 20;
/// Largest value accepted in an answer: Consul's own limit on a KV value
/// (`kv_max_value_size`, 512 KiB by default); a larger one is a fault.
pub const MAX_VALUE: usize = 512 << 10;
/// The flags Consul's lock puts on its key (`api.LockFlagValue`).
pub const LOCK_FLAGS: u64 = 0x2ddc_cbc0_58a5_0c18;

/// One KV entry as `GET /v1/kv/<key>` returns it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KvEntry {
    /// The value, decoded.
    pub value: Vec<u8>,
    /// The session holding it, if any.
    pub session: Option<String>,
    /// Its flags.
    pub flags: u64,
    /// Raft index of its last change.
    pub modify_index: u64,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct KvRow {
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    session: Option<String>,
    #[serde(default)]
    flags: u64,
    #[serde(default)]
    modify_index: u64,
}

/// A session as `/v1/session/list` shows it.
#[derive(Debug, Clone, Deserialize)]
pub struct SessionRow {
    /// Its ID.
    #[serde(rename = "ID")]
    pub id: String,
    /// Its name.
    #[serde(rename = "Name", default)]
    pub name: String,
}

/// One op of a `/v1/txn` request (the KV verbs Vault uses).
#[derive(Debug, Clone)]
pub enum TxnOp<'a> {
    /// `check-session`: the key is held by this session, else roll back.
    CheckSession {
        /// The lock key.
        key: &'a str,
        /// The session.
        session: &'a str,
    },
    /// `set`.
    Set {
        /// Key.
        key: &'a str,
        /// Value.
        value: &'a [u8],
    },
    /// `delete`.
    Delete {
        /// Key.
        key: &'a str,
    },
}

/// A Vault server's client of the Consul HTTP API.
pub struct KvClient {
    pool: Pool<ByteCounters>,
    base: String,
    dc: String,
    token: Option<HeaderValue>,
}

impl std::fmt::Debug for KvClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvClient")
            .field("base", &self.base)
            .finish()
    }
}

/// An answer with its body unzipped when the server gzipped it.
fn unzipped(mut a: Answer) -> Result<Answer, Refusal> {
    let gzipped = a
        .headers
        .get(::http::header::CONTENT_ENCODING)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"gzip"));
    if gzipped {
        a.body = gunzip(&a.body, MAX_ANSWER)
            .map_err(|e| match e {
                Gunzip::TooLarge => Refusal {
                    kind: "answer_too_large",
                    words: Some(format!("an answer over {} MiB unzipped", MAX_ANSWER >> 20)),
                },
                Gunzip::Bad(why) => decode_err(&format!("gzip: {why}")),
            })?
            .into();
        a.headers.remove(::http::header::CONTENT_ENCODING);
    }
    Ok(a)
}

fn decode_err(what: &str) -> Refusal {
    Refusal {
        kind: "vault_bad_answer",
        words: Some(what.to_owned()),
    }
}

impl KvClient {
    /// A client of `addr` (over TLS when `tls` is given); `conns`: most
    /// calls at once (the permit pool plus the lock's blocking reads).
    pub fn new(
        addr: SocketAddr,
        tls: Option<ApiTls>,
        token: Option<&str>,
        datacenter: &str,
        conns: usize,
        longest_wait: Duration,
        bytes: Option<ByteCounters>,
    ) -> Result<Self, ConsulError> {
        let c = api_conn(
            addr,
            tls,
            token,
            bytes,
            PoolLimits {
                max_conns: conns,
                idle: crate::http::POOL_IDLE,
                dial_timeout: crate::http::DIAL_TIMEOUT,
                // A blocking read waits up to its `wait` (plus Consul's
                // jitter of wait/16): the pool's cap covers the longest.
                timeout: longest_wait + longest_wait / 8 + CALL_TIMEOUT,
            },
        )?;
        Ok(KvClient {
            pool: c.pool,
            base: c.base,
            dc: datacenter.to_owned(),
            token: c.token,
        })
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
        timeout: Duration,
    ) -> Result<Answer, Refusal> {
        let mut uri = format!("{}{}", self.base, path);
        if !self.dc.is_empty() {
            uri.push(if path.contains('?') { '&' } else { '?' });
            uri.push_str("dc=");
            uri.push_str(&self.dc);
        }
        // Go's transport asks for gzip (and Consul then gzips every answer,
        // which is part of what Vault's calls cost it).
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .header(::http::header::ACCEPT_ENCODING, "gzip");
        if let Some(t) = &self.token {
            req = req.header("X-Consul-Token", t.clone());
        }
        let req = req
            .body(Full::new(body))
            .map_err(|_| Refusal::kind("http_request"))?;
        match tokio::time::timeout(timeout, self.pool.send(req, MAX_ANSWER)).await {
            Ok(Ok(a)) => unzipped(a),
            Ok(Err(e)) => Err(HttpError::from(e).into()),
            Err(_) => Err(Refusal {
                kind: "http_timeout",
                words: Some(format!("no answer within {} s", timeout.as_secs())),
            }),
        }
    }

    /// A call whose answer must be 200.
    async fn ok(&self, method: Method, path: &str, body: Bytes) -> Result<Answer, Refusal> {
        let a = self.send(method, path, body, CALL_TIMEOUT).await?;
        if a.status.as_u16() == 200 {
            Ok(a)
        } else {
            Err(HttpError::answered(a.status.as_u16(), a.body).into())
        }
    }

    /// `GET /v1/kv/<key>` (`?consistent` when asked; with `index`, a
    /// blocking read waiting up to `wait`): the entry (`None` on 404) and
    /// the answer's `X-Consul-Index`.
    pub async fn get(
        &self,
        key: &str,
        consistent: bool,
        block: Option<(u64, Duration)>,
    ) -> Result<(Option<KvEntry>, u64), Refusal> {
        let mut path = format!("/v1/kv/{}", key);
        let mut timeout = CALL_TIMEOUT;
        let mut sep = '?';
        if consistent {
            path.push_str("?consistent");
            sep = '&';
        }
        if let Some((index, wait)) = block {
            path.push_str(&format!("{sep}index={index}&wait={}ms", wait.as_millis()));
            timeout = wait + wait / 8 + CALL_TIMEOUT;
        }
        let a = self.send(Method::GET, &path, Bytes::new(), timeout).await?;
        let index = index_of(&a)?;
        match a.status.as_u16() {
            404 => Ok((None, index)),
            200 => Ok((Some(entry_of(&a.body)?), index)),
            s => Err(HttpError::answered(s, a.body).into()),
        }
    }

    /// `GET /v1/kv/<prefix>?keys&separator=/`: the keys and folders one
    /// level under `prefix` (empty on 404).
    pub async fn keys(&self, prefix: &str) -> Result<Vec<String>, Refusal> {
        let path = format!("/v1/kv/{}?keys&separator=/", prefix);
        let a = self
            .send(Method::GET, &path, Bytes::new(), CALL_TIMEOUT)
            .await?;
        index_of(&a)?;
        match a.status.as_u16() {
            404 => Ok(Vec::new()),
            200 => serde_json::from_slice(&a.body).map_err(|_| decode_err("a keys list")),
            s => Err(HttpError::answered(s, a.body).into()),
        }
    }

    /// Every key under `prefix` (`?keys`, no separator).
    pub async fn all_keys(&self, prefix: &str) -> Result<Vec<String>, Refusal> {
        let path = format!("/v1/kv/{}?keys", prefix);
        let a = self
            .send(Method::GET, &path, Bytes::new(), CALL_TIMEOUT)
            .await?;
        match a.status.as_u16() {
            404 => Ok(Vec::new()),
            200 => serde_json::from_slice(&a.body).map_err(|_| decode_err("a keys list")),
            s => Err(HttpError::answered(s, a.body).into()),
        }
    }

    /// `PUT /v1/txn`: `Ok(())` when applied; a rollback as kind
    /// `vault_txn_rollback` with the server's words for each failed op
    /// (`check_failed` tells whether op 0, a session check, failed).
    pub async fn txn(&self, ops: &[TxnOp<'_>]) -> Result<(), (Refusal, bool)> {
        let body = txn_body(ops);
        let a = self
            .send(Method::PUT, "/v1/txn", Bytes::from(body), CALL_TIMEOUT)
            .await
            .map_err(|r| (r, false))?;
        match a.status.as_u16() {
            200 => Ok(()),
            409 => {
                let errs: TxnErrors = serde_json::from_slice(&a.body)
                    .map_err(|_| (decode_err("a txn rollback"), false))?;
                let errs = errs.errors.unwrap_or_default();
                let first = errs.iter().any(|e| e.op_index == 0);
                let words = errs
                    .iter()
                    .map(|e| format!("op {}: {}", e.op_index, e.what))
                    .collect::<Vec<_>>()
                    .join("; ");
                Err((
                    Refusal {
                        kind: "vault_txn_rollback",
                        words: Some(words),
                    },
                    first,
                ))
            }
            s => Err((HttpError::answered(s, a.body).into(), false)),
        }
    }

    /// `PUT /v1/session/create` with a name and TTL (Consul's default
    /// lock-delay of 15 s and behavior `release`, as Vault's lock).
    pub async fn session_create(&self, name: &str, ttl: Duration) -> Result<String, Refusal> {
        let body = serde_json::json!({"Name": name, "TTL": format!("{}s", ttl.as_secs())});
        let a = self
            .ok(
                Method::PUT,
                "/v1/session/create",
                Bytes::from(body.to_string()),
            )
            .await?;
        let c: crate::http::SessionCreated =
            serde_json::from_slice(&a.body).map_err(|_| decode_err("a session create answer"))?;
        Ok(c.id)
    }

    /// `PUT /v1/session/renew/<id>`.
    pub async fn session_renew(&self, id: &str) -> Result<(), Refusal> {
        self.ok(
            Method::PUT,
            &format!("/v1/session/renew/{id}"),
            Bytes::new(),
        )
        .await
        .map(drop)
    }

    /// `PUT /v1/session/destroy/<id>`.
    pub async fn session_destroy(&self, id: &str) -> Result<(), Refusal> {
        self.ok(
            Method::PUT,
            &format!("/v1/session/destroy/{id}"),
            Bytes::new(),
        )
        .await
        .map(drop)
    }

    /// `GET /v1/session/list`.
    pub async fn session_list(&self) -> Result<Vec<SessionRow>, Refusal> {
        let a = self
            .ok(Method::GET, "/v1/session/list", Bytes::new())
            .await?;
        serde_json::from_slice(&a.body).map_err(|_| decode_err("a session list"))
    }

    /// `PUT /v1/kv/<key>?acquire=<session>&flags=` (or `release=`) with
    /// the lock's value: whether the server took it.
    pub async fn lock_op(
        &self,
        key: &str,
        verb: &str,
        session: &str,
        value: &[u8],
    ) -> Result<bool, Refusal> {
        let path = format!("/v1/kv/{}?{verb}={session}&flags={LOCK_FLAGS}", key);
        let a = self
            .ok(Method::PUT, &path, Bytes::copy_from_slice(value))
            .await?;
        crate::http::parse_bool(&a.body).map_err(|_| decode_err("an acquire answer"))
    }

    /// `DELETE /v1/kv/<prefix>?recurse`.
    pub async fn delete_tree(&self, prefix: &str) -> Result<(), Refusal> {
        self.ok(
            Method::DELETE,
            &format!("/v1/kv/{}?recurse", prefix),
            Bytes::new(),
        )
        .await
        .map(drop)
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct TxnErrors {
    #[serde(default)]
    errors: Option<Vec<crate::http::TxnOpError>>,
}

/// The index of an answer: required, as Consul always sends it on reads.
fn index_of(a: &Answer) -> Result<u64, Refusal> {
    if !matches!(a.status.as_u16(), 200 | 404) {
        return Ok(0);
    }
    a.headers
        .get("X-Consul-Index")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| decode_err("an answer without a valid X-Consul-Index"))
}

fn entry_of(body: &[u8]) -> Result<KvEntry, Refusal> {
    let mut rows: Vec<KvRow> =
        serde_json::from_slice(body).map_err(|_| decode_err("a KV entry"))?;
    if rows.len() != 1 {
        return Err(decode_err(&format!("{} entries for one key", rows.len())));
    }
    let r = rows.remove(0);
    let raw = r.value.unwrap_or_default();
    // Base64 of MAX_VALUE bytes is 4/3 as long; reject before decoding.
    if raw.len() > MAX_VALUE / 3 * 4 + 4 {
        return Err(Refusal {
            kind: "vault_value_too_large",
            words: Some(format!("a value of {} base64 bytes", raw.len())),
        });
    }
    let value = B64
        .decode(raw.as_bytes())
        .map_err(|_| decode_err("a value that is not base64"))?;
    Ok(KvEntry {
        value,
        session: r.session.filter(|s| !s.is_empty()),
        flags: r.flags,
        modify_index: r.modify_index,
    })
}

/// The JSON body of a `/v1/txn` request, byte for byte as Vault's
/// Consul client writes it (Go's `encoding/json` of the api's `TxnOps`:
/// every `KVTxnOp` field in declaration order, `Value` null when absent,
/// `Node`, `Service` and `Check` null, a newline after the array): a real
/// Vault 1.18.3's 2-op txn setting a 140-byte value was 556 bytes, and so
/// is this one.
pub fn txn_body(ops: &[TxnOp<'_>]) -> String {
    let quoted = |s: &str| serde_json::Value::from(s).to_string();
    let mut out = String::with_capacity(256 * ops.len());
    out.push('[');
    for (i, op) in ops.iter().enumerate() {
        let (verb, key, value, session) = match op {
            TxnOp::CheckSession { key, session } => ("check-session", *key, None, *session),
            TxnOp::Set { key, value } => ("set", *key, Some(B64.encode(value)), ""),
            TxnOp::Delete { key } => ("delete", *key, None, ""),
        };
        if i > 0 {
            out.push(',');
        }
        let value = value.map_or_else(|| "null".to_owned(), |v| format!("\"{v}\""));
        out.push_str(&format!(
            "{{\"KV\":{{\"Verb\":\"{verb}\",\"Key\":{},\"Value\":{value},\"Flags\":0,\"Index\":0,\"Session\":{}}},\"Node\":null,\"Service\":null,\"Check\":null}}",
            quoted(key),
            quoted(session),
        ));
    }
    out.push_str("]\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_txn_body_has_the_check_first_and_values_in_base64() {
        let b = txn_body(&[
            TxnOp::CheckSession {
                key: "p/core/lock",
                session: "s1",
            },
            TxnOp::Set {
                key: "p/a",
                value: b"hi",
            },
            TxnOp::Delete { key: "p/b" },
        ]);
        assert_eq!(
            b,
            concat!(
                r#"[{"KV":{"Verb":"check-session","Key":"p/core/lock","Value":null,"Flags":0,"Index":0,"Session":"s1"},"Node":null,"Service":null,"Check":null},"#,
                r#"{"KV":{"Verb":"set","Key":"p/a","Value":"aGk=","Flags":0,"Index":0,"Session":""},"Node":null,"Service":null,"Check":null},"#,
                r#"{"KV":{"Verb":"delete","Key":"p/b","Value":null,"Flags":0,"Index":0,"Session":""},"Node":null,"Service":null,"Check":null}]"#,
                "\n"
            )
        );
    }

    #[test]
    fn a_txn_body_is_as_long_as_a_real_vaults() {
        // Captured from Vault 1.18.3: the accessor's set, 140-byte value,
        // path `vaultreal/`, a 36-character session: 556 bytes.
        let session = "0123abcd-0123-abcd-0123-0123456789ab";
        let key = format!("vaultreal/sys/token/accessor/{}", "9b".repeat(20));
        let b = txn_body(&[
            TxnOp::CheckSession {
                key: "vaultreal/core/lock",
                session,
            },
            TxnOp::Set {
                key: &key,
                value: &[7u8; 140],
            },
        ]);
        assert_eq!(b.len(), 556);
    }

    #[test]
    fn an_entry_decodes_and_bad_ones_are_refused() {
        let e = entry_of(
            br#"[{"Key":"k","Value":"aGk=","Flags":3304740253564472344,"Session":"s","ModifyIndex":9}]"#,
        )
        .unwrap();
        assert_eq!(e.value, b"hi");
        assert_eq!(e.flags, LOCK_FLAGS);
        assert_eq!(e.session.as_deref(), Some("s"));
        assert_eq!(e.modify_index, 9);
        assert_eq!(entry_of(b"[]").unwrap_err().kind, "vault_bad_answer");
        let huge = format!(
            r#"[{{"Key":"k","Value":"{}"}}]"#,
            "A".repeat(MAX_VALUE / 3 * 4 + 8)
        );
        assert_eq!(
            entry_of(huge.as_bytes()).err().map(|e| e.kind),
            Some("vault_value_too_large")
        );
    }
}
