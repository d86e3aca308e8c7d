//! The one accept loop of agent-sim's listeners (every port of the embedded
//! backend, and `/metrics`): [`accept_until`] hands each connection to the
//! caller until a shutdown future completes.
//!
//! A failed `accept` (out of file descriptors while 40,000 agents hold
//! theirs, a connection reset before it was taken) does not end the
//! listener: it is counted in the caller's counter and the loop pauses
//! before the next try, doubling from [`BACKOFF_FIRST`] to [`BACKOFF_MAX`]
//! (so a listener out of descriptors does not spin a core), and starting
//! over after a good accept. Shutdown ends the loop at once, also during
//! a pause.
//!
//! What it is not: no connection handling and no task tracking (the caller
//! spawns and waits for its own tasks), no protocol.

use std::future::{Future, poll_fn};
use std::io;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

/// Pause after the first failed accept of a run of failures.
pub const BACKOFF_FIRST: Duration = Duration::from_millis(5);
/// Longest pause between two failed accepts (the pause doubles up to it).
pub const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Where connections come from: a [`TcpListener`] (or a test's fake one).
pub trait Listener {
    /// One accepted connection.
    type Conn;

    /// Polls for the next connection and its peer address.
    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<(Self::Conn, SocketAddr)>>;
}

impl Listener for TcpListener {
    type Conn = TcpStream;

    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<(TcpStream, SocketAddr)>> {
        TcpListener::poll_accept(self, cx)
    }
}

/// Accepts on `listener` until `shutdown` completes, handing every
/// connection to `on_conn` (which should spawn its task and return);
/// counts each failed accept in `errors` and pauses after it (see the
/// module doc). The listener is closed when this returns.
pub async fn accept_until<L, F>(
    mut listener: L,
    shutdown: impl Future<Output = ()>,
    errors: &AtomicU64,
    mut on_conn: F,
) where
    L: Listener,
    F: FnMut(L::Conn, SocketAddr),
{
    let mut shutdown = pin!(shutdown);
    let mut pause = BACKOFF_FIRST;
    loop {
        let accepted = tokio::select! {
            biased;
            () = &mut shutdown => return,
            r = poll_fn(|cx| listener.poll_accept(cx)) => r,
        };
        match accepted {
            Ok((conn, peer)) => {
                pause = BACKOFF_FIRST;
                on_conn(conn, peer);
            }
            Err(_) => {
                errors.fetch_add(1, Ordering::Relaxed);
                tokio::select! {
                    biased;
                    () = &mut shutdown => return,
                    () = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(BACKOFF_MAX);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    use tokio::time::Instant;

    use super::*;

    /// A listener that plays a script (`true`: a connection, `false`: an
    /// error), then waits forever; it notes when each step was taken.
    struct Scripted {
        script: VecDeque<bool>,
        taken: Arc<Mutex<Vec<Instant>>>,
    }

    impl Scripted {
        fn new(script: impl IntoIterator<Item = bool>) -> (Self, Arc<Mutex<Vec<Instant>>>) {
            let taken = Arc::new(Mutex::new(Vec::new()));
            let l = Scripted {
                script: script.into_iter().collect(),
                taken: taken.clone(),
            };
            (l, taken)
        }
    }

    impl Listener for Scripted {
        type Conn = ();

        fn poll_accept(&mut self, _: &mut Context<'_>) -> Poll<io::Result<((), SocketAddr)>> {
            let Some(ok) = self.script.pop_front() else {
                return Poll::Pending;
            };
            self.taken.lock().unwrap().push(Instant::now());
            Poll::Ready(if ok {
                Ok(((), SocketAddr::from(([127, 0, 0, 1], 1))))
            } else {
                Err(io::Error::from_raw_os_error(24)) // EMFILE
            })
        }
    }

    /// Milliseconds between consecutive steps.
    fn gaps(taken: &[Instant]) -> Vec<u64> {
        taken
            .windows(2)
            .map(|w| (w[1] - w[0]).as_millis() as u64)
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn failed_accepts_are_counted_and_spaced_doubling_up_to_a_second() {
        let (l, taken) = Scripted::new(std::iter::repeat_n(false, 100));
        let errors = AtomicU64::new(0);
        let t0 = Instant::now();
        let stop = tokio::time::sleep(Duration::from_millis(3000));
        accept_until(l, stop, &errors, |(), _| panic!("no connection")).await;
        // The loop was in a 1 s pause (2,275 ms .. 3,275 ms) and left it at
        // the shutdown.
        assert_eq!(t0.elapsed(), Duration::from_millis(3000));
        let taken = taken.lock().unwrap();
        assert_eq!(gaps(&taken), [5, 10, 20, 40, 80, 160, 320, 640, 1000]);
        assert_eq!(errors.load(Ordering::Relaxed), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn a_good_accept_starts_the_pause_over() {
        let script = [false, false, false, true, false, false, false];
        let (l, taken) = Scripted::new(script);
        let errors = AtomicU64::new(0);
        let mut conns = 0;
        let stop = tokio::time::sleep(Duration::from_secs(10));
        accept_until(l, stop, &errors, |(), _| conns += 1).await;
        assert_eq!(conns, 1);
        assert_eq!(errors.load(Ordering::Relaxed), 6);
        // 5, 10, 20 ms after the first errors; the connection at 35 ms is
        // followed at once by an error, then 5 and 10 ms again.
        assert_eq!(gaps(&taken.lock().unwrap()), [5, 10, 20, 0, 5, 10]);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_ends_a_waiting_loop() {
        let (l, _) = Scripted::new([]);
        let errors = AtomicU64::new(0);
        let t0 = Instant::now();
        accept_until(
            l,
            tokio::time::sleep(Duration::from_secs(7)),
            &errors,
            |(), _| {},
        )
        .await;
        assert_eq!(t0.elapsed(), Duration::from_secs(7));
        assert_eq!(errors.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_tcp_listener_hands_over_connections_and_closes_on_shutdown() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let stop = Arc::new(tokio::sync::Notify::new());
        let stopped = stop.clone();
        let errors = Arc::new(AtomicU64::new(0));
        let errs = errors.clone();
        let served = tokio::spawn(async move {
            accept_until(l, stopped.notified(), &errs, |s: TcpStream, peer| {
                let _ = tx.send((s.local_addr().unwrap(), peer));
            })
            .await;
        });
        let limit = Duration::from_secs(10);
        let client = tokio::time::timeout(limit, TcpStream::connect(addr))
            .await
            .unwrap()
            .unwrap();
        let (local, peer) = tokio::time::timeout(limit, rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!((local, peer), (addr, client.local_addr().unwrap()));
        stop.notify_one();
        tokio::time::timeout(limit, served).await.unwrap().unwrap();
        assert!(TcpStream::connect(addr).await.is_err(), "listener closed");
        assert_eq!(errors.load(Ordering::Relaxed), 0);
    }
}
