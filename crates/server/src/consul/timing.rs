//! How long the server's writes take, in the summaries a 1.20.1 server
//! exports at `/v1/agent/metrics`: `consul.kvs.apply` (`KVS.Apply`, a KV
//! `PUT`/`DELETE`), `consul.txn.apply` and `consul.txn.read` (a txn with
//! and without writes), in milliseconds; and [`Summary`], the shape every
//! go-metrics sample takes in Prometheus text (these and the serf port's,
//! `consul::serf`): a count and sum since start and quantiles 0.5, 0.9,
//! 0.99 over the samples of the last 10 s (go-metrics' Prometheus sink sets
//! `MaxAge` 10 s; NaN with none, as a real server prints an empty window).

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::time::Duration;

use tokio::time::Instant;

/// How far back a summary's quantiles look (go-metrics' `MaxAge`).
const MAX_AGE: Duration = Duration::from_secs(10);
/// Samples kept per summary for its quantiles at most (in a burst beyond
/// it, the oldest of the window go first).
const WINDOW: usize = 4096;

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

/// One go-metrics sample series as its Prometheus summary shows it.
#[derive(Debug, Default)]
pub(crate) struct Summary {
    count: u64,
    sum: f64,
    // Bound: WINDOW samples, none older than 10 s once pruned.
    recent: VecDeque<(Instant, f64)>,
}

impl Summary {
    /// Adds a sample taken now.
    pub(crate) fn record(&mut self, v: f64) {
        let now = Instant::now();
        self.prune(now);
        self.count += 1;
        self.sum += v;
        if self.recent.len() == WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back((now, v));
    }

    fn prune(&mut self, now: Instant) {
        while let Some((at, _)) = self.recent.front() {
            if now.duration_since(*at) <= MAX_AGE {
                break;
            }
            self.recent.pop_front();
        }
    }

    /// The samples of the window, at `now`.
    fn window(&self, now: Instant) -> impl Iterator<Item = f64> + '_ {
        self.recent
            .iter()
            .filter(move |(at, _)| now.duration_since(*at) <= MAX_AGE)
            .map(|(_, v)| *v)
    }

    fn quantile(&self, q: f64, now: Instant) -> f64 {
        let mut v: Vec<f64> = self.window(now).collect();
        if v.is_empty() {
            return f64::NAN;
        }
        v.sort_by(f64::total_cmp);
        v[((v.len() - 1) as f64 * q).round() as usize]
    }

    /// Its lines of Prometheus text (HELP, TYPE, quantiles, sum, count)
    /// under `name`, with `labels` (`network="lan"`, or empty) on each.
    pub(crate) fn write(&self, out: &mut String, name: &str, labels: &str, help: &str) {
        let now = Instant::now();
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} summary");
        let sep = if labels.is_empty() { "" } else { "," };
        for (q, text) in [(0.5, "0.5"), (0.9, "0.9"), (0.99, "0.99")] {
            let v = go_float(self.quantile(q, now));
            let _ = writeln!(out, "{name}{{{labels}{sep}quantile=\"{text}\"}} {v}");
        }
        let braced = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_sum{braced} {}", go_float(self.sum));
        let _ = writeln!(out, "{name}_count{braced} {}", self.count);
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
        self.summaries[which as usize].record(took.as_secs_f64() * 1e3);
    }

    /// The Prometheus text a real server prints for these summaries.
    pub(crate) fn prometheus(&self) -> String {
        let mut out = String::new();
        for ((name, help), s) in NAMES.iter().zip(&self.summaries) {
            s.write(&mut out, &format!("consul_{name}"), "", help);
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
                let now = Instant::now();
                let min = s.window(now).fold(f64::INFINITY, f64::min);
                let max = s.window(now).fold(0.0, f64::max);
                serde_json::json!({
                    "Name": format!("consul.{}", name.replace('_', ".")),
                    "Count": s.count,
                    "Sum": s.sum,
                    "Min": min,
                    "Max": max,
                    "Mean": s.sum / s.count as f64,
                    "Labels": {},
                })
            })
            .collect()
    }
}

/// A float as Go's Prometheus client prints it (`strconv`'s shortest `%g`:
/// `NaN`, `12345`, `1.5e+06`, `1e-05`).
pub(crate) fn go_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    if v == 0.0 {
        return "0".into();
    }
    // The shortest digits that read back as `v`, and the exponent.
    let e = format!("{:e}", v.abs());
    let (mantissa, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if v < 0.0 { "-" } else { "" };
    // Go's `%g` with the shortest precision: exponent form below 1e-4 and
    // from 1e6 on (its precision for the decision is 6).
    if !(-4..6).contains(&exp) {
        let (first, rest) = digits.split_at(1);
        let dot = if rest.is_empty() { "" } else { "." };
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{first}{dot}{rest}e{esign}{:02}", exp.abs());
    }
    if exp < 0 {
        let zeros = "0".repeat((-exp - 1) as usize);
        return format!("{sign}0.{zeros}{digits}");
    }
    let int_len = exp as usize + 1;
    if digits.len() <= int_len {
        let zeros = "0".repeat(int_len - digits.len());
        format!("{sign}{digits}{zeros}")
    } else {
        format!("{sign}{}.{}", &digits[..int_len], &digits[int_len..])
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

    #[test]
    fn floats_print_as_go_prints_them() {
        let cases = [
            (0.0, "0"),
            (1.0, "1"),
            (337_000.0, "337000"),
            (2_321_260.0, "2.32126e+06"),
            (315_360_000.0, "3.1536e+08"),
            (1e6, "1e+06"),
            (0.0057680001482367516, "0.0057680001482367516"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-2.5, "-2.5"),
            (f64::NAN, "NaN"),
        ];
        for (v, want) in cases {
            assert_eq!(go_float(v), want, "{v}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn quantiles_look_back_ten_seconds_and_counts_go_on() {
        let mut s = Summary::default();
        s.record(3.0);
        let mut out = String::new();
        s.write(&mut out, "consul_x", "network=\"lan\"", "x");
        assert!(
            out.contains("consul_x{network=\"lan\",quantile=\"0.5\"} 3\n"),
            "{out}"
        );
        tokio::time::advance(Duration::from_secs(11)).await;
        out.clear();
        s.write(&mut out, "consul_x", "network=\"lan\"", "x");
        assert!(
            out.contains("consul_x{network=\"lan\",quantile=\"0.99\"} NaN\n"),
            "{out}"
        );
        assert!(
            out.contains("consul_x_sum{network=\"lan\"} 3\nconsul_x_count{network=\"lan\"} 1\n")
        );
    }
}
