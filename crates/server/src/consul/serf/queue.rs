//! What the server has to gossip: memberlist's verdicts (alive, suspect,
//! dead), serf's intents and serf's user events, each sent a limited
//! number of times (memberlist's `retransmitMult × ceil(log10(n + 1))`),
//! a newer message about a member replacing the older one, as memberlist's
//! transmit-limited queues do. memberlist's own messages fill a packet
//! first, then serf's intents, then its events, as memberlist's
//! `getBroadcasts` asks serf's delegate only for the room left (so in a
//! storm the intents wait behind the alive messages: hashicorp/consul#9926);
//! within each, fewest sends first and newest first among equals: the
//! gossip crate's [`broadcast::Queue`], memberlist's transmit-limited
//! queue, with a class each.
//!
//! What it is not: no sockets; `probe`'s gossip task sends what it takes.

use std::sync::Arc;

use agent_sim_gossip::broadcast;

/// The classes, in the order a packet is filled: memberlist's messages,
/// serf's intents, serf's events.
const MEMBERS: u8 = 0;
const INTENTS: u8 = 1;
const EVENTS: u8 = 2;

/// What a message is about: a newer one with the same key replaces it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Key {
    /// memberlist's word on a member.
    Member(Arc<str>),
    /// serf's join or leave intent of a member.
    Intent(Arc<str>),
    /// One of serf's user events (never replaced: serf's event broadcasts
    /// invalidate nothing).
    Event,
}

impl Key {
    /// Which of memberlist's and serf's queues the message is in: the
    /// order a packet is filled in.
    fn class(&self) -> u8 {
        match self {
            Key::Member(_) => MEMBERS,
            Key::Intent(_) => INTENTS,
            Key::Event => EVENTS,
        }
    }
}

/// Messages waiting by queue: memberlist's broadcasts, serf's intents and
/// serf's events (what memberlist samples as `queue.broadcasts` and serf as
/// `queue.Intent` and `queue.Event`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Depths {
    pub(crate) broadcasts: usize,
    pub(crate) intents: usize,
    pub(crate) events: usize,
}

/// The queue, bounded: beyond `cap` messages the most sent goes.
#[derive(Debug)]
pub(crate) struct Queue {
    items: broadcast::Queue<Key>,
}

impl Queue {
    /// An empty queue of at most `cap` messages.
    pub(crate) fn new(cap: usize) -> Self {
        Queue {
            items: broadcast::Queue::new(cap),
        }
    }

    /// Messages waiting.
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    /// Messages waiting, by queue.
    pub(crate) fn depths(&self) -> Depths {
        Depths {
            broadcasts: self.items.depth(MEMBERS),
            intents: self.items.depth(INTENTS),
            events: self.items.depth(EVENTS),
        }
    }

    /// Queues `msg` (type byte first), replacing any about the same key.
    pub(crate) fn push(&mut self, key: Key, msg: Vec<u8>) {
        let class = key.class();
        let key = (key != Key::Event).then_some(key);
        self.items.push(key, class, msg.into(), 0);
    }

    /// Messages for one packet: as many as fit `budget` bytes, each
    /// costing `overhead` more, memberlist's first, then serf's intents,
    /// then its events, fewest sends first in each. Each taken counts a
    /// send; one sent `limit` times leaves the queue.
    pub(crate) fn take(&mut self, budget: usize, overhead: usize, limit: u32) -> Vec<Vec<u8>> {
        let taken = self.items.take(budget, overhead, limit);
        taken.iter().map(|m| m.to_vec()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(n: &str) -> Key {
        Key::Member(n.into())
    }

    #[test]
    fn newest_replaces_and_fewest_sends_go_first() {
        let mut q = Queue::new(10);
        q.push(member("a"), vec![1; 10]);
        q.push(member("b"), vec![2; 10]);
        q.push(member("a"), vec![3; 10]);
        assert_eq!(q.len(), 2);
        // Newest first among equals; the budget holds one.
        assert_eq!(q.take(12, 2, 3), vec![vec![3; 10]]);
        assert_eq!(q.take(12, 2, 3), vec![vec![2; 10]]);
        assert_eq!(q.take(100, 2, 2), vec![vec![3; 10], vec![2; 10]]);
        assert_eq!(q.len(), 0, "each went twice: the limit");
        q.push(Key::Intent("a".into()), vec![4]);
        q.push(member("a"), vec![5]);
        assert_eq!(
            q.len(),
            2,
            "an intent and a verdict about one member both stay"
        );
    }

    #[test]
    fn memberlist_s_messages_fill_a_packet_before_serf_s() {
        let mut q = Queue::new(10);
        q.push(Key::Event, vec![1; 10]);
        q.push(Key::Event, vec![2; 10]);
        q.push(Key::Intent("a".into()), vec![3; 10]);
        q.push(member("a"), vec![4; 10]);
        let depths = Depths {
            broadcasts: 1,
            intents: 1,
            events: 2,
        };
        assert_eq!(q.depths(), depths, "two events: they replace nothing");
        assert_eq!(q.take(24, 2, 5), vec![vec![4; 10], vec![3; 10]]);
        // Sent once, the alive and the intent still go first.
        assert_eq!(q.take(24, 2, 5), vec![vec![4; 10], vec![3; 10]]);
        assert_eq!(q.take(100, 2, 2)[2..], [vec![2; 10], vec![1; 10]]);
        assert_eq!(q.depths().broadcasts, 0, "past its limit");
    }

    #[test]
    fn the_queue_is_bounded_and_the_limit_grows_with_the_pool() {
        let mut q = Queue::new(3);
        for i in 0..10u8 {
            q.push(member(&i.to_string()), vec![i]);
        }
        assert_eq!(q.len(), 3);
    }
}
