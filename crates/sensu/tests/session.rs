//! A simulated agent session against a tiny in-test WebSocket backend on
//! 127.0.0.1: nothing before `entity_config`, keepalives on schedule, check
//! requests answered, pings, close 1001 on cancel, upgrade rejections.
//!
//! Every test runs on paused tokio time: the clock moves only when both
//! sides wait, so timers fire at their exact instants (the session timers
//! at their real defaults: keepalive 20 s, entity_config wait 10 s, ping
//! 30 s, pong timeout 45 s) and no test sleeps on the wall clock.

// The server callback's error type is tungstenite's `ErrorResponse`.
#![allow(clippy::result_large_err)]

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use agent_sim_fleet::{Agent as _, AgentFactory as _, SessionCx, SessionEnd};
use agent_sim_metrics::Metrics;
use agent_sim_proto::sensu::{v2, v3};
use agent_sim_sensu::codec::{self, Encoding, validate_event};
use agent_sim_sensu::{SensuConfig, SensuFactory, metrics_spec};
use futures_util::{SinkExt as _, StreamExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, timeout};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_util::sync::CancellationToken;

const STEP: Duration = Duration::from_secs(3);

type Headers = Arc<std::sync::Mutex<Option<http::HeaderMap>>>;

/// Accepts one upgrade, recording its headers and answering with the
/// content type the request asked for.
async fn accept(listener: &TcpListener, headers: Headers) -> WebSocketStream<TcpStream> {
    let (tcp, _) = timeout(STEP, listener.accept()).await.unwrap().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(None));
    let seen2 = seen.clone();
    let ws = tokio_tungstenite::accept_hdr_async(tcp, move |req: &Request, mut resp: Response| {
        let enc = Encoding::from_accept(req.headers().get("accept").and_then(|v| v.to_str().ok()));
        resp.headers_mut()
            .insert("content-type", enc.content_type().parse().unwrap());
        *seen2.lock().unwrap() = Some(req.headers().clone());
        Ok::<_, ErrorResponse>(resp)
    })
    .await
    .unwrap();
    let got = seen.lock().unwrap().take();
    *headers.lock().unwrap() = got;
    ws
}

/// The test backend's listener on 127.0.0.1:0, and its port.
async fn listen() -> (TcpListener, u16) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    (listener, port)
}

/// Ends the agent's session from the test's side and waits for its task.
async fn hang_up(
    cancel: CancellationToken,
    ws: WebSocketStream<TcpStream>,
    task: tokio::task::JoinHandle<SessionEnd>,
) {
    cancel.cancel();
    drop(ws);
    let _ = timeout(STEP, task).await;
}

fn config(port: u16, enc: Encoding) -> SensuConfig {
    SensuConfig {
        targets: vec![format!("ws://127.0.0.1:{port}/")],
        encoding: enc,
        keepalive_interval: Duration::from_secs(1),
        name_prefix: "sim".into(),
        subscriptions: vec!["linux".into(), "web".into()],
        ..Default::default()
    }
}

fn metrics() -> Metrics {
    Metrics::new(&agent_sim_fleet::metrics_spec().merge(&metrics_spec()), 1)
}

/// Starts agent `index` of a factory on its own task.
fn start(
    cfg: SensuConfig,
    m: &Metrics,
    index: u64,
) -> (CancellationToken, tokio::task::JoinHandle<SessionEnd>) {
    let factory = SensuFactory::new(cfg, m.clone()).unwrap();
    let cancel = CancellationToken::new();
    let cx = SessionCx::standalone(index, m.clone(), cancel.clone());
    let mut agent = factory.create(index);
    let task = tokio::spawn(async move { agent.run_session(&cx).await });
    (cancel, task)
}

/// Next binary frame from the agent (answering nothing else), within two
/// minutes of (paused) time.
async fn next_frame(ws: &mut WebSocketStream<TcpStream>) -> Vec<u8> {
    loop {
        match timeout(Duration::from_secs(120), ws.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            Message::Binary(b) => return b.to_vec(),
            Message::Ping(_) | Message::Pong(_) => continue,
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// An agent's end of the test: its cancel token, its task and the backend's
/// end of its WebSocket.
type Session = (
    CancellationToken,
    tokio::task::JoinHandle<SessionEnd>,
    WebSocketStream<TcpStream>,
);

/// Agent `index` (protobuf, a keepalive every `keepalive`) started against
/// `listener` and accepted, before any entity_config.
async fn accepted(listener: &TcpListener, m: &Metrics, index: u64, keepalive: u64) -> Session {
    let port = listener.local_addr().unwrap().port();
    let cfg = SensuConfig {
        keepalive_interval: Duration::from_secs(keepalive),
        ..config(port, Encoding::Protobuf)
    };
    let (cancel, task) = start(cfg, m, index);
    let ws = accept(listener, Headers::default()).await;
    (cancel, task, ws)
}

/// The keepalives' lateness recorded so far: how many, and the largest (µs).
fn keepalive_lateness(m: &Metrics) -> (u64, u64) {
    m.collect();
    let h = m.cumulative_of("keepalive_lateness").expect("declared");
    (h.len(), h.max())
}

/// The agent's next frame, which must be a keepalive.
async fn next_keepalive(ws: &mut WebSocketStream<TcpStream>) {
    let b = next_frame(ws).await;
    assert_eq!(codec::split_frame(&b).unwrap().kind, codec::KIND_KEEPALIVE);
}

/// Sends the agent an `entity_config` for `name` (protobuf).
async fn send_entity_config(ws: &mut WebSocketStream<TcpStream>, name: &str) {
    ws.send(Message::Binary(
        entity_config(name, Encoding::Protobuf).into(),
    ))
    .await
    .unwrap();
}

fn entity_config(name: &str, enc: Encoding) -> Vec<u8> {
    let ec = v3::EntityConfig {
        metadata: Some(v2::ObjectMeta {
            name: name.into(),
            namespace: "default".into(),
            ..Default::default()
        }),
        entity_class: "agent".into(),
        ..Default::default()
    };
    codec::encode_frame(
        codec::KIND_ENTITY_CONFIG,
        &codec::encode_entity_config(&ec, enc).unwrap(),
    )
}

/// Agent `index` (protobuf, a keepalive a second) started against
/// `listener` and sent its `entity_config`.
async fn configured(listener: &TcpListener, m: &Metrics, index: u64) -> Session {
    let (cancel, task, mut ws) = accepted(listener, m, index, 1).await;
    send_entity_config(&mut ws, &format!("sim-{index}")).await;
    (cancel, task, ws)
}

#[tokio::test(start_paused = true)]
async fn protobuf_session_end_to_end() {
    let (listener, port) = listen().await;
    let m = metrics();
    let (cancel, task) = start(config(port, Encoding::Protobuf), &m, 7);
    let headers = Headers::default();
    let mut ws = accept(&listener, headers.clone()).await;

    let h = headers.lock().unwrap().take().unwrap();
    assert_eq!(h["sensu-agentname"], "sim-7");
    assert_eq!(h["sensu-subscriptions"], "linux,web");
    assert_eq!(h["sensu-namespace"], "default");
    assert_eq!(h["accept"], "application/octet-stream");

    // Nothing before entity_config.
    assert!(
        timeout(Duration::from_millis(300), ws.next())
            .await
            .is_err(),
        "the agent spoke before entity_config"
    );

    send_entity_config(&mut ws, "not found").await;
    let first = next_frame(&mut ws).await;
    let t1 = Instant::now();
    let f = codec::split_frame(&first).unwrap();
    assert_eq!(f.kind, codec::KIND_KEEPALIVE);
    let ka = codec::decode_event(f.body, Encoding::Protobuf).unwrap();
    assert_eq!(validate_event(&ka, true), Ok(()));
    assert_eq!(ka.sequence, 1);
    assert_eq!(ka.id.len(), 16);
    let e = ka.entity.clone().unwrap();
    assert_eq!(e.metadata.unwrap().name, "sim-7");
    assert_eq!(e.subscriptions, ["linux", "web"]);

    let second = next_frame(&mut ws).await;
    let gap = t1.elapsed();
    let f = codec::split_frame(&second).unwrap();
    assert_eq!(f.kind, codec::KIND_KEEPALIVE);
    let ka2 = codec::decode_event(f.body, Encoding::Protobuf).unwrap();
    assert_eq!(ka2.sequence, 2);
    assert_ne!(ka2.id, ka.id);
    // Paused time: exactly one keepalive interval later.
    assert_eq!(gap, Duration::from_secs(1));

    // The real check request of vector 003 is answered like vector 004.
    let req = common::read("sensu/protobuf/003-backend-check_request.bin");
    ws.send(Message::Binary(req.clone().into())).await.unwrap();
    // A replay (same issued) is dropped, as 6.x agents do.
    ws.send(Message::Binary(req.into())).await.unwrap();
    let reply = loop {
        let b = next_frame(&mut ws).await;
        if codec::split_frame(&b).unwrap().kind == codec::KIND_EVENT {
            break b;
        }
    };
    let ev =
        codec::decode_event(codec::split_frame(&reply).unwrap().body, Encoding::Protobuf).unwrap();
    assert_eq!(validate_event(&ev, false), Ok(()));
    assert_eq!(ev.sequence, 1);
    let c = ev.check.unwrap();
    assert_eq!(c.issued, 1_795_300_847);
    assert_eq!(c.processed_by, "sim-7");
    assert_eq!(c.metadata.unwrap().name, "vector-check");
    assert_eq!(c.status, 0);

    // Frames are handled in order: once a later keepalive arrives, the
    // replayed request has been seen (and dropped).
    loop {
        let b = next_frame(&mut ws).await;
        let kind = codec::split_frame(&b).unwrap().kind.to_owned();
        assert_ne!(
            kind,
            codec::KIND_EVENT,
            "a replayed check request was answered"
        );
        if kind == codec::KIND_KEEPALIVE {
            break;
        }
    }

    // Cancel: close 1001 "bye", and the session ends as Shutdown.
    cancel.cancel();
    let close = loop {
        match timeout(STEP, ws.next()).await.unwrap().unwrap().unwrap() {
            Message::Close(c) => break c.unwrap(),
            Message::Binary(b) => {
                let kind = codec::split_frame(&b).unwrap().kind.to_owned();
                assert_ne!(
                    kind,
                    codec::KIND_EVENT,
                    "a replayed check request was answered"
                );
            }
            _ => {}
        }
    };
    assert_eq!(close.code, CloseCode::Away);
    assert_eq!(close.reason.as_str(), "bye");
    // Reading on lets tungstenite answer the close.
    while let Ok(Some(Ok(_))) = timeout(STEP, ws.next()).await {}
    // The backend ends the TCP connection once the close handshake is done.
    drop(ws);
    let end = timeout(STEP, task).await.unwrap().unwrap();
    assert_eq!(end, SessionEnd::Shutdown);

    let s = m.snapshot();
    assert!(s.counter("keepalives_sent") >= 2);
    assert_eq!(s.counter("check_requests_received"), 2);
    assert_eq!(s.counter("check_requests_dropped"), 1);
    assert_eq!(s.counter("check_replies_sent"), 1);
    assert_eq!(s.counter("events_sent"), 1);
    assert_eq!(s.counter("entity_configs_received"), 1);
    assert!(s.counter("bytes_sent") > 0 && s.counter("bytes_received") > 0);
    assert_eq!(s.counter(agent_sim_fleet::COUNTER_SESSIONS), 1);
    assert!(s.errors.is_empty(), "{:?}", s.errors);
    let lat: Vec<_> = m.collect();
    let count = |n: &str| lat.iter().find(|(k, _)| *k == n).unwrap().1.len();
    assert_eq!(count("connect"), 1);
    assert_eq!(count("session_ready"), 1);
    assert!(count("keepalive_lateness") >= 2);
    assert_eq!(count("check_turnaround"), 1);
}

#[tokio::test(start_paused = true)]
async fn json_session_applies_entity_config_and_sends_agent_events() {
    let (listener, port) = listen().await;
    let m = metrics();
    let cfg = SensuConfig {
        event_rate: Some("20/s".parse().unwrap()),
        event_output_size: 100,
        keepalive_interval: Duration::from_secs(20),
        ..config(port, Encoding::Json)
    };
    let (cancel, task) = start(cfg, &m, 3);
    let headers = Headers::default();
    let mut ws = accept(&listener, headers.clone()).await;
    assert!(
        headers
            .lock()
            .unwrap()
            .as_ref()
            .unwrap()
            .get("accept")
            .is_none()
    );

    // A real entity config (JSON vector 002, another agent's name).
    let ec = common::read("sensu/json/002-backend-entity_config.bin");
    ws.send(Message::Binary(ec.into())).await.unwrap();
    let ka = next_frame(&mut ws).await;
    let f = codec::split_frame(&ka).unwrap();
    assert_eq!(f.kind, codec::KIND_KEEPALIVE);
    let ev = codec::decode_event(f.body, Encoding::Json).unwrap();
    assert_eq!(validate_event(&ev, true), Ok(()));
    let e = ev.entity.unwrap();
    assert_eq!(e.subscriptions, ["vectors", "entity:vec-json-1"]);
    assert!(e.deregister);

    // A garbage frame is counted and skipped.
    ws.send(Message::Binary(b"check_request\n{not json".to_vec().into()))
        .await
        .unwrap();
    let mut seqs = Vec::new();
    while seqs.len() < 3 {
        let b = next_frame(&mut ws).await;
        let f = codec::split_frame(&b).unwrap();
        if f.kind == codec::KIND_EVENT {
            let ev = codec::decode_event(f.body, Encoding::Json).unwrap();
            assert_eq!(validate_event(&ev, false), Ok(()));
            let c = ev.check.unwrap();
            assert_eq!(c.metadata.unwrap().name, "agent-sim-event");
            assert_eq!(c.output.len(), 100);
            seqs.push(ev.sequence);
        }
    }
    assert_eq!(seqs, [1, 2, 3]);
    cancel.cancel();
    while let Ok(Some(Ok(_))) = timeout(STEP, ws.next()).await {}
    // The backend ends the TCP connection once the close handshake is done.
    drop(ws);
    assert_eq!(
        timeout(STEP, task).await.unwrap().unwrap(),
        SessionEnd::Shutdown
    );
    let s = m.snapshot();
    assert!(s.counter("agent_events_sent") >= 3);
    assert_eq!(s.errors.get("decode_check_request"), Some(&1));
}

#[tokio::test(start_paused = true)]
async fn missing_pong_drops_the_session() {
    let (listener, port) = listen().await;
    let m = metrics();
    let cfg = SensuConfig {
        ping_interval: Duration::from_millis(100),
        pong_timeout: Duration::from_millis(250),
        entity_config_timeout: Duration::from_millis(50),
        ..config(port, Encoding::Protobuf)
    };
    let (_cancel, task) = start(cfg, &m, 1);
    // Accept, then never read: no pong is ever sent back.
    let _ws = accept(&listener, Headers::default()).await;
    let end = timeout(STEP, task).await.unwrap().unwrap();
    assert_eq!(end, SessionEnd::lost("pong_timeout"));
    // A warning, as the real agent logs it, not an error.
    assert_eq!(m.snapshot().warnings.get("entity_config_timeout"), Some(&1));
    assert_eq!(m.snapshot().errors.get("entity_config_timeout"), None);
}

#[tokio::test(start_paused = true)]
async fn upgrade_rejections_and_refused_dials_have_kinds() {
    let (listener, port) = listen().await;
    let m = metrics();
    let (_c, task) = start(config(port, Encoding::Protobuf), &m, 1);
    let (tcp, _) = timeout(STEP, listener.accept()).await.unwrap().unwrap();
    let _ = tokio_tungstenite::accept_hdr_async(tcp, |_: &Request, _: Response| {
        let mut r = ErrorResponse::new(Some("missing credentials".into()));
        *r.status_mut() = http::StatusCode::UNAUTHORIZED;
        Err(r)
    })
    .await;
    // Retried by the engine like every refusal, with the backend's words.
    assert_eq!(
        timeout(STEP, task).await.unwrap().unwrap(),
        SessionEnd::lost_with("upgrade_401", "HTTP 401 Unauthorized: missing credentials")
    );

    drop(listener);
    let (_c, task) = start(config(port, Encoding::Protobuf), &m, 1);
    let end = timeout(STEP, task).await.unwrap().unwrap();
    assert_eq!(end.failure().unwrap().kind, "connect_refused");
    assert!(
        end.failure()
            .unwrap()
            .detail
            .as_deref()
            .is_some_and(|d| d.contains("refused")),
        "{end:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn cancel_during_entity_config_wait_closes_politely() {
    let (listener, port) = listen().await;
    let m = metrics();
    let (cancel, task) = start(config(port, Encoding::Protobuf), &m, 2);
    let mut ws = accept(&listener, Headers::default()).await;
    // A pong proves the agent's session loop runs (the handshake is done).
    ws.send(Message::Ping(b"sync".to_vec().into()))
        .await
        .unwrap();
    match timeout(STEP, ws.next()).await.unwrap().unwrap().unwrap() {
        Message::Pong(p) => assert_eq!(&p[..], b"sync"),
        other => panic!("unexpected {other:?}"),
    }
    cancel.cancel();
    match timeout(STEP, ws.next()).await.unwrap().unwrap().unwrap() {
        Message::Close(Some(c)) => assert_eq!(c.code, CloseCode::Away),
        other => panic!("unexpected {other:?}"),
    }
    while let Ok(Some(Ok(_))) = timeout(STEP, ws.next()).await {}
    // The backend ends the TCP connection once the close handshake is done.
    drop(ws);
    assert_eq!(
        timeout(STEP, task).await.unwrap().unwrap(),
        SessionEnd::Shutdown
    );
    assert_eq!(m.snapshot().counter("keepalives_sent"), 0);
}

/// Keepalives at the real default interval go out at exactly the intended
/// instants, one interval apart, with zero lateness.
#[tokio::test(start_paused = true)]
async fn keepalives_follow_the_schedule_exactly_on_paused_time() {
    let (listener, _) = listen().await;
    let m = metrics();
    let (cancel, task, mut ws) = accepted(&listener, &m, 3, 20).await;
    send_entity_config(&mut ws, "not found").await;
    let t0 = Instant::now();
    let mut at = Vec::new();
    for _ in 0..5 {
        next_keepalive(&mut ws).await;
        at.push(t0.elapsed());
    }
    let want: Vec<Duration> = (0..5).map(|k| Duration::from_secs(20 * k)).collect();
    assert_eq!(at, want);
    let (count, max) = keepalive_lateness(&m);
    assert_eq!(count, 5);
    assert!(max < 1_000, "lateness {max} µs");
    hang_up(cancel, ws, task).await;
}

/// Without an entity_config the agent waits exactly 10 s, then sends its
/// first keepalive anyway (a warning, and not "connected").
#[tokio::test(start_paused = true)]
async fn without_entity_config_the_first_keepalive_comes_after_the_10s_wait() {
    let (listener, _) = listen().await;
    let m = metrics();
    let (cancel, task, mut ws) = accepted(&listener, &m, 4, 20).await;
    let t0 = Instant::now();
    next_keepalive(&mut ws).await;
    assert_eq!(t0.elapsed(), Duration::from_secs(10));
    let s = m.snapshot();
    assert_eq!(s.warnings.get("entity_config_timeout"), Some(&1));
    assert_eq!(s.connected, 0, "no answer from the backend: not connected");
    // The backend answers late: now the agent is connected.
    send_entity_config(&mut ws, "sim-4").await;
    next_keepalive(&mut ws).await;
    assert_eq!(t0.elapsed(), Duration::from_secs(30));
    assert_eq!(m.snapshot().connected, 1);
    hang_up(cancel, ws, task).await;
}

/// When each of two agents of one factory (a keepalive every 20 s, the
/// given timer grid step) sends its first two keepalives, counted from the
/// factory's creation; their `entity_config`s arrive 10 ms and 30 ms in.
async fn two_agents_keepalives(tick: Duration) -> Vec<[Duration; 2]> {
    let (listener, port) = listen().await;
    let m = metrics();
    let cfg = SensuConfig {
        keepalive_interval: Duration::from_secs(20),
        timer_tick: tick,
        ..config(port, Encoding::Protobuf)
    };
    let factory = SensuFactory::new(cfg, m.clone()).unwrap();
    let origin = Instant::now();
    let mut agents = Vec::new();
    for index in 0..2 {
        let cancel = CancellationToken::new();
        let cx = SessionCx::standalone(index, m.clone(), cancel.clone());
        let mut agent = factory.create(index);
        let task = tokio::spawn(async move { agent.run_session(&cx).await });
        agents.push((cancel, task, accept(&listener, Headers::default()).await));
    }
    // Each backend end on a task of its own: it reads its agent's
    // keepalives while the other agent is configured.
    let mut readers = Vec::new();
    for (at, (cancel, task, mut ws)) in [10, 30].into_iter().zip(agents) {
        tokio::time::sleep_until(origin + Duration::from_millis(at)).await;
        send_entity_config(&mut ws, "not found").await;
        readers.push(tokio::spawn(async move {
            let mut sent = [Duration::ZERO; 2];
            for t in &mut sent {
                next_keepalive(&mut ws).await;
                *t = origin.elapsed();
            }
            (sent, (cancel, task, ws))
        }));
    }
    let mut sent = Vec::new();
    let mut agents = Vec::new();
    for r in readers {
        let (times, agent) = r.await.unwrap();
        sent.push(times);
        agents.push(agent);
    }
    let (_, max) = keepalive_lateness(&m);
    assert!(max < 1_000, "lateness {max} µs");
    for (cancel, task, ws) in agents {
        hang_up(cancel, ws, task).await;
    }
    sent
}

/// On a 50 ms timer grid, two agents configured 20 ms apart within one
/// step send their keepalives together at the step's end, then each
/// exactly one interval later (lateness measured from the grid point);
/// without a grid each starts at once.
#[tokio::test(start_paused = true)]
async fn agents_due_within_one_timer_tick_send_together() {
    let ms = Duration::from_millis;
    let s = |ms: u64| Duration::from_secs(20) + Duration::from_millis(ms);
    assert_eq!(
        two_agents_keepalives(ms(50)).await,
        [[ms(50), s(50)], [ms(50), s(50)]]
    );
    assert_eq!(
        two_agents_keepalives(Duration::ZERO).await,
        [[ms(10), s(10)], [ms(30), s(30)]]
    );
}

/// The agent pings every 30 s and drops the session 45 s after an
/// unanswered ping; answered pings keep it up.
#[tokio::test(start_paused = true)]
async fn pings_every_30s_and_a_missing_pong_ends_the_session_at_45s() {
    let (listener, port) = listen().await;

    // Answered: the backend reads (tungstenite answers pings) for 200 s.
    let m = metrics();
    let (cancel, task, mut ws) = configured(&listener, &m, 5).await;
    let t0 = Instant::now();
    let mut pings = Vec::new();
    while t0.elapsed() < Duration::from_secs(200) {
        match timeout(Duration::from_secs(60), ws.next()).await {
            Ok(Some(Ok(Message::Ping(_)))) => pings.push(t0.elapsed()),
            Ok(Some(Ok(_))) => {}
            other => panic!("session ended: {other:?}"),
        }
    }
    let want: Vec<Duration> = (1..=6).map(|k| Duration::from_secs(30 * k)).collect();
    assert_eq!(pings, want);
    assert!(!task.is_finished());
    hang_up(cancel, ws, task).await;

    // Unanswered: the backend stops reading after the upgrade.
    let m = metrics();
    let (_cancel, task) = start(config(port, Encoding::Protobuf), &m, 6);
    let _ws = accept(&listener, Headers::default()).await;
    let t0 = Instant::now();
    let end = timeout(Duration::from_secs(300), task)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(end, SessionEnd::lost("pong_timeout"));
    assert_eq!(t0.elapsed(), Duration::from_secs(30 + 45));
}

/// A backend that sends what a 6.x agent does not know: an unknown message
/// type and a check request with an unknown top-level field are counted
/// (warnings, with the type and the field in the sample) and the session
/// goes on; a message over the limit ends it with `message_too_large`,
/// retried by the engine as any lost session.
#[tokio::test(start_paused = true)]
async fn hostile_backend_frames_are_counted_and_bounded() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let m = metrics();
    let (_cancel, task, mut ws) = configured(&listener, &m, 3).await;
    assert_eq!(
        codec::split_frame(&next_frame(&mut ws).await).unwrap().kind,
        codec::KIND_KEEPALIVE
    );
    ws.send(Message::Binary(
        codec::encode_frame("backend_gossip", b"\x01\x02").into(),
    ))
    .await
    .unwrap();
    // The captured request with field 99 (a string) appended.
    let mut req = common::read("sensu/protobuf/003-backend-check_request.bin");
    req.extend_from_slice(&[0x9a, 0x06, 0x02, b'h', b'i']);
    ws.send(Message::Binary(req.into())).await.unwrap();
    // Still answered: the unknown field is skipped.
    let reply = loop {
        let b = next_frame(&mut ws).await;
        if codec::split_frame(&b).unwrap().kind == codec::KIND_EVENT {
            break b;
        }
    };
    let ev =
        codec::decode_event(codec::split_frame(&reply).unwrap().body, Encoding::Protobuf).unwrap();
    assert_eq!(ev.check.unwrap().metadata.unwrap().name, "vector-check");

    let mut huge = codec::encode_frame(codec::KIND_CHECK_REQUEST, &[]);
    huge.resize(codec::MAX_MESSAGE + 1, 0);
    ws.send(Message::Binary(huge.into())).await.unwrap();
    let end = timeout(STEP, task).await.unwrap().unwrap();
    assert_eq!(end.failure().map(|f| f.kind), Some("message_too_large"));

    let s = m.snapshot();
    assert_eq!(s.warnings.get("unknown_messages"), Some(&1));
    assert_eq!(s.warnings.get("unknown_fields"), Some(&1));
    assert_eq!(s.counter("check_replies_sent"), 1);
    let sample = |k: &str| m.warning_sample(k).unwrap_or_default();
    assert!(sample("unknown_messages").contains("backend_gossip"));
    assert!(sample("unknown_fields").contains("check_request: field 99"));
    assert!(
        m.error_kind("message_too_large").is_some(),
        "declared with a hint"
    );
}
