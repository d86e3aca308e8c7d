//! A validated run, as the rest of the program reads it: the fleets with
//! their protocol and engine settings ([`FleetPlan`]), the run's own
//! settings ([`RunConfig`]), the shard of a multi-process run, and the
//! [`UsageError`] every refusal of bad input is. Built by
//! [`crate::config::resolve`]; nothing here parses flags.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use agent_sim_consul::ConsulConfig;
use agent_sim_dataplane::DataplaneConfig;
use agent_sim_fleet::FleetConfig;
use agent_sim_metrics::assert::Assertion;
use agent_sim_sensu::SensuConfig;

use crate::values::ServerDown;

/// A usage problem: printed as one line, exit code 64.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

pub(crate) fn usage<T>(msg: impl Into<String>) -> Result<T, UsageError> {
    Err(UsageError(msg.into()))
}

/// A bcrypt cost given by `flag` (`--sensu-password-cost`,
/// `--embedded-password-cost`), checked against what the embedded Sensu
/// backend takes.
pub(crate) fn password_cost(flag: &str, cost: Option<u32>) -> Result<Option<u32>, UsageError> {
    let costs = agent_sim_server::sensu::PASSWORD_COSTS;
    match cost {
        Some(c) if !costs.contains(&c) => usage(format!(
            "{flag} {c}: must be {} to {} (a real backend's is 10)",
            costs.start(),
            costs.end()
        )),
        c => Ok(c),
    }
}

/// Which slice of a multi-process run this process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// This process's index, `0..count`.
    pub index: u64,
    /// Number of processes.
    pub count: u64,
}

impl Shard {
    /// The half-open range of global agent indexes this shard runs out of `total`.
    pub fn slice(&self, total: u64) -> (u64, u64) {
        let start = total * self.index / self.count;
        let end = total * (self.index + 1) / self.count;
        (start, end - start)
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// Where `--shard N` found this process's index: a variable the engine
/// that started the process set (see [`crate::shard`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexSource {
    /// The variable read, e.g. `JOB_COMPLETION_INDEX`.
    pub variable: &'static str,
    /// Who sets it, in people's words, e.g. `Kubernetes Indexed Job`.
    pub engine: &'static str,
    /// Its value as read (a slot for a slot variable: the index + 1).
    pub value: u64,
}

impl std::fmt::Display for IndexSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={} ({})", self.variable, self.value, self.engine)
    }
}

/// The protocol of one fleet with its settings.
#[derive(Debug, Clone)]
pub enum Protocol {
    /// Sensu Go agents.
    Sensu(SensuConfig),
    /// Consul client agents.
    Consul(Box<ConsulConfig>),
    /// Consul dataplane sidecars.
    Dataplane(DataplaneConfig),
}

impl Protocol {
    /// `sensu`, `consul` or `consul-dataplane`.
    pub fn kind(&self) -> &'static str {
        match self {
            Protocol::Sensu(_) => "sensu",
            Protocol::Consul(_) => "consul",
            Protocol::Dataplane(_) => agent_sim_dataplane::KIND,
        }
    }
}

/// One fleet of a run.
#[derive(Debug, Clone)]
pub struct FleetPlan {
    /// Protocol settings.
    pub protocol: Protocol,
    /// Engine settings (agent count and first index already sharded).
    pub fleet: FleetConfig,
    /// Agents of the whole fleet across shards.
    pub total_agents: u64,
    /// Whether this fleet runs against the embedded in-process backend.
    pub embedded: bool,
}

/// Everything a run needs, validated.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The fleets (one, or several from `[[fleet]]` sections).
    pub fleets: Vec<FleetPlan>,
    /// Run length (None: until Ctrl-C).
    pub duration: Option<Duration>,
    /// Shutdown grace period.
    pub grace: Duration,
    /// Summary JSON path.
    pub summary: Option<PathBuf>,
    /// HdrHistogram interval log path.
    pub hlog: Option<PathBuf>,
    /// Interval of hlog records.
    pub hlog_interval: Duration,
    /// Prometheus listen address.
    pub metrics_addr: Option<SocketAddr>,
    /// SLO assertions.
    pub asserts: Vec<Assertion>,
    /// Shard of a multi-process run.
    pub shard: Option<Shard>,
    /// Where the shard's index came from, when an engine's variable gave it.
    pub shard_from: Option<IndexSource>,
    /// Seed for stable randomness.
    pub seed: Option<u64>,
    /// No live progress.
    pub quiet: bool,
    /// Interval of plain progress lines (non-TTY).
    pub progress_every: Duration,
    /// Tokio worker threads.
    pub threads: Option<usize>,
    /// Check schedule of the embedded Sensu target (demo and tests).
    pub embedded_check_interval: Duration,
    /// bcrypt cost of the embedded Sensu backend's password checks (`None`:
    /// a plain comparison).
    pub embedded_password_cost: Option<u32>,
    /// Servers of the embedded backend (per protocol).
    pub embedded_servers: usize,
    /// Embedded servers stopped and started again during the run.
    pub server_downs: Vec<ServerDown>,
    /// Report page path.
    pub report_html: Option<PathBuf>,
    /// Every counter in the final table.
    pub verbose: bool,
    /// Local processes asked for (`--processes`; `None`: as the host needs).
    pub processes: Option<u64>,
    /// This process is a local child of another (see [`crate::local`]).
    pub local_child: bool,
    /// The servers to observe during the run (`--observe`), if this
    /// process observes.
    pub observe: Option<agent_sim_observe::ObserveConfig>,
    /// The effective settings for the summary's `config` (see
    /// [`crate::settings::effective_settings`]).
    pub effective: serde_json::Map<String, serde_json::Value>,
    /// The published experiment the run reproduces (`agent-sim study`).
    pub study: Option<agent_sim_metrics::study::StudySummary>,
    /// Notes printed at start, each about a setting the user gave: one
    /// that no fleet of the run reads (a Consul flag in a Sensu run, see
    /// [`crate::settings::unread`]), or a reconnect burst that the dial cap
    /// narrows (see [`crate::scenario::capped_burst`]). The defaults make
    /// none.
    pub notes: Vec<String>,
    /// A stepped run's steps and SLOs (`--steps`).
    pub steps: Option<StepPlan>,
}

impl RunConfig {
    /// `sensu`, `consul`, `consul-dataplane` or `mixed`.
    pub fn kind(&self) -> &'static str {
        let first = self.fleets[0].protocol.kind();
        if self.fleets.iter().all(|f| f.protocol.kind() == first) {
            first
        } else {
            "mixed"
        }
    }

    /// Whether any fleet needs the in-process backend.
    pub fn embedded(&self) -> bool {
        self.fleets.iter().any(|f| f.embedded)
    }
}

impl FleetPlan {
    /// The fleet's servers (its targets, in order).
    pub fn targets(&self) -> Vec<String> {
        match &self.protocol {
            Protocol::Sensu(s) => s.targets.clone(),
            Protocol::Consul(c) => c.conn.targets.clone(),
            Protocol::Dataplane(c) => c.conn.targets.clone(),
        }
    }
}

/// One step, on the fleet's clock (from its first start).
#[derive(Debug, Clone, PartialEq)]
pub struct StepTimes {
    /// The whole fleet's agents.
    pub agents: u64,
    /// This process's agents.
    pub here: u64,
    /// When its first new agent starts.
    pub at: Duration,
    /// Its judged window.
    pub window: (Duration, Duration),
}

/// A stepped run, resolved.
#[derive(Debug, Clone)]
pub struct StepPlan {
    /// The steps in order.
    pub steps: Vec<StepTimes>,
    /// Each window's length.
    pub hold: Duration,
    /// From a step's last start to its window.
    pub settle: Duration,
    /// What each step is judged by.
    pub slos: Vec<Assertion>,
    /// Whether the SLOs are the kind's defaults (printed at start).
    pub default_slos: bool,
    /// Steps run past the first that fails.
    pub past: u64,
}

impl StepPlan {
    /// When the last window closes: the run's length.
    pub fn length(&self) -> Duration {
        self.steps.last().map_or(Duration::ZERO, |s| s.window.1)
    }
}
