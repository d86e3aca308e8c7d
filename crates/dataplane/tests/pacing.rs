//! The embedded server's pacing of proxy updates (Consul's
//! `xds.update_max_per_second`, `serve --xds-update-rate`): sidecars that
//! all start at once get their first configuration one token apart, and
//! never before the coalescing delay; with no limit (`off`) all of them
//! after the coalescing delay; each server of a cluster paces its own.
//! Paused time, 127.0.0.1:0.

use std::time::Duration;

use agent_sim_dataplane::DataplaneFactory;
use agent_sim_fleet::{FleetConfig, Rate};
use agent_sim_server::consul::ConsulTargetConfig;

use crate::common::*;

/// `xds_initial` of sidecars, in µs at the histogram's 3 significant
/// figures.
struct Initial {
    min: u64,
    p10: u64,
    p50: u64,
    max: u64,
    /// 200 ms, as the histogram holds it.
    coalesce: u64,
}

/// `xds_initial` of `agents` sidecars started within 10 ms against a
/// server pacing updates at `rate` per second (0: no limit).
async fn first_configurations(agents: u64, rate: f64) -> Initial {
    first_configurations_on(1, agents, rate).await
}

/// The same against a cluster of `servers` (one state, a gRPC port each),
/// the sidecars spread over their ports.
async fn first_configurations_on(servers: usize, agents: u64, rate: f64) -> Initial {
    let t = start_with(ConsulTargetConfig {
        xds_update_rate: rate,
        ..ConsulTargetConfig::default()
    })
    .await;
    let mut cfg = config(&t);
    for _ in 1..servers {
        let g = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        cfg.conn.targets.push(g.local_addr().unwrap().to_string());
        let serve = agent_sim_server::consul::serve_grpc(g, t.state.clone(), t.stop.clone());
        tokio::spawn(serve);
    }
    let m = metrics();
    let f = DataplaneFactory::new(cfg, m.clone()).unwrap();
    let fc = FleetConfig {
        agents,
        ramp: Some(Rate::per_second(10_000.0)),
        duration: Some(Duration::from_secs(4)),
        grace: Duration::from_secs(5),
        ..FleetConfig::default()
    };
    let report = run_fleet(f, fc, &m).await;
    assert_eq!(report.connected_at_end, agents, "{report:?}");
    m.collect();
    let h = m.cumulative_of("xds_initial").unwrap();
    assert_eq!(h.len(), agents);
    Initial {
        min: h.min(),
        p10: h.value_at_quantile(0.1),
        p50: h.value_at_quantile(0.5),
        max: h.max(),
        coalesce: h.lowest_equivalent(200_000),
    }
}

#[tokio::test(start_paused = true)]
async fn n_first_configurations_at_rate_r_take_n_over_r_and_no_less_than_the_coalescing_delay() {
    // 100 proxies at 50/s: tokens at 0, 20 ms, ..., 1.98 s; the first ten
    // are due within the 200 ms coalescing delay and wait for it.
    let h = first_configurations(100, 50.0).await;
    assert!(h.min >= h.coalesce, "min {}", h.min);
    assert!(h.p10 < 260_000, "p10 {}", h.p10);
    assert!((1_970_000..2_100_000).contains(&h.max), "max {}", h.max);
    // Spread evenly: the median proxy waits about half as long.
    assert!((950_000..1_100_000).contains(&h.p50), "p50 {}", h.p50);
}

#[tokio::test(start_paused = true)]
async fn no_update_rate_means_every_proxy_after_the_coalescing_delay() {
    let h = first_configurations(100, 0.0).await;
    assert!(h.min >= h.coalesce, "min {}", h.min);
    assert!(h.max < 260_000, "max {}", h.max);
}

#[tokio::test(start_paused = true)]
async fn each_server_of_a_cluster_paces_its_own_streams() {
    // 100 proxies at 50/s on one server take 2 s; spread over two servers
    // of one cluster, each server's 50 take 1 s, as each Consul server's
    // proxycfg manager has its own limiter.
    let h = first_configurations_on(2, 100, 50.0).await;
    assert!(h.min >= h.coalesce, "min {}", h.min);
    assert!((950_000..1_100_000).contains(&h.max), "max {}", h.max);
}
