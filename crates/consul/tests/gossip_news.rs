//! What gossip tells the agents about their server, against the embedded
//! server with its serf port (real loopback sockets, real time, bounded):
//! a server that restarts fires `consul:new-leader` as a Consul leader
//! does when it takes leadership, and every agent answers it with one full
//! anti-entropy sync (Consul's `ServerUp`), counted apart; a server down
//! past its suspicion is dead to the pool, and back it is a return with a
//! sync; a gossip key that is not the server's lets no agent hold a
//! session; a fleet that ends is left, none failed, even on a server whose
//! handler lags and takes the newest message first.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{counter, gossiping, metrics, serf_backend};
use agent_sim_consul::gossip::GossipConfig;
use agent_sim_consul::{ConsulConfig, ConsulFactory};
use agent_sim_fleet::{FleetConfig, FleetStatus};
use agent_sim_gossip::{Keyring, Security};
use agent_sim_metrics::Metrics;
use agent_sim_server::backend::Backend;
use agent_sim_server::consul::{SerfConfig, SerfSnapshot};
use agent_sim_server::faults::RestartState;
use agent_sim_testkit::bounded::until;
use tokio_util::sync::CancellationToken;

async fn backend() -> Backend {
    backend_with(Security::default()).await
}

async fn backend_with(security: Security) -> Backend {
    serf_backend(SerfConfig {
        security,
        ..SerfConfig::default()
    })
    .await
}

/// A config of agents gossiping with the backend's serf port with `keys`.
fn gossiping_with(b: &Backend, keys: Vec<String>) -> ConsulConfig {
    ConsulConfig {
        cluster_size: 10,
        ..gossiping(
            b,
            GossipConfig {
                keys,
                ..GossipConfig::default()
            },
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_gossip_key_is_no_membership_and_no_session() {
    let server_key = "pUqJrVyVRj5jsiYEkM/tFQYfWyJIv4s3XkvDwy7Cu5s=";
    let b = backend_with(Security {
        label: String::new(),
        keyring: Some(Keyring::from_base64(&[server_key]).unwrap()),
    })
    .await;
    let ours = "4mKYJNl+0eW7+5Ko9CAVrIF6TPU2w5A6hoSFMkwUGNA=".to_string();
    let m = metrics();
    let n = 3;
    let fleet = FleetConfig {
        agents: n,
        duration: Some(Duration::from_secs(5)),
        label: "consul",
        ..FleetConfig::default()
    };
    let report = agent_sim_fleet::run(
        fleet,
        Arc::new(ConsulFactory::new(gossiping_with(&b, vec![ours]), m.clone()).unwrap()),
        m.clone(),
        Arc::new(FleetStatus::default()),
        CancellationToken::new(),
    )
    .await;
    // As a real agent with another key never learns its servers, none of
    // the run's agents held a session, each stopped by the cause.
    assert_eq!(report.ever_connected, 0);
    let errors = m.snapshot().errors;
    assert_eq!(errors.get("gossip_encryption"), Some(&n), "{errors:?}");
    // A cause that does not heal, whose hint names the flag.
    let spec = agent_sim_gossip::BAD_KEY;
    assert!(!spec.heals && spec.hint.contains("--gossip-key"));
    assert_eq!(counter(&m, "registrations"), 0);
    b.stop().await;
}

/// `n` agents of `cfg` running until `stop`, once every one is a gossip
/// member and registered: the metrics, the stop, the run.
async fn members(
    cfg: ConsulConfig,
    n: u64,
) -> (
    Metrics,
    CancellationToken,
    tokio::task::JoinHandle<agent_sim_fleet::FleetReport>,
) {
    let m = metrics();
    let stop = CancellationToken::new();
    let fleet = FleetConfig {
        agents: n,
        duration: None,
        grace: Duration::from_secs(10),
        label: "consul",
        ..FleetConfig::default()
    };
    let run = tokio::spawn(agent_sim_fleet::run(
        fleet,
        Arc::new(ConsulFactory::new(cfg, m.clone()).unwrap()),
        m.clone(),
        Arc::new(FleetStatus::default()),
        stop.clone(),
    ));
    let mm = m.clone();
    until(
        Duration::from_secs(30),
        "every agent a member and registered",
        async move || counter(&mm, "gossip_joins") == n && counter(&mm, "registrations") == n,
    )
    .await;
    (m, stop, run)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_leaders_new_leader_event_brings_one_full_sync_per_agent() {
    let b = backend().await;
    let n = 5;
    let (m, stop, run) = members(gossiping_with(&b, Vec::new()), n).await;
    // The start's own event came before the joins: not acted on.
    assert_eq!(counter(&m, "anti_entropy_server_up"), 0);

    let syncs = counter(&m, "anti_entropy_syncs");
    b.restart(Duration::from_millis(300), RestartState::Keep)
        .await
        .unwrap();
    let mm = m.clone();
    until(
        Duration::from_secs(30),
        "one ServerUp sync per agent",
        async move || counter(&mm, "anti_entropy_server_up") >= n,
    )
    .await;
    // Each agent once, whatever the retransmits of the event; the sync
    // itself runs within the stagger (3 s at 10 nodes), and is the same
    // sync as the reconnect's to the restarted server when both are due.
    let mm = m.clone();
    until(
        Duration::from_secs(30),
        "the triggered syncs ran",
        async move || counter(&mm, "anti_entropy_syncs") >= syncs + n,
    )
    .await;
    assert_eq!(counter(&m, "anti_entropy_server_up"), n);
    assert_eq!(
        counter(&m, "gossip_user_events"),
        1,
        "the pool took the event in once"
    );
    stop.cancel();
    let report = run.await.unwrap();
    assert_eq!(report.ever_connected, n);
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_down_past_its_suspicion_is_dead_then_back_with_a_sync() {
    let b = backend().await;
    let n = 5;
    let (m, stop, run) = members(gossiping_with(&b, Vec::new()), n).await;
    // Down for 8 s: the members' probes go unanswered, the suspicion runs
    // its course (4 s at the least in a pool this small, confirmed by
    // each member's failed probe) and the server is dead to them; back at
    // a higher incarnation, it is alive again: a return.
    let restart = {
        let b = b.clone();
        tokio::spawn(async move { b.restart(Duration::from_secs(8), RestartState::Keep).await })
    };
    let mm = m.clone();
    until(
        Duration::from_secs(30),
        "the server dead to the pool",
        async move || counter(&mm, "gossip_servers_failed") >= 1,
    )
    .await;
    restart.await.unwrap().unwrap();
    let mm = m.clone();
    until(
        Duration::from_secs(30),
        "the server back, and a sync per agent",
        async move || {
            counter(&mm, "gossip_servers_returned") >= 1
                && counter(&mm, "anti_entropy_server_up") >= n
        },
    )
    .await;
    // Its return and its new-leader event come together: one sync each
    // agent, two when the first ran between them.
    let up = counter(&m, "anti_entropy_server_up");
    assert!((n..=2 * n).contains(&up), "{up}");
    // The only server stays on every list.
    assert_eq!(counter(&m, "router_removes"), 0);
    stop.cancel();
    run.await.unwrap();
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_that_ends_is_left_not_failed_on_a_server_whose_handler_lags() {
    // Each message costs the server's handler 3 ms: a burst of 200 leaves
    // (intents, dead messages, their rebroadcasts) backs it up by seconds,
    // and it takes the newest first, as memberlist does.
    let b = serf_backend(SerfConfig {
        handle_delay: Duration::from_millis(3),
        ..SerfConfig::default()
    })
    .await;
    let n = 200;
    let cfg = ConsulConfig {
        cluster_size: n,
        ..gossiping_with(&b, Vec::new())
    };
    let (m, stop, run) = members(cfg, n).await;
    let serf = || b.consul_stats().unwrap().serf;
    // The joins' burst handled first: the leaves start on an empty queue.
    until(
        Duration::from_secs(30),
        "the server's handler caught up",
        async || serf().serf_handler_queue == 0,
    )
    .await;
    let before = serf();
    stop.cancel();
    let report = run.await.unwrap();
    assert_eq!(report.ever_connected, n);
    until(
        Duration::from_secs(60),
        "every member left or failed on the server",
        async || {
            let s = serf();
            s.serf_members_left + s.serf_members_failed == n
        },
    )
    .await;
    let s = serf();
    // A member's dead message went only once the server had its intent
    // (its rebroadcast, or its push-pull answer's status time).
    assert_eq!((s.serf_failures, s.serf_members_left), (0, n), "{s:?}");
    // Nor did the leaves flood it. Counted in messages, not in the queue's
    // drops: how far a 3 ms handler lags is the box's speed (a loaded CI
    // box dropped 13 of ~2,000 and every member still left). Here a leave
    // cost the server ~3 dead and ~7 user messages (intents, rebroadcasts).
    let got = |s: &SerfSnapshot, t: &str| s.serf_received_by_type.get(t).copied().unwrap_or(0);
    let since = |t: &str| got(&s, t) - got(&before, t);
    assert!(since("dead") <= 4 * n, "{s:?}");
    assert!(since("user") <= 10 * n, "{s:?}");
    assert_eq!(counter(&m, "gossip_leaves"), n);
    b.stop().await;
}
