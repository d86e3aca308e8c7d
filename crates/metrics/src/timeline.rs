//! The run over time: the summary's `timeline` (sessions, RSS, CPU and what
//! the counters and errors did between samples) and latency percentiles per
//! interval ([`LatencyWindow`]), both bounded however long the run is.
//!
//! Main parts:
//! - [`TimelineRecorder`]: fed a [`Snapshot`] every `--progress-every` by the
//!   run's reporter (and once at the end); keeps at most [`MAX_SAMPLES`] by
//!   joining neighbours and halving its sampling rate when full, so a week
//!   long run holds as many samples as a 5-hour one, evenly spaced.
//! - [`merge_timelines`]: the timelines of several processes (shards) as one,
//!   on a common grid: levels summed, increments summed.
//! - [`LatencyWindow`], [`windows_from_hlogs`], [`WindowLog`]: p50/p90/p99/max
//!   of each latency per interval, from interval logs (exact, also over
//!   several logs) or recorded by a run as it goes (bounded).
//!
//! It draws nothing: see [`crate::html`].

use std::collections::BTreeMap;

use hdrhistogram::Histogram;

use crate::Snapshot;
use crate::hlog::{HlogContents, UNTAGGED};
use crate::new_latency_histogram;
use crate::spread::ServerLevels;
use crate::summary::TimelineSample;

/// Most timeline samples (and latency windows per name) kept: at the
/// default `--progress-every 10s`, 5.5 hours at full resolution.
pub const MAX_SAMPLES: usize = 2_000;

/// Builds the bounded timeline of a run from periodic snapshots.
#[derive(Debug)]
pub struct TimelineRecorder {
    // Bound: MAX_SAMPLES samples (neighbours joined when full).
    samples: Vec<TimelineSample>,
    max: usize,
    /// Keep one observation in `stride` (doubles at each compaction).
    stride: u64,
    offered: u64,
    /// Cumulative counters and errors at the last kept sample.
    counters: BTreeMap<String, u64>,
    errors: BTreeMap<String, u64>,
    /// Cumulative sessions established per server at the last kept sample.
    connects: Vec<u64>,
    finished: bool,
}

impl Default for TimelineRecorder {
    fn default() -> Self {
        Self::new(MAX_SAMPLES)
    }
}

/// Increments of `now` over `before` (names with no increment left out).
fn increments(
    now: impl Iterator<Item = (String, u64)>,
    before: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    now.filter_map(|(k, v)| {
        let d = v.saturating_sub(before.get(&k).copied().unwrap_or(0));
        (d > 0).then_some((k, d))
    })
    .collect()
}

fn add_all(acc: &mut BTreeMap<String, u64>, more: &BTreeMap<String, u64>) {
    for (k, v) in more {
        *acc.entry(k.clone()).or_insert(0) += v;
    }
}

/// Adds `more` to `acc` element by element (per-server counts).
fn add_each(acc: &mut Vec<u64>, more: &[u64]) {
    if acc.len() < more.len() {
        acc.resize(more.len(), 0);
    }
    for (a, m) in acc.iter_mut().zip(more) {
        *a += m;
    }
}

impl TimelineRecorder {
    /// A recorder keeping at most `max` samples (at least 2).
    pub fn new(max: usize) -> Self {
        TimelineRecorder {
            samples: Vec::new(),
            max: max.max(2),
            stride: 1,
            offered: 0,
            counters: BTreeMap::new(),
            errors: BTreeMap::new(),
            connects: Vec::new(),
            finished: false,
        }
    }

    /// Offers the state at `t_s` seconds from the run start (with the
    /// sessions per server, when the run has several). Kept when on the
    /// current stride, or when `last` (the end of the run, kept always;
    /// later observations are ignored).
    pub fn observe(
        &mut self,
        t_s: f64,
        snap: &Snapshot,
        (rss_bytes, cpu_s): (u64, f64),
        servers: Option<&ServerLevels>,
        last: bool,
    ) {
        if self.finished {
            return;
        }
        self.offered += 1;
        if !last && !self.offered.is_multiple_of(self.stride) {
            return;
        }
        self.finished = last;
        let counters: BTreeMap<String, u64> = snap
            .counters
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect();
        let (held_by_server, connects) = servers
            .map(|l| (l.held.clone(), l.connects.clone()))
            .unwrap_or_default();
        let sample = TimelineSample {
            t_s,
            connected: snap.connected.max(0) as u64,
            rss_bytes,
            cpu_s,
            counters: increments(counters.clone().into_iter(), &self.counters),
            errors: increments(
                snap.errors.iter().map(|(k, v)| (k.clone(), *v)),
                &self.errors,
            ),
            held_by_server,
            connects_by_server: connects
                .iter()
                .enumerate()
                .map(|(i, c)| c.saturating_sub(self.connects.get(i).copied().unwrap_or(0)))
                .collect(),
        };
        self.counters = counters;
        self.errors = snap.errors.clone();
        self.connects = connects;
        self.samples.push(sample);
        if self.samples.len() >= self.max && !last {
            self.compact();
        }
    }

    /// Joins neighbours pairwise (the later one's levels, both increments)
    /// and halves the sampling rate.
    fn compact(&mut self) {
        let old = std::mem::take(&mut self.samples);
        let mut it = old.into_iter();
        while let Some(a) = it.next() {
            match it.next() {
                Some(mut b) => {
                    add_all(&mut b.counters, &a.counters);
                    add_all(&mut b.errors, &a.errors);
                    add_each(&mut b.connects_by_server, &a.connects_by_server);
                    self.samples.push(b);
                }
                None => self.samples.push(a),
            }
        }
        self.stride *= 2;
    }

    /// The samples kept so far.
    pub fn samples(&self) -> &[TimelineSample] {
        &self.samples
    }

    /// The timeline.
    pub fn into_samples(self) -> Vec<TimelineSample> {
        self.samples
    }
}

/// The middle of the gaps between consecutive samples of every part (1 s
/// when no part has two samples).
fn typical_step(gaps: impl Iterator<Item = f64>) -> f64 {
    let mut g: Vec<f64> = gaps.filter(|d| *d > 1e-9).collect();
    if g.is_empty() {
        return 1.0;
    }
    g.sort_by(f64::total_cmp);
    g[g.len() / 2]
}

/// Joins the timelines of several processes. Each part comes with its start
/// in seconds after the earliest part's start (shards start apart). Samples
/// go onto a common grid (the typical sampling interval, slot = nearest
/// multiple); per slot `connected` and `rss_bytes` are summed over the parts
/// running then (a part between two of its samples counts with its last
/// level, a part that has ended counts 0), `cpu_s` sums each part's CPU
/// used so far (an ended part keeps its total), increments are summed. A
/// slot's time is the latest sample time in it. One part is returned as it
/// is, moved by its start.
pub fn merge_timelines(parts: &[(f64, &[TimelineSample])]) -> Vec<TimelineSample> {
    let shifted = |off: f64, s: &TimelineSample| TimelineSample {
        t_s: s.t_s + off,
        ..s.clone()
    };
    let nonempty: Vec<&(f64, &[TimelineSample])> =
        parts.iter().filter(|(_, t)| !t.is_empty()).collect();
    match nonempty.as_slice() {
        [] => return Vec::new(),
        [(off, t)] => return t.iter().map(|s| shifted(*off, s)).collect(),
        _ => {}
    }
    let step = typical_step(
        nonempty
            .iter()
            .flat_map(|(_, t)| t.windows(2).map(|w| w[1].t_s - w[0].t_s)),
    );
    let slot_of = |t: f64| (t / step).round().max(0.0) as i64;
    // Per part: slot -> its sample there (two in one slot are joined).
    let per_part: Vec<BTreeMap<i64, TimelineSample>> = nonempty
        .iter()
        .map(|(off, t)| {
            let mut m: BTreeMap<i64, TimelineSample> = BTreeMap::new();
            for s in t.iter() {
                let s = shifted(*off, s);
                match m.get_mut(&slot_of(s.t_s)) {
                    Some(prev) => {
                        let (mut c, mut e) = (s.counters.clone(), s.errors.clone());
                        add_all(&mut c, &prev.counters);
                        add_all(&mut e, &prev.errors);
                        let mut k = s.connects_by_server.clone();
                        add_each(&mut k, &prev.connects_by_server);
                        *prev = TimelineSample {
                            counters: c,
                            errors: e,
                            connects_by_server: k,
                            ..s
                        };
                    }
                    None => {
                        m.insert(slot_of(s.t_s), s);
                    }
                }
            }
            m
        })
        .collect();
    let slots: std::collections::BTreeSet<i64> =
        per_part.iter().flat_map(|m| m.keys().copied()).collect();
    let mut out = Vec::with_capacity(slots.len());
    for slot in slots {
        let mut merged = TimelineSample::default();
        for m in &per_part {
            let (first, last) = (
                *m.keys().next().unwrap_or(&0),
                *m.keys().last().unwrap_or(&0),
            );
            if let Some(s) = m.get(&slot) {
                merged.t_s = merged.t_s.max(s.t_s);
                add_all(&mut merged.counters, &s.counters);
                add_all(&mut merged.errors, &s.errors);
                add_each(&mut merged.connects_by_server, &s.connects_by_server);
            }
            if slot < first {
                continue;
            }
            // The part's latest sample at or before this slot.
            let Some((_, s)) = m.range(..=slot).next_back() else {
                continue;
            };
            merged.cpu_s += s.cpu_s;
            if slot <= last {
                merged.connected += s.connected;
                merged.rss_bytes += s.rss_bytes;
                add_each(&mut merged.held_by_server, &s.held_by_server);
            }
        }
        out.push(merged);
    }
    out
}

/// Latency percentiles of one name over one interval (µs).
#[derive(Debug, Clone, PartialEq)]
pub struct LatencyWindow {
    /// The latency name (`connect`, `propagation`, ...).
    pub name: String,
    /// Start, seconds from the run start.
    pub start_s: f64,
    /// Length in seconds.
    pub length_s: f64,
    /// Samples.
    pub count: u64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// Largest sample.
    pub max: u64,
}

impl LatencyWindow {
    /// The percentiles of `h` (`None` when it is empty).
    pub fn of(name: &str, start_s: f64, length_s: f64, h: &Histogram<u64>) -> Option<Self> {
        (!h.is_empty()).then(|| LatencyWindow {
            name: name.to_string(),
            start_s,
            length_s,
            count: h.len(),
            p50: h.value_at_quantile(0.50),
            p90: h.value_at_quantile(0.90),
            p99: h.value_at_quantile(0.99),
            max: h.max(),
        })
    }
}

/// Latency windows from interval logs, exact: every interval's histogram is
/// added into its window before percentiles are taken. `zero_unix_s` is the
/// run start (seconds since the epoch; default: the earliest interval).
/// One log keeps its own intervals; several logs (shards) are put on a
/// common grid of their typical interval length (slot = nearest multiple
/// after `zero_unix_s`) and added per slot. Beyond [`MAX_SAMPLES`] slots per
/// name, neighbouring slots are joined (still exact).
pub fn windows_from_hlogs(logs: &[HlogContents], zero_unix_s: Option<f64>) -> Vec<LatencyWindow> {
    let all = || logs.iter().flat_map(|l| l.intervals.iter());
    let Some(zero) = zero_unix_s.or_else(|| all().map(|i| i.start).min_by(f64::total_cmp)) else {
        return Vec::new();
    };
    let step = if logs.iter().filter(|l| !l.intervals.is_empty()).count() <= 1 {
        None
    } else {
        Some(typical_step(all().map(|i| i.length)))
    };
    // (name, slot) -> (start, end, histogram).
    let mut slots: BTreeMap<(String, i64), (f64, f64, Histogram<u64>)> = BTreeMap::new();
    for (n, i) in all().enumerate() {
        let name = i.tag.as_deref().unwrap_or(UNTAGGED).to_string();
        let start = i.start - zero;
        let slot = match step {
            Some(step) => (start / step).round() as i64,
            None => n as i64,
        };
        let e = slots
            .entry((name, slot))
            .or_insert_with(|| (start, start + i.length, new_latency_histogram()));
        e.0 = e.0.min(start);
        e.1 = e.1.max(start + i.length);
        let _ = e.2.add(&i.histogram);
    }
    // Per name, in time order; join neighbours while there are too many.
    let mut by_name: BTreeMap<String, Vec<(f64, f64, Histogram<u64>)>> = BTreeMap::new();
    for ((name, _), w) in slots {
        by_name.entry(name).or_default().push(w);
    }
    let mut out = Vec::new();
    for (name, mut ws) in by_name {
        ws.sort_by(|a, b| a.0.total_cmp(&b.0));
        let join = ws.len().div_ceil(MAX_SAMPLES).max(1);
        for chunk in ws.chunks(join) {
            let mut h = new_latency_histogram();
            for (_, _, x) in chunk {
                let _ = h.add(x);
            }
            let start = chunk[0].0;
            let end = chunk.iter().map(|w| w.1).fold(start, f64::max);
            out.extend(LatencyWindow::of(&name, start, end - start, &h));
        }
    }
    out
}

/// Latency windows recorded by a run as it goes: at most [`MAX_SAMPLES`] per
/// name. When a name has more, neighbouring windows are joined: counts
/// added, each percentile the larger of the two (an upper bound, since the
/// histograms are gone; exact figures need `--hlog`).
#[derive(Debug, Default)]
pub struct WindowLog {
    // Bound: MAX_SAMPLES windows per latency name.
    windows: Vec<LatencyWindow>,
    per_name: BTreeMap<String, usize>,
}

impl WindowLog {
    /// Adds the windows of one interval: one per non-empty histogram.
    pub fn add<'a>(
        &mut self,
        start_s: f64,
        length_s: f64,
        hists: impl IntoIterator<Item = (&'a str, &'a Histogram<u64>)>,
    ) {
        for (name, h) in hists {
            if let Some(w) = LatencyWindow::of(name, start_s, length_s, h) {
                let n = self.per_name.entry(name.to_string()).or_insert(0);
                *n += 1;
                self.windows.push(w);
                if *n >= MAX_SAMPLES {
                    let name = name.to_string();
                    self.halve(&name);
                }
            }
        }
    }

    /// Joins the windows of `name` pairwise.
    fn halve(&mut self, name: &str) {
        let (mine, rest): (Vec<LatencyWindow>, Vec<LatencyWindow>) =
            std::mem::take(&mut self.windows)
                .into_iter()
                .partition(|w| w.name == name);
        self.windows = rest;
        let mut it = mine.into_iter();
        let mut kept = 0;
        while let Some(a) = it.next() {
            let w = match it.next() {
                Some(b) => LatencyWindow {
                    name: a.name,
                    start_s: a.start_s,
                    length_s: b.start_s + b.length_s - a.start_s,
                    count: a.count + b.count,
                    p50: a.p50.max(b.p50),
                    p90: a.p90.max(b.p90),
                    p99: a.p99.max(b.p99),
                    max: a.max.max(b.max),
                },
                None => a,
            };
            self.windows.push(w);
            kept += 1;
        }
        self.per_name.insert(name.to_string(), kept);
    }

    /// Every window, by name then time.
    pub fn into_windows(mut self) -> Vec<LatencyWindow> {
        self.windows
            .sort_by(|a, b| a.name.cmp(&b.name).then(a.start_s.total_cmp(&b.start_s)));
        self.windows
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hlog::HlogInterval;

    fn snap(connected: i64, keepalives: u64, errors: &[(&str, u64)]) -> Snapshot {
        Snapshot {
            counters: vec![("keepalives_sent", keepalives), ("sessions_established", 5)],
            errors: errors.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            connected,
            ..Default::default()
        }
    }

    #[test]
    fn samples_hold_levels_and_increments() {
        let mut r = TimelineRecorder::default();
        r.observe(10.0, &snap(5, 50, &[]), (1_000, 0.5), None, false);
        r.observe(
            20.0,
            &snap(4, 150, &[("connect_refused", 2)]),
            (2_000, 0.7),
            None,
            false,
        );
        r.observe(
            23.5,
            &snap(5, 160, &[("connect_refused", 3)]),
            (3_000, 0.9),
            None,
            true,
        );
        r.observe(30.0, &snap(0, 999, &[]), (0, 9.0), None, false);
        let t = r.into_samples();
        assert_eq!(t.len(), 3, "nothing after the last sample");
        assert_eq!((t[0].connected, t[0].counters["keepalives_sent"]), (5, 50));
        assert_eq!(t[0].counters["sessions_established"], 5);
        assert!(t[0].errors.is_empty());
        assert_eq!(t[1].counters["keepalives_sent"], 100);
        assert!(
            !t[1].counters.contains_key("sessions_established"),
            "zeroes left out"
        );
        assert_eq!(t[1].errors["connect_refused"], 2);
        assert_eq!((t[2].t_s, t[2].rss_bytes, t[2].cpu_s), (23.5, 3_000, 0.9));
        assert_eq!(t[2].errors["connect_refused"], 1);
    }

    #[test]
    fn long_runs_stay_bounded_evenly_spaced_and_keep_every_increment() {
        let mut r = TimelineRecorder::new(100);
        let n = 1_000u64;
        for i in 1..=n {
            r.observe(
                i as f64,
                &snap(1, i * 3, &[("x", i)]),
                (0, 0.0),
                None,
                i == n,
            );
        }
        let t = r.into_samples();
        assert!(t.len() <= 100 && t.len() >= 50, "{}", t.len());
        let total: u64 = t.iter().map(|s| s.counters["keepalives_sent"]).sum();
        assert_eq!(total, n * 3);
        assert_eq!(t.iter().map(|s| s.errors["x"]).sum::<u64>(), n);
        assert_eq!(t.last().unwrap().t_s, n as f64);
        // Evenly spaced but for the last one.
        let gaps: Vec<f64> = t.windows(2).map(|w| w[1].t_s - w[0].t_s).collect();
        let g0 = gaps[0];
        assert!(gaps[..gaps.len() - 1].iter().all(|g| *g == g0), "{gaps:?}");
    }

    fn sample(t_s: f64, connected: u64, cpu_s: f64, k: u64) -> TimelineSample {
        TimelineSample {
            t_s,
            connected,
            rss_bytes: connected * 10,
            cpu_s,
            counters: [("k".to_string(), k)].into(),
            errors: BTreeMap::new(),
            ..TimelineSample::default()
        }
    }

    #[test]
    fn merged_timelines_sum_levels_and_increments_on_a_grid() {
        // Part a: 0..=30 s; part b started 1 s later, ends at its 20 s.
        let a: Vec<_> = (1..=3)
            .map(|i| sample(i as f64 * 10.0, 100, i as f64, 7))
            .collect();
        let b: Vec<_> = (1..=2)
            .map(|i| sample(i as f64 * 10.0, 50, i as f64 * 2.0, 1))
            .collect();
        let m = merge_timelines(&[(0.0, &a), (1.0, &b)]);
        assert_eq!(m.len(), 3);
        assert_eq!(
            (m[0].t_s, m[0].connected, m[0].rss_bytes),
            (11.0, 150, 1_500)
        );
        assert_eq!(m[1].counters["k"], 8);
        assert_eq!(m[1].cpu_s, 2.0 + 4.0);
        // Part b has ended: no sessions, its CPU total stays.
        assert_eq!(
            (m[2].t_s, m[2].connected, m[2].cpu_s),
            (30.0, 100, 3.0 + 4.0)
        );
        assert_eq!(m[2].counters["k"], 7);
        let total: u64 = m.iter().map(|s| s.counters["k"]).sum();
        assert_eq!(total, 3 * 7 + 2);
        // One part: unchanged but for its start.
        let one = merge_timelines(&[(2.0, &a), (0.0, &[])]);
        assert_eq!(one.len(), 3);
        assert_eq!(
            one[0],
            TimelineSample {
                t_s: 12.0,
                ..a[0].clone()
            }
        );
    }

    fn hist(values: &[u64]) -> Histogram<u64> {
        let mut h = new_latency_histogram();
        for v in values {
            h.record(*v).unwrap();
        }
        h
    }

    fn log(start: f64, intervals: &[(f64, &str, &[u64])]) -> HlogContents {
        HlogContents {
            start_time: Some(start),
            base_time: Some(start),
            intervals: intervals
                .iter()
                .map(|(t, tag, v)| HlogInterval {
                    tag: Some(tag.to_string()),
                    start: start + t,
                    length: 10.0,
                    histogram: hist(v),
                })
                .collect(),
        }
    }

    #[test]
    fn windows_from_one_log_keep_its_intervals() {
        let l = log(
            1_000.0,
            &[
                (0.0, "connect", &[100, 200, 300]),
                (10.0, "connect", &[5_000]),
                (0.0, "rtt", &[7]),
            ],
        );
        let w = windows_from_hlogs(&[l], Some(1_000.0));
        assert_eq!(w.len(), 3);
        assert_eq!(
            (w[0].name.as_str(), w[0].start_s, w[0].count),
            ("connect", 0.0, 3)
        );
        assert_eq!((w[0].p50, w[0].max), (200, 300));
        assert_eq!(w[1].start_s, 10.0);
        assert!((5_000..=5_005).contains(&w[1].p99), "{}", w[1].p99);
        assert_eq!(w[2].name, "rtt");
    }

    #[test]
    fn windows_of_several_logs_add_histograms_per_slot() {
        let a = log(
            1_000.0,
            &[(0.0, "connect", &[100; 9]), (10.0, "connect", &[100])],
        );
        // Started 1.5 s later: its intervals join the nearest slots.
        let b = log(
            1_001.5,
            &[(0.0, "connect", &[9_000]), (10.0, "connect", &[9_000; 3])],
        );
        let w = windows_from_hlogs(&[a, b], Some(1_000.0));
        assert_eq!(w.len(), 2);
        assert_eq!((w[0].count, w[0].p50), (10, 100));
        assert!(w[0].max >= 9_000 && w[0].max <= 9_010);
        assert_eq!(w[1].count, 4);
        assert_eq!(w[1].start_s, 10.0);
        assert!((w[1].length_s - 11.5).abs() < 1e-9);
    }

    #[test]
    fn recorded_windows_stay_bounded() {
        let mut log = WindowLog::default();
        let h = hist(&[10, 20]);
        for i in 0..(MAX_SAMPLES * 2 + 1) {
            log.add(
                i as f64,
                1.0,
                [("connect", &h), ("empty", &new_latency_histogram())],
            );
        }
        let w = log.into_windows();
        assert!(w.len() <= MAX_SAMPLES, "{}", w.len());
        assert!(w.iter().all(|x| x.name == "connect"));
        assert_eq!(
            w.iter().map(|x| x.count).sum::<u64>(),
            2 * (MAX_SAMPLES as u64 * 2 + 1)
        );
        assert!(w.windows(2).all(|p| p[0].start_s < p[1].start_s));
    }
}
