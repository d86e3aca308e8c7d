//! The reporter task of a run: every second it collects the per-worker
//! histograms, adds them to the current `--hlog` interval (written every
//! `--hlog-interval`), and redraws the progress line. On stop it makes one
//! last pass, so the final interval is written and flushed.

use std::collections::BTreeMap;
use std::io::IsTerminal as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use agent_sim_fleet::FleetStatus;
use agent_sim_metrics::Metrics;
use agent_sim_metrics::hlog::HlogWriter;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::RunConfig;
use crate::progress::Progress;

/// A running reporter; [`Reporter::finish`] stops it after its last pass.
pub(super) struct Reporter {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// What the reporter reads and where it writes.
pub(super) struct ReporterSetup<'a> {
    pub cfg: &'a RunConfig,
    pub metrics: Metrics,
    pub statuses: Vec<Arc<FleetStatus>>,
    pub hlog: Option<HlogWriter>,
    pub started: Instant,
    /// Whether progress is shown at all (terminal output, not `--quiet`).
    pub show: bool,
}

impl Reporter {
    /// Starts the reporter task.
    pub(super) fn start(s: ReporterSetup<'_>) -> Reporter {
        let stop = CancellationToken::new();
        let requested: u64 = s.cfg.fleets.iter().map(|f| f.fleet.agents).sum();
        let mut progress = Progress::new(
            requested,
            std::io::stderr().is_terminal(),
            s.cfg.progress_every,
            s.cfg.kind(),
        );
        let mut hlog = s.hlog.map(|w| HlogInterval::new(w, s.cfg.hlog_interval));
        let (metrics, statuses, started, show) = (s.metrics, s.statuses, s.started, s.show);
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let stopping = tokio::select! {
                    _ = tick.tick() => false,
                    _ = stopped.cancelled() => true,
                };
                let interval = metrics.collect();
                let now = started.elapsed();
                if let Some(h) = hlog.as_mut() {
                    h.add(interval, now, stopping);
                }
                if show {
                    let started_agents = statuses
                        .iter()
                        .map(|s| s.started.load(Ordering::Relaxed))
                        .sum();
                    progress.tick(now, &metrics.snapshot(), started_agents, stopping);
                }
                if stopping {
                    break;
                }
            }
        });
        Reporter { stop, task }
    }

    /// Stops the reporter and waits for its last pass (final hlog interval
    /// written and flushed, last progress line printed).
    pub(super) async fn finish(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// The `--hlog` interval being accumulated.
struct HlogInterval {
    writer: HlogWriter,
    every: Duration,
    pending: BTreeMap<&'static str, hdrhistogram::Histogram<u64>>,
    window_start: Duration,
}

impl HlogInterval {
    fn new(writer: HlogWriter, every: Duration) -> Self {
        HlogInterval {
            writer,
            every,
            pending: BTreeMap::new(),
            window_start: Duration::ZERO,
        }
    }

    /// Adds one collection; writes the interval when it is due or `last`.
    fn add(
        &mut self,
        collected: Vec<(&'static str, hdrhistogram::Histogram<u64>)>,
        now: Duration,
        last: bool,
    ) {
        for (name, h) in collected {
            let acc = self
                .pending
                .entry(name)
                .or_insert_with(agent_sim_metrics::new_latency_histogram);
            let _ = acc.add(&h);
        }
        if last || now.saturating_sub(self.window_start) >= self.every {
            for (name, h) in &self.pending {
                if let Err(e) =
                    self.writer
                        .write_interval(self.window_start, now - self.window_start, name, h)
                {
                    eprintln!("agent-sim: --hlog: {e}");
                }
            }
            let _ = self.writer.flush();
            self.pending.clear();
            self.window_start = now;
        }
    }
}
