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

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use std::time::Duration;

use ::http::uri::PathAndQuery;
use agent_sim_fleet::{Agent, AgentFactory, Backoff, BoxFuture, Failure, SessionCx, SessionEnd};
use agent_sim_metrics::{CounterId, LatencyId, Metrics};
use agent_sim_proto::consul::subscribe::{Event, Topic, event::Payload};
use bytes::Bytes;
use futures_util::Stream;
use tokio::time::Instant;
use tonic::codec::Streaming;
use tonic::{Code, Status};

use crate::codec::{SUBSCRIBE_PATH, SmallCodec, subscribe_request};
use crate::config::{self, ConsulConfig, NamePattern, ProbeKind};
use crate::conn::{self, Dialer, GrpcClient, RpcConn};
use crate::http::{self, HttpApi, Refusal, Registration};
use crate::probe::{Expect, ProbeBoard, ProbeObserver, ProbeRunner};
use crate::txn::{TxnBatcher, TxnOps};
use crate::view::{Signal, View, ViewKind};
use crate::{ConsulError, names};

/// Dial + prefix + TLS + HTTP/2 handshake must finish within this.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// A resumed stream that stays silent this long was resumed (a stale index
/// gets `NewSnapshotToFollow` at once).
pub const RESUME_QUIET: Duration = Duration::from_millis(500);
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
    aborts: CounterId,
    events_received: CounterId,
    sessions_created: CounterId,
    sessions_renewed: CounterId,
    sessions_expired: CounterId,
    registrations: CounterId,
    deregistrations: CounterId,
    flaps: CounterId,
    connect: LatencyId,
    subscribe_snapshot: LatencyId,
    session_renew: LatencyId,
    probe_overhead: LatencyId,
}

impl Ids {
    fn resolve(m: &Metrics) -> Result<Self, ConsulError> {
        let spec = crate::metrics_spec();
        let snap = m.snapshot();
        for c in &spec.counters {
            if !snap.counters.iter().any(|(n, _)| n == c) {
                return Err(ConsulError::Metrics(format!("counter {c:?} not declared")));
            }
        }
        for l in &spec.latencies {
            if !m.latency_names().contains(l) {
                return Err(ConsulError::Metrics(format!("latency {l:?} not declared")));
            }
        }
        Ok(Ids {
            subscriptions: m.counter(names::SUBSCRIPTIONS),
            snapshots: m.counter(names::SNAPSHOTS),
            resumes: m.counter(names::RESUMES),
            aborts: m.counter(names::ABORTS),
            events_received: m.counter(names::EVENTS_RECEIVED),
            sessions_created: m.counter(names::SESSIONS_CREATED),
            sessions_renewed: m.counter(names::SESSIONS_RENEWED),
            sessions_expired: m.counter(names::SESSIONS_EXPIRED),
            registrations: m.counter(names::REGISTRATIONS),
            deregistrations: m.counter(names::DEREGISTRATIONS),
            flaps: m.counter(names::FLAPS),
            connect: m.latency(names::CONNECT),
            subscribe_snapshot: m.latency(names::SUBSCRIBE_SNAPSHOT),
            session_renew: m.latency(names::SESSION_RENEW),
            probe_overhead: m.latency(names::PROBE_OVERHEAD),
        })
    }
}

/// What every agent of a fleet shares.
pub(crate) struct Shared {
    cfg: ConsulConfig,
    dialers: Vec<Dialer>,
    upstreams: Vec<(NamePattern, Option<Arc<str>>)>,
    http: Arc<HttpApi>,
    batcher: OnceLock<TxnBatcher>,
    board: Option<Arc<ProbeBoard>>,
    metrics: Metrics,
    ids: Ids,
    token: String,
    ttl: Option<(Duration, String)>,
    flap_interval: Option<Duration>,
}

impl Shared {
    fn batcher(&self) -> &TxnBatcher {
        self.batcher
            .get_or_init(|| TxnBatcher::spawn(self.http.clone(), self.metrics.clone()))
    }
}

/// Creates [`ConsulAgent`]s; see [`ConsulFactory::new`].
pub struct ConsulFactory {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ConsulFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsulFactory")
            .field("rpc_targets", &self.shared.cfg.rpc_targets)
            .field("upstreams", &self.shared.cfg.upstreams)
            .finish()
    }
}

impl ConsulFactory {
    /// Validates `cfg` and builds what the agents share: dialers (TLS
    /// config), the HTTP client, the registration batcher (started on first
    /// use) and the probe board. `metrics` must declare [`crate::metrics_spec`].
    pub fn new(cfg: ConsulConfig, metrics: Metrics) -> Result<Self, ConsulError> {
        let v = cfg.prepare()?;
        let ids = Ids::resolve(&metrics)?;
        let dialers = v
            .rpc_addrs
            .iter()
            .zip(&v.rpc_hosts)
            .map(|(a, h)| {
                Dialer::new(
                    *a,
                    h,
                    cfg.tls.as_ref(),
                    cfg.keepalive_time,
                    cfg.keepalive_timeout,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let http_tls = match (&cfg.tls, v.https) {
            (Some(t), true) => Some((
                conn::tls_client_config(t)?,
                conn::server_name(t, &v.http_host)?,
            )),
            _ => None,
        };
        let http = Arc::new(
            HttpApi::with_tls(v.http_addr, http_tls, cfg.token.as_deref(), &cfg.datacenter)
                .map_err(ConsulError::Config)?,
        );
        let board = match (cfg.probe.kind, &v.probe_service) {
            (Some(kind), Some(svc)) if cfg.probe.controller => {
                Some(Arc::new(ProbeBoard::new(kind, svc, &cfg.name_prefix)))
            }
            (Some(kind), Some(svc)) => Some(Arc::new(ProbeBoard::new_observer(
                kind,
                svc,
                &cfg.name_prefix,
                cfg.probe.timeout(),
            ))),
            _ => None,
        };
        let upstreams = v
            .upstreams
            .into_iter()
            .map(|p| {
                let fixed = p.is_fixed().then(|| Arc::<str>::from(p.expand(0)));
                (p, fixed)
            })
            .collect();
        let ttl = cfg.session_ttl.map(|d| (d, config::go_duration(d)));
        let flap_interval = cfg.flap_rate.map(|r| r.interval());
        Ok(ConsulFactory {
            shared: Arc::new(Shared {
                token: cfg.token.clone().unwrap_or_default(),
                cfg,
                dialers,
                upstreams,
                http,
                batcher: OnceLock::new(),
                board,
                metrics,
                ids,
                ttl,
                flap_interval,
            }),
        })
    }

    /// The probe controller, when a probe kind is set and this process is
    /// the controller.
    pub fn probe_runner(&self) -> Option<ProbeRunner> {
        let s = &self.shared;
        if !s.cfg.probe.controller {
            return None;
        }
        let board = s.board.clone()?;
        Some(ProbeRunner {
            board,
            http: s.http.clone(),
            metrics: s.metrics.clone(),
            every: s.cfg.probe.every,
            timeout: s.cfg.probe.timeout(),
            instance_id: http::probe_instance_id(&s.cfg.name_prefix),
            keep: s.cfg.keep_registrations,
        })
    }

    /// The probe observer, when a probe kind is set and this process is not
    /// the controller (another shard makes the changes; this one measures
    /// its own agents and reports each change by raft index).
    pub fn probe_observer(&self) -> Option<ProbeObserver> {
        let s = &self.shared;
        if s.cfg.probe.controller {
            return None;
        }
        let board = s.board.clone()?;
        Some(ProbeObserver {
            board,
            metrics: s.metrics.clone(),
        })
    }

    /// The probe board (for tests and status displays).
    pub fn probe_board(&self) -> Option<Arc<ProbeBoard>> {
        self.shared.board.clone()
    }
}

impl AgentFactory for ConsulFactory {
    type Agent = ConsulAgent;

    fn create(&self, index: u64) -> ConsulAgent {
        let s = &self.shared;
        let probe_svc = s.board.as_ref().map(|b| b.service());
        let mut subs: Vec<Sub> = Vec::with_capacity(s.upstreams.len() + 1);
        let mut probe_taken = false;
        for (pattern, fixed) in &s.upstreams {
            let name = match fixed {
                Some(n) => n.clone(),
                None => Arc::from(pattern.expand(index)),
            };
            let probe = !probe_taken
                && fixed.is_some()
                && s.board.as_ref().map(|b| b.kind()) == Some(ProbeKind::Catalog)
                && probe_svc == Some(&*name);
            probe_taken |= probe;
            subs.push(Sub::new(
                name,
                Topic::ServiceHealth,
                ViewKind::Health,
                probe,
            ));
        }
        if let Some(b) = &s.board
            && b.kind() == ProbeKind::Intentions
        {
            subs.push(Sub::new(
                Arc::from(b.service()),
                Topic::ServiceIntentions,
                ViewKind::Intentions,
                true,
            ));
        }
        ConsulAgent {
            index,
            shared: s.clone(),
            subs: subs.into_boxed_slice(),
            registered: false,
            session_id: None,
            renew_due: None,
            flaps: 0,
        }
    }
}

/// Persistent state of one subscription.
struct Sub {
    name: Arc<str>,
    topic: Topic,
    view: View,
    /// The subscription the probe is timed on.
    probe: bool,
    /// Completed a snapshot at least once (later snapshots are re-syncs).
    ever_synced: bool,
    /// Last probe id (controller) or raft index (observer) this agent
    /// recorded an arrival for.
    probe_seen: u64,
    /// Observer: state of the probe target after the last snapshot or probe
    /// change (`Expect as u8`, 0 unknown), to spot changes a re-sync brings.
    probe_state: u8,
}

impl Sub {
    fn new(name: Arc<str>, topic: Topic, kind: ViewKind, probe: bool) -> Self {
        Sub {
            name,
            topic,
            view: View::new(kind),
            probe,
            ever_synced: false,
            probe_seen: 0,
            probe_state: 0,
        }
    }
}

/// One simulated Consul client agent.
pub struct ConsulAgent {
    index: u64,
    shared: Arc<Shared>,
    subs: Box<[Sub]>,
    registered: bool,
    session_id: Option<Box<str>>,
    renew_due: Option<Instant>,
    flaps: u32,
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

    fn node(&self) -> String {
        http::node_name(&self.shared.cfg.name_prefix, self.index)
    }
}

type StartFuture = Pin<Box<dyn Future<Output = Result<Streaming<Event>, Status>> + Send>>;

// `Live` is the steady state and the slots sit in one heap Vec: boxing the
// stream would add an allocation and save nothing.
#[allow(clippy::large_enum_variant)]
enum SlotState {
    Idle { at: Instant },
    Starting(StartFuture),
    Live(Streaming<Event>),
    Done,
}

/// Session-local state of one subscription.
struct Slot {
    state: SlotState,
    /// Counted toward `established` (snapshot done, or resumed).
    ready: bool,
    /// `sub_up` was called on the probe board for this slot.
    counted: bool,
    /// When the pending snapshot was asked for (Subscribe call or reset).
    started: Instant,
    /// Subscribed with an index; not yet known whether it resumed.
    resume_pending: bool,
    /// The snapshot in progress re-syncs a view that existed before.
    resync: bool,
    /// Set after the first ABORTED: later ones back off.
    backoff: Option<Backoff>,
}

/// The session's slots; dropping them takes live probe subscriptions off
/// the board (also when the session future is dropped mid-way).
struct Slots {
    v: Vec<Slot>,
    board: Option<Arc<ProbeBoard>>,
}

impl Drop for Slots {
    fn drop(&mut self) {
        if let Some(b) = &self.board {
            for s in &self.v {
                if s.counted {
                    b.sub_down();
                }
            }
        }
    }
}

enum HttpDone {
    Registered(Result<(), Refusal>),
    SessionCreated(Result<String, Refusal>),
    Renewed(Result<(), Refusal>, Duration),
    Flapped(Result<(), Refusal>),
}

type HttpFuture = Pin<Box<dyn Future<Output = HttpDone> + Send>>;

/// Session-local HTTP scheduling.
struct HttpSched {
    retry_at: Instant,
    backoff: Backoff,
    flap_due: Option<Instant>,
}

enum Wake {
    Cancelled,
    ConnClosed(&'static str),
    Started(usize, Result<Streaming<Event>, Status>),
    Event(usize, Instant, Result<Event, Status>),
    StreamEnd,
    Http(HttpDone),
    Timer,
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(3600)
}

fn start_call(
    grpc: &GrpcClient,
    req: agent_sim_proto::consul::subscribe::SubscribeRequest,
) -> StartFuture {
    let mut grpc = grpc.clone();
    Box::pin(async move {
        grpc.ready()
            .await
            .map_err(|e| Status::unavailable(format!("connection not ready: {e}")))?;
        let resp = grpc
            .server_streaming(
                tonic::Request::new(req),
                PathAndQuery::from_static(SUBSCRIBE_PATH),
                SmallCodec,
            )
            .await?;
        Ok(resp.into_inner())
    })
}

fn jitter(d: Duration) -> Duration {
    d.mul_f64(0.5 + fastrand::f64())
}

impl ConsulAgent {
    fn start_slot(&mut self, i: usize, slot: &mut Slot, grpc: &GrpcClient) {
        let sh = &self.shared;
        let sub = &mut self.subs[i];
        let index = sub.view.resume_index();
        if index == 0 {
            // A partial snapshot from a lost session cannot be resumed.
            sub.view.reset();
            slot.resync = sub.ever_synced;
        }
        slot.resume_pending = index > 0;
        slot.started = Instant::now();
        let req = subscribe_request(sub.topic, &sub.name, index, &sh.token, &sh.cfg.datacenter);
        slot.state = SlotState::Starting(start_call(grpc, req));
        sh.metrics.incr(sh.ids.subscriptions);
    }

    fn mark_ready(&self, i: usize, slot: &mut Slot) {
        slot.ready = true;
        if self.subs[i].probe
            && !slot.counted
            && let Some(b) = &self.shared.board
        {
            b.sub_up();
            slot.counted = true;
        }
    }

    fn uncount(&self, slot: &mut Slot) {
        if slot.counted {
            if let Some(b) = &self.shared.board {
                b.sub_down();
            }
            slot.counted = false;
        }
    }

    /// Handles a failed call or stream; `Some(end)` ends the session.
    fn on_status(
        &mut self,
        i: usize,
        slot: &mut Slot,
        status: &Status,
        grpc: &GrpcClient,
    ) -> Option<SessionEnd> {
        if status.code() != Code::Aborted {
            return Some(SessionEnd::lost_with(
                grpc_kind(status),
                format!("gRPC {:?}: {}", status.code(), status.message()),
            ));
        }
        let sh = self.shared.clone();
        sh.metrics.incr(sh.ids.aborts);
        self.uncount(slot);
        let sub = &mut self.subs[i];
        sub.view.reset();
        slot.resync = sub.ever_synced;
        slot.resume_pending = false;
        match &mut slot.backoff {
            None => {
                slot.backoff = Some(Backoff::new(ABORT_BACKOFF.0, ABORT_BACKOFF.1));
                self.start_slot(i, slot, grpc);
            }
            Some(b) => {
                slot.state = SlotState::Idle {
                    at: Instant::now() + b.next_delay(),
                };
            }
        }
        None
    }

    fn on_event(&mut self, i: usize, slot: &mut Slot, decoded: Instant, ev: &Event) {
        let sh = self.shared.clone();
        let ids = &sh.ids;
        sh.metrics.incr(ids.events_received);
        let is_nstf = matches!(ev.payload, Some(Payload::NewSnapshotToFollow(true)));
        if slot.resume_pending {
            slot.resume_pending = false;
            if !is_nstf {
                sh.metrics.incr(ids.resumes);
                self.mark_ready(i, slot);
            }
        }
        let sub = &mut self.subs[i];
        let board = if sub.probe { sh.board.as_deref() } else { None };
        let observing = board.is_some_and(|b| b.is_observer());
        // Controller: the armed probe id, and whether it came live.
        let mut hit = None;
        let mut hit_live = false;
        // Observer: outcome of a live probe change.
        let mut seen = None;
        let signal = sub.view.apply(ev, &mut |c| {
            if let Some(b) = board {
                if observing {
                    seen = b.observes(&c).or(seen);
                } else if let Some(id) = b.matches(&c) {
                    hit = Some(id);
                    hit_live = true;
                }
            }
        });
        // The event's raft index (one per event, batch included).
        let index = sub.view.index();
        match signal {
            Signal::EndOfSnapshot => {
                sh.metrics.incr(ids.snapshots);
                sh.metrics.record(
                    ids.subscribe_snapshot,
                    self.index as usize,
                    slot.started.elapsed(),
                );
                if let Some(b) = board {
                    if observing {
                        let now = b.state(&sub.view).map_or(0, |e| e as u8);
                        if slot.resync
                            && sub.probe_state != 0
                            && now != sub.probe_state
                            && let Some(kind) = Expect::from_u8(now)
                            && b.observe_resync(sub.probe_seen, index, kind, decoded)
                        {
                            sh.metrics.record(
                                ids.probe_overhead,
                                self.index as usize,
                                decoded.elapsed(),
                            );
                        }
                        sub.probe_state = now;
                        // The view is current up to here: a later re-sync
                        // credits only changes after this index.
                        sub.probe_seen = index;
                    } else if slot.resync {
                        hit = hit.or(b.matches_state(&sub.view));
                    }
                }
                slot.resync = false;
                slot.backoff = None;
                sub.ever_synced = true;
                self.mark_ready(i, slot);
            }
            Signal::NewSnapshotToFollow => {
                slot.resync = sub.ever_synced;
                slot.started = decoded;
            }
            Signal::Item | Signal::Ignored => {}
        }
        let sub = &mut self.subs[i];
        if let (Some(kind), Some(b)) = (seen, board) {
            sub.probe_state = kind as u8;
            if sub.probe_seen != index && b.observe(index, kind, decoded) {
                sub.probe_seen = index;
                sh.metrics
                    .record(ids.probe_overhead, self.index as usize, decoded.elapsed());
            }
        }
        if let (Some(id), Some(b)) = (hit, board)
            && sub.probe_seen != id
            && b.arrive(id, decoded, if hit_live { index } else { 0 })
        {
            sub.probe_seen = id;
            sh.metrics
                .record(ids.probe_overhead, self.index as usize, decoded.elapsed());
        }
    }

    /// When the next HTTP action is due (none when nothing is scheduled).
    fn http_due(&self, hs: &HttpSched) -> Option<Instant> {
        let cfg = &self.shared.cfg;
        if cfg.register && !self.registered {
            return Some(hs.retry_at);
        }
        if self.shared.ttl.is_some() && self.session_id.is_none() {
            return Some(hs.retry_at);
        }
        let renew = if self.session_id.is_some() {
            self.renew_due
        } else {
            None
        };
        match (renew, hs.flap_due) {
            (Some(a), Some(b)) => Some(a.min(b).max(hs.retry_at)),
            (a, b) => a.or(b).map(|t| t.max(hs.retry_at)),
        }
    }

    fn next_http(&mut self, hs: &mut HttpSched, now: Instant) -> Option<HttpFuture> {
        let due = self.http_due(hs)?;
        if due > now {
            return None;
        }
        let sh = self.shared.clone();
        let node = self.node();
        if sh.cfg.register && !self.registered {
            let upstreams: Vec<String> = self.subs.iter().map(|s| s.name.to_string()).collect();
            let address = http::node_address(self.index);
            let ops = http::registration_ops(&Registration {
                node: &node,
                address: &address,
                index: self.index,
                service: &sh.cfg.service_name,
                instances: sh.cfg.services_per_agent,
                sidecars: sh.cfg.sidecars,
                upstreams: &upstreams,
            });
            return Some(Box::pin(async move {
                HttpDone::Registered(sh.batcher().submit(TxnOps::new(ops)).await)
            }));
        }
        if let Some((_, ttl)) = &sh.ttl
            && self.session_id.is_none()
        {
            let body = Bytes::from(http::session_create_body(&node, ttl));
            return Some(Box::pin(async move {
                let r = match sh.http.put("/v1/session/create", body).await {
                    Ok(b) => serde_json::from_slice::<http::SessionCreated>(&b)
                        .map(|s| s.id)
                        .map_err(|_| Refusal::kind("http_decode")),
                    Err(e) => Err(e.into()),
                };
                HttpDone::SessionCreated(r)
            }));
        }
        if let (Some(id), Some(t)) = (&self.session_id, self.renew_due)
            && t <= now
        {
            let path = format!("/v1/session/renew/{id}");
            return Some(Box::pin(async move {
                let start = Instant::now();
                let r = sh
                    .http
                    .put(&path, Bytes::new())
                    .await
                    .map(|_| ())
                    .map_err(Refusal::from);
                HttpDone::Renewed(r, start.elapsed())
            }));
        }
        if let Some(t) = hs.flap_due
            && t <= now
        {
            let n = sh.cfg.services_per_agent.max(1);
            let k = self.flaps % n;
            let status = if (self.flaps / n).is_multiple_of(2) {
                "warning"
            } else {
                "passing"
            };
            let id = http::instance_id(&sh.cfg.service_name, self.index, k);
            let body = Bytes::from(http::check_status_body(
                &node,
                &http::node_address(self.index),
                &id,
                &sh.cfg.service_name,
                status,
            ));
            return Some(Box::pin(async move {
                let r = sh
                    .http
                    .put("/v1/catalog/register", body)
                    .await
                    .map(|_| ())
                    .map_err(Refusal::from);
                HttpDone::Flapped(r)
            }));
        }
        None
    }

    fn on_http(&mut self, cx: &SessionCx, hs: &mut HttpSched, done: HttpDone) {
        let sh = self.shared.clone();
        let now = Instant::now();
        // Counted, and kept as this agent's last cause (a registration the
        // server refuses keeps the agent from being connected).
        let failed = |r: Refusal, hs: &mut HttpSched| {
            cx.report(&Failure {
                kind: r.kind,
                detail: r.words,
            });
            hs.retry_at = now + hs.backoff.next_delay();
        };
        match done {
            HttpDone::Registered(Ok(())) => {
                self.registered = true;
                sh.metrics.incr(sh.ids.registrations);
                hs.backoff.reset();
                if let Some(iv) = sh.flap_interval {
                    hs.flap_due = Some(now + iv.mul_f64(fastrand::f64()));
                }
            }
            HttpDone::Registered(Err(k)) => failed(k, hs),
            HttpDone::SessionCreated(Ok(id)) => {
                sh.metrics.incr(sh.ids.sessions_created);
                self.session_id = Some(id.into_boxed_str());
                if let Some((ttl, _)) = sh.ttl {
                    self.renew_due = Some(now + ttl / 2);
                }
                hs.backoff.reset();
            }
            HttpDone::SessionCreated(Err(k)) => failed(k, hs),
            HttpDone::Renewed(r, took) => {
                let half = sh
                    .ttl
                    .as_ref()
                    .map(|(t, _)| *t / 2)
                    .unwrap_or(Duration::from_secs(15));
                match r {
                    Ok(()) => {
                        sh.metrics.incr(sh.ids.sessions_renewed);
                        sh.metrics
                            .record(sh.ids.session_renew, self.index as usize, took);
                        // Timed from the intended time, not from the reply.
                        let next = self.renew_due.map_or(now + half, |t| t + half);
                        self.renew_due = Some(if next <= now { now + half } else { next });
                        hs.backoff.reset();
                    }
                    Err(r) if r.kind == "http_404" => {
                        sh.metrics.incr(sh.ids.sessions_expired);
                        self.session_id = None;
                        self.renew_due = None;
                    }
                    Err(r) => {
                        sh.metrics.error_with(r.kind, r.words.as_deref());
                        self.renew_due = Some(now + jitter(Duration::from_secs(1)).min(half));
                    }
                }
            }
            HttpDone::Flapped(r) => {
                let iv = sh.flap_interval.unwrap_or(Duration::from_secs(60));
                match r {
                    Ok(()) => {
                        sh.metrics.incr(sh.ids.flaps);
                        self.flaps = self.flaps.wrapping_add(1);
                    }
                    Err(r) => sh.metrics.error_with(r.kind, r.words.as_deref()),
                }
                let next = hs.flap_due.map_or(now, |t| t) + jitter(iv);
                hs.flap_due = Some(if next <= now { now + jitter(iv) } else { next });
            }
        }
    }

    async fn session(&mut self, cx: &SessionCx) -> SessionEnd {
        let sh = self.shared.clone();
        let dialer = &sh.dialers[(self.index as usize) % sh.dialers.len()];
        let t = Instant::now();
        // Boxed: the connect state machine is freed once the connection is up.
        let connect = Box::pin(tokio::time::timeout(
            CONNECT_TIMEOUT,
            dialer.connect(cx.bind_addr),
        ));
        let conn = tokio::select! {
            r = connect => r,
            _ = cx.cancel.cancelled() => return SessionEnd::Shutdown,
        };
        let conn = match conn {
            Err(_) => return SessionEnd::lost("connect_timeout"),
            Ok(Err(e)) => return SessionEnd::lost_with(e.kind, e.detail),
            Ok(Ok(c)) => c,
        };
        sh.metrics
            .record(sh.ids.connect, self.index as usize, t.elapsed());
        let first_bytes = conn.first_bytes.clone();
        let (end, answered) = self.steady(cx, conn).await;
        match end {
            // Ended before the server answered any call: say what was on
            // the other end when the first bytes tell (HTTP port, a
            // connection cap that closes at once, a gRPC port).
            SessionEnd::Lost(f) if !answered => match conn::what_answered(&first_bytes) {
                Some((kind, words)) => SessionEnd::lost_with(
                    kind,
                    match f.detail {
                        Some(d) => format!("{words} ({}: {d})", f.kind),
                        None => format!("{words} ({})", f.kind),
                    },
                ),
                None => SessionEnd::Lost(f),
            },
            end => end,
        }
    }

    /// The session on an established connection; also whether the server
    /// answered any call (a stream event or a call's reply).
    async fn steady(&mut self, cx: &SessionCx, conn: RpcConn) -> (SessionEnd, bool) {
        let RpcConn {
            grpc, mut driver, ..
        } = conn;
        let mut answered = false;
        let now = Instant::now();
        let slots: Vec<Slot> = (0..self.subs.len())
            .map(|_| Slot {
                state: SlotState::Done,
                ready: false,
                counted: false,
                started: now,
                resume_pending: false,
                resync: false,
                backoff: None,
            })
            .collect();
        // Uncounts live probe subscriptions however the session ends.
        let mut slots = Slots {
            v: slots,
            board: self.shared.board.clone(),
        };
        let slots = &mut slots.v;
        for (i, slot) in slots.iter_mut().enumerate() {
            self.start_slot(i, slot, &grpc);
        }
        let mut hs = HttpSched {
            retry_at: now,
            backoff: Backoff::new(HTTP_BACKOFF.0, HTTP_BACKOFF.1),
            flap_due: None,
        };
        if self.registered
            && let Some(iv) = self.shared.flap_interval
        {
            hs.flap_due = Some(now + iv.mul_f64(fastrand::f64()));
        }
        let mut http_op: Option<HttpFuture> = None;
        let mut established = false;
        let mut sleep = pin!(tokio::time::sleep_until(far_future()));
        let mut cancel = pin!(cx.cancel.cancelled());
        let mut rotate = 0usize;
        let end = loop {
            let now = Instant::now();
            if http_op.is_none() {
                http_op = self.next_http(&mut hs, now);
            }
            let mut deadline = far_future();
            for slot in slots.iter() {
                if let SlotState::Idle { at } = slot.state {
                    deadline = deadline.min(at);
                }
                if slot.resume_pending && !slot.ready {
                    deadline = deadline.min(slot.started + RESUME_QUIET);
                }
            }
            if http_op.is_none()
                && let Some(t) = self.http_due(&hs)
            {
                deadline = deadline.min(t);
            }
            if sleep.deadline() != deadline {
                sleep.as_mut().reset(deadline);
            }
            rotate = rotate.wrapping_add(1);
            let wake = std::future::poll_fn(|tcx| {
                if cancel.as_mut().poll(tcx).is_ready() {
                    return Poll::Ready(Wake::Cancelled);
                }
                if let Poll::Ready(r) = driver.as_mut().poll(tcx) {
                    return Poll::Ready(Wake::ConnClosed(driver_kind(r)));
                }
                let n = slots.len();
                for j in 0..n {
                    let i = (j + rotate) % n;
                    match &mut slots[i].state {
                        SlotState::Starting(f) => {
                            if let Poll::Ready(r) = f.as_mut().poll(tcx) {
                                return Poll::Ready(Wake::Started(i, r));
                            }
                        }
                        SlotState::Live(s) => match Pin::new(s).poll_next(tcx) {
                            Poll::Ready(Some(r)) => {
                                return Poll::Ready(Wake::Event(i, Instant::now(), r));
                            }
                            Poll::Ready(None) => return Poll::Ready(Wake::StreamEnd),
                            Poll::Pending => {}
                        },
                        SlotState::Idle { .. } | SlotState::Done => {}
                    }
                }
                if let Some(op) = http_op.as_mut()
                    && let Poll::Ready(done) = op.as_mut().poll(tcx)
                {
                    return Poll::Ready(Wake::Http(done));
                }
                if sleep.as_mut().poll(tcx).is_ready() {
                    return Poll::Ready(Wake::Timer);
                }
                Poll::Pending
            })
            .await;
            match wake {
                Wake::Cancelled => break SessionEnd::Shutdown,
                Wake::ConnClosed(kind) => break SessionEnd::lost(kind),
                Wake::Started(i, Ok(stream)) => {
                    answered = true;
                    slots[i].state = SlotState::Live(stream);
                }
                Wake::Started(i, Err(status)) => {
                    answered |= server_said(&status);
                    let slot = &mut slots[i];
                    slot.state = SlotState::Done;
                    if let Some(end) = self.on_status(i, slot, &status, &grpc) {
                        break end;
                    }
                }
                Wake::Event(i, decoded, Ok(ev)) => {
                    answered = true;
                    self.on_event(i, &mut slots[i], decoded, &ev);
                }
                Wake::Event(i, _, Err(status)) => {
                    answered |= server_said(&status);
                    let slot = &mut slots[i];
                    slot.state = SlotState::Done;
                    if let Some(end) = self.on_status(i, slot, &status, &grpc) {
                        break end;
                    }
                }
                Wake::StreamEnd => break SessionEnd::lost("stream_end"),
                Wake::Http(done) => {
                    http_op = None;
                    self.on_http(cx, &mut hs, done);
                }
                Wake::Timer => {
                    let now = Instant::now();
                    for (i, slot) in slots.iter_mut().enumerate() {
                        if let SlotState::Idle { at } = slot.state
                            && at <= now
                        {
                            self.start_slot(i, slot, &grpc);
                        }
                        if slot.resume_pending && !slot.ready && slot.started + RESUME_QUIET <= now
                        {
                            // Silence after a resume request: the server kept our index.
                            slot.resume_pending = false;
                            self.shared.metrics.incr(self.shared.ids.resumes);
                            self.mark_ready(i, slot);
                        }
                    }
                }
            }
            // Connected = the server has answered: every subscription has
            // its snapshot (or resumed) and the registration is in place.
            // The dial slot is freed with the snapshots, so a registration
            // that keeps failing does not hold up other agents' handshakes.
            if !established && slots.iter().all(|s| s.ready) {
                if self.registered || !self.shared.cfg.register {
                    established = true;
                    cx.established();
                } else {
                    cx.release_dial_slot();
                }
            }
        };
        (end, answered)
    }

    async fn finish_inner(&mut self) {
        let sh = self.shared.clone();
        let node = self.node();
        let dereg = async {
            if self.registered && !sh.cfg.keep_registrations {
                let ops = TxnOps::new(vec![http::deregistration_op(&node)]);
                match sh.batcher().submit(ops).await {
                    Ok(()) => {
                        sh.metrics.incr(sh.ids.deregistrations);
                        true
                    }
                    Err(r) => {
                        sh.metrics.error_with(r.kind, r.words.as_deref());
                        false
                    }
                }
            } else {
                false
            }
        };
        let destroy = async {
            if let Some(id) = &self.session_id {
                let path = format!("/v1/session/destroy/{id}");
                if let Err(e) = sh.http.put(&path, Bytes::new()).await {
                    sh.metrics.error_with(e.kind, e.words().as_deref());
                }
            }
        };
        let (deregistered, ()) = futures_util::future::join(dereg, destroy).await;
        if deregistered {
            self.registered = false;
        }
        self.session_id = None;
    }
}

/// Whether a status came from the server (an answer) rather than from a
/// broken transport.
fn server_said(status: &Status) -> bool {
    !matches!(status.code(), Code::Unavailable | Code::Cancelled)
        && !status.message().contains("transport")
}

/// Error kind of a failed call or stream: the cause Consul names in its
/// message (`ACL not found` comes as code Unknown), else by code;
/// `Unimplemented: unknown service subscribe...` means the wrong port.
fn grpc_kind(status: &Status) -> &'static str {
    if let Some(k) = http::cause_kind(status.message()) {
        return k;
    }
    if status.code() == Code::Unimplemented && status.message().contains("unknown service") {
        return "wrong_port_grpc";
    }
    conn::status_kind(status.code())
}

fn driver_kind(r: Result<(), hyper::Error>) -> &'static str {
    match r {
        Ok(()) => "conn_closed",
        Err(e) if e.is_timeout() => "keepalive_timeout",
        Err(_) => "conn_error",
    }
}

impl Agent for ConsulAgent {
    fn run_session<'a>(&'a mut self, cx: &'a SessionCx) -> BoxFuture<'a, SessionEnd> {
        Box::pin(self.session(cx))
    }

    fn finish<'a>(&'a mut self, _cx: &'a SessionCx) -> BoxFuture<'a, ()> {
        Box::pin(self.finish_inner())
    }
}
