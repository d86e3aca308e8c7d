//! The embedded Consul target's KV over loopback HTTP, checked against
//! what a real Consul 1.20.1 dev agent answered (the `GOLDEN` list:
//! status, body, error words, typed in from `curl -i` against
//! `consul agent -dev` on 2026-11-26), plus blocking reads, locks,
//! lock-delay, session invalidation and `/v1/txn` KV operations. Each
//! test starts its own target on `127.0.0.1:0` and is bounded.
#![cfg(feature = "consul")]

use agent_sim_server::consul::ConsulTargetConfig;
use agent_sim_testkit::bounded::until;
use bytes::Bytes;
use serde_json::{Value, json};

use crate::common::{BOUND, Reply, Target, call_at, start, within};

async fn call(t: &Target, method: &'static str, path: &str, body: impl Into<Bytes>) -> Reply {
    call_at(t.http, method, path, body).await
}

async fn get(t: &Target, path: &str) -> Reply {
    call(t, "GET", path, Bytes::new()).await
}

async fn put(t: &Target, path: &str, body: &'static str) -> Reply {
    call(t, "PUT", path, body).await
}

async fn session(t: &Target, body: &'static str) -> String {
    let r = put(t, "/v1/session/create", body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["ID"].as_str().unwrap().to_owned()
}

/// One request and what Consul 1.20.1 answered: status and body (`*` at
/// the end: the body starts with this).
struct Golden {
    method: &'static str,
    path: &'static str,
    body: &'static str,
    status: u16,
    answer: &'static str,
}

const fn g(
    method: &'static str,
    path: &'static str,
    body: &'static str,
    status: u16,
    answer: &'static str,
) -> Golden {
    Golden {
        method,
        path,
        body,
        status,
        answer,
    }
}

/// Answers of a real 1.20.1 dev agent, in order, on a fresh KV store.
const GOLDEN: &[Golden] = &[
    g("PUT", "/v1/kv/a/b", "hello", 200, "true"),
    g("PUT", "/v1/kv/a/c?flags=42", "world", 200, "true"),
    g("PUT", "/v1/kv/a/b?cas=0", "x", 200, "false"),
    g("PUT", "/v1/kv/a/b?cas=1", "x", 200, "false"),
    g("DELETE", "/v1/kv/a/b?cas=1", "", 200, "false"),
    g("DELETE", "/v1/kv/nope", "", 200, "true"),
    g("GET", "/v1/kv/nope", "", 404, ""),
    g("GET", "/v1/kv/nope?recurse", "", 404, ""),
    g("GET", "/v1/kv/nope?keys", "", 404, ""),
    g("GET", "/v1/kv/a/b?raw", "", 200, "hello"),
    g(
        "GET",
        "/v1/kv/?keys&separator=/",
        "",
        200,
        "[\n    \"a/\"\n]",
    ),
    g(
        "PUT",
        "/v1/kv/x?cas=1&acquire=abc",
        "1",
        400,
        "Conflicting flags: acquire=abc&cas=1\n",
    ),
    g(
        "DELETE",
        "/v1/kv/a?recurse&cas=3",
        "",
        400,
        "Conflicting flags: cas=3&recurse=\n",
    ),
    g(
        "PUT",
        "/v1/kv/x?cas=abc",
        "1",
        500,
        "strconv.ParseUint: parsing \"abc\": invalid syntax",
    ),
    g(
        "PUT",
        "/v1/kv/x?flags=-1",
        "1",
        500,
        "strconv.ParseUint: parsing \"-1\": invalid syntax",
    ),
    g(
        "PUT",
        "/v1/kv/x?acquire=abc",
        "1",
        500,
        "raft apply failed: invalid session \"abc\"",
    ),
    g(
        "PUT",
        "/v1/kv/x?acquire=",
        "1",
        500,
        "raft apply failed: missing session",
    ),
    g("PUT", "/v1/kv/x?release=abc", "1", 200, "false"),
    g("PUT", "/v1/kv/", "1", 400, "Missing key name"),
    g("GET", "/v1/kv/", "", 400, "Missing key name"),
    g("DELETE", "/v1/kv/", "", 400, "Missing key name"),
    g("POST", "/v1/kv/a", "1", 405, "method POST not allowed"),
];

#[tokio::test]
async fn answers_match_a_real_1_20_1_agent() {
    let t = start(ConsulTargetConfig::default()).await;
    within(async {
        for (i, gold) in GOLDEN.iter().enumerate() {
            let r = call(&t, gold.method, gold.path, gold.body).await;
            let what = format!("#{i} {} {}", gold.method, gold.path);
            assert_eq!(r.status, gold.status, "{what}: {}", r.text());
            assert_eq!(r.text(), gold.answer, "{what}");
            if gold.method == "GET" && gold.status != 400 {
                assert!(r.index() > 0, "{what}: an index header");
                assert_eq!(r.header("x-consul-knownleader"), "true", "{what}");
                assert_eq!(r.header("x-consul-query-backend"), "blocking-query");
            }
        }
        let r = call(&t, "POST", "/v1/kv/a", "1").await;
        assert_eq!(r.header("allow"), "OPTIONS,GET,PUT,DELETE");
        let raw = get(&t, "/v1/kv/a/b?raw").await;
        assert_eq!(raw.header("content-type"), "text/plain");
        assert_eq!(raw.header("x-content-type-options"), "nosniff");
        assert_eq!(raw.header("content-security-policy"), "sandbox");
    })
    .await;
}

#[tokio::test]
async fn entries_print_like_consul() {
    let t = start(ConsulTargetConfig::default()).await;
    within(async {
        put(&t, "/v1/kv/a/b", "hello").await;
        put(&t, "/v1/kv/a/c?flags=42", "world").await;
        put(&t, "/v1/kv/e", "").await;
        let one = get(&t, "/v1/kv/a/b").await;
        let b_index = one.json()[0]["ModifyIndex"].as_u64().unwrap();
        assert_eq!(one.index(), b_index, "a key's read answers with its index");
        // Consul's field order, 4-space indent, Session absent when free.
        assert_eq!(
            one.text(),
            format!(
                "[\n    {{\n        \"LockIndex\": 0,\n        \"Key\": \"a/b\",\n        \
                 \"Flags\": 0,\n        \"Value\": \"aGVsbG8=\",\n        \"CreateIndex\": \
                 {b_index},\n        \"ModifyIndex\": {b_index}\n    }}\n]"
            )
        );
        assert_eq!(one.header("content-type"), "application/json");
        let all = get(&t, "/v1/kv/a?recurse").await.json();
        assert_eq!(all.as_array().unwrap().len(), 2);
        assert_eq!(all[1]["Flags"], 42);
        assert_eq!(all[1]["Value"], "d29ybGQ=");
        assert_eq!(get(&t, "/v1/kv/e").await.json()[0]["Value"], Value::Null);
        let keys = get(&t, "/v1/kv/a?keys").await.json();
        assert_eq!(keys, json!(["a/b", "a/c"]));
        let empty = get(&t, "/v1/kv/?keys").await;
        assert_eq!(empty.status, 200);
        // A missing key: 404, empty body, the table's index.
        let gone = get(&t, "/v1/kv/nope").await;
        assert_eq!((gone.status, gone.body.len()), (404, 0));
        assert_eq!(gone.index(), t.state.stats().raft_index);
    })
    .await;
}

#[tokio::test]
async fn cas_and_delete_cas_follow_the_modify_index() {
    let t = start(ConsulTargetConfig::default()).await;
    within(async {
        assert_eq!(put(&t, "/v1/kv/k?cas=0", "1").await.text(), "true");
        assert_eq!(put(&t, "/v1/kv/k?cas=0", "2").await.text(), "false");
        let m = get(&t, "/v1/kv/k").await.json()[0]["ModifyIndex"]
            .as_u64()
            .unwrap();
        let path = |q: &str| format!("/v1/kv/k?cas={q}");
        assert_eq!(
            call(&t, "PUT", &path(&m.to_string()), "3").await.text(),
            "true"
        );
        assert_eq!(
            call(&t, "PUT", &path(&m.to_string()), "4").await.text(),
            "false"
        );
        let e = get(&t, "/v1/kv/k").await.json();
        assert_eq!(e[0]["Value"], "Mw==");
        let m2 = e[0]["ModifyIndex"].as_u64().unwrap();
        assert_eq!(e[0]["CreateIndex"].as_u64().unwrap(), m);
        let del = |i: u64| format!("/v1/kv/k?cas={i}");
        assert_eq!(call(&t, "DELETE", &del(m), "").await.text(), "false");
        assert_eq!(call(&t, "DELETE", &del(m2), "").await.text(), "true");
        assert_eq!(get(&t, "/v1/kv/k").await.status, 404);
    })
    .await;
}

#[tokio::test]
async fn locks_are_held_released_and_lost_with_the_session() {
    let t = start(ConsulTargetConfig::default()).await;
    within(async {
        let s1 = session(&t, r#"{"TTL":"10s"}"#).await;
        let s2 = session(&t, r#"{"TTL":"10s"}"#).await;
        let acquire = |s: &str| format!("/v1/kv/lk?acquire={s}");
        assert_eq!(call(&t, "PUT", &acquire(&s1), "me").await.text(), "true");
        assert_eq!(call(&t, "PUT", &acquire(&s2), "you").await.text(), "false");
        let e = get(&t, "/v1/kv/lk").await.json();
        assert_eq!(e[0]["Session"], s1.as_str());
        assert_eq!(e[0]["LockIndex"], 1);
        // The holder acquires again: same lock index, new value.
        assert_eq!(call(&t, "PUT", &acquire(&s1), "me2").await.text(), "true");
        assert_eq!(get(&t, "/v1/kv/lk").await.json()[0]["LockIndex"], 1);
        // A plain write keeps the session (and resets the lock index, as
        // Consul's kvsSetTxn does).
        assert_eq!(put(&t, "/v1/kv/lk", "plain").await.text(), "true");
        let e = get(&t, "/v1/kv/lk").await.json();
        assert_eq!(
            (e[0]["LockIndex"].clone(), e[0]["Session"].clone()),
            (json!(0), json!(s1))
        );
        // Destroying the session releases the key (behavior release).
        assert_eq!(put_s(&t, "/v1/session/destroy/", &s1).await.status, 200);
        let e = get(&t, "/v1/kv/lk").await.json();
        assert!(e[0].get("Session").is_none(), "{e}");
        assert_eq!(
            call(&t, "PUT", &acquire(&s2), "you").await.text(),
            "false",
            "lock-delay"
        );
        let stats = t.state.stats();
        assert_eq!(stats.kv_lock_acquires, 2);
        assert_eq!(stats.kv_lock_refused, 2);
        assert_eq!(stats.kv_writes, 4, "the delayed acquire took no raft write");
        assert_eq!(stats.kv_keys, 1);
    })
    .await;
}

async fn put_s(t: &Target, prefix: &str, s: &str) -> Reply {
    call(t, "PUT", &format!("{prefix}{s}"), Bytes::new()).await
}

#[tokio::test]
async fn a_delete_session_takes_its_keys_with_it() {
    let t = start(ConsulTargetConfig::default()).await;
    within(async {
        let s = session(&t, r#"{"Behavior":"delete","LockDelay":"0s"}"#).await;
        let r = call(&t, "PUT", &format!("/v1/kv/eph?acquire={s}"), "x").await;
        assert_eq!(r.text(), "true");
        let before = get(&t, "/v1/kv/?recurse").await.index();
        put_s(&t, "/v1/session/destroy/", &s).await;
        let gone = get(&t, "/v1/kv/eph").await;
        assert_eq!(gone.status, 404);
        // The prefix's index moved with the deletion (its tombstone).
        let after = get(&t, "/v1/kv/e?recurse").await;
        assert_eq!(after.status, 404);
        assert!(after.index() > before);
        // No lock-delay with LockDelay 0: a new session takes it at once.
        let s2 = session(&t, r#"{}"#).await;
        let r = call(&t, "PUT", &format!("/v1/kv/eph?acquire={s2}"), "y").await;
        assert_eq!(r.text(), "true");
    })
    .await;
}

#[tokio::test]
async fn a_blocking_read_wakes_on_its_prefix_and_not_on_others() {
    let t = start(ConsulTargetConfig::default()).await;
    within(async {
        put(&t, "/v1/kv/w/a", "1").await;
        let idx = get(&t, "/v1/kv/w?recurse").await.index();
        let path = format!("/v1/kv/w?recurse&index={idx}&wait=5s");
        let held = tokio::spawn(call_at(t.http, "GET", path, Bytes::new()));
        until(BOUND, "the read held", async || {
            t.state.stats().blocking_queries_held == 1
        })
        .await;
        // A write elsewhere does not answer it.
        put(&t, "/v1/kv/other", "x").await;
        tokio::task::yield_now().await;
        assert!(!held.is_finished());
        put(&t, "/v1/kv/w/b", "2").await;
        let r = held.await.unwrap();
        assert_eq!(r.status, 200);
        assert!(r.index() > idx);
        assert_eq!(r.json().as_array().unwrap().len(), 2);
    })
    .await;
}

#[tokio::test]
async fn value_size_limit_answers_like_the_agent() {
    let t = start(ConsulTargetConfig {
        kv_max_value_size: 16,
        ..ConsulTargetConfig::default()
    })
    .await;
    within(async {
        let r = call(&t, "PUT", "/v1/kv/big", vec![b'a'; 17]).await;
        assert_eq!(r.status, 413);
        assert_eq!(
            r.text(),
            "Request body(17 bytes) too large, max size: 16 bytes. See \
             https://www.consul.io/docs/agent/config/config-files#kv_max_value_size."
        );
        let r = call(&t, "PUT", "/v1/kv/big", vec![b'a'; 16]).await;
        assert_eq!(r.text(), "true");
    })
    .await;
}

// ---------------------------------------------------------------- txn

/// `/v1/txn` answers of a real 1.20.1 agent: status and the errors' words.
#[tokio::test]
async fn txn_kv_ops_answer_like_a_real_agent() {
    let t = start(ConsulTargetConfig::default()).await;
    within(async {
        let set = r#"[{"KV":{"Verb":"set","Key":"t/a","Value":"aGk=","Flags":3}},
            {"KV":{"Verb":"get","Key":"t/a"}},{"KV":{"Verb":"get-tree","Key":"t/"}},
            {"KV":{"Verb":"check-not-exists","Key":"t/zz"}}]"#;
        let r = put(&t, "/v1/txn", set).await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-consul-index"), "", "a write txn has no index header");
        let v = r.json();
        let results = v["Results"].as_array().unwrap();
        assert_eq!(results.len(), 3, "{v}");
        // A write's result has no value; a read's has it.
        assert_eq!(results[0]["KV"]["Value"], Value::Null);
        assert_eq!(results[0]["KV"]["Flags"], 3);
        assert_eq!(results[1]["KV"]["Value"], "aGk=");
        assert_eq!(results[2]["KV"]["Key"], "t/a");
        assert_eq!(v["Errors"], Value::Null);
        assert!(r.text().starts_with("{\n    \"Results\": ["), "Consul's order");

        // Reads only: the query meta in the body, leader headers.
        let r = put(&t, "/v1/txn", r#"[{"KV":{"Verb":"get","Key":"t/none"}}]"#).await;
        assert_eq!(r.status, 409);
        assert_eq!(r.header("x-consul-knownleader"), "true");
        let v = r.json();
        assert_eq!(v["Errors"][0]["What"], "key \"t/none\" doesn't exist");
        assert_eq!((v["Index"].clone(), v["KnownLeader"].clone()), (json!(1), json!(true)));
        assert_eq!(v["Results"], Value::Null);

        // Every failing op listed, in Consul's words; nothing applied.
        let m = get(&t, "/v1/kv/t/a").await.json()[0]["ModifyIndex"].as_u64().unwrap();
        let bad = r#"[{"KV":{"Verb":"cas","Key":"t/a","Value":"eA==","Index":1}},
            {"KV":{"Verb":"check-index","Key":"t/a","Index":1}},
            {"KV":{"Verb":"delete-cas","Key":"t/a","Index":1}},
            {"KV":{"Verb":"check-not-exists","Key":"t/a"}},
            {"KV":{"Verb":"check-session","Key":"t/a","Session":"abc"}},
            {"KV":{"Verb":"lock","Key":"t/a","Session":"abc"}},
            {"KV":{"Verb":"unlock","Key":"t/a","Session":"abc"}},
            {"KV":{"Verb":"lock","Key":"t/a"}},
            {"KV":{"Verb":"check-index","Key":"t/q","Index":2}},
            {"KV":{"Verb":"check-session","Key":"t/q"}},
            {"KV":{"Verb":"set","Key":"t/new","Value":"eA=="}}]"#;
        let r = put(&t, "/v1/txn", bad).await;
        assert_eq!(r.status, 409);
        let whats: Vec<String> = r.json()["Errors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| format!("{} {}", e["OpIndex"], e["What"].as_str().unwrap()))
            .collect();
        assert_eq!(
            whats,
            vec![
                "0 failed to set key \"t/a\", index is stale".to_owned(),
                format!("1 failed index check for key \"t/a\", current modify index {m} != 1"),
                "2 failed to delete key \"t/a\", index is stale".into(),
                "3 key \"t/a\" exists".into(),
                "4 failed session check for key \"t/a\", current session \"\" != \"abc\"".into(),
                "5 invalid session \"abc\"".into(),
                "6 failed to unlock key \"t/a\", lock isn't held, or is held by another session"
                    .into(),
                "7 missing session".into(),
                "8 failed to check index, key \"t/q\" doesn't exist".into(),
                "9 failed to check session, key \"t/q\" doesn't exist".into(),
            ]
        );
        assert_eq!(get(&t, "/v1/kv/t/new").await.status, 404, "rolled back");

        // Checked before anything is applied: only these errors.
        let r = put(
            &t,
            "/v1/txn",
            r#"[{"KV":{"Verb":"set","Key":"t/x"}},{"KV":{"Verb":"bogus","Key":"t/a"}}]"#,
        )
        .await;
        assert_eq!(r.text(), "{\n    \"Results\": null,\n    \"Errors\": [\n        {\n            \"OpIndex\": 1,\n            \"What\": \"unknown KV operation: bogus\"\n        }\n    ]\n}");
        let r = put(&t, "/v1/txn", r#"[{"KV":{"Verb":"set","Key":"","Value":"eA=="}}]"#).await;
        assert_eq!(r.json()["Errors"][0]["What"], "Must provide key");

        // get-or-empty of an absent key, deletes with no results: `[]`.
        let r = put(&t, "/v1/txn", r#"[{"KV":{"Verb":"get-or-empty","Key":"t/zz"}},{"KV":{"Verb":"set","Key":"t/q","Value":"eA=="}}]"#).await;
        let v = r.json();
        assert_eq!(v["Results"][0]["KV"]["CreateIndex"], 0);
        assert_eq!(v["Results"][0]["KV"]["Value"], Value::Null);
        let r = put(&t, "/v1/txn", r#"[{"KV":{"Verb":"delete-tree","Key":"t/"}},{"KV":{"Verb":"delete","Key":"t/b"}}]"#).await;
        assert_eq!(r.text(), "{\n    \"Results\": [],\n    \"Errors\": null\n}");
        assert_eq!(get(&t, "/v1/kv/t?recurse").await.status, 404);
        let stats = t.state.stats();
        assert_eq!(stats.kv_txns, 3);
    })
    .await;
}

#[tokio::test]
async fn txn_limits_answer_like_a_real_agent() {
    let t = start(ConsulTargetConfig {
        kv_max_value_size: 8,
        ..ConsulTargetConfig::default()
    })
    .await;
    within(async {
        let ops: Vec<Value> = (0..129)
            .map(|_| json!({"KV": {"Verb": "get", "Key": "a"}}))
            .collect();
        let r = call(&t, "PUT", "/v1/txn", serde_json::to_vec(&ops).unwrap()).await;
        assert_eq!(r.status, 413);
        assert_eq!(
            r.text(),
            "Transaction contains too many operations (129 > 128)"
        );
        // "123456789" in base64: one byte over the limit.
        let big = r#"[{"KV":{"Verb":"set","Key":"big","Value":"MTIzNDU2Nzg5"}}]"#;
        let r = put(&t, "/v1/txn", big).await;
        assert_eq!(r.status, 413);
        assert_eq!(r.text(), "Value for key \"big\" is too large (9 > 8 bytes)");
        let r = call(&t, "GET", "/v1/txn", Bytes::new()).await;
        assert_eq!(r.status, 405);
    })
    .await;
}

#[tokio::test]
async fn txn_locks_take_the_lock_delay_and_check_the_session() {
    let t = start(ConsulTargetConfig::default()).await;
    within(async {
        let s = session(&t, r#"{"LockDelay":"15s"}"#).await;
        let lock = format!(r#"[{{"KV":{{"Verb":"lock","Key":"l","Value":"eA==","Session":"{s}"}}}},{{"KV":{{"Verb":"check-session","Key":"l","Session":"{s}"}}}}]"#);
        let r = call(&t, "PUT", "/v1/txn", lock).await;
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(v["Results"][0]["KV"]["LockIndex"], 1);
        assert_eq!(v["Results"][1]["KV"]["Session"], s.as_str());
        put_s(&t, "/v1/session/destroy/", &s).await;
        let s2 = session(&t, "{}").await;
        let lock = format!(r#"[{{"KV":{{"Verb":"lock","Key":"l","Session":"{s2}"}}}}]"#);
        let r = call(&t, "PUT", "/v1/txn", lock).await;
        assert_eq!(r.status, 409);
        assert_eq!(
            r.json()["Errors"][0]["What"],
            "failed to lock key \"l\" due to lock delay"
        );
    })
    .await;
}

#[tokio::test]
async fn a_txn_body_over_the_limit_is_refused_before_it_is_read() {
    let t = start(ConsulTargetConfig::default()).await;
    within(async {
        let r = call(&t, "PUT", "/v1/txn", vec![b' '; 533_389]).await;
        assert_eq!(r.status, 413);
        assert_eq!(
            r.text(),
            "Request body(533389 bytes) too large, max size: 524288 bytes. See \
             https://www.consul.io/docs/agent/config/config-files#txn_max_req_len."
        );
        assert_eq!(r.header("connection"), "close");
    })
    .await;
}

// ---------------------------------------------------------------- faults

fn with_faults(specs: &[&str]) -> ConsulTargetConfig {
    let specs = specs.iter().map(|s| s.parse().unwrap()).collect();
    ConsulTargetConfig {
        faults: agent_sim_server::faults::Faults::new(specs, 7),
        ..ConsulTargetConfig::default()
    }
}

#[tokio::test]
async fn kv_read_faults_send_indexes_back_or_to_zero_and_huge_values() {
    let t = start(with_faults(&[
        "consul.kv=index-back@100%,path:/v1/kv/back/",
        "consul.kv=index-zero@100%,path:/v1/kv/zero",
        "consul.kv=huge-value@100%,path:/v1/kv/huge",
    ]))
    .await;
    within(async {
        for k in ["back/a", "zero", "huge", "plain"] {
            call(&t, "PUT", &format!("/v1/kv/{k}"), "v").await;
        }
        let m = get(&t, "/v1/kv/plain").await.index();
        assert!(m >= 4, "{m}");
        let back = get(&t, "/v1/kv/back/a").await;
        let true_index = back.json()[0]["ModifyIndex"].as_u64().unwrap();
        assert_eq!(back.index(), (true_index / 2).max(1));
        assert!(back.index() < true_index, "the index goes backwards");
        let zero = get(&t, "/v1/kv/zero?recurse").await;
        assert_eq!(zero.header("x-consul-index"), "0");
        let huge = get(&t, "/v1/kv/huge?raw").await;
        assert_eq!(huge.body.len(), 8 * 1024 * 1024);
        let huge = get(&t, "/v1/kv/huge").await.json();
        let b64 = huge[0]["Value"].as_str().unwrap().len();
        assert_eq!(b64, (8usize * 1024 * 1024).div_ceil(3) * 4);
        // The store itself is untouched.
        assert_eq!(get(&t, "/v1/kv/plain?raw").await.text(), "v");
    })
    .await;
}

#[tokio::test]
async fn lock_stuck_takes_the_key_for_good() {
    let t = start(with_faults(&["consul.kv=lock-stuck@100%,max:1"])).await;
    within(async {
        let s = session(&t, r#"{"TTL":"10s"}"#).await;
        let acquire = format!("/v1/kv/vault/core/lock?acquire={s}");
        assert_eq!(call(&t, "PUT", &acquire, "me").await.text(), "false");
        let e = get(&t, "/v1/kv/vault/core/lock").await.json();
        let holder = e[0]["Session"].as_str().unwrap().to_owned();
        assert_ne!(holder, s);
        assert_eq!(e[0]["LockIndex"], 1);
        let info = get(&t, &format!("/v1/session/info/{holder}")).await.json();
        assert_eq!(info[0]["Name"], "agent-sim lock-stuck");
        assert_eq!(info[0]["TTL"], "");
        // The fault is spent (max:1); the lock stays held.
        assert_eq!(call(&t, "PUT", &acquire, "me").await.text(), "false");
        assert_eq!(t.state.stats().kv_lock_refused, 2);
    })
    .await;
}

#[tokio::test]
async fn agent_metrics_time_kv_and_txn_applies_under_consuls_names() {
    let t = start(ConsulTargetConfig::default()).await;
    within(async {
        put(&t, "/v1/kv/m/a", "1").await;
        call(&t, "DELETE", "/v1/kv/m/a", Bytes::new()).await;
        put(
            &t,
            "/v1/txn",
            r#"[{"KV":{"Verb":"set","Key":"m/b","Value":"eA=="}}]"#,
        )
        .await;
        put(&t, "/v1/txn", r#"[{"KV":{"Verb":"get","Key":"m/b"}}]"#).await;
        let r = get(&t, "/v1/agent/metrics?format=prometheus").await;
        assert_eq!(r.status, 200);
        let text = r.text();
        for line in [
            "# TYPE consul_kvs_apply summary",
            "consul_kvs_apply_count 2",
            "consul_txn_apply_count 1",
            "consul_txn_read_count 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in {text}");
        }
        let json = get(&t, "/v1/agent/metrics").await.json();
        let names: Vec<&str> = json["Samples"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["Name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            ["consul.kvs.apply", "consul.txn.apply", "consul.txn.read"]
        );
    })
    .await;
}

#[tokio::test]
async fn a_deregistered_node_releases_its_sessions_locks_in_the_same_write() {
    let t = start(ConsulTargetConfig::default()).await;
    within(async {
        let reg = put(
            &t,
            "/v1/catalog/register",
            r#"{"Node":"n1","Address":"10.0.0.1"}"#,
        )
        .await;
        assert_eq!(reg.status, 200, "{}", reg.text());
        let s = session(&t, r#"{"Node":"n1","NodeChecks":[]}"#).await;
        let r = call(&t, "PUT", &format!("/v1/kv/lk?acquire={s}"), "x").await;
        assert_eq!(r.text(), "true");
        put(&t, "/v1/catalog/deregister", r#"{"Node":"n1"}"#).await;
        let raft = t.state.stats().raft_index;
        let e = get(&t, "/v1/kv/lk").await.json();
        assert!(e[0].get("Session").is_none(), "{e}");
        assert_eq!(
            e[0]["ModifyIndex"], raft,
            "released at the deregistration's index"
        );
        assert_eq!(
            get(&t, &format!("/v1/session/info/{s}")).await.json(),
            json!([])
        );
    })
    .await;
}
