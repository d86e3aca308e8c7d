//! How long the server's writes take, in the summaries a 1.20.1 server
//! exports at `/v1/agent/metrics`: `consul.kvs.apply` (`KVS.Apply`, a KV
//! `PUT`/`DELETE`), `consul.txn.apply` and `consul.txn.read` (a txn with
//! and without writes), in milliseconds: a count and sum since start and
//! quantiles 0.5, 0.9, 0.99 over the latest samples (NaN with none, as a
//! real server's summary prints an empty window).

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::time::Duration;

/// Samples kept per summary for its quantiles.
const WINDOW: usize = 1024;

/// The summaries, by name.
pub(crate) const NAMES: [(&str, &str); 3] = [
    (
        "kvs_apply",
        "Measures the time it takes to complete an update to the KV store.",
    ),
    (
        "txn_apply",
        "Measures the time spent applying a transaction operation.",
    ),
    (
        "txn_read",
        "Measures the time spent returning a read transaction.",
    ),
];

/// Which summary a sample goes to.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Timed {
    KvsApply = 0,
    TxnApply = 1,
    TxnRead = 2,
}

#[derive(Default)]
struct Summary {
    count: u64,
    sum_ms: f64,
    // Bound: WINDOW samples (the oldest dropped).
    recent: VecDeque<f64>,
}

impl Summary {
    fn quantile(&self, q: f64) -> f64 {
        if self.recent.is_empty() {
            return f64::NAN;
        }
        let mut v: Vec<f64> = self.recent.iter().copied().collect();
        v.sort_by(f64::total_cmp);
        v[((v.len() - 1) as f64 * q).round() as usize]
    }
}

/// Records a txn's time when dropped (every answer of a txn that got
/// past its parsing): `txn.apply`, or `txn.read` for reads only.
pub(crate) struct TxnTimer<'a> {
    state: &'a super::ConsulState,
    which: Timed,
    started: std::time::Instant,
}

impl<'a> TxnTimer<'a> {
    pub(crate) fn start(state: &'a super::ConsulState, writes: bool) -> Self {
        Self {
            state,
            which: if writes {
                Timed::TxnApply
            } else {
                Timed::TxnRead
            },
            started: std::time::Instant::now(),
        }
    }
}

impl Drop for TxnTimer<'_> {
    fn drop(&mut self) {
        self.state.timed(self.which, self.started);
    }
}

/// The three summaries.
#[derive(Default)]
pub(crate) struct Timings {
    summaries: [Summary; 3],
}

impl Timings {
    pub(crate) fn record(&mut self, which: Timed, took: Duration) {
        let s = &mut self.summaries[which as usize];
        let ms = took.as_secs_f64() * 1e3;
        s.count += 1;
        s.sum_ms += ms;
        if s.recent.len() == WINDOW {
            s.recent.pop_front();
        }
        s.recent.push_back(ms);
    }

    /// The Prometheus text a real server prints for these summaries.
    pub(crate) fn prometheus(&self) -> String {
        let mut out = String::new();
        for ((name, help), s) in NAMES.iter().zip(&self.summaries) {
            let m = format!("consul_{name}");
            let _ = writeln!(out, "# HELP {m} {help}");
            let _ = writeln!(out, "# TYPE {m} summary");
            for q in ["0.5", "0.9", "0.99"] {
                let v = s.quantile(q.parse().unwrap_or(0.5));
                let _ = writeln!(out, "{m}{{quantile=\"{q}\"}} {}", go_float(v));
            }
            let _ = writeln!(out, "{m}_sum {}", go_float(s.sum_ms));
            let _ = writeln!(out, "{m}_count {}", s.count);
        }
        out
    }

    /// `Samples` of the JSON `/v1/agent/metrics` (only those with a count).
    pub(crate) fn samples(&self) -> Vec<serde_json::Value> {
        NAMES
            .iter()
            .zip(&self.summaries)
            .filter(|(_, s)| s.count > 0)
            .map(|((name, _), s)| {
                let min = s.recent.iter().copied().fold(f64::INFINITY, f64::min);
                let max = s.recent.iter().copied().fold(0.0, f64::max);
                serde_json::json!({
                    "Name": format!("consul.{}", name.replace('_', ".")),
                    "Count": s.count,
                    "Sum": s.sum_ms,
                    "Min": min,
                    "Max": max,
                    "Mean": s.sum_ms / s.count as f64,
                    "Labels": {},
                })
            })
            .collect()
    }
}

/// A float as Go's Prometheus client prints it (`NaN`).
fn go_float(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_print_as_a_real_servers() {
        let mut t = Timings::default();
        let empty = t.prometheus();
        assert!(empty.contains("consul_kvs_apply{quantile=\"0.5\"} NaN\n"));
        assert!(empty.contains("consul_txn_read_count 0\n"));
        for ms in [1, 2, 3, 4] {
            t.record(Timed::KvsApply, Duration::from_millis(ms));
        }
        let text = t.prometheus();
        assert!(text.contains(
            "# HELP consul_kvs_apply Measures the time it takes to complete an update to the KV store.\n"
        ));
        assert!(
            text.contains("consul_kvs_apply{quantile=\"0.99\"} 4\n"),
            "{text}"
        );
        assert!(text.contains("consul_kvs_apply_sum 10\nconsul_kvs_apply_count 4\n"));
        let samples = t.samples();
        assert_eq!(samples.len(), 1);
        assert_eq!(samples[0]["Name"], "consul.kvs.apply");
        assert_eq!(samples[0]["Mean"], 2.5);
    }
}
