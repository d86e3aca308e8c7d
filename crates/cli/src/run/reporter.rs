//! The reporter task of a run: every second it collects the per-worker
//! histograms, adds them to the current interval (written to `--hlog` and,
//! for the report page, summed up as latency percentiles every
//! `--hlog-interval`), samples the timeline every `--progress-every`
//! (sessions, RSS, CPU, counter and error increments) and redraws the
//! progress line. On stop it makes one last pass, so the final interval is
//! written and flushed and the timeline ends at the end of the run.

use std::collections::BTreeMap;
use std::io::IsTerminal as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use agent_sim_fleet::FleetStatus;
use agent_sim_metrics::Metrics;
use agent_sim_metrics::hlog::HlogWriter;
use agent_sim_metrics::spread::ServerLevels;
use agent_sim_metrics::summary::TimelineSample;
use agent_sim_metrics::timeline::{LatencyWindow, TimelineRecorder, WindowLog};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::plan::RunConfig;
use crate::progress::Progress;

/// A running reporter; [`Reporter::finish`] stops it after its last pass.
pub(super) struct Reporter {
    stop: CancellationToken,
    task: JoinHandle<Recorded>,
}

/// What the reporter kept over the run.
#[derive(Debug, Default)]
pub(super) struct Recorded {
    /// The summary's timeline.
    pub timeline: Vec<TimelineSample>,
    /// Latency percentiles per `--hlog-interval` (kept for the report page).
    pub windows: Vec<LatencyWindow>,
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
    /// Whether to keep latency windows (for the report page).
    pub windows: bool,
    /// Fires when the run ends and shutdown begins (a timeline sample is
    /// taken then, so the level before sessions close is on it).
    pub end: CancellationToken,
}

/// Sessions per server over the fleets that keep them (their servers one
/// after the other), or `None` when none does.
pub(super) fn server_levels(statuses: &[Arc<FleetStatus>]) -> Option<ServerLevels> {
    let mut out: Option<ServerLevels> = None;
    for b in statuses.iter().filter_map(|s| s.servers.get()) {
        let c = b.counts();
        let l = out.get_or_insert_with(ServerLevels::default);
        l.held.extend(c.held);
        l.connects.extend(c.connects);
    }
    out
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
        let mut intervals = (s.hlog.is_some() || s.windows)
            .then(|| Intervals::new(s.hlog, s.windows, s.cfg.hlog_interval));
        let sample_every = s.cfg.progress_every.max(Duration::from_secs(1));
        let (metrics, statuses, started, show, end) =
            (s.metrics, s.statuses, s.started, s.show, s.end);
        // A local process tells its parent how it does, every second.
        let child = s.cfg.local_child;
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut timeline = TimelineRecorder::default();
            let mut next_sample = sample_every;
            let mut ended = false;
            loop {
                let (stopping, ending) = tokio::select! {
                    _ = tick.tick() => (false, false),
                    _ = stopped.cancelled() => (true, false),
                    _ = end.cancelled(), if !ended => (false, true),
                };
                ended |= ending;
                let interval = metrics.collect();
                let now = started.elapsed();
                if let Some(i) = intervals.as_mut() {
                    i.add(interval, now, stopping);
                }
                let sample_due = stopping || ending || now >= next_sample;
                if !(sample_due || show || child) {
                    continue;
                }
                let snap = metrics.snapshot();
                if sample_due {
                    let cpu = agent_sim_metrics::process::cpu_times()
                        .map(|(u, s)| u + s)
                        .unwrap_or(0.0);
                    let rss = agent_sim_metrics::process::rss_bytes();
                    let servers = server_levels(&statuses);
                    timeline.observe(
                        now.as_secs_f64(),
                        &snap,
                        (rss, cpu),
                        servers.as_ref(),
                        stopping,
                    );
                    while next_sample <= now {
                        next_sample += sample_every;
                    }
                }
                let started_agents = statuses
                    .iter()
                    .map(|s| s.started.load(Ordering::Relaxed))
                    .sum();
                if show {
                    progress.tick(now, &snap, started_agents, stopping);
                }
                if child {
                    eprintln!("{}", crate::progress::progress_line(&snap, started_agents));
                }
                if stopping {
                    break;
                }
            }
            Recorded {
                timeline: timeline.into_samples(),
                windows: intervals
                    .and_then(|i| i.windows)
                    .map(WindowLog::into_windows)
                    .unwrap_or_default(),
            }
        });
        Reporter { stop, task }
    }

    /// Stops the reporter and waits for its last pass (final hlog interval
    /// written and flushed, last progress line printed, last timeline
    /// sample taken); returns what it kept.
    pub(super) async fn finish(self) -> Recorded {
        self.stop.cancel();
        self.task.await.unwrap_or_default()
    }
}

/// The interval being accumulated, for `--hlog` and the report page.
struct Intervals {
    writer: Option<HlogWriter>,
    windows: Option<WindowLog>,
    every: Duration,
    pending: BTreeMap<&'static str, hdrhistogram::Histogram<u64>>,
    window_start: Duration,
}

impl Intervals {
    fn new(writer: Option<HlogWriter>, windows: bool, every: Duration) -> Self {
        Intervals {
            writer,
            windows: windows.then(WindowLog::default),
            every,
            pending: BTreeMap::new(),
            window_start: Duration::ZERO,
        }
    }

    /// Adds one collection; closes the interval when it is due or `last`.
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
            let length = now - self.window_start;
            if let Some(w) = self.writer.as_mut() {
                for (name, h) in &self.pending {
                    if let Err(e) = w.write_interval(self.window_start, length, name, h) {
                        eprintln!("agent-sim: --hlog: {e}");
                    }
                }
                let _ = w.flush();
            }
            if let Some(log) = self.windows.as_mut() {
                log.add(
                    self.window_start.as_secs_f64(),
                    length.as_secs_f64(),
                    self.pending.iter().map(|(n, h)| (*n, h)),
                );
            }
            self.pending.clear();
            self.window_start = now;
        }
    }
}
