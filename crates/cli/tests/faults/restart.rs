//! Backend restarts against a Sensu and a Consul fleet at once: without
//! state (scheduled by a `restart` fault) and with state (through the
//! backend handle); every agent is back at the end, exit 0.

use std::time::Duration;

use agent_sim::run::RunOutcome;
use agent_sim_server::faults::RestartState;
use agent_sim_testkit::bounded::until;

use super::*;

/// 100 Sensu and 50 Consul agents against `b` at once, for 9 s.
async fn both_fleets(b: &Backend) -> (RunOutcome, RunOutcome) {
    let (sensu, consul) = tokio::join!(sensu_run(b, 100, 9.0).run(), consul_run(b, 50, 9.0).run());
    (sensu.unwrap(), consul.unwrap())
}

/// Asserts the 50 Consul agents each lost their session to `kind`.
fn lost_all_50(c: &Summary, kind: &str) {
    assert_eq!(
        c.sessions_lost.get(kind),
        Some(&50),
        "{:?} {:#?}",
        c.sessions_lost,
        c.errors
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_that_loses_its_state_brings_every_sensu_and_consul_agent_back() {
    bounded(Duration::from_secs(25), async {
        let b = backend(true, true, &["restart@at:2s,down:1s,state:lose"]).await;
        web_instances(&b, 2).await;
        let (sensu, consul) = both_fleets(&b).await;
        let web = b.consul_state().unwrap();
        b.stop().await;
        assert_eq!(b.fault_stats().restarts, 1);
        assert_complete(&sensu);
        assert_complete(&consul);

        let s = &sensu.summary;
        assert_eq!(
            s.sessions_lost.get("ws_closed"),
            Some(&100),
            "{:?} {:#?}",
            s.sessions_lost,
            s.errors
        );
        assert_eq!(
            error(s, "ws_closed").sample.as_deref(),
            Some("close 1001 (Away): backend shutting down")
        );
        assert_eq!(s.counters["agents_reconnected"], 100);

        let c = &consul.summary;
        lost_all_50(c, "server_shutting_down");
        assert!(
            error(c, "server_shutting_down")
                .sample
                .as_deref()
                .unwrap()
                .contains("subscription closed by server, server is shutting down")
        );
        // The new server knew nothing: every node registered again, every
        // stream got a new snapshot (the upstream instances are gone).
        assert_eq!(c.counters["reregistrations"], 50);
        assert_eq!(c.counters["resumes"] + c.counters["resumes_silent"], 0);
        assert_eq!(c.counters["snapshots"], 100);
        assert_eq!(web.stats().resumes_served, 0);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_that_keeps_its_state_resumes_every_stream() {
    bounded(Duration::from_secs(25), async {
        let b = backend(true, true, &[]).await;
        web_instances(&b, 2).await;
        let restart = {
            let (b, seen) = (b.clone(), b.clone());
            tokio::spawn(async move {
                // Once every agent holds its session (and stream).
                until(
                    Duration::from_secs(10),
                    "every agent connected",
                    async move || {
                        let (s, c) = (seen.sensu_stats().unwrap(), seen.consul_stats().unwrap());
                        s.sessions_active == 100
                            && c.sessions_active == 50
                            && c.subscriptions_active == 50
                            && c.snapshots_sent >= 50
                    },
                )
                .await;
                let before = b.consul_stats().unwrap().raft_index;
                b.restart(Duration::from_secs(1), RestartState::Keep)
                    .await
                    .unwrap();
                before
            })
        };
        let (sensu, consul) = both_fleets(&b).await;
        let raft_before = restart.await.unwrap();
        let stats = b.consul_stats().unwrap();
        b.stop().await;
        assert_eq!(b.fault_stats().restarts, 1);
        assert_complete(&sensu);
        assert_complete(&consul);

        let s = &sensu.summary;
        assert_eq!(s.sessions_lost["ws_closed"], 100, "{:?}", s.sessions_lost);
        assert_eq!(s.counters["agents_reconnected"], 100);

        let c = &consul.summary;
        lost_all_50(c, "server_shutting_down");
        // The server kept its catalog, sessions and indexes: nothing to
        // register again, every stream resumed where it was.
        assert_eq!(c.counters["reregistrations"], 0);
        assert_eq!(c.counters["resumes"] + c.counters["resumes_silent"], 50);
        assert_eq!(c.counters["snapshots"], 50);
        assert_eq!(c.counters.get("sessions_expired").copied().unwrap_or(0), 0);
        assert!(stats.raft_index >= raft_before);
        assert_eq!(stats.resumes_served, 50);
    })
    .await;
}
