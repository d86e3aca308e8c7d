//! Consul's KV store as a 1.20 server applies it: the verbs of
//! `KVS.Apply` and of `/v1/txn` KV operations ([`Verb`], [`apply`]), locks
//! held by sessions with their lock-delay, the release or deletion of a
//! session's keys when it is invalidated ([`invalidate`]), and blocking
//! reads held until the key's or prefix's index passes the caller's
//! ([`wait`]).
//!
//! Parts: `store` (the table, tombstones, lock-delays, watchers), `txn`
//! (KV ops in a transaction), `rpc` (`KVS.Get`, `KVS.List`,
//! `KVS.ListKeys`, `KVS.Apply`, `Txn.Apply`, `Txn.Read` on the RPC port),
//! `faults` (`consul.kv`). The HTTP API is `http::kv`, its txn ops
//! `http::txn_kv`. Errors keep
//! Consul's words (`agent/consul/state/kvs.go`, `state/txn.go`).

mod error;
mod faults;
mod store;
pub(crate) mod txn;

use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub(crate) use error::Error;
pub(crate) use store::{DirEntry, KvStore};

use super::sessions::{Session, Sessions};
use super::timing::Timed;
use super::wait;
use super::{ConsulState, Gauge};

/// Consul's default `limits.kv_max_value_size` (raft's suggested largest
/// entry, 512 KiB).
pub const KV_MAX_VALUE_SIZE: usize = 512 * 1024;

/// A KV operation (`api.KVOp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verb {
    Set,
    Cas,
    Lock,
    Unlock,
    Delete,
    DeleteCas,
    DeleteTree,
    Get,
    GetOrEmpty,
    GetTree,
    CheckSession,
    CheckIndex,
    CheckNotExists,
}

impl Verb {
    pub(crate) fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "set" => Self::Set,
            "cas" => Self::Cas,
            "lock" => Self::Lock,
            "unlock" => Self::Unlock,
            "delete" => Self::Delete,
            "delete-cas" => Self::DeleteCas,
            "delete-tree" => Self::DeleteTree,
            "get" => Self::Get,
            "get-or-empty" => Self::GetOrEmpty,
            "get-tree" => Self::GetTree,
            "check-session" => Self::CheckSession,
            "check-index" => Self::CheckIndex,
            "check-not-exists" => Self::CheckNotExists,
            _ => return None,
        })
    }

    /// Whether the op changes the store (a txn of reads only is not a
    /// raft write).
    pub(crate) fn is_write(self) -> bool {
        matches!(
            self,
            Self::Set
                | Self::Cas
                | Self::Lock
                | Self::Unlock
                | Self::Delete
                | Self::DeleteCas
                | Self::DeleteTree
        )
    }
}

/// One KV operation's arguments (`structs.DirEntry` as a request carries
/// it; `index` is the `ModifyIndex` a CAS compares).
#[derive(Clone, Debug, Default)]
pub(crate) struct KvRequest {
    pub key: String,
    pub flags: u64,
    pub value: Bytes,
    pub session: String,
    pub index: u64,
}

/// What one applied op gives: whether it did what it asked (`false`: a
/// CAS or lock that lost), and the entries a txn lists for it.
pub(crate) struct Applied {
    pub ok: bool,
    pub entries: Vec<DirEntry>,
}

impl Applied {
    fn done(ok: bool) -> Self {
        Self {
            ok,
            entries: Vec::new(),
        }
    }
}

/// The entry a write of `req` stores, indexes and session not yet set.
fn entry_of(req: &KvRequest) -> DirEntry {
    DirEntry {
        key: req.key.clone(),
        flags: req.flags,
        value: req.value.clone(),
        ..DirEntry::default()
    }
}

/// `kvsSetTxn`: writes the entry; the session is kept unless `session`
/// says otherwise; nothing changes when the entry is equal to the stored
/// one. Returns the entry as stored.
fn set(
    kv: &mut KvStore,
    idx: u64,
    mut e: DirEntry,
    session: Option<&str>,
) -> Result<DirEntry, Error> {
    let existing = kv.get(&e.key).cloned();
    e.create_index = existing.as_ref().map_or(idx, |x| x.create_index);
    e.session = match session {
        Some(s) => s.to_owned(),
        None => existing
            .as_ref()
            .map(|x| x.session.clone())
            .unwrap_or_default(),
    };
    if let Some(x) = &existing {
        let same = x.lock_index == e.lock_index
            && x.flags == e.flags
            && x.value == e.value
            && x.session == e.session;
        if same {
            e.modify_index = x.modify_index;
            return Ok(e);
        }
    }
    if !kv.room_for(&e.key, e.value.len()) {
        return Err(Error::Full);
    }
    e.modify_index = idx;
    let key = e.key.clone();
    kv.put(&key, Some(e.clone()), idx);
    Ok(e)
}

/// `kvsDeleteTxn`: removes the key and leaves a tombstone.
fn delete(kv: &mut KvStore, idx: u64, key: &str) {
    if kv.get(key).is_some() {
        kv.bury(key, idx);
        kv.put(key, None, idx);
    }
}

/// `kvsLockTxn`.
fn lock(
    kv: &mut KvStore,
    sessions: &Sessions,
    idx: u64,
    req: &KvRequest,
) -> Result<Option<DirEntry>, Error> {
    if req.session.is_empty() {
        return Err(Error::MissingSession);
    }
    if sessions.get(&req.session).is_none() {
        return Err(Error::InvalidSession(req.session.clone()));
    }
    let mut e = entry_of(req);
    match kv.get(&req.key) {
        Some(x) if x.session == req.session => {
            e.lock_index = x.lock_index;
        }
        Some(x) if !x.session.is_empty() => return Ok(None),
        Some(x) => e.lock_index = x.lock_index + 1,
        None => e.lock_index = 1,
    }
    set(kv, idx, e, Some(&req.session)).map(Some)
}

/// `kvsUnlockTxn`.
fn unlock(kv: &mut KvStore, idx: u64, req: &KvRequest) -> Result<Option<DirEntry>, Error> {
    if req.session.is_empty() {
        return Err(Error::MissingSession);
    }
    let Some(x) = kv.get(&req.key) else {
        return Ok(None);
    };
    if x.session != req.session {
        return Ok(None);
    }
    let mut e = entry_of(req);
    e.lock_index = x.lock_index;
    set(kv, idx, e, Some("")).map(Some)
}

/// Applies one op at raft index `idx`, as the state store does inside a
/// transaction: reads see the writes of earlier ops. An `Err` is the op's
/// error in Consul's words (a txn lists it; `KVS.Apply` answers it).
pub(crate) fn apply(
    kv: &mut KvStore,
    sessions: &Sessions,
    idx: u64,
    verb: Verb,
    req: &KvRequest,
) -> Result<Applied, Error> {
    let key = req.key.as_str();
    let one = |e: DirEntry| Applied {
        ok: true,
        entries: vec![e],
    };
    Ok(match verb {
        Verb::Set => one(set(kv, idx, entry_of(req), None)?),
        Verb::Cas => {
            let current = kv.get(key).map(|e| e.modify_index);
            let fits = match (req.index, current) {
                (0, None) => true,
                (i, Some(m)) => i != 0 && i == m,
                _ => false,
            };
            if !fits {
                return Ok(Applied::done(false));
            }
            one(set(kv, idx, entry_of(req), None)?)
        }
        Verb::Lock => match lock(kv, sessions, idx, req)? {
            Some(e) => one(e),
            None => Applied::done(false),
        },
        Verb::Unlock => match unlock(kv, idx, req)? {
            Some(e) => one(e),
            None => Applied::done(false),
        },
        Verb::Delete => {
            delete(kv, idx, key);
            Applied::done(true)
        }
        Verb::DeleteCas => match kv.get(key) {
            None => Applied::done(true),
            Some(e) if e.modify_index != req.index => Applied::done(false),
            Some(_) => {
                delete(kv, idx, key);
                Applied::done(true)
            }
        },
        Verb::DeleteTree => {
            if kv.delete_prefix(key, idx) && !key.is_empty() {
                kv.bury(key, idx);
            }
            Applied::done(true)
        }
        Verb::Get => match kv.get(key) {
            Some(e) => one(e.clone()),
            None => return Err(Error::NoSuchKey(key.to_owned())),
        },
        Verb::GetOrEmpty => one(kv.get(key).cloned().unwrap_or_else(|| DirEntry {
            value: Bytes::new(),
            ..entry_of(req)
        })),
        Verb::GetTree => Applied {
            ok: true,
            entries: kv.range(key).cloned().collect(),
        },
        Verb::CheckSession => match kv.get(key) {
            None => return Err(Error::CheckSessionNoKey(key.to_owned())),
            Some(e) if e.session != req.session => {
                return Err(Error::SessionMismatch {
                    key: key.to_owned(),
                    current: e.session.clone(),
                    asked: req.session.clone(),
                });
            }
            Some(e) => one(e.clone()),
        },
        Verb::CheckIndex => match kv.get(key) {
            None => return Err(Error::CheckIndexNoKey(key.to_owned())),
            Some(e) if e.modify_index != req.index => {
                return Err(Error::IndexMismatch {
                    key: key.to_owned(),
                    current: e.modify_index,
                    asked: req.index,
                });
            }
            Some(e) => one(e.clone()),
        },
        Verb::CheckNotExists => match kv.get(key) {
            Some(_) => return Err(Error::KeyExists(key.to_owned())),
            None => Applied::done(true),
        },
    })
}

/// The session is gone (destroyed, expired, or its node deregistered) at
/// raft index `idx`: its keys are released (behavior `release`: no
/// session, same lock index) or deleted (`delete`), each under a
/// lock-delay of the session's `LockDelay` (at most 60 s).
pub(crate) fn invalidate(kv: &mut KvStore, idx: u64, s: &Session, now: Instant) {
    let delay = Duration::from_nanos(s.lock_delay);
    for key in kv.held_by(&s.id) {
        if s.behavior == "delete" {
            delete(kv, idx, &key);
        } else if let Some(mut e) = kv.get(&key).cloned() {
            e.session.clear();
            e.modify_index = idx;
            kv.put(&key, Some(e), idx);
        }
        kv.delay_lock(&key, now, delay);
    }
}

impl ConsulState {
    /// Counts a KV read.
    pub(crate) fn kv_read(&self) {
        let c = &self.inner.counters;
        c.bump(&c.kv_reads);
    }

    /// `KVS.Apply` of one write: refused (`false`, no raft write) when a
    /// lock is asked within the key's lock-delay; otherwise applied at the
    /// next raft index (a CAS or lock that loses still takes one).
    pub(crate) fn kv_apply(&self, verb: Verb, r: &KvRequest) -> Result<bool, Error> {
        let started = std::time::Instant::now();
        let answer = self.kv_apply_untimed(verb, r);
        self.timed(Timed::KvsApply, started);
        answer
    }

    fn kv_apply_untimed(&self, verb: Verb, r: &KvRequest) -> Result<bool, Error> {
        let c = &self.inner.counters;
        let mut store = self.store();
        if verb == Verb::Lock && store.kv.lock_delayed(&r.key, Instant::now()) {
            c.bump(&c.kv_lock_refused);
            return Ok(false);
        }
        let idx = store.next_index();
        if verb == Verb::Lock && !r.session.is_empty() && self.kv_lock_stuck(&r.key) {
            self.take_for_good(&mut store.kv, idx, &r.key);
            store.kv.notify();
            c.bump(&c.kv_writes);
            c.bump(&c.kv_lock_refused);
            return Ok(false);
        }
        let sessions = self.sessions();
        let applied = apply(&mut store.kv, &sessions, idx, verb, r);
        drop(sessions);
        store.kv.notify();
        drop(store);
        c.bump(&c.kv_writes);
        let ok = applied?.ok;
        if verb == Verb::Lock {
            c.bump(if ok {
                &c.kv_lock_acquires
            } else {
                &c.kv_lock_refused
            });
        }
        Ok(ok)
    }
}

/// What a blocking KV read waits on.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Query<'a> {
    /// One key (`KVS.Get`).
    Key(&'a str),
    /// A prefix (`KVS.List`, `KVS.ListKeys`).
    Prefix(&'a str),
}

impl Query<'_> {
    fn prefix(&self) -> &str {
        match self {
            Query::Key(k) | Query::Prefix(k) => k,
        }
    }

    /// The index the read answers with, and whether a key read found it.
    fn index(&self, kv: &KvStore) -> (u64, bool) {
        match self {
            Query::Key(k) => {
                let (i, e) = kv.get_index(k);
                (i, e.is_some())
            }
            Query::Prefix(p) => (kv.list_index(p), true),
        }
    }
}

/// Holds a blocking KV read as a 1.20 server's blocking query does: until
/// the answer's index passes `min` (a key that stays absent moves `min`
/// up to the table's index, so unrelated writes do not wake it), or the
/// jittered `wait` ends, or `shutdown`. `min` 0: at once.
pub(crate) async fn wait(
    state: &ConsulState,
    q: Query<'_>,
    mut min: u64,
    wait: Duration,
    shutdown: Option<&CancellationToken>,
) {
    if min == 0 {
        return;
    }
    let _held = Gauge::up(state, |c| &c.blocking_queries_held);
    let deadline = Instant::now() + wait::jittered(wait);
    let mut absent_before = false;
    loop {
        let mut rx = {
            let mut store = state.store();
            let (index, found) = q.index(&store.kv);
            if !found {
                if absent_before {
                    min = min.max(index);
                }
                absent_before = true;
            }
            if index.max(1) > min {
                return;
            }
            match store.kv.watch(q.prefix()) {
                Some(rx) => rx,
                None => return,
            }
        };
        rx.mark_unchanged();
        let stop = async {
            match shutdown {
                Some(s) => s.cancelled().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = rx.changed() => if r.is_err() { return },
            () = tokio::time::sleep_until(deadline) => return,
            () = stop => return,
        }
    }
}

#[cfg(test)]
mod tests;
