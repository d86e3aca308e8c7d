//! Reconnect delays. A synchronized reconnect storm is what collapses real
//! backends, so the default policy randomizes every delay ("equal jitter":
//! between half and all of the current step) and doubles the step up to a
//! cap. The other policies exist to show what that jitter saves:
//!
//! | policy | delay after the k-th failure in a row (step = min·2^k, capped at max) |
//! |---|---|
//! | [`ReconnectPolicy::Exponential`] (default) | uniform in `[step/2, step]` |
//! | [`ReconnectPolicy::FullJitter`] | uniform in `[0, step]` |
//! | [`ReconnectPolicy::Fixed`] | exactly `min`, every time (no jitter: synchronized) |
//! | [`ReconnectPolicy::None`] | zero: reconnect at once (the synchronized burst) |
//!
//! A session that reached steady state resets the step to `min`.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// How an agent waits between two sessions (`--reconnect`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReconnectPolicy {
    /// Equal jitter: uniform in `[step/2, step]`, the step doubling to the cap.
    #[default]
    Exponential,
    /// Full jitter: uniform in `[0, step]`, the step doubling to the cap.
    FullJitter,
    /// Exactly the minimum every time, no jitter.
    Fixed,
    /// No delay at all.
    None,
}

impl ReconnectPolicy {
    /// The name used on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            ReconnectPolicy::Exponential => "exponential",
            ReconnectPolicy::FullJitter => "full-jitter",
            ReconnectPolicy::Fixed => "fixed",
            ReconnectPolicy::None => "none",
        }
    }
}

impl fmt::Display for ReconnectPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ReconnectPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "exponential" => Ok(ReconnectPolicy::Exponential),
            "full-jitter" | "full_jitter" => Ok(ReconnectPolicy::FullJitter),
            "fixed" => Ok(ReconnectPolicy::Fixed),
            "none" => Ok(ReconnectPolicy::None),
            o => Err(format!(
                "{o:?}: expected exponential, full-jitter, fixed or none"
            )),
        }
    }
}

impl<'de> serde::Deserialize<'de> for ReconnectPolicy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Backoff state for one agent (or one subscription).
#[derive(Debug, Clone)]
pub struct Backoff {
    policy: ReconnectPolicy,
    min: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    /// Exponential with equal jitter: starts at `min` (at least 1 ms),
    /// doubles to at most `max`. A `max` below `min` is kept as given so
    /// that [`crate::FleetConfig::validate`] can refuse it; the delays never
    /// exceed `min` then.
    pub fn new(min: Duration, max: Duration) -> Self {
        Self::with_policy(ReconnectPolicy::Exponential, min, max)
    }

    /// A backoff of the given policy (see the module table).
    pub fn with_policy(policy: ReconnectPolicy, min: Duration, max: Duration) -> Self {
        let min = min.max(Duration::from_millis(1));
        Backoff {
            policy,
            min,
            max,
            current: min,
        }
    }

    /// The next delay (see the module table); the step then doubles.
    pub fn next_delay(&mut self) -> Duration {
        let step = self.current;
        self.current = (self.current * 2).min(self.max.max(self.min));
        match self.policy {
            ReconnectPolicy::Exponential => step.mul_f64(0.5 + 0.5 * fastrand::f64()),
            ReconnectPolicy::FullJitter => step.mul_f64(fastrand::f64()),
            ReconnectPolicy::Fixed => self.min,
            ReconnectPolicy::None => Duration::ZERO,
        }
    }

    /// The next delay after the server said it is overloaded (an HTTP 429):
    /// as sensu-go's agent does, the start, the cap and the growth of the
    /// backoff are doubled for it (the step at least twice the minimum,
    /// the next one four times this one, both capped at twice the cap).
    pub fn next_delay_overloaded(&mut self) -> Duration {
        let cap = self.max.max(self.min) * 2;
        let step = (self.current * 2).max(self.min * 2).min(cap);
        self.current = (step * 4).min(cap);
        match self.policy {
            ReconnectPolicy::Exponential => step.mul_f64(0.5 + 0.5 * fastrand::f64()),
            ReconnectPolicy::FullJitter => step.mul_f64(fastrand::f64()),
            ReconnectPolicy::Fixed => self.min * 2,
            ReconnectPolicy::None => Duration::ZERO,
        }
    }

    /// Back to the smallest step (after a session that worked).
    pub fn reset(&mut self) {
        self.current = self.min;
    }

    /// The policy.
    pub fn policy(&self) -> ReconnectPolicy {
        self.policy
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

    const MIN: Duration = Duration::from_millis(200);
    const MAX: Duration = Duration::from_secs(60);

    /// Runs `n` delays of a fresh backoff and checks each against its step.
    fn check(policy: ReconnectPolicy, ok: impl Fn(Duration, Duration) -> bool) {
        let mut b = Backoff::with_policy(policy, MIN, MAX);
        let mut step = MIN;
        for _ in 0..20 {
            let d = b.next_delay();
            assert!(ok(d, step), "{policy}: {d:?} with step {step:?}");
            step = (step * 2).min(MAX);
        }
        b.reset();
        assert!(b.next_delay() <= MIN);
    }

    #[test]
    fn exponential_delays_double_with_equal_jitter_up_to_the_cap() {
        check(ReconnectPolicy::Exponential, |d, step| {
            d >= step / 2 && d <= step
        });
        assert_eq!(
            Backoff::new(MIN, MAX).policy(),
            ReconnectPolicy::Exponential
        );
    }

    #[test]
    fn full_jitter_delays_fall_anywhere_below_the_step() {
        check(ReconnectPolicy::FullJitter, |d, step| d <= step);
        // Over many draws some land in the lower half (unlike equal jitter).
        let low = (0..200)
            .filter(|_| {
                Backoff::with_policy(ReconnectPolicy::FullJitter, MIN, MAX).next_delay() < MIN / 2
            })
            .count();
        assert!(low > 50, "{low}");
    }

    #[test]
    fn fixed_and_none_do_not_jitter() {
        check(ReconnectPolicy::Fixed, |d, _| d == MIN);
        check(ReconnectPolicy::None, |d, _| d.is_zero());
    }

    #[test]
    fn an_overloaded_server_doubles_start_cap_and_growth() {
        let mut b = Backoff::with_policy(ReconnectPolicy::Fixed, MIN, MAX);
        assert_eq!(b.next_delay_overloaded(), MIN * 2);
        let mut b = Backoff::new(MIN, MAX);
        // First: a step of twice the minimum.
        let d = b.next_delay_overloaded();
        assert!(d >= MIN && d <= MIN * 2, "{d:?}");
        // Then four times that, where a plain failure would double it.
        let d = b.next_delay();
        assert!(d >= MIN * 4 && d <= MIN * 8, "{d:?}");
        // Capped at twice the cap.
        for _ in 0..20 {
            assert!(b.next_delay_overloaded() <= MAX * 2);
        }
    }

    #[test]
    fn jitter_spreads_agents_apart() {
        let delays: Vec<Duration> = (0..100)
            .map(|_| Backoff::new(Duration::from_secs(1), Duration::from_secs(1)).next_delay())
            .collect();
        let distinct: std::collections::HashSet<_> = delays.iter().collect();
        assert!(distinct.len() > 90);
    }

    #[test]
    fn policies_parse_by_name() {
        for p in [
            ReconnectPolicy::Exponential,
            ReconnectPolicy::FullJitter,
            ReconnectPolicy::Fixed,
            ReconnectPolicy::None,
        ] {
            assert_eq!(p.to_string().parse::<ReconnectPolicy>().unwrap(), p);
        }
        assert!("linear".parse::<ReconnectPolicy>().is_err());
    }
}
