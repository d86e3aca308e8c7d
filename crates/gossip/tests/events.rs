//! serf's user events and queries as the pool's members take them in, on
//! paused time against a stand-in server on 127.0.0.1: a
//! `consul:new-leader` event is news once (again or from before the join:
//! not), and is passed back to the servers a bounded number of times; a
//! query is acked by each simulated member from its own name, once, as
//! its filters say; `_serf_conflict` is answered by all but the member
//! named; the keyring queries list the pool's keys and change them for
//! real (the key it encrypts with, the keys that open what it receives).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use crate::member_server::MemberServer;
use agent_sim_gossip::serf::event::{NEW_LEADER, UserEvent};
use agent_sim_gossip::serf::keys::{self, KeyResponse, status};
use agent_sim_gossip::serf::query::{FLAG_ACK, Filter, Query, QueryResponse};
use agent_sim_gossip::wire::kind;
use agent_sim_gossip::{Keyring, Pool, PoolConfig, Security, Timings, names};
use agent_sim_metrics::Metrics;
use base64::Engine;
use tokio::time::{Instant, timeout};

const KEY1: &str = "pUqJrVyVRj5jsiYEkM/tFQYfWyJIv4s3XkvDwy7Cu5s=";
const KEY2: &str = "BwcHBwcHBwcHBwcHBwcHBw==";

/// Long enough for anything the tests wait for; on paused time, free.
const BOUND: Duration = Duration::from_secs(60);

fn security(keys: &[&str]) -> Security {
    Security {
        label: String::new(),
        keyring: (!keys.is_empty()).then(|| Keyring::from_base64(keys).unwrap()),
    }
}

fn raw(key: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(key)
        .unwrap()
}

/// A pool joined to `server` with members `m0`..: the pool, its metrics,
/// and the address its members listen on.
async fn pool_of(server: &MemberServer, n: u64, sec: Security) -> (Pool, Metrics, SocketAddr) {
    let metrics = Metrics::new(&agent_sim_gossip::metrics_spec(), 2);
    let cfg = PoolConfig {
        bind: vec!["127.0.0.1:0".parse().unwrap()],
        join: vec![server.join],
        security: sec,
        tags: vec![("role".into(), "node".into()), ("dc".into(), "dc1".into())],
        timings: Timings::default(),
    };
    let pool = Pool::start(cfg, metrics.clone()).await.unwrap();
    let mut at = None;
    for i in 0..n {
        let (slot, addr) = pool.add(&format!("m{i}"), &format!("id-{i}"), i);
        pool.join(slot).await.unwrap();
        at = Some(addr);
    }
    (pool, metrics, at.unwrap())
}

fn event(ltime: u64, name: &str, payload: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    UserEvent {
        ltime,
        name,
        payload,
        cc: false,
    }
    .encode(&mut b);
    b
}

/// A query from the server, answered to its own address.
fn query(server: &MemberServer, id: u32, name: &str, payload: &[u8], flags: u32) -> Vec<u8> {
    query_filtered(server, id, name, payload, flags, Vec::new())
}

fn query_filtered(
    server: &MemberServer,
    id: u32,
    name: &str,
    payload: &[u8],
    flags: u32,
    filters: Vec<&[u8]>,
) -> Vec<u8> {
    let mut b = Vec::new();
    Query {
        ltime: u64::from(id),
        id,
        addr: &[127, 0, 0, 1],
        port: server.join.port(),
        source_node: "srv",
        filters,
        flags,
        relay_factor: 0,
        timeout: Duration::from_secs(2),
        name,
        payload,
    }
    .encode(&mut b);
    b
}

/// The event of `name` at `ltime` in a serf message body, if it is one.
fn is_event(body: &[u8], ltime: u64, name: &str) -> bool {
    matches!(UserEvent::decode(body), Ok(Some(e)) if e.ltime == ltime && e.name == name)
}

/// The answers to query `id` received until `until`: acks and responses,
/// by member name.
async fn answers(
    server: &mut MemberServer,
    id: u32,
    until: Instant,
) -> (BTreeMap<String, u32>, BTreeMap<String, Vec<u8>>) {
    let (mut acks, mut responses) = (BTreeMap::new(), BTreeMap::new());
    for h in server.until(until).await {
        if h.t != kind::USER {
            continue;
        }
        let Ok(Some(r)) = QueryResponse::decode(&h.body) else {
            continue;
        };
        if r.id != id {
            continue;
        }
        if r.flags & FLAG_ACK != 0 {
            *acks.entry(r.from.to_string()).or_insert(0) += 1;
        } else {
            let old = responses.insert(r.from.to_string(), r.payload.to_vec());
            assert!(old.is_none(), "{} answered twice", r.from);
        }
    }
    (acks, responses)
}

#[tokio::test(start_paused = true)]
async fn a_new_leader_event_is_news_once_and_passed_back_a_bounded_number_of_times() {
    let mut server = MemberServer::start(Security::default(), 0, 5).await;
    let (pool, metrics, at) = pool_of(&server, 3, Security::default()).await;
    let mut news = pool.news();
    {
        let n = news.borrow_and_update();
        assert_eq!(n.new_leaders, 0);
        assert_eq!(n.servers.len(), 1);
        assert_eq!(n.servers[0].rpc, "127.0.0.1:8300".parse().unwrap());
        assert!(n.servers[0].alive);
    }
    server.send(at, &event(5, NEW_LEADER, b"srv")).await;
    timeout(BOUND, news.changed()).await.unwrap().unwrap();
    assert_eq!(news.borrow_and_update().new_leaders, 1);
    // Again, and one from before the pool's join (the join answer's event
    // clock was 5): neither is news. Then a marker, taken in after them.
    server.send(at, &event(5, NEW_LEADER, b"srv")).await;
    server.send(at, &event(3, NEW_LEADER, b"old")).await;
    server.send(at, &event(6, "marker", b"")).await;
    let mut heard = Vec::new();
    let first = loop {
        let h = timeout(BOUND, server.next()).await.unwrap();
        heard.push(h.clone());
        if h.t == kind::USER && is_event(&h.body, 6, "marker") {
            break h.at;
        }
    };
    assert_eq!(pool.news().borrow().new_leaders, 1);
    // Every copy passed back within a few gossip rounds.
    heard.extend(server.until(first + Duration::from_secs(10)).await);
    let copies = |ltime, name| {
        heard
            .iter()
            .filter(|h| h.t == kind::USER && is_event(&h.body, ltime, name))
            .count()
    };
    // 4 members: memberlist's limit is 4 × ceil(log10(5)) = 4 sends.
    let leader = copies(5, NEW_LEADER);
    assert!((1..=4).contains(&leader), "{leader} copies");
    assert_eq!(copies(3, NEW_LEADER), 0, "an old event is not passed on");
    let marker = copies(6, "marker");
    assert!(marker <= 4, "{marker} copies");
    assert_eq!(metrics.get(metrics.counter(names::USER_EVENTS)), 2);
    pool.stop();
}

#[tokio::test(start_paused = true)]
async fn a_ping_query_is_acked_once_by_each_member_in_its_own_name() {
    let mut server = MemberServer::start(Security::default(), 0, 0).await;
    let (pool, metrics, at) = pool_of(&server, 3, Security::default()).await;
    let q = query(&server, 42, keys::PING, b"", FLAG_ACK);
    server.send(at, &q).await;
    server.send(at, &q).await;
    let (acks, responses) = answers(&mut server, 42, Instant::now() + BOUND).await;
    let want: BTreeMap<String, u32> = ["m0", "m1", "m2"].map(|m| (m.into(), 1)).into();
    assert_eq!(acks, want, "each member acks once");
    assert!(
        responses.is_empty(),
        "serf answers a ping with its ack only"
    );
    assert_eq!(metrics.get(metrics.counter(names::QUERIES_ANSWERED)), 3);
    pool.stop();
}

#[tokio::test(start_paused = true)]
async fn filters_choose_who_answers_and_a_conflict_is_answered_by_the_others() {
    let mut server = MemberServer::start(Security::default(), 0, 0).await;
    let (pool, _, at) = pool_of(&server, 3, Security::default()).await;
    let mut only_m1 = Vec::new();
    Filter::Nodes(vec!["m1"]).encode(&mut only_m1);
    let q = query_filtered(&server, 7, "consul:custom", b"", FLAG_ACK, vec![&only_m1]);
    server.send(at, &q).await;
    let (acks, responses) = answers(&mut server, 7, Instant::now() + BOUND).await;
    assert_eq!(acks.keys().collect::<Vec<_>>(), ["m1"]);
    assert!(
        responses.is_empty(),
        "Consul's own queries get the ack only"
    );
    server
        .send(at, &query(&server, 8, keys::CONFLICT, b"m0", 0))
        .await;
    let (acks, responses) = answers(&mut server, 8, Instant::now() + BOUND).await;
    assert!(acks.is_empty());
    assert_eq!(responses.keys().collect::<Vec<_>>(), ["m1", "m2"]);
    for payload in responses.values() {
        let m = keys::decode_conflict(payload).unwrap();
        assert_eq!(m, Some(("m0", status::ALIVE)));
    }
    pool.stop();
}

/// The keyring answers to query `id`, one per member.
async fn key_answers(server: &mut MemberServer, id: u32) -> Vec<KeyResponse> {
    let (_, responses) = answers(server, id, Instant::now() + BOUND).await;
    assert_eq!(responses.len(), 3, "{responses:?}");
    let all: Vec<KeyResponse> = responses
        .values()
        .map(|p| KeyResponse::decode(p).unwrap())
        .collect();
    assert!(all.iter().all(|r| r == &all[0]), "{all:?}");
    all
}

fn key_request(key: &str) -> Vec<u8> {
    let mut b = Vec::new();
    keys::encode_key_request(&raw(key), &mut b);
    b
}

#[tokio::test(start_paused = true)]
async fn the_keyring_queries_list_and_change_the_pools_keys() {
    // The server opens with either key and seals with the first.
    let mut server = MemberServer::start(security(&[KEY1, KEY2]), 0, 0).await;
    let (pool, metrics, at) = pool_of(&server, 3, security(&[KEY1])).await;
    server
        .send(at, &query(&server, 1, keys::LIST_KEYS, b"", 0))
        .await;
    let list = &key_answers(&mut server, 1).await[0];
    assert!(list.result);
    assert_eq!(
        (list.keys.clone(), list.primary.as_str()),
        (vec![KEY1.to_string()], KEY1)
    );
    let install = query(&server, 2, keys::INSTALL_KEY, &key_request(KEY2), 0);
    server.send(at, &install).await;
    assert!(key_answers(&mut server, 2).await[0].result);
    assert_eq!(pool.keys(), vec![raw(KEY1), raw(KEY2)]);
    let use2 = query(&server, 3, keys::USE_KEY, &key_request(KEY2), 0);
    server.send(at, &use2).await;
    assert!(key_answers(&mut server, 3).await[0].result);
    // The server turns to the new key too, as the whole cluster does.
    server.seal_with(security(&[KEY2, KEY1]));
    // The pool seals with the new primary now: a packet of it opens with
    // KEY2 alone, not with KEY1 alone.
    let h = timeout(BOUND, server.next_of(kind::PING, |_| true))
        .await
        .unwrap();
    assert!(security(&[KEY2]).open_packet(&h.packet).is_ok());
    assert!(security(&[KEY1]).open_packet(&h.packet).is_err());
    let remove2 = query(&server, 4, keys::REMOVE_KEY, &key_request(KEY2), 0);
    server.send(at, &remove2).await;
    let refused = &key_answers(&mut server, 4).await[0];
    assert!(!refused.result);
    assert_eq!(refused.message, "Removing the primary key is not allowed");
    let remove1 = query(&server, 5, keys::REMOVE_KEY, &key_request(KEY1), 0);
    server.send(at, &remove1).await;
    assert!(key_answers(&mut server, 5).await[0].result);
    assert_eq!(pool.keys(), vec![raw(KEY2)]);
    // What KEY1 seals no longer opens: counted, not taken in.
    let old = event(9, NEW_LEADER, b"srv");
    server.send_sealed(at, &old, &security(&[KEY1])).await;
    server.send(at, &event(10, "marker", b"")).await;
    timeout(
        BOUND,
        server.next_of(kind::USER, |b| is_event(b, 10, "marker")),
    )
    .await
    .unwrap();
    assert_eq!(pool.news().borrow().new_leaders, 0);
    assert!(
        metrics
            .error_sample(agent_sim_gossip::BAD_KEY.kind)
            .is_some()
    );
    pool.stop();
}
