//! `agent-sim doctor` on fake limits: a `/proc` tree written by the test
//! (no root needed, nothing of the real host read), exit codes and fixes.

use std::path::{Path, PathBuf};
use std::process::Command;

use agent_sim_testkit::bounded::{CHILD_LIMIT, OutputWithin};
use agent_sim_testkit::fake_proc::FakeProc;

fn agent_sim() -> Command {
    Command::new(env!("CARGO_BIN_EXE_agent-sim"))
}

/// A fake /proc: fd limits 1024/20000, ports 32768-60999, somaxconn 128,
/// conntrack 1000 of 65536, 2 GiB available.
fn fake_proc(tag: &str) -> PathBuf {
    FakeProc {
        nofile: (1024, 20_000),
        nr_open: 1_048_576,
        ports: (32768, 60999),
        somaxconn: 128,
        conntrack: (1000, 65_536),
        mem_kib: (4_194_304, 2_097_152),
        tcp: Vec::new(),
    }
    .write(&format!("doctor-{tag}"))
}

fn doctor(root: &Path, args: &[&str]) -> (i32, String) {
    let out = agent_sim()
        .arg("doctor")
        .arg("--proc-root")
        .arg(root)
        .args(args)
        .env_remove("AGENT_SIM_AGENTS")
        .env_remove("AGENT_SIM_TARGET")
        .output_within(CHILD_LIMIT);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn a_run_that_fits_exits_0() {
    let root = fake_proc("fits");
    let (code, out) = doctor(&root, &["--agents", "2000", "--target", "10.1.2.3:8081"]);
    let _ = std::fs::remove_dir_all(&root);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("This run fits this host"), "{out}");
    assert!(
        out.contains("raises the soft limit to the hard one"),
        "{out}"
    );
}

#[test]
fn a_run_that_does_not_fit_exits_2_with_every_fix() {
    let root = fake_proc("nofit");
    // On the HTTP API's wire: one RPC connection per agent.
    let consul_70k = [
        "--kind",
        "consul",
        "--consul-agent",
        "api",
        "--agents",
        "70000",
        "--target",
    ];
    let (code, out) = doctor(
        &root,
        &[&consul_70k[..], &["10.1.2.3:8300", "--processes", "1"]].concat(),
    );
    assert_eq!(code, 2, "{out}");
    for want in [
        "[FAIL] file descriptors",
        "ulimit -Hn 77824",
        "--shard I/4",
        "[FAIL] ephemeral ports",
        "--source-addr with 3 addresses of this box",
        "[FAIL] conntrack",
        "sysctl -w net.netfilter.nf_conntrack_max=",
        "[FAIL] memory",
        "does not fit this host (exit 2)",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
    // Without --processes 1 the fds and ports are the local processes'.
    let (code, out) = doctor(&root, &[&consul_70k[..], &["127.0.0.1:8300"]].concat());
    let _ = std::fs::remove_dir_all(&root);
    assert_eq!(code, 2, "conntrack and memory still do not fit: {out}");
    assert!(
        out.contains("[  ok] local processes")
            && out.contains("4 local processes")
            && out.contains("dialing from 127.0.0.1-127.0.0.4")
            && !out.contains("[FAIL] file descriptors"),
        "{out}"
    );
}

/// A client agent holds two RPC connections: the file descriptors, ports
/// and shards a fleet needs are counted twice.
#[test]
fn a_client_agents_two_connections_are_counted() {
    let root = fake_proc("client");
    let (code, out) = doctor(
        &root,
        &[
            "--kind",
            "consul",
            "--agents",
            "70000",
            "--target",
            "10.1.2.3:8300",
            "--processes",
            "1",
        ],
    );
    let _ = std::fs::remove_dir_all(&root);
    assert_eq!(code, 2, "{out}");
    for want in [
        // Two per agent, the HTTP pool (64), the process (64), and gossip:
        // its sockets (2), the joins in flight (32) and the servers' streams (8).
        "need 140,170 (70,000 agents)",
        "--shard I/8",
        "need 140,000 sessions per source address per target",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
}

#[test]
fn the_in_process_target_needs_a_listen_backlog() {
    let root = fake_proc("backlog");
    let (code, out) = doctor(&root, &["--agents", "1000"]);
    let _ = std::fs::remove_dir_all(&root);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("[warn] net.core.somaxconn"), "{out}");
    assert!(out.contains("sysctl -w net.core.somaxconn=4096"), "{out}");
}

#[test]
fn bad_usage_exits_64() {
    let out = agent_sim()
        .args(["doctor", "--agents", "0"])
        .output_within(CHILD_LIMIT);
    assert_eq!(out.status.code(), Some(64));
}

/// A fake /proc whose host already holds `n` connections toward `to`.
fn busy_proc(tag: &str, n: u16, to: &str) -> PathBuf {
    let to: std::net::SocketAddr = to.parse().unwrap();
    FakeProc {
        nofile: (20_000, 20_000),
        nr_open: 1_048_576,
        ports: (32768, 60999),
        somaxconn: 4096,
        conntrack: (1000, 262_144),
        mem_kib: (16_777_216, 8_388_608),
        tcp: (0..n)
            .map(|i| {
                (
                    std::net::SocketAddr::new([10, 0, 0, 5].into(), 32768 + i),
                    to,
                )
            })
            .collect(),
    }
    .write(&format!("busy-{tag}"))
}

#[test]
fn a_run_is_refused_before_dialing_when_others_hold_the_ports_to_its_target() {
    let root = busy_proc("run", 26_000, "10.1.2.3:8081");
    let out = agent_sim()
        .env("AGENT_SIM_PROC_ROOT", &root)
        .args([
            "--agents",
            "5000",
            "--target",
            "10.1.2.3:8081",
            "--duration",
            "5s",
        ])
        .output_within(CHILD_LIMIT);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("5000 sessions from one source address to one target need more than the 1976 ephemeral ports left")
            && err.contains("26000 of them already held by this host's connections to 10.1.2.3:8081")
            && err.contains("--source-addr")
            && err.contains("ip_local_port_range"),
        "{err}"
    );
    let (code, report) = doctor(&root, &["--agents", "5000", "--target", "10.1.2.3:8081"]);
    assert_eq!(code, 2, "{report}");
    assert!(
        report.contains("26,000 of them held by this host's connections"),
        "{report}"
    );
    let _ = std::fs::remove_dir_all(&root);
}
