//! SLO assertions over a run [`Summary`] (`--assert EXPR`, repeatable): each
//! assertion gives a [`Verdict`]; the CLI exits 3 when any fails.
//!
//! # Grammar
//!
//! ```text
//! assertion := path op value            (spaces around op optional)
//! op        := "<" | "<=" | ">" | ">=" | "==" | "!="
//! ```
//!
//! | path | meaning | value |
//! |------|---------|-------|
//! | `<name>.<stat>`, `latency.<name>.<stat>` | statistic of latency `<name>` (`connect`, `session_ready`, `propagation`, ...); `<stat>` is `p50` `p75` `p90` `p95` `p99` `p999` (or `p99.9`) `min` `max` `mean` `count` | duration: `800us` (`µs`), `250ms`, `1s`, `2m`, `1h`, `1500ns`; a bare number is microseconds. `count` takes a plain number |
//! | `agents.requested` `agents.connected` `agents.peak_connected` `agents.ever_connected` `agents.never_connected` (`agents.failed`) `agents.lost_not_back` `agents.left` | agent counts | number, or the word `requested` (= `agents.requested`) |
//! | `errors.total` (or `errors`) | sum of all error kinds | number |
//! | `errors.<kind>` | errors of one kind (0 when the kind never occurred) | number |
//! | `counters.<name>` or a bare `<name>` | a protocol counter, e.g. `keepalives_sent` | number or `requested` |
//! | `rates.<name>` | a rate of `rates_per_s`, e.g. `rates.events >= 4000/s` | number, optional `/s` |
//! | `probes.delivered_ratio` | the smallest `delivered / expected` over all probes | number (`0.99`) or percent (`99%`) |
//! | `probes.time_to_99pct` | the largest time-to-99 % over all probes (fails if one never got there) | duration |
//! | `process.peak_rss_bytes` (or `process.peak_rss`) | peak RSS | size: `20MiB`, `512KiB`, `1GiB`, `20MB` (10^6), bare = bytes |
//! | `process.cpu_user_s`, `process.cpu_sys_s`, `duration_s` | seconds | seconds, or a duration (`90s`, `2m`) |
//! | `reconvergence.<stat>` | per lost session, loss → steady state again, over every disruption (their `reconnect_us` added) | duration |
//! | `disruptions.count` `disruptions.sessions_lost` `disruptions.back` `disruptions.missing` `disruptions.attempts` | summed over the disruptions | number |
//! | `disruptions.back_after_p50` (`_p90`, `_p99`, `_p100`) | the longest time until that share of a disruption's lost sessions were back (fails if one never got there) | duration |
//! | `server.cpu_cores.<max\|mean\|baseline>`, `server.rss_bytes.<max\|mean\|baseline>` | an observed server's CPU (cores) and RSS: highest scrape, mean at steady state, before the run | number; size |
//! | `server.cores_per_1000_agents`, `server.rss_per_agent_kib` | what each agent cost the server at steady state, above its baseline | number |
//! | `server.cpu_ms_per_connect` | a Sensu backend's CPU milliseconds per agent connection (`--observe sensu`) | number |
//! | `server.<latency>.<p50\|p99\|mean\|baseline_p50\|baseline_p99>` | a kept server latency under load or at baseline (`consul_raft_commit_time`, `etcd_disk_wal_fsync_duration_seconds`, ...) | duration |
//! | `server.<series>.<max\|mean\|last\|baseline>` | a kept gauge, or a counter's rate (`<name>_per_s`) | number |
//! | `vault.split_brain` `vault.mismatch` `vault.read_back_lost` `vault.read_back_changed` `vault.keys_left` `vault.sessions_left` `vault.tokens_created` `vault.leadership_changes` `vault.fenced_writes` `vault.handover_max_s` | the run's simulated Vault servers (`--vault-nodes`, docs/writes.md): the lock checker's split-brain and mismatched checks, read-backs lost or changed, what the clean-up left, tokens created, leadership changes, fenced writes, the longest handover in seconds | number |
//! | `capacity.agents` `capacity.broke_at` | a stepped run's (`--steps`, docs/capacity.md) capacity: the last step that held, the first that did not (absent when none did, or none failed) | number |
//! | `gossip.failed_ever` `gossip.failed_turns` `gossip.critical_ever` `gossip.alive_max` `gossip.failed_max` `gossip.critical_max` `gossip.not_left_at_end` | the run's gossip members as the observed Consul server saw them (members ever failed, turns to failed, nodes ever with `serfHealth` critical, the most at one poll, not left at the last poll) | number |
//!
//! With several observed servers a `server.*` or `gossip.*` path takes the
//! highest value among them (the worst, for the usual `<` thresholds).
//!
//! Numbers may use `_` separators (`10_000`). `propagation.<stat>` falls back
//! to the probes' merged histograms when the summary has no `propagation`
//! latency. Values are compared as numbers in the path's base unit (µs, bytes,
//! seconds). An assertion that does not parse is a usage error (the CLI exits
//! 64); one whose metric is absent from the summary (unknown latency or counter,
//! a latency with no samples, no probes) *fails* with a note. Examples:
//!
//! ```text
//! propagation.p99 < 1s        agents.connected == requested     errors.total == 0
//! connect.p99 <= 250ms        latency.session_ready.max < 5s    errors.connect_refused == 0
//! keepalives_sent > 0         rates.events >= 4000/s            probes.delivered_ratio >= 99%
//! process.peak_rss_bytes < 400MiB
//! ```
//!
//! This module only evaluates; it does not decide exit codes or print. It
//! parses here ([`AssertError`] says which mistake); its child `measure`
//! reads a path's value from the summary ([`Absent`] says why there is none).

use std::fmt::Write as _;
use std::str::FromStr;

use crate::server::GOSSIP_FIELDS;
use crate::summary::Summary;
use crate::units::{Kind, fmt_mib, fmt_us};
use crate::vault::VAULT_FIELDS;

mod measure;

pub use measure::Absent;
use measure::actual;

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `==`
    Eq,
    /// `!=`
    Ne,
}

impl Op {
    fn as_str(self) -> &'static str {
        match self {
            Op::Lt => "<",
            Op::Le => "<=",
            Op::Gt => ">",
            Op::Ge => ">=",
            Op::Eq => "==",
            Op::Ne => "!=",
        }
    }

    #[allow(clippy::float_cmp)]
    fn holds(self, a: f64, b: f64) -> bool {
        match self {
            Op::Lt => a < b,
            Op::Le => a <= b,
            Op::Gt => a > b,
            Op::Ge => a >= b,
            Op::Eq => a == b,
            Op::Ne => a != b,
        }
    }
}

/// The unit a path is measured in (decides value parsing and display).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    Micros,
    Seconds,
    Bytes,
    Count,
    Ratio,
    PerSecond,
    Plain,
}

impl Unit {
    /// The units a value of this unit may carry, for an error's words.
    fn allowed(self) -> &'static str {
        match self {
            Unit::Micros => "ns, us, µs, ms, s, m, h (bare = µs)",
            Unit::Seconds => "ms, s, m, h (bare = seconds)",
            Unit::Bytes => "B, KiB, MiB, GiB, KB, MB, GB (bare = bytes)",
            Unit::Ratio => "% (or a bare fraction)",
            Unit::PerSecond => "/s (or a bare number)",
            Unit::Count => "none: a plain number or `requested`",
            Unit::Plain => "none: a plain number",
        }
    }
}

const STATS: &[&str] = &[
    "count", "min", "p50", "p75", "p90", "p95", "p99", "p999", "max", "mean",
];

/// Fields of `probes.<field>` (`time_to_99pct_us` is read too).
const PROBE_FIELDS: [&str; 2] = ["delivered_ratio", "time_to_99pct"];

/// Fields of `process.<field>` (`peak_rss` is read too).
const PROCESS_FIELDS: [&str; 3] = ["peak_rss_bytes", "cpu_user_s", "cpu_sys_s"];

/// Fields of `agents.<field>`.
const AGENT_FIELDS: [&str; 7] = [
    "requested",
    "connected",
    "peak_connected",
    "ever_connected",
    "never_connected",
    "lost_not_back",
    "left",
];

#[derive(Debug, Clone, PartialEq)]
enum Metric {
    Latency { name: String, stat: &'static str },
    Agents(&'static str),
    ErrorsTotal,
    Error(String),
    Warning(String),
    Counter(String),
    Rate(String),
    ProbesDeliveredRatio,
    ProbesTimeTo99,
    Disruptions(&'static str),
    DisruptionsBackAfter(&'static str),
    PeakRss,
    CpuUser,
    CpuSys,
    DurationS,
    Server { name: String, stat: String },
    Gossip(&'static str),
    Vault(&'static str),
    Capacity(&'static str),
}

/// Whether a server series is a latency by its name, as the servers name
/// theirs (`consul_raft_commit_time`, `sensu_go_eventd_update_event_duration`,
/// `etcd_disk_wal_fsync_duration_seconds`).
fn is_latency_name(name: &str) -> bool {
    name.contains("duration") || name.ends_with("_time") || name.ends_with("_seconds")
}

impl Metric {
    fn unit(&self) -> Unit {
        match self {
            Metric::Latency { stat, .. } if *stat == "count" => Unit::Count,
            Metric::Latency { .. } | Metric::ProbesTimeTo99 | Metric::DisruptionsBackAfter(_) => {
                Unit::Micros
            }
            Metric::Disruptions(_) => Unit::Count,
            Metric::Agents(_)
            | Metric::ErrorsTotal
            | Metric::Error(_)
            | Metric::Warning(_)
            | Metric::Counter(_)
            | Metric::Gossip(_)
            | Metric::Vault(_)
            | Metric::Capacity(_) => Unit::Count,
            Metric::Rate(_) => Unit::PerSecond,
            Metric::ProbesDeliveredRatio => Unit::Ratio,
            Metric::PeakRss => Unit::Bytes,
            Metric::CpuUser | Metric::CpuSys | Metric::DurationS => Unit::Seconds,
            Metric::Server { name, stat } => match (name.as_str(), stat.as_str()) {
                ("rss_bytes", _) => Unit::Bytes,
                (_, "p50" | "p99" | "baseline_p50" | "baseline_p99") => Unit::Micros,
                // The mean of a kept latency is a duration too; a series'
                // mean is its own number.
                (n, "mean") if is_latency_name(n) => Unit::Micros,
                (
                    "cpu_cores"
                    | "cores_per_1000_agents"
                    | "rss_per_agent_kib"
                    | "cpu_ms_per_connect",
                    _,
                ) => Unit::Plain,
                _ => Unit::Plain,
            },
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Value {
    Number(f64),
    Requested,
}

/// One parsed SLO assertion (`connect.p99 < 250ms`).
#[derive(Debug, Clone, PartialEq)]
pub struct Assertion {
    text: String,
    metric: Metric,
    op: Op,
    value: Value,
}

impl std::fmt::Display for Assertion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// Why an `--assert` expression does not parse: one line, the expression
/// or the part of it at fault named (the CLI prints it and exits 64).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AssertError {
    /// No comparison operator at all.
    #[error("no operator in {0:?} (expected `path op value`, op one of < <= > >= == !=)")]
    NoOperator(String),
    /// An operator that is not one (`=`, `=<`).
    #[error("bad operator in {0:?} (one of < <= > >= == !=; equality is `==`)")]
    BadOperator(String),
    /// An operator followed by more operator characters (`<<=`).
    #[error("bad operator in {0:?} (one of < <= > >= == !=)")]
    OperatorRun(String),
    /// Nothing before the operator.
    #[error("missing path before the operator in {0:?}")]
    MissingPath(String),
    /// A path with characters a path has not.
    #[error("bad path {0:?} (letters, digits, `_`, `-` and `.` only)")]
    PathCharacters(String),
    /// A path with an empty segment (`a..b`).
    #[error("bad path {0:?} (empty segment)")]
    EmptySegment(String),
    /// A path of a shape no metric has.
    #[error("unknown path {0:?}")]
    UnknownPath(String),
    /// A latency statistic that is not one (`p98`).
    #[error("unknown latency statistic {stat:?} in {path:?} (one of {})", STATS.join(", "))]
    UnknownStatistic {
        /// The statistic as written.
        stat: String,
        /// The path it is in.
        path: String,
    },
    /// A field a section does not have (`agents.happy`, `vault.nope`).
    #[error("unknown {section} field {field:?} ({})", known.join(", "))]
    UnknownField {
        /// The section (`agents`, `probes`, `process`, `disruptions`,
        /// `gossip`, `vault`).
        section: &'static str,
        /// The field as written.
        field: String,
        /// The section's fields.
        known: &'static [&'static str],
    },
    /// A `server.<name>.<stat>` statistic that is not one.
    #[error("unknown statistic {stat:?} of server.{name} ({})", SERVER_STATS.join(", "))]
    UnknownServerStatistic {
        /// The series or latency.
        name: String,
        /// The statistic as written.
        stat: String,
    },
    /// A `server.` path of no known shape.
    #[error(
        "unknown server path {0:?} (server.cpu_cores.max, server.rss_bytes.mean, \
         server.cores_per_1000_agents, server.rss_per_agent_kib, server.cpu_ms_per_connect, \
         server.<latency>.p99, server.<series>.max)"
    )]
    UnknownServerPath(String),
    /// The value after the operator does not read in the path's unit.
    #[error("{source} (in assertion {assertion:?})")]
    Value {
        /// The whole assertion.
        assertion: String,
        /// What is wrong with the value.
        source: ValueError,
    },
}

/// Why the value of an assertion does not read in its path's unit.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValueError {
    /// Nothing after the operator.
    #[error("missing value after the operator")]
    Missing,
    /// `requested` compared with something that is not a count.
    #[error("`requested` compares only with counts (agents.*, counters)")]
    RequestedNotCount,
    /// The number does not parse.
    #[error("bad number in value {value:?}")]
    Number {
        /// The value as written.
        value: String,
        /// What the parser said.
        source: std::num::ParseFloatError,
    },
    /// A unit the path's unit does not take.
    #[error("unknown unit {unit:?} in {value:?}; units: {allowed}")]
    Unit {
        /// The unit as written.
        unit: String,
        /// The value as written.
        value: String,
        /// The units the path takes.
        allowed: &'static str,
    },
}

fn stat_of(s: &str) -> Option<&'static str> {
    STATS.iter().copied().find(|x| *x == s)
}

/// The fields of a stepped run's `capacity.<f>` path.
const CAPACITY_FIELDS: [&str; 2] = ["agents", "broke_at"];

fn parse_path(path: &str) -> Result<Metric, AssertError> {
    let normalized = path.strip_suffix(".p99.9").map(|p| format!("{p}.p999"));
    let path = normalized.as_deref().unwrap_or(path);
    if path.is_empty()
        || !path
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        return Err(AssertError::PathCharacters(path.to_owned()));
    }
    let seg: Vec<&str> = path.split('.').collect();
    if seg.iter().any(|s| s.is_empty()) {
        return Err(AssertError::EmptySegment(path.to_owned()));
    }
    let bad_stat = |s: &str| AssertError::UnknownStatistic {
        stat: s.to_owned(),
        path: path.to_owned(),
    };
    let unknown = |section: &'static str, f: &str, known: &'static [&'static str]| {
        AssertError::UnknownField {
            section,
            field: f.to_owned(),
            known,
        }
    };
    Ok(match seg.as_slice() {
        ["latency", name, stat] => Metric::Latency {
            name: (*name).to_owned(),
            stat: stat_of(stat).ok_or_else(|| bad_stat(stat))?,
        },
        ["agents", f] => Metric::Agents(
            AGENT_FIELDS
                .into_iter()
                .find(|x| x == f)
                .or((*f == "failed").then_some("never_connected"))
                .ok_or_else(|| unknown("agents", f, &AGENT_FIELDS))?,
        ),
        ["errors"] | ["errors", "total"] => Metric::ErrorsTotal,
        ["errors", kind] => Metric::Error((*kind).to_owned()),
        ["warnings", kind] => Metric::Warning((*kind).to_owned()),
        ["counters", name] => Metric::Counter((*name).to_owned()),
        ["rates" | "rates_per_s", name] => Metric::Rate((*name).to_owned()),
        ["probes", "delivered_ratio"] => Metric::ProbesDeliveredRatio,
        ["probes", "time_to_99pct" | "time_to_99pct_us"] => Metric::ProbesTimeTo99,
        ["probes", f] => return Err(unknown("probes", f, &PROBE_FIELDS)),
        ["disruptions", f] => disruptions_field(f)?,
        ["process", "peak_rss_bytes" | "peak_rss"] => Metric::PeakRss,
        ["process", "cpu_user_s"] => Metric::CpuUser,
        ["process", "cpu_sys_s"] => Metric::CpuSys,
        ["process", f] => return Err(unknown("process", f, &PROCESS_FIELDS)),
        ["duration_s"] => Metric::DurationS,
        [
            "server",
            f @ ("cores_per_1000_agents" | "rss_per_agent_kib" | "cpu_ms_per_connect"),
        ] => Metric::Server {
            name: (*f).to_owned(),
            stat: String::new(),
        },
        ["server", name, stat] => Metric::Server {
            name: (*name).to_owned(),
            stat: server_stat(name, stat)?,
        },
        ["server", ..] => return Err(AssertError::UnknownServerPath(path.to_owned())),
        ["vault", f] => {
            Metric::Vault(crate::vault::field(f).ok_or_else(|| unknown("vault", f, &VAULT_FIELDS))?)
        }
        ["capacity", f] => Metric::Capacity(
            CAPACITY_FIELDS
                .into_iter()
                .find(|x| x == f)
                .ok_or_else(|| unknown("capacity", f, &CAPACITY_FIELDS))?,
        ),
        ["gossip", f] => Metric::Gossip(
            GOSSIP_FIELDS
                .into_iter()
                .find(|x| x == f)
                .ok_or_else(|| unknown("gossip", f, &GOSSIP_FIELDS))?,
        ),
        [name] => Metric::Counter((*name).to_owned()),
        [name, stat] => Metric::Latency {
            name: (*name).to_owned(),
            stat: stat_of(stat).ok_or_else(|| bad_stat(stat))?,
        },
        _ => return Err(AssertError::UnknownPath(path.to_owned())),
    })
}

/// Statistics of `server.<name>.<stat>`.
const SERVER_STATS: [&str; 8] = [
    "max",
    "mean",
    "last",
    "baseline",
    "p50",
    "p99",
    "baseline_p50",
    "baseline_p99",
];

fn server_stat(name: &str, stat: &str) -> Result<String, AssertError> {
    SERVER_STATS
        .into_iter()
        .find(|x| *x == stat)
        .map(str::to_owned)
        .ok_or_else(|| AssertError::UnknownServerStatistic {
            name: name.to_owned(),
            stat: stat.to_owned(),
        })
}

/// Fields of `disruptions.<field>`.
const DISRUPTION_FIELDS: [&str; 9] = [
    "count",
    "sessions_lost",
    "back",
    "missing",
    "attempts",
    "back_after_p50",
    "back_after_p90",
    "back_after_p99",
    "back_after_p100",
];

fn disruptions_field(f: &str) -> Result<Metric, AssertError> {
    let Some(field) = DISRUPTION_FIELDS.into_iter().find(|x| *x == f) else {
        return Err(AssertError::UnknownField {
            section: "disruptions",
            field: f.to_owned(),
            known: &DISRUPTION_FIELDS,
        });
    };
    Ok(match field.strip_prefix("back_after_") {
        Some(_) => Metric::DisruptionsBackAfter(field),
        None => Metric::Disruptions(field),
    })
}

/// Splits `"250ms"` into `(250.0, "ms")`.
fn split_number(s: &str) -> Result<(f64, &str), ValueError> {
    let end = s
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_digit() || c == '.' || c == '_' || (i == 0 && c == '-')))
        .map_or(s.len(), |(i, _)| i);
    let (num, unit) = s.split_at(end);
    let n: f64 = num
        .replace('_', "")
        .parse()
        .map_err(|source| ValueError::Number {
            value: s.to_owned(),
            source,
        })?;
    Ok((n, unit.trim()))
}

fn parse_value(s: &str, unit: Unit) -> Result<Value, ValueError> {
    if s.is_empty() {
        return Err(ValueError::Missing);
    }
    if s == "requested" {
        return if unit == Unit::Count {
            Ok(Value::Requested)
        } else {
            Err(ValueError::RequestedNotCount)
        };
    }
    let (n, suffix) = split_number(s)?;
    let scale = match (unit, suffix.to_ascii_lowercase().as_str()) {
        (_, "") => 1.0,
        (Unit::Micros, "ns") => 1e-3,
        (Unit::Micros, "us" | "µs") => 1.0,
        (Unit::Micros, "ms") => 1e3,
        (Unit::Micros, "s") => 1e6,
        (Unit::Micros, "m" | "min") => 60e6,
        (Unit::Micros, "h") => 3600e6,
        (Unit::Seconds, "ms") => 1e-3,
        (Unit::Seconds, "s") => 1.0,
        (Unit::Seconds, "m" | "min") => 60.0,
        (Unit::Seconds, "h") => 3600.0,
        (Unit::Bytes, "b") => 1.0,
        (Unit::Bytes, "kib") => 1024.0,
        (Unit::Bytes, "mib") => 1024.0 * 1024.0,
        (Unit::Bytes, "gib") => 1024.0 * 1024.0 * 1024.0,
        (Unit::Bytes, "kb") => 1e3,
        (Unit::Bytes, "mb") => 1e6,
        (Unit::Bytes, "gb") => 1e9,
        (Unit::Ratio, "%") => 0.01,
        (Unit::PerSecond | Unit::Plain, "/s") => 1.0,
        (u, other) => {
            return Err(ValueError::Unit {
                unit: other.to_owned(),
                value: s.to_owned(),
                allowed: u.allowed(),
            });
        }
    };
    Ok(Value::Number(n * scale))
}

impl<'de> serde::Deserialize<'de> for Assertion {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl FromStr for Assertion {
    type Err = AssertError;

    /// Parses `path op value`; the error is a one-line reason.
    fn from_str(s: &str) -> Result<Self, AssertError> {
        let s = s.trim();
        let Some(pos) = s.find(['<', '>', '=', '!']) else {
            return Err(AssertError::NoOperator(s.to_owned()));
        };
        let rest = &s[pos..];
        let (op, len) = if rest.starts_with("<=") {
            (Op::Le, 2)
        } else if rest.starts_with(">=") {
            (Op::Ge, 2)
        } else if rest.starts_with("==") {
            (Op::Eq, 2)
        } else if rest.starts_with("!=") {
            (Op::Ne, 2)
        } else if rest.starts_with('<') {
            (Op::Lt, 1)
        } else if rest.starts_with('>') {
            (Op::Gt, 1)
        } else {
            return Err(AssertError::BadOperator(s.to_owned()));
        };
        let path = s[..pos].trim();
        let value_text = rest[len..].trim();
        if value_text.starts_with(['<', '>', '=', '!']) {
            return Err(AssertError::OperatorRun(s.to_owned()));
        }
        if path.is_empty() {
            return Err(AssertError::MissingPath(s.to_owned()));
        }
        let metric = parse_path(path)?;
        let value =
            parse_value(value_text, metric.unit()).map_err(|source| AssertError::Value {
                assertion: s.to_owned(),
                source,
            })?;
        Ok(Assertion {
            text: format!("{path} {} {value_text}", op.as_str()),
            metric,
            op,
            value,
        })
    }
}

/// The outcome of one assertion.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// The assertion as written (normalized spacing).
    pub assertion: String,
    /// The measured value in the path's base unit (µs, bytes, seconds, count),
    /// `None` when the metric is absent.
    pub actual: Option<f64>,
    /// Operator and threshold, readable (`< 1.00s`, `== 10000 (requested)`).
    pub expected: String,
    /// Whether it held.
    pub passed: bool,
    /// Why it could not be evaluated, if so.
    pub note: Option<String>,
}

fn fmt_value(unit: Unit, v: f64) -> String {
    match unit {
        // A mean is fractional: shown to the microsecond, as the rest.
        Unit::Micros if v >= 0.0 => fmt_us(v.round() as u64),
        Unit::Micros => format!("{v}µs"),
        Unit::Bytes => fmt_mib(v.max(0.0) as u64),
        Unit::Seconds => format!("{v:.2}s"),
        Unit::Ratio => format!("{v:.4}"),
        Unit::PerSecond => format!("{v:.1}/s"),
        Unit::Plain => format!("{}", (v * 1000.0).round() / 1000.0),
        Unit::Count if v.fract() == 0.0 => format!("{v:.0}"),
        Unit::Count => format!("{v}"),
    }
}

/// Evaluates every assertion against `s`, in order.
pub fn evaluate(asserts: &[Assertion], s: &Summary) -> Vec<Verdict> {
    asserts
        .iter()
        .map(|a| {
            let unit = a.metric.unit();
            let (threshold, expected) = match a.value {
                Value::Number(n) => (n, format!("{} {}", a.op.as_str(), fmt_value(unit, n))),
                Value::Requested => {
                    let n = s.agents.requested as f64;
                    (
                        n,
                        format!("{} {} (requested)", a.op.as_str(), fmt_value(unit, n)),
                    )
                }
            };
            match actual(&a.metric, s) {
                Ok(v) => Verdict {
                    assertion: a.text.clone(),
                    actual: Some(v),
                    expected,
                    passed: a.op.holds(v, threshold),
                    note: None,
                },
                Err(absent) => Verdict {
                    assertion: a.text.clone(),
                    actual: None,
                    expected,
                    passed: false,
                    note: Some(absent.to_string()),
                },
            }
        })
        .collect()
}

impl Assertion {
    /// The value compared against, in the path's base unit (`requested`
    /// taken as `requested` agents).
    pub fn threshold(&self, requested: u64) -> f64 {
        match self.value {
            Value::Number(n) => n,
            Value::Requested => requested as f64,
        }
    }
}

impl Verdict {
    /// The measured value in the assertion's unit (`1.20s`, `45.0 MiB`,
    /// `2000`), or `-` when the metric was absent.
    pub fn actual_text(&self) -> String {
        match (self.actual, self.assertion.parse::<Assertion>()) {
            (Some(a), Ok(parsed)) => fmt_value(parsed.metric.unit(), a),
            (Some(a), Err(_)) => format!("{a}"),
            (None, _) => "-".to_string(),
        }
    }
}

/// A path of the assertion grammar read on its own, with no comparison:
/// what a study's figure names (`propagation.p99`, `server.cpu_cores.max`).
/// Parsed once; read from any summary in the path's base unit.
#[derive(Debug, Clone, PartialEq)]
pub struct Measure {
    path: String,
    metric: Metric,
}

impl FromStr for Measure {
    type Err = AssertError;

    fn from_str(s: &str) -> Result<Self, AssertError> {
        let path = s.trim();
        Ok(Measure {
            path: path.to_owned(),
            metric: parse_path(path)?,
        })
    }
}

impl Measure {
    /// The path as written.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The value in `s`, in the path's base unit (µs, bytes, seconds,
    /// count), or why `s` has none.
    pub fn read(&self, s: &Summary) -> Result<f64, Absent> {
        actual(&self.metric, s)
    }

    /// `v` written in the path's unit (`361ms`, `45.0 MiB`, `2000`).
    pub fn show(&self, v: f64) -> String {
        fmt_value(self.metric.unit(), v)
    }

    /// How the value reads (counts, seconds, rates and ratios are
    /// numbers).
    pub fn unit(&self) -> Kind {
        match self.metric.unit() {
            Unit::Micros => Kind::Micros,
            Unit::Bytes => Kind::Bytes,
            _ => Kind::Number,
        }
    }
}

/// Renders verdicts as a plain-text table, one row per assertion and a
/// closing line `SLO: k of n assertions passed`.
pub fn render_verdicts(v: &[Verdict]) -> String {
    let shown: Vec<(String, &Verdict)> = v.iter().map(|x| (x.actual_text(), x)).collect();
    let w_assert = v
        .iter()
        .map(|x| x.assertion.chars().count())
        .chain([9])
        .max()
        .unwrap_or(9);
    let w_actual = shown
        .iter()
        .map(|(a, _)| a.chars().count())
        .chain([6])
        .max()
        .unwrap_or(6);
    let w_expected = v
        .iter()
        .map(|x| x.expected.chars().count())
        .chain([8])
        .max()
        .unwrap_or(8);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<6} {:<w_assert$}  {:>w_actual$}  {:<w_expected$}",
        "result", "assertion", "actual", "expected"
    );
    for (actual, x) in &shown {
        let line = format!(
            "{:<6} {:<w_assert$}  {:>w_actual$}  {:<w_expected$}  {}",
            if x.passed { "pass" } else { "FAIL" },
            x.assertion,
            actual,
            x.expected,
            x.note.as_deref().unwrap_or("")
        );
        let _ = writeln!(out, "{}", line.trim_end());
    }
    let passed = v.iter().filter(|x| x.passed).count();
    let _ = writeln!(out, "SLO: {passed} of {} assertions passed", v.len());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::new_latency_histogram;
    use crate::summary::{LatencySummary, ProbeSummary};

    fn summary() -> Summary {
        let mut s = Summary {
            kind: "consul".into(),
            duration_s: 90.0,
            ..Default::default()
        };
        s.agents.requested = 10_000;
        s.agents.connected = 10_000;
        s.agents.peak_connected = 10_000;
        s.agents.never_connected = 0;
        s.counters.insert("keepalives_sent".into(), 500);
        for (kind, count) in [("connect_refused", 2), ("timeout", 1)] {
            s.errors.insert(
                kind.into(),
                crate::summary::KindEntry {
                    count,
                    ..Default::default()
                },
            );
        }
        s.rates_per_s.insert("events".into(), 4_200.0);
        s.process.peak_rss_bytes = 300 * 1024 * 1024;
        s.process.cpu_user_s = 4.5;
        let mut h = new_latency_histogram();
        for v in 1..=1000u64 {
            h.record(v * 1000).unwrap(); // 1 ms .. 1 s
        }
        s.latency_us
            .insert("connect".into(), LatencySummary::from_histogram(&h));
        s.latency_us.insert(
            "empty".into(),
            LatencySummary::from_histogram(&new_latency_histogram()),
        );
        let mut p1 = new_latency_histogram();
        p1.record(200_000).unwrap();
        let mut p2 = new_latency_histogram();
        p2.record(900_000).unwrap();
        for (id, h, delivered) in [(1, p1, 100), (2, p2, 98)] {
            s.probes.push(ProbeSummary {
                id,
                kind: "deregister".into(),
                delivered,
                expected: 100,
                time_to_99pct_us: Some(h.max()),
                latency_us: LatencySummary::from_histogram(&h),
                ..Default::default()
            });
        }
        s
    }

    fn check(expr: &str) -> Verdict {
        let a: Assertion = expr.parse().unwrap_or_else(|e| panic!("{expr}: {e}"));
        evaluate(&[a], &summary()).remove(0)
    }

    fn passes(expr: &str) -> bool {
        let v = check(expr);
        assert!(v.note.is_none(), "{expr}: {:?}", v.note);
        v.passed
    }

    #[test]
    fn disruption_paths_read_the_reconvergence() {
        let log = crate::disruption::DisruptionLog::default();
        let sec = std::time::Duration::from_secs(1);
        let id = log.open("storm", "sensu", 10 * sec, None).unwrap();
        for ms in [200u64, 400, 800] {
            log.lost(id);
            let d = std::time::Duration::from_millis(ms);
            log.back(id, d, 10 * sec + d, 1);
        }
        let mut s = summary();
        s.disruptions = log.summaries();
        let run = |e: &str| evaluate(&[e.parse().unwrap()], &s).remove(0);
        for e in [
            "disruptions.count == 1",
            "disruptions.sessions_lost == 3",
            "disruptions.missing == 0",
            "disruptions.attempts == 3",
            "disruptions.back_after_p100 < 801ms",
            "disruptions.back_after_p50 > 399ms",
            "reconvergence.p99 < 1s",
            "reconvergence.max > 799ms",
            "reconvergence.count == 3",
        ] {
            let v = run(e);
            assert!(v.passed, "{e}: {v:?}");
        }
        log.lost(id);
        s.disruptions = log.summaries();
        let v = evaluate(&["disruptions.back_after_p100 < 1s".parse().unwrap()], &s).remove(0);
        assert!(
            !v.passed && v.note.as_deref().unwrap().contains("never"),
            "{v:?}"
        );
        let v = check("reconvergence.p99 < 1s");
        assert!(!v.passed && v.note.is_some());
        assert!("disruptions.nope == 1".parse::<Assertion>().is_err());
    }

    #[test]
    fn every_operator() {
        // connect.p50 is 500 ms (within HDR precision: 500.0..500.5 ms).
        assert!(passes("connect.p50 < 501ms"));
        assert!(!passes("connect.p50 < 499ms"));
        assert!(passes("agents.connected <= 10000"));
        assert!(!passes("agents.connected <= 9999"));
        assert!(passes("errors.total > 2"));
        assert!(!passes("errors.total > 3"));
        assert!(passes("errors.total >= 3"));
        assert!(!passes("errors.total >= 4"));
        assert!(passes("errors.total == 3"));
        assert!(!passes("errors.total == 0"));
        assert!(passes("errors.total != 0"));
        assert!(!passes("errors.total != 3"));
        assert!(passes("agents.connected==requested"));
        assert!(!passes("agents.failed == requested"));
        assert!(passes("agents.failed != requested"));
    }

    #[test]
    fn units_and_paths() {
        assert!(passes("connect.p99 < 1s"));
        assert!(passes("latency.connect.p99 <= 1000ms"));
        assert!(passes("connect.max < 1_000_500")); // bare = µs
        assert!(passes("connect.min >= 999us"));
        assert!(passes("connect.min <= 1000µs"));
        assert!(passes("connect.min > 900000ns"));
        assert!(passes("connect.p99.9 < 0.02m"));
        assert!(passes("connect.count == 1000"));
        assert!(passes("connect.mean < 1h"));
        assert!(passes("process.peak_rss_bytes <= 300MiB"));
        assert!(!passes("process.peak_rss_bytes < 307200KiB"));
        assert!(passes("process.peak_rss < 1GiB"));
        assert!(passes("process.peak_rss_bytes > 300MB"));
        assert!(passes("process.cpu_user_s < 5"));
        assert!(passes("duration_s >= 1.5m"));
        assert!(passes("keepalives_sent > 0"));
        assert!(passes("counters.keepalives_sent == 500"));
        assert!(passes("errors.connect_refused == 2"));
        assert!(passes("errors.never_seen == 0"));
        assert!(passes("errors == 3"));
        assert!(passes("rates.events >= 4000/s"));
        assert!(passes("probes.delivered_ratio >= 0.98"));
        assert!(!passes("probes.delivered_ratio >= 99%"));
        assert!(passes("probes.time_to_99pct <= 901ms"));
        assert!(!passes("probes.time_to_99pct < 899ms"));
        // propagation falls back to the probes' merged histograms.
        let v = check("propagation.max < 1s");
        assert!(v.passed, "{v:?}");
        assert_eq!(check("propagation.count == 2").actual, Some(2.0));
    }

    #[test]
    fn absent_metrics_fail_with_a_note() {
        for expr in [
            "nope.p99 < 1s",
            "latency.nope.p50 < 1s",
            "no_such_counter == 0",
            "counters.nope > 1",
            "rates.nope > 1",
            "empty.p99 < 1s",
        ] {
            let v = check(expr);
            assert!(!v.passed, "{expr}");
            assert_eq!(v.actual, None, "{expr}");
            assert!(v.note.is_some(), "{expr}");
        }
        assert!(check("empty.count == 0").passed);
        let mut s = summary();
        s.probes.clear();
        let v = evaluate(&["probes.delivered_ratio > 0.5".parse().unwrap()], &s);
        assert!(!v[0].passed && v[0].note.as_deref().unwrap().contains("probes"));
    }

    #[test]
    fn parse_errors_are_one_line_reasons() {
        for (expr, want) in [
            ("connect.p99", "no operator"),
            ("connect.p99 = 1s", "bad operator"),
            ("connect.p99 =< 1s", "bad operator"),
            ("connect.p99 <<= 1s", "bad operator"),
            ("< 1s", "missing path"),
            ("connect.p99 <", "missing value"),
            ("connect.p98 < 1s", "statistic"),
            ("connect.p99 < 1 fortnight", "unknown unit"),
            ("connect.p99 < fast", "bad number"),
            ("connect.p99 < requested", "requested"),
            ("agents.happy == 1", "agents field"),
            ("process.peak_rss_bytes < 20Mb-ish", "unknown unit"),
            ("process.vsz < 1", "process field"),
            ("probes.fun > 1", "probes field"),
            ("a.b.c.d < 1", "unknown path"),
            ("a..b < 1", "empty segment"),
            ("a b < 1", "bad path"),
        ] {
            let e = expr.parse::<Assertion>().unwrap_err().to_string();
            assert!(e.contains(want), "{expr}: {e}");
            assert!(!e.contains('\n'), "{expr}: {e}");
        }
    }

    #[test]
    fn parse_errors_say_which_mistake() {
        let err = |e: &str| e.parse::<Assertion>().unwrap_err();
        assert_eq!(
            err("connect.p99"),
            AssertError::NoOperator("connect.p99".into())
        );
        assert!(matches!(
            err("agents.happy == 1"),
            AssertError::UnknownField { section: "agents", field, .. } if field == "happy"
        ));
        assert!(matches!(
            err("vault.nope == 0"),
            AssertError::UnknownField {
                section: "vault",
                ..
            }
        ));
        assert!(matches!(
            err("server.cpu_cores.p42 < 1"),
            AssertError::UnknownServerStatistic { .. }
        ));
        // A latency's mean takes a duration; a series' mean a number.
        let mean: Assertion = "server.sensu_go_eventd_update_event_duration.mean < 50ms"
            .parse()
            .unwrap();
        assert_eq!(mean.threshold(0), 50_000.0);
        assert!(
            "server.etcd_server_proposals_pending.mean < 5"
                .parse::<Assertion>()
                .is_ok()
        );
        assert!(matches!(
            err("server.etcd_server_proposals_pending.mean < 5ms"),
            AssertError::Value { .. }
        ));
        let e = err("connect.p99 < fast");
        assert!(
            matches!(
                &e,
                AssertError::Value {
                    source: ValueError::Number { .. },
                    ..
                }
            ),
            "{e:?}"
        );
        // The number's parse error is kept as the cause.
        let value = std::error::Error::source(&e).unwrap();
        assert!(std::error::Error::source(value).is_some(), "{e:?}");
        assert!(matches!(
            err("connect.p99 < 1 fortnight"),
            AssertError::Value {
                source: ValueError::Unit { .. },
                ..
            }
        ));
    }

    #[test]
    fn verdict_table_shows_each_assertion() {
        let asserts: Vec<Assertion> = ["connect.p99 < 1s", "errors.total == 0", "nope.p99 < 1s"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let v = evaluate(&asserts, &summary());
        assert_eq!(
            v.iter().map(|x| x.passed).collect::<Vec<_>>(),
            [true, false, false]
        );
        assert_eq!(v[0].expected, "< 1.00s");
        let t = render_verdicts(&v);
        assert!(t.contains("pass   connect.p99 < 1s"), "{t}");
        assert!(t.contains("FAIL   errors.total == 0"), "{t}");
        assert!(t.contains("no latency \"nope\""), "{t}");
        assert!(
            t.contains("990.") || t.contains("991."),
            "actual shown in ms: {t}"
        );
        assert!(t.ends_with("SLO: 1 of 3 assertions passed\n"), "{t}");
        let r = evaluate(
            &["agents.connected == requested".parse().unwrap()],
            &summary(),
        );
        assert_eq!(r[0].expected, "== 10000 (requested)");
        // A fractional mean reads as the other latencies do.
        let m: Measure = "connect.mean".parse().unwrap();
        assert_eq!(m.show(1_008_530.285_714), fmt_us(1_008_530));
    }

    #[test]
    fn gossip_paths_read_the_servers_view_of_the_members() {
        use crate::server::{GossipSample, GossipSummary, ServerSummary};
        let asserts: Vec<Assertion> = [
            "gossip.failed_ever == 0",
            "gossip.critical_ever <= 1",
            "gossip.alive_max >= 2",
            "gossip.not_left_at_end == 0",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        let none = evaluate(&asserts[..1], &summary());
        assert!(!none[0].passed);
        assert!(
            none[0].note.as_deref().unwrap().contains("gossip members"),
            "{none:?}"
        );
        let mut s = summary();
        let at = GossipSample::at;
        s.server.push(ServerSummary {
            gossip: Some(GossipSummary {
                samples: vec![at(5.0, 2, 0, 0), at(10.0, 1, 0, 1), at(15.0, 0, 2, 0)],
                failed_ever: 1,
                failed_turns: 1,
                critical_ever: 1,
                ..GossipSummary::default()
            }),
            ..ServerSummary::default()
        });
        let v = evaluate(&asserts, &s);
        assert_eq!(
            v.iter().map(|x| x.passed).collect::<Vec<_>>(),
            [false, true, true, true],
            "{v:?}"
        );
        assert_eq!(v[0].actual, Some(1.0));
        let e = "gossip.suspect == 0"
            .parse::<Assertion>()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown gossip field") && e.contains("failed_ever"),
            "{e}"
        );
    }
}
