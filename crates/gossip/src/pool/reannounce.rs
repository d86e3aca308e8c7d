//! A joined member's re-announcement of the members its join taught it,
//! as memberlist does it: a fresh member merges the server's answer
//! (`mergeState`), every alive member in it is new to it, and each gets
//! an `alive` broadcast in its queue, sent `4 × ceil(log10(n+1))` times (n:
//! the nodes it knows, itself included). Each gossip round it sends 3
//! packets, each to a random member it knows and each a compound of as
//! many queued messages as fit (least-sent first, so the queue goes round
//! in order). The servers are some of those members: from each fresh
//! member they receive about `limit × servers` alive messages in all.
//!
//! The model keeps O(1) per member under way (a cursor over its
//! `learnt × limit` messages, not a list of members): each round, each of
//! its packets covers the next messages; one goes to a server with
//! probability servers/learnt (a live server of the view, uniform), else
//! to a member not simulated here and is not sent. A packet to a server
//! carries alive messages of members the view knows alive, the member
//! itself apart, taken in a fixed order from the cursor: the first
//! `learnt` of them are those the pool learnt first, remote ones then
//! local ones, as a join's answer lists them.
//!
//! Not here: the answer's counting (`answer`), the model's other sends
//! (`tick`: each server gets each broadcast the limit times).

use std::net::SocketAddr;

use super::Inner;
use super::answer::Learnt;
use super::net;
use super::view::{Phase, View, Who, retransmit_limit};
use crate::wire::msgs::{Alive, state};
use crate::wire::{Security, UDP_BUFFER, compound, crypt, ip_bytes};

/// memberlist's compound header (type byte and count).
const COMPOUND_HEADER: usize = 2;
/// memberlist's cost of each message in a compound (its length).
const PER_MESSAGE: usize = 2;

/// A re-announcement's arithmetic, fixed when it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Plan {
    /// Alive members the answer listed, the member itself apart.
    pub learnt: u64,
    /// Of those, servers.
    pub servers: u64,
    /// Sends of each alive message.
    pub limit: u64,
    /// Alive messages a packet carries.
    pub per_packet: u64,
    /// Packets a gossip round (`gossip_nodes`, or fewer members known).
    pub fanout: u64,
}

impl Plan {
    /// The plan of a member that learnt `learnt` from its join, with
    /// memberlist's `retransmit_mult` and `gossip_nodes`, its packets
    /// sealed by `sec`. `None` when it learnt no one.
    pub fn new(
        learnt: &Learnt,
        retransmit_mult: u32,
        gossip_nodes: u32,
        sec: &Security,
    ) -> Option<Plan> {
        let alive_len = learnt.alive_len()?;
        (learnt.members > 0).then(|| Plan {
            learnt: learnt.members,
            servers: learnt.servers.min(learnt.members),
            limit: retransmit_limit(retransmit_mult, learnt.members + 1),
            per_packet: per_packet(room(sec), alive_len),
            fanout: u64::from(gossip_nodes.max(1)).min(learnt.members),
        })
    }

    /// Alive messages in all: each learnt member's, `limit` times.
    pub fn total(&self) -> u64 {
        self.learnt * self.limit
    }

    /// The chance a packet goes to a server.
    pub fn server_share(&self) -> f64 {
        self.servers as f64 / self.learnt as f64
    }
}

/// What the tests check of a plan.
#[cfg(test)]
impl Plan {
    /// Gossip rounds until the last is sent.
    pub fn rounds(&self) -> u64 {
        self.total().div_ceil(self.fanout * self.per_packet)
    }

    /// Alive messages the servers receive in all, on average: the limit
    /// times the servers.
    pub fn expected_at_servers(&self) -> f64 {
        self.total() as f64 * self.server_share()
    }
}

/// The bytes of messages a gossip packet takes (memberlist's `gossip`: the
/// UDP buffer less the compound header, the label header and encryption).
pub(super) fn room(sec: &Security) -> usize {
    let label = match sec.label.len() {
        0 => 0,
        n => 2 + n,
    };
    let crypt = if sec.keyring.is_some() {
        crypt::OVERHEAD
    } else {
        0
    };
    UDP_BUFFER - COMPOUND_HEADER - label - crypt
}

/// Alive messages of `alive_len` bytes that fit in `room` (at least one, at
/// most a compound's 255).
pub(super) fn per_packet(room: usize, alive_len: usize) -> u64 {
    (room / (alive_len + PER_MESSAGE)).clamp(1, 255) as u64
}

/// One member's re-announcement under way.
#[derive(Debug)]
pub(super) struct Reannounce {
    slot: usize,
    /// Messages covered so far (sent, or passed to members not simulated).
    cursor: u64,
    plan: Plan,
}

/// A packet owed to a server this round.
struct Due {
    slot: usize,
    /// The first message it covers, and how many.
    from: u64,
    count: u64,
    learnt: u64,
    /// The server (remote index).
    server: usize,
}

/// The re-announcements under way (held apart from the view, and before
/// it when both are).
fn list(inner: &Inner) -> std::sync::MutexGuard<'_, Vec<Reannounce>> {
    inner.reannouncing.lock().unwrap_or_else(|p| p.into_inner())
}

/// Starts member `slot`'s re-announcement of what its join taught it
/// (nothing once the pool is closing, or when it learnt no one).
pub(super) fn start(inner: &Inner, slot: usize, learnt: &Learnt) {
    let t = &inner.cfg.timings;
    let Some(plan) = Plan::new(
        learnt,
        t.retransmit_mult,
        t.gossip_nodes,
        &inner.cfg.security,
    ) else {
        return;
    };
    if inner.closing.is_cancelled() {
        return;
    }
    list(inner).push(Reannounce {
        slot,
        cursor: 0,
        plan,
    });
}

/// One gossip round of every re-announcement under way: each covers its
/// next packets, those to servers are sent; one done, or whose member is no
/// longer alive, is dropped, and all of them once the pool is closing.
pub(super) fn round(inner: &Inner) {
    let mut list = list(inner);
    if list.is_empty() {
        return;
    }
    if inner.closing.is_cancelled() {
        *list = Vec::new();
        return;
    }
    let mut due = Vec::new();
    {
        let v = inner.lock();
        let servers = v.live_servers();
        list.retain_mut(|r| {
            if v.locals.get(r.slot).is_none_or(|l| l.phase != Phase::Alive) {
                return false;
            }
            let total = r.plan.total();
            for _ in 0..r.plan.fanout {
                if r.cursor >= total {
                    break;
                }
                let count = r.plan.per_packet.min(total - r.cursor);
                if !servers.is_empty() && fastrand::f64() < r.plan.server_share() {
                    due.push(Due {
                        slot: r.slot,
                        from: r.cursor,
                        count,
                        learnt: r.plan.learnt,
                        server: servers[fastrand::usize(..servers.len())],
                    });
                }
                r.cursor += count;
            }
            r.cursor < total
        });
    }
    drop(list);
    let room = room(&inner.cfg.security);
    for d in due {
        send(inner, &d, room);
    }
}

/// Sends a packet owed to a server through `net` (sealed as any packet,
/// broadcasts for that server filling what room is left).
fn send(inner: &Inner, d: &Due, room: usize) {
    let (msgs, ep, to): (Vec<Vec<u8>>, usize, SocketAddr) = {
        let v = inner.lock();
        let (Some(l), Some(s)) = (v.locals.get(d.slot), v.remotes.get(d.server)) else {
            return;
        };
        let ep = usize::from(l.endpoint);
        (alives(&v, d, room), ep, s.addr)
    };
    if msgs.is_empty() {
        return;
    }
    let packet = match &msgs[..] {
        [one] => one.clone(),
        _ => compound(&msgs.iter().map(|m| &m[..]).collect::<Vec<_>>()),
    };
    inner.metrics.add(inner.ids.reannounced, msgs.len() as u64);
    net::send(inner, ep, to, &packet);
}

/// A member the view knows alive.
#[derive(Debug, Clone, Copy)]
enum Known {
    Remote(usize),
    Local(usize),
}

/// The members the view knows alive, `me` apart, in a fixed order: remote
/// ones (those no local member shadows), then local ones.
fn known(v: &View, me: usize) -> impl Iterator<Item = Known> + '_ {
    let remotes =
        v.remotes.iter().enumerate().filter(|(i, r)| {
            r.state == state::ALIVE && v.names.get(&r.name) == Some(&Who::Remote(*i))
        });
    let locals = v.locals.iter().enumerate();
    let locals = locals.filter(move |(slot, l)| *slot != me && l.phase == Phase::Alive);
    remotes
        .map(|(i, _)| Known::Remote(i))
        .chain(locals.map(|(slot, _)| Known::Local(slot)))
}

/// A known member's alive message.
fn alive(v: &View, k: Known) -> Vec<u8> {
    match k {
        Known::Local(slot) => v.alive_msg(slot),
        Known::Remote(i) => {
            let r = &v.remotes[i];
            let ip = ip_bytes(r.addr.ip());
            let mut out = Vec::with_capacity(64 + r.meta.len());
            Alive {
                incarnation: r.incarnation,
                node: &r.name,
                addr: &ip,
                port: r.addr.port(),
                meta: &r.meta,
                vsn: &r.vsn,
            }
            .encode(&mut out);
            out
        }
    }
}

/// The alive messages of packet `d`: message `i` is about the known
/// member `i mod learnt` (from the start again when the view knows fewer);
/// one that does not fit in `room` is passed over, as memberlist does.
fn alives(v: &View, d: &Due, room: usize) -> Vec<Vec<u8>> {
    let (mut out, mut used) = (Vec::new(), 0);
    let mut at = d.from % d.learnt;
    let from = |i: u64| known(v, d.slot).skip(i as usize);
    let mut members = from(at);
    for _ in 0..d.count {
        let next = match members.next() {
            Some(k) if at < d.learnt => Some(k),
            _ => {
                at = 0;
                members = from(0);
                members.next()
            }
        };
        let Some(k) = next else {
            break;
        };
        at += 1;
        let msg = alive(v, k);
        if used + msg.len() + PER_MESSAGE <= room {
            used += msg.len() + PER_MESSAGE;
            out.push(msg);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Keyring;

    #[test]
    fn memberlists_limit_grows_with_the_log_of_the_nodes_known() {
        // 4 × ceil(log10(n + 1)): 8 up to 99 nodes, 12 to 999, 16, 20.
        assert_eq!(retransmit_limit(4, 1), 4);
        assert_eq!(retransmit_limit(4, 9), 4);
        assert_eq!(retransmit_limit(4, 10), 8);
        assert_eq!(retransmit_limit(4, 99), 8);
        assert_eq!(retransmit_limit(4, 100), 12);
        assert_eq!(retransmit_limit(4, 1_000), 16);
        assert_eq!(retransmit_limit(4, 10_000), 20);
    }

    #[test]
    fn a_packet_takes_what_fits_after_the_headers_and_the_encryption() {
        let plain = Security::default();
        assert_eq!(room(&plain), 1_398);
        let labelled = Security {
            label: "prod".into(),
            keyring: Some(
                Keyring::from_base64(&["pUqJrVyVRj5jsiYEkM/tFQYfWyJIv4s3XkvDwy7Cu5s="]).unwrap(),
            ),
        };
        // Label: 2 + 4 bytes; AES-GCM version 1: 1 + 12 + 16.
        assert_eq!(room(&labelled), 1_398 - 6 - 29);
        // A client's alive message of a Consul 1.20.1 is about 200 bytes.
        assert_eq!(per_packet(1_398, 200), 6);
        assert_eq!(per_packet(1_398, 5_000), 1);
        assert_eq!(per_packet(1_398, 1), 255);
    }

    #[test]
    fn a_plan_spreads_the_learnt_members_limit_times_over_rounds() {
        let sec = Security::default();
        // 1,000 members and 3 servers learnt: 1,001 nodes known, 16 sends
        // each; 6 messages a packet, 3 packets a round.
        let p = Plan::new(&Learnt::of(1_000, 3, 200), 4, 3, &sec).unwrap();
        assert_eq!((p.limit, p.per_packet, p.fanout), (16, 6, 3));
        assert_eq!(p.total(), 16_000);
        assert_eq!(p.rounds(), 889);
        assert!((p.server_share() - 0.003).abs() < 1e-12);
        // The servers get the limit times the servers, in all.
        assert!((p.expected_at_servers() - 48.0).abs() < 1e-9);
        // One member learnt (the server): one packet a round, all to it.
        let p = Plan::new(&Learnt::of(1, 1, 200), 4, 3, &sec).unwrap();
        assert_eq!((p.limit, p.fanout, p.rounds()), (4, 1, 1));
        assert_eq!(p.server_share(), 1.0);
        assert_eq!(Plan::new(&Learnt::default(), 4, 3, &sec), None);
    }
}
