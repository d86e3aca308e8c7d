//! Golden vectors captured from a real Consul 1.20.1 server
//! (`testdata/vectors/consul/`, see its README): decoding, our own request
//! bytes, the view over the captured stream, HTTP bodies, and the bytes our
//! connector writes first.

use std::path::{Path, PathBuf};

use agent_sim_consul::codec::{Health, subscribe_request};
use agent_sim_consul::conn::Dialer;
use agent_sim_consul::http::{SessionCreated, SessionEntry, parse_bool};
use agent_sim_consul::view::{Phase, Signal, View, ViewKind};
use agent_sim_proto::consul::subscribe::{
    CatalogOp, Event, SubscribeRequest, Topic, event::Payload, subscribe_request::Subject,
};
use prost::Message;
use serde_json::Value;
use tokio::io::AsyncReadExt;

const VECTORS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/vectors");
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn dir() -> PathBuf {
    Path::new(VECTORS).to_path_buf()
}

fn read(rel: &str) -> Vec<u8> {
    std::fs::read(dir().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn manifest() -> Vec<Value> {
    let v: Value = serde_json::from_slice(&read("manifest.json")).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .filter(|e| e["system"] == "consul")
        .cloned()
        .collect()
}

fn entry(file: &str) -> Value {
    manifest()
        .into_iter()
        .find(|e| e["file"] == file)
        .unwrap_or_else(|| panic!("{file} not in manifest"))
}

fn payload_name(p: &Option<Payload>) -> &'static str {
    match p {
        None => "None",
        Some(Payload::EndOfSnapshot(_)) => "EndOfSnapshot",
        Some(Payload::NewSnapshotToFollow(_)) => "NewSnapshotToFollow",
        Some(Payload::EventBatch(_)) => "EventBatch",
        Some(Payload::ServiceHealth(_)) => "ServiceHealth",
        Some(Payload::ConfigEntry(_)) => "ConfigEntry",
    }
}

fn check_request(file: &str, bytes: &[u8], want: &Value) {
    let r = SubscribeRequest::decode(bytes).unwrap_or_else(|e| panic!("{file}: {e}"));
    assert_eq!(r.index, want["Index"].as_u64().unwrap(), "{file} Index");
    assert_eq!(
        r.topic as i64,
        want["TopicValue"].as_i64().unwrap(),
        "{file} Topic"
    );
    assert_eq!(
        Topic::try_from(r.topic).unwrap().as_str_name(),
        want["Topic"].as_str().unwrap()
    );
    let Some(Subject::NamedSubject(s)) = &r.subject else {
        panic!("{file}: no NamedSubject");
    };
    assert_eq!(s.key, want["NamedSubject.Key"].as_str().unwrap());
}

fn check_event(file: &str, bytes: &[u8], want: &Value) {
    let ev = Event::decode(bytes).unwrap_or_else(|e| panic!("{file}: {e}"));
    assert_eq!(ev.index, want["Index"].as_u64().unwrap(), "{file} Index");
    assert_eq!(
        payload_name(&ev.payload),
        want["Payload"].as_str().unwrap(),
        "{file} Payload"
    );
    match &ev.payload {
        Some(Payload::EndOfSnapshot(b)) => assert_eq!(*b, want["EndOfSnapshot"] == true),
        Some(Payload::NewSnapshotToFollow(b)) => {
            assert_eq!(*b, want["NewSnapshotToFollow"] == true)
        }
        Some(Payload::ServiceHealth(u)) => {
            let w = &want["ServiceHealth"];
            assert_eq!(i64::from(u.op), w["OpValue"].as_i64().unwrap(), "{file} Op");
            assert_eq!(
                CatalogOp::try_from(u.op).unwrap().as_str_name(),
                w["Op"].as_str().unwrap()
            );
            let csn = u.check_service_node.as_ref().unwrap();
            let node = csn.node.as_ref().unwrap();
            let svc = csn.service.as_ref().unwrap();
            assert_eq!(node.node, w["Node"].as_str().unwrap(), "{file} Node");
            assert_eq!(node.address, w["NodeAddress"].as_str().unwrap(), "{file}");
            assert_eq!(svc.id, w["ServiceID"].as_str().unwrap(), "{file}");
            assert_eq!(svc.service, w["ServiceName"].as_str().unwrap(), "{file}");
            assert_eq!(svc.address, w["ServiceAddress"].as_str().unwrap(), "{file}");
            assert_eq!(svc.kind, w["ServiceKind"].as_str().unwrap(), "{file}");
            assert_eq!(
                i64::from(svc.port),
                w["ServicePort"].as_i64().unwrap(),
                "{file}"
            );
            let checks = w["Checks"].as_array().unwrap();
            assert_eq!(csn.checks.len(), checks.len(), "{file} Checks");
            for (c, wc) in csn.checks.iter().zip(checks) {
                assert_eq!(c.check_id, wc["CheckID"].as_str().unwrap());
                assert_eq!(c.node, wc["Node"].as_str().unwrap());
                assert_eq!(c.service_id, wc["ServiceID"].as_str().unwrap());
                assert_eq!(c.status, wc["Status"].as_str().unwrap());
            }
        }
        other => panic!("{file}: unexpected payload {}", payload_name(other)),
    }
}

#[test]
fn every_subscribe_vector_decodes_to_the_manifest_fields() {
    let mut files: Vec<_> = std::fs::read_dir(dir().join("consul/subscribe"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    assert_eq!(files.len(), 12, "{files:?}");
    for name in files {
        let rel = format!("consul/subscribe/{name}");
        let e = entry(&rel);
        let bytes = read(&rel);
        assert_eq!(
            bytes.len() as u64,
            e["size"].as_u64().unwrap(),
            "{rel} size"
        );
        let want = &e["expected_decoded_fields"];
        match e["message_type"].as_str().unwrap() {
            "subscribe.SubscribeRequest" => check_request(&rel, &bytes, want),
            "subscribe.Event" => check_event(&rel, &bytes, want),
            t => panic!("{rel}: unexpected message type {t}"),
        }
    }
}

#[test]
fn our_requests_encode_to_the_captured_bytes() {
    let r = subscribe_request(Topic::ServiceHealth, "web", 0, "", "");
    let bytes = r.encode_to_vec();
    assert_eq!(bytes, read("consul/subscribe/request-index-0.bin"));
    assert_eq!(
        bytes,
        [0x08, 0x01, 0x52, 0x05, 0x0a, 0x03, 0x77, 0x65, 0x62]
    );
    let r = subscribe_request(Topic::ServiceHealth, "web", 30, "", "");
    assert_eq!(
        r.encode_to_vec(),
        read("consul/subscribe/request-index-30-stale.bin")
    );
}

#[test]
fn the_captured_stream_builds_the_expected_view() {
    let ev = |n: &str| Event::decode(read(&format!("consul/subscribe/{n}")).as_slice()).unwrap();
    let mut v = View::new(ViewKind::Health);
    let apply = |v: &mut View, n: &str| v.apply(&ev(n), &mut |_| {});
    let health = |v: &View, node: &str, id: &str| v.get(node, id).unwrap().health;

    // Stream 1: snapshot of web-1, web-2 at index 30.
    assert_eq!(
        apply(&mut v, "000-service-health-register-web-1.bin"),
        Signal::Item
    );
    apply(&mut v, "001-service-health-register-web-2.bin");
    assert_eq!(v.phase(), Phase::Snapshot);
    assert_eq!(
        apply(&mut v, "002-end-of-snapshot.bin"),
        Signal::EndOfSnapshot
    );
    assert_eq!(v.len(), 2);
    assert_eq!(v.resume_index(), 30);
    // Live: web-2 gone, web-3 critical, web-1 warning.
    apply(&mut v, "003-service-health-deregister-web-2.bin");
    assert!(v.get("sim-node-2", "web-2").is_none());
    assert_eq!(v.resume_index(), 31);
    apply(&mut v, "004-service-health-register-web-3.bin");
    apply(&mut v, "005-service-health-register-web-1.bin");
    assert_eq!(v.len(), 2);
    assert_eq!(health(&v, "sim-node-1", "web-1"), Health::Warning);
    assert_eq!(health(&v, "sim-node-3", "web-3"), Health::Critical);
    assert_eq!(v.resume_index(), 33);

    // Stream 2: stale resume → reset, new snapshot at 33.
    assert_eq!(
        apply(&mut v, "006-resume-new-snapshot-to-follow.bin"),
        Signal::NewSnapshotToFollow
    );
    assert!(v.is_empty());
    assert_eq!(v.resume_index(), 0);
    apply(&mut v, "007-service-health-register-web-1.bin");
    apply(&mut v, "008-service-health-register-web-3.bin");
    assert_eq!(
        apply(&mut v, "009-end-of-snapshot.bin"),
        Signal::EndOfSnapshot
    );
    assert_eq!(v.len(), 2);
    assert_eq!(v.get("sim-node-1", "web-1").unwrap().index, 33);
    assert_eq!(health(&v, "sim-node-1", "web-1"), Health::Warning);
    assert_eq!(health(&v, "sim-node-3", "web-3"), Health::Critical);
    assert!(v.get("sim-node-2", "web-2").is_none());
    assert_eq!(v.resume_index(), 33);
}

#[test]
fn http_bodies_parse_with_our_types() {
    for e in manifest() {
        let file = e["file"].as_str().unwrap();
        if !file.starts_with("consul/http/") {
            continue;
        }
        let raw = String::from_utf8(read(file)).unwrap();
        // Request files hold the request line and headers before the body.
        let body = if file.ends_with(".request.txt") {
            raw.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("")
        } else {
            raw.as_str()
        };
        if file.ends_with(".request.txt") && !body.is_empty() {
            let v: Value = serde_json::from_str(body).unwrap();
            assert!(v.is_object(), "{file}");
        }
        assert_eq!(
            body,
            e["expected_decoded_fields"]["body"].as_str().unwrap(),
            "{file}"
        );
    }
    assert!(parse_bool(&read("consul/http/catalog-register.response.json")).unwrap());
    let s: SessionCreated =
        serde_json::from_slice(&read("consul/http/session-create.response.json")).unwrap();
    assert_eq!(s.id, "003f28ee-cd88-2631-0c91-50469e4ac804");
    let r: Vec<SessionEntry> =
        serde_json::from_slice(&read("consul/http/session-renew.response.json")).unwrap();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].id, s.id);
    assert_eq!(r[0].ttl, "15s");
    assert_eq!(r[0].behavior, "release");
    assert_eq!(r[0].node_checks.as_deref(), Some(&[][..]));
    assert_eq!(r[0].lock_delay, 15_000_000_000);
    assert_eq!(r[0].create_index, 28);
    // The TTL error is plain text, not JSON: HTTP 500 → http_5xx.
    let err = read("consul/http/session-create-ttl-5s-error.response.txt");
    assert!(serde_json::from_slice::<SessionCreated>(&err).is_err());
    assert_eq!(agent_sim_consul::http::status_kind(500), "http_5xx");
}

#[test]
fn captured_client_hello_starts_with_the_rpc_grpc_byte_and_preface() {
    let hello = read("consul/rpc-prefix-client-hello.bin");
    assert_eq!(hello.len(), 64);
    assert_eq!(hello[0], 0x08);
    assert_eq!(&hello[1..25], H2_PREFACE);
    // Then a SETTINGS frame header: type 4 on stream 0.
    assert_eq!(hello[25 + 3], 0x04);
}

#[tokio::test(start_paused = true)]
async fn our_connector_writes_0x08_then_the_h2_preface() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let dialer = Dialer::new(
        addr,
        "127.0.0.1",
        None,
        std::time::Duration::from_secs(30),
        std::time::Duration::from_secs(10),
    )
    .unwrap();
    let (server_read, was_read) = tokio::sync::oneshot::channel::<()>();
    let client = tokio::spawn(async move {
        // Keep the connection object alive until the server side has read.
        let c = dialer.connect_streams(None, None).await;
        let _ = was_read.await;
        c.is_ok()
    });
    let (mut sock, _) = listener.accept().await.unwrap();
    let mut got = [0u8; 25];
    tokio::time::timeout(std::time::Duration::from_secs(5), sock.read_exact(&mut got))
        .await
        .expect("client wrote 25 bytes in time")
        .unwrap();
    let _ = server_read.send(());
    assert_eq!(got[0], 0x08);
    assert_eq!(&got[1..], H2_PREFACE);
    assert_eq!(&got[..], &read("consul/rpc-prefix-client-hello.bin")[..25]);
    drop(sock);
    let _ = client.await;
}
