//! memberlist's suspicion of a member, for the servers the pool probes: a
//! server suspected (its probe unanswered, or another member's `suspect`)
//! has until a deadline to refute it with a higher incarnation, or it is
//! declared dead. The deadline starts at `max` and falls towards `min` as
//! independent confirmations come in (memberlist's `suspicion.go`):
//!
//! - `min = suspicion_mult × max(1, log10(n)) × probe_interval` (the scale
//!   kept to thousandths, as Go keeps it), `max = 6 × min`;
//! - `k = suspicion_mult − 2` confirmations bring it to `min` (none are
//!   awaited, and `min` is the deadline, when the pool has fewer than
//!   `k + 2` members);
//! - after `c` of them the timeout is
//!   `max − (max − min) × log(c + 1) / log(k + 1)`, whole milliseconds, at
//!   least `min`.
//!
//! What it is not: no timer and no state of its own beyond the deadlines.
//! The view starts and ends suspicions, the probe round looks for those
//! overdue ([`Suspicions::overdue`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

/// memberlist's `SuspicionMaxTimeoutMult`.
pub const MAX_TIMEOUT_MULT: u32 = 6;

/// memberlist's `suspicionTimeout`: the least a suspicion lasts in a pool
/// of `n` members.
pub fn min_timeout(mult: u32, n: usize, interval: Duration) -> Duration {
    let scale = (n.max(1) as f64).log10().max(1.0);
    let milli = (scale * 1000.0) as u32;
    interval * mult * milli / 1000
}

/// One suspicion.
#[derive(Debug, Clone)]
pub struct Suspicion {
    /// Confirmations that bring the timeout down to `min`.
    k: u32,
    min: Duration,
    max: Duration,
    start: Instant,
    /// When the member is declared dead unless it refutes.
    pub deadline: Instant,
    /// The accuser, then each confirmation's member (at most `k + 1`).
    from: Vec<Arc<str>>,
}

impl Suspicion {
    /// Raised by `from` at `now`: `max` away, or `min` when no
    /// confirmation is awaited (`k` 0).
    pub fn new(from: &str, k: u32, min: Duration, max: Duration, now: Instant) -> Self {
        let first = if k == 0 { min } else { max };
        Suspicion {
            k,
            min,
            max,
            start: now,
            deadline: now + first,
            from: vec![from.into()],
        }
    }

    /// Independent confirmations so far.
    pub fn confirmations(&self) -> u32 {
        self.from.len() as u32 - 1
    }

    /// The timeout after `c` confirmations (from the start).
    pub fn timeout_after(&self, c: u32) -> Duration {
        if self.k == 0 {
            return self.min;
        }
        let frac = f64::from(c + 1).ln() / f64::from(self.k + 1).ln();
        let (max, min) = (self.max.as_secs_f64(), self.min.as_secs_f64());
        let raw = max - frac * (max - min);
        Duration::from_millis((1000.0 * raw).floor().max(0.0) as u64).max(self.min)
    }

    /// A confirmation by `from`: true when it is a new one (each member
    /// once, `k` at most), the deadline then brought forward.
    pub fn confirm(&mut self, from: &str) -> bool {
        if self.confirmations() >= self.k || self.from.iter().any(|f| &**f == from) {
            return false;
        }
        self.from.push(from.into());
        self.deadline = self.start + self.timeout_after(self.confirmations());
        true
    }
}

/// The suspicions of the servers, by remote index, with the settings they
/// are timed by.
#[derive(Debug, Clone)]
pub struct Suspicions {
    /// `Timings::suspicion_mult`.
    pub mult: u32,
    /// `Timings::probe_interval`.
    pub interval: Duration,
    open: HashMap<usize, Suspicion>,
}

impl Default for Suspicions {
    fn default() -> Self {
        Suspicions {
            mult: 4,
            interval: Duration::from_secs(1),
            open: HashMap::new(),
        }
    }
}

impl Suspicions {
    /// Starts the suspicion of `remote`, raised by `from`, in a pool of `n`
    /// members.
    pub fn start(&mut self, remote: usize, from: &str, n: usize, now: Instant) {
        let mut k = self.mult.saturating_sub(2);
        if n.saturating_sub(2) < k as usize {
            k = 0;
        }
        let min = min_timeout(self.mult, n, self.interval);
        let s = Suspicion::new(from, k, min, min * MAX_TIMEOUT_MULT, now);
        self.open.insert(remote, s);
    }

    /// A confirmation of the suspicion of `remote` by `from`: true when
    /// it is new (and to be passed on, as memberlist does).
    pub fn confirm(&mut self, remote: usize, from: &str) -> bool {
        self.open.get_mut(&remote).is_some_and(|s| s.confirm(from))
    }

    /// Ends the suspicion of `remote` (refuted, or it is dead).
    pub fn end(&mut self, remote: usize) {
        self.open.remove(&remote);
    }

    /// The suspicion of `remote`, if one is open.
    pub fn get(&self, remote: usize) -> Option<&Suspicion> {
        self.open.get(&remote)
    }

    /// Takes out the suspicions whose deadline has come: their servers.
    pub fn overdue(&mut self, now: Instant) -> Vec<usize> {
        let due: Vec<usize> = self
            .open
            .iter()
            .filter(|(_, s)| s.deadline <= now)
            .map(|(&r, _)| r)
            .collect();
        for r in &due {
            self.open.remove(r);
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn min_and_max_grow_with_the_log_of_the_pool() {
        assert_eq!(min_timeout(4, 1, S), Duration::from_secs(4));
        assert_eq!(min_timeout(4, 10, S), Duration::from_secs(4));
        assert_eq!(min_timeout(4, 1_000, S), Duration::from_secs(12));
        assert_eq!(min_timeout(4, 10_000, S), Duration::from_secs(16));
        // The scale in thousandths, as Go keeps it: log10(50) = 1.698...
        assert_eq!(min_timeout(4, 50, S), Duration::from_millis(6_792));
        let now = Instant::now();
        for (n, min) in [(10, 4), (1_000, 12), (10_000, 16)] {
            let mut t = Suspicions::default();
            t.start(0, "m1", n, now);
            let s = t.get(0).unwrap();
            assert_eq!(s.deadline, now + Duration::from_secs(6 * min), "n {n}");
            assert_eq!(s.timeout_after(2), Duration::from_secs(min), "n {n}");
        }
    }

    #[test]
    fn confirmations_bring_the_deadline_down_to_the_minimum() {
        let now = Instant::now();
        let (min, max) = (Duration::from_secs(4), Duration::from_secs(24));
        let mut s = Suspicion::new("a", 2, min, max, now);
        assert_eq!(s.deadline, now + max);
        assert!(!s.confirm("a"), "the accuser does not confirm itself");
        assert!(s.confirm("b"));
        // log(2)/log(3) of the way from 24 s to 4 s.
        assert_eq!(s.deadline, now + Duration::from_millis(11_381));
        assert!(!s.confirm("b"), "each member once");
        assert!(s.confirm("c"));
        assert_eq!(s.deadline, now + min);
        assert!(!s.confirm("d"), "k confirmations are all that count");
    }

    #[test]
    fn a_small_pool_awaits_no_confirmation() {
        let now = Instant::now();
        let mut t = Suspicions::default();
        t.start(3, "m1", 3, now);
        assert_eq!(t.get(3).unwrap().deadline, now + Duration::from_secs(4));
        assert!(!t.confirm(3, "m2"));
        assert!(t.overdue(now + Duration::from_secs(3)).is_empty());
        assert_eq!(t.overdue(now + Duration::from_secs(4)), vec![3]);
        assert!(t.get(3).is_none());
    }
}
