//! The run's view for the observer: the whole fleet's sessions held (a
//! shard's count scaled to the fleet it is a slice of), whether the ramp is
//! over (every agent started, and each connected once or [`SETTLE`] gone
//! by), and when the run's end came.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use agent_sim_fleet::FleetStatus;
use agent_sim_metrics::Metrics;
use agent_sim_observe::{ObserveConfig, Observer, RunView};
use tokio_util::sync::CancellationToken;

use super::RunError;
use crate::plan::RunConfig;

/// Starts the observer (its baseline is taken before this returns).
pub(super) async fn start(
    o: ObserveConfig,
    cfg: &RunConfig,
    metrics: &Metrics,
    statuses: &[Arc<FleetStatus>],
    started: Instant,
    ending: CancellationToken,
) -> Result<Observer, RunError> {
    // This process holds `here` of the fleet's `total` agents.
    let here: u64 = cfg.fleets.iter().map(|f| f.fleet.agents).sum();
    let total: u64 = cfg.fleets.iter().map(|f| f.total_agents).sum();
    let scale = total as f64 / here.max(1) as f64;
    let m = metrics.clone();
    // Each fleet with its first connects as last seen, and since when.
    let st: Vec<(Arc<FleetStatus>, FirstConnects)> = statuses
        .iter()
        .map(|s| (s.clone(), Mutex::new(None)))
        .collect();
    let view = RunView {
        started,
        agents: Arc::new(move || (m.connected().max(0) as f64 * scale).round() as u64),
        ramp_done: Arc::new(move || st.iter().all(|(s, seen)| settled(s, seen))),
        end: ending,
    };
    Observer::start(o, metrics.clone(), view)
        .await
        .map_err(RunError::Observe)
}

/// A fleet's count of first connects as last seen, and since when.
type FirstConnects = Mutex<Option<(u64, Instant)>>;

/// How long a fleet's first connects may stand still before agents that
/// never connected stop holding off the steady state.
const SETTLE: Duration = Duration::from_secs(5);

/// Whether fleet `s`'s ramp is over for the server's figures: every agent
/// started, and each connected once (a session being opened is part of
/// the ramp, not of the steady state it is measured against), or no agent
/// connected for the first time in [`SETTLE`] (`last`: the count of first
/// connects last seen and since when). A server that admits sessions
/// slowly (a Sensu backend checks each agent's password with bcrypt, ~65
/// ms of its core each) keeps its ramp going for as long as it admits.
fn settled(s: &FleetStatus, last: &FirstConnects) -> bool {
    settled_at(s, last, Instant::now())
}

/// [`settled`] as of `now`.
fn settled_at(s: &FleetStatus, last: &FirstConnects, now: Instant) -> bool {
    if !s.ramp_done.load(Ordering::Acquire) {
        return false;
    }
    let ever = s.ever_connected.load(Ordering::Relaxed);
    if ever >= s.started.load(Ordering::Relaxed) {
        return true;
    }
    let mut last = last.lock().unwrap_or_else(PoisonError::into_inner);
    match *last {
        Some((seen, since)) if seen == ever => now.duration_since(since) >= SETTLE,
        _ => {
            *last = Some((ever, now));
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ramp_lasts_while_first_connects_come_and_ends_when_they_stop() {
        let s = FleetStatus::default();
        let last = Mutex::new(None);
        let t0 = Instant::now();
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        s.started.store(200, Ordering::Relaxed);
        assert!(!settled_at(&s, &last, at(0)), "agents are still starting");
        s.ramp_done.store(true, Ordering::Release);
        // A slow server admits 15 agents a second: 13 s for 200.
        for sec in 0..13 {
            s.ever_connected.store(15 * sec, Ordering::Relaxed);
            assert!(
                !settled_at(&s, &last, at(sec)),
                "still admitting at {sec} s"
            );
        }
        // 10 never connect: 5 s after the last first connect, steady.
        s.ever_connected.store(190, Ordering::Relaxed);
        assert!(!settled_at(&s, &last, at(13)));
        assert!(!settled_at(&s, &last, at(17)));
        assert!(settled_at(&s, &last, at(18)));
        // Every agent connected once: steady at once.
        let all = Mutex::new(None);
        s.ever_connected.store(200, Ordering::Relaxed);
        assert!(settled_at(&s, &all, at(0)));
    }
}
