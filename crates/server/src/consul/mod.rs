//! An embedded Consul-compatible server: enough of the RPC port and the HTTP
//! API for simulated client agents, sized for load (10,000 connections × 2
//! Subscribe streams in one process).
//!
//! - [`serve_rpc`]: the server RPC port. A connection starts with a byte:
//!   `0x08`, then h2c gRPC `subscribe.StateChangeSubscription/Subscribe`
//!   on topics `ServiceHealth`, `ServiceHealthConnect` (connect proxies,
//!   keyed by destination) and `ServiceIntentions`, with snapshots,
//!   `EndOfSnapshot`, one event per raft index (an `EventBatch` for several
//!   changes of one key in one transaction), resume by index, and
//!   `NewSnapshotToFollow`; or `0x04`, then yamux streams of net/rpc calls
//!   in msgpack: `Health.ServiceNodes` blocking queries. With TLS, `0x03`
//!   first and either byte inside it. `0x07`: `AutoEncrypt.Sign` over a
//!   TLS handshake of its own (`auto_encrypt`).
//! - [`serve_http`]: KV at `/v1/kv/<key>` (`GET` with `?recurse`, `?keys`,
//!   `?raw` and blocking `?index=&wait=`; `PUT` with `?cas=`, `?flags=`,
//!   `?acquire=`, `?release=`; `DELETE` with `?recurse`, `?cas=`; locks,
//!   lock-delay and session invalidation as Consul's, see `kv`); writes
//!   `/v1/catalog/register|deregister`, `/v1/txn`,
//!   `/v1/session/create|renew|destroy` (expiry after 2 × TTL),
//!   `/v1/config`; reads `/v1/catalog/nodes|node/:node|service/:name`,
//!   `/v1/session/list|node/:node|info/:id`, `/v1/config/:kind/:name`,
//!   `/v1/health/service/:name` (a blocking query with `?index=&wait=`),
//!   `/v1/health/node/:node`, `/v1/health/state/:state`, `/v1/status/leader`,
//!   `/v1/agent/members`, `/v1/agent/metrics` (the KV and txn apply
//!   summaries only). Bodies and error texts follow Consul 1.20 (see
//!   `testdata/vectors/consul/http`).
//! - [`serve_grpc`]: the public gRPC port (8502; TLS 8503 with a TLS config)
//!   that consul-dataplane uses: `DataplaneService/GetEnvoyBootstrapParams`
//!   (from the catalog it holds), `ServerDiscoveryService/WatchServers`, and
//!   Envoy's Delta ADS (CDS + EDS built from the catalog, Consul's cluster
//!   names, sha256 resource versions, one response in flight until ACKed,
//!   a coalescing delay after catalog changes like Consul's 200 ms and the
//!   server-wide pacing of proxy updates (`xds.update_max_per_second`), an
//!   optional per-server stream cap answered with `RESOURCE_EXHAUSTED`;
//!   faults on streams and responses, `consul.xds`).
//! - [`serve_serf`] (`--consul-serf`): the serf LAN port, UDP and TCP: the
//!   server is a memberlist/serf member that answers, probes, gossips and
//!   push-pulls, reconciles the pool into its catalog with `serfHealth`
//!   checks, and lists it at `/v1/agent/members` ([`SerfConfig`]).
//! - [`ConsulState`]: the shared catalog (cheap to clone), its counters
//!   ([`ConsulState::stats`]), test hooks ([`ConsulState::abort_subscriptions`])
//!   and the state a restart starts with ([`ConsulState::restarted`]).
//! - Faults ([`ConsulTargetConfig::faults`]): RPC connections (and blocking
//!   `Health.ServiceNodes` calls) delayed, stalled, dropped or reset;
//!   Subscribe calls and streams ended with `ABORTED`, `UNAVAILABLE` or
//!   `RESOURCE_EXHAUSTED`, snapshots cut halfway; garbage, truncated or
//!   oversized gRPC messages; HTTP requests delayed, stalled, dropped, reset
//!   or answered with a status.
//!
//! Not here: agent endpoints other than `/v1/agent/members` and
//! `/v1/agent/metrics`,
//! listeners/routes (LDS, RDS), the WAN pool,
//! clustering (a follower relays its agents to a leader, [`serve_relay`]; no
//! replication), persistence. Internals: `state` (catalog + fan-out),
//! `events` (event encoding), `conn` (what every port does with a
//! connection: accept, TLS handshake, HTTP/2 settings, graceful end), `rpc`,
//! `rpc_error` (why a call on the RPC port failed: net/rpc's error answer,
//! one variant per cause, Consul's words as Display),
//! `blocking` (blocking queries over RPC and HTTP, and the encoded results
//! they share), `kv` (the KV store, its locks and blocking reads), `http` (the API, one file per endpoint family), `render`
//! (the catalog in Consul's JSON), `sessions`, `grpc` (the public gRPC
//! port, one file per service) and `xds` (Envoy resources from the
//! catalog), `serf` (the LAN pool) and `acl` (tokens, policies, and
//! what a request's token may do).

mod acl;
mod agent_rpc;
mod auto_encrypt;
mod blocking;
mod conn;
mod connect_ca;
mod events;
mod fields;
mod grpc;
mod http;
mod kv;
mod kv_rpc;
mod mux;
mod relay;
mod render;
mod rpc;
mod rpc_error;
mod serf;
mod sessions;
mod state;
mod timing;
mod wait;
mod write_error;
mod writes;
mod xds;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;

pub use acl::AclSnapshot;
pub use connect_ca::{CaConfig, CaSnapshot, RATE_LIMITED};
pub use grpc::serve_grpc;
pub use http::{ApiRequest, dispatch, serve_http};
pub use kv::KV_MAX_VALUE_SIZE;
pub use relay::{RelayConfig, RelayCounters, RelaySnapshot, serve_relay};
pub use rpc::serve_rpc;
pub use serf::{
    SerfConfig, SerfConfigError, SerfLog, SerfMember, SerfSnapshot, bind_serf, serve_serf,
};

use crate::faults::{Faults, RestartState};
use sessions::Sessions;
use state::{CheckDef, NodeDef, Store, Touched};

/// Settings of the embedded Consul target.
#[derive(Clone, Debug)]
pub struct ConsulTargetConfig {
    /// Datacenter name put into nodes (`dc1`).
    pub datacenter: String,
    /// Shortest session TTL accepted (Consul's `session_ttl_min`, 10 s).
    pub session_ttl_min: Duration,
    /// Events kept per topic+key for subscribers that fall behind; a
    /// subscriber further behind gets a new snapshot.
    pub topic_buffer: usize,
    /// The server's own node (registered at start, with a `serfHealth`
    /// check); sessions created without `Node` belong to it.
    pub node_name: String,
    /// TLS as a Consul server with `tls.internal_rpc` / `tls.https`: on the
    /// RPC port a first byte `0x03` starts a TLS handshake (then `0x08`
    /// inside it; `0x08` first stays plaintext); the HTTP port speaks HTTPS
    /// only. Client certificates are required when the config verifies them
    /// (`verify_incoming`), see [`agent_sim_net::server_config`].
    pub tls: Option<std::sync::Arc<rustls::ServerConfig>>,
    /// Consul's `limits.rpc_max_conns_per_client`: RPC connections beyond
    /// this many from one client IP are closed right after accept, without
    /// a byte (0 = no cap; a real server's default is 100).
    pub rpc_max_conns_per_client: usize,
    /// ACLs with `default_policy = "deny"` when set: these secrets are
    /// management tokens (everything allowed); more tokens, with node and
    /// service identities and policies, are made at `/v1/acl/token` (see
    /// `acl`). Requests are allowed what their token's rules grant, denied
    /// and `ACL not found` in Consul 1.20's words; a Subscribe whose token
    /// may not read the service (no token included) gets an empty
    /// snapshot, with an unknown token `Unknown: ACL not found`.
    pub acl_tokens: Option<Vec<String>>,
    /// How long the xDS server waits after a catalog change before it
    /// rebuilds a proxy's resources (Consul's proxycfg coalescing, 200 ms).
    pub xds_coalesce: Duration,
    /// Most proxy updates delivered per second, across all xDS streams
    /// (Consul's `xds.update_max_per_second`, default 250): each proxy's
    /// update, its first configuration included, takes a token of one
    /// server-wide bucket (burst 1) and waits for the longer of its token
    /// and the coalescing delay, as Consul's proxycfg does. `0`: no limit.
    pub xds_update_rate: f64,
    /// Most Delta ADS streams open at once; more are refused with
    /// `RESOURCE_EXHAUSTED` in Consul's words (0 = no cap; a real server
    /// caps at ceil(proxies / healthy servers × 1.1)).
    pub xds_max_streams: usize,
    /// Faults to inject (`consul.rpc`, `consul.subscribe`, `consul.frame`,
    /// `consul.http`); none by default.
    pub faults: Faults,
    /// The serf LAN port (`--consul-serf`): where and how the server is a
    /// gossip member; `None`: not served (`/v1/agent/members` lists the
    /// server alone).
    pub serf: Option<SerfConfig>,
    /// The Connect CA's signing and rationing (`ConnectCA.Sign`).
    pub connect_ca: CaConfig,
    /// Consul's `limits.kv_max_value_size`: a KV `PUT` whose
    /// `Content-Length` is larger is refused with 413 (a chunked body is
    /// not checked, as on a real agent; it is read up to 16 MiB), as is a
    /// txn KV op whose value is larger.
    pub kv_max_value_size: usize,
}

/// Consul's proxycfg coalescing delay.
pub const XDS_COALESCE: Duration = Duration::from_millis(200);

/// Consul's default `xds.update_max_per_second` (agent/config/default.go).
pub const XDS_UPDATE_RATE: f64 = 250.0;

impl Default for ConsulTargetConfig {
    fn default() -> Self {
        Self {
            datacenter: "dc1".into(),
            session_ttl_min: Duration::from_secs(10),
            topic_buffer: 256,
            node_name: "agent-sim-server".into(),
            tls: None,
            rpc_max_conns_per_client: 0,
            acl_tokens: None,
            xds_coalesce: XDS_COALESCE,
            xds_update_rate: XDS_UPDATE_RATE,
            xds_max_streams: 0,
            faults: Faults::default(),
            serf: None,
            connect_ca: CaConfig::default(),
            kv_max_value_size: KV_MAX_VALUE_SIZE,
        }
    }
}

/// Counters of the target since it started (gauges where noted).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ConsulTargetSnapshot {
    /// RPC connections accepted with the `0x08` prefix (total).
    pub rpc_connections: u64,
    /// RPC connections open now (gauge).
    pub rpc_connections_open: u64,
    /// RPC connections closed because the first byte was not `0x08` or did not
    /// arrive within 5 s.
    pub rpc_rejected_no_prefix: u64,
    /// RPC connections whose TLS handshake failed (no or a bad client
    /// certificate, a client that does not trust the server).
    pub rpc_rejected_tls: u64,
    /// RPC connections closed at once: over `rpc_max_conns_per_client`.
    pub rpc_rejected_conn_cap: u64,
    /// Subscribe streams open now (gauge).
    pub subscriptions_active: u64,
    pub subscribe_calls: u64,
    /// Snapshots started (fresh, after a stale resume, or after lagging).
    pub snapshots_sent: u64,
    /// Subscribes that resumed at their index without a snapshot.
    pub resumes_served: u64,
    /// Event messages written to Subscribe streams (all kinds).
    pub events_sent: u64,
    pub http_requests: u64,
    /// Successful `/v1/catalog/register` calls plus `Service` `set` ops in txns.
    pub registrations: u64,
    /// `/v1/catalog/deregister` calls plus `Service`/`Node` `delete` ops in txns.
    pub deregistrations: u64,
    /// Successful `/v1/txn` calls.
    pub txns: u64,
    /// Sessions alive now (gauge).
    pub sessions_active: u64,
    pub sessions_created: u64,
    pub sessions_renewed: u64,
    pub sessions_expired: u64,
    pub config_entries_written: u64,
    pub raft_index: u64,
    /// `GetEnvoyBootstrapParams` calls answered.
    pub xds_bootstraps: u64,
    /// Delta ADS streams accepted (total).
    pub xds_streams: u64,
    /// Delta ADS streams open now (gauge).
    pub xds_streams_active: u64,
    /// Delta ADS streams refused at the stream cap.
    pub xds_streams_refused: u64,
    /// Delta xDS responses sent.
    pub xds_responses: u64,
    /// ACKs received.
    pub xds_acks: u64,
    /// NACKs received.
    pub xds_nacks: u64,
    /// Delta ADS streams whose first request offered resource versions
    /// (`initial_resource_versions`: a proxy resuming after a reconnect).
    pub xds_streams_resumed: u64,
    /// Requests on the public gRPC port (Delta xDS, bootstrap params,
    /// WatchServers) with top-level fields the API does not define
    /// (ignored).
    pub grpc_unknown_fields: u64,
    /// Delta xDS requests for a type this server does not serve (listeners,
    /// routes, secrets, ...; ignored, as Consul ignores types it has no
    /// handler for).
    pub xds_unknown_types: u64,
    /// Delta ADS streams ended because a request did not decode, was over
    /// its size limit, or named more resources than a stream holds.
    pub xds_requests_refused: u64,
    /// RPC connections accepted with the `0x04` prefix (yamux; blocking
    /// queries), of `rpc_connections`.
    pub rpc_mux_connections: u64,
    /// Blocking queries (RPC and HTTP) held now, waiting for a change or
    /// the end of their wait (gauge).
    pub blocking_queries_held: u64,
    /// `Health.ServiceNodes` calls answered over RPC.
    pub blocking_answers: u64,
    /// Failed accepts on the RPC, HTTP and gRPC ports (e.g. out of file
    /// descriptors), each retried after a pause.
    pub accept_errors: u64,
    /// `Coordinate.Update` calls accepted.
    pub coordinate_updates: u64,
    /// Calls on the multiplexed RPC port by method (methods this server
    /// does not know counted as `other`).
    pub rpc_calls: std::collections::BTreeMap<String, u64>,
    /// Of those, the calls answered with an error.
    pub rpc_errors: u64,
    /// KV reads answered (HTTP `GET /v1/kv`, `KVS.Get|List|ListKeys`,
    /// txn `get`/`get-tree` ops).
    pub kv_reads: u64,
    /// KV writes applied (each a raft index; CAS and locks that lost too).
    pub kv_writes: u64,
    /// Lock acquires that took the lock.
    pub kv_lock_acquires: u64,
    /// Lock acquires answered `false` (held by another session, within a
    /// lock-delay, or by a `consul.kv` fault).
    pub kv_lock_refused: u64,
    /// `/v1/txn` calls with KV operations, and `Txn.Apply`/`Txn.Read`
    /// calls, that applied.
    pub kv_txns: u64,
    /// Keys held now (gauge).
    pub kv_keys: u64,
    /// The serf LAN port's counters (`serf_*`).
    #[serde(flatten)]
    pub serf: SerfSnapshot,
    /// The Connect CA: leaves signed, rate-limited answers, roots.
    pub connect_ca: CaSnapshot,
    /// ACL resolutions and denials, tokens and policies held.
    pub acl: AclSnapshot,
}

#[derive(Default)]
struct Counters {
    rpc_connections: AtomicU64,
    rpc_connections_open: AtomicU64,
    rpc_rejected_no_prefix: AtomicU64,
    rpc_rejected_tls: AtomicU64,
    rpc_rejected_conn_cap: AtomicU64,
    subscriptions_active: AtomicU64,
    subscribe_calls: AtomicU64,
    snapshots_sent: AtomicU64,
    resumes_served: AtomicU64,
    events_sent: AtomicU64,
    http_requests: AtomicU64,
    registrations: AtomicU64,
    deregistrations: AtomicU64,
    txns: AtomicU64,
    sessions_created: AtomicU64,
    sessions_renewed: AtomicU64,
    sessions_expired: AtomicU64,
    config_entries_written: AtomicU64,
    xds_bootstraps: AtomicU64,
    xds_streams: AtomicU64,
    xds_streams_active: AtomicU64,
    xds_streams_refused: AtomicU64,
    xds_responses: AtomicU64,
    xds_acks: AtomicU64,
    xds_nacks: AtomicU64,
    xds_streams_resumed: AtomicU64,
    grpc_unknown_fields: AtomicU64,
    xds_unknown_types: AtomicU64,
    xds_requests_refused: AtomicU64,
    rpc_mux_connections: AtomicU64,
    blocking_queries_held: AtomicU64,
    blocking_answers: AtomicU64,
    accept_errors: AtomicU64,
    coordinate_updates: AtomicU64,
    rpc_calls: [AtomicU64; RPC_METHODS.len() + 1],
    rpc_errors: AtomicU64,
    kv_reads: AtomicU64,
    kv_writes: AtomicU64,
    kv_lock_acquires: AtomicU64,
    kv_lock_refused: AtomicU64,
    kv_txns: AtomicU64,
    serf: Arc<serf::SerfCounters>,
    acl: Arc<acl::AclCounters>,
}

/// The methods whose calls are counted by name (the rest as `other`).
const RPC_METHODS: [&str; 17] = [
    "Health.ServiceNodes",
    "ConnectCA.Roots",
    "ConnectCA.Sign",
    "Catalog.Register",
    "Catalog.Deregister",
    "Catalog.NodeServiceList",
    "Health.NodeChecks",
    "Coordinate.Update",
    "Session.Apply",
    "Session.Renew",
    "Status.Ping",
    "KVS.Get",
    "KVS.List",
    "KVS.ListKeys",
    "KVS.Apply",
    "Txn.Apply",
    "Txn.Read",
];

impl Counters {
    fn bump(&self, c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// Holds a gauge up while alive.
struct Gauge {
    state: ConsulState,
    pick: fn(&Counters) -> &AtomicU64,
}

impl Gauge {
    fn up(state: &ConsulState, pick: fn(&Counters) -> &AtomicU64) -> Self {
        pick(&state.inner.counters).fetch_add(1, Ordering::Relaxed);
        Self {
            state: state.clone(),
            pick,
        }
    }
}

impl Drop for Gauge {
    fn drop(&mut self) {
        (self.pick)(&self.state.inner.counters).fetch_sub(1, Ordering::Relaxed);
    }
}

struct Inner {
    cfg: ConsulTargetConfig,
    /// Catalog, config entries and topics. Lock order: `store`, then `sessions`.
    store: Mutex<Store>,
    sessions: Mutex<Sessions>,
    /// Shared by the states of one server across restarts.
    counters: Arc<Counters>,
    /// Bumped by [`ConsulState::abort_subscriptions`].
    abort: watch::Sender<u64>,
    rpc_addr: Mutex<Option<SocketAddr>>,
    /// RPC connections open per client IP (for the per-client cap).
    rpc_per_ip: Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
    /// The Connect CA's trust domain (a UUID, as a dev server's), part of
    /// every cluster name.
    trust_domain: String,
    /// The public gRPC listener (what `WatchServers` names).
    grpc_addr: Mutex<Option<SocketAddr>>,
    /// Encoded health results shared by the blocking queries one change
    /// wakes. Lock order: `results`, then `store`.
    results: blocking::ResultCache,
    /// The server's node ID (its serf `id` tag).
    node_id: String,
    /// The LAN pool as this server sees it.
    serf: Arc<serf::Serf>,
    /// The Connect CA.
    ca: connect_ca::Ca,
    /// How long KV and txn applies took (`/v1/agent/metrics`).
    timings: Mutex<timing::Timings>,
    /// Tokens and policies (ACLs on with `acl_tokens`).
    acl: acl::Acl,
}

/// One RPC connection counted against its client IP's cap; uncounted on drop.
pub(crate) struct IpSlot {
    state: ConsulState,
    ip: std::net::IpAddr,
}

impl ConsulState {
    /// Takes a slot for a connection from `ip`, unless the IP is at the cap.
    pub(crate) fn rpc_slot(&self, ip: std::net::IpAddr) -> Option<IpSlot> {
        let cap = self.inner.cfg.rpc_max_conns_per_client;
        let mut m = self
            .inner
            .rpc_per_ip
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let n = m.entry(ip).or_insert(0);
        if cap > 0 && *n >= cap {
            return None;
        }
        *n += 1;
        Some(IpSlot {
            state: self.clone(),
            ip,
        })
    }

    /// What a request's token may do (`""`: the anonymous token), or
    /// `ACL not found`.
    pub(crate) fn acl(&self, token: &str) -> Result<acl::Authz, acl::AclError> {
        self.inner.acl.resolve(token)
    }
}

impl Drop for IpSlot {
    fn drop(&mut self) {
        let mut m = self
            .state
            .inner
            .rpc_per_ip
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

/// The shared state of one embedded Consul server: catalog, sessions, config
/// entries, subscriptions and counters. Clones share it.
#[derive(Clone)]
pub struct ConsulState {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ConsulState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsulState")
            .field("cfg", &self.inner.cfg)
            .field("raft_index", &self.raft_index())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ConsulState {
    /// A fresh server whose catalog holds only its own node (`node_name`,
    /// 127.0.0.1, with a passing `serfHealth` check).
    pub fn new(cfg: ConsulTargetConfig) -> Self {
        Self::with_counters(cfg, Arc::default())
    }

    fn with_counters(cfg: ConsulTargetConfig, counters: Arc<Counters>) -> Self {
        let mut store = Store::new(cfg.datacenter.clone(), cfg.topic_buffer);
        let idx = store.next_index();
        let mut t = Touched::default();
        let node = NodeDef {
            address: "127.0.0.1".into(),
            ..NodeDef::default()
        };
        store.ensure_node(&cfg.node_name, node, idx, &mut t);
        let serf = CheckDef {
            check_id: state::SERF_HEALTH.into(),
            name: "Serf Health Status".into(),
            status: "passing".into(),
            ..CheckDef::default()
        };
        store
            .ensure_check(&cfg.node_name, serf, idx, &mut t)
            .expect("the node was just added");
        store.commit(idx, t);
        let node_id = uuid::Uuid::new_v4().to_string();
        let serf = serf::Serf::new(
            cfg.serf.clone().unwrap_or_default(),
            &cfg.node_name,
            &cfg.datacenter,
            &node_id,
            serf::server_meta(&cfg, &node_id, 8300, None),
            counters.serf.clone(),
        );
        let trust_domain = uuid::Uuid::new_v4().to_string();
        let acl = acl::Acl::new(
            cfg.acl_tokens.as_deref(),
            &cfg.datacenter,
            idx,
            counters.acl.clone(),
        );
        Self {
            inner: Arc::new(Inner {
                store: Mutex::new(store),
                sessions: Mutex::new(Sessions::default()),
                counters,
                abort: watch::channel(0).0,
                rpc_addr: Mutex::new(None),
                rpc_per_ip: Mutex::new(std::collections::HashMap::new()),
                ca: connect_ca::Ca::new(cfg.connect_ca.clone(), &trust_domain, &cfg.datacenter),
                trust_domain,
                cfg,
                grpc_addr: Mutex::new(None),
                results: blocking::ResultCache::default(),
                node_id,
                serf: Arc::new(serf),
                timings: Mutex::new(timing::Timings::default()),
                acl,
            }),
        }
    }

    /// A copy of the counters.
    pub fn stats(&self) -> ConsulTargetSnapshot {
        let c = &self.inner.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        // Its own statement: a guard inside the literal below would live to
        // its end, holding the sessions while `raft_index` takes the store
        // (the opposite of the lock order; session creation deadlocked it).
        let sessions_active = lock(&self.inner.sessions).len() as u64;
        let kv_keys = self.store().kv.len() as u64;
        ConsulTargetSnapshot {
            rpc_connections: get(&c.rpc_connections),
            rpc_connections_open: get(&c.rpc_connections_open),
            rpc_rejected_no_prefix: get(&c.rpc_rejected_no_prefix),
            rpc_rejected_tls: get(&c.rpc_rejected_tls),
            rpc_rejected_conn_cap: get(&c.rpc_rejected_conn_cap),
            subscriptions_active: get(&c.subscriptions_active),
            subscribe_calls: get(&c.subscribe_calls),
            snapshots_sent: get(&c.snapshots_sent),
            resumes_served: get(&c.resumes_served),
            events_sent: get(&c.events_sent),
            http_requests: get(&c.http_requests),
            registrations: get(&c.registrations),
            deregistrations: get(&c.deregistrations),
            txns: get(&c.txns),
            sessions_active,
            sessions_created: get(&c.sessions_created),
            sessions_renewed: get(&c.sessions_renewed),
            sessions_expired: get(&c.sessions_expired),
            config_entries_written: get(&c.config_entries_written),
            raft_index: self.raft_index(),
            xds_bootstraps: get(&c.xds_bootstraps),
            xds_streams: get(&c.xds_streams),
            xds_streams_active: get(&c.xds_streams_active),
            xds_streams_refused: get(&c.xds_streams_refused),
            xds_responses: get(&c.xds_responses),
            xds_acks: get(&c.xds_acks),
            xds_nacks: get(&c.xds_nacks),
            xds_streams_resumed: get(&c.xds_streams_resumed),
            grpc_unknown_fields: get(&c.grpc_unknown_fields),
            xds_unknown_types: get(&c.xds_unknown_types),
            xds_requests_refused: get(&c.xds_requests_refused),
            rpc_mux_connections: get(&c.rpc_mux_connections),
            blocking_queries_held: get(&c.blocking_queries_held),
            blocking_answers: get(&c.blocking_answers),
            accept_errors: get(&c.accept_errors),
            coordinate_updates: get(&c.coordinate_updates),
            rpc_calls: RPC_METHODS
                .iter()
                .chain(&["other"])
                .zip(&c.rpc_calls)
                .map(|(m, n)| (m.to_string(), get(n)))
                .filter(|(_, n)| *n > 0)
                .collect(),
            rpc_errors: get(&c.rpc_errors),
            kv_reads: get(&c.kv_reads),
            kv_writes: get(&c.kv_writes),
            kv_lock_acquires: get(&c.kv_lock_acquires),
            kv_lock_refused: get(&c.kv_lock_refused),
            kv_txns: get(&c.kv_txns),
            kv_keys,
            serf: self.inner.serf.snapshot(),
            connect_ca: self.inner.ca.snapshot(),
            acl: self.inner.acl.snapshot(),
        }
    }

    /// Records how long an apply took.
    pub(crate) fn timed(&self, which: timing::Timed, since: std::time::Instant) {
        lock(&self.inner.timings).record(which, since.elapsed());
    }

    /// Counts a call on the multiplexed RPC port.
    pub(crate) fn count_call(&self, method: &str, errored: bool) {
        let c = &self.inner.counters;
        let i = RPC_METHODS
            .iter()
            .position(|m| *m == method)
            .unwrap_or(RPC_METHODS.len());
        c.bump(&c.rpc_calls[i]);
        if errored {
            c.bump(&c.rpc_errors);
        }
    }

    /// The state a restarted server starts with: this one
    /// ([`RestartState::Keep`]: catalog, sessions, config entries and raft
    /// index; every session's TTL timer starts over, as a new leader's do),
    /// or an empty one with indexes starting over ([`RestartState::Lose`],
    /// a `consul agent -dev` restart). Counters go on either way.
    pub fn restarted(&self, state: RestartState) -> ConsulState {
        match state {
            RestartState::Keep => {
                self.sessions().touch_all(tokio::time::Instant::now());
                self.clone()
            }
            RestartState::Lose => {
                Self::with_counters(self.inner.cfg.clone(), self.inner.counters.clone())
            }
        }
    }

    /// The faults this server injects.
    pub(crate) fn faults(&self) -> &Faults {
        &self.inner.cfg.faults
    }

    /// Ends every open Subscribe stream with gRPC status `ABORTED` (what a
    /// real server does on an ACL change or snapshot restore).
    pub fn abort_subscriptions(&self) {
        self.inner.abort.send_modify(|g| *g += 1);
    }

    /// The Connect trust domain (cluster names end in
    /// `.internal.<trust domain>.consul`).
    pub fn trust_domain(&self) -> &str {
        &self.inner.trust_domain
    }

    /// The Connect CA.
    pub(crate) fn ca(&self) -> &connect_ca::Ca {
        &self.inner.ca
    }

    /// The index of the last write.
    pub fn raft_index(&self) -> u64 {
        self.store().raft_index
    }

    fn store(&self) -> MutexGuard<'_, Store> {
        lock(&self.inner.store)
    }

    fn sessions(&self) -> MutexGuard<'_, Sessions> {
        lock(&self.inner.sessions)
    }

    fn set_rpc_addr(&self, addr: SocketAddr) {
        *lock(&self.inner.rpc_addr) = Some(addr);
    }

    /// Where the RPC and public gRPC ports listen, known before they serve
    /// (the serf tags name them).
    pub(crate) fn note_listeners(&self, rpc: Option<SocketAddr>, grpc: Option<SocketAddr>) {
        if let Some(a) = rpc {
            self.set_rpc_addr(a);
        }
        if let Some(a) = grpc {
            *lock(&self.inner.grpc_addr) = Some(a);
        }
    }

    /// What `/v1/status/leader` names: the RPC listener when it is bound to a
    /// concrete address, else Consul's default `127.0.0.1:8300`.
    fn leader_addr(&self) -> SocketAddr {
        lock(&self.inner.rpc_addr)
            .filter(|a| !a.ip().is_unspecified())
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8300)))
    }
}
