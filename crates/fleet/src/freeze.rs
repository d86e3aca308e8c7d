//! `--pause`: frozen agents, as if their process had been stopped
//! (SIGSTOP) and continued later.
//!
//! How: the engine wraps each session future in [`Frozen`], which does not
//! poll the session while its agent is in a pause window. Nothing of the
//! session runs: no reads (the kernel buffers what the server sends until
//! the receive window is full, then the server's writes stall), no writes
//! (no keepalives, pings, pongs, HTTP/2 or WebSocket acks), and its timers
//! fire late, all at once, when it thaws, as a stopped process's do. This
//! is done above the protocols rather than in their sockets (a pausable
//! `AsyncRead`/`AsyncWrite`) because a socket-level pause would let the
//! session's own timers keep running (a Sensu agent would time out its
//! pong while "frozen", which a stopped process never does) and would need
//! a hook in every transport. A session woken while frozen (a timer, data
//! arriving) parks on one timer until the window ends, or until the run
//! ends (shutdown is never held up by a pause).
//!
//! Which agents: window `w` freezes exactly `round(share × agents)` of the
//! fleet, chosen by a bijection of the agent numbers (`n × P + offset mod
//! agents < k`, `P` a prime), so the choice costs no memory per agent.
//!
//! Costs: nothing per agent; a check of the windows on each poll of a
//! session only when the run has pauses.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::scenario::{Phase, Scenario, Share};

/// A prime larger than any fleet: `n ↦ n·P mod agents` is a bijection.
const STRIDE: u128 = 2_654_435_761;

#[derive(Debug, Clone, Copy)]
struct Window {
    from: Duration,
    to: Duration,
    k: u64,
    offset: u64,
}

/// The pause windows of a fleet.
#[derive(Debug)]
pub(crate) struct Freezer {
    windows: Vec<Window>,
    agents: u64,
    start: Instant,
}

impl Freezer {
    /// The pauses of `plan`, or `None` when it has none.
    pub(crate) fn new(plan: &Scenario, agents: u64, start: Instant) -> Option<Freezer> {
        let windows: Vec<Window> = plan
            .phases
            .iter()
            .filter_map(|p| match *p {
                Phase::Pause { at, length, share } => Some(Window {
                    from: at,
                    to: at + length,
                    k: Share(share).of(agents),
                    offset: fastrand::u64(..agents.max(1)),
                }),
                _ => None,
            })
            .collect();
        (!windows.is_empty()).then_some(Freezer {
            windows,
            agents,
            start,
        })
    }

    /// How many windows.
    pub(crate) fn windows(&self) -> usize {
        self.windows.len()
    }

    /// Agents window `w` freezes.
    pub(crate) fn frozen_agents(&self, w: usize) -> u64 {
        self.windows[w].k
    }

    fn selected(&self, w: &Window, n: u64) -> bool {
        let agents = u128::from(self.agents.max(1));
        ((u128::from(n) * STRIDE + u128::from(w.offset)) % agents) < u128::from(w.k)
    }

    /// Until when agent `n` is frozen, if it is at `now`.
    pub(crate) fn frozen_until(&self, n: u64, now: Instant) -> Option<Instant> {
        let t = now.saturating_duration_since(self.start);
        self.windows
            .iter()
            .filter(|w| t >= w.from && t < w.to && self.selected(w, n))
            .map(|w| self.start + w.to)
            .max()
    }

    /// The window that froze agent `n` at `t` or up to `settle` before.
    pub(crate) fn window_of(&self, n: u64, t: Duration, settle: Duration) -> Option<usize> {
        self.windows
            .iter()
            .position(|w| t >= w.from && t <= w.to + settle && self.selected(w, n))
    }
}

/// What a frozen session waits for: the end of its window, or of the run.
type Thaw = (Pin<Box<Sleep>>, Pin<Box<WaitForCancellationFutureOwned>>);

/// A session future that stands still while its agent is frozen.
pub(crate) struct Frozen<'a, F> {
    inner: F,
    freezer: Option<&'a Freezer>,
    n: u64,
    run: &'a CancellationToken,
    /// While frozen: the end of the window, and the end of the run.
    thaw: Option<Thaw>,
}

impl<'a, F> Frozen<'a, F> {
    /// Wraps `inner`, the session of agent `n` (`freezer`: `None` when the
    /// run has no pauses).
    pub(crate) fn new(
        inner: F,
        freezer: Option<&'a Freezer>,
        n: u64,
        run: &'a CancellationToken,
    ) -> Self {
        Frozen {
            inner,
            freezer,
            n,
            run,
            thaw: None,
        }
    }
}

impl<F: Future + Unpin> Future for Frozen<'_, F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        if let Some(fr) = this.freezer
            && !this.run.is_cancelled()
            && let Some(until) = fr.frozen_until(this.n, Instant::now())
        {
            let run = this.run;
            let (sleep, stop) = this.thaw.get_or_insert_with(|| {
                (
                    Box::pin(tokio::time::sleep_until(until)),
                    Box::pin(run.clone().cancelled_owned()),
                )
            });
            if sleep.deadline() != until {
                sleep.as_mut().reset(until);
            }
            let thawed = sleep.as_mut().poll(cx).is_ready();
            let stopped = stop.as_mut().poll(cx).is_ready();
            if !thawed && !stopped {
                return Poll::Pending;
            }
        }
        this.thaw = None;
        Pin::new(&mut this.inner).poll(cx)
    }
}
