//! The propagation probe: how long a catalog (or intentions) change takes
//! to reach every agent's view, measured on one clock.
//!
//! - [`ProbeBoard`] (shared by every agent of the process): the runner arms
//!   probe `k` with what to expect *before* making the change; an agent whose
//!   view receives the matching change pushes its arrival instant, once.
//! - [`ProbeRunner`]: makes a change every `every` (catalog: alternately
//!   deregister / re-register the controller's own instance of a shared
//!   upstream; intentions: flip a `service-intentions` source between allow
//!   and deny), takes T0 when the HTTP call returns, and after `timeout`
//!   turns the arrivals into a [`ProbeSummary`] with exact percentiles.
//!   Missing deliveries stay visible as `delivered < expected`.
//! - [`ProbeObserver`] (every other process of a sharded run, where
//!   `controller == false`): its board is in observe mode — agents report
//!   every live change of the probe instance (or source), keyed by the raft
//!   index of its event, which every subscriber of every process sees alike.
//!   Arrivals are grouped by that index; each group becomes a
//!   [`ProbeSummary`] with role `observer`: latencies after this process's
//!   first arrival plus that arrival's wall-clock time, which `agent-sim
//!   report merge` shifts onto the controller's T0 (see
//!   [`agent_sim_metrics::merge`]). The controller's own entries carry the
//!   raft index and T0 as unix µs for that join.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use ::http::Method;
use agent_sim_metrics::summary::{ROLE_CONTROLLER, ROLE_OBSERVER, unix_us};
use agent_sim_metrics::{LatencySummary, Metrics, ProbeSummary, new_latency_histogram};
use bytes::Bytes;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::codec::instance_key;
use crate::config::ProbeKind;
use crate::http::{self, HttpApi, PROBE_NODE, PROBE_SOURCE};
use crate::view::{Change, View, source_key};

/// What the armed probe expects an agent to see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Expect {
    /// The probe instance appears.
    Register = 1,
    /// The probe instance disappears.
    Deregister = 2,
    /// The probe source becomes `allow`.
    Allow = 3,
    /// The probe source becomes `deny`.
    Deny = 4,
}

impl Expect {
    /// `ProbeSummary::kind` of a change with this outcome.
    pub fn kind_name(self) -> &'static str {
        match self {
            Expect::Register => "register",
            Expect::Deregister => "deregister",
            Expect::Allow | Expect::Deny => "intentions",
        }
    }

    /// Inverse of `self as u8` (0 and unknown values: `None`).
    pub fn from_u8(v: u8) -> Option<Expect> {
        match v {
            1 => Some(Expect::Register),
            2 => Some(Expect::Deregister),
            3 => Some(Expect::Allow),
            4 => Some(Expect::Deny),
            _ => None,
        }
    }
}

#[derive(Debug, Default)]
struct Arrivals {
    id: u64,
    /// Arrival instant and raft index of the event (0: arrived by a re-sync
    /// snapshot, index unknown).
    at: Vec<(Instant, u64)>,
}

/// Arrivals of one change seen by an observer, keyed by raft index.
#[derive(Debug)]
struct Group {
    kind: Expect,
    /// Probe subscriptions live when the change first arrived here.
    expected: u64,
    at: Vec<Instant>,
    /// (monotonic, wall clock) read together when the group was opened.
    anchor: (Instant, SystemTime),
}

/// What an observer board collects.
#[derive(Debug, Default)]
struct Observed {
    open: BTreeMap<u64, Group>,
    done: Vec<ProbeSummary>,
    /// Groups still inside their window with missing deliveries when the
    /// board closed.
    interrupted: u64,
    closed: bool,
}

/// Shared between the runner (or observer) and every agent of the process.
#[derive(Debug)]
pub struct ProbeBoard {
    kind: ProbeKind,
    service: String,
    target: u64,
    armed: AtomicU64,
    expect: AtomicU8,
    live: AtomicI64,
    arrivals: Mutex<Arrivals>,
    /// `Some` in observe mode (this process is not the controller), with the
    /// delivery window.
    observer: Option<(Mutex<Observed>, Duration)>,
}

impl ProbeBoard {
    /// A controller's board for probes of `kind` on `service`; `prefix`
    /// names the controller's probe instance.
    pub fn new(kind: ProbeKind, service: &str, prefix: &str) -> Self {
        let target = match kind {
            ProbeKind::Catalog => instance_key(PROBE_NODE, &http::probe_instance_id(prefix)),
            ProbeKind::Intentions => source_key(PROBE_SOURCE),
        };
        ProbeBoard {
            kind,
            service: service.to_owned(),
            target,
            armed: AtomicU64::new(0),
            expect: AtomicU8::new(0),
            live: AtomicI64::new(0),
            arrivals: Mutex::new(Arrivals::default()),
            observer: None,
        }
    }

    /// An observer's board: the same probe instance (derived from the same
    /// `prefix`, as every shard of a run shares it), no arming; arrivals
    /// later than `timeout` after this process's first arrival of a change
    /// count as missing.
    pub fn new_observer(kind: ProbeKind, service: &str, prefix: &str, timeout: Duration) -> Self {
        ProbeBoard {
            observer: Some((Mutex::new(Observed::default()), timeout)),
            ..ProbeBoard::new(kind, service, prefix)
        }
    }

    /// Whether this board observes (the process is not the controller).
    pub fn is_observer(&self) -> bool {
        self.observer.is_some()
    }

    /// Probe kind.
    pub fn kind(&self) -> ProbeKind {
        self.kind
    }

    /// The probed service.
    pub fn service(&self) -> &str {
        &self.service
    }

    /// Key of the probe instance (catalog) or probe source (intentions).
    pub fn target(&self) -> u64 {
        self.target
    }

    /// An agent's probe subscription went live.
    pub fn sub_up(&self) {
        self.live.fetch_add(1, Ordering::Relaxed);
    }

    /// An agent's probe subscription stopped.
    pub fn sub_down(&self) {
        self.live.fetch_sub(1, Ordering::Relaxed);
    }

    /// Agents whose probe subscription is live now.
    pub fn live(&self) -> u64 {
        self.live.load(Ordering::Relaxed).max(0) as u64
    }

    /// The armed probe, if any.
    pub fn armed(&self) -> Option<(u64, Expect)> {
        let id = self.armed.load(Ordering::Acquire);
        if id == 0 {
            return None;
        }
        Expect::from_u8(self.expect.load(Ordering::Acquire)).map(|e| (id, e))
    }

    /// Arms probe `id` (> 0): arrivals from now on count for it.
    pub fn arm(&self, id: u64, expect: Expect, capacity: usize) {
        {
            let mut a = self.arrivals.lock().unwrap_or_else(|p| p.into_inner());
            a.id = id;
            a.at = Vec::with_capacity(capacity);
        }
        self.expect.store(expect as u8, Ordering::Release);
        self.armed.store(id, Ordering::Release);
    }

    /// Disarms and returns the arrivals of the armed probe (instant, raft
    /// index or 0).
    pub fn disarm(&self) -> Vec<(Instant, u64)> {
        self.armed.store(0, Ordering::Release);
        let mut a = self.arrivals.lock().unwrap_or_else(|p| p.into_inner());
        a.id = 0;
        std::mem::take(&mut a.at)
    }

    /// Records an arrival for probe `id` with the raft index of its event
    /// (0 when it came by a re-sync snapshot); false if that probe is no
    /// longer armed.
    pub fn arrive(&self, id: u64, at: Instant, index: u64) -> bool {
        let mut a = self.arrivals.lock().unwrap_or_else(|p| p.into_inner());
        if a.id != id {
            return false;
        }
        a.at.push((at, index));
        true
    }

    /// Observe mode: the outcome of `change` (a change on the probe
    /// subscription) if it is a live change of the probe instance / source.
    pub fn observes(&self, change: &Change) -> Option<Expect> {
        self.observer.as_ref()?;
        match *change {
            Change::Register {
                key,
                snapshot: false,
            } if key == self.target => Some(Expect::Register),
            Change::Deregister { key } if key == self.target => Some(Expect::Deregister),
            Change::Intention {
                source,
                allow: Some(a),
                snapshot: false,
            } if source == self.target => Some(if a { Expect::Allow } else { Expect::Deny }),
            _ => None,
        }
    }

    /// The state of the probe instance / source in `view`, as the outcome of
    /// the change that led there (`None`: no intention for the source).
    pub fn state(&self, view: &View) -> Option<Expect> {
        match self.kind {
            ProbeKind::Catalog => Some(if view.instance(self.target).is_some() {
                Expect::Register
            } else {
                Expect::Deregister
            }),
            ProbeKind::Intentions => view
                .intention(self.target)
                .map(|a| if a { Expect::Allow } else { Expect::Deny }),
        }
    }

    /// Observe mode: an agent's view received the change of raft `index`
    /// with outcome `kind` at `at`. False when not observing or closed, or
    /// when the change's window here is over (a missing delivery).
    pub fn observe(&self, index: u64, kind: Expect, at: Instant) -> bool {
        let Some((obs, timeout)) = &self.observer else {
            return false;
        };
        let mut o = obs.lock().unwrap_or_else(|p| p.into_inner());
        if o.closed {
            return false;
        }
        let now = Instant::now();
        if !o.open.contains_key(&index) {
            if o.done.iter().any(|d| d.change_id == Some(index)) {
                // Its window is over and summarized: a missing delivery.
                return false;
            }
            // A new change: the windows of earlier ones are over by now,
            // unless changes come faster than the timeout.
            let over: Vec<u64> = o
                .open
                .iter()
                .filter(|(_, g)| g.anchor.0 + *timeout <= now)
                .map(|(&i, _)| i)
                .collect();
            for i in over {
                if let Some(g) = o.open.remove(&i) {
                    o.done.push(observed_summary(i, g, *timeout));
                }
            }
            let expected = self.live();
            o.open.insert(
                index,
                Group {
                    kind,
                    expected,
                    at: Vec::with_capacity(expected as usize),
                    anchor: (now, SystemTime::now()),
                },
            );
        }
        let g = o.open.get_mut(&index).expect("inserted above");
        if g.kind != kind {
            // Not the same change (cannot happen with one raft index).
            return false;
        }
        g.at.push(at);
        true
    }

    /// Observe mode: a re-synced view (complete snapshot after a reset) is
    /// in state `kind`, unlike before the reset: the change arrived by the
    /// snapshot. It is credited to the open change of that outcome with the
    /// greatest raft index in `(after, upto]` (`after`: last index this
    /// subscription recorded; `upto`: the snapshot's index); with none, it
    /// is not counted (a missing delivery here).
    pub fn observe_resync(&self, after: u64, upto: u64, kind: Expect, at: Instant) -> bool {
        let Some((obs, _)) = &self.observer else {
            return false;
        };
        let mut o = obs.lock().unwrap_or_else(|p| p.into_inner());
        if o.closed {
            return false;
        }
        match o
            .open
            .range_mut(after.saturating_add(1)..=upto)
            .rev()
            .find(|(_, g)| g.kind == kind)
        {
            Some((_, g)) => {
                g.at.push(at);
                true
            }
            None => false,
        }
    }

    /// Observe mode: stops accepting arrivals and returns every observed
    /// change, in raft-index order. A change still inside its window with
    /// missing deliveries is left out and counted (like the controller's
    /// interrupted probe); the count is returned too.
    pub fn close_observer(&self) -> (Vec<ProbeSummary>, u64) {
        let Some((obs, timeout)) = &self.observer else {
            return (Vec::new(), 0);
        };
        let mut o = obs.lock().unwrap_or_else(|p| p.into_inner());
        o.closed = true;
        let now = Instant::now();
        for (i, g) in std::mem::take(&mut o.open) {
            if g.anchor.0 + *timeout > now && (g.at.len() as u64) < g.expected {
                o.interrupted += 1;
                continue;
            }
            o.done.push(observed_summary(i, g, *timeout));
        }
        let mut done = std::mem::take(&mut o.done);
        done.sort_by_key(|d| d.change_id);
        (done, std::mem::take(&mut o.interrupted))
    }

    /// The armed probe id if `change` (a live change on the probe
    /// subscription) is the one it expects.
    pub fn matches(&self, change: &Change) -> Option<u64> {
        let (id, expect) = self.armed()?;
        let hit = match (*change, expect) {
            (
                Change::Register {
                    key,
                    snapshot: false,
                },
                Expect::Register,
            ) => key == self.target,
            (Change::Deregister { key }, Expect::Deregister) => key == self.target,
            (
                Change::Intention {
                    source,
                    allow: Some(a),
                    snapshot: false,
                },
                Expect::Allow | Expect::Deny,
            ) => source == self.target && a == (expect == Expect::Allow),
            _ => false,
        };
        hit.then_some(id)
    }

    /// The armed probe id if a freshly re-synced `view` (complete snapshot
    /// after a reset) is in the expected state.
    pub fn matches_state(&self, view: &View) -> Option<u64> {
        let (id, expect) = self.armed()?;
        let hit = match expect {
            Expect::Register => view.instance(self.target).is_some(),
            Expect::Deregister => view.instance(self.target).is_none(),
            Expect::Allow => view.intention(self.target) == Some(true),
            Expect::Deny => view.intention(self.target) == Some(false),
        };
        hit.then_some(id)
    }
}

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Builds the summary of one probe from exact latencies (µs after T0).
/// Latencies above `timeout_us` are missing deliveries and dropped.
pub fn summarize(
    id: u64,
    kind: &str,
    t0: SystemTime,
    expected: u64,
    mut latencies_us: Vec<u64>,
    timeout_us: u64,
) -> ProbeSummary {
    latencies_us.retain(|&l| l <= timeout_us);
    latencies_us.sort_unstable();
    let mut h = new_latency_histogram();
    for &l in &latencies_us {
        let _ = h.record(l.min(agent_sim_metrics::LATENCY_MAX_US));
    }
    let mut latency = LatencySummary::from_histogram(&h);
    if !latencies_us.is_empty() {
        let s = &latencies_us;
        latency.min = s[0];
        latency.max = s[s.len() - 1];
        latency.p50 = percentile(s, 0.50);
        latency.p75 = percentile(s, 0.75);
        latency.p90 = percentile(s, 0.90);
        latency.p95 = percentile(s, 0.95);
        latency.p99 = percentile(s, 0.99);
        latency.p999 = percentile(s, 0.999);
        latency.mean = s.iter().map(|&v| v as f64).sum::<f64>() / s.len() as f64;
    }
    let delivered = latencies_us.len() as u64;
    let time_to_99pct_us = if expected == 0 {
        None
    } else {
        let need = ((expected as f64) * 0.99).ceil().max(1.0) as usize;
        latencies_us.get(need - 1).copied()
    };
    ProbeSummary {
        id,
        kind: kind.to_owned(),
        t0: agent_sim_metrics::summary::rfc3339(t0),
        delivered,
        expected,
        time_to_99pct_us,
        latency_us: latency,
        ..ProbeSummary::default()
    }
}

/// The observer's summary of one change: latencies after this process's
/// first arrival, whose wall-clock time is derived from the group's anchor
/// (one monotonic clock inside the process, one wall-clock reading).
fn observed_summary(raft_index: u64, g: Group, timeout: Duration) -> ProbeSummary {
    let first = g.at.iter().copied().min().unwrap_or(g.anchor.0);
    let lat: Vec<u64> = g.at.iter().map(|&a| micros_after(first, a)).collect();
    let timeout_us = u64::try_from(timeout.as_micros()).unwrap_or(u64::MAX);
    let (anchor, anchor_wall) = g.anchor;
    let first_wall = if first >= anchor {
        anchor_wall + (first - anchor)
    } else {
        anchor_wall
            .checked_sub(anchor - first)
            .unwrap_or(SystemTime::UNIX_EPOCH)
    };
    let mut s = summarize(
        0,
        g.kind.kind_name(),
        first_wall,
        g.expected,
        lat,
        timeout_us,
    );
    // No T0 is known here: the controller's entry has it.
    s.t0 = String::new();
    s.change_id = Some(raft_index);
    s.role = Some(ROLE_OBSERVER.into());
    s.first_arrival_unix_us = Some(unix_us(first_wall));
    s
}

/// The raft index most arrivals carried (ties: the smaller; 0s ignored).
pub fn common_index(arrivals: &[(Instant, u64)]) -> Option<u64> {
    let mut counts: BTreeMap<u64, u64> = BTreeMap::new();
    for &(_, i) in arrivals {
        if i > 0 {
            *counts.entry(i).or_insert(0) += 1;
        }
    }
    counts
        .into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
        .map(|(i, _)| i)
}

/// Observes the probe changes another process makes (see the module docs).
pub struct ProbeObserver {
    pub(crate) board: Arc<ProbeBoard>,
    pub(crate) metrics: Metrics,
}

impl std::fmt::Debug for ProbeObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeObserver")
            .field("kind", &self.board.kind)
            .field("service", &self.board.service)
            .finish()
    }
}

impl ProbeObserver {
    /// Waits for `cancel` (the end of the run), then [`Self::finish`]es.
    pub async fn run(self, cancel: CancellationToken) -> Vec<ProbeSummary> {
        cancel.cancelled().await;
        self.finish()
    }

    /// Stops observing and returns one summary (role `observer`) per change
    /// seen, in raft-index order; changes cut short by the end of the run
    /// with missing deliveries are counted in `probes_interrupted` instead.
    pub fn finish(&self) -> Vec<ProbeSummary> {
        let (done, interrupted) = self.board.close_observer();
        if interrupted > 0 {
            self.metrics.add(
                self.metrics.counter(crate::names::PROBES_INTERRUPTED),
                interrupted,
            );
        }
        done
    }
}

/// Microseconds from `t0` to `at` (0 when `at` is earlier).
pub fn micros_after(t0: Instant, at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(t0).as_micros()).unwrap_or(u64::MAX)
}

/// Makes the probe changes and measures them (see the module docs).
pub struct ProbeRunner {
    pub(crate) board: Arc<ProbeBoard>,
    pub(crate) http: Arc<HttpApi>,
    pub(crate) metrics: Metrics,
    pub(crate) every: Duration,
    pub(crate) timeout: Duration,
    pub(crate) instance_id: String,
    pub(crate) keep: bool,
}

impl std::fmt::Debug for ProbeRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeRunner")
            .field("kind", &self.board.kind)
            .field("service", &self.board.service)
            .field("every", &self.every)
            .finish()
    }
}

enum Setup {
    Pending,
    /// Catalog: whether the instance is registered now; intentions: whether
    /// the source is `allow` now.
    Done(bool),
}

impl ProbeRunner {
    /// Runs a probe every `every` until `cancel`; returns every finished
    /// probe. One still inside its timeout at cancel is reported with what
    /// arrived if every expected subscriber had it, and otherwise counted in
    /// `probes_interrupted` and left out.
    pub async fn run(self, cancel: CancellationToken) -> Vec<ProbeSummary> {
        let mut out = Vec::new();
        let start = Instant::now();
        let mut state = Setup::Pending;
        self.setup(&mut state).await;
        let propagation = self.metrics.latency("propagation");
        let mut next_id = 1u64;
        for k in 1u32.. {
            let due = start + self.every * k;
            tokio::select! {
                _ = tokio::time::sleep_until(due) => {}
                _ = cancel.cancelled() => break,
            }
            if matches!(state, Setup::Pending) {
                self.setup(&mut state).await;
            }
            let Setup::Done(on) = state else { continue };
            let (expect, kind) = match (self.board.kind, on) {
                (ProbeKind::Catalog, true) => (Expect::Deregister, "deregister"),
                (ProbeKind::Catalog, false) => (Expect::Register, "register"),
                (ProbeKind::Intentions, true) => (Expect::Deny, "intentions"),
                (ProbeKind::Intentions, false) => (Expect::Allow, "intentions"),
            };
            let id = next_id;
            next_id += 1;
            let capacity = self.board.live() as usize;
            self.board.arm(id, expect, capacity);
            if let Err(e) = self.change(expect).await {
                self.metrics.error(e.kind);
                self.board.disarm();
                continue;
            }
            let t0 = Instant::now();
            let t0_wall = SystemTime::now();
            let expected = self.board.live();
            state = Setup::Done(!on);
            let interrupted = tokio::select! {
                _ = tokio::time::sleep_until(t0 + self.timeout) => false,
                _ = cancel.cancelled() => true,
            };
            let arrivals = self.board.disarm();
            if interrupted && (arrivals.len() as u64) < expected {
                // The run ended inside this probe's window while agents were
                // closing: its figures would be wrong, so it is counted, not
                // reported.
                self.metrics
                    .incr(self.metrics.counter(crate::names::PROBES_INTERRUPTED));
                break;
            }
            let lat: Vec<u64> = arrivals.iter().map(|&(a, _)| micros_after(t0, a)).collect();
            let timeout_us = u64::try_from(self.timeout.as_micros()).unwrap_or(u64::MAX);
            for (i, &l) in lat.iter().enumerate() {
                if l <= timeout_us {
                    self.metrics.record_us(propagation, i, l);
                }
            }
            let mut summary = summarize(id, kind, t0_wall, expected, lat, timeout_us);
            summary.change_id = common_index(&arrivals);
            summary.role = Some(ROLE_CONTROLLER.into());
            summary.t0_unix_us = Some(unix_us(t0_wall));
            out.push(summary);
            if cancel.is_cancelled() {
                break;
            }
        }
        if !self.keep {
            let _ = tokio::time::timeout(Duration::from_secs(3), self.cleanup()).await;
        }
        out
    }

    async fn setup(&self, state: &mut Setup) {
        let r = match self.board.kind {
            ProbeKind::Catalog => self.change(Expect::Register).await,
            ProbeKind::Intentions => self.change(Expect::Allow).await,
        };
        match r {
            Ok(()) => *state = Setup::Done(true),
            Err(e) => self.metrics.error(e.kind),
        }
    }

    async fn change(&self, expect: Expect) -> Result<(), http::HttpError> {
        let svc = &self.board.service;
        let (path, body) = match expect {
            Expect::Register => (
                "/v1/catalog/register",
                http::probe_register_body(svc, &self.instance_id),
            ),
            Expect::Deregister => (
                "/v1/catalog/deregister",
                http::probe_deregister_body(&self.instance_id),
            ),
            Expect::Allow => ("/v1/config", http::intentions_body(svc, true)),
            Expect::Deny => ("/v1/config", http::intentions_body(svc, false)),
        };
        self.http.put(path, Bytes::from(body)).await.map(|_| ())
    }

    async fn cleanup(&self) {
        let r = match self.board.kind {
            ProbeKind::Catalog => self.change(Expect::Deregister).await,
            ProbeKind::Intentions => {
                let path = format!("/v1/config/service-intentions/{}", self.board.service);
                self.http
                    .call(Method::DELETE, &path, Bytes::new())
                    .await
                    .map(|_| ())
            }
        };
        if let Err(e) = r {
            self.metrics.error(e.kind);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_percentiles_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), 50);
        assert_eq!(percentile(&v, 0.99), 99);
        assert_eq!(percentile(&v, 0.999), 100);
        assert_eq!(percentile(&v, 0.0), 1);
        assert_eq!(percentile(&[], 0.5), 0);
    }

    #[test]
    fn summary_is_exact_and_reports_missing() {
        // 200 expected, 198 delivered in time, one late, one never.
        let mut lat: Vec<u64> = (0..198).map(|i| 1_000 + i * 1_001).collect();
        lat.push(20_000_000); // after the 10 s timeout: missing
        lat.reverse();
        let s = summarize(
            7,
            "deregister",
            SystemTime::UNIX_EPOCH,
            200,
            lat,
            10_000_000,
        );
        assert_eq!(s.id, 7);
        assert_eq!(s.kind, "deregister");
        assert_eq!(s.t0, "1970-01-01T00:00:00.000Z");
        assert_eq!(s.delivered, 198);
        assert_eq!(s.expected, 200);
        // 99 % of 200 = 198 → the 198th arrival.
        assert_eq!(s.time_to_99pct_us, Some(1_000 + 197 * 1_001));
        assert_eq!(s.latency_us.count, 198);
        assert_eq!(s.latency_us.min, 1_000);
        assert_eq!(s.latency_us.max, 1_000 + 197 * 1_001);
        assert_eq!(s.latency_us.p50, 1_000 + 98 * 1_001);
        assert!(!s.latency_us.hdr.is_empty());
    }

    #[test]
    fn time_to_99pct_needs_enough_deliveries() {
        let s = summarize(
            1,
            "register",
            SystemTime::UNIX_EPOCH,
            200,
            vec![5; 197],
            1_000,
        );
        assert_eq!(s.delivered, 197);
        assert_eq!(s.time_to_99pct_us, None);
        let s = summarize(1, "register", SystemTime::UNIX_EPOCH, 0, vec![], 1_000);
        assert_eq!(s.time_to_99pct_us, None);
        assert_eq!(s.latency_us.count, 0);
        let s = summarize(1, "register", SystemTime::UNIX_EPOCH, 1, vec![0], 1_000);
        assert_eq!(s.time_to_99pct_us, Some(0));
        assert_eq!(s.latency_us.p99, 0);
    }

    #[test]
    fn early_arrivals_count_as_zero() {
        let t0 = Instant::now();
        let before = t0 - Duration::from_millis(3);
        assert_eq!(micros_after(t0, before), 0);
        assert_eq!(micros_after(t0, t0 + Duration::from_millis(2)), 2_000);
    }

    #[test]
    fn board_matches_only_the_armed_expectation_once_per_probe() {
        let b = ProbeBoard::new(ProbeKind::Catalog, "web", "agent-sim");
        let key = b.target();
        assert_eq!(
            key,
            instance_key("agent-sim-probe", "agent-sim-probe-agent-sim")
        );
        let dereg = Change::Deregister { key };
        assert_eq!(b.matches(&dereg), None, "not armed");
        b.arm(1, Expect::Deregister, 4);
        assert_eq!(b.matches(&dereg), Some(1));
        assert_eq!(b.matches(&Change::Deregister { key: key ^ 1 }), None);
        assert_eq!(
            b.matches(&Change::Register {
                key,
                snapshot: false
            }),
            None
        );
        let now = Instant::now();
        assert!(b.arrive(1, now, 41));
        assert!(!b.arrive(2, now, 41));
        assert_eq!(b.disarm(), vec![(now, 41)]);
        assert!(!b.arrive(1, now, 41), "disarmed");
        assert!(!b.observe(41, Expect::Deregister, now), "not an observer");
        assert_eq!(b.observes(&dereg), None);
        b.arm(2, Expect::Register, 0);
        assert_eq!(
            b.matches(&Change::Register {
                key,
                snapshot: true
            }),
            None,
            "snapshot items are checked with matches_state"
        );
        let mut view = View::new(crate::view::ViewKind::Health);
        assert_eq!(b.matches_state(&view), None);
        view.reset();
        b.arm(3, Expect::Deregister, 0);
        assert_eq!(b.matches_state(&view), Some(3));
    }

    #[test]
    fn common_index_is_the_most_frequent_known_one() {
        let t = Instant::now();
        assert_eq!(common_index(&[]), None);
        assert_eq!(common_index(&[(t, 0), (t, 0)]), None);
        assert_eq!(common_index(&[(t, 9), (t, 0), (t, 7), (t, 9)]), Some(9));
        assert_eq!(common_index(&[(t, 9), (t, 7)]), Some(7), "tie: smaller");
    }

    fn observer(timeout: Duration) -> ProbeBoard {
        let b = ProbeBoard::new_observer(ProbeKind::Catalog, "web", "agent-sim", timeout);
        for _ in 0..4 {
            b.sub_up();
        }
        b
    }

    #[test]
    fn observer_sees_live_changes_of_the_derived_probe_instance_only() {
        let b = observer(Duration::from_secs(1));
        assert!(b.is_observer());
        // Same instance as the controller's board of the same prefix.
        assert_eq!(
            b.target(),
            ProbeBoard::new(ProbeKind::Catalog, "web", "agent-sim").target()
        );
        let key = b.target();
        assert_eq!(
            b.observes(&Change::Deregister { key }),
            Some(Expect::Deregister)
        );
        assert_eq!(
            b.observes(&Change::Register {
                key,
                snapshot: false
            }),
            Some(Expect::Register)
        );
        assert_eq!(
            b.observes(&Change::Register {
                key,
                snapshot: true
            }),
            None
        );
        assert_eq!(b.observes(&Change::Deregister { key: key ^ 1 }), None);
        assert_eq!(b.matches(&Change::Deregister { key }), None, "never armed");
        let i = ProbeBoard::new_observer(ProbeKind::Intentions, "web", "x", Duration::ZERO);
        let source = i.target();
        let allow = |a| Change::Intention {
            source,
            allow: Some(a),
            snapshot: false,
        };
        assert_eq!(i.observes(&allow(false)), Some(Expect::Deny));
        assert_eq!(i.observes(&allow(true)), Some(Expect::Allow));
        assert_eq!(Expect::Deny.kind_name(), "intentions");
    }

    #[test]
    fn observer_groups_arrivals_by_raft_index() {
        let b = observer(Duration::from_millis(500));
        let t = Instant::now();
        let ms = Duration::from_millis;
        // Change at index 10 (deregister): 3 of 4 agents, recorded out of
        // order; one arrival after the 500 ms window (missing).
        assert!(b.observe(10, Expect::Deregister, t + ms(5)));
        assert!(b.observe(10, Expect::Deregister, t + ms(2)));
        assert!(b.observe(10, Expect::Deregister, t + ms(9)));
        assert!(b.observe(10, Expect::Deregister, t + ms(900)));
        assert!(
            !b.observe(10, Expect::Register, t),
            "one index, one outcome"
        );
        // Change at index 12 (register): all 4, one of them by a re-sync.
        for k in 0..3 {
            assert!(b.observe(12, Expect::Register, t + ms(1_000 + k)));
        }
        assert!(
            !b.observe_resync(12, 20, Expect::Register, t + ms(1_010)),
            "already had index 12"
        );
        assert!(
            !b.observe_resync(10, 20, Expect::Deregister, t),
            "no open deregister in (10, 20]"
        );
        assert!(b.observe_resync(10, 20, Expect::Register, t + ms(1_010)));
        let (done, interrupted) = b.close_observer();
        assert_eq!(interrupted, 0);
        assert!(!b.observe(14, Expect::Deregister, t), "closed");
        assert_eq!(done.len(), 2);
        let (d, r) = (&done[0], &done[1]);
        assert_eq!(d.change_id, Some(10));
        assert_eq!(d.kind, "deregister");
        assert_eq!(d.role.as_deref(), Some("observer"));
        assert_eq!((d.id, d.t0.as_str(), d.t0_unix_us), (0, "", None));
        assert_eq!((d.delivered, d.expected), (3, 4));
        assert_eq!(d.latency_us.min, 0, "after the first arrival");
        assert_eq!(d.latency_us.max, 7_000);
        assert_eq!(d.time_to_99pct_us, None);
        assert_eq!(r.change_id, Some(12));
        assert_eq!(
            (r.kind.as_str(), r.delivered, r.expected),
            ("register", 4, 4)
        );
        assert_eq!(r.latency_us.max, 10_000);
        assert_eq!(r.time_to_99pct_us, Some(10_000));
        // First arrivals in wall-clock time keep their monotonic distance.
        let (fd, fr) = (
            d.first_arrival_unix_us.unwrap(),
            r.first_arrival_unix_us.unwrap(),
        );
        let now = unix_us(SystemTime::now());
        assert!(fd <= now && now - fd < 10_000_000, "{fd} vs {now}");
        assert!((fr - fd).abs_diff(998_000) <= 1_000, "{}", fr - fd);
    }

    #[test]
    fn observer_leaves_out_a_change_cut_short_with_missing_deliveries() {
        let b = observer(Duration::from_secs(60));
        let t = Instant::now();
        assert!(b.observe(5, Expect::Deregister, t));
        for _ in 0..4 {
            assert!(b.observe(6, Expect::Register, t));
        }
        // Both windows are open: 6 is complete (kept), 5 is not (counted).
        let (done, interrupted) = b.close_observer();
        assert_eq!(interrupted, 1);
        assert_eq!(done.len(), 1);
        assert_eq!((done[0].change_id, done[0].delivered), (Some(6), 4));
    }
}
