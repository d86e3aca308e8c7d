//! The run's view for the observer: the whole fleet's sessions held (a
//! shard's count scaled to the fleet it is a slice of), whether the ramp is
//! over (every agent started, and each connected once or [`SETTLE`] gone
//! by), and when the run's end came.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
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
    // Each fleet with the instant its ramp was first seen done.
    let st: Vec<(Arc<FleetStatus>, OnceLock<Instant>)> = statuses
        .iter()
        .map(|s| (s.clone(), OnceLock::new()))
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

/// How long after its last agent started a fleet's first connects may
/// still be under way; past it, agents that never connected do not hold
/// off the steady state.
const SETTLE: Duration = Duration::from_secs(5);

/// Whether fleet `s`'s ramp is over for the server's figures: every agent
/// started, and each connected once (a session being opened is part of
/// the ramp, not of the steady state it is measured against), or
/// [`SETTLE`] passed since the last start (since `ramp_seen`, the first
/// look that found every agent started: the fleet's own clock, whenever it
/// began in the run).
fn settled(s: &FleetStatus, ramp_seen: &OnceLock<Instant>) -> bool {
    if !s.ramp_done.load(Ordering::Acquire) {
        return false;
    }
    let since = ramp_seen.get_or_init(Instant::now);
    let all_once = s.ever_connected.load(Ordering::Relaxed) >= s.started.load(Ordering::Relaxed);
    all_once || since.elapsed() >= SETTLE
}
