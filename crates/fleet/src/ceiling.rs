//! Local ceilings: when the kernel of the load box refuses a connection
//! (the ephemeral ports of a source address are all taken, the process is
//! out of file descriptors or of socket memory), retrying with backoff
//! only burns the box's CPU in failed `connect` calls and makes every
//! timing of the run worthless. Instead the agent that could not dial
//! waits until one of this fleet's own connections closes (on the same
//! source address for ports; any for fds and memory), then tries once.
//!
//! The ceiling is reported once per source address and kind (warning
//! `local_ports_exhausted`, `local_fds_exhausted`, `local_buffers_exhausted`:
//! how many connections the fleet held from that address when it hit);
//! every refused dial counts under that cause, and an agent still waiting
//! when the run ends is missing with it.
//!
//! Bound: one gate per source address and one for the process; the count
//! of sessions held per source address.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use agent_sim_metrics::Metrics;
use tokio::sync::Notify;

use crate::outcome::{CAUSE_BUFFERS, CAUSE_FDS, CAUSE_PORTS, Failure, SessionEnd};

/// The dial error kinds (of `agent_sim_net::dial_error_kind`) that are the
/// load box's own ceiling, with the cause they are counted under and
/// whether the ceiling is per source address.
const CEILINGS: [(&str, &str, bool); 3] = [
    ("connect_addr_unavailable", CAUSE_PORTS, true),
    ("connect_too_many_files", CAUSE_FDS, false),
    ("connect_no_buffers", CAUSE_BUFFERS, false),
];

/// One place to wait at.
#[derive(Debug, Default)]
pub(crate) struct Gate {
    opened: Notify,
    reported: AtomicBool,
}

impl Gate {
    /// Waits until a connection the gate watches closes.
    pub(crate) async fn wait(&self) {
        self.opened.notified().await;
    }
}

/// The fleet's ceilings (see the module doc).
#[derive(Debug)]
pub(crate) struct Ceilings {
    sources: Vec<IpAddr>,
    /// Sessions held per source address (one slot when the OS chooses).
    held: Vec<AtomicI64>,
    /// One gate per source slot (ports).
    ports: Vec<Gate>,
    /// The process's gate (fds, socket memory).
    process: Gate,
}

impl Ceilings {
    /// Ceilings of a fleet dialing from `sources` (empty: the OS chooses).
    pub(crate) fn new(sources: &[IpAddr]) -> Self {
        let slots = sources.len().max(1);
        Ceilings {
            sources: sources.to_vec(),
            held: (0..slots).map(|_| AtomicI64::new(0)).collect(),
            ports: (0..slots).map(|_| Gate::default()).collect(),
            process: Gate::default(),
        }
    }

    fn slot(&self, bind: Option<IpAddr>) -> usize {
        bind.and_then(|b| self.sources.iter().position(|s| *s == b))
            .unwrap_or(0)
    }

    /// A session from `bind` was established.
    pub(crate) fn up(&self, bind: Option<IpAddr>) {
        self.held[self.slot(bind)].fetch_add(1, Ordering::Relaxed);
    }

    /// A session from `bind` closed: one agent waiting at its address (and
    /// one waiting for the process) may try.
    pub(crate) fn down(&self, bind: Option<IpAddr>) {
        let slot = self.slot(bind);
        self.held[slot].fetch_sub(1, Ordering::Relaxed);
        self.ports[slot].opened.notify_one();
        self.process.opened.notify_one();
    }

    /// If `end` is a dial the kernel refused for a local ceiling: the same
    /// end under the ceiling's cause, and the gate to wait at. The first
    /// time per gate the ceiling is reported as a warning with the numbers.
    pub(crate) fn refused(
        &self,
        end: &SessionEnd,
        bind: Option<IpAddr>,
        metrics: &Metrics,
    ) -> Option<(SessionEnd, &Gate)> {
        let SessionEnd::Lost(f) = end else {
            return None;
        };
        let (kind, cause, per_source) = CEILINGS.iter().copied().find(|c| c.0 == f.kind)?;
        let slot = self.slot(bind);
        let gate = if per_source {
            &self.ports[slot]
        } else {
            &self.process
        };
        if !gate.reported.swap(true, Ordering::Relaxed) {
            let held = if per_source {
                self.held[slot].load(Ordering::Relaxed)
            } else {
                self.held.iter().map(|h| h.load(Ordering::Relaxed)).sum()
            };
            let from = match (per_source, bind) {
                (true, Some(a)) => format!(" from {a}"),
                (true, None) => " from the OS-chosen source address".to_string(),
                (false, _) => String::new(),
            };
            metrics.warn(
                cause,
                Some(&format!(
                    "the kernel refused a connection{from} ({kind}: {}) while this fleet held {held} \
                     connection(s){from}; the agents that could not dial wait for one of them to \
                     close instead of retrying",
                    f.detail.as_deref().unwrap_or("no detail")
                )),
            );
        }
        Some((
            SessionEnd::Lost(Failure {
                kind: cause,
                detail: f.detail.clone(),
                said_by: f.said_by,
            }),
            gate,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_refused_dial_waits_for_a_close_and_is_reported_once() {
        let m = Metrics::new(&agent_sim_metrics::MetricsSpec::default(), 1);
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.3".parse().unwrap();
        let c = Ceilings::new(&[a, b]);
        for _ in 0..3 {
            c.up(Some(a));
        }
        let refused = SessionEnd::lost_with("connect_addr_unavailable", "os error 99");
        let (end, gate) = c.refused(&refused, Some(a), &m).unwrap();
        assert_eq!(end.failure().unwrap().kind, CAUSE_PORTS);
        let _ = c.refused(&refused, Some(a), &m).unwrap();
        let w = m.warning_report();
        assert_eq!((w[0].kind.as_str(), w[0].stat.count), (CAUSE_PORTS, 1));
        let words = w[0].stat.sample.as_deref().unwrap();
        assert!(
            words.contains("from 127.0.0.2") && words.contains("held 3"),
            "{words}"
        );
        // A close on the other address does not open this one's gate.
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(20), gate.wait());
        c.down(Some(b));
        assert!(waiting.await.is_err());
        c.down(Some(a));
        gate.wait().await;
        assert!(
            c.refused(&SessionEnd::lost("connect_refused"), Some(a), &m)
                .is_none()
        );
    }
}
