//! Late probe changes told apart from the server's side: a write the
//! server answers late (its commit and apply) against a change it answers
//! at once and then sends late (its publishing).

use std::time::Duration;

use agent_sim_metrics::Summary;
use agent_sim_metrics::late::{Leg, late_probes};

use super::*;

/// Ten agents probed every second for 9 s against `fault` (which hits in
/// the window 4-5 s after the backend started).
async fn probed_with(fault: &str) -> (Summary, u64) {
    let b = backend(false, true, &[fault]).await;
    let run = consul_run(&b, 10, 9.0).args(|a| {
        a.probe = None;
        a.probe_every = Some("1s".parse().unwrap());
        a.probe_timeout = Some("900ms".parse().unwrap());
    });
    let s = complete(&b, run).await;
    (s, b.fault_stats().injected)
}

/// The late probes' legs, each checked to be the one the fault held.
fn late_legs(s: &Summary) -> Vec<Leg> {
    assert!(s.probes.len() >= 6, "{:#?}", s.probes);
    for p in &s.probes {
        assert_eq!((p.delivered, p.expected), (10, 10), "{p:?}");
        assert!(p.written_us.is_some(), "{p:?}");
    }
    late_probes(&s.probes).iter().map(|l| l.leg).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_the_server_answers_late_is_its_commit_and_apply() {
    bounded(Duration::from_secs(30), async {
        let (s, injected) =
            probed_with("consul.http=delay:500ms@at:4s,for:1s,path:/v1/catalog/register").await;
        assert!(injected >= 1);
        let legs = late_legs(&s);
        assert!(!legs.is_empty(), "{:#?}", s.probes);
        assert!(legs.iter().all(|&l| l == Leg::Written), "{legs:?}");
        let table = agent_sim_metrics::report::render(&s);
        assert!(table.contains("raft commit and apply"), "{table}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_answered_at_once_and_sent_late_is_its_publishing() {
    bounded(Duration::from_secs(30), async {
        let (s, injected) = probed_with("consul.frame=delay:500ms@at:4s,for:1s").await;
        assert!(
            injected >= 10,
            "one event to each agent at least: {injected}"
        );
        let legs = late_legs(&s);
        assert!(!legs.is_empty(), "{:#?}", s.probes);
        assert!(legs.iter().all(|&l| l == Leg::Published), "{legs:?}");
        let late = &late_probes(&s.probes)[0];
        assert!(late.legs.published >= 450_000, "{late:?}");
        assert!(late.legs.written < 100_000, "{late:?}");
        let table = agent_sim_metrics::report::render(&s);
        assert!(table.contains("the server's publishing"), "{table}");
    })
    .await;
}
