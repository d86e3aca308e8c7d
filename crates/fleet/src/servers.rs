//! Which of the run's servers an agent talks to, chosen as the real agents
//! choose (the protocol crates hold one of these per agent; the engine
//! only counts where agents are):
//!
//! - [`Rotation`]: a Sensu agent's backends (sensu-go's random backend
//!   selector): shuffled once, then the next one on every connect attempt,
//!   so an agent is back on a surviving backend after one failed attempt.
//! - [`Router`]: a Consul client agent's server list (Consul's router
//!   manager): shuffled; a failed call or a closed connection moves the
//!   server in front to the end; every 2–3 minutes (longer past 11,520
//!   nodes per server) the list is shuffled again, so a server that came
//!   back gets its share.
//!
//! Both keep a few bytes per agent: the order is a seed and a cursor
//! (Rotation) or a small permutation (Router), never the servers' names.
//!
//! [`ServerBoard`]: where the fleet's sessions are, per server (sessions
//! held, and sessions established there), for the run's per-server view:
//! a failover's surge on the survivors, the spread coming back even.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

/// Consul's shortest time between two rebalances.
pub const REBALANCE_MIN: Duration = Duration::from_secs(120);
/// Consul's per-node term: the delay grows with nodes per server past
/// `REBALANCE_MIN / DELAY_PER_NODE` (7,680 nodes per server), limiting
/// reconnections per server in a big cluster.
pub const DELAY_PER_NODE: Duration = Duration::from_micros(15_625);

/// A permutation of `0..n` drawn from `seed` (Fisher–Yates).
fn permutation(n: usize, seed: u64) -> Vec<u16> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut p: Vec<u16> = (0..n as u16).collect();
    rng.shuffle(&mut p);
    p
}

/// A Sensu agent's backends, shuffled once and taken in turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotation {
    seed: u64,
    n: u16,
    next: u16,
}

impl Rotation {
    /// The order of `servers` backends for an agent, drawn from `seed`.
    pub fn new(servers: usize, seed: u64) -> Self {
        Rotation {
            seed,
            n: servers.clamp(1, u16::MAX as usize) as u16,
            next: 0,
        }
    }

    /// The backend for the next connect attempt (every attempt takes the
    /// next one, successful or not).
    pub fn take(&mut self) -> usize {
        let i = if self.n == 1 {
            0
        } else {
            usize::from(permutation(self.n.into(), self.seed)[usize::from(self.next)])
        };
        self.next = (self.next + 1) % self.n;
        i
    }
}

/// A Consul client agent's server list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Router {
    order: Vec<u16>,
}

impl Router {
    /// `servers` servers in an order drawn from `seed`.
    pub fn new(servers: usize, seed: u64) -> Self {
        Router {
            order: permutation(servers.clamp(1, u16::MAX as usize), seed),
        }
    }

    /// The server the next call goes to.
    pub fn current(&self) -> usize {
        usize::from(self.order[0])
    }

    /// A call to `server` failed or its connection closed: when it is the
    /// one in front, it moves to the end (Consul's `NotifyFailedServer`).
    pub fn failed(&mut self, server: usize) {
        if self.order.len() > 1 && usize::from(self.order[0]) == server {
            self.order.rotate_left(1);
        }
    }

    /// A rebalance: the list shuffled again (the caller then checks the
    /// new server in front answers, and calls [`Router::failed`] if not).
    pub fn rebalance(&mut self, rng: &mut fastrand::Rng) {
        rng.shuffle(&mut self.order);
    }

    /// Gossip declared `server` failed or left (Consul's `RemoveServer`):
    /// it leaves the list, unless it is the last one (a list is never
    /// empty here; a real agent's would be, and its calls would fail with
    /// "no known Consul servers" as ours fail on the dead server).
    pub fn remove(&mut self, server: usize) {
        if self.order.len() > 1 {
            self.order.retain(|&s| usize::from(s) != server);
        }
    }

    /// Gossip saw `server` join (Consul's `AddServer`): a server not on
    /// the list is appended at its end, so it gets its share only at the
    /// next rebalance; one already there stays where it is. Whether it
    /// was added.
    pub fn add(&mut self, server: usize) -> bool {
        let Ok(s) = u16::try_from(server) else {
            return false;
        };
        if self.order.contains(&s) {
            return false;
        }
        self.order.push(s);
        true
    }

    /// Whether `server` is on the list.
    pub fn contains(&self, server: usize) -> bool {
        u16::try_from(server).is_ok_and(|s| self.order.contains(&s))
    }

    /// How many servers the list holds.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether the list is empty (never: at least one server).
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

/// Time until the next rebalance (Consul's `rebalanceDelayer`): `min` plus
/// up to half of it at random, or `nodes × 15.625 ms / servers` when that
/// is longer. `min` is [`REBALANCE_MIN`] unless a test shortens it.
pub fn rebalance_delay(
    min: Duration,
    servers: usize,
    nodes: u64,
    rng: &mut fastrand::Rng,
) -> Duration {
    let jittered = min + (min / 2).mul_f64(rng.f64());
    if servers == 0 {
        return jittered;
    }
    let per_nodes = DELAY_PER_NODE.mul_f64(nodes as f64 / servers as f64);
    jittered.max(per_nodes)
}

/// Sessions per server of a fleet (index = the run's target order).
#[derive(Debug)]
pub struct ServerBoard {
    labels: Vec<String>,
    held: Vec<AtomicI64>,
    connects: Vec<AtomicU64>,
}

/// What a [`ServerBoard`] holds at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServerCounts {
    /// Sessions held now, per server.
    pub held: Vec<u64>,
    /// Sessions established there so far, per server.
    pub connects: Vec<u64>,
}

impl ServerBoard {
    /// A board for the run's servers, named by `labels` (their targets).
    pub fn new(labels: Vec<String>) -> Self {
        let n = labels.len();
        ServerBoard {
            labels,
            held: (0..n).map(|_| AtomicI64::new(0)).collect(),
            connects: (0..n).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The servers' names.
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// A session established on `server`.
    pub fn up(&self, server: usize) {
        if let (Some(h), Some(c)) = (self.held.get(server), self.connects.get(server)) {
            h.fetch_add(1, Ordering::Relaxed);
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A session on `server` ended.
    pub fn down(&self, server: usize) {
        if let Some(h) = self.held.get(server) {
            h.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The counts now.
    pub fn counts(&self) -> ServerCounts {
        ServerCounts {
            held: self
                .held
                .iter()
                .map(|h| h.load(Ordering::Relaxed).max(0) as u64)
                .collect(),
            connects: self
                .connects
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rotation_visits_every_backend_in_one_shuffled_order() {
        let mut r = Rotation::new(3, 7);
        let first: Vec<usize> = (0..3).map(|_| r.take()).collect();
        let mut sorted = first.clone();
        sorted.sort();
        assert_eq!(sorted, [0, 1, 2]);
        // The same order again: shuffled once, not per cycle.
        let second: Vec<usize> = (0..3).map(|_| r.take()).collect();
        assert_eq!(first, second);
        // Agents differ: over many seeds every backend comes first.
        let mut firsts = [0; 3];
        for seed in 0..300 {
            firsts[Rotation::new(3, seed).take()] += 1;
        }
        assert!(firsts.iter().all(|n| *n > 60), "{firsts:?}");
        assert_eq!(Rotation::new(1, 5).take(), 0);
    }

    #[test]
    fn a_failed_server_in_front_moves_to_the_end() {
        let mut r = Router::new(3, 11);
        let a = r.current();
        r.failed((a + 1) % 3 + 10); // not the one in front: nothing moves
        assert_eq!(r.current(), a);
        r.failed(a);
        let b = r.current();
        assert_ne!(a, b);
        r.failed(b);
        let c = r.current();
        assert!(c != a && c != b);
        r.failed(c);
        assert_eq!(r.current(), a, "after all three, the first again");
        let mut one = Router::new(1, 3);
        one.failed(0);
        assert_eq!(one.current(), 0);
    }

    #[test]
    fn a_server_gossip_lost_leaves_the_list_and_comes_back_at_its_end() {
        let mut r = Router::new(3, 5);
        let a = r.current();
        r.remove(a);
        assert_eq!(r.len(), 2);
        assert!(!r.contains(a));
        assert_ne!(
            r.current(),
            a,
            "no call goes to a server gossip declared dead"
        );
        // Failing over between the two left never reaches it.
        for _ in 0..4 {
            let c = r.current();
            r.failed(c);
            assert_ne!(r.current(), a);
        }
        assert!(r.add(a));
        assert!(!r.add(a), "already there: stays where it is");
        assert_eq!(r.len(), 3);
        // Appended at the end: the two others come first.
        let b = r.current();
        r.failed(b);
        let c = r.current();
        r.failed(c);
        assert_eq!(r.current(), a);
        // The last server is never taken off.
        let mut one = Router::new(1, 3);
        one.remove(0);
        assert_eq!(one.len(), 1);
        assert!(!one.add(70_000), "not a server index");
    }

    #[test]
    fn rebalance_delays_follow_consuls_formula() {
        let mut rng = fastrand::Rng::with_seed(1);
        for _ in 0..100 {
            // 100 nodes, 3 servers: 2 to 3 minutes.
            let d = rebalance_delay(REBALANCE_MIN, 3, 100, &mut rng);
            assert!(
                d >= Duration::from_secs(120) && d <= Duration::from_secs(180),
                "{d:?}"
            );
            // 10,000 nodes: 3,333 per server × 15.625 ms = 52 s, under the minimum.
            let d = rebalance_delay(REBALANCE_MIN, 3, 10_000, &mut rng);
            assert!(
                d >= Duration::from_secs(120) && d <= Duration::from_secs(180),
                "{d:?}"
            );
            // 100,000 nodes: 33,333 per server × 15.625 ms = 520.8 s.
            let d = rebalance_delay(REBALANCE_MIN, 3, 100_000, &mut rng);
            assert!((d.as_secs_f64() - 520.83).abs() < 0.01, "{d:?}");
        }
        // A shortened minimum for tests keeps the shape.
        let d = rebalance_delay(Duration::from_secs(2), 3, 100, &mut rng);
        assert!(d >= Duration::from_secs(2) && d <= Duration::from_secs(3));
    }

    #[test]
    fn the_board_counts_sessions_per_server() {
        let b = ServerBoard::new(vec!["a".into(), "b".into()]);
        b.up(0);
        b.up(1);
        b.up(1);
        b.down(1);
        b.up(9); // not a server of the run: ignored
        assert_eq!(
            b.counts(),
            ServerCounts {
                held: vec![1, 1],
                connects: vec![1, 2]
            }
        );
    }

    #[test]
    fn rebalancing_spreads_agents_over_every_server() {
        let mut rng = fastrand::Rng::with_seed(5);
        let mut on = [0; 3];
        for seed in 0..3000 {
            let mut r = Router::new(3, seed);
            r.rebalance(&mut rng);
            on[r.current()] += 1;
        }
        assert!(on.iter().all(|n| (900..=1100).contains(n)), "{on:?}");
    }
}
