//! Unit tests of the KV operations: CAS, locks, lock-delay on paused time,
//! session invalidation, and blocking reads woken by their prefix.

use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::*;
use crate::consul::ConsulTargetConfig;
use crate::consul::sessions::{Session, Sessions};

fn session(id: &str, behavior: &str, delay: Duration) -> Session {
    Session {
        id: id.into(),
        name: String::new(),
        node: "n".into(),
        lock_delay: delay.as_nanos() as u64,
        behavior: behavior.into(),
        ttl: String::new(),
        node_checks: None,
        service_checks: None,
        create_index: 1,
        modify_index: 1,
        ttl_duration: None,
        deadline: None,
    }
}

fn req(key: &str, value: &str) -> KvRequest {
    KvRequest {
        key: key.into(),
        value: Bytes::copy_from_slice(value.as_bytes()),
        ..KvRequest::default()
    }
}

fn with_session(key: &str, value: &str, s: &str) -> KvRequest {
    KvRequest {
        session: s.into(),
        ..req(key, value)
    }
}

#[test]
fn cas_zero_creates_only_and_an_index_must_match() {
    let (mut kv, sessions) = (KvStore::default(), Sessions::default());
    let cas = |i: u64| KvRequest {
        index: i,
        ..req("k", "v")
    };
    assert!(apply(&mut kv, &sessions, 1, Verb::Cas, &cas(0)).unwrap().ok);
    assert!(!apply(&mut kv, &sessions, 2, Verb::Cas, &cas(0)).unwrap().ok);
    assert!(!apply(&mut kv, &sessions, 3, Verb::Cas, &cas(7)).unwrap().ok);
    let changed = KvRequest {
        index: 1,
        ..req("k", "w")
    };
    assert!(
        apply(&mut kv, &sessions, 4, Verb::Cas, &changed)
            .unwrap()
            .ok
    );
    let e = kv.get("k").unwrap();
    assert_eq!((e.create_index, e.modify_index), (1, 4));
    // An unchanged write keeps the modify index.
    apply(&mut kv, &sessions, 5, Verb::Set, &req("k", "w")).unwrap();
    assert_eq!(kv.get("k").unwrap().modify_index, 4);
    // A delete-cas of an absent key is `true`, as Consul's.
    let dc = |i: u64| KvRequest {
        index: i,
        ..req("gone", "")
    };
    assert!(
        apply(&mut kv, &sessions, 6, Verb::DeleteCas, &dc(3))
            .unwrap()
            .ok
    );
}

#[test]
fn locks_count_their_holders_and_unlock_only_by_the_holder() {
    let mut kv = KvStore::default();
    let mut sessions = Sessions::default();
    sessions.insert(session("s1", "release", Duration::ZERO));
    sessions.insert(session("s2", "release", Duration::ZERO));
    let lock = |kv: &mut KvStore, idx, s: &str| {
        apply(kv, &sessions, idx, Verb::Lock, &with_session("l", "x", s))
            .unwrap()
            .ok
    };
    assert!(lock(&mut kv, 1, "s1"));
    assert!(!lock(&mut kv, 2, "s2"), "held by s1");
    assert!(lock(&mut kv, 3, "s1"), "the holder again");
    assert_eq!(kv.get("l").unwrap().lock_index, 1);
    let unlock = |kv: &mut KvStore, idx, s: &str| {
        apply(kv, &sessions, idx, Verb::Unlock, &with_session("l", "y", s))
            .unwrap()
            .ok
    };
    assert!(!unlock(&mut kv, 4, "s2"));
    assert!(unlock(&mut kv, 5, "s1"));
    let e = kv.get("l").unwrap();
    assert_eq!(
        (e.session.as_str(), e.lock_index, &e.value[..]),
        ("", 1, &b"y"[..])
    );
    assert!(lock(&mut kv, 6, "s2"));
    assert_eq!(kv.get("l").unwrap().lock_index, 2);
    let err = apply(
        &mut kv,
        &sessions,
        7,
        Verb::Lock,
        &with_session("l", "", "s9"),
    );
    assert_eq!(err.err().unwrap().to_string(), "invalid session \"s9\"");
    let err = apply(&mut kv, &sessions, 8, Verb::Unlock, &req("l", ""));
    assert_eq!(err.err().unwrap().to_string(), "missing session");
}

#[tokio::test(start_paused = true)]
async fn invalidation_releases_or_deletes_under_a_lock_delay() {
    let mut kv = KvStore::default();
    let mut sessions = Sessions::default();
    let rel = session("rel", "release", Duration::from_secs(15));
    let del = session("del", "delete", Duration::from_secs(120));
    sessions.insert(rel.clone());
    sessions.insert(del.clone());
    for (i, (k, s)) in [("a", "rel"), ("b", "rel"), ("c", "del")]
        .iter()
        .enumerate()
    {
        let r = with_session(k, "v", s);
        assert!(
            apply(&mut kv, &sessions, i as u64 + 1, Verb::Lock, &r)
                .unwrap()
                .ok
        );
    }
    let now = Instant::now();
    invalidate(&mut kv, 10, &rel, now);
    invalidate(&mut kv, 11, &del, now);
    let a = kv.get("a").unwrap();
    assert_eq!(
        (a.session.as_str(), a.modify_index, a.lock_index),
        ("", 10, 1)
    );
    assert!(kv.get("c").is_none(), "behavior delete");
    assert_eq!(kv.list_index("c"), 11, "its tombstone");
    assert!(kv.lock_delayed("a", now + Duration::from_secs(14)));
    assert!(!kv.lock_delayed("a", now + Duration::from_secs(15)));
    // A delay over 60 s is capped at 60 s (structs.MaxLockDelay).
    assert!(kv.lock_delayed("c", now + Duration::from_secs(59)));
    assert!(!kv.lock_delayed("c", now + Duration::from_secs(60)));
    assert!(kv.held_by("rel").is_empty());
}

#[test]
fn a_tree_delete_leaves_one_tombstone_for_its_prefix() {
    let (mut kv, sessions) = (KvStore::default(), Sessions::default());
    for (i, k) in ["p/a", "p/b", "q"].iter().enumerate() {
        apply(&mut kv, &sessions, i as u64 + 1, Verb::Set, &req(k, "v")).unwrap();
    }
    apply(&mut kv, &sessions, 9, Verb::DeleteTree, &req("p/", "")).unwrap();
    assert_eq!(kv.range("p/").count(), 0);
    assert_eq!(kv.list_index("p/"), 9);
    assert_eq!(kv.list_index("p/a"), 9);
    assert_eq!(kv.get_index("q").0, 3);
    // An empty prefix deletes everything, with no tombstone.
    apply(&mut kv, &sessions, 10, Verb::DeleteTree, &req("", "")).unwrap();
    assert_eq!(kv.len(), 0);
    assert_eq!(kv.table_index(), 10);
}

#[test]
fn txn_checks_fail_in_consuls_words() {
    let (mut kv, sessions) = (KvStore::default(), Sessions::default());
    apply(&mut kv, &sessions, 1, Verb::Set, &req("k", "v")).unwrap();
    let check = |verb, r: KvRequest| apply(&mut KvStore::default(), &sessions, 2, verb, &r);
    assert_eq!(
        check(Verb::CheckIndex, req("k", ""))
            .err()
            .unwrap()
            .to_string(),
        "failed to check index, key \"k\" doesn't exist"
    );
    let idx = KvRequest {
        index: 5,
        ..req("k", "")
    };
    assert_eq!(
        apply(&mut kv, &sessions, 2, Verb::CheckIndex, &idx)
            .err()
            .unwrap()
            .to_string(),
        "failed index check for key \"k\", current modify index 1 != 5"
    );
    assert_eq!(
        apply(&mut kv, &sessions, 2, Verb::CheckNotExists, &req("k", ""))
            .err()
            .unwrap()
            .to_string(),
        "key \"k\" exists"
    );
    let got = apply(&mut kv, &sessions, 2, Verb::GetOrEmpty, &req("none", "")).unwrap();
    assert_eq!(got.entries[0].modify_index, 0);
}

#[tokio::test(start_paused = true)]
async fn a_blocking_read_wakes_on_its_key_and_ends_at_its_wait() {
    let state = ConsulState::new(ConsulTargetConfig::default());
    let write = |key: &str| {
        state.kv_apply(Verb::Set, &req(key, "v")).unwrap();
    };
    write("x/a");
    let min = state.store().kv.list_index("x/");
    let held = tokio::spawn({
        let state = state.clone();
        async move {
            wait(
                &state,
                Query::Prefix("x/"),
                min,
                Duration::from_secs(60),
                None,
            )
            .await;
            Instant::now()
        }
    });
    tokio::task::yield_now().await;
    let start = Instant::now();
    write("y");
    tokio::task::yield_now().await;
    assert!(!held.is_finished(), "another prefix");
    write("x/b");
    assert_eq!(held.await.unwrap(), start, "woken at once");

    // An absent key that stays absent waits out its wait (plus jitter),
    // unrelated writes notwithstanding.
    let table = state.store().kv.table_index();
    let held = tokio::spawn({
        let state = state.clone();
        async move {
            wait(
                &state,
                Query::Key("none"),
                table,
                Duration::from_secs(16),
                None,
            )
            .await;
            Instant::now()
        }
    });
    tokio::task::yield_now().await;
    write("none-other");
    let ended = held.await.unwrap();
    let waited = ended - start;
    assert!(
        waited >= Duration::from_secs(16) && waited <= Duration::from_secs(17),
        "{waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_expired_session_releases_its_lock_at_a_raft_index_of_its_own() {
    let state = ConsulState::new(ConsulTargetConfig::default());
    let mut s = session("ttl", "release", Duration::from_secs(15));
    s.ttl_duration = Some(Duration::from_secs(10));
    s.touch(Instant::now());
    state.sessions().insert(s);
    assert!(
        state
            .kv_apply(Verb::Lock, &with_session("l", "x", "ttl"))
            .unwrap()
    );
    let before = state.raft_index();
    tokio::time::advance(Duration::from_secs(21)).await;
    let gone = state.sessions().sweep(Instant::now());
    state.sessions_expired(gone);
    let e = state.store().kv.get("l").cloned().unwrap();
    assert_eq!((e.session.as_str(), e.modify_index), ("", before + 1));
    assert_eq!(state.stats().sessions_expired, 1);
    // Within its lock-delay no other session takes it (no raft write).
    state
        .sessions()
        .insert(session("next", "release", Duration::ZERO));
    assert!(
        !state
            .kv_apply(Verb::Lock, &with_session("l", "y", "next"))
            .unwrap()
    );
    assert_eq!(state.raft_index(), before + 1);
    tokio::time::advance(Duration::from_secs(15)).await;
    assert!(
        state
            .kv_apply(Verb::Lock, &with_session("l", "y", "next"))
            .unwrap()
    );
}
