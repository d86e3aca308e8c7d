//! One simulated Consul client agent ([`ConsulAgent`]) and the factory that
//! builds them ([`ConsulFactory`]).
//!
//! A session is: dial the agent's server (boxed connect step, freed once the
//! connection is up), one Subscribe stream per upstream on that single
//! HTTP/2 connection, then one loop that polls together the connection
//! driver, every stream, at most one HTTP call (registration, TTL session
//! create / renew, check flap) and one timer. State that must survive a
//! reconnect — views with their indexes, registration, session ID — lives
//! in the agent; streams, timers and in-flight calls live in the session.
//!
//! A session the scenario ends (a storm, churn, the max session length)
//! is cancelled like the end of the run: streams and connection are
//! dropped, the registration and the TTL session stay (a network blip, not
//! a leave), and the next session resubscribes at its indexes; only the
//! agent's `finish` (the end of the run, or a ramp-down) deregisters.
//!
//! Parts, each importing only those after it: `factory` ([`ConsulFactory`]:
//! validation, dialers, HTTP client, probe board); `streaming` (a session
//! of Subscribe streams) and `watching` (blocking queries, HTTP long
//! polls), each a `session::Watches`; `session` (the entry and the loop
//! every session runs); `subscriptions` (watch state, Subscribe streams,
//! views, status handling) and `upkeep` (registration, TTL session, check
//! flaps, the exit cleanup).

mod auto_encrypt;
mod connect;
mod factory;
mod kv;
mod link;
mod news;
mod session;
mod streaming;
mod subscriptions;
mod upkeep;
mod watching;

pub(crate) use auto_encrypt::{
    RATE_LIMITED_KIND as AUTO_ENCRYPT_RATE_LIMITED, REFUSED as AUTO_ENCRYPT_REFUSED,
};
pub use factory::{ConsulFactory, api_client, http_api};

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use agent_sim_metrics::{CounterId, LatencyId, Metrics};
use agent_sim_proto::consul::subscribe::Topic;
use tokio::time::Instant;

use crate::config::{ConsulConfig, NamePattern};
use crate::conn::{ByteCounters, Dialer};
use crate::http::{self, HttpApi};
use crate::probe::{Owed, ProbeBoard};
use agent_sim_fleet::SessionEnd;
use agent_sim_fleet::servers::Router;
use link::Link;

use crate::rpc::coordinate::Vivaldi;
use crate::txn::TxnBatcher;
use crate::view::{View, ViewKind};
use crate::{ConsulError, names};

/// Backoff of a subscription after repeated `ABORTED`.
pub const ABORT_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(200), Duration::from_secs(60));
/// Backoff of failed HTTP calls of one agent.
pub const HTTP_BACKOFF: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(30));

/// Metric ids resolved once.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ids {
    subscriptions: CounterId,
    snapshots: CounterId,
    resumes: CounterId,
    resumes_silent: CounterId,
    aborts: CounterId,
    events_received: CounterId,
    sessions_created: CounterId,
    sessions_renewed: CounterId,
    sessions_expired: CounterId,
    registrations: CounterId,
    reregistrations: CounterId,
    anti_entropy_syncs: CounterId,
    deregistrations: CounterId,
    flaps: CounterId,
    connect: LatencyId,
    subscribe_snapshot: LatencyId,
    session_renew: LatencyId,
    probe_overhead: LatencyId,
    arrivals_user_time: CounterId,
    watch_calls: CounterId,
    watch_responses: CounterId,
    watch_results_changed: CounterId,
    bytes_rx: CounterId,
    bytes_tx: CounterId,
    watch_bytes_rx: CounterId,
    watch_bytes_tx: CounterId,
    coordinate_updates: CounterId,
    pings: CounterId,
    skips: CounterId,
    syncs_server_up: CounterId,
    router_removes: CounterId,
    router_adds: CounterId,
    leaf_issued: CounterId,
    leaf_renewed: CounterId,
    leaf_rate_limited: CounterId,
    leaf_boot: LatencyId,
    leaf_rotation: LatencyId,
    auto_encrypt: LatencyId,
    auto_encrypt_rate_limited: CounterId,
    proxy_updates: CounterId,
    /// A client agent's calls by method (`link::Rpc` order).
    rpc: [LatencyId; 8],
    kv: kv::KvIds,
}

impl Ids {
    fn resolve(m: &Metrics) -> Result<Self, ConsulError> {
        crate::check_declared(m, &crate::metrics_spec())?;
        Ok(Ids {
            subscriptions: m.counter(names::SUBSCRIPTIONS),
            snapshots: m.counter(names::SNAPSHOTS),
            resumes: m.counter(names::RESUMES),
            resumes_silent: m.counter(names::RESUMES_SILENT),
            aborts: m.counter(names::ABORTS),
            events_received: m.counter(names::EVENTS_RECEIVED),
            sessions_created: m.counter(names::SESSIONS_CREATED),
            sessions_renewed: m.counter(names::SESSIONS_RENEWED),
            sessions_expired: m.counter(names::SESSIONS_EXPIRED),
            registrations: m.counter(names::REGISTRATIONS),
            reregistrations: m.counter(names::REREGISTRATIONS),
            anti_entropy_syncs: m.counter(names::ANTI_ENTROPY_SYNCS),
            deregistrations: m.counter(names::DEREGISTRATIONS),
            flaps: m.counter(names::FLAPS),
            watch_calls: m.counter(names::WATCH_CALLS),
            watch_responses: m.counter(names::WATCH_RESPONSES),
            watch_results_changed: m.counter(names::WATCH_RESULTS_CHANGED),
            bytes_rx: m.counter(names::BYTES_RECEIVED),
            bytes_tx: m.counter(names::BYTES_SENT),
            watch_bytes_rx: m.counter(names::WATCH_BYTES_RECEIVED),
            watch_bytes_tx: m.counter(names::WATCH_BYTES_SENT),
            connect: m.latency(names::CONNECT),
            subscribe_snapshot: m.latency(names::SUBSCRIBE_SNAPSHOT),
            session_renew: m.latency(names::SESSION_RENEW),
            probe_overhead: m.latency(names::PROBE_OVERHEAD),
            arrivals_user_time: m.counter(names::ARRIVALS_USER_TIME),
            coordinate_updates: m.counter(names::COORDINATE_UPDATES),
            pings: m.counter(names::ROUTER_PINGS),
            skips: m.counter(names::ROUTER_SKIPS),
            syncs_server_up: m.counter(names::SYNCS_SERVER_UP),
            router_removes: m.counter(names::ROUTER_REMOVES),
            router_adds: m.counter(names::ROUTER_ADDS),
            leaf_issued: m.counter(names::LEAF_CERTS_ISSUED),
            leaf_renewed: m.counter(names::LEAF_CERTS_RENEWED),
            leaf_rate_limited: m.counter(names::LEAF_RATE_LIMITED),
            leaf_boot: m.latency(names::LEAF_BOOT),
            leaf_rotation: m.latency(names::LEAF_ROTATION),
            auto_encrypt: m.latency(names::AUTO_ENCRYPT),
            auto_encrypt_rate_limited: m.counter(names::AUTO_ENCRYPT_RATE_LIMITED),
            proxy_updates: m.counter(names::PROXY_UPDATES),
            rpc: names::RPC_LATENCIES.map(|n| m.latency(n)),
            kv: kv::KvIds::resolve(m),
        })
    }
}

/// What every agent of a fleet shares.
pub(crate) struct Shared {
    cfg: ConsulConfig,
    /// The service chains laid out over the agents (`--service-chain`).
    chains: Option<crate::chain::Chains>,
    dialers: Vec<Dialer>,
    upstreams: Vec<(NamePattern, Option<Arc<str>>)>,
    http: Arc<HttpApi>,
    batcher: OnceLock<TxnBatcher>,
    board: Option<Arc<ProbeBoard>>,
    /// The intentions probe's board beside the catalog probe's
    /// (`--probe catalog,intentions`).
    also: Option<Arc<ProbeBoard>>,
    metrics: Metrics,
    ids: Ids,
    token: String,
    ttl: Option<(Duration, String)>,
    flap_interval: Option<Duration>,
    /// Where `--watch http` long polls go.
    watch_api: WatchApi,
    /// The agents' gossip pool (client wire with `--gossip on`).
    gossip: Option<crate::gossip::Gossip>,
    /// The fleet's certificates (boot and rotation figures).
    connect: Option<Arc<crate::connect::ConnectBoard>>,
    /// Each server's TLS for `AutoEncrypt.Sign`, when the agents ask for
    /// their certificate at boot (`auto_encrypt`, client wire).
    auto_encrypt: Option<auto_encrypt::InsecureTls>,
    /// The KV prefixes watched (`--watch-kv`), and the probe key.
    kv: kv::KvShared,
    /// Each agent's own ACL token (`--acl-tokens`), once had.
    tokens: OnceLock<crate::acl::AgentTokens>,
    /// What the run created of ACLs (token accessors, policy IDs): what it
    /// deletes at its end.
    acl_created: std::sync::Mutex<(Vec<String>, Vec<String>)>,
}

/// The HTTP API as `--watch http` dials it: a connection per watched
/// service, outside the shared client's pool.
pub(crate) struct WatchApi {
    addr: std::net::SocketAddr,
    tls: Option<(
        tokio_rustls::TlsConnector,
        rustls::pki_types::ServerName<'static>,
    )>,
    /// `Host` header.
    host: String,
}

/// An agent's own service and how many instances of it it registers.
pub(crate) struct Own<'a> {
    service: std::borrow::Cow<'a, str>,
    instances: u32,
}

impl Shared {
    /// Agent `index`'s own service: the configured one, or its tier's in
    /// a service chain (computed from the index, not stored).
    fn own(&self, index: u64) -> Own<'_> {
        match &self.chains {
            Some(c) => {
                let p = c.place(index);
                Own {
                    service: p.service(&self.cfg.service_name).into(),
                    instances: p.instances,
                }
            }
            None => Own {
                service: self.cfg.service_name.as_str().into(),
                instances: self.cfg.services_per_agent,
            },
        }
    }

    /// The board a subscription timed on `t` reports to.
    fn board_of(&self, t: Option<Timed>) -> Option<&Arc<ProbeBoard>> {
        match t? {
            Timed::Main => self.board.as_ref(),
            Timed::Also => self.also.as_ref(),
        }
    }

    /// The token agent `index` calls with: its own, else the run's.
    fn token(&self, index: u64) -> &str {
        self.tokens
            .get()
            .and_then(|t| t.get(index))
            .unwrap_or(&self.token)
    }

    /// Where a connection's bytes go: the run's totals, and the watches'
    /// when `watching`.
    fn bytes(&self, watching: bool) -> ByteCounters {
        ByteCounters {
            metrics: self.metrics.clone(),
            rx: self.ids.bytes_rx,
            tx: self.ids.bytes_tx,
            class: watching.then_some((self.ids.watch_bytes_rx, self.ids.watch_bytes_tx)),
        }
    }

    fn batcher(&self) -> &TxnBatcher {
        self.batcher
            .get_or_init(|| TxnBatcher::spawn(self.http.clone(), self.metrics.clone()))
    }
}

/// Which of the run's probes a subscription is timed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Timed {
    /// The run's probe (`Shared::board`).
    Main,
    /// The intentions probe beside the catalog probe (`Shared::also`).
    Also,
}

/// Persistent state of one subscription.
struct Sub {
    name: Arc<str>,
    topic: Topic,
    view: View,
    /// The probe this subscription is timed on, if any.
    probe: Option<Timed>,
    /// Completed a snapshot at least once (later snapshots are re-syncs).
    ever_synced: bool,
    /// Last probe id (controller) or raft index (observer) this agent
    /// recorded an arrival for.
    probe_seen: u64,
    /// The probes (observer: changes) that expected this subscription's
    /// arrival when it last went down (see `ProbeBoard::sub_down`).
    probe_owed: Owed,
    /// Observer: state of the probe target after the last snapshot or probe
    /// change (`Expect as u8`, 0 unknown), to spot changes a re-sync brings.
    probe_state: u8,
    /// Set after its stream's first failure, until an event: later
    /// Subscribes back off, across sessions too (a real agent's materializer
    /// lives in its cache, not in its connection to a server).
    backoff: Option<agent_sim_fleet::Backoff>,
}

impl Sub {
    fn new(name: Arc<str>, topic: Topic, kind: ViewKind, probe: Option<Timed>) -> Self {
        Sub {
            name,
            topic,
            view: View::new(kind),
            probe,
            ever_synced: false,
            probe_seen: 0,
            probe_owed: Owed::default(),
            probe_state: 0,
            backoff: None,
        }
    }
}

/// What only some agents keep (boxed, so the agent stays small).
#[derive(Default)]
struct Extra {
    /// The agent's network coordinate (the client wire sends it; a fresh
    /// one until the first round trip moves it).
    vivaldi: Option<Vivaldi>,
    /// The leaf certificate of the agent's sidecars (client wire).
    leaf: Option<connect::Leaf>,
    /// What the agent keeps of its own certificate (`auto_encrypt`).
    agent_cert: Option<auto_encrypt::AgentCert>,
    /// The Connect proxies behind the agent (`--proxies-per-agent`), made
    /// at its first update.
    proxies: Option<crate::proxy::Proxies>,
}

/// One simulated Consul client agent.
pub struct ConsulAgent {
    index: u64,
    shared: Arc<Shared>,
    subs: Box<[Sub]>,
    /// The catalog holds our registration (as far as we know).
    registered: bool,
    /// A registration was sent: it may be in the catalog even if its answer
    /// never came (the exit cleanup removes the node then too).
    maybe_registered: bool,
    /// Anti-entropy found the registration lost: the next one is a repair.
    repairing: bool,
    session_id: Option<Box<str>>,
    renew_due: Option<Instant>,
    flaps: u32,
    /// What only some agents keep, boxed on first use: the network
    /// coordinate and the sidecars' leaf certificate.
    extra: Option<Box<Extra>>,
    /// The run's servers in this agent's order (Consul's router).
    router: Router,
    /// The server of the current (or last) session.
    session_server: u16,
    /// What gossip's news the agent has acted on, across its sessions
    /// (a session that starts after a new leader's event still syncs).
    news_seen: news::Seen,
    /// The last session ended with a move to another server, or was lost
    /// and the router's next server is another one: the next session
    /// syncs nothing (the cluster kept the agent's state) and confirms
    /// its server by a ping at once.
    moved: bool,
    /// The connection a rebalance checked the server it moved to on
    /// (client wire), and that server: the next session's, as a real
    /// agent's pool keeps it (dropped if that session goes elsewhere).
    /// (Its server is the link's own.)
    moved_link: Option<Box<Link>>,
    /// The agent's KV watches (`--watch-kv`; a thin pointer, `None`
    /// without any: the agent struct stays within 128 bytes).
    kv: Option<Box<Box<[kv::KvWatch]>>>,
}

impl std::fmt::Debug for ConsulAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsulAgent")
            .field("index", &self.index)
            .field("registered", &self.registered)
            .field("session", &self.session_id)
            .finish()
    }
}

impl ConsulAgent {
    /// Instances in the view of upstream `name` (tests, debugging).
    pub fn view_len(&self, name: &str) -> Option<usize> {
        self.subs
            .iter()
            .find(|s| &*s.name == name && s.topic == Topic::ServiceHealth)
            .map(|s| s.view.len())
    }

    /// The services this agent's sidecars call: its health subscriptions,
    /// each name once (an intentions watch is no upstream, and a real
    /// server refuses a proxy whose upstreams repeat a service).
    fn upstream_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::with_capacity(self.subs.len());
        for s in self.subs.iter().filter(|s| s.topic == Topic::ServiceHealth) {
            if !names.contains(&&*s.name) {
                names.push(&s.name);
            }
        }
        names
    }

    fn node(&self) -> String {
        http::node_name(&self.shared.cfg.conn.name_prefix, self.index)
    }

    /// The ACL token this agent calls with.
    fn token(&self) -> &str {
        self.shared.token(self.index)
    }

    /// The node's address in the catalog: the one its gossip member
    /// advertises, or (without gossip) a made-up one of its index.
    fn node_address(&self) -> String {
        match &self.shared.gossip {
            Some(g) => g.address(self.index).to_string(),
            None => http::node_address(self.index),
        }
    }

    /// Makes this agent a gossip member on its first session (it joins in
    /// the background, as `retry_join` does, every 30 s until it is in).
    /// When the servers' gossip security is not the run's, the agent stops
    /// there: a real one so set up never learns its servers.
    async fn ensure_member(&self) -> Result<(), SessionEnd> {
        let Some(g) = &self.shared.gossip else {
            return Ok(());
        };
        if let Some((kind, words)) = g.refused().await {
            return Err(SessionEnd::Fatal(agent_sim_fleet::Failure {
                kind,
                detail: Some(words.into()),
                said_by: None,
            }));
        }
        let Some(pool) = g.pool().await else {
            return Ok(());
        };
        if pool.slot(self.index).is_none() {
            let node = self.node();
            let (slot, _) = pool.add(&node, &upkeep::node_id(&node), self.index);
            pool.join_retrying(slot, crate::gossip::RETRY_JOIN);
        }
        Ok(())
    }

    /// This agent's gossip member, when it has one.
    fn member(&self) -> Option<(&agent_sim_gossip::Pool, usize)> {
        let pool = self.shared.gossip.as_ref()?.started()?;
        Some((pool, pool.slot(self.index)?))
    }

    /// The server (its dialer) of this agent's session.
    fn server(&self) -> usize {
        usize::from(self.session_server)
    }
}

fn jitter(d: Duration) -> Duration {
    d.mul_f64(0.5 + fastrand::f64())
}
