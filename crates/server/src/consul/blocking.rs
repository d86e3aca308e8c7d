//! Blocking queries, as a Consul 1.20 server answers the clients that do
//! not stream: `Health.ServiceNodes` over the multiplexed RPC port (`0x04`,
//! then yamux; each stream carries net/rpc calls in msgpack, a request or
//! an answer being two msgpack values back to back) and
//! `GET /v1/health/service/<svc>?index=N&wait=D` on the HTTP API.
//!
//! A query whose index is 0 is answered at once; otherwise it is held until
//! the service's index passes it (an event on its `ServiceHealth` topic) or
//! its wait ends: the asked wait (0: 5 min; at most 10 min) plus up to
//! 1/16 of it at random, as Consul spreads the wake-ups. Either way the
//! answer is the whole result at the service's index, the index of the
//! last change to any of its instances, encoded once per change and
//! encoding ([`ResultCache`], from the views of `render`) for every watcher
//! it wakes.

use std::collections::HashMap;
use std::future::poll_fn;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{AsyncReadExt as _, AsyncWriteExt as _};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio_util::compat::TokioAsyncReadCompatExt as _;
use tokio_util::sync::CancellationToken;

use agent_sim_proto::consul::subscribe::Topic;
use agent_sim_proto::msgpack::Scanner;

use super::render::{health_entries, pretty};
use super::state::TopicKey;
use super::{ConsulState, Gauge, lock};
use crate::faults::{Action, RETRY_LATER, STALL_LIMIT, Target};

/// `pool.RPCMultiplexV2`: the byte that starts yamux on an RPC connection.
pub(crate) const RPC_MULTIPLEX_V2: u8 = 0x04;
/// Consul's `default_query_time`.
pub(crate) const DEFAULT_WAIT: Duration = Duration::from_secs(300);
/// Consul's `max_query_time`.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(600);
/// The method a blocking watcher calls.
const SERVICE_NODES: &str = "Health.ServiceNodes";
/// Largest request read: a header and a `ServiceSpecificRequest` are
/// ≈0.5 KiB; a stream sending more is closed.
const MAX_REQUEST: usize = 64 * 1024;
/// Streams one connection may hold at once (an agent opens one per
/// watched service).
const MAX_STREAMS: usize = 1024;

/// The wait a query is held for: `asked` (0: the default), at most
/// [`MAX_WAIT`], plus up to 1/16 of it at random.
pub(crate) fn jittered(asked: Duration) -> Duration {
    let base = if asked.is_zero() {
        DEFAULT_WAIT
    } else {
        asked.min(MAX_WAIT)
    };
    base + (base / 16).mul_f64(fastrand::f64())
}

/// Holds until `service`'s index passes `min` or the jittered `wait` ends
/// (at once when `min` is 0), or `shutdown`.
pub(crate) async fn block(
    state: &ConsulState,
    service: &str,
    min: u64,
    wait: Duration,
    shutdown: Option<&CancellationToken>,
) {
    if min == 0 {
        return;
    }
    let _held = Gauge::up(state, |c| &c.blocking_queries_held);
    let deadline = tokio::time::Instant::now() + jittered(wait);
    let key = TopicKey::new(Topic::ServiceHealth, service);
    loop {
        let mut rx = {
            let mut store = state.store();
            if store.service_index(service) > min || !store.room_for_topic(&key) {
                return;
            }
            store.watch(&key)
        };
        let stop = async {
            match shutdown {
                Some(s) => s.cancelled().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            // An event (or a lag) on the service: look again.
            _ = rx.recv() => {}
            () = tokio::time::sleep_until(deadline) => return,
            () = stop => return,
        }
    }
}

/// How a cached result is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Encoding {
    /// The HTTP API's JSON array.
    Json,
    /// `IndexedCheckServiceNodes` in msgpack (the RPC answer's body).
    Msgpack,
}

/// Most results kept encoded (services × filters × encodings); the cache
/// starts over when full.
const CACHE_ENTRIES: usize = 1024;

/// A cached result: service, passing only, encoding.
type CacheKey = (String, bool, Encoding);

/// Encoded results of `/v1/health/service` and `Health.ServiceNodes`, each
/// at the index it was encoded at: the watchers one change wakes share one
/// encoding (a 5,000-instance result is megabytes; a real server encodes it
/// per query, which is the cost being measured on it, not on this one).
#[derive(Default)]
pub(crate) struct ResultCache {
    // Bound: CACHE_ENTRIES entries, cleared when full.
    m: std::sync::Mutex<HashMap<CacheKey, (u64, Bytes)>>,
}

/// The service's instances (with `passing_only`, those whose checks all
/// pass) at the service's index, encoded as `enc`: from the cache when
/// nothing changed since it was encoded.
pub(crate) fn result(
    state: &ConsulState,
    service: &str,
    passing_only: bool,
    enc: Encoding,
) -> (u64, Bytes) {
    let mut cache = lock(&state.inner.results.m);
    let store = state.store();
    let index = store.service_index(service);
    let key = (service.to_owned(), passing_only, enc);
    if let Some((i, b)) = cache.get(&key)
        && *i == index
    {
        return (index, b.clone());
    }
    let nodes = health_entries(&store, service, passing_only);
    drop(store);
    let encoded = Bytes::from(match enc {
        Encoding::Json => pretty(&nodes),
        Encoding::Msgpack => {
            let body = json!({
                "Index": index,
                "LastContact": 0,
                "KnownLeader": true,
                "ConsistencyLevel": "leader",
                "NotModified": false,
                "Backend": 0,
                "ResultsFilteredByACLs": false,
                "QueryBackend": 0,
                "Nodes": nodes,
            });
            // serde_json values always encode.
            rmp_serde::to_vec_named(&body).unwrap_or_default()
        }
    });
    if cache.len() >= CACHE_ENTRIES {
        cache.clear();
    }
    cache.insert(key, (index, encoded.clone()));
    (index, encoded)
}

/// net/rpc's request header.
#[derive(Deserialize)]
struct RequestHeader {
    #[serde(rename = "ServiceMethod", default)]
    service_method: String,
    #[serde(rename = "Seq", default)]
    seq: u64,
}

/// What a `ServiceSpecificRequest` asks that this server reads.
#[derive(Deserialize, Default)]
struct ServiceNodesRequest {
    #[serde(rename = "Datacenter", default)]
    datacenter: String,
    #[serde(rename = "ServiceName", default)]
    service_name: String,
    #[serde(rename = "MinQueryIndex", default)]
    min_query_index: u64,
    /// Nanoseconds (Go's `time.Duration`).
    #[serde(rename = "MaxQueryTime", default)]
    max_query_time: u64,
    #[serde(rename = "Token", default)]
    token: String,
}

#[derive(Serialize)]
struct ResponseHeader<'a> {
    #[serde(rename = "ServiceMethod")]
    service_method: &'a str,
    #[serde(rename = "Seq")]
    seq: u64,
    #[serde(rename = "Error")]
    error: &'a str,
}

/// Serves yamux on an RPC connection whose `0x04` was read: each stream
/// the client opens gets a task answering its calls one after another.
pub(crate) async fn serve_mux<I>(io: I, state: ConsulState, shutdown: CancellationToken)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let counters = &state.inner.counters;
    counters.bump(&counters.rpc_connections);
    counters.bump(&counters.rpc_mux_connections);
    let _open = Gauge::up(&state, |c| &c.rpc_connections_open);
    let mut cfg = yamux::Config::default();
    cfg.set_max_num_streams(MAX_STREAMS);
    let mut conn = yamux::Connection::new(io.compat(), cfg, yamux::Mode::Server);
    // Bound: at most MAX_STREAMS streams (yamux refuses more), one task each.
    let mut calls = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            next = poll_fn(|cx| conn.poll_next_inbound(cx)) => match next {
                Some(Ok(stream)) => {
                    calls.spawn(serve_stream(stream, state.clone(), shutdown.clone()));
                }
                Some(Err(_)) | None => break,
            },
            Some(_) = calls.join_next(), if !calls.is_empty() => {}
        }
    }
    // Dropping the set ends the streams' tasks, and the connection with it.
}

/// One yamux stream: requests in, answers out, in order.
async fn serve_stream(mut s: yamux::Stream, state: ConsulState, shutdown: CancellationToken) {
    let mut buf: Vec<u8> = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        // Two values: the header, then the arguments.
        let (mut head, mut args) = (Scanner::default(), Scanner::default());
        let (h, end) = loop {
            let scanned = head.scan(&buf).and_then(|h| match h {
                Some(h) => Ok(args.scan(&buf[h..])?.map(|a| (h, h + a))),
                None => Ok(None),
            });
            match scanned {
                Ok(Some(done)) => break done,
                Ok(None) if buf.len() <= MAX_REQUEST => {}
                // Not msgpack, or too long: the stream is closed.
                _ => return,
            }
            let n = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = s.read(&mut chunk) => match r {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                },
            };
            buf.extend_from_slice(&chunk[..n]);
        };
        let Ok(header) = rmp_serde::from_slice::<RequestHeader>(&buf[..h]) else {
            return;
        };
        let req = rmp_serde::from_slice::<ServiceNodesRequest>(&buf[h..end]);
        buf.drain(..end);
        let answer = match (header.service_method.as_str(), req) {
            (SERVICE_NODES, Ok(req)) => match call_fault(&state, &shutdown).await {
                Some(CallFault::Close) => return,
                Some(CallFault::Error(words)) => Err(words),
                None => service_nodes(&state, &req, &shutdown).await,
            },
            (SERVICE_NODES, Err(e)) => Err(format!("rpc: decoding the request: {e}")),
            (m, _) => Err(unknown_method(m)),
        };
        let (error, body) = match &answer {
            Ok(body) => ("", &body[..]),
            // net/rpc answers an error with an empty struct.
            Err(words) => (words.as_str(), &[0x80u8][..]),
        };
        let Ok(out) = rmp_serde::to_vec_named(&ResponseHeader {
            service_method: &header.service_method,
            seq: header.seq,
            error,
        }) else {
            return;
        };
        if s.write_all(&out).await.is_err()
            || s.write_all(body).await.is_err()
            || s.flush().await.is_err()
        {
            return;
        }
    }
}

/// net/rpc's words for a method it does not serve.
fn unknown_method(m: &str) -> String {
    match m.split_once('.') {
        Some(("Health", _)) => format!("rpc: can't find method {m}"),
        _ => format!("rpc: can't find service {m}"),
    }
}

enum CallFault {
    /// The call's stream ends without an answer.
    Close,
    /// The call is answered with this error.
    Error(String),
}

/// What a `consul.rpc` fault does to one call: delays it, answers it with
/// Consul's rate-limit words, or closes its stream (a stall holds it until
/// the limit or shutdown first).
async fn call_fault(state: &ConsulState, shutdown: &CancellationToken) -> Option<CallFault> {
    let hit = state
        .faults()
        .pick(Target::ConsulRpc, Some(SERVICE_NODES))?;
    match hit.action {
        Action::Delay(d) => {
            tokio::select! {
                _ = shutdown.cancelled() => Some(CallFault::Close),
                () = tokio::time::sleep(d) => None,
            }
        }
        Action::Stall => {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                () = tokio::time::sleep(STALL_LIMIT) => {}
            }
            Some(CallFault::Close)
        }
        Action::Drop | Action::Reset | Action::Truncated | Action::Garbage => {
            Some(CallFault::Close)
        }
        Action::Status(_) | Action::Unavailable | Action::ResourceExhausted | Action::Aborted => {
            Some(CallFault::Error(format!("rpc error: {RETRY_LATER}")))
        }
        _ => None,
    }
}

/// `Health.ServiceNodes`: held as the request asks, then the whole result
/// (`IndexedCheckServiceNodes` with its `QueryMeta`) in msgpack.
async fn service_nodes(
    state: &ConsulState,
    req: &ServiceNodesRequest,
    shutdown: &CancellationToken,
) -> Result<Bytes, String> {
    if state.acl_check(&req.token) == Err(Some(())) {
        return Err("ACL not found".into());
    }
    let dc = state.store().datacenter.clone();
    if !req.datacenter.is_empty() && req.datacenter != dc {
        return Err("No path to datacenter".into());
    }
    if req.service_name.is_empty() {
        return Err("Must provide service name".into());
    }
    let wait = Duration::from_nanos(req.max_query_time);
    block(
        state,
        &req.service_name,
        req.min_query_index,
        wait,
        Some(shutdown),
    )
    .await;
    let counters = &state.inner.counters;
    counters.bump(&counters.blocking_answers);
    Ok(result(state, &req.service_name, false, Encoding::Msgpack).1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_are_capped_defaulted_and_jittered_by_a_sixteenth() {
        for _ in 0..200 {
            let w = jittered(Duration::from_secs(16));
            assert!(
                w >= Duration::from_secs(16) && w <= Duration::from_secs(17),
                "{w:?}"
            );
            let d = jittered(Duration::ZERO);
            assert!(d >= DEFAULT_WAIT && d <= DEFAULT_WAIT + DEFAULT_WAIT / 16);
            let m = jittered(Duration::from_secs(3600));
            assert!(m >= MAX_WAIT && m <= MAX_WAIT + MAX_WAIT / 16);
        }
    }

    #[test]
    fn unknown_methods_in_net_rpcs_words() {
        assert_eq!(
            unknown_method("Health.Nope"),
            "rpc: can't find method Health.Nope"
        );
        assert_eq!(unknown_method("Foo.Bar"), "rpc: can't find service Foo.Bar");
    }
}
