//! Against a real Consul server, opt-in: `AGENT_SIM_REAL_CONSUL` is its
//! HTTP address (its serf LAN port is taken as 8301 on the same host):
//!
//! ```sh
//! AGENT_SIM_REAL_CONSUL=127.0.0.200:8500 \
//!     cargo test -p agent-sim-gossip --test integration real_server -- --ignored
//! ```
//!
//! Twenty members join and the server lists them alive, then the pool
//! closes and it lists them left (each state waited for, within a bound).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use agent_sim_gossip::{Pool, PoolConfig, Security, Timings};
use agent_sim_metrics::Metrics;
use agent_sim_testkit::bounded::until;

/// How long the server may take to list a change (its gossip and its
/// push-pulls; a real agent's join or leave shows within seconds).
const SEEN_WITHIN: Duration = Duration::from_secs(30);

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
#[ignore = "needs a real Consul server: AGENT_SIM_REAL_CONSUL=HOST:8500 cargo test -p \
            agent-sim-gossip --test integration real_server -- --ignored"]
async fn members_join_are_alive_and_leave_as_left() {
    let http = std::env::var("AGENT_SIM_REAL_CONSUL")
        .expect("set AGENT_SIM_REAL_CONSUL=HOST:8500, a real Consul server's HTTP address");
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
    let listed = async |status: u64| statuses(&members(&http), &prefix) == vec![status; n as usize];
    until(SEEN_WITHIN, "every member listed alive", async || {
        listed(1).await
    })
    .await;
    pool.close().await;
    until(SEEN_WITHIN, "every member listed left", async || {
        listed(3).await
    })
    .await;
    let snap = metrics.snapshot();
    eprintln!("{:?}", snap.counters);
    assert!(snap.errors_total() == 0, "{:?}", metrics.error_report());
}
