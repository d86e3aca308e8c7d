//! Tests bounded in time. A child process's output with a time limit:
//! `Command::output` waits as long as the child runs; a child that hangs (a
//! deadlock, a shutdown that never ends) would hold the whole test run until
//! CI's own limit, with nothing said. [`output_within`] kills it at the
//! limit and fails the test with what it had printed so far. And a state
//! waited for, not a time slept: [`until`] looks at a condition every 10 ms
//! of tokio time (virtual time on a paused clock, so no wall clock is
//! waited on there) and fails the test naming what never came; a child
//! process is waited on for a line it writes ([`Lines`]).
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

/// What a child process writes to a pipe, line by line as it comes: wait
/// for the line that says the state a test needs (instead of sleeping),
/// then have all it said.
#[derive(Debug)]
pub struct Lines {
    rx: std::sync::mpsc::Receiver<String>,
    said: Vec<String>,
}

impl Lines {
    /// Reads `pipe` (a child's `stderr.take()`) on a thread of its own.
    pub fn of(pipe: impl Read + Send + 'static) -> Lines {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufRead::lines(std::io::BufReader::new(pipe)) {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines {
            rx,
            said: Vec::new(),
        }
    }

    /// Waits for a line containing `text` and returns it; panics with what
    /// was said when none comes within `limit` or the pipe closes first.
    pub fn wait_for(&mut self, text: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => {
                    self.said.push(line.clone());
                    if line.contains(text) {
                        return line;
                    }
                }
                Err(e) => panic!(
                    "no line with {text:?} within {limit:?} ({e}); it said:\n{}",
                    self.said.join("\n")
                ),
            }
        }
    }

    /// Everything said, up to the pipe's end (after the child has exited).
    pub fn all(mut self) -> String {
        self.said.extend(self.rx.iter());
        self.said.join("\n")
    }
}

/// How often [`until`] looks at its condition (tokio time).
pub const POLL_EVERY: Duration = Duration::from_millis(10);

/// What a condition of [`until`] answers: `true`, or `Some(value)`, once
/// what it waits for is there.
pub trait Reached {
    /// What [`until`] returns.
    type Value;
    /// The value once reached, `None` before.
    fn reached(self) -> Option<Self::Value>;
}

impl Reached for bool {
    type Value = ();
    fn reached(self) -> Option<()> {
        self.then_some(())
    }
}

impl<T> Reached for Option<T> {
    type Value = T;
    fn reached(self) -> Option<T> {
        self
    }
}

/// Waits until `cond` holds (`true`, or `Some(value)`: returned), looking
/// every [`POLL_EVERY`] of tokio time; panics naming `what` when it does
/// not within `limit`. The one way tests wait for a state:
/// `until(LIMIT, "20 sessions", async || count() >= 20).await` (in a spawned
/// task, `async move ||`: a closure lending its captures is not `Send`).
pub async fn until<R: Reached>(
    limit: Duration,
    what: &str,
    mut cond: impl AsyncFnMut() -> R,
) -> R::Value {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = cond().await.reached() {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(POLL_EVERY).await;
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
    fn a_line_is_waited_for_and_everything_said_is_kept() {
        let mut child = Command::new("sh")
            .args(["-c", "echo one >&2; echo two >&2; echo three >&2"])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = Lines::of(child.stderr.take().unwrap());
        assert_eq!(lines.wait_for("tw", Duration::from_secs(10)), "two");
        wait_within(&mut child, Duration::from_secs(10));
        assert_eq!(lines.all(), "one\ntwo\nthree");
        let mut quiet = Command::new("true").stderr(Stdio::piped()).spawn().unwrap();
        let mut none = Lines::of(quiet.stderr.take().unwrap());
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            none.wait_for("anything", Duration::from_secs(10))
        }));
        let msg = *r.unwrap_err().downcast::<String>().unwrap();
        assert!(msg.contains("no line with \"anything\""), "{msg}");
        wait_within(&mut quiet, Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn until_returns_what_came_and_fails_naming_what_did_not() {
        let started = tokio::time::Instant::now();
        let mut n = 0;
        let got = until(Duration::from_secs(1), "the third look", async || {
            n += 1;
            (n == 3).then_some(n)
        })
        .await;
        assert_eq!(got, 3);
        assert_eq!(started.elapsed(), 2 * POLL_EVERY);
        let never = tokio::spawn(until(Duration::from_secs(1), "never", async || false));
        let msg = *never
            .await
            .unwrap_err()
            .into_panic()
            .downcast::<String>()
            .unwrap();
        assert_eq!(msg, "timed out after 1s waiting for never");
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
