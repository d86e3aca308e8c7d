//! A sidecar's whole connection read back against a real Consul 1.20.1
//! (`testdata/vectors/consul/h2/dataplane-*.bin`, see its README): a
//! replaying server sends the real server's frames in their order, each
//! frame of a stream once the sidecar has opened that stream, and the
//! sidecar's calls and Delta ADS requests are the captured ones, message
//! for message, as the hyper-based client sent them before.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use agent_sim_dataplane::{DataplaneConfig, DataplaneFactory};
use agent_sim_fleet::FleetConfig;
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use prost::Message as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::common::*;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0;
const HEADERS: u8 = 1;

fn vector(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/../../testdata/vectors/consul/h2/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

struct Frame {
    kind: u8,
    stream: u32,
    /// The whole frame, its 9-octet head included.
    raw: Vec<u8>,
}

/// The complete frames of `b` (after the client's preface, when it has
/// one) and how many octets they took.
fn frames(b: &[u8]) -> (Vec<Frame>, usize) {
    let mut at = if b.starts_with(PREFACE) {
        PREFACE.len()
    } else {
        0
    };
    let mut out = Vec::new();
    while at + 9 <= b.len() {
        let len = u32::from_be_bytes([0, b[at], b[at + 1], b[at + 2]]) as usize;
        if at + 9 + len > b.len() {
            break;
        }
        let stream = u32::from_be_bytes(b[at + 5..at + 9].try_into().unwrap()) & 0x7fff_ffff;
        out.push(Frame {
            kind: b[at + 3],
            stream,
            raw: b[at..at + 9 + len].to_vec(),
        });
        at += 9 + len;
    }
    (out, at)
}

/// The gRPC messages of each stream's DATA frames, in order.
fn messages(b: &[u8]) -> BTreeMap<u32, Vec<Vec<u8>>> {
    let mut bodies: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
    for f in frames(b).0.iter().filter(|f| f.kind == DATA) {
        bodies.entry(f.stream).or_default().extend(&f.raw[9..]);
    }
    bodies
        .into_iter()
        .map(|(stream, body)| {
            let mut out = Vec::new();
            let mut at = 0;
            while at + 5 <= body.len() {
                let n = u32::from_be_bytes(body[at + 1..at + 5].try_into().unwrap()) as usize;
                out.push(body[at + 5..at + 5 + n].to_vec());
                at += 5 + n;
            }
            (stream, out)
        })
        .collect()
}

fn requests(msgs: &[Vec<u8>]) -> Vec<DeltaDiscoveryRequest> {
    msgs.iter()
        .map(|m| DeltaDiscoveryRequest::decode(&m[..]).unwrap())
        .collect()
}

/// Accepts one connection and plays `server`'s frames on it, a stream's
/// frames once the client has opened that stream; returns what the client
/// wrote, once it closes the connection.
async fn replay(l: TcpListener, server: Vec<Frame>) -> Vec<u8> {
    let (mut s, _) = l.accept().await.unwrap();
    let mut got = Vec::new();
    let mut opened = BTreeSet::new();
    let mut next = 0;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        while let Some(f) = server.get(next)
            && (f.stream == 0 || opened.contains(&f.stream))
        {
            if s.write_all(&f.raw).await.is_err() {
                return got;
            }
            next += 1;
        }
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
        let (fs, _) = frames(&got);
        opened.extend(fs.iter().filter(|f| f.kind == HEADERS).map(|f| f.stream));
    }
}

#[tokio::test(start_paused = true)]
async fn a_sidecar_against_a_real_servers_frames_sends_the_captured_calls() {
    let t = start().await;
    let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut cfg = DataplaneConfig {
        watch_servers: true,
        ..config(&t)
    };
    cfg.conn.targets = vec![grpc.local_addr().unwrap().to_string()];
    let (server, _) = frames(&vector("dataplane-s2c.bin"));
    let played = tokio::spawn(replay(grpc, server));
    let m = metrics();
    let f = DataplaneFactory::new(cfg, m.clone()).unwrap();
    let fc = FleetConfig {
        agents: 1,
        duration: Some(Duration::from_secs(10)),
        grace: Duration::from_secs(5),
        ..FleetConfig::default()
    };
    let report = run_fleet(f, fc, &m).await;
    let sent = tokio::time::timeout(Duration::from_secs(30), played)
        .await
        .expect("the sidecar closed its connection")
        .unwrap();
    let s = m.snapshot();
    assert_eq!(report.ever_connected, 1, "{s:?}");
    assert!(s.errors.is_empty(), "errors: {:?}", s.errors);
    assert_eq!(s.counter("xds_bootstraps"), 1);
    assert_eq!(s.counter("server_lists"), 1);
    // CDS, EDS, then three EDS updates of the probe's changes.
    assert_eq!(s.counter("xds_responses"), 5);
    assert_eq!(s.counter("xds_acks"), 5);
    assert_eq!(s.counter("xds_nacks"), 0);

    assert!(sent.starts_with(PREFACE), "no 0x08 byte on the gRPC port");
    let ours = messages(&sent);
    let captured = messages(&vector("dataplane-c2s.bin"));
    assert_eq!(ours.keys().collect::<Vec<_>>(), [&1, &3, &5]);
    // The bootstrap call and WatchServers: the very bytes.
    assert_eq!(ours[&1], captured[&1]);
    assert_eq!(ours[&5], captured[&5]);
    // The ADS requests field for field (the node's metadata is a map).
    assert_eq!(requests(&ours[&3]), requests(&captured[&3]));
}

fn kind_name(k: u8) -> &'static str {
    match k {
        0 => "DATA",
        1 => "HEADERS",
        3 => "RST_STREAM",
        4 => "SETTINGS",
        6 => "PING",
        7 => "GOAWAY",
        8 => "WINDOW_UPDATE",
        _ => "OTHER",
    }
}

/// Each capture holds the frames and messages its manifest lists, and the
/// lean client's calls name their methods as literals.
#[test]
fn the_captures_hold_what_the_manifest_lists() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/vectors/consul/h2/manifest.json"
    );
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let entries: Vec<_> = manifest
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["file"].as_str().unwrap().contains("/dataplane"))
        .collect();
    assert_eq!(entries.len(), 3);
    for e in entries {
        let file = e["file"].as_str().unwrap();
        let b = vector(file.trim_start_matches("consul/h2/"));
        let want = &e["expected_decoded_fields"];
        let (fs, used) = frames(&b);
        assert_eq!(used, b.len(), "{file}: whole frames");
        let names: Vec<&str> = fs.iter().map(|f| kind_name(f.kind)).collect();
        let listed: Vec<&str> = want["frame_types"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(names, listed, "{file}");
        let msgs = messages(&b);
        for (stream, n) in want["grpc_messages"].as_object().unwrap() {
            let s: u32 = stream.parse().unwrap();
            assert_eq!(msgs[&s].len() as u64, n.as_u64().unwrap(), "{file} {s}");
        }
        let Some(paths) = want.get("paths") else {
            continue;
        };
        for (stream, p) in paths.as_object().unwrap() {
            let s: u32 = stream.parse().unwrap();
            let h = fs
                .iter()
                .find(|f| f.kind == HEADERS && f.stream == s)
                .unwrap();
            let p = p.as_str().unwrap().as_bytes();
            assert!(h.raw.windows(p.len()).any(|w| w == p), "{file} {s}");
        }
    }
}

/// The lean client's captured calls against the hyper-based client's on
/// the same real server version: the same messages on the same streams (the
/// EDS names carry each server's own trust domain).
#[test]
fn the_lean_client_sends_what_the_hyper_client_sent() {
    let lean = messages(&vector("dataplane-c2s.bin"));
    let hyper = messages(&vector("dataplane-hyper-c2s.bin"));
    assert_eq!(lean.keys().collect::<Vec<_>>(), [&1, &3, &5]);
    assert_eq!(
        lean.keys().collect::<Vec<_>>(),
        hyper.keys().collect::<Vec<_>>()
    );
    assert_eq!(lean[&1], hyper[&1], "GetEnvoyBootstrapParams");
    assert_eq!(lean[&5], hyper[&5], "WatchServers");
    let (l, h) = (requests(&lean[&3]), requests(&hyper[&3]));
    assert_eq!(l.len(), 7);
    assert_eq!(l.len(), h.len());
    assert_eq!(l[0], h[0], "the first request, node and all");
    for (i, (a, b)) in l.iter().zip(&h).enumerate() {
        assert_eq!(a.type_url, b.type_url, "request {i}");
        assert_eq!(a.response_nonce, b.response_nonce, "request {i}");
        assert_eq!(
            a.resource_names_subscribe.len(),
            b.resource_names_subscribe.len(),
            "request {i}"
        );
    }
}
