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

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use ::http::Method;
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
    fn from_u8(v: u8) -> Option<Expect> {
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
    at: Vec<Instant>,
}

/// Shared between the runner and every agent of the process.
#[derive(Debug)]
pub struct ProbeBoard {
    kind: ProbeKind,
    service: String,
    target: u64,
    armed: AtomicU64,
    expect: AtomicU8,
    live: AtomicI64,
    arrivals: Mutex<Arrivals>,
}

impl ProbeBoard {
    /// A board for probes of `kind` on `service`; `prefix` names the
    /// controller's probe instance.
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
        }
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

    /// Disarms and returns the arrivals of the armed probe.
    pub fn disarm(&self) -> Vec<Instant> {
        self.armed.store(0, Ordering::Release);
        let mut a = self.arrivals.lock().unwrap_or_else(|p| p.into_inner());
        a.id = 0;
        std::mem::take(&mut a.at)
    }

    /// Records an arrival for probe `id`; false if that probe is no longer armed.
    pub fn arrive(&self, id: u64, at: Instant) -> bool {
        let mut a = self.arrivals.lock().unwrap_or_else(|p| p.into_inner());
        if a.id != id {
            return false;
        }
        a.at.push(at);
        true
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
            let lat: Vec<u64> = arrivals.iter().map(|&a| micros_after(t0, a)).collect();
            let timeout_us = u64::try_from(self.timeout.as_micros()).unwrap_or(u64::MAX);
            for (i, &l) in lat.iter().enumerate() {
                if l <= timeout_us {
                    self.metrics.record_us(propagation, i, l);
                }
            }
            out.push(summarize(id, kind, t0_wall, expected, lat, timeout_us));
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
        assert!(b.arrive(1, now));
        assert!(!b.arrive(2, now));
        assert_eq!(b.disarm(), vec![now]);
        assert!(!b.arrive(1, now), "disarmed");
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
}
