//! A server that takes the pool's push-pulls but never acks a probe: the
//! probes time out (counted), the server is suspected (and the suspicion
//! passed on), and nothing waits for an ack past the probe timeout (joins
//! on real time; the probes on paused time). And the pool's close, on
//! paused time: it ends by itself within its `Timings` bound when the
//! server stops answering, and early when it answers, having told it every
//! member's intent, then their leave.

use std::time::Duration;

use crate::fake_server::FakeServer;
use agent_sim_gossip::wire::msgs::state;
use agent_sim_gossip::{Pool, PoolConfig, Security, Timings, names};
use agent_sim_metrics::Metrics;
use tokio::time::{Instant, timeout};

/// A pool joined to `server` with `n` members in, on the default timings.
async fn pool_of(server: &FakeServer, n: u64) -> (Pool, Metrics) {
    let metrics = Metrics::new(&agent_sim_gossip::metrics_spec(), 2);
    let cfg = PoolConfig {
        bind: vec!["127.0.0.1:0".parse().unwrap()],
        join: vec![server.join],
        security: Security::default(),
        tags: vec![("role".into(), "node".into()), ("dc".into(), "dc1".into())],
        timings: Timings::default(),
    };
    let pool = Pool::start(cfg, metrics.clone()).await.unwrap();
    for i in 0..n {
        let (slot, _) = pool.add(&format!("m{i}"), &format!("id-{i}"), i);
        pool.join(slot).await.unwrap();
    }
    assert_eq!(pool.census(), (n as usize, 0, 0));
    (pool, metrics)
}

/// Closes `pool`, failing if it does not end within `bound`; how long it took.
async fn close_within(pool: &Pool, bound: Duration) -> Duration {
    let start = Instant::now();
    timeout(bound + Duration::from_secs(1), pool.close())
        .await
        .expect("the close ends by itself");
    let took = start.elapsed();
    assert!(took <= bound, "took {took:?}, bound {bound:?}");
    took
}

#[tokio::test]
async fn probes_of_a_server_that_never_acks_time_out_and_suspect_it() {
    let server = FakeServer::start().await;
    let (pool, metrics) = pool_of(&server, 10).await;
    tokio::time::pause();
    // 10 members, 1 server: the server gets 10/10 = 1 probe a second.
    for _ in 0..100 {
        tokio::time::advance(Duration::from_millis(100)).await;
        tokio::task::yield_now().await;
    }
    let sent = metrics.get(metrics.counter(names::PROBES));
    let timeouts = metrics.get(metrics.counter(names::PROBE_TIMEOUTS));
    assert!(sent >= 3, "probes sent {sent}");
    // Each probe times out 500 ms after it went; the last may still wait.
    assert!(
        timeouts + 1 >= sent && timeouts >= 2,
        "{timeouts} of {sent}"
    );
    assert_eq!(pool.waiting(), (sent - timeouts) as usize);
    assert!(pool.waiting() <= 1);
    assert_eq!(pool.suspected_servers(), 1);
    pool.stop();
}

#[tokio::test(start_paused = true)]
async fn a_close_ends_within_its_bound_when_the_server_never_answers() {
    let server = FakeServer::start().await;
    let (pool, _) = pool_of(&server, 10).await;
    let t = Timings::default();
    server.go_silent();
    let took = close_within(&pool, t.close_bound(1)).await;
    // Both closing push-pulls were given their whole deadline; no server
    // answered the first, so none was asked whether it took the intents.
    assert!(took >= t.tcp_timeout * 2, "took {took:?}");
    assert!(took < t.tcp_timeout * 2 + t.intent_lead, "took {took:?}");
    assert_eq!(pool.census(), (0, 0, 10));
}

#[tokio::test(start_paused = true)]
async fn a_close_ends_early_when_the_server_answers() {
    let server = FakeServer::start().await;
    let (pool, _) = pool_of(&server, 10).await;
    let t = Timings::default();
    let took = close_within(&pool, t.close_bound(1)).await;
    // No other wait ran to its bound: the gossip went in a round, the
    // push-pulls were answered at once (this server never shows the
    // intents taken, so the leaves waited `intent_lead` for it).
    assert!(took >= t.intent_lead, "took {took:?}");
    assert!(took < t.intent_lead + t.leave_wait, "took {took:?}");
    assert_eq!(pool.census(), (0, 0, 10));
    // The server heard every member's intent (shown alive), then its leave.
    let members: Vec<Vec<u8>> = server
        .heard()
        .iter()
        .map(|pp| {
            let ms = pp.iter().filter(|(name, _)| name.starts_with('m'));
            ms.map(|&(_, st)| st).collect()
        })
        .filter(|states: &Vec<u8>| states.len() == 10)
        .collect();
    let [.., intents, leaves] = &members[..] else {
        panic!("no closing push-pulls: {members:?}");
    };
    assert_eq!(intents, &vec![state::ALIVE; 10]);
    assert_eq!(leaves, &vec![state::LEFT; 10]);
}
