//! `AutoEncrypt.Sign` on the embedded target's RPC port as a Consul 1.20
//! client agent calls it at boot: `0x07`, a TLS handshake without a client
//! certificate, net/rpc in msgpack on the TLS stream. The agent's
//! certificate comes back in the cluster's trust domain with a raft index
//! of its own; refusals and the signing rate are answered in Consul's
//! words. Bounded, on `127.0.0.1:0`.
#![cfg(feature = "consul")]

use std::net::SocketAddr;

use agent_sim_proto::msgpack::{MessageScan, Writer};
use agent_sim_server::consul::{CaConfig, ConsulTargetConfig, RATE_LIMITED};
use rcgen::{CertificateParams, DistinguishedName, KeyPair, PKCS_ECDSA_P256_SHA256, SanType};
use serde::Deserialize;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::common::{start, within};

/// A connection as an agent opens it for `AutoEncrypt.Sign`.
async fn connect(addr: SocketAddr) -> TlsStream<TcpStream> {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(&[0x07]).await.unwrap();
    let tls = agent_sim_net::ClientTls {
        insecure_skip_verify: true,
        ..Default::default()
    };
    let connector = TlsConnector::from(agent_sim_net::client_config(&tls, &[]).unwrap());
    let name = "server.dc1.consul".try_into().unwrap();
    connector.connect(name, tcp).await.unwrap()
}

/// One call on `io`: the answer's error words and body.
async fn call(io: &mut TlsStream<TcpStream>, method: &str, args: &[u8]) -> (String, Vec<u8>) {
    let mut req = Vec::new();
    Writer(&mut req)
        .map(2)
        .kv_uint("Seq", 1)
        .kv_str("ServiceMethod", method);
    req.extend_from_slice(args);
    io.write_all(&req).await.unwrap();
    let (mut buf, mut chunk) = (Vec::new(), [0u8; 4096]);
    let mut scan = MessageScan::default();
    let (h, end) = loop {
        if let Some(done) = scan.scan(&buf).unwrap() {
            break done;
        }
        let n = io.read(&mut chunk).await.unwrap();
        assert!(n > 0, "closed before the answer");
        buf.extend_from_slice(&chunk[..n]);
    };
    #[derive(Deserialize)]
    struct Head {
        #[serde(rename = "Error")]
        error: String,
    }
    let head: Head = agent_sim_proto::msgpack::decode(&buf[..h]).unwrap();
    (head.error, buf[h..end].to_vec())
}

/// A `CASignRequest` of a CSR for `uri` from datacenter `dc`.
fn sign_args(uri: &str, dc: &str) -> Vec<u8> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let mut p = CertificateParams::default();
    p.distinguished_name = DistinguishedName::new();
    p.subject_alt_names = vec![
        SanType::DnsName("localhost".try_into().unwrap()),
        SanType::URI(uri.try_into().unwrap()),
    ];
    let csr = p.serialize_request(&key).unwrap().pem().unwrap();
    let mut out = Vec::new();
    Writer(&mut out)
        .map(3)
        .kv_str("CSR", &csr)
        .kv_str("Datacenter", dc)
        .kv_str("Token", "");
    out
}

const AGENT: &str = "spiffe://unknown/agent/client/dc/dc1/id/node-1";

#[derive(Deserialize)]
struct Signed {
    #[serde(rename = "IssuedCert")]
    issued: Issued,
    #[serde(rename = "ConnectCARoots")]
    roots: Roots,
}

#[derive(Deserialize)]
struct Issued {
    #[serde(rename = "Agent")]
    agent: String,
    #[serde(rename = "AgentURI")]
    agent_uri: String,
    #[serde(rename = "Service")]
    service: String,
    #[serde(rename = "CertPEM")]
    cert_pem: String,
    #[serde(rename = "ModifyIndex")]
    modify_index: u64,
}

#[derive(Deserialize)]
struct Roots {
    #[serde(rename = "TrustDomain")]
    trust_domain: String,
}

#[tokio::test]
async fn an_agents_certificate_comes_in_the_clusters_trust_domain_with_a_raft_index() {
    let t = start(ConsulTargetConfig::default()).await;
    let mut io = within(connect(t.rpc)).await;
    let before = t.state.raft_index();
    let (error, body) = within(call(&mut io, "AutoEncrypt.Sign", &sign_args(AGENT, "dc1"))).await;
    assert_eq!(error, "");
    let s: Signed = agent_sim_proto::msgpack::decode(&body).unwrap();
    let td = &s.roots.trust_domain;
    assert!(td.ends_with(".consul") && td != "unknown", "{td}");
    assert_eq!(s.issued.agent, "node-1");
    assert_eq!(
        s.issued.agent_uri,
        format!("spiffe://{td}/agent/client/dc/dc1/id/node-1")
    );
    assert_eq!(s.issued.service, "");
    // The certificate itself names the cluster's trust domain, not the
    // CSR's `unknown`.
    let (_, pem) = x509_parser::pem::parse_x509_pem(s.issued.cert_pem.as_bytes()).unwrap();
    let cert = pem.parse_x509().unwrap();
    let san = cert.subject_alternative_name().unwrap().unwrap();
    let uris: Vec<String> = san
        .value
        .general_names
        .iter()
        .filter_map(|n| match n {
            x509_parser::extensions::GeneralName::URI(u) => Some(u.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(uris, std::slice::from_ref(&s.issued.agent_uri));
    // One raft write for the signing.
    assert_eq!(t.state.raft_index(), before + 1);
    assert_eq!(s.issued.modify_index, before + 1);
    // The connection serves the next call too (a real agent's stays open).
    let (error, _) = within(call(&mut io, "AutoEncrypt.Sign", &sign_args(AGENT, "dc1"))).await;
    assert_eq!(error, "");
    let ca = t.state.stats().connect_ca;
    assert_eq!((ca.agent_certs_signed, ca.leaves_signed), (2, 0));
}

#[tokio::test]
async fn refusals_are_in_consuls_words() {
    let t = start(ConsulTargetConfig::default()).await;
    let mut io = within(connect(t.rpc)).await;
    let mut ask = async |method: &str, args: Vec<u8>| within(call(&mut io, method, &args)).await.0;
    assert_eq!(
        ask("AutoEncrypt.Sign", sign_args(AGENT, "dc2")).await,
        "mismatched datacenter (client_dc='dc2' server_dc='dc1'); check client has same \
         datacenter set as servers"
    );
    let service = "spiffe://unknown/ns/default/dc/dc1/svc/web";
    assert_eq!(
        ask("AutoEncrypt.Sign", sign_args(service, "dc1")).await,
        "SPIFFE ID in CSR must be a service, agent, server, or mesh gateway ID"
    );
    assert_eq!(
        ask("AutoEncrypt.Nope", vec![0x80]).await,
        "rpc: can't find method AutoEncrypt.Nope"
    );
    // The insecure RPC server holds nothing else.
    assert_eq!(
        ask("Status.Ping", vec![0x80]).await,
        "rpc: can't find service Status.Ping"
    );
    assert_eq!(t.state.stats().connect_ca.agent_certs_signed, 0);
}

#[tokio::test]
async fn signing_past_csr_max_per_second_is_refused_after_the_wait() {
    // A token every 2 s, burst 1: of three at once, the first is signed and
    // the others would wait over 500 ms for a token, so they are refused.
    let t = start(ConsulTargetConfig {
        connect_ca: CaConfig {
            csr_max_per_second: 0.5,
            ..CaConfig::default()
        },
        ..ConsulTargetConfig::default()
    })
    .await;
    let addr = t.rpc;
    let one = async move || {
        let mut io = connect(addr).await;
        call(&mut io, "AutoEncrypt.Sign", &sign_args(AGENT, "dc1"))
            .await
            .0
    };
    let (a, b, c) = within(async { tokio::join!(one(), one(), one()) }).await;
    let mut words = [a, b, c];
    words.sort();
    assert_eq!(words, ["", RATE_LIMITED, RATE_LIMITED]);
    let ca = t.state.stats().connect_ca;
    assert_eq!((ca.agent_certs_signed, ca.sign_rate_limited), (1, 2));
}
