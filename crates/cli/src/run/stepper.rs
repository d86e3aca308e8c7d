//! The judge of a stepped run (`--steps`): at each step's window it reads
//! the run's figures at the window's edges, judges the window alone by
//! the SLOs (and the observed servers over it), says so in a line, and
//! ends the run at the first step that fails (or `--steps-past` later),
//! at a step where the load box gave way, or after the last step.
//!
//! Its clock is the fleet's (from its first start), as the engine's steps
//! are; its marks are in seconds of the run, as the observer's samples.

use std::time::Instant;

use agent_sim_metrics::capacity::{CapacitySummary, StepSummary, StepVerdict};
use agent_sim_metrics::step_window::{self, Mark, StepHead, WindowOf};
use agent_sim_metrics::{Metrics, Summary};
use agent_sim_observe::LiveView;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::plan::{StepPlan, StepTimes};

/// What the judge works with.
pub(super) struct Judge {
    pub plan: StepPlan,
    pub kind: String,
    pub rated: Vec<&'static str>,
    pub metrics: Metrics,
    pub live: Option<LiveView>,
    /// The run's time zero (the marks' and the observer's seconds).
    pub started: Instant,
    /// Cancelled by the judge when the search is over; by the run on
    /// Ctrl-C.
    pub end: CancellationToken,
    pub show: bool,
    /// A shard of a run over several processes or boxes.
    pub sharded: bool,
}

/// What the judge hands the summary.
pub(super) struct Judged {
    pub capacity: CapacitySummary,
    /// Each judged step's window as a summary of its own.
    pub windows: Vec<Summary>,
}

impl Judge {
    /// Starts judging, the fleet's clock starting now.
    pub(super) fn start(self) -> JoinHandle<Judged> {
        let zero = tokio::time::Instant::now();
        tokio::spawn(self.run(zero))
    }

    async fn run(self, zero: tokio::time::Instant) -> Judged {
        if self.show {
            let slos: Vec<String> = self.plan.slos.iter().map(ToString::to_string).collect();
            let whose = if self.plan.default_slos {
                " (the kind's defaults; --slo to set)"
            } else {
                ""
            };
            eprintln!(
                "stepped run: {} steps up to {} agents, each settled {:?} and held {:?}, judged by {}{whose}",
                self.plan.steps.len(),
                self.plan.steps.last().map_or(0, |s| s.agents),
                self.plan.settle,
                self.plan.hold,
                slos.join(", ")
            );
        }
        let mut out = CapacitySummary {
            slos: self.plan.slos.iter().map(ToString::to_string).collect(),
            hold_s: self.plan.hold.as_secs_f64(),
            settle_s: self.plan.settle.as_secs_f64(),
            ..CapacitySummary::default()
        };
        let mut windows = Vec::new();
        let mut past_failure: Option<u64> = None;
        let mut interrupted = false;
        for (k, step) in self.plan.steps.iter().enumerate() {
            let Some((judged, window)) = self.step(zero, step).await else {
                interrupted = true;
                out.steps.push(self.cut(step));
                break;
            };
            if self.show {
                eprintln!(
                    "step {}/{}: {}",
                    k + 1,
                    self.plan.steps.len(),
                    line(&judged)
                );
            }
            let verdict = judged.verdict;
            out.steps.push(judged);
            windows.push(window);
            // A shard sees its share alone: every step runs, and the
            // merged result judges them (report merge, the local parent).
            if self.sharded {
                continue;
            }
            if verdict == StepVerdict::LoadBox {
                break;
            }
            if verdict != StepVerdict::Held || past_failure.is_some() {
                let n = past_failure.get_or_insert(0);
                if *n >= self.plan.past {
                    break;
                }
                *n += 1;
            }
        }
        out.conclude(interrupted);
        self.end.cancel();
        Judged {
            capacity: out,
            windows,
        }
    }

    /// Waits for the step's window and judges it; `None` when the run
    /// ended first.
    async fn step(
        &self,
        zero: tokio::time::Instant,
        step: &StepTimes,
    ) -> Option<(StepSummary, Summary)> {
        let until = |d| async move {
            tokio::select! {
                () = tokio::time::sleep_until(zero + d) => true,
                () = self.end.cancelled() => false,
            }
        };
        if !until(step.window.0).await {
            return None;
        }
        let a = Mark::take(&self.metrics, self.started.elapsed().as_secs_f64());
        if !until(step.window.1).await {
            return None;
        }
        let b = Mark::take(&self.metrics, self.started.elapsed().as_secs_f64());
        Some(self.judge(step, &a, &b))
    }

    fn judge(&self, step: &StepTimes, a: &Mark, b: &Mark) -> (StepSummary, Summary) {
        let mut w = step_window::window(
            a,
            b,
            WindowOf {
                kind: &self.kind,
                requested: step.here,
                rated: &self.rated,
                metrics: &self.metrics,
            },
        );
        if let Some(live) = &self.live {
            w.server = live.window(a.t_s, b.t_s);
        }
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let load_box = step_window::load_box(&w, cores);
        let head = StepHead {
            agents: step.agents,
            started_s: a.t_s - (step.window.0 - step.at).as_secs_f64(),
            window_s: (a.t_s, b.t_s),
        };
        (step_window::judge(head, &w, &self.plan.slos, load_box), w)
    }

    /// A step the run's end cut short.
    fn cut(&self, step: &StepTimes) -> StepSummary {
        StepSummary {
            agents: step.agents,
            verdict: StepVerdict::Cut,
            connected: self.metrics.connected().max(0) as u64,
            ..StepSummary::default()
        }
    }
}

/// A judged step in one line: agents, verdict, the SLOs' figures.
fn line(s: &StepSummary) -> String {
    let figures: Vec<String> = s
        .slos
        .iter()
        .map(|f| {
            format!(
                "{} {}{}",
                f.slo
                    .split([' ', '<', '>', '=', '!'])
                    .next()
                    .unwrap_or(&f.slo),
                f.actual,
                if f.passed { "" } else { " (failed)" }
            )
        })
        .collect();
    let mut out = format!(
        "{} agents, {} connected: {}; {}",
        s.agents,
        s.connected,
        s.verdict.word(),
        figures.join(", ")
    );
    if !s.load_box.is_empty() {
        out.push_str(&format!(" [load box: {}]", s.load_box.join("; ")));
    }
    out
}
