//! End to end: simulated Vault servers (`--vault-nodes`) beside Consul
//! agents against the embedded target, through the same path as the
//! binary: the summary's `vault` section (schema-valid), the table's lines,
//! the page's section; and the flags' usage errors, the TOML keys.

use std::time::Duration;

use agent_sim::args::RunArgs;
use agent_sim::config::resolve;
use agent_sim::plan::Protocol;
use agent_sim::{Kind, Ramp, RunBuilder};

use crate::common;
use crate::common::{assert_exit, temp_path};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vault_servers_write_check_and_clean_up_beside_the_agents() {
    let summary_path = temp_path("vault-run.json");
    let page = temp_path("vault-run.html");
    let outcome = RunBuilder::new(Kind::Consul)
        .agents(5)
        .ramp(Ramp::per_second(1000.0))
        .duration(Duration::from_secs(4))
        .args(|a| {
            a.vault_nodes = Some(3);
            a.vault_tokens = Some("100/s".parse().unwrap());
            a.vault_token_ttl = Some("1s".parse().unwrap());
            a.vault_bursts = vec!["at=1s,tokens=200".parse().unwrap()];
            a.summary = Some(summary_path.clone());
            a.report_html = Some(page.clone());
        })
        .assert("errors.total == 0".parse().unwrap())
        .run()
        .await
        .expect("run");
    assert_exit(&outcome, 0);
    let v = outcome.summary.vault.as_ref().expect("a vault section");
    assert_eq!(v.nodes, 3);
    assert_eq!(v.path, "agent-sim/vault/");
    assert!(v.tokens_created >= 200 && v.tokens_revoked > 0, "{v:?}");
    assert_eq!(v.bursts[0].created, 200);
    assert_eq!(v.lock_check.split_brain + v.lock_check.mismatch, 0);
    assert_eq!((v.read_back.lost, v.read_back.changed), (0, 0));
    assert_eq!((v.cleanup.keys_left, v.cleanup.sessions_left), (0, 0));
    assert!(outcome.summary.rates_per_s["vault_kv_writes"] > 0.0);
    assert!(outcome.summary.latency_us["kv_put"].count > 0);
    let lines = v.table_lines().join("\n");
    assert!(lines.contains("0 split-brain"), "{lines}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary_path).unwrap()).unwrap();
    agent_sim_testkit::validate_json(agent_sim_metrics::SUMMARY_SCHEMA, &json)
        .expect("the summary with a vault section validates");
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("Vault storage writes"));
    let _ = std::fs::remove_file(&summary_path);
    let _ = std::fs::remove_file(&page);
}

fn args(f: &dyn Fn(&mut RunArgs)) -> RunArgs {
    let mut a = RunArgs {
        kind: Some(Kind::Consul),
        ..RunArgs::default()
    };
    f(&mut a);
    a
}

#[test]
fn vault_flags_are_checked_before_any_socket() {
    let no_env = |_: &str| None;
    for (a, needle) in [
        (args(&|a| a.vault_nodes = Some(17)), "--vault-nodes: 17"),
        (
            args(&|a| {
                a.vault_nodes = Some(3);
                a.vault_token_ttl = Some("100ms".parse().unwrap());
            }),
            "--vault-token-ttl",
        ),
        (
            args(&|a| {
                a.vault_nodes = Some(3);
                a.vault_path = Some("vault/".into());
            }),
            "--vault-path",
        ),
        (
            args(&|a| {
                a.kind = Some(Kind::Sensu);
                a.vault_nodes = Some(3);
            }),
            "--vault-nodes: only --kind consul",
        ),
    ] {
        let e = resolve(a, &no_env).unwrap_err().0;
        assert!(e.starts_with(needle), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
    let bad: Result<agent_sim_consul::vault::Burst, _> = "at=1s".parse();
    assert!(bad.unwrap_err().to_string().contains("at=T,tokens=N"));
}

#[test]
fn the_config_file_sets_the_vault_servers() {
    let dir = std::env::temp_dir().join(format!("agent-sim-vault-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("run.toml");
    std::fs::write(
        &p,
        "kind = \"consul\"\nname-prefix = \"vlt\"\nvault-nodes = 3\nvault-tokens = \"200/s\"\n\
         vault-token-ttl = \"45s\"\nvault-burst = [\"at=30s,tokens=5000\", \"at=1m,tokens=10\"]\n",
    )
    .unwrap();
    let c = resolve(
        RunArgs {
            config: Some(p),
            ..RunArgs::default()
        },
        &|_: &str| None,
    )
    .unwrap();
    let Protocol::Consul(cc) = &c.fleets[0].protocol else {
        panic!("a consul fleet")
    };
    let v = cc.vault.as_ref().expect("vault servers");
    assert_eq!(v.nodes, 3);
    assert_eq!(v.tokens_per_s, 200.0);
    assert_eq!(v.token_ttl, Duration::from_secs(45));
    assert_eq!(v.bursts.len(), 2);
    assert_eq!(v.bursts[0].tokens, 5000);
    assert_eq!(v.path_for("vlt"), "vlt/vault/");
    assert_eq!(c.effective["vault-nodes"], 3);
    let _ = std::fs::remove_dir_all(&dir);
    // The scenario's config reads as the flags say.
    let scenario =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/vault-on-consul.toml");
    let c = resolve(
        RunArgs {
            config: Some(scenario),
            ..RunArgs::default()
        },
        &|_: &str| None,
    )
    .unwrap();
    let Protocol::Consul(cc) = &c.fleets[0].protocol else {
        panic!("a consul fleet")
    };
    assert_eq!(cc.vault.as_ref().map(|v| v.nodes), Some(3));
    assert_eq!(c.asserts.len(), 6);
}

/// The keys under the run's Vault path on `api`'s server (0 on 404).
async fn vault_keys(api: &agent_sim_consul::http::HttpApi, path: &str) -> usize {
    match api
        .call(
            http::Method::GET,
            &format!("/v1/kv/{path}?keys"),
            bytes::Bytes::new(),
        )
        .await
    {
        Ok(b) => serde_json::from_slice::<Vec<String>>(&b).unwrap().len(),
        Err(e) if e.status == Some(404) => 0,
        Err(e) => panic!("{e}"),
    }
}

/// The lock sessions of the run's Vault servers on `api`'s server.
async fn vault_sessions(api: &agent_sim_consul::http::HttpApi) -> usize {
    let b = api
        .call(http::Method::GET, "/v1/session/list", bytes::Bytes::new())
        .await
        .unwrap();
    let list: Vec<serde_json::Value> = serde_json::from_slice(&b).unwrap();
    list.iter()
        .filter(|s| {
            s["Name"]
                .as_str()
                .is_some_and(|n| n.starts_with("Vault Lock "))
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_removes_the_keys_and_sessions_of_a_killed_vault_run() {
    use agent_sim_testkit::bounded::{CHILD_LIMIT, OutputWithin, until, wait_within};
    use std::process::{Command, Stdio};
    let b = common::consul_backend(agent_sim_server::consul::ConsulTargetConfig::default()).await;
    let _guard = b.stop.clone().drop_guard();
    let api = agent_sim_consul::http::HttpApi::new(b.http, None, "").unwrap();
    let bin = env!("CARGO_BIN_EXE_agent-sim");
    let target = [
        "--target".to_string(),
        b.rpc.to_string(),
        "--http-target".to_string(),
        b.http.to_string(),
    ];
    let mut child = Command::new(bin)
        .args(["--kind", "consul", "--agents", "2", "--duration", "60s"])
        .args(["--name-prefix", "vk", "--quiet"])
        .args(["--vault-nodes", "3", "--vault-tokens", "100/s"])
        .args(&target)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The child runs in real time.
    until(Duration::from_secs(20), "tokens written", async || {
        vault_keys(&api, "vk/vault/").await > 100
    })
    .await;
    child.kill().unwrap();
    wait_within(&mut child, CHILD_LIMIT);
    assert_eq!(vault_sessions(&api).await, 3);
    let dry = Command::new(bin)
        .args([
            "cleanup",
            "--kind",
            "consul",
            "--name-prefix",
            "vk",
            "--dry-run",
        ])
        .args(&target)
        .output_within(CHILD_LIMIT);
    let out = String::from_utf8_lossy(&dry.stdout);
    assert!(out.contains("vault vk/vault/: would remove"), "{out}");
    assert!(vault_keys(&api, "vk/vault/").await > 100);
    let done = Command::new(bin)
        .args(["cleanup", "--kind", "consul", "--name-prefix", "vk"])
        .args(&target)
        .output_within(CHILD_LIMIT);
    let out = String::from_utf8_lossy(&done.stdout);
    assert_eq!(done.status.code(), Some(0), "{out}");
    assert!(
        out.contains("3 session(s); left 0 key(s), 0 session(s)"),
        "{out}"
    );
    assert_eq!(vault_keys(&api, "vk/vault/").await, 0);
    assert_eq!(vault_sessions(&api).await, 0);
}
