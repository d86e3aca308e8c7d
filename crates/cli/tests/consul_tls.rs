//! TLS to Consul end to end: the `agent-sim` binary with `--kind consul
//! --ca-file --cert-file --key-file` against the in-process backend serving
//! RPC (0x03 + TLS + 0x08) and HTTPS with client certificates required, on a
//! test CA generated now.

use agent_sim_server::consul::{ConsulState, ConsulTargetConfig};
use agent_sim_testkit::Pki;
use agent_sim_testkit::bounded::{CHILD_LIMIT, OutputWithin};
use tokio_util::sync::CancellationToken;

use crate::common;
use crate::common::temp_path;

struct TlsBackend {
    rpc: String,
    http: String,
    state: ConsulState,
    stop: CancellationToken,
}

async fn tls_backend(pki: &Pki) -> TlsBackend {
    let tls = agent_sim_net::server_config(
        &pki.path("server.pem"),
        &pki.path("server-key.pem"),
        Some(&pki.path("ca.pem")),
    )
    .unwrap();
    let b = common::consul_backend(ConsulTargetConfig {
        tls: Some(tls),
        ..ConsulTargetConfig::default()
    })
    .await;
    TlsBackend {
        rpc: b.rpc.to_string(),
        http: format!("https://{}", b.http),
        state: b.state,
        stop: b.stop,
    }
}

/// Runs the binary with `args` (bounded by its own --duration) and returns
/// its exit code and the summary it wrote.
async fn run_cli(args: Vec<String>, name: &str) -> (Option<i32>, serde_json::Value) {
    let summary = temp_path(name);
    let mut all = args;
    all.push(format!("--summary={}", summary.display()));
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_agent-sim"))
            .args(&all)
            .output_within(CHILD_LIMIT)
    })
    .await
    .unwrap();
    let text = std::fs::read_to_string(&summary)
        .unwrap_or_else(|e| panic!("no summary ({e}): {}", String::from_utf8_lossy(&out.stderr)));
    let _ = std::fs::remove_file(&summary);
    (out.status.code(), serde_json::from_str(&text).unwrap())
}

fn base_args(b: &TlsBackend, agents: u32) -> Vec<String> {
    [
        "--kind=consul".to_string(),
        format!("--agents={agents}"),
        format!("--target={}", b.rpc),
        format!("--http-target={}", b.http),
        "--upstreams=web".into(),
        "--probe=off".into(),
        "--ramp=all".into(),
        "--duration=3s".into(),
        "--quiet".into(),
    ]
    .into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_agents_connect_over_tls_with_client_certificates() {
    let pki = Pki::new("cli-consul");
    let b = tls_backend(&pki).await;
    let mut args = base_args(&b, 20);
    args.extend([
        format!("--ca-file={}", pki.path("ca.pem").display()),
        format!("--cert-file={}", pki.path("client.pem").display()),
        format!("--key-file={}", pki.path("client-key.pem").display()),
    ]);
    let (code, s) = run_cli(args, "consul-tls.json").await;
    b.stop.cancel();
    assert_eq!(code, Some(0), "{s}");
    assert_eq!(s["agents"]["connected"], 20, "{s}");
    assert_eq!(s["counters"]["registrations"], 20, "{s}");
    let seen = b.state.stats();
    assert!(seen.rpc_connections >= 20, "{seen:?}");
    assert_eq!(seen.rpc_rejected_tls, 0, "{seen:?}");
}

/// Blocking watchers over TLS: `0x03`, TLS, then `0x04` and yamux inside
/// it; long polls over HTTPS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_and_http_watchers_connect_over_tls() {
    let pki = Pki::new("cli-consul-watch");
    let b = tls_backend(&pki).await;
    for mode in ["blocking", "http"] {
        let mut args = base_args(&b, 10);
        args.extend([
            format!("--watch={mode}"),
            format!("--ca-file={}", pki.path("ca.pem").display()),
            format!("--cert-file={}", pki.path("client.pem").display()),
            format!("--key-file={}", pki.path("client-key.pem").display()),
        ]);
        let (code, s) = run_cli(args, &format!("consul-tls-{mode}.json")).await;
        assert_eq!(code, Some(0), "{mode}: {s}");
        assert_eq!(s["agents"]["connected"], 10, "{mode}: {s}");
        assert_eq!(s["counters"]["watch_results_changed"], 10, "{mode}: {s}");
        assert_eq!(s["config"]["watch"], mode, "{s}");
    }
    let seen = b.state.stats();
    b.stop.cancel();
    assert_eq!(seen.rpc_mux_connections, 10, "{seen:?}");
    assert_eq!(seen.rpc_rejected_tls, 0, "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_client_certificate_the_server_refuses_and_the_run_says_why() {
    let pki = Pki::new("cli-consul-anon");
    let b = tls_backend(&pki).await;
    let mut args = base_args(&b, 5);
    args.push(format!("--ca-file={}", pki.path("ca.pem").display()));
    let (code, s) = run_cli(args, "consul-tls-anon.json").await;
    b.stop.cancel();
    assert_eq!(code, Some(1), "{s}");
    assert_eq!(s["agents"]["connected"], 0);
    let errors = s["errors"].as_object().unwrap();
    assert!(
        errors
            .keys()
            .any(|k| k.starts_with("tls") || k.starts_with("h2")),
        "{errors:?}"
    );
    // The run is over: the server has refused every anonymous handshake.
    assert!(
        b.state.stats().rpc_rejected_tls >= 5,
        "{:?}",
        b.state.stats()
    );
}
