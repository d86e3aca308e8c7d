//! The embedded server as a gossip member (`serve --consul-serf`), over
//! real loopback sockets on paused time: members join by push-pull and
//! show in `/v1/agent/members` and in the catalog with `serfHealth`; a
//! member that stops answering is suspected, then failed; one that leaves
//! is `left` and deregistered; encryption and labels must match; the
//! server relays indirect probes; hostile packets and streams are counted
//! with a cause. Each test starts its own backend on `127.0.0.1:0`.
#![cfg(feature = "consul")]

use crate::gossip_member;

use std::net::SocketAddr;
use std::time::Duration;

use crate::gossip_member::Member;
use agent_sim_gossip::serf::{decode_tags, intent};
use agent_sim_gossip::wire::msgs::{Ack, IndirectPing, Nack, PushPull, PushPullHeader, Verdict};
use agent_sim_gossip::wire::{compound, kind};
use agent_sim_gossip::{Keyring, Pool, PoolConfig, Security, Timings};
use agent_sim_metrics::Metrics;
use agent_sim_server::backend::{Backend, BackendConfig, ConsulAddrs};
use agent_sim_server::consul::{ConsulTargetConfig, ConsulTargetSnapshot, SerfConfig};
use agent_sim_testkit::bounded::until;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UdpSocket};

const KEY: &str = "pUqJrVyVRj5jsiYEkM/tFQYfWyJIv4s3XkvDwy7Cu5s=";
/// Paused time a test may take to see what it waits for.
const LIMIT: Duration = Duration::from_secs(60);

fn secured(key: Option<&str>, label: &str) -> Security {
    Security {
        label: label.into(),
        keyring: key.map(|k| Keyring::from_base64(&[k]).unwrap()),
    }
}

/// A backend serving Consul with the serf port on.
async fn start(serf: SerfConfig) -> Backend {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    Backend::start(BackendConfig {
        consul: Some(ConsulAddrs {
            rpc: any,
            http: any,
            grpc: None,
            cfg: ConsulTargetConfig {
                serf: Some(serf),
                ..ConsulTargetConfig::default()
            },
            state: None,
        }),
        ..BackendConfig::default()
    })
    .await
    .unwrap()
}

fn serf_addr(b: &Backend) -> SocketAddr {
    b.consul_serf_addr().unwrap()
}

fn stats(b: &Backend) -> ConsulTargetSnapshot {
    b.consul_stats().unwrap()
}

async fn get(b: &Backend, path: &str) -> Value {
    let addr = b.consul_addrs().unwrap().1;
    let s = TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get(path)
        .header("host", addr.to_string())
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200, "{path}");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&body).unwrap()
}

/// The member's row of `/v1/agent/members`, once it is there.
async fn member_row(b: &Backend, name: &str) -> Option<Value> {
    let all = get(b, "/v1/agent/members").await;
    all.as_array()?.iter().find(|m| m["Name"] == name).cloned()
}

/// Waits until the member's status is `status`.
async fn wait_status(b: &Backend, name: &str, status: u64) -> Value {
    until(LIMIT, &format!("{name} with status {status}"), async || {
        member_row(b, name).await.filter(|m| m["Status"] == status)
    })
    .await
}

/// The node's `serfHealth` check, once it is `status`.
async fn wait_serf_health(b: &Backend, node: &str, status: &str) -> Value {
    let path = format!("/v1/health/node/{node}");
    until(
        LIMIT,
        &format!("serfHealth {status} on {node}"),
        async || {
            let checks = get(b, &path).await;
            checks
                .as_array()?
                .iter()
                .find(|c| c["CheckID"] == "serfHealth" && c["Status"] == status)
                .cloned()
        },
    )
    .await
}

/// A member joined by push-pull, alive with its serfHealth passing.
async fn joined(b: &Backend, name: &str) -> Member {
    let m = Member::start(name, Security::default()).await;
    m.push_pull(serf_addr(b), true).await.expect("an answer");
    wait_status(b, name, 1).await;
    wait_serf_health(b, name, "passing").await;
    m
}

/// `/v1/agent/members` of a real Consul 1.20.1 server, captured.
fn real_members() -> Value {
    let path =
        agent_sim_testkit::hostile::vectors_dir().join("consul/members/agent-members-1.20.1.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Every row has a real row's fields, and the server's tags
/// are a real server's (but the WAN port and the TLS gRPC port).
fn same_shape_as_a_real_server(ours: &Value) {
    let real = real_members();
    let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    let want = keys(&real[0]);
    for row in ours.as_array().unwrap() {
        assert_eq!(keys(row), want, "{row}");
    }
    let role = |rows: &Value, r: &str| {
        rows.as_array()
            .unwrap()
            .iter()
            .find(|m| m["Tags"]["role"] == r)
            .cloned()
            .unwrap()
    };
    let mut real_tags = keys(&role(&real, "consul")["Tags"]);
    real_tags.retain(|k| k != "wan_join_port" && k != "grpc_port" && k != "grpc_tls_port");
    assert_eq!(keys(&role(ours, "consul")["Tags"]), real_tags);
}

#[tokio::test(start_paused = true)]
async fn a_member_joining_by_push_pull_is_alive_in_members_and_in_the_catalog() {
    let b = start(SerfConfig::default()).await;
    let m = Member::start("agent-1", Security::default()).await;
    let answer = m.push_pull(serf_addr(&b), true).await.expect("an answer");
    assert_eq!(answer[0], kind::PUSH_PULL);
    let pp = PushPull::decode(&answer[1..]).unwrap();
    let me = pp
        .nodes
        .iter()
        .find(|n| n.name == "agent-sim-server")
        .unwrap();
    assert_eq!((me.state, me.vsn), (0, &[1, 5, 2, 2, 5, 4][..]));
    assert_eq!(me.port, serf_addr(&b).port());
    let tags = decode_tags(me.meta).unwrap();
    let tag = |k: &str| tags.iter().find(|(t, _)| t == k).map(|(_, v)| v.as_str());
    let rpc_port = b.consul_addrs().unwrap().0.port().to_string();
    assert_eq!(tag("role"), Some("consul"));
    assert_eq!(tag("dc"), Some("dc1"));
    assert_eq!(tag("port"), Some(rpc_port.as_str()));
    assert_eq!(tag("build"), Some("1.20.1:"));

    let row = wait_status(&b, "agent-1", 1).await;
    assert_eq!(row["Addr"], "127.0.0.1");
    assert_eq!(row["Port"], m.addr.port());
    assert_eq!(row["Tags"]["role"], "node");
    assert_eq!(
        [
            &row["ProtocolMin"],
            &row["ProtocolMax"],
            &row["ProtocolCur"]
        ],
        [1, 5, 2]
    );
    assert_eq!(
        [
            &row["DelegateMin"],
            &row["DelegateMax"],
            &row["DelegateCur"]
        ],
        [2, 5, 4]
    );
    let server = member_row(&b, "agent-sim-server").await.unwrap();
    assert_eq!(server["Status"], 1);
    assert_eq!(server["Tags"]["role"], "consul");

    let check = wait_serf_health(&b, "agent-1", "passing").await;
    assert_eq!(check["Name"], "Serf Health Status");
    same_shape_as_a_real_server(&get(&b, "/v1/agent/members").await);
    assert_eq!(check["Output"], "Agent alive and reachable");
    let node = get(&b, "/v1/catalog/node/agent-1").await;
    assert_eq!(node["Node"]["Address"], "127.0.0.1");
    assert_eq!(node["Node"]["Meta"]["consul-version"], "1.20.1");

    // The server probes it, and it answers.
    until(LIMIT, "three probes answered", async || {
        stats(&b).serf.serf_probes_sent >= 3
    })
    .await;
    let s = stats(&b).serf;
    assert_eq!((s.serf_probes_failed, s.serf_members_alive), (0, 2));
    assert_eq!(s.serf_push_pulls_answered, 1);
    assert_eq!(s.serf_push_pulls_refused, 0);
    assert!(s.serf_push_pull_encodings >= 1, "its answer encoded");
    assert!(s.serf_received_by_type["push_pull"] >= 1);
    assert!(s.serf_sent_by_type["ping"] >= 3);
    b.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_member_that_stops_answering_is_suspected_then_failed() {
    let b = start(SerfConfig::default()).await;
    let m = joined(&b, "agent-1").await;
    m.mute();
    let muted_at = tokio::time::Instant::now();
    until(LIMIT, "a suspicion", async || {
        stats(&b).serf.serf_members_suspect == 1
    })
    .await;
    // Suspect still shows as alive, as in Consul.
    assert_eq!(member_row(&b, "agent-1").await.unwrap()["Status"], 1);
    let row = wait_status(&b, "agent-1", 4).await;
    assert_eq!(row["Name"], "agent-1");
    // A probe interval at most to notice, then 4 s of suspicion (2 members).
    assert!(
        muted_at.elapsed() >= Duration::from_secs(4),
        "{:?}",
        muted_at.elapsed()
    );
    let check = wait_serf_health(&b, "agent-1", "critical").await;
    assert_eq!(check["Output"], "Agent not live or unreachable");
    let critical = get(&b, "/v1/health/state/critical").await;
    assert_eq!(critical.as_array().unwrap().len(), 1);
    assert_eq!(
        (&critical[0]["Node"], &critical[0]["CheckID"]),
        (&Value::from("agent-1"), &Value::from("serfHealth"))
    );
    let s = stats(&b).serf;
    assert!(s.serf_probes_failed >= 1 && s.serf_probes_tcp >= 1);
    assert_eq!((s.serf_members_failed, s.serf_failures), (1, 1));
    // The suspected member was told, with its ping, so it could refute.
    assert!(m.heard(kind::SUSPECT, |body| {
        Verdict::decode(body).is_ok_and(|v| v.node == "agent-1")
    }));
    b.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_member_leaving_is_left_and_its_node_deregistered() {
    let b = start(SerfConfig::default()).await;
    let m = joined(&b, "agent-1").await;
    let mut leave = Vec::new();
    intent(true, 10, "agent-1", &mut leave);
    let mut dead = Vec::new();
    Verdict {
        incarnation: 1,
        node: "agent-1",
        from: "agent-1",
    }
    .encode(kind::DEAD, &mut dead);
    m.send(serf_addr(&b), &compound(&[&leave, &dead])).await;
    wait_status(&b, "agent-1", 3).await;
    until(LIMIT, "the node deregistered", async || {
        get(&b, "/v1/catalog/node/agent-1").await.is_null()
    })
    .await;
    assert_eq!(
        get(&b, "/v1/health/node/agent-1").await,
        serde_json::json!([])
    );
    assert_eq!(stats(&b).serf.serf_members_left, 1);
    b.stop().await;
}

#[tokio::test(start_paused = true)]
async fn encryption_and_labels_must_match_the_pools() {
    let b = start(SerfConfig {
        security: secured(Some(KEY), "prod"),
        ..SerfConfig::default()
    })
    .await;
    let same = Member::start("agent-1", secured(Some(KEY), "prod")).await;
    let answer = same
        .push_pull(serf_addr(&b), true)
        .await
        .expect("an answer");
    assert_eq!(answer[0], kind::PUSH_PULL);
    wait_status(&b, "agent-1", 1).await;
    wait_serf_health(&b, "agent-1", "passing").await;

    let plain = Member::start("agent-2", secured(None, "prod")).await;
    assert_eq!(plain.push_pull(serf_addr(&b), true).await, None);
    let other_key = "AAAAAAAAAAAAAAAAAAAAAA==";
    let wrong = Member::start("agent-3", secured(Some(other_key), "prod")).await;
    assert_eq!(wrong.push_pull(serf_addr(&b), true).await, None);
    let unlabelled = Member::start("agent-4", secured(Some(KEY), "")).await;
    assert_eq!(unlabelled.push_pull(serf_addr(&b), true).await, None);
    let mut ping = Vec::new();
    agent_sim_gossip::wire::msgs::Ping {
        seq: 1,
        node: "agent-sim-server",
        ..Default::default()
    }
    .encode(&mut ping);
    wrong.send(serf_addr(&b), &ping).await;
    until(LIMIT, "the refusals counted", async || {
        let bad = stats(&b).serf.serf_bad_by_cause;
        bad.get("encryption") == Some(&3) && bad.get("label") == Some(&1)
    })
    .await;
    assert!(member_row(&b, "agent-2").await.is_none());
    b.stop().await;
}

#[tokio::test(start_paused = true)]
async fn indirect_pings_are_relayed_and_nacked_when_the_target_is_silent() {
    let b = start(SerfConfig::default()).await;
    let asker = joined(&b, "agent-1").await;
    let target = joined(&b, "agent-2").await;
    let ask = |seq| {
        let mut msg = Vec::new();
        IndirectPing {
            seq,
            target: &[127, 0, 0, 1],
            port: target.addr.port(),
            node: "agent-2",
            nack: true,
            ..Default::default()
        }
        .encode(&mut msg);
        msg
    };
    asker.send(serf_addr(&b), &ask(7001)).await;
    until(LIMIT, "the relayed ack", async || {
        asker.heard(kind::ACK, |body| {
            Ack::decode(body).is_ok_and(|a| a.seq == 7001)
        })
    })
    .await;
    target.mute();
    asker.send(serf_addr(&b), &ask(7002)).await;
    until(LIMIT, "a nack", async || {
        asker.heard(kind::NACK, |body| {
            Nack::decode(body).is_ok_and(|n| n.seq == 7002)
        })
    })
    .await;
    assert!(stats(&b).serf.serf_indirect_relayed >= 2);
    b.stop().await;
}

/// Sends `bytes` as a stream to the serf port and closes its side.
async fn stream(to: SocketAddr, bytes: &[u8]) {
    let mut s = TcpStream::connect(to).await.unwrap();
    let _ = s.write_all(bytes).await;
    let _ = s.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn hostile_packets_and_streams_are_counted_by_cause() {
    let b = start(SerfConfig {
        max_stream_bytes: 64 * 1024,
        max_tcp_handlers: 2,
        tcp_timeout: Duration::from_secs(10),
        ..SerfConfig::default()
    })
    .await;
    let to = serf_addr(&b);
    let udp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    for p in [
        &[][..],
        &[kind::PING],
        &[kind::PING, 0x01],
        &[99, 1, 2],
        &[kind::COMPOUND, 9, 0],
    ] {
        udp.send_to(p, to).await.unwrap();
    }
    // A push-pull claiming a million members in a few bytes.
    let mut huge = Vec::new();
    PushPullHeader {
        nodes: 1_000_000,
        user_state_len: 0,
        join: true,
    }
    .encode(&mut huge);
    stream(to, &huge).await;
    // More than the byte bound.
    let mut long = vec![kind::USER, 0x81, 0xaa];
    long.extend_from_slice(b"UserMsgLen");
    long.extend_from_slice(&[0xce, 0x10, 0, 0, 0]);
    long.resize(100 * 1024, 0);
    stream(to, &long).await;
    until(LIMIT, "the bad input counted", async || {
        let bad = stats(&b).serf.serf_bad_by_cause;
        let n = |c: &str| bad.get(c).copied().unwrap_or(0);
        n("truncated") >= 3 && n("malformed") >= 1 && n("unknown_type") >= 1 && n("oversized") >= 1
    })
    .await;
    // Two silent streams hold both handlers: a third is refused at once,
    // and the silent ones end at the stream timeout.
    let _a = TcpStream::connect(to).await.unwrap();
    let _b = TcpStream::connect(to).await.unwrap();
    until(LIMIT, "both handlers busy", async || {
        stats(&b).serf.serf_tcp_streams_accepted >= 4
    })
    .await;
    let _c = TcpStream::connect(to).await.unwrap();
    until(LIMIT, "the third refused", async || {
        stats(&b).serf.serf_bad_by_cause.get("busy") == Some(&1)
    })
    .await;
    until(LIMIT, "the silent streams timed out", async || {
        stats(&b).serf.serf_bad_by_cause.get("timeout") == Some(&2)
    })
    .await;
    // Still a member that answers.
    let m = Member::start("agent-1", Security::default()).await;
    assert!(m.push_pull(to, true).await.is_some());
    b.stop().await;
}

/// The tags of a Consul 1.20 client (the pool adds `id`).
fn client_tags() -> Vec<(String, String)> {
    gossip_member::CLIENT_TAGS
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn agent_sim_s_own_pool_joins_stays_alive_and_leaves_as_left() {
    let b = start(SerfConfig::default()).await;
    let metrics = Metrics::new(&agent_sim_gossip::metrics_spec(), 1);
    let pool = Pool::start(
        PoolConfig {
            bind: vec!["127.0.0.1:0".parse().unwrap()],
            join: vec![serf_addr(&b)],
            security: Security::default(),
            tags: client_tags(),
            timings: Timings::default(),
        },
        metrics.clone(),
    )
    .await
    .unwrap();
    let n = 20;
    for i in 0..n {
        let id = format!("00000000-0000-4000-8000-{i:012x}");
        let (slot, _) = pool.add(&format!("sim-{i}"), &id, i);
        pool.join(slot).await.unwrap();
    }
    let sims = async || -> Vec<u64> {
        let all = get(&b, "/v1/agent/members").await;
        all.as_array()
            .unwrap()
            .iter()
            .filter(|m| m["Name"].as_str().unwrap().starts_with("sim-"))
            .map(|m| m["Status"].as_u64().unwrap())
            .collect()
    };
    until(LIMIT, "every member alive", async || {
        sims().await == vec![1; n as usize]
    })
    .await;
    for i in 0..n {
        wait_serf_health(&b, &format!("sim-{i}"), "passing").await;
    }
    // A minute of probes both ways, gossip and push-pulls: nobody flaps.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(sims().await, vec![1; n as usize]);
    let s = stats(&b).serf;
    assert!(s.serf_probes_sent >= 50, "{s:?}");
    assert_eq!(
        (s.serf_probes_failed, s.serf_suspicions, s.serf_failures),
        (0, 0, 0),
        "{s:?}"
    );
    pool.close().await;
    until(LIMIT, "every member left", async || {
        sims().await == vec![3; n as usize]
    })
    .await;
    until(LIMIT, "every node deregistered", async || {
        get(&b, "/v1/catalog/node/sim-0").await.is_null()
            && get(&b, &format!("/v1/catalog/node/sim-{}", n - 1))
                .await
                .is_null()
    })
    .await;
    assert_eq!(stats(&b).serf.serf_bad_by_cause, Default::default());
    assert_eq!(
        metrics.snapshot().errors_total(),
        0,
        "{:?}",
        metrics.error_report()
    );
    b.stop().await;
}
