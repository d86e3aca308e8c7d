//! A box that runs out of ephemeral ports mid-run: in a network namespace
//! of its own (its port range is its own), a Sensu fleet of 400 agents
//! starts against the embedded backend from one source address, and 1.5 s
//! in the range is narrowed to 150 ports. The agents that cannot get a
//! port wait (no retry storm), the ceiling is reported once with the
//! numbers, they end missing with cause `local_ports_exhausted`, and the
//! sessions already connected keep their keepalive timing.
//!
//! Needs `unshare -n` (root, or user namespaces) and `ip`; says it is
//! skipped otherwise.

use std::process::Command;

use agent_sim_testkit::bounded::{CHILD_LIMIT, OutputWithin};

fn can_unshare() -> bool {
    Command::new("unshare")
        .args(["-n", "sh", "-c", "ip link set lo up"])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn running_out_of_ports_is_a_ceiling_not_a_retry_storm() {
    if !can_unshare() {
        eprintln!("skipped: `unshare -n` is not permitted here (needs root or user namespaces)");
        return;
    }
    let summary =
        std::env::temp_dir().join(format!("agent-sim-ceiling-{}.json", std::process::id()));
    let script = format!(
        "ip link set lo up || exit 97\n\
         {bin} --agents 400 --ramp 100/s --source-addr 127.0.0.1 --keepalive-interval 1s \
         --duration 9s --quiet --summary {summary} &\n\
         P=$!\n\
         sleep 1.5\n\
         sysctl -q -w net.ipv4.ip_local_port_range='40000 40149' || {{ kill $P; exit 98; }}\n\
         wait $P",
        bin = env!("CARGO_BIN_EXE_agent-sim"),
        summary = summary.display()
    );
    let out = Command::new("unshare")
        .args(["-n", "sh", "-c", &script])
        .output_within(CHILD_LIMIT);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(
        out.status.code(),
        Some(98),
        "sysctl in the namespace: {err}"
    );
    assert_eq!(out.status.code(), Some(2), "an incomplete fleet: {err}");
    let s = agent_sim::Summary::read(&summary).unwrap();
    let _ = std::fs::remove_file(&summary);
    let connected = s.agents.connected;
    assert!((200..=340).contains(&connected), "connected {connected}");
    assert_eq!(
        s.outcome.missing.get("local_ports_exhausted").copied(),
        Some(400 - connected),
        "{:?}",
        s.outcome
    );
    let w = &s.warnings["local_ports_exhausted"];
    assert_eq!(w.count, 1, "reported once: {w:?}");
    let words = w.sample.as_deref().unwrap();
    assert!(
        words.contains("from 127.0.0.1") && words.contains("held"),
        "{words}"
    );
    // No storm: each refused agent dialed about once (nothing closed).
    let refused = s.errors["local_ports_exhausted"].count;
    assert!(refused <= (400 - connected) + 20, "{refused} refused dials");
    assert!(
        s.counters["reconnect_attempts"] <= 2 * (400 - connected),
        "{:?}",
        s.counters
    );
    // The connected ones kept their timing (a budget).
    let lateness = &s.latency_us["keepalive_lateness"];
    assert!(
        lateness.p99 < 100_000,
        "keepalive lateness p99 {} µs",
        lateness.p99
    );
}
