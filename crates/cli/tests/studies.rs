//! Every study runs as one command against the embedded backend, at a tiny
//! scale, and its summary, table and page carry the published figures
//! beside the run's own.

use std::process::Command;
use std::time::Duration;

use agent_sim_testkit::bounded::OutputWithin;

use crate::common::temp_path;

/// The longest one tiny study may take.
const LIMIT: Duration = Duration::from_secs(90);

fn agent_sim() -> Command {
    Command::new(env!("CARGO_BIN_EXE_agent-sim"))
}

/// Runs `study` with `args` and returns its summary and stdout.
fn run(study: &str, args: &[&str]) -> (agent_sim_metrics::Summary, String) {
    let summary = temp_path(&format!("study-{study}.json"));
    let page = temp_path(&format!("study-{study}.html"));
    let out = agent_sim()
        .args(["study", study])
        .args(args)
        .arg("--summary")
        .arg(&summary)
        .arg("--report-html")
        .arg(&page)
        .output_within(LIMIT);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{study}: {stdout}\n{stderr}");
    let text = std::fs::read_to_string(&summary).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    agent_sim_testkit::validate_json(agent_sim_metrics::SUMMARY_SCHEMA, &v).expect("validates");
    let s = agent_sim_metrics::Summary::from_json(&text).unwrap();
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains("<section id=\"study\">"),
        "{study}: no study section"
    );
    let _ = std::fs::remove_file(&summary);
    let _ = std::fs::remove_file(&page);
    (s, stdout)
}

/// The study's section: named, scaled, every figure a row.
fn check_section(s: &agent_sim_metrics::Summary, stdout: &str, name: &str) {
    let st = s.study.as_ref().expect("the summary carries the study");
    assert_eq!(st.name, name);
    assert!(!st.figures.is_empty());
    assert!(stdout.contains(&format!("study      {name}: ")), "{stdout}");
    for f in &st.figures {
        assert!(
            stdout.contains(&f.label),
            "{name}: no row {:?}\n{stdout}",
            f.label
        );
    }
}

#[test]
fn consul_global_scale_times_the_upstream_and_intention_changes_at_every_agent() {
    let (s, out) = run(
        "consul-global-scale",
        &[
            "--scale",
            "0.002",
            "--duration",
            "12s",
            "--probe-every",
            "3s",
        ],
    );
    check_section(&s, &out, "consul-global-scale");
    let st = s.study.as_ref().unwrap();
    assert_eq!(st.scale, 0.002);
    assert!(
        st.scaled.iter().any(|l| l == "agents: 20 of 10000"),
        "{:?}",
        st.scaled
    );
    assert!(
        st.scaled
            .iter()
            .any(|l| l.starts_with("boot window: 3.1s of 26m")),
        "{:?}",
        st.scaled
    );
    assert_eq!(s.agents.connected, 20);
    // Our propagation figures, at the proxy and at the agent, read from
    // the run beside the published.
    let rows = agent_sim_metrics::study::rows(&s);
    for label in [
        "endpoint propagation p50, at the proxy",
        "endpoint propagation p99, at the proxy",
        "endpoint propagation p50, at the agent",
        "intention propagation p50, at the agent",
        "intention propagation p99, at the proxy",
    ] {
        let row = rows.iter().find(|r| r.label == label);
        assert!(row.unwrap().value.is_some(), "{label}: {rows:?}");
    }
    // 18 proxies behind each agent, each change of either kind handed to
    // every one.
    for name in ["propagation", "propagation_intentions"] {
        let (agent, proxy) = (&s.latency_us[name], &s.latency_us[&format!("{name}_proxy")]);
        assert!(agent.count >= 20, "{name}: {agent:?}");
        assert_eq!(proxy.count, 18 * agent.count, "{agent:?} {proxy:?}");
    }
    assert!(s.probes.iter().any(|p| p.kind == "intentions"));
    // Every node asked for its certificate at boot.
    assert_eq!(s.latency_us["auto_encrypt"].count, 20);
}

#[test]
fn sensu_scaling_connects_its_share_of_the_forty_thousand() {
    let (s, out) = run(
        "sensu-scaling",
        &["--scale", "0.001", "--ramp", "all", "--duration", "4s"],
    );
    check_section(&s, &out, "sensu-scaling");
    assert_eq!(s.agents.connected, 40);
    let rows = agent_sim_metrics::study::rows(&s);
    assert_eq!(rows[0].value, Some(40.0), "{rows:?}");
}

#[test]
fn criteo_streaming_runs_in_both_modes_and_compares() {
    let args = ["--scale", "0.01", "--ramp", "all", "--duration", "5s"];
    let (s, out) = run("criteo-streaming", &args);
    check_section(&s, &out, "criteo-streaming");
    assert_eq!(s.agents.connected, 5);
    let mut blocking = args.to_vec();
    blocking.extend(["--watch", "blocking"]);
    let (b, _) = run("criteo-streaming", &blocking);
    let rows = agent_sim_metrics::compare::rows(&s, &b);
    assert!(
        rows.iter()
            .any(|r| r.group == "study criteo-streaming" && r.a.is_some() && r.b.is_some()),
        "{rows:?}"
    );
}

#[test]
fn vault_outage_writes_and_cleans_up() {
    let (s, out) = run(
        "vault-outage",
        &["--scale", "0.005", "--ramp", "all", "--duration", "6s"],
    );
    check_section(&s, &out, "vault-outage");
    assert_eq!(s.agents.connected, 10);
    let v = s.vault.as_ref().expect("the Vault servers ran");
    assert_eq!(v.cleanup.keys_left, 0, "{v:?}");
}

#[test]
fn auth_cost_drops_every_session_and_times_the_return() {
    let (s, out) = run(
        "auth-cost",
        &[
            "--scale",
            "0.01",
            "--storm",
            "at=2s,drop=100%",
            "--duration",
            "6s",
        ],
    );
    check_section(&s, &out, "auth-cost");
    assert_eq!(s.agents.connected, 20);
    assert!(!s.disruptions.is_empty());
    // The embedded backend checked each password with bcrypt at cost 10
    // (tens of milliseconds each), as Sensu's does.
    let connect = &s.latency_us["connect"];
    assert!(connect.p50 >= 20_000, "{connect:?}");
}

#[test]
fn a_study_refuses_what_it_cannot_run() {
    for (args, says) in [
        (vec!["study", "nope"], "no study \"nope\""),
        (vec!["study", "auth-cost", "--scale", "2"], "--scale 2"),
        (vec!["study", "auth-cost", "--scale", "0"], "--scale 0"),
        (
            vec!["study", "auth-cost", "--config", "configs/mixed.toml"],
            "--config cannot be given",
        ),
    ] {
        let out = agent_sim().args(&args).output_within(LIMIT);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let out = agent_sim().args(["study", "--list"]).output_within(LIMIT);
    assert_eq!(out.status.code(), Some(0));
    let list = String::from_utf8_lossy(&out.stdout);
    for name in [
        "consul-global-scale",
        "sensu-scaling",
        "criteo-streaming",
        "vault-outage",
        "auth-cost",
    ] {
        assert!(list.contains(name), "{list}");
    }
}
