//! How long a blocking read is held, as a Consul 1.20 server holds it:
//! the asked wait (0: `default_query_time`, at most `max_query_time`) plus
//! up to 1/16 of it at random. A leaf: the service queries (`blocking`)
//! and the KV reads (`kv`) both take it from here.

use std::time::Duration;

/// Consul's `default_query_time`.
pub(crate) const DEFAULT_WAIT: Duration = Duration::from_secs(300);
/// Consul's `max_query_time`.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(600);

/// The wait a query is held for: `asked` (0: the default), at most
/// [`MAX_WAIT`], plus up to 1/16 of it at random.
pub(crate) fn jittered(asked: Duration) -> Duration {
    let base = if asked.is_zero() {
        DEFAULT_WAIT
    } else {
        asked.min(MAX_WAIT)
    };
    base + (base / 16).mul_f64(fastrand::f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_are_capped_defaulted_and_jittered_by_a_sixteenth() {
        for _ in 0..200 {
            let w = jittered(Duration::from_secs(16));
            assert!(
                w >= Duration::from_secs(16) && w <= Duration::from_secs(17),
                "{w:?}"
            );
            let d = jittered(Duration::ZERO);
            assert!(d >= DEFAULT_WAIT && d <= DEFAULT_WAIT + DEFAULT_WAIT / 16);
            let m = jittered(Duration::from_secs(3600));
            assert!(m >= MAX_WAIT && m <= MAX_WAIT + MAX_WAIT / 16);
        }
    }
}
