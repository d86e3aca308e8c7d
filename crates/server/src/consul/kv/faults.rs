//! `consul.kv` faults, the bad input a KV client must survive: reads
//! answered with an index that goes back (`index-back`) or is 0
//! (`index-zero`), or with an 8 MiB value (`huge-value`), and lock
//! acquires whose key is taken for good by a session that is never
//! invalidated (`lock-stuck`). A KV call over RPC is matched against
//! `path:` as `/v1/kv/<key>`.

use std::sync::OnceLock;

use bytes::Bytes;

use super::{DirEntry, KvStore};
use crate::consul::ConsulState;
use crate::consul::sessions::{self, Session};
use crate::faults::{Action, Target};

/// The value `huge-value` answers with: 16 × Consul's default
/// `kv_max_value_size`.
pub(crate) const HUGE_VALUE: usize = 8 * 1024 * 1024;
/// The name of the session `lock-stuck` takes keys with.
pub(crate) const STUCK_SESSION: &str = "agent-sim lock-stuck";

fn huge() -> Bytes {
    static HUGE: OnceLock<Bytes> = OnceLock::new();
    HUGE.get_or_init(|| Bytes::from(vec![b'x'; HUGE_VALUE]))
        .clone()
}

/// What a `consul.kv` fault does to one read (nothing by default).
#[derive(Default)]
pub(crate) struct ReadFault(Option<Action>);

impl ReadFault {
    /// The index the read answers with, from its true one (at least 1,
    /// as a server's query meta has it).
    pub(crate) fn index(&self, true_index: u64) -> u64 {
        let i = true_index.max(1);
        match self.0 {
            Some(Action::IndexBack) => (i / 2).max(1),
            Some(Action::IndexZero) => 0,
            _ => i,
        }
    }

    /// The first entry with the huge value in place of its own.
    pub(crate) fn entry(&self, e: &DirEntry) -> Option<DirEntry> {
        matches!(self.0, Some(Action::HugeValue)).then(|| DirEntry {
            value: huge(),
            ..e.clone()
        })
    }
}

impl ConsulState {
    /// The `consul.kv` read fault that hits a read of `key` (counted).
    pub(crate) fn kv_read_fault(&self, key: &str) -> ReadFault {
        let faults = self.faults();
        let path = format!("/v1/kv/{key}");
        let read =
            |a: &Action| matches!(a, Action::IndexBack | Action::IndexZero | Action::HugeValue);
        match faults.draw_if(Target::ConsulKv, Some(&path), read) {
            Some(hit) if faults.confirm(hit.idx) => ReadFault(Some(hit.action)),
            _ => ReadFault(None),
        }
    }

    /// Whether a `lock-stuck` fault hits this acquire of `key` (counted).
    pub(crate) fn kv_lock_stuck(&self, key: &str) -> bool {
        let faults = self.faults();
        let path = format!("/v1/kv/{key}");
        let stuck = |a: &Action| matches!(a, Action::LockStuck);
        faults
            .draw_if(Target::ConsulKv, Some(&path), stuck)
            .is_some_and(|hit| faults.confirm(hit.idx))
    }

    /// `lock-stuck`: the key, unless someone holds it, is locked at raft
    /// index `idx` by the server's stuck session (made on first use: no
    /// TTL, no checks, so nothing ever invalidates it).
    pub(crate) fn take_for_good(&self, kv: &mut KvStore, idx: u64, key: &str) {
        if kv.get(key).is_some_and(|e| !e.session.is_empty()) {
            return;
        }
        let mut sessions = self.sessions();
        let found = sessions
            .iter()
            .find(|s| s.name == STUCK_SESSION)
            .map(|s| s.id.clone());
        let id = match found {
            Some(id) => id,
            None => {
                let s = Session {
                    id: sessions::uuid(),
                    name: STUCK_SESSION.into(),
                    node: self.inner.cfg.node_name.clone(),
                    lock_delay: 0,
                    behavior: "release".into(),
                    ttl: String::new(),
                    node_checks: Some(Vec::new()),
                    service_checks: None,
                    create_index: idx,
                    modify_index: idx,
                    ttl_duration: None,
                    deadline: None,
                };
                let id = s.id.clone();
                sessions.insert(s);
                id
            }
        };
        let mut e = kv.get(key).cloned().unwrap_or_else(|| DirEntry {
            key: key.to_owned(),
            create_index: idx,
            ..DirEntry::default()
        });
        e.lock_index += 1;
        e.session = id;
        e.modify_index = idx;
        kv.put(key, Some(e), idx);
    }
}
