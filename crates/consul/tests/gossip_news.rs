//! What gossip tells the agents about their server, against the embedded
//! server with its serf port (real loopback sockets, real time, bounded):
//! a server that restarts fires `consul:new-leader` as a Consul leader
//! does when it takes leadership, and every agent answers it with one full
//! anti-entropy sync (Consul's `ServerUp`), counted apart.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use agent_sim_consul::gossip::GossipConfig;
use agent_sim_consul::{ConsulConfig, ConsulFactory};
use agent_sim_fleet::{FleetConfig, FleetStatus};
use agent_sim_server::backend::{Backend, BackendConfig, ConsulAddrs};
use agent_sim_server::consul::{ConsulTargetConfig, SerfConfig};
use agent_sim_server::faults::RestartState;
use agent_sim_testkit::bounded::until;
use common::{counter, metrics};
use tokio_util::sync::CancellationToken;

async fn backend() -> Backend {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    Backend::start(BackendConfig {
        consul: Some(ConsulAddrs {
            rpc: any,
            http: any,
            grpc: None,
            cfg: ConsulTargetConfig {
                serf: Some(SerfConfig {
                    bind: any,
                    ..SerfConfig::default()
                }),
                ..ConsulTargetConfig::default()
            },
            state: None,
        }),
        ..BackendConfig::default()
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_leaders_new_leader_event_brings_one_full_sync_per_agent() {
    let b = backend().await;
    let (rpc, http) = b.consul_addrs().unwrap();
    let serf = b.consul_serf_addr().unwrap();
    let n = 5;
    let cfg = ConsulConfig {
        conn: agent_sim_consul::Connection {
            targets: vec![rpc.to_string()],
            http_target: http.to_string(),
            ..agent_sim_consul::Connection::to(&[])
        },
        gossip: Some(GossipConfig {
            join: vec![serf.to_string()],
            join_given: true,
            bind: vec!["127.0.0.1".into()],
            ..GossipConfig::default()
        }),
        cluster_size: 10,
        ..ConsulConfig::default()
    };
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
