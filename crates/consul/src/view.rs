//! The materialized view of one subscription: what a client agent's
//! streaming cache holds, reduced to what a load simulator needs.
//!
//! A [`View`] follows the stream protocol — snapshot items, `EndOfSnapshot`,
//! live events (single or in an `EventBatch`), `NewSnapshotToFollow` (reset)
//! — and remembers the last raft index for resuming. Health views keep one
//! small [`Instance`] (16 bytes) per instance key instead of the whole
//! `CheckServiceNode`: thousands of agents each hold a copy.
//!
//! Bound: a view keeps at most [`MAX_VIEW_ENTRIES`] instances (or
//! intention sources); what a server sends beyond that is not tracked and
//! is counted (`take_dropped`, warning `view_full`).
//!
//! Pure state, no I/O; tested on the captured event sequence.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use agent_sim_proto::consul::subscribe::{
    CatalogOp, Event, config_entry::Entry, config_entry_update::UpdateOp, event::Payload,
};

use crate::codec::{Health, csn_key, instance_key};

/// Hasher for keys that already are hashes.
#[derive(Debug, Default, Clone, Copy)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) ^ u64::from(b) ^ (self.0 >> 56);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type KeyMap<V> = HashMap<u64, V, BuildHasherDefault<KeyHasher>>;

/// Most instances (health) or sources (intentions) one view keeps. Large
/// Consul services run thousands of instances; 65,536 is several times the
/// largest, and caps one view at ≈2–4 MiB (16-byte entries in a hash map)
/// whatever a server streams. Every agent holds its own views, so a fleet
/// watching a service that large needs that much per agent: see
/// docs/hardening.md.
pub const MAX_VIEW_ENTRIES: usize = 65_536;

/// What a health view keeps per instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Instance {
    /// Raft index of the event that last set the instance.
    pub index: u64,
    /// Worst check status.
    pub health: Health,
}

/// Which topic a view follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViewKind {
    /// `ServiceHealth`: instances of one service.
    Health,
    /// `ServiceIntentions`: the sources of one service's intentions entry.
    Intentions,
}

#[derive(Debug)]
enum Body {
    Health(KeyMap<Instance>),
    /// (hash of source name, allow)
    Intentions(Vec<(u64, bool)>),
}

/// Where the stream is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Receiving a snapshot (before `EndOfSnapshot`).
    Snapshot,
    /// Snapshot complete; events are live.
    Live,
}

/// A change to a view, reported while applying an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// An instance was registered or updated.
    Register {
        /// Instance key ([`instance_key`]).
        key: u64,
        /// Whether it arrived as a snapshot item.
        snapshot: bool,
    },
    /// An instance was deregistered.
    Deregister {
        /// Instance key.
        key: u64,
    },
    /// A source of the intentions entry was set (`Some(allow)`) or removed.
    Intention {
        /// Hash of the source name ([`source_key`]).
        source: u64,
        /// `Some(true)` allow, `Some(false)` deny, `None` removed.
        allow: Option<bool>,
        /// Whether it arrived as a snapshot item.
        snapshot: bool,
    },
}

/// What an event meant for the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// A snapshot item or live change (possibly a batch).
    Item,
    /// The snapshot is complete.
    EndOfSnapshot,
    /// The view was reset; a new snapshot follows.
    NewSnapshotToFollow,
    /// Nothing this view understands.
    Ignored,
    /// A blocking query's result with nothing new (its wait ended).
    Unchanged,
}

/// Key of an intention source name.
pub fn source_key(name: &str) -> u64 {
    instance_key("", name)
}

/// The materialized view of one subscription.
#[derive(Debug)]
pub struct View {
    index: u64,
    phase: Phase,
    // Bound: at most MAX_VIEW_ENTRIES entries.
    body: Body,
    /// Entries not kept because the view was full, not yet taken.
    dropped: u32,
}

impl View {
    /// An empty view waiting for its first snapshot.
    pub fn new(kind: ViewKind) -> Self {
        View {
            index: 0,
            phase: Phase::Snapshot,
            body: match kind {
                ViewKind::Health => Body::Health(KeyMap::default()),
                ViewKind::Intentions => Body::Intentions(Vec::new()),
            },
            dropped: 0,
        }
    }

    /// Which topic the view follows.
    pub fn kind(&self) -> ViewKind {
        match self.body {
            Body::Health(_) => ViewKind::Health,
            Body::Intentions(_) => ViewKind::Intentions,
        }
    }

    /// Entries not kept because the view was full, since the last call.
    pub fn take_dropped(&mut self) -> u32 {
        std::mem::take(&mut self.dropped)
    }

    /// Index to resume from: the last index once a snapshot completed, else 0.
    pub fn resume_index(&self) -> u64 {
        match self.phase {
            Phase::Live => self.index,
            Phase::Snapshot => 0,
        }
    }

    /// Last raft index seen.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// Stream phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Drops everything (ABORTED, or a fresh subscribe at index 0).
    pub fn reset(&mut self) {
        self.index = 0;
        self.phase = Phase::Snapshot;
        match &mut self.body {
            Body::Health(m) => {
                m.clear();
                m.shrink_to_fit();
            }
            Body::Intentions(v) => {
                v.clear();
                v.shrink_to_fit();
            }
        }
    }

    /// Instances (health) or sources (intentions) held.
    pub fn len(&self) -> usize {
        match &self.body {
            Body::Health(m) => m.len(),
            Body::Intentions(v) => v.len(),
        }
    }

    /// Whether the view holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The instance with this key, if present.
    pub fn instance(&self, key: u64) -> Option<Instance> {
        match &self.body {
            Body::Health(m) => m.get(&key).copied(),
            Body::Intentions(_) => None,
        }
    }

    /// The instance `service_id` on `node`, if present.
    pub fn get(&self, node: &str, service_id: &str) -> Option<Instance> {
        self.instance(instance_key(node, service_id))
    }

    /// Action of an intention source: `Some(true)` allow.
    pub fn intention(&self, source: u64) -> Option<bool> {
        match &self.body {
            Body::Intentions(v) => v.iter().find(|(k, _)| *k == source).map(|(_, a)| *a),
            Body::Health(_) => None,
        }
    }

    /// Applies one event, reporting every change to `on_change`.
    pub fn apply(&mut self, ev: &Event, on_change: &mut dyn FnMut(Change)) -> Signal {
        let Some(payload) = &ev.payload else {
            return Signal::Ignored;
        };
        match payload {
            Payload::EndOfSnapshot(true) => {
                self.index = self.index.max(ev.index);
                self.phase = Phase::Live;
                Signal::EndOfSnapshot
            }
            Payload::NewSnapshotToFollow(true) => {
                self.reset();
                Signal::NewSnapshotToFollow
            }
            Payload::EventBatch(batch) => {
                let mut any = false;
                for inner in &batch.events {
                    any |= self.apply_item(inner, on_change);
                }
                if ev.index > 0 {
                    self.index = ev.index;
                }
                if any { Signal::Item } else { Signal::Ignored }
            }
            _ => {
                if self.apply_item(ev, on_change) {
                    Signal::Item
                } else {
                    Signal::Ignored
                }
            }
        }
    }

    /// Applies a blocking query's whole result at `index`: the first (or
    /// the first after a reset) is the snapshot, every instance a register,
    /// and the snapshot ends; a later one is compared with the view: an
    /// instance that is new, touched since (a later modify index) or of
    /// another health is a register, one that is gone a deregister. What a
    /// health view keeps per instance is then its modify index.
    pub fn apply_result(
        &mut self,
        index: u64,
        items: &[crate::watch::Item],
        on_change: &mut dyn FnMut(Change),
    ) -> Signal {
        let Body::Health(map) = &mut self.body else {
            return Signal::Ignored;
        };
        let snapshot = self.phase == Phase::Snapshot;
        let mut changed = false;
        let mut seen: KeyMap<()> = KeyMap::default();
        for it in items {
            seen.insert(it.key, ());
            let now = Instance {
                index: it.modify,
                health: it.health,
            };
            if map.get(&it.key) == Some(&now) {
                continue;
            }
            if map.len() >= MAX_VIEW_ENTRIES && !map.contains_key(&it.key) {
                self.dropped = self.dropped.saturating_add(1);
                continue;
            }
            map.insert(it.key, now);
            changed = true;
            on_change(Change::Register {
                key: it.key,
                snapshot,
            });
        }
        let gone: Vec<u64> = map
            .keys()
            .filter(|k| !seen.contains_key(k))
            .copied()
            .collect();
        for key in gone {
            map.remove(&key);
            changed = true;
            on_change(Change::Deregister { key });
        }
        self.index = index.max(1);
        if snapshot {
            self.phase = Phase::Live;
            Signal::EndOfSnapshot
        } else if changed {
            Signal::Item
        } else {
            Signal::Unchanged
        }
    }

    fn apply_item(&mut self, ev: &Event, on_change: &mut dyn FnMut(Change)) -> bool {
        if let Some(Payload::EventBatch(b)) = &ev.payload {
            // Nested batches do not occur; apply them flat regardless.
            let mut any = false;
            for inner in &b.events {
                any |= self.apply_item(inner, on_change);
            }
            return any;
        }
        let snapshot = self.phase == Phase::Snapshot;
        let index = ev.index;
        let applied = match (&mut self.body, &ev.payload) {
            (Body::Health(map), Some(Payload::ServiceHealth(u))) => {
                let Some(csn) = &u.check_service_node else {
                    return false;
                };
                let key = csn_key(csn);
                if u.op == CatalogOp::Deregister as i32 {
                    map.remove(&key);
                    on_change(Change::Deregister { key });
                } else {
                    if map.len() >= MAX_VIEW_ENTRIES && !map.contains_key(&key) {
                        self.dropped = self.dropped.saturating_add(1);
                        return true;
                    }
                    map.insert(
                        key,
                        Instance {
                            index,
                            health: Health::of(csn),
                        },
                    );
                    on_change(Change::Register { key, snapshot });
                }
                true
            }
            (Body::Intentions(sources), Some(Payload::ConfigEntry(u))) => {
                let Some(entry) = &u.config_entry else {
                    return false;
                };
                let new: Vec<(u64, bool)> = if u.op == UpdateOp::Delete as i32 {
                    Vec::new()
                } else {
                    match &entry.entry {
                        Some(Entry::ServiceIntentions(e)) => {
                            if e.sources.len() > MAX_VIEW_ENTRIES {
                                self.dropped = self.dropped.saturating_add(
                                    u32::try_from(e.sources.len() - MAX_VIEW_ENTRIES)
                                        .unwrap_or(u32::MAX),
                                );
                            }
                            e.sources
                                .iter()
                                .take(MAX_VIEW_ENTRIES)
                                .map(|s| (source_key(&s.name), s.action == 1))
                                .collect()
                        }
                        None => Vec::new(),
                    }
                };
                for (k, _) in sources.iter() {
                    if !new.iter().any(|(n, _)| n == k) {
                        on_change(Change::Intention {
                            source: *k,
                            allow: None,
                            snapshot,
                        });
                    }
                }
                for (k, a) in &new {
                    on_change(Change::Intention {
                        source: *k,
                        allow: Some(*a),
                        snapshot,
                    });
                }
                *sources = new;
                true
            }
            _ => false,
        };
        if applied && index > 0 {
            self.index = index;
        }
        applied
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_sim_proto::consul::subscribe::{
        CheckServiceNode, ConfigEntry, ConfigEntryUpdate, EventBatch, HealthCheck, IntentionsEntry,
        Node, NodeService, ServiceHealthUpdate, SourceIntention,
    };

    fn health(index: u64, op: CatalogOp, node: &str, id: &str, status: &str) -> Event {
        Event {
            index,
            payload: Some(Payload::ServiceHealth(ServiceHealthUpdate {
                op: op as i32,
                check_service_node: Some(CheckServiceNode {
                    node: Some(Node {
                        node: node.into(),
                        ..Default::default()
                    }),
                    service: Some(NodeService {
                        id: id.into(),
                        service: "web".into(),
                        ..Default::default()
                    }),
                    checks: if status.is_empty() {
                        vec![]
                    } else {
                        vec![HealthCheck {
                            status: status.into(),
                            ..Default::default()
                        }]
                    },
                }),
            })),
        }
    }

    fn eos(index: u64) -> Event {
        Event {
            index,
            payload: Some(Payload::EndOfSnapshot(true)),
        }
    }

    fn nstf() -> Event {
        Event {
            index: 0,
            payload: Some(Payload::NewSnapshotToFollow(true)),
        }
    }

    fn apply(v: &mut View, e: &Event) -> (Signal, Vec<Change>) {
        let mut changes = Vec::new();
        let s = v.apply(e, &mut |c| changes.push(c));
        (s, changes)
    }

    #[test]
    fn snapshot_then_live_register_and_deregister() {
        let mut v = View::new(ViewKind::Health);
        let (s, c) = apply(
            &mut v,
            &health(10, CatalogOp::Register, "n1", "a", "passing"),
        );
        assert_eq!(s, Signal::Item);
        assert_eq!(
            c,
            vec![Change::Register {
                key: instance_key("n1", "a"),
                snapshot: true
            }]
        );
        apply(
            &mut v,
            &health(10, CatalogOp::Register, "n2", "b", "warning"),
        );
        assert_eq!(v.resume_index(), 0, "no resume before EndOfSnapshot");
        assert_eq!(apply(&mut v, &eos(10)).0, Signal::EndOfSnapshot);
        assert_eq!(v.resume_index(), 10);
        assert_eq!(v.len(), 2);
        assert_eq!(v.get("n2", "b").unwrap().health, Health::Warning);

        let (_, c) = apply(&mut v, &health(11, CatalogOp::Deregister, "n1", "a", ""));
        assert_eq!(
            c,
            vec![Change::Deregister {
                key: instance_key("n1", "a")
            }]
        );
        assert!(v.get("n1", "a").is_none());
        assert_eq!(v.resume_index(), 11);
        let (_, c) = apply(
            &mut v,
            &health(12, CatalogOp::Register, "n2", "b", "critical"),
        );
        assert_eq!(
            c,
            vec![Change::Register {
                key: instance_key("n2", "b"),
                snapshot: false
            }]
        );
        assert_eq!(
            v.get("n2", "b"),
            Some(Instance {
                index: 12,
                health: Health::Critical
            })
        );
    }

    #[test]
    fn batches_apply_every_event_at_the_batch_index() {
        let mut v = View::new(ViewKind::Health);
        apply(&mut v, &eos(5));
        let batch = Event {
            index: 6,
            payload: Some(Payload::EventBatch(EventBatch {
                events: vec![
                    health(6, CatalogOp::Register, "n1", "a", "passing"),
                    health(6, CatalogOp::Register, "n1", "b", "passing"),
                    health(6, CatalogOp::Register, "n2", "c", ""),
                ],
            })),
        };
        let (s, c) = apply(&mut v, &batch);
        assert_eq!(s, Signal::Item);
        assert_eq!(c.len(), 3);
        assert_eq!(v.len(), 3);
        assert_eq!(v.resume_index(), 6);
    }

    #[test]
    fn new_snapshot_to_follow_resets_the_view() {
        let mut v = View::new(ViewKind::Health);
        apply(
            &mut v,
            &health(3, CatalogOp::Register, "n1", "a", "passing"),
        );
        apply(&mut v, &eos(3));
        assert_eq!(apply(&mut v, &nstf()).0, Signal::NewSnapshotToFollow);
        assert!(v.is_empty());
        assert_eq!(v.phase(), Phase::Snapshot);
        assert_eq!(v.resume_index(), 0);
        apply(
            &mut v,
            &health(9, CatalogOp::Register, "n3", "c", "passing"),
        );
        apply(&mut v, &eos(9));
        assert_eq!(v.len(), 1);
        assert_eq!(v.resume_index(), 9);
        v.reset();
        assert!(v.is_empty());
        assert_eq!(v.resume_index(), 0);
    }

    #[test]
    fn deregister_of_an_unknown_instance_is_harmless() {
        let mut v = View::new(ViewKind::Health);
        apply(&mut v, &eos(1));
        let (s, _) = apply(&mut v, &health(2, CatalogOp::Deregister, "x", "y", ""));
        assert_eq!(s, Signal::Item);
        assert!(v.is_empty());
        assert_eq!(v.resume_index(), 2);
    }

    #[test]
    fn intentions_view_tracks_source_actions() {
        let entry = |action: i32| Event {
            index: 20,
            payload: Some(Payload::ConfigEntry(ConfigEntryUpdate {
                op: UpdateOp::Upsert as i32,
                config_entry: Some(ConfigEntry {
                    kind: 4,
                    name: "web".into(),
                    raft_index: None,
                    entry: Some(Entry::ServiceIntentions(IntentionsEntry {
                        sources: vec![SourceIntention {
                            name: "agent-sim-probe".into(),
                            action,
                            description: String::new(),
                        }],
                        meta: Default::default(),
                    })),
                }),
            })),
        };
        let mut v = View::new(ViewKind::Intentions);
        apply(&mut v, &eos(1));
        let (_, c) = apply(&mut v, &entry(1));
        let k = source_key("agent-sim-probe");
        assert_eq!(
            c,
            vec![Change::Intention {
                source: k,
                allow: Some(true),
                snapshot: false
            }]
        );
        assert_eq!(v.intention(k), Some(true));
        apply(&mut v, &entry(0));
        assert_eq!(v.intention(k), Some(false));
        // Health events do not touch an intentions view.
        let (s, _) = apply(&mut v, &health(21, CatalogOp::Register, "n", "a", ""));
        assert_eq!(s, Signal::Ignored);
    }
}
