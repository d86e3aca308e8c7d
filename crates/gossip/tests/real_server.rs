//! Against a real Consul server, opt-in: set `AGENT_SIM_REAL_CONSUL` to
//! its HTTP address (its serf LAN port is taken as 8301 on the same host),
//! e.g. `AGENT_SIM_REAL_CONSUL=127.0.0.200:8500`. Without it the test says
//! so and passes.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use agent_sim_gossip::{Pool, PoolConfig, Security, Timings};
use agent_sim_metrics::Metrics;

fn members(http: &str) -> String {
    let mut c = TcpStream::connect(http).unwrap();
    write!(c, "GET /v1/agent/members HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut s = String::new();
    c.read_to_string(&mut s).unwrap();
    s
}

fn statuses(body: &str, prefix: &str) -> Vec<u64> {
    let json = &body[body.find("\r\n\r\n").unwrap() + 4..];
    let v: serde_json::Value = serde_json::from_str(json).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .filter(|m| m["Name"].as_str().unwrap().starts_with(prefix))
        .map(|m| m["Status"].as_u64().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_join_are_alive_and_leave_as_left() {
    let Ok(http) = std::env::var("AGENT_SIM_REAL_CONSUL") else {
        eprintln!("skipped: set AGENT_SIM_REAL_CONSUL=HOST:8500 to run against a real server");
        return;
    };
    let host: SocketAddr = http.parse().unwrap();
    let serf = SocketAddr::new(host.ip(), 8301);
    let metrics = Metrics::new(&agent_sim_gossip::metrics_spec(), 2);
    let cfg = PoolConfig {
        bind: vec!["127.0.0.1:0".parse().unwrap()],
        join: vec![serf],
        security: Security::default(),
        tags: agent_sim_gossip::serf::client_tags("dc1"),
        timings: Timings::default(),
    };
    let pool = Pool::start(cfg, metrics.clone()).await.unwrap();
    let n = 20;
    let prefix = format!("gtest-{}-", std::process::id());
    let mut slots = Vec::new();
    for i in 0..n {
        let name = format!("{prefix}{i}");
        let id = format!(
            "00000000-0000-4000-8000-{:012x}",
            std::process::id() as u64 * 1000 + i
        );
        slots.push(pool.add(&name, &id, i).0);
    }
    for &s in &slots {
        pool.join(s).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(8)).await;
    let st = statuses(&members(&http), &prefix);
    assert_eq!(st, vec![1; n as usize], "all alive");
    pool.close().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let st = statuses(&members(&http), &prefix);
    assert_eq!(st, vec![3; n as usize], "all left");
    let snap = metrics.snapshot();
    eprintln!("{:?}", snap.counters);
    assert!(snap.errors_total() == 0, "{:?}", metrics.error_report());
}
