//! A pool of simulated gossip members in one process: they share one
//! [`view::View`], a few sockets (each endpoint an address both UDP and TCP
//! listen on, shared by the members that advertise it: a probe names the
//! member it is for), and one ticker that sends the servers what N real
//! members would: probes at each member's share of the probe rate,
//! broadcasts until each server had them memberlist's retransmit limit of
//! times, push-pulls at the scaled interval, and leaves in serf's order.
//!
//! Parts: `view` (the shared state), `net` (packets and streams in and
//! out), `answer` (a join's answer, read as it arrives), `reannounce` (a
//! joined member's re-announcement of what its join taught it), `tick` (the
//! model's timers), `probe` (one probe round: send, ack, timeout,
//! suspicion), `user` (serf's events, queries and relays taken in) and
//! `outbox` (the queries' answers, paced), `close` (the pool's leave, step
//! by step), `error` (why a start, a join or a push-pull failed). Below
//! the view: `news` (what the agents hear of the servers), `suspicion`
//! (memberlist's timing of a suspect), `seen` (serf's event and query
//! buffers).

pub mod view;

mod answer;
mod close;
mod error;
mod memo;
mod net;
mod news;
mod outbox;
mod probe;
mod reannounce;
mod seen;
pub mod suspicion;
mod tick;
mod user;

pub use error::{ExchangeError, JoinError, PoolError};
pub use news::{News, ServerNews};

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_sim_metrics::{CounterId, LatencyId, Metrics};
use tokio::net::UdpSocket;
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::coordinate::Coord;
use crate::names;
use crate::wire::Security;
use view::{Phase, View};

/// memberlist's LAN timings (Consul's defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// Each member probes one member this often.
    pub probe_interval: Duration,
    /// An ack later than this is a failed probe.
    pub probe_timeout: Duration,
    /// Members with broadcasts gossip this often...
    pub gossip_interval: Duration,
    /// ...to this many members.
    pub gossip_nodes: u32,
    /// Each member's state exchange, before scaling with the pool's size.
    pub push_pull_interval: Duration,
    /// Sends of a broadcast: this times log10 of the pool's size.
    pub retransmit_mult: u32,
    /// A suspected server has at least this times log10 of the pool's size
    /// probe intervals to refute it (at most 6 times that).
    pub suspicion_mult: u32,
    /// A stream's deadline (a push-pull's whole exchange).
    pub tcp_timeout: Duration,
    /// How long a closing pool waits for the joins in flight to end (each
    /// is one push-pull, so `tcp_timeout` at most): a join the server took
    /// is a member that must leave.
    pub join_drain: Duration,
    /// The longest a gossiped leave waits for every server to take its
    /// intent (gossip it back) before a batch of push-pulls takes it on
    /// (serf's `BroadcastTimeout`, after which a real agent gives its
    /// graceful leave up).
    pub broadcast_timeout: Duration,
    /// How long a closing pool lets the leaves already gossiped go out
    /// (until each was sent once).
    pub leave_wait: Duration,
    /// How long a closing pool then waits for a batch of leaves under way
    /// (its push-pulls) to end before it sends its own.
    pub batch_wait: Duration,
    /// Between a leave batch's intents and its leaves, at most: until each
    /// server that took the intents' push-pull shows them taken (its serf
    /// status times), asked every half second. serf merges a push-pull
    /// after answering it and marks a member left only if its intent came
    /// first; a server writing raft to disk, with thousands leaving, takes
    /// seconds.
    pub intent_lead: Duration,
}

impl Timings {
    /// The longest a pool's [`Pool::close`] takes with `servers` servers
    /// that never answer: each wait at its bound, and the closing batch's
    /// two push-pulls to each server at `tcp_timeout`.
    pub fn close_bound(&self, servers: u32) -> Duration {
        self.join_drain
            + self.leave_wait
            + self.batch_wait
            + self.tcp_timeout * 2 * servers
            + self.intent_lead
    }
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            probe_interval: Duration::from_secs(1),
            probe_timeout: Duration::from_millis(500),
            gossip_interval: Duration::from_millis(200),
            gossip_nodes: 3,
            push_pull_interval: Duration::from_secs(30),
            retransmit_mult: 4,
            suspicion_mult: 4,
            tcp_timeout: Duration::from_secs(10),
            join_drain: Duration::from_secs(10),
            broadcast_timeout: Duration::from_secs(5),
            leave_wait: Duration::from_secs(5),
            batch_wait: Duration::from_secs(30),
            intent_lead: Duration::from_secs(10),
        }
    }
}

/// memberlist's push-pull interval for a pool of `n` members (doubling
/// steps past 32 members).
pub fn push_pull_scale(interval: Duration, n: usize) -> Duration {
    if n <= 32 {
        return interval;
    }
    let mult = ((n as f64).log2() - 32f64.log2()).ceil() + 1.0;
    interval.mul_f64(mult)
}

/// What a pool is given.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Addresses to listen on (UDP and TCP, the same port); port 0 takes
    /// one port for the first and the same on the others.
    pub bind: Vec<SocketAddr>,
    /// The servers' serf LAN addresses (`--gossip-join`).
    pub join: Vec<SocketAddr>,
    /// Label and keyring.
    pub security: Security,
    /// The tags every member carries (`id` is added per member).
    pub tags: Vec<(String, String)>,
    /// memberlist's timings.
    pub timings: Timings,
}

/// Counter ids the pool adds to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ids {
    joins: CounterId,
    leaves: CounterId,
    acks_sent: CounterId,
    probes: CounterId,
    probe_timeouts: CounterId,
    push_pulls: CounterId,
    join_answer_bytes: CounterId,
    packets_tx: CounterId,
    packets_rx: CounterId,
    bytes_tx: CounterId,
    bytes_rx: CounterId,
    late_ticks: CounterId,
    reannounced: CounterId,
    user_events: CounterId,
    queries_answered: CounterId,
    answers_dropped: CounterId,
    servers_suspected: CounterId,
    servers_failed: CounterId,
    servers_returned: CounterId,
    ack_delay: LatencyId,
}

/// What every task of a pool shares.
pub(crate) struct Inner {
    cfg: PoolConfig,
    view: Mutex<View>,
    udp: Vec<Arc<UdpSocket>>,
    seq: AtomicU32,
    /// Probes and relayed pings waiting for their ack.
    waiting: Mutex<HashMap<u32, probe::Waiting>>,
    /// The queries' answers owed.
    outbox: Mutex<outbox::Outbox>,
    metrics: Metrics,
    ids: Ids,
    joins: Semaphore,
    streams: Semaphore,
    stop: CancellationToken,
    warned_late: AtomicBool,
    /// Members whose join the servers took (a failed join after some:
    /// the servers are overloaded, not unreachable).
    joined: AtomicU64,
    /// Cancelled when the pool starts closing (or stops): no join starts
    /// after.
    closing: CancellationToken,
    /// Held by the one batch of quiet leaves under way.
    batch: Arc<tokio::sync::Mutex<()>>,
    /// Notified after each of the ticker's gossip rounds.
    gossiped: Notify,
    /// The joined members' re-announcements under way.
    reannouncing: Mutex<Vec<reannounce::Reannounce>>,
    /// The compressed join answers decoded lately, and what each taught.
    join_memo: memo::Memos<answer::Learnt>,
}

/// A pool of simulated members; cheap to clone.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("join", &self.inner.cfg.join)
            .finish()
    }
}

/// Joins the pool has in flight at once (each reads the server's whole
/// member list, through a 16 KiB window: the bound is for the server's 128
/// concurrent push-pulls).
pub const JOINS_AT_ONCE: usize = 32;
/// Leaves gossiped at once; more go by a batch of push-pulls.
pub const GOSSIPED_LEAVES: usize = 256;
/// Streams served at once (memberlist's own bound).
const STREAMS_AT_ONCE: usize = 128;

impl Pool {
    /// Binds the endpoints and starts the pool's tasks. `metrics` must
    /// declare [`crate::metrics_spec`].
    pub async fn start(cfg: PoolConfig, metrics: Metrics) -> Result<Pool, PoolError> {
        if cfg.bind.is_empty() {
            return Err(PoolError::NoBind);
        }
        if cfg.join.is_empty() {
            return Err(PoolError::NoJoin);
        }
        let (udp, tcp, endpoints) = net::bind(&cfg.bind).await?;
        let ids = Ids {
            joins: metrics.counter(names::JOINS),
            leaves: metrics.counter(names::LEAVES),
            acks_sent: metrics.counter(names::ACKS_SENT),
            probes: metrics.counter(names::PROBES),
            probe_timeouts: metrics.counter(names::PROBE_TIMEOUTS),
            push_pulls: metrics.counter(names::PUSH_PULLS),
            join_answer_bytes: metrics.counter(names::JOIN_ANSWER_BYTES),
            packets_tx: metrics.counter(names::PACKETS_SENT),
            packets_rx: metrics.counter(names::PACKETS_RECEIVED),
            bytes_tx: metrics.counter(names::BYTES_SENT),
            bytes_rx: metrics.counter(names::BYTES_RECEIVED),
            late_ticks: metrics.counter(names::LATE_TICKS),
            reannounced: metrics.counter(names::REANNOUNCED),
            user_events: metrics.counter(names::USER_EVENTS),
            queries_answered: metrics.counter(names::QUERIES_ANSWERED),
            answers_dropped: metrics.counter(names::QUERY_ANSWERS_DROPPED),
            servers_suspected: metrics.counter(names::SERVERS_SUSPECTED),
            servers_failed: metrics.counter(names::SERVERS_FAILED),
            servers_returned: metrics.counter(names::SERVERS_RETURNED),
            ack_delay: metrics.latency(names::ACK_DELAY),
        };
        let mut cfg = cfg;
        // The pool's own ring: serf's keyring queries change it.
        cfg.security.keyring = cfg.security.keyring.as_ref().map(|k| k.detached());
        let mut view = View {
            endpoints,
            tags: cfg.tags.clone(),
            ..View::default()
        };
        view.suspicions.mult = cfg.timings.suspicion_mult;
        view.retransmit_mult = cfg.timings.retransmit_mult;
        view.suspicions.interval = cfg.timings.probe_interval;
        let stop = CancellationToken::new();
        let inner = Arc::new(Inner {
            cfg,
            view: Mutex::new(view),
            udp: udp.into_iter().map(Arc::new).collect(),
            seq: AtomicU32::new(fastrand::u32(..)),
            waiting: Mutex::new(Default::default()),
            outbox: Mutex::default(),
            metrics,
            ids,
            joins: Semaphore::new(JOINS_AT_ONCE),
            streams: Semaphore::new(STREAMS_AT_ONCE),
            closing: stop.child_token(),
            stop,
            warned_late: AtomicBool::new(false),
            joined: AtomicU64::new(0),
            batch: Arc::default(),
            gossiped: Notify::new(),
            reannouncing: Mutex::default(),
            join_memo: memo::Memos::default(),
        });
        for (i, sock) in inner.udp.iter().enumerate() {
            tokio::spawn(net::packets(inner.clone(), i, sock.clone()));
        }
        for l in tcp {
            tokio::spawn(net::streams(inner.clone(), l));
        }
        if let Err(e) = net::hello(&inner).await {
            inner.stop.cancel();
            return Err(e);
        }
        tokio::spawn(tick::run(inner.clone()));
        Ok(Pool { inner })
    }

    /// Adds agent `index`'s member (not yet joined), on endpoint `index`
    /// modulo their number: its slot, and the address it advertises (the
    /// agent's catalog address must be that IP, or the leader's reconcile
    /// would move the node's address back and forth).
    pub fn add(&self, name: &str, node_id: &str, index: u64) -> (usize, SocketAddr) {
        let mut v = self.inner.lock();
        let ep = (index % v.endpoints.len() as u64) as u16;
        let slot = v.add_local(name, node_id, ep);
        v.by_index.insert(index, slot);
        (slot, v.endpoints[usize::from(ep)])
    }

    /// Joins member `slot` through a server (a push-pull with `Join` set,
    /// as `consul agent -retry-join` does); on failure, why (counted as
    /// [`JoinError::kind`]; the caller may retry later).
    pub async fn join(&self, slot: usize) -> Result<(), JoinError> {
        // A fresh member re-announces every member its join taught it.
        if let Some(learnt) = net::join(&self.inner, slot).await? {
            reannounce::start(&self.inner, slot, &learnt);
        }
        Ok(())
    }

    /// Starts member `slot`'s leave (its leave intent, then its dead
    /// message, gossiped as a real agent's `consul leave`).
    pub fn leave(&self, slot: usize) {
        let i = &self.inner;
        let mut v = i.lock();
        let limit = v.retransmit_limit(i.cfg.timings.retransmit_mult);
        if v.locals.get(slot).is_some_and(|l| l.phase == Phase::Alive) {
            i.metrics.incr(i.ids.leaves);
        }
        let now = tokio::time::Instant::now();
        // Beyond what gossip carries in time (a server's queue would drop
        // intents, and a leave without its intent is a failure), the
        // leaves go by a batch of push-pulls (the ticker starts one).
        if v.leaving.len() >= GOSSIPED_LEAVES {
            v.leave_quietly(slot, now);
        } else {
            v.leave(slot, limit, now);
        }
    }

    /// The member of agent `index`, once added.
    pub fn slot(&self, index: u64) -> Option<usize> {
        self.inner.lock().by_index.get(&index).copied()
    }

    /// Whether member `slot` has joined and not left.
    pub fn is_member(&self, slot: usize) -> bool {
        self.inner
            .lock()
            .locals
            .get(slot)
            .is_some_and(|l| l.phase == Phase::Alive)
    }

    /// Member `slot`'s coordinate.
    pub fn coordinate(&self, slot: usize) -> Coord {
        self.inner.lock().locals[slot].vivaldi.coord().clone()
    }

    /// Moves member `slot`'s coordinate by a round trip to a peer at the
    /// origin (the agent's RPC round trips, between its probes).
    pub fn observe(&self, slot: usize, rtt: Duration) {
        self.inner.lock().locals[slot]
            .vivaldi
            .observe(&Coord::default(), rtt);
    }

    /// The Consul servers the pool knows: gossip address and serf tags.
    pub fn servers(&self) -> Vec<(SocketAddr, Vec<(String, String)>)> {
        self.inner
            .lock()
            .remotes
            .iter()
            .filter(|r| r.server)
            .map(|r| {
                (
                    r.addr,
                    crate::serf::decode_tags(&r.meta).unwrap_or_default(),
                )
            })
            .collect()
    }

    /// Probes and relayed pings awaiting an ack.
    pub fn waiting(&self) -> usize {
        self.inner
            .waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// What the pool heard about the servers (new leaders, servers seen,
    /// failed, left, back), current at once and updated on each change.
    pub fn news(&self) -> tokio::sync::watch::Receiver<News> {
        self.inner.lock().news.subscribe()
    }

    /// The keys the pool holds, its primary first (serf's keyring queries
    /// change them).
    pub fn keys(&self) -> Vec<Vec<u8>> {
        let ring = self.inner.cfg.security.keyring.as_ref();
        ring.map(crate::wire::Keyring::keys).unwrap_or_default()
    }

    /// Servers this pool suspects or believes dead (their probes failed).
    pub fn suspected_servers(&self) -> usize {
        self.inner
            .lock()
            .remotes
            .iter()
            .filter(|r| r.server && r.state != crate::wire::msgs::state::ALIVE)
            .count()
    }

    /// Members alive, joining, and gone.
    pub fn census(&self) -> (usize, usize, usize) {
        let v = self.inner.lock();
        let joining = v
            .locals
            .iter()
            .filter(|l| l.phase == Phase::Joining)
            .count();
        (v.alive, joining, v.locals.len() - v.alive - joining)
    }

    /// Leaves every member still in, lets the broadcasts travel (at most
    /// `leave_wait`), then tells each server the whole pool's leave in two
    /// push-pulls (intents, then leaves: serf marks a member left only if
    /// its intent came first), and stops; at most
    /// [`Timings::close_bound`] (the steps: `close`'s module doc).
    pub async fn close(&self) {
        close::close(&self.inner).await;
        self.inner.stop.cancel();
    }

    /// Stops at once: no leave (the servers will find the members failed).
    pub fn stop(&self) {
        self.inner.stop.cancel();
    }

    /// Joins `slot` in the background, again every `retry` while it fails
    /// (Consul's `retry_join`), until it is in or the pool stops.
    pub fn join_retrying(&self, slot: usize, retry: Duration) {
        let pool = self.clone();
        tokio::spawn(async move {
            loop {
                let closing = pool.inner.closing.clone();
                if closing.is_cancelled() || pool.join(slot).await.is_ok() {
                    return;
                }
                tokio::select! {
                    () = tokio::time::sleep(retry) => {}
                    () = closing.cancelled() => return,
                }
                if pool.inner.lock().locals[slot].phase != Phase::Joining {
                    return;
                }
            }
        });
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, View> {
        self.view.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn next_seq(&self) -> u32 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }

    /// The probes and relayed pings awaiting an ack.
    fn awaited(&self) -> std::sync::MutexGuard<'_, HashMap<u32, probe::Waiting>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The queries' answers owed.
    fn outbox(&self) -> std::sync::MutexGuard<'_, outbox::Outbox> {
        self.outbox.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds what the view tallied since the last call to the run's counters.
    fn count_tally(&self) {
        let t = std::mem::take(&mut self.lock().news.tally);
        let m = &self.metrics;
        m.add(self.ids.user_events, t.user_events);
        m.add(self.ids.servers_suspected, t.suspected);
        m.add(self.ids.servers_failed, t.failed);
        m.add(self.ids.servers_returned, t.returned);
    }
}
