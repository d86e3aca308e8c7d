//! `agent-sim serve --faults` as a command: bad specs are refused before
//! any socket (exit 64, one line), and what it prints as injected is what
//! a run against it reports.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use agent_sim::{Kind, Ramp, RunBuilder};
use agent_sim_testkit::bounded::{CHILD_LIMIT, OutputWithin, wait_within};

use super::*;

fn agent_sim() -> Command {
    Command::new(env!("CARGO_BIN_EXE_agent-sim"))
}

#[test]
fn bad_fault_specs_are_refused_with_exit_64_and_one_line() {
    for (spec, says) in [
        ("sensu.upgrade=503", "expected TARGET=ACTION@WHEN"),
        ("sensu.upgrade=503@at:1s", "add for:DUR"),
        ("sensu.session=aborted@1%", "does not take aborted"),
        ("consul.http=503@1%", "consul.http is not served"),
        ("restart@at:1s", "needs state:keep"),
        ("sensu.frame=garbage@200%", "(0, 100]"),
        (
            "consul.xds=reset@1%",
            "consul.xds is not served (add --consul-grpc)",
        ),
        ("consul.xds=bad-resource@at:1s", "add for:DUR"),
    ] {
        let out = agent_sim()
            .args(["serve", "--sensu", "127.0.0.1:0", "--faults", spec])
            .output_within(CHILD_LIMIT);
        assert_eq!(out.status.code(), Some(64), "{spec}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{spec}: {err}");
        assert!(
            err.contains("--faults") && err.contains(says),
            "{spec}: {err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_serve_says_it_injected_is_what_the_run_reports() {
    bounded(Duration::from_secs(20), async {
        let mut child = agent_sim()
            .args([
                "serve",
                "--sensu",
                "127.0.0.1:0",
                "--faults",
                "sensu.upgrade=503@30%",
                "--faults-seed",
                "5",
                "--stats-every",
                "0",
            ])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, rx) = mpsc::channel::<String>();
        let stderr = child.stderr.take().unwrap();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut lines = Vec::new();
        let addr = loop {
            let line = rx
                .recv_timeout(Duration::from_secs(10))
                .expect("serve starts");
            lines.push(line.clone());
            if let Some(rest) = line.strip_prefix("agent-sim serve: sensu agent endpoint on ") {
                break rest.to_owned();
            }
        };
        let o = RunBuilder::new(Kind::Sensu)
            .agents(30)
            .ramp(Ramp::All)
            .target(addr)
            .duration(Duration::from_secs(2))
            .args(|a| {
                a.reconnect_min = Some("50ms".parse().unwrap());
                a.reconnect_max = Some("300ms".parse().unwrap());
            })
            .run()
            .await
            .unwrap();
        let term = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(term.success());
        let status = wait_within(&mut child, CHILD_LIMIT);
        assert_eq!(status.code(), Some(0));
        reader.join().unwrap();
        lines.extend(rx.try_iter());
        assert!(
            lines.iter().any(|l| l == "agent-sim serve: faults seed 5"),
            "{lines:#?}"
        );
        let stats = lines
            .iter()
            .rev()
            .find_map(|l| l.strip_prefix("agent-sim serve: faults "))
            .unwrap_or_else(|| panic!("{lines:#?}"));
        let stats: serde_json::Value = serde_json::from_str(stats).unwrap();
        let injected = stats["faults"][0]["injected"].as_u64().unwrap();
        assert!(injected > 0, "{stats}");
        assert_eq!(stats["faults"][0]["spec"], "sensu.upgrade=503@30%");
        assert_complete(&o);
        assert_eq!(error(&o.summary, "upgrade_5xx").count, injected);
    })
    .await;
}
