//! The wait at the top of every session loop, whatever the protocol: one
//! poll over cancellation, the kind's connection and streams, at most one
//! side call and one timer, in that order, giving one [`Woke`]. A kind's
//! loop is then this wait and one handler per variant.
//!
//! The order is the same for every kind: cancellation first (a session the
//! run or the scenario ends stops at once, whatever else is ready), then
//! what the connection and its streams bring (polled in the kind's own
//! order, by its closure), then the side call, then the timer.
//!
//! What it is not: it owns none of the futures it polls (they live in the
//! session's own future, so the wait adds no allocation) and knows nothing
//! of what a kind's streams carry.

use std::convert::Infallible;
use std::future::{Future, Pending};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::time::{Instant, Sleep};
use tokio_util::sync::WaitForCancellationFuture;

/// What woke a session's loop.
#[derive(Debug)]
pub enum Woke<E, C = Infallible> {
    /// The session was cancelled (the run's end, or the scenario ended it).
    Cancelled,
    /// The kind's connection or one of its streams had something.
    Io(E),
    /// The side call finished (it was taken out of its slot).
    Call(C),
    /// The timer's deadline passed.
    Timer,
}

/// The side call of a session that makes none.
pub type NoCall = Pending<Infallible>;

/// Sets `timer` to `at` unless it is set for it already (a reset registers
/// the timer again).
pub fn arm(timer: Pin<&mut Sleep>, at: Instant) {
    if timer.deadline() != at {
        timer.reset(at);
    }
}

/// The session's next wake: `cancel`, then `io` (the kind's connection and
/// streams), then the side call in `call` (emptied when it finishes), then
/// `timer`, if any.
pub fn next<'a, E, F>(
    mut cancel: Pin<&'a mut WaitForCancellationFuture<'_>>,
    mut io: impl FnMut(&mut Context<'_>) -> Poll<E> + 'a,
    call: &'a mut Option<F>,
    mut timer: Option<Pin<&'a mut Sleep>>,
) -> impl Future<Output = Woke<E, F::Output>> + 'a
where
    F: Future + Unpin + 'a,
{
    std::future::poll_fn(move |tcx| {
        if cancel.as_mut().poll(tcx).is_ready() {
            return Poll::Ready(Woke::Cancelled);
        }
        if let Poll::Ready(e) = io(tcx) {
            return Poll::Ready(Woke::Io(e));
        }
        if let Some(f) = call.as_mut()
            && let Poll::Ready(done) = Pin::new(f).poll(tcx)
        {
            *call = None;
            return Poll::Ready(Woke::Call(done));
        }
        if let Some(t) = timer.as_mut()
            && t.as_mut().poll(tcx).is_ready()
        {
            return Poll::Ready(Woke::Timer);
        }
        Poll::Pending
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio_util::sync::CancellationToken;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn cancellation_comes_before_everything_else() {
        let token = CancellationToken::new();
        token.cancel();
        let mut cancel = std::pin::pin!(token.cancelled());
        let mut timer = std::pin::pin!(tokio::time::sleep(Duration::ZERO));
        let mut call = Some(std::future::ready(1u8));
        let woke = next(
            cancel.as_mut(),
            |_| Poll::Ready(()),
            &mut call,
            Some(timer.as_mut()),
        )
        .await;
        assert!(matches!(woke, Woke::Cancelled));
        assert!(call.is_some(), "the call stays in its slot");
    }

    #[tokio::test(start_paused = true)]
    async fn io_then_the_call_then_the_timer() {
        let token = CancellationToken::new();
        let mut cancel = std::pin::pin!(token.cancelled());
        let mut timer = std::pin::pin!(tokio::time::sleep(Duration::ZERO));
        let mut call = Some(std::future::ready(7u8));
        let mut io_ready = true;
        let mut order = Vec::new();
        for _ in 0..3 {
            let woke = next(
                cancel.as_mut(),
                |_| {
                    if std::mem::take(&mut io_ready) {
                        Poll::Ready("io")
                    } else {
                        Poll::Pending
                    }
                },
                &mut call,
                Some(timer.as_mut()),
            )
            .await;
            order.push(match woke {
                Woke::Io(s) => s.to_owned(),
                Woke::Call(n) => format!("call {n}"),
                Woke::Timer => "timer".into(),
                Woke::Cancelled => "cancelled".into(),
            });
        }
        assert_eq!(order, ["io", "call 7", "timer"]);
        assert!(call.is_none(), "a finished call leaves its slot");
    }

    #[tokio::test(start_paused = true)]
    async fn arm_moves_the_deadline_only_when_it_changes() {
        let mut timer = std::pin::pin!(tokio::time::sleep(Duration::from_secs(3600)));
        let at = Instant::now() + Duration::from_secs(5);
        arm(timer.as_mut(), at);
        assert_eq!(timer.deadline(), at);
        let token = CancellationToken::new();
        let mut cancel = std::pin::pin!(token.cancelled());
        let woke = next(
            cancel.as_mut(),
            |_| Poll::<()>::Pending,
            &mut None::<NoCall>,
            Some(timer.as_mut()),
        )
        .await;
        assert!(matches!(woke, Woke::Timer));
        assert_eq!(Instant::now(), at);
    }
}
