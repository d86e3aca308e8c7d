//! The KV table as a Consul 1.20 server's state store keeps it: entries
//! with their create, modify and lock indexes, the tombstones of deleted
//! keys (so a prefix's index never goes back when a key under it is
//! deleted), the lock-delay of keys whose lock was lost to an invalidated
//! session, and the prefixes blocked readers wait on.
//!
//! Every change goes through [`KvStore::put`] and [`KvStore::bury`], which
//! keep the session index and the byte count, and record what a
//! transaction must undo ([`KvStore::begin`], [`KvStore::rollback`]).
//! Pure: no locks, no sockets; the raft index is the caller's.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tokio::time::Instant;

/// Most keys held; a write adding one more is refused with [`KV_FULL`].
pub(crate) const MAX_KEYS: usize = 1 << 20;
/// Most value bytes held (all keys together).
pub(crate) const MAX_BYTES: usize = 1 << 31;
/// Most tombstones kept; past it the oldest half is reaped (a real server
/// reaps them after `tombstone_ttl`, 15 min).
pub(crate) const MAX_TOMBSTONES: usize = 1 << 18;
/// Most distinct prefixes blocked readers wait on; past it a reader is
/// answered at once, not held.
pub(crate) const MAX_WATCHED: usize = 1 << 16;
/// Most keys with a lock-delay remembered; past it the expired ones go.
const MAX_DELAYS: usize = 1 << 16;
/// `structs.MaxLockDelay`: a session's lock-delay is capped at this.
pub(crate) const MAX_LOCK_DELAY: Duration = Duration::from_secs(60);
/// The words of a write refused by one of the bounds above.
pub(crate) const KV_FULL: &str = "agent-sim serve: KV store is full (bounded store)";

/// One key (`structs.DirEntry`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct DirEntry {
    pub lock_index: u64,
    pub key: String,
    pub flags: u64,
    pub value: Bytes,
    /// The session holding the key's lock ("" = none).
    pub session: String,
    pub create_index: u64,
    pub modify_index: u64,
}

/// What a transaction undoes, newest last.
enum Undo {
    Entry(String, Option<DirEntry>),
    Tomb(String, Option<u64>),
    Index(u64),
}

#[derive(Default)]
pub(crate) struct KvStore {
    // Bound: MAX_KEYS entries and MAX_BYTES value bytes (writes refused).
    entries: BTreeMap<String, DirEntry>,
    // Bound: MAX_TOMBSTONES (the oldest half reaped).
    tombstones: BTreeMap<String, u64>,
    /// The index of the last change to the table or its tombstones
    /// (`maxIndexTxn("kvs", "tombstones")`).
    table_index: u64,
    /// Keys held per session.
    held: HashMap<String, BTreeSet<String>>,
    // Bound: MAX_DELAYS (expired ones dropped when full).
    delays: HashMap<String, Instant>,
    bytes: usize,
    // Bound: MAX_WATCHED prefixes (readers beyond answered at once).
    watchers: HashMap<String, watch::Sender<()>>,
    /// Keys (or deleted prefixes) changed since the last [`KvStore::notify`].
    changed: Vec<String>,
    journal: Option<Vec<Undo>>,
}

impl KvStore {
    /// The table's index: the last write to any key or tombstone.
    #[cfg(test)]
    pub(crate) fn table_index(&self) -> u64 {
        self.table_index
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn get(&self, key: &str) -> Option<&DirEntry> {
        self.entries.get(key)
    }

    /// Entries whose key starts with `prefix`, in key order.
    pub(crate) fn range<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a DirEntry> + 'a {
        self.entries
            .range::<str, _>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .take_while(move |(k, _)| k.starts_with(prefix))
            .map(|(_, e)| e)
    }

    /// `KVS.Get`'s index: the entry's modify index, or the table's when
    /// the key is absent.
    pub(crate) fn get_index(&self, key: &str) -> (u64, Option<&DirEntry>) {
        match self.entries.get(key) {
            Some(e) => (e.modify_index, Some(e)),
            None => (self.table_index, None),
        }
    }

    /// `KVSList`'s index: the highest modify index under `prefix` or of a
    /// tombstone under it; the table's for the empty prefix or when
    /// nothing under the prefix ever changed.
    pub(crate) fn list_index(&self, prefix: &str) -> u64 {
        if prefix.is_empty() {
            return self.table_index;
        }
        let live = self
            .range(prefix)
            .map(|e| e.modify_index)
            .max()
            .unwrap_or(0);
        let dead = self
            .tombstones
            .range::<str, _>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(_, i)| *i)
            .max()
            .unwrap_or(0);
        match live.max(dead) {
            0 => self.table_index,
            i => i,
        }
    }

    /// `KVS.ListKeys`: the keys under `prefix`, each cut after the first
    /// `separator` past the prefix (once per distinct cut).
    pub(crate) fn list_keys(&self, prefix: &str, separator: &str) -> Vec<String> {
        let mut keys: Vec<String> = Vec::new();
        for e in self.range(prefix) {
            let cut = (!separator.is_empty())
                .then(|| e.key[prefix.len()..].find(separator))
                .flatten();
            match cut {
                Some(i) => {
                    let k = &e.key[..prefix.len() + i + separator.len()];
                    if keys.last().map(String::as_str) != Some(k) {
                        keys.push(k.to_owned());
                    }
                }
                None => keys.push(e.key.clone()),
            }
        }
        keys
    }

    /// Keys whose lock is held by session `id`.
    pub(crate) fn held_by(&self, id: &str) -> Vec<String> {
        self.held
            .get(id)
            .map(|k| k.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Whether `key` is within a lock-delay at `now`.
    pub(crate) fn lock_delayed(&self, key: &str, now: Instant) -> bool {
        self.delays.get(key).is_some_and(|until| *until > now)
    }

    /// Starts a lock-delay on `key` until `now + delay` (capped at
    /// [`MAX_LOCK_DELAY`]).
    pub(crate) fn delay_lock(&mut self, key: &str, now: Instant, delay: Duration) {
        if delay.is_zero() {
            return;
        }
        if self.delays.len() >= MAX_DELAYS {
            self.delays.retain(|_, until| *until > now);
            if self.delays.len() >= MAX_DELAYS {
                return;
            }
        }
        self.delays
            .insert(key.to_owned(), now + delay.min(MAX_LOCK_DELAY));
    }

    // ------------------------------------------------------------ changes

    /// Whether a write of `value` to `key` fits the bounds.
    pub(crate) fn room_for(&self, key: &str, value: usize) -> bool {
        let old = self.entries.get(key).map(|e| e.value.len());
        (old.is_some() || self.entries.len() < MAX_KEYS)
            && self.bytes - old.unwrap_or(0) + value <= MAX_BYTES
    }

    /// Sets `key` to `entry` (or removes it), keeping the session index,
    /// the byte count and the table index at `idx`.
    pub(crate) fn put(&mut self, key: &str, entry: Option<DirEntry>, idx: u64) {
        let prev = match &entry {
            Some(e) => self.entries.insert(key.to_owned(), e.clone()),
            None => self.entries.remove(key),
        };
        if let Some(p) = &prev {
            self.bytes -= p.value.len();
            self.unhold(&p.session, key);
        }
        if let Some(e) = &entry {
            self.bytes += e.value.len();
            if !e.session.is_empty() {
                self.held
                    .entry(e.session.clone())
                    .or_default()
                    .insert(key.to_owned());
            }
        }
        self.set_table_index(idx);
        self.changed.push(key.to_owned());
        if let Some(j) = &mut self.journal {
            j.push(Undo::Entry(key.to_owned(), prev));
        }
    }

    fn unhold(&mut self, session: &str, key: &str) {
        if session.is_empty() {
            return;
        }
        if let Some(keys) = self.held.get_mut(session) {
            keys.remove(key);
            if keys.is_empty() {
                self.held.remove(session);
            }
        }
    }

    /// Leaves a tombstone for `key` (a deleted key, or a deleted prefix).
    pub(crate) fn bury(&mut self, key: &str, idx: u64) {
        if self.tombstones.len() >= MAX_TOMBSTONES && !self.tombstones.contains_key(key) {
            self.reap_half();
        }
        let prev = self.tombstones.insert(key.to_owned(), idx);
        self.set_table_index(idx);
        self.changed.push(key.to_owned());
        if let Some(j) = &mut self.journal {
            j.push(Undo::Tomb(key.to_owned(), prev));
        }
    }

    /// Removes the older half of the tombstones (not undone by a rollback).
    fn reap_half(&mut self) {
        let mut idx: Vec<u64> = self.tombstones.values().copied().collect();
        let mid = idx.len() / 2;
        let (_, cut, _) = idx.select_nth_unstable(mid);
        let cut = *cut;
        self.tombstones.retain(|_, i| *i > cut);
    }

    /// Marks the table changed at `idx` (a tree delete that removed keys).
    pub(crate) fn set_table_index(&mut self, idx: u64) {
        if idx != self.table_index
            && let Some(j) = &mut self.journal
        {
            j.push(Undo::Index(self.table_index));
        }
        self.table_index = idx;
    }

    /// Removes every key under `prefix`; `true` when there were some.
    pub(crate) fn delete_prefix(&mut self, prefix: &str, idx: u64) -> bool {
        let keys: Vec<String> = self.range(prefix).map(|e| e.key.clone()).collect();
        for k in &keys {
            self.put(k, None, idx);
        }
        !keys.is_empty()
    }

    // ------------------------------------------------------------ txns

    /// Starts recording what [`KvStore::rollback`] undoes.
    pub(crate) fn begin(&mut self) {
        self.journal = Some(Vec::new());
    }

    /// Keeps the changes since [`KvStore::begin`].
    pub(crate) fn keep(&mut self) {
        self.journal = None;
    }

    /// Undoes the changes since [`KvStore::begin`].
    pub(crate) fn rollback(&mut self) {
        let Some(journal) = self.journal.take() else {
            return;
        };
        for undo in journal.into_iter().rev() {
            match undo {
                Undo::Entry(key, prev) => {
                    let idx = self.table_index;
                    self.put(&key, prev, idx);
                }
                Undo::Tomb(key, None) => {
                    self.tombstones.remove(&key);
                }
                Undo::Tomb(key, Some(i)) => {
                    self.tombstones.insert(key, i);
                }
                Undo::Index(i) => self.table_index = i,
            }
        }
    }

    // ------------------------------------------------------------ watchers

    /// A receiver woken when a key under `prefix` (or `prefix` itself)
    /// changes; `None` when too many prefixes are watched.
    pub(crate) fn watch(&mut self, prefix: &str) -> Option<watch::Receiver<()>> {
        if let Some(tx) = self.watchers.get(prefix) {
            return Some(tx.subscribe());
        }
        if self.watchers.len() >= MAX_WATCHED {
            self.watchers.retain(|_, tx| tx.receiver_count() > 0);
            if self.watchers.len() >= MAX_WATCHED {
                return None;
            }
        }
        let (tx, rx) = watch::channel(());
        self.watchers.insert(prefix.to_owned(), tx);
        Some(rx)
    }

    /// Wakes the readers of every prefix the changes since the last call
    /// touched (a change to a key under the prefix, or a tree delete of a
    /// prefix of it); forgets prefixes nobody waits on.
    pub(crate) fn notify(&mut self) {
        if self.changed.is_empty() {
            return;
        }
        let changed = std::mem::take(&mut self.changed);
        self.watchers.retain(|prefix, tx| {
            if tx.receiver_count() == 0 {
                return false;
            }
            if changed
                .iter()
                .any(|k| k.starts_with(prefix.as_str()) || prefix.starts_with(k.as_str()))
            {
                tx.send_replace(());
            }
            true
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str, value: &str, idx: u64) -> DirEntry {
        DirEntry {
            key: key.into(),
            value: Bytes::copy_from_slice(value.as_bytes()),
            create_index: idx,
            modify_index: idx,
            ..DirEntry::default()
        }
    }

    #[test]
    fn list_indexes_come_from_the_prefix_and_its_tombstones() {
        let mut kv = KvStore::default();
        kv.put("a/b", Some(entry("a/b", "1", 5)), 5);
        kv.put("a/c", Some(entry("a/c", "2", 6)), 6);
        kv.put("z", Some(entry("z", "3", 7)), 7);
        assert_eq!(kv.list_index("a/"), 6);
        assert_eq!(kv.list_index(""), 7);
        // Nothing under it: the table's index.
        assert_eq!(kv.list_index("q/"), 7);
        kv.put("a/c", None, 8);
        kv.bury("a/c", 8);
        assert_eq!(kv.list_index("a/"), 8);
        assert_eq!(kv.get_index("a/c"), (8, None));
        assert_eq!(kv.get_index("a/b").0, 5);
    }

    #[test]
    fn keys_are_cut_after_the_separator() {
        let mut kv = KvStore::default();
        for (i, k) in ["a/b/c", "a/b/d", "a/e", "b"].iter().enumerate() {
            kv.put(k, Some(entry(k, "", i as u64 + 1)), i as u64 + 1);
        }
        assert_eq!(kv.list_keys("", "/"), vec!["a/", "b"]);
        assert_eq!(kv.list_keys("a/", "/"), vec!["a/b/", "a/e"]);
        assert_eq!(kv.list_keys("a/", ""), vec!["a/b/c", "a/b/d", "a/e"]);
    }

    #[test]
    fn a_rollback_restores_entries_tombstones_holders_and_index() {
        let mut kv = KvStore::default();
        let mut held = entry("l", "x", 3);
        held.session = "s1".into();
        kv.put("l", Some(held.clone()), 3);
        kv.begin();
        kv.put("l", None, 4);
        kv.bury("l", 4);
        kv.put("n", Some(entry("n", "y", 4)), 4);
        assert!(kv.held_by("s1").is_empty());
        kv.rollback();
        assert_eq!(kv.get("l"), Some(&held));
        assert!(kv.get("n").is_none());
        assert_eq!(kv.held_by("s1"), vec!["l"]);
        assert_eq!(kv.table_index(), 3);
        assert_eq!(kv.list_index("l"), 3);
        assert_eq!(kv.bytes, 1);
    }

    #[test]
    fn tombstones_are_reaped_by_half_at_their_bound() {
        let mut kv = KvStore::default();
        for i in 0..MAX_TOMBSTONES as u64 {
            kv.tombstones.insert(format!("k{i}"), i + 1);
        }
        kv.bury("new", MAX_TOMBSTONES as u64 + 1);
        assert!(kv.tombstones.len() <= MAX_TOMBSTONES / 2 + 1);
        assert!(kv.tombstones.contains_key("new"));
    }

    #[tokio::test(start_paused = true)]
    async fn lock_delays_end_and_are_capped() {
        let mut kv = KvStore::default();
        let now = Instant::now();
        kv.delay_lock("k", now, Duration::from_secs(600));
        assert!(kv.lock_delayed("k", now + Duration::from_secs(59)));
        assert!(!kv.lock_delayed("k", now + Duration::from_secs(60)));
        kv.delay_lock("z", now, Duration::ZERO);
        assert!(!kv.lock_delayed("z", now));
    }

    #[test]
    fn readers_wake_on_changes_under_their_prefix_only() {
        let mut kv = KvStore::default();
        let mut a = kv.watch("a/").expect("room");
        let mut b = kv.watch("b/x").expect("room");
        a.mark_unchanged();
        b.mark_unchanged();
        kv.put("a/1", Some(entry("a/1", "", 1)), 1);
        kv.notify();
        assert!(a.has_changed().unwrap());
        assert!(!b.has_changed().unwrap());
        // A tree delete of a prefix of the watched key wakes it.
        kv.bury("b/", 2);
        kv.notify();
        assert!(b.has_changed().unwrap());
        drop(a);
        kv.put("a/2", Some(entry("a/2", "", 3)), 3);
        kv.notify();
        assert!(!kv.watchers.contains_key("a/"));
    }
}
