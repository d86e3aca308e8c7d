//! The summary's `server` section: what each observed server did during
//! the run (`--observe`), on the run's time axis, and what each agent cost
//! it. Written by `agent-sim-observe`, read by the table, the page, the
//! assertions and `report compare`. A model only: nothing here computes.
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
