//! What a Vault token's life writes under the storage path, and the live
//! tokens the active node renews and revokes.
//!
//! Keys follow Vault's token store and expiration manager, as a real Vault
//! 1.18.3 on Consul 1.20.1 wrote them (captured, docs/writes.md): the
//! accessor `sys/token/accessor/<40 hex>`, the parent's index entry
//! `sys/token/parent/h<parent>/h<token>`, the token entry
//! `sys/token/id/h<token>`, the lease `sys/expire/id/auth/token/create/h…`;
//! at revocation the token's children `sys/token/parent/h<token>/`, its
//! cubbyhole `logical/<mount uuid>/<storage id>/` and its leases
//! `sys/expire/token/h<token>/` are listed. Values are pseudo-random bytes
//! of the sizes the captured encrypted entries had: only their size
//! matters to Consul, their content to the read-back.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Encrypted token entry (574 bytes captured).
pub const TOKEN_ENTRY_BYTES: usize = 574;
/// Encrypted accessor entry (140 bytes captured).
pub const ACCESSOR_BYTES: usize = 140;
/// The parent's index entry (33 bytes captured).
pub const PARENT_BYTES: usize = 33;
/// Encrypted lease entry: the auth with policies, metadata, times (1,040
/// bytes captured).
pub const LEASE_BYTES: usize = 1_040;
/// The active node's advertisement (`core/leader/<uuid>`: cluster
/// certificate and key, addresses).
pub const LEADER_BYTES: usize = 1_800;

/// The four entries of a token and the three folders its revocation
/// lists, as keys under the path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenKeys {
    /// `sys/token/id/h…`.
    pub entry: String,
    /// `sys/token/accessor/…`.
    pub accessor: String,
    /// `sys/token/parent/h<parent>/h<token>` (the root token is the parent).
    pub parent: String,
    /// `sys/expire/id/auth/token/create/h…`.
    pub lease: String,
    /// The folders listed at revocation: children, cubbyhole, leases.
    pub listed: [String; 3],
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
        parent: format!("{path}sys/token/parent/h{}/h{salted}", hex64(0, 4)),
        lease: format!("{path}sys/expire/id/auth/token/create/h{}", hex64(id, 3)),
        listed: [
            format!("{path}sys/token/parent/h{salted}/"),
            format!(
                "{path}logical/{}/{}/",
                &hex64(0, 5)[..32],
                &hex64(id, 6)[..24]
            ),
            format!("{path}sys/expire/token/h{salted}/"),
        ],
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
    /// The parent's index entry.
    pub const PARENT: u64 = 4;
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
        assert!(
            a.listed
                .iter()
                .all(|f| f.starts_with("p/vault/") && f.ends_with('/'))
        );
        // The parent index entry sits in the root token's children folder,
        // named by this token's salted id, as the entry is.
        let salted = &a.entry["p/vault/sys/token/id/h".len()..];
        assert!(a.parent.ends_with(&format!("/h{salted}")));
        assert_eq!(a.listed[0], format!("p/vault/sys/token/parent/h{salted}/"));
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
