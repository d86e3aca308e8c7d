//! memberlist's handler queue: the packet reader answers pings, indirect
//! pings, acks and nacks itself, and hands alive, suspect, dead and user
//! (serf) messages to one handler task through two queues of
//! `HandoffQueueDepth` (1,024) messages each, alive messages in the high
//! priority one and the rest in the low one. The handler takes the newest
//! first, high before low (memberlist's `getNextMessage`), and applies each
//! as the reader did before (`apply`). A message that finds its queue full
//! is dropped, counted (`serf_handler_queue_dropped`) and logged as
//! memberlist logs it, "[WARN] memberlist: handler queue full, dropping
//! message (4) from=ADDR", at most once a second with the count held back
//! since the last line. The push-pulls memberlist refuses (`answer`) are
//! logged the same way: "[ERR] memberlist: Too many pending push/pull
//! requests".
//!
//! So a burst that outruns the handler loses messages as a real server's
//! does: 150 agents joining at once overflowed a real 1.20.1's.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_sim_gossip::WireError;
use agent_sim_gossip::wire::kind;
use agent_sim_gossip::wire::msgs::{Alive, Verdict};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Serf, lock};

/// memberlist's `HandoffQueueDepth`: messages per queue.
pub(super) const HANDOFF_QUEUE_DEPTH: usize = 1024;
/// Bytes waiting in both queues at most (a message that would pass it is
/// dropped as one finding its queue full): gossip is small, but a
/// compressed packet may unpack to large user messages.
const HANDOFF_MAX_BYTES: usize = 32 << 20;
/// A repeated log line at most this often.
const LOG_EVERY: Duration = Duration::from_secs(1);

/// A message waiting for the handler.
#[derive(Debug)]
struct Queued {
    t: u8,
    body: Vec<u8>,
}

/// The two queues (high, low) and the bytes they hold.
#[derive(Debug, Default)]
struct Queues {
    queues: [VecDeque<Queued>; 2],
    bytes: usize,
}

/// The queues and the handler's wake-up.
#[derive(Debug, Default)]
pub(super) struct Handoff {
    // Bound: HANDOFF_QUEUE_DEPTH messages per queue, HANDOFF_MAX_BYTES in all.
    queues: Mutex<Queues>,
    ready: Notify,
}

impl Handoff {
    /// Puts a message on its queue; `false` when that queue is full.
    fn push(&self, t: u8, body: &[u8]) -> bool {
        {
            let mut q = lock(&self.queues);
            if q.bytes + body.len() > HANDOFF_MAX_BYTES {
                return false;
            }
            let queue = &mut q.queues[usize::from(t != kind::ALIVE)];
            if queue.len() >= HANDOFF_QUEUE_DEPTH {
                return false;
            }
            queue.push_back(Queued {
                t,
                body: body.to_vec(),
            });
            q.bytes += body.len();
        }
        self.ready.notify_one();
        true
    }

    /// The next message: the newest of the high priority queue, else of
    /// the low one.
    fn pop(&self) -> Option<Queued> {
        let mut q = lock(&self.queues);
        let m = q.queues[0].pop_back().or_else(|| q.queues[1].pop_back())?;
        q.bytes -= m.body.len();
        Some(m)
    }

    /// Messages waiting.
    pub(super) fn len(&self) -> usize {
        let q = lock(&self.queues);
        q.queues[0].len() + q.queues[1].len()
    }

    /// Forgets what waits (a restart).
    pub(super) fn clear(&self) {
        *lock(&self.queues) = Queues::default();
    }
}

/// A log line repeated at most once per LOG_EVERY, with how many were
/// held back in between.
#[derive(Debug, Default)]
pub(super) struct Throttle {
    last: Option<Instant>,
    held: u64,
}

impl Throttle {
    /// `Some(held back since the last line)` when a line is due at `now`;
    /// else this one is held back.
    pub(super) fn due(&mut self, now: Instant) -> Option<u64> {
        if self.last.is_some_and(|t| now.duration_since(t) < LOG_EVERY) {
            self.held += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.held))
    }
}

/// What a throttled line says of the ones held back.
pub(super) fn held_back(n: u64) -> String {
    if n == 0 {
        String::new()
    } else {
        format!(" ({n} more since the last such line)")
    }
}

/// Handles what the reader hands off, until `shutdown`.
pub(super) async fn handler(serf: Arc<Serf>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            () = serf.handoff.ready.notified() => {}
            () = shutdown.cancelled() => return,
        }
        while let Some(m) = serf.handoff.pop() {
            serf.apply(m.t, &m.body);
            if serf.cfg.handle_delay.is_zero() {
                // Other tasks (the reader's acks) get their turn in a long run.
                tokio::task::consume_budget().await;
            } else {
                tokio::time::sleep(serf.cfg.handle_delay).await;
            }
        }
    }
}

impl Serf {
    /// Hands a message (type `t`, `body` after its type byte) to the
    /// handler; with its queue full, drops it (counted, logged).
    pub(super) fn hand_off(&self, t: u8, body: &[u8], from: SocketAddr) {
        if self.handoff.push(t, body) {
            return;
        }
        let c = &self.counters;
        c.bump(&c.handler_dropped);
        if let Some(held) = lock(&self.throttles[0]).due(Instant::now()) {
            self.log(format!(
                "[WARN] memberlist: handler queue full, dropping message ({t}) from={from}{}",
                held_back(held)
            ));
        }
    }

    /// Handles every message waiting, at once (the hostile-input tests).
    #[cfg(test)]
    pub(super) fn drain_handoff(&self) {
        while let Some(m) = self.handoff.pop() {
            self.apply(m.t, &m.body);
        }
    }

    /// Applies one handed-off message; bad ones are counted by cause.
    fn apply(&self, t: u8, body: &[u8]) {
        if let Err(e) = self.apply_message(t, body, Instant::now()) {
            self.counters.bad(e.cause());
        }
    }

    fn apply_message(&self, t: u8, body: &[u8], now: Instant) -> Result<(), WireError> {
        match t {
            kind::ALIVE => {
                let a = Alive::decode(body)?;
                if let Err(r) = self.with_table(|tb| tb.alive(&a, now)) {
                    self.counters.bad(r.cause());
                }
            }
            kind::SUSPECT => {
                let v = Verdict::decode(body)?;
                self.with_table(|tb| tb.suspect(&v, now));
            }
            kind::DEAD => {
                let v = Verdict::decode(body)?;
                self.with_table(|tb| tb.dead(&v, now));
            }
            _ => self.on_user(body, now)?,
        }
        Ok(())
    }

    /// A line for the server's log (`serve`'s stderr), if it has one.
    pub(super) fn log(&self, line: String) {
        if let Some(log) = &self.cfg.log {
            (log.0)(line);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_alive_goes_first_and_a_full_queue_refuses() {
        let h = Handoff::default();
        assert!(h.push(kind::DEAD, &[1]));
        assert!(h.push(kind::ALIVE, &[2]));
        assert!(h.push(kind::ALIVE, &[3]));
        let order: Vec<u8> = std::iter::from_fn(|| h.pop()).map(|m| m.body[0]).collect();
        assert_eq!(order, vec![3, 2, 1]);
        for _ in 0..HANDOFF_QUEUE_DEPTH {
            assert!(h.push(kind::ALIVE, &[0]));
        }
        assert!(!h.push(kind::ALIVE, &[0]), "the high queue is full");
        assert!(h.push(kind::USER, &[0]), "the low one is not");
        assert_eq!(h.len(), HANDOFF_QUEUE_DEPTH + 1);
        let big = vec![0; HANDOFF_MAX_BYTES / 2];
        assert!(h.push(kind::USER, &big));
        assert!(!h.push(kind::USER, &big), "past the bytes bound");
        h.clear();
        assert_eq!(h.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_repeated_line_is_logged_once_a_second_with_the_count() {
        let mut t = Throttle::default();
        let now = Instant::now();
        assert_eq!(t.due(now), Some(0));
        assert_eq!(t.due(now), None);
        assert_eq!(t.due(now + Duration::from_millis(999)), None);
        assert_eq!(t.due(now + Duration::from_secs(1)), Some(2));
        assert_eq!(held_back(2), " (2 more since the last such line)");
    }
}
