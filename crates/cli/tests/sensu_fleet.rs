//! End to end: Sensu agents against the in-process reference target on
//! 127.0.0.1:0, through the same code path the binary uses.

use std::time::Duration;

use agent_sim::{Kind, Ramp, RunBuilder};
use tokio_util::sync::CancellationToken;

use crate::common::{assert_exit, temp_path};
use agent_sim_testkit::bounded::until;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_agents_connect_keepalive_and_answer_checks() {
    let summary_path = temp_path("sensu-200.json");
    let outcome = RunBuilder::new(Kind::Sensu)
        .agents(200)
        .ramp(Ramp::per_second(2000.0))
        .duration(Duration::from_secs(4))
        .args(|a| {
            a.keepalive_interval = Some("1s".parse().unwrap());
            a.embedded_check_interval = Some("500ms".parse().unwrap());
            a.summary = Some(summary_path.clone());
        })
        .assert("agents.connected == requested".parse().unwrap())
        .run()
        .await
        .expect("run");
    let s = &outcome.summary;
    assert_exit(&outcome, 0);
    assert_eq!(s.agents.requested, 200);
    assert_eq!(s.agents.connected, 200);
    assert_eq!(s.agents.peak_connected, 200);
    assert_eq!(s.agents.never_connected, 0);
    assert!(s.errors.is_empty(), "{:?}", s.errors);

    // The target saw every agent's keepalives (≥ 3 each over ~4 s at 1 s).
    let target = outcome
        .embedded_sensu
        .as_ref()
        .expect("embedded target stats");
    let sent = s.counters["keepalives_sent"];
    assert!(sent >= 600, "keepalives sent {sent}");
    assert!(target.keepalives_received >= 600, "{target:?}");
    assert!(target.keepalives_received <= sent);

    // Check requests went out and every one that arrived was answered.
    let received = s.counters["check_requests_received"];
    assert!(received >= 200, "check requests received {received}");
    assert!(target.check_requests_sent >= received);
    assert_eq!(s.counters["check_replies_sent"], received);
    assert!(target.check_replies_received >= received.saturating_sub(200));
    assert_eq!(target.frames_invalid, 0, "{target:?}");

    for name in [
        "connect",
        "session_ready",
        "keepalive_lateness",
        "check_turnaround",
    ] {
        assert!(s.latency_us[name].count > 0, "{name} has no samples");
    }

    // The summary file was written and matches the schema.
    let text = std::fs::read_to_string(&summary_path).expect("summary written");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["schema"], "agent-sim.summary.v2");
    assert_eq!(v["agents"]["connected"], 200);
    agent_sim_testkit::validate_json(agent_sim_metrics::SUMMARY_SCHEMA, &v)
        .expect("summary validates against the schema");
    let _ = std::fs::remove_file(&summary_path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupted_run_still_writes_the_summary() {
    let summary_path = temp_path("sensu-interrupted.json");
    // Our own backend, to see when every agent is in: the run is
    // interrupted once each of the 20 has sent a keepalive (not after a
    // guessed time).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let stats = std::sync::Arc::new(agent_sim_server::sensu::SensuTargetStats::default());
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    tokio::spawn(agent_sim_server::sensu::serve(
        listener,
        agent_sim_server::sensu::SensuTargetConfig::default(),
        stats.clone(),
        stop,
    ));
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        // Ends the run once 20 keepalives are in, or after 20 s.
        let _end = t.drop_guard();
        until(Duration::from_secs(20), "20 keepalives", async move || {
            stats
                .keepalives_received
                .load(std::sync::atomic::Ordering::Relaxed)
                >= 20
        })
        .await;
    });
    let outcome = RunBuilder::new(Kind::Sensu)
        .agents(20)
        .target(addr)
        .ramp(Ramp::All)
        .shutdown(token)
        .args(|a| a.summary = Some(summary_path.clone()))
        .run()
        .await
        .expect("run");
    assert_eq!(outcome.summary.agents.connected, 20);
    assert!(outcome.summary.duration_s < 10.0);
    let back = agent_sim_metrics::Summary::read(&summary_path).expect("summary written");
    assert_eq!(back.agents.requested, 20);
    let _ = std::fs::remove_file(&summary_path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_assertion_sets_exit_code_3() {
    let outcome = RunBuilder::new(Kind::Sensu)
        .agents(5)
        .ramp(Ramp::All)
        .duration(Duration::from_secs(1))
        .assert("agents.connected == requested".parse().unwrap())
        .assert("errors.total > 0".parse().unwrap())
        .run()
        .await
        .expect("run");
    assert_eq!(outcome.exit_code, 3);
    assert_eq!(outcome.verdicts.len(), 2);
    assert!(outcome.verdicts[0].passed);
    assert!(!outcome.verdicts[1].passed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_target_is_a_runtime_failure_with_counted_errors() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    let outcome = RunBuilder::new(Kind::Sensu)
        .agents(3)
        .ramp(Ramp::All)
        .target(addr.to_string())
        .duration(Duration::from_secs(1))
        .run()
        .await
        .expect("run");
    assert_eq!(outcome.exit_code, 1);
    assert_eq!(outcome.summary.agents.never_connected, 3);
    assert!(outcome.summary.errors["connect_refused"].count >= 3);
}
