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
//! | [`ReconnectPolicy::SensuAgent`] | sensu-agent's own: see below |
//!
//! A session that reached steady state resets the step to `min`.
//!
//! `sensu-agent` is what a real Sensu Go 6.12 agent does (`agent.go`
//! `connectWithBackoff` over `util/retry`, defaults `--retry-min 1s
//! --retry-max 120s --retry-multiplier 2`): after a session it held, the
//! first attempt goes at once; after a failed attempt it waits `min`
//! exactly, and each wait after that is the last one times two plus up to
//! 100 % of that at random, capped at `max`. So a backend restart meets
//! every agent at once, and a second time one `min` later, before the
//! jitter spreads them.

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
    /// A real sensu-agent's: at once after a held session, then `min`, then
    /// each wait doubled plus up to 100 % at random, capped at `max`.
    SensuAgent,
}

impl ReconnectPolicy {
    /// The name used on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            ReconnectPolicy::Exponential => "exponential",
            ReconnectPolicy::FullJitter => "full-jitter",
            ReconnectPolicy::Fixed => "fixed",
            ReconnectPolicy::None => "none",
            ReconnectPolicy::SensuAgent => "sensu-agent",
        }
    }
}

impl fmt::Display for ReconnectPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `--reconnect` value that names no policy (the text as given).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?}: expected exponential, full-jitter, fixed, none or sensu-agent")]
pub struct UnknownPolicy(pub String);

impl FromStr for ReconnectPolicy {
    type Err = UnknownPolicy;
    fn from_str(s: &str) -> Result<Self, UnknownPolicy> {
        match s.trim() {
            "exponential" => Ok(ReconnectPolicy::Exponential),
            "full-jitter" | "full_jitter" => Ok(ReconnectPolicy::FullJitter),
            "fixed" => Ok(ReconnectPolicy::Fixed),
            "none" => Ok(ReconnectPolicy::None),
            "sensu-agent" | "sensu_agent" => Ok(ReconnectPolicy::SensuAgent),
            o => Err(UnknownPolicy(o.into())),
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
    /// `sensu-agent`: the next attempt goes at once (a held session ended).
    at_once: bool,
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
            at_once: false,
        }
    }

    /// The next delay (see the module table); the step then grows.
    pub fn next_delay(&mut self) -> Duration {
        if self.policy == ReconnectPolicy::SensuAgent {
            return self.next_sensu_agent();
        }
        let step = self.current;
        self.current = (self.current * 2).min(self.max.max(self.min));
        match self.policy {
            ReconnectPolicy::Exponential => step.mul_f64(0.5 + 0.5 * fastrand::f64()),
            ReconnectPolicy::FullJitter => step.mul_f64(fastrand::f64()),
            ReconnectPolicy::Fixed => self.min,
            ReconnectPolicy::None => Duration::ZERO,
            ReconnectPolicy::SensuAgent => unreachable!("answered above"),
        }
    }

    /// sensu-agent's wait: at once after a held session, else the current
    /// wait (capped), the one after it doubled plus up to 100 % at random.
    fn next_sensu_agent(&mut self) -> Duration {
        if std::mem::take(&mut self.at_once) {
            return Duration::ZERO;
        }
        let cap = self.max.max(self.min);
        let wait = self.current.min(cap);
        self.current = (wait * 2).mul_f64(1.0 + fastrand::f64()).min(cap);
        wait
    }

    /// A session started at once without asking for a delay (a move to
    /// another server): `sensu-agent`'s attempt at once after a held
    /// session is used up.
    pub fn started_at_once(&mut self) {
        self.at_once = false;
    }

    /// Back to the smallest step (after a session that worked).
    pub fn reset(&mut self) {
        self.current = self.min;
        self.at_once = self.policy == ReconnectPolicy::SensuAgent;
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
    fn sensu_agent_waits_min_then_doubles_with_up_to_full_jitter() {
        let (min, max) = (Duration::from_secs(1), Duration::from_secs(120));
        for _ in 0..50 {
            let mut b = Backoff::with_policy(ReconnectPolicy::SensuAgent, min, max);
            // A failed first attempt: exactly min, no jitter.
            assert_eq!(b.next_delay(), min);
            // Then twice the last wait plus up to 100 % of that, capped.
            let mut last = min;
            for _ in 0..12 {
                let d = b.next_delay();
                assert!(
                    d >= (last * 2).min(max) && d <= (last * 4).min(max),
                    "{d:?} after {last:?}"
                );
                last = d;
            }
            assert_eq!(last, max, "the cap is reached within a dozen failures");
            // A held session ends: the first attempt at once, then min.
            b.reset();
            assert_eq!(b.next_delay(), Duration::ZERO);
            assert_eq!(b.next_delay(), min);
            // A held session that moved on at once used up its attempt at
            // once: the next failure waits min.
            b.reset();
            b.started_at_once();
            assert_eq!(b.next_delay(), min);
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
            ReconnectPolicy::SensuAgent,
        ] {
            assert_eq!(p.to_string().parse::<ReconnectPolicy>().unwrap(), p);
        }
        assert!("linear".parse::<ReconnectPolicy>().is_err());
    }
}
