//! Disruptions and how the fleet reconverged after each: the `disruptions`
//! array of the summary, its live form for progress and `/metrics`, its
//! table section and its exact merge across shards.
//!
//! A disruption is one moment that cost the fleet sessions: scenario-made
//! (`storm`, `churn`, `pause`, `max_session_length`; a ramp-down is not
//! one) or the backend's own (`backend`: a restart or failover the engine
//! detected from many sessions lost at once). The engine ([`DisruptionLog`]
//! is fed by `agent-sim-fleet`) attributes each lost session to at most one
//! disruption and records, per session, the time from its loss until the
//! agent was in steady state again (`reconnect_us`) and the time from the
//! disruption's start until then (`back_at_us`); `back_after_s` are the
//! times by which 50/90/99/100 % of the lost sessions were back, ranked
//! against `sessions_lost` (so `null` when fewer came back).
//!
//! Memory: two HDR histograms per disruption (~190 KiB each), so at most
//! [`MAX_DISRUPTIONS`] are kept per run; later ones are counted in
//! [`DisruptionLog::refused`] and not reported.
//!
//! What it is not: the detection rule or the scenarios (see the fleet
//! crate); nothing here knows a protocol (Consul's snapshots and resumes
//! are generic [`Resync`] notes).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;

use crate::histo::{add_shifted, value_at_rank};
use crate::summary::LatencySummary;
pub use crate::summary::{BackAfter, DisruptionSummary};
use crate::units::fmt_us;
use crate::{MetricsError, new_latency_histogram};

/// Cause of a disruption the engine detected (a restart or failover of the
/// backend).
pub const CAUSE_BACKEND: &str = "backend";

/// Most disruptions kept per run (see the module doc).
pub const MAX_DISRUPTIONS: usize = 64;

/// Detected disruptions of several shards whose starts are at most this
/// far apart are one disruption in a merge.
pub const MERGE_WINDOW_S: f64 = 2.0;

/// Handle of an open disruption.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DisruptionId(u32);

/// How an agent's state came back after a reconnect (what Consul calls a
/// new snapshot, a resumed stream, or a stream resumed silently).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resync {
    /// The server sent the whole state again.
    Snapshot,
    /// The server resumed where the agent left off.
    Resume,
    /// Resumed with nothing to send (taken as live once the server answered).
    ResumeSilent,
}

/// `back_after_s` from the histogram of times since the start and the
/// number of sessions lost.
pub fn back_after(back_at: &Histogram<u64>, lost: u64) -> BackAfter {
    let at = |q: u64| {
        // Rank q % of `lost`, rounded up (100 % is every one).
        let rank = (lost * q).div_ceil(100).max(1);
        value_at_rank(back_at, rank).map(|us| us as f64 / 1e6)
    };
    if lost == 0 {
        return BackAfter::default();
    }
    BackAfter {
        p50: at(50),
        p90: at(90),
        p99: at(99),
        p100: at(100),
    }
}

struct Record {
    cause: &'static str,
    fleet: &'static str,
    began: Duration,
    lost: u64,
    back: u64,
    attempts: u64,
    snapshots: u64,
    resumes: u64,
    resumes_silent: u64,
    reconnect: Histogram<u64>,
    back_at: Histogram<u64>,
    missing: BTreeMap<&'static str, u64>,
    note: Option<String>,
}

/// A disruption as it stands while the run goes on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveDisruption {
    /// Its cause.
    pub cause: &'static str,
    /// The fleet it hit.
    pub fleet: &'static str,
    /// When it began (from the start of the run).
    pub began: Duration,
    /// Sessions lost so far.
    pub lost: u64,
    /// Of those, back so far.
    pub back: u64,
}

/// The disruptions of a run, recorded while it goes on (one per
/// [`crate::Metrics`]; every fleet of the run feeds it).
#[derive(Default)]
pub struct DisruptionLog {
    // Bound: MAX_DISRUPTIONS records; later ones only counted (`refused`).
    records: Mutex<Vec<Record>>,
    refused: AtomicU64,
}

impl std::fmt::Debug for DisruptionLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DisruptionLog")
            .field("count", &self.lock().len())
            .finish()
    }
}

impl DisruptionLog {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Record>> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn with(&self, id: DisruptionId, f: impl FnOnce(&mut Record)) {
        if let Some(r) = self.lock().get_mut(id.0 as usize) {
            f(r);
        }
    }

    /// Opens a disruption of `fleet` that began at `began` (from the start
    /// of the run); `None` once [`MAX_DISRUPTIONS`] are open.
    pub fn open(
        &self,
        cause: &'static str,
        fleet: &'static str,
        began: Duration,
        note: Option<String>,
    ) -> Option<DisruptionId> {
        let mut r = self.lock();
        if r.len() >= MAX_DISRUPTIONS {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        r.push(Record {
            cause,
            fleet,
            began,
            lost: 0,
            back: 0,
            attempts: 0,
            snapshots: 0,
            resumes: 0,
            resumes_silent: 0,
            reconnect: new_latency_histogram(),
            back_at: new_latency_histogram(),
            missing: BTreeMap::new(),
            note,
        });
        Some(DisruptionId((r.len() - 1) as u32))
    }

    /// Disruptions not kept (over [`MAX_DISRUPTIONS`]).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// One session lost in it.
    pub fn lost(&self, id: DisruptionId) {
        self.with(id, |r| r.lost += 1);
    }

    /// A lost session is back in steady state: `reconnect` after its loss,
    /// at `at` from the start of the run, after `attempts` session attempts.
    pub fn back(&self, id: DisruptionId, reconnect: Duration, at: Duration, attempts: u64) {
        let us = |d: Duration| {
            u64::try_from(d.as_micros())
                .unwrap_or(u64::MAX)
                .clamp(crate::LATENCY_MIN_US, crate::LATENCY_MAX_US)
        };
        self.with(id, |r| {
            r.back += 1;
            r.attempts += attempts;
            let _ = r.reconnect.record(us(reconnect));
            let _ = r.back_at.record(us(at.saturating_sub(r.began)));
        });
    }

    /// How a lost agent's state came back.
    pub fn resync(&self, id: DisruptionId, how: Resync) {
        self.with(id, |r| match how {
            Resync::Snapshot => r.snapshots += 1,
            Resync::Resume => r.resumes += 1,
            Resync::ResumeSilent => r.resumes_silent += 1,
        });
    }

    /// A lost session not back at the end: the cause of its agent's last
    /// failure, and the attempts it made.
    pub fn missing(&self, id: DisruptionId, cause: &'static str, attempts: u64) {
        self.with(id, |r| {
            *r.missing.entry(cause).or_insert(0) += 1;
            r.attempts += attempts;
        });
    }

    /// Every disruption so far, oldest first.
    pub fn live(&self) -> Vec<LiveDisruption> {
        let mut v: Vec<LiveDisruption> = self
            .lock()
            .iter()
            .map(|r| LiveDisruption {
                cause: r.cause,
                fleet: r.fleet,
                began: r.began,
                lost: r.lost,
                back: r.back,
            })
            .collect();
        v.sort_by_key(|d| d.began);
        v
    }

    /// Loss → back times of every disruption, added up.
    pub fn reconnect_histogram(&self) -> Histogram<u64> {
        let mut h = new_latency_histogram();
        for r in self.lock().iter() {
            let _ = h.add(&r.reconnect);
        }
        h
    }

    /// The summary entries, in order of their start.
    pub fn summaries(&self) -> Vec<DisruptionSummary> {
        let mut out: Vec<DisruptionSummary> = self
            .lock()
            .iter()
            .map(|r| DisruptionSummary {
                id: 0,
                cause: r.cause.to_string(),
                fleet: r.fleet.to_string(),
                began_s: r.began.as_secs_f64(),
                sessions_lost: r.lost,
                back: r.back,
                back_after_s: back_after(&r.back_at, r.lost),
                reconnect_us: LatencySummary::from_histogram(&r.reconnect),
                back_at_us: LatencySummary::from_histogram(&r.back_at),
                attempts: r.attempts,
                snapshots: r.snapshots,
                resumes: r.resumes,
                resumes_silent: r.resumes_silent,
                missing_at_end: r.missing.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
                note: r.note.clone(),
            })
            .collect();
        number(&mut out);
        out
    }
}

/// Sorts by start and numbers from 1.
fn number(v: &mut [DisruptionSummary]) {
    v.sort_by(|a, b| {
        a.began_s
            .total_cmp(&b.began_s)
            .then_with(|| a.fleet.cmp(&b.fleet))
            .then_with(|| a.cause.cmp(&b.cause))
    });
    for (i, d) in v.iter_mut().enumerate() {
        d.id = i as u64 + 1;
    }
}

fn secs(v: Option<f64>) -> String {
    v.map(|s| fmt_us((s * 1e6).round() as u64))
        .unwrap_or_else(|| "never".into())
}

/// The table section of the disruptions (nothing when there were none).
pub fn render(out: &mut String, disruptions: &[DisruptionSummary]) {
    if disruptions.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "disruptions {:<22} {:>8} {:>7} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "", "began", "lost", "back", "50% at", "90% at", "99% at", "100% at", "attempts"
    );
    for d in disruptions {
        let _ = writeln!(
            out,
            "  #{:<3} {:<25} {:>8} {:>7} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9}",
            d.id,
            format!("{} ({})", d.cause, d.fleet),
            format!("{:.1}s", d.began_s),
            d.sessions_lost,
            d.back,
            secs(d.back_after_s.p50),
            secs(d.back_after_s.p90),
            secs(d.back_after_s.p99),
            secs(d.back_after_s.p100),
            d.attempts
        );
        let l = &d.reconnect_us;
        if l.count > 0 {
            let _ = writeln!(
                out,
                "        reconnect per agent: min {}  p10..p90 spread {}  p50 {}  p99 {}  max {}",
                fmt_us(l.min),
                spread(l).map(fmt_us).unwrap_or_else(|| "-".into()),
                fmt_us(l.p50),
                fmt_us(l.p99),
                fmt_us(l.max)
            );
        }
        if d.snapshots + d.resumes + d.resumes_silent > 0 {
            let _ = writeln!(
                out,
                "        resynced by snapshot {}  resumed {}  resumed silently {}",
                d.snapshots, d.resumes, d.resumes_silent
            );
        }
        if !d.missing_at_end.is_empty() {
            let causes: Vec<String> = d
                .missing_at_end
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            let _ = writeln!(out, "        missing at the end: {}", causes.join(", "));
        }
        if let Some(n) = &d.note {
            let _ = writeln!(out, "        {n}");
        }
    }
}

/// `p90 − p10` of a latency with its embedded histogram: how far apart the
/// reconnects were (the synchronized burst has almost none).
pub fn spread(l: &LatencySummary) -> Option<u64> {
    let h = l.histogram().ok()?;
    if h.is_empty() {
        return None;
    }
    Some(h.value_at_quantile(0.9) - h.value_at_quantile(0.1))
}

/// Joins the disruptions of several shards (see the module doc of
/// `merge`): a scheduled disruption is the same one in every shard (same
/// cause, fleet and start) and merges exactly; detected (`backend`) ones of
/// one fleet whose starts are within [`MERGE_WINDOW_S`] merge with their
/// `back_at_us` shifted onto the earliest start (within one HDR bucket).
/// Counts add, histograms add, `back_after_s` is recomputed.
pub fn merge(parts: &[&[DisruptionSummary]]) -> Result<Vec<DisruptionSummary>, MetricsError> {
    let mut all: Vec<(usize, &DisruptionSummary)> = parts
        .iter()
        .enumerate()
        .flat_map(|(i, p)| p.iter().map(move |d| (i, d)))
        .collect();
    all.sort_by(|a, b| a.1.began_s.total_cmp(&b.1.began_s));
    // Groups of entries that are one disruption.
    let mut groups: Vec<Vec<&DisruptionSummary>> = Vec::new();
    for (_, d) in &all {
        let joins = groups.iter_mut().find(|g| {
            let first = g[0];
            first.cause == d.cause
                && first.fleet == d.fleet
                && if d.cause == CAUSE_BACKEND {
                    d.began_s - first.began_s <= MERGE_WINDOW_S
                } else {
                    (d.began_s - first.began_s).abs() < 1e-3
                }
        });
        match joins {
            Some(g) => g.push(d),
            None => groups.push(vec![d]),
        }
    }
    let mut out = Vec::new();
    for g in groups {
        if let [only] = g.as_slice() {
            out.push((*only).clone());
            continue;
        }
        let first = g[0];
        let mut m = DisruptionSummary {
            cause: first.cause.clone(),
            fleet: first.fleet.clone(),
            began_s: first.began_s,
            note: first.note.clone(),
            ..Default::default()
        };
        let mut reconnect = new_latency_histogram();
        let mut back_at = new_latency_histogram();
        let mut below = 0;
        for d in &g {
            let what = format!("disruption {} at {:.1}s", d.cause, d.began_s);
            m.sessions_lost += d.sessions_lost;
            m.back += d.back;
            m.attempts += d.attempts;
            m.snapshots += d.snapshots;
            m.resumes += d.resumes;
            m.resumes_silent += d.resumes_silent;
            for (k, v) in &d.missing_at_end {
                *m.missing_at_end.entry(k.clone()).or_insert(0) += v;
            }
            reconnect
                .add(&d.reconnect_us.merge_histogram(&what)?)
                .map_err(|e| MetricsError::Merge(format!("{e:?}")))?;
            let shift = ((d.began_s - first.began_s) * 1e6).round() as i128;
            add_shifted(
                &mut back_at,
                &d.back_at_us.merge_histogram(&what)?,
                shift,
                &mut below,
            )?;
        }
        if first.cause == CAUSE_BACKEND {
            m.note = Some(format!(
                "detected in {} part(s) within {MERGE_WINDOW_S}s; back times shifted onto the \
                 earliest start",
                g.len()
            ));
        }
        m.back_after_s = back_after(&back_at, m.sessions_lost);
        m.reconnect_us = LatencySummary::from_histogram(&reconnect);
        m.back_at_us = LatencySummary::from_histogram(&back_at);
        out.push(m);
    }
    number(&mut out);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    /// A storm at 10 s: 10 sessions lost, 9 back at 10.1 s … 10.9 s.
    fn storm(log: &DisruptionLog, fleet: &'static str) -> DisruptionId {
        let id = log.open("storm", fleet, 10 * S, None).unwrap();
        for i in 0..10u32 {
            log.lost(id);
            if i < 9 {
                let t = Duration::from_millis(100 * (i as u64 + 1));
                log.back(id, t, 10 * S + t, 2);
            }
        }
        log.missing(id, "connect_refused", 7);
        id
    }

    #[test]
    fn quantile_times_rank_against_the_sessions_lost() {
        let log = DisruptionLog::default();
        storm(&log, "sensu");
        log.resync(DisruptionId(0), Resync::Snapshot);
        let s = &log.summaries()[0];
        assert_eq!((s.id, s.sessions_lost, s.back, s.attempts), (1, 10, 9, 25));
        let near = |v: Option<f64>, want: f64| v.is_some_and(|x| (x - want).abs() < 0.001);
        // 50 % of 10 = the 5th back (0.5 s); 90 % = the 9th (0.9 s); 99 % and
        // 100 % need the 10th, which never came.
        assert!(near(s.back_after_s.p50, 0.5), "{:?}", s.back_after_s);
        assert!(near(s.back_after_s.p90, 0.9), "{:?}", s.back_after_s);
        assert_eq!((s.back_after_s.p99, s.back_after_s.p100), (None, None));
        assert_eq!(s.missing_at_end["connect_refused"], 1);
        assert_eq!(s.reconnect_us.count, 9);
        assert_eq!(s.snapshots, 1);
        let sp = spread(&s.reconnect_us).unwrap();
        assert!((700_000..=900_000).contains(&sp), "{sp}");
        let v = serde_json::to_value(s).unwrap();
        assert!(v["back_after_s"]["p100"].is_null());
        for k in [
            "resumes",
            "resumes_silent",
            "missing_at_end",
            "reconnect_us",
        ] {
            assert!(v.get(k).is_some(), "{k}");
        }
        let mut t = String::new();
        render(&mut t, &log.summaries());
        assert!(t.contains("storm (sensu)") && t.contains("never"), "{t}");
        assert!(t.contains("missing at the end: connect_refused 1"), "{t}");
    }

    #[test]
    fn the_log_is_bounded_and_live_figures_show_progress() {
        let log = DisruptionLog::default();
        for i in 0..MAX_DISRUPTIONS + 3 {
            let id = log.open("backend", "consul", i as u32 * S, None);
            assert_eq!(id.is_some(), i < MAX_DISRUPTIONS);
        }
        assert_eq!(log.refused(), 3);
        let id = DisruptionId(1);
        log.lost(id);
        log.lost(id);
        log.back(id, S, 2 * S, 1);
        let live = &log.live()[1];
        assert_eq!((live.lost, live.back), (2, 1));
        assert_eq!(log.reconnect_histogram().len(), 1);
    }

    #[test]
    fn shards_merge_scheduled_disruptions_exactly_and_detected_ones_within_the_window() {
        let (a, b) = (DisruptionLog::default(), DisruptionLog::default());
        storm(&a, "sensu");
        storm(&b, "sensu");
        // Detected in both shards 1.5 s apart (one restart), and once more
        // in shard b much later (another one).
        let da = a.open(CAUSE_BACKEND, "sensu", 30 * S, None).unwrap();
        a.lost(da);
        a.back(da, S, 31 * S, 1);
        let db = b
            .open(CAUSE_BACKEND, "sensu", 30 * S + S / 2 * 3, None)
            .unwrap();
        b.lost(db);
        b.back(db, S, 32 * S + S / 2, 1);
        let late = b.open(CAUSE_BACKEND, "sensu", 50 * S, None).unwrap();
        b.lost(late);
        let (sa, sb) = (a.summaries(), b.summaries());
        let m = merge(&[&sa, &sb]).unwrap();
        assert_eq!(m.len(), 3, "{m:?}");
        let st = &m[0];
        assert_eq!(
            (st.cause.as_str(), st.sessions_lost, st.back),
            ("storm", 20, 18)
        );
        assert_eq!(st.reconnect_us.count, 18);
        assert_eq!(st.missing_at_end["connect_refused"], 2);
        // 50 % of 20 = the 10th back: both shards' 5th at 0.5 s.
        assert!(st.back_after_s.p50.is_some_and(|x| (x - 0.5).abs() < 0.001));
        let d = &m[1];
        assert_eq!(
            (d.cause.as_str(), d.sessions_lost, d.back),
            ("backend", 2, 2)
        );
        assert_eq!(d.began_s, 30.0);
        // Shard b's back at 1 s after its start is 2.5 s after the merged start.
        assert!(
            d.back_after_s.p100.is_some_and(|x| (x - 2.5).abs() < 0.01),
            "{d:?}"
        );
        assert!(d.note.as_deref().unwrap().contains("2 part(s)"));
        assert_eq!((m[2].began_s, m[2].id), (50.0, 3));
        // Different fleets never merge.
        let c = DisruptionLog::default();
        storm(&c, "consul");
        let sc = c.summaries();
        assert_eq!(merge(&[&sa, &sc]).unwrap().len(), 3);
    }
}
