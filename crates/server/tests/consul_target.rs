//! The embedded Consul target over real loopback sockets: the RPC port's
//! `0x08` switch, Subscribe semantics (snapshot, live events, batches, resume,
//! `NewSnapshotToFollow`, `ABORTED`), the HTTP subset (catalog, txn, sessions,
//! config entries) and shutdown. Each test starts its own target on
//! `127.0.0.1:0` and is bounded by [`within`].
#![cfg(feature = "consul")]

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use agent_sim_proto::consul::subscribe::{
    CatalogOp, Event, IntentionAction, NamedSubject, ServiceHealthUpdate, SubscribeRequest, Topic,
    config_entry, config_entry_update, event::Payload,
    state_change_subscription_client::StateChangeSubscriptionClient, subscribe_request::Subject,
};
use agent_sim_server::consul::ConsulTargetConfig;
use agent_sim_testkit::bounded::until;
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper::{Request, Response, Uri};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::Streaming;

use crate::common::{BOUND, Target, call_at, start, within};

async fn start_default() -> Target {
    start(ConsulTargetConfig::default()).await
}

// ---------------------------------------------------------------- HTTP client

struct Reply {
    status: u16,
    content_type: String,
    body: String,
}

async fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> Reply {
    let r = call_at(addr, method, path, body.to_owned()).await;
    Reply {
        status: r.status,
        content_type: r.header("content-type").to_owned(),
        body: r.text(),
    }
}

async fn put(t: &Target, path: &str, body: &str) -> Reply {
    http(t.http, "PUT", path, body).await
}

fn register_body(node: &str, addr: &str, id: &str, status: &str) -> String {
    format!(
        r#"{{"Node":"{node}","Address":"{addr}","Service":{{"ID":"{id}","Service":"web","Port":8080,"Address":"{addr}"}},"Check":{{"CheckID":"{id}-ttl","Name":"web ttl","ServiceID":"{id}","Status":"{status}"}}}}"#
    )
}

async fn register(t: &Target, node: &str, addr: &str, id: &str) {
    let r = put(
        t,
        "/v1/catalog/register",
        &register_body(node, addr, id, "passing"),
    )
    .await;
    assert_eq!((r.status, r.body.as_str()), (200, "true"));
}

// ---------------------------------------------------------------- gRPC client

/// A hyper HTTP/2 connection as a tower service for tonic.
#[derive(Clone)]
struct H2(SendRequest<tonic::body::Body>);

impl tower::Service<Request<tonic::body::Body>> for H2 {
    type Response = Response<Incoming>;
    type Error = hyper::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Incoming>, hyper::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: Request<tonic::body::Body>) -> Self::Future {
        Box::pin(self.0.send_request(req))
    }
}

type Client = StateChangeSubscriptionClient<H2>;

/// Dials the RPC port the way a Consul agent does: `0x08`, then h2c.
async fn dial(addr: SocketAddr) -> Client {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&[0x08]).await.unwrap();
    let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    StateChangeSubscriptionClient::with_origin(H2(send), Uri::from_static("http://127.0.0.1"))
}

fn request(topic: Topic, key: &str, index: u64) -> SubscribeRequest {
    SubscribeRequest {
        topic: topic as i32,
        index,
        subject: Some(Subject::NamedSubject(NamedSubject {
            key: key.into(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

async fn subscribe(c: &mut Client, topic: Topic, key: &str, index: u64) -> Streaming<Event> {
    c.subscribe(request(topic, key, index))
        .await
        .unwrap()
        .into_inner()
}

async fn next(s: &mut Streaming<Event>) -> Event {
    within(s.message()).await.unwrap().expect("stream ended")
}

fn health(e: &Event) -> &ServiceHealthUpdate {
    match &e.payload {
        Some(Payload::ServiceHealth(h)) => h,
        other => panic!("expected ServiceHealth, got {other:?}"),
    }
}

fn instance(e: &Event) -> (String, String, String) {
    let csn = health(e).check_service_node.as_ref().unwrap();
    (
        csn.node.as_ref().unwrap().node.clone(),
        csn.service.as_ref().unwrap().id.clone(),
        csn.node.as_ref().unwrap().address.clone(),
    )
}

fn is_end_of_snapshot(e: &Event) -> bool {
    matches!(e.payload, Some(Payload::EndOfSnapshot(true)))
}

/// Reads a snapshot: instance events, then EndOfSnapshot; returns both and
/// the snapshot index.
async fn read_snapshot(s: &mut Streaming<Event>) -> (Vec<Event>, u64) {
    let mut items = Vec::new();
    loop {
        let e = next(s).await;
        if is_end_of_snapshot(&e) {
            assert!(items.iter().all(|i: &Event| i.index == e.index));
            return (items, e.index);
        }
        items.push(e);
    }
}

/// Waits for a condition on the target's counters, for server-side effects
/// without a client-visible reply (paused time: no wall clock waited on).
async fn eventually(
    t: &Target,
    what: &str,
    f: impl Fn(&agent_sim_server::consul::ConsulTargetSnapshot) -> bool,
) {
    until(BOUND, what, async || f(&t.state.stats())).await;
    assert!(f(&t.state.stats()), "{what}");
}

// ---------------------------------------------------------------- RPC port

#[tokio::test(start_paused = true)]
async fn a_connection_without_the_prefix_byte_is_closed() {
    let t = start_default().await;
    let mut s = TcpStream::connect(t.rpc).await.unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    // Closed: EOF, or a reset because our bytes were never read.
    let r = within(s.read(&mut buf)).await;
    assert!(matches!(r, Ok(0) | Err(_)), "{r:?}");
    eventually(&t, "rejected", |s| s.rpc_rejected_no_prefix == 1).await;
    assert_eq!(t.state.stats().rpc_connections, 0);
}

#[tokio::test(start_paused = true)]
async fn a_silent_connection_is_closed_after_the_handshake_timeout() {
    let t = start_default().await;
    let mut s = TcpStream::connect(t.rpc).await.unwrap();
    let started = tokio::time::Instant::now();
    let mut buf = [0u8; 8];
    let r = tokio::time::timeout(Duration::from_secs(30), s.read(&mut buf))
        .await
        .expect("closed by the server");
    assert!(matches!(r, Ok(0) | Err(_)), "{r:?}");
    assert!(started.elapsed() >= Duration::from_secs(5));
    assert_eq!(t.state.stats().rpc_rejected_no_prefix, 1);
}

#[tokio::test(start_paused = true)]
async fn snapshot_then_live_deregister_without_address() {
    let t = start_default().await;
    register(&t, "sim-node-1", "10.0.0.1", "web-1").await;
    register(&t, "sim-node-2", "10.0.0.2", "web-2").await;
    let idx = t.state.raft_index();

    let mut c = dial(t.rpc).await;
    let mut s = subscribe(&mut c, Topic::ServiceHealth, "web", 0).await;
    let (items, snap_index) = read_snapshot(&mut s).await;
    assert_eq!(snap_index, idx);
    let got: Vec<_> = items.iter().map(instance).collect();
    assert_eq!(
        got,
        vec![
            ("sim-node-1".into(), "web-1".into(), "10.0.0.1".into()),
            ("sim-node-2".into(), "web-2".into(), "10.0.0.2".into()),
        ]
    );
    let first = health(&items[0]);
    assert_eq!(first.op, CatalogOp::Register as i32);
    let csn = first.check_service_node.as_ref().unwrap();
    assert_eq!(csn.node.as_ref().unwrap().datacenter, "dc1");
    assert_eq!(csn.service.as_ref().unwrap().port, 8080);
    assert_eq!(csn.checks.len(), 1);
    assert_eq!(csn.checks[0].check_id, "web-1-ttl");
    assert_eq!(csn.checks[0].status, "passing");
    assert_eq!(csn.checks[0].service_name, "web");

    let r = put(
        &t,
        "/v1/catalog/deregister",
        r#"{"Node":"sim-node-2","ServiceID":"web-2"}"#,
    )
    .await;
    assert_eq!(r.body, "true");
    let e = next(&mut s).await;
    assert_eq!(e.index, idx + 1);
    let h = health(&e);
    assert_eq!(h.op, CatalogOp::Deregister as i32);
    let csn = h.check_service_node.as_ref().unwrap();
    assert_eq!(csn.node.as_ref().unwrap().node, "sim-node-2");
    assert_eq!(csn.node.as_ref().unwrap().address, "");
    assert!(csn.checks.is_empty());
    assert_eq!(csn.service.as_ref().unwrap().id, "web-2");
    assert_eq!(csn.service.as_ref().unwrap().address, "10.0.0.2");

    // A check status change arrives as a Register with the full instance.
    let r = put(
        &t,
        "/v1/catalog/register",
        r#"{"Node":"sim-node-1","SkipNodeUpdate":true,"Check":{"CheckID":"web-1-ttl","Name":"web ttl","ServiceID":"web-1","Status":"warning"}}"#,
    )
    .await;
    assert_eq!(r.body, "true");
    let e = next(&mut s).await;
    assert_eq!(e.index, idx + 2);
    let csn = health(&e).check_service_node.as_ref().unwrap();
    assert_eq!(csn.node.as_ref().unwrap().address, "10.0.0.1");
    assert_eq!(csn.checks[0].status, "warning");

    let stats = t.state.stats();
    assert_eq!(stats.rpc_connections, 1);
    assert_eq!(stats.subscriptions_active, 1);
    assert_eq!(stats.snapshots_sent, 1);
}

#[tokio::test(start_paused = true)]
async fn a_txn_with_two_instances_of_one_service_is_one_event_batch() {
    let t = start_default().await;
    let mut c = dial(t.rpc).await;
    let mut s = subscribe(&mut c, Topic::ServiceHealth, "api", 0).await;
    let (items, _) = read_snapshot(&mut s).await;
    assert!(items.is_empty());

    let before = t.state.raft_index();
    let ops = r#"[
        {"Node":{"Verb":"set","Node":{"Node":"sim-node-9","Address":"10.0.0.9"}}},
        {"Service":{"Verb":"set","Node":"sim-node-9","Service":{"ID":"api-1","Service":"api","Port":9000}}},
        {"Service":{"Verb":"set","Node":"sim-node-9","Service":{"ID":"api-2","Service":"api","Port":9001}}},
        {"Check":{"Verb":"set","Check":{"Node":"sim-node-9","CheckID":"api-1-ttl","Name":"ttl","ServiceID":"api-1","Status":"passing"}}}
    ]"#;
    let r = put(&t, "/v1/txn", ops).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["Errors"], serde_json::Value::Null);
    assert_eq!(v["Results"].as_array().unwrap().len(), 4);
    assert_eq!(v["Results"][1]["Service"]["ID"], "api-1");
    assert_eq!(t.state.raft_index(), before + 1, "one raft index per txn");

    let e = next(&mut s).await;
    assert_eq!(e.index, before + 1);
    let Some(Payload::EventBatch(batch)) = &e.payload else {
        panic!("expected a batch, got {e:?}")
    };
    assert_eq!(batch.events.len(), 2);
    let ids: Vec<_> = batch.events.iter().map(|e| instance(e).1).collect();
    assert_eq!(ids, vec!["api-1", "api-2"]);
    let api1 = health(&batch.events[0])
        .check_service_node
        .as_ref()
        .unwrap();
    assert_eq!(
        api1.checks[0].status, "passing",
        "the final state of the txn"
    );
    assert_eq!(t.state.stats().txns, 1);

    // A failing op: nothing applied, 409 with the op index.
    let bad = r#"[
        {"Service":{"Verb":"set","Node":"sim-node-9","Service":{"ID":"api-3","Service":"api"}}},
        {"Service":{"Verb":"set","Node":"nowhere","Service":{"ID":"api-4","Service":"api"}}}
    ]"#;
    let r = put(&t, "/v1/txn", bad).await;
    assert_eq!(r.status, 409);
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["Errors"][0]["OpIndex"], 1);
    assert_eq!(t.state.raft_index(), before + 1);

    // Too many ops.
    let many = format!(
        "[{}]",
        vec![r#"{"Node":{"Verb":"get","Node":{"Node":"x"}}}"#; 129].join(",")
    );
    let r = put(&t, "/v1/txn", &many).await;
    assert_eq!(r.status, 413);
    assert_eq!(
        r.body,
        "Transaction contains too many operations (129 > 128)"
    );
}

#[tokio::test(start_paused = true)]
async fn resume_at_the_current_index_skips_the_snapshot() {
    let t = start_default().await;
    register(&t, "sim-node-1", "10.0.0.1", "web-1").await;
    let mut c = dial(t.rpc).await;
    let mut s = subscribe(&mut c, Topic::ServiceHealth, "web", 0).await;
    let (_, index) = read_snapshot(&mut s).await;
    drop(s);

    // Reconnect (new connection, as after a server restart of the link).
    // The resumed call stays unanswered (as grpc-go: no headers before the
    // first message) until the topic's next event. Yielding (not sleeping:
    // virtual time would run ahead of the socket) until the server has it.
    let mut c = dial(t.rpc).await;
    let mut call = std::pin::pin!(subscribe(&mut c, Topic::ServiceHealth, "web", index));
    for _ in 0..1_000_000 {
        if t.state.stats().resumes_served == 1 {
            break;
        }
        tokio::select! {
            biased;
            _ = &mut call => panic!("a resumed call answered before any event"),
            _ = tokio::task::yield_now() => {}
        }
    }
    assert_eq!(t.state.stats().resumes_served, 1);
    register(&t, "sim-node-3", "10.0.0.3", "web-3").await;
    let mut s = within(call).await;
    let e = next(&mut s).await;
    assert_eq!(e.index, index + 1, "the first message is the live event");
    assert_eq!(instance(&e).1, "web-3");
    let stats = t.state.stats();
    assert_eq!(stats.resumes_served, 1);
    assert_eq!(stats.snapshots_sent, 1);
}

#[tokio::test(start_paused = true)]
async fn resume_at_a_stale_index_gets_a_new_snapshot() {
    let t = start_default().await;
    register(&t, "sim-node-1", "10.0.0.1", "web-1").await;
    register(&t, "sim-node-2", "10.0.0.2", "web-2").await;
    let mut c = dial(t.rpc).await;
    let mut s = subscribe(&mut c, Topic::ServiceHealth, "web", 0).await;
    let (_, stale) = read_snapshot(&mut s).await;
    drop(s);
    put(&t, "/v1/catalog/deregister", r#"{"Node":"sim-node-2"}"#).await;
    register(&t, "sim-node-3", "10.0.0.3", "web-3").await;

    let mut s = subscribe(&mut c, Topic::ServiceHealth, "web", stale).await;
    let first = next(&mut s).await;
    assert_eq!(first.index, 0);
    assert_eq!(first.payload, Some(Payload::NewSnapshotToFollow(true)));
    let (items, index) = read_snapshot(&mut s).await;
    assert_eq!(index, t.state.raft_index());
    let ids: Vec<_> = items.iter().map(|e| instance(e).1).collect();
    assert_eq!(ids, vec!["web-1", "web-3"]);
    assert_eq!(t.state.stats().snapshots_sent, 2);
}

#[tokio::test(start_paused = true)]
async fn abort_subscriptions_ends_streams_with_aborted() {
    let t = start_default().await;
    register(&t, "sim-node-1", "10.0.0.1", "web-1").await;
    let mut c = dial(t.rpc).await;
    let mut a = subscribe(&mut c, Topic::ServiceHealth, "web", 0).await;
    let mut b = subscribe(&mut c, Topic::ServiceHealth, "api", 0).await;
    read_snapshot(&mut a).await;
    read_snapshot(&mut b).await;
    assert_eq!(t.state.stats().subscriptions_active, 2);
    t.state.abort_subscriptions();
    for s in [&mut a, &mut b] {
        let status = within(s.message()).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Aborted);
    }
    eventually(&t, "streams closed", |s| s.subscriptions_active == 0).await;
    // The connection stays usable: resubscribe at 0 on it.
    let mut again = subscribe(&mut c, Topic::ServiceHealth, "web", 0).await;
    assert_eq!(read_snapshot(&mut again).await.0.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn intentions_writes_arrive_as_config_entry_events() {
    let t = start_default().await;
    let mut c = dial(t.rpc).await;
    let mut s = subscribe(&mut c, Topic::ServiceIntentions, "api", 0).await;
    assert!(read_snapshot(&mut s).await.0.is_empty());

    let body = r#"{"Kind":"service-intentions","Name":"api","Sources":[{"Name":"web","Action":"allow"},{"Name":"*","Action":"deny"}]}"#;
    let r = put(&t, "/v1/config", body).await;
    assert_eq!((r.status, r.body.as_str()), (200, "true"));
    let e = next(&mut s).await;
    assert_eq!(e.index, t.state.raft_index());
    let Some(Payload::ConfigEntry(update)) = &e.payload else {
        panic!("expected a config entry, got {e:?}")
    };
    assert_eq!(update.op, config_entry_update::UpdateOp::Upsert as i32);
    let entry = update.config_entry.as_ref().unwrap();
    assert_eq!(entry.name, "api");
    let Some(config_entry::Entry::ServiceIntentions(i)) = &entry.entry else {
        panic!("no intentions")
    };
    assert_eq!(i.sources.len(), 2);
    assert_eq!(i.sources[0].name, "web");
    assert_eq!(i.sources[0].action, IntentionAction::Allow as i32);
    assert_eq!(i.sources[1].action, IntentionAction::Deny as i32);

    // A new subscriber's snapshot holds the entry.
    let mut fresh = subscribe(&mut c, Topic::ServiceIntentions, "api", 0).await;
    assert_eq!(read_snapshot(&mut fresh).await.0.len(), 1);

    // Check-and-set writes: cas=0 creates only, cas=N needs ModifyIndex N.
    let r = http(t.http, "PUT", "/v1/config?cas=0", body).await;
    assert_eq!(r.body, "false", "exists already");
    let r = http(
        t.http,
        "DELETE",
        "/v1/config/service-intentions/api?cas=1",
        "",
    )
    .await;
    assert_eq!(r.body, "false", "changed since index 1");
    let r = http(t.http, "DELETE", "/v1/config/service-intentions/api", "").await;
    assert_eq!(r.body, "{}");
    let e = next(&mut s).await;
    let Some(Payload::ConfigEntry(update)) = &e.payload else {
        panic!("expected a config entry")
    };
    assert_eq!(update.op, config_entry_update::UpdateOp::Delete as i32);
    assert_eq!(t.state.stats().config_entries_written, 2);
}

// ---------------------------------------------------------------- HTTP

#[tokio::test(start_paused = true)]
async fn catalog_register_answers_like_the_vector() {
    let t = start_default().await;
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/vectors/consul/http"
    );
    let request = std::fs::read_to_string(format!("{dir}/catalog-register.request.txt")).unwrap();
    let body = request
        .split("\r\n\r\n")
        .nth(1)
        .or_else(|| request.split("\n\n").nth(1))
        .unwrap();
    let expected =
        std::fs::read_to_string(format!("{dir}/catalog-register.response.json")).unwrap();
    let r = put(&t, "/v1/catalog/register", body.trim_end()).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.content_type, "application/json");
    assert_eq!(r.body, expected);

    let r = http(t.http, "GET", "/v1/health/service/web", "").await;
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v[0]["Node"]["Node"], "sim-node-1");
    assert_eq!(v[0]["Service"]["ID"], "web-1");
    assert_eq!(v[0]["Checks"][0]["Status"], "passing");

    let r = http(t.http, "GET", "/v1/status/leader", "").await;
    assert_eq!(r.body, format!("\"{}\"", t.rpc));
    assert_eq!(http(t.http, "GET", "/v1/nope", "").await.status, 404);
    assert_eq!(t.state.stats().registrations, 1);
}

#[tokio::test(start_paused = true)]
async fn serf_health_checks_are_accepted_but_not_stored() {
    let t = start_default().await;
    let body = r#"{"Node":"sim-node-1","Address":"10.0.0.1","Checks":[{"CheckID":"serfHealth","Name":"Serf","Status":"passing"}]}"#;
    assert_eq!(put(&t, "/v1/catalog/register", body).await.body, "true");
    // So a session that wants serfHealth (the default) fails like Consul.
    let r = put(
        &t,
        "/v1/session/create",
        r#"{"Node":"sim-node-1","TTL":"15s"}"#,
    )
    .await;
    assert_eq!(r.status, 500);
    assert_eq!(r.body, "Missing check 'serfHealth' registration");
}

#[tokio::test(start_paused = true)]
async fn session_ttl_below_the_minimum_is_refused_like_consul() {
    let t = start_default().await;
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/vectors/consul/http"
    );
    let expected =
        std::fs::read_to_string(format!("{dir}/session-create-ttl-5s-error.response.txt")).unwrap();
    let r = put(
        &t,
        "/v1/session/create",
        r#"{"Name":"vec-session-bad","NodeChecks":[],"TTL":"5s"}"#,
    )
    .await;
    assert_eq!(r.status, 500);
    assert_eq!(r.content_type, "text/plain; charset=utf-8");
    assert_eq!(r.body, expected);

    let r = put(
        &t,
        "/v1/session/create",
        r#"{"Node":"ghost","NodeChecks":[],"TTL":"15s"}"#,
    )
    .await;
    assert_eq!(
        (r.status, r.body.as_str()),
        (500, "Missing node registration")
    );
}

#[tokio::test(start_paused = true)]
async fn sessions_renew_and_expire_after_twice_the_ttl() {
    let t = start(ConsulTargetConfig {
        session_ttl_min: Duration::from_millis(50),
        ..ConsulTargetConfig::default()
    })
    .await;
    register(&t, "sim-node-1", "10.0.0.1", "web-1").await;
    let r = put(
        &t,
        "/v1/session/create",
        r#"{"Node":"sim-node-1","Name":"keepalive","NodeChecks":[],"TTL":"150ms","Behavior":"delete"}"#,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let id = serde_json::from_str::<serde_json::Value>(&r.body).unwrap()["ID"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(r.body.starts_with("{\n    \"ID\": \""));

    let r = put(&t, &format!("/v1/session/renew/{id}"), "").await;
    assert_eq!(r.status, 200);
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    let s = &v.as_array().unwrap()[0];
    assert_eq!(s["ID"], id.as_str());
    assert_eq!(s["Node"], "sim-node-1");
    assert_eq!(s["TTL"], "150ms");
    assert_eq!(s["Behavior"], "delete");
    assert_eq!(s["LockDelay"], 15_000_000_000u64);
    assert_eq!(s["NodeChecks"], serde_json::json!([]));
    assert_eq!(s["ServiceChecks"], serde_json::Value::Null);
    assert_eq!(t.state.stats().sessions_active, 1);

    // No more renewals: gone after 2 × 150 ms (+ sweep period).
    eventually(&t, "expired", |s| {
        s.sessions_expired == 1 && s.sessions_active == 0
    })
    .await;
    let r = put(&t, &format!("/v1/session/renew/{id}"), "").await;
    assert_eq!(r.status, 404);
    assert_eq!(r.body, format!("Session id '{id}' not found"));

    // Destroy.
    let r = put(&t, "/v1/session/create", r#"{"NodeChecks":[],"TTL":"1s"}"#).await;
    let id = serde_json::from_str::<serde_json::Value>(&r.body).unwrap()["ID"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        put(&t, &format!("/v1/session/destroy/{id}"), "").await.body,
        "true"
    );
    assert_eq!(
        put(&t, &format!("/v1/session/renew/{id}"), "").await.status,
        404
    );
    let stats = t.state.stats();
    assert_eq!((stats.sessions_created, stats.sessions_renewed), (2, 1));
}

#[tokio::test(start_paused = true)]
async fn shutdown_ends_both_servers_with_open_streams() {
    let mut t = start_default().await;
    let mut c = dial(t.rpc).await;
    let mut s = subscribe(&mut c, Topic::ServiceHealth, "web", 0).await;
    read_snapshot(&mut s).await;
    // An idle keep-alive HTTP connection too.
    let idle = TcpStream::connect(t.http).await.unwrap();
    t.shutdown.cancel();
    for server in t.servers.drain(..) {
        tokio::time::timeout(Duration::from_millis(2500), server)
            .await
            .expect("server ended in time")
            .unwrap()
            .unwrap();
    }
    // The stream ended (status or EOF), not hung.
    let end = within(s.message()).await;
    assert!(matches!(end, Ok(None) | Err(_)), "{end:?}");
    drop(idle);
    assert!(TcpStream::connect(t.rpc).await.is_err(), "listener closed");
}

/// A Subscribe request over the server's 64 KiB limit (a 100 KiB token) is
/// refused with OUT_OF_RANGE before it is buffered; the connection serves
/// the next call.
#[tokio::test(start_paused = true)]
async fn an_oversized_subscribe_request_is_refused() {
    let t = start_default().await;
    let mut c = dial(t.rpc).await;
    let mut req = request(Topic::ServiceHealth, "web", 0);
    req.token = "x".repeat(100 * 1024);
    let status = within(c.subscribe(req)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    let mut s = subscribe(&mut c, Topic::ServiceHealth, "web", 0).await;
    let (_, index) = read_snapshot(&mut s).await;
    assert!(index > 0);
}

/// `stats()` reads the sessions while sessions are created (which hold the
/// catalog, then the sessions): it must never hold one lock while it takes
/// the other in the opposite order. A CI run hung for 85 minutes on that
/// (a test polling `stats()` while a child run created its sessions). A
/// deadlock blocks the threads for good, so a watchdog thread reports it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_can_be_read_while_sessions_are_created() {
    let t = start_default().await;
    register(&t, "sim-node-1", "10.0.0.1", "web-1").await;
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let state = t.state.clone();
    let reader = std::thread::spawn(move || {
        // Reads that saw sessions: the reading overlapped the creations.
        let mut overlapping = 0u64;
        while done_rx.try_recv().is_err() {
            overlapping += state.stats().sessions_active.min(1);
        }
        overlapping
    });
    let writers: Vec<_> = (0..4)
        .map(|_| {
            let addr = t.http;
            tokio::spawn(async move {
                for _ in 0..100 {
                    let r = http(
                        addr,
                        "PUT",
                        "/v1/session/create",
                        r#"{"Node":"sim-node-1","NodeChecks":[],"TTL":"60s"}"#,
                    )
                    .await;
                    assert_eq!(r.status, 200, "{}", r.body);
                }
            })
        })
        .collect();
    let all = async {
        for w in writers {
            w.await.unwrap();
        }
    };
    // Not `within`: deadlocked workers never fire a timer, and the test
    // could not end. The watchdog ends the process with the reason.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if rx.recv_timeout(Duration::from_secs(30)).is_err() {
            eprintln!("creating 400 sessions while reading stats() took over 30 s: deadlock");
            std::process::exit(101);
        }
    });
    all.await;
    tx.send(()).unwrap();
    done_tx.send(()).unwrap();
    assert!(reader.join().unwrap() > 0, "no read saw a session");
    assert_eq!(t.state.stats().sessions_active, 400);
}
