//! A blocking query's whole result reduced to what a view compares: per
//! instance its key, worst check and last modify index (16 + 8 bytes, not
//! the ~1.3 KB the server sent), and the result's index.

use crate::codec::Health;

/// One instance of a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Item {
    /// Instance key (`crate::codec::instance_key` of node and service ID).
    pub key: u64,
    /// Worst check status.
    pub health: Health,
    /// The last raft index that touched its node, service or a check.
    pub modify: u64,
}

/// A result: its index (`X-Consul-Index`, `QueryMeta.Index`) and instances.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Digest {
    /// The result's index.
    pub index: u64,
    /// Its instances.
    pub items: Vec<Item>,
}
