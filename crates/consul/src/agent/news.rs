//! What gossip tells an agent about its servers, and what a Consul 1.20
//! client agent does about it (`lanEventHandler` in `client_serf.go`, the
//! router manager, `agent/ae`):
//!
//! - a server that failed or left leaves the router's list
//!   (`RemoveServer`): no call and no dial goes to it while gossip holds it
//!   dead;
//! - a server that joins, or comes back, is appended at the list's end
//!   (`AddServer`) and triggers a full anti-entropy sync (`ServerUp`);
//! - the new leader's `consul:new-leader` user event triggers one too.
//!
//! A triggered sync waits a random part of `serverUpInterval` (3 s) times
//! the cluster's scale factor, as Consul staggers it (0–24 s at 10,000
//! nodes): a leader change is a wave of catalog reads over the stagger.
//!
//! Each session holds one [`NewsWatch`]: the wait for the pool's next news,
//! and the counts it has acted on. A new session takes the servers' state
//! as it stands without a sync (its own first sync covers it).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use agent_sim_gossip::News;
use tokio::sync::watch;
use tokio::time::Instant;

use super::ConsulAgent;
use super::upkeep::{AE_SERVER_UP, Sched, stagger};

/// The wait for the next change, holding the receiver it gives back.
type Changed = Pin<Box<dyn Future<Output = watch::Receiver<News>> + Send>>;

/// A session's watch on the pool's news.
pub(super) struct NewsWatch {
    next: Changed,
}

/// What news an agent has acted on (kept by the agent, across its
/// sessions; wrapping counts, compared for a change only).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Seen {
    /// New-leader events.
    leaders: u16,
    /// Returns of the agent's servers.
    returns: u16,
    /// Taken once: what came before the agent's first look is not news to
    /// it (a real agent joins with serf's `ignoreOld`).
    taken: bool,
}

fn changed(mut rx: watch::Receiver<News>) -> Changed {
    Box::pin(async move {
        if rx.changed().await.is_err() {
            // The pool stopped: there is no more news.
            std::future::pending::<()>().await;
        }
        rx
    })
}

impl NewsWatch {
    /// The news changed (the receiver, to read it and wait again).
    pub(super) fn poll(&mut self, tcx: &mut Context<'_>) -> Poll<watch::Receiver<News>> {
        self.next.as_mut().poll(tcx)
    }
}

/// What the router did to follow the news.
struct Followed {
    leaders: u64,
    returns: u64,
    /// Servers appended (a join the agent had not seen).
    added: u64,
    removed: u64,
}

impl ConsulAgent {
    /// A new session's watch on the pool's news (none without gossip): the
    /// news as it stands is taken (what came between two sessions still
    /// brings its sync).
    pub(super) fn news_watch(&mut self, hs: &mut Sched, now: Instant) -> Option<NewsWatch> {
        let sh = self.shared.clone();
        let rx = sh.gossip.as_ref()?.started()?.news();
        Some(self.on_news(hs, rx, now))
    }

    /// The news changed: the router follows it, and a server's join or
    /// return, or a new leader, brings the next full sync forward to within
    /// Consul's stagger (an earlier one due stays). The watch on the next
    /// change.
    pub(super) fn on_news(
        &mut self,
        hs: &mut Sched,
        mut rx: watch::Receiver<News>,
        now: Instant,
    ) -> NewsWatch {
        let news = rx.borrow_and_update().clone();
        let f = self.follow(&news);
        // Wrapping counts: only a change matters.
        let (leaders, returns) = (f.leaders as u16, f.returns as u16);
        let seen = self.news_seen;
        let up = seen.taken && (leaders != seen.leaders || returns != seen.returns || f.added > 0);
        self.news_seen = Seen {
            leaders,
            returns,
            taken: true,
        };
        let sh = self.shared.clone();
        if up && sh.cfg.register && !hs.server_up_pending {
            let at = now + stagger(AE_SERVER_UP, sh.cfg.cluster_size);
            hs.ae_due = Some(hs.ae_due.map_or(at, |t| t.min(at)));
            hs.server_up_pending = true;
            sh.metrics.incr(sh.ids.syncs_server_up);
        }
        NewsWatch { next: changed(rx) }
    }

    /// The router made to follow gossip's news as it stands, before a
    /// session picks its server: none that gossip holds dead.
    pub(super) fn follow_now(&mut self) {
        let sh = self.shared.clone();
        if let Some(pool) = sh.gossip.as_ref().and_then(|g| g.started()) {
            let news = pool.news().borrow().clone();
            self.follow(&news);
        }
    }

    /// The router made to follow `news` (counted): the agents' servers
    /// gossip holds failed or left off the list, those alive on it.
    fn follow(&mut self, news: &News) -> Followed {
        let sh = self.shared.clone();
        let mut f = Followed {
            leaders: news.new_leaders,
            returns: 0,
            added: 0,
            removed: 0,
        };
        let Some(g) = sh.gossip.as_ref() else {
            return f;
        };
        for (i, s) in g.targets(news) {
            f.returns += s.returns;
            if s.alive {
                f.added += u64::from(self.router.add(i));
            } else if self.router.contains(i) && self.router.len() > 1 {
                self.router.remove(i);
                f.removed += 1;
            }
        }
        sh.metrics.add(sh.ids.router_removes, f.removed);
        sh.metrics.add(sh.ids.router_adds, f.added);
        f
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use agent_sim_fleet::{AgentFactory, Backoff};
    use agent_sim_gossip::ServerNews;
    use agent_sim_metrics::Metrics;

    use super::*;
    use crate::gossip::GossipConfig;
    use crate::{ConsulConfig, ConsulFactory};

    const TARGETS: [&str; 3] = ["127.0.0.1:8300", "127.0.0.2:8300", "127.0.0.3:8300"];

    fn agent() -> (ConsulAgent, Metrics) {
        let m = Metrics::new(
            &crate::metrics_spec().merge(&agent_sim_fleet::metrics_spec()),
            1,
        );
        let cfg = ConsulConfig {
            conn: crate::Connection {
                http_target: "127.0.0.1:8500".into(),
                ..crate::Connection::to(&TARGETS)
            },
            gossip: Some(GossipConfig {
                join: vec!["127.0.0.1:8301".into()],
                join_given: true,
                ..GossipConfig::default()
            }),
            cluster_size: 100,
            ..ConsulConfig::default()
        };
        let f = ConsulFactory::new(cfg, m.clone()).unwrap();
        (f.create(7), m)
    }

    fn sched(now: Instant) -> Sched {
        Sched {
            retry_at: now,
            backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(30)),
            flap_due: None,
            ae_due: None,
            server_up_pending: false,
            coord_due: None,
            ping_due: None,
            ae_answered: false,
            confirm_by_ping: false,
            checking: false,
        }
    }

    /// The pool's news: the three targets (alive or not, returns) and a
    /// server at no target.
    fn news(leaders: u64, alive: [bool; 3], returns: [u64; 3]) -> News {
        let mut servers: Vec<ServerNews> = TARGETS
            .iter()
            .zip(alive.iter().zip(returns))
            .map(|(t, (&alive, returns))| ServerNews {
                rpc: t.parse().unwrap(),
                alive,
                returns,
            })
            .collect();
        servers.push(ServerNews {
            rpc: "127.0.0.9:8300".parse().unwrap(),
            alive: false,
            returns: 4,
        });
        News {
            new_leaders: leaders,
            servers,
        }
    }

    fn count(m: &Metrics, name: &str) -> u64 {
        m.snapshot().counter(name)
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_leader_and_a_servers_return_each_bring_one_staggered_sync() {
        let (mut a, m) = agent();
        let now = Instant::now();
        let (tx, rx) = watch::channel(news(0, [true; 3], [0; 3]));
        let mut hs = sched(now);

        // The servers as they stand: nothing to do.
        a.on_news(&mut hs, rx.clone(), now);
        assert_eq!(hs.ae_due, None);
        assert_eq!(count(&m, crate::names::SYNCS_SERVER_UP), 0);

        // `consul:new-leader`: a full sync within serverUpInterval (3 s
        // at 100 nodes), once for the one event.
        tx.send(news(1, [true; 3], [0; 3])).unwrap();
        a.on_news(&mut hs, rx.clone(), now);
        let due = hs.ae_due.expect("a sync is due");
        assert!(due >= now && due <= now + Duration::from_secs(3), "{due:?}");
        a.on_news(&mut hs, rx.clone(), now);
        assert_eq!(count(&m, crate::names::SYNCS_SERVER_UP), 1);

        // The second target fails: off the list, no call goes to it.
        let second = 1;
        tx.send(news(1, [true, false, true], [0; 3])).unwrap();
        a.on_news(&mut hs, rx.clone(), now);
        assert!(!a.router.contains(second));
        assert_eq!(a.router.len(), 2);
        assert_eq!(count(&m, crate::names::ROUTER_REMOVES), 1);
        assert_eq!(
            count(&m, crate::names::SYNCS_SERVER_UP),
            1,
            "a loss syncs nothing"
        );

        // It comes back before the sync ran: at the end of the list, and
        // the sync already due covers it (Consul's trigger holds one).
        tx.send(news(1, [true; 3], [0, 1, 0])).unwrap();
        a.on_news(&mut hs, rx.clone(), now);
        assert!(a.router.contains(second));
        assert_ne!(a.router.current(), second, "appended, not in front");
        assert_eq!(count(&m, crate::names::ROUTER_ADDS), 1);
        assert_eq!(count(&m, crate::names::SYNCS_SERVER_UP), 1);
        assert_eq!(hs.ae_due, Some(due));

        // Once that sync ran, the next trigger brings another.
        let later = now + Duration::from_secs(10);
        (hs.ae_due, hs.server_up_pending) = (None, false);
        tx.send(news(2, [true; 3], [0, 1, 0])).unwrap();
        a.on_news(&mut hs, rx.clone(), later);
        assert_eq!(count(&m, crate::names::SYNCS_SERVER_UP), 2);
        assert!(hs.ae_due.unwrap() >= later);
    }

    #[tokio::test(start_paused = true)]
    async fn a_return_between_two_looks_still_syncs_and_the_last_server_stays() {
        let (mut a, m) = agent();
        let now = Instant::now();
        let (tx, rx) = watch::channel(news(0, [true; 3], [0; 3]));
        let mut hs = sched(now);
        a.on_news(&mut hs, rx.clone(), now);
        // Failed and back before the agent looked again: the count says so.
        tx.send(news(0, [true; 3], [1, 0, 0])).unwrap();
        a.on_news(&mut hs, rx.clone(), now);
        assert_eq!(count(&m, crate::names::SYNCS_SERVER_UP), 1);
        assert_eq!(a.router.len(), 3);
        // All three failed: the last one stays on the list.
        tx.send(news(0, [false; 3], [1, 0, 0])).unwrap();
        a.on_news(&mut hs, rx, now);
        assert_eq!(a.router.len(), 1);
        assert_eq!(count(&m, crate::names::ROUTER_REMOVES), 2);
    }
}
