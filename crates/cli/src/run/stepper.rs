//! The judge of a stepped run (`--steps`): at each step's window it reads
//! the run's figures at the window's edges, judges the window alone by
//! the SLOs (and the observed servers over it), says so in a line, and
//! ends the run at the first step that fails (or `--steps-past` later),
//! at a step where the load box gave way, or after the last step.
//!
//! Its clock is the fleet's (from its first start), as the engine's steps
//! are; its marks are in seconds of the run, as the observer's samples.

use std::time::Instant;

use agent_sim_metrics::Metrics;
use agent_sim_metrics::assert::evaluate;
use agent_sim_metrics::capacity::{
    CapacitySummary, SloFigure, StepServer, StepSummary, StepVerdict,
};
use agent_sim_metrics::step_window::{self, Mark, WindowOf};
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
}

impl Judge {
    /// Starts judging, the fleet's clock starting now.
    pub(super) fn start(self) -> JoinHandle<CapacitySummary> {
        let zero = tokio::time::Instant::now();
        tokio::spawn(self.run(zero))
    }

    async fn run(self, zero: tokio::time::Instant) -> CapacitySummary {
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
        let mut past_failure: Option<u64> = None;
        let mut interrupted = false;
        for (k, step) in self.plan.steps.iter().enumerate() {
            let Some(judged) = self.step(zero, step).await else {
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
        out
    }

    /// Waits for the step's window and judges it; `None` when the run
    /// ended first.
    async fn step(&self, zero: tokio::time::Instant, step: &StepTimes) -> Option<StepSummary> {
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

    fn judge(&self, step: &StepTimes, a: &Mark, b: &Mark) -> StepSummary {
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
        let verdicts = evaluate(&self.plan.slos, &w);
        let slos: Vec<SloFigure> = verdicts
            .iter()
            .zip(&self.plan.slos)
            .map(|(v, s)| step_window::slo_figure(v, s.threshold(step.here)))
            .collect();
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let load_box = step_window::load_box(&w, cores);
        let verdict = if !load_box.is_empty() {
            StepVerdict::LoadBox
        } else if slos.iter().all(|s| s.passed) {
            StepVerdict::Held
        } else {
            StepVerdict::Failed
        };
        let errors: u64 = w.errors.values().map(|e| e.count).sum();
        StepSummary {
            agents: step.agents,
            started_s: a.t_s - (step.window.0 - step.at).as_secs_f64(),
            window_s: (a.t_s, b.t_s),
            connected: w.agents.connected,
            verdict,
            slos,
            errors,
            top_error: w
                .errors
                .iter()
                .max_by_key(|(_, e)| e.count)
                .map(|(k, _)| k.clone()),
            load_box,
            server: w.server.iter().map(step_server).collect(),
        }
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

fn step_server(s: &agent_sim_metrics::server::ServerSummary) -> StepServer {
    StepServer {
        target: s.target.clone(),
        cpu_cores: s.sizing.cpu_cores.mean,
        rss_bytes: s.sizing.rss_bytes.mean,
        cores_per_1000_agents: s.sizing.cores_per_1000_agents,
        rss_per_agent_kib: s.sizing.rss_per_agent_kib,
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
