//! The scenario driver of one fleet: a task per phase of its [`Scenario`]
//! that asks the ledger to end sessions (storm, churn, max session length),
//! to let agents leave (ramp-down), or opens the disruption of a pause
//! (the freezing itself is done by `freeze`). Phases run concurrently,
//! each on its own schedule; all stop when the run ends.
//!
//! Schedules are kept from their intended times: a churn phase ends
//! `share × agents` sessions per period at evenly spread instants (a late
//! tick ends every session that was due), a ramp-down lets agents go at
//! its rate from its start, whatever the timer's lateness.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::freeze::Freezer;
use crate::ledger::Ledger;
use crate::scenario::{Phase, Scenario, Share};

/// Shortest sleep between two churn or ramp-down steps (steps due in
/// between are done together).
const MIN_TICK: Duration = Duration::from_millis(5);

/// Starts one task per phase; they end with `run` (or by themselves).
pub(crate) fn start(
    plan: &Scenario,
    ledger: Arc<Ledger>,
    freezer: Option<Arc<Freezer>>,
    agents: u64,
    start: Instant,
    run: &CancellationToken,
) -> JoinSet<()> {
    let mut tasks = JoinSet::new();
    let mut pause = 0usize;
    for phase in plan.phases.iter().copied() {
        let (ledger, run) = (ledger.clone(), run.clone());
        let job: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> = match phase {
            Phase::Storm { at, share } => Box::pin(async move {
                tokio::time::sleep_until(start + at).await;
                let id = ledger.open("storm", at, None);
                ledger.storm(Share(share), id);
            }),
            Phase::Churn {
                share,
                period,
                from,
                until,
            } => Box::pin(churn(ledger, start, share, period, agents, from, until)),
            Phase::MaxSessionLength {
                length,
                from,
                until,
            } => Box::pin(max_session(ledger, start, length, from, until)),
            Phase::Pause { at, length, .. } => {
                let w = pause;
                pause += 1;
                let frozen = freezer.as_ref().map_or(0, |f| f.frozen_agents(w));
                Box::pin(async move {
                    tokio::time::sleep_until(start + at).await;
                    let note = format!(
                        "{frozen} agent(s) frozen for {}",
                        humantime::format_duration(length)
                    );
                    let id = ledger.open("pause", at, Some(note));
                    ledger.set_pause(w, id);
                })
            }
            Phase::RampDown { at, rate } => {
                Box::pin(ramp_down(ledger, start + at, rate.interval(), agents))
            }
        };
        tasks.spawn(async move {
            tokio::select! {
                _ = job => {}
                _ = run.cancelled() => {}
            }
        });
    }
    tasks
}

/// How many whole `interval`s have passed since `from` (0 before it).
fn due_count(from: Instant, interval: Duration) -> u64 {
    let elapsed = Instant::now().saturating_duration_since(from);
    (elapsed.as_secs_f64() / interval.as_secs_f64()) as u64
}

async fn churn(
    ledger: Arc<Ledger>,
    start: Instant,
    share: f64,
    period: Duration,
    agents: u64,
    from: Duration,
    until: Option<Duration>,
) {
    let per_period = share * agents as f64;
    if per_period <= 0.0 || until.is_some_and(|u| u <= from) {
        return;
    }
    tokio::time::sleep_until(start + from).await;
    let note = format!(
        "{} of the sessions every {}",
        Share(share),
        humantime::format_duration(period)
    );
    let id = ledger.open("churn", from, Some(note));
    let interval = period.div_f64(per_period);
    let begin = start + from;
    let end = until.map(|u| start + u);
    let mut cursor = fastrand::usize(..agents.max(1) as usize);
    let mut done = 0u64;
    loop {
        let now = Instant::now();
        let horizon = end.map_or(now, |e| now.min(e));
        let due = (horizon.saturating_duration_since(begin).as_secs_f64() / interval.as_secs_f64())
            as u64;
        while done < due {
            ledger.churn_next(&mut cursor, id);
            done += 1;
        }
        if end.is_some_and(|e| now >= e) {
            return;
        }
        let next = begin + interval.mul_f64((done + 1) as f64);
        tokio::time::sleep_until(next.max(now + MIN_TICK)).await;
    }
}

/// Agents leave one per `interval` from `from`, the last agent first.
async fn ramp_down(ledger: Arc<Ledger>, from: Instant, interval: Duration, agents: u64) {
    tokio::time::sleep_until(from).await;
    let mut left = 0u64;
    while left < agents {
        // One at `from`, then one per interval.
        let due = (due_count(from, interval) + 1).min(agents);
        while left < due {
            ledger.leave((agents - 1 - left) as usize);
            left += 1;
        }
        if left >= agents {
            return;
        }
        let next = from + interval.mul_f64(left as f64);
        tokio::time::sleep_until(next.max(Instant::now() + MIN_TICK)).await;
    }
}

async fn max_session(
    ledger: Arc<Ledger>,
    start: Instant,
    length: Duration,
    from: Duration,
    until: Option<Duration>,
) {
    tokio::time::sleep_until(start + from).await;
    let note = format!(
        "sessions end after {} ± {:.0} %",
        humantime::format_duration(length),
        crate::scenario::SESSION_LENGTH_JITTER * 100.0
    );
    let id = ledger.open("max_session_length", from, Some(note));
    // Deadlines are checked this often: 1 % of the length, within 10 ms..1 s.
    let tick = (length / 100).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut every = tokio::time::interval(tick);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        if until.is_some_and(|u| Instant::now() >= start + u) {
            return;
        }
        ledger.expire(id);
    }
}
