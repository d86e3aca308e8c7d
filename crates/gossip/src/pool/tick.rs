//! The model's timers, on one task (what they send goes out through
//! `net`): each tick sends the servers their
//! share of what the pool's members would send them (probes, gossip,
//! push-pulls), times out probes, completes leaves, and notices when the
//! process itself was too busy to tick on time.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::net::Waiting;
use super::view::Phase;
use super::{Inner, close, net, push_pull_scale};
use crate::wire::msgs::{Nack, Ping, Verdict, state};
use crate::wire::{self, UDP_BUFFER, compound, kind};

/// The ticker's period.
const TICK: Duration = Duration::from_millis(100);
/// A tick this late means the process could not answer probes in time.
const LATE: Duration = Duration::from_millis(250);

/// Per-server fractions of a send owed.
#[derive(Default)]
struct Owed {
    probes: HashMap<usize, f64>,
    push_pulls: HashMap<usize, f64>,
}

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
        probe(&inner, &mut owed, dt, now);
        expire(&inner, now);
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

/// A live server: its index, gossip address and name.
type Target = (usize, SocketAddr, std::sync::Arc<str>);

/// The live servers and the share of the pool's probes (or push-pulls)
/// each gets per second: every alive member sends one per interval to one
/// of the others.
fn shares(inner: &Inner) -> (Vec<Target>, f64, usize) {
    let v = inner.lock();
    let others = v.size.saturating_sub(1).max(1) as f64;
    let servers = v
        .live_servers()
        .into_iter()
        .map(|s| (s, v.remotes[s].addr, v.remotes[s].name.clone()))
        .collect();
    (servers, v.alive as f64 / others, v.size)
}

/// A random alive member (slot, endpoint) to send from.
fn some_member(inner: &Inner) -> Option<(usize, usize, std::sync::Arc<str>, SocketAddr)> {
    let v = inner.lock();
    if v.alive == 0 {
        return None;
    }
    for _ in 0..32 {
        let slot = fastrand::usize(..v.locals.len());
        let l = &v.locals[slot];
        if l.phase == Phase::Alive {
            let ep = usize::from(l.endpoint);
            return Some((slot, ep, l.name.clone(), v.endpoints[ep]));
        }
    }
    None
}

fn probe(inner: &Inner, owed: &mut Owed, dt: Duration, now: Instant) {
    let (servers, share, _) = shares(inner);
    let per = dt.as_secs_f64() / inner.cfg.timings.probe_interval.as_secs_f64();
    for (s, addr, name) in servers {
        let o = owed.probes.entry(s).or_insert(fastrand::f64());
        *o += share * per;
        while *o >= 1.0 {
            *o -= 1.0;
            let Some((slot, ep, member, me)) = some_member(inner) else {
                break;
            };
            let seq = inner.next_seq();
            let ip = wire::ip_bytes(me.ip());
            let mut out = Vec::with_capacity(80);
            Ping {
                seq,
                node: &name,
                source_addr: &ip,
                source_port: me.port(),
                source_node: &member,
            }
            .encode(&mut out);
            inner
                .waiting
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(
                    seq,
                    Waiting::Probe {
                        slot,
                        server: s,
                        sent: now,
                    },
                );
            inner.metrics.incr(inner.ids.probes);
            net::send(inner, ep, addr, &out);
        }
    }
}

/// Probes with no ack in time: the server is suspected (and the suspicion
/// gossiped to the others, as the member's memberlist would); relayed
/// pings with no ack get their nack.
fn expire(inner: &Inner, now: Instant) {
    let timeout = inner.cfg.timings.probe_timeout;
    // Bound: what waits is at most one probe timeout old (swept here).
    let mut gone = Vec::new();
    inner
        .waiting
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|_, w| {
            let sent = match w {
                Waiting::Probe { sent, .. } | Waiting::Relay { sent, .. } => *sent,
            };
            if now - sent < timeout {
                return true;
            }
            gone.push(*w);
            false
        });
    for w in gone {
        match w {
            Waiting::Probe { slot, server, .. } => {
                inner.metrics.incr(inner.ids.probe_timeouts);
                let mut v = inner.lock();
                let limit = v.retransmit_limit(inner.cfg.timings.retransmit_mult);
                let (Some(r), Some(l)) = (v.remotes.get(server), v.locals.get(slot)) else {
                    continue;
                };
                if r.state != state::ALIVE {
                    continue;
                }
                let (name, inc, from) = (r.name.clone(), r.incarnation, l.name.clone());
                let verdict = Verdict {
                    incarnation: inc,
                    node: &name,
                    from: &from,
                };
                v.on_verdict(kind::SUSPECT, &verdict, None, limit);
            }
            Waiting::Relay {
                to,
                seq,
                nack: true,
                ..
            } => {
                let mut out = Vec::new();
                Nack { seq }.encode(&mut out);
                net::send(inner, 0, to, &out);
            }
            Waiting::Relay { .. } => {}
        }
    }
}

/// Each server with broadcasts owed gets the packets the pool's gossip
/// would send it this round: `gossip_nodes` targets per member with
/// something to say, of whom it is one in (pool size − 1).
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

/// Members whose leave intent has had two gossip rounds to travel send
/// their leave (serf's order: intent first).
fn finish_leaves(inner: &Inner, now: Instant) {
    let wait = inner.cfg.timings.gossip_interval * 2;
    let mut v = inner.lock();
    let limit = v.retransmit_limit(inner.cfg.timings.retransmit_mult);
    while let Some(&slot) = v.leaving.front() {
        match v.locals[slot].phase {
            Phase::Leaving(at) if now - at < wait => break,
            Phase::Leaving(_) => {
                v.leaving.pop_front();
                v.leave_done(slot, limit);
            }
            _ => {
                v.leaving.pop_front();
            }
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
        let inner = inner.clone();
        tokio::spawn(async move {
            let msg = inner.lock().push_pull(false, super::view::Shown::Intents);
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
}
