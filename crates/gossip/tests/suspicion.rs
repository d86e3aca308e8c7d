//! memberlist's suspicion of a server, as the pool's members hold it, on
//! paused time against a stand-in server on 127.0.0.1 listing ten other
//! members (a pool of 12: suspicion lasts 4.316 s to 25.896 s, two
//! confirmations awaited), the pool simulating one member (whose own
//! timeouts never confirm its own suspicion): a server that stops acking
//! is suspected, then failed when its suspicion runs out, and no longer
//! probed; another member's `suspect` shortens the suspicion; a `dead`
//! from another member fails it at once, serf's reconnect joins it again,
//! and an `alive` with a higher incarnation (its refutation) brings it
//! back (a return); a leave is a leave, not a failure. The agents hear each of these through `Pool::news`.
//! And the other way: a member's ack to a server's probe is timed from the
//! ping's arrival.

use std::time::Duration;

use crate::member_server::MemberServer;
use agent_sim_gossip::serf::{self, intent};
use agent_sim_gossip::wire::kind;
use agent_sim_gossip::wire::msgs::{Alive, Verdict};
use agent_sim_gossip::{News, Pool, PoolConfig, Security, Timings, names};
use agent_sim_metrics::Metrics;
use tokio::sync::watch;
use tokio::time::{Instant, timeout};

/// Long enough for anything the tests wait for; on paused time, free.
const BOUND: Duration = Duration::from_secs(120);
/// The suspicion's bounds in a pool of 12: 4 × log10(12) s (the scale in
/// thousandths, as memberlist keeps it), and 6 times that.
const MIN: Duration = Duration::from_millis(4_316);
const MAX: Duration = Duration::from_millis(25_896);
/// How much later than the suspicion's start the server can hear it (the
/// next gossip round), and the ticker's period.
const HEARD_AFTER: Duration = Duration::from_millis(200);
const TICK: Duration = Duration::from_millis(100);

/// A pool of one member, `m0`, joined to `server`.
async fn pool_of(server: &MemberServer) -> (Pool, Metrics, std::net::SocketAddr) {
    let metrics = Metrics::new(&agent_sim_gossip::metrics_spec(), 2);
    let cfg = PoolConfig {
        bind: vec!["127.0.0.1:0".parse().unwrap()],
        join: vec![server.join],
        security: Security::default(),
        tags: vec![("role".into(), "node".into()), ("dc".into(), "dc1".into())],
        timings: Timings::default(),
    };
    let pool = Pool::start(cfg, metrics.clone()).await.unwrap();
    let (slot, at) = pool.add("m0", "id-0", 0);
    pool.join(slot).await.unwrap();
    (pool, metrics, at)
}

fn verdict(t: u8, incarnation: u32, from: &str) -> Vec<u8> {
    let mut b = Vec::new();
    Verdict {
        incarnation,
        node: "srv",
        from,
    }
    .encode(t, &mut b);
    b
}

fn about_srv(body: &[u8]) -> bool {
    Verdict::decode(body).is_ok_and(|v| v.node == "srv")
}

/// Waits until the server is (or is not) alive in the news; when.
async fn alive_is(news: &mut watch::Receiver<News>, alive: bool) -> Instant {
    timeout(BOUND, news.wait_for(|n| n.servers[0].alive == alive))
        .await
        .expect("in time")
        .unwrap();
    Instant::now()
}

fn count(metrics: &Metrics, name: &str) -> u64 {
    metrics.get(metrics.counter(name))
}

/// The timeout after `c` of `k` confirmations, as memberlist computes it.
fn after_confirmations(c: u32, k: u32) -> Duration {
    let frac = f64::from(c + 1).ln() / f64::from(k + 1).ln();
    let raw = MAX.as_secs_f64() - frac * (MAX - MIN).as_secs_f64();
    Duration::from_millis((raw * 1000.0).floor() as u64)
}

#[tokio::test(start_paused = true)]
async fn a_server_that_stops_acking_is_suspected_then_failed_and_probed_no_more() {
    let mut server = MemberServer::start(Security::default(), 10, 0).await;
    let (pool, metrics, _) = pool_of(&server).await;
    let mut news = pool.news();
    server.stop_acking();
    let heard = timeout(BOUND, server.next_of(kind::SUSPECT, about_srv));
    let suspected = heard.await.unwrap().at;
    assert_eq!(pool.suspected_servers(), 1);
    assert!(news.borrow().servers[0].alive, "a suspect is alive in serf");
    let failed = alive_is(&mut news, false).await;
    let took = failed - suspected;
    assert!(
        took + HEARD_AFTER >= MAX && took <= MAX + TICK,
        "failed {took:?} after the suspicion (max {MAX:?})"
    );
    assert_eq!(count(&metrics, names::SERVERS_SUSPECTED), 1);
    assert_eq!(count(&metrics, names::SERVERS_FAILED), 1);
    // memberlist probes only alive and suspect members.
    let after = server.until(failed + Duration::from_secs(30)).await;
    let pings = after
        .iter()
        .filter(|h| h.t == kind::PING && h.at > failed)
        .count();
    assert_eq!(pings, 0, "a dead server is not probed");
    assert_eq!(pool.waiting(), 0);
    pool.stop();
}

#[tokio::test(start_paused = true)]
async fn another_members_suspect_shortens_the_suspicion() {
    let mut server = MemberServer::start(Security::default(), 10, 0).await;
    let (pool, _, at) = pool_of(&server).await;
    let mut news = pool.news();
    server.stop_acking();
    let heard = timeout(BOUND, server.next_of(kind::SUSPECT, about_srv));
    let suspected = heard.await.unwrap().at;
    server.send(at, &verdict(kind::SUSPECT, 1, "c-3")).await;
    let failed = alive_is(&mut news, false).await;
    let took = failed - suspected;
    let want = after_confirmations(1, 2);
    assert!(want < MAX - Duration::from_secs(10), "{want:?}");
    assert!(
        took + HEARD_AFTER >= want && took <= want + TICK,
        "failed {took:?} after the suspicion, {want:?} expected"
    );
    pool.stop();
}

#[tokio::test(start_paused = true)]
async fn a_dead_server_is_back_with_a_higher_incarnation() {
    let mut server = MemberServer::start(Security::default(), 10, 0).await;
    let (pool, metrics, at) = pool_of(&server).await;
    let mut news = pool.news();
    // Another member's dead message: failed at once.
    server.send(at, &verdict(kind::DEAD, 1, "c-1")).await;
    let failed = alive_is(&mut news, false).await;
    // The ticker counts it at its next tick.
    tokio::time::sleep_until(failed + TICK * 2).await;
    assert_eq!(count(&metrics, names::SERVERS_FAILED), 1);
    // serf's reconnect: the pool's share (1 member of 11 alive) of one
    // join a 30 s, each answered; the server refutes its death then.
    let rejoined = async {
        loop {
            let (at, join) = server.next_push_pull().await;
            if join && at > failed {
                return;
            }
        }
    };
    timeout(Duration::from_secs(1_000), rejoined)
        .await
        .expect("a reconnect");
    let meta = serf::encode_tags(&[("role", "consul"), ("dc", "dc1"), ("port", "8300")]);
    let mut alive = Vec::new();
    Alive {
        incarnation: 2,
        node: "srv",
        addr: &[127, 0, 0, 1],
        port: server.join.port(),
        meta: &meta,
        vsn: &[1, 5, 2, 2, 5, 4],
    }
    .encode(&mut alive);
    server.send(at, &alive).await;
    let back = alive_is(&mut news, true).await;
    let n = news.borrow().clone();
    assert_eq!((n.servers.len(), n.servers[0].returns), (1, 1));
    tokio::time::sleep_until(back + TICK * 2).await;
    assert_eq!(count(&metrics, names::SERVERS_RETURNED), 1);
    // Probed again.
    let ping = timeout(BOUND, server.next_of(kind::PING, |_| true));
    assert!(ping.await.unwrap().at >= back);
    pool.stop();
}

#[tokio::test(start_paused = true)]
async fn a_server_that_leaves_is_left_not_failed() {
    let server = MemberServer::start(Security::default(), 10, 0).await;
    let (pool, metrics, at) = pool_of(&server).await;
    let mut news = pool.news();
    let mut leave = Vec::new();
    intent(true, 9, "srv", &mut leave);
    server.send(at, &leave).await;
    server.send(at, &verdict(kind::DEAD, 1, "srv")).await;
    let left = alive_is(&mut news, false).await;
    // A tick later the tally is counted: a leave, no failure.
    tokio::time::sleep_until(left + TICK * 2).await;
    assert_eq!(count(&metrics, names::SERVERS_FAILED), 0);
    assert_eq!(count(&metrics, names::SERVERS_SUSPECTED), 0);
    pool.stop();
}

/// A server's probe of a member is acked, and the pool records how long
/// after the ping came (kernel stamp to send): one sample, well within
/// memberlist's 500 ms, nothing warned. Real time: the kernel stamps.
#[tokio::test]
async fn a_members_ack_is_timed_from_the_pings_arrival() {
    let mut server = MemberServer::start(Security::default(), 10, 0).await;
    let (pool, metrics, at) = pool_of(&server).await;
    let mut ping = Vec::new();
    agent_sim_gossip::wire::msgs::Ping {
        seq: 4242,
        node: "m0",
        source_addr: &[127, 0, 0, 1],
        source_port: server.join.port(),
        source_node: "srv",
    }
    .encode(&mut ping);
    server.send(at, &ping).await;
    let is_ours =
        |b: &[u8]| agent_sim_gossip::wire::msgs::Ack::decode(b).is_ok_and(|a| a.seq == 4242);
    timeout(Duration::from_secs(10), server.next_of(kind::ACK, is_ours))
        .await
        .expect("acked");
    metrics.collect();
    let h = metrics.cumulative_of(names::ACK_DELAY).expect("declared");
    assert_eq!(h.len(), 1, "one ack timed");
    assert!(h.max() < 500_000, "{} µs", h.max());
    assert!(metrics.warning_report().is_empty());
    pool.stop();
}
