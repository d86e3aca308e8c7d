//! How long a suspected member has to refute before it is declared failed,
//! as memberlist times it: a timeout that starts at its maximum and shrinks
//! towards its minimum as other members confirm the suspicion.
//!
//! What it is not: no timer. The table keeps each suspicion's deadline and
//! the timers task of `probe` looks at them.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

/// memberlist's `suspicionTimeout`: `mult × max(1, log10(n)) × interval`,
/// the scale kept to milliseconds as Go keeps it.
pub(crate) fn min_timeout(mult: u32, n: usize, interval: Duration) -> Duration {
    let scale = (n.max(1) as f64).log10().max(1.0);
    let milli = (scale * 1000.0) as u32;
    interval * mult * milli / 1000
}

/// One suspicion of one member.
#[derive(Debug, Clone)]
pub(crate) struct Suspicion {
    /// Confirmations that bring the timeout down to `min`.
    k: u32,
    /// Confirmations so far (from members other than the first accuser).
    n: u32,
    min: Duration,
    max: Duration,
    start: Instant,
    /// When the member is declared failed, unless refuted.
    pub(crate) deadline: Instant,
    /// Who accused it (at most `k + 1` names).
    from: Vec<Arc<str>>,
}

impl Suspicion {
    /// A suspicion raised by `from` at `now`: `max` away, or `min` when no
    /// confirmations are expected (`k` 0).
    pub(crate) fn new(from: &str, k: u32, min: Duration, max: Duration, now: Instant) -> Self {
        let first = if k < 1 { min } else { max };
        Suspicion {
            k,
            n: 0,
            min,
            max,
            start: now,
            deadline: now + first,
            from: vec![from.into()],
        }
    }

    /// Counts a confirmation by `from`: `true` when it is new (and worth
    /// gossiping on), the deadline then brought forward.
    pub(crate) fn confirm(&mut self, from: &str) -> bool {
        if self.n >= self.k || self.from.iter().any(|f| &**f == from) {
            return false;
        }
        self.from.push(from.into());
        self.n += 1;
        let frac = f64::from(self.n + 1).ln() / f64::from(self.k + 1).ln();
        let max = self.max.as_secs_f64();
        let raw = max - frac * (max - self.min.as_secs_f64());
        let timeout = Duration::from_millis((1000.0 * raw).floor().max(0.0) as u64).max(self.min);
        self.deadline = self.start + timeout;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_minimum_grows_with_the_log_of_the_pool() {
        let s = Duration::from_secs(1);
        assert_eq!(min_timeout(4, 1, s), Duration::from_secs(4));
        assert_eq!(min_timeout(4, 10, s), Duration::from_secs(4));
        assert_eq!(min_timeout(4, 100, s), Duration::from_secs(8));
        assert_eq!(min_timeout(4, 10_000, s), Duration::from_secs(16));
        assert_eq!(min_timeout(4, 50, s), Duration::from_millis(6_792));
    }

    #[tokio::test(start_paused = true)]
    async fn confirmations_bring_the_deadline_down_to_the_minimum() {
        let now = Instant::now();
        let (min, max) = (Duration::from_secs(4), Duration::from_secs(24));
        let mut s = Suspicion::new("a", 2, min, max, now);
        assert_eq!(s.deadline, now + max);
        assert!(!s.confirm("a"), "the accuser does not confirm itself");
        assert!(s.confirm("b"));
        // log(2)/log(3) of the way from 24 s to 4 s.
        assert_eq!(s.deadline, now + Duration::from_millis(11_381));
        assert!(s.confirm("c"));
        assert_eq!(s.deadline, now + min);
        assert!(!s.confirm("d"), "k confirmations are all that count");
        let lone = Suspicion::new("a", 0, min, max, now);
        assert_eq!(lone.deadline, now + min);
    }
}
