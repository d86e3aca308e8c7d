//! Consul rows of the fault matrix: what the backend does to RPC
//! connections, Subscribe calls and streams, gRPC frames and HTTP requests,
//! and what the agents do and report.

use std::time::Duration;

use agent_sim_consul::{ConsulConfig, ConsulFactory};

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_refusals_are_retried_per_stream_with_the_servers_words() {
    bounded(Duration::from_secs(20), async {
        let b = backend(
            false,
            true,
            &[
                "consul.subscribe=unavailable@100%,max:4",
                "consul.subscribe=resource-exhausted@100%,max:4",
                "consul.subscribe=aborted@100%,max:4",
            ],
        )
        .await;
        let s = &complete(&b, consul_run(&b, 10, 3.0)).await;
        assert_eq!(b.fault_stats().injected, 12);
        // A stream refused is subscribed again on the same connection.
        assert!(s.sessions_lost.is_empty(), "{:?}", s.sessions_lost);
        let u = error(s, "grpc_unavailable");
        assert_eq!(u.count, 4);
        assert_eq!(
            u.sample.as_deref(),
            Some("gRPC Unavailable: rate limit exceeded, try again later")
        );
        assert!(u.heals && u.hint.is_some());
        let r = error(s, "grpc_resource_exhausted");
        assert_eq!(r.count, 4);
        assert_eq!(
            r.sample.as_deref(),
            Some("gRPC ResourceExhausted: rate limit exceeded, try a different server")
        );
        assert_eq!(s.counters["aborts"], 4);
        let a = &s.warnings["subscription_aborted"];
        assert_eq!(a.count, 4);
        assert!(a.sample.as_deref().unwrap().contains("must reset state"));
        assert_eq!(s.counters["subscriptions"], 10 + 12);
        assert_eq!(s.counters["snapshots"], 10);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_retry_of_a_stream_is_immediate_then_it_backs_off() {
    bounded(Duration::from_secs(20), async {
        // Three refusals in a row, each its own spec: the backend records
        // when each was injected, i.e. when each call arrived.
        let one = "consul.subscribe=resource-exhausted@100%,max:1";
        let b = backend(false, true, &[one, one, one]).await;
        let s = complete(&b, consul_run(&b, 1, 2.0)).await;
        let at: Vec<f64> = b
            .fault_stats()
            .faults
            .iter()
            .map(|f| f.first_s.expect("each refused one call"))
            .collect();
        let (first, second) = (at[1] - at[0], at[2] - at[1]);
        // At once; then equal jitter of a 200 ms step: 100..200 ms.
        assert!(first < 0.05, "{first}");
        assert!((0.1..0.3).contains(&second), "{second}");
        assert_eq!(error(&s, "grpc_resource_exhausted").count, 3);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_cut_halfway_is_discarded_and_never_a_live_view() {
    bounded(Duration::from_secs(20), async {
        let b = backend(false, true, &["consul.subscribe=cut@100%,max:5"]).await;
        web_instances(&b, 6).await;
        let s = &complete(&b, consul_run(&b, 10, 2.5)).await;
        assert_eq!(b.fault_stats().injected, 5);
        let e = error(s, "stream_end");
        assert_eq!(e.count, 5);
        assert!(
            e.sample
                .as_deref()
                .unwrap()
                .contains("before EndOfSnapshot")
        );
        assert_eq!(s.counters["subscriptions"], 15);
        assert_eq!(
            s.counters["snapshots"], 10,
            "cut snapshots are not snapshots"
        );
        assert!(s.sessions_lost.is_empty(), "{:?}", s.sessions_lost);

        // Every snapshot cut: half views everywhere, no agent connected.
        let b = backend(false, true, &["consul.subscribe=cut@100%"]).await;
        web_instances(&b, 6).await;
        let o = consul_run(&b, 5, 2.0).run().await.unwrap();
        b.stop().await;
        let s = &o.summary;
        assert_eq!(s.agents.ever_connected, 0, "{:?}", s.agents);
        assert_eq!(o.exit_code, 1, "{:?}", s.outcome);
        assert_eq!(s.counters["snapshots"], 0);
        assert_eq!(error(s, "stream_end").count, b.fault_stats().injected);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_truncated_and_oversized_frames_fail_the_stream_not_the_session() {
    bounded(Duration::from_secs(20), async {
        let b = backend(
            false,
            true,
            &[
                "consul.frame=garbage@100%,max:3",
                "consul.frame=truncated@100%,max:3",
                "consul.frame=oversized@100%,max:3",
            ],
        )
        .await;
        web_instances(&b, 2).await;
        let s = &complete(&b, consul_run(&b, 10, 3.0)).await;
        assert_eq!(b.fault_stats().injected, 9);
        assert!(s.sessions_lost.is_empty(), "{:?}", s.sessions_lost);
        // Garbage that does not decode, a message cut short, one announced
        // over the limit: each fails its stream only.
        let garbage = error(s, "decode_event");
        assert_eq!(garbage.count, 3, "{:#?}", s.errors);
        let cut = error(s, "grpc_internal");
        assert_eq!(cut.count, 3, "{:#?}", s.errors);
        let big = error(s, "message_too_large");
        assert_eq!(big.count, 3);
        assert!(
            big.sample.as_deref().unwrap().contains("4194305"),
            "{big:?}"
        );
        assert_eq!(s.counters["snapshots"], 10);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_frames_make_snapshots_late() {
    bounded(Duration::from_secs(20), async {
        let b = backend(false, true, &["consul.frame=delay:300ms@100%"]).await;
        let s = &complete(&b, consul_run(&b, 5, 2.0)).await;
        assert!(s.errors.is_empty(), "{:#?}", s.errors);
        assert!(b.fault_stats().injected >= 5);
        let snap = &s.latency_us["subscribe_snapshot"];
        assert!(snap.min >= 300_000, "{snap:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpc_connections_dropped_reset_or_delayed_at_accept() {
    bounded(Duration::from_secs(20), async {
        let b = backend(
            false,
            true,
            &[
                "consul.rpc=drop@100%,max:3",
                "consul.rpc=reset@100%,max:3",
                "consul.rpc=delay:300ms@100%,max:4",
            ],
        )
        .await;
        let s = &complete(&b, consul_api_run(&b, 10, 3.0)).await;
        assert_eq!(b.fault_stats().injected, 10);
        // Closed before a byte: what Consul's per-IP cap looks like too.
        let closed = error(s, "rpc_closed_at_once");
        assert_eq!(closed.count, 6, "{:#?}", s.errors);
        assert_eq!(s.errors.len(), 1, "{:#?}", s.errors);
        assert!(s.latency_us["subscribe_snapshot"].max >= 300_000);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_rpc_connections_reset_at_a_time_lose_every_session() {
    bounded(Duration::from_secs(20), async {
        let b = backend(false, true, &["consul.rpc=reset@at:1500ms"]).await;
        // Back = resubscribed and the registration confirmed by a sync,
        // which a reconnected agent runs within a staggered 3 s.
        let s = &complete(&b, consul_api_run(&b, 10, 6.0)).await;
        assert_eq!(b.fault_stats().injected, 10);
        let lost: u64 = s.sessions_lost.values().sum();
        assert_eq!(lost, 10, "{:?}", s.sessions_lost);
        assert_eq!(
            s.sessions_lost.get("conn_error"),
            Some(&10),
            "{:?}",
            s.sessions_lost
        );
        assert!(error(s, "conn_error").sample.is_some());
        assert_eq!(s.counters["agents_reconnected"], 10);
    })
    .await;
}

/// A client agent holds two RPC connections (streaming and its own calls):
/// both reset at once lose the session, which comes back with its
/// registration confirmed over RPC; the calls' connection is dialed again
/// with the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_agents_two_rpc_connections_reset_at_a_time_come_back() {
    bounded(Duration::from_secs(20), async {
        let b = backend(false, true, &["consul.rpc=reset@at:1500ms"]).await;
        let s = &complete(&b, consul_run(&b, 10, 6.0)).await;
        assert_eq!(b.fault_stats().injected, 20, "two connections per agent");
        let lost: u64 = s.sessions_lost.values().sum();
        assert_eq!(lost, 10, "{:?}", s.sessions_lost);
        assert_eq!(s.counters["agents_reconnected"], 10);
        let calls = b.consul_stats().unwrap().rpc_calls;
        // Every agent synced after its reconnect: its node read twice at least.
        assert!(calls["Catalog.NodeServiceList"] >= 20, "{calls:?}");
        assert_eq!(
            calls["Catalog.Register"], 20,
            "node and service, once: {calls:?}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_streams_aborted_or_unavailable_at_a_time() {
    bounded(Duration::from_secs(20), async {
        let b = backend(
            false,
            true,
            &[
                "consul.subscribe=aborted@at:1500ms",
                "consul.subscribe=unavailable@at:2500ms",
            ],
        )
        .await;
        web_instances(&b, 2).await;
        let o = consul_run(&b, 10, 3.5).run().await.unwrap();
        let served = b.consul_stats().unwrap().resumes_served;
        b.stop().await;
        assert_complete(&o);
        let s = &o.summary;
        let f = b.fault_stats();
        assert_eq!(f.count("consul.subscribe=aborted@at:1500ms"), 10);
        assert_eq!(f.count("consul.subscribe=unavailable@at:2500ms"), 10);
        assert_eq!(s.counters["aborts"], 10);
        assert_eq!(error(s, "grpc_unavailable").count, 10);
        assert!(s.sessions_lost.is_empty(), "{:?}", s.sessions_lost);
        // Aborted: a new snapshot; unavailable: resumed at the index kept.
        assert_eq!(s.counters["snapshots"], 20);
        assert_eq!(s.counters["subscriptions"], 30);
        assert_eq!(served, 10);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_refusals_and_broken_connections_are_retried_with_backoff() {
    bounded(Duration::from_secs(20), async {
        let path = "path:/v1/session/create";
        let faults: Vec<String> = [
            "429@100%,max:2",
            "503@100%,max:2",
            "500@100%,max:1",
            "drop@100%,max:2",
            "reset@100%,max:2",
            "delay:200ms@100%,max:2",
        ]
        .iter()
        .map(|f| format!("consul.http={f},{path}"))
        .collect();
        let faults: Vec<&str> = faults.iter().map(String::as_str).collect();
        let b = backend(false, true, &faults).await;
        let o = consul_api_run(&b, 10, 5.0).run().await.unwrap();
        let created = b.consul_stats().unwrap().sessions_created;
        b.stop().await;
        assert_complete(&o);
        let s = &o.summary;
        assert_eq!(b.fault_stats().injected, 11);
        let e429 = error(s, "http_429");
        assert_eq!(e429.count, 2);
        assert_eq!(
            e429.sample.as_deref(),
            Some("HTTP 429: rate limit exceeded, try a different server")
        );
        assert_eq!(error(s, "http_5xx").count, 3);
        assert_eq!(error(s, "http_io").count, 4, "{:#?}", s.errors);
        assert_eq!(s.counters["sessions_created"], 10);
        assert_eq!(created, 10);
        assert!(s.sessions_lost.is_empty(), "{:?}", s.sessions_lost);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_http_request_times_out_and_is_retried() {
    bounded(Duration::from_secs(20), async {
        let b = backend(
            false,
            true,
            &["consul.http=stall@100%,max:1,path:/v1/session/create"],
        )
        .await;
        let s = &complete(&b, consul_api_run(&b, 2, 12.5)).await;
        assert_eq!(b.fault_stats().injected, 1);
        let t = error(s, "http_timeout");
        assert_eq!(t.count, 1);
        assert!(t.sample.as_deref().unwrap().contains("10s"), "{t:?}");
        assert_eq!(s.counters["sessions_created"], 2);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_rpc_connection_is_ended_by_the_keepalive() {
    bounded(Duration::from_secs(25), async {
        let b = backend(false, true, &["consul.rpc=stall@100%,max:1"]).await;
        let (rpc, http) = b.consul_addrs().unwrap();
        let cfg = ConsulConfig {
            conn: agent_sim_consul::Connection {
                targets: vec![rpc.to_string()],
                http_target: http.to_string(),
                keepalive_time: Duration::from_secs(15),
                keepalive_timeout: Duration::from_secs(1),
                ..agent_sim_consul::Connection::to(&[])
            },
            upstreams: vec!["web".into()],
            // Connected again as soon as the streams are (no sync to wait for).
            register: false,
            session_ttl: None,
            // One RPC connection per agent: the stalled one is the streams'.
            agent: agent_sim_consul::modes::AgentWire::Api,
            ..ConsulConfig::default()
        };
        let m = metrics(&agent_sim_consul::metrics_spec());
        let factory = ConsulFactory::new(cfg, m.clone()).unwrap();
        let report = fleet_run(factory, &m, 2, 17.5).await;
        b.stop().await;
        assert_eq!(report.connected_at_end, 2);
        assert_eq!(b.fault_stats().injected, 1);
        let k = reported(&m, "keepalive_timeout");
        assert_eq!(k.stat.count, 1);
        assert!(k.hint.is_some());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_and_http_watchers_survive_rpc_and_http_faults() {
    bounded(Duration::from_secs(30), async {
        // Blocking: RPC connections dropped at accept, then calls delayed.
        let b = backend(
            false,
            true,
            &[
                "consul.rpc=drop@100%,max:3",
                "consul.rpc=delay:300ms@100%,max:4",
            ],
        )
        .await;
        web_instances(&b, 3).await;
        let run = consul_run(&b, 10, 3.0).args(|a| a.watch = Some("blocking".parse().unwrap()));
        let s = &complete(&b, run).await;
        assert_eq!(b.fault_stats().injected, 7);
        assert!(
            s.counters["watch_results_changed"] >= 10,
            "{:?}",
            s.counters
        );
        assert!(s.latency_us["subscribe_snapshot"].max >= 300_000);

        // HTTP long polls answered 503 in Consul's words, then served.
        let b = backend(
            false,
            true,
            &["consul.http=503@100%,max:5,path:/v1/health/service/"],
        )
        .await;
        web_instances(&b, 3).await;
        let run = consul_run(&b, 10, 3.0).args(|a| a.watch = Some("http".parse().unwrap()));
        let s = &complete(&b, run).await;
        assert_eq!(b.fault_stats().injected, 5);
        assert!(
            s.counters["watch_results_changed"] >= 10,
            "{:?}",
            s.counters
        );
        let total: u64 = s.errors.values().map(|e| e.count).sum();
        assert_eq!(total, 5, "{:#?}", s.errors);
    })
    .await;
}
