//! KV operations inside a transaction, shared by `/v1/txn` and the RPC
//! port's `Txn.Apply` / `Txn.Read`: the checks made before anything is
//! applied (`kvsPreApply`: the verb, the key, the lock-delay), and the ops
//! applied in order at one raft index, every failing op listed in the
//! state store's words and nothing kept when one fails (`txnKVS`).

use bytes::Bytes;
use tokio::time::Instant;

use super::{DirEntry, KvRequest, KvStore, Verb, apply};
use crate::consul::ConsulState;
use crate::consul::sessions::Sessions;

/// A failed op: its index in the txn and Consul's words.
pub(crate) type OpError = (usize, String);

/// `kvsPreApply`'s checks of one op named `verb_name` that need no store:
/// the verb known, a key given (but to `delete-tree`).
pub(crate) fn check(verb_name: &str, req: &KvRequest) -> Result<Verb, String> {
    let Some(verb) = Verb::parse(verb_name) else {
        return Err(format!("unknown KV operation: {verb_name}"));
    };
    if req.key.is_empty() && verb != Verb::DeleteTree {
        return Err("Must provide key".into());
    }
    Ok(verb)
}

/// `kvsPreApply`'s lock-delay check: a lock within its key's lock-delay
/// fails before anything is applied.
pub(crate) fn delayed(kv: &KvStore, verb: Verb, req: &KvRequest, now: Instant) -> Option<String> {
    (verb == Verb::Lock && kv.lock_delayed(&req.key, now))
        .then(|| format!("failed to lock key {:?} due to lock delay", req.key))
}

/// Applies the txn's KV ops (`(op index, verb, request)`) at `idx`: the
/// entries each lists, by op index (a write's without its value), or
/// every failing op (then nothing is kept). Counts reads, writes and
/// locks; wakes the readers of what changed.
pub(crate) fn apply_all<'a>(
    state: &ConsulState,
    kv: &mut KvStore,
    sessions: &Sessions,
    idx: u64,
    ops: impl Iterator<Item = (usize, Verb, &'a KvRequest)>,
) -> Result<Vec<(usize, DirEntry)>, Vec<OpError>> {
    kv.begin();
    let mut results = Vec::new();
    let mut errors = Vec::new();
    for (i, verb, req) in ops {
        match one(state, kv, sessions, idx, verb, req) {
            Ok(entries) => results.extend(entries.into_iter().map(|e| (i, e))),
            Err(what) => errors.push((i, what)),
        }
    }
    if errors.is_empty() {
        kv.keep();
    } else {
        kv.rollback();
    }
    kv.notify();
    if errors.is_empty() {
        Ok(results)
    } else {
        Err(errors)
    }
}

/// One op: the entries it lists, or its error in `txnKVS`'s words.
fn one(
    state: &ConsulState,
    kv: &mut KvStore,
    sessions: &Sessions,
    idx: u64,
    verb: Verb,
    req: &KvRequest,
) -> Result<Vec<DirEntry>, String> {
    let c = &state.inner.counters;
    c.bump(if verb.is_write() {
        &c.kv_writes
    } else {
        &c.kv_reads
    });
    let applied = apply(kv, sessions, idx, verb, req)?;
    if !applied.ok {
        return Err(match verb {
            Verb::Cas => format!("failed to set key {:?}, index is stale", req.key),
            Verb::DeleteCas => format!("failed to delete key {:?}, index is stale", req.key),
            Verb::Lock => {
                c.bump(&c.kv_lock_refused);
                format!("failed to lock key {:?}, lock is already held", req.key)
            }
            _ => format!(
                "failed to unlock key {:?}, lock isn't held, or is held by another session",
                req.key
            ),
        });
    }
    if verb == Verb::Lock {
        c.bump(&c.kv_lock_acquires);
    }
    let with_value = matches!(verb, Verb::Get | Verb::GetOrEmpty | Verb::GetTree);
    Ok(applied
        .entries
        .into_iter()
        .map(|mut e| {
            if !with_value {
                e.value = Bytes::new();
            }
            e
        })
        .collect())
}
