//! Memory per simulated agent (client RSS only: the embedded target runs in
//! a child process). Ignored by default; run it with
//! `cargo test -p agent-sim-consul --release --test memory -- --ignored --nocapture memory_per_agent`
//! (`AGENT_SIM_MEM_AGENTS` = number of agents, default 2000).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use agent_sim_consul::http::HttpApi;
use agent_sim_consul::{ConsulConfig, ConsulFactory, metrics_spec};
use agent_sim_fleet::FleetStatus;
use agent_sim_metrics::Metrics;
use agent_sim_testkit::child;
use bytes::Bytes;
use tokio_util::sync::CancellationToken;

mod measure;
use measure::{backend, rss_kib, run_fleet};

const SERVE_ENV: &str = "AGENT_SIM_CONSUL_MEMORY_SERVE";

/// The server half of [`memory_per_agent`], in its child process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn serve_helper() {
    child::only_as_child(SERVE_ENV, "serve_helper", "memory_per_agent");
    let b = backend(false).await;
    let (ra, ha) = b.consul_addrs().unwrap();
    let api = HttpApi::new(ha, None, "").unwrap();
    for (node, id, svc) in [("n1", "web-1", "web"), ("n2", "api-1", "api")] {
        let body = format!(
            r#"{{"Node":"{node}","Address":"10.9.0.1","Service":{{"ID":"{id}","Service":"{svc}","Port":80}}}}"#
        );
        api.put("/v1/catalog/register", Bytes::from(body))
            .await
            .unwrap();
    }
    child::serve_for_parent(&[ra, ha]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn memory_per_agent() {
    let n = child::mem_agents(2000);
    let server = child::ChildServer::spawn(SERVE_ENV, "serve_helper");
    let (rpc, http) = (server.addrs[0].clone(), server.addrs[1].clone());
    let m = Metrics::new(&metrics_spec().merge(&agent_sim_fleet::metrics_spec()), 8);
    let factory = ConsulFactory::new(
        ConsulConfig {
            conn: agent_sim_consul::Connection {
                targets: vec![rpc],
                http_target: http,
                ..agent_sim_consul::Connection::to(&[])
            },
            ..ConsulConfig::default()
        },
        m.clone(),
    )
    .unwrap();
    let status = Arc::new(FleetStatus::default());
    let stop = CancellationToken::new();
    let start = || tokio::spawn(run_fleet(n, factory, &m, &status, &stop));
    let (run, base, up) = child::rss_around(rss_kib, start, async || {
        status.ever_connected.load(Ordering::Relaxed) >= n
            && m.snapshot().counter("sessions_created") >= n
    })
    .await;
    let s = m.snapshot();
    println!(
        "{n} agents: RSS {base} KiB → {up} KiB = {:.1} KiB per agent (snapshots {}, sessions {}, errors {:?})",
        (up.saturating_sub(base)) as f64 / n as f64,
        s.counter("snapshots"),
        s.counter("sessions_created"),
        s.errors
    );
    stop.cancel();
    let _ = run.await;
    drop(server);
    // The budget of a Consul agent (two subscriptions, a TTL session).
    let per_agent = up.saturating_sub(base) as f64 / n as f64;
    assert!(per_agent <= 40.0, "{per_agent:.1} KiB per agent");
}
