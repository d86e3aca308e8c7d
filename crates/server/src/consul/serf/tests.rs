//! The member table's rules on their own (no sockets): memberlist's
//! incarnations, suspicions and refutations, serf's statuses and intents,
//! Consul's merge rules, push-pulls both ways, reaping.

use std::sync::Arc;
use std::time::Duration;

use agent_sim_gossip::serf::{SerfState, encode_tags, intent};
use agent_sim_gossip::wire::kind;
use agent_sim_gossip::wire::msgs::{Alive, NodeState, PushPull, Verdict, state};
use tokio::time::Instant;

use super::members::{Liveness, Refused, Rules, Status, Table, VSN};
use super::queue::Key;

fn rules() -> Rules {
    Rules {
        me: "server".into(),
        datacenter: "dc1".into(),
        node_id: "00000000-0000-0000-0000-000000000001".into(),
        probe_interval: Duration::from_secs(1),
        suspicion_mult: 4,
        suspicion_max_mult: 6,
        retransmit_mult: 4,
        gossip_to_the_dead: Duration::from_secs(30),
        reap_left: Duration::from_secs(3600),
        reap_failed: Duration::from_secs(7200),
        max_members: 100,
    }
}

pub(super) fn table() -> Table {
    Table::new(rules(), encode_tags(&[("role", "consul")]), Arc::default())
}

pub(super) fn meta(id: &str) -> Vec<u8> {
    encode_tags(&[
        ("role", "node"),
        ("dc", "dc1"),
        ("id", id),
        ("build", "1.20.1:"),
    ])
}

pub(super) fn alive<'a>(name: &'a str, inc: u32, meta: &'a [u8]) -> Alive<'a> {
    Alive {
        incarnation: inc,
        node: name,
        addr: &[127, 0, 0, 2],
        port: 8301,
        meta,
        vsn: &VSN,
    }
}

pub(super) fn verdict<'a>(node: &'a str, inc: u32, from: &'a str) -> Verdict<'a> {
    Verdict {
        incarnation: inc,
        node,
        from,
    }
}

fn status(t: &Table, name: &str) -> (Liveness, Status) {
    let m = &t.members[name];
    (m.liveness, m.status)
}

#[tokio::test(start_paused = true)]
async fn alive_joins_stale_news_is_ignored_and_a_suspicion_runs_out() {
    let mut t = table();
    let now = Instant::now();
    let m = meta("a");
    t.alive(&alive("a", 1, &m), now).unwrap();
    assert_eq!(status(&t, "a"), (Liveness::Alive, Status::Alive));
    assert_eq!(t.take_dirty(), vec![Arc::<str>::from("a")]);
    t.suspect(&verdict("a", 0, "x"), now);
    assert_eq!(status(&t, "a").0, Liveness::Alive, "older incarnation");
    t.suspect(&verdict("a", 1, "server"), now);
    assert_eq!(status(&t, "a"), (Liveness::Suspect, Status::Alive));
    // Two members: no confirmations expected, the minimum: 4 × 1 × 1 s.
    assert_eq!(t.next_deadline(), Some(now + Duration::from_secs(4)));
    assert_eq!(t.expire(now + Duration::from_millis(3999)), 0);
    assert_eq!(t.expire(now + Duration::from_secs(4)), 1);
    assert_eq!(status(&t, "a"), (Liveness::Dead, Status::Failed));
    assert_eq!(t.take_dirty().len(), 1);
    // Back with a higher incarnation: alive again.
    t.alive(&alive("a", 2, &m), now).unwrap();
    assert_eq!(status(&t, "a"), (Liveness::Alive, Status::Alive));
}

#[tokio::test(start_paused = true)]
async fn a_refutation_clears_a_suspicion() {
    let mut t = table();
    let now = Instant::now();
    let m = meta("a");
    t.alive(&alive("a", 1, &m), now).unwrap();
    t.suspect(&verdict("a", 1, "server"), now);
    t.alive(&alive("a", 1, &m), now).unwrap();
    assert_eq!(
        status(&t, "a").0,
        Liveness::Suspect,
        "same incarnation refutes nothing"
    );
    t.alive(&alive("a", 2, &m), now).unwrap();
    assert_eq!(status(&t, "a").0, Liveness::Alive);
    assert_eq!(t.next_deadline(), None);
}

#[tokio::test(start_paused = true)]
async fn accusations_of_the_server_are_refuted() {
    let mut t = table();
    let now = Instant::now();
    let before = t.me().incarnation;
    t.suspect(&verdict("server", before + 4, "a"), now);
    assert_eq!(t.me().incarnation, before + 5);
    assert_eq!(t.me().liveness, Liveness::Alive);
    t.dead(&verdict("server", before + 5, "a"), now);
    assert_eq!(t.me().incarnation, before + 6);
    let msgs = t.queue.take(1400, 2, 10);
    assert_eq!(msgs.len(), 1, "one alive about itself, the newest");
    let a = Alive::decode(&msgs[0][1..]).unwrap();
    assert_eq!(
        (msgs[0][0], a.node, a.incarnation),
        (kind::ALIVE, "server", before + 6)
    );
}

#[tokio::test(start_paused = true)]
async fn leaving_then_dead_is_left_and_dead_alone_is_failed_until_the_intent() {
    let mut t = table();
    let now = Instant::now();
    let (ma, mb) = (meta("a"), meta("b"));
    t.alive(&alive("a", 1, &ma), now).unwrap();
    t.alive(&alive("b", 1, &mb), now).unwrap();
    assert!(t.intent(true, 5, "a", now));
    assert_eq!(status(&t, "a"), (Liveness::Alive, Status::Leaving));
    assert!(!t.intent(true, 5, "a", now), "not newer");
    t.dead(&verdict("a", 1, "a"), now);
    assert_eq!(status(&t, "a"), (Liveness::Left, Status::Left));
    // serf calls a member dead without its leave intent failed, then left.
    t.dead(&verdict("b", 1, "b"), now);
    assert_eq!(status(&t, "b"), (Liveness::Left, Status::Failed));
    assert!(t.intent(true, 7, "b", now));
    assert_eq!(status(&t, "b").1, Status::Left);
    // An intent about a member not known yet waits for it.
    assert!(t.intent(true, 9, "c", now));
    let mc = meta("c");
    t.alive(&alive("c", 1, &mc), now).unwrap();
    assert_eq!(status(&t, "c"), (Liveness::Alive, Status::Leaving));
    assert!(t.clock > 9, "the clock witnessed the intents");
}

#[tokio::test(start_paused = true)]
async fn merge_rules_refuse_other_datacenters_and_stolen_ids() {
    let mut t = table();
    let now = Instant::now();
    let other = encode_tags(&[("role", "node"), ("dc", "dc2")]);
    assert_eq!(t.alive(&alive("x", 1, &other), now), Err(Refused::WrongDc));
    let stolen = meta("00000000-0000-0000-0000-000000000001");
    assert_eq!(
        t.alive(&alive("y", 1, &stolen), now),
        Err(Refused::ConflictingId)
    );
    let m = meta("a");
    let mut bad = alive("a", 1, &m);
    bad.addr = &[1, 2, 3];
    assert_eq!(t.alive(&bad, now), Err(Refused::BadAddress));
    bad = alive("a", 1, &m);
    bad.vsn = &[];
    assert_eq!(t.alive(&bad, now), Err(Refused::BadVersion));
    assert_eq!(t.len(), 1);
    // A join whose members share an ID is refused whole.
    let node = |name| NodeState {
        name,
        addr: &[127, 0, 0, 3],
        port: 8301,
        meta: &m,
        incarnation: 1,
        state: state::ALIVE,
        vsn: &VSN,
    };
    let pp = PushPull {
        join: true,
        nodes: vec![node("p"), node("q")],
        user_state: &[],
    };
    assert_eq!(t.merge(&pp, None, now), Err(Refused::ConflictingId));
    assert_eq!(t.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn push_pulls_merge_both_layers_and_the_answer_reads_back() {
    let mut t = table();
    let now = Instant::now();
    let (ma, mb, mc) = (meta("a"), meta("b"), meta("c"));
    let node = |name, meta: &'static [u8], st| NodeState {
        name,
        addr: &[127, 0, 0, 3],
        port: 8301,
        meta,
        incarnation: 1,
        state: st,
        vsn: &VSN,
    };
    let (ma, mb, mc): (&'static [u8], &'static [u8], &'static [u8]) =
        (ma.leak(), mb.leak(), mc.leak());
    let serf = SerfState {
        ltime: 40,
        status: vec![("a", 3), ("b", 4), ("c", 5)],
        left: vec!["b"],
        event_ltime: 2,
        query_ltime: 3,
    };
    let pp = PushPull {
        join: true,
        nodes: vec![
            node("a", ma, state::ALIVE),
            node("b", mb, state::ALIVE),
            node("c", mc, state::ALIVE),
        ],
        user_state: &[],
    };
    assert_eq!(t.merge(&pp, Some(&serf), now), Ok(vec![]));
    assert_eq!(status(&t, "a"), (Liveness::Alive, Status::Alive));
    assert_eq!(status(&t, "b"), (Liveness::Alive, Status::Leaving));
    let left = PushPull {
        join: false,
        nodes: vec![node("b", mb, state::LEFT), node("c", mc, state::DEAD)],
        user_state: &[],
    };
    t.merge(&left, None, now).unwrap();
    assert_eq!(status(&t, "b"), (Liveness::Left, Status::Left));
    assert_eq!(
        status(&t, "c").0,
        Liveness::Suspect,
        "dead in a push-pull: suspected"
    );
    assert_eq!(t.clock, 40);

    let answer = t.local_state(false, now);
    assert_eq!(answer[0], kind::PUSH_PULL);
    let back = PushPull::decode(&answer[1..]).unwrap();
    let mut names: Vec<(&str, u8)> = back.nodes.iter().map(|n| (n.name, n.state)).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        vec![
            ("a", state::ALIVE),
            ("b", state::LEFT),
            ("c", state::SUSPECT),
            ("server", state::ALIVE),
        ]
    );
    let s = SerfState::decode(back.user_state).unwrap();
    assert_eq!((s.ltime, s.left, s.event_ltime), (40, vec!["b"], 2));
    // Dead long enough, a member is forgotten by memberlist (not by serf).
    let later = now + Duration::from_secs(31);
    assert_eq!(
        PushPull::decode(&t.local_state(false, later)[1..])
            .unwrap()
            .nodes
            .len(),
        3
    );
}

#[tokio::test(start_paused = true)]
async fn reaping_removes_long_gone_members_for_the_catalog_to_follow() {
    let mut t = table();
    let now = Instant::now();
    let (ma, mb) = (meta("a"), meta("b"));
    t.alive(&alive("a", 1, &ma), now).unwrap();
    t.alive(&alive("b", 1, &mb), now).unwrap();
    t.dead(&verdict("a", 1, "server"), now);
    t.intent(true, 3, "b", now);
    t.dead(&verdict("b", 1, "b"), now);
    t.take_dirty();
    t.reap(now + Duration::from_secs(3600));
    assert!(!t.members.contains_key("b"), "left: gone after reap_left");
    assert!(t.members.contains_key("a"), "failed: kept longer");
    t.reap(now + Duration::from_secs(7200));
    assert!(!t.members.contains_key("a"));
    let mut dirty = t.take_dirty();
    dirty.sort();
    assert_eq!(dirty, vec![Arc::<str>::from("a"), Arc::from("b")]);
}

#[tokio::test(start_paused = true)]
async fn probes_go_round_the_pool_and_skip_the_dead() {
    let mut t = table();
    let now = Instant::now();
    let metas: Vec<Vec<u8>> = (0..5).map(|i| meta(&format!("m{i}"))).collect();
    let names: Vec<String> = (0..5).map(|i| format!("m{i}")).collect();
    for (n, m) in names.iter().zip(&metas) {
        t.alive(&alive(n, 1, m), now).unwrap();
    }
    t.dead(&verdict("m0", 1, "server"), now);
    let mut seen: Vec<String> = (0..4)
        .map(|_| t.next_probe(now).unwrap().name.to_string())
        .collect();
    seen.sort();
    assert_eq!(seen, vec!["m1", "m2", "m3", "m4"]);
    assert!(t.next_probe(now).is_some(), "wraps around");
    let peers = t.indirect_peers(3, "m1");
    assert_eq!(peers.len(), 3);
    assert!(t.gossip_targets(10, now).len() <= 5);
}

#[tokio::test(start_paused = true)]
async fn a_restarted_server_comes_back_above_its_old_incarnation() {
    let mut t = table();
    let before = t.me().incarnation;
    t.return_me();
    assert_eq!(t.me().incarnation, before + 1);
    let msgs = t.queue.take(1400, 2, 10);
    let a = Alive::decode(&msgs[0][1..]).unwrap();
    assert_eq!((a.node, a.incarnation), ("server", before + 1));
}

#[tokio::test(start_paused = true)]
async fn a_peer_s_state_brings_its_events_and_the_server_s_own_go_out() {
    use super::event::{encode_state, state_user_events};
    use agent_sim_gossip::serf::event::NEW_LEADER;
    let mut t = table();
    let now = Instant::now();
    t.fire_event(NEW_LEADER, b"server");
    assert_eq!(t.event_clock, 2);
    // The server's push-pull state carries its event.
    let pp = t.local_state(false, now);
    let state = PushPull::decode(&pp[1..]).unwrap().user_state.to_vec();
    let mine = state_user_events(&state).unwrap();
    assert_eq!(
        (mine.len(), mine[0].name, mine[0].ltime),
        (1, NEW_LEADER, 1)
    );
    // A peer's state with the same event and another: only the other is new.
    let mut peer = table();
    peer.event_clock = 1;
    peer.fire_event(NEW_LEADER, b"server");
    peer.fire_event("deploy", b"v2");
    let s = SerfState {
        ltime: 1,
        status: vec![],
        left: vec![],
        event_ltime: peer.event_clock,
        query_ltime: 1,
    };
    let mut user = Vec::new();
    encode_state(&s, &peer.events, &mut user);
    let events = state_user_events(&user).unwrap();
    let taken: Vec<bool> = events.iter().map(|e| t.take_event(e)).collect();
    assert_eq!(taken, vec![false, true]);
    assert_eq!(t.event_clock, 3, "the peer's clock witnessed");
}

#[tokio::test(start_paused = true)]
async fn a_gossiped_intent_is_passed_on_once() {
    let mut t = table();
    let now = Instant::now();
    let m = meta("a");
    t.alive(&alive("a", 1, &m), now).unwrap();
    t.queue.take(1400, 2, 1);
    assert!(t.intent(true, 4, "a", now));
    let sent = t.queue.take(1400, 2, 10);
    let mut want = Vec::new();
    intent(true, 4, "a", &mut want);
    assert_eq!(sent, vec![want]);
    assert!(!t.intent(true, 4, "a", now));
    t.queue.push(Key::Member("z".into()), vec![kind::ALIVE]);
    assert_eq!(t.queue.len(), 2);
}

mod hostile {
    //! Arbitrary bytes and damaged copies of every message the serf port
    //! takes, through the same code a socket's bytes go through: nothing
    //! panics, the table keeps the server and its bounds.

    use std::net::SocketAddr;
    use std::sync::Arc;

    use agent_sim_gossip::serf::{SerfState, encode_tags, intent};
    use agent_sim_gossip::wire::msgs::{
        Ack, Alive, IndirectPing, Nack, NodeState, Ping, PushPull, Verdict, state,
    };
    use agent_sim_gossip::wire::{compound, kind};
    use agent_sim_gossip::{Keyring, Security};
    use agent_sim_testkit::hostile::mutated;
    use proptest::prelude::*;

    use super::super::members::VSN;
    use super::super::stream::read_message;
    use super::super::{Serf, SerfConfig, lock};

    const KEY: &str = "pUqJrVyVRj5jsiYEkM/tFQYfWyJIv4s3XkvDwy7Cu5s=";

    fn serf(keyed: bool) -> Arc<Serf> {
        let security = Security {
            label: String::new(),
            keyring: keyed.then(|| Keyring::from_base64(&[KEY]).unwrap()),
        };
        let cfg = SerfConfig {
            security,
            max_members: 64,
            ..SerfConfig::default()
        };
        Arc::new(Serf::new(
            cfg,
            "server",
            "dc1",
            "id",
            Vec::new(),
            Arc::default(),
        ))
    }

    /// One of each message a member sends, type byte first.
    fn messages() -> Vec<Vec<u8>> {
        let meta = encode_tags(&[
            ("role", "node"),
            ("dc", "dc1"),
            ("id", "x"),
            ("build", "1.20.1:"),
        ]);
        let mut out = Vec::new();
        let mut m = Vec::new();
        Ping {
            seq: 1,
            node: "server",
            source_addr: &[127, 0, 0, 1],
            source_port: 9,
            source_node: "a",
        }
        .encode(&mut m);
        out.push(std::mem::take(&mut m));
        IndirectPing {
            seq: 2,
            target: &[127, 0, 0, 1],
            port: 9,
            node: "b",
            nack: true,
            ..Default::default()
        }
        .encode(&mut m);
        out.push(std::mem::take(&mut m));
        Ack {
            seq: 3,
            payload: &[1, 0x80],
        }
        .encode(&mut m);
        out.push(std::mem::take(&mut m));
        Nack { seq: 4 }.encode(&mut m);
        out.push(std::mem::take(&mut m));
        Alive {
            incarnation: 1,
            node: "a",
            addr: &[127, 0, 0, 2],
            port: 9,
            meta: &meta,
            vsn: &VSN,
        }
        .encode(&mut m);
        out.push(std::mem::take(&mut m));
        for t in [kind::SUSPECT, kind::DEAD] {
            Verdict {
                incarnation: 1,
                node: "a",
                from: "b",
            }
            .encode(t, &mut m);
            out.push(std::mem::take(&mut m));
        }
        intent(true, 5, "a", &mut m);
        out.push(std::mem::take(&mut m));
        let parts: Vec<&[u8]> = out.iter().map(Vec::as_slice).collect();
        let all = compound(&parts);
        out.push(all);
        out
    }

    fn push_pull() -> Vec<u8> {
        let meta = encode_tags(&[("role", "node"), ("dc", "dc1"), ("build", "1.20.1:")]);
        let mut user = Vec::new();
        SerfState {
            ltime: 3,
            status: vec![("a", 2)],
            left: vec!["a"],
            event_ltime: 1,
            query_ltime: 1,
        }
        .encode(&mut user);
        let node = |name| NodeState {
            name,
            addr: &[127, 0, 0, 2],
            port: 9,
            meta: &meta,
            incarnation: 1,
            state: state::ALIVE,
            vsn: &VSN,
        };
        let mut out = Vec::new();
        PushPull {
            join: true,
            nodes: vec![node("a"), node("b")],
            user_state: &user,
        }
        .encode(&mut out);
        out
    }

    fn packets(keyed: bool) -> Vec<Vec<u8>> {
        let sec = serf(keyed).cfg.security.clone();
        messages().iter().map(|m| sec.seal_packet(m)).collect()
    }

    fn streams(keyed: bool) -> Vec<Vec<u8>> {
        let sec = serf(keyed).cfg.security.clone();
        let mut ping = Vec::new();
        Ping {
            seq: 1,
            node: "server",
            ..Default::default()
        }
        .encode(&mut ping);
        vec![sec.seal_stream(&push_pull()), sec.seal_stream(&ping)]
    }

    fn from() -> SocketAddr {
        "127.0.0.1:9".parse().unwrap()
    }

    fn survive_packet(s: &Arc<Serf>, bytes: &[u8]) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(s.on_packet(bytes, from()));
        s.drain_handoff();
        let t = lock(&s.table);
        assert!(t.len() <= 64);
        assert_eq!(&*t.me().addr_raw, &[127, 0, 0, 1]);
    }

    fn survive_stream(s: &Arc<Serf>, bytes: &[u8]) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut r = bytes;
            let sec = s.cfg.security.clone();
            if let Ok(msg) = read_message(&mut r, &sec, 1 << 20, false, &s.counters).await
                && msg[0] == kind::PUSH_PULL
            {
                let _ = s.merge_push_pull(&msg[1..]);
            }
        });
        assert!(lock(&s.table).len() <= 64);
    }

    #[test]
    fn the_seeds_are_taken_whole() {
        let s = serf(false);
        for p in packets(false) {
            survive_packet(&s, &p);
        }
        for p in streams(false) {
            survive_stream(&s, &p);
        }
        assert!(lock(&s.table).len() >= 2, "members from the seeds");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn damaged_packets_never_panic(p in mutated(packets(false)), q in mutated(packets(true))) {
            survive_packet(&serf(false), &p);
            survive_packet(&serf(true), &q);
        }

        #[test]
        fn arbitrary_packets_never_panic(p in proptest::collection::vec(any::<u8>(), 0..512)) {
            survive_packet(&serf(false), &p);
            survive_packet(&serf(true), &p);
        }

        #[test]
        fn damaged_streams_never_panic(p in mutated(streams(false)), q in mutated(streams(true))) {
            survive_stream(&serf(false), &p);
            survive_stream(&serf(true), &q);
        }
    }
}

/// A peer's push-pull holding only serf's state, merged.
fn merge_serf(t: &mut Table, ltime: u64, event_ltime: u64, now: Instant) {
    let pp = PushPull {
        join: false,
        nodes: vec![],
        user_state: &[],
    };
    let serf = SerfState {
        ltime,
        status: vec![("a", 1)],
        left: vec![],
        event_ltime,
        query_ltime: 1,
    };
    t.merge(&pp, Some(&serf), now).unwrap();
}

/// Applies `step`: the version must move exactly when it `changes` what
/// the push-pull state holds, and the state never without it.
fn step(t: &mut Table, what: &str, changes: bool, step: impl FnOnce(&mut Table)) {
    let now = Instant::now();
    let (version, state) = (t.version, t.local_state(true, now));
    step(t);
    assert_eq!(t.version != version, changes, "{what}: the version");
    if t.local_state(true, now) != state {
        assert!(changes, "{what}: the state changed, the version did not");
    }
}

#[tokio::test(start_paused = true)]
async fn the_version_moves_exactly_when_the_push_pull_state_changes() {
    let mut t = table();
    let now = Instant::now();
    let (ma, mb) = (meta("a"), meta("b"));
    let a = |inc| alive("a", inc, &ma);
    step(&mut t, "a joins", true, |t| t.alive(&a(1), now).unwrap());
    step(&mut t, "old news of a", false, |t| {
        t.alive(&a(1), now).unwrap()
    });
    step(&mut t, "an old suspicion", false, |t| {
        t.suspect(&verdict("a", 0, "x"), now);
    });
    step(&mut t, "a suspected", true, |t| {
        t.suspect(&verdict("a", 1, "x"), now);
    });
    step(&mut t, "a confirmation", false, |t| {
        t.suspect(&verdict("a", 1, "y"), now);
    });
    step(&mut t, "a refutes", true, |t| t.alive(&a(2), now).unwrap());
    step(&mut t, "a's join intent", true, |t| {
        t.intent(false, 5, "a", now);
    });
    step(&mut t, "the same intent", false, |t| {
        t.intent(false, 5, "a", now);
    });
    step(&mut t, "an intent for b, unknown", false, |t| {
        t.intent(true, 3, "b", now);
    });
    step(&mut t, "b joins, leaving", true, |t| {
        t.alive(&alive("b", 1, &mb), now).unwrap();
    });
    step(&mut t, "b leaves", true, |t| {
        t.dead(&verdict("b", 1, "b"), now)
    });
    step(&mut t, "b leaves again", false, |t| {
        t.dead(&verdict("b", 1, "b"), now);
    });
    step(&mut t, "older clocks", false, |t| merge_serf(t, 2, 1, now));
    step(&mut t, "a later event clock", true, |t| {
        merge_serf(t, 2, 9, now)
    });
    step(&mut t, "nothing to reap or expire", false, |t| {
        t.reap(now);
        t.expire(now);
    });
    step(&mut t, "a probe round", false, |t| _ = t.next_probe(now));
    step(&mut t, "the server accused", true, |t| {
        t.suspect(&verdict("server", 1, "a"), now);
    });
    let later = now + Duration::from_secs(3600);
    step(&mut t, "b reaped", true, |t| t.reap(later));
}
