//! A leaf's key and CSR as Consul's `connect.CreateCSR` makes them: a new
//! ECDSA P-256 key (the agent's default `ec`, 256 bits) per certificate, an
//! empty subject and one SAN, the service's SPIFFE ID (critical, as the
//! subject is empty), signed with ECDSA-SHA256, PEM-encoded. The key is not
//! kept: no simulated proxy serves TLS with it. The agent's own certificate
//! (`auto_encrypt`, [`new_agent_csr`]) is asked for alike, its SAN holding
//! `localhost`, `127.0.0.1` and `::1` before the agent's SPIFFE ID, as
//! `agent/auto-config` writes it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rcgen::{CertificateParams, DistinguishedName, KeyPair, PKCS_ECDSA_P256_SHA256, SanType};

/// A CSR ready for `ConnectCA.Sign`.
#[derive(Debug, Clone)]
pub struct Csr {
    /// PEM (`CERTIFICATE REQUEST`).
    pub pem: String,
}

/// The SPIFFE ID of `service` in `datacenter` of the cluster whose trust
/// domain is `trust_domain` (default namespace, as a CE agent writes it).
pub fn spiffe_service_id(trust_domain: &str, datacenter: &str, service: &str) -> String {
    format!("spiffe://{trust_domain}/ns/default/dc/{datacenter}/svc/{service}")
}

/// The SPIFFE ID of client agent `node` in `datacenter` (default
/// partition, as a CE agent writes it); at boot the agent does not know the
/// trust domain yet and writes [`UNKNOWN_TRUST_DOMAIN`], which the server
/// replaces.
pub fn spiffe_agent_id(trust_domain: &str, datacenter: &str, node: &str) -> String {
    format!("spiffe://{trust_domain}/agent/client/dc/{datacenter}/id/{node}")
}

/// The trust domain of an agent's first CSR (`unknownTrustDomain`).
pub const UNKNOWN_TRUST_DOMAIN: &str = "unknown";

/// Why a CSR could not be made (rcgen's words).
#[derive(Debug, thiserror::Error)]
#[error("making a CSR: {0}")]
pub struct CsrError(#[from] rcgen::Error);

impl CsrError {
    /// The error kind it is counted as.
    pub fn kind(&self) -> &'static str {
        "csr_failed"
    }
}

/// A new P-256 key and the CSR of `spiffe_id` signed with it.
pub fn new_csr(spiffe_id: &str) -> Result<Csr, CsrError> {
    csr_with(Vec::new(), spiffe_id)
}

/// A new P-256 key and the CSR of an agent's `spiffe_id`
/// ([`spiffe_agent_id`]) with the SANs a 1.20 agent adds (`defaultDNSSANs`,
/// `defaultIPSANs`), in the order Go writes them: DNS, IP, URI.
pub fn new_agent_csr(spiffe_id: &str) -> Result<Csr, CsrError> {
    let sans = vec![
        SanType::DnsName("localhost".try_into()?),
        SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        SanType::IpAddress(IpAddr::V6(Ipv6Addr::LOCALHOST)),
    ];
    csr_with(sans, spiffe_id)
}

/// The CSR of `sans` then the URI `spiffe_id`, under a new P-256 key.
fn csr_with(mut sans: Vec<SanType>, spiffe_id: &str) -> Result<Csr, CsrError> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    sans.push(SanType::URI(spiffe_id.to_owned().try_into()?));
    params.subject_alt_names = sans;
    let csr = params.serialize_request(&key)?;
    Ok(Csr { pem: csr.pem()? })
}

/// The authority key ID of the first certificate in `pem` as Consul writes
/// a signing key ID (colon-separated lowercase hex): what a leaf names as
/// the key that signed it. `None` when there is none.
pub fn authority_key_id(pem: &str) -> Option<String> {
    let body: String = pem
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN CERTIFICATE"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .collect();
    let der = STANDARD.decode(body).ok()?;
    // The extension: OID 2.5.29.35, OCTET STRING { SEQUENCE { [0] keyId } }.
    const OID: [u8; 5] = [0x06, 0x03, 0x55, 0x1d, 0x23];
    let at = der.windows(OID.len()).position(|w| w == OID)? + OID.len();
    let mut rest = &der[at..];
    // An optional `critical` BOOLEAN.
    if rest.first() == Some(&0x01) {
        rest = rest.get(3..)?;
    }
    let (tag, rest) = (rest.first()?, tlv_body(rest)?);
    let (seq, rest) = (rest.first()?, tlv_body(rest)?);
    let (key, id) = (rest.first()?, tlv_body(rest)?);
    if (*tag, *seq, *key) != (0x04, 0x30, 0x80) {
        return None;
    }
    Some(
        id.iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":"),
    )
}

/// The contents of the DER TLV at the start of `b` (lengths up to 64 KiB).
fn tlv_body(b: &[u8]) -> Option<&[u8]> {
    let first = *b.get(1)?;
    let (len, at) = match first {
        0..=0x7f => (usize::from(first), 2),
        0x81 => (usize::from(*b.get(2)?), 3),
        0x82 => ((usize::from(*b.get(2)?) << 8) | usize::from(*b.get(3)?), 4),
        _ => return None,
    };
    b.get(at..at + len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_csr_carries_the_spiffe_id_and_a_p256_key() {
        let id = spiffe_service_id("11111111-2222-3333-4444-555555555555.consul", "dc1", "web");
        assert_eq!(
            id,
            "spiffe://11111111-2222-3333-4444-555555555555.consul/ns/default/dc/dc1/svc/web"
        );
        let csr = new_csr(&id).unwrap();
        assert!(csr.pem.starts_with("-----BEGIN CERTIFICATE REQUEST-----"));
        let body: String = csr
            .pem
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .collect();
        let der = STANDARD.decode(body).unwrap();
        // id-ecPublicKey, prime256v1, ecdsa-with-SHA256, and the URI.
        for needle in [
            &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01][..],
            &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07],
            &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02],
            id.as_bytes(),
        ] {
            assert!(der.windows(needle.len()).any(|w| w == needle));
        }
        // An empty subject: `SEQUENCE {}` right after the version.
        assert!(der.windows(5).any(|w| w == [0x02, 0x01, 0x00, 0x30, 0x00]));
    }

    #[test]
    fn an_agent_csr_names_the_node_under_an_unknown_trust_domain() {
        let id = spiffe_agent_id(UNKNOWN_TRUST_DOMAIN, "dc1", "agent-7");
        assert_eq!(id, "spiffe://unknown/agent/client/dc/dc1/id/agent-7");
        let csr = new_agent_csr(&id).unwrap();
        let body: String = csr
            .pem
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .collect();
        let der = STANDARD.decode(body).unwrap();
        // dNSName localhost, iPAddress 127.0.0.1, then the URI.
        let dns = der.windows(11).position(|w| w == b"\x82\x09localhost");
        let ip = der.windows(6).position(|w| w == [0x87, 0x04, 127, 0, 0, 1]);
        let uri = der.windows(id.len()).position(|w| w == id.as_bytes());
        assert!(
            dns < ip && ip < uri && dns.is_some(),
            "{dns:?} {ip:?} {uri:?}"
        );
    }

    /// The cost of one leaf's key and CSR (run with `--release --ignored
    /// --nocapture`; BENCHMARKS.md has the figure).
    #[test]
    #[ignore = "a measurement, not a check"]
    fn cost_per_key_and_csr() {
        let id = spiffe_service_id("11111111-2222-3333-4444-555555555555.consul", "dc1", "web");
        let n = 2_000;
        let t = std::time::Instant::now();
        for _ in 0..n {
            new_csr(&id).unwrap();
        }
        let per = t.elapsed() / n;
        eprintln!("one P-256 key and CSR: {per:?} ({n} made)");
    }
}
