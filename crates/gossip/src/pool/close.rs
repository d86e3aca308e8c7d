//! The pool's leave at the end of a run, in order:
//!
//! 1. no join starts (`closing` is cancelled);
//! 2. the joins in flight end, at most `join_drain` (a join the server took
//!    is a member that must leave);
//! 3. every member still in leaves quietly: by the batch below, not by
//!    gossip (thousands of intents at once would overflow a server's queue,
//!    serf's too, and a leave whose intent was dropped is a failure);
//! 4. the leaves already gossiped (earlier members') go out, each sent
//!    once, at most `leave_wait` (woken by the ticker's gossip rounds);
//! 5. a batch of leaves under way ends, at most `batch_wait`;
//! 6. one batch tells each server the rest: a push-pull with every leaving
//!    member alive with its intent, `intent_lead`, then one with them left
//!    (each answered or given up at `tcp_timeout`);
//! 7. the gossiped leavers still waiting for their dead message are marked
//!    left: the batch told the servers, and a stopped pool sends nothing.
//!
//! Every wait is a field of [`super::Timings`], so the whole is at most
//! [`super::Timings::close_bound`]. The ticker's batches (members leaving
//! faster than gossip carries) go by [`leave_batch`] too.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::time::{Instant, timeout};

use super::view::{Phase, Shown};
use super::{Inner, JOINS_AT_ONCE, net};

/// The closing of a pool (the steps: the module doc).
pub(super) async fn close(inner: &Inner) {
    let t = inner.cfg.timings;
    inner.closing.cancel();
    let _joins = timeout(t.join_drain, inner.joins.acquire_many(JOINS_AT_ONCE as u32)).await;
    leave_all_quietly(inner);
    let _ = timeout(t.leave_wait, gossiped_leaves_sent(inner)).await;
    let _batch = timeout(t.batch_wait, inner.batch.lock()).await;
    leave_batch(inner, t.intent_lead).await;
    mark_gossiped_left(inner);
}

/// Step 3: every member still in starts its leave, for the closing batch.
fn leave_all_quietly(inner: &Inner) {
    let now = Instant::now();
    let mut v = inner.lock();
    for slot in 0..v.locals.len() {
        if v.locals[slot].phase == Phase::Alive {
            inner.metrics.incr(inner.ids.leaves);
            v.leave_quietly(slot, now);
        }
    }
}

/// Step 4: returns once every broadcast queued was sent at least once
/// (the rest is the batch's work), looking after each gossip round.
async fn gossiped_leaves_sent(inner: &Inner) {
    loop {
        // Made before the look: a round that ends in between still wakes it.
        let round = inner.gossiped.notified();
        if inner.lock().queues.values().all(|q| q.unsent() == 0) {
            return;
        }
        round.await;
    }
}

/// Step 7: the leavers whose dead message is still to come are left.
fn mark_gossiped_left(inner: &Inner) {
    let mut v = inner.lock();
    let now = Instant::now();
    while let Some(slot) = v.leaving.pop_front() {
        if matches!(v.locals[slot].phase, Phase::Leaving(_)) {
            v.locals[slot].phase = Phase::Left(Some(now));
        }
    }
}

/// The members that left quietly ([`super::view::View::leave_quietly`]:
/// more at once than gossip carries in time, or the pool's closing) leave
/// by two push-pulls to each server: every member in its leave shown alive
/// with its intent, then, `intent_lead` later (serf having taken the
/// intents), left. The caller holds [`Inner::batch`].
pub(super) async fn leave_batch(inner: &Inner, intent_lead: Duration) {
    let batch: Vec<usize> = std::mem::take(&mut inner.lock().quiet);
    let servers: Vec<SocketAddr> = {
        let v = inner.lock();
        v.live_servers()
            .iter()
            .map(|&s| v.remotes[s].addr)
            .collect()
    };
    push_pull_all(inner, &servers, Shown::Intents).await;
    tokio::time::sleep(intent_lead).await;
    push_pull_all(inner, &servers, Shown::Leaves).await;
    let mut v = inner.lock();
    let now = Instant::now();
    for slot in batch {
        if matches!(v.locals[slot].phase, Phase::Leaving(_)) {
            v.locals[slot].phase = Phase::Left(Some(now));
        }
    }
}

/// One push-pull to each server, the leaving members shown as `shown`
/// (a server that does not answer is given up at `tcp_timeout`).
async fn push_pull_all(inner: &Inner, servers: &[SocketAddr], shown: Shown) {
    let msg = inner.lock().push_pull(false, shown);
    for s in servers {
        if net::exchange(inner, *s, &msg).await.is_ok() {
            inner.metrics.incr(inner.ids.push_pulls);
        }
    }
}
