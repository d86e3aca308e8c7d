//! A window of a run read as a run of its own: what a stepped run
//! (`--steps`) judges each step by.
//!
//! Parts:
//! - [`Mark`]: the run's figures at one moment (counters, errors, every
//!   latency recorded so far, this process's CPU); two marks make a
//!   window, and [`window`] reads it as a [`Summary`] of that window alone
//!   (counters and errors as differences, latencies as the histogram of
//!   the samples between the marks, rates over the window), so that the
//!   `--assert` grammar judges a step as it judges a run.
//! - [`load_box`]: whether the load box, not the server, was the limit in
//!   a window (its own CPU, a local ceiling, its delay on probes).
//! - [`judge`]: a step's verdict and figures from its window, the same
//!   for one process's window and for shards' merged ones.
//!
//! What it is not: the clock of the steps (the CLI's stepper), the
//! server's figures (the observer's window), the answer
//! ([`crate::capacity`]).

use std::collections::BTreeMap;

use hdrhistogram::Histogram;

use crate::assert::{Assertion, Verdict, evaluate};
use crate::capacity::{SloFigure, StepServer, StepSummary, StepVerdict};
use crate::server::ServerSummary;
use crate::summary::{AgentCounts, KindEntry, LatencySummary, ProcessStats, SCHEMA_V2, Summary};
use crate::units::fmt_us;
use crate::{Metrics, Snapshot, Speaker};

/// Share of this process's cores busy over a window past which the load
/// box is the limit.
pub const LOAD_BOX_CPU: f64 = 0.95;

/// `probe_overhead` p99 above this share of the propagation p99: the load
/// box's own delay is part of what a step measured.
pub const LOAD_BOX_PROBE_SHARE: f64 = 0.10;

/// ... and above this (µs): below it the delay is the load box's ordinary
/// scheduling, whatever share of a fast propagation it is (the Consul
/// run's own `probe_overhead_high` warning starts there too).
pub const LOAD_BOX_PROBE_FLOOR_US: u64 = 10_000;

/// The run's figures at one moment of its clock.
#[derive(Debug, Clone)]
pub struct Mark {
    /// Seconds from the run's start.
    pub t_s: f64,
    /// Counters, errors and sessions.
    pub snap: Snapshot,
    /// Every latency recorded up to now.
    pub hists: Vec<(&'static str, Histogram<u64>)>,
    /// This process's CPU seconds (user and system) so far.
    pub cpu_s: f64,
    /// The wall clock then.
    pub wall: std::time::SystemTime,
}

impl Mark {
    /// Reads `m` now, `t_s` seconds into the run.
    pub fn take(m: &Metrics, t_s: f64) -> Mark {
        let (user, sys) = crate::process::cpu_times().unwrap_or((0.0, 0.0));
        Mark {
            t_s,
            snap: m.snapshot(),
            hists: m.recorded_now(),
            cpu_s: user + sys,
            wall: std::time::SystemTime::now(),
        }
    }
}

/// What a window's summary is built with besides its two marks.
#[derive(Debug, Clone, Copy)]
pub struct WindowOf<'a> {
    /// The run's kind (`sensu`, `consul`, ...).
    pub kind: &'a str,
    /// Agents this process was asked to hold in the window.
    pub requested: u64,
    /// Counters whose rate is kept.
    pub rated: &'a [&'static str],
    /// Who says what each error kind means (its speaker).
    pub metrics: &'a Metrics,
}

/// The window between `a` and `b` as a summary of its own.
pub fn window(a: &Mark, b: &Mark, of: WindowOf<'_>) -> Summary {
    let len = (b.t_s - a.t_s).max(1e-9);
    let before = |name: &str| a.snap.counter(name);
    let counters: BTreeMap<String, u64> = b
        .snap
        .counters
        .iter()
        .map(|(n, v)| (n.to_string(), v.saturating_sub(before(n))))
        .collect();
    let rates_per_s = counters
        .iter()
        .filter(|(n, v)| **v > 0 && of.rated.contains(&n.as_str()))
        .map(|(n, v)| (n.clone(), *v as f64 / len))
        .collect();
    let errors = b
        .snap
        .errors
        .iter()
        .filter_map(|(k, v)| {
            let n = v.saturating_sub(a.snap.errors.get(k).copied().unwrap_or(0));
            let spec = of.metrics.error_kind(k);
            (n > 0).then(|| {
                let entry = KindEntry {
                    count: n,
                    first_seen_s: a.t_s,
                    sample: of.metrics.error_sample(k),
                    hint: spec.map(|s| s.hint.to_string()),
                    heals: spec.is_none_or(|s| s.heals),
                    said_by: of.metrics.error_speaker(k),
                };
                (k.clone(), entry)
            })
        })
        .collect();
    let connected = b.snap.connected.max(0) as u64;
    Summary {
        schema: SCHEMA_V2.into(),
        kind: of.kind.into(),
        started_at: crate::units::rfc3339(a.wall),
        duration_s: len,
        agents: AgentCounts {
            requested: of.requested,
            connected,
            peak_connected: connected,
            ever_connected: connected,
            never_connected: of.requested.saturating_sub(connected),
            ..AgentCounts::default()
        },
        counters,
        errors,
        latency_us: latencies(a, b),
        rates_per_s,
        process: ProcessStats {
            peak_rss_bytes: crate::process::rss_bytes(),
            cpu_user_s: b.cpu_s - a.cpu_s,
            cpu_sys_s: 0.0,
        },
        ..Summary::default()
    }
}

/// Each latency's samples recorded between the marks.
fn latencies(a: &Mark, b: &Mark) -> BTreeMap<String, LatencySummary> {
    b.hists
        .iter()
        .map(|(name, h)| {
            let mut h = h.clone();
            if let Some((_, old)) = a.hists.iter().find(|(n, _)| n == name) {
                // `b` holds every sample `a` does: it cannot go below zero.
                let _ = h.subtract(old);
            }
            (name.to_string(), LatencySummary::from_histogram(&h))
        })
        .collect()
}

/// Why the load box, not the server, was the limit in window `w` (empty:
/// it was not): its CPU at `cores`' limit, a local ceiling (ports, file
/// descriptors, socket memory), or its delay on probes past a tenth of
/// what they measured (and past [`LOAD_BOX_PROBE_FLOOR_US`]).
pub fn load_box(w: &Summary, cores: usize) -> Vec<String> {
    let mut why = Vec::new();
    let busy = w.process.cpu_user_s / w.duration_s.max(1e-9) / cores.max(1) as f64;
    if busy >= LOAD_BOX_CPU {
        why.push(format!(
            "agent-sim's own CPU at {:.0} % of its {cores} cores",
            busy * 100.0
        ));
    }
    for (kind, e) in &w.errors {
        if e.said_by == Speaker::Os && kind.starts_with("local_") {
            why.push(format!("{kind}: {} (the load box's own limit)", e.count));
        }
    }
    let p99 = |name: &str| {
        w.latency_us
            .get(name)
            .filter(|l| l.count > 0)
            .map(|l| l.p99)
    };
    if let (Some(over), Some(prop)) = (p99("probe_overhead"), p99("propagation"))
        && over as f64 > LOAD_BOX_PROBE_SHARE * prop as f64
        && over > LOAD_BOX_PROBE_FLOOR_US
    {
        why.push(format!(
            "probe_overhead p99 {} is over {:.0} % of the propagation p99 {}",
            fmt_us(over),
            LOAD_BOX_PROBE_SHARE * 100.0,
            fmt_us(prop)
        ));
    }
    why
}

/// What a step is besides its window's figures.
#[derive(Debug, Clone, Copy)]
pub struct StepHead {
    /// The whole fleet's agents in the step.
    pub agents: u64,
    /// When its first agent started, seconds from the run's start.
    pub started_s: f64,
    /// Its window, seconds from the run's start.
    pub window_s: (f64, f64),
}

/// Step `head` judged by `slos` over its window `w` (a run's, or shards'
/// merged); `load_box`: why the load box was the limit, if it was.
pub fn judge(
    head: StepHead,
    w: &Summary,
    slos: &[Assertion],
    load_box: Vec<String>,
) -> StepSummary {
    let requested = w.agents.requested;
    let slos: Vec<SloFigure> = evaluate(slos, w)
        .iter()
        .zip(slos)
        .map(|(v, s)| slo_figure(v, s.threshold(requested)))
        .collect();
    let verdict = if !load_box.is_empty() {
        StepVerdict::LoadBox
    } else if slos.iter().all(|s| s.passed) {
        StepVerdict::Held
    } else {
        StepVerdict::Failed
    };
    StepSummary {
        agents: head.agents,
        started_s: head.started_s,
        window_s: head.window_s,
        connected: w.agents.connected,
        verdict,
        slos,
        errors: w.errors.values().map(|e| e.count).sum(),
        top_error: w
            .errors
            .iter()
            .max_by_key(|(_, e)| e.count)
            .map(|(k, _)| k.clone()),
        load_box,
        server: w.server.iter().map(step_server).collect(),
    }
}

fn step_server(s: &ServerSummary) -> StepServer {
    StepServer {
        target: s.target.clone(),
        cpu_cores: s.sizing.cpu_cores.mean,
        rss_bytes: s.sizing.rss_bytes.mean,
        cores_per_1000_agents: s.sizing.cores_per_1000_agents,
        rss_per_agent_kib: s.sizing.rss_per_agent_kib,
    }
}

/// The figure of verdict `v`, whose threshold was `threshold`.
pub fn slo_figure(v: &Verdict, threshold: f64) -> SloFigure {
    SloFigure {
        slo: v.assertion.clone(),
        actual: v.actual_text(),
        value: v.actual,
        passed: v.passed,
        over: match v.actual {
            Some(a) if !v.passed && threshold != 0.0 => Some(a / threshold),
            _ => None,
        },
        note: v.note.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_reads_only_what_happened_between_its_marks() {
        let spec = crate::MetricsSpec {
            counters: vec!["events"],
            latencies: vec!["propagation"],
            errors: Vec::new(),
        };
        let m = Metrics::new(&spec, 1);
        let (ev, prop) = (m.counter("events"), m.latency("propagation"));
        m.add(ev, 5);
        m.record_us(prop, 0, 100_000);
        m.collect();
        let a = Mark::take(&m, 10.0);
        m.add(ev, 20);
        m.record_us(prop, 0, 3_000_000);
        // Not collected yet: the window sees it all the same.
        let b = Mark::take(&m, 20.0);
        let of = WindowOf {
            kind: "consul",
            requested: 4,
            rated: &["events"],
            metrics: &m,
        };
        let w = window(&a, &b, of);
        assert_eq!(w.counters["events"], 20);
        assert_eq!(w.rates_per_s["events"], 2.0);
        let p = &w.latency_us["propagation"];
        assert_eq!(p.count, 1);
        assert!(p.p99 >= 2_990_000, "{}", p.p99);
        assert_eq!(w.agents.requested, 4);
        // The reporter's interval still holds the sample: nothing drained.
        let interval = m.collect();
        assert_eq!(interval[0].1.len(), 1);
    }
}
