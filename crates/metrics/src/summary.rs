//! The run summary written by `--summary PATH`: schema `agent-sim.summary.v2`
//! (files of schema v1 are read and upgraded, see [`Summary::from_json`]).
//!
//! Keys other tools rely on are fixed here; every latency carries its full
//! histogram (`hdr`, base64 of the compressed V2 HdrHistogram encoding) so that
//! summaries from several processes merge exactly instead of averaging
//! percentiles.
//!
//! Changes from v1: `outcome` (exit code, whether the fleet was complete,
//! and the causes of the agents missing at the end); `agents.failed` became
//! `agents.never_connected`, with `ever_connected` and `lost_not_back`
//! beside it; errors moved from `counters.errors` (counts) to `errors`
//! (count, first-seen time, a sample of the server's words, a hint, whether
//! the cause heals by itself); `warnings` (what a real agent logs and
//! carries on with) and `sessions_lost` (by cause) are new; a probe's
//! `raft_index` is now `change_id`.
//!
//! Optional keys that v2 files may lack: `disruptions` (each disruption and
//! how the fleet came back), `timeline` (samples over the run: sessions,
//! RSS, CPU, counter and error increments) and `config` (the effective
//! settings, secrets redacted).

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::histo::{decode_histogram, encode_histogram};
use crate::server::ServerSummary;
use crate::{MetricsError, Speaker, new_latency_histogram};

/// Schema identifier of version 1 (read, upgraded to v2).
pub const SCHEMA_V1: &str = "agent-sim.summary.v1";
/// Schema identifier of version 2 (written).
pub const SCHEMA_V2: &str = "agent-sim.summary.v2";

/// Agent counts of a run. `connected` means "the server has answered": a
/// Sensu agent received its `entity_config`; a Consul agent has every
/// subscription's snapshot (or a resumed event) and its registration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentCounts {
    /// Agents the run was asked for.
    pub requested: u64,
    /// Agents holding a session when the run ended (before shutdown began).
    pub connected: u64,
    /// Most agents holding a session at once.
    pub peak_connected: u64,
    /// Agents that held a session at least once.
    #[serde(default)]
    pub ever_connected: u64,
    /// Agents that never held a session.
    pub never_connected: u64,
    /// Agents that held a session, lost it and were not back at the end.
    #[serde(default)]
    pub lost_not_back: u64,
    /// Agents that left the run on purpose (`--ramp-down`): neither
    /// connected nor missing at the end.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub left: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The outcome of a run: what its exit code says, and why.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// The process exit code: 0 complete and every assertion held; 1 nothing
    /// could run (no agent ever held a session, or `--fail-fast` stopped the
    /// run); 2 finished with an incomplete fleet; 3 an assertion failed.
    pub exit_code: i32,
    /// Every requested agent held a session at the end.
    pub complete: bool,
    /// Why the exit code is not 0, in one line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Agents not holding a session at the end, by the cause of their last
    /// failure (`never_connected` and `lost_not_back` together).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub missing: BTreeMap<String, u64>,
}

/// One error (or warning) kind: how often, since when, in whose words.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KindEntry {
    /// Occurrences.
    pub count: u64,
    /// Seconds from the start of the run to the first occurrence.
    #[serde(default)]
    pub first_seen_s: f64,
    /// The first words it had (secrets redacted): the server's, or the OS's
    /// or agent-sim's own as [`KindEntry::said_by`] says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample: Option<String>,
    /// What to check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    /// Whether the cause can go away by itself (load, restarts, a cache
    /// refresh); `false` for bad credentials, an unknown namespace, ACL
    /// denials, the wrong protocol on a port.
    #[serde(default = "heals_default")]
    pub heals: bool,
    /// Whose words the sample is; absent: the server's (files written
    /// before it was kept).
    #[serde(default, skip_serializing_if = "Speaker::is_server")]
    pub said_by: Speaker,
}

fn heals_default() -> bool {
    true
}

/// Resource use of the simulator process.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessStats {
    /// Peak resident set size (VmHWM).
    pub peak_rss_bytes: u64,
    /// User CPU seconds.
    pub cpu_user_s: f64,
    /// System CPU seconds.
    pub cpu_sys_s: f64,
}

/// Percentiles of one latency histogram, in microseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    /// Samples.
    pub count: u64,
    /// Smallest sample.
    pub min: u64,
    /// Median.
    pub p50: u64,
    /// 75th percentile.
    pub p75: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 95th percentile.
    pub p95: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Largest sample.
    pub max: u64,
    /// Mean.
    pub mean: f64,
    /// The whole histogram: base64 of the compressed V2 encoding.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hdr: String,
}

impl LatencySummary {
    /// Percentiles of `h`, with `h` itself embedded.
    pub fn from_histogram(h: &Histogram<u64>) -> Self {
        let empty = h.is_empty();
        let q = |p: f64| if empty { 0 } else { h.value_at_quantile(p) };
        LatencySummary {
            count: h.len(),
            min: if empty { 0 } else { h.min() },
            p50: q(0.50),
            p75: q(0.75),
            p90: q(0.90),
            p95: q(0.95),
            p99: q(0.99),
            p999: q(0.999),
            max: if empty { 0 } else { h.max() },
            mean: if empty { 0.0 } else { h.mean() },
            hdr: encode_histogram(h).unwrap_or_default(),
        }
    }

    /// The embedded histogram (an error when absent or corrupt).
    pub fn histogram(&self) -> Result<Histogram<u64>, MetricsError> {
        if self.hdr.is_empty() {
            return Err(MetricsError::Encoding(
                "latency has no embedded histogram (`hdr`)".into(),
            ));
        }
        decode_histogram(&self.hdr)
    }

    /// The histogram to merge (`what` names the entry in errors): the
    /// decoded `hdr`, an empty histogram when there were no samples, an
    /// error when samples exist but `hdr` is missing.
    pub fn merge_histogram(&self, what: &str) -> Result<Histogram<u64>, MetricsError> {
        if self.hdr.is_empty() {
            if self.count == 0 {
                return Ok(new_latency_histogram());
            }
            return Err(MetricsError::Merge(format!(
                "{what}: {} samples but no embedded histogram (`hdr`); percentiles cannot be \
                 merged exactly",
                self.count
            )));
        }
        self.histogram()
            .map_err(|e| MetricsError::Merge(format!("{what}: {e}")))
    }
}

/// One propagation probe, whatever the protocol: a change made at T0 and its
/// arrival at every subscriber that should see it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProbeSummary {
    /// Sequence number of the probe in the run.
    pub id: u64,
    /// What the change was, in the protocol's words (Consul: `deregister`,
    /// `register` or `intentions`).
    pub kind: String,
    /// Wall-clock T0 (RFC 3339, UTC).
    pub t0: String,
    /// Subscribers that saw the change before the timeout.
    pub delivered: u64,
    /// Subscribers that should have seen it.
    pub expected: u64,
    /// Time from T0 until 99 % of the expected subscribers had it (µs), if reached.
    pub time_to_99pct_us: Option<u64>,
    /// Propagation latency percentiles: µs after T0 (role `controller`, or
    /// no role), or µs after `first_arrival_unix_us` (role `observer`).
    pub latency_us: LatencySummary,
    /// Identifier of the change that every subscriber of every process sees
    /// alike (Consul: the raft index of the change's event), so it is the key
    /// that joins a probe across shards. The controller takes it from its own
    /// subscribers' live arrivals (`None` when none arrived live). Written as
    /// `raft_index` in schema v1.
    #[serde(default, alias = "raft_index", skip_serializing_if = "Option::is_none")]
    pub change_id: Option<u64>,
    /// `controller` (this process made the change; latencies after T0) or
    /// `observer` (another process made it; latencies after this entry's
    /// first arrival). Absent in older summaries: treated as `controller`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// Controller: T0 as wall-clock unix microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t0_unix_us: Option<u64>,
    /// Observer: wall-clock unix microseconds of the earliest arrival this
    /// entry counts (the zero of its `latency_us`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_arrival_unix_us: Option<u64>,
    /// What a merge had to approximate or could not join, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The fleet kind whose agents this entry measured when it is not the
    /// probe's own (`consul-dataplane`: the same change timed at the
    /// sidecars' EDS updates). Absent: the Consul agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<String>,
    /// Controller: µs from T0 until the server answered the write that made
    /// the change (a Consul server answers a catalog or config-entry write
    /// once its leader has committed and applied it through raft). With the
    /// first delivery (`latency_us.min`, a kernel receive time) it tells
    /// where a late change spent its time: the server's commit and apply,
    /// the server's publishing (applied to first delivery), or the fan-out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written_us: Option<u64>,
}

/// [`ProbeSummary::role`] of the process that made the change.
pub const ROLE_CONTROLLER: &str = "controller";
/// [`ProbeSummary::role`] of a process that only watched the change arrive.
pub const ROLE_OBSERVER: &str = "observer";

impl ProbeSummary {
    /// Whether this entry was measured by a process that did not make the
    /// change (its latencies are relative to its first arrival, not T0).
    pub fn is_observer(&self) -> bool {
        self.role.as_deref() == Some(ROLE_OBSERVER)
    }

    /// The first delivery, µs after the zero (`latency_us.min`), if any
    /// arrived.
    pub fn first_us(&self) -> Option<u64> {
        (self.latency_us.count > 0).then_some(self.latency_us.min)
    }
}

/// The whole run summary (`--summary PATH`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Always [`SCHEMA_V2`] (a v1 file is upgraded when read).
    pub schema: String,
    /// `sensu`, `consul` or `mixed`.
    pub kind: String,
    /// Targets the agents were spread over.
    pub targets: Vec<String>,
    /// Wall-clock start (RFC 3339, UTC).
    pub started_at: String,
    /// Seconds from the first dial to the end of shutdown.
    pub duration_s: f64,
    /// Agent counts.
    pub agents: AgentCounts,
    /// Exit code, completeness and causes.
    pub outcome: Outcome,
    /// Protocol counters by name (`keepalives_sent`, `events_sent`, ...).
    pub counters: BTreeMap<String, u64>,
    /// Errors by kind.
    #[serde(default)]
    pub errors: BTreeMap<String, KindEntry>,
    /// Warnings by kind (a real agent logs these and carries on).
    #[serde(default)]
    pub warnings: BTreeMap<String, KindEntry>,
    /// Sessions that ended, by cause (a session lost and re-established
    /// counts once per loss).
    #[serde(default)]
    pub sessions_lost: BTreeMap<String, u64>,
    /// Calls the servers refused for the caller's credentials (an unknown
    /// token, a permission the token lacks, bad credentials), by what was
    /// called: each is an error too, and never counted as a success.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub denied: BTreeMap<String, u64>,
    /// Latency percentiles by name (µs).
    pub latency_us: BTreeMap<String, LatencySummary>,
    /// Rates achieved over the run (per second), e.g. `keepalives`, `events`.
    #[serde(default)]
    pub rates_per_s: BTreeMap<String, f64>,
    /// Resource use of this process.
    pub process: ProcessStats,
    /// Propagation probes of every protocol that runs them, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub probes: Vec<ProbeSummary>,
    /// Connect leaf certificates: boot, signing, a CA rotation (Consul
    /// agents with sidecars on the client wire).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect: Option<ConnectSummary>,
    /// Shard `I/N` of a multi-process run, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<String>,
    /// Where the shard's index came from when an engine set it: the
    /// variable, its value and the engine, e.g.
    /// `AGENT_SIM_SHARD_SLOT=2 (Docker Swarm task slot)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard_from: Option<String>,

    // --- disruptions (written by the scenarios, read by the report) ---
    /// Every disruption of the run (storm, churn, pause, max session
    /// length, a backend restart detected), in order of `began_s`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disruptions: Vec<DisruptionSummary>,

    // --- the observed servers (written by `--observe`) ---
    /// What each observed server did during the run, and what each agent
    /// cost it (see [`crate::server`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub server: Vec<ServerSummary>,

    // --- timeline and config (written by the run's reporter) ---
    /// Samples every `--progress-every` and at the end (at most
    /// [`crate::timeline::MAX_SAMPLES`]; longer runs are downsampled).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<TimelineSample>,
    /// Where the sessions were, per server, when the run had several
    /// (failover: the surge on the survivors; the spread coming back even).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_server: Vec<ServerSpread>,
    /// The run's effective settings, in the config file's keys (kebab-case,
    /// `fleet` for `[[fleet]]` sections), secrets as `<redacted>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<serde_json::Map<String, serde_json::Value>>,
    /// The run's simulated Vault servers (`--vault-nodes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vault: Option<crate::vault::VaultSummary>,
    /// The published experiment the run reproduced (`agent-sim study`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub study: Option<StudySummary>,
    /// A stepped run's steps and the capacity found (`--steps`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<crate::capacity::CapacitySummary>,
    /// Each judged step's window as a summary of its own (counters and
    /// errors in it, its histograms), so that shards' steps merge exactly.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub step_windows: Vec<Summary>,
}

/// The study a run reproduced, as the summary keeps it (read and shown
/// by [`crate::study`]).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct StudySummary {
    /// The study's name (`consul-global-scale`).
    pub name: String,
    /// What the original was, in a line (`HashiCorp's 10,000-node Consul
    /// benchmark (2020)`).
    pub title: String,
    /// Where it was published.
    pub source: String,
    /// The page of docs/studies/ that explains what we reproduce.
    pub doc: String,
    /// The fleet and topology against the published ones (1 = as published).
    pub scale: f64,
    /// What the scale changed, one line each (`agents: 100 of 10,000`).
    #[serde(default)]
    pub scaled: Vec<String>,
    /// How this run's setup differs from the original's, one line each.
    #[serde(default)]
    pub differences: Vec<String>,
    /// The published figures, in the order they were published.
    #[serde(default)]
    pub figures: Vec<StudyFigure>,
}

/// One published figure and the path of ours.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct StudyFigure {
    /// What was measured (`endpoint propagation p99`).
    pub label: String,
    /// The value as published, units and all (`32.1 s`, `~4,000/s`).
    pub published: String,
    /// The assertion path of our figure (`propagation.p99`); none when the
    /// run does not measure it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ours: Option<String>,
    /// What to know when reading the two side by side.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// One of the run's servers as its sessions saw it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ServerSpread {
    /// The server (the target as given).
    pub target: String,
    /// Sessions held on it at the end.
    pub held_at_end: u64,
    /// Most sessions it held at once (over the timeline's samples).
    pub peak_held: u64,
    /// Sessions established on it over the run.
    pub connects: u64,
    /// Its highest rate of new sessions between two samples (per second):
    /// the surge a server takes when another fails.
    pub peak_connects_per_s: f64,
    /// Seconds from the run start at which it went down (held nothing
    /// after holding sessions), if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub down_at_s: Option<f64>,
    /// When it took sessions again after being down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub back_at_s: Option<f64>,
    /// Seconds from its return until every server held within 10 % of an
    /// even share again (`None`: not within the run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub even_after_s: Option<f64>,
}

/// Times from the start of a disruption until a share of its lost sessions
/// were back in steady state, in seconds (`None`: never reached).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BackAfter {
    /// Half of them.
    pub p50: Option<f64>,
    /// 90 %.
    pub p90: Option<f64>,
    /// 99 %.
    pub p99: Option<f64>,
    /// All of them.
    pub p100: Option<f64>,
}

fn is_empty_latency(l: &LatencySummary) -> bool {
    l.count == 0 && l.hdr.is_empty()
}

/// One disruption and the fleet's reconvergence after it (summary entry).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DisruptionSummary {
    /// Sequence number in order of `began_s`, from 1.
    pub id: u64,
    /// `storm`, `churn`, `pause`, `max_session_length` or `backend`.
    pub cause: String,
    /// Kind of the fleet it hit (`sensu`, `consul`).
    pub fleet: String,
    /// Seconds from the start of the run (scheduled disruptions: the
    /// scheduled time; detected ones: the first session lost).
    pub began_s: f64,
    /// Sessions lost (an agent lost twice in it counts twice).
    pub sessions_lost: u64,
    /// Of those, how many were in steady state again by the end.
    pub back: u64,
    /// When 50/90/99/100 % of `sessions_lost` were back.
    pub back_after_s: BackAfter,
    /// Per lost session: loss → steady state again (the spread).
    pub reconnect_us: LatencySummary,
    /// Per lost session: start of the disruption → steady state again
    /// (what `back_after_s` is read from; kept for exact merges).
    #[serde(default, skip_serializing_if = "is_empty_latency")]
    pub back_at_us: LatencySummary,
    /// Session attempts those agents made until they were back (or until
    /// the end).
    pub attempts: u64,
    /// Resyncs with a whole new snapshot (Consul; 0 for Sensu).
    pub snapshots: u64,
    /// Streams resumed where they left off (Consul).
    pub resumes: u64,
    /// Streams resumed silently (Consul).
    pub resumes_silent: u64,
    /// Lost and not back at the end, by the cause of their last failure.
    #[serde(default)]
    pub missing_at_end: BTreeMap<String, u64>,
    /// What the disruption was, in words (e.g. `200 agent(s) frozen for 20s`),
    /// or what a merge joined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl DisruptionSummary {
    /// Lost and still missing at the end.
    pub fn missing(&self) -> u64 {
        self.missing_at_end.values().sum()
    }
}

/// One timeline sample of a run (see [`crate::timeline`]): levels at `t_s`
/// and what happened since the previous sample.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TimelineSample {
    /// Seconds from the run start.
    pub t_s: f64,
    /// Sessions held at `t_s`.
    pub connected: u64,
    /// Resident set size of the process at `t_s` (summed over processes in
    /// a merged summary).
    pub rss_bytes: u64,
    /// CPU seconds (user + system) the process had used by `t_s`.
    pub cpu_s: f64,
    /// Counter increments since the previous sample (zeroes left out).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counters: BTreeMap<String, u64>,
    /// Errors by kind since the previous sample (zeroes left out).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub errors: BTreeMap<String, u64>,
    /// Sessions held at `t_s` on each of the run's servers (the order of
    /// `by_server`; empty with one server).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held_by_server: Vec<u64>,
    /// Sessions established on each server since the previous sample.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub connects_by_server: Vec<u64>,
}

impl Summary {
    /// How a Consul run's agents watched (`streaming`, `blocking` or
    /// `http`), from its recorded config.
    pub fn watch_mode(&self) -> Option<&str> {
        if !self.kind.contains("consul") {
            return None;
        }
        self.config.as_ref()?.get("watch")?.as_str()
    }

    /// A Consul run's wire and watch mode in words (`wire: client,
    /// watching: streaming`); only the watch mode for runs recorded before
    /// the wire was a setting.
    pub fn consul_modes(&self) -> Option<String> {
        let watch = self.watch_mode()?;
        let wire = self
            .config
            .as_ref()
            .and_then(|c| c.get("consul-agent"))
            .and_then(|w| w.as_str());
        let gossip = match self.config.as_ref().and_then(|c| c.get("gossip")) {
            Some(g) if g == "true" || g == &serde_json::Value::Bool(true) => {
                match self.counters.get("gossip_joins").copied().unwrap_or(0) {
                    0 => ", gossip: none joined".to_string(),
                    n => format!(", gossip: {n} joined"),
                }
            }
            Some(_) => ", gossip: off".to_string(),
            None => String::new(),
        };
        Some(match wire {
            Some(w) => format!("wire: {w}{gossip}, watching: {watch}"),
            None => format!("watching: {watch}"),
        })
    }

    /// Reads a summary JSON file (v2, or v1 upgraded).
    pub fn read(path: &std::path::Path) -> Result<Self, MetricsError> {
        let text = std::fs::read_to_string(path)?;
        Self::from_json(&text).map_err(|source| MetricsError::SummaryFile {
            path: path.to_owned(),
            source,
        })
    }

    /// Parses a summary of schema v2, or of v1 upgraded to v2: counter
    /// `errors` become error entries (counts only), `agents.failed` becomes
    /// `never_connected`, and the outcome is inferred from the counts (v1
    /// recorded none).
    pub fn from_json(text: &str) -> Result<Self, SummaryError> {
        let mut v: serde_json::Value = serde_json::from_str(text).map_err(SummaryError::Json)?;
        match v.get("schema").and_then(|s| s.as_str()) {
            Some(SCHEMA_V2) => {}
            Some(SCHEMA_V1) => upgrade_v1(&mut v)?,
            other => return Err(SummaryError::Schema(other.map(str::to_owned))),
        }
        serde_json::from_value(v).map_err(SummaryError::Shape)
    }

    /// Total errors over every kind.
    pub fn errors_total(&self) -> u64 {
        self.errors.values().map(|e| e.count).sum()
    }

    /// Writes the summary as pretty JSON, atomically (temp file + rename).
    pub fn write(&self, path: &std::path::Path) -> Result<(), MetricsError> {
        let text = serde_json::to_string_pretty(self).map_err(MetricsError::Summary)?;
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, text + "\n")?;
        std::fs::rename(&tmp, path)?;
        Ok(())
    }
}

/// Why a summary's text is not a summary.
#[derive(Debug, thiserror::Error)]
pub enum SummaryError {
    /// The text is not JSON.
    #[error("{0}")]
    Json(#[source] serde_json::Error),
    /// A `schema` that is neither v2 nor v1 (or none).
    #[error("schema {0:?}, expected {SCHEMA_V2:?} or {SCHEMA_V1:?}")]
    Schema(Option<String>),
    /// A v1 file without v1's shape.
    #[error("{0}")]
    V1(&'static str),
    /// The JSON does not have v2's shape.
    #[error("{0}")]
    Shape(#[source] serde_json::Error),
}

/// Rewrites a v1 summary (as JSON) into the v2 shape.
fn upgrade_v1(v: &mut serde_json::Value) -> Result<(), SummaryError> {
    use serde_json::{Value, json};
    let obj = v
        .as_object_mut()
        .ok_or(SummaryError::V1("a summary is a JSON object"))?;
    obj.insert("schema".into(), json!(SCHEMA_V2));
    let mut errors = serde_json::Map::new();
    if let Some(Value::Object(counters)) = obj.get_mut("counters")
        && let Some(Value::Object(e)) = counters.remove("errors")
    {
        for (kind, count) in e {
            errors.insert(kind, json!({ "count": count }));
        }
    }
    obj.insert("errors".into(), Value::Object(errors));
    let (requested, connected) = match obj.get_mut("agents").and_then(Value::as_object_mut) {
        Some(a) => {
            let failed = a.remove("failed").and_then(|f| f.as_u64()).unwrap_or(0);
            let requested = a.get("requested").and_then(Value::as_u64).unwrap_or(0);
            a.insert("never_connected".into(), json!(failed));
            a.insert(
                "ever_connected".into(),
                json!(requested.saturating_sub(failed)),
            );
            (
                requested,
                a.get("connected").and_then(Value::as_u64).unwrap_or(0),
            )
        }
        None => return Err(SummaryError::V1("`agents` missing")),
    };
    let complete = connected >= requested;
    obj.insert(
        "outcome".into(),
        json!({
            "exit_code": if complete { 0 } else { 2 },
            "complete": complete,
            "reason": "upgraded from a v1 summary, which recorded no outcome",
        }),
    );
    Ok(())
}

/// The `connect` section of the summary.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConnectSummary {
    /// Agents that keep a certificate (their sidecars share one).
    pub agents: u64,
    /// Of those, agents that held one at the end.
    pub holding: u64,
    /// Seconds from the run's first dial to the last agent's first
    /// certificate (`None`: not every agent got one).
    pub boot_s: Option<f64>,
    /// First certificates signed.
    pub issued: u64,
    /// Certificates signed again (renewals, rotations).
    pub renewed: u64,
    /// Signs the servers answered with their rate limit.
    pub rate_limited: u64,
    /// Signing latency, milliseconds: median and 99th percentile.
    pub sign_p50_ms: f64,
    /// 99th percentile.
    pub sign_p99_ms: f64,
    /// The run's CA rotation, if it made one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotation: Option<RotationSummary>,
}

/// A CA rotation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RotationSummary {
    /// When the run changed the CA (seconds from the first dial).
    pub at_s: f64,
    /// Agents holding a certificate of the new root at the end.
    pub rotated: u64,
    /// Seconds from the change to the last agent's certificate of the new
    /// root (`None`: not every agent holding a certificate got one).
    pub all_after_s: Option<f64>,
    /// What failed, in the server's words, when the change was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_round_trips_through_base64() {
        let mut h = new_latency_histogram();
        for v in [1u64, 10, 100, 1000, 123_456, 9_999_999] {
            h.record(v).unwrap();
        }
        let s = LatencySummary::from_histogram(&h);
        assert_eq!(s.count, 6);
        let back = s.histogram().unwrap();
        assert_eq!(back, h);
    }

    #[test]
    fn empty_histogram_summarizes_to_zeroes() {
        let s = LatencySummary::from_histogram(&new_latency_histogram());
        assert_eq!((s.count, s.p99, s.max), (0, 0, 0));
    }

    #[test]
    fn probes_of_older_summaries_parse_and_new_fields_are_optional() {
        let old = serde_json::json!({"id": 1, "kind": "deregister",
            "t0": "2026-11-21T22:40:44.250Z", "delivered": 2, "expected": 2,
            "time_to_99pct_us": 10, "latency_us": {"count": 0, "min": 0, "p50": 0,
            "p75": 0, "p90": 0, "p95": 0, "p99": 0, "p999": 0, "max": 0, "mean": 0.0}});
        let p: ProbeSummary = serde_json::from_value(old.clone()).unwrap();
        assert_eq!((p.change_id, p.role.as_deref()), (None, None));
        assert!(!p.is_observer());
        assert_eq!(
            serde_json::to_value(&p).unwrap(),
            old,
            "no new keys when unset"
        );
        let o = ProbeSummary {
            role: Some(ROLE_OBSERVER.into()),
            change_id: Some(9),
            first_arrival_unix_us: Some(5),
            ..p
        };
        assert!(o.is_observer());
        let v = serde_json::to_value(&o).unwrap();
        assert_eq!(v["role"], "observer");
        assert_eq!(v["change_id"], 9);
        assert!(v.get("t0_unix_us").is_none() && v.get("note").is_none());
    }

    #[test]
    fn summary_json_has_the_v2_keys() {
        let mut s = Summary {
            schema: SCHEMA_V2.into(),
            kind: "sensu".into(),
            ..Default::default()
        };
        s.counters.insert("keepalives_sent".into(), 3);
        s.errors.insert(
            "connect_refused".into(),
            KindEntry {
                count: 1,
                first_seen_s: 0.5,
                sample: Some("connection refused".into()),
                hint: Some("is the server up?".into()),
                heals: true,
                said_by: crate::Speaker::Os,
            },
        );
        let v: serde_json::Value = serde_json::to_value(&s).unwrap();
        assert_eq!(v["counters"]["keepalives_sent"], 3);
        assert_eq!(v["errors"]["connect_refused"]["count"], 1);
        assert_eq!(
            v["errors"]["connect_refused"]["sample"],
            "connection refused"
        );
        for key in [
            "schema",
            "kind",
            "targets",
            "started_at",
            "duration_s",
            "agents",
            "outcome",
            "counters",
            "errors",
            "warnings",
            "sessions_lost",
            "latency_us",
            "process",
        ] {
            assert!(v.get(key).is_some(), "missing {key}");
        }
        assert_eq!(v["errors"]["connect_refused"]["said_by"], "os");
        let back = Summary::from_json(&v.to_string()).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn a_sample_without_a_speaker_is_the_servers() {
        let mut s = Summary {
            schema: SCHEMA_V2.into(),
            ..Default::default()
        };
        s.errors.insert(
            "upgrade_401".into(),
            KindEntry {
                count: 1,
                sample: Some("wrong password".into()),
                ..Default::default()
            },
        );
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(
            v["errors"]["upgrade_401"].get("said_by"),
            None,
            "not written"
        );
        let back = Summary::from_json(&v.to_string()).unwrap();
        assert_eq!(back.errors["upgrade_401"].said_by, crate::Speaker::Server);
    }

    #[test]
    fn v1_summaries_are_upgraded_when_read() {
        let v1 = serde_json::json!({
            "schema": "agent-sim.summary.v1", "kind": "sensu", "targets": ["ws://x:1/"],
            "started_at": "2026-11-21T22:40:44.250Z", "duration_s": 3.0,
            "agents": {"requested": 10, "connected": 7, "peak_connected": 8, "failed": 3},
            "counters": {"keepalives_sent": 20, "errors": {"connect_refused": 4}},
            "latency_us": {}, "process": {"peak_rss_bytes": 1, "cpu_user_s": 0.1, "cpu_sys_s": 0.1},
            "probes": [{"id": 1, "kind": "deregister", "t0": "x", "delivered": 1,
                "expected": 1, "raft_index": 42, "latency_us": {"count": 0, "min": 0,
                "p50": 0, "p75": 0, "p90": 0, "p95": 0, "p99": 0, "p999": 0, "max": 0,
                "mean": 0.0}}]
        });
        let s = Summary::from_json(&v1.to_string()).unwrap();
        assert_eq!(s.schema, SCHEMA_V2);
        assert_eq!((s.agents.never_connected, s.agents.ever_connected), (3, 7));
        assert_eq!(s.counters["keepalives_sent"], 20);
        assert_eq!(s.errors["connect_refused"].count, 4);
        assert_eq!(s.errors_total(), 4);
        assert_eq!((s.outcome.complete, s.outcome.exit_code), (false, 2));
        assert_eq!(s.probes[0].change_id, Some(42));
        assert!(matches!(
            Summary::from_json(r#"{"schema": "agent-sim.summary.v9"}"#),
            Err(SummaryError::Schema(Some(v))) if v == "agent-sim.summary.v9"
        ));
        assert!(matches!(
            Summary::from_json("not json"),
            Err(SummaryError::Json(_))
        ));
    }
}
