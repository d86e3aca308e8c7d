//! Catalog upkeep of an agent: registration, anti-entropy, the TTL session
//! and its renewals, check flaps and, on a client agent's wire, its
//! coordinate updates and its router's pings; and the cleanup when the run
//! ends. One call at a time: what is due next is an [`Op`], made a call by
//! the run's wire (`api`: the HTTP API; `rpc`: the agent's own RPCs), and
//! its result ([`Done`]) handled the same for both.

mod api;
mod rpc;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use agent_sim_fleet::{Backoff, Failure, SessionCx};
use tokio::time::Instant;

use super::link::{CallLine, Link};
use super::{ConsulAgent, jitter};
use crate::config;
use crate::http::{self, Refusal, Registration};
use crate::modes::AgentWire;
use crate::rpc::coordinate;
use crate::rpc::mux::CallError;

/// What the upkeep does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    /// Register the node and its services (the first sync of a client agent).
    Register,
    /// Anti-entropy: compare the catalog's node with what the agent holds.
    Sync,
    /// Create the TTL session.
    CreateSession,
    /// Renew it.
    Renew,
    /// Flip an instance's check.
    Flap,
    /// Send the agent's network coordinate (client wire).
    Coordinate,
    /// Ask the server in front of the router's list whether it answers
    /// (client wire, at a rebalance that kept the agent's server).
    Ping,
    /// A rebalance put another server in front: the agent moves there
    /// (on the client wire once that server answered a ping).
    Move,
    /// Sign the sidecars' leaf certificate (client wire).
    Sign,
}

/// The RPC connection dialed again (client wire), for the session's loop
/// to hold.
pub(super) type Redialed = Result<Box<Link>, CallError>;

/// How a call of the upkeep ended.
pub(super) enum Done {
    Registered(Result<(), Refusal>),
    /// Anti-entropy: whether the catalog holds the node as registered (or,
    /// without registration, whether the server names a leader).
    Synced(Result<bool, Refusal>),
    SessionCreated(Result<String, Refusal>),
    /// A renewal; `Ok(false)`: the session is gone (expired, or the server
    /// lost it).
    Renewed(Result<bool, Refusal>, Duration),
    Flapped(Result<(), Refusal>),
    /// A coordinate update and its round trip.
    Coordinated(Result<(), Refusal>, Duration),
    Pinged(Result<(), Refusal>),
    /// The RPC connection, dialed again after it closed under a session
    /// whose streams went on.
    Redialed(Redialed),
    /// The agent moves to the server its rebalanced router put in front,
    /// with the connection the move checked it on (client wire).
    Moved(Option<Box<Link>>),
    /// The server a rebalance put in front did not answer its ping: it
    /// goes to the end of the list and the next one is checked.
    Skipped(usize),
    /// A leaf certificate signed, or why not.
    Signed(Result<super::connect::Signed, Refusal>),
}

impl Done {
    /// The server's refusal (or what broke) of an RPC the agent made; not
    /// an answer that did not decode (Consul's client gives that back to
    /// its caller without blaming the server).
    pub(super) fn failed_call(&self) -> Option<&Refusal> {
        let r = match self {
            Done::Registered(Err(r))
            | Done::Synced(Err(r))
            | Done::SessionCreated(Err(r))
            | Done::Renewed(Err(r), _)
            | Done::Flapped(Err(r))
            | Done::Coordinated(Err(r), _)
            | Done::Pinged(Err(r)) => r,
            _ => return None,
        };
        (r.kind != "decode_answer").then_some(r)
    }
}

/// A call of the upkeep in flight.
pub(super) type UpkeepCall = Pin<Box<dyn Future<Output = Done> + Send>>;

/// Session-local scheduling of the upkeep.
pub(super) struct Sched {
    pub(super) retry_at: Instant,
    pub(super) backoff: Backoff,
    pub(super) flap_due: Option<Instant>,
    /// Next anti-entropy sync.
    pub(super) ae_due: Option<Instant>,
    /// A full sync gossip triggered is due and has not run: another
    /// trigger adds nothing (Consul's `SyncFull` is a channel of one).
    pub(super) server_up_pending: bool,
    /// Next coordinate update (client wire).
    pub(super) coord_due: Option<Instant>,
    /// Next rebalance of the router (with its ping on the client wire).
    pub(super) ping_due: Option<Instant>,
    /// A sync was answered in this session: the server is there and has a
    /// leader (resubscribed streams that stay silent are then resumed).
    pub(super) ae_answered: bool,
    /// The session follows a move: the router's ping answering confirms
    /// the server as a sync would.
    pub(super) confirm_by_ping: bool,
    /// A rebalance goes on after a server it checked did not answer: the
    /// next server in front is checked, without a new shuffle.
    pub(super) checking: bool,
}

pub(super) use crate::config::AE_SERVER_UP;
pub(super) use rpc::node_id;
/// The server's method behind `/v1/txn` (the end's removal of the node).
const TXN_APPLY: &str = "Txn.Apply";

/// Consul's `retryFailInterval`: a failed sync is retried after this plus a
/// random part of it (scaled).
pub(super) const AE_RETRY: Duration = Duration::from_secs(15);

/// A call the server refused: counted, and kept as the agent's last cause
/// (a registration the server refuses keeps the agent from being
/// connected); the next call after the backoff.
fn refused(cx: &SessionCx, hs: &mut Sched, r: Refusal, now: Instant) {
    cx.report(&Failure {
        kind: r.kind,
        detail: r.words,
        said_by: None,
    });
    hs.retry_at = now + hs.backoff.next_delay();
}

/// A random part of `d` scaled with the cluster size (Consul's stagger).
pub(super) fn stagger(d: Duration, cluster: u64) -> Duration {
    (d * config::ae_scale(cluster)).mul_f64(fastrand::f64())
}

impl ConsulAgent {
    /// When the next call is due (none when nothing is scheduled).
    pub(super) fn upkeep_due_at(&self, hs: &Sched) -> Option<Instant> {
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
        [
            renew,
            hs.flap_due,
            hs.ae_due,
            hs.coord_due,
            hs.ping_due,
            self.leaf_due(),
        ]
        .into_iter()
        .flatten()
        .min()
        .map(|t| t.max(hs.retry_at))
    }

    /// The first sync of a session: after a reconnect, within Consul's
    /// staggered `serverUpInterval` (the server may have lost our state, and
    /// silent resubscribed streams wait for a server answer); else one
    /// interval after registering.
    pub(super) fn first_sync(&self, now: Instant, reconnect: bool) -> Option<Instant> {
        let sh = &self.shared;
        let cluster = sh.cfg.cluster_size;
        if reconnect {
            Some(now + stagger(AE_SERVER_UP, cluster))
        } else if sh.cfg.register {
            self.next_sync(now)
        } else {
            None
        }
    }

    /// When the periodic sync after one at `now` is due (registered agents
    /// with anti-entropy on only).
    fn next_sync(&self, now: Instant) -> Option<Instant> {
        let sh = &self.shared;
        let iv = sh.cfg.anti_entropy.filter(|_| sh.cfg.register)?;
        Some(now + iv + stagger(iv, sh.cfg.cluster_size))
    }

    /// The router's schedule in a new session, and the client wire's
    /// coordinates: the first coordinate one interval on; the first
    /// rebalance after Consul's minimum delay (without jitter, as its
    /// timer starts), on the client wire or with several servers.
    pub(super) fn client_schedule(&self, hs: &mut Sched, now: Instant) {
        let cfg = &self.shared.cfg;
        if cfg.agent == AgentWire::Client {
            hs.coord_due = Some(now + coordinate::update_interval(cfg.cluster_size));
        }
        if cfg.agent == AgentWire::Client || self.shared.dialers.len() > 1 {
            hs.ping_due = Some(now + cfg.rebalance_min);
        }
    }

    /// The registration of this agent as the catalog should hold it.
    pub(super) fn with_registration<T>(&self, f: impl FnOnce(&Registration<'_>) -> T) -> T {
        let sh = &self.shared;
        let upstreams: Vec<String> = self
            .upstream_names()
            .into_iter()
            .map(str::to_owned)
            .collect();
        let node = self.node();
        let address = self.node_address();
        let own = sh.own(self.index);
        f(&Registration {
            node: &node,
            address: &address,
            index: self.index,
            service: &own.service,
            instances: own.instances,
            sidecars: sh.cfg.sidecars,
            upstreams: &upstreams,
            prefix: &sh.cfg.conn.name_prefix,
        })
    }

    /// The next check flap's instance and status: the agent's instances in
    /// turn, each to `warning` and back to `passing`.
    pub(super) fn next_flap(&self) -> (String, &'static str) {
        let own = self.shared.own(self.index);
        let n = own.instances.max(1);
        let k = self.flaps % n;
        let status = if (self.flaps / n).is_multiple_of(2) {
            "warning"
        } else {
            "passing"
        };
        (http::instance_id(&own.service, self.index, k), status)
    }

    /// The operation due at `now`, if any, in this order: registration,
    /// anti-entropy sync, TTL session create, renew, check flap,
    /// coordinate, ping.
    fn next_op(&mut self, hs: &mut Sched, now: Instant) -> Option<Op> {
        let due = self.upkeep_due_at(hs)?;
        if due > now {
            return None;
        }
        let sh = &self.shared;
        let due_now = |t: Option<Instant>| t.is_some_and(|t| t <= now);
        if sh.cfg.register && !self.registered {
            self.maybe_registered = true;
            return Some(Op::Register);
        }
        if due_now(hs.ae_due) {
            hs.ae_due = None;
            hs.server_up_pending = false;
            return Some(Op::Sync);
        }
        if sh.ttl.is_some() && self.session_id.is_none() {
            return Some(Op::CreateSession);
        }
        if self.session_id.is_some() && due_now(self.renew_due) {
            return Some(Op::Renew);
        }
        if self.take_leaf_due(now) {
            return Some(Op::Sign);
        }
        if due_now(hs.flap_due) {
            return Some(Op::Flap);
        }
        if due_now(hs.coord_due) {
            hs.coord_due = None;
            return Some(Op::Coordinate);
        }
        if due_now(hs.ping_due) {
            hs.ping_due = None;
            if hs.confirm_by_ping {
                // The server just moved to is pinged as it is.
                return Some(Op::Ping);
            }
            // Consul's router: a new order, then a ping of the server in
            // front (or a move there when it is another one, once it
            // answered its own ping).
            if !std::mem::take(&mut hs.checking) {
                self.router.rebalance(&mut fastrand::Rng::new());
            }
            if self.router.current() != self.server() {
                return Some(Op::Move);
            }
            return Some(Op::Ping);
        }
        None
    }

    /// The call due at `now`, if any, on the run's wire (`line`: the
    /// agent's RPC call stream, on the client wire; without one, a call
    /// that is due dials the RPC connection first, from `bind`).
    pub(super) fn next_call(
        &mut self,
        hs: &mut Sched,
        line: Option<&CallLine>,
        bind: Option<std::net::IpAddr>,
        now: Instant,
    ) -> Option<UpkeepCall> {
        match (self.shared.cfg.agent, line) {
            (AgentWire::Api, _) => match self.next_op(hs, now)? {
                Op::Move | Op::Sign => Some(Box::pin(async { Done::Moved(None) })),
                op => Some(self.api_call(op)),
            },
            (AgentWire::Client, Some(line)) => match self.next_op(hs, now)? {
                Op::Move => Some(self.check_move(bind)),
                op => Some(self.rpc_call(op, line.clone())),
            },
            (AgentWire::Client, None) => {
                if self.upkeep_due_at(hs)? > now {
                    return None;
                }
                let dial = self.redial(bind);
                Some(Box::pin(async move { Done::Redialed(dial.await) }))
            }
        }
    }

    /// A call finished: one handler per call.
    pub(super) fn on_done(&mut self, cx: &SessionCx, hs: &mut Sched, done: Done) {
        let now = Instant::now();
        match done {
            Done::Registered(Ok(())) => self.on_registered(hs, now),
            Done::Registered(Err(r)) => refused(cx, hs, r, now),
            Done::Synced(r) => self.on_synced(hs, r, now),
            Done::SessionCreated(Err(r)) if r.kind == "missing_node_registration" => {
                // The server lost the node: sync at once (a real agent's
                // anti-entropy registers it again), then create.
                refused(cx, hs, r, now);
                hs.ae_due = Some(now);
            }
            Done::SessionCreated(Ok(id)) => {
                let sh = &self.shared;
                sh.metrics.incr(sh.ids.sessions_created);
                self.session_id = Some(id.into_boxed_str());
                if let Some((ttl, _)) = sh.ttl {
                    self.renew_due = Some(now + ttl / 2);
                }
                hs.backoff.reset();
            }
            Done::SessionCreated(Err(r)) => refused(cx, hs, r, now),
            Done::Renewed(r, took) => self.on_renewed(hs, r, took, now),
            Done::Flapped(r) => self.on_flapped(hs, r, now),
            Done::Coordinated(r, rtt) => self.on_coordinated(hs, r, rtt, now),
            Done::Pinged(r) => self.on_pinged(hs, r, now),
            // The session's loop takes a new connection (and ends the
            // session for a move); a failed dial waits the backoff.
            Done::Redialed(Ok(_)) | Done::Moved(_) => hs.backoff.reset(),
            Done::Skipped(server) => self.on_skipped(hs, server, now),
            Done::Signed(r) => self.on_signed(r, now),
            Done::Redialed(Err(e)) => refused(cx, hs, e.into(), now),
        }
    }

    /// A rebalance found the server in front not answering (as Consul's
    /// router logs it, not an error): it goes to the end of the list, and
    /// the next in front is checked at once (the agent's own server last).
    fn on_skipped(&mut self, hs: &mut Sched, server: usize, now: Instant) {
        let sh = &self.shared;
        sh.metrics.incr(sh.ids.skips);
        self.router.failed(server);
        hs.checking = true;
        hs.ping_due = Some(now);
    }

    fn on_registered(&mut self, hs: &mut Sched, now: Instant) {
        let sh = self.shared.clone();
        self.registered = true;
        if std::mem::take(&mut self.repairing) {
            sh.metrics.incr(sh.ids.reregistrations);
        } else {
            sh.metrics.incr(sh.ids.registrations);
        }
        hs.backoff.reset();
        if hs.ae_due.is_none() {
            hs.ae_due = self.next_sync(now);
        }
        if let Some(iv) = sh.flap_interval {
            hs.flap_due = Some(now + iv.mul_f64(fastrand::f64()));
        }
    }

    fn on_synced(&mut self, hs: &mut Sched, r: Result<bool, Refusal>, now: Instant) {
        let sh = self.shared.clone();
        let in_sync = match r {
            Ok(in_sync) => in_sync,
            Err(r) => {
                sh.metrics.error_with(r.kind, r.words.as_deref());
                hs.ae_due = Some(now + AE_RETRY + stagger(AE_RETRY, sh.cfg.cluster_size));
                return;
            }
        };
        sh.metrics.incr(sh.ids.anti_entropy_syncs);
        if sh.cfg.register {
            hs.ae_answered = true;
            if !in_sync {
                // Lost or changed on the server: register again now.
                self.registered = false;
                self.repairing = true;
                hs.retry_at = now;
            }
            hs.ae_due = self.next_sync(now);
        } else if in_sync {
            hs.ae_answered = true;
        } else {
            // No leader yet: ask again shortly.
            hs.ae_due = Some(now + jitter(Duration::from_secs(1)));
        }
    }

    fn on_renewed(
        &mut self,
        hs: &mut Sched,
        r: Result<bool, Refusal>,
        took: Duration,
        now: Instant,
    ) {
        let sh = self.shared.clone();
        let half = sh
            .ttl
            .as_ref()
            .map(|(t, _)| *t / 2)
            .unwrap_or(Duration::from_secs(15));
        match r {
            Ok(true) => {
                sh.metrics.incr(sh.ids.sessions_renewed);
                sh.metrics
                    .record(sh.ids.session_renew, self.index as usize, took);
                // Timed from the intended time, not from the reply.
                let next = self.renew_due.map_or(now + half, |t| t + half);
                self.renew_due = Some(if next <= now { now + half } else { next });
                hs.backoff.reset();
            }
            Ok(false) => {
                // Expired, or the server lost its state: check the
                // registration at once before a new session.
                let words = self
                    .session_id
                    .as_ref()
                    .map(|id| format!("Session id '{id}' not found"));
                sh.metrics.incr(sh.ids.sessions_expired);
                sh.metrics.warn("session_expired", words.as_deref());
                self.session_id = None;
                self.renew_due = None;
                if sh.cfg.register {
                    hs.ae_due = Some(now);
                }
            }
            Err(r) => {
                sh.metrics.error_with(r.kind, r.words.as_deref());
                self.renew_due = Some(now + jitter(Duration::from_secs(1)).min(half));
            }
        }
    }

    fn on_flapped(&mut self, hs: &mut Sched, r: Result<(), Refusal>, now: Instant) {
        let sh = &self.shared;
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

    /// A coordinate update: its round trip moves the estimate (until the
    /// agents gossip, the server is the one peer measured), the next one an
    /// interval on.
    fn on_coordinated(
        &mut self,
        hs: &mut Sched,
        r: Result<(), Refusal>,
        rtt: Duration,
        now: Instant,
    ) {
        let sh = &self.shared;
        match r {
            Ok(()) => {
                sh.metrics.incr(sh.ids.coordinate_updates);
                match self.member() {
                    Some((pool, slot)) => pool.observe(slot, rtt),
                    None => self
                        .extra
                        .get_or_insert_default()
                        .vivaldi
                        .get_or_insert_default()
                        .observe(&coordinate::Coord::default(), rtt),
                }
            }
            Err(r) => sh.metrics.error_with(r.kind, r.words.as_deref()),
        }
        hs.coord_due = Some(now + coordinate::update_interval(sh.cfg.cluster_size));
    }

    /// The router's ping (or, on the API's wire, the rebalance that kept
    /// the agent's server): the next rebalance after Consul's delay. A
    /// server that does not answer moves to the end of the list.
    fn on_pinged(&mut self, hs: &mut Sched, r: Result<(), Refusal>, now: Instant) {
        let sh = self.shared.clone();
        if r.is_ok() && std::mem::take(&mut hs.confirm_by_ping) {
            hs.ae_answered = true;
        }
        match r {
            Ok(()) if sh.cfg.agent == AgentWire::Client => sh.metrics.incr(sh.ids.pings),
            Ok(()) => {}
            Err(r) => {
                sh.metrics.error_with(r.kind, r.words.as_deref());
                // The client wire's loop moves the server the ping went to
                // after this handler, as after any failed call (it may not be
                // the session's: a failed call moves the calls, not the
                // streams).
                if sh.cfg.agent == AgentWire::Api {
                    self.router.failed(self.server());
                }
            }
        }
        let servers = sh.dialers.len();
        let nodes = sh.cfg.cluster_size.max(1);
        hs.ping_due = Some(
            now + agent_sim_fleet::servers::rebalance_delay(
                sh.cfg.rebalance_min,
                servers,
                nodes,
                &mut fastrand::Rng::new(),
            ),
        );
    }

    /// The end of the run (or a ramp-down): the node and the session go.
    /// Until the agents gossip, the node's removal (what the leader does
    /// when a client agent leaves) is written through the HTTP API on
    /// either wire, batched over the fleet.
    pub(super) async fn finish_inner(&mut self) {
        let sh = self.shared.clone();
        let node = self.node();
        // A gossip member leaves, and the leader removes its node, as for
        // a real agent's `consul leave`.
        let left = match self.member() {
            Some((pool, slot)) if !sh.cfg.keep_registrations && pool.is_member(slot) => {
                pool.leave(slot);
                true
            }
            _ => false,
        };
        let dereg = async {
            if self.maybe_registered && !sh.cfg.keep_registrations && !left {
                let ops = crate::txn::TxnOps::new(vec![http::deregistration_op(&node)]);
                match sh.batcher().submit(ops).await {
                    Ok(()) => {
                        sh.metrics.incr(sh.ids.deregistrations);
                        true
                    }
                    Err(r) => {
                        // A refused removal is a denied call as much as
                        // the registration it follows (`/v1/txn`).
                        super::link::count_denial(&sh.metrics, r.kind, TXN_APPLY);
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
                if let Err(e) = sh.http.put(&path, bytes::Bytes::new()).await {
                    super::link::count_denial(&sh.metrics, e.kind, crate::rpc::session::APPLY);
                    sh.metrics.error_with(e.kind, e.words().as_deref());
                }
            }
        };
        let (deregistered, ()) = futures_util::future::join(dereg, destroy).await;
        if deregistered {
            self.registered = false;
            self.maybe_registered = false;
        }
        self.session_id = None;
    }
}
