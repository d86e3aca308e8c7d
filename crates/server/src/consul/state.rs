//! The catalog, config entries and per-topic event fan-out, behind one mutex.
//!
//! Every write runs under the lock as one "raft transaction": it takes the next
//! raft index, changes the catalog, records which service instances it touched
//! ([`Touched`]) and, at [`Store::commit`], turns them into ONE event per
//! topic+key for that index (an `EventBatch` when a key got several changes).
//! Subscribing also happens under the lock, so a snapshot and the live events
//! after it never overlap or leave a gap.
//!
//! Each instance keeps its encoded `Register` payload ([`ServiceEntry::payload`]),
//! refreshed at commit; snapshots clone those refcounted bytes.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::Bytes;
use tokio::sync::broadcast;

use agent_sim_proto::consul::subscribe::Topic;

use super::events::{self, InstanceView, Payload};
use super::write_error::WriteError;

/// (node name, service id).
pub(crate) type InstanceKey = (String, String);

/// A subscription subject: topic and key (service name or config entry name).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct TopicKey {
    pub topic: Topic,
    pub key: String,
}

impl TopicKey {
    pub(crate) fn new(topic: Topic, key: &str) -> Self {
        Self {
            topic,
            key: key.to_owned(),
        }
    }
}

/// The check id real nodes carry for gossip health; never stored for
/// catalog-registered nodes (the real leader would reap them).
pub(crate) const SERF_HEALTH: &str = "serfHealth";

#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct NodeDef {
    pub id: String,
    pub address: String,
    pub meta: BTreeMap<String, String>,
    pub tagged_addresses: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ServiceDef {
    pub kind: String,
    pub id: String,
    pub service: String,
    pub tags: Vec<String>,
    pub address: String,
    pub port: i32,
    pub meta: BTreeMap<String, String>,
    pub proxy: Option<serde_json::Value>,
    /// `Connect.Native`: the instance speaks Connect itself (an endpoint of
    /// its own service's mesh cluster, like a proxy of it).
    pub connect_native: bool,
}

impl ServiceDef {
    /// For a `connect-proxy`, the service it fronts.
    pub(crate) fn connect_destination(&self) -> Option<&str> {
        if self.kind != "connect-proxy" {
            return None;
        }
        self.proxy
            .as_ref()?
            .get("DestinationServiceName")?
            .as_str()
            .filter(|s| !s.is_empty())
    }

    /// The service whose mesh endpoints this instance is: a proxy's
    /// destination, or a Connect-native instance's own service.
    pub(crate) fn connect_service(&self) -> Option<&str> {
        self.connect_destination()
            .or_else(|| self.connect_native.then_some(self.service.as_str()))
    }

    /// The topic keys whose subscribers see this instance.
    fn topic_keys(&self) -> Vec<TopicKey> {
        let mut keys = vec![TopicKey::new(Topic::ServiceHealth, &self.service)];
        if let Some(dest) = self.connect_service() {
            keys.push(TopicKey::new(Topic::ServiceHealthConnect, dest));
        }
        keys
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct CheckDef {
    pub check_id: String,
    pub name: String,
    pub status: String,
    pub notes: String,
    pub output: String,
    pub service_id: String,
    pub service_name: String,
}

#[derive(Debug)]
pub(crate) struct NodeEntry {
    pub def: NodeDef,
    pub create_index: u64,
    pub modify_index: u64,
    pub services: BTreeMap<String, ServiceEntry>,
    pub checks: BTreeMap<String, CheckEntry>,
    /// The node's network coordinate (`Coordinate.Update`), as sent.
    pub coord: Option<serde_json::Value>,
}

#[derive(Debug)]
pub(crate) struct ServiceEntry {
    pub def: ServiceDef,
    pub create_index: u64,
    pub modify_index: u64,
    /// Encoded `ServiceHealthUpdate{Register, CheckServiceNode}`, current as of
    /// the last commit.
    pub payload: Payload,
}

#[derive(Debug)]
pub(crate) struct CheckEntry {
    pub def: CheckDef,
    pub create_index: u64,
    pub modify_index: u64,
}

/// A stored config entry. Only `service-intentions` produce events.
#[derive(Debug)]
pub(crate) struct ConfigEntryStored {
    pub body: serde_json::Value,
    pub create_index: u64,
    pub modify_index: u64,
    pub payload: Option<Payload>,
}

#[derive(Default)]
struct TopicState {
    /// Index of the newest event published on this topic+key (0 = none yet).
    last_index: u64,
    /// Created with the first subscriber, dropped when a publish finds none.
    tx: Option<broadcast::Sender<Bytes>>,
}

/// What a subscription starts with.
pub(crate) enum Start {
    /// The subscriber's index is the newest event: live events only.
    Resume,
    /// Send a (new) snapshot: payloads at `index`, then `EndOfSnapshot`.
    Snapshot {
        new_snapshot_to_follow: bool,
        index: u64,
        payloads: Vec<Payload>,
    },
}

/// Service instances touched by one write, with their state before it.
#[derive(Default)]
pub(crate) struct Touched {
    order: Vec<InstanceKey>,
    prev: HashMap<InstanceKey, Option<PrevService>>,
}

struct PrevService {
    def: ServiceDef,
    create_index: u64,
    modify_index: u64,
}

/// Most nodes the embedded catalog holds: four times the largest fleet one
/// `agent-sim serve` has been sized for (≈250,000 agents over shards),
/// ≈1–2 KiB each with a service and a check: 1–2 GiB at the cap. A write
/// that would add a node beyond it is refused (HTTP 500, [`super::write_error::CATALOG_FULL`]).
pub(crate) const MAX_NODES: usize = 1 << 20;
/// Most services (and, separately, checks) on one node: agents register a
/// handful; a node is not a place to store an unbounded list.
pub(crate) const MAX_PER_NODE: usize = 1024;
/// Most config entries held (agents write one per probe service).
pub(crate) const MAX_CONFIG_ENTRIES: usize = 65_536;
/// Most topics (service names subscribed to or written) with their last
/// index: a client subscribing to ever new keys is refused beyond it.
pub(crate) const MAX_TOPICS: usize = 1 << 20;
pub(crate) struct Store {
    pub raft_index: u64,
    pub datacenter: String,
    // Bound: MAX_NODES nodes, MAX_PER_NODE services and checks each;
    // MAX_CONFIG_ENTRIES config entries; MAX_TOPICS topics (new ones refused).
    pub nodes: HashMap<String, NodeEntry>,
    by_name: HashMap<String, BTreeSet<InstanceKey>>,
    by_connect: HashMap<String, BTreeSet<InstanceKey>>,
    pub config: HashMap<(String, String), ConfigEntryStored>,
    topics: HashMap<TopicKey, TopicState>,
    topic_buffer: usize,
    /// The KV table (under the same lock: KV writes take raft indexes).
    pub kv: super::kv::KvStore,
}

impl Store {
    pub(crate) fn new(datacenter: String, topic_buffer: usize) -> Self {
        Self {
            raft_index: 0,
            datacenter,
            nodes: HashMap::new(),
            by_name: HashMap::new(),
            by_connect: HashMap::new(),
            config: HashMap::new(),
            topics: HashMap::new(),
            topic_buffer: topic_buffer.max(1),
            kv: super::kv::KvStore::default(),
        }
    }

    /// Takes the index of a new raft write.
    pub(crate) fn next_index(&mut self) -> u64 {
        self.raft_index += 1;
        self.raft_index
    }

    pub(crate) fn service(&self, key: &InstanceKey) -> Option<&ServiceEntry> {
        self.nodes.get(&key.0)?.services.get(&key.1)
    }

    /// The mesh endpoints of service `name` (its proxies and Connect-native
    /// instances), in (node, id) order.
    pub(crate) fn connect_instances(&self, name: &str) -> impl Iterator<Item = &InstanceKey> {
        self.by_connect.get(name).into_iter().flatten()
    }

    /// A receiver of every event published on `key` from now on, without a
    /// snapshot (the xDS server wakes on them).
    pub(crate) fn watch(&mut self, key: &TopicKey) -> broadcast::Receiver<Bytes> {
        let cap = self.topic_buffer;
        self.topics
            .entry(key.clone())
            .or_default()
            .tx
            .get_or_insert_with(|| broadcast::channel(cap).0)
            .subscribe()
    }

    /// The index a blocking query on service `name` answers with and waits
    /// past: its last change (the last event on its `ServiceHealth`
    /// topic), or the raft index when it never changed; at least 1.
    pub(crate) fn service_index(&self, name: &str) -> u64 {
        self.topics
            .get(&TopicKey::new(Topic::ServiceHealth, name))
            .map(|t| t.last_index)
            .filter(|i| *i > 0)
            .unwrap_or(self.raft_index)
            .max(1)
    }

    /// Instances registered under service `name`, in (node, id) order.
    pub(crate) fn instances(&self, name: &str) -> impl Iterator<Item = &InstanceKey> {
        self.by_name.get(name).into_iter().flatten()
    }

    fn touch(&self, t: &mut Touched, key: &InstanceKey) {
        if t.prev.contains_key(key) {
            return;
        }
        let prev = self.service(key).map(|s| PrevService {
            def: s.def.clone(),
            create_index: s.create_index,
            modify_index: s.modify_index,
        });
        t.order.push(key.clone());
        t.prev.insert(key.clone(), prev);
    }

    fn touch_node(&self, t: &mut Touched, node: &str) {
        if let Some(n) = self.nodes.get(node) {
            for id in n.services.keys() {
                self.touch(t, &(node.to_owned(), id.clone()));
            }
        }
    }

    fn index_instance(&mut self, key: &InstanceKey, def: &ServiceDef) {
        self.by_name
            .entry(def.service.clone())
            .or_default()
            .insert(key.clone());
        if let Some(dest) = def.connect_service() {
            self.by_connect
                .entry(dest.to_owned())
                .or_default()
                .insert(key.clone());
        }
    }

    fn unindex_instance(&mut self, key: &InstanceKey, def: &ServiceDef) {
        fn remove(map: &mut HashMap<String, BTreeSet<InstanceKey>>, name: &str, key: &InstanceKey) {
            if let Some(set) = map.get_mut(name) {
                set.remove(key);
                if set.is_empty() {
                    map.remove(name);
                }
            }
        }
        remove(&mut self.by_name, &def.service, key);
        if let Some(dest) = def.connect_service() {
            remove(&mut self.by_connect, dest, key);
        }
    }

    /// Whether a write may add node `name` (it exists, or there is room).
    pub(crate) fn room_for_node(&self, name: &str) -> bool {
        self.nodes.len() < MAX_NODES || self.nodes.contains_key(name)
    }

    /// Whether a subscription to `key` may be tracked (known, or room).
    pub(crate) fn room_for_topic(&self, key: &TopicKey) -> bool {
        self.topics.len() < MAX_TOPICS || self.topics.contains_key(key)
    }

    /// Whether a config entry may be written (exists, or there is room).
    pub(crate) fn room_for_config(&self, kind: &str, name: &str) -> bool {
        self.config.len() < MAX_CONFIG_ENTRIES
            || self
                .config
                .contains_key(&(kind.to_owned(), name.to_owned()))
    }

    /// Creates or updates a node (a new node beyond [`MAX_NODES`] is not
    /// stored: callers check [`Store::room_for_node`] to refuse it).
    pub(crate) fn ensure_node(&mut self, name: &str, def: NodeDef, idx: u64, t: &mut Touched) {
        if !self.room_for_node(name) {
            return;
        }
        match self.nodes.get(name) {
            Some(n) if n.def == def => {}
            Some(_) => {
                self.touch_node(t, name);
                let n = self.nodes.get_mut(name).expect("checked above");
                n.def = def;
                n.modify_index = idx;
            }
            None => {
                self.nodes.insert(
                    name.to_owned(),
                    NodeEntry {
                        def,
                        create_index: idx,
                        modify_index: idx,
                        services: BTreeMap::new(),
                        checks: BTreeMap::new(),
                        coord: None,
                    },
                );
            }
        }
    }

    /// Creates or updates a service instance on an existing node.
    pub(crate) fn ensure_service(
        &mut self,
        node: &str,
        def: ServiceDef,
        idx: u64,
        t: &mut Touched,
    ) -> Result<(), WriteError> {
        let n = self.nodes.get(node).ok_or(WriteError::MissingNode)?;
        let key = (node.to_owned(), def.id.clone());
        let old_def = match n.services.get(&def.id) {
            Some(s) if s.def == def => return Ok(()),
            Some(s) => Some(s.def.clone()),
            None if n.services.len() >= MAX_PER_NODE => {
                return Err(WriteError::Full);
            }
            None => None,
        };
        self.touch(t, &key);
        if let Some(old) = &old_def {
            self.unindex_instance(&key, old);
        }
        self.index_instance(&key, &def);
        let n = self.nodes.get_mut(node).expect("checked above");
        match n.services.get_mut(&def.id) {
            Some(s) => {
                s.def = def;
                s.modify_index = idx;
            }
            None => {
                n.services.insert(
                    def.id.clone(),
                    ServiceEntry {
                        def,
                        create_index: idx,
                        modify_index: idx,
                        payload: Payload {
                            tag: events::TAG_SERVICE_HEALTH,
                            bytes: Bytes::new(),
                        },
                    },
                );
            }
        }
        Ok(())
    }

    /// Creates or updates a check on an existing node (and service).
    pub(crate) fn ensure_check(
        &mut self,
        node: &str,
        mut def: CheckDef,
        idx: u64,
        t: &mut Touched,
    ) -> Result<(), WriteError> {
        let n = self.nodes.get(node).ok_or(WriteError::MissingNode)?;
        if !def.service_id.is_empty() {
            let svc = n
                .services
                .get(&def.service_id)
                .ok_or(WriteError::MissingService)?;
            def.service_name = svc.def.service.clone();
        } else {
            def.service_name.clear();
        }
        if def.status.is_empty() {
            def.status = "critical".into();
        }
        let old_service = match n.checks.get(&def.check_id) {
            Some(c) if c.def == def => return Ok(()),
            Some(c) => Some(c.def.service_id.clone()),
            None if n.checks.len() >= MAX_PER_NODE => {
                return Err(WriteError::Full);
            }
            None => None,
        };
        for sid in old_service.iter().chain(std::iter::once(&def.service_id)) {
            if sid.is_empty() {
                self.touch_node(t, node);
            } else {
                self.touch(t, &(node.to_owned(), sid.clone()));
            }
        }
        let n = self.nodes.get_mut(node).expect("checked above");
        match n.checks.get_mut(&def.check_id) {
            Some(c) => {
                c.def = def;
                c.modify_index = idx;
            }
            None => {
                n.checks.insert(
                    def.check_id.clone(),
                    CheckEntry {
                        def,
                        create_index: idx,
                        modify_index: idx,
                    },
                );
            }
        }
        Ok(())
    }

    /// Removes a node with its services and checks. Returns whether it existed.
    pub(crate) fn delete_node(&mut self, node: &str, t: &mut Touched) -> bool {
        if !self.nodes.contains_key(node) {
            return false;
        }
        self.touch_node(t, node);
        let n = self.nodes.remove(node).expect("checked above");
        for (id, s) in &n.services {
            self.unindex_instance(&(node.to_owned(), id.clone()), &s.def);
        }
        true
    }

    /// Removes a service instance and its checks.
    pub(crate) fn delete_service(&mut self, node: &str, id: &str, t: &mut Touched) {
        let key = (node.to_owned(), id.to_owned());
        let Some(def) = self.service(&key).map(|s| s.def.clone()) else {
            return;
        };
        self.touch(t, &key);
        self.unindex_instance(&key, &def);
        let n = self.nodes.get_mut(node).expect("service found");
        n.services.remove(id);
        n.checks.retain(|_, c| c.def.service_id != id);
    }

    /// Removes a check.
    pub(crate) fn delete_check(&mut self, node: &str, check_id: &str, t: &mut Touched) {
        let Some(sid) = self
            .nodes
            .get(node)
            .and_then(|n| n.checks.get(check_id))
            .map(|c| c.def.service_id.clone())
        else {
            return;
        };
        if sid.is_empty() {
            self.touch_node(t, node);
        } else {
            self.touch(t, &(node.to_owned(), sid));
        }
        if let Some(n) = self.nodes.get_mut(node) {
            n.checks.remove(check_id);
        }
    }

    /// Writes a config entry; `service-intentions` entries publish an event.
    pub(crate) fn put_config(
        &mut self,
        kind: &str,
        name: &str,
        body: serde_json::Value,
        sources: Option<Vec<(String, bool, String)>>,
        idx: u64,
    ) {
        let key = (kind.to_owned(), name.to_owned());
        let create_index = self.config.get(&key).map_or(idx, |c| c.create_index);
        let payload = sources
            .as_deref()
            .map(|s| events::intentions(name, Some(s), (create_index, idx)));
        if let Some(p) = &payload {
            self.publish(
                TopicKey::new(Topic::ServiceIntentions, name),
                idx,
                events::event(idx, p),
            );
        }
        self.config.insert(
            key,
            ConfigEntryStored {
                body,
                create_index,
                modify_index: idx,
                payload,
            },
        );
    }

    /// Deletes a config entry; returns whether it existed.
    pub(crate) fn delete_config(&mut self, kind: &str, name: &str, idx: u64) -> bool {
        let Some(old) = self.config.remove(&(kind.to_owned(), name.to_owned())) else {
            return false;
        };
        if old.payload.is_some() {
            let p = events::intentions(name, None, (old.create_index, idx));
            self.publish(
                TopicKey::new(Topic::ServiceIntentions, name),
                idx,
                events::event(idx, &p),
            );
        }
        true
    }

    fn register_payload(&self, node_name: &str, node: &NodeEntry, svc: &ServiceEntry) -> Payload {
        let view = self.view(
            node_name,
            node,
            &svc.def,
            (svc.create_index, svc.modify_index),
        );
        let checks = node
            .checks
            .values()
            .filter(|c| c.def.service_id.is_empty() || c.def.service_id == svc.def.id)
            .map(|c| {
                (
                    c.def.check_id.as_str(),
                    c.def.name.as_str(),
                    c.def.status.as_str(),
                    c.def.service_id.as_str(),
                    c.def.service_name.as_str(),
                )
            });
        events::register(&view, checks)
    }

    fn view<'a>(
        &'a self,
        node_name: &'a str,
        node: &'a NodeEntry,
        def: &'a ServiceDef,
        service_index: (u64, u64),
    ) -> InstanceView<'a> {
        InstanceView {
            datacenter: &self.datacenter,
            node_id: &node.def.id,
            node: node_name,
            node_address: &node.def.address,
            node_meta: &node.def.meta,
            node_index: (node.create_index, node.modify_index),
            kind: &def.kind,
            service_id: &def.id,
            service: &def.service,
            tags: &def.tags,
            service_address: &def.address,
            port: def.port,
            service_index,
        }
    }

    /// Refreshes the payloads of the touched instances and publishes one event
    /// per topic+key at `idx`. Returns how many events were published.
    pub(crate) fn commit(&mut self, idx: u64, t: Touched) -> usize {
        let Touched { order, mut prev } = t;
        let mut per_key: Vec<(TopicKey, Vec<Payload>)> = Vec::new();
        let mut slot: HashMap<TopicKey, usize> = HashMap::new();
        let mut push = |key: TopicKey, p: Payload| {
            let i = *slot.entry(key.clone()).or_insert_with(|| {
                per_key.push((key, Vec::new()));
                per_key.len() - 1
            });
            per_key[i].1.push(p);
        };
        let empty_meta = BTreeMap::new();
        for key in order {
            let prev = prev.remove(&key).flatten();
            let mut new_keys = Vec::new();
            let current = self
                .nodes
                .get(&key.0)
                .and_then(|n| n.services.get(&key.1).map(|s| (n, s)));
            if let Some((node, svc)) = current {
                let payload = self.register_payload(&key.0, node, svc);
                new_keys = svc.def.topic_keys();
                for k in &new_keys {
                    push(k.clone(), payload.clone());
                }
                let svc = self
                    .nodes
                    .get_mut(&key.0)
                    .and_then(|n| n.services.get_mut(&key.1))
                    .expect("found above");
                svc.payload = payload;
            }
            if let Some(prev) = prev {
                let gone: Vec<TopicKey> = prev
                    .def
                    .topic_keys()
                    .into_iter()
                    .filter(|k| !new_keys.contains(k))
                    .collect();
                if !gone.is_empty() {
                    let view = InstanceView {
                        datacenter: &self.datacenter,
                        node_id: "",
                        node: &key.0,
                        node_address: "",
                        node_meta: &empty_meta,
                        node_index: (0, 0),
                        kind: &prev.def.kind,
                        service_id: &prev.def.id,
                        service: &prev.def.service,
                        tags: &prev.def.tags,
                        service_address: &prev.def.address,
                        port: prev.def.port,
                        service_index: (prev.create_index, prev.modify_index),
                    };
                    let payload = events::deregister(&view);
                    for k in gone {
                        push(k, payload.clone());
                    }
                }
            }
        }
        let published = per_key.len();
        for (key, payloads) in per_key {
            let ev = events::for_index(idx, &payloads);
            self.publish(key, idx, ev);
        }
        published
    }

    fn publish(&mut self, key: TopicKey, idx: u64, ev: Bytes) {
        let ts = self.topics.entry(key).or_default();
        ts.last_index = idx;
        if let Some(tx) = &ts.tx {
            if tx.receiver_count() == 0 {
                ts.tx = None;
            } else {
                let _ = tx.send(ev);
            }
        }
    }

    /// Starts a subscription at `index` (0 = fresh).
    pub(crate) fn subscribe(
        &mut self,
        key: &TopicKey,
        index: u64,
    ) -> (Start, broadcast::Receiver<Bytes>) {
        let cap = self.topic_buffer;
        let ts = self.topics.entry(key.clone()).or_default();
        let resume = index > 0 && ts.last_index == index;
        let last = ts.last_index;
        let rx = ts
            .tx
            // Bound: `topic_buffer` events per topic; a subscriber that
            // falls further behind gets a new snapshot instead.
            .get_or_insert_with(|| broadcast::channel(cap).0)
            .subscribe();
        if resume {
            return (Start::Resume, rx);
        }
        let snapshot_index = if last > 0 {
            last
        } else {
            self.raft_index.max(1)
        };
        (
            Start::Snapshot {
                new_snapshot_to_follow: index > 0,
                index: snapshot_index,
                payloads: self.snapshot(key),
            },
            rx,
        )
    }

    fn snapshot(&self, key: &TopicKey) -> Vec<Payload> {
        let instances = |map: &HashMap<String, BTreeSet<InstanceKey>>| -> Vec<Payload> {
            map.get(&key.key)
                .into_iter()
                .flatten()
                .filter_map(|k| self.service(k))
                .map(|s| s.payload.clone())
                .collect()
        };
        match key.topic {
            Topic::ServiceHealth => instances(&self.by_name),
            Topic::ServiceHealthConnect => instances(&self.by_connect),
            Topic::ServiceIntentions => self
                .config
                .get(&("service-intentions".to_owned(), key.key.clone()))
                .and_then(|c| c.payload.clone())
                .into_iter()
                .collect(),
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consul::write_error::CATALOG_FULL;
    use agent_sim_proto::consul::subscribe::{Event, event::Payload as P};
    use prost::Message;

    fn node(addr: &str) -> NodeDef {
        NodeDef {
            address: addr.into(),
            ..NodeDef::default()
        }
    }

    fn svc(id: &str, name: &str) -> ServiceDef {
        ServiceDef {
            id: id.into(),
            service: name.into(),
            port: 8080,
            ..ServiceDef::default()
        }
    }

    fn write(store: &mut Store, f: impl FnOnce(&mut Store, u64, &mut Touched)) -> u64 {
        let idx = store.next_index();
        let mut t = Touched::default();
        f(store, idx, &mut t);
        store.commit(idx, t);
        idx
    }

    #[test]
    fn identical_reregistration_publishes_nothing() {
        let mut s = Store::new("dc1".into(), 8);
        let key = TopicKey::new(Topic::ServiceHealth, "web");
        write(&mut s, |s, i, t| {
            s.ensure_node("n1", node("10.0.0.1"), i, t);
            s.ensure_service("n1", svc("web-1", "web"), i, t).unwrap();
        });
        let (_, mut rx) = s.subscribe(&key, 0);
        write(&mut s, |s, i, t| {
            s.ensure_node("n1", node("10.0.0.1"), i, t);
            s.ensure_service("n1", svc("web-1", "web"), i, t).unwrap();
        });
        assert!(rx.try_recv().is_err());
        // A node address change re-publishes every instance on the node.
        let idx = write(&mut s, |s, i, t| {
            s.ensure_node("n1", node("10.0.0.9"), i, t)
        });
        let ev = Event::decode(rx.try_recv().unwrap()).unwrap();
        assert_eq!(ev.index, idx);
        assert!(matches!(ev.payload, Some(P::ServiceHealth(_))));
    }

    #[test]
    fn renaming_a_service_deregisters_it_from_the_old_key() {
        let mut s = Store::new("dc1".into(), 8);
        write(&mut s, |s, i, t| {
            s.ensure_node("n1", node("10.0.0.1"), i, t);
            s.ensure_service("n1", svc("x-1", "old"), i, t).unwrap();
        });
        let (_, mut old_rx) = s.subscribe(&TopicKey::new(Topic::ServiceHealth, "old"), 0);
        write(&mut s, |s, i, t| {
            s.ensure_service("n1", svc("x-1", "new"), i, t).unwrap()
        });
        let ev = Event::decode(old_rx.try_recv().unwrap()).unwrap();
        let Some(P::ServiceHealth(sh)) = ev.payload else {
            panic!()
        };
        assert_eq!(sh.op, 1);
        assert_eq!(s.instances("new").count(), 1);
        assert_eq!(s.instances("old").count(), 0);
    }

    #[test]
    fn connect_proxies_publish_on_the_destination_key() {
        let mut s = Store::new("dc1".into(), 8);
        let (_, mut rx) = s.subscribe(&TopicKey::new(Topic::ServiceHealthConnect, "api"), 0);
        write(&mut s, |s, i, t| {
            s.ensure_node("n1", node("10.0.0.1"), i, t);
            let mut p = svc("api-1-sidecar-proxy", "api-sidecar-proxy");
            p.kind = "connect-proxy".into();
            p.proxy = Some(serde_json::json!({"DestinationServiceName": "api"}));
            s.ensure_service("n1", p, i, t).unwrap();
        });
        assert!(rx.try_recv().is_ok());
    }

    #[test]
    fn service_write_needs_the_node() {
        let mut s = Store::new("dc1".into(), 8);
        let mut t = Touched::default();
        let e = s
            .ensure_service("nope", svc("a", "a"), 1, &mut t)
            .unwrap_err();
        assert_eq!(e, WriteError::MissingNode);
    }

    #[test]
    fn a_node_holds_at_most_its_bound_of_services_and_checks() {
        let mut s = Store::new("dc1".into(), 8);
        let mut t = Touched::default();
        s.ensure_node("n1", node("10.0.0.1"), 1, &mut t);
        for i in 0..MAX_PER_NODE {
            s.ensure_service("n1", svc(&format!("s{i}"), "web"), 1, &mut t)
                .unwrap();
        }
        let e = s
            .ensure_service("n1", svc("one-more", "web"), 1, &mut t)
            .unwrap_err();
        assert_eq!(e, WriteError::Full);
        assert_eq!(e.to_string(), CATALOG_FULL);
        // Updating one it holds is still fine.
        s.ensure_service("n1", svc("s0", "api"), 2, &mut t).unwrap();
        assert_eq!(s.nodes["n1"].services.len(), MAX_PER_NODE);
        assert!(s.room_for_node("n1") && s.room_for_node("n2"));
    }
}
