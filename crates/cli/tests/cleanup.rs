//! `agent-sim cleanup`: a Consul run killed with SIGKILL leaves its nodes,
//! sessions and probe objects; cleanup by name prefix removes exactly
//! those and leaves everything else (a node with the prefix in its name
//! but not marked as the run's, another service's intentions).

use std::process::{Command, Stdio};
use std::time::Duration;

use agent_sim_consul::http::HttpApi;
use agent_sim_server::consul::ConsulTargetConfig;
use agent_sim_testkit::bounded::{CHILD_LIMIT, OutputWithin, until, wait_within};
use bytes::Bytes;
use http::Method;

use crate::common;

async fn get(api: &HttpApi, path: &str) -> serde_json::Value {
    serde_json::from_slice(&api.call(Method::GET, path, Bytes::new()).await.unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_removes_what_a_killed_run_left_and_nothing_else() {
    let b = common::consul_backend(ConsulTargetConfig::default()).await;
    let _guard = b.stop.clone().drop_guard();
    let (state, rpc, http) = (b.state.clone(), b.rpc, b.http);
    let api = HttpApi::new(http, None, "").unwrap();
    // Not the run's: a look-alike node without the run's meta, and the
    // intentions of a real service.
    for body in [
        r#"{"Node":"agent-sim-lookalike","Address":"10.8.0.1"}"#,
        r#"{"Node":"web-node","Address":"10.8.0.2","Service":{"ID":"web-1","Service":"web","Port":80}}"#,
    ] {
        api.put("/v1/catalog/register", Bytes::from(body))
            .await
            .unwrap();
    }
    let theirs = r#"{"Kind":"service-intentions","Name":"web","Sources":[{"Name":"frontend","Action":"allow"}]}"#;
    api.put("/v1/config", Bytes::from(theirs)).await.unwrap();
    let before_nodes = get(&api, "/v1/catalog/nodes").await;
    let before_web = get(&api, "/v1/config/service-intentions/web").await;

    let bin = env!("CARGO_BIN_EXE_agent-sim");
    let target = [
        "--target",
        &rpc.to_string(),
        "--http-target",
        &http.to_string(),
    ];
    let mut child = Command::new(bin)
        .args([
            "--kind",
            "consul",
            "--agents",
            "20",
            "--ramp",
            "all",
            "--duration",
            "60s",
        ])
        .args([
            "--upstreams",
            "web",
            "--probe",
            "catalog",
            "--probe-every",
            "1s",
            "--quiet",
        ])
        .args(target)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The child runs in real time.
    until(
        Duration::from_secs(20),
        "20 sessions and the probe node",
        async || {
            state.stats().sessions_active == 20
                && get(&api, "/v1/catalog/node/agent-sim-probe").await != serde_json::Value::Null
        },
    )
    .await;
    child.kill().unwrap();
    wait_within(&mut child, CHILD_LIMIT);
    // The intentions probe's own entry, as a killed intentions run leaves it.
    let probe_entry = r#"{"Kind":"service-intentions","Name":"agent-sim-probe",
        "Meta":{"agent-sim":"probe","agent-sim-prefix":"agent-sim"},
        "Sources":[{"Name":"agent-sim-probe","Action":"deny"}]}"#;
    api.put("/v1/config", Bytes::from(probe_entry))
        .await
        .unwrap();
    assert_eq!(
        get(&api, "/v1/catalog/nodes")
            .await
            .as_array()
            .unwrap()
            .len(),
        3 + 21
    );

    // A new run over the same names refuses to start (it would take over
    // and then delete nodes it did not create) and touches nothing.
    let nodes_left = get(&api, "/v1/catalog/nodes").await;
    // A run of 5 agents for `duration` with `extra` flags.
    let five = |duration: &str, extra: &[&str]| {
        Command::new(bin)
            .args(["--kind", "consul", "--agents", "5", "--duration", duration])
            .args(["--quiet"])
            .args(extra)
            .args(target)
            .output_within(CHILD_LIMIT)
    };
    let again = five("5s", &[]);
    let err = String::from_utf8_lossy(&again.stderr);
    assert_eq!(again.status.code(), Some(64), "{err}");
    assert!(
        err.contains("5 node(s) this run would register already exist")
            && err.contains("agent-sim cleanup --kind consul"),
        "{err}"
    );
    assert_eq!(get(&api, "/v1/catalog/nodes").await, nodes_left);
    assert_eq!(state.stats().sessions_active, 20);
    // Another prefix does not collide.
    let other = five("2s", &["--name-prefix", "other-run"]);
    assert_eq!(
        other.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&other.stderr)
    );
    assert_eq!(get(&api, "/v1/catalog/nodes").await, nodes_left);

    // `agent-sim cleanup` with `extra` flags: must succeed; its stdout.
    let cleanup = |extra: &[&str]| {
        let o = Command::new(bin)
            .args(["cleanup", "--kind", "consul"])
            .args(extra)
            .args(target)
            .output_within(CHILD_LIMIT);
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(
            o.status.success(),
            "{out} {}",
            String::from_utf8_lossy(&o.stderr)
        );
        out
    };
    let out = cleanup(&["--dry-run"]);
    assert!(
        out.contains("would remove 21 node(s) with 20 session(s), 1 config entry"),
        "{out}"
    );
    assert!(
        out.contains("left alone (not marked as this prefix's): node agent-sim-lookalike"),
        "{out}"
    );
    assert_eq!(
        state.stats().sessions_active,
        20,
        "a dry run removes nothing"
    );
    let out = cleanup(&[]);
    assert!(
        out.contains("removed 21 node(s) with 20 session(s), 1 config entry"),
        "{out}"
    );

    assert_eq!(get(&api, "/v1/catalog/nodes").await, before_nodes);
    assert_eq!(get(&api, "/v1/session/list").await, serde_json::json!([]));
    assert_eq!(
        get(&api, "/v1/config/service-intentions/web").await,
        before_web
    );
    let gone = api
        .call(
            Method::GET,
            "/v1/config/service-intentions/agent-sim-probe",
            Bytes::new(),
        )
        .await;
    assert_eq!(gone.unwrap_err().status, Some(404));

    // Without a target there is nothing to clean: a usage error.
    let bad = Command::new(bin)
        .args(["cleanup", "--kind", "consul"])
        .output_within(CHILD_LIMIT);
    assert_eq!(bad.status.code(), Some(64));
}
