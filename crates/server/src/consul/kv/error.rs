//! Why a KV operation failed, each cause its own variant; the Display is
//! the state store's words as a Consul 1.20 server sends them (a txn's
//! `What`, `KVS.Apply`'s error answer, `/v1/kv`'s 500 body), byte for byte:
//! the tests compare them to a real server's.

use super::store::KV_FULL;

/// A KV operation's failure, in Consul's words (`state/kvs.go`,
/// `state/txn.go`, `kvsPreApply`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Error {
    /// A write would add a key past this server's bound.
    #[error("{}", KV_FULL)]
    Full,
    /// A lock or unlock named no session.
    #[error("missing session")]
    MissingSession,
    /// A lock named a session that does not exist.
    #[error("invalid session {0:?}")]
    InvalidSession(String),
    /// A `get` of a key that does not exist.
    #[error("key {0:?} doesn't exist")]
    NoSuchKey(String),
    /// A `check-session` of a key that does not exist.
    #[error("failed to check session, key {0:?} doesn't exist")]
    CheckSessionNoKey(String),
    /// A `check-session` whose session is not the key's.
    #[error("failed session check for key {key:?}, current session {current:?} != {asked:?}")]
    SessionMismatch {
        /// The key checked.
        key: String,
        /// The key's session.
        current: String,
        /// The session the op named.
        asked: String,
    },
    /// A `check-index` of a key that does not exist.
    #[error("failed to check index, key {0:?} doesn't exist")]
    CheckIndexNoKey(String),
    /// A `check-index` whose index is not the key's.
    #[error("failed index check for key {key:?}, current modify index {current} != {asked}")]
    IndexMismatch {
        /// The key checked.
        key: String,
        /// The key's modify index.
        current: u64,
        /// The index the op named.
        asked: u64,
    },
    /// A `check-not-exists` of a key that exists.
    #[error("key {0:?} exists")]
    KeyExists(String),
    /// A verb Consul does not know.
    #[error("unknown KV operation: {0}")]
    UnknownOp(String),
    /// An op without a key (but `delete-tree`).
    #[error("Must provide key")]
    NoKey,
    /// A lock within its key's lock-delay.
    #[error("failed to lock key {0:?} due to lock delay")]
    LockDelayed(String),
    /// A txn's `cas` whose index is stale.
    #[error("failed to set key {0:?}, index is stale")]
    StaleSet(String),
    /// A txn's `delete-cas` whose index is stale.
    #[error("failed to delete key {0:?}, index is stale")]
    StaleDelete(String),
    /// A txn's `lock` of a key another session holds.
    #[error("failed to lock key {0:?}, lock is already held")]
    LockHeld(String),
    /// A txn's `unlock` of a key its session does not hold.
    #[error("failed to unlock key {0:?}, lock isn't held, or is held by another session")]
    NotHeld(String),
    /// A write op (its verb) in a `Txn.Read`.
    #[error("{0} in a read-only transaction")]
    ReadOnly(String),
    /// A non-KV op in a txn over RPC (this server's own words: it serves
    /// only KV ops there).
    #[error("agent-sim serve: only KV operations are served in a txn over RPC")]
    NotKv,
}
