//! Consul's pacing of proxy updates, shared by every Delta ADS stream of a
//! server (one [`Pacer`] per gRPC listener: the servers of a cluster share
//! a state, each paces its own streams).

use std::time::Duration;

use tokio::time::Instant;

/// Consul's pacing of proxy updates (`proxycfg.Manager`'s rate limiter,
/// `xds.update_max_per_second`): ONE token bucket for the whole server,
/// burst 1, refilled at `rate` per second. Each proxy update reserves a
/// token when it is scheduled and waits `max(token delay, coalesce)`, so
/// an endpoint change that reaches N proxies at once is delivered to them
/// over `N / rate` seconds (200 sidecars at 250/s: from 200 ms to ≈ 800 ms,
/// p50 ≈ 400 ms, as a real Consul 1.20 server does).
#[derive(Debug)]
pub(crate) struct Pacer {
    /// Tokens per second (`0`, negative or not finite: no limit).
    rate: f64,
    /// Tokens in the bucket at `last` (≤ 1; negative: reserved ahead).
    tokens: f64,
    last: Option<Instant>,
}

impl Pacer {
    pub(crate) fn new(rate: f64) -> Pacer {
        Pacer {
            rate,
            tokens: 1.0,
            last: None,
        }
    }

    /// Reserves one token at `now`: how long until it is there (golang's
    /// `rate.Limiter.Reserve().Delay()` with burst 1).
    pub(crate) fn reserve(&mut self, now: Instant) -> Duration {
        if !(self.rate.is_finite() && self.rate > 0.0) {
            return Duration::ZERO;
        }
        let elapsed = self
            .last
            .map_or(Duration::ZERO, |l| now.saturating_duration_since(l));
        self.tokens = (self.tokens + elapsed.as_secs_f64() * self.rate).min(1.0);
        self.last = Some(now);
        self.tokens -= 1.0;
        if self.tokens < 0.0 {
            Duration::from_secs_f64(-self.tokens / self.rate)
        } else {
            Duration::ZERO
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_pacer_spaces_reservations_by_one_over_the_rate() {
        let mut p = Pacer::new(250.0);
        let t0 = Instant::now();
        let delays: Vec<Duration> = (0..4).map(|_| p.reserve(t0)).collect();
        let ms = |n| Duration::from_millis(n);
        assert_eq!(delays, vec![ms(0), ms(4), ms(8), ms(12)]);
        // The bucket refills at the rate, to one token at most.
        let later = t0 + Duration::from_secs(1);
        assert_eq!(p.reserve(later), Duration::ZERO);
        assert_eq!(p.reserve(later), ms(4));
        let mut off = Pacer::new(0.0);
        assert_eq!(off.reserve(t0), Duration::ZERO);
        assert_eq!(off.reserve(t0), Duration::ZERO);
    }

    #[test]
    fn n_updates_at_once_take_n_over_the_rate_and_no_rate_is_no_limit() {
        let t0 = Instant::now();
        let mut p = Pacer::new(50.0);
        let last = (0..100).map(|_| p.reserve(t0)).last().unwrap();
        assert_eq!(last, Duration::from_secs_f64(99.0 / 50.0));
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let mut p = Pacer::new(rate);
            assert!((0..1000).all(|_| p.reserve(t0).is_zero()), "{rate}");
        }
    }
}
