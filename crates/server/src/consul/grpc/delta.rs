//! What a Delta xDS stream keeps per resource type, as Consul's delta
//! server does: subscriptions (or wildcard), the versions the proxy ACKed,
//! what is in flight by nonce; and the response that brings the proxy to
//! the current resources ([`TypeState::delta`], Consul's
//! `createDeltaResponse`), sent in Consul's [`ORDER`]. Pure: no I/O.

use std::collections::{BTreeSet, HashMap};

use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryResponse, Resource};

use crate::consul::xds::{self, CLUSTER_TYPE, ENDPOINT_TYPE};

/// One resource type's state on a stream (what Consul's delta server keeps).
#[derive(Default)]
pub(super) struct TypeState {
    pub(super) registered: bool,
    pub(super) wildcard: bool,
    pub(super) sent_once: bool,
    pub(super) subscriptions: BTreeSet<String>,
    /// What the proxy has ACKed: name → version.
    pub(super) versions: HashMap<String, String>,
    /// Sent, not yet ACKed: nonce → (name, version or `None` for a removal).
    pub(super) pending: HashMap<String, Vec<(String, Option<String>)>>,
}

impl TypeState {
    pub(super) fn subscribed(&self, name: &str) -> bool {
        self.wildcard || self.subscriptions.contains(name)
    }

    /// The response that brings the proxy to `current` (upserts and/or
    /// removals), Consul's `createDeltaResponse`; `None` when nothing is due.
    pub(super) fn delta(
        &mut self,
        type_url: &str,
        current: &xds::Resources,
        upsert: bool,
        remove: bool,
        nonce: &mut u64,
    ) -> Option<DeltaDiscoveryResponse> {
        if !self.registered || current.is_empty() {
            return None;
        }
        let mut relevant = false;
        let mut updates: Vec<(String, Option<String>)> = Vec::new();
        for (name, held) in &self.versions {
            if !self.subscribed(name) {
                continue;
            }
            match current.get(name) {
                None if self.wildcard => {
                    relevant |= remove;
                    updates.push((name.clone(), None));
                }
                None => {}
                Some(b) if b.version != *held => {
                    relevant |= upsert;
                    updates.push((name.clone(), Some(b.version.clone())));
                }
                Some(_) => {}
            }
        }
        for (name, b) in current {
            if self.versions.contains_key(name) || !self.subscribed(name) {
                continue;
            }
            relevant |= upsert;
            updates.push((name.clone(), Some(b.version.clone())));
        }
        if !relevant && self.sent_once {
            return None;
        }
        let mut resp = DeltaDiscoveryResponse {
            type_url: type_url.to_owned(),
            ..Default::default()
        };
        let mut real = Vec::new();
        for (name, version) in updates {
            match version {
                None if remove => {
                    resp.removed_resources.push(name.clone());
                    real.push((name, None));
                }
                Some(v) if upsert => {
                    resp.resources.push(Resource {
                        name: name.clone(),
                        version: v.clone(),
                        resource: Some(current[&name].any.clone()),
                        ..Default::default()
                    });
                    real.push((name, Some(v)));
                }
                _ => {}
            }
        }
        resp.resources.sort_by(|a, b| a.name.cmp(&b.name));
        *nonce += 1;
        resp.nonce = format!("{:08x}", *nonce);
        self.pending.insert(resp.nonce.clone(), real);
        Some(resp)
    }

    /// Applies an ACK; returns the names upserted (their children must be
    /// sent again).
    pub(super) fn ack(&mut self, nonce: &str) -> Vec<String> {
        let Some(updates) = self.pending.remove(nonce) else {
            return Vec::new();
        };
        self.sent_once = true;
        let mut upserted = Vec::new();
        for (name, version) in updates {
            match version {
                None => {
                    self.versions.remove(&name);
                }
                Some(v) => {
                    self.versions.insert(name.clone(), v);
                    upserted.push(name);
                }
            }
        }
        upserted
    }
}

/// The index of a served type in [`TYPE_URLS`].
pub(super) fn type_index(type_url: &str) -> Option<usize> {
    match type_url {
        CLUSTER_TYPE => Some(0),
        ENDPOINT_TYPE => Some(1),
        _ => None,
    }
}

/// The types served: clusters, endpoints.
pub(super) const TYPE_URLS: [&str; 2] = [CLUSTER_TYPE, ENDPOINT_TYPE];

/// Consul's order of operations: upserts of clusters, then endpoints, then
/// removals of clusters, then endpoints.
pub(super) const ORDER: [(usize, bool, bool); 4] = [
    (0, true, false),
    (1, true, false),
    (0, false, true),
    (1, false, true),
];
