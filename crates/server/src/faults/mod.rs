//! Fault injection for the embedded backends (`agent-sim serve --faults`).
//!
//! - [`spec`]: the grammar ([`FaultSpec`]), parsed and checked before any
//!   socket is opened.
//! - `io`: [`FaultIo`], the accepted TCP stream that a fault can drop
//!   (FIN), reset (RST) or stall, and the registries of live connections.
//! - [`Faults`]: the armed faults of one backend, shared by its servers (and
//!   kept across restarts): each spec with its own seeded RNG (so a seed
//!   replays the same decisions in the same order), its injection count, and
//!   one task per timed fault that hits live units at its times.
//!
//! The servers ask at each point (`pick` for an upgrade, a request, a call,
//! a frame) and act on the answer; live streams also wait for the orders
//! of timed faults (`orders`, `next_order`). Counts are what was actually
//! injected.
//! With no faults, [`Faults`] is an empty handle and every check is one
//! branch.

mod io;
pub mod spec;
mod when;

#[cfg(feature = "consul")]
pub(crate) use io::ConnCtl;
pub use io::FaultIo;
pub(crate) use io::{Kill, Registry};
pub use spec::{Action, FaultSpec, Protocol, RestartState, SpecError, Target};
pub use when::Load;

/// The `--faults` grammar, shown by `agent-sim serve --help`.
pub const HELP: &str = "\
Faults (--faults SPEC, repeatable; counted in the printed stats):
  SPEC  = TARGET=ACTION@ITEM[,ITEM...]  |  restart@ITEM[,ITEM...]
  TARGET and ACTION:
    sensu.upgrade     delay:DUR | stall | drop | reset | 400..599   (WebSocket upgrade)
    sensu.session     drop | reset | stall                          (established sessions)
    sensu.frame       garbage | truncated | oversized | delay:DUR   (messages the backend sends)
    consul.rpc        delay:DUR | stall | drop | reset              (RPC connections)
    consul.subscribe  aborted | unavailable | resource-exhausted | cut   (calls; live streams at a time)
    consul.frame      garbage | truncated | oversized | delay:DUR   (gRPC messages on streams)
    consul.http       delay:DUR | stall | drop | reset | 400..599   (HTTP API requests)
    consul.xds        reset | resource-exhausted                    (Delta ADS streams; live at a time)
                      garbage | bad-resource | delay:DUR            (xDS responses; needs --consul-grpc)
    consul.kv         index-back | index-zero | huge-value          (KV reads, HTTP and RPC)
                      lock-stuck                                    (lock acquires: held for good)
  ITEM:
    N%              each unit (connection, request, stream, frame) with this probability
    at:DUR          once, DUR after serve started     every:DUR  periodically
    for:DUR         with at/every: also units arriving within DUR (required for
                    upgrades, frames, requests and cut, which have no live units)
    after:DUR       sensu.session with a rate: hit DUR into the session
    path:PREFIX     consul.http, consul.kv: only paths starting with PREFIX
    max:N           at most N injections
    past:N          with N%: only once serve holds N sessions or more (Sensu
                    sessions; xDS streams for consul.xds; multiplexed RPC
                    connections, one per client agent, for the other consul
                    targets): a server that degrades past a size
    down:DUR        restart: listeners closed this long (default 1s)
    state:keep|lose restart: keep catalog, sessions, raft index, or start empty
  Examples:
    --faults 'sensu.upgrade=503@10%'   --faults 'consul.subscribe=aborted@at:30s'
    --faults 'sensu.session=reset@every:60s,20%'   --faults 'consul.http=429@5%,path:/v1/txn'
    --faults 'consul.xds=bad-resource@5%'   --faults 'consul.xds=reset@at:1m'
    --faults 'restart@at:20s,down:5s,state:lose'   --faults-seed 42
    --faults 'consul.frame=delay:2s@100%,past:500'   (a knee for --steps to find)";

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use serde::Serialize;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The longest a stalled connection is held (its client normally gives up
/// much earlier, and the stall ends when it does).
pub const STALL_LIMIT: Duration = Duration::from_secs(600);

/// Payload of an oversized gRPC message: one byte over the 4 MiB that gRPC
/// clients (grpc-go, tonic) accept by default.
pub const OVERSIZED_GRPC: usize = 4 * 1024 * 1024 + 1;

/// Payload of an oversized WebSocket message: one byte over the 64 KiB the
/// simulated agents accept.
pub const OVERSIZED_WS: usize = 64 * 1024 + 1;

/// What a `consul.xds=bad-resource` fault puts in a resource's `Any`
/// instead of its encoding: a key with wire type 7, which no protobuf
/// decoder accepts.
pub const BAD_RESOURCE: &[u8] = &[0x07, 0xba, 0xd0];

/// What the injecting server says where it answers (HTTP bodies).
pub const INJECTED_WORDS: &str = "injected by agent-sim serve --faults";

/// Consul's words for a request refused by its rate limiter on a server
/// that others could serve (gRPC `RESOURCE_EXHAUSTED`, HTTP 429).
pub const RETRY_ELSEWHERE: &str = "rate limit exceeded, try a different server";

/// Consul's words for a request refused by its rate limiter that only this
/// server can serve (gRPC `UNAVAILABLE`, HTTP 503).
pub const RETRY_LATER: &str = "rate limit exceeded, try again later";

/// Consul's words when it resets a subscription (gRPC `ABORTED`).
pub const ABORTED_WORDS: &str =
    "subscription closed by server, client must reset state and resubscribe";

/// One armed spec.
#[derive(Debug)]
struct Armed {
    spec: FaultSpec,
    rng: Mutex<fastrand::Rng>,
    injected: AtomicU64,
    /// Nanoseconds from the start to the first and the last injection
    /// (`u64::MAX`: none yet).
    first_ns: AtomicU64,
    last_ns: AtomicU64,
}

/// An order to the live Subscribe (or Delta ADS) streams: spec `idx` fires
/// (`seq` makes each firing a change).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Order {
    seq: u64,
    idx: usize,
}

#[derive(Debug)]
struct Inner {
    armed: Vec<Armed>,
    seed: u64,
    start: OnceLock<Instant>,
    scheduled: OnceLock<()>,
    sensu_sessions: Arc<Registry>,
    consul_rpc: Arc<Registry>,
    consul_http: Arc<Registry>,
    /// Orders of timed `consul.subscribe` faults.
    orders: watch::Sender<Order>,
    /// Orders of timed `consul.xds` faults.
    xds_orders: watch::Sender<Order>,
    /// Sessions held now, by [`Load`] (what `past:` reads).
    held: [Arc<AtomicU64>; 3],
    stop: CancellationToken,
}

/// The armed faults of one backend (cheap to clone; the default has none).
#[derive(Debug, Clone, Default)]
pub struct Faults {
    inner: Option<Arc<Inner>>,
}

/// A session counted for `past:` items while it lives ([`Faults::hold`]).
#[derive(Debug)]
pub(crate) struct Held(Option<Arc<AtomicU64>>);

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(c) = &self.0 {
            c.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A unit the dice chose, with what to do to it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Hit {
    pub idx: usize,
    pub action: Action,
    /// Sensu sessions: how far into the session.
    pub after: Duration,
}

/// Counts of one spec.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FaultCount {
    /// The spec as written.
    pub spec: String,
    /// Its target (`sensu.upgrade`, ..., `restart`).
    pub target: &'static str,
    /// Times it was injected (restarts: times the backend restarted).
    pub injected: u64,
    /// Seconds from serve start to the first injection.
    pub first_s: Option<f64>,
    /// Seconds from serve start to the last injection.
    pub last_s: Option<f64>,
}

/// What the faults injected so far.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FaultSnapshot {
    /// The seed of the dice.
    pub seed: u64,
    /// Per spec, in the order given.
    pub faults: Vec<FaultCount>,
    /// Sum of every spec's injections (restarts included).
    pub injected: u64,
    /// Restarts done (scheduled or through the backend handle; set by
    /// [`crate::backend::Backend::fault_stats`]).
    pub restarts: u64,
}

impl FaultSnapshot {
    /// Injections of the spec written `spec` (0 if there is none).
    pub fn count(&self, spec: &str) -> u64 {
        self.faults
            .iter()
            .filter(|f| f.spec == spec.trim())
            .map(|f| f.injected)
            .sum()
    }
}

impl Faults {
    /// Arms `specs`; decisions are drawn from `seed` (each spec its own
    /// stream). No specs: an empty handle.
    pub fn new(specs: Vec<FaultSpec>, seed: u64) -> Faults {
        if specs.is_empty() {
            return Faults::default();
        }
        let armed = specs
            .into_iter()
            .enumerate()
            .map(|(i, spec)| Armed {
                spec,
                rng: Mutex::new(fastrand::Rng::with_seed(
                    seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                )),
                injected: AtomicU64::new(0),
                first_ns: AtomicU64::new(u64::MAX),
                last_ns: AtomicU64::new(u64::MAX),
            })
            .collect();
        Faults {
            inner: Some(Arc::new(Inner {
                armed,
                seed,
                start: OnceLock::new(),
                scheduled: OnceLock::new(),
                sensu_sessions: Arc::default(),
                consul_rpc: Arc::default(),
                consul_http: Arc::default(),
                orders: watch::Sender::new(Order::default()),
                xds_orders: watch::Sender::new(Order::default()),
                held: Default::default(),
                stop: CancellationToken::new(),
            })),
        }
    }

    /// Whether any fault is armed on `target`.
    pub fn targets(&self, target: Target) -> bool {
        self.armed(target).next().is_some()
    }

    /// The armed specs.
    pub fn specs(&self) -> Vec<FaultSpec> {
        self.inner
            .iter()
            .flat_map(|i| i.armed.iter().map(|a| a.spec.clone()))
            .collect()
    }

    fn armed(&self, target: Target) -> impl Iterator<Item = (usize, &Armed)> {
        self.inner
            .iter()
            .flat_map(|i| i.armed.iter().enumerate())
            .filter(move |(_, a)| a.spec.target == target)
    }

    /// Starts the clock of `at:`/`every:` (once; later calls keep the first
    /// start) and the tasks that hit live units at their times. Call from
    /// inside a tokio runtime; [`Faults::stop`] ends the tasks.
    pub fn start(&self) {
        let Some(inner) = &self.inner else {
            return;
        };
        let start = *inner.start.get_or_init(Instant::now);
        if inner.scheduled.set(()).is_err() {
            return;
        }
        for (idx, a) in inner.armed.iter().enumerate() {
            let live = a
                .spec
                .action
                .as_ref()
                .is_some_and(|act| a.spec.target.has_live_units(act));
            if a.spec.untimed() || !live {
                continue;
            }
            let weak = Arc::downgrade(inner);
            let (spec, stop) = (a.spec.clone(), inner.stop.clone());
            tokio::spawn(async move {
                at_moments(&spec, start, &stop, || {
                    // Gone with the backend: the task ends.
                    let alive = weak.upgrade();
                    async move {
                        let Some(inner) = alive else { return false };
                        Faults { inner: Some(inner) }.fire(idx);
                        true
                    }
                })
                .await;
            });
        }
    }

    /// Stops the tasks of timed faults.
    pub fn stop(&self) {
        if let Some(i) = &self.inner {
            i.stop.cancel();
        }
    }

    /// Time since [`Faults::start`] (which it calls if nobody did).
    fn elapsed(&self) -> Duration {
        self.inner.as_ref().map_or(Duration::ZERO, |i| {
            i.start.get_or_init(Instant::now).elapsed()
        })
    }

    fn roll(&self, idx: usize) -> bool {
        let Some(inner) = &self.inner else {
            return false;
        };
        let a = &inner.armed[idx];
        a.spec.rate >= 1.0
            || a.rng.lock().unwrap_or_else(PoisonError::into_inner).f64() < a.spec.rate
    }

    /// Counts one injection of spec `idx`, unless its `max:` is reached.
    pub(crate) fn confirm(&self, idx: usize) -> bool {
        let Some(inner) = &self.inner else {
            return false;
        };
        let a = &inner.armed[idx];
        let max = a.spec.max.unwrap_or(u64::MAX);
        let counted = a
            .injected
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok();
        if counted {
            self.stamp(a);
        }
        counted
    }

    /// Records when `a` injected.
    fn stamp(&self, a: &Armed) {
        let ns = u64::try_from(self.elapsed().as_nanos()).unwrap_or(u64::MAX - 1);
        let _ = a
            .first_ns
            .compare_exchange(u64::MAX, ns, Ordering::AcqRel, Ordering::Acquire);
        a.last_ns.store(ns, Ordering::Release);
    }

    /// Counts a session of `load` held until the guard drops (what a
    /// `past:` item reads); nothing without faults.
    pub(crate) fn hold(&self, load: Load) -> Held {
        let count = self.inner.as_ref().map(|i| i.held[load as usize].clone());
        if let Some(c) = &count {
            c.fetch_add(1, Ordering::Relaxed);
        }
        Held(count)
    }

    /// Sessions of `load` held now.
    fn held_now(&self, load: Load) -> u64 {
        self.inner
            .as_ref()
            .map_or(0, |i| i.held[load as usize].load(Ordering::Relaxed))
    }

    /// Whether spec `idx` can still inject (its `max:` not reached).
    fn open(&self, idx: usize) -> bool {
        self.inner.as_ref().is_some_and(|i| {
            let a = &i.armed[idx];
            a.injected.load(Ordering::Acquire) < a.spec.max.unwrap_or(u64::MAX)
        })
    }

    /// Rolls the dice for a unit arriving now at `target` (`path`: an HTTP
    /// request's path), without counting: the first spec that hits.
    pub(crate) fn draw(&self, target: Target, path: Option<&str>) -> Option<Hit> {
        self.draw_if(target, path, |_| true)
    }

    /// [`Faults::draw`] among the specs whose action `accept`s (a target
    /// whose actions hit different units, as `consul.xds` streams and
    /// responses).
    pub(crate) fn draw_if(
        &self,
        target: Target,
        path: Option<&str>,
        accept: impl Fn(&Action) -> bool,
    ) -> Option<Hit> {
        self.inner.as_ref()?;
        let t = self.elapsed();
        for (idx, a) in self.armed(target) {
            let s = &a.spec;
            if !s.action.as_ref().is_some_and(&accept) {
                continue;
            }
            if let (Some(prefix), Some(p)) = (&s.path, path)
                && !p.starts_with(prefix.as_str())
            {
                continue;
            }
            if s.past.is_some_and(|n| self.held_now(target.load()) < n) {
                continue;
            }
            let now = s.untimed() || s.in_window(t);
            if now && self.open(idx) && self.roll(idx) {
                return Some(Hit {
                    idx,
                    action: s.action.clone().expect("targets with units have actions"),
                    after: if s.untimed() { s.after } else { Duration::ZERO },
                });
            }
        }
        None
    }

    /// [`Faults::draw`] and count it.
    pub(crate) fn pick(&self, target: Target, path: Option<&str>) -> Option<Hit> {
        let hit = self.draw(target, path)?;
        self.confirm(hit.idx).then_some(hit)
    }

    #[cfg(feature = "consul")]
    /// [`Faults::draw_if`] and count it.
    pub(crate) fn pick_if(&self, target: Target, accept: impl Fn(&Action) -> bool) -> Option<Hit> {
        let hit = self.draw_if(target, None, accept)?;
        self.confirm(hit.idx).then_some(hit)
    }

    /// Wraps an accepted connection: with a kill switch when any fault is
    /// armed, else passing through at no cost.
    pub fn io(&self, stream: TcpStream) -> FaultIo {
        match self.inner {
            Some(_) => FaultIo::armed(stream),
            None => FaultIo::plain(stream),
        }
    }

    /// Wraps an accepted connection of `target`; it is listed (reachable
    /// by a fault at a time) when a timed fault may hit it.
    pub fn wrap(&self, stream: TcpStream, target: Target) -> FaultIo {
        match self.registry(target) {
            Some(r) if self.has_timed_live(target) => FaultIo::listed(stream, &r),
            _ => self.io(stream),
        }
    }

    /// Lists an already wrapped connection (a Sensu connection becomes a
    /// session only after its upgrade).
    #[cfg(feature = "sensu")]
    pub(crate) fn enlist(&self, io: &mut FaultIo, target: Target) {
        if let Some(r) = self.registry(target)
            && self.has_timed_live(target)
        {
            io.enlist(&r);
        }
    }

    fn has_timed_live(&self, target: Target) -> bool {
        self.armed(target).any(|(_, a)| {
            !a.spec.untimed()
                && a.spec
                    .action
                    .as_ref()
                    .is_some_and(|act| target.has_live_units(act))
        })
    }

    fn registry(&self, target: Target) -> Option<Arc<Registry>> {
        let i = self.inner.as_ref()?;
        match target {
            Target::SensuSession => Some(i.sensu_sessions.clone()),
            Target::ConsulRpc => Some(i.consul_rpc.clone()),
            Target::ConsulHttp => Some(i.consul_http.clone()),
            _ => None,
        }
    }

    #[cfg(feature = "consul")]
    /// Orders to live streams of `target` (`consul.subscribe`,
    /// `consul.xds`), when a timed fault may give them.
    pub(crate) fn orders(&self, target: Target) -> Option<watch::Receiver<Order>> {
        let i = self.inner.as_ref()?;
        let tx = match target {
            Target::ConsulSubscribe => &i.orders,
            Target::ConsulXds => &i.xds_orders,
            _ => return None,
        };
        self.has_timed_live(target).then(|| tx.subscribe())
    }

    #[cfg(feature = "consul")]
    /// A live stream's answer to an order: the action when the dice hit it
    /// (counted).
    pub(crate) fn obey(&self, order: Order) -> Option<Action> {
        let i = self.inner.as_ref()?;
        let a = i.armed.get(order.idx)?;
        if self.roll(order.idx) && self.confirm(order.idx) {
            a.spec.action.clone()
        } else {
            None
        }
    }

    /// Spec `idx` fires now: every live unit of its target, each with the
    /// spec's probability.
    fn fire(&self, idx: usize) {
        let Some(inner) = &self.inner else {
            return;
        };
        let spec = &inner.armed[idx].spec;
        let Some(action) = &spec.action else {
            return;
        };
        let orders = match spec.target {
            Target::ConsulSubscribe => Some(&inner.orders),
            Target::ConsulXds => Some(&inner.xds_orders),
            _ => None,
        };
        if let Some(tx) = orders {
            tx.send_modify(|o| {
                o.seq += 1;
                o.idx = idx;
            });
            return;
        }
        let Some(registry) = self.registry(spec.target) else {
            return;
        };
        let kill = kill_of(action);
        for ctl in registry.snapshot() {
            if self.roll(idx) && self.confirm(idx) {
                ctl.kill(kill);
            }
        }
    }

    /// Counts one restart of spec `idx`.
    pub(crate) fn restarted(&self, idx: usize) {
        if let Some(i) = &self.inner {
            let a = &i.armed[idx];
            a.injected.fetch_add(1, Ordering::Relaxed);
            self.stamp(a);
        }
    }

    /// The armed restarts: (index, spec).
    pub(crate) fn restarts(&self) -> Vec<(usize, FaultSpec)> {
        self.armed(Target::Restart)
            .map(|(i, a)| (i, a.spec.clone()))
            .collect()
    }

    /// When the clock of timed faults started.
    pub(crate) fn started_at(&self) -> Option<Instant> {
        self.inner
            .as_ref()
            .map(|i| *i.start.get_or_init(Instant::now))
    }

    /// What was injected so far.
    pub fn snapshot(&self) -> FaultSnapshot {
        let Some(i) = &self.inner else {
            return FaultSnapshot::default();
        };
        let faults: Vec<FaultCount> = i
            .armed
            .iter()
            .map(|a| {
                let secs = |ns: &AtomicU64| {
                    let ns = ns.load(Ordering::Acquire);
                    (ns != u64::MAX).then(|| Duration::from_nanos(ns).as_secs_f64())
                };
                FaultCount {
                    spec: a.spec.text.clone(),
                    target: a.spec.target.name(),
                    injected: a.injected.load(Ordering::Relaxed),
                    first_s: secs(&a.first_ns),
                    last_s: secs(&a.last_ns),
                }
            })
            .collect();
        FaultSnapshot {
            seed: i.seed,
            injected: faults.iter().map(|f| f.injected).sum(),
            faults,
            restarts: 0,
        }
    }
}

/// Runs `hit` at each moment of `spec` (`at:`, then every `every:`, from
/// `start`) until the moments end, `stop` is cancelled, or `hit` answers
/// `false`.
pub(crate) async fn at_moments<F, Fut>(
    spec: &FaultSpec,
    start: Instant,
    stop: &CancellationToken,
    mut hit: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    for k in 0.. {
        let Some(at) = spec.moment(k) else {
            return;
        };
        tokio::select! {
            () = tokio::time::sleep_until(start + at) => {}
            () = stop.cancelled() => return,
        }
        if !hit().await {
            return;
        }
    }
}

/// Waits for a live stream's next order ([`Faults::orders`]), or forever
/// without a channel (or once its sender is gone).
#[cfg(feature = "consul")]
pub(crate) async fn next_order(orders: &mut Option<watch::Receiver<Order>>) {
    match orders {
        Some(rx) => {
            if rx.changed().await.is_err() {
                *orders = None;
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

/// The connection-level kill of an action (drop, reset, stall).
pub(crate) fn kill_of(action: &Action) -> Kill {
    match action {
        Action::Reset => Kill::Reset,
        Action::Stall => Kill::Stall,
        _ => Kill::Drop,
    }
}

/// Bytes that are no valid frame of either protocol: no `\n` (so no Sensu
/// `type\n` prefix), and a first byte that is an invalid protobuf key
/// (field 0), so a gRPC message of them never decodes.
pub(crate) fn garbage(rng_seed: u64, len: usize) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(rng_seed);
    let mut out: Vec<u8> = (0..len)
        .map(|_| match rng.u8(..) {
            b'\n' => b'.',
            b => b,
        })
        .collect();
    if let Some(first) = out.first_mut() {
        *first = 0x07;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn faults(specs: &[&str], seed: u64) -> Faults {
        Faults::new(specs.iter().map(|s| s.parse().unwrap()).collect(), seed)
    }

    #[test]
    fn a_past_fault_waits_for_the_sessions_held() {
        let f = faults(&["sensu.upgrade=503@100%,past:2"], 1);
        let up = || f.pick(Target::SensuUpgrade, None).is_some();
        let one = f.hold(Load::SensuSessions);
        assert!(!up(), "1 session held: not yet");
        let two = f.hold(Load::SensuSessions);
        let _xds = f.hold(Load::XdsStreams);
        assert!(up(), "2 held: refused");
        drop((one, two));
        assert!(!up(), "the sessions gone, the gate shuts again");
        assert_eq!(f.snapshot().count("sensu.upgrade=503@100%,past:2"), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_seed_replays_the_same_decisions() {
        let run = |seed| {
            let f = faults(&["sensu.upgrade=503@30%"], seed);
            (0..200)
                .map(|_| f.pick(Target::SensuUpgrade, None).is_some())
                .collect::<Vec<_>>()
        };
        let a = run(7);
        assert_eq!(a, run(7));
        assert_ne!(a, run(8));
        let hits = a.iter().filter(|h| **h).count();
        assert!((40..=80).contains(&hits), "{hits} of 200 at 30%");
    }

    #[tokio::test(start_paused = true)]
    async fn max_caps_the_count_and_windows_follow_the_clock() {
        let f = faults(
            &[
                "consul.http=503@100%,max:3,path:/v1/txn",
                "consul.http=429@at:1s,for:500ms",
            ],
            1,
        );
        f.start();
        let mut codes = Vec::new();
        for _ in 0..5 {
            codes.push(
                f.pick(Target::ConsulHttp, Some("/v1/txn"))
                    .map(|h| h.action),
            );
        }
        assert_eq!(codes.iter().filter(|c| c.is_some()).count(), 3);
        assert!(
            f.pick(Target::ConsulHttp, Some("/v1/session/renew/x"))
                .is_none()
        );
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert_eq!(
            f.pick(Target::ConsulHttp, Some("/v1/session/renew/x"))
                .map(|h| h.action),
            Some(Action::Status(429))
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(
            f.pick(Target::ConsulHttp, Some("/v1/catalog/register"))
                .is_none()
        );
        let snap = f.snapshot();
        assert_eq!(snap.count("consul.http=503@100%,max:3,path:/v1/txn"), 3);
        assert_eq!(snap.count("consul.http=429@at:1s,for:500ms"), 1);
        assert_eq!(snap.injected, 4);
        assert_eq!(snap.faults[0].first_s, Some(0.0));
        assert_eq!(snap.faults[1].first_s, Some(1.2));
        assert_eq!(snap.faults[1].last_s, Some(1.2));
    }

    #[cfg(feature = "consul")]
    #[tokio::test(start_paused = true)]
    async fn timed_faults_give_orders_to_live_streams_at_their_times() {
        let f = faults(&["consul.subscribe=aborted@every:2s"], 3);
        f.start();
        let mut rx = f
            .orders(Target::ConsulSubscribe)
            .expect("a timed subscribe fault lists streams");
        assert!(f.orders(Target::ConsulXds).is_none(), "no xds fault");
        // Timed stream faults of consul.xds give orders of their own; its
        // response faults (units that only exist within for:) none.
        let x = faults(&["consul.xds=reset@every:2s"], 3);
        assert!(x.orders(Target::ConsulXds).is_some());
        assert!(x.orders(Target::ConsulSubscribe).is_none());
        let g = faults(&["consul.xds=garbage@every:2s,for:1s"], 3);
        assert!(g.orders(Target::ConsulXds).is_none());
        let t0 = Instant::now();
        rx.changed().await.unwrap();
        assert_eq!(t0.elapsed(), Duration::from_secs(2));
        let order = *rx.borrow_and_update();
        assert_eq!(f.obey(order), Some(Action::Aborted));
        rx.changed().await.unwrap();
        assert_eq!(t0.elapsed(), Duration::from_secs(4));
        f.stop();
        assert_eq!(f.snapshot().injected, 1, "counted per stream that obeyed");
    }

    #[test]
    fn garbage_is_no_frame() {
        let g = garbage(9, 64);
        assert_eq!(g.len(), 64);
        assert!(!g.contains(&b'\n'));
        assert_eq!(g[0], 0x07);
    }
}
