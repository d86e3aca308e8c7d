//! Reading an assertion's metric from a run [`Summary`]: its value in the
//! path's base unit, or why the summary has none ([`Absent`], the failed
//! verdict's note).

use std::collections::BTreeMap;

use super::Metric;
use crate::histo::add_into;
use crate::summary::{LatencySummary, Summary};
use crate::{MetricsError, new_latency_histogram};

fn latency_stat(l: &LatencySummary, stat: &str) -> f64 {
    match stat {
        "count" => l.count as f64,
        "min" => l.min as f64,
        "p50" => l.p50 as f64,
        "p75" => l.p75 as f64,
        "p90" => l.p90 as f64,
        "p95" => l.p95 as f64,
        "p99" => l.p99 as f64,
        "p999" => l.p999 as f64,
        "max" => l.max as f64,
        _ => l.mean,
    }
}

/// Why a metric could not be read from the summary: the assertion fails
/// with these words as its note.
#[derive(Debug, thiserror::Error)]
pub enum Absent {
    /// No latency of that name (nor a fallback for it).
    #[error("no latency {name:?} in the summary (has: {})", listed(have))]
    Latency {
        /// The name asked for.
        name: String,
        /// The latencies the summary has.
        have: Vec<String>,
    },
    /// The latency is there but empty.
    #[error("latency {0:?} has no samples")]
    NoSamples(String),
    /// A histogram to merge (a probe's, a disruption's) did not decode.
    #[error("{0}")]
    Histogram(#[source] MetricsError),
    /// No counter of that name.
    #[error("no counter {name:?} in the summary (has: {})", listed(have))]
    Counter {
        /// The name asked for.
        name: String,
        /// The counters the summary has.
        have: Vec<String>,
    },
    /// No rate of that name.
    #[error("no rate {0:?} in the summary")]
    Rate(String),
    /// No probe expected any subscriber.
    #[error("no probes with expected subscribers in the summary")]
    NoProbesExpected,
    /// No probes at all.
    #[error("no probes in the summary")]
    NoProbes,
    /// A probe never reached 99 % of its subscribers.
    #[error("probe #{0} never reached 99 %")]
    ProbeNever99(u64),
    /// No disruptions at all.
    #[error("no disruptions in the summary")]
    NoDisruptions,
    /// A disruption's lost sessions never came back to the share asked.
    #[error("disruption #{id} ({cause}) never got there")]
    NeverBack {
        /// The disruption's number.
        id: u64,
        /// What it was.
        cause: String,
    },
    /// No server was observed.
    #[error("no server was observed (--observe)")]
    NoServer,
    /// No observed server kept that series or latency.
    #[error(
        "no observed server has {name}{} (latencies kept: {})",
        if stat.is_empty() { String::new() } else { format!(".{stat}") },
        listed(kept)
    )]
    ServerSeries {
        /// The series or latency.
        name: String,
        /// Its statistic (empty for the sizing figures).
        stat: String,
        /// The latencies the observed servers kept.
        kept: Vec<String>,
    },
    /// No observed Consul server reported the gossip members.
    #[error(
        "no observed Consul server reported the run's gossip members (a fleet that \
         gossips and --observe consul)"
    )]
    NoGossip,
    /// The run was not a stepped one.
    #[error("the run had no --steps")]
    NotStepped,
    /// The stepped run has no such step.
    #[error("capacity.{0}: no such step (none held, or none failed)")]
    NoKnee(&'static str),
    /// The run had no Vault servers.
    #[error("the run had no Vault servers (--vault-nodes)")]
    NoVault,
}

/// Names joined with commas, or `none`.
fn listed(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

/// The names of a map's keys.
fn keys<V>(m: &BTreeMap<String, V>) -> Vec<String> {
    m.keys().cloned().collect()
}

/// The histograms of `parts` merged (`what` names each in an error).
fn merged<'a>(
    parts: impl Iterator<Item = (&'a LatencySummary, String)>,
) -> Result<LatencySummary, Absent> {
    let mut acc = new_latency_histogram();
    for (l, what) in parts {
        let h = l.merge_histogram(&what).map_err(Absent::Histogram)?;
        add_into(&mut acc, &h).map_err(Absent::Histogram)?;
    }
    Ok(LatencySummary::from_histogram(&acc))
}

/// Latency summary by name; `propagation` falls back to the probes' merged
/// histograms, `reconvergence` is the disruptions' merged.
fn find_latency(s: &Summary, name: &str) -> Result<LatencySummary, Absent> {
    if let Some(l) = s.latency_us.get(name) {
        return Ok(l.clone());
    }
    if name == "propagation" && !s.probes.is_empty() {
        if let [only] = s.probes.as_slice() {
            return Ok(only.latency_us.clone());
        }
        return merged(
            s.probes
                .iter()
                .map(|p| (&p.latency_us, format!("probe #{}", p.id))),
        );
    }
    if name == "reconvergence" {
        if s.disruptions.is_empty() {
            return Err(Absent::NoDisruptions);
        }
        return merged(
            s.disruptions
                .iter()
                .map(|d| (&d.reconnect_us, format!("disruption #{}", d.id))),
        );
    }
    Err(Absent::Latency {
        name: name.to_owned(),
        have: keys(&s.latency_us),
    })
}

/// The measured value of `m` in its base unit, or why the summary has none.
pub(super) fn actual(m: &Metric, s: &Summary) -> Result<f64, Absent> {
    Ok(match m {
        Metric::Latency { name, stat } => {
            let l = find_latency(s, name)?;
            if l.count == 0 && *stat != "count" {
                return Err(Absent::NoSamples(name.clone()));
            }
            latency_stat(&l, stat)
        }
        Metric::Agents(f) => agents_stat(s, f),
        Metric::ErrorsTotal => s.errors_total() as f64,
        Metric::Error(kind) => s.errors.get(kind).map_or(0, |e| e.count) as f64,
        Metric::Warning(kind) => s.warnings.get(kind).map_or(0, |e| e.count) as f64,
        Metric::Counter(name) => *s.counters.get(name).ok_or_else(|| Absent::Counter {
            name: name.clone(),
            have: keys(&s.counters),
        })? as f64,
        Metric::Rate(name) => *s
            .rates_per_s
            .get(name)
            .ok_or_else(|| Absent::Rate(name.clone()))?,
        Metric::ProbesDeliveredRatio => s
            .probes
            .iter()
            .filter(|p| p.expected > 0)
            .map(|p| p.delivered as f64 / p.expected as f64)
            .reduce(f64::min)
            .ok_or(Absent::NoProbesExpected)?,
        Metric::ProbesTimeTo99 => probes_time_to_99(s)?,
        Metric::Disruptions(f) => disruptions_stat(s, f),
        Metric::DisruptionsBackAfter(f) => disruptions_back_after(s, f)?,
        Metric::PeakRss => s.process.peak_rss_bytes as f64,
        Metric::CpuUser => s.process.cpu_user_s,
        Metric::CpuSys => s.process.cpu_sys_s,
        Metric::DurationS => s.duration_s,
        Metric::Gossip(f) => gossip_stat(s, f)?,
        Metric::Vault(f) => s
            .vault
            .as_ref()
            .and_then(|v| v.stat(f))
            .ok_or(Absent::NoVault)?,
        Metric::Server { name, stat } => server_stat_value(s, name, stat)?,
        Metric::Capacity(f) => {
            let c = s.capacity.as_ref().ok_or(Absent::NotStepped)?;
            let v = if *f == "agents" {
                c.capacity
            } else {
                c.broke_at
            };
            v.ok_or(Absent::NoKnee(f))? as f64
        }
    })
}

/// `agents.<f>`.
fn agents_stat(s: &Summary, f: &str) -> f64 {
    (match f {
        "requested" => s.agents.requested,
        "connected" => s.agents.connected,
        "peak_connected" => s.agents.peak_connected,
        "ever_connected" => s.agents.ever_connected,
        "lost_not_back" => s.agents.lost_not_back,
        "left" => s.agents.left,
        _ => s.agents.never_connected,
    }) as f64
}

/// The largest time-to-99 % over the probes; none if one never got there.
fn probes_time_to_99(s: &Summary) -> Result<f64, Absent> {
    if s.probes.is_empty() {
        return Err(Absent::NoProbes);
    }
    let mut worst = 0u64;
    for p in &s.probes {
        let t = p.time_to_99pct_us.ok_or(Absent::ProbeNever99(p.id))?;
        worst = worst.max(t);
    }
    Ok(worst as f64)
}

/// `disruptions.<f>`, summed over the disruptions.
fn disruptions_stat(s: &Summary, f: &str) -> f64 {
    let d = &s.disruptions;
    (match f {
        "count" => d.len() as u64,
        "sessions_lost" => d.iter().map(|x| x.sessions_lost).sum(),
        "back" => d.iter().map(|x| x.back).sum(),
        "missing" => d.iter().map(|x| x.missing()).sum(),
        _ => d.iter().map(|x| x.attempts).sum(),
    }) as f64
}

/// `disruptions.back_after_<p>` in µs: the longest over the disruptions.
fn disruptions_back_after(s: &Summary, f: &str) -> Result<f64, Absent> {
    if s.disruptions.is_empty() {
        return Err(Absent::NoDisruptions);
    }
    let mut worst = 0f64;
    for d in &s.disruptions {
        let b = &d.back_after_s;
        let v = match f {
            "back_after_p50" => b.p50,
            "back_after_p90" => b.p90,
            "back_after_p99" => b.p99,
            _ => b.p100,
        };
        let x = v.ok_or_else(|| Absent::NeverBack {
            id: d.id,
            cause: d.cause.clone(),
        })?;
        worst = worst.max(x * 1e6);
    }
    Ok(worst.round())
}

/// `server.<name>[.<stat>]`: the highest among the observed servers.
fn server_stat_value(s: &Summary, name: &str, stat: &str) -> Result<f64, Absent> {
    if s.server.is_empty() {
        return Err(Absent::NoServer);
    }
    s.server
        .iter()
        .filter_map(|srv| match name {
            "cores_per_1000_agents" => srv.sizing.cores_per_1000_agents,
            "rss_per_agent_kib" => srv.sizing.rss_per_agent_kib,
            "cpu_ms_per_connect" => srv.sizing.cpu_ms_per_connect,
            _ => srv.stat(name, stat),
        })
        .reduce(f64::max)
        .ok_or_else(|| {
            let mut kept: Vec<String> = s
                .server
                .iter()
                .flat_map(|srv| srv.latencies.keys().cloned())
                .collect();
            kept.sort_unstable();
            kept.dedup();
            Absent::ServerSeries {
                name: name.to_owned(),
                stat: stat.to_owned(),
                kept,
            }
        })
}

/// The highest `gossip.<field>` among the observed servers.
fn gossip_stat(s: &Summary, field: &str) -> Result<f64, Absent> {
    s.server
        .iter()
        .filter_map(|srv| srv.gossip.as_ref()?.stat(field))
        .max()
        .map(|v| v as f64)
        .ok_or(Absent::NoGossip)
}
