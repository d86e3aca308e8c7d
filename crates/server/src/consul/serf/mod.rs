//! The embedded server as a member of the LAN gossip pool (`agent-sim serve
//! --consul-serf ADDR`): memberlist and serf as a Consul 1.20 server speaks
//! them on its serf LAN port, UDP and TCP on one address, with the tags a
//! server sets (`role=consul`, `dc`, `port`, `id`, `vsn`, `build`, ...).
//!
//! - It answers pings (an ack with its coordinate), indirect pings (it
//!   pings the target, relays the ack or sends a nack), TCP pings,
//!   push-pulls (its whole state, encoded once per change of it; then it
//!   merges the peer's; past memberlist's 128 pending, none), gossip
//!   (alive, suspect, dead; serf's join and leave intents and user events)
//!   and serf messages on streams. Gossip goes through memberlist's handler
//!   queue (1,024 a queue: past it, dropped, counted and logged).
//! - It leads: serving (at start and after every restart) it fires serf's
//!   user event `consul:new-leader` with its name, as a server taking
//!   leadership does (real client agents then run a full anti-entropy
//!   sync); after a restart it gossips itself alive at a higher
//!   incarnation, so members that declared it dead take it back.
//! - It probes one member per probe interval (1 s, stretched by its health
//!   awareness), round robin over a shuffled list; no ack within 500 ms:
//!   indirect pings through up to 3 members and a TCP ping, then suspicion;
//!   a suspicion not refuted in memberlist's time makes the member failed.
//!   It gossips what changed to 3 members every 200 ms and push-pulls with
//!   one every 30 s (scaled).
//! - Its catalog follows the pool as a Consul leader's does: an alive
//!   member's node is registered with a passing `serfHealth` check, a
//!   failed one's `serfHealth` goes critical, a left one's node is
//!   deregistered.
//! - `/v1/agent/members` lists the pool (`consul::http`), the port's
//!   counters are `serf_*` fields of the server's snapshot, and
//!   `/v1/agent/metrics?format=prometheus` shows them under the names a
//!   real server exports (`exposition`).
//!
//! Parts: `members` (the table and memberlist's and serf's rules; a
//! suspicion is timed by the gossip crate's `pool::suspicion`, the
//! simulated members' own), `merge`, `awareness`, `event` (user events), `queue` (what to
//! gossip), `view` (selection, push-pull state, rows), `answer` (the
//! push-pull state kept encoded, push-pulls in flight), `packet` (UDP),
//! `handoff` (the handler queue), `stream` (TCP), `probe` (the timers:
//! probes, gossip, suspicion deadlines, push-pulls, queue checks),
//! `reconcile` (the catalog), `stats`, `exposition`.
//!
//! What it is not: no WAN pool, no serf queries (received and counted, not
//! answered), no Vivaldi of its own (its coordinate is serf's starting
//! one), no reconnect of failed members, no rejoin of the members it knew
//! after a restart (it gossips to them instead); the `consul` service of
//! other servers is not registered.

mod answer;
mod awareness;
mod event;
mod exposition;
mod handoff;
mod members;
mod merge;
mod packet;
mod probe;
mod queue;
mod reconcile;
mod stats;
mod stream;
#[cfg(test)]
mod tests;
mod view;

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use agent_sim_gossip::coordinate::Coord;
use agent_sim_gossip::serf::encode_tags;
use agent_sim_gossip::serf::event::NEW_LEADER;
use agent_sim_gossip::{Keyring, Security, WireError};
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::{Notify, Semaphore, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use stats::SerfSnapshot;
pub use view::SerfMember;

pub(crate) use stats::SerfCounters;

use super::ConsulState;
use members::{Rules, Table};

/// Settings of the serf LAN port (memberlist's LAN defaults, Consul's
/// reap times).
#[derive(Clone, Debug)]
pub struct SerfConfig {
    /// Where to listen, UDP and TCP on one port (port 0: any free port,
    /// the same for both).
    pub bind: SocketAddr,
    /// The pool's label and keyring (`--consul-serf-label`,
    /// `--consul-serf-key`, as the agents' `--gossip-label`/`--gossip-key`).
    pub security: Security,
    /// One probe per interval (1 s).
    pub probe_interval: Duration,
    /// How long a direct ping waits for its ack (500 ms).
    pub probe_timeout: Duration,
    /// Members asked for an indirect probe (3).
    pub indirect_checks: usize,
    /// Suspicion timeout: `mult × max(1, log10(n)) × probe_interval` (4).
    pub suspicion_mult: u32,
    /// The timeout without confirmations, in multiples of that (6).
    pub suspicion_max_timeout_mult: u32,
    /// Gossip every (200 ms).
    pub gossip_interval: Duration,
    /// To this many members (3).
    pub gossip_nodes: usize,
    /// How long dead members still get gossip and stay in push-pulls (30 s).
    pub gossip_to_the_dead: Duration,
    /// Each message gossiped `mult × ceil(log10(n + 1))` times (4).
    pub retransmit_mult: u32,
    /// Push-pull with a random member every (30 s, longer beyond 32
    /// members); zero: never.
    pub push_pull_interval: Duration,
    /// A stream's whole life at most (10 s).
    pub tcp_timeout: Duration,
    /// Largest stream message read (8 MiB: a push-pull of ≈40,000 members).
    pub max_stream_bytes: usize,
    /// Most members held (and claimed by one push-pull).
    pub max_members: usize,
    /// Streams handled at once; more are closed at accept (128; of them,
    /// push-pulls are bounded as memberlist bounds them, in `answer`).
    pub max_tcp_handlers: usize,
    /// How long left members stay listed (serf's tombstone timeout, 24 h).
    pub reap_left: Duration,
    /// How long failed members stay listed (Consul's reconnect timeout, 72 h).
    pub reap_failed: Duration,
    /// Where its log lines go (the handler queue's drops, refused
    /// push-pulls, as memberlist words them); none: nowhere.
    pub log: Option<SerfLog>,
    /// What each message handed to memberlist's handler costs it beyond its
    /// work (zero: nothing): a server whose handler waits on serf's event
    /// consumers, and so falls behind in a burst (and, taking the newest
    /// first, handles a member's dead message before its leave intent).
    pub handle_delay: Duration,
}

/// Where the serf port's log lines go, one line each.
#[derive(Clone)]
pub struct SerfLog(pub Arc<dyn Fn(String) + Send + Sync>);

impl std::fmt::Debug for SerfLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SerfLog")
    }
}

impl Default for SerfConfig {
    fn default() -> Self {
        SerfConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            security: Security::default(),
            probe_interval: Duration::from_secs(1),
            probe_timeout: Duration::from_millis(500),
            indirect_checks: 3,
            suspicion_mult: 4,
            suspicion_max_timeout_mult: 6,
            gossip_interval: Duration::from_millis(200),
            gossip_nodes: 3,
            gossip_to_the_dead: Duration::from_secs(30),
            retransmit_mult: 4,
            push_pull_interval: Duration::from_secs(30),
            tcp_timeout: Duration::from_secs(10),
            max_stream_bytes: 8 << 20,
            max_members: 1 << 17,
            max_tcp_handlers: 128,
            reap_left: Duration::from_secs(24 * 3600),
            reap_failed: Duration::from_secs(72 * 3600),
            log: None,
            handle_delay: Duration::ZERO,
        }
    }
}

/// Settings that cannot work, in one line.
#[derive(Debug, thiserror::Error)]
pub enum SerfConfigError {
    /// A gossip key that is not one (not base64, or not 16, 24 or 32
    /// bytes), in the keyring's words.
    #[error(transparent)]
    Keys(#[from] WireError),
    /// A setting out of its range (what is wrong, in one line).
    #[error("{0}")]
    Invalid(&'static str),
}

impl SerfConfig {
    /// Memberlist's LAN settings on `bind`, with the pool's gossip keys
    /// (base64, as `consul keygen` prints them; the first encrypts, all
    /// decrypt; none: plain) and label (empty: none), validated.
    pub fn secured(
        bind: SocketAddr,
        keys: &[String],
        label: String,
    ) -> Result<Self, SerfConfigError> {
        let keyring = match keys {
            [] => None,
            keys => Some(Keyring::from_base64(keys)?),
        };
        let cfg = SerfConfig {
            bind,
            security: Security { label, keyring },
            ..SerfConfig::default()
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// These settings, logging to `log` (the backend's log, when it has
    /// one; else where they logged).
    pub fn logging_to(self, log: Option<Arc<dyn Fn(String) + Send + Sync>>) -> Self {
        SerfConfig {
            log: log.map(SerfLog).or(self.log.clone()),
            ..self
        }
    }

    /// Checks the settings before a socket is opened.
    pub fn validate(&self) -> Result<(), SerfConfigError> {
        let bad = |s| Err(SerfConfigError::Invalid(s));
        if self.security.label.len() > 255 {
            return bad("a gossip label is at most 255 bytes");
        }
        if self.probe_interval.is_zero() || self.gossip_interval.is_zero() {
            return bad("the probe and gossip intervals must be above zero");
        }
        if self.probe_timeout >= self.probe_interval {
            return bad("the probe timeout must be shorter than the probe interval");
        }
        if self.max_tcp_handlers == 0 || self.max_members < 2 {
            return bad("at least one stream handler and two members are needed");
        }
        Ok(())
    }
}

/// memberlist's UDP receive buffer: 2 MiB (halved until the kernel takes
/// it), so a burst of gossip is not dropped before it is read.
const UDP_RECV_BUFFER: usize = 2 << 20;

/// Binds the serf port: TCP, then UDP on the port TCP got (retried on
/// another port when that one is taken for UDP and any port will do).
pub fn bind_serf(addr: SocketAddr) -> io::Result<(UdpSocket, TcpListener)> {
    let mut tries = 0;
    loop {
        tries += 1;
        let tcp = crate::listen::bind(addr, false)?;
        let at = tcp.local_addr()?;
        match bind_udp(at) {
            Ok(udp) => return Ok((udp, tcp)),
            Err(_) if addr.port() == 0 && tries < 8 => continue,
            Err(e) => return Err(e),
        }
    }
}

fn bind_udp(at: SocketAddr) -> io::Result<UdpSocket> {
    let s = socket2::Socket::new(
        socket2::Domain::for_address(at),
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    let mut size = UDP_RECV_BUFFER;
    while size > 0 && s.set_recv_buffer_size(size).is_err() {
        size /= 2;
    }
    s.set_nonblocking(true)?;
    s.bind(&at.into())?;
    UdpSocket::from_std(s.into())
}

/// What an ack or nack for a sequence number goes to.
#[derive(Debug)]
enum Waiter {
    /// A probe of this server's.
    Probe {
        tx: mpsc::Sender<Reply>,
        /// Acks after this are late.
        direct_until: Instant,
    },
    /// An indirect probe done for a member: relay the ack to it.
    Relay { to: SocketAddr, seq: u32 },
}

/// What a probe hears.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reply {
    Ack,
    Nack,
}

/// Indirect probes in flight at most (more are refused as `busy`).
const MAX_WAITERS: usize = 4096;

/// The serf side of one server: its table, its sockets while serving,
/// its probes in flight and its counters.
pub(crate) struct Serf {
    cfg: SerfConfig,
    table: Mutex<Table>,
    // Bound: MAX_WAITERS indirect probes relayed at once, besides the one
    // probe of its own in flight.
    waiters: Mutex<HashMap<u32, Waiter>>,
    seq: AtomicU32,
    counters: Arc<SerfCounters>,
    socket: Mutex<Option<Arc<UdpSocket>>>,
    /// Rung when members need their catalog entry reconciled.
    dirty: Notify,
    tcp_slots: Arc<Semaphore>,
    /// The push-pull state kept encoded, and the push-pulls in flight.
    answers: answer::Answers,
    /// The ack payload: serf's version byte and this server's coordinate.
    ack_payload: Vec<u8>,
    me: Arc<str>,
    /// memberlist's handler queue.
    handoff: handoff::Handoff,
    /// Log lines at most once a second: the handler queue full, push-pulls
    /// refused.
    throttles: [Mutex<handoff::Throttle>; 2],
    /// Times it started serving (the second on are restarts).
    served: AtomicU64,
}

impl std::fmt::Debug for Serf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Serf")
            .field("me", &self.me)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The coordinate a new serf member starts with (origin, error 1.5,
/// height 10 µs), as an ack's payload.
fn ack_payload() -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    Coord::default().ack_payload(&mut out);
    out
}

/// The address a server bound to `ip` advertises: that one, or for a
/// wildcard the local address that routes to private networks (memberlist
/// picks a private address), else loopback.
fn advertise(ip: IpAddr) -> IpAddr {
    if !ip.is_unspecified() {
        return ip;
    }
    let routed = std::net::UdpSocket::bind(("0.0.0.0", 0))
        .and_then(|s| s.connect(("10.255.255.254", 9)).map(|()| s))
        .and_then(|s| s.local_addr());
    match routed {
        Ok(a) if !a.ip().is_unspecified() => a.ip(),
        _ => IpAddr::from([127, 0, 0, 1]),
    }
}

impl Serf {
    /// The serf side of a server named `me` in `datacenter` with `node_id`.
    /// `meta`: its tags, encoded.
    pub(crate) fn new(
        cfg: SerfConfig,
        me: &str,
        datacenter: &str,
        node_id: &str,
        meta: Vec<u8>,
        counters: Arc<SerfCounters>,
    ) -> Self {
        let me: Arc<str> = me.into();
        let rules = Rules {
            me: me.clone(),
            datacenter: datacenter.to_owned(),
            node_id: node_id.to_owned(),
            probe_interval: cfg.probe_interval,
            suspicion_mult: cfg.suspicion_mult,
            suspicion_max_mult: cfg.suspicion_max_timeout_mult,
            retransmit_mult: cfg.retransmit_mult,
            gossip_to_the_dead: cfg.gossip_to_the_dead,
            reap_left: cfg.reap_left,
            reap_failed: cfg.reap_failed,
            max_members: cfg.max_members,
        };
        Serf {
            table: Mutex::new(Table::new(rules, meta, counters.clone())),
            waiters: Mutex::new(HashMap::new()),
            seq: AtomicU32::new(fastrand::u32(..)),
            counters,
            socket: Mutex::new(None),
            dirty: Notify::new(),
            tcp_slots: Arc::new(Semaphore::new(cfg.max_tcp_handlers.max(1))),
            answers: answer::Answers::default(),
            ack_payload: ack_payload(),
            me,
            cfg,
            handoff: handoff::Handoff::default(),
            throttles: Default::default(),
            served: AtomicU64::new(0),
        }
    }

    /// Runs `f` on the table; wakes the reconcile when it left members to
    /// reconcile.
    fn with_table<R>(&self, f: impl FnOnce(&mut Table) -> R) -> R {
        let (r, dirty) = {
            let mut t = lock(&self.table);
            let r = f(&mut t);
            (r, !t.dirty.is_empty())
        };
        if dirty {
            self.dirty.notify_one();
        }
        r
    }

    fn next_seq(&self) -> u32 {
        self.seq.fetch_add(1, Ordering::Relaxed).wrapping_add(1)
    }

    /// This server's address and port as it advertises them.
    fn me_addr(&self) -> (Vec<u8>, u16) {
        let t = lock(&self.table);
        (t.me().addr_raw.clone(), t.me().port)
    }

    /// The counters, with the members by state and the queues' depths.
    pub(crate) fn snapshot(&self) -> SerfSnapshot {
        let (census, depths) = {
            let t = lock(&self.table);
            (t.census(), t.queue.depths())
        };
        self.counters.snapshot(census, depths, self.handoff.len())
    }
}

impl ConsulState {
    /// The serf side of this server.
    pub(crate) fn serf(&self) -> &Arc<Serf> {
        &self.inner.serf
    }

    /// The LAN pool as this server sees it (itself included), sorted by
    /// name: what `/v1/agent/members` lists.
    pub fn serf_members(&self) -> Vec<SerfMember> {
        let mut rows = lock(&self.serf().table).rows();
        rows.sort_by(|a, b| a.name.cmp(&b.name));
        rows.into_iter().map(SerfMember::from).collect()
    }

    /// This server's serf tags with the ports it listens on now.
    fn serf_meta(&self) -> Vec<u8> {
        let grpc = super::lock(&self.inner.grpc_addr).map(|a| a.port());
        let rpc = self.leader_addr().port();
        server_meta(&self.inner.cfg, &self.inner.node_id, rpc, grpc)
    }
}

/// The serf tags of a server, as a Consul 1.20 server sets them (no WAN
/// pool: no `wan_join_port`), encoded as its memberlist metadata.
pub(crate) fn server_meta(
    cfg: &super::ConsulTargetConfig,
    node_id: &str,
    rpc_port: u16,
    grpc_port: Option<u16>,
) -> Vec<u8> {
    let acls = if cfg.acl_tokens.is_some() { "1" } else { "0" };
    let (rpc, grpc) = (rpc_port.to_string(), grpc_port.map(|p| p.to_string()));
    let mut tags: Vec<(&str, &str)> = vec![
        ("acls", acls),
        ("build", "1.20.1:"),
        ("dc", &cfg.datacenter),
        ("ft_fs", "1"),
        ("ft_si", "1"),
        ("id", node_id),
        ("port", &rpc),
        ("raft_vsn", "3"),
        ("role", "consul"),
        ("segment", ""),
        ("vsn", "2"),
        ("vsn_max", "3"),
        ("vsn_min", "2"),
    ];
    if let Some(grpc) = &grpc {
        let key = if cfg.tls.is_some() {
            "grpc_tls_port"
        } else {
            "grpc_port"
        };
        tags.push((key, grpc));
    }
    if cfg.tls.is_some() {
        tags.push(("use_tls", "1"));
    }
    tags.sort_unstable();
    encode_tags(&tags)
}

/// Serves the serf port on `udp` and `tcp` (one address, from
/// [`bind_serf`]) for `state` until `shutdown`: answers, probes, gossips,
/// push-pulls and reconciles the catalog.
pub async fn serve_serf(
    udp: UdpSocket,
    tcp: TcpListener,
    state: ConsulState,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let serf = state.serf().clone();
    let at = tcp.local_addr()?;
    let ip = advertise(at.ip());
    let meta = state.serf_meta();
    let again = serf.served.fetch_add(1, Ordering::Relaxed) > 0;
    serf.with_table(|t| {
        t.set_me(ip, at.port(), meta);
        if again {
            t.return_me();
        }
        // A Consul server that takes leadership fires this (leader.go's
        // `leaderLoop`); this one leads from the moment it serves.
        t.fire_event(NEW_LEADER, serf.me.as_bytes());
    });
    let udp = Arc::new(udp);
    *lock(&serf.socket) = Some(udp.clone());
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(packet::receive(serf.clone(), udp, shutdown.clone()));
    tasks.spawn(handoff::handler(serf.clone(), shutdown.clone()));
    tasks.spawn(probe::queue_checks(serf.clone(), shutdown.clone()));
    tasks.spawn(probe::probes(serf.clone(), shutdown.clone()));
    tasks.spawn(probe::gossip(serf.clone(), shutdown.clone()));
    tasks.spawn(probe::timers(serf.clone(), shutdown.clone()));
    tasks.spawn(probe::push_pulls(serf.clone(), shutdown.clone()));
    tasks.spawn(reconcile::run(state.clone(), shutdown.clone()));
    let conns = serf.clone();
    let served = super::conn::accept_loop(tcp, &state, shutdown.clone(), move |stream| {
        stream::accepted(conns.clone(), stream)
    })
    .await;
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    *lock(&serf.socket) = None;
    // A probe cut short left its waiter, and the handler what it had not
    // handled; a restart keeping the state starts without them.
    lock(&serf.waiters).clear();
    serf.handoff.clear();
    served
}
