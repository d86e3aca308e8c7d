//! A real Consul 1.20.1 client agent's own RPCs, captured on its server's
//! RPC port (`testdata/vectors/consul/agent-rpc/`, see its README): every
//! request we write for the same values is the bytes the agent wrote (Go
//! writes its maps in a random order, so both sides are compared with map
//! entries sorted), and our decoders recover the manifest's values from the
//! server's answers.

use std::path::Path;

use agent_sim_consul::rpc::catalog::{
    self, CheckDef, NodeIdent, ServiceDef, ServiceKind, decode_node_checks, decode_node_services,
};
use agent_sim_consul::rpc::coordinate::{self, Coord};
use agent_sim_consul::rpc::session::{self, NewSession};
use agent_sim_consul::rpc::{MessageScan, decode_header, encode_ping};
use serde_json::Value;

use crate::common::agent_rpc::{DIR, fields, payload};

/// One msgpack value at `b[*at..]` re-written with every map's entries in
/// the order of their encoded keys (a Go map's order is random).
fn canonical(b: &[u8], at: &mut usize, out: &mut Vec<u8>) {
    let m = b[*at];
    let be = |s: &[u8]| s.iter().fold(0usize, |a, x| (a << 8) | usize::from(*x));
    let start = *at;
    let (len, entries): (usize, Option<(usize, bool)>) = match m {
        0x80..=0x8f => (1, Some(((m & 0x0f) as usize, true))),
        0x90..=0x9f => (1, Some(((m & 0x0f) as usize, false))),
        0xde => (3, Some((be(&b[*at + 1..*at + 3]), true))),
        0xdc => (3, Some((be(&b[*at + 1..*at + 3]), false))),
        0xa0..=0xbf => (1 + (m & 0x1f) as usize, None),
        0xda => (3 + be(&b[*at + 1..*at + 3]), None),
        0xcc => (2, None),
        0xcd => (3, None),
        0xce => (5, None),
        0xcf | 0xcb => (9, None),
        0x00..=0x7f | 0xc0 | 0xc2 | 0xc3 | 0xe0..=0xff => (1, None),
        o => panic!("marker {o:#x} not expected in these messages"),
    };
    *at += len;
    out.extend_from_slice(&b[start..start + len]);
    match entries {
        None => {}
        Some((n, false)) => {
            for _ in 0..n {
                canonical(b, at, out);
            }
        }
        Some((n, true)) => {
            let mut kv: Vec<(Vec<u8>, Vec<u8>)> = (0..n)
                .map(|_| {
                    let (mut k, mut v) = (Vec::new(), Vec::new());
                    canonical(b, at, &mut k);
                    canonical(b, at, &mut v);
                    (k, v)
                })
                .collect();
            kv.sort();
            for (k, v) in kv {
                out.extend(k);
                out.extend(v);
            }
        }
    }
}

/// Both messages (header and body) with their maps in one order.
fn canon(b: &[u8]) -> Vec<u8> {
    let (mut at, mut out) = (0, Vec::new());
    while at < b.len() {
        canonical(b, &mut at, &mut out);
    }
    out
}

fn assert_same(file: &str, ours: &[u8]) {
    let theirs = payload(file);
    assert_eq!(
        canon(ours),
        canon(&theirs),
        "{file}: our request differs from the agent's"
    );
    assert_eq!(ours.len(), theirs.len(), "{file}: length");
}

fn seq(file: &str) -> u64 {
    fields(file)["Seq"].as_u64().unwrap()
}

/// The Connect capture (`agent-rpc-connect/`): its payload and `Seq`.
fn connect_vector(file: &str) -> (Vec<u8>, u64) {
    let dir = Path::new(DIR).with_file_name("agent-rpc-connect");
    let b = std::fs::read(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    let m: Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    let f = m
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["file"] == format!("consul/agent-rpc-connect/{file}"))
        .unwrap_or_else(|| panic!("{file} not in the manifest"))["expected_decoded_fields"]
        .clone();
    (b[12..].to_vec(), f["Seq"].as_u64().unwrap())
}

const META: &[(&str, &str)] = &[("consul-network-segment", ""), ("consul-version", "1.20.1")];

fn node() -> NodeIdent<'static> {
    NodeIdent {
        datacenter: "dc1",
        id: "6f1b2d3c-0a4e-4b5f-8c9d-0e1f2a3b4c11",
        node: "real-1",
        address: "127.0.0.11",
        meta: META,
        token: "",
    }
}

fn plain(id: &'static str, port: u16) -> ServiceDef<'static> {
    ServiceDef {
        id,
        service: id,
        port,
        address: "",
        tags: &[],
        kind: ServiceKind::Plain,
    }
}

fn app2_check(status: &'static str) -> CheckDef<'static> {
    CheckDef {
        check_id: "service:app2",
        name: "Service 'app2' check",
        status,
        service_id: "app2",
        service_name: "app2",
        kind: "ttl",
        interval: "",
        output: "",
    }
}

#[test]
fn anti_entropy_reads_are_the_agents_bytes() {
    for (file, method) in [
        (
            "007-catalog-nodeservicelist-first.request.bin",
            catalog::NODE_SERVICE_LIST,
        ),
        ("009-health-nodechecks.request.bin", catalog::NODE_CHECKS),
        (
            "017-catalog-nodeservicelist-periodic.request.bin",
            catalog::NODE_SERVICE_LIST,
        ),
    ] {
        let mut ours = Vec::new();
        catalog::encode_node_read(seq(file), method, &node(), &mut ours);
        assert_same(file, &ours);
    }
}

#[test]
fn registrations_and_deregistrations_are_the_agents_bytes() {
    let n = node();
    let app = plain("app", 8080);
    let app2 = plain("app2", 8081);
    let cases: [(&str, Option<&ServiceDef<'_>>, Option<CheckDef<'_>>, bool); 5] = [
        ("011-catalog-register-node.request.bin", None, None, false),
        (
            "013-catalog-register-service.request.bin",
            Some(&app),
            None,
            true,
        ),
        (
            "021-catalog-register-service-with-check.request.bin",
            Some(&app2),
            Some(app2_check("critical")),
            true,
        ),
        (
            "023-catalog-register-check-pass.request.bin",
            Some(&app2),
            Some(app2_check("passing")),
            true,
        ),
        (
            "037-catalog-register-check-critical.request.bin",
            Some(&app2),
            Some(app2_check("critical")),
            true,
        ),
    ];
    for (file, service, check, skip) in cases {
        let mut ours = Vec::new();
        let checks: Vec<CheckDef<'_>> = check.into_iter().collect();
        catalog::encode_register(seq(file), &n, service, &checks, skip, &mut ours);
        assert_same(file, &ours);
    }
    let file = "039-catalog-deregister-service.request.bin";
    let mut ours = Vec::new();
    catalog::encode_deregister(seq(file), &n, "app2", &mut ours);
    assert_same(file, &ours);
}

#[test]
fn a_sidecar_with_upstreams_and_its_checks_is_the_agents_bytes() {
    let n = NodeIdent {
        id: "7a2c3e4d-1b5f-4c6a-9d0e-1f2a3b4c5d12",
        node: "real-2",
        address: "127.0.0.12",
        ..node()
    };
    let sidecar = ServiceDef {
        id: "web-sidecar-proxy",
        service: "web-sidecar-proxy",
        port: 21000,
        address: "",
        tags: &[],
        kind: ServiceKind::Sidecar {
            destination: "web",
            destination_id: "web",
            local_address: "127.0.0.1",
            local_port: 8080,
            upstreams: &[("api", 9191), ("db", 9192)],
        },
    };
    let check = |n: u8, name, kind, status, interval, output| CheckDef {
        check_id: if n == 1 {
            "service:web-sidecar-proxy:1"
        } else {
            "service:web-sidecar-proxy:2"
        },
        name,
        status,
        service_id: "web-sidecar-proxy",
        service_name: "web-sidecar-proxy",
        kind,
        interval,
        output,
    };
    let checks = [
        check(1, "Connect Sidecar Listening", "tcp", "critical", "10s", ""),
        check(
            2,
            "Connect Sidecar Aliasing web",
            "alias",
            "passing",
            "",
            "No checks found.",
        ),
    ];
    let (theirs, seq) = connect_vector("028-catalog-register-sidecar.request.bin");
    let mut ours = Vec::new();
    catalog::encode_register(seq, &n, Some(&sidecar), &checks, true, &mut ours);
    assert_eq!(canon(&ours), canon(&theirs), "the sidecar's registration");
    let (theirs, seq) = connect_vector("026-catalog-register-web.request.bin");
    let mut ours = Vec::new();
    catalog::encode_register(seq, &n, Some(&plain("web", 8080)), &[], true, &mut ours);
    assert_eq!(
        canon(&ours),
        canon(&theirs),
        "the plain service's registration"
    );
}

#[test]
fn coordinate_ping_and_sessions_are_the_agents_bytes() {
    let file = "015-coordinate-update.request.bin";
    let f = fields(file);
    let mut vec = [0.0; coordinate::DIMENSIONS];
    for (i, v) in f["Coord.Vec"].as_array().unwrap().iter().enumerate() {
        vec[i] = v.as_f64().unwrap();
    }
    let c = Coord {
        vec,
        error: f["Coord.Error"].as_f64().unwrap(),
        adjustment: f["Coord.Adjustment"].as_f64().unwrap(),
        height: f["Coord.Height"].as_f64().unwrap(),
    };
    let mut ours = Vec::new();
    coordinate::encode_update(seq(file), "dc1", "real-1", &c, "", &mut ours);
    assert_same(file, &ours);

    let file = "019-status-ping.request.bin";
    let mut ours = Vec::new();
    encode_ping(seq(file), &mut ours);
    assert_same(file, &ours);

    for (file, name, checks) in [
        (
            "025-session-apply-create.request.bin",
            "s",
            &["serfHealth"][..],
        ),
        (
            "027-session-apply-create-nochecks.request.bin",
            "s-nochecks",
            &[][..],
        ),
    ] {
        let mut ours = Vec::new();
        let s = NewSession {
            datacenter: "dc1",
            node: "real-1",
            name,
            ttl: "15s",
            behavior: "release",
            node_checks: checks,
            token: "",
        };
        session::encode_create(seq(file), &s, &mut ours);
        assert_same(file, &ours);
    }
    let id = "08ca1517-e8ed-0aaf-e91c-a31e4950b4f1";
    let file = "031-session-renew.request.bin";
    let mut ours = Vec::new();
    session::encode_renew(seq(file), "dc1", id, "", &mut ours);
    assert_same(file, &ours);
    let file = "035-session-apply-destroy.request.bin";
    let mut ours = Vec::new();
    session::encode_destroy(seq(file), "dc1", id, "", &mut ours);
    assert_same(file, &ours);
}

/// The answer in a reply frame: its header, and its body's bytes.
fn answer(file: &str) -> (agent_sim_consul::rpc::ResponseHeader, Vec<u8>) {
    let p = payload(file);
    let (h, end) = MessageScan::default()
        .scan(&p)
        .unwrap()
        .expect("a whole answer");
    assert_eq!(end, p.len(), "{file}: one answer per frame");
    let f = fields(file);
    let header = decode_header(&p[..h]).unwrap();
    assert_eq!(header.seq, f["Seq"].as_u64().unwrap());
    assert_eq!(header.service_method, f["ServiceMethod"].as_str().unwrap());
    assert_eq!(header.error, "");
    (header, p[h..].to_vec())
}

#[test]
fn answers_decode_to_the_manifest() {
    let (_, body) = answer("008-catalog-nodeservicelist-first.reply.bin");
    let first = decode_node_services(&body).unwrap();
    assert_eq!(first.index, 18);
    assert!(first.node_known);
    assert!(first.services.is_empty());
    // The leader's reconcile of the agent's gossip join registered the
    // node first, with only its version: the agent's meta differs, so its
    // first sync registers the node (as the real agent did next).
    assert_eq!(
        first.node_meta,
        vec![("consul-version".into(), "1.20.1".into())]
    );

    let file = "018-catalog-nodeservicelist-periodic.reply.bin";
    let (_, body) = answer(file);
    let f = fields(file);
    let later = decode_node_services(&body).unwrap();
    assert_eq!(later.index, f["Index"].as_u64().unwrap());
    assert_eq!(later.services.len(), 1);
    assert_eq!(
        later.services[0].id,
        f["NodeServices.Services.0.ID"].as_str().unwrap()
    );
    assert_eq!(
        u64::from(later.services[0].port),
        f["NodeServices.Services.0.Port"].as_u64().unwrap()
    );

    let file = "010-health-nodechecks.reply.bin";
    let (_, body) = answer(file);
    let f = fields(file);
    let (index, checks) = decode_node_checks(&body).unwrap();
    assert_eq!(index, f["Index"].as_u64().unwrap());
    assert_eq!(
        checks[0].check_id,
        f["HealthChecks.0.CheckID"].as_str().unwrap()
    );
    assert_eq!(
        checks[0].status,
        f["HealthChecks.0.Status"].as_str().unwrap()
    );

    let file = "026-session-apply-create.reply.bin";
    let (_, body) = answer(file);
    assert_eq!(
        session::decode_apply(&body).unwrap(),
        fields(file)["body"].as_str().unwrap()
    );
    let (_, body) = answer("036-session-apply-destroy.reply.bin");
    assert_eq!(session::decode_apply(&body).unwrap(), "");
    let (_, body) = answer("032-session-renew.reply.bin");
    assert!(session::decode_renew(&body).unwrap());
    for file in [
        "012-catalog-register-node.reply.bin",
        "016-coordinate-update.reply.bin",
        "020-status-ping.reply.bin",
        "040-catalog-deregister-service.reply.bin",
    ] {
        let (_, body) = answer(file);
        assert_eq!(body, [0x80], "{file}: an empty struct");
    }
}
