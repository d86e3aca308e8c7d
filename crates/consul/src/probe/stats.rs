//! Exact statistics of probe arrivals: nearest-rank percentiles and the
//! [`ProbeSummary`] of a set of latencies (a probe's, or an observed
//! change's: `board` builds that one). A leaf: it imports no sibling.

use std::collections::BTreeMap;
use std::time::SystemTime;

use agent_sim_metrics::{LatencySummary, ProbeSummary, new_latency_histogram};
use tokio::time::Instant;

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
        t0: agent_sim_metrics::units::rfc3339(t0),
        delivered,
        expected,
        time_to_99pct_us,
        latency_us: latency,
        ..ProbeSummary::default()
    }
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

/// Microseconds from `t0` to `at` (0 when `at` is earlier).
pub fn micros_after(t0: Instant, at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(t0).as_micros()).unwrap_or(u64::MAX)
}
