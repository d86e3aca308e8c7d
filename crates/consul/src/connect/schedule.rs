//! When a client agent signs a leaf again, by Consul 1.20's `leafcert`
//! rules (random draws passed in, so the rules are tested on numbers):
//!
//! - renewal: a random time between 60 % and 90 % of the certificate's
//!   life (from now when the 60 % mark has passed; at once past 90 %, or
//!   for a life under 10 minutes);
//! - a root rotation: the active root's signing key is not the one that
//!   signed the leaf, so sign again within a random 30 s (sooner if the
//!   renewal was due sooner);
//! - the servers' rate-limit answer to a first certificate is an error of
//!   the watch: retried at once three times, then after 2^(n-3) s (at most
//!   a minute) plus up to as much again;
//! - to a renewal, not an error: the next try `n` rate-limited answers on
//!   is due `(n + 1)` random 30 s windows after the rotation (or the first
//!   refusal) started.

use std::time::Duration;

/// The window a rotation's re-signs spread over (`caChangeJitterWindow`).
pub const ROTATION_WINDOW: Duration = Duration::from_secs(30);
/// Failures of a watch retried at once (`LeafCertRefreshBackoffMin`).
pub const BACKOFF_MIN: u32 = 3;
/// Longest back-off of a failing watch (`LeafCertRefreshMaxWait`).
pub const BACKOFF_MAX: Duration = Duration::from_secs(60);

/// How long after its `failures`-th failure in a row a watch tries again;
/// `r` a random draw in `[0, 1)`.
pub fn backoff_wait(failures: u32, r: f64) -> Duration {
    if failures <= BACKOFF_MIN {
        return Duration::ZERO;
    }
    let shift = failures - BACKOFF_MIN;
    let wait = if shift < 31 {
        Duration::from_secs(1u64 << shift).min(BACKOFF_MAX)
    } else {
        BACKOFF_MAX
    };
    wait + wait.mul_f64(r)
}

/// A random delay within the rotation window; `r` in `[0, 1)`.
pub fn rotation_delay(r: f64) -> Duration {
    ROTATION_WINDOW.mul_f64(r)
}

/// How long from `now` until a certificate valid from `after` to `before`
/// (all Unix seconds) is renewed; `r` in `[0, 1)`.
pub fn renew_in(after: i64, before: i64, now: i64, r: f64) -> Duration {
    let life = before - after;
    if life < 600 {
        return Duration::ZERO;
    }
    let soft = after as f64 + life as f64 * 0.6;
    let hard = after as f64 + life as f64 * 0.9;
    let now_f = now as f64;
    if now_f >= hard {
        return Duration::ZERO;
    }
    let low = soft.max(now_f);
    let at = low + (hard - low) * r;
    Duration::from_secs_f64((at - now_f).max(0.0))
}

/// After the `n`-th rate-limited answer in a row to a renewal, how long
/// from the start of the rotation (or of the first refusal) the next try
/// is due: `(n + 1)` windows of one random delay (`r` in `[0, 1)`).
pub fn rate_limited_retry(n: u32, r: f64) -> Duration {
    rotation_delay(r) * (n + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_falls_between_60_and_90_percent_of_the_life() {
        let day = 86_400;
        // Issued now for 72 h: between 43.2 h and 64.8 h.
        assert_eq!(renew_in(0, 3 * day, 0, 0.0), Duration::from_secs(155_520));
        assert_eq!(renew_in(0, 3 * day, 0, 1.0), Duration::from_secs(233_280));
        // Inside the window: from now on.
        assert_eq!(renew_in(0, 100_000, 70_000, 0.0), Duration::ZERO);
        assert_eq!(
            renew_in(0, 100_000, 70_000, 0.5),
            Duration::from_secs(10_000)
        );
        // Past 90 %, or a life under 10 minutes: at once.
        assert_eq!(renew_in(0, 100_000, 95_000, 0.5), Duration::ZERO);
        assert_eq!(renew_in(0, 500, 0, 0.5), Duration::ZERO);
    }

    #[test]
    fn a_failing_watch_backs_off_after_three_tries() {
        for n in 0..=3 {
            assert_eq!(backoff_wait(n, 0.9), Duration::ZERO);
        }
        assert_eq!(backoff_wait(4, 0.0), Duration::from_secs(2));
        assert_eq!(backoff_wait(5, 0.5), Duration::from_secs(6));
        assert_eq!(backoff_wait(9, 0.0), Duration::from_secs(60));
        assert_eq!(backoff_wait(60, 1.0), Duration::from_secs(120));
    }

    #[test]
    fn rate_limited_renewals_move_one_window_further_each_time() {
        assert_eq!(rate_limited_retry(1, 0.5), Duration::from_secs(30));
        assert_eq!(rate_limited_retry(3, 0.5), Duration::from_secs(60));
        assert!(rotation_delay(0.999) < ROTATION_WINDOW);
    }
}
