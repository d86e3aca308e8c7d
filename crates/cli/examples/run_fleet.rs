//! Runs 100 Sensu agents against the embedded backend for three seconds
//! through the library API and prints parts of the summary.
//!
//! `cargo run -p agent-sim --example run_fleet`

use std::time::Duration;

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let outcome = agent_sim::RunBuilder::new(agent_sim::Kind::Sensu)
        .agents(100)
        .ramp(agent_sim::Ramp::per_second(1000.0))
        .duration(Duration::from_secs(3))
        .args(|a| a.keepalive_interval = Some("1s".parse().unwrap()))
        .assert("agents.connected == requested".parse().unwrap())
        .run()
        .await?;
    let s = &outcome.summary;
    println!(
        "connected {}/{}, keepalives sent {}, connect p99 {} µs, exit code {}",
        s.agents.connected,
        s.agents.requested,
        s.counters.get("keepalives_sent").copied().unwrap_or(0),
        s.latency_us.get("connect").map(|l| l.p99).unwrap_or(0),
        outcome.exit_code
    );
    Ok(())
}
