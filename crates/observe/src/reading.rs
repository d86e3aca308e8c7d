//! One scrape as typed series: what a server said at one moment, keyed by
//! the series' exposed name (label sets of counters and gauges summed,
//! those of summaries kept apart, histogram buckets added per bound).
//!
//! The Prometheus text format is parsed with `prometheus-parse`: the most
//! used parser of the format on crates.io, small (a regex per line type),
//! and it reads what Go servers write: typed summaries with `quantile`
//! labels, histograms with `le` buckets, `NaN` and `+Inf`. It keeps
//! `_sum`/`_count` as separate untyped samples, which [`Reading`] joins
//! back to their summary or histogram. Consul's JSON format
//! (`/v1/agent/metrics`) and `/proc/PID` become the same series.

use std::collections::BTreeMap;

use agent_sim_metrics::process::ProcReading;

use crate::kinds::{self, ServerKind};

/// One series at one scrape.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A counter (total since the server started).
    Counter(f64),
    /// A gauge.
    Gauge(f64),
    /// A rate the server already computed (Consul's JSON counters, per s).
    Rate(f64),
    /// A summary: per label set, its quantiles (NaN left out), sum and count.
    Summary(BTreeMap<String, SummarySet>),
    /// A histogram: cumulative counts per upper bound (label sets added),
    /// sum and count.
    Histogram {
        /// `(le, cumulative count)`, increasing `le`, `+Inf` last.
        buckets: Vec<(f64, f64)>,
        /// Sum of observations.
        sum: f64,
        /// Observations.
        count: f64,
    },
    /// Consul's JSON sample: one 10-second window's aggregate.
    Window {
        /// Mean of the window.
        mean: f64,
        /// Largest of the window.
        max: f64,
        /// Observations in the window.
        count: f64,
    },
}

/// One label set of a summary.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SummarySet {
    /// `(quantile, value)`, NaN left out.
    pub quantiles: Vec<(f64, f64)>,
    /// Sum of observations since the start.
    pub sum: f64,
    /// Observations since the start.
    pub count: f64,
}

/// What one scrape said.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reading {
    /// The kind the series tell.
    pub kind: Option<ServerKind>,
    /// Kept series by exposed name.
    pub series: BTreeMap<String, Value>,
    /// Series in the scrape (kept or not).
    pub exposed: usize,
}

impl Reading {
    /// A value of a counter or gauge.
    pub fn scalar(&self, name: &str) -> Option<f64> {
        match self.series.get(name)? {
            Value::Counter(v) | Value::Gauge(v) | Value::Rate(v) => Some(*v),
            _ => None,
        }
    }
}

fn add_scalar(series: &mut BTreeMap<String, Value>, name: &str, v: Value) {
    match (series.get_mut(name), v) {
        (Some(Value::Counter(a)), Value::Counter(b)) | (Some(Value::Gauge(a)), Value::Gauge(b)) => {
            *a += b
        }
        (None, v) => {
            series.insert(name.to_string(), v);
        }
        _ => {}
    }
}

/// A line with any colon of its series name made `_`: the format allows
/// colons in names (Consul's `consul_serf_events_consul:new_leader`), the
/// parser reads a name as word characters only and would skip the line.
fn colons_out(line: &str) -> String {
    let at = match line.strip_prefix("# ") {
        Some(rest) if rest.starts_with("TYPE ") || rest.starts_with("HELP ") => 7,
        Some(_) => return line.to_string(),
        None => 0,
    };
    let end = line[at..]
        .find(|c: char| c == '{' || c.is_whitespace())
        .map_or(line.len(), |n| at + n);
    let name = &line[at..end];
    if !name.contains(':') {
        return line.to_string();
    }
    format!("{}{}{}", &line[..at], name.replace(':', "_"), &line[end..])
}

/// Parses the Prometheus text format, keeping what `keep(kind, name)`
/// wants (the kind is told by every series name first). A colon in a
/// series name reads as `_`.
pub fn parse_prometheus(text: &str, keep: &dyn Fn(ServerKind, &str) -> bool) -> Reading {
    let lines = text.lines().map(|l| Ok(colons_out(l)));
    let Ok(scrape) = prometheus_parse::Scrape::parse(lines) else {
        return Reading::default();
    };
    let kind = kinds::detect(scrape.samples.iter().map(|s| s.metric.as_str()));
    let mut names: Vec<&str> = scrape.samples.iter().map(|s| s.metric.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    let mut series: BTreeMap<String, Value> = BTreeMap::new();
    // `_sum` and `_count` of summaries and histograms, by base name and labels.
    let mut sums: BTreeMap<(String, String), (f64, f64)> = BTreeMap::new();
    for s in &scrape.samples {
        use prometheus_parse::Value as P;
        let labels = label_key(&s.labels);
        match &s.value {
            P::Counter(v) if keep(kind, &s.metric) => {
                add_scalar(&mut series, &s.metric, Value::Counter(*v))
            }
            P::Gauge(v) if keep(kind, &s.metric) => {
                add_scalar(&mut series, &s.metric, Value::Gauge(*v))
            }
            P::Untyped(v) => {
                for (suffix, slot) in [("_sum", 0), ("_count", 1)] {
                    if let Some(base) = s.metric.strip_suffix(suffix)
                        && keep(kind, base)
                    {
                        let e = sums.entry((base.to_string(), labels.clone())).or_default();
                        if slot == 0 {
                            e.0 = *v;
                        } else {
                            e.1 = *v;
                        }
                    }
                }
                if keep(kind, &s.metric) && !v.is_nan() {
                    add_scalar(&mut series, &s.metric, Value::Gauge(*v));
                }
            }
            P::Summary(qs) if keep(kind, &s.metric) => {
                let set = SummarySet {
                    quantiles: qs
                        .iter()
                        .filter(|q| !q.count.is_nan())
                        .map(|q| (q.quantile, q.count))
                        .collect(),
                    ..SummarySet::default()
                };
                if let Value::Summary(sets) = series
                    .entry(s.metric.clone())
                    .or_insert_with(|| Value::Summary(BTreeMap::new()))
                {
                    sets.insert(labels, set);
                }
            }
            P::Histogram(hs) if keep(kind, &s.metric) => {
                let entry = series.entry(s.metric.clone()).or_insert(Value::Histogram {
                    buckets: Vec::new(),
                    sum: 0.0,
                    count: 0.0,
                });
                if let Value::Histogram { buckets, .. } = entry {
                    for h in hs {
                        match buckets.iter_mut().find(|(le, _)| *le == h.less_than) {
                            Some(b) => b.1 += h.count,
                            None => buckets.push((h.less_than, h.count)),
                        }
                    }
                    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
                }
            }
            _ => {}
        }
    }
    for ((base, labels), (sum, count)) in sums {
        match series.get_mut(&base) {
            Some(Value::Summary(sets)) => {
                let set = sets.entry(labels).or_default();
                set.sum = sum;
                set.count = count;
            }
            Some(Value::Histogram {
                sum: s, count: c, ..
            }) => {
                *s += sum;
                *c += count;
            }
            _ => {}
        }
    }
    Reading {
        kind: Some(kind),
        series,
        exposed: names.len(),
    }
}

fn label_key(labels: &prometheus_parse::Labels) -> String {
    let mut pairs: Vec<(&String, &String)> = labels.iter().collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Parses Consul's JSON metrics (`/v1/agent/metrics`): gauges, counters
/// (their per-second rate over the window) and samples (a 10-second
/// window's mean, max and count). Names become the Prometheus sink's
/// (`consul.raft.commitTime` → `consul_raft_commitTime`); the runtime's
/// heap and goroutine gauges become [`kinds::HEAP`] and [`kinds::GOROUTINES`].
pub fn parse_consul_json(text: &str, keep: &dyn Fn(ServerKind, &str) -> bool) -> Reading {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(text) else {
        return Reading::default();
    };
    let kind = ServerKind::Consul;
    let mut series = BTreeMap::new();
    let mut exposed = 0;
    let items = |key: &str| -> Vec<serde_json::Value> {
        v.get(key)
            .and_then(|x| x.as_array())
            .cloned()
            .unwrap_or_default()
    };
    let num = |x: &serde_json::Value, k: &str| x.get(k).and_then(|n| n.as_f64()).unwrap_or(0.0);
    for g in items("Gauges") {
        exposed += 1;
        let name = json_name(&g);
        let name = match name.as_str() {
            "consul_runtime_alloc_bytes" => kinds::HEAP.to_string(),
            "consul_runtime_num_goroutines" => kinds::GOROUTINES.to_string(),
            _ => name,
        };
        if keep(kind, &name) {
            add_scalar(&mut series, &name, Value::Gauge(num(&g, "Value")));
        }
    }
    for c in items("Counters") {
        exposed += 1;
        let name = json_name(&c);
        if keep(kind, &name) {
            let rate = num(&c, "Rate");
            match series.get_mut(&name) {
                Some(Value::Rate(r)) => *r += rate,
                _ => {
                    series.insert(name, Value::Rate(rate));
                }
            }
        }
    }
    for s in items("Samples") {
        exposed += 1;
        let name = json_name(&s);
        if keep(kind, &name) {
            let (mean, max, count) = (num(&s, "Mean"), num(&s, "Max"), num(&s, "Count"));
            match series.get_mut(&name) {
                Some(Value::Window {
                    mean: m,
                    max: x,
                    count: c,
                }) => {
                    let total = *c + count;
                    if total > 0.0 {
                        *m = (*m * *c + mean * count) / total;
                    }
                    *x = x.max(max);
                    *c = total;
                }
                _ => {
                    series.insert(name, Value::Window { mean, max, count });
                }
            }
        }
    }
    Reading {
        kind: Some(kind),
        series,
        exposed,
    }
}

/// A JSON metric's name as the Prometheus sink writes it, and a colon
/// made `_` as [`parse_prometheus`] reads it.
fn json_name(metric: &serde_json::Value) -> String {
    metric["Name"]
        .as_str()
        .unwrap_or_default()
        .replace(['.', ':'], "_")
}

/// A `/proc/PID` reading as the same series a Prometheus process
/// collector exposes.
pub fn from_proc(p: &ProcReading) -> Reading {
    let mut series = BTreeMap::new();
    series.insert(kinds::CPU.to_string(), Value::Counter(p.cpu_s));
    series.insert(kinds::RSS.to_string(), Value::Gauge(p.rss_bytes as f64));
    series.insert(kinds::THREADS.to_string(), Value::Gauge(p.threads as f64));
    if let Some(f) = p.open_fds {
        series.insert(kinds::FDS.to_string(), Value::Gauge(f as f64));
    }
    Reading {
        kind: Some(ServerKind::Process),
        exposed: series.len(),
        series,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(_: ServerKind, _: &str) -> bool {
        true
    }

    #[test]
    fn summaries_join_their_sum_and_count_and_drop_nan() {
        let text = "# TYPE x_latency summary\n\
                    x_latency{op=\"a\",quantile=\"0.5\"} 2\n\
                    x_latency{op=\"a\",quantile=\"0.99\"} NaN\n\
                    x_latency_sum{op=\"a\"} 30\n\
                    x_latency_count{op=\"a\"} 10\n\
                    # TYPE up gauge\nup{a=\"1\"} 1\nup{a=\"2\"} 1\n\
                    # TYPE reqs counter\nreqs 5\n";
        let r = parse_prometheus(text, &all);
        let Some(Value::Summary(sets)) = r.series.get("x_latency") else {
            panic!("{r:?}")
        };
        let set = &sets["op=a"];
        assert_eq!(set.quantiles, vec![(0.5, 2.0)]);
        assert_eq!((set.sum, set.count), (30.0, 10.0));
        assert_eq!(r.scalar("up"), Some(2.0), "label sets of a gauge add up");
        assert_eq!(r.series.get("reqs"), Some(&Value::Counter(5.0)));
    }

    #[test]
    fn a_colon_in_a_series_name_reads_as_an_underscore() {
        let text = "# HELP a:b a:b\n# TYPE a:b counter\na:b{network=\"lan\"} 2\n\
                    # some comment: with a colon\nplain{x=\"c:d\"} 1\n";
        let r = parse_prometheus(text, &all);
        assert_eq!(r.series.get("a_b"), Some(&Value::Counter(2.0)), "{r:?}");
        assert_eq!(r.scalar("plain"), Some(1.0), "a label's colon untouched");
        assert_eq!(colons_out("# some comment: here"), "# some comment: here");
        let json = r#"{"Counters":[{"Name":"consul.serf.events.consul:new_leader","Rate":0.1}]}"#;
        let r = parse_consul_json(json, &all);
        assert_eq!(r.scalar("consul_serf_events_consul_new_leader"), Some(0.1));
    }

    #[test]
    fn histograms_add_their_label_sets_per_bound() {
        let text = "# TYPE d_seconds histogram\n\
                    d_seconds_bucket{k=\"a\",le=\"0.1\"} 1\n\
                    d_seconds_bucket{k=\"a\",le=\"+Inf\"} 2\n\
                    d_seconds_sum{k=\"a\"} 0.25\n\
                    d_seconds_count{k=\"a\"} 2\n\
                    d_seconds_bucket{k=\"b\",le=\"0.1\"} 3\n\
                    d_seconds_bucket{k=\"b\",le=\"+Inf\"} 3\n\
                    d_seconds_sum{k=\"b\"} 0.5\n\
                    d_seconds_count{k=\"b\"} 3\n";
        let r = parse_prometheus(text, &all);
        assert_eq!(
            r.series["d_seconds"],
            Value::Histogram {
                buckets: vec![(0.1, 4.0), (f64::INFINITY, 5.0)],
                sum: 0.75,
                count: 5.0
            }
        );
    }
}
