//! From readings to the summary's `server` section.
//!
//! A sample is the interval between two scrapes: counters become rates
//! (`<name>_per_s`, less a `_total` suffix; a counter that went down restarted and counts from
//! zero), gauges their value, summaries their quantiles as the server
//! reports them at the scrape (a sliding window on the server) from the
//! label set with the most observations in the interval, and their exact
//! interval mean from the sum and count deltas; histograms their quantiles
//! interpolated in the buckets that filled in the interval (as
//! `histogram_quantile` does); Consul's JSON windows their mean and max.
//! CPU is the rate of `process_cpu_seconds_total` (cores).
//!
//! The sizing figures come from the steady-state samples (every agent
//! started before the interval began, the run not ending): cores per 1,000
//! agents is (mean CPU − baseline CPU) / (mean agents held / 1,000), RSS
//! per agent (mean RSS − baseline RSS) / mean agents held; a latency under
//! load is the median of the steady intervals' medians and the highest of
//! their 99th percentiles, at baseline the baseline interval's.

use std::collections::BTreeMap;

use agent_sim_metrics::server::{
    LatencyUnderLoad, Level, Quantiles, ServerSample, ServerSizing, ServerSummary,
};

use crate::kinds;
use crate::reading::{Reading, SummarySet, Value};

/// Samples kept per server; beyond it every other one is dropped.
pub const MAX_SAMPLES: usize = 2_000;

/// What the run looked like at a scrape.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RunState {
    /// Seconds from the run start.
    pub t_s: f64,
    /// Agents holding a session (the fleet's, estimated when sharded).
    pub agents: u64,
    /// Every agent had been started (the ramp was over).
    pub ramp_done: bool,
    /// The run was ending (its end had come; agents leaving).
    pub ending: bool,
}

/// A quantile of the observations that filled `buckets` between two
/// cumulative readings, interpolated linearly inside its bucket.
fn bucket_quantile(prev: &[(f64, f64)], cur: &[(f64, f64)], q: f64) -> Option<f64> {
    let delta: Vec<(f64, f64)> = cur
        .iter()
        .map(|(le, c)| {
            let before = prev.iter().find(|(l, _)| l == le).map_or(0.0, |(_, p)| *p);
            (*le, (c - before).max(0.0))
        })
        .collect();
    let total = delta.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = 0.0;
    let mut below = 0.0;
    for (le, cum) in &delta {
        if *cum >= rank {
            if le.is_infinite() {
                return Some(lower);
            }
            let inside = cum - below;
            let frac = if inside > 0.0 {
                (rank - below) / inside
            } else {
                1.0
            };
            return Some(lower + (le - lower) * frac);
        }
        lower = *le;
        below = *cum;
    }
    Some(lower)
}

/// The label set with the most observations since `prev`.
fn busiest<'a>(
    prev: Option<&BTreeMap<String, SummarySet>>,
    cur: &'a BTreeMap<String, SummarySet>,
) -> Option<(&'a SummarySet, f64)> {
    cur.iter()
        .map(|(k, s)| {
            let before = prev.and_then(|p| p.get(k)).map_or(0.0, |p| p.count);
            (s, (s.count - before).max(0.0))
        })
        .max_by(|a, b| a.1.total_cmp(&b.1))
}

/// A latency over the interval, in µs (`scale` µs per server unit).
fn latency(prev: Option<&Value>, cur: &Value, scale: f64) -> Option<Quantiles> {
    let q = |v: f64| Some(v * scale);
    match cur {
        Value::Summary(sets) => {
            let prev_sets = match prev {
                Some(Value::Summary(p)) => Some(p),
                _ => None,
            };
            let (set, _) = busiest(prev_sets, sets)?;
            let at = |want: f64| {
                set.quantiles
                    .iter()
                    .find(|(k, _)| (k - want).abs() < 1e-9)
                    .and_then(|(_, v)| q(*v))
            };
            let (sum, count) = sets.iter().fold((0.0, 0.0), |(s, c), (k, x)| {
                let p = prev_sets.and_then(|p| p.get(k));
                (
                    s + (x.sum - p.map_or(0.0, |p| p.sum)).max(0.0),
                    c + (x.count - p.map_or(0.0, |p| p.count)).max(0.0),
                )
            });
            Some(Quantiles {
                p50: at(0.5),
                p90: at(0.9),
                p99: at(0.99),
                max: None,
                mean: (count > 0.0).then(|| sum / count * scale),
                count,
            })
        }
        Value::Histogram {
            buckets,
            sum,
            count,
        } => {
            let (pb, ps, pc) = match prev {
                Some(Value::Histogram {
                    buckets,
                    sum,
                    count,
                }) if *count <= *count_of(cur) => (buckets.as_slice(), *sum, *count),
                _ => (&[][..], 0.0, 0.0),
            };
            let n = (count - pc).max(0.0);
            Some(Quantiles {
                p50: bucket_quantile(pb, buckets, 0.5).and_then(q),
                p90: bucket_quantile(pb, buckets, 0.9).and_then(q),
                p99: bucket_quantile(pb, buckets, 0.99).and_then(q),
                max: None,
                mean: (n > 0.0).then(|| (sum - ps) / n * scale),
                count: n,
            })
        }
        Value::Window { mean, max, count } => Some(Quantiles {
            mean: (*count > 0.0).then(|| mean * scale),
            max: (*count > 0.0).then(|| max * scale),
            count: *count,
            ..Quantiles::default()
        }),
        _ => None,
    }
}

fn count_of(v: &Value) -> &f64 {
    match v {
        Value::Histogram { count, .. } => count,
        _ => &0.0,
    }
}

/// A counter's rate over `dt` seconds (a restart counts from zero).
fn rate(prev: Option<f64>, cur: f64, dt: f64) -> Option<f64> {
    if dt <= 0.0 {
        return None;
    }
    let before = prev.unwrap_or(cur);
    Some(if cur >= before { cur - before } else { cur } / dt)
}

/// The sample of the interval from `prev` (at `prev_t`) to `cur`.
pub fn sample(prev: Option<(&Reading, f64)>, cur: &Reading, run: RunState) -> ServerSample {
    let dt = prev.map_or(0.0, |(_, t)| run.t_s - t);
    let before = |name: &str| prev.and_then(|(r, _)| r.series.get(name));
    let scalar_before = |name: &str| prev.and_then(|(r, _)| r.scalar(name));
    let gauge = |name: &str| cur.scalar(name).map(|v| v.max(0.0) as u64);
    let mut s = ServerSample {
        t_s: run.t_s,
        agents: run.agents,
        cpu_cores: cur
            .scalar(kinds::CPU)
            .filter(|_| prev.is_some())
            .and_then(|c| rate(scalar_before(kinds::CPU), c, dt)),
        rss_bytes: gauge(kinds::RSS),
        heap_bytes: gauge(kinds::HEAP),
        goroutines: gauge(kinds::GOROUTINES),
        open_fds: gauge(kinds::FDS),
        threads: gauge(kinds::THREADS),
        ..ServerSample::default()
    };
    for (name, value) in &cur.series {
        // The process's are the sample's own fields; the storm series are
        // the storm part's (`crate::storm`), their summaries not latencies.
        if kinds::PROCESS.contains(&name.as_str()) || kinds::storm(name) {
            continue;
        }
        let key = kinds::normalize(name);
        match value {
            Value::Gauge(v) => {
                s.values.insert(key, *v);
            }
            Value::Rate(v) => {
                s.values.insert(format!("{key}_per_s"), *v);
            }
            Value::Counter(v) => {
                if prev.is_some()
                    && let Some(r) = rate(scalar_before(name), *v, dt)
                {
                    let base = key.strip_suffix("_total").unwrap_or(&key);
                    s.values.insert(format!("{base}_per_s"), r);
                }
            }
            other => match kinds::latency_unit(name) {
                Some((scale, _)) => {
                    if let Some(q) = latency(before(name), other, scale) {
                        s.latencies.insert(key, q);
                    }
                }
                // Unknown unit: the quantiles as plain values.
                None => {
                    if let Some(q) = latency(before(name), other, 1.0) {
                        for (suffix, v) in [("p50", q.p50), ("p99", q.p99), ("mean", q.mean)] {
                            if let Some(v) = v {
                                s.values.insert(format!("{key}_{suffix}"), v);
                            }
                        }
                    }
                }
            },
        }
    }
    s
}

/// Drops every other sample (first and last kept) once there are more
/// than [`MAX_SAMPLES`].
pub fn bound<T>(samples: &mut Vec<T>) {
    if samples.len() <= MAX_SAMPLES {
        return;
    }
    let last = samples.pop();
    let mut i = 0;
    samples.retain(|_| {
        i += 1;
        i % 2 == 1
    });
    samples.extend(last);
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

/// The sizing figures and latencies under load of a finished track.
pub fn summarize(s: &mut ServerSummary, units: &BTreeMap<String, &'static str>) {
    let mut steady: Vec<&ServerSample> = s.samples.iter().filter(|x| x.steady).collect();
    if steady.is_empty() {
        steady = s.samples.iter().filter(|x| x.agents > 0).collect();
        if !steady.is_empty() {
            s.notes.push(
                "no interval was wholly at steady state (the run ended within an interval of \
                 its ramp): figures from the intervals with agents connected"
                    .into(),
            );
        }
    }
    let of = |f: &dyn Fn(&ServerSample) -> Option<f64>| -> Vec<f64> {
        steady.iter().filter_map(|x| f(x)).collect()
    };
    let cpu = |x: &ServerSample| x.cpu_cores;
    let rss = |x: &ServerSample| x.rss_bytes.map(|b| b as f64);
    let agents = mean(&of(&|x| Some(x.agents as f64))).unwrap_or(0.0);
    let level = |f: &dyn Fn(&ServerSample) -> Option<f64>| Level {
        baseline: f(&s.baseline),
        mean: mean(&of(f)),
        max: s.samples.iter().filter_map(f).reduce(f64::max),
    };
    let cpu_level = level(&cpu);
    let rss_level = level(&rss);
    let per = |l: &Level, each: f64| match (l.mean, l.baseline) {
        (Some(m), Some(b)) if agents >= 1.0 => Some((m - b) / agents * each),
        _ => None,
    };
    s.sizing = ServerSizing {
        steady_s: match (steady.first(), steady.last()) {
            (Some(a), Some(b)) => Some((a.t_s, b.t_s)),
            _ => None,
        },
        agents,
        cores_per_1000_agents: per(&cpu_level, 1000.0),
        rss_per_agent_kib: per(&rss_level, 1.0 / 1024.0),
        cpu_cores: cpu_level,
        rss_bytes: rss_level,
        // Set by the run, which knows its connects.
        cpu_ms_per_connect: None,
    };
    let mut names: Vec<&String> = s
        .samples
        .iter()
        .flat_map(|x| x.latencies.keys())
        .chain(s.baseline.latencies.keys())
        .collect();
    names.sort();
    names.dedup();
    let mut out = BTreeMap::new();
    for name in names {
        let qs: Vec<&Quantiles> = steady
            .iter()
            .filter_map(|x| x.latencies.get(name))
            .collect();
        let count: f64 = qs.iter().map(|q| q.count).sum();
        let weighted: f64 = qs.iter().filter_map(|q| q.mean.map(|m| m * q.count)).sum();
        let base = s.baseline.latencies.get(name);
        out.insert(
            name.clone(),
            LatencyUnderLoad {
                baseline_p50: base.and_then(|b| b.p50.or(b.mean)),
                baseline_p99: base.and_then(|b| b.p99.or(b.max)),
                p50: median(qs.iter().filter_map(|q| q.p50.or(q.mean)).collect()),
                p99: qs.iter().filter_map(|q| q.p99.or(q.max)).reduce(f64::max),
                mean: (count > 0.0).then(|| weighted / count),
                count,
                unit: units.get(name).map(|u| u.to_string()).unwrap_or_default(),
            },
        );
    }
    s.latencies = out;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reading::parse_prometheus;

    fn all(_: kinds::ServerKind, _: &str) -> bool {
        true
    }

    fn run(t_s: f64, agents: u64) -> RunState {
        RunState {
            t_s,
            agents,
            ramp_done: true,
            ending: false,
        }
    }

    #[test]
    fn counters_become_rates_and_cpu_cores() {
        let a = parse_prometheus(
            "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 10\n\
             # TYPE consul_rpc_request counter\nconsul_rpc_request 100\n",
            &all,
        );
        let b = parse_prometheus(
            "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 15\n\
             # TYPE consul_rpc_request counter\nconsul_rpc_request 150\n\
             # TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes 1e6\n",
            &all,
        );
        let s = sample(Some((&a, 0.0)), &b, run(5.0, 10));
        assert_eq!(s.cpu_cores, Some(1.0));
        assert_eq!(s.values["consul_rpc_request_per_s"], 10.0);
        assert_eq!(s.rss_bytes, Some(1_000_000));
        assert_eq!(sample(None, &b, run(0.0, 0)).cpu_cores, None);
    }

    #[test]
    fn summaries_are_milliseconds_and_keep_the_busiest_label_set() {
        let text = |c: u32| {
            format!(
                "# TYPE consul_raft_commitTime summary\n\
                 consul_raft_commitTime{{quantile=\"0.5\"}} 0.02\n\
                 consul_raft_commitTime{{quantile=\"0.99\"}} 0.5\n\
                 consul_raft_commitTime_sum {}\nconsul_raft_commitTime_count {c}\n",
                f64::from(c) * 0.03
            )
        };
        let a = parse_prometheus(&text(100), &all);
        let b = parse_prometheus(&text(300), &all);
        let s = sample(Some((&a, 0.0)), &b, run(5.0, 10));
        let q = &s.latencies["consul_raft_commit_time"];
        assert_eq!(q.p50, Some(20.0));
        assert_eq!(q.p99, Some(500.0));
        assert_eq!(q.count, 200.0);
        assert!((q.mean.unwrap() - 30.0).abs() < 1e-9, "{q:?}");
    }

    #[test]
    fn histogram_quantiles_come_from_the_buckets_filled_in_the_interval() {
        let prev = [(0.001, 10.0), (0.01, 10.0), (f64::INFINITY, 10.0)];
        let cur = [(0.001, 10.0), (0.01, 110.0), (f64::INFINITY, 110.0)];
        // 100 new observations, all in (1 ms, 10 ms]: the median half-way.
        let p50 = bucket_quantile(&prev, &cur, 0.5).unwrap();
        assert!((p50 - 0.0055).abs() < 1e-12, "{p50}");
        assert_eq!(bucket_quantile(&cur, &cur, 0.5), None);
        let over = [(0.001, 0.0), (f64::INFINITY, 5.0)];
        assert_eq!(bucket_quantile(&[], &over, 0.99), Some(0.001));
    }

    #[test]
    fn sizing_is_from_the_steady_state_above_the_baseline() {
        let mk = |t_s: f64, agents: u64, cpu: f64, rss: u64, steady: bool| ServerSample {
            t_s,
            agents,
            steady,
            cpu_cores: Some(cpu),
            rss_bytes: Some(rss),
            ..ServerSample::default()
        };
        let mut s = ServerSummary {
            baseline: mk(-1.0, 0, 0.1, 100 << 20, false),
            samples: vec![
                mk(5.0, 500, 3.0, 120 << 20, false),
                mk(10.0, 1000, 1.1, 200 << 20, true),
                mk(15.0, 1000, 1.1, 200 << 20, true),
            ],
            ..ServerSummary::default()
        };
        summarize(&mut s, &BTreeMap::new());
        let z = &s.sizing;
        assert_eq!(z.steady_s, Some((10.0, 15.0)));
        assert_eq!(z.agents, 1000.0);
        assert!((z.cores_per_1000_agents.unwrap() - 1.0).abs() < 1e-9);
        assert!((z.rss_per_agent_kib.unwrap() - 102.4).abs() < 1e-9);
        assert_eq!(z.cpu_cores.max, Some(3.0));
    }
}
