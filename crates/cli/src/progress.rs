//! Live progress while a run goes on: one rewritten status line on a
//! terminal (every second), plain periodic lines otherwise (pipelines, CI
//! logs), and a last line when shutdown starts.

use std::io::Write as _;
use std::time::Duration;

use std::collections::BTreeMap;

use agent_sim_metrics::Snapshot;

/// Counters shown with a rate, by fleet kind.
const RATED: &[(&str, &str)] = &[
    ("keepalives_sent", "keepalives"),
    ("events_sent", "events"),
    ("check_requests_received", "checks"),
    ("events_received", "consul events"),
    ("sessions_renewed", "renews"),
];

/// Prefix of a local process's progress lines on stderr (read by its
/// parent, see `crate::local`).
pub const PROGRESS_PREFIX: &str = "agent-sim-progress ";

/// What a child reports of itself each second.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ChildProgress {
    /// Sessions held now.
    pub connected: i64,
    /// Agents started.
    pub started: u64,
    /// Counters by name.
    pub counters: BTreeMap<String, u64>,
    /// Errors by kind.
    pub errors: BTreeMap<String, u64>,
}

/// The progress line of a child (`agent-sim-progress {json}`).
pub fn progress_line(snap: &Snapshot, started: u64) -> String {
    let p = ChildProgress {
        connected: snap.connected,
        started,
        counters: snap
            .counters
            .iter()
            .filter(|(_, v)| *v > 0)
            .map(|(k, v)| (k.to_string(), *v))
            .collect(),
        errors: snap.errors.clone(),
    };
    format!(
        "{PROGRESS_PREFIX}{}",
        serde_json::to_string(&p).unwrap_or_default()
    )
}

/// Every counter the progress line reads (what a local process reports
/// to its parent).
pub const COUNTERS_READ: &[&str] = &[
    "keepalives_sent",
    "events_sent",
    "check_requests_received",
    "events_received",
    "sessions_renewed",
    agent_sim_fleet::COUNTER_RECONNECT_ATTEMPTS,
];

/// How early a line may be printed: half the reporter's 1 s tick.
const TICK_SLACK: Duration = Duration::from_millis(500);

/// Progress printer state.
#[derive(Debug)]
pub struct Progress {
    requested: u64,
    tty: bool,
    every: Duration,
    last_print: Option<Duration>,
    last_counts: Vec<u64>,
    last_at: Duration,
    kind: &'static str,
}

impl Progress {
    /// A printer for a run of `requested` agents.
    pub fn new(requested: u64, tty: bool, every: Duration, kind: &'static str) -> Self {
        Progress {
            requested,
            tty,
            every,
            last_print: None,
            last_counts: vec![0; RATED.len()],
            last_at: Duration::ZERO,
            kind,
        }
    }

    /// The status line for the state at `now`.
    pub fn line(&mut self, now: Duration, snap: &Snapshot, started: u64) -> String {
        let dt = (now - self.last_at).as_secs_f64().max(1e-3);
        let mut rates = String::new();
        for (i, (counter, label)) in RATED.iter().enumerate() {
            let v = snap.counter(counter);
            if v > 0 || self.last_counts[i] > 0 {
                let r = (v - self.last_counts[i].min(v)) as f64 / dt;
                rates.push_str(&format!("  {label} {r:.1}/s"));
            }
            self.last_counts[i] = v;
        }
        self.last_at = now;
        let errors = snap.errors_total();
        let top_error = snap
            .errors
            .iter()
            .max_by_key(|(_, v)| **v)
            .map(|(k, v)| format!(" (most: {k} {v})"))
            .unwrap_or_default();
        format!(
            "[{:>7.1}s] {} connected {}/{} started {}{}  retries {}  errors {}{}{}",
            now.as_secs_f64(),
            self.kind,
            snap.connected,
            self.requested,
            started,
            rates,
            snap.counter(agent_sim_fleet::COUNTER_RECONNECT_ATTEMPTS),
            errors,
            top_error,
            disruption(snap)
        )
    }

    /// Prints if due (every second on a TTY, every `every` otherwise).
    pub fn tick(&mut self, now: Duration, snap: &Snapshot, started: u64, last: bool) {
        let due = match self.last_print {
            None => true,
            Some(_) if self.tty => true,
            // Half a tick of slack: the reporter wakes every second, a
            // hair early or late, and a line due at 5 s seen at 4.999 s
            // waited for 6 s (lines every 5, 6, 5, 6 s).
            Some(t) => now + TICK_SLACK >= t + self.every,
        };
        if last {
            // Sessions are closed by now: keep the last live figures on screen.
            if self.tty {
                let _ = writeln!(std::io::stderr());
            }
            return;
        }
        if !due {
            return;
        }
        self.last_print = Some(now);
        let line = self.line(now, snap, started);
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = write!(err, "\r\x1b[2K{line}");
            if last {
                let _ = writeln!(err);
            }
        } else {
            let _ = writeln!(err, "{line}");
        }
        let _ = err.flush();
    }
}

/// `  storm (sensu) at 20.0s: lost 2000, back 1234` while a disruption's
/// lost sessions are not all back.
fn disruption(snap: &Snapshot) -> String {
    snap.disruption
        .as_ref()
        .map(|d| {
            format!(
                "  {} ({}) at {:.1}s: lost {}, back {}",
                d.cause,
                d.fleet,
                d.began.as_secs_f64(),
                d.lost,
                d.back
            )
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_shows_connected_rates_and_errors() {
        let mut p = Progress::new(100, false, Duration::from_secs(10), "sensu");
        let mut snap = Snapshot {
            counters: vec![("keepalives_sent", 50), ("reconnect_attempts", 2)],
            connected: 90,
            ..Default::default()
        };
        snap.errors.insert("connect_refused".into(), 3);
        let l = p.line(Duration::from_secs(10), &snap, 100);
        assert!(l.contains("connected 90/100"), "{l}");
        assert!(l.contains("keepalives 5.0/s"), "{l}");
        assert!(l.contains("errors 3 (most: connect_refused 3)"), "{l}");
        assert!(l.contains("retries 2"), "{l}");
        assert!(!l.contains("lost"), "{l}");
        snap.disruption = Some(agent_sim_metrics::disruption::LiveDisruption {
            cause: "storm",
            fleet: "sensu",
            began: Duration::from_secs(20),
            lost: 2000,
            back: 1234,
        });
        let l = p.line(Duration::from_secs(21), &snap, 100);
        assert!(
            l.ends_with("storm (sensu) at 20.0s: lost 2000, back 1234"),
            "{l}"
        );
    }

    #[test]
    fn lines_come_at_the_interval_asked_when_the_tick_wakes_a_hair_early() {
        let mut p = Progress::new(10, false, Duration::from_secs(5), "sensu");
        let snap = Snapshot::default();
        let mut printed = Vec::new();
        for s in 1..=30u64 {
            // The 1 s tick, 1 ms early every other second.
            let now = Duration::from_secs(s) - Duration::from_millis(s % 2);
            let before = p.last_print;
            p.tick(now, &snap, 10, false);
            if p.last_print != before {
                printed.push(s);
            }
        }
        assert_eq!(printed, vec![1, 6, 11, 16, 21, 26], "{printed:?}");
    }
}
