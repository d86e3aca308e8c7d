//! The catalog follows the pool, as a Consul 1.20 leader reconciles serf
//! members (`leader_registrator_v1.go`): an alive member's node is
//! registered (if missing, at another address, or without a passing
//! `serfHealth`) with `serfHealth` passing, "Agent alive and reachable"; a
//! failed member's `serfHealth` goes critical, "Agent not live or
//! unreachable", its node untouched (and nothing happens for a node not in
//! the catalog); a member that left, or was reaped, has its node (with its
//! services, checks and sessions) deregistered. Leaving members and this
//! server itself are left alone.
//!
//! One task per server takes the members the table marked and writes each
//! in a raft index of its own, through the store every endpoint uses, so
//! Subscribe streams, blocking queries and watches see it.

use std::collections::BTreeMap;

use agent_sim_gossip::serf::decode_tags;
use tokio_util::sync::CancellationToken;

use super::members::Status;
use super::view::Row;
use super::{Serf, lock};
use crate::consul::ConsulState;
use crate::consul::state::{CheckDef, NodeDef, SERF_HEALTH, Touched};

/// `structs.SerfCheckName`.
const CHECK_NAME: &str = "Serf Health Status";
/// `structs.SerfCheckAliveOutput`.
const ALIVE_OUTPUT: &str = "Agent alive and reachable";
/// `structs.SerfCheckFailedOutput`.
const FAILED_OUTPUT: &str = "Agent not live or unreachable";
/// `structs.MetaConsulVersion`.
const META_VERSION: &str = "consul-version";

/// Reconciles marked members until `shutdown`.
pub(super) async fn run(state: ConsulState, shutdown: CancellationToken) {
    let serf = state.serf().clone();
    loop {
        let names = lock(&serf.table).take_dirty();
        for name in names {
            if name != serf.me {
                member(&state, &serf, &name);
            }
        }
        tokio::select! {
            () = serf.dirty.notified() => {}
            () = shutdown.cancelled() => return,
        }
    }
}

/// Brings one member's catalog entry in line with its status now.
pub(super) fn member(state: &ConsulState, serf: &Serf, name: &str) {
    let row = lock(&serf.table).row(name);
    let wrote = match &row {
        Some(r) if r.status == Status::Alive => alive(state, serf, r),
        Some(r) if r.status == Status::Failed => failed(state, r),
        Some(r) if r.status == Status::Leaving => false,
        _ => deregister(state, name),
    };
    if wrote {
        serf.counters.bump(&serf.counters.reconcile_writes);
    }
}

fn serf_check(status: &str, output: &str) -> CheckDef {
    CheckDef {
        check_id: SERF_HEALTH.into(),
        name: CHECK_NAME.into(),
        status: status.into(),
        output: output.into(),
        ..CheckDef::default()
    }
}

/// `HandleAliveMember` (without the `consul` service of servers).
fn alive(state: &ConsulState, serf: &Serf, r: &Row) -> bool {
    let tags = decode_tags(&r.meta).unwrap_or_default();
    let tag = |k: &str| {
        tags.iter()
            .find(|(t, _)| t == k)
            .map(|(_, v)| v.as_str())
            .unwrap_or_default()
    };
    // Consul reads the version from the `build` tag and registers nothing
    // without it.
    let version = tag("build").split(':').next().unwrap_or_default();
    if version.is_empty() {
        serf.counters.bump(&serf.counters.reconcile_skipped);
        return false;
    }
    let addr = r.addr.to_string();
    let mut store = state.store();
    let node = store.nodes.get(&r.name);
    let healthy = node.is_some_and(|n| {
        n.def.address == addr
            && n.checks
                .get(SERF_HEALTH)
                .is_some_and(|c| c.def.status == "passing")
    });
    if healthy {
        return false;
    }
    if !store.room_for_node(&r.name) {
        serf.counters.bump(&serf.counters.reconcile_skipped);
        return false;
    }
    let (meta, tagged) = match node {
        Some(n) => (n.def.meta.clone(), n.def.tagged_addresses.clone()),
        None => (
            BTreeMap::from([(META_VERSION.to_owned(), version.to_owned())]),
            BTreeMap::new(),
        ),
    };
    let def = NodeDef {
        id: tag("id").to_owned(),
        address: addr,
        meta,
        tagged_addresses: tagged,
    };
    let idx = store.next_index();
    let mut t = Touched::default();
    store.ensure_node(&r.name, def, idx, &mut t);
    let checked = store.ensure_check(&r.name, serf_check("passing", ALIVE_OUTPUT), idx, &mut t);
    store.commit(idx, t);
    checked.is_ok()
}

/// `HandleFailedMember`: `serfHealth` critical on a node in the catalog.
fn failed(state: &ConsulState, r: &Row) -> bool {
    let addr = r.addr.to_string();
    let mut store = state.store();
    let Some(node) = store.nodes.get(&r.name) else {
        return false;
    };
    let critical = node.def.address == addr
        && node
            .checks
            .get(SERF_HEALTH)
            .is_some_and(|c| c.def.status == "critical");
    if critical {
        return false;
    }
    let idx = store.next_index();
    let mut t = Touched::default();
    let checked = store.ensure_check(&r.name, serf_check("critical", FAILED_OUTPUT), idx, &mut t);
    store.commit(idx, t);
    checked.is_ok()
}

/// `HandleLeftMember` and `HandleReapMember`: the node goes, with its
/// sessions.
fn deregister(state: &ConsulState, name: &str) -> bool {
    let mut store = state.store();
    if !store.nodes.contains_key(name) {
        return false;
    }
    let idx = store.next_index();
    let mut t = Touched::default();
    store.delete_node(name, &mut t);
    store.commit(idx, t);
    let gone = state.sessions().remove_node(name);
    state.sessions_gone(&mut store, &gone, Some(idx));
    true
}
