//! Jittered exponential backoff. A synchronized reconnect storm is what
//! collapses real backends, so every delay is randomized ("equal jitter":
//! between half and all of the current step) and steps double up to a cap.

use std::time::Duration;

/// Exponential backoff state for one agent (or one subscription).
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    /// Starts at `min` (at least 1 ms), doubles to at most `max`. A `max`
    /// below `min` is kept as given so that [`crate::FleetConfig::validate`]
    /// can refuse it; the delays never exceed `min` then.
    pub fn new(min: Duration, max: Duration) -> Self {
        let min = min.max(Duration::from_millis(1));
        Backoff {
            min,
            max,
            current: min,
        }
    }

    /// The next delay: uniformly in `[step/2, step]`, then the step doubles.
    pub fn next_delay(&mut self) -> Duration {
        let step = self.current;
        self.current = (self.current * 2).min(self.max.max(self.min));
        step.mul_f64(0.5 + 0.5 * fastrand::f64())
    }

    /// Back to the smallest step (after a session that worked).
    pub fn reset(&mut self) {
        self.current = self.min;
    }

    /// The smallest step.
    pub fn min(&self) -> Duration {
        self.min
    }

    /// The cap.
    pub fn max(&self) -> Duration {
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_with_jitter_up_to_the_cap() {
        let mut b = Backoff::new(Duration::from_millis(200), Duration::from_secs(60));
        let mut step = Duration::from_millis(200);
        for _ in 0..20 {
            let d = b.next_delay();
            assert!(
                d >= step / 2 && d <= step,
                "{d:?} outside [{:?}, {step:?}]",
                step / 2
            );
            step = (step * 2).min(Duration::from_secs(60));
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(200));
    }

    #[test]
    fn jitter_spreads_agents_apart() {
        let delays: Vec<Duration> = (0..100)
            .map(|_| Backoff::new(Duration::from_secs(1), Duration::from_secs(1)).next_delay())
            .collect();
        let distinct: std::collections::HashSet<_> = delays.iter().collect();
        assert!(distinct.len() > 90);
    }
}
