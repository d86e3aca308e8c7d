//! KV watchers (`--watch-kv`) and the KV probe (`--probe kv`) against the
//! embedded server's KV (RPC and HTTP) on paused time: the probe's key reaches every
//! watcher and is gone after the run (and after `cleanup`), an index that
//! went backwards starts the watch over, an index of 0 is read as 1 (the
//! next read blocks), and bad answers (too large, garbage, none at all)
//! are bounded and counted. `KVS.List`'s bytes are proven on a real
//! 1.20.1's (`kv_vectors.rs`); here it runs against the embedded server's.

use crate::common::*;

use std::time::Duration;

use agent_sim_consul::kv::http::read;
use agent_sim_consul::kv::read_deadline;
use agent_sim_consul::watch::WatchMode;
use agent_sim_consul::watch::http::HttpWatch;
use agent_sim_consul::{ConsulConfig, ConsulFactory, ProbeKind};
use agent_sim_fleet::AgentFactory;
use agent_sim_net::http::Peer;
use bytes::Bytes;
use http::Method;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

fn kv_watching(t: &Target, prefixes: &[&str], wait: Duration) -> ConsulConfig {
    ConsulConfig {
        watch: WatchMode::Http,
        blocking_wait: wait,
        upstreams: vec!["web".into()],
        watch_kv: prefixes.iter().map(|p| p.to_string()).collect(),
        ..subscriber(t)
    }
}

async fn kv_status(t: &Target, key: &str) -> Option<u16> {
    match t
        .api()
        .call(Method::GET, &format!("/v1/kv/{key}"), Bytes::new())
        .await
    {
        Ok(_) => None,
        Err(e) => e.status,
    }
}

#[tokio::test(start_paused = true)]
async fn the_kv_probe_reaches_every_watcher_and_leaves_no_key() {
    // KVS.List on the agents' RPC connection (the client wire), then long
    // polls of the HTTP API.
    for mode in [WatchMode::Blocking, WatchMode::Http] {
        let t = start_target().await;
        let m = metrics();
        let cfg = ConsulConfig {
            probe: probe(
                ProbeKind::Kv,
                Duration::from_secs(2),
                Duration::from_secs(1),
            ),
            watch: mode,
            // A second prefix per agent, outside the probe's: watched, not
            // timed.
            ..kv_watching(&t, &["agent-sim/", "other/{i%4}/"], Duration::from_secs(60))
        };
        let f = fleet_of(20, Some(1000.0), Duration::from_secs(9));
        let (report, probes) = run_fleet(cfg, f, &m).await;
        assert_eq!(report.ever_connected, 20, "{mode}");
        assert!(probes.len() >= 3, "{mode}: {probes:?}");
        for p in &probes {
            assert_eq!(p.kind, "kv");
            assert_eq!((p.delivered, p.expected), (20, 20), "{mode}: {p:?}");
        }
        let s = m.snapshot();
        assert!(s.errors.is_empty(), "{mode}: {:?}", s.errors);
        // Every probe changed every agent's probe prefix once.
        let n = probes.len() as u64;
        assert!(counter(&m, "kv_watch_results_changed") >= 20 * n, "{mode}");
        assert!(counter(&m, "kv_watch_answers") >= 40 + 20 * n, "{mode}");
        assert!(counter(&m, "kv_watch_bytes") > 0);
        let rpc_lists = t.state.stats().rpc_calls.get("KVS.List").copied();
        match mode {
            WatchMode::Blocking => assert!(rpc_lists >= Some(40 + 20 * n), "{rpc_lists:?}"),
            _ => assert!(rpc_lists.unwrap_or(0) == 0, "{rpc_lists:?}"),
        }
        let key = kv_status(&t, "agent-sim/probe/kv").await;
        assert_eq!(key, Some(404), "{mode}: deleted");
    }
}

#[tokio::test(start_paused = true)]
async fn cleanup_removes_the_probe_key_it_owns_only() {
    let t = start_target().await;
    let api = t.api();
    api.put("/v1/kv/run1/probe/kv", Bytes::from_static(b"17"))
        .await
        .unwrap();
    api.put("/v1/kv/run2/probe/kv", Bytes::from_static(b"not ours"))
        .await
        .unwrap();
    let r = agent_sim_consul::cleanup::cleanup(&api, "run1", true)
        .await
        .unwrap();
    assert_eq!(r.kv_keys, ["run1/probe/kv"]);
    assert_eq!(kv_status(&t, "run1/probe/kv").await, None, "a dry run");
    agent_sim_consul::cleanup::cleanup(&api, "run1", false)
        .await
        .unwrap();
    assert_eq!(kv_status(&t, "run1/probe/kv").await, Some(404));
    let r = agent_sim_consul::cleanup::cleanup(&api, "run2", false)
        .await
        .unwrap();
    assert!(r.kv_keys.is_empty());
    assert_eq!(r.left_alone, ["kv key run2/probe/kv"]);
    assert_eq!(kv_status(&t, "run2/probe/kv").await, None);
}

#[tokio::test(start_paused = true)]
async fn an_index_that_went_backwards_starts_the_kv_watch_over() {
    let t = start_target().await;
    let m = metrics();
    let factory = ConsulFactory::new(
        kv_watching(&t, &["cfg/"], Duration::from_secs(5)),
        m.clone(),
    )
    .unwrap();
    let mut agent = factory.create(0);
    for i in 0..20 {
        t.api()
            .put(&format!("/v1/kv/cfg/k{i}"), Bytes::from_static(b"v"))
            .await
            .unwrap();
    }
    with_session(&mut agent, &m, |stop| async move {
        tokio::time::sleep(Duration::from_secs(3)).await;
        stop.cancel();
    })
    .await;
    assert_eq!(counter(&m, "kv_watch_answers"), 1);

    // The server comes back empty: its indexes start over.
    let t = t.restart_empty().await;
    t.api()
        .put("/v1/kv/cfg/a", Bytes::from_static(b"v"))
        .await
        .unwrap();
    with_session(&mut agent, &m, |stop| async move {
        tokio::time::sleep(Duration::from_secs(12)).await;
        stop.cancel();
    })
    .await;
    let s = m.snapshot();
    // The read at the old index came back lower: warned, read from 0
    // (once by the KV watch, once by the health watch of `web`).
    assert_eq!(s.warnings.get("watch_index_reset"), Some(&2), "{s:?}");
    // The first session's answer, the one that went back, the new result.
    assert!(counter(&m, "kv_watch_answers") >= 3);
    assert!(counter(&m, "kv_watch_results_changed") >= 1);
    assert!(s.errors.is_empty(), "{:?}", s.errors);
}

#[tokio::test(start_paused = true)]
async fn an_empty_prefix_at_index_0_blocks_instead_of_spinning() {
    let t = start_target().await;
    let m = metrics();
    let factory = ConsulFactory::new(
        kv_watching(&t, &["nothing/here/"], Duration::from_secs(60)),
        m.clone(),
    )
    .unwrap();
    let mut agent = factory.create(0);
    with_session(&mut agent, &m, |stop| async move {
        tokio::time::sleep(Duration::from_secs(30)).await;
        stop.cancel();
    })
    .await;
    // The first read answers at once (404, an empty store's index); the
    // next asks past index 1 and is held: not one read per 100 ms.
    assert_eq!(counter(&m, "kv_watch_answers"), 1);
    assert_eq!(counter(&m, "kv_watch_calls"), 2);
    assert!(m.snapshot().errors.is_empty());
}

/// A server on 127.0.0.1 that answers each connection's first request
/// with `answer` (or never, when `None`).
async fn fake_api(answer: Option<Vec<u8>>) -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let _ = s.read(&mut buf).await;
                match answer {
                    Some(a) => {
                        let _ = s.write_all(&a).await;
                        let _ = s.flush().await;
                        // Hold the connection open, as a kept-alive one.
                        let _ = s.read(&mut buf).await;
                    }
                    None => {
                        let _ = s.read(&mut buf).await;
                    }
                }
            });
        }
    });
    addr
}

fn ok_answer(body: &[u8], index: &str) -> Vec<u8> {
    let mut a = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Consul-Index: {index}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    a.extend_from_slice(body);
    a
}

async fn read_once(
    answer: Option<Vec<u8>>,
    max: usize,
) -> Result<agent_sim_consul::kv::KvDigest, agent_sim_consul::rpc::mux::CallError> {
    let addr = fake_api(answer).await;
    let (w, _) = HttpWatch::connect(Peer::plain(addr), addr.to_string(), None)
        .await
        .unwrap();
    let deadline = read_deadline(Duration::from_secs(10));
    let (_, r) = read(
        w,
        "/v1/kv/p?recurse&index=0&wait=10s".into(),
        None,
        None,
        max,
        deadline,
    )
    .await;
    r.and_then(|a| a.result)
}

#[tokio::test(start_paused = true)]
async fn bad_answers_are_bounded_and_counted_never_a_hang() {
    // A value far past the bound: refused, not read to its end.
    let huge = format!(
        r#"[{{"Key":"p/a","ModifyIndex":3,"Value":"{}"}}]"#,
        "A".repeat(256 * 1024)
    );
    let e = read_once(Some(ok_answer(huge.as_bytes(), "3")), 64 * 1024)
        .await
        .unwrap_err();
    assert_eq!(e.kind, "answer_too_large", "{e:?}");
    // Not JSON, or no index: the words say which.
    let e = read_once(Some(ok_answer(b"[{", "3")), 64 * 1024)
        .await
        .unwrap_err();
    assert_eq!(e.kind, "decode_answer");
    let e = read_once(Some(ok_answer(b"[]", "x")), 64 * 1024)
        .await
        .unwrap_err();
    assert!(e.detail.contains("without X-Consul-Index"), "{e:?}");
    // A server that never answers: lost at the deadline (10 s + 1/16 + 5 s).
    let start = tokio::time::Instant::now();
    let e = read_once(None, 64 * 1024).await.unwrap_err();
    assert_eq!(e.kind, "rpc_timeout");
    assert_eq!(start.elapsed(), read_deadline(Duration::from_secs(10)));
    // A good answer still reads.
    let d = read_once(
        Some(ok_answer(
            br#"[{"Key":"p/a","ModifyIndex":3,"Value":null}]"#,
            "3",
        )),
        64 * 1024,
    )
    .await
    .unwrap();
    assert_eq!((d.index, d.keys), (3, 1));
}
