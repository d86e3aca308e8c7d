//! ACLs on the embedded Consul target (`acl_tokens`, default deny): tokens
//! and policies made through `/v1/acl/*` with the management token, as
//! the agent side makes one per agent (a node identity, a service
//! identity, the run's policy), then each agent's calls allowed or denied
//! with that token, in Consul 1.20's words, on the RPC port (msgpack net/rpc
//! over yamux, and Subscribe) and the HTTP API; listed and deleted at the
//! end. On `127.0.0.1:0`, bounded by [`within`].
#![cfg(feature = "consul")]

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use agent_sim_proto::consul::subscribe::{
    Event, NamedSubject, SubscribeRequest, Topic, event::Payload,
    state_change_subscription_client::StateChangeSubscriptionClient, subscribe_request::Subject,
};
use agent_sim_server::consul::ConsulTargetConfig;
use bytes::Bytes;
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper::{Request, Response, Uri};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;
use tonic::Streaming;

use crate::common;

use crate::common::{Reply, Target, start, within};

/// The management token the target starts with.
const ROOT: &str = "11111111-2222-3333-4444-555555555555";

async fn acl_target() -> Target {
    start(ConsulTargetConfig {
        acl_tokens: Some(vec![ROOT.into()]),
        ..Default::default()
    })
    .await
}

// ---------------------------------------------------------------- HTTP

/// One request with `token` in `X-Consul-Token` ("" sends none).
async fn api(t: &Target, method: &str, path: &str, token: &str, body: Value) -> Reply {
    let body = if body.is_null() {
        Bytes::new()
    } else {
        Bytes::from(body.to_string())
    };
    within(common::call_with_token(t.http, method, path, token, body)).await
}

/// A token made with the management token: (accessor, secret).
async fn make_token(t: &Target, body: Value) -> (String, String) {
    let r = api(t, "PUT", "/v1/acl/token", ROOT, body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let s = |k: &str| v[k].as_str().unwrap().to_owned();
    (s("AccessorID"), s("SecretID"))
}

fn agent_token(node: &str, policy: Option<&str>) -> Value {
    let mut body = json!({
        "Description": format!("agent-sim:t {node}"),
        "NodeIdentities": [{"NodeName": node, "Datacenter": "dc1"}],
        "ServiceIdentities": [{"ServiceName": "app"}],
    });
    if let Some(p) = policy {
        body["Policies"] = json!([{ "Name": p }]);
    }
    body
}

// ---------------------------------------------------------------- RPC

/// One call on the RPC port, within the test's bound.
async fn rpc(t: &Target, method: &str, args: Value) -> (String, Vec<u8>) {
    within(common::rpc_call(t.rpc, method, &args)).await
}

fn register_node(node: &str, token: &str) -> Value {
    json!({
        "Datacenter": "dc1", "Node": node, "Address": "10.0.0.1",
        "ID": "0d3c2a5e-1d2b-4c3d-8e4f-5a6b7c8d9e0f", "Token": token,
    })
}

fn register_service(node: &str, service: &str, token: &str) -> Value {
    let mut v = register_node(node, token);
    v["Service"] = json!({"ID": service, "Service": service, "Port": 8080});
    v
}

fn session_create(node: &str, token: &str) -> Value {
    json!({
        "Datacenter": "dc1", "Op": "create", "Token": token,
        "Session": {"Node": node, "Name": "lock", "TTL": "30s", "NodeChecks": []},
    })
}

fn denied(accessor: &str, perm: &str, name: &str) -> String {
    format!(
        "Permission denied: token with AccessorID '{accessor}' lacks permission '{perm}' on \"{name}\""
    )
}

// ---------------------------------------------------------------- tests

#[tokio::test]
async fn a_node_identity_token_writes_its_own_node_only() {
    let t = acl_target().await;
    let (accessor, secret) = make_token(&t, agent_token("t-1", None)).await;

    let (e, _) = rpc(&t, "Catalog.Register", register_node("t-1", &secret)).await;
    assert_eq!(e, "");
    let (e, _) = rpc(&t, "Catalog.Register", register_node("t-2", &secret)).await;
    assert_eq!(e, denied(&accessor, "node:write", "t-2"));

    // Its service identity's service (and sidecar) may be registered on
    // its node; another service may not.
    let (e, _) = rpc(
        &t,
        "Catalog.Register",
        register_service("t-1", "app", &secret),
    )
    .await;
    assert_eq!(e, "");
    let (e, _) = rpc(
        &t,
        "Catalog.Register",
        register_service("t-1", "db", &secret),
    )
    .await;
    assert_eq!(e, denied(&accessor, "service:write", "db"));

    // Coordinates of its node only.
    let dims = [0.0_f64; 8];
    let coord = json!({"Vec": dims, "Error": 1.5, "Adjustment": 0.0, "Height": 1e-5});
    let update = |node: &str| json!({"Node": node, "Coord": coord, "Token": secret});
    assert_eq!(rpc(&t, "Coordinate.Update", update("t-1")).await.0, "");
    let (e, _) = rpc(&t, "Coordinate.Update", update("t-2")).await;
    assert_eq!(e, denied(&accessor, "node:write", "t-2"));

    // Identities grant no session: session:write on the node is lacking.
    let (e, _) = rpc(&t, "Session.Apply", session_create("t-1", &secret)).await;
    assert_eq!(e, denied(&accessor, "session:write", "t-1"));

    // Reads of the service: allowed (service_prefix "" read).
    let read = json!({"ServiceName": "app", "Token": secret});
    let (e, body) = rpc(&t, "Health.ServiceNodes", read).await;
    assert_eq!(e, "");
    let v: Value = agent_sim_proto::msgpack::decode(&body).unwrap();
    assert_eq!(v["Nodes"].as_array().unwrap().len(), 1, "{v}");

    // An unknown secret.
    let stranger = "99999999-0000-0000-0000-000000000000";
    let (e, _) = rpc(&t, "Catalog.Register", register_node("t-1", stranger)).await;
    assert_eq!(e, "ACL not found");

    // Over HTTP the same words, 403.
    let body = json!({"Node": "t-2", "Address": "10.0.0.2"});
    let r = api(&t, "PUT", "/v1/catalog/register", &secret, body).await;
    assert_eq!(
        (r.status, r.text()),
        (403, denied(&accessor, "node:write", "t-2"))
    );
    let s = t.state.stats().acl;
    assert!(s.denied["node:write"] >= 3, "{s:?}");
    assert_eq!(s.not_found, 1, "{s:?}");
}

#[tokio::test]
async fn the_runs_policy_adds_sessions_and_key_reads() {
    let t = acl_target().await;
    let rules = "session_prefix \"t-\" {\n  policy = \"write\"\n}\nkey_prefix \"app/\" {\n  policy = \"read\"\n}\n";
    let r = api(
        &t,
        "PUT",
        "/v1/acl/policy",
        ROOT,
        json!({"Name": "agent-sim-t", "Description": "agent-sim:t what agents need", "Rules": rules}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let p = r.json();
    let keys: Vec<&str> = p.as_object().unwrap().keys().map(String::as_str).collect();
    for k in [
        "ID",
        "Name",
        "Description",
        "Rules",
        "Hash",
        "CreateIndex",
        "ModifyIndex",
    ] {
        assert!(keys.contains(&k), "{k} in {p}");
    }
    assert_eq!(p["Rules"], rules);

    let (accessor, secret) = make_token(&t, agent_token("t-1", Some("agent-sim-t"))).await;
    assert_eq!(
        rpc(&t, "Catalog.Register", register_node("t-1", &secret))
            .await
            .0,
        ""
    );
    let (e, body) = rpc(&t, "Session.Apply", session_create("t-1", &secret)).await;
    assert_eq!(e, "");
    let id: String = agent_sim_proto::msgpack::decode(&body).unwrap();
    let renew = json!({"SessionID": id, "Token": secret});
    assert_eq!(rpc(&t, "Session.Renew", renew).await.0, "");

    // Keys: read under app/, no write; nothing elsewhere.
    let put = api(&t, "PUT", "/v1/kv/app/x", ROOT, json!("v")).await;
    assert_eq!(put.status, 200);
    let r = api(&t, "GET", "/v1/kv/app/x", &secret, Value::Null).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = api(&t, "PUT", "/v1/kv/app/x", &secret, json!("w")).await;
    assert_eq!(
        (r.status, r.text()),
        (403, denied(&accessor, "key:write", "app/x"))
    );
    let get = json!({"Key": "other/y", "Token": secret});
    assert_eq!(
        rpc(&t, "KVS.Get", get).await.0,
        denied(&accessor, "key:read", "other/y")
    );
}

#[tokio::test]
async fn tokens_are_listed_and_deleted_by_the_management_token() {
    let t = acl_target().await;
    let (a1, _) = make_token(&t, agent_token("t-1", None)).await;
    let (a2, s2) = make_token(&t, agent_token("t-2", None)).await;

    let r = api(&t, "GET", &format!("/v1/acl/token/{a1}"), ROOT, Value::Null).await;
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(
        v["NodeIdentities"],
        json!([{"NodeName": "t-1", "Datacenter": "dc1"}])
    );
    assert_eq!(v["ServiceIdentities"], json!([{"ServiceName": "app"}]));
    assert_eq!(v["Local"], false);
    assert!(v.get("Policies").is_none(), "{v}");

    let r = api(&t, "GET", "/v1/acl/tokens", ROOT, Value::Null).await;
    assert_eq!(r.status, 200);
    let ours: Vec<String> = r
        .json()
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| {
            t["Description"]
                .as_str()
                .unwrap()
                .starts_with("agent-sim:t ")
        })
        .map(|t| t["AccessorID"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ours.len(), 2);
    assert!(ours.contains(&a1) && ours.contains(&a2));

    // An agent's token may not manage tokens; nor may no token.
    let r = api(&t, "GET", "/v1/acl/tokens", &s2, Value::Null).await;
    assert_eq!(
        (r.status, r.text()),
        (
            403,
            format!("Permission denied: token with AccessorID '{a2}' lacks permission 'acl:read'")
        )
    );
    let r = api(&t, "PUT", "/v1/acl/token", "", json!({})).await;
    assert_eq!(
        (r.status, r.text()),
        (
            403,
            "Permission denied: anonymous token lacks permission 'acl:write'. The anonymous token \
             is used implicitly when a request does not specify a token."
                .to_owned()
        )
    );

    for a in &ours {
        let r = api(
            &t,
            "DELETE",
            &format!("/v1/acl/token/{a}"),
            ROOT,
            Value::Null,
        )
        .await;
        assert_eq!((r.status, r.text()), (200, "true".to_owned()));
    }
    let r = api(
        &t,
        "DELETE",
        &format!("/v1/acl/token/{a1}"),
        ROOT,
        Value::Null,
    )
    .await;
    assert_eq!(
        (r.status, r.text()),
        (404, "Cannot find token to delete".to_owned())
    );
    let (e, _) = rpc(&t, "Catalog.Register", register_node("t-2", &s2)).await;
    assert_eq!(e, "ACL not found");
    // Left: the anonymous token and the management one.
    let r = api(&t, "GET", "/v1/acl/tokens", ROOT, Value::Null).await;
    let left: Vec<String> = r
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["Description"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left.contains(&"Anonymous Token".to_owned()), "{left:?}");
}

#[tokio::test]
async fn the_agent_sides_flow_runs_end_to_end() {
    let t = acl_target().await;
    // The datacenter the node identities must name.
    let r = api(&t, "GET", "/v1/catalog/datacenters", ROOT, Value::Null).await;
    assert_eq!((r.status, r.json()), (200, json!(["dc1"])));
    let policy = json!({
        "Name": "agent-sim-t-from-0",
        "Description": "agent-sim:t what agents from 0 need beyond their identities",
        "Rules": "session_prefix \"\" {\n  policy = \"write\"\n}\n",
    });
    let r = api(&t, "PUT", "/v1/acl/policy", ROOT, policy).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let policy_id = r.json()["ID"].as_str().unwrap().to_owned();
    let (accessor, secret) = make_token(&t, agent_token("t-0", Some("agent-sim-t-from-0"))).await;
    let r = api(
        &t,
        "GET",
        &format!("/v1/acl/token/{accessor}"),
        ROOT,
        Value::Null,
    )
    .await;
    assert_eq!(
        r.json()["Policies"],
        json!([{"ID": policy_id, "Name": "agent-sim-t-from-0"}])
    );
    assert_eq!(
        rpc(&t, "Catalog.Register", register_node("t-0", &secret))
            .await
            .0,
        ""
    );
    assert_eq!(
        rpc(&t, "Session.Apply", session_create("t-0", &secret))
            .await
            .0,
        ""
    );

    // Cleanup: the run's policies by description; the built-ins stay.
    let r = api(&t, "GET", "/v1/acl/policies", ROOT, Value::Null).await;
    let listed = r.json();
    let names: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["Name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"global-management"), "{names:?}");
    let ours: Vec<&Value> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| {
            p["Description"]
                .as_str()
                .unwrap()
                .starts_with("agent-sim:t ")
        })
        .collect();
    assert_eq!(ours.len(), 1);
    assert_eq!(ours[0]["Datacenters"], Value::Null);
    let path = format!("/v1/acl/token/{accessor}");
    assert_eq!(
        api(&t, "DELETE", &path, ROOT, Value::Null).await.text(),
        "true"
    );
    let path = format!("/v1/acl/policy/{policy_id}");
    assert_eq!(
        api(&t, "DELETE", &path, ROOT, Value::Null).await.text(),
        "true"
    );
    let r = api(&t, "DELETE", &path, ROOT, Value::Null).await;
    assert_eq!(
        (r.status, r.text()),
        (404, "Cannot find policy to delete".to_owned())
    );
    let builtin = "/v1/acl/policy/00000000-0000-0000-0000-000000000001";
    let r = api(&t, "DELETE", builtin, ROOT, Value::Null).await;
    assert_eq!(
        r.text(),
        "Delete operation not permitted on the builtin global-management policy"
    );
}

#[tokio::test]
async fn a_txn_answers_each_op_the_token_may_not_do() {
    let t = acl_target().await;
    let (accessor, secret) = make_token(&t, agent_token("t-1", None)).await;
    let ops = json!([
        {"KV": {"Verb": "set", "Key": "app/x", "Value": "dg=="}},
        {"Node": {"Verb": "set", "Node": {"Node": "t-1", "Address": "10.0.0.1"}}},
        {"Node": {"Verb": "set", "Node": {"Node": "t-2", "Address": "10.0.0.2"}}},
    ]);
    let r = api(&t, "PUT", "/v1/txn", &secret, ops).await;
    assert_eq!(r.status, 409, "{}", r.text());
    assert_eq!(
        r.json()["Errors"],
        json!([
            {"OpIndex": 0, "What": denied(&accessor, "key:write", "app/x")},
            {"OpIndex": 2, "What": denied(&accessor, "node:write", "t-2")},
        ])
    );
    // Nothing applied; with the management token all of it is.
    let r = api(&t, "GET", "/v1/kv/app/x", ROOT, Value::Null).await;
    assert_eq!(r.status, 404);
    // A get of a key it may not read is denied too (nothing unreadable is
    // answered), over HTTP and over the RPC port.
    let get = json!([{"KV": {"Verb": "get", "Key": "app/x"}}]);
    let r = api(&t, "PUT", "/v1/txn", "", get).await;
    assert_eq!(r.status, 409);
    let what = r.json()["Errors"][0]["What"].as_str().unwrap().to_owned();
    assert!(
        what.starts_with(
            "Permission denied: anonymous token lacks permission 'key:read' on \"app/x\""
        ),
        "{what}"
    );
    let args =
        json!({"Ops": [{"KV": {"Verb": "get", "DirEnt": {"Key": "app/x"}}}], "Token": secret});
    let (e, body) = rpc(&t, "Txn.Read", args).await;
    assert_eq!(e, "");
    let v: Value = agent_sim_proto::msgpack::decode(&body).unwrap();
    assert_eq!(
        v["Errors"][0]["What"],
        denied(&accessor, "key:read", "app/x"),
        "{v}"
    );
}

#[tokio::test]
async fn bad_requests_are_refused_in_consuls_words() {
    let t = acl_target().await;
    let r = api(
        &t,
        "PUT",
        "/v1/acl/token",
        ROOT,
        json!({"NodeIdentities": [{"NodeName": "Web.1", "Datacenter": "dc1"}]}),
    )
    .await;
    assert_eq!(r.status, 500);
    assert!(
        r.text().starts_with("Node identity has an invalid name."),
        "{}",
        r.text()
    );
    let r = api(
        &t,
        "PUT",
        "/v1/acl/token",
        ROOT,
        json!({"Policies": [{"Name": "nope"}]}),
    )
    .await;
    assert_eq!(
        (r.status, r.text()),
        (500, "No such ACL policy with name \"nope\"".to_owned())
    );
    let r = api(
        &t,
        "PUT",
        "/v1/acl/policy",
        ROOT,
        json!({"Name": "p", "Rules": "node \"x\" { policy = \"sudo\" }"}),
    )
    .await;
    assert_eq!(r.status, 500);
    assert!(
        r.text().starts_with("Invalid node policy: "),
        "{}",
        r.text()
    );

    // ACLs off: every ACL endpoint is 401.
    let off = start(ConsulTargetConfig::default()).await;
    for (m, p) in [
        ("PUT", "/v1/acl/token"),
        ("GET", "/v1/acl/tokens"),
        ("GET", "/v1/acl/policies"),
    ] {
        let r = api(&off, m, p, "", json!({})).await;
        assert_eq!(
            (r.status, r.text()),
            (401, "ACL support disabled".to_owned()),
            "{m} {p}"
        );
    }
}

// ---------------------------------------------------------------- Subscribe

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

async fn subscribe(rpc: SocketAddr, key: &str, token: &str) -> Streaming<Event> {
    let mut s = TcpStream::connect(rpc).await.unwrap();
    s.write_all(&[0x08]).await.unwrap();
    let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut c =
        StateChangeSubscriptionClient::with_origin(H2(send), Uri::from_static("http://127.0.0.1"));
    let req = SubscribeRequest {
        topic: Topic::ServiceHealth as i32,
        token: token.into(),
        subject: Some(Subject::NamedSubject(NamedSubject {
            key: key.into(),
            ..Default::default()
        })),
        ..Default::default()
    };
    // Not under `within`: on paused time a timer would run out while the
    // connection's first exchange is on the wire.
    c.subscribe(req).await.unwrap().into_inner()
}

async fn next(s: &mut Streaming<Event>) -> Event {
    within(s.message()).await.unwrap().expect("stream ended")
}

#[tokio::test(start_paused = true)]
async fn a_subscriber_that_may_not_read_the_service_sees_nothing() {
    let t = acl_target().await;
    let policy = json!({"Name": "web-reader", "Rules": "service \"web\" { policy = \"read\" }"});
    assert_eq!(
        api(&t, "PUT", "/v1/acl/policy", ROOT, policy).await.status,
        200
    );
    let (_, secret) = make_token(&t, json!({"Policies": [{"Name": "web-reader"}]})).await;
    for svc in ["web", "db"] {
        let body = json!({"Node": "n1", "Address": "10.0.0.1", "Service": {"Service": svc}});
        assert_eq!(
            api(&t, "PUT", "/v1/catalog/register", ROOT, body)
                .await
                .status,
            200
        );
    }

    let mut web = subscribe(t.rpc, "web", &secret).await;
    let mut db = subscribe(t.rpc, "db", &secret).await;
    assert!(matches!(
        next(&mut web).await.payload,
        Some(Payload::ServiceHealth(_))
    ));
    assert!(matches!(
        next(&mut web).await.payload,
        Some(Payload::EndOfSnapshot(true))
    ));
    // db: an empty snapshot, then no events for its changes.
    assert!(matches!(
        next(&mut db).await.payload,
        Some(Payload::EndOfSnapshot(true))
    ));
    let body = json!({"Node": "n2", "Address": "10.0.0.2", "Service": {"Service": "db"}});
    assert_eq!(
        api(&t, "PUT", "/v1/catalog/register", ROOT, body)
            .await
            .status,
        200
    );
    let quiet = tokio::time::timeout(Duration::from_secs(5), db.message()).await;
    assert!(
        quiet.is_err(),
        "an event reached a blind subscriber: {quiet:?}"
    );

    // Over HTTP the read is filtered to nothing.
    let r = api(&t, "GET", "/v1/health/service/db", &secret, Value::Null).await;
    assert_eq!((r.status, r.json()), (200, json!([])));
    assert_eq!(r.header("x-consul-results-filtered-by-acls"), "true");
}
