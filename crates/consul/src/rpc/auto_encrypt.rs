//! `AutoEncrypt.Sign`, as a Consul 1.20 client agent with
//! `auto_encrypt { tls = true }` calls it at boot (`agent/auto-config`,
//! `agent/pool`'s `rpcInsecure`), and its answer, `SignedResponse`.
//!
//! The call has a connection of its own: the byte `0x07`
//! (`pool.RPCTLSInsecure`), a TLS handshake in which the server asks for
//! no client certificate (the agent has none yet), then net/rpc in
//! Consul's msgpack straight on the TLS stream: no inner byte, no yamux.
//! The request is a `CASignRequest` like `ConnectCA.Sign`'s (`CSR`,
//! `Datacenter`, `Token`); the answer carries the agent's `IssuedCert`,
//! the Connect CA's roots, the servers' own CA certificates
//! (`ManualCARoots`) and `VerifyServerHostname`.

use std::borrow::Cow;

use serde::Deserialize;

use super::MsgpackError;
use super::connect_ca::{GoTime, encode_sign_as};

/// `AutoEncrypt.Sign`.
pub const SIGN: &str = "AutoEncrypt.Sign";

/// First byte of the connection (`pool.RPCTLSInsecure`): TLS follows, and
/// the calls right after it.
pub const RPC_TLS_INSECURE: u8 = 0x07;

/// Largest answer read: a certificate (≈1 KiB), the roots (a few KiB each)
/// and the servers' CA certificates.
pub const MAX_ANSWER: usize = 1 << 20;

/// `AutoEncrypt.Sign` of the agent's `csr` (PEM).
pub fn encode_sign(seq: u64, csr: &str, datacenter: &str, token: &str, out: &mut Vec<u8>) {
    encode_sign_as(SIGN, seq, csr, datacenter, token, out);
}

/// The agent's certificate in the answer, as far as an agent looks at it.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct AgentCert<'a> {
    /// Colon-separated hex.
    #[serde(rename = "SerialNumber", borrow, default)]
    pub serial_number: Cow<'a, str>,
    /// The certificate (and intermediates), PEM.
    #[serde(rename = "CertPEM", borrow, default)]
    pub cert_pem: Cow<'a, str>,
    /// The node it is for.
    #[serde(rename = "Agent", borrow, default)]
    pub agent: Cow<'a, str>,
    /// Its SPIFFE ID, in the cluster's trust domain (the server put it in
    /// place of the CSR's `unknown`).
    #[serde(rename = "AgentURI", borrow, default)]
    pub agent_uri: Cow<'a, str>,
    /// Start of validity (Unix seconds).
    #[serde(rename = "ValidAfter", default)]
    pub valid_after: GoTime,
    /// End of validity (Unix seconds).
    #[serde(rename = "ValidBefore", default)]
    pub valid_before: GoTime,
    /// The raft index of the signing.
    #[serde(rename = "ModifyIndex", default)]
    pub modify_index: u64,
}

/// The head of the roots in the answer (the rest is skipped).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq, Default)]
pub struct RootsHead<'a> {
    /// The cluster's trust domain.
    #[serde(rename = "TrustDomain", borrow, default)]
    pub trust_domain: Cow<'a, str>,
}

/// `SignedResponse`, as far as an agent looks at it.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Signed<'a> {
    /// The agent's certificate.
    #[serde(rename = "IssuedCert", borrow)]
    pub issued: AgentCert<'a>,
    /// The Connect CA's roots.
    #[serde(rename = "ConnectCARoots", borrow, default)]
    pub roots: RootsHead<'a>,
    /// Whether the servers verify their names (`server.<dc>.<domain>`).
    #[serde(rename = "VerifyServerHostname", default)]
    pub verify_server_hostname: bool,
}

/// Decodes `AutoEncrypt.Sign`'s answer.
pub fn decode_signed(body: &[u8]) -> Result<Signed<'_>, MsgpackError> {
    agent_sim_proto::msgpack::decode_as(SIGN, body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_sim_proto::msgpack::Writer;

    #[test]
    fn the_request_is_connect_cas_with_another_method() {
        let mut ae = Vec::new();
        encode_sign(3, "PEM", "dc1", "tok", &mut ae);
        let mut ca = Vec::new();
        super::super::connect_ca::encode_sign(3, "PEM", "dc1", "tok", &mut ca);
        let split = |b: &[u8]| {
            let h = crate::rpc::Scanner::default().scan(b).unwrap().unwrap();
            (b[..h].to_vec(), b[h..].to_vec())
        };
        let ((ae_head, ae_body), (_, ca_body)) = (split(&ae), split(&ca));
        assert_eq!(ae_body, ca_body);
        let head = crate::rpc::decode_header(&ae_head).unwrap();
        assert_eq!((head.service_method.as_str(), head.seq), (SIGN, 3));
    }

    #[test]
    fn the_answer_gives_the_agents_certificate_and_skips_the_rest() {
        let mut b = Vec::new();
        let mut w = Writer(&mut b);
        w.map(5).str("ConnectCARoots").map(2);
        w.kv_str("TrustDomain", "abcd.consul").str("Roots").array(0);
        w.kv_str("GossipKey", "").str("IssuedCert").map(4);
        w.kv_str("Agent", "agent-7").kv_str(
            "AgentURI",
            "spiffe://abcd.consul/agent/client/dc/dc1/id/agent-7",
        );
        let t = [1, 0, 0, 0, 14, 226, 153, 128, 14, 0, 0, 0, 0, 0xff, 0xff];
        w.str("ValidBefore").raw(&t).kv_uint("ModifyIndex", 42);
        w.kv_nil("ManualCARoots")
            .kv_bool("VerifyServerHostname", true);
        let s = decode_signed(&b).unwrap();
        assert_eq!(s.issued.agent, "agent-7");
        assert!(
            s.issued
                .agent_uri
                .starts_with("spiffe://abcd.consul/agent/")
        );
        assert_eq!(s.issued.valid_before, GoTime(1_795_655_950));
        assert_eq!(s.issued.modify_index, 42);
        assert_eq!(s.roots.trust_domain, "abcd.consul");
        assert!(s.verify_server_hostname);
    }
}
