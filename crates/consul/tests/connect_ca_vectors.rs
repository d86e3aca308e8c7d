//! A real Consul 1.20.1 client agent's `ConnectCA.Roots` and
//! `ConnectCA.Sign` (`testdata/vectors/consul/agent-rpc/053`–`060`, see its
//! README): our requests for the same values are the agent's bytes, our
//! decoders read the server's answers (the roots before and after a
//! rotation, a leaf and its validity), and a CSR we make has the shape of
//! the agent's.

use agent_sim_consul::connect::{authority_key_id, new_csr, spiffe_service_id};
use agent_sim_consul::rpc::connect_ca::{self, decode_roots, decode_sign};
use agent_sim_consul::rpc::{MessageScan, decode_header};

use crate::common::agent_rpc::{fields, payload};

/// An answer's header (checked) and body.
fn answer(file: &str) -> Vec<u8> {
    let p = payload(file);
    let (h, end) = MessageScan::default().scan(&p).unwrap().unwrap();
    assert_eq!(end, p.len());
    let header = decode_header(&p[..h]).unwrap();
    let f = fields(file);
    assert_eq!(header.seq, f["Seq"].as_u64().unwrap());
    assert_eq!(header.service_method, f["ServiceMethod"].as_str().unwrap());
    assert_eq!(header.error, "");
    p[h..].to_vec()
}

#[test]
fn roots_requests_are_the_agents_bytes() {
    for file in [
        "053-connectca-roots-first.request.bin",
        "055-connectca-roots-blocking-rotated.request.bin",
    ] {
        let f = fields(file);
        let mut ours = Vec::new();
        connect_ca::encode_roots(
            f["Seq"].as_u64().unwrap(),
            "dc1",
            f["MinQueryIndex"].as_u64().unwrap(),
            "",
            &mut ours,
        );
        assert_eq!(ours, payload(file), "{file}");
    }
}

#[test]
fn sign_requests_are_the_agents_bytes() {
    for file in [
        "057-connectca-sign-first.request.bin",
        "059-connectca-sign-after-rotation.request.bin",
    ] {
        let f = fields(file);
        let mut ours = Vec::new();
        connect_ca::encode_sign(
            f["Seq"].as_u64().unwrap(),
            f["CSR"].as_str().unwrap(),
            "dc1",
            "",
            &mut ours,
        );
        assert_eq!(ours, payload(file), "{file}");
    }
}

#[test]
fn roots_answers_decode_before_and_after_a_rotation() {
    let first = decode_roots(&answer("054-connectca-roots-first.reply.bin")).unwrap();
    let f = fields("054-connectca-roots-first.reply.bin");
    assert_eq!(first.index, f["Index"].as_u64().unwrap());
    assert_eq!(first.active_root_id, f["ActiveRootID"].as_str().unwrap());
    assert_eq!(first.trust_domain, f["TrustDomain"].as_str().unwrap());
    assert_eq!(
        first.active_signing_key(),
        f["Roots.0.SigningKeyID"].as_str()
    );
    let rotated = decode_roots(&answer("056-connectca-roots-blocking-rotated.reply.bin")).unwrap();
    let g = fields("056-connectca-roots-blocking-rotated.reply.bin");
    assert!(rotated.index > first.index);
    assert_eq!(rotated.roots.as_ref().unwrap().len(), 2);
    assert_eq!(rotated.active_root_id, g["Roots.1.ID"].as_str().unwrap());
    assert_eq!(
        rotated.active_signing_key(),
        g["Roots.1.SigningKeyID"].as_str()
    );
    assert_ne!(rotated.active_signing_key(), first.active_signing_key());
}

#[test]
fn issued_certs_decode_with_their_validity_and_authority() {
    let roots = decode_roots(&answer("054-connectca-roots-first.reply.bin")).unwrap();
    let rotated = decode_roots(&answer("056-connectca-roots-blocking-rotated.reply.bin")).unwrap();
    let body = answer("058-connectca-sign-first.reply.bin");
    let cert = decode_sign(&body).unwrap();
    let f = fields("058-connectca-sign-first.reply.bin");
    assert_eq!(cert.service, "app");
    assert_eq!(cert.service_uri, f["ServiceURI"].as_str().unwrap());
    assert_eq!(cert.modify_index, f["ModifyIndex"].as_u64().unwrap());
    // 72 h, backdated by a minute.
    assert_eq!(cert.valid_before.0 - cert.valid_after.0, 72 * 3600);
    assert_eq!(
        authority_key_id(&cert.cert_pem).as_deref(),
        roots.active_signing_key()
    );
    let body = answer("060-connectca-sign-after-rotation.reply.bin");
    let again = decode_sign(&body).unwrap();
    assert_eq!(
        authority_key_id(&again.cert_pem).as_deref(),
        rotated.active_signing_key()
    );
}

#[test]
fn our_csr_has_the_agents_shape() {
    let theirs = fields("057-connectca-sign-first.request.bin")["CSR"]
        .as_str()
        .unwrap()
        .to_owned();
    let td = "4d9c033c-d809-e885-0c67-2029f24acb41.consul";
    let ours = new_csr(&spiffe_service_id(td, "dc1", "app")).unwrap().pem;
    // Same algorithm, subject and SAN: the same length within the
    // signature's variable size (an ECDSA signature's DER is 70-72 bytes).
    let der_len = |pem: &str| {
        pem.lines()
            .filter(|l| !l.starts_with("-----"))
            .map(str::len)
            .sum::<usize>()
    };
    let (a, b) = (der_len(&ours) as i64, der_len(&theirs) as i64);
    assert!(
        (a - b).abs() <= 4,
        "ours {a} vs the agent's {b} base64 chars"
    );
}
