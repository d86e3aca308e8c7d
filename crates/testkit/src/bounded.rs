//! A child process's output with a time limit. `Command::output` waits as
//! long as the child runs; a child that hangs (a deadlock, a shutdown that
//! never ends) would hold the whole test run until CI's own limit, with
//! nothing said. [`output_within`] kills it at the limit and fails the test
//! with what it had printed so far.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a child run of a test may take: every one ends by itself
/// within seconds (its `--duration`, or an exit before any session).
pub const CHILD_LIMIT: Duration = Duration::from_secs(120);

/// [`output_within`] as a method, for a command built in one chain.
pub trait OutputWithin {
    /// The output of this command, killed and failed after `limit`.
    fn output_within(&mut self, limit: Duration) -> Output;
}

impl OutputWithin for Command {
    fn output_within(&mut self, limit: Duration) -> Output {
        output_within(self, limit)
    }
}

/// Runs `cmd` (stdin closed, stdout and stderr captured) and returns its
/// output; panics, after killing it, when it runs longer than `limit`.
pub fn output_within(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let Some(status) = exit_within(&mut child, limit) else {
        // A grandchild may still hold the pipes: wait for them only briefly.
        let until = Instant::now() + Duration::from_secs(2);
        while !(stdout.is_finished() && stderr.is_finished()) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        let partial = |r: JoinHandle<Vec<u8>>| {
            if r.is_finished() {
                collect(r)
            } else {
                b"(still held open by another process)".to_vec()
            }
        };
        let (out, err) = (partial(stdout), partial(stderr));
        panic!(
            "{cmd:?} ran longer than {limit:?} and was killed\n--- stdout\n{}\n--- stderr\n{}",
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&err)
        );
    };
    Output {
        status,
        stdout: collect(stdout),
        stderr: collect(stderr),
    }
}

/// Waits for `child` to exit; kills it and panics when it takes longer than
/// `limit` (a server told to stop that does not).
pub fn wait_within(child: &mut Child, limit: Duration) -> ExitStatus {
    exit_within(child, limit).unwrap_or_else(|| {
        panic!(
            "child {} did not exit within {limit:?} and was killed",
            child.id()
        )
    })
}

/// The child's exit status, or `None` after killing (and reaping) it when it
/// runs longer than `limit`.
fn exit_within(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("waiting for the child") {
            return Some(status);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn drain(pipe: Option<impl Read + Send + 'static>) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut buf);
        }
        buf
    })
}

fn collect(reader: JoinHandle<Vec<u8>>) -> Vec<u8> {
    reader.join().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_captured_and_a_hanging_child_is_killed_at_the_limit() {
        let o = output_within(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            Duration::from_secs(10),
        );
        assert_eq!(o.status.code(), Some(3));
        assert_eq!(
            (o.stdout.as_slice(), o.stderr.as_slice()),
            (&b"out\n"[..], &b"err\n"[..])
        );

        let started = Instant::now();
        let hung = std::panic::catch_unwind(|| {
            output_within(
                Command::new("sh").args(["-c", "echo started; exec sleep 30"]),
                Duration::from_millis(300),
            )
        });
        let msg = *hung.unwrap_err().downcast::<String>().unwrap();
        assert!(
            msg.contains("was killed") && msg.contains("started"),
            "{msg}"
        );
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn a_child_that_does_not_exit_is_killed_at_the_limit() {
        let mut quick = Command::new("true").spawn().unwrap();
        assert!(wait_within(&mut quick, Duration::from_secs(10)).success());
        let mut slow = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = slow.id();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait_within(&mut slow, Duration::from_millis(200))
        }));
        assert!(r.is_err());
        // Killed and reaped: waiting again answers at once.
        assert!(slow.try_wait().unwrap().is_some(), "{pid} still running");
    }
}
