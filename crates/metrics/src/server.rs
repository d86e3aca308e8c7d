//! The summary's `server` section: what each observed server did during
//! the run (`--observe`), on the run's time axis, and what each agent cost
//! it; for a Consul server while the fleet gossips, its own view of the
//! run's members ([`GossipSummary`]), and what its gossip layers went
//! through ([`crate::storm`]). Written by `agent-sim-observe`, read
//! by the table, the page, the assertions and `report compare`. A model
//! only: nothing here computes but a few readings of its own fields.
//!
//! Units: CPU in cores (1 = one core busy), memory in bytes, latencies in
//! microseconds whatever the server's own unit (Consul's and Sensu's
//! summaries are milliseconds, etcd's histograms seconds: converted when
//! read), rates per second.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One observed server (or process).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerSummary {
    /// Where it was read: the URL (no credentials) or `pid N`.
    pub target: String,
    /// `consul`, `sensu`, `agent-sim` (an `agent-sim serve`), `process`
    /// (`--observe-pid`) or `prometheus` (anything else).
    pub kind: String,
    /// `prometheus` (the text format), `consul-json` (`/v1/agent/metrics`,
    /// no process CPU or RSS) or `proc` (`/proc/PID`).
    pub source: String,
    /// Scrapes that answered.
    pub scrapes: u64,
    /// Scrapes that failed (warnings `observe_failed` say why).
    pub failed: u64,
    /// The server before the first agent dialed.
    pub baseline: ServerSample,
    /// Every scrape during the run, in time order (at most 2,000; longer
    /// runs keep every other one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub samples: Vec<ServerSample>,
    /// The figures people size a cluster by.
    pub sizing: ServerSizing,
    /// Each kept latency at baseline and under load, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub latencies: BTreeMap<String, LatencyUnderLoad>,
    /// What the reader should know about these figures (a fallback taken,
    /// a series asked for that the server does not expose).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The run's gossip members as this Consul server saw them (its
    /// `/v1/agent/members` and `serfHealth` checks), when the fleet gossips.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gossip: Option<GossipSummary>,
    /// What this Consul server's gossip layers and anti-entropy reads went
    /// through, from its own metrics, when it exported any of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storm: Option<crate::storm::StormSummary>,
}

/// The run's gossip members as one Consul server saw them: its
/// `/v1/agent/members` (serf's status of each member) and its critical
/// `serfHealth` checks, polled with the metrics. A member is the run's
/// when its name is a run prefix followed by `-`; one already listed before
/// the run (left or failed by an earlier run of the same prefix) counts
/// from the first time its status changes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GossipSummary {
    /// The name prefixes of the run's members.
    pub prefixes: Vec<String>,
    /// Polls that answered.
    pub polls: u64,
    /// Polls that failed (warnings `observe_failed` say why).
    pub failed_polls: u64,
    /// Members of the prefixes already listed, not alive, before the run.
    #[serde(default)]
    pub stale: u64,
    /// The counts at every poll, in time order (at most 2,000).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub samples: Vec<GossipSample>,
    /// Distinct members seen `failed` at some poll.
    pub failed_ever: u64,
    /// Times a member was seen going `failed` (a member that came back and
    /// failed again counts again).
    pub failed_turns: u64,
    /// Seconds from the run start when the first member was seen failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_failed_s: Option<f64>,
    /// When the last member seen failed was first seen so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failed_s: Option<f64>,
    /// Distinct nodes whose `serfHealth` check was seen critical.
    pub critical_ever: u64,
    /// When the first node was seen with `serfHealth` critical.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_critical_s: Option<f64>,
    /// When the last of them was first seen critical.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_critical_s: Option<f64>,
}

/// The run's members by serf status at one poll, and its nodes with a
/// critical `serfHealth`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct GossipSample {
    /// Seconds from the run start.
    pub t_s: f64,
    /// Status 1: alive (a suspected member stays alive until declared dead).
    pub alive: u64,
    /// Status 2: leaving (its leave intent seen, its leave not yet).
    pub leaving: u64,
    /// Status 3: left.
    pub left: u64,
    /// Status 4: failed.
    pub failed: u64,
    /// Nodes whose `serfHealth` check is critical.
    pub critical: u64,
}

impl GossipSample {
    /// A poll's counts without leaving members or critical nodes (tests).
    #[cfg(test)]
    pub(crate) fn at(t_s: f64, alive: u64, left: u64, failed: u64) -> Self {
        GossipSample {
            t_s,
            alive,
            left,
            failed,
            ..GossipSample::default()
        }
    }

    /// Members not left (alive, leaving or failed).
    pub fn not_left(&self) -> u64 {
        self.alive + self.leaving + self.failed
    }
}

/// Fields `gossip.<field>` of an assertion, read by [`GossipSummary::stat`].
pub const GOSSIP_FIELDS: [&str; 7] = [
    "failed_ever",
    "failed_turns",
    "critical_ever",
    "alive_max",
    "failed_max",
    "critical_max",
    "not_left_at_end",
];

impl GossipSummary {
    /// The poll with the most members alive (the earliest of equals).
    pub fn peak(&self) -> Option<&GossipSample> {
        self.samples
            .iter()
            .reduce(|best, x| if x.alive > best.alive { x } else { best })
    }

    /// The last poll (after the last agent left).
    pub fn at_end(&self) -> Option<&GossipSample> {
        self.samples.last()
    }

    /// One of [`GOSSIP_FIELDS`]; `None` for another name, or for a level
    /// when nothing was polled.
    pub fn stat(&self, field: &str) -> Option<u64> {
        let most = |f: fn(&GossipSample) -> u64| self.samples.iter().map(f).max();
        match field {
            "failed_ever" => Some(self.failed_ever),
            "failed_turns" => Some(self.failed_turns),
            "critical_ever" => Some(self.critical_ever),
            "alive_max" => most(|x| x.alive),
            "failed_max" => most(|x| x.failed),
            "critical_max" => most(|x| x.critical),
            "not_left_at_end" => self.at_end().map(GossipSample::not_left),
            _ => None,
        }
    }

    /// Moves every time by `by` seconds (a merge onto another clock).
    pub fn shift(&mut self, by: f64) {
        for x in &mut self.samples {
            x.t_s += by;
        }
        for t in [
            &mut self.first_failed_s,
            &mut self.last_failed_s,
            &mut self.first_critical_s,
            &mut self.last_critical_s,
        ]
        .into_iter()
        .flatten()
        {
            *t += by;
        }
    }
}

/// The server at one scrape; rates and latencies are over the interval
/// since the scrape before.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerSample {
    /// Seconds from the run start (the baseline is before 0).
    pub t_s: f64,
    /// Agents of the run holding a session then (the whole fleet's,
    /// estimated from this process's share in a sharded run).
    pub agents: u64,
    /// Whether the interval before this scrape was wholly at steady state:
    /// every agent started before it began, the run not yet ending.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub steady: bool,
    /// CPU in cores over the interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_cores: Option<f64>,
    /// Resident memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    /// Go heap in use (`go_memstats_heap_alloc_bytes`,
    /// `consul.runtime.alloc_bytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heap_bytes: Option<u64>,
    /// Goroutines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goroutines: Option<u64>,
    /// Open file descriptors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_fds: Option<u64>,
    /// OS threads (`--observe-pid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u64>,
    /// Kept gauges (their value) and counters (`<name>_per_s`: their rate).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub values: BTreeMap<String, f64>,
    /// Kept latencies over the interval, µs.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub latencies: BTreeMap<String, Quantiles>,
}

/// A latency over one interval, in microseconds. A server's summary gives
/// its own sliding-window quantiles; a histogram's are interpolated from
/// the buckets that filled in the interval; Consul's JSON gives mean and
/// max only.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Quantiles {
    /// Median.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p50: Option<f64>,
    /// 90th percentile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p90: Option<f64>,
    /// 99th percentile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99: Option<f64>,
    /// Largest (Consul JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
    /// Mean over the interval (exact: sum and count deltas).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean: Option<f64>,
    /// Observations in the interval.
    #[serde(default)]
    pub count: f64,
}

/// What each agent cost the server, from the steady-state intervals.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerSizing {
    /// Seconds from the run start of the first and last steady-state scrape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steady_s: Option<(f64, f64)>,
    /// Agents holding a session, mean over the steady state.
    #[serde(default)]
    pub agents: f64,
    /// CPU in cores: at baseline, mean at steady state, highest interval.
    #[serde(default)]
    pub cpu_cores: Level,
    /// Resident memory: at baseline, mean at steady state, highest.
    #[serde(default)]
    pub rss_bytes: Level,
    /// (steady CPU − baseline CPU) per 1,000 agents held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores_per_1000_agents: Option<f64>,
    /// (steady RSS − baseline RSS) per agent held, KiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_per_agent_kib: Option<f64>,
    /// The server's CPU above its baseline over the whole observed run,
    /// per agent connect, ms: what each accepted session cost it to open
    /// and hold (on a Sensu backend with passwords, a bcrypt check each).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ms_per_connect: Option<f64>,
}

impl ServerSummary {
    /// Sets [`ServerSizing::cpu_ms_per_connect`]: the CPU above the
    /// baseline summed over every interval of the run, over `connects`
    /// (none without connects or a baseline CPU reading).
    pub fn set_cpu_per_connect(&mut self, connects: u64) {
        let Some(base) = self.baseline.cpu_cores else {
            return;
        };
        let mut since = self.baseline.t_s;
        let mut cpu_s = 0.0;
        for x in &self.samples {
            if let Some(c) = x.cpu_cores {
                cpu_s += (c - base).max(0.0) * (x.t_s - since).max(0.0);
            }
            since = x.t_s;
        }
        self.sizing.cpu_ms_per_connect = (connects > 0).then(|| cpu_s * 1000.0 / connects as f64);
    }
}

/// A level at baseline, on average at steady state, and at its highest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Level {
    /// Before the first agent dialed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<f64>,
    /// Mean over the steady-state scrapes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean: Option<f64>,
    /// Highest scrape of the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
}

/// One latency at baseline and under load (µs).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencyUnderLoad {
    /// The baseline interval's median (absent when nothing was observed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline_p50: Option<f64>,
    /// The baseline interval's 99th percentile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline_p99: Option<f64>,
    /// Under load: the median of the steady-state intervals' medians.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p50: Option<f64>,
    /// Under load: the highest 99th percentile of a steady-state interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99: Option<f64>,
    /// Under load: the mean over every steady-state observation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean: Option<f64>,
    /// Observations during the steady state.
    #[serde(default)]
    pub count: f64,
    /// The server's own unit (`ms`, `s`), converted to µs here.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub unit: String,
}

impl ServerSummary {
    /// The kept latency or value named `name`, under load, by statistic:
    /// latencies `p50|p99|mean|baseline_p50|baseline_p99` (µs); values
    /// `max|mean|last|baseline` over the samples.
    pub fn stat(&self, name: &str, stat: &str) -> Option<f64> {
        if let Some(l) = self.latencies.get(name) {
            return match stat {
                "p50" => l.p50,
                "p99" => l.p99,
                "mean" => l.mean,
                "baseline_p50" => l.baseline_p50,
                "baseline_p99" => l.baseline_p99,
                _ => None,
            };
        }
        let level = match name {
            "cpu_cores" => Some(self.sizing.cpu_cores),
            "rss_bytes" => Some(self.sizing.rss_bytes),
            _ => None,
        };
        if let Some(l) = level {
            return match stat {
                "baseline" => l.baseline,
                "mean" => l.mean,
                "max" => l.max,
                _ => None,
            };
        }
        let values: Vec<f64> = self
            .samples
            .iter()
            .filter_map(|s| s.values.get(name).copied())
            .collect();
        match stat {
            "max" => values.iter().copied().reduce(f64::max),
            "mean" if !values.is_empty() => Some(values.iter().sum::<f64>() / values.len() as f64),
            "last" => values.last().copied(),
            "baseline" => self.baseline.values.get(name).copied(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod cpu_per_connect_tests {
    use super::*;

    #[test]
    fn cpu_above_baseline_over_the_run_per_connect() {
        let at = |t_s: f64, cpu: f64| ServerSample {
            t_s,
            cpu_cores: Some(cpu),
            ..ServerSample::default()
        };
        let mut s = ServerSummary {
            baseline: at(-1.0, 0.5),
            // 1 s at 1.5 cores, 2 s at 2.5, 1 s below baseline (none).
            samples: vec![at(0.0, 1.5), at(2.0, 2.5), at(3.0, 0.1)],
            ..ServerSummary::default()
        };
        s.set_cpu_per_connect(0);
        assert_eq!(s.sizing.cpu_ms_per_connect, None);
        // (1 × 1.0 + 2 × 2.0) CPU-s = 5 s over 100 connects: 50 ms.
        s.set_cpu_per_connect(100);
        assert_eq!(s.sizing.cpu_ms_per_connect, Some(50.0));
    }
}
