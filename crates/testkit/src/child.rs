//! The server half of a memory measurement in a child process, so that the
//! parent's RSS is the simulated agents' alone: the test binary runs itself
//! again as one of its (ignored) tests with an environment variable set,
//! and that test serves on 127.0.0.1:0 and prints its addresses.
//!
//! In the parent: `let server = ChildServer::spawn(ENV, "serve_helper");`
//! then `server.addrs`; in the helper test: [`only_as_child`] first (run by
//! itself, a helper fails instead of passing having measured nothing), then
//! serve and [`serve_for_parent`] with the addresses. [`rss_around`] reads
//! the parent's memory before and after its fleet is in.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The line prefix the helper prints its addresses after.
const PREFIX: &str = "ADDRS ";

/// Prints `addrs` for the parent (call it in the helper test once it
/// serves).
pub fn announce(addrs: &[SocketAddr]) {
    let list: Vec<String> = addrs.iter().map(SocketAddr::to_string).collect();
    println!("{PREFIX}{}", list.join(" "));
}

/// Fails the helper test `helper` unless its parent `parent` started it
/// (with `env` set): run by itself, it would pass having measured nothing.
pub fn only_as_child(env: &str, helper: &str, parent: &str) {
    assert!(
        std::env::var_os(env).is_some(),
        "{helper} is the server half of {parent}, which runs it in a child process with {env} \
         set; run {parent} instead (`-- --ignored --exact {parent}`)"
    );
}

/// Announces `addrs` to the parent, then serves until the parent kills this
/// process (at most 10 minutes, so that an orphan ends).
pub async fn serve_for_parent(addrs: &[SocketAddr]) {
    announce(addrs);
    tokio::time::sleep(Duration::from_secs(600)).await;
}

/// Resident memory (KiB, read by `rss`) before `start` launches a fleet,
/// and after `held` says every agent is in (within 2 minutes) and 2 more
/// seconds have passed, as every memory figure of these tests was read;
/// with what `start` returned.
pub async fn rss_around<R>(
    rss: impl Fn() -> u64,
    start: impl FnOnce() -> R,
    held: impl AsyncFnMut() -> bool,
) -> (R, u64, u64) {
    let base = rss();
    let started = start();
    crate::bounded::until(Duration::from_secs(120), "every agent connected", held).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    (started, base, rss())
}

/// A helper test running in a child process; killed on drop.
#[derive(Debug)]
pub struct ChildServer {
    child: Child,
    /// The addresses it announced, in its order.
    pub addrs: Vec<String>,
}

impl ChildServer {
    /// Runs the ignored test `helper` of this test binary with `env` set,
    /// and waits for the addresses it announces.
    pub fn spawn(env: &str, helper: &str) -> ChildServer {
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args(["--ignored", "--exact", helper, "--nocapture"])
            .env(env, "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("child process");
        let mut lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        let addrs = loop {
            let line = lines.next().expect("helper output").expect("helper line");
            if let Some(rest) = line.strip_prefix(PREFIX) {
                break rest.split(' ').map(str::to_owned).collect();
            }
        };
        ChildServer { child, addrs }
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How many agents a memory measurement runs: `AGENT_SIM_MEM_AGENTS`, or
/// `default`.
pub fn mem_agents(default: u64) -> u64 {
    std::env::var("AGENT_SIM_MEM_AGENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
