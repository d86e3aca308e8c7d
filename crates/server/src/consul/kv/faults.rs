//! `consul.kv` faults: KV reads answered with an index that goes back or
//! is 0, or with a huge value, and locks that never free.

use bytes::Bytes;

use crate::consul::ConsulState;

impl ConsulState {
    /// The index a KV read answers with (a fault may lower it).
    pub(crate) fn faults_kv_index(&self, index: u64) -> u64 {
        index
    }

    /// A huge value to answer a KV read with, when a fault says so.
    pub(crate) fn faults_kv_value(&self) -> Option<Bytes> {
        None
    }

    /// Whether a fault keeps this acquire's key locked forever.
    pub(crate) fn faults_lock_stuck(&self) -> bool {
        false
    }
}
