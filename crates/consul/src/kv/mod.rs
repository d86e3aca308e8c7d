//! Watching a KV prefix as consul-template does (`--watch-kv PREFIX`): one
//! blocking recursive read after another, each at the index the last one
//! returned, through the agent's local agent. On the client wire that is
//! `KVS.List` on the agent's RPC connection ([`rpc`]); API agents and
//! `--watch http` long-poll `GET /v1/kv/PREFIX?recurse&index=&wait=`
//! ([`http`]). Either answer is reduced to a [`KvDigest`]: the result's
//! index, its key count, a hash of every key's modify index (what tells a
//! changed result from a wait that ended) and the probe key's value when
//! the result holds it (`--probe kv`).
//!
//! The rules a watcher follows between reads are here ([`next_index`],
//! [`rate_limit`]); the session state is the agent's (`agent::kv`).

pub mod http;
pub mod rpc;

use std::time::Duration;

pub use crate::modes::{
    KV_MAX_PREFIXES as MAX_PREFIXES, kv_normal_prefix as normal_prefix,
    kv_own_prefix as own_prefix, kv_probe_key as probe_key,
};

/// What a KV watch answer is reduced to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvDigest {
    /// The result's index (`X-Consul-Index`, `QueryMeta.Index`).
    pub index: u64,
    /// Keys in the result.
    pub keys: u32,
    /// A hash over every key and its modify index, in the answer's order.
    pub hash: u64,
    /// The probe key's value read as a probe id, when the result holds it.
    pub probe: Option<u64>,
}

/// Builds a [`KvDigest`] one entry at a time.
#[derive(Debug)]
pub(crate) struct DigestBuilder<'a> {
    digest: KvDigest,
    probe_key: Option<&'a str>,
}

impl<'a> DigestBuilder<'a> {
    pub(crate) fn new(index: u64, probe_key: Option<&'a str>) -> Self {
        DigestBuilder {
            digest: KvDigest {
                index,
                hash: FNV_OFFSET,
                ..KvDigest::default()
            },
            probe_key,
        }
    }

    /// One entry; `value` is read only for the probe key.
    pub(crate) fn entry(&mut self, key: &str, modify: u64, value: impl FnOnce() -> Option<u64>) {
        let d = &mut self.digest;
        d.keys = d.keys.saturating_add(1);
        d.hash = fnv(fnv(d.hash, key.as_bytes()), &modify.to_le_bytes());
        if self.probe_key == Some(key) {
            d.probe = value();
        }
    }

    pub(crate) fn finish(self) -> KvDigest {
        self.digest
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The probe's value (a probe id in decimal), or `None` for anything else.
pub fn probe_value(raw: &[u8]) -> Option<u64> {
    std::str::from_utf8(raw).ok()?.trim().parse().ok()
}

/// The index the next read asks past, after an answer at `answered` when
/// the last asked past `previous`. Matched on consul-template's view
/// (`watch/view.go`): an index lower than the last one starts over at 0.
/// And on Consul's own blocking clients (its agent cache, `cache/watch.go`;
/// the KVS endpoint answers 1 for an empty table for the same reason): an
/// index of 0 is read as 1, so that the next read blocks instead of
/// returning at once.
pub fn next_index(previous: u64, answered: u64) -> u64 {
    crate::watch::next_index(previous, answered)
}

/// consul-template's shortest time between two reads of one watch
/// (`minDelayBetweenUpdates`).
pub const MIN_BETWEEN_READS: Duration = Duration::from_millis(100);

/// How long to wait before the next read when the last one took `took`
/// (consul-template's `rateLimiter`, not applied after a view's first
/// read): a read that came back within [`MIN_BETWEEN_READS`] waits out
/// the rest, plus up to 20 ms at random; a slower one goes again at once.
pub fn rate_limit(took: Duration) -> Duration {
    match MIN_BETWEEN_READS.checked_sub(took) {
        Some(rest) if !rest.is_zero() => rest + Duration::from_micros(fastrand::u64(0..20_000)),
        _ => Duration::ZERO,
    }
}

/// consul-template's retry after a failed read (its `retry` defaults:
/// `backoff = 250ms`, doubled each time, `max_backoff = 1m`); it gives up
/// after 12 attempts, a load tool goes on at the cap.
pub fn retry_wait(failures: u32) -> Duration {
    let n = failures.saturating_sub(1).min(16);
    (Duration::from_millis(250) * (1u32 << n)).min(Duration::from_secs(60))
}

/// How long a read may stay unanswered before it counts as lost
/// (`rpc_timeout`): the server holds it `wait` plus up to `wait/16` of
/// jitter; 5 s more for the trip. A server that never answers costs a
/// watch this long, never more.
pub fn read_deadline(wait: Duration) -> Duration {
    wait + wait / 16 + Duration::from_secs(5)
}

/// Bounds `read` by `deadline`: past it the read is lost and its stream
/// or connection with it.
pub(crate) async fn bounded<S>(
    deadline: Duration,
    read: impl std::future::Future<
        Output = (Option<S>, Result<rpc::KvAnswer, crate::rpc::mux::CallError>),
    >,
) -> (Option<S>, Result<rpc::KvAnswer, crate::rpc::mux::CallError>) {
    tokio::time::timeout(deadline, read)
        .await
        .unwrap_or_else(|_| {
            let e = crate::rpc::mux::CallError::new(
                "rpc_timeout",
                format!("no answer to a KV read within {:.0?}", deadline),
            );
            (None, Err(e))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ConsulConfig, ProbeKind};

    fn check(c: &ConsulConfig) -> Result<Vec<crate::config::NamePattern>, String> {
        c.kv_prefixes().map_err(|e| e.to_string())
    }

    #[test]
    fn a_probe_key_outside_a_watched_prefix_is_refused() {
        let mut c = ConsulConfig::default();
        c.conn.name_prefix = "run".into();
        assert!(check(&c).unwrap().is_empty(), "no watch, no probe");
        c.probe.kind = Some(ProbeKind::Kv);
        let own = check(&c).unwrap();
        assert_eq!(own.len(), 1);
        assert_eq!(own[0].expand(3), "run/", "the run's own prefix by default");
        c.watch_kv = vec!["run/probe".into(), "/".into(), "/run".into()];
        assert_eq!(check(&c).unwrap().len(), 3);
        c.watch_kv = vec!["config/".into(), "run/{i%4}/".into()];
        let e = check(&c).unwrap_err();
        assert!(
            e.contains("outside every watched prefix (config/, run/{i%4}/)"),
            "{e}"
        );
        c.watch_kv.push("run/probe/".into());
        assert_eq!(check(&c).unwrap().len(), 3, "one holds it");
        c.probe.kind = None;
        assert_eq!(check(&c).unwrap()[1].expand(6), "run/2/");
        c.watch_kv = vec!["a?b".into()];
        assert!(check(&c).is_err());
        c.watch_kv = vec!["p".into(); MAX_PREFIXES + 1];
        assert!(check(&c).is_err());
    }

    #[test]
    fn an_index_that_goes_backwards_starts_over_and_zero_reads_as_one() {
        assert_eq!(next_index(0, 22), 22);
        assert_eq!(next_index(22, 24), 24);
        assert_eq!(next_index(24, 24), 24, "a wait that ended");
        assert_eq!(next_index(24, 7), 0, "backwards: from 0 again");
        assert_eq!(next_index(0, 0), 1, "zero: blocks next time");
        assert_eq!(next_index(5, 0), 0, "zero after 5 went backwards");
    }

    #[test]
    fn failed_reads_retry_as_consul_template_does() {
        let ms = Duration::from_millis;
        assert_eq!(retry_wait(1), ms(250));
        assert_eq!(retry_wait(2), ms(500));
        assert_eq!(retry_wait(5), ms(4_000));
        assert_eq!(retry_wait(9), ms(60_000));
        assert_eq!(retry_wait(1_000), ms(60_000));
    }

    #[test]
    fn quick_returns_wait_out_the_rest_of_100ms() {
        for _ in 0..100 {
            let w = rate_limit(Duration::from_millis(30));
            assert!(
                w >= Duration::from_millis(70) && w < Duration::from_millis(90),
                "{w:?}"
            );
        }
        assert_eq!(rate_limit(Duration::from_millis(100)), Duration::ZERO);
        assert_eq!(rate_limit(Duration::from_secs(300)), Duration::ZERO);
    }

    #[test]
    fn the_digest_tells_a_changed_result_and_reads_the_probe_key_only() {
        let digest = |entries: &[(&str, u64, &[u8])]| {
            let mut b = DigestBuilder::new(9, Some("run/probe/kv"));
            for (k, m, v) in entries {
                b.entry(k, *m, || probe_value(v));
            }
            b.finish()
        };
        let a = digest(&[("run/a", 3, b"x"), ("run/probe/kv", 5, b"12")]);
        assert_eq!((a.index, a.keys, a.probe), (9, 2, Some(12)));
        let same = digest(&[("run/a", 3, b"y"), ("run/probe/kv", 5, b"12")]);
        assert_eq!(a.hash, same.hash, "the modify index tells a change");
        let moved = digest(&[("run/a", 4, b"x"), ("run/probe/kv", 5, b"12")]);
        assert_ne!(a.hash, moved.hash);
        let other = digest(&[("run/a", 3, b"7")]);
        assert_eq!(other.probe, None);
        assert_eq!(probe_value(b"not a number"), None);
        assert_eq!(probe_key("agent-sim"), "agent-sim/probe/kv");
        assert_eq!(normal_prefix("/agent-sim/"), "agent-sim/");
    }
}
