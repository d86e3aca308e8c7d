//! memberlist's transmit-limited queue (hashicorp/memberlist `queue.go`):
//! messages waiting to be gossiped, each sent a limited number of times,
//! the fewest-sent first and the newest first among equals, a newer message
//! about the same thing (its key) replacing the older one, as a
//! `NamedBroadcast` invalidates the queued one of its name. One [`Queue`]
//! serves the simulated members (one per server they gossip to) and the
//! embedded server (memberlist's and serf's queues as classes of one).
//!
//! Parts: [`Queue`] with its `push`, `take` (one packet's messages) and
//! depths. Items sit in a `BTreeMap` by (class, sends, newest first) and a
//! `HashMap` by key: a push and each message taken cost O(log n).
//!
//! What it is not: no encoding (messages are bytes, type byte first), no
//! clock, no sockets; the caller packs what `take` returns into a compound.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::Arc;

/// Most messages in one packet: a compound counts its parts in one byte.
pub const MAX_PER_PACKET: usize = u8::MAX as usize;
/// Messages too big for the room left passed over in a row before a
/// packet is closed.
const MAX_PASSED: usize = 32;

/// Where an item sits: packets are filled in this order (class, then the
/// fewest sends, then the newest, as memberlist orders by transmits
/// ascending then id descending).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Order {
    class: u8,
    sends: u32,
    newest: Reverse<u64>,
}

#[derive(Debug)]
struct Item<K> {
    key: Option<K>,
    msg: Arc<[u8]>,
    /// Sends it gets whatever the limit at `take` (0: the limit alone).
    at_least: u32,
}

/// Messages waiting to be gossiped, bounded: beyond `cap` the most sent
/// (the oldest among those) goes, counted in [`Queue::dropped`].
#[derive(Debug)]
pub struct Queue<K> {
    items: BTreeMap<Order, Item<K>>,
    by_key: HashMap<K, Order>,
    depths: Vec<usize>,
    unsent: usize,
    next_id: u64,
    cap: usize,
    dropped: u64,
}

impl<K: Eq + Hash + Clone> Queue<K> {
    /// An empty queue of at most `cap` messages (at least one).
    pub fn new(cap: usize) -> Self {
        Queue {
            items: BTreeMap::new(),
            by_key: HashMap::new(),
            depths: Vec::new(),
            unsent: 0,
            next_id: 0,
            cap: cap.max(1),
            dropped: 0,
        }
    }

    /// Messages waiting.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Nothing waits.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Messages waiting in `class`.
    pub fn depth(&self, class: u8) -> usize {
        self.depths.get(usize::from(class)).copied().unwrap_or(0)
    }

    /// Messages waiting not sent even once yet.
    pub fn unsent(&self) -> usize {
        self.unsent
    }

    /// Messages dropped from a full queue so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Queues `msg` in `class`, replacing the message queued with the same
    /// `key` (none: it replaces nothing and is never replaced). It is sent
    /// at least `at_least` times, more if the limit at [`Queue::take`] is
    /// higher. True when a full queue dropped its most sent to make room.
    pub fn push(&mut self, key: Option<K>, class: u8, msg: Arc<[u8]>, at_least: u32) -> bool {
        if let Some(old) = key.as_ref().and_then(|k| self.by_key.get(k).copied()) {
            self.remove(old);
        }
        let full = self.items.len() >= self.cap;
        if full && let Some(worst) = self.most_sent() {
            self.remove(worst);
            self.dropped += 1;
        }
        self.next_id += 1;
        let order = Order {
            class,
            sends: 0,
            newest: Reverse(self.next_id),
        };
        if let Some(k) = &key {
            self.by_key.insert(k.clone(), order);
        }
        let c = usize::from(class);
        if self.depths.len() <= c {
            self.depths.resize(c + 1, 0);
        }
        self.depths[c] += 1;
        self.unsent += 1;
        self.items.insert(order, Item { key, msg, at_least });
        full
    }

    /// Messages for one packet: walking from the first class's fewest
    /// sent, each that fits the `budget` bytes left (costing `overhead`
    /// more), at most [`MAX_PER_PACKET`]. Each taken counts a send; one
    /// sent `limit` times (or its own `at_least`, at least once) leaves.
    pub fn take(&mut self, budget: usize, overhead: usize, limit: u32) -> Vec<Arc<[u8]>> {
        let mut left = budget;
        let mut picked = Vec::new();
        // Messages that do not fit are passed over, a bounded number of
        // them in a row: a packet nearly full does not walk a whole
        // backlog of a storm.
        let mut passed = 0;
        for (order, item) in &self.items {
            if picked.len() == MAX_PER_PACKET || left < overhead || passed == MAX_PASSED {
                break;
            }
            let cost = item.msg.len() + overhead;
            if cost <= left {
                left -= cost;
                picked.push(*order);
                passed = 0;
            } else {
                passed += 1;
            }
        }
        let mut out = Vec::with_capacity(picked.len());
        for order in picked {
            let Some(item) = self.items.remove(&order) else {
                continue;
            };
            out.push(item.msg.clone());
            if order.sends == 0 {
                self.unsent -= 1;
            }
            let sends = order.sends.saturating_add(1);
            if sends >= limit.max(item.at_least).max(1) {
                self.depths[usize::from(order.class)] -= 1;
                if let Some(k) = &item.key {
                    self.by_key.remove(k);
                }
                continue;
            }
            let next = Order { sends, ..order };
            if let Some(at) = item.key.as_ref().and_then(|k| self.by_key.get_mut(k)) {
                *at = next;
            }
            self.items.insert(next, item);
        }
        out
    }

    /// The most sent message, the oldest among those, of any class.
    fn most_sent(&self) -> Option<Order> {
        let mut worst: Option<Order> = None;
        for (class, _) in self.depths.iter().enumerate().filter(|(_, d)| **d > 0) {
            let class = class as u8;
            let first = Order {
                class,
                sends: 0,
                newest: Reverse(u64::MAX),
            };
            let last = Order {
                class,
                sends: u32::MAX,
                newest: Reverse(0),
            };
            let Some((o, _)) = self.items.range(first..=last).next_back() else {
                continue;
            };
            if worst.is_none_or(|w| (o.sends, o.newest) > (w.sends, w.newest)) {
                worst = Some(*o);
            }
        }
        worst
    }

    /// Takes out the item at `order`, with its key and counts.
    fn remove(&mut self, order: Order) {
        let Some(item) = self.items.remove(&order) else {
            return;
        };
        self.depths[usize::from(order.class)] -= 1;
        if order.sends == 0 {
            self.unsent -= 1;
        }
        if let Some(k) = &item.key
            && self.by_key.get(k) == Some(&order)
        {
            self.by_key.remove(k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(b: u8, len: usize) -> Arc<[u8]> {
        vec![b; len].into()
    }

    fn firsts(msgs: &[Arc<[u8]>]) -> Vec<u8> {
        msgs.iter().map(|m| m[0]).collect()
    }

    #[test]
    fn a_newer_message_with_the_same_key_replaces_the_older() {
        let mut q: Queue<&str> = Queue::new(10);
        q.push(Some("a"), 0, msg(1, 4), 0);
        q.push(Some("b"), 0, msg(2, 4), 0);
        q.push(Some("a"), 0, msg(3, 4), 0);
        q.push(None, 0, msg(4, 4), 0);
        q.push(None, 0, msg(5, 4), 0);
        assert_eq!(q.len(), 4, "keyless messages replace nothing");
        assert_eq!(q.unsent(), 4);
        assert_eq!(firsts(&q.take(100, 0, 1)), vec![5, 4, 3, 2]);
        assert!(q.is_empty());
        // A key replaces its message after it was sent too.
        q.push(Some("a"), 0, msg(6, 4), 0);
        q.take(100, 0, 3);
        q.push(Some("a"), 0, msg(7, 4), 0);
        assert_eq!((q.len(), q.unsent()), (1, 1));
        assert_eq!(firsts(&q.take(100, 0, 3)), vec![7]);
    }

    #[test]
    fn classes_fill_a_packet_in_order() {
        let mut q: Queue<u8> = Queue::new(10);
        q.push(None, 2, msg(1, 4), 0);
        q.push(None, 1, msg(2, 4), 0);
        q.push(None, 0, msg(3, 4), 0);
        q.push(None, 2, msg(4, 4), 0);
        assert_eq!(
            (q.depth(0), q.depth(1), q.depth(2), q.depth(7)),
            (1, 1, 2, 0)
        );
        // Sent once, the first classes still go first.
        assert_eq!(firsts(&q.take(100, 0, 5)), vec![3, 2, 4, 1]);
        assert_eq!(firsts(&q.take(8, 0, 5)), vec![3, 2]);
    }

    #[test]
    fn fewest_sends_first_then_newest() {
        let mut q: Queue<u8> = Queue::new(10);
        q.push(None, 0, msg(1, 4), 0);
        q.push(None, 0, msg(2, 4), 0);
        assert_eq!(firsts(&q.take(4, 0, 5)), vec![2]);
        q.push(None, 0, msg(3, 4), 0);
        // 1 and 3 unsent (3 newer), then 2 sent once.
        assert_eq!(firsts(&q.take(100, 0, 5)), vec![3, 1, 2]);
        assert_eq!(q.unsent(), 0);
    }

    #[test]
    fn a_message_leaves_after_limit_sends_or_its_own() {
        let mut q: Queue<u8> = Queue::new(10);
        q.push(None, 0, msg(1, 4), 0);
        q.push(None, 0, msg(2, 4), 4);
        let sends = |q: &mut Queue<u8>, b: u8, limit: u32| {
            (0..10)
                .filter(|_| firsts(&q.take(100, 0, limit)).contains(&b))
                .count()
        };
        // The limit is the one at each take (the pool's size then).
        assert_eq!(q.take(100, 0, 2).len(), 2);
        assert_eq!(sends(&mut q, 1, 3), 2);
        assert_eq!(q.len(), 0, "2 had 4 sends of its own: 1 + 3");
        q.push(None, 0, msg(3, 4), 0);
        assert_eq!(sends(&mut q, 3, 0), 1, "at least once");
    }

    #[test]
    fn a_full_queue_drops_the_most_sent_oldest() {
        let mut q: Queue<u8> = Queue::new(3);
        q.push(None, 1, msg(1, 4), 0);
        q.push(None, 0, msg(2, 4), 0);
        q.take(100, 0, 5);
        q.push(None, 0, msg(3, 4), 0);
        assert!(
            q.push(None, 0, msg(4, 4), 0),
            "full: 1, sent as often as 2 but older, goes"
        );
        assert_eq!(firsts(&q.take(100, 0, 5)), vec![4, 3, 2]);
        assert!(q.push(None, 0, msg(5, 4), 0));
        assert_eq!(firsts(&q.take(100, 0, 5)), vec![5, 4, 3], "2 was sent most");
        assert_eq!(q.dropped(), 2);
        // A replacement makes room itself.
        let mut q: Queue<u8> = Queue::new(1);
        q.push(Some(1), 0, msg(1, 4), 0);
        assert!(!q.push(Some(1), 0, msg(2, 4), 0));
        assert_eq!(q.dropped(), 0);
    }

    #[test]
    fn a_packet_holds_what_fits_its_budget_with_overhead() {
        let mut q: Queue<u8> = Queue::new(1000);
        q.push(None, 0, msg(1, 10), 0);
        q.push(None, 0, msg(2, 30), 0);
        q.push(None, 0, msg(3, 10), 0);
        // 12 + 32 > 40: the big one waits, the small one behind it fits.
        assert_eq!(firsts(&q.take(40, 2, 5)), vec![3, 1]);
        assert_eq!(firsts(&q.take(11, 2, 5)), Vec::<u8>::new());
        assert_eq!(firsts(&q.take(32, 2, 5)), vec![2]);
        for i in 0..300 {
            q.push(None, 0, msg(i as u8, 1), 0);
        }
        assert_eq!(q.take(usize::MAX, 0, 5).len(), MAX_PER_PACKET);
    }
}
