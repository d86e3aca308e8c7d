//! What a Vault token's life writes under the storage path, and the live
//! tokens the active node renews and revokes.
//!
//! Keys follow Vault's token store and expiration manager: the token entry
//! `sys/token/id/h<salted id>`, its accessor `sys/token/accessor/<salted>`,
//! its lease `sys/expire/id/auth/token/create/h<hash>`; the children index
//! listed at revocation `sys/token/parent/<salted>/`. Values are
//! pseudo-random bytes of the sizes Vault's encrypted entries have
//! (ciphertext of the JSON entry plus the barrier's term, nonce and tag):
//! only their size matters to Consul, their content to the read-back.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Encrypted token entry (≈480 bytes of JSON + 33 of barrier overhead).
pub const TOKEN_ENTRY_BYTES: usize = 512;
/// Encrypted accessor entry.
pub const ACCESSOR_BYTES: usize = 160;
/// Encrypted lease entry (the auth with policies, metadata, times).
pub const LEASE_BYTES: usize = 720;
/// The active node's advertisement (`core/leader/<uuid>`: cluster
/// certificate and key, addresses).
pub const LEADER_BYTES: usize = 1_800;

/// The three entries of a token, as keys under the path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenKeys {
    /// `sys/token/id/h…`.
    pub entry: String,
    /// `sys/token/accessor/…`.
    pub accessor: String,
    /// `sys/expire/id/auth/token/create/h…`.
    pub lease: String,
    /// The children folder listed at revocation.
    pub children: String,
}

/// 64 hex digits derived from `id` and `salt` (a stand-in for Vault's
/// salted SHA-256 names).
fn hex64(id: u64, salt: u64) -> String {
    let mut r = fastrand::Rng::with_seed(id.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ salt);
    (0..4).map(|_| format!("{:016x}", r.u64(..))).collect()
}

/// The keys of token `id` under `path`.
pub fn keys(path: &str, id: u64) -> TokenKeys {
    let salted = hex64(id, 1);
    TokenKeys {
        entry: format!("{path}sys/token/id/h{salted}"),
        accessor: format!("{path}sys/token/accessor/{}", &hex64(id, 2)[..40]),
        lease: format!("{path}sys/expire/id/auth/token/create/h{}", hex64(id, 3)),
        children: format!("{path}sys/token/parent/{salted}/"),
    }
}

/// The bytes written for (`id`, `what`, `version`): the same triple gives
/// the same bytes, so a read-back compares without keeping them.
pub fn value(id: u64, what: u64, version: u64, len: usize) -> Vec<u8> {
    let mut r = fastrand::Rng::with_seed(id ^ (what << 56) ^ (version << 48));
    let mut v = vec![0u8; len];
    r.fill(&mut v);
    v
}

/// What a token is for [`value`].
pub mod what {
    /// The token entry.
    pub const ENTRY: u64 = 1;
    /// The accessor.
    pub const ACCESSOR: u64 = 2;
    /// The lease.
    pub const LEASE: u64 = 3;
}

/// A live token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Live {
    /// Its number.
    pub id: u64,
    /// When its create finished.
    pub created: Instant,
    /// Renewed already.
    pub renewed: bool,
}

/// The live tokens, oldest first (one TTL for all: creation order is
/// expiry order). Shared by the nodes: a node that becomes active takes
/// over the leases, as Vault's restore does from storage.
#[derive(Debug, Default)]
pub struct Registry {
    live: Mutex<Queue>,
}

/// The queue and how many at its front are renewed already (renewals go
/// in creation order: a prefix), so a tick does not walk them again.
#[derive(Debug, Default)]
struct Queue {
    queue: VecDeque<Live>,
    renewed: usize,
}

/// What is due now.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Due {
    /// Tokens to renew.
    pub renew: Vec<u64>,
    /// Tokens to revoke.
    pub revoke: Vec<u64>,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A token created at `now`.
    pub fn add(&self, id: u64, now: Instant) {
        self.lock().queue.push_back(Live {
            id,
            created: now,
            renewed: false,
        });
    }

    /// Takes the tokens due for revocation (past `ttl`) and marks those
    /// due for renewal (past `ttl / 2`), at most `max` of each.
    pub fn due(&self, now: Instant, ttl: Duration, max: usize) -> Due {
        let mut live = self.lock();
        let mut due = Due::default();
        while let Some(t) = live.queue.front() {
            if now < t.created + ttl || due.revoke.len() >= max {
                break;
            }
            due.revoke.push(t.id);
            live.queue.pop_front();
            live.renewed = live.renewed.saturating_sub(1);
        }
        let from = live.renewed;
        let mut taken = 0;
        for t in live.queue.iter_mut().skip(from) {
            if now < t.created + ttl / 2 || due.renew.len() >= max {
                break;
            }
            if !t.renewed {
                t.renewed = true;
                due.renew.push(t.id);
            }
            taken += 1;
        }
        live.renewed += taken;
        due
    }

    /// Every live token (a restore's list).
    pub fn ids(&self) -> Vec<u64> {
        self.lock().queue.iter().map(|t| t.id).collect()
    }

    /// How many are live.
    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stable_and_under_the_path() {
        let a = keys("p/vault/", 7);
        assert_eq!(a, keys("p/vault/", 7));
        assert_ne!(a.entry, keys("p/vault/", 8).entry);
        assert!(a.entry.starts_with("p/vault/sys/token/id/h"));
        assert_eq!(a.entry.len(), "p/vault/sys/token/id/h".len() + 64);
        assert!(
            a.lease
                .starts_with("p/vault/sys/expire/id/auth/token/create/h")
        );
        assert!(a.children.ends_with('/'));
    }

    #[test]
    fn values_repeat_for_the_same_version_only() {
        assert_eq!(value(1, what::ENTRY, 0, 32), value(1, what::ENTRY, 0, 32));
        assert_ne!(value(1, what::ENTRY, 0, 32), value(1, what::ENTRY, 1, 32));
        assert_eq!(value(1, what::LEASE, 0, LEASE_BYTES).len(), LEASE_BYTES);
    }

    #[tokio::test(start_paused = true)]
    async fn tokens_come_due_for_renewal_then_revocation() {
        let r = Registry::default();
        let t0 = Instant::now();
        let ttl = Duration::from_secs(60);
        r.add(1, t0);
        r.add(2, t0 + Duration::from_secs(10));
        assert_eq!(r.due(t0 + Duration::from_secs(29), ttl, 10), Due::default());
        let d = r.due(t0 + Duration::from_secs(30), ttl, 10);
        assert_eq!(d.renew, vec![1]);
        let d = r.due(t0 + Duration::from_secs(60), ttl, 10);
        assert_eq!((d.renew, d.revoke), (vec![2], vec![1]));
        assert_eq!(r.ids(), vec![2]);
    }
}
