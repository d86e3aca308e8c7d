//! The model's timers, on one task (what they send goes out through
//! `net`): each tick sends the servers their
//! share of what the pool's members would send them (probes, gossip,
//! push-pulls), runs the probe round's timeouts and suspicions (`probe`),
//! sends the queries' answers due (`outbox`), completes leaves, and
//! notices when the process itself was too busy to tick on time.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::probe::{self, Target};
use super::view::Phase;
use super::{Inner, close, net, outbox, push_pull_scale};
use crate::wire::{UDP_BUFFER, compound};

/// The ticker's period.
const TICK: Duration = Duration::from_millis(100);
/// A tick this late means the process could not answer probes in time.
const LATE: Duration = Duration::from_millis(250);

/// Per-server fractions of a send owed.
#[derive(Default)]
struct Owed {
    probes: HashMap<usize, f64>,
    push_pulls: HashMap<usize, f64>,
    reconnects: HashMap<usize, f64>,
}

/// serf's `ReconnectInterval`.
const RECONNECT_INTERVAL: Duration = Duration::from_secs(30);

/// The ticker.
pub(super) async fn run(inner: Arc<Inner>) {
    let mut every = tokio::time::interval(TICK);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut owed = Owed::default();
    let mut last = Instant::now();
    let mut since_gossip = Duration::ZERO;
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = inner.stop.cancelled() => return,
        }
        let now = Instant::now();
        let dt = now - last;
        last = now;
        if dt > TICK + LATE {
            late(&inner, dt);
        }
        inner.lock().refresh_size();
        // The probe round (send, ack, timeout, suspicion): `probe`.
        let (servers, share, _) = shares(&inner);
        let probes = probe::due(&inner, &servers, share, &mut owed.probes, dt, now);
        for o in probes.into_iter().chain(probe::expire(&inner, now)) {
            net::send(&inner, o.ep, o.to, &o.msg);
        }
        inner.count_tally();
        outbox::send_due(&inner, now);
        since_gossip += dt;
        if since_gossip >= inner.cfg.timings.gossip_interval {
            since_gossip = Duration::ZERO;
            gossip(&inner);
            finish_leaves(&inner, now);
            // A closing pool waits for its leaves' first sends on these rounds.
            inner.gossiped.notify_waiters();
            start_batch(&inner);
        }
        push_pulls(&inner, &mut owed, dt);
        reconnect(&inner, &mut owed, dt);
    }
}

fn late(inner: &Inner, dt: Duration) {
    inner.metrics.incr(inner.ids.late_ticks);
    if !inner.warned_late.swap(true, Ordering::Relaxed) {
        inner.metrics.warn(
            crate::ACKED_LATE.kind,
            Some(&format!(
                "the gossip ticker ran {} ms late: members may have answered probes after the servers' 500 ms",
                (dt - TICK).as_millis()
            )),
        );
    }
}

/// The live servers and the share of the pool's probes (or push-pulls)
/// each gets per second: every running member (alive, or gossiping its
/// leave) sends one per interval to one of the others.
fn shares(inner: &Inner) -> (Vec<Target>, f64, usize) {
    let v = inner.lock();
    // A member in its leave still probes and gossips until it stops (a
    // closing fleet's intents need the rounds of all its members), and is
    // still one of the others a member picks from.
    let running = v.alive + v.leaving.len();
    let others = (v.size + v.leaving.len()).saturating_sub(1).max(1) as f64;
    let servers = v
        .live_servers()
        .into_iter()
        .map(|s| (s, v.remotes[s].addr, v.remotes[s].name.clone()))
        .collect();
    (servers, running as f64 / others, v.size)
}

/// Each server with broadcasts owed gets the packets the pool's gossip
/// would send it this round: `gossip_nodes` targets per member with
/// something to say, of whom it is one in (pool size − 1); then the
/// joined members' re-announcements take their round.
fn gossip(inner: &Inner) {
    let (servers, share, _) = shares(inner);
    let n = (share * f64::from(inner.cfg.timings.gossip_nodes))
        .round()
        .max(1.0) as usize;
    for (s, addr, _) in servers {
        for _ in 0..n {
            let msgs = inner.lock().take_broadcasts(s, UDP_BUFFER - 2);
            if msgs.is_empty() {
                break;
            }
            let parts: Vec<&[u8]> = msgs.iter().map(|m| &m[..]).collect();
            let packet = if parts.len() == 1 {
                parts[0].to_vec()
            } else {
                compound(&parts)
            };
            let ep = fastrand::usize(..inner.udp.len());
            let sealed = inner.cfg.security.seal_packet(&packet);
            if inner.udp[ep].try_send_to(&sealed, addr).is_ok() {
                inner.metrics.incr(inner.ids.packets_tx);
                inner.metrics.add(inner.ids.bytes_tx, sealed.len() as u64);
            }
        }
    }
    super::reannounce::round(inner);
}

/// Quiet leaves waiting: a batch of push-pulls takes them (one at a time;
/// once the pool is closing, its own batch does).
fn start_batch(inner: &Arc<Inner>) {
    if inner.lock().quiet.is_empty() || inner.closing.is_cancelled() {
        return;
    }
    let Ok(under_way) = inner.batch.clone().try_lock_owned() else {
        return;
    };
    let inner = inner.clone();
    tokio::spawn(async move {
        close::leave_batch(&inner, inner.cfg.timings.intent_lead).await;
        drop(under_way);
    });
}

/// Members whose leave intent every server has taken (gossiped back, or
/// shown in a push-pull's answer) send their leave: serf's order, the
/// intent first, after two gossip rounds at least. One not taken within
/// `broadcast_timeout` goes to the next batch of push-pulls, which asks
/// the servers until they show it: a dead message sent before a server
/// that lags took the intent would make the member failed. Those still
/// waiting keep their order.
fn finish_leaves(inner: &Inner, now: Instant) {
    let t = inner.cfg.timings;
    let mut v = inner.lock();
    let limit = v.retransmit_limit(t.retransmit_mult);
    for slot in std::mem::take(&mut v.leaving) {
        let Phase::Leaving(at) = v.locals[slot].phase else {
            continue;
        };
        let waited = now - at;
        if waited >= t.gossip_interval * 2 && v.intent_taken(slot) {
            v.leave_done(slot, limit);
        } else if waited >= t.broadcast_timeout {
            v.quiet.push(slot);
        } else {
            v.leaving.push_back(slot);
        }
    }
}

/// Periodic push-pulls: each alive member exchanges state with one random
/// member per scaled interval; a server gets its share of them.
fn push_pulls(inner: &Arc<Inner>, owed: &mut Owed, dt: Duration) {
    let (servers, share, size) = shares(inner);
    let interval = push_pull_scale(inner.cfg.timings.push_pull_interval, size);
    let per = dt.as_secs_f64() / interval.as_secs_f64();
    for (s, addr, _) in servers {
        let o = owed.push_pulls.entry(s).or_insert(fastrand::f64());
        *o += share * per;
        if *o < 1.0 {
            continue;
        }
        *o -= 1.0;
        spawn_push_pull(inner, s, addr, false);
    }
}

/// A push-pull with server `s` in the background, its answer merged.
fn spawn_push_pull(inner: &Arc<Inner>, s: usize, addr: SocketAddr, join: bool) {
    let inner = inner.clone();
    tokio::spawn(async move {
        let msg = inner.lock().push_pull(join, super::view::Shown::Intents);
        if let Ok(answer) = net::exchange(&inner, addr, &msg).await {
            inner.metrics.incr(inner.ids.push_pulls);
            if let Ok(pp) = crate::wire::msgs::PushPull::decode(&answer[1..]) {
                let mut v = inner.lock();
                let limit = v.retransmit_limit(inner.cfg.timings.retransmit_mult);
                v.merge(&pp, Some(s), limit);
            }
        }
    });
}

/// serf's reconnect: every 30 s each member joins a random failed member
/// with probability failed/alive, so a dead server gets about one join
/// push-pull per 30 s from the whole cluster, of which the pool sends its
/// share. A server alive again refutes the death our state shows it (a
/// higher incarnation), and is back.
fn reconnect(inner: &Arc<Inner>, owed: &mut Owed, dt: Duration) {
    let (dead, share): (Vec<(usize, SocketAddr)>, f64) = {
        let v = inner.lock();
        let dead = v.remotes.iter().enumerate();
        let dead = dead.filter(|(_, r)| r.server && r.state == crate::wire::msgs::state::DEAD);
        let share = v.alive as f64 / v.size.max(1) as f64;
        (dead.map(|(s, r)| (s, r.addr)).collect(), share)
    };
    let per = dt.as_secs_f64() / RECONNECT_INTERVAL.as_secs_f64();
    for (s, addr) in dead {
        let o = owed.reconnects.entry(s).or_insert(fastrand::f64());
        *o += share * per;
        if *o >= 1.0 {
            *o -= 1.0;
            spawn_push_pull(inner, s, addr, true);
        }
    }
}
