//! Leaf certificates of client agents with sidecars against the embedded
//! target: a boot past the servers' signing rate (rate-limited answers
//! counted in the server's words, every agent ends with a certificate),
//! a renewal within 60-90 % of a certificate's life, and a CA rotation
//! (every agent holds a certificate of the new root). On paused time: the
//! back-off, the renewal window and the rotation stagger are timers.

use crate::common;

use std::time::Duration;

use std::sync::Arc;

use agent_sim_consul::ca_rotation::rotate_ca;
use agent_sim_consul::connect::ConnectBoard;
use agent_sim_consul::modes::AgentWire;
use agent_sim_consul::{ConsulConfig, ConsulFactory};
use agent_sim_fleet::FleetStatus;
use agent_sim_metrics::Metrics;
use agent_sim_server::consul::{CaConfig, ConsulTargetConfig, RATE_LIMITED};
use tokio_util::sync::CancellationToken;

fn sidecar_agents(t: &common::Target) -> ConsulConfig {
    ConsulConfig {
        agent: AgentWire::Client,
        sidecars: true,
        session_ttl: None,
        ..common::config(t)
    }
}

/// A fleet of `agents` sidecar agents running against `t` for `lasting`,
/// once every agent holds a certificate (waited for up to 50 s).
struct Certified {
    m: Metrics,
    board: Arc<ConnectBoard>,
    stop: CancellationToken,
    run: tokio::task::JoinHandle<()>,
}

impl Certified {
    async fn start(t: &common::Target, agents: u64, lasting: Duration) -> Self {
        let m = common::metrics();
        let factory = ConsulFactory::new(sidecar_agents(t), m.clone()).unwrap();
        let board = factory
            .connect_board()
            .expect("sidecars on the client wire");
        let fleet = common::fleet_of(agents, None, lasting);
        let stop = CancellationToken::new();
        let run = tokio::spawn({
            let (m, stop) = (m.clone(), stop.clone());
            async move {
                let status = Arc::new(FleetStatus::default());
                let _ = agent_sim_fleet::run(fleet, Arc::new(factory), m, status, stop).await;
            }
        });
        let within = Duration::from_secs(50);
        agent_sim_testkit::bounded::until(within, "every agent holds a certificate", async || {
            board.counts().0 == agents
        })
        .await;
        Certified {
            m,
            board,
            stop,
            run,
        }
    }

    /// Stops the fleet and waits for it.
    async fn stop(self) {
        self.stop.cancel();
        let _ = self.run.await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_boot_past_the_signing_rate_backs_off_and_every_agent_gets_a_certificate() {
    let t = common::start_with(ConsulTargetConfig {
        connect_ca: CaConfig {
            csr_max_per_second: 20.0,
            ..CaConfig::default()
        },
        ..ConsulTargetConfig::default()
    })
    .await;
    let agents = 60;
    let fleet = Certified::start(&t, agents, Duration::from_secs(60)).await;
    let m = fleet.m.clone();
    fleet.stop().await;
    let ca = t.state.stats().connect_ca;
    assert_eq!(ca.leaves_signed, agents);
    assert!(ca.sign_rate_limited > 0, "{ca:?}");
    assert_eq!(common::counter(&m, "leaf_certs_issued"), agents);
    assert_eq!(
        common::counter(&m, "leaf_rate_limited"),
        ca.sign_rate_limited
    );
    let warned = m.snapshot();
    assert!(
        warned
            .warnings
            .get("csr_rate_limited")
            .copied()
            .unwrap_or(0)
            > 0
    );
    assert_eq!(
        m.warning_sample("csr_rate_limited").as_deref(),
        Some(RATE_LIMITED)
    );
}

#[tokio::test(start_paused = true)]
async fn after_a_rotation_every_agent_holds_a_certificate_of_the_new_root() {
    let t = common::start_target().await;
    let agents = 20;
    let fleet = Certified::start(&t, agents, Duration::from_secs(120)).await;
    let (m, board) = (fleet.m.clone(), fleet.board.clone());
    rotate_ca(&t.api(), Some(&board)).await.unwrap();
    // leafcert's stagger: within 30 s of the roots watch answering.
    agent_sim_testkit::bounded::until(
        Duration::from_secs(45),
        "certificates of the new root",
        async || board.counts().1 == agents,
    )
    .await;
    fleet.stop().await;
    let ca = t.state.stats().connect_ca;
    assert_eq!(ca.roots_created, 2);
    assert_eq!(ca.leaves_signed, 2 * agents);
    assert_eq!(common::counter(&m, "leaf_certs_renewed"), agents);
}

#[tokio::test(start_paused = true)]
async fn certificates_are_renewed_between_60_and_90_percent_of_their_life() {
    let t = common::start_with(ConsulTargetConfig {
        connect_ca: CaConfig {
            leaf_ttl: Duration::from_secs(3600),
            ..CaConfig::default()
        },
        ..ConsulTargetConfig::default()
    })
    .await;
    let agents = 10;
    let fleet = Certified::start(&t, agents, Duration::from_secs(7200)).await;
    let m = fleet.m.clone();
    let issued = tokio::time::Instant::now();
    // A 1 h leaf: nothing before 36 min, every agent again by 54 min.
    tokio::time::sleep(Duration::from_secs(35 * 60)).await;
    assert_eq!(common::counter(&m, "leaf_certs_renewed"), 0);
    agent_sim_testkit::bounded::until(Duration::from_secs(20 * 60), "renewals", async || {
        common::counter(&m, "leaf_certs_renewed") == agents
    })
    .await;
    assert!(issued.elapsed() <= Duration::from_secs(54 * 60 + 30));
    fleet.stop().await;
    assert_eq!(t.state.stats().connect_ca.leaves_signed, 2 * agents);
}
