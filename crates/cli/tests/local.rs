//! A run as local processes (`--processes N`, or as many as the open-files
//! hard limit needs): one summary, table, hlog and page merged from every
//! child, SIGTERM forwarded, and a child that dies reported as such (its
//! agents missing with cause `process_died`, exit 2).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use agent_sim_testkit::bounded::{CHILD_LIMIT, Lines, OutputWithin, wait_within};

fn agent_sim() -> Command {
    Command::new(env!("CARGO_BIN_EXE_agent-sim"))
}

fn scratch(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("agent-sim-local-test-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The pids whose parent is `parent` (from /proc).
fn children_of(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let rest = &stat[stat.rfind(')').map_or(0, |i| i + 2)..];
        if rest
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<u32>().ok())
            == Some(parent)
        {
            out.push(pid);
        }
    }
    out
}

/// A run of `agents` over two local processes for `duration`, its summary
/// in `d`: the parent, and its progress lines (one a second) as they come.
fn two_processes(d: &std::path::Path, agents: &str, duration: &str) -> (Child, Lines) {
    let mut parent = agent_sim()
        .args([
            "--agents",
            agents,
            "--processes",
            "2",
            "--duration",
            duration,
        ])
        .args(["--progress-every", "1s", "--summary"])
        .arg(d.join("run.json"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let said = Lines::of(parent.stderr.take().unwrap());
    (parent, said)
}

fn kill(pid: u32, sig: &str) {
    let _ = Command::new("kill").args([sig, &pid.to_string()]).status();
}

#[test]
fn local_processes_write_one_merged_summary_table_hlog_and_page() {
    let d = scratch("merged");
    let out = agent_sim()
        .args([
            "--agents",
            "300",
            "--processes",
            "3",
            "--duration",
            "4s",
            "--ramp",
            "all",
        ])
        .args(["--assert", "agents.connected == requested"])
        .arg("--summary")
        .arg(d.join("run.json"))
        .arg("--hlog")
        .arg(d.join("run.hlog"))
        .arg("--report-html")
        .arg(d.join("run.html"))
        .output_within(CHILD_LIMIT);
    let table = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{table}\n{err}");
    assert!(err.contains("agent-sim: --processes 3"), "{err}");
    assert_eq!(
        table.matches("agent-sim sensu run:").count(),
        1,
        "one table: {table}"
    );
    assert!(
        table.contains("pass   agents.connected == requested"),
        "{table}"
    );
    let s = agent_sim::Summary::read(&d.join("run.json")).unwrap();
    assert_eq!((s.agents.requested, s.agents.connected), (300, 300));
    assert_eq!(s.shard, None);
    assert_eq!(
        s.targets.len(),
        3,
        "each child ran its own in-process target"
    );
    assert_eq!(s.latency_us["connect"].count, 300);
    let hlog = agent_sim_metrics::hlog::read_hlog(&d.join("run.hlog")).unwrap();
    let connects: u64 = hlog
        .intervals
        .iter()
        .filter(|i| i.tag.as_deref() == Some("connect"))
        .map(|i| i.histogram.len())
        .sum();
    assert_eq!(connects, 300, "every child's intervals in one log");
    let page = std::fs::read_to_string(d.join("run.html")).unwrap();
    assert!(page.contains("300 agent(s)"));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn sigterm_to_the_parent_ends_every_child_and_still_writes_the_summary() {
    let d = scratch("term");
    let (mut parent, mut said) = two_processes(&d, "100", "60s");
    let t = Instant::now();
    said.wait_for("connected 100/100", Duration::from_secs(60));
    assert_eq!(children_of(parent.id()).len(), 2);
    kill(parent.id(), "-TERM");
    let status = wait_within(&mut parent, CHILD_LIMIT);
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    assert_eq!(status.code(), Some(0));
    let s = agent_sim::Summary::read(&d.join("run.json")).unwrap();
    assert_eq!(s.agents.connected, 100);
    assert!(s.duration_s < 20.0, "{}", s.duration_s);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_local_process_that_dies_is_reported_with_its_agents_missing() {
    let d = scratch("died");
    let (mut parent, mut said) = two_processes(&d, "200", "8s");
    said.wait_for("connected 200/200", Duration::from_secs(60));
    let kids = children_of(parent.id());
    assert_eq!(kids.len(), 2, "{kids:?}");
    kill(kids[0], "-KILL");
    let status = wait_within(&mut parent, CHILD_LIMIT);
    let err = said.all();
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains("died (signal: 9"), "{err}");
    let s = agent_sim::Summary::read(&d.join("run.json")).unwrap();
    assert_eq!((s.agents.requested, s.agents.connected), (200, 100));
    assert_eq!(
        s.outcome.missing.get("process_died"),
        Some(&100),
        "{:?}",
        s.outcome
    );
    let e = &s.errors["process_died"];
    assert!(
        e.sample.as_deref().unwrap().contains("without a summary"),
        "{e:?}"
    );
    let _ = std::fs::remove_dir_all(&d);
}
