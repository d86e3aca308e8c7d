//! How an agent watches its upstreams (`--watch`): streaming `Subscribe`
//! (what agents with `use_streaming_backend` do, the default), blocking
//! queries over the multiplexed RPC port (agents with streaming off:
//! [`rpc`]), or long polls of the HTTP API (consul-template, Prometheus
//! service discovery: [`http`]). A blocking watcher re-sends its query as
//! soon as the last one returns and gets the whole result each time;
//! [`digest`] reduces it to what a view compares, [`msgpack`] speaks the
//! RPC's encoding. The session loop is the agent's (`agent::watching`).

pub mod digest;
pub mod http;
pub mod msgpack;
pub mod rpc;

use std::time::Duration;

pub use crate::modes::{DEFAULT_WAIT, WatchMode};
pub use digest::{Digest, Item};

/// Consul's blocking-query rule for a result's index (its docs and its
/// agent cache): an index that went backwards restarts the loop at 0, and
/// after any answer the index is at least 1 (so the next query blocks).
pub fn next_index(previous: u64, answered: u64) -> u64 {
    if answered < previous {
        0
    } else {
        answered.max(1)
    }
}

/// Wait before the next query after `failures` failed ones in a row:
/// Consul's agent cache (`backOffWait`): none for the first 3, then 2^(n−3)
/// seconds up to a minute, plus up to as much again at random.
pub fn backoff(failures: u32) -> Duration {
    if failures <= 3 {
        return Duration::ZERO;
    }
    let wait = Duration::from_secs(1u64 << (failures - 3).min(6)).min(Duration::from_secs(60));
    wait + wait.mul_f64(fastrand::f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_that_goes_backwards_restarts_and_zero_becomes_one() {
        assert_eq!(next_index(0, 19), 19);
        assert_eq!(next_index(19, 22), 22);
        assert_eq!(next_index(22, 22), 22);
        assert_eq!(next_index(22, 5), 0);
        assert_eq!(next_index(0, 0), 1);
    }

    #[test]
    fn failures_back_off_as_consuls_agent_cache() {
        assert_eq!(backoff(3), Duration::ZERO);
        let b = backoff(4);
        assert!(
            b >= Duration::from_secs(2) && b <= Duration::from_secs(4),
            "{b:?}"
        );
        let b = backoff(20);
        assert!(
            b >= Duration::from_secs(60) && b <= Duration::from_secs(120),
            "{b:?}"
        );
    }
}
