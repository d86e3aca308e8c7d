//! The embedded Sensu endpoint against a plain tokio-tungstenite client on 127.0.0.1:0,
//! frames built with the agent codec: upgrade checks, entity_config, validation,
//! check scheduling, JSON mode and shutdown.

#![cfg(feature = "sensu")]

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use agent_sim_proto::sensu::{v2, v3};
use agent_sim_sensu::codec::{self, Encoding};
use agent_sim_server::sensu::{
    CheckSpec, SensuTargetConfig, SensuTargetSnapshot, SensuTargetStats, serve,
};
use agent_sim_testkit::bounded::until;
use base64::Engine as _;
use futures_util::{SinkExt as _, StreamExt as _};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::handshake::client::Response;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_util::sync::CancellationToken;

type Ws = WebSocketStream<TcpStream>;

const NS: &str = "default";
const CHECK: &str = "agent-sim-check";
const ENTITY_CHECK: &str = "entity-check";

/// Every test body runs under this bound.
async fn bounded<F: Future<Output = ()>>(f: F) {
    tokio::time::timeout(Duration::from_secs(5), f)
        .await
        .expect("test exceeded 5 s");
}

struct Target {
    addr: SocketAddr,
    stats: Arc<SensuTargetStats>,
    shutdown: CancellationToken,
    task: JoinHandle<io::Result<()>>,
}

fn check(name: &str, subscription: &str) -> CheckSpec {
    CheckSpec {
        name: name.to_owned(),
        command: "!sensu_test_check!".to_owned(),
        interval: Duration::from_millis(200),
        subscriptions: vec![subscription.to_owned()],
    }
}

async fn start_with(cfg: SensuTargetConfig) -> Target {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stats = Arc::new(SensuTargetStats::default());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(serve(listener, cfg, stats.clone(), shutdown.clone()));
    Target {
        addr,
        stats,
        shutdown,
        task,
    }
}

async fn start() -> Target {
    start_with(SensuTargetConfig {
        checks: vec![check(CHECK, "linux")],
        ..Default::default()
    })
    .await
}

/// Upgrade request of a simulated agent.
struct Hello<'a> {
    name: &'a str,
    namespace: Option<&'a str>,
    credentials: Option<(&'a str, &'a str)>,
    subscriptions: &'a str,
    encoding: Encoding,
}

impl<'a> Hello<'a> {
    fn new(name: &'a str, subscriptions: &'a str) -> Self {
        Self {
            name,
            namespace: Some(NS),
            credentials: Some(("agent", "P@ssw0rd!")),
            subscriptions,
            encoding: Encoding::Protobuf,
        }
    }
}

async fn try_connect(addr: SocketAddr, hello: &Hello<'_>) -> Result<(Ws, Response), WsError> {
    let mut req = format!("ws://{addr}/").into_client_request().unwrap();
    let h = req.headers_mut();
    if let Some(ns) = hello.namespace {
        h.insert("Sensu-Namespace", ns.parse().unwrap());
    }
    if let Some((user, password)) = hello.credentials {
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        h.insert("Authorization", format!("Basic {token}").parse().unwrap());
        h.insert("Sensu-User", user.parse().unwrap());
    }
    h.insert("Sensu-AgentName", hello.name.parse().unwrap());
    h.insert("Sensu-Subscriptions", hello.subscriptions.parse().unwrap());
    if hello.encoding == Encoding::Protobuf {
        h.insert("Accept", "application/octet-stream".parse().unwrap());
    }
    let tcp = TcpStream::connect(addr).await.unwrap();
    tokio_tungstenite::client_async(req, tcp).await
}

async fn connect(addr: SocketAddr, hello: &Hello<'_>) -> (Ws, Response) {
    try_connect(addr, hello).await.expect("upgrade accepted")
}

fn rejected_status(r: Result<(Ws, Response), WsError>) -> u16 {
    match r {
        Err(WsError::Http(resp)) => resp.status().as_u16(),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("upgrade unexpectedly accepted"),
    }
}

/// Next data frame as (kind, body); control frames are skipped.
async fn recv(ws: &mut Ws) -> (String, Vec<u8>) {
    loop {
        match ws.next().await.expect("stream open").expect("read ok") {
            Message::Binary(p) => {
                let f = codec::split_frame(&p).expect("well-formed frame");
                return (f.kind.to_owned(), f.body.to_vec());
            }
            Message::Ping(_) | Message::Pong(_) => {}
            other => panic!("unexpected message {other:?}"),
        }
    }
}

/// Next frame of `kind`, skipping others (check requests may interleave).
async fn recv_kind(ws: &mut Ws, kind: &str) -> Vec<u8> {
    loop {
        let (k, body) = recv(ws).await;
        if k == kind {
            return body;
        }
    }
}

async fn send_event(ws: &mut Ws, kind: &str, ev: &v2::Event, enc: Encoding) {
    let body = codec::encode_event(ev, enc).unwrap();
    ws.send(Message::binary(codec::encode_frame(kind, &body)))
        .await
        .unwrap();
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn meta(name: &str) -> Option<v2::ObjectMeta> {
    Some(v2::ObjectMeta {
        name: name.to_owned(),
        namespace: NS.to_owned(),
        ..Default::default()
    })
}

fn entity(name: &str) -> v2::Entity {
    v2::Entity {
        entity_class: "agent".to_owned(),
        metadata: meta(name),
        subscriptions: vec!["linux".to_owned(), format!("entity:{name}")],
        user: "agent".to_owned(),
        deregister: true,
        last_seen: unix_now(),
        ..Default::default()
    }
}

fn keepalive(name: &str, timestamp: i64) -> v2::Event {
    v2::Event {
        timestamp,
        entity: Some(entity(name)),
        check: Some(v2::Check {
            metadata: meta("keepalive"),
            interval: 20,
            timeout: 120,
            ..Default::default()
        }),
        metadata: meta(""),
        id: vec![0x42; 16],
        sequence: 1,
        ..Default::default()
    }
}

/// The agent's reply to a check request.
fn reply(name: &str, req: &v2::CheckRequest) -> v2::Event {
    let config = req.config.clone().unwrap();
    v2::Event {
        timestamp: unix_now(),
        entity: Some(entity(name)),
        check: Some(v2::Check {
            command: config.command,
            interval: config.interval,
            subscriptions: config.subscriptions,
            metadata: config.metadata,
            issued: req.issued,
            executed: unix_now(),
            output: "ok".to_owned(),
            processed_by: name.to_owned(),
            ..Default::default()
        }),
        metadata: meta(""),
        id: vec![0x43; 16],
        sequence: 1,
        ..Default::default()
    }
}

fn check_name(req: &v2::CheckRequest) -> &str {
    &req.config.as_ref().unwrap().metadata.as_ref().unwrap().name
}

/// The stats once `pred` holds (bounded).
async fn wait_for(
    stats: &SensuTargetStats,
    pred: impl Fn(&SensuTargetSnapshot) -> bool,
) -> SensuTargetSnapshot {
    until(
        Duration::from_secs(3),
        "the target's counters",
        async || {
            let s = stats.snapshot();
            pred(&s).then_some(s)
        },
    )
    .await
}

#[tokio::test(start_paused = true)]
async fn unknown_or_missing_namespace_is_404() {
    bounded(async {
        let t = start().await;
        let mut hello = Hello::new("a-1", "linux");
        hello.namespace = Some("nope");
        assert_eq!(rejected_status(try_connect(t.addr, &hello).await), 404);
        hello.namespace = None;
        assert_eq!(rejected_status(try_connect(t.addr, &hello).await), 404);
        let s = t.stats.snapshot();
        assert_eq!((s.upgrades_rejected, s.rejected_namespace), (2, 2));
        assert_eq!(s.upgrades_accepted, 0);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn missing_or_wrong_credentials_are_401() {
    bounded(async {
        let t = start().await;
        // Missing: raw request, to see the body.
        let mut tcp = TcpStream::connect(t.addr).await.unwrap();
        tcp.write_all(
            b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
              Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
              Sensu-Namespace: default\r\nSensu-AgentName: a-1\r\n\r\n",
        )
        .await
        .unwrap();
        let mut resp = String::new();
        tcp.read_to_string(&mut resp).await.unwrap();
        assert!(resp.starts_with("HTTP/1.1 401"), "{resp}");
        // Sensu 6.12's words, newline included (Go's http.Error).
        assert!(resp.ends_with("\r\n\r\nmissing credentials\n"), "{resp}");

        let mut hello = Hello::new("a-1", "linux");
        hello.credentials = Some(("agent", "wrong"));
        assert_eq!(rejected_status(try_connect(t.addr, &hello).await), 401);
        hello.credentials = Some(("other", "P@ssw0rd!"));
        assert_eq!(rejected_status(try_connect(t.addr, &hello).await), 401);
        let s = t.stats.snapshot();
        assert_eq!((s.upgrades_rejected, s.rejected_credentials), (3, 3));
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn protobuf_session_entity_config_keepalive_and_check_request() {
    bounded(async {
        let t = start().await;
        let (mut ws, resp) = connect(t.addr, &Hello::new("pb-1", "linux,extra")).await;
        let h = resp.headers();
        assert_eq!(h["content-type"], "application/octet-stream");
        assert_eq!(h["backend-id"], "agent-sim");
        let accept: Vec<_> = h.get_all("accept").iter().collect();
        assert_eq!(accept, ["application/octet-stream", "application/json"]);

        // First frame: the placeholder, byte for byte what Sensu Go 6.12 sends.
        let (kind, body) = recv(&mut ws).await;
        assert_eq!(kind, "entity_config");
        let mut expected = vec![0x0a, 0x14, 0x0a, 0x09];
        expected.extend_from_slice(b"not found");
        expected.extend_from_slice(&[0x12, 0x07]);
        expected.extend_from_slice(b"default");
        expected.extend_from_slice(&[0x12, 0x05]);
        expected.extend_from_slice(b"agent");
        expected.extend_from_slice(&[0x32, 0x00]);
        assert_eq!(body, expected);

        send_event(
            &mut ws,
            "keepalive",
            &keepalive("pb-1", unix_now()),
            Encoding::Protobuf,
        )
        .await;
        let body = recv_kind(&mut ws, "entity_config").await;
        let cfg: v3::EntityConfig = codec::decode_entity_config(&body, Encoding::Protobuf).unwrap();
        let m = cfg.metadata.as_ref().unwrap();
        assert_eq!((m.name.as_str(), m.namespace.as_str()), ("pb-1", NS));
        assert_eq!(cfg.entity_class, "agent");
        assert_eq!(cfg.user, "agent");
        assert_eq!(cfg.subscriptions, ["linux", "extra", "entity:pb-1"]);
        assert!(cfg.deregister);
        wait_for(&t.stats, |s| s.keepalives_received == 1).await;

        // Check requests arrive for the matching subscription, issued increasing.
        let body = recv_kind(&mut ws, "check_request").await;
        let first = codec::decode_check_request(&body, Encoding::Protobuf).unwrap();
        let config = first.config.as_ref().unwrap();
        assert_eq!(check_name(&first), CHECK);
        assert_eq!(config.metadata.as_ref().unwrap().namespace, NS);
        assert_eq!(config.command, "!sensu_test_check!");
        assert_eq!(config.subscriptions, ["linux"]);
        assert_eq!(config.interval, 1);
        assert!(config.publish);
        assert!(first.issued >= unix_now() - 5, "issued {}", first.issued);
        send_event(&mut ws, "event", &reply("pb-1", &first), Encoding::Protobuf).await;
        let s = wait_for(&t.stats, |s| s.check_replies_received == 1).await;
        assert_eq!(s.events_received, 1);
        assert!(s.check_replies_current <= 1);

        let body = recv_kind(&mut ws, "check_request").await;
        let second = codec::decode_check_request(&body, Encoding::Protobuf).unwrap();
        assert!(second.issued > first.issued);

        let s = t.stats.snapshot();
        assert_eq!(s.upgrades_accepted, 1);
        assert_eq!(s.sessions_active, 1);
        assert!(s.check_requests_sent >= 2 && s.check_requests_published >= 2);
        assert_eq!(s.entity_configs_sent, 2);
        assert_eq!((s.events_rejected, s.frames_invalid), (0, 0));
        assert!(s.bytes_received > 0);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn check_requests_follow_subscriptions_and_entity_names() {
    bounded(async {
        let t = start_with(SensuTargetConfig {
            checks: vec![
                check(CHECK, "linux"),
                check(ENTITY_CHECK, "entity:special-1"),
            ],
            ..Default::default()
        })
        .await;
        let (mut lin, _) = connect(t.addr, &Hello::new("lin-1", "linux")).await;
        let (mut win, _) = connect(t.addr, &Hello::new("win-1", "windows")).await;
        let (mut special, _) = connect(t.addr, &Hello::new("special-1", "linux")).await;
        for ws in [&mut lin, &mut win, &mut special] {
            assert_eq!(recv(ws).await.0, "entity_config");
        }

        // Both checks reach special-1 (subscription and entity:special-1).
        let mut seen = Vec::new();
        while seen.len() < 2 {
            let body = recv_kind(&mut special, "check_request").await;
            let req = codec::decode_check_request(&body, Encoding::Protobuf).unwrap();
            let name = check_name(&req).to_owned();
            if !seen.contains(&name) {
                seen.push(name);
            }
        }
        seen.sort();
        assert_eq!(seen, [CHECK, ENTITY_CHECK]);

        // lin-1 only gets the linux check, twice (two publications).
        for _ in 0..2 {
            let body = recv_kind(&mut lin, "check_request").await;
            let req = codec::decode_check_request(&body, Encoding::Protobuf).unwrap();
            assert_eq!(check_name(&req), CHECK);
        }

        // win-1 matched nothing: after two publications its only frames are the
        // placeholder (read above) and the pong to our ping.
        win.send(Message::Ping(b"p".to_vec().into())).await.unwrap();
        match win.next().await.unwrap().unwrap() {
            Message::Pong(p) => assert_eq!(&p[..], b"p"),
            other => panic!("expected only a pong, got {other:?}"),
        }
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn invalid_frames_are_counted_and_the_connection_stays_open() {
    bounded(async {
        let t = start().await;
        let (mut ws, _) = connect(t.addr, &Hello::new("bad-1", "linux")).await;
        assert_eq!(recv(&mut ws).await.0, "entity_config");

        send_event(
            &mut ws,
            "keepalive",
            &keepalive("bad-1", 0),
            Encoding::Protobuf,
        )
        .await;
        let s = wait_for(&t.stats, |s| s.events_rejected == 1).await;
        assert_eq!(s.rejected_by_reason.get("invalid_timestamp"), Some(&1));
        assert_eq!(s.keepalives_received, 0);

        ws.send(Message::binary(b"no newline".to_vec()))
            .await
            .unwrap();
        ws.send(Message::binary(b"mystery\n{}".to_vec()))
            .await
            .unwrap();
        ws.send(Message::binary(b"keepalive\n\xff\xff\xff".to_vec()))
            .await
            .unwrap();
        wait_for(&t.stats, |s| s.frames_invalid == 3).await;

        // Still open: a valid keepalive registers the entity.
        send_event(
            &mut ws,
            "keepalive",
            &keepalive("bad-1", unix_now()),
            Encoding::Protobuf,
        )
        .await;
        let body = recv_kind(&mut ws, "entity_config").await;
        let cfg = codec::decode_entity_config(&body, Encoding::Protobuf).unwrap();
        assert_eq!(cfg.metadata.unwrap().name, "bad-1");
        wait_for(&t.stats, |s| s.keepalives_received == 1).await;

        // An `event` frame whose check is `keepalive` is a keepalive too.
        send_event(
            &mut ws,
            "event",
            &keepalive("bad-1", unix_now()),
            Encoding::Protobuf,
        )
        .await;
        let s = wait_for(&t.stats, |s| s.keepalives_received == 2).await;
        assert_eq!(s.events_received, 0);
        assert_eq!((s.events_rejected, s.session_errors), (1, 0));
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn json_mode_works() {
    bounded(async {
        let t = start().await;
        let mut hello = Hello::new("js-1", "linux");
        hello.encoding = Encoding::Json;
        let (mut ws, resp) = connect(t.addr, &hello).await;
        assert_eq!(resp.headers()["content-type"], "application/json");

        let (kind, body) = recv(&mut ws).await;
        assert_eq!(kind, "entity_config");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["metadata"]["name"], "not found");
        assert_eq!(v["metadata"]["namespace"], NS);
        assert_eq!(v["entity_class"], "agent");
        assert_eq!(v["deregister"], false);

        send_event(
            &mut ws,
            "keepalive",
            &keepalive("js-1", unix_now()),
            Encoding::Json,
        )
        .await;
        let body = recv_kind(&mut ws, "entity_config").await;
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["metadata"]["name"], "js-1");
        assert_eq!(
            v["subscriptions"],
            serde_json::json!(["linux", "entity:js-1"])
        );
        assert_eq!(v["deregister"], true);

        let body = recv_kind(&mut ws, "check_request").await;
        let req = codec::decode_check_request(&body, Encoding::Json).unwrap();
        assert_eq!(check_name(&req), CHECK);
        assert!(req.issued > 0);
        send_event(&mut ws, "event", &reply("js-1", &req), Encoding::Json).await;
        let s = wait_for(&t.stats, |s| s.check_replies_received == 1).await;
        assert_eq!((s.keepalives_received, s.events_received), (1, 1));
        assert_eq!((s.events_rejected, s.frames_invalid), (0, 0));
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_closes_sessions_with_1001_and_returns() {
    bounded(async {
        let t = start().await;
        let (mut ws, _) = connect(t.addr, &Hello::new("sd-1", "linux")).await;
        assert_eq!(recv(&mut ws).await.0, "entity_config");
        wait_for(&t.stats, |s| s.sessions_active == 1).await;

        let cancelled = Instant::now();
        t.shutdown.cancel();
        loop {
            match ws.next().await {
                Some(Ok(Message::Close(Some(frame)))) => {
                    assert_eq!(frame.code, CloseCode::Away);
                    break;
                }
                Some(Ok(Message::Close(None))) => panic!("close without code"),
                Some(Ok(_)) => {}
                other => panic!("no close frame: {other:?}"),
            }
        }
        // Reading on completes the close handshake.
        while let Some(Ok(_)) = ws.next().await {}
        t.task.await.unwrap().unwrap();
        assert!(cancelled.elapsed() < Duration::from_millis(2500));
        assert_eq!(t.stats.snapshot().sessions_active, 0);
    })
    .await;
}
