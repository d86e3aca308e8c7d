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
//!    member alive with its intent; more, every half second, until each
//!    server's answer shows the intents taken (at most `intent_lead`);
//!    then one with them left (each answered or given up at `tcp_timeout`);
//! 7. the gossiped leavers still waiting for their dead message are marked
//!    left: the batch told the servers, and a stopped pool sends nothing.
//!
//! Every wait is a field of [`super::Timings`], so the whole is at most
//! [`super::Timings::close_bound`]. The ticker's batches (members leaving
//! faster than gossip carries) go by [`leave_batch`] too.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, timeout};

use super::view::{Phase, Shown};
use super::{Inner, JOINS_AT_ONCE, net};
use crate::serf::SerfState;
use crate::wire::msgs::PushPull;

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
/// by push-pulls to each server: every member in its leave shown alive
/// with its intent; then, once each server that answered shows the
/// intents taken (at most `intent_lead`), left. serf merges a push-pull
/// after answering it, and marks a member left only if its intent came
/// first, so the leaves wait for the proof. The caller holds
/// [`Inner::batch`].
pub(super) async fn leave_batch(inner: &Inner, intent_lead: Duration) {
    let batch: Vec<usize> = std::mem::take(&mut inner.lock().quiet);
    let servers: Vec<(usize, SocketAddr)> = {
        let v = inner.lock();
        v.live_servers()
            .iter()
            .map(|&s| (s, v.remotes[s].addr))
            .collect()
    };
    let answered = push_pull_all(inner, &servers, Shown::Intents).await;
    let _ = timeout(intent_lead, intents_shown(inner, answered)).await;
    push_pull_all(inner, &servers, Shown::Leaves).await;
    let mut v = inner.lock();
    let now = Instant::now();
    for slot in batch {
        if matches!(v.locals[slot].phase, Phase::Leaving(_)) {
            v.locals[slot].phase = Phase::Left(Some(now));
        }
    }
    v.forget_taken();
}

/// How often a leave batch asks the servers whether they took its intents.
const INTENT_CHECK: Duration = Duration::from_millis(500);

/// Returns once each of `servers` answers a push-pull with every leaving
/// member's status time at its leave's (serf took the intent; a gossiped
/// leave then sends its dead message at the next round); a server that
/// stops answering is no longer waited for.
async fn intents_shown(inner: &Inner, mut servers: Vec<(usize, SocketAddr)>) {
    let want: Vec<(usize, Arc<str>, u64)> = {
        let v = inner.lock();
        (0..v.locals.len())
            .filter(|&slot| matches!(v.locals[slot].phase, Phase::Leaving(_)))
            .map(|slot| {
                (
                    slot,
                    v.locals[slot].name.clone(),
                    v.locals[slot].status_ltime,
                )
            })
            .collect()
    };
    while !servers.is_empty() && !want.is_empty() {
        tokio::time::sleep(INTENT_CHECK).await;
        let msg = inner.lock().push_pull(false, Shown::Intents);
        let mut still = Vec::new();
        for (s, addr) in servers {
            let Ok(answer) = net::exchange(inner, addr, &msg).await else {
                continue;
            };
            inner.metrics.incr(inner.ids.push_pulls);
            let taken = taken_of(&answer, &want);
            let all = taken.len() == want.len();
            inner
                .lock()
                .intents_taken
                .extend(taken.into_iter().map(|slot| (slot, s)));
            if !all {
                still.push((s, addr));
            }
        }
        servers = still;
    }
}

/// The members of `want` (slot, name, leave's Lamport time) a server's
/// push-pull `answer` shows at that status time or later.
fn taken_of(answer: &[u8], want: &[(usize, Arc<str>, u64)]) -> Vec<usize> {
    let Some(state) = answer
        .get(1..)
        .and_then(|b| PushPull::decode(b).ok())
        .and_then(|pp| SerfState::decode(pp.user_state).ok().map(|s| s.status))
    else {
        return Vec::new();
    };
    let at: HashMap<&str, u64> = state.into_iter().collect();
    want.iter()
        .filter(|(_, name, ltime)| at.get(&**name).is_some_and(|t| t >= ltime))
        .map(|(slot, _, _)| *slot)
        .collect()
}

/// One push-pull to each server, the leaving members shown as `shown`
/// (a server that does not answer is given up at `tcp_timeout`); the
/// servers that answered.
async fn push_pull_all(
    inner: &Inner,
    servers: &[(usize, SocketAddr)],
    shown: Shown,
) -> Vec<(usize, SocketAddr)> {
    let msg = inner.lock().push_pull(false, shown);
    let mut answered = Vec::with_capacity(servers.len());
    for &(s, addr) in servers {
        if net::exchange(inner, addr, &msg).await.is_ok() {
            inner.metrics.incr(inner.ids.push_pulls);
            answered.push((s, addr));
        }
    }
    answered
}
