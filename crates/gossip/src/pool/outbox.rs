//! The answers the simulated members owe to serf queries, sent at a pace
//! real members would keep. Each of N members answers a query (its ack,
//! its response) straight to the asker as the query reaches it, and
//! gossip takes some rounds to reach them all: the pool spreads a query's
//! answers evenly over half its timeout, under a ceiling of
//! [`PER_TICK`] packets a tick for all queries together, so a query to a
//! pool of 10,000 members is never a burst of 20,000 packets. Answers the
//! ceiling held back past the query's deadline are dropped and counted
//! (`gossip_query_answers_dropped`), as a real member past its deadline
//! does not answer.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Inner;
use crate::serf::query::{FLAG_ACK, QueryResponse};

/// Answer packets sent per tick of the pool's ticker (100 ms), at most.
pub const PER_TICK: usize = 1_000;
/// Queries answered at once; a further one drops the oldest's answers
/// still owed.
pub const QUERIES_AT_ONCE: usize = 64;

/// One query's answers still owed.
#[derive(Debug)]
pub(super) struct Pending {
    /// Where they go.
    pub to: SocketAddr,
    /// The query's time and ID.
    pub ltime: u64,
    /// The query's ID.
    pub id: u32,
    /// Each member acks first.
    pub ack: bool,
    /// The response's payload, when the query has one.
    pub response: Option<Arc<[u8]>>,
    /// A member that acks but does not respond (a conflict query about
    /// itself).
    pub mute: Option<usize>,
    /// Copies of each answer (1 + the relay factor: relayed copies come
    /// straight from the pool).
    pub copies: u8,
    /// The members still to answer (slots), answered from the back.
    pub members: Vec<u32>,
    /// How many there were.
    pub total: usize,
    /// When the pool took the query in.
    pub start: Instant,
    /// The answers are spread over this.
    pub spread: Duration,
    /// None is sent after this.
    pub deadline: Instant,
}

/// The queries with answers owed, oldest first.
#[derive(Debug, Default)]
pub(super) struct Outbox {
    pending: VecDeque<Pending>,
}

impl Outbox {
    /// Adds a query's answers; the answers dropped to make room, if any.
    pub fn push(&mut self, p: Pending) -> usize {
        let mut dropped = 0;
        if self.pending.len() >= QUERIES_AT_ONCE {
            dropped = self.pending.pop_front().map_or(0, |old| old.members.len());
        }
        self.pending.push_back(p);
        dropped
    }
}

/// One member's answers to send: the slot, and what of the query.
struct Due {
    slot: usize,
    to: SocketAddr,
    ltime: u64,
    id: u32,
    ack: bool,
    response: Option<Arc<[u8]>>,
    copies: u8,
}

/// Sends the answers due by `now` (each query's share of its spread, under
/// the ceiling); drops those past their deadline.
pub(super) fn send_due(inner: &Inner, now: Instant) {
    let (due, dropped) = take_due(&mut inner.outbox(), now);
    if dropped > 0 {
        inner.metrics.add(inner.ids.answers_dropped, dropped as u64);
    }
    if due.is_empty() {
        return;
    }
    // Names and endpoints first, then the sends, outside the view's lock.
    let senders: Vec<Option<(Arc<str>, usize)>> = {
        let v = inner.lock();
        due.iter()
            .map(|d| {
                let l = v.locals.get(d.slot)?;
                Some((l.name.clone(), usize::from(l.endpoint)))
            })
            .collect()
    };
    let mut msg = Vec::with_capacity(128);
    for (d, who) in due.iter().zip(senders) {
        let Some((name, ep)) = who else { continue };
        let mut r = QueryResponse {
            ltime: d.ltime,
            id: d.id,
            from: &name,
            flags: FLAG_ACK,
            payload: &[],
        };
        for _ in 0..d.copies {
            if d.ack {
                msg.clear();
                r.encode(&mut msg);
                send_plain(inner, ep, d.to, &msg);
            }
            if let Some(p) = &d.response {
                (r.flags, r.payload) = (0, &p[..]);
                msg.clear();
                r.encode(&mut msg);
                send_plain(inner, ep, d.to, &msg);
                (r.flags, r.payload) = (FLAG_ACK, &[]);
            }
        }
        inner.metrics.incr(inner.ids.queries_answered);
    }
}

/// The members whose answers are due (within the ceiling), and the number
/// of answers dropped past their deadline.
fn take_due(ob: &mut Outbox, now: Instant) -> (Vec<Due>, usize) {
    let (mut due, mut dropped, mut budget) = (Vec::new(), 0, PER_TICK);
    for p in &mut ob.pending {
        if now >= p.deadline {
            dropped += p.members.len();
            p.members.clear();
            continue;
        }
        let per_member = usize::from(p.copies) * (usize::from(p.ack) + 1);
        let frac = match p.spread.is_zero() {
            true => 1.0,
            false => ((now - p.start).as_secs_f64() / p.spread.as_secs_f64()).min(1.0),
        };
        let want = (p.total as f64 * frac).ceil() as usize;
        let done = p.total - p.members.len();
        let n = want.saturating_sub(done).min(budget / per_member.max(1));
        for _ in 0..n {
            let Some(slot) = p.members.pop() else { break };
            let slot = slot as usize;
            let response = p.response.clone().filter(|_| p.mute != Some(slot));
            if response.is_none() && !p.ack {
                continue;
            }
            budget -= per_member;
            due.push(Due {
                slot,
                to: p.to,
                ltime: p.ltime,
                id: p.id,
                ack: p.ack,
                response,
                copies: p.copies,
            });
        }
    }
    ob.pending.retain(|p| !p.members.is_empty());
    (due, dropped)
}

/// Sends one message from endpoint `ep` as memberlist's `SendToAddress`
/// does: sealed, nothing piggybacked.
pub(super) fn send_plain(inner: &Inner, ep: usize, to: SocketAddr, msg: &[u8]) {
    let packet = inner.cfg.security.seal_packet(msg);
    let sock = &inner.udp[ep % inner.udp.len()];
    if sock.try_send_to(&packet, to).is_ok() {
        inner.metrics.incr(inner.ids.packets_tx);
        inner.metrics.add(inner.ids.bytes_tx, packet.len() as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(n: u32, now: Instant) -> Pending {
        Pending {
            to: "127.0.0.1:1".parse().unwrap(),
            ltime: 1,
            id: 2,
            ack: true,
            response: Some(Arc::from(&b"x"[..])),
            mute: None,
            copies: 1,
            members: (0..n).collect(),
            total: n as usize,
            start: now,
            spread: Duration::from_secs(1),
            deadline: now + Duration::from_secs(2),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn answers_are_spread_and_held_under_the_ceiling() {
        let now = Instant::now();
        let mut ob = Outbox::default();
        ob.push(pending(10_000, now));
        // A tenth of the spread: a tenth of the members, two packets each.
        let (due, _) = take_due(&mut ob, now + Duration::from_millis(100));
        assert_eq!(due.len(), 500, "the ceiling: {PER_TICK} packets");
        let (due, _) = take_due(&mut ob, now + Duration::from_millis(200));
        assert_eq!(due.len(), 500);
        // Past the deadline, what is left is dropped.
        let (due, dropped) = take_due(&mut ob, now + Duration::from_secs(2));
        assert_eq!((due.len(), dropped), (0, 9_000));
        assert!(ob.pending.is_empty());
        // A small pool answers its share at once.
        ob.push(pending(10, now));
        let (due, _) = take_due(&mut ob, now + Duration::from_secs(1));
        assert_eq!(due.len(), 10);
    }
}
