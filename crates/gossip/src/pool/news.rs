//! What the pool heard about the servers, for the agents that act on it
//! as a real agent's serf handler does ([`News`], watched through
//! `Pool::news`): `consul:new-leader` events, and each server's comings and
//! goings (first seen, failed or left, back). And the tally of the same
//! for the run's counters, which the ticker takes.

use std::collections::HashMap;
use std::net::SocketAddr;

use tokio::sync::watch;

/// A Consul server's RPC port when its `port` tag is absent.
pub const RPC_PORT: u16 = 8300;

/// What the pool heard about the servers that a real agent's serf handler acts on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct News {
    /// `consul:new-leader` user events taken in (each once).
    pub new_leaders: u64,
    /// The servers the pool has seen, in the order first seen.
    pub servers: Vec<ServerNews>,
}

/// One server as the pool has seen it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerNews {
    /// Its RPC address: the member's IP and its `port` tag (8300 when absent).
    pub rpc: std::net::SocketAddr,
    /// Alive in serf's view (false: failed or left).
    pub alive: bool,
    /// Times it came alive again after the pool saw it failed or left.
    pub returns: u64,
}

/// A server's RPC address: its gossip IP and its `port` tag.
pub fn rpc_of(gossip: SocketAddr, tags: &[(String, String)]) -> SocketAddr {
    let port = tags
        .iter()
        .find(|(k, _)| k == "port")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(RPC_PORT);
    SocketAddr::new(gossip.ip(), port)
}

/// Counts since the ticker last took them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// User events taken in.
    pub user_events: u64,
    /// Servers suspected.
    pub suspected: u64,
    /// Servers declared failed (a suspicion's end, or a `dead` from
    /// another member).
    pub failed: u64,
    /// Servers alive again after failed or left.
    pub returned: u64,
}

/// Where the news is kept and sent from (the view holds it).
#[derive(Debug)]
pub struct Desk {
    tx: watch::Sender<News>,
    /// Each server's place in `News::servers`, by remote index.
    at: HashMap<usize, usize>,
    /// Counts for the run's counters.
    pub tally: Tally,
}

impl Default for Desk {
    fn default() -> Self {
        Desk {
            tx: watch::channel(News::default()).0,
            at: HashMap::new(),
            tally: Tally::default(),
        }
    }
}

impl Desk {
    /// A receiver of the news, current at once.
    pub fn subscribe(&self) -> watch::Receiver<News> {
        self.tx.subscribe()
    }

    /// The news as it stands.
    pub fn now(&self) -> News {
        self.tx.borrow().clone()
    }

    /// A `consul:new-leader` event taken in.
    pub fn new_leader(&mut self) {
        self.tx.send_modify(|n| n.new_leaders += 1);
    }

    /// Server `remote` seen alive at `rpc`: first seen, or back after it
    /// failed or left (a return).
    pub fn up(&mut self, remote: usize, rpc: SocketAddr) {
        let at = self.at.get(&remote).copied();
        let mut back = false;
        self.tx.send_if_modified(|n| match at {
            None => {
                n.servers.push(ServerNews {
                    rpc,
                    alive: true,
                    returns: 0,
                });
                true
            }
            Some(i) => {
                let s = &mut n.servers[i];
                let changed = !s.alive || s.rpc != rpc;
                if !s.alive {
                    s.returns += 1;
                    back = true;
                }
                s.alive = true;
                s.rpc = rpc;
                changed
            }
        });
        if at.is_none() {
            self.at.insert(remote, self.tx.borrow().servers.len() - 1);
        }
        if back {
            self.tally.returned += 1;
        }
    }

    /// Server `remote` failed or left.
    pub fn down(&mut self, remote: usize) {
        let Some(&i) = self.at.get(&remote) else {
            return;
        };
        self.tx.send_if_modified(|n| {
            let was = n.servers[i].alive;
            n.servers[i].alive = false;
            was
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_are_listed_once_in_the_order_seen_and_returns_counted() {
        let mut d = Desk::default();
        let mut rx = d.subscribe();
        let a: SocketAddr = "10.0.0.1:8300".parse().unwrap();
        let b: SocketAddr = "10.0.0.2:8300".parse().unwrap();
        d.up(4, a);
        d.up(1, b);
        assert!(rx.has_changed().unwrap());
        rx.mark_unchanged();
        d.up(4, a);
        assert!(!rx.has_changed().unwrap(), "nothing new");
        d.down(4);
        d.up(4, a);
        d.new_leader();
        let n = rx.borrow_and_update().clone();
        assert_eq!(n.new_leaders, 1);
        assert_eq!(n.servers.len(), 2);
        assert_eq!(n.servers[0].rpc, a);
        assert_eq!((n.servers[0].alive, n.servers[0].returns), (true, 1));
        assert_eq!(d.tally.returned, 1);
    }

    #[test]
    fn the_rpc_port_is_the_port_tag() {
        let g: SocketAddr = "10.0.0.1:8301".parse().unwrap();
        let tags = vec![("port".to_string(), "9300".to_string())];
        assert_eq!(rpc_of(g, &tags), "10.0.0.1:9300".parse().unwrap());
        assert_eq!(rpc_of(g, &[]), "10.0.0.1:8300".parse().unwrap());
    }
}
