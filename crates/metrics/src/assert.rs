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
//! | `server.<latency>.<p50\|p99\|mean\|baseline_p50\|baseline_p99>` | a kept server latency under load or at baseline (`consul_raft_commit_time`, `etcd_disk_wal_fsync_duration_seconds`, ...) | duration |
//! | `server.<series>.<max\|mean\|last\|baseline>` | a kept gauge, or a counter's rate (`<name>_per_s`) | number |
//! | `vault.split_brain` `vault.mismatch` `vault.read_back_lost` `vault.read_back_changed` `vault.keys_left` `vault.sessions_left` `vault.tokens_created` `vault.leadership_changes` `vault.fenced_writes` `vault.handover_max_s` | the run's simulated Vault servers (`--vault-nodes`, docs/writes.md): the lock checker's split-brain and mismatched checks, read-backs lost or changed, what the clean-up left, tokens created, leadership changes, fenced writes, the longest handover in seconds | number |
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
//! This module only evaluates; it does not decide exit codes or print.

use std::fmt::Write as _;
use std::str::FromStr;

use crate::new_latency_histogram;
use crate::server::GOSSIP_FIELDS;
use crate::summary::{LatencySummary, Summary};
use crate::units::{fmt_mib, fmt_us};

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

const STATS: &[&str] = &[
    "count", "min", "p50", "p75", "p90", "p95", "p99", "p999", "max", "mean",
];

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
            | Metric::Vault(_) => Unit::Count,
            Metric::Rate(_) => Unit::PerSecond,
            Metric::ProbesDeliveredRatio => Unit::Ratio,
            Metric::PeakRss => Unit::Bytes,
            Metric::CpuUser | Metric::CpuSys | Metric::DurationS => Unit::Seconds,
            Metric::Server { name, stat } => match (name.as_str(), stat.as_str()) {
                ("rss_bytes", _) => Unit::Bytes,
                (_, "p50" | "p99" | "baseline_p50" | "baseline_p99") => Unit::Micros,
                ("cpu_cores" | "cores_per_1000_agents" | "rss_per_agent_kib", _) => Unit::Plain,
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

fn stat_of(s: &str) -> Option<&'static str> {
    STATS.iter().copied().find(|x| *x == s)
}

fn parse_path(path: &str) -> Result<Metric, String> {
    let normalized = path.strip_suffix(".p99.9").map(|p| format!("{p}.p999"));
    let path = normalized.as_deref().unwrap_or(path);
    if path.is_empty()
        || !path
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        return Err(format!(
            "bad path {path:?} (letters, digits, `_`, `-` and `.` only)"
        ));
    }
    let seg: Vec<&str> = path.split('.').collect();
    if seg.iter().any(|s| s.is_empty()) {
        return Err(format!("bad path {path:?} (empty segment)"));
    }
    let bad_stat = |s: &str| {
        format!(
            "unknown latency statistic {s:?} in {path:?} (one of {})",
            STATS.join(", ")
        )
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
                .ok_or_else(|| {
                    format!("unknown agents field {f:?} ({})", AGENT_FIELDS.join(", "))
                })?,
        ),
        ["errors"] | ["errors", "total"] => Metric::ErrorsTotal,
        ["errors", kind] => Metric::Error((*kind).to_owned()),
        ["warnings", kind] => Metric::Warning((*kind).to_owned()),
        ["counters", name] => Metric::Counter((*name).to_owned()),
        ["rates" | "rates_per_s", name] => Metric::Rate((*name).to_owned()),
        ["probes", "delivered_ratio"] => Metric::ProbesDeliveredRatio,
        ["probes", "time_to_99pct" | "time_to_99pct_us"] => Metric::ProbesTimeTo99,
        ["probes", f] => {
            return Err(format!(
                "unknown probes field {f:?} (delivered_ratio, time_to_99pct)"
            ));
        }
        ["disruptions", f] => disruptions_field(f)?,
        ["process", "peak_rss_bytes" | "peak_rss"] => Metric::PeakRss,
        ["process", "cpu_user_s"] => Metric::CpuUser,
        ["process", "cpu_sys_s"] => Metric::CpuSys,
        ["process", f] => {
            return Err(format!(
                "unknown process field {f:?} (peak_rss_bytes, cpu_user_s, cpu_sys_s)"
            ));
        }
        ["duration_s"] => Metric::DurationS,
        [
            "server",
            f @ ("cores_per_1000_agents" | "rss_per_agent_kib"),
        ] => Metric::Server {
            name: (*f).to_owned(),
            stat: String::new(),
        },
        ["server", name, stat] => Metric::Server {
            name: (*name).to_owned(),
            stat: server_stat(name, stat)?,
        },
        ["server", ..] => {
            return Err(format!(
                "unknown server path {path:?} (server.cpu_cores.max, server.rss_bytes.mean, \
                 server.cores_per_1000_agents, server.rss_per_agent_kib, \
                 server.<latency>.p99, server.<series>.max)"
            ));
        }
        ["vault", f] => Metric::Vault(crate::vault::field(f)?),
        ["gossip", f] => {
            Metric::Gossip(GOSSIP_FIELDS.into_iter().find(|x| x == f).ok_or_else(|| {
                format!("unknown gossip field {f:?} ({})", GOSSIP_FIELDS.join(", "))
            })?)
        }
        [name] => Metric::Counter((*name).to_owned()),
        [name, stat] => Metric::Latency {
            name: (*name).to_owned(),
            stat: stat_of(stat).ok_or_else(|| bad_stat(stat))?,
        },
        _ => return Err(format!("unknown path {path:?}")),
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

fn server_stat(name: &str, stat: &str) -> Result<String, String> {
    SERVER_STATS
        .into_iter()
        .find(|x| *x == stat)
        .map(str::to_owned)
        .ok_or_else(|| {
            format!(
                "unknown statistic {stat:?} of server.{name} ({})",
                SERVER_STATS.join(", ")
            )
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

fn disruptions_field(f: &str) -> Result<Metric, String> {
    let Some(field) = DISRUPTION_FIELDS.into_iter().find(|x| *x == f) else {
        return Err(format!(
            "unknown disruptions field {f:?} ({})",
            DISRUPTION_FIELDS.join(", ")
        ));
    };
    Ok(match field.strip_prefix("back_after_") {
        Some(_) => Metric::DisruptionsBackAfter(field),
        None => Metric::Disruptions(field),
    })
}

/// Splits `"250ms"` into `(250.0, "ms")`.
fn split_number(s: &str) -> Result<(f64, &str), String> {
    let end = s
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_digit() || c == '.' || c == '_' || (i == 0 && c == '-')))
        .map_or(s.len(), |(i, _)| i);
    let (num, unit) = s.split_at(end);
    let n: f64 = num
        .replace('_', "")
        .parse()
        .map_err(|_| format!("bad number in value {s:?}"))?;
    Ok((n, unit.trim()))
}

fn parse_value(s: &str, unit: Unit) -> Result<Value, String> {
    if s.is_empty() {
        return Err("missing value after the operator".into());
    }
    if s == "requested" {
        return if unit == Unit::Count {
            Ok(Value::Requested)
        } else {
            Err("`requested` compares only with counts (agents.*, counters)".into())
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
            let allowed = match u {
                Unit::Micros => "ns, us, µs, ms, s, m, h (bare = µs)",
                Unit::Seconds => "ms, s, m, h (bare = seconds)",
                Unit::Bytes => "B, KiB, MiB, GiB, KB, MB, GB (bare = bytes)",
                Unit::Ratio => "% (or a bare fraction)",
                Unit::PerSecond => "/s (or a bare number)",
                Unit::Count => "none: a plain number or `requested`",
                Unit::Plain => "none: a plain number",
            };
            return Err(format!("unknown unit {other:?} in {s:?}; units: {allowed}"));
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
    type Err = String;

    /// Parses `path op value`; the error is a one-line reason.
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let Some(pos) = s.find(['<', '>', '=', '!']) else {
            return Err(format!(
                "no operator in {s:?} (expected `path op value`, op one of < <= > >= == !=)"
            ));
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
            return Err(format!(
                "bad operator in {s:?} (one of < <= > >= == !=; equality is `==`)"
            ));
        };
        let path = s[..pos].trim();
        let value_text = rest[len..].trim();
        if value_text.starts_with(['<', '>', '=', '!']) {
            return Err(format!("bad operator in {s:?} (one of < <= > >= == !=)"));
        }
        if path.is_empty() {
            return Err(format!("missing path before the operator in {s:?}"));
        }
        let metric = parse_path(path)?;
        let value = parse_value(value_text, metric.unit())
            .map_err(|e| format!("{e} (in assertion {s:?})"))?;
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

/// Latency summary by name; `propagation` falls back to the probes' merged histograms.
fn find_latency(s: &Summary, name: &str) -> Result<LatencySummary, String> {
    if let Some(l) = s.latency_us.get(name) {
        return Ok(l.clone());
    }
    if name == "propagation" && !s.probes.is_empty() {
        if let [only] = s.probes.as_slice() {
            return Ok(only.latency_us.clone());
        }
        let mut acc = new_latency_histogram();
        for p in &s.probes {
            let h = p
                .latency_us
                .merge_histogram(&format!("probe #{}", p.id))
                .map_err(|e| e.to_string())?;
            acc.add(&h).map_err(|e| format!("{e:?}"))?;
        }
        return Ok(LatencySummary::from_histogram(&acc));
    }
    if name == "reconvergence" {
        if s.disruptions.is_empty() {
            return Err("no disruptions in the summary".into());
        }
        let mut acc = new_latency_histogram();
        for d in &s.disruptions {
            let h = d
                .reconnect_us
                .merge_histogram(&format!("disruption #{}", d.id))
                .map_err(|e| e.to_string())?;
            acc.add(&h).map_err(|e| format!("{e:?}"))?;
        }
        return Ok(LatencySummary::from_histogram(&acc));
    }
    let have: Vec<&str> = s.latency_us.keys().map(String::as_str).collect();
    Err(format!(
        "no latency {name:?} in the summary (has: {})",
        if have.is_empty() {
            "none".to_string()
        } else {
            have.join(", ")
        }
    ))
}

fn actual(m: &Metric, s: &Summary) -> Result<f64, String> {
    Ok(match m {
        Metric::Latency { name, stat } => {
            let l = find_latency(s, name)?;
            if l.count == 0 && *stat != "count" {
                return Err(format!("latency {name:?} has no samples"));
            }
            latency_stat(&l, stat)
        }
        Metric::Agents(f) => {
            (match *f {
                "requested" => s.agents.requested,
                "connected" => s.agents.connected,
                "peak_connected" => s.agents.peak_connected,
                "ever_connected" => s.agents.ever_connected,
                "lost_not_back" => s.agents.lost_not_back,
                "left" => s.agents.left,
                _ => s.agents.never_connected,
            }) as f64
        }
        Metric::ErrorsTotal => s.errors_total() as f64,
        Metric::Error(kind) => s.errors.get(kind).map_or(0, |e| e.count) as f64,
        Metric::Warning(kind) => s.warnings.get(kind).map_or(0, |e| e.count) as f64,
        Metric::Counter(name) => match s.counters.get(name) {
            Some(v) => *v as f64,
            None => {
                let have: Vec<&str> = s.counters.keys().map(String::as_str).collect();
                return Err(format!(
                    "no counter {name:?} in the summary (has: {})",
                    if have.is_empty() {
                        "none".to_string()
                    } else {
                        have.join(", ")
                    }
                ));
            }
        },
        Metric::Rate(name) => *s
            .rates_per_s
            .get(name)
            .ok_or_else(|| format!("no rate {name:?} in the summary"))?,
        Metric::ProbesDeliveredRatio => s
            .probes
            .iter()
            .filter(|p| p.expected > 0)
            .map(|p| p.delivered as f64 / p.expected as f64)
            .reduce(f64::min)
            .ok_or("no probes with expected subscribers in the summary")?,
        Metric::ProbesTimeTo99 => {
            if s.probes.is_empty() {
                return Err("no probes in the summary".into());
            }
            let mut worst = 0u64;
            for p in &s.probes {
                match p.time_to_99pct_us {
                    Some(t) => worst = worst.max(t),
                    None => return Err(format!("probe #{} never reached 99 %", p.id)),
                }
            }
            worst as f64
        }
        Metric::Disruptions(f) => {
            let d = &s.disruptions;
            (match *f {
                "count" => d.len() as u64,
                "sessions_lost" => d.iter().map(|x| x.sessions_lost).sum(),
                "back" => d.iter().map(|x| x.back).sum(),
                "missing" => d.iter().map(|x| x.missing()).sum(),
                _ => d.iter().map(|x| x.attempts).sum(),
            }) as f64
        }
        Metric::DisruptionsBackAfter(f) => {
            if s.disruptions.is_empty() {
                return Err("no disruptions in the summary".into());
            }
            let mut worst = 0f64;
            for d in &s.disruptions {
                let b = &d.back_after_s;
                let v = match *f {
                    "back_after_p50" => b.p50,
                    "back_after_p90" => b.p90,
                    "back_after_p99" => b.p99,
                    _ => b.p100,
                };
                match v {
                    Some(x) => worst = worst.max(x * 1e6),
                    None => {
                        return Err(format!(
                            "disruption #{} ({}) never got there",
                            d.id, d.cause
                        ));
                    }
                }
            }
            worst.round()
        }
        Metric::PeakRss => s.process.peak_rss_bytes as f64,
        Metric::CpuUser => s.process.cpu_user_s,
        Metric::CpuSys => s.process.cpu_sys_s,
        Metric::DurationS => s.duration_s,
        Metric::Gossip(f) => gossip_stat(s, f)?,
        Metric::Vault(f) => crate::vault::value(s.vault.as_ref(), f)?,
        Metric::Server { name, stat } => {
            if s.server.is_empty() {
                return Err("no server was observed (--observe)".into());
            }
            s.server
                .iter()
                .filter_map(|srv| match name.as_str() {
                    "cores_per_1000_agents" => srv.sizing.cores_per_1000_agents,
                    "rss_per_agent_kib" => srv.sizing.rss_per_agent_kib,
                    _ => srv.stat(name, stat),
                })
                .reduce(f64::max)
                .ok_or_else(|| {
                    let mut kept: Vec<&str> = s
                        .server
                        .iter()
                        .flat_map(|srv| srv.latencies.keys().map(String::as_str))
                        .collect();
                    kept.sort_unstable();
                    kept.dedup();
                    format!(
                        "no observed server has {name}{} (latencies kept: {})",
                        if stat.is_empty() {
                            String::new()
                        } else {
                            format!(".{stat}")
                        },
                        if kept.is_empty() {
                            "none".to_string()
                        } else {
                            kept.join(", ")
                        }
                    )
                })?
        }
    })
}

/// The highest `gossip.<field>` among the observed servers.
fn gossip_stat(s: &Summary, field: &str) -> Result<f64, String> {
    s.server
        .iter()
        .filter_map(|srv| srv.gossip.as_ref()?.stat(field))
        .max()
        .map(|v| v as f64)
        .ok_or_else(|| {
            "no observed Consul server reported the run's gossip members (a fleet that \
             gossips and --observe consul)"
                .to_string()
        })
}

fn fmt_value(unit: Unit, v: f64) -> String {
    match unit {
        Unit::Micros if v >= 0.0 && v.fract() == 0.0 => fmt_us(v as u64),
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
                Err(note) => Verdict {
                    assertion: a.text.clone(),
                    actual: None,
                    expected,
                    passed: false,
                    note: Some(note),
                },
            }
        })
        .collect()
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
    use crate::summary::ProbeSummary;

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
            let e = expr.parse::<Assertion>().unwrap_err();
            assert!(e.contains(want), "{expr}: {e}");
            assert!(!e.contains('\n'), "{expr}: {e}");
        }
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
        let e = "gossip.suspect == 0".parse::<Assertion>().unwrap_err();
        assert!(
            e.contains("unknown gossip field") && e.contains("failed_ever"),
            "{e}"
        );
    }
}
