//! Failover end to end: three embedded servers, one stopped mid-run and
//! started again (`--server-down`). Sensu agents move to the next backend
//! on their next attempt; Consul agents' routers move them on a lost
//! session and, after the server is back, their rebalances give it its
//! share again. The summary, its schema, the table and the page say so.

use std::time::Duration;

use agent_sim::{Kind, Ramp, RunBuilder};
use agent_sim_metrics::summary::Summary;

use crate::common::{assert_exit, temp_path};

fn validates(s: &Summary) {
    let v = serde_json::to_value(s).unwrap();
    agent_sim_testkit::validate_json(agent_sim_metrics::SUMMARY_SCHEMA, &v)
        .expect("the summary validates");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sensu_agents_move_to_the_surviving_backends_at_once() {
    let outcome = RunBuilder::new(Kind::Sensu)
        .agents(300)
        .ramp(Ramp::per_second(1000.0))
        .duration(Duration::from_secs(7))
        .args(|a| {
            a.embedded_servers = Some(3);
            a.server_downs = vec!["at=2s,server=1,for=2s".parse().unwrap()];
            a.progress_every = Some("1s".parse().unwrap());
        })
        .run()
        .await
        .expect("run");
    assert_exit(&outcome, 0);
    let s = &outcome.summary;
    assert_eq!(s.agents.connected, 300, "{:?}", s.outcome);
    validates(s);
    assert_eq!(s.by_server.len(), 3, "{:?}", s.by_server);
    let down = &s.by_server[1];
    assert!(down.down_at_s.is_some(), "{down:?}");
    // Its agents went to the others at their next attempt: the survivors
    // hold the whole fleet and took the surge.
    let held: u64 = s.by_server.iter().map(|b| b.held_at_end).sum();
    assert_eq!(held, 300);
    assert!(s.by_server[0].peak_connects_per_s > 0.0);
    let d = s
        .disruptions
        .iter()
        .find(|d| d.cause == "backend")
        .expect("the loss is a detected disruption");
    assert_eq!(d.sessions_lost, d.back, "{d:?}");
    assert!(
        d.back_after_s.p100.is_some(),
        "every lost session back: {d:?}"
    );
    let table = agent_sim_metrics::report::render(s);
    assert!(
        table.contains("servers") && table.contains("down at"),
        "{table}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_agents_fail_over_and_spread_back_after_the_return() {
    let page = temp_path("failover.html");
    let outcome = RunBuilder::new(Kind::Consul)
        .agents(900)
        .ramp(Ramp::per_second(2000.0))
        // A reconnected agent is back once its staggered sync answers:
        // up to 3 s × 4 (Consul's scale at 900 nodes) after its session.
        .duration(Duration::from_secs(20))
        .args(|a| {
            a.embedded_servers = Some(3);
            a.server_downs = vec!["at=2s,server=2,for=2s".parse().unwrap()];
            a.rebalance_min = Some("1s".parse().unwrap());
            a.upstreams = Some("web".parse().unwrap());
            a.probe = Some("off".parse().unwrap());
            a.progress_every = Some("1s".parse().unwrap());
            a.report_html = Some(page.clone());
        })
        .run()
        .await
        .expect("run");
    assert_exit(&outcome, 0);
    let s = &outcome.summary;
    assert_eq!(s.agents.connected, 900, "{:?}", s.outcome);
    validates(s);
    let down = &s.by_server[2];
    let (Some(d), Some(b)) = (down.down_at_s, down.back_at_s) else {
        panic!("down and back: {down:?}");
    };
    assert!(b > d, "{down:?}");
    assert!(
        down.even_after_s.is_some(),
        "the rebalances gave it its share again: {:?}",
        s.by_server
    );
    // Moves between servers are no losses: only the stop lost sessions.
    let lost: u64 = s.sessions_lost.values().sum();
    assert!(lost <= 900, "{:?}", s.sessions_lost);
    assert!(s.counters["router_pings"] > 0);
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("Sessions per server"), "the page draws them");
    let _ = std::fs::remove_file(&page);
}

#[tokio::test]
async fn server_down_needs_the_embedded_servers() {
    let with_target = RunBuilder::new(Kind::Sensu)
        .agents(1)
        .target("127.0.0.1:9")
        .args(|a| a.server_downs = vec!["at=1s,server=0,for=1s".parse().unwrap()])
        .run()
        .await;
    let e = with_target.expect_err("refused").to_string();
    assert!(e.contains("stop the real server yourself"), "{e}");
    let out_of_range = RunBuilder::new(Kind::Sensu)
        .agents(1)
        .args(|a| {
            a.embedded_servers = Some(2);
            a.server_downs = vec!["at=1s,server=2,for=1s".parse().unwrap()];
        })
        .run()
        .await;
    let e = out_of_range.expect_err("refused").to_string();
    assert!(e.contains("numbered from 0"), "{e}");
    assert!(
        "at=1s,server=x,for=1s"
            .parse::<agent_sim::values::ServerDown>()
            .is_err()
    );
}
