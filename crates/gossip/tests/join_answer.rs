//! A member's join answered with a member list far larger than a cluster
//! sends (50 MiB): the pool reads it as it arrives, counts its bytes and
//! never holds it (the heap the whole process, server included, holds at
//! once while it arrives stays within a few of the pool's 16 KiB windows).
//! An encrypted answer past memberlist's 20 MiB is refused from its
//! header, a counted failed join.
//!
//! Its own test binary: the heap is measured by a counting global
//! allocator, on the one thread the pool and the server run on.

use std::time::Duration;

use crate::fake_server::{FakeServer, JoinAnswer};
use agent_sim_gossip::{JoinError, Keyring, Pool, PoolConfig, Security, Timings, names};
use agent_sim_metrics::Metrics;
use agent_sim_testkit::alloc::{CountingAlloc, peak_during};
use tokio::runtime::Runtime;
use tokio::time::timeout;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// The bytes of the member list the server answers a join with.
const BULK: u64 = 50 << 20;
/// The most heap the join may hold at once while it arrives.
const HEAP_BOUND: usize = 256 << 10;
/// Each join's deadline in the test (the pool's own is `tcp_timeout`).
const WITHIN: Duration = Duration::from_secs(60);

/// One thread for the pool and the server: the allocator counts per thread.
fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A pool started on `server` (the hello answered as usual), the server
/// then told to answer joins `how`.
fn pool_on(rt: &Runtime, sec: Security, how: JoinAnswer) -> (FakeServer, Pool, Metrics) {
    let server = rt.block_on(FakeServer::start_with(sec.clone()));
    let metrics = Metrics::new(&agent_sim_gossip::metrics_spec(), 1);
    let cfg = PoolConfig {
        bind: vec!["127.0.0.1:0".parse().unwrap()],
        join: vec![server.join],
        security: sec,
        tags: vec![("role".into(), "node".into()), ("dc".into(), "dc1".into())],
        timings: Timings::default(),
    };
    let pool = rt.block_on(Pool::start(cfg, metrics.clone())).unwrap();
    server.answer_joins(how);
    (server, pool, metrics)
}

#[test]
fn a_50_mib_join_answer_is_read_as_it_arrives_counted_and_not_held() {
    let rt = runtime();
    let (_server, pool, metrics) =
        pool_on(&rt, Security::default(), JoinAnswer::Bulk(BULK as usize));
    let (slot, _) = pool.add("m0", "id-0", 0);
    let (joined, peak) =
        peak_during(|| rt.block_on(async { timeout(WITHIN, pool.join(slot)).await }));
    joined
        .expect("the join ends in time")
        .expect("the join is taken");
    assert!(pool.is_member(slot));
    let got = metrics.get(metrics.counter(names::JOIN_ANSWER_BYTES));
    assert!(
        (BULK..BULK + (1 << 20)).contains(&got),
        "{got} bytes counted"
    );
    assert!(metrics.get(metrics.counter(names::BYTES_RECEIVED)) >= got);
    assert_eq!(metrics.get(metrics.counter(names::JOINS)), 1);
    assert!(
        peak < HEAP_BOUND,
        "{peak} bytes held at once for a {BULK}-byte answer"
    );
    pool.stop();
}

#[test]
fn an_encrypted_join_answer_past_the_limit_is_refused_from_its_header_and_counted() {
    let key = "pUqJrVyVRj5jsiYEkM/tFQYfWyJIv4s3XkvDwy7Cu5s=";
    let sec = Security {
        label: String::new(),
        keyring: Some(Keyring::from_base64(&[key]).unwrap()),
    };
    let rt = runtime();
    let (_server, pool, metrics) = pool_on(&rt, sec, JoinAnswer::Oversized);
    let (slot, _) = pool.add("m0", "id-0", 0);
    let (joined, peak) =
        peak_during(|| rt.block_on(async { timeout(WITHIN, pool.join(slot)).await }));
    let e = joined.expect("the join ends in time").unwrap_err();
    assert!(matches!(e, JoinError::Exchange(_)), "{e:?}");
    assert!(e.to_string().contains("larger than 20971520 bytes"), "{e}");
    let failed = metrics.snapshot().errors.get(e.kind().unwrap()).copied();
    assert_eq!(failed, Some(1));
    assert_eq!(e.kind(), Some(agent_sim_gossip::JOIN_FAILED.kind));
    // Only the frame's header was waited for.
    let got = metrics.get(metrics.counter(names::JOIN_ANSWER_BYTES));
    assert_eq!(got, 5);
    assert!(!pool.is_member(slot));
    assert!(peak < HEAP_BOUND, "{peak} bytes held at once");
    pool.stop();
}
