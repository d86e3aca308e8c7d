//! A stepped run's answer (`--steps`): every step judged over its own
//! window, and where the cluster broke.
//!
//! [`CapacitySummary`] / [`StepSummary`] are the summary's `capacity`
//! section; [`CapacitySummary::conclude`] finds the knee and
//! [`CapacitySummary::table`] is the table printed at the end.
//!
//! What it is not: a window's figures ([`crate::step_window`]), the clock
//! of the steps or the decision to stop (the CLI's stepper).

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

/// How a step ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepVerdict {
    /// Every SLO held over its window.
    #[default]
    Held,
    /// An SLO failed, the load box not at its limit.
    Failed,
    /// The load box was at its limit: the step says nothing of the server.
    LoadBox,
    /// The run ended before the step's window did.
    Cut,
}

impl StepVerdict {
    /// The word in the table.
    pub fn word(self) -> &'static str {
        match self {
            StepVerdict::Held => "held",
            StepVerdict::Failed => "FAILED",
            StepVerdict::LoadBox => "LOAD BOX",
            StepVerdict::Cut => "cut",
        }
    }
}

/// One SLO over one step's window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SloFigure {
    /// The SLO as written.
    pub slo: String,
    /// What the window measured, readable (`1.20s`, `-` when absent).
    pub actual: String,
    /// The measured value in the path's base unit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<f64>,
    /// Whether it held.
    pub passed: bool,
    /// Measured over the threshold (`2.5`: two and a half times it), for
    /// a failed SLO with a threshold other than zero.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub over: Option<f64>,
    /// Why it could not be measured, if so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// One observed server over one step's window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepServer {
    /// The server, as `server` names it.
    pub target: String,
    /// Mean CPU in cores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_cores: Option<f64>,
    /// Mean resident memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<f64>,
    /// Cores per 1,000 agents above the server's baseline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores_per_1000_agents: Option<f64>,
    /// KiB per agent above the baseline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_per_agent_kib: Option<f64>,
}

/// One step of a stepped run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepSummary {
    /// Agents of the step (the whole fleet's).
    pub agents: u64,
    /// When its first agent started, seconds from the run's start.
    pub started_s: f64,
    /// The window it was judged over (seconds from the run's start).
    pub window_s: (f64, f64),
    /// Sessions held at the window's end.
    pub connected: u64,
    /// How it ended.
    pub verdict: StepVerdict,
    /// Each SLO over the window.
    pub slos: Vec<SloFigure>,
    /// Errors counted in the window.
    pub errors: u64,
    /// The most frequent error kind in the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_error: Option<String>,
    /// Why the load box was the limit, when it was.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub load_box: Vec<String>,
    /// The observed servers over the window.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub server: Vec<StepServer>,
}

impl StepSummary {
    /// The first SLO that failed, if one did.
    pub fn first_failed(&self) -> Option<&SloFigure> {
        self.slos.iter().find(|s| !s.passed)
    }
}

/// What the search found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    /// Every step held: the capacity is at least the last.
    #[default]
    NotReached,
    /// A step failed on the server's side: the knee.
    Server,
    /// The load box gave way first: no figure about the server past it.
    LoadBox,
    /// The run ended (Ctrl-C, an error) before the steps did.
    Interrupted,
}

/// The summary's `capacity` section.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CapacitySummary {
    /// The SLOs every step was judged by.
    pub slos: Vec<String>,
    /// Seconds each step's window lasted.
    pub hold_s: f64,
    /// Seconds between a step's last start and its window.
    pub settle_s: f64,
    /// The steps run, in order.
    pub steps: Vec<StepSummary>,
    /// Agents of the last step that held before the first that did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<u64>,
    /// Agents of the first step that did not hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broke_at: Option<u64>,
    /// What the search found.
    pub limit: Limit,
    /// The answer in one line.
    pub answer: String,
}

impl CapacitySummary {
    /// Fills `capacity`, `broke_at`, `limit` and `answer` from the steps;
    /// `interrupted` when the run ended before its last step did.
    pub fn conclude(&mut self, interrupted: bool) {
        let first_bad = self
            .steps
            .iter()
            .position(|s| s.verdict != StepVerdict::Held);
        let held = |upto: usize| self.steps[..upto].last().map(|s| s.agents);
        match first_bad.map(|i| (i, &self.steps[i])) {
            Some((i, s)) if s.verdict != StepVerdict::Cut => {
                self.capacity = held(i);
                self.broke_at = Some(s.agents);
                self.limit = if s.verdict == StepVerdict::LoadBox {
                    Limit::LoadBox
                } else {
                    Limit::Server
                };
            }
            other => {
                let upto = other.map_or(self.steps.len(), |(i, _)| i);
                self.capacity = held(upto);
                self.limit = if interrupted || other.is_some() {
                    Limit::Interrupted
                } else {
                    Limit::NotReached
                };
            }
        }
        self.answer = self.answer_line();
    }

    fn answer_line(&self) -> String {
        let cap = self
            .capacity
            .map_or("no step held".to_string(), |c| format!("{c} agents"));
        let broke = self.steps.iter().find(|s| Some(s.agents) == self.broke_at);
        match (self.limit, broke) {
            (Limit::Server, Some(s)) => {
                let why = s.first_failed().map_or(String::new(), |f| {
                    let by = f
                        .over
                        .map_or(String::new(), |o| format!(", {o:.2}x the limit"));
                    format!(": {} was {}{by}", f.slo, f.actual)
                });
                format!("capacity {cap}; broke at {} agents{why}", s.agents)
            }
            (Limit::LoadBox, Some(s)) => format!(
                "capacity at least {cap}; at {} agents the load box gave way, not the server ({}): \
                 add processes (--processes), boxes (--shard) or source addresses (--source-addr)",
                s.agents,
                s.load_box.join("; ")
            ),
            (Limit::Interrupted, _) => {
                format!("capacity at least {cap}; the run ended before its steps did")
            }
            _ => format!(
                "capacity at least {cap}: every step held (add larger steps to find the knee)"
            ),
        }
    }

    /// The table printed at the end: one row per step, then the answer.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let slo_head: Vec<&str> = self.slos.iter().map(|s| short(s)).collect();
        let _ = write!(out, "{:>9} {:>9} {:>8}", "agents", "connected", "errors");
        for h in &slo_head {
            let _ = write!(out, " {h:>18}");
        }
        let _ = writeln!(out, " {:>10} {:>10}  verdict", "srv cores", "srv RSS");
        for s in &self.steps {
            let _ = write!(out, "{:>9} {:>9} {:>8}", s.agents, s.connected, s.errors);
            for f in &s.slos {
                let mark = if f.passed { "" } else { " !" };
                let _ = write!(out, " {:>18}", format!("{}{mark}", f.actual));
            }
            let srv = s.server.first();
            let cores = srv
                .and_then(|x| x.cpu_cores)
                .map_or("-".into(), |c| format!("{c:.2}"));
            let rss = srv
                .and_then(|x| x.rss_bytes)
                .map_or("-".into(), |b| format!("{:.0} MiB", b / 1048576.0));
            let _ = writeln!(out, " {cores:>10} {rss:>10}  {}", s.verdict.word());
        }
        let _ = writeln!(out, "{}", self.answer);
        out
    }
}

/// An SLO's path, the column's head (`propagation.p99 < 1s` → `propagation.p99`).
fn short(slo: &str) -> &str {
    slo.split(['<', '>', '=', '!']).next().unwrap_or(slo).trim()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(agents: u64, verdict: StepVerdict) -> StepSummary {
        StepSummary {
            agents,
            verdict,
            slos: vec![SloFigure {
                slo: "propagation.p99 < 1s".into(),
                actual: "2.50s".into(),
                value: Some(2_500_000.0),
                passed: verdict == StepVerdict::Held,
                over: (verdict != StepVerdict::Held).then_some(2.5),
                note: None,
            }],
            load_box: if verdict == StepVerdict::LoadBox {
                vec!["agent-sim's own CPU at 99 % of its 2 cores".into()]
            } else {
                Vec::new()
            },
            ..StepSummary::default()
        }
    }

    fn concluded(steps: Vec<StepSummary>, interrupted: bool) -> CapacitySummary {
        let mut c = CapacitySummary {
            slos: vec!["propagation.p99 < 1s".into()],
            steps,
            ..CapacitySummary::default()
        };
        c.conclude(interrupted);
        c
    }

    #[test]
    fn the_capacity_is_the_last_step_that_held_before_the_first_that_failed() {
        use StepVerdict::*;
        let c = concluded(
            vec![
                step(10, Held),
                step(20, Held),
                step(30, Failed),
                step(40, Failed),
            ],
            false,
        );
        assert_eq!(
            (c.capacity, c.broke_at, c.limit),
            (Some(20), Some(30), Limit::Server)
        );
        assert_eq!(
            c.answer,
            "capacity 20 agents; broke at 30 agents: propagation.p99 < 1s was 2.50s, 2.50x the limit"
        );
        let t = c.table();
        assert!(t.contains("propagation.p99"), "{t}");
        assert!(t.lines().nth(3).unwrap().ends_with("FAILED"), "{t}");
    }

    #[test]
    fn a_load_box_limit_is_never_the_servers_capacity() {
        use StepVerdict::*;
        let c = concluded(vec![step(10, Held), step(20, LoadBox)], false);
        assert_eq!((c.capacity, c.limit), (Some(10), Limit::LoadBox));
        assert!(
            c.answer
                .starts_with("capacity at least 10 agents; at 20 agents the load box"),
            "{}",
            c.answer
        );
        assert!(c.answer.contains("CPU at 99 %"), "{}", c.answer);
    }

    #[test]
    fn every_step_held_or_the_run_ended_says_at_least() {
        use StepVerdict::*;
        let c = concluded(vec![step(10, Held), step(20, Held)], false);
        assert_eq!(
            (c.capacity, c.broke_at, c.limit),
            (Some(20), None, Limit::NotReached)
        );
        let c = concluded(vec![step(10, Held), step(20, Cut)], true);
        assert_eq!((c.capacity, c.limit), (Some(10), Limit::Interrupted));
        let c = concluded(vec![step(10, Failed)], false);
        assert_eq!(c.capacity, None);
        assert!(
            c.answer.starts_with("capacity no step held; broke at 10"),
            "{}",
            c.answer
        );
    }
}
