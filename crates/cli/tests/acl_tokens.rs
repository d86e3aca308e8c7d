//! Each Consul agent with its own ACL token (`--acl-tokens`) against the
//! embedded server with ACLs on (default deny): tokens created per agent
//! and deleted at the end, a token file whose lines go to agents by index,
//! denials counted by method in the server's words, a run whose tokens
//! cannot be created stopped before its agents boot, and `cleanup`
//! removing what a killed run left.

use crate::common;

use std::time::Duration;

use crate::common::assert_exit;
use agent_sim::{Kind, Ramp, RunBuilder};
use agent_sim_consul::http::HttpApi;
use bytes::Bytes;

const MGMT: &str = "0c0ffee0-0000-4000-8000-00000000a11c";

async fn backend() -> common::ConsulBackend {
    common::consul_backend(agent_sim_server::consul::ConsulTargetConfig {
        acl_tokens: Some(vec![MGMT.into()]),
        ..Default::default()
    })
    .await
}

fn run(b: &common::ConsulBackend, agents: u64) -> RunBuilder {
    let http = b.http.to_string();
    RunBuilder::new(Kind::Consul)
        .agents(agents)
        .ramp(Ramp::All)
        .target(b.rpc.to_string())
        .duration(Duration::from_secs(4))
        .args(move |a| {
            a.http_target = Some(http);
            a.upstreams = Some("web".parse().unwrap());
            a.probe = Some("off".parse().unwrap());
            a.gossip = Some(false);
            a.name_prefix = Some("acl".into());
            a.reconnect_max = Some("1s".parse().unwrap());
        })
}

fn api(b: &common::ConsulBackend) -> HttpApi {
    HttpApi::new(b.http, Some(MGMT), "").unwrap()
}

/// The tokens on the server whose description marks them as the run's.
async fn runs_tokens(api: &HttpApi) -> Vec<serde_json::Value> {
    let body = api
        .call(::http::Method::GET, "/v1/acl/tokens", Bytes::new())
        .await
        .expect("token list");
    let all: Vec<serde_json::Value> = serde_json::from_slice(&body).unwrap();
    all.into_iter()
        .filter(|t| {
            t["Description"]
                .as_str()
                .is_some_and(|d| d.starts_with("agent-sim:acl "))
        })
        .collect()
}

/// A token for `node` with its node's identity and the `app` service's.
async fn create_token(api: &HttpApi, node: &str) -> String {
    let body = serde_json::json!({
        "Description": format!("made by the test for {node}"),
        "NodeIdentities": [{ "NodeName": node, "Datacenter": "dc1" }],
        "ServiceIdentities": [{ "ServiceName": "app" }],
    });
    let answer = api
        .put("/v1/acl/token", Bytes::from(body.to_string()))
        .await
        .expect("token create");
    let t: serde_json::Value = serde_json::from_slice(&answer).unwrap();
    t["SecretID"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_agent_gets_its_own_node_identity_token_and_the_run_deletes_them() {
    let b = backend().await;
    let outcome = run(&b, 20)
        .args(|a| {
            a.token = Some(MGMT.into());
            a.acl_tokens = Some("node-identity".parse().unwrap());
            // Sessions need session:write: the run's policy grants it.
            a.session_ttl = Some("30s".parse().unwrap());
        })
        .run()
        .await
        .expect("run");
    let s = &outcome.summary;
    assert_exit(&outcome, 0);
    assert_eq!(s.agents.connected, 20);
    assert!(s.denied.is_empty(), "{:?}", s.denied);
    assert!(s.errors.is_empty(), "{:?}", s.errors);
    assert_eq!(s.counters["sessions_created"], 20, "{:?}", s.counters);
    let left = runs_tokens(&api(&b)).await;
    b.stop.cancel();
    assert!(left.is_empty(), "tokens left: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_file_goes_to_agents_by_index_and_a_wrong_one_is_denied_by_method() {
    let b = backend().await;
    let api = api(&b);
    let mut lines = Vec::new();
    for i in 0..4 {
        lines.push(create_token(&api, &format!("acl-{i}")).await);
    }
    // Agent 4 gets agent 0's token: it may not write node acl-4.
    lines.push(lines[0].clone());
    let file = common::temp_path("acl-tokens.txt");
    std::fs::write(&file, lines.join("\n")).unwrap();
    let path = file.clone();
    let outcome = run(&b, 5)
        .args(move |a| {
            a.acl_tokens = Some(path.to_str().unwrap().parse().unwrap());
            a.session_ttl = Some("off".parse().unwrap());
        })
        .run()
        .await
        .expect("run");
    b.stop.cancel();
    std::fs::remove_file(&file).unwrap();
    let s = &outcome.summary;
    assert_exit(&outcome, 2);
    // Denied, and retried with backoff: no storm of refused calls.
    let denied = s.denied["Catalog.Register"];
    assert!((1..=10).contains(&denied), "{:?}", s.denied);
    let e = &s.errors["acl_denied"];
    let sample = e.sample.as_deref().unwrap();
    assert!(
        sample.contains("lacks permission 'node:write' on \"acl-4\""),
        "{sample}"
    );
    assert!(
        !sample.contains(&lines[0]),
        "a secret in a sample: {sample}"
    );
    // The other four registered with their own tokens.
    assert!(s.agents.connected >= 4, "{:?}", s.agents);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_that_cannot_be_created_stop_the_fleet_before_it_boots() {
    let b = backend().await;
    // No management token: the server refuses to create tokens.
    let outcome = run(&b, 5)
        .args(|a| a.acl_tokens = Some("node-identity".parse().unwrap()))
        .run()
        .await
        .expect("run");
    b.stop.cancel();
    let s = &outcome.summary;
    assert_exit(&outcome, 1);
    assert_eq!(s.agents.ever_connected, 0, "{:?}", s.agents);
    let e = &s.errors["acl_tokens"];
    assert!(
        e.sample
            .as_deref()
            .unwrap()
            .contains("lacks permission 'acl:write'"),
        "{e:?}"
    );
    assert!(e.hint.as_deref().unwrap().contains("management token"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_file_too_short_is_refused_before_the_run() {
    let b = backend().await;
    let file = common::temp_path("acl-short.txt");
    std::fs::write(&file, "only-one\n").unwrap();
    let path = file.clone();
    let outcome = run(&b, 3)
        .args(move |a| a.acl_tokens = Some(path.to_str().unwrap().parse().unwrap()))
        .run()
        .await
        .expect("run");
    b.stop.cancel();
    std::fs::remove_file(&file).unwrap();
    assert_exit(&outcome, 1);
    let e = &outcome.summary.errors["acl_tokens"];
    assert!(
        e.sample
            .as_deref()
            .unwrap()
            .contains("1 tokens, but the agents need 3"),
        "{e:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_removes_the_tokens_and_policy_a_killed_run_left() {
    let b = backend().await;
    let api = api(&b);
    let plan = agent_sim_consul::acl::TokenPlan {
        prefix: "acl".into(),
        datacenter: "dc1".into(),
        service: Some("app".into()),
        chains: None,
        rules: agent_sim_consul::acl::needed_rules("acl", true, &[]),
        rate: 1000.0,
    };
    let end = tokio_util::sync::CancellationToken::new();
    let (made, failed) = agent_sim_consul::acl::create(&api, &plan, 0, 3, &end, &|_| {}).await;
    assert!(failed.is_none(), "{failed:?}");
    assert_eq!((made.accessors.len(), made.policy.is_some()), (3, true));
    // Another run's token is not ours.
    create_token(&api, "other-1").await;
    assert_eq!(runs_tokens(&api).await.len(), 3);
    let report = agent_sim_consul::cleanup::cleanup(&api, "acl", false)
        .await
        .expect("cleanup");
    let left = runs_tokens(&api).await;
    b.stop.cancel();
    assert_eq!((report.acl_tokens.len(), report.acl_policies.len()), (3, 1));
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_runs_tokens_are_removed_by_the_cleanup_command() {
    use agent_sim_testkit::bounded::{CHILD_LIMIT, OutputWithin as _, until, wait_within};
    use std::process::{Command, Stdio};
    let b = backend().await;
    let _guard = b.stop.clone().drop_guard();
    let api = api(&b);
    let bin = env!("CARGO_BIN_EXE_agent-sim");
    let (rpc, http) = (b.rpc.to_string(), b.http.to_string());
    let target = ["--target", &rpc, "--http-target", &http, "--token", MGMT];
    let mut child = Command::new(bin)
        .args(["--kind", "consul", "--agents", "10", "--ramp", "all"])
        .args(["--duration", "60s", "--name-prefix", "acl", "--quiet"])
        .args(["--acl-tokens", "node-identity", "--gossip=false"])
        .args(["--probe", "off", "--upstreams", "web"])
        .args(target)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let state = b.state.clone();
    until(Duration::from_secs(20), "10 sessions", async || {
        state.stats().sessions_active == 10
    })
    .await;
    child.kill().unwrap();
    wait_within(&mut child, CHILD_LIMIT);
    // Killed: its tokens (and its sessions' policy) are still there.
    assert_eq!(runs_tokens(&api).await.len(), 10);
    let o = Command::new(bin)
        .args(["cleanup", "--kind", "consul", "--name-prefix", "acl"])
        .args(target)
        .output_within(CHILD_LIMIT);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.contains("10 ACL token(s) and 1 ACL policy marked as this prefix's"),
        "{out}"
    );
    assert!(runs_tokens(&api).await.is_empty());
}
