//! One probe round of the pool's members, in one place, as memberlist's
//! `probeNode` runs it for a server:
//!
//! 1. **send** ([`due`]): each alive member probes one member per
//!    `probe_interval`; a server gets its share, from random members;
//! 2. **ack** ([`on_ack`]): the round trip moves the member's coordinate
//!    and the server's;
//! 3. **timeout** ([`expire`]): no ack within `probe_timeout` and the
//!    member suspects the server (as it would once its indirect probes
//!    failed: the pool sends none), gossiping a `suspect`; another
//!    member's timeout confirms it;
//! 4. **suspicion** (`suspicion`, kept by the view): the server is dead
//!    when its suspicion runs out, unless it refuted it; a dead server is
//!    probed no more.
//!
//! The indirect pings a server asks of the members wait for their ack here
//! too ([`wait_relay`]). Nothing here touches a socket: what is to be sent
//! is returned ([`Out`]) for `net` to send.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Inner;
use super::view::Phase;
use crate::coordinate::Coord;
use crate::wire::msgs::{Ack, Nack, Ping, Verdict, state};
use crate::wire::{self, kind};

/// A live server: its index, gossip address and name.
pub(super) type Target = (usize, SocketAddr, Arc<str>);

/// A packet to send from endpoint `ep`.
#[derive(Debug)]
pub(super) struct Out {
    /// The endpoint (its socket) it goes from.
    pub ep: usize,
    /// Where it goes.
    pub to: SocketAddr,
    /// The message, type byte first.
    pub msg: Vec<u8>,
}

/// What an ack is awaited for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Waiting {
    /// A member's probe of a server.
    Probe {
        /// The member.
        slot: usize,
        /// The server (remote index).
        server: usize,
        /// When it was sent.
        sent: Instant,
    },
    /// A ping sent for a server's indirect probe: its ack goes back there.
    Relay {
        /// The asker.
        to: SocketAddr,
        /// The asker's sequence number.
        seq: u32,
        /// Whether it wants a nack.
        nack: bool,
        /// When it was sent.
        sent: Instant,
    },
}

/// A random alive member (slot, endpoint) to send from.
fn some_member(inner: &Inner) -> Option<(usize, usize, Arc<str>, SocketAddr)> {
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

/// Step 1: the probes owed to each live server after `dt` (each gets
/// `share` probes per interval; `owed` keeps the fractions), each awaited.
pub(super) fn due(
    inner: &Inner,
    servers: &[Target],
    share: f64,
    owed: &mut HashMap<usize, f64>,
    dt: Duration,
    now: Instant,
) -> Vec<Out> {
    let per = dt.as_secs_f64() / inner.cfg.timings.probe_interval.as_secs_f64();
    let mut out = Vec::new();
    for (s, addr, name) in servers {
        let o = owed.entry(*s).or_insert(fastrand::f64());
        *o += share * per;
        while *o >= 1.0 {
            *o -= 1.0;
            let Some((slot, ep, member, me)) = some_member(inner) else {
                break;
            };
            let seq = inner.next_seq();
            let ip = wire::ip_bytes(me.ip());
            let mut msg = Vec::with_capacity(80);
            Ping {
                seq,
                node: name,
                source_addr: &ip,
                source_port: me.port(),
                source_node: &member,
            }
            .encode(&mut msg);
            let w = Waiting::Probe {
                slot,
                server: *s,
                sent: now,
            };
            inner.awaited().insert(seq, w);
            inner.metrics.incr(inner.ids.probes);
            out.push(Out { ep, to: *addr, msg });
        }
    }
    out
}

/// Step 2: an ack. A probe's round trip moves the member's coordinate (and
/// the server's, from its payload); a relayed ping's ack is to go back to
/// its asker (returned).
pub(super) fn on_ack(inner: &Inner, ack: &Ack<'_>) -> Option<Out> {
    let w = inner.awaited().remove(&ack.seq);
    match w? {
        Waiting::Probe { slot, server, sent } => {
            let rtt = sent.elapsed();
            let peer = Coord::from_ack_payload(ack.payload).ok();
            let mut v = inner.lock();
            if let (Some(c), Some(r)) = (&peer, v.remotes.get_mut(server)) {
                r.coord = c.clone();
            }
            let other = peer.unwrap_or_default();
            if let Some(l) = v.locals.get_mut(slot) {
                l.vivaldi.observe(&other, rtt);
            }
            None
        }
        Waiting::Relay { to, seq, .. } => {
            let mut msg = Vec::new();
            Ack { seq, payload: &[] }.encode(&mut msg);
            Some(Out { ep: 0, to, msg })
        }
    }
}

/// Registers a ping sent for a server's indirect probe (`local` is its
/// sequence number; `seq` the asker's).
pub(super) fn wait_relay(inner: &Inner, local: u32, to: SocketAddr, seq: u32, nack: bool) {
    let w = Waiting::Relay {
        to,
        seq,
        nack,
        sent: Instant::now(),
    };
    inner.awaited().insert(local, w);
}

/// Steps 3 and 4: probes with no ack in time suspect their server (or
/// confirm its suspicion, from another member), the suspicions run out
/// declare their server dead, and relayed pings with no ack get their
/// nack (returned).
pub(super) fn expire(inner: &Inner, now: Instant) -> Vec<Out> {
    let timeout = inner.cfg.timings.probe_timeout;
    // Bound: what waits is at most one probe timeout old (swept here).
    let mut gone = Vec::new();
    inner.awaited().retain(|_, w| {
        let sent = match w {
            Waiting::Probe { sent, .. } | Waiting::Relay { sent, .. } => *sent,
        };
        if now - sent < timeout {
            return true;
        }
        gone.push(*w);
        false
    });
    let mut out = Vec::new();
    for w in gone {
        match w {
            Waiting::Probe { slot, server, .. } => {
                inner.metrics.incr(inner.ids.probe_timeouts);
                suspect(inner, slot, server);
            }
            Waiting::Relay {
                to,
                seq,
                nack: true,
                ..
            } => {
                let mut msg = Vec::new();
                Nack { seq }.encode(&mut msg);
                out.push(Out { ep: 0, to, msg });
            }
            Waiting::Relay { .. } => {}
        }
    }
    if let Some((_, _, me, _)) = some_member(inner) {
        let mut v = inner.lock();
        let limit = v.retransmit_limit(inner.cfg.timings.retransmit_mult);
        v.fail_overdue(now, &me, limit);
    }
    out
}

/// Member `slot`'s probe of `server` went unanswered: it suspects the
/// server (a confirmation when another member already does).
fn suspect(inner: &Inner, slot: usize, server: usize) {
    let mut v = inner.lock();
    let limit = v.retransmit_limit(inner.cfg.timings.retransmit_mult);
    let (Some(r), Some(l)) = (v.remotes.get(server), v.locals.get(slot)) else {
        return;
    };
    if r.state != state::ALIVE && r.state != state::SUSPECT {
        return;
    }
    let (name, incarnation, from) = (r.name.clone(), r.incarnation, l.name.clone());
    let verdict = Verdict {
        incarnation,
        node: &name,
        from: &from,
    };
    v.on_verdict(kind::SUSPECT, &verdict, None, limit);
}
