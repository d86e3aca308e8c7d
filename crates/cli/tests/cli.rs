//! The binary's contract: exit codes and one-line usage errors.

use std::process::Command;

use agent_sim_testkit::bounded::{CHILD_LIMIT, OutputWithin};
fn agent_sim() -> Command {
    Command::new(env!("CARGO_BIN_EXE_agent-sim"))
}

#[test]
fn bad_usage_exits_64_with_one_line() {
    for args in [
        vec!["--agents", "0"],
        vec!["--ramp", "fast"],
        vec!["--kind", "nomad"],
        vec!["--duration", "ten"],
        vec!["--no-such-flag"],
        vec!["--shard", "3/2"],
        vec!["--assert", "nonsense"],
        vec!["serve"],
        vec![
            "serve",
            "--consul-rpc",
            "127.0.0.1:0",
            "--consul-http",
            "127.0.0.1:0",
            "--tls-cert-file",
            "/nonexistent.pem",
        ],
        vec!["--kind", "consul", "--cert-file", "/nonexistent.pem"],
        vec!["--deregister=maybe"],
        vec!["--kind", "consul-dataplane", "--proxies-per-agent", "2"],
        vec!["--kind", "sensu", "--proxies-per-agent", "2"],
        vec!["--embedded-password-cost", "99"],
        vec!["--kind", "consul-dataplane", "--auto-encrypt"],
    ] {
        let out = agent_sim().args(&args).output_within(CHILD_LIMIT);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.trim().is_empty(), "{args:?}");
    }
}

#[test]
fn result_files_that_cannot_be_written_are_refused_before_any_agent_dials() {
    let missing = std::env::temp_dir().join(format!("agent-sim-missing-{}", std::process::id()));
    for (flag, file, processes) in [
        ("--summary", "run.json", "1"),
        ("--report-html", "run.html", "1"),
        ("--hlog", "run.hlog", "1"),
        // The parent of local processes writes them only at the very end.
        ("--summary", "run.json", "2"),
        ("--report-html", "run.html", "2"),
    ] {
        let path = missing.join(file);
        let out = agent_sim()
            .args([
                "--agents",
                "5",
                "--duration",
                "30s",
                "--processes",
                processes,
            ])
            .arg(flag)
            .arg(&path)
            .output_within(CHILD_LIMIT);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{flag} {processes}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains(&format!("{flag} {}", path.display()))
                && err.contains("cannot be written"),
            "{err}"
        );
        assert!(out.stdout.is_empty(), "no run, no table: {out:?}");
    }
}

#[test]
fn too_many_agents_for_the_fd_limit_are_refused_before_any_socket() {
    let out = agent_sim()
        .args(["--agents", "5000000"])
        .output_within(CHILD_LIMIT);
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("file descriptors"), "{err}");
    assert!(err.contains("--shard"), "{err}");
}

#[test]
fn demo_run_prints_the_table_and_exits_0() {
    let out = agent_sim()
        .args([
            "--agents",
            "50",
            "--duration",
            "2s",
            "--ramp",
            "all",
            "--quiet",
        ])
        .output_within(CHILD_LIMIT);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("connected 50/50"), "{stdout}");
}

#[test]
fn help_lists_exit_codes() {
    let out = agent_sim().arg("--help").output_within(CHILD_LIMIT);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("64 bad usage"));
}

#[test]
fn scenario_usage_errors_are_one_line_naming_the_flag() {
    for (args, flag) in [
        (vec!["--churn", "150%/30s"], "--churn"),
        (vec!["--storm", "at=x"], "--storm"),
        (vec!["--pause", "at=10s"], "--pause"),
        (vec!["--ramp-down", "200/s"], "--ramp-down"),
        (vec!["--reconnect", "linear"], "--reconnect"),
        (vec!["--max-session-length", "soon"], "--max-session-length"),
        (vec!["--storm", "at=90s", "--duration", "30s"], "--storm"),
    ] {
        let out = agent_sim().args(&args).output_within(CHILD_LIMIT);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(flag), "{args:?}: {err}");
    }
}
