//! The observer of a sharded run's other processes (see the module docs of
//! [`super`]).

use std::sync::Arc;

use agent_sim_metrics::{Metrics, ProbeSummary};
use tokio_util::sync::CancellationToken;

use super::ProbeBoard;

/// Observes the probe changes another process makes (see the module docs).
pub struct ProbeObserver {
    pub(crate) board: Arc<ProbeBoard>,
    pub(crate) metrics: Metrics,
}

impl std::fmt::Debug for ProbeObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeObserver")
            .field("kind", &self.board.kind)
            .field("service", &self.board.service)
            .finish()
    }
}

impl ProbeObserver {
    /// Waits for `cancel` (the end of the run), then [`Self::finish`]es.
    pub async fn run(self, cancel: CancellationToken) -> Vec<ProbeSummary> {
        cancel.cancelled().await;
        self.finish()
    }

    /// Stops observing and returns one summary (role `observer`) per change
    /// seen, in raft-index order; changes cut short by the end of the run
    /// with missing deliveries are counted in `probes_interrupted` instead.
    pub fn finish(&self) -> Vec<ProbeSummary> {
        let (done, interrupted) = self.board.close_observer();
        if interrupted > 0 {
            self.metrics.add(
                self.metrics.counter(crate::names::PROBES_INTERRUPTED),
                interrupted,
            );
        }
        done
    }
}
