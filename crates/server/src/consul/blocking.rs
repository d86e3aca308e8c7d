//! Blocking queries, as a Consul 1.20 server answers the clients that do
//! not stream: `Health.ServiceNodes` over the multiplexed RPC port (the
//! connection is `super::mux`'s) and `GET /v1/health/service/<svc>?index=N&wait=D`
//! on the HTTP API.
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
use std::time::Duration;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use agent_sim_proto::consul::subscribe::Topic;

use super::acl::{Access, Resource};
use super::render::{health_entries, pretty};
use super::rpc_error::RpcError;
use super::state::TopicKey;
use super::{ConsulState, Gauge, lock};

use super::wait::jittered;
/// The method a blocking watcher calls.
pub(crate) const SERVICE_NODES: &str = "Health.ServiceNodes";
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
        Encoding::Msgpack => indexed_nodes(index, false, json!(nodes)),
    });
    if cache.len() >= CACHE_ENTRIES {
        cache.clear();
    }
    cache.insert(key, (index, encoded.clone()));
    (index, encoded)
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

/// `Health.ServiceNodes`: held as the request asks, then the whole result
/// (`IndexedCheckServiceNodes` with its `QueryMeta`) in msgpack.
pub(crate) async fn service_nodes(
    state: &ConsulState,
    args: &[u8],
    shutdown: &CancellationToken,
) -> Result<Bytes, RpcError> {
    let req: ServiceNodesRequest = agent_sim_proto::msgpack::decode(args)?;
    let authz = state.acl(&req.token)?;
    let dc = state.store().datacenter.clone();
    if !req.datacenter.is_empty() && req.datacenter != dc {
        return Err(RpcError::NoPathToDatacenter);
    }
    if req.service_name.is_empty() {
        return Err(RpcError::NoServiceName);
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
    if !authz.allows(Resource::Service, Access::Read, &req.service_name) {
        let index = state.store().service_index(&req.service_name);
        return Ok(filtered(index));
    }
    Ok(result(state, &req.service_name, false, Encoding::Msgpack).1)
}

/// `IndexedCheckServiceNodes` with every instance filtered out: what a
/// token that may not read the service is answered.
fn filtered(index: u64) -> Bytes {
    Bytes::from(indexed_nodes(index, true, json!([])))
}

/// `IndexedCheckServiceNodes` in msgpack: the query meta of a leader's
/// answer and `nodes`.
fn indexed_nodes(index: u64, filtered: bool, nodes: serde_json::Value) -> Vec<u8> {
    let body = json!({
        "Index": index,
        "LastContact": 0,
        "KnownLeader": true,
        "ConsistencyLevel": "leader",
        "NotModified": false,
        "Backend": 0,
        "ResultsFilteredByACLs": filtered,
        "QueryBackend": 0,
        "Nodes": nodes,
    });
    // serde_json values always encode.
    agent_sim_proto::msgpack::encode_named(&body).unwrap_or_default()
}
