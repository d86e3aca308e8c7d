//! The simulated Vault servers against the embedded Consul target (KV,
//! sessions, locks, `/v1/txn`) and against a small fake that answers
//! badly: one active node, tokens written, read back and removed; the
//! lock's handover; a lock held by another; indexes that go backwards and
//! values too large, all bounded.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use agent_sim_consul::vault::client::{KvClient, LOCK_FLAGS};
use agent_sim_consul::vault::{Burst, VaultConfig, VaultRunner, VaultSummary, metrics_spec};
use agent_sim_metrics::Metrics;
use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Longest a test's run may take, its clean-up included.
const BOUND: Duration = Duration::from_secs(60);

fn quick(nodes: u32) -> VaultConfig {
    VaultConfig {
        nodes,
        tokens_per_s: 200.0,
        token_ttl: Duration::from_secs(1),
        read_back_every: 5,
        check_every: Duration::from_millis(100),
        lock_wait: Duration::from_secs(1),
        path: "t/vault/".into(),
        ..VaultConfig::default()
    }
}

/// Runs `cfg` against the HTTP API at `http` for `run`, bounded.
async fn run_vault(http: SocketAddr, cfg: VaultConfig, run: Duration) -> (VaultSummary, Metrics) {
    let metrics = Metrics::new(&metrics_spec(), 4);
    let client = KvClient::new(http, None, None, "", 64, Duration::from_secs(300), None).unwrap();
    let runner = VaultRunner::new(cfg, "t/vault/".into(), client, metrics.clone());
    let end = CancellationToken::new();
    let e = end.clone();
    // The run's length: its workload, not a synchronisation.
    tokio::spawn(async move {
        tokio::time::sleep(run).await;
        e.cancel();
    });
    let s = tokio::time::timeout(BOUND, runner.run(end))
        .await
        .expect("the Vault servers ended within the bound");
    (s, metrics)
}

fn errors(m: &Metrics, kind: &str) -> u64 {
    m.error_report()
        .into_iter()
        .find(|k| k.kind == kind)
        .map_or(0, |k| k.stat.count)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_is_active_its_tokens_read_back_and_everything_is_removed() {
    let t = common::start_target().await;
    let cfg = VaultConfig {
        bursts: vec![Burst {
            at: Duration::from_millis(300),
            tokens: 300,
        }],
        ..quick(3)
    };
    let (s, m) = run_vault(t.http, cfg, Duration::from_secs(3)).await;
    assert!(s.tokens_created >= 300, "{s:?}");
    assert!(s.tokens_renewed > 0 && s.tokens_revoked > 0, "{s:?}");
    assert_eq!(s.lock_acquisitions, 1);
    assert_eq!(s.bursts[0].created, 300);
    assert!(s.bursts[0].done_s.is_some());
    let c = &s.lock_check;
    assert!(c.agree > 0, "{c:?}");
    assert_eq!((c.split_brain, c.mismatch, c.held_by_other), (0, 0, 0));
    let r = &s.read_back;
    assert!(r.ok > 0, "{r:?}");
    assert_eq!((r.lost, r.changed), (0, 0));
    assert!(s.cleanup.keys_removed > 0);
    assert_eq!((s.cleanup.keys_left, s.cleanup.sessions_left), (0, 0));
    assert_eq!(m.error_report().len(), 0, "{:?}", m.error_report());
    // Nothing of the run is left on the server.
    let api = t.api();
    let keys = api
        .call(http::Method::GET, "/v1/kv/t/?keys", Bytes::new())
        .await;
    assert_eq!(keys.err().and_then(|e| e.status), Some(404));
    let sessions = api
        .call(http::Method::GET, "/v1/session/list", Bytes::new())
        .await
        .unwrap();
    assert_eq!(&sessions[..], b"[]");
}

// On paused time: the handover is measured on the runtime's clock, which
// moves only by the run's own timers, so a busy box cannot stretch it.
#[tokio::test(start_paused = true)]
async fn the_lock_passes_to_a_standby_when_the_active_node_stops() {
    let t = common::start_target().await;
    let cfg = VaultConfig {
        stop_active_at: Some(Duration::from_millis(800)),
        ..quick(3)
    };
    let (s, _) = run_vault(t.http, cfg, Duration::from_secs(3)).await;
    assert_eq!(s.lock_acquisitions, 2, "{s:?}");
    assert_eq!(s.leadership_changes, 1);
    assert_eq!(s.handovers_s.len(), 1);
    // Released, not expired: a standby's blocking read wakes at once.
    assert!(s.handovers_s[0] < 1.0, "{:?}", s.handovers_s);
    let c = &s.lock_check;
    assert_eq!((c.split_brain, c.mismatch), (0, 0), "{c:?}");
    assert_eq!((s.cleanup.keys_left, s.cleanup.sessions_left), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_that_never_frees_keeps_the_standbys_waiting_and_the_run_ends_on_time() {
    let t = common::start_target().await;
    let api = t.api();
    let other = api
        .put(
            "/v1/session/create",
            Bytes::from(r#"{"Name":"someone else","TTL":"60s"}"#),
        )
        .await
        .unwrap();
    let other: serde_json::Value = serde_json::from_slice(&other).unwrap();
    let id = other["ID"].as_str().unwrap();
    let took = api
        .put(
            &format!("/v1/kv/t/vault/core/lock?acquire={id}&flags={LOCK_FLAGS}"),
            Bytes::from("not-ours"),
        )
        .await
        .unwrap();
    assert_eq!(&took[..], b"true");
    let started = tokio::time::Instant::now();
    let (s, m) = run_vault(t.http, quick(2), Duration::from_secs(2)).await;
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(s.first_active_s, None);
    assert_eq!(s.tokens_created, 0);
    assert!(s.lock_check.held_by_other > 0, "{:?}", s.lock_check);
    assert_eq!(errors(&m, "vault_never_active"), 1);
    // The nodes' own sessions are gone; the other's is not theirs.
    assert_eq!(s.cleanup.sessions_left, 0);
}

/// A fake Consul HTTP API: `answer(method, path)` gives status, extra
/// headers and body; every request is counted.
async fn fake(
    answer: impl Fn(&str, &str) -> (u16, String, Vec<u8>) + Send + Sync + 'static,
) -> (SocketAddr, Arc<AtomicU64>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let count = Arc::new(AtomicU64::new(0));
    let answer = Arc::new(answer);
    let c = count.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let (answer, c) = (answer.clone(), c.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_string();
                    let len: usize = head
                        .lines()
                        .find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case("content-length")
                                .then(|| v.trim().parse().ok())?
                        })
                        .unwrap_or(0);
                    while buf.len() < end + 4 + len {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    buf.drain(..end + 4 + len);
                    let mut first = head.split(' ');
                    let method = first.next().unwrap_or("").to_string();
                    let path = first.next().unwrap_or("").to_string();
                    c.fetch_add(1, Ordering::Relaxed);
                    let (status, headers, body) = answer(&method, &path);
                    let reply = format!(
                        "HTTP/1.1 {status} X\r\nContent-Length: {}\r\n{headers}\r\n",
                        body.len()
                    );
                    if s.write_all(reply.as_bytes()).await.is_err()
                        || s.write_all(&body).await.is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (addr, count)
}

/// What the fake answers to everything but the lock key.
fn plain(method: &str, path: &str) -> (u16, String, Vec<u8>) {
    let idx = "X-Consul-Index: 1\r\n".to_string();
    if path.starts_with("/v1/session/create") {
        (200, String::new(), br#"{"ID":"s-ours"}"#.to_vec())
    } else if path.starts_with("/v1/session/list") {
        (200, String::new(), b"[]".to_vec())
    } else if path.starts_with("/v1/session/") || method == "DELETE" {
        (200, String::new(), b"true".to_vec())
    } else {
        (404, idx, Vec::new())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn indexes_going_backwards_are_paced_and_reported() {
    let next = Arc::new(AtomicU64::new(1_000_000));
    let n = next.clone();
    let (addr, count) = fake(move |m, p| {
        if p.starts_with("/v1/kv/t/vault/core/lock") && m == "GET" {
            // Held by another, answered at once, the index lower each time.
            let i = n.fetch_sub(7, Ordering::Relaxed);
            let body = format!(
                r#"[{{"Key":"t/vault/core/lock","Flags":{LOCK_FLAGS},"Session":"other","Value":"eA=="}}]"#
            );
            (200, format!("X-Consul-Index: {i}\r\n"), body.into_bytes())
        } else {
            plain(m, p)
        }
    })
    .await;
    let (s, m) = run_vault(addr, quick(1), Duration::from_secs(3)).await;
    assert_eq!(s.tokens_created, 0);
    assert!(errors(&m, "vault_index_reset") > 0);
    // Paced: about one lock read a second, not a hot loop.
    let calls = count.load(Ordering::Relaxed);
    assert!(calls < 60, "{calls} calls in 3 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_too_large_is_refused_unread_and_the_run_goes_on() {
    let huge = Arc::new(format!(
        r#"[{{"Key":"t/vault/core/lock","Flags":{LOCK_FLAGS},"Session":"other","Value":"{}"}}]"#,
        "A".repeat(1 << 20)
    ));
    let (addr, _) = fake(move |m, p| {
        if p.starts_with("/v1/kv/t/vault/core/lock") && m == "GET" {
            (
                200,
                "X-Consul-Index: 5\r\n".into(),
                huge.as_bytes().to_vec(),
            )
        } else {
            plain(m, p)
        }
    })
    .await;
    let (s, m) = run_vault(addr, quick(1), Duration::from_secs(2)).await;
    assert_eq!(s.tokens_created, 0);
    assert!(errors(&m, "vault_value_too_large") > 0);
}
