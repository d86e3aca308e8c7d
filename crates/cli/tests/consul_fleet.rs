//! End to end: Consul agents (and a mixed fleet) against the in-process
//! reference target on 127.0.0.1:0, through the same path as the binary.

use std::time::Duration;

use agent_sim::{Kind, Ramp, RunBuilder};

use crate::common::{assert_exit, temp_path};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_agents_subscribe_register_and_time_the_probe() {
    let summary_path = temp_path("consul-50.json");
    let outcome = RunBuilder::new(Kind::Consul)
        .agents(50)
        .ramp(Ramp::per_second(1000.0))
        .duration(Duration::from_secs(5))
        .args(|a| {
            a.upstreams = Some("web,api".parse().unwrap());
            a.probe_every = Some("1500ms".parse().unwrap());
            a.probe_timeout = Some("1s".parse().unwrap());
            a.summary = Some(summary_path.clone());
        })
        .assert("agents.connected == requested".parse().unwrap())
        .assert("probes.delivered_ratio == 1".parse().unwrap())
        .assert("errors.total == 0".parse().unwrap())
        .run()
        .await
        .expect("run");
    let s = &outcome.summary;
    assert_exit(&outcome, 0);
    assert_eq!(s.kind, "consul");
    assert_eq!(s.agents.connected, 50);
    // web, api and the run's own probe service agent-sim-probe.
    assert_eq!(s.counters["subscriptions"], 150);
    assert_eq!(s.counters["snapshots"], 150);
    assert_eq!(s.counters["registrations"], 50);
    assert!(s.probes.len() >= 2, "{:?}", s.probes);
    for p in &s.probes {
        assert_eq!(p.delivered, 50, "{p:?}");
        assert_eq!(p.expected, 50, "{p:?}");
        assert!(p.time_to_99pct_us.is_some());
    }
    assert!(s.latency_us["propagation"].count >= 100);
    let target = outcome
        .embedded_consul
        .as_ref()
        .expect("embedded target stats");
    assert_eq!(
        target.subscriptions_active, 0,
        "streams closed at shutdown: {target:?}"
    );

    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary_path).unwrap()).unwrap();
    agent_sim_testkit::validate_json(agent_sim_metrics::SUMMARY_SCHEMA, &v)
        .expect("consul summary validates");
    let _ = std::fs::remove_file(&summary_path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_config_runs_both_fleets_with_one_report() {
    let dir = temp_path("mixed");
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("mixed.toml");
    std::fs::write(
        &cfg,
        "ramp = \"all\"\n\
         [[fleet]]\nkind = \"sensu\"\nagents = 30\nkeepalive-interval = \"1s\"\n\
         [[fleet]]\nkind = \"consul\"\nagents = 20\nprobe = \"off\"\n",
    )
    .unwrap();
    let summary_path = dir.join("summary.json");
    let outcome = RunBuilder::new(Kind::Sensu)
        .duration(Duration::from_secs(3))
        .args(|a| {
            a.kind = None;
            a.config = Some(cfg.clone());
            a.summary = Some(summary_path.clone());
        })
        .run()
        .await
        .expect("run");
    let s = &outcome.summary;
    assert_eq!(s.kind, "mixed");
    assert_eq!(s.agents.requested, 50);
    assert_eq!(s.agents.connected, 50);
    assert!(s.counters["keepalives_sent"] >= 30);
    assert_eq!(s.counters["subscriptions"], 40);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary_path).unwrap()).unwrap();
    agent_sim_testkit::validate_json(agent_sim_metrics::SUMMARY_SCHEMA, &v)
        .expect("mixed summary validates");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn merged_shard_summaries_validate_and_add_up() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let parts: Vec<agent_sim::Summary> = (0..2)
        .map(|i| {
            rt.block_on(
                RunBuilder::new(Kind::Sensu)
                    .agents(40)
                    .ramp(Ramp::All)
                    .duration(Duration::from_secs(2))
                    .args(|a| a.shard = Some(format!("{i}/2").parse().unwrap()))
                    .run(),
            )
            .expect("shard run")
            .summary
        })
        .collect();
    assert_eq!(parts[0].agents.requested, 20);
    assert_eq!(parts[0].shard.as_deref(), Some("0/2"));
    let merged = agent_sim_metrics::merge::merge_summaries(&parts).unwrap();
    assert_eq!(merged.agents.requested, 40);
    assert_eq!(merged.agents.connected, 40);
    assert_eq!(
        merged.latency_us["connect"].count,
        parts[0].latency_us["connect"].count + parts[1].latency_us["connect"].count
    );
    let v = serde_json::to_value(&merged).unwrap();
    agent_sim_testkit::validate_json(agent_sim_metrics::SUMMARY_SCHEMA, &v)
        .expect("merged summary validates");

    // `report merge DIR` reads the summaries in a directory (no shell glob).
    let dir = temp_path("merge-dir");
    std::fs::create_dir_all(&dir).unwrap();
    for (i, p) in parts.iter().enumerate() {
        p.write(&dir.join(format!("summary-{i}.json"))).unwrap();
    }
    std::fs::write(dir.join("notes.txt"), "not a summary").unwrap();
    let from_dir = agent_sim::report_cmd::load_and_merge(std::slice::from_ref(&dir)).unwrap();
    assert_eq!(from_dir.agents.requested, 40);
    assert_eq!(from_dir.agents.connected, merged.agents.connected);
    // The merge step of the orchestrator configs writes into the folder it
    // reads: run again, it does not count its own last result.
    let out = dir.join("merged.json");
    for _ in 0..2 {
        let code = agent_sim::report_cmd::merge(std::slice::from_ref(&dir), Some(&out), &[]);
        assert_eq!(code, 0);
        assert_eq!(agent_sim::Summary::read(&out).unwrap().agents.requested, 40);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Criteo's scenario in small, with blocking watchers: the seeded service
/// is in the catalog while the agents run and gone after, and every
/// metadata change of the probe's instance reaches every watcher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seeded_service_with_a_changing_instance_watched_by_blocking_queries() {
    use agent_sim_server::backend::{Backend, BackendConfig, ConsulAddrs};
    let any: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    let b = Backend::start(BackendConfig {
        consul: Some(ConsulAddrs {
            rpc: any,
            http: any,
            grpc: None,
            cfg: agent_sim_server::consul::ConsulTargetConfig::default(),
            state: None,
        }),
        ..BackendConfig::default()
    })
    .await
    .unwrap();
    let (rpc, http) = b.consul_addrs().unwrap();
    let api = agent_sim_consul::http::HttpApi::new(http, None, "").unwrap();
    let nodes = || async {
        let body = api
            .call(http::Method::GET, "/v1/catalog/nodes", bytes::Bytes::new())
            .await
            .unwrap();
        serde_json::from_slice::<Vec<serde_json::Value>>(&body)
            .unwrap()
            .len()
    };
    let before = nodes().await;
    let run = tokio::time::timeout(Duration::from_secs(60), async {
        RunBuilder::new(Kind::Consul)
            .agents(20)
            .ramp(Ramp::All)
            .target(rpc.to_string())
            .duration(Duration::from_secs(7))
            .args(move |a| {
                a.http_target = Some(http.to_string());
                a.watch = Some("blocking".parse().unwrap());
                a.seed_service = Some("big=120".parse().unwrap());
                a.upstreams = Some("big".parse().unwrap());
                a.probe_service = Some("big".into());
                // Each change has 2 s to reach every watcher (a debug
                // build beside other tests).
                a.change_every = Some("2s".parse().unwrap());
            })
            .run()
            .await
            .expect("run")
    });
    let outcome = run.await.expect("the run ends within its bound");
    assert_exit(&outcome, 0);
    let s = &outcome.summary;
    assert!(s.probes.len() >= 2, "{:?}", s.probes);
    for p in &s.probes {
        assert_eq!(p.kind, "meta");
        assert_eq!((p.delivered, p.expected), (20, 20), "{p:?}");
    }
    // Each snapshot held the 120 seeded instances and the probe's.
    let target = b.consul_stats().unwrap();
    assert!(target.registrations >= 120 + 20, "{target:?}");
    assert!(s.counters["watch_bytes_received"] > 20 * 120 * 200);
    assert!(s.errors.is_empty(), "{:?}", s.errors);
    assert_eq!(nodes().await, before, "seed, probe and agent nodes removed");
    b.stop().await;
}

/// Followers relay the agents' RPC connections to one leader: the agents
/// dial the two followers, join the leader's gossip, and every probe
/// change made at the leader reaches every agent through a follower, while
/// the leader holds a few links instead of two connections per agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_relay_every_agent_to_one_leader_over_a_few_links() {
    use std::sync::Arc;

    use agent_sim_server::backend::{Backend, BackendConfig, ConsulAddrs};
    use agent_sim_server::consul::{
        ConsulTargetConfig, RelayConfig, RelayCounters, SerfConfig, serve_relay,
    };
    use tokio_util::sync::CancellationToken;

    let any: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    let leader = Backend::start(BackendConfig {
        consul: Some(ConsulAddrs {
            rpc: any,
            http: any,
            grpc: None,
            cfg: ConsulTargetConfig {
                serf: Some(SerfConfig::secured(any, &[], String::new()).unwrap()),
                ..ConsulTargetConfig::default()
            },
            state: None,
        }),
        ..BackendConfig::default()
    })
    .await
    .unwrap();
    let (rpc, http) = leader.consul_addrs().unwrap();
    let serf = leader.consul_serf_addr().unwrap();
    let stop = CancellationToken::new();
    let mut followers = Vec::new();
    let mut relays = Vec::new();
    for _ in 0..2 {
        let listener = agent_sim_server::listen::bind(any, false).unwrap();
        followers.push(listener.local_addr().unwrap().to_string());
        let counters = Arc::new(RelayCounters::default());
        // Small links, so that the fleet needs several of them.
        let cfg = RelayConfig {
            streams_per_link: 16,
            ..RelayConfig::new(rpc)
        };
        relays.push(counters.clone());
        tokio::spawn(serve_relay(listener, cfg, counters, stop.clone()));
    }
    let run = tokio::time::timeout(Duration::from_secs(60), async {
        RunBuilder::new(Kind::Consul)
            .agents(60)
            .ramp(Ramp::per_second(200.0))
            .duration(Duration::from_secs(6))
            .args(move |a| {
                a.targets = followers;
                a.http_target = Some(http.to_string());
                a.gossip_join = vec![serf.to_string()];
                a.upstreams = Some("web".parse().unwrap());
                a.probe_every = Some("1500ms".parse().unwrap());
                a.probe_timeout = Some("1s".parse().unwrap());
            })
            .assert("agents.connected == requested".parse().unwrap())
            .assert("probes.delivered_ratio == 1".parse().unwrap())
            .assert("errors.total == 0".parse().unwrap())
            .run()
            .await
            .expect("run")
    });
    let outcome = run.await.expect("the run ends within its bound");
    assert_exit(&outcome, 0);
    let s = &outcome.summary;
    assert_eq!(s.agents.connected, 60);
    assert_eq!(s.counters["registrations"], 60);
    assert!(s.probes.len() >= 2, "{:?}", s.probes);
    for p in &s.probes {
        assert_eq!((p.delivered, p.expected), (60, 60), "{p:?}");
    }
    // Every agent joined the leader's pool.
    assert!(s.counters["gossip_joins"] >= 60, "{:?}", s.counters);
    let snaps: Vec<_> = relays.iter().map(|r| r.snapshot()).collect();
    let agent_conns: u64 = snaps.iter().map(|r| r.connections).sum();
    let links: u64 = snaps.iter().map(|r| r.links_opened).sum();
    let subscribes: u64 = snaps.iter().map(|r| r.grpc_requests).sum();
    // Two connections per agent (calls and streams), all at the followers.
    assert!(agent_conns >= 120, "{snaps:?}");
    // web and the probe's service: two Subscribe streams per agent.
    assert!(subscribes >= 120, "{snaps:?}");
    assert!(snaps.iter().all(|r| r.link_failures == 0), "{snaps:?}");
    // 60 streams on links of 16: several links, far fewer than agents.
    let target = leader.consul_stats().unwrap();
    assert!((4..=24).contains(&links), "{snaps:?}");
    assert_eq!(target.rpc_connections, links, "{target:?} {snaps:?}");
    stop.cancel();
    leader.stop().await;
}
