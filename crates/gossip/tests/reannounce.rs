//! A joined member re-announces what its join taught it, as a fresh
//! memberlist member does: the server receives about the retransmit limit
//! times one (its share of each member's `learnt × limit` alive messages)
//! alive messages about the members it listed, never one about the joining
//! member in them, in packets of at most 1,400 bytes spread over gossip
//! rounds; it ends after the last, and at the pool's close.
//!
//! A stand-in server of its own: it answers every push-pull with itself
//! and [`LISTED`] members (and two gone, which a fresh member does not
//! learn), compressed as a real server's streams are; it acks the pool's
//! probes (a server suspected would leave the view's alive members) and
//! counts the alive messages it receives, by member. Joins on real time,
//! the rounds on paused time.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_sim_gossip::serf::{self, SerfState};
use agent_sim_gossip::wire::msgs::{Ack, Alive, NodeState, Ping, PushPull, state};
use agent_sim_gossip::wire::{self, UDP_BUFFER, kind};
use agent_sim_gossip::{Pool, PoolConfig, Security, Timings, names};
use agent_sim_metrics::Metrics;
use agent_sim_testkit::bounded::until;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

/// Alive members the server lists besides itself.
const LISTED: usize = 29;
/// Members that join.
const MEMBERS: u64 = 60;
/// memberlist's limit for a member that knows LISTED + 1 others and itself:
/// 4 × ceil(log10(32)). The model's own broadcasts have the same (the
/// pool never passes 99 members).
const LIMIT: u64 = 8;
/// The bound on anything the test waits for.
const WITHIN: Duration = Duration::from_secs(10);

/// What the server received over UDP.
#[derive(Default)]
struct Heard {
    /// Alive messages, by member.
    alive: HashMap<String, u64>,
    /// The largest datagram.
    largest: usize,
}

/// The stand-in server.
struct Server {
    join: SocketAddr,
    heard: Arc<Mutex<Heard>>,
}

impl Server {
    async fn start() -> Server {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let join = l.local_addr().unwrap();
        let udp = UdpSocket::bind(join).await.unwrap();
        let answer: Arc<[u8]> = Security::default().seal_stream(&answer(join)).into();
        tokio::spawn(async move {
            while let Ok((c, _)) = l.accept().await {
                tokio::spawn(serve(c, answer.clone()));
            }
        });
        let heard = Arc::new(Mutex::new(Heard::default()));
        tokio::spawn(listen(udp, heard.clone()));
        Server { join, heard }
    }

    /// Alive messages received about the members it listed (itself too).
    fn listed(&self) -> u64 {
        let h = self.heard.lock().unwrap();
        h.alive
            .iter()
            .filter(|(name, _)| *name == "srv" || name.starts_with("k-"))
            .map(|(_, n)| n)
            .sum()
    }
}

/// A Consul 1.20.1 client's tags, padded to a large meta (two alive
/// messages a packet: many packets, so the test's counts vary little).
fn client_meta(i: usize) -> Vec<u8> {
    let id = format!("7c1d4f0e-3b2a-4c5d-9e8f-{i:012}");
    let pad = "p".repeat(380);
    serf::encode_tags(&[
        ("role", "node"),
        ("dc", "dc1"),
        ("segment", ""),
        ("id", &id),
        ("vsn", "2"),
        ("vsn_min", "2"),
        ("vsn_max", "3"),
        ("build", "1.20.1:"),
        ("pad", &pad),
    ])
}

/// The server's push-pull: itself at `at`, the listed members, two gone.
fn answer(at: SocketAddr) -> Vec<u8> {
    let server_meta = serf::encode_tags(&[("role", "consul"), ("dc", "dc1")]);
    let names: Vec<String> = (0..LISTED).map(|i| format!("k-{i:02}")).collect();
    let metas: Vec<Vec<u8>> = (0..LISTED).map(client_meta).collect();
    let ip = wire::ip_bytes(at.ip());
    let node = |name, addr, port, meta, st| NodeState {
        name,
        addr,
        port,
        meta,
        incarnation: 1,
        state: st,
        vsn: &[1, 5, 2, 2, 5, 4],
    };
    let mut nodes = vec![node("srv", &ip, at.port(), &server_meta, state::ALIVE)];
    for (name, meta) in names.iter().zip(&metas) {
        nodes.push(node(name, &[10, 0, 0, 1], 8301, meta, state::ALIVE));
    }
    nodes.push(node("gone-0", &[10, 0, 0, 2], 8301, &metas[0], state::DEAD));
    nodes.push(node("gone-1", &[10, 0, 0, 3], 8301, &metas[0], state::LEFT));
    let status = nodes.iter().map(|n| (n.name, 1)).collect();
    let mut user = Vec::new();
    SerfState {
        ltime: 1,
        status,
        ..Default::default()
    }
    .encode(&mut user);
    let mut out = Vec::new();
    PushPull {
        join: false,
        nodes,
        user_state: &user,
    }
    .encode(&mut out);
    out
}

/// One stream: its push-pull read whole, then answered.
async fn serve(mut c: TcpStream, answer: Arc<[u8]>) {
    let (mut buf, mut chunk) = (Vec::new(), [0u8; 4096]);
    loop {
        match c.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if let Ok(Some(_)) = Security::default().open_stream(&buf) {
            break;
        }
    }
    let _ = c.write_all(&answer).await;
}

/// The UDP side: probes acked, alive messages counted.
async fn listen(udp: UdpSocket, heard: Arc<Mutex<Heard>>) {
    let mut buf = vec![0u8; 65_536];
    while let Ok((n, from)) = udp.recv_from(&mut buf).await {
        let Ok(msg) = Security::default().open_packet(&buf[..n]) else {
            continue;
        };
        let mut acks = Vec::new();
        {
            let mut h = heard.lock().unwrap();
            h.largest = h.largest.max(n);
            let _ = wire::each_message(&msg, &mut |t, body| match t {
                kind::ALIVE => {
                    let a = Alive::decode(body).unwrap();
                    *h.alive.entry(a.node.to_string()).or_default() += 1;
                }
                kind::PING => {
                    let mut out = Vec::new();
                    let seq = Ping::decode(body).unwrap().seq;
                    Ack { seq, payload: &[] }.encode(&mut out);
                    acks.push(out);
                }
                _ => {}
            });
        }
        for a in acks {
            let _ = udp.send_to(&a, from).await;
        }
    }
}

/// A pool of `MEMBERS` members joined to `server` (on real time).
async fn joined(server: &Server) -> (Pool, Metrics) {
    let metrics = Metrics::new(&agent_sim_gossip::metrics_spec(), 2);
    let cfg = PoolConfig {
        bind: vec!["127.0.0.1:0".parse().unwrap()],
        join: vec![server.join],
        security: Security::default(),
        tags: serf::client_tags("dc1"),
        timings: Timings::default(),
    };
    let pool = Pool::start(cfg, metrics.clone()).await.unwrap();
    for i in 0..MEMBERS {
        let (slot, _) = pool.add(&format!("m-{i:02}"), &format!("id-{i}"), i);
        pool.join(slot).await.unwrap();
    }
    (pool, metrics)
}

/// One gossip round of paused time, the sockets given their turn.
async fn round() {
    for _ in 0..2 {
        tokio::time::advance(Duration::from_millis(100)).await;
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }
}

#[tokio::test]
async fn the_server_gets_its_share_of_each_members_reannouncement_over_rounds_then_no_more() {
    let server = Server::start().await;
    let (pool, metrics) = joined(&server).await;
    let reannounced = || metrics.get(metrics.counter(names::REANNOUNCED));
    tokio::time::pause();
    // Each member: 30 learnt × 8 sends, 2 a packet, 3 packets a round: 40
    // rounds; a packet goes to the server one time in 30.
    let (mut rounds_sending, mut last) = (0, reannounced());
    for _ in 0..150 {
        round().await;
        let now = reannounced();
        rounds_sending += u64::from(now > last);
        last = now;
    }
    let expected = MEMBERS * LIMIT;
    let got = reannounced();
    assert!(
        got * 100 >= expected * 65 && got * 100 <= expected * 135,
        "{got} alive messages re-announced to the server, about {expected} expected"
    );
    // Spread over the plan's 40 rounds (the first may have gone during
    // the joins, on real time), not sent at once.
    assert!(
        (25..=45).contains(&rounds_sending),
        "sent in {rounds_sending} rounds"
    );
    // Ended: nothing more after its last message.
    for _ in 0..50 {
        round().await;
    }
    assert_eq!(reannounced(), got);
    // All of them arrived, about members the server listed; about the
    // members themselves only the model's own broadcasts (each sent the
    // limit times), nothing of the re-announcements.
    until(WITHIN, "the re-announced messages", async || {
        server.listed() == got
    })
    .await;
    let h = server.heard.lock().unwrap();
    for i in 0..MEMBERS {
        let name = format!("m-{i:02}");
        assert_eq!(h.alive.get(&name), Some(&LIMIT), "{name}");
    }
    assert!(!h.alive.contains_key("gone-0") && !h.alive.contains_key("gone-1"));
    assert!(h.largest <= UDP_BUFFER, "a datagram of {} bytes", h.largest);
    drop(h);
    assert_eq!(pool.suspected_servers(), 0);
    pool.stop();
}

#[tokio::test]
async fn a_closing_pool_stops_reannouncing() {
    let server = Server::start().await;
    let (pool, metrics) = joined(&server).await;
    let reannounced = || metrics.get(metrics.counter(names::REANNOUNCED));
    tokio::time::pause();
    for _ in 0..5 {
        round().await;
    }
    let closing = tokio::spawn({
        let pool = pool.clone();
        async move { pool.close().await }
    });
    // The close's first step has run: no join, no re-announcement after.
    tokio::task::yield_now().await;
    let at_close = reannounced();
    assert!(
        at_close < MEMBERS * LIMIT / 2,
        "{at_close}: most of the re-announcements still to come"
    );
    let bound = Timings::default().close_bound(1);
    tokio::time::timeout(bound, closing)
        .await
        .expect("the close ends by itself")
        .unwrap();
    for _ in 0..50 {
        round().await;
    }
    assert_eq!(reannounced(), at_close);
}
