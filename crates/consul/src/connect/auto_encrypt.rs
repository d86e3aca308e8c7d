//! When a client agent with `auto_encrypt` asks again for its certificate
//! at boot (Consul 1.20's `agent/auto-config`, random draws passed in so
//! that the rule is tested on numbers): a round calls `AutoEncrypt.Sign` on
//! each server in turn until one signs; after a round where none did, the
//! agent waits as `lib/retry.Waiter{MinFailures: 1, MaxWait: 10m,
//! Jitter: NewJitter(25)}` says: nothing after the first failed round, then
//! 1, 2, 4 … s (at most 10 minutes), each plus up to 25 % at random.
//!
//! The CSR is [`super::new_agent_csr`]'s; the calls and the loop are the
//! agent's (`agent::auto_encrypt`). No socket, no timer here.

use std::time::Duration;

/// Longest wait between two rounds before the jitter (`MaxWait`).
pub const MAX_WAIT: Duration = Duration::from_secs(600);
/// The jitter: up to this share of the wait is added (`NewJitter(25)`).
pub const JITTER: f64 = 0.25;

/// The waiter between rounds: how many rounds failed in a row.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Waiter {
    failures: u32,
}

impl Waiter {
    /// A round failed: how long to wait before the next one; `r` a random
    /// draw in `[0, 1)`.
    pub fn failed(&mut self, r: f64) -> Duration {
        self.failures = self.failures.saturating_add(1);
        round_wait(self.failures, r)
    }

    /// Rounds failed in a row.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

/// The wait after the `failures`-th failed round in a row (`Waiter.delay`
/// with `MinFailures` 1, `MinWait` 0, a factor of 1 s); `r` in `[0, 1)`.
pub fn round_wait(failures: u32, r: f64) -> Duration {
    if failures <= 1 {
        return Duration::ZERO;
    }
    let shift = failures - 2;
    let wait = if shift < 31 {
        Duration::from_secs(1u64 << shift).min(MAX_WAIT)
    } else {
        MAX_WAIT
    };
    wait + wait.mul_f64(JITTER * r.clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_wait_0_1_2_4_s_up_to_10_minutes() {
        let waits: Vec<u64> = (1..=6).map(|n| round_wait(n, 0.0).as_secs()).collect();
        assert_eq!(waits, [0, 1, 2, 4, 8, 16]);
        assert_eq!(round_wait(11, 0.0), Duration::from_secs(512));
        assert_eq!(round_wait(12, 0.0), MAX_WAIT);
        assert_eq!(round_wait(200, 0.0), MAX_WAIT);
    }

    #[test]
    fn the_jitter_adds_up_to_a_quarter_and_never_to_the_first_wait() {
        assert_eq!(round_wait(1, 0.99), Duration::ZERO);
        assert_eq!(round_wait(3, 0.5), Duration::from_millis(2250));
        assert!(round_wait(40, 0.999) < MAX_WAIT.mul_f64(1.25));
        let mut w = Waiter::default();
        assert_eq!(w.failed(0.5), Duration::ZERO);
        assert_eq!(w.failed(0.0), Duration::from_secs(1));
        assert_eq!(w.failures(), 2);
    }
}
