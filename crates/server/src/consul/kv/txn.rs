//! KV operations inside a transaction, shared by `/v1/txn` and the RPC
//! port's `Txn.Apply` / `Txn.Read`: the checks made before anything is
//! applied (`kvsPreApply`: the verb, the key, the lock-delay), and the ops
//! applied in order at one raft index, every failing op listed in the
//! state store's words and nothing kept when one fails (`txnKVS`).

use bytes::Bytes;
use tokio::time::Instant;

use super::{DirEntry, Error, KvRequest, KvStore, Verb, apply};
use crate::consul::ConsulState;
use crate::consul::sessions::Sessions;

/// A failed op: its index in the txn and why (Consul's words).
pub(crate) type OpError = (usize, Error);

/// `kvsPreApply`'s checks of one op named `verb_name` that need no store:
/// the verb known, a key given (but to `delete-tree`).
pub(crate) fn check(verb_name: &str, req: &KvRequest) -> Result<Verb, Error> {
    let Some(verb) = Verb::parse(verb_name) else {
        return Err(Error::UnknownOp(verb_name.to_owned()));
    };
    if req.key.is_empty() && verb != Verb::DeleteTree {
        return Err(Error::NoKey);
    }
    Ok(verb)
}

/// `kvsPreApply`'s lock-delay check: a lock within its key's lock-delay
/// fails before anything is applied.
pub(crate) fn delayed(kv: &KvStore, verb: Verb, req: &KvRequest, now: Instant) -> Option<Error> {
    (verb == Verb::Lock && kv.lock_delayed(&req.key, now))
        .then(|| Error::LockDelayed(req.key.clone()))
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
) -> Result<Vec<DirEntry>, Error> {
    let c = &state.inner.counters;
    c.bump(if verb.is_write() {
        &c.kv_writes
    } else {
        &c.kv_reads
    });
    let applied = apply(kv, sessions, idx, verb, req)?;
    if !applied.ok {
        let key = req.key.clone();
        return Err(match verb {
            Verb::Cas => Error::StaleSet(key),
            Verb::DeleteCas => Error::StaleDelete(key),
            Verb::Lock => {
                c.bump(&c.kv_lock_refused);
                Error::LockHeld(key)
            }
            _ => Error::NotHeld(key),
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
