//! The scenario timeline: what a run does to its own sessions besides
//! holding them (`--churn`, `--max-session-length`, `--storm`, `--pause`,
//! `--ramp-down`, and `[[scenario]]` sections of the config file).
//!
//! Parts:
//! - the specs as typed, written on the command line and in config files:
//!   [`ChurnSpec`] (`5%/30s`), [`StormSpec`] (`at=60s,drop=100%`),
//!   [`PauseSpec`] (`at=2m,for=30s,share=10%`), [`RampDownSpec`]
//!   (`200/s` or `at=5m,rate=200/s`), each parsed once by [`FromStr`];
//! - [`PhaseSpec`]: one phase as given (a spec plus optional `at`, `until`,
//!   `for`), and [`Scenario::plan`], which lays the phases on the run's
//!   clock: a phase without `at` starts when the one before it ends (one
//!   phase after another), otherwise at its own time;
//! - [`Phase`] / [`Scenario`]: the resolved timeline the engine drives;
//! - the mistakes: [`ShareError`] and [`SpecError`] (a spec as written),
//!   [`ScenarioError`] (a phase that cannot be laid on the run's clock).
//!
//! Timing rules (also in docs/scenarios.md):
//! - Continuous phases (churn, max session length) without `until`/`for`
//!   stop [`settle`] before the end of a run with a `--duration`, so the
//!   end-of-run count measures the fleet, not the churn in flight: 10 % of
//!   the run (at most 10 s), or longer when an agent takes longer to come
//!   back (the caller's `comeback`: its reconnect delay and the protocol's
//!   own, e.g. Consul's staggered sync after a reconnect).
//! - A session of max length `L` ends after `L` ± [`SESSION_LENGTH_JITTER`]
//!   (uniform), counted from the moment it reached steady state.
//! - `--ramp-down R` without `at=` starts so that the last agent leaves as
//!   the run ends (`duration − agents/R`); it needs `--duration`.
//!
//! What it is not: the driver (see `driver`), or the CLI's flag names (the
//! CLI names its flags in [`ScenarioError`]s through [`PhaseSpec::origin`]).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::units::{Rate, UnitError, parse_duration};

/// Relative jitter of a max session length: each session lasts
/// `L × uniform(1 − j, 1 + j)`.
pub const SESSION_LENGTH_JITTER: f64 = 0.10;

/// How long before the end of a run continuous phases stop when they were
/// given no end: 10 % of the run (at most 10 s), or `comeback` (how long an
/// agent whose session was ended takes to be back) when that is longer.
pub fn settle(run: Duration, comeback: Duration) -> Duration {
    (run / 10).min(Duration::from_secs(10)).max(comeback)
}

/// Why a share does not parse (each carries the share as given).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShareError {
    /// No `%` at the end.
    #[error("share {0:?}: expected a percentage such as 5%")]
    NotPercent(String),
    /// What comes before the `%` is not a number.
    #[error("share {text:?}: {num:?} is not a number")]
    NotNumber {
        /// The share as given.
        text: String,
        /// The part before the `%`.
        num: String,
    },
    /// Zero, below zero or not finite.
    #[error("share {0:?} must be above 0%")]
    NotAboveZero(String),
    /// Over 100 %.
    #[error("share {0:?} is above 100%")]
    OverAll(String),
}

/// Why a spec (`5%/30s`, `at=60s,drop=100%`, any `key=value` list read by
/// [`pairs`]) does not parse.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpecError {
    /// A share that does not parse.
    #[error(transparent)]
    Share(#[from] ShareError),
    /// A duration or a rate that does not parse.
    #[error(transparent)]
    Unit(#[from] UnitError),
    /// A churn without its `/`.
    #[error("{0:?}: expected SHARE/PERIOD, e.g. 5%/30s")]
    NotChurn(String),
    /// A churn over a period of zero.
    #[error("{0:?}: the period must be above zero")]
    ZeroPeriod(String),
    /// An item of a `key=value` list without its `=`.
    #[error("{item:?}: expected key=value (keys: {keys})")]
    NotPair {
        /// The item as given.
        item: String,
        /// The keys the list takes, comma-separated.
        keys: String,
    },
    /// A key the list does not take.
    #[error("unknown key {key:?} (keys: {keys})")]
    UnknownKey {
        /// The key as given.
        key: String,
        /// The keys the list takes, comma-separated.
        keys: String,
    },
    /// A key given twice.
    #[error("{0}= given twice")]
    Twice(String),
    /// A key's duration or rate that does not parse.
    #[error("{key}={value}: {source}")]
    BadUnit {
        /// The key.
        key: String,
        /// Its value as given.
        value: String,
        /// What is wrong with it.
        source: UnitError,
    },
    /// A key's share that does not parse.
    #[error("{key}={value}: {source}")]
    BadShare {
        /// The key.
        key: String,
        /// Its value as given.
        value: String,
        /// What is wrong with it.
        source: ShareError,
    },
    /// A pause of length zero.
    #[error("for= must be above zero")]
    ZeroLength,
    /// A ramp-down in `key=value` form without its rate.
    #[error("rate= is missing (e.g. rate=200/s)")]
    NoRate,
}

/// A share of sessions or agents, written `N%` (0 < N ≤ 100).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Share(pub(crate) f64);

impl Share {
    /// All of them.
    pub const ALL: Share = Share(1.0);

    /// The fraction, in `(0, 1]`.
    pub fn fraction(self) -> f64 {
        self.0
    }

    /// `round(fraction × n)`, at least 1 when `n > 0`.
    pub fn of(self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        ((self.0 * n as f64).round() as u64).clamp(1, n)
    }
}

impl FromStr for Share {
    type Err = ShareError;
    fn from_str(s: &str) -> Result<Self, ShareError> {
        let t = s.trim();
        let Some(num) = t.strip_suffix('%') else {
            return Err(ShareError::NotPercent(t.into()));
        };
        let p: f64 = num.trim().parse().map_err(|_| ShareError::NotNumber {
            text: t.into(),
            num: num.into(),
        })?;
        if !p.is_finite() || p <= 0.0 {
            return Err(ShareError::NotAboveZero(t.into()));
        }
        if p > 100.0 {
            return Err(ShareError::OverAll(t.into()));
        }
        Ok(Share(p / 100.0))
    }
}

impl fmt::Display for Share {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}%", (self.0 * 1e6).round() / 1e4)
    }
}

fn fmt_d(d: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(d)
}

/// `key=value,key=value` pairs; every key must be one of `known`, once
/// (the form of every scenario flag, and of others that name a moment).
pub fn pairs<'a>(s: &'a str, known: &[&str]) -> Result<Vec<(&'a str, &'a str)>, SpecError> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let Some((k, v)) = item.split_once('=') else {
            return Err(SpecError::NotPair {
                item: item.into(),
                keys: known.join(", "),
            });
        };
        let (k, v) = (k.trim(), v.trim());
        if !known.contains(&k) {
            return Err(SpecError::UnknownKey {
                key: k.into(),
                keys: known.join(", "),
            });
        }
        if out.iter().any(|(x, _)| *x == k) {
            return Err(SpecError::Twice(k.into()));
        }
        out.push((k, v));
    }
    Ok(out)
}

/// A pair's duration, refused in words that name the key.
pub fn duration_of(key: &str, v: &str) -> Result<Duration, SpecError> {
    parse_duration(v).map_err(|source| SpecError::BadUnit {
        key: key.into(),
        value: v.into(),
        source,
    })
}

fn share_of(key: &str, v: &str) -> Result<Share, SpecError> {
    v.parse().map_err(|source| SpecError::BadShare {
        key: key.into(),
        value: v.into(),
        source,
    })
}

/// `--churn 5%/30s`: close and reopen that share of the fleet's sessions
/// every period, spread evenly over it (like rolling deploys).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChurnSpec {
    /// Share of the fleet ended per period.
    pub share: Share,
    /// The period.
    pub period: Duration,
}

impl FromStr for ChurnSpec {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        let t = s.trim();
        let Some((share, period)) = t.split_once('/') else {
            return Err(SpecError::NotChurn(t.into()));
        };
        let share: Share = share.parse()?;
        let period = parse_duration(period)?;
        if period.is_zero() {
            return Err(SpecError::ZeroPeriod(t.into()));
        }
        Ok(ChurnSpec { share, period })
    }
}

impl fmt::Display for ChurnSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.share, fmt_d(self.period))
    }
}

/// `--storm at=60s,drop=100%`: drop that share of the connected sessions
/// at once (`drop` defaults to 100 %).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StormSpec {
    /// When, from the start of the run.
    pub at: Option<Duration>,
    /// Share of the connected sessions dropped.
    pub drop: Share,
}

impl FromStr for StormSpec {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        let mut spec = StormSpec {
            at: None,
            drop: Share::ALL,
        };
        for (k, v) in pairs(s, &["at", "drop"])? {
            match k {
                "at" => spec.at = Some(duration_of(k, v)?),
                _ => spec.drop = share_of(k, v)?,
            }
        }
        Ok(spec)
    }
}

impl fmt::Display for StormSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(at) = self.at {
            write!(f, "at={},", fmt_d(at))?;
        }
        write!(f, "drop={}", self.drop)
    }
}

/// `--pause at=2m,for=30s[,share=10%]`: that share of the agents freezes
/// (reads and writes nothing, its timers fire late) for that long.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PauseSpec {
    /// When, from the start of the run.
    pub at: Option<Duration>,
    /// How long the agents stay frozen.
    pub length: Option<Duration>,
    /// Share of the fleet's agents frozen (default 100 %).
    pub share: Share,
}

impl FromStr for PauseSpec {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        let mut spec = PauseSpec {
            at: None,
            length: None,
            share: Share::ALL,
        };
        for (k, v) in pairs(s, &["at", "for", "share"])? {
            match k {
                "at" => spec.at = Some(duration_of(k, v)?),
                "for" => spec.length = Some(duration_of(k, v)?),
                _ => spec.share = share_of(k, v)?,
            }
        }
        if spec.length.is_some_and(|l| l.is_zero()) {
            return Err(SpecError::ZeroLength);
        }
        Ok(spec)
    }
}

impl fmt::Display for PauseSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(at) = self.at {
            parts.push(format!("at={}", fmt_d(at)));
        }
        if let Some(l) = self.length {
            parts.push(format!("for={}", fmt_d(l)));
        }
        parts.push(format!("share={}", self.share));
        f.write_str(&parts.join(","))
    }
}

/// `--ramp-down 200/s` (or `at=5m,rate=200/s`): agents leave politely at
/// that rate, the last agent first; leaving is not a disruption.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RampDownSpec {
    /// When it starts (default: so that it ends with the run).
    pub at: Option<Duration>,
    /// Agents leaving per second.
    pub rate: Rate,
}

impl FromStr for RampDownSpec {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        let t = s.trim();
        if !t.contains('=') {
            return Ok(RampDownSpec {
                at: None,
                rate: t.parse()?,
            });
        }
        let mut at = None;
        let mut rate = None;
        for (k, v) in pairs(t, &["at", "rate"])? {
            match k {
                "at" => at = Some(duration_of(k, v)?),
                _ => {
                    let rate_of = |source| SpecError::BadUnit {
                        key: k.into(),
                        value: v.into(),
                        source,
                    };
                    rate = Some(v.parse::<Rate>().map_err(rate_of)?);
                }
            }
        }
        Ok(RampDownSpec {
            at,
            rate: rate.ok_or(SpecError::NoRate)?,
        })
    }
}

impl fmt::Display for RampDownSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.at {
            Some(at) => write!(f, "at={},rate={}", fmt_d(at), self.rate),
            None => write!(f, "{}", self.rate),
        }
    }
}

macro_rules! deserialize_via_from_str {
    ($($t:ty),*) => {$(
        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    )*};
}
deserialize_via_from_str!(ChurnSpec, StormSpec, PauseSpec, RampDownSpec);

/// What one phase does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum What {
    /// `churn`.
    Churn(ChurnSpec),
    /// `max-session-length`.
    MaxSessionLength(Duration),
    /// `storm`.
    Storm(StormSpec),
    /// `pause`.
    Pause(PauseSpec),
    /// `ramp-down`.
    RampDown(RampDownSpec),
}

/// One phase as given: a spec with optional bounds.
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseSpec {
    /// What it does.
    pub what: What,
    /// Start, from the start of the run (overrides `at=` inside the spec
    /// only when that one is absent; both given is an error).
    pub at: Option<Duration>,
    /// End (continuous phases), from the start of the run.
    pub until: Option<Duration>,
    /// Length (continuous phases; the freeze of a pause).
    pub length: Option<Duration>,
    /// A phase without a start begins when the previous one ends (config
    /// sections); otherwise it needs a start of its own (flags) or starts
    /// at 0 (continuous phases and ramp-downs).
    pub chained: bool,
    /// Where it was given, for messages (`--storm`, `[[scenario]] #2`).
    pub origin: String,
}

impl PhaseSpec {
    /// A phase as a flag gives it: no bounds of its own, not chained.
    pub fn flag(what: What, origin: impl Into<String>) -> Self {
        PhaseSpec {
            what,
            at: None,
            until: None,
            length: None,
            chained: false,
            origin: origin.into(),
        }
    }
}

/// A phase laid on the run's clock (times from the start of the run).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Phase {
    /// End `share × agents` sessions per `period`, evenly spread, from
    /// `from` until `until` (or the end of the run).
    Churn {
        /// Share of the fleet per period.
        share: f64,
        /// The period.
        period: Duration,
        /// Start.
        from: Duration,
        /// End.
        until: Option<Duration>,
    },
    /// Sessions that reach steady state between `from` and `until` end after
    /// `length` ± [`SESSION_LENGTH_JITTER`].
    MaxSessionLength {
        /// Nominal session length.
        length: Duration,
        /// Start.
        from: Duration,
        /// End.
        until: Option<Duration>,
    },
    /// Drop `share` of the connected sessions at `at`.
    Storm {
        /// When.
        at: Duration,
        /// Share of the connected sessions.
        share: f64,
    },
    /// Freeze `share` of the agents from `at` for `length`.
    Pause {
        /// When.
        at: Duration,
        /// How long.
        length: Duration,
        /// Share of the fleet's agents.
        share: f64,
    },
    /// Agents leave at `rate` from `at`, the last one first.
    RampDown {
        /// When it starts.
        at: Duration,
        /// Agents per second.
        rate: Rate,
    },
}

/// A scenario phase that cannot run as given: where it came from and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}: {reason}")]
pub struct ScenarioError {
    /// The flag or section (`--storm`, `[[scenario]] #2`).
    pub origin: String,
    /// What is wrong.
    pub reason: String,
}

/// One phase being laid on the run's clock, with what its checks need.
struct Laying<'a> {
    spec: &'a PhaseSpec,
    run: Option<Duration>,
    agents: u64,
    comeback: Duration,
}

impl Laying<'_> {
    fn bad(&self, reason: impl Into<String>) -> ScenarioError {
        ScenarioError {
            origin: self.spec.origin.clone(),
            reason: reason.into(),
        }
    }

    /// Whether the phase says how long it lasts (`until` or `for`).
    fn explicit_end(&self) -> bool {
        self.spec.until.is_some() || self.spec.length.is_some()
    }

    /// When the phase starts: its `at`, the end of the phase before it when
    /// chained (`cursor`), or `None` (from the run's start, or unknown).
    fn start(&self, cursor: Option<Duration>) -> Result<Option<Duration>, ScenarioError> {
        let spec = self.spec;
        let inner_at = match spec.what {
            What::Storm(s) => s.at,
            What::Pause(p) => p.at,
            What::RampDown(r) => r.at,
            What::Churn(_) | What::MaxSessionLength(_) => None,
        };
        if inner_at.is_some() && spec.at.is_some() {
            return Err(self.bad("at is given twice"));
        }
        let at = inner_at.or(spec.at);
        if spec.until.is_some() && spec.length.is_some() {
            return Err(self.bad("give until or for, not both"));
        }
        let start = match (at, spec.chained) {
            (Some(t), _) => Some(t),
            (None, true) => Some(cursor.ok_or_else(|| {
                self.bad(
                    "has no `at` and follows a phase that never ends: give that one \
                     `until` or `for`, or this one `at`",
                )
            })?),
            (None, false) => None,
        };
        if let (Some(s), Some(r)) = (start, self.run)
            && s >= r
        {
            return Err(self.bad(format!(
                "starts at {} but the run ends at {} (--duration)",
                fmt_d(s),
                fmt_d(r)
            )));
        }
        Ok(start)
    }

    /// When a phase that starts at `from` ends: its `until`, `from` plus
    /// its `for`, or before the run's end with room to settle.
    fn end_of(&self, from: Duration) -> Result<Option<Duration>, ScenarioError> {
        let spec = self.spec;
        let end = match (spec.until, spec.length) {
            (Some(u), _) => Some(u),
            (None, Some(l)) => Some(from + l),
            (None, None) => self
                .run
                .map(|r| r.saturating_sub(settle(r, self.comeback)).max(from)),
        };
        if let Some(e) = end
            && e <= from
            && self.explicit_end()
        {
            return Err(self.bad(format!(
                "ends at {}, not after its start {}",
                fmt_d(e),
                fmt_d(from)
            )));
        }
        Ok(end)
    }

    /// The phase starting at `start`, and where a phase chained after it
    /// starts (`None`: this one never ends).
    fn phase(&self, start: Option<Duration>) -> Result<(Phase, Option<Duration>), ScenarioError> {
        let spec = self.spec;
        let explicit_end = self.explicit_end();
        Ok(match spec.what {
            What::Churn(c) => {
                let from = start.unwrap_or_default();
                let until = self.end_of(from)?;
                (
                    Phase::Churn {
                        share: c.share.fraction(),
                        period: c.period,
                        from,
                        until,
                    },
                    until.filter(|_| explicit_end),
                )
            }
            What::MaxSessionLength(length) => {
                if length.is_zero() {
                    return Err(self.bad("the length must be above zero"));
                }
                let from = start.unwrap_or_default();
                let until = self.end_of(from)?;
                (
                    Phase::MaxSessionLength {
                        length,
                        from,
                        until,
                    },
                    until.filter(|_| explicit_end),
                )
            }
            What::Storm(s) => {
                let at = start.ok_or_else(|| self.bad("at= is required, e.g. at=60s"))?;
                if spec.until.is_some() {
                    return Err(self.bad("a storm is an instant: use for= to hold after it"));
                }
                (
                    Phase::Storm {
                        at,
                        share: s.drop.fraction(),
                    },
                    Some(at + spec.length.unwrap_or_default()),
                )
            }
            What::Pause(p) => {
                let at = start.ok_or_else(|| self.bad("at= is required, e.g. at=60s"))?;
                if spec.until.is_some() || (p.length.is_some() && spec.length.is_some()) {
                    return Err(self.bad("give the pause's length once, as for="));
                }
                let length = p
                    .length
                    .or(spec.length)
                    .ok_or_else(|| self.bad("for= is required, e.g. for=30s"))?;
                (
                    Phase::Pause {
                        at,
                        length,
                        share: p.share.fraction(),
                    },
                    Some(at + length),
                )
            }
            What::RampDown(r) => self.ramp_down(start, r.rate)?,
        })
    }

    /// A ramp-down at `rate`: from its `at`, or timed to end with the run.
    fn ramp_down(
        &self,
        start: Option<Duration>,
        rate: Rate,
    ) -> Result<(Phase, Option<Duration>), ScenarioError> {
        if self.explicit_end() {
            return Err(self.bad("a ramp-down lasts agents ÷ rate: give at= and rate only"));
        }
        let agents = self.agents;
        let takes = Duration::from_secs_f64(agents as f64 / rate.as_per_second());
        let at = match (start, self.run) {
            (Some(t), _) => t,
            (None, Some(run)) => run.checked_sub(takes).ok_or_else(|| {
                self.bad(format!(
                    "{} agent(s) at {} take {}, longer than the run ({}): \
                     raise the rate or give at=",
                    agents,
                    rate,
                    fmt_d(takes),
                    fmt_d(run)
                ))
            })?,
            (None, None) => {
                return Err(self.bad("needs --duration (it ends with the run) or at="));
            }
        };
        Ok((Phase::RampDown { at, rate }, Some(at + takes)))
    }
}

/// The resolved timeline of a fleet (empty: nothing but holding sessions).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scenario {
    /// Phases in the order given.
    pub phases: Vec<Phase>,
}

impl Scenario {
    /// Whether there is nothing to drive.
    pub fn is_empty(&self) -> bool {
        self.phases.is_empty()
    }

    /// Lays `specs` on the clock of a run of `run` (if known) with `agents`
    /// agents whose ended sessions take up to `comeback` to be back (see
    /// [`settle`]), checking each phase.
    pub fn plan(
        specs: &[PhaseSpec],
        run: Option<Duration>,
        agents: u64,
        comeback: Duration,
    ) -> Result<Scenario, ScenarioError> {
        let mut phases = Vec::new();
        // Where a chained phase starts; None after a phase without an end.
        let mut cursor = Some(Duration::ZERO);
        for spec in specs {
            let laying = Laying {
                spec,
                run,
                agents,
                comeback,
            };
            let start = laying.start(cursor)?;
            let (phase, end) = laying.phase(start)?;
            phases.push(phase);
            cursor = end;
        }
        Ok(Scenario { phases })
    }

    /// The max session length in force for a session that reached steady
    /// state at `t`, with the end of its phase.
    pub fn session_length_at(&self, t: Duration) -> Option<(Duration, Option<Duration>)> {
        self.phases.iter().find_map(|p| match *p {
            Phase::MaxSessionLength {
                length,
                from,
                until,
            } if t >= from && until.is_none_or(|u| t < u) => Some((length, until)),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    fn flag(what: What) -> PhaseSpec {
        PhaseSpec::flag(what, "--flag")
    }

    fn section(what: What, at: Option<u64>, until: Option<u64>, length: Option<u64>) -> PhaseSpec {
        PhaseSpec {
            what,
            at: at.map(s),
            until: until.map(s),
            length: length.map(s),
            chained: true,
            origin: "[[scenario]] #1".into(),
        }
    }

    #[test]
    fn specs_parse_and_print_back() {
        let c: ChurnSpec = "5%/30s".parse().unwrap();
        assert_eq!((c.share.fraction(), c.period), (0.05, s(30)));
        assert_eq!(c.to_string(), "5%/30s");
        let st: StormSpec = "at=60s,drop=50%".parse().unwrap();
        assert_eq!((st.at, st.drop.fraction()), (Some(s(60)), 0.5));
        assert_eq!(st.to_string().parse::<StormSpec>().unwrap(), st);
        let st: StormSpec = "at=1m".parse().unwrap();
        assert_eq!(st.drop, Share::ALL);
        let p: PauseSpec = "at=10s,for=5s,share=10%".parse().unwrap();
        assert_eq!(
            (p.at, p.length, p.share.fraction()),
            (Some(s(10)), Some(s(5)), 0.1)
        );
        assert_eq!(p.to_string().parse::<PauseSpec>().unwrap(), p);
        let r: RampDownSpec = "200/s".parse().unwrap();
        assert_eq!((r.at, r.rate.as_per_second()), (None, 200.0));
        let r: RampDownSpec = "at=5m,rate=10/s".parse().unwrap();
        assert_eq!(r.at, Some(s(300)));
        assert_eq!(Share::ALL.of(7), 7);
        assert_eq!("10%".parse::<Share>().unwrap().of(3), 1);
        assert_eq!("50%".parse::<Share>().unwrap().of(0), 0);
    }

    #[test]
    fn bad_specs_say_why_in_one_line() {
        for (text, needle) in [
            ("150%/30s", "above 100%"),
            ("5/30s", "percentage"),
            ("5%", "SHARE/PERIOD"),
            ("0%/30s", "above 0%"),
            ("5%/0s", "above zero"),
        ] {
            let e = text.parse::<ChurnSpec>().unwrap_err().to_string();
            assert!(e.contains(needle) && !e.contains('\n'), "{text}: {e}");
        }
        for (text, needle) in [
            ("at=x", "at=x"),
            ("at=1s,at=2s", "twice"),
            ("when=1s", "unknown key"),
            ("drop=200%", "above 100%"),
            ("60s", "key=value"),
        ] {
            let e = text.parse::<StormSpec>().unwrap_err().to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
        assert!("at=1s,for=0s".parse::<PauseSpec>().is_err());
        assert!("at=1s".parse::<RampDownSpec>().is_err());
        assert!("fast".parse::<RampDownSpec>().is_err());
    }

    #[test]
    fn flags_resolve_to_absolute_phases_and_continuous_ones_settle_before_the_end() {
        let specs = [
            flag(What::Churn("10%/10s".parse().unwrap())),
            flag(What::Storm("at=20s".parse().unwrap())),
            flag(What::Pause("at=30s,for=5s".parse().unwrap())),
            flag(What::RampDown("10/s".parse().unwrap())),
            flag(What::MaxSessionLength(s(40))),
        ];
        let plan = Scenario::plan(&specs, Some(s(60)), 100, Duration::ZERO).unwrap();
        assert_eq!(
            plan.phases,
            vec![
                Phase::Churn {
                    share: 0.1,
                    period: s(10),
                    from: s(0),
                    until: Some(s(54))
                },
                Phase::Storm {
                    at: s(20),
                    share: 1.0
                },
                Phase::Pause {
                    at: s(30),
                    length: s(5),
                    share: 1.0
                },
                Phase::RampDown {
                    at: s(50),
                    rate: Rate::per_second(10.0)
                },
                Phase::MaxSessionLength {
                    length: s(40),
                    from: s(0),
                    until: Some(s(54))
                },
            ]
        );
        assert_eq!(plan.session_length_at(s(10)), Some((s(40), Some(s(54)))));
        assert_eq!(plan.session_length_at(s(55)), None);
        // Without a duration, continuous phases run until the end.
        let plan = Scenario::plan(&specs[..1], None, 100, Duration::ZERO).unwrap();
        assert!(matches!(plan.phases[0], Phase::Churn { until: None, .. }));
        // Agents that take longer to come back stop the churn earlier.
        let plan = Scenario::plan(&specs[..1], Some(s(60)), 100, s(15)).unwrap();
        assert!(matches!(plan.phases[0], Phase::Churn { until: Some(u), .. } if u == s(45)));
        assert_eq!(settle(s(600), s(2)), s(10));
        assert_eq!(settle(s(30), Duration::ZERO), s(3));
    }

    #[test]
    fn sections_follow_one_another() {
        let specs = [
            section(
                What::Churn("10%/10s".parse().unwrap()),
                Some(5),
                None,
                Some(20),
            ),
            section(
                What::Storm("drop=50%".parse().unwrap()),
                None,
                None,
                Some(10),
            ),
            section(What::Pause("for=3s".parse().unwrap()), None, None, None),
            section(What::RampDown("10/s".parse().unwrap()), None, None, None),
        ];
        let plan = Scenario::plan(&specs, Some(s(120)), 100, Duration::ZERO).unwrap();
        assert_eq!(
            plan.phases,
            vec![
                Phase::Churn {
                    share: 0.1,
                    period: s(10),
                    from: s(5),
                    until: Some(s(25))
                },
                Phase::Storm {
                    at: s(25),
                    share: 0.5
                },
                Phase::Pause {
                    at: s(35),
                    length: s(3),
                    share: 1.0
                },
                Phase::RampDown {
                    at: s(38),
                    rate: Rate::per_second(10.0)
                },
            ]
        );
    }

    #[test]
    fn impossible_timelines_are_refused_naming_the_origin() {
        let cases: Vec<(Vec<PhaseSpec>, Option<u64>, &str)> = vec![
            (
                vec![flag(What::Storm("drop=10%".parse().unwrap()))],
                Some(60),
                "at= is required",
            ),
            (
                vec![flag(What::Storm("at=90s".parse().unwrap()))],
                Some(60),
                "run ends",
            ),
            (
                vec![flag(What::Pause("at=5s".parse().unwrap()))],
                Some(60),
                "for= is required",
            ),
            (
                vec![flag(What::RampDown("1/s".parse().unwrap()))],
                Some(60),
                "longer than the run",
            ),
            (
                vec![flag(What::RampDown("1/s".parse().unwrap()))],
                None,
                "needs --duration",
            ),
            (
                vec![
                    section(What::Churn("1%/1s".parse().unwrap()), None, None, None),
                    section(What::Storm("drop=1%".parse().unwrap()), None, None, None),
                ],
                None,
                "never ends",
            ),
            (
                vec![section(
                    What::Churn("1%/1s".parse().unwrap()),
                    Some(10),
                    Some(5),
                    None,
                )],
                None,
                "not after its start",
            ),
            (
                vec![section(
                    What::Storm("at=1s".parse().unwrap()),
                    Some(2),
                    None,
                    None,
                )],
                None,
                "twice",
            ),
        ];
        for (specs, run, needle) in cases {
            let e = Scenario::plan(&specs, run.map(s), 100, Duration::ZERO).unwrap_err();
            assert!(e.to_string().contains(needle), "{e}");
            assert!(
                e.to_string().starts_with(&specs[0].origin)
                    || e.to_string().starts_with("[[scenario]]"),
                "{e}"
            );
        }
    }
}
