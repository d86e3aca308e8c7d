//! A fleet on Docker Swarm for real, small and opt-in (it changes the
//! host's swarm for about a minute, and leaves it as found):
//!
//! ```sh
//! cargo test -p agent-sim --test integration swarm -- --ignored
//! ```
//!
//! `benches/scripts/swarm.sh 2 200 5` with this build's binary: the image
//! built FROM scratch with no registry, two shards as one Swarm service
//! (configs/swarm/agent-sim.yaml) against `serve --reuse-port` processes,
//! each shard's index from its task slot, the merge step as a Swarm task.
//! The merged summary holds the whole fleet, every shard says where its
//! index came from, and the script's own check (every merged count the sum
//! of the shards') passes. Skipped, saying so, where no dockerd answers.

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use agent_sim_testkit::bounded::OutputWithin;

/// Whether a dockerd answers `docker info`, and if not, why.
fn dockerd() -> Result<(), String> {
    if Command::new("docker").arg("--version").output().is_err() {
        return Err("no `docker` command".into());
    }
    let out = Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .output_within(Duration::from_secs(30));
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

#[test]
#[ignore = "needs dockerd and uses its swarm: cargo test -p agent-sim --test integration swarm -- --ignored"]
fn a_small_fleet_on_docker_swarm_merges_to_the_whole() {
    if let Err(why) = dockerd() {
        eprintln!(
            "skipped: no dockerd answers ({why}); install one (Debian: apt-get install docker.io)"
        );
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::env::temp_dir().join(format!("agent-sim-swarm-{}", std::process::id()));
    // A port nobody holds now, for the serve processes on the host.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let run = Command::new("bash")
        .arg(root.join("benches/scripts/swarm.sh"))
        .args(["2", "200", "5"])
        .env("AGENT_SIM_BIN", env!("CARGO_BIN_EXE_agent-sim"))
        .env("AGENT_SIM_IMAGE", "agent-sim:swarm-test")
        .env("OUT", &out)
        .env("PORT", port.to_string())
        .env("STACK", format!("agent-sim-test-{}", std::process::id()))
        .output_within(Duration::from_secs(600));
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "swarm.sh: {:?}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        run.status
    );
    assert!(stdout.contains("connected 200/200 (complete)"), "{stdout}");
    assert!(
        stdout.contains("every counter and histogram count is the sum"),
        "{stdout}"
    );
    let results = out.join("results");
    let merged = agent_sim::Summary::read(&results.join("merged.json")).unwrap();
    assert_eq!(
        (merged.agents.requested, merged.agents.connected),
        (200, 200)
    );
    for slot in 1..=2 {
        let s = agent_sim::Summary::read(&results.join(format!("summary-{slot}.json"))).unwrap();
        assert_eq!(s.shard, Some(format!("{}/2", slot - 1)));
        assert_eq!(
            s.shard_from,
            Some(format!(
                "AGENT_SIM_SHARD_SLOT={slot} (Docker Swarm task slot)"
            ))
        );
        assert_eq!(s.agents.connected, 100);
    }
    let _ = Command::new("docker")
        .args(["image", "rm", "--force", "agent-sim:swarm-test"])
        .output_within(Duration::from_secs(60));
    // The shards wrote as the image's user (65532): the files are left for
    // root or docker to remove when this test does not run as root.
    let _ = std::fs::remove_dir_all(&out);
}
