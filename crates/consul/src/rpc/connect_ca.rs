//! Connect's CA as a client agent asks it: `ConnectCA.Roots` (the agent
//! cache's blocking watch of the trusted roots: how an agent learns of a
//! rotation) and `ConnectCA.Sign` (a leaf certificate for a CSR), written
//! as Consul 1.20's agent writes them, and their answers.
//!
//! Times in the answers are Go's `time.MarshalBinary` bytes in a msgpack
//! string (15 bytes: version 1, seconds since 0001-01-01, nanoseconds, the
//! zone `0xffff` for UTC); [`go_time`] reads them as Unix seconds.

use std::borrow::Cow;
use std::fmt;

use agent_sim_proto::msgpack::Writer;
use serde::Deserialize;
use serde::de::{Deserializer, Visitor};

use super::{MsgpackError, request_header};

/// `ConnectCA.Roots`.
pub const ROOTS: &str = "ConnectCA.Roots";
/// `ConnectCA.Sign`.
pub const SIGN: &str = "ConnectCA.Sign";

/// How long the agent's cache lets a roots query block (10 minutes, in
/// nanoseconds).
pub const ROOTS_MAX_QUERY_NS: u64 = 600_000_000_000;

/// Seconds from 0001-01-01 to the Unix epoch (Go's binary time counts from
/// the former).
const GO_UNIX_OFFSET: i64 = 62_135_596_800;

/// Consul's answer when the servers ration signing (`csr_max_per_second`
/// or `csr_max_concurrent`), in its words.
pub const RATE_LIMITED: &str = "Rate limit reached, try again later";

/// `ConnectCA.Roots`: a `DCSpecificRequest` (query options flattened, the
/// agent's empty `Source`), blocking from `min_index` when it is not 0.
pub fn encode_roots(seq: u64, datacenter: &str, min_index: u64, token: &str, out: &mut Vec<u8>) {
    request_header(out, seq, ROOTS);
    let mut w = Writer(out);
    w.map(16);
    w.falses(&["AllowNotModifiedResponse", "AllowStale"]);
    w.kv_str("Datacenter", datacenter).kv_str("Filter", "");
    w.kv_uint("MaxAge", 0)
        .kv_uint("MaxQueryTime", ROOTS_MAX_QUERY_NS);
    w.kv_uint("MaxStaleDuration", 0)
        .kv_uint("MinQueryIndex", min_index);
    w.kv_bool("MustRevalidate", false)
        .kv_nil("NodeMetaFilters")
        .kv_str("PeerName", "")
        .kv_bool("RequireConsistent", false);
    w.str("Source").map(6);
    w.kv_str("Datacenter", "").kv_bool("DisableNode", false);
    w.empties(&["Ip", "Node", "NodePartition", "Segment"]);
    w.kv_uint("StaleIfError", 0).kv_str("Token", token);
    w.kv_bool("UseCache", false);
}

/// `ConnectCA.Sign` of `csr` (PEM): a `CASignRequest`.
pub fn encode_sign(seq: u64, csr: &str, datacenter: &str, token: &str, out: &mut Vec<u8>) {
    encode_sign_as(SIGN, seq, csr, datacenter, token, out);
}

/// A `CASignRequest` of `csr` to `method` (`ConnectCA.Sign`, or
/// `AutoEncrypt.Sign`, which takes the same).
pub fn encode_sign_as(
    method: &str,
    seq: u64,
    csr: &str,
    datacenter: &str,
    token: &str,
    out: &mut Vec<u8>,
) {
    request_header(out, seq, method);
    Writer(out)
        .map(3)
        .kv_str("CSR", csr)
        .kv_str("Datacenter", datacenter)
        .kv_str("Token", token);
}

/// One trusted root, as far as an agent looks at it.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Root {
    /// The root's ID (its key's hash, colon-separated hex).
    #[serde(rename = "ID", default)]
    pub id: String,
    /// Whether leaves are signed under it now.
    #[serde(rename = "Active", default)]
    pub active: bool,
    /// The key ID of what signs leaves under it (a leaf's authority key
    /// ID, colon-separated hex).
    #[serde(rename = "SigningKeyID", default)]
    pub signing_key_id: String,
}

/// `IndexedCARoots`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Roots {
    /// The active root's ID.
    #[serde(rename = "ActiveRootID", default)]
    pub active_root_id: String,
    /// The cluster's trust domain (`<cluster id>.consul`).
    #[serde(rename = "TrustDomain", default)]
    pub trust_domain: String,
    /// Every root, the active one and those rotated out.
    #[serde(rename = "Roots", default)]
    pub roots: Option<Vec<Root>>,
    /// The raft index to block from next.
    #[serde(rename = "Index", default)]
    pub index: u64,
}

impl Roots {
    /// The active root's signing key ID (what a leaf signed under it names
    /// as its authority).
    pub fn active_signing_key(&self) -> Option<&str> {
        self.roots
            .iter()
            .flatten()
            .find(|r| r.active)
            .map(|r| r.signing_key_id.as_str())
    }
}

/// Decodes `ConnectCA.Roots`' answer.
pub fn decode_roots(body: &[u8]) -> Result<Roots, MsgpackError> {
    agent_sim_proto::msgpack::decode_as("ConnectCA.Roots", body)
}

/// A Go binary time as Unix seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GoTime(pub i64);

impl<'de> Deserialize<'de> for GoTime {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = GoTime;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a Go binary time")
            }
            fn visit_bytes<E: serde::de::Error>(self, b: &[u8]) -> Result<GoTime, E> {
                go_time(b)
                    .map(GoTime)
                    .ok_or_else(|| E::custom("not a Go binary time"))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<GoTime, E> {
                self.visit_bytes(s.as_bytes())
            }
        }
        d.deserialize_any(V)
    }
}

/// Unix seconds of a Go `time.MarshalBinary` value (versions 1 and 2).
pub fn go_time(b: &[u8]) -> Option<i64> {
    if b.len() < 15 || !matches!(b[0], 1 | 2) {
        return None;
    }
    let secs = i64::from_be_bytes(b[1..9].try_into().ok()?);
    Some(secs - GO_UNIX_OFFSET)
}

/// `IssuedCert`, as far as an agent looks at it.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct IssuedCert<'a> {
    /// The leaf (and the intermediates under the root), PEM.
    #[serde(rename = "CertPEM", borrow, default)]
    pub cert_pem: Cow<'a, str>,
    /// The service it is for.
    #[serde(rename = "Service", borrow, default)]
    pub service: Cow<'a, str>,
    /// Its SPIFFE ID.
    #[serde(rename = "ServiceURI", borrow, default)]
    pub service_uri: Cow<'a, str>,
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

/// Decodes `ConnectCA.Sign`'s answer.
pub fn decode_sign(body: &[u8]) -> Result<IssuedCert<'_>, MsgpackError> {
    agent_sim_proto::msgpack::decode_as("ConnectCA.Sign", body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_binary_times_read_as_unix_seconds() {
        // 2026-11-26T01:19:10Z as Go writes it.
        let b = [1, 0, 0, 0, 14, 226, 153, 128, 14, 0, 0, 0, 0, 0xff, 0xff];
        assert_eq!(go_time(&b), Some(1_795_655_950));
        assert_eq!(go_time(&b[..10]), None);
    }
}
