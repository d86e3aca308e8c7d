//! The embedded server's Connect CA, enough for a client agent's leaf
//! certificates and a rotation: `ConnectCA.Roots` (blocking on the roots'
//! index), `ConnectCA.Sign` (the CSR parsed and checked, its SPIFFE ID a
//! service of this trust domain and datacenter, a leaf signed by the active
//! root, the token allowed to write the service), Consul's rationing of signing (`csr_max_per_second` as a token
//! bucket of burst 1 waited on at most 500 ms, else `csr_max_concurrent`
//! slots waited on as long) answered in the real server's words, and
//! `GET/PUT /v1/connect/ca/configuration` and `GET /v1/connect/ca/roots`.
//!
//! A `PUT` whose provider config changes the private key, its type or its
//! bits makes a new root, as the consul provider's ID hashes those: the
//! old root stays listed inactive, the roots' index moves and every
//! blocking roots query answers. Other changes (a TTL) keep the root.
//!
//! Agents' own certificates (`AutoEncrypt.Sign`, `super::auto_encrypt`)
//! are signed here too ([`Leaf::Agent`]): the CSR's `unknown` trust domain
//! replaced with the cluster's, a raft index taken for each.
//!
//! Keys and certificates are rcgen's (ECDSA P-256). Not here: intermediates
//! and cross-signing, mesh-gateway IDs; `ConnectCA.Sign` of an agent ID.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::StatusCode;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    PKCS_ECDSA_P256_SHA256, SanType, SerialNumber,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use agent_sim_proto::msgpack::Writer;

use super::acl::AclError;

/// `ConnectCA.Roots`.
pub(crate) const ROOTS: &str = "ConnectCA.Roots";
/// `ConnectCA.Sign`.
pub(crate) const SIGN: &str = "ConnectCA.Sign";
/// The real server's answer when signing is rationed (`structs.ErrRateLimited`).
pub const RATE_LIMITED: &str = "Rate limit reached, try again later";
/// Longest a Sign waits for a token or a slot (`csrLimitWait`).
const CSR_LIMIT_WAIT: Duration = Duration::from_millis(500);
/// Longest a blocking roots query is held.
const MAX_QUERY: Duration = Duration::from_secs(600);
/// Seconds from 0001-01-01 to the Unix epoch (Go's binary time).
const GO_UNIX_OFFSET: i64 = 62_135_596_800;

/// Why a CA call failed, each cause its own variant; the Display is what
/// the real server answers (an RPC error answer, an HTTP 500 body).
#[derive(Debug, thiserror::Error)]
pub(crate) enum CaError {
    /// The arguments are not the msgpack the method takes.
    #[error("rpc: decoding the request: {0}")]
    Decode(#[from] agent_sim_proto::msgpack::DecodeError),
    /// The call names another datacenter.
    #[error("No path to datacenter")]
    NoPathToDatacenter,
    /// The CSR does not parse.
    #[error("failed to parse CSR: {0}")]
    Csr(#[source] rcgen::Error),
    /// The CSR names no SPIFFE ID.
    #[error("CSR SAN does not contain a SPIFFE ID")]
    NoSpiffeId,
    /// The CSR's SPIFFE ID is not a service's.
    #[error("SPIFFE ID in CSR must be a service, agent, server, or mesh gateway ID")]
    NotAService,
    /// The CSR's SPIFFE ID is of another trust domain.
    #[error("SPIFFE ID in CSR from a different trust domain: {theirs}, we are {ours}")]
    OtherTrustDomain {
        /// The CSR's.
        theirs: String,
        /// This cluster's.
        ours: String,
    },
    /// The CSR's SPIFFE ID is of another datacenter.
    #[error("SPIFFE ID in CSR from a different datacenter: {theirs}, we are {ours}")]
    OtherDatacenter {
        /// The CSR's.
        theirs: String,
        /// This server's.
        ours: String,
    },
    /// `AutoEncrypt.Sign` from an agent of another datacenter.
    #[error(
        "mismatched datacenter (client_dc='{client}' server_dc='{server}'); check client has \
         same datacenter set as servers"
    )]
    MismatchedDatacenter {
        /// The request's.
        client: String,
        /// This server's.
        server: String,
    },
    /// A CSR with other than one URI in its SAN.
    #[error("CSR SAN contains an invalid number of URIs: {0}")]
    UriCount(usize),
    /// Signing is rationed and no token or slot came in time.
    #[error("{}", RATE_LIMITED)]
    RateLimited,
    /// No root is active (never the case once built).
    #[error("no active root")]
    NoActiveRoot,
    /// Signing the leaf failed.
    #[error("error signing: {0}")]
    Signing(#[source] rcgen::Error),
    /// Encoding the answer failed.
    #[error("encoding: {0}")]
    Encode(#[from] agent_sim_proto::msgpack::EncodeError),
    /// A configuration body that is not JSON.
    #[error("Request decode failed: {0}")]
    ConfigDecode(#[source] serde_json::Error),
    /// A provider other than `consul`.
    #[error("could not initialize provider: unknown CA provider {0:?}")]
    UnknownProvider(String),
    /// Making a new root failed.
    #[error(transparent)]
    NewRoot(rcgen::Error),
    /// A method the path under `/v1/connect/ca/` (named) does not take.
    #[error("method not allowed on /v1/connect/ca/{0}")]
    MethodNotAllowed(String),
    /// The Sign's token is unknown, or may not write the service.
    #[error(transparent)]
    Acl(#[from] AclError),
}

impl CaError {
    /// The HTTP status the error is answered with.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            CaError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// How the CA signs and rations.
#[derive(Clone, Debug, PartialEq)]
pub struct CaConfig {
    /// Leaf certificate lifetime (Consul's `leaf_cert_ttl`, 72 h).
    pub leaf_ttl: Duration,
    /// Signings per second (`csr_max_per_second`, 50; 0 = unlimited).
    pub csr_max_per_second: f64,
    /// Signings at once when there is no rate (`csr_max_concurrent`, 0 =
    /// unlimited).
    pub csr_max_concurrent: usize,
}

impl Default for CaConfig {
    fn default() -> Self {
        CaConfig {
            leaf_ttl: Duration::from_secs(72 * 3600),
            csr_max_per_second: 50.0,
            csr_max_concurrent: 0,
        }
    }
}

/// What the CA did since the server started.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CaSnapshot {
    /// Leaves signed.
    pub leaves_signed: u64,
    /// Signs answered with [`RATE_LIMITED`].
    pub sign_rate_limited: u64,
    /// Signs refused for their CSR.
    pub sign_refused: u64,
    /// Roots made (the first one included).
    pub roots_created: u64,
    /// Roots queries answered.
    pub roots_answers: u64,
    /// Agents' certificates signed (`AutoEncrypt.Sign`), each a raft write.
    pub agent_certs_signed: u64,
}

/// One root.
struct Root {
    id: String,
    signing_key_id: String,
    pem: String,
    name: String,
    issuer: Issuer<'static, KeyPair>,
    active: bool,
    key_bits: u32,
    create_index: u64,
    not_before: i64,
    not_after: i64,
}

/// The CA's mutable part.
struct Roots {
    roots: Vec<Root>,
    /// The provider config as last set (`Config` of the configuration).
    provider: serde_json::Map<String, Value>,
    index: u64,
    serial: u64,
}

/// The embedded Connect CA.
pub(crate) struct Ca {
    cfg: Mutex<CaConfig>,
    /// `<cluster id>.consul`.
    trust_domain: String,
    datacenter: String,
    roots: Mutex<Roots>,
    changed: watch::Sender<u64>,
    bucket: Mutex<Bucket>,
    slots: Semaphore,
    counters: [AtomicU64; 6],
    /// The TLS of `AutoEncrypt.Sign`'s connections, made at the first.
    pub(super) insecure_tls: std::sync::OnceLock<Option<std::sync::Arc<rustls::ServerConfig>>>,
}

/// What a leaf is signed for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Leaf<'a> {
    /// A service (`ConnectCA.Sign`).
    Service(&'a str),
    /// A client agent's node (`AutoEncrypt.Sign`).
    Agent(&'a str),
}

/// A token bucket of burst 1 (Go's `rate.Limiter` as the server sets it).
struct Bucket {
    tokens: f64,
    at: Instant,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn colon_hex(b: &[u8]) -> String {
    b.iter()
        .map(|x| format!("{x:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// A new root of `trust_domain` at raft index `index`.
fn new_root(trust_domain: &str, index: u64, serial: u64) -> Result<Root, rcgen::Error> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let mut p = CertificateParams::default();
    let short = &trust_domain[..8.min(trust_domain.len())];
    let name = format!("pri-{:08x}.consul.ca.{short}.consul", fastrand::u32(..));
    p.distinguished_name = DistinguishedName::new();
    p.distinguished_name.push(DnType::CommonName, name);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    p.subject_alt_names = vec![SanType::URI(format!("spiffe://{trust_domain}").try_into()?)];
    let now = unix_now();
    p.not_before = time_of(now - 60);
    p.not_after = time_of(now + 10 * 365 * 86_400);
    p.serial_number = Some(SerialNumber::from(serial));
    let kid = p.key_identifier(&key);
    let cert = p.self_signed(&key)?;
    let digest = sha2_hex(cert.der());
    Ok(Root {
        id: digest,
        signing_key_id: colon_hex(&kid),
        pem: cert.pem(),
        name: "Consul CA Primary Cert".into(),
        issuer: Issuer::new(p, key),
        active: true,
        key_bits: 256,
        create_index: index,
        not_before: now - 60,
        not_after: now + 10 * 365 * 86_400,
    })
}

/// A root's ID: a hash of its certificate as colon hex (20 bytes, as
/// Consul's root IDs are).
fn sha2_hex(der: &[u8]) -> String {
    use sha2::Digest as _;
    colon_hex(&sha2::Sha256::digest(der)[..20])
}

fn time_of(unix: i64) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(unix).unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

/// Go's `time.MarshalBinary` of Unix seconds `unix` in UTC (15 bytes).
fn go_time(unix: i64) -> [u8; 15] {
    let mut b = [0u8; 15];
    b[0] = 1;
    b[1..9].copy_from_slice(&(unix + GO_UNIX_OFFSET).to_be_bytes());
    b[13] = 0xff;
    b[14] = 0xff;
    b
}

#[derive(Deserialize)]
struct SignArgs {
    #[serde(rename = "CSR", default)]
    csr: String,
    #[serde(rename = "Datacenter", default)]
    datacenter: String,
    #[serde(rename = "Token", default)]
    token: String,
}

#[derive(Deserialize)]
struct RootsArgs {
    #[serde(rename = "MinQueryIndex", default)]
    min_query_index: u64,
    #[serde(rename = "MaxQueryTime", default)]
    max_query_time: u64,
}

impl Ca {
    /// A CA of trust domain `<cluster_id>.consul` with its first root.
    pub(crate) fn new(cfg: CaConfig, cluster_id: &str, datacenter: &str) -> Self {
        let trust_domain = format!("{cluster_id}.consul");
        let root = new_root(&trust_domain, 1, 1).expect("a P-256 root is always made");
        let mut provider = serde_json::Map::new();
        provider.insert("LeafCertTTL".into(), json!(go_duration(cfg.leaf_ttl)));
        provider.insert("IntermediateCertTTL".into(), json!("8760h"));
        provider.insert("RootCertTTL".into(), json!("87600h"));
        let slots = if cfg.csr_max_concurrent > 0 {
            cfg.csr_max_concurrent
        } else {
            Semaphore::MAX_PERMITS
        };
        let ca = Ca {
            cfg: Mutex::new(cfg),
            trust_domain,
            datacenter: datacenter.to_owned(),
            roots: Mutex::new(Roots {
                roots: vec![root],
                provider,
                index: 1,
                serial: 2,
            }),
            changed: watch::channel(1).0,
            bucket: Mutex::new(Bucket {
                tokens: 1.0,
                at: Instant::now(),
            }),
            slots: Semaphore::new(slots),
            counters: Default::default(),
            insecure_tls: std::sync::OnceLock::new(),
        };
        ca.bump(3);
        ca
    }

    fn bump(&self, i: usize) {
        self.counters[i].fetch_add(1, Ordering::Relaxed);
    }

    /// What the CA did so far.
    pub(crate) fn snapshot(&self) -> CaSnapshot {
        let g = |i: usize| self.counters[i].load(Ordering::Relaxed);
        CaSnapshot {
            leaves_signed: g(0),
            sign_rate_limited: g(1),
            sign_refused: g(2),
            roots_created: g(3),
            roots_answers: g(4),
            agent_certs_signed: g(5),
        }
    }

    /// Takes a signing token within [`CSR_LIMIT_WAIT`] (rate), or a slot
    /// (concurrency); `None`: the server's rate-limit answer.
    async fn admit(&self) -> Option<Option<tokio::sync::SemaphorePermit<'_>>> {
        let (rate, concurrent) = {
            let c = lock(&self.cfg);
            (c.csr_max_per_second, c.csr_max_concurrent)
        };
        if rate > 0.0 {
            let wait = {
                let mut b = lock(&self.bucket);
                let now = Instant::now();
                b.tokens = (b.tokens + (now - b.at).as_secs_f64() * rate).min(1.0);
                b.at = now;
                let wait = Duration::from_secs_f64(((1.0 - b.tokens) / rate).max(0.0));
                if wait > CSR_LIMIT_WAIT {
                    return None;
                }
                b.tokens -= 1.0;
                wait
            };
            tokio::time::sleep(wait).await;
            Some(None)
        } else if concurrent > 0 {
            match tokio::time::timeout(CSR_LIMIT_WAIT, self.slots.acquire()).await {
                Ok(Ok(p)) => Some(Some(p)),
                _ => None,
            }
        } else {
            Some(None)
        }
    }

    /// `ConnectCA.Sign`: an `IssuedCert`, or the error words;
    /// `authorize(token, service)` checks the call's token may write the
    /// service the CSR names (Consul's `service:write`).
    pub(crate) async fn sign(
        &self,
        args: &[u8],
        authorize: impl FnOnce(&str, &str) -> Result<(), AclError>,
    ) -> Result<Bytes, CaError> {
        let a: SignArgs = agent_sim_proto::msgpack::decode(args)?;
        if !a.datacenter.is_empty() && a.datacenter != self.datacenter {
            return Err(CaError::NoPathToDatacenter);
        }
        let csr = match CertificateSigningRequestParams::from_pem(&a.csr) {
            Ok(c) => c,
            Err(e) => {
                self.bump(2);
                return Err(CaError::Csr(e));
            }
        };
        let service = match self.service_of(&csr.params) {
            Ok(s) => s,
            Err(e) => {
                self.bump(2);
                return Err(e);
            }
        };
        authorize(&a.token, &service)?;
        self.sign_leaf(csr, Leaf::Service(&service), || None).await
    }

    /// `csr` (its CSR checked and authorized) signed for `leaf` once the
    /// rate admits it: an `IssuedCert` of the raft index `index` gives
    /// then (`None`: the roots').
    pub(super) async fn sign_leaf(
        &self,
        csr: CertificateSigningRequestParams,
        leaf: Leaf<'_>,
        index: impl FnOnce() -> Option<u64>,
    ) -> Result<Bytes, CaError> {
        let Some(_slot) = self.admit().await else {
            self.bump(1);
            return Err(CaError::RateLimited);
        };
        let ttl = lock(&self.cfg).leaf_ttl;
        let body = self.issue(csr, leaf, ttl, index())?;
        self.bump(if matches!(leaf, Leaf::Agent(_)) { 5 } else { 0 });
        Ok(body)
    }

    /// A CSR as the server parses it (a refusal counted).
    pub(super) fn parse_csr(&self, pem: &str) -> Result<CertificateSigningRequestParams, CaError> {
        CertificateSigningRequestParams::from_pem(pem).map_err(|e| {
            self.bump(2);
            CaError::Csr(e)
        })
    }

    /// The node a CSR's one SPIFFE ID names as a client agent's
    /// (`/agent/client/dc/<dc>/id/<node>`, any trust domain: the server
    /// puts its own in); a refusal counted.
    pub(super) fn agent_of(&self, p: &CertificateParams) -> Result<String, CaError> {
        let uris: Vec<&str> = p
            .subject_alt_names
            .iter()
            .filter_map(|s| match s {
                SanType::URI(u) => Some(u.as_str()),
                _ => None,
            })
            .collect();
        let refused = |e| {
            self.bump(2);
            Err(e)
        };
        let [uri] = uris[..] else {
            return refused(CaError::UriCount(uris.len()));
        };
        let path = uri
            .strip_prefix("spiffe://")
            .and_then(|rest| rest.split_once('/'))
            .map_or("", |(_, path)| path);
        match path.split('/').collect::<Vec<_>>()[..] {
            ["agent", "client", "dc", _, "id", node] if !node.is_empty() => Ok(node.to_owned()),
            _ => refused(CaError::NotAService),
        }
    }

    /// The service a CSR's SPIFFE ID names, checked against this cluster.
    fn service_of(&self, p: &CertificateParams) -> Result<String, CaError> {
        let uri = p
            .subject_alt_names
            .iter()
            .find_map(|s| match s {
                SanType::URI(u) => Some(u.as_str().to_owned()),
                _ => None,
            })
            .ok_or(CaError::NoSpiffeId)?;
        let rest = uri.strip_prefix("spiffe://").ok_or(CaError::NoSpiffeId)?;
        let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
        let parts: Vec<&str> = path.split('/').collect();
        let ["ns", _, "dc", dc, "svc", service] = parts[..] else {
            return Err(CaError::NotAService);
        };
        if host != self.trust_domain {
            return Err(CaError::OtherTrustDomain {
                theirs: host.to_owned(),
                ours: self.trust_domain.clone(),
            });
        }
        if dc != self.datacenter {
            return Err(CaError::OtherDatacenter {
                theirs: dc.to_owned(),
                ours: self.datacenter.clone(),
            });
        }
        Ok(service.to_owned())
    }

    /// A leaf for `csr` signed by the active root, as an `IssuedCert` of
    /// raft index `index` (`None`: the roots').
    fn issue(
        &self,
        mut csr: CertificateSigningRequestParams,
        leaf: Leaf<'_>,
        ttl: Duration,
        index: Option<u64>,
    ) -> Result<Bytes, CaError> {
        let now = unix_now();
        let (after, before) = (now - 60, now + ttl.as_secs() as i64);
        let (td, dc) = (&self.trust_domain, &self.datacenter);
        let uri = match leaf {
            Leaf::Service(s) => format!("spiffe://{td}/ns/default/dc/{dc}/svc/{s}"),
            Leaf::Agent(node) => format!("spiffe://{td}/agent/client/dc/{dc}/id/{node}"),
        };
        if let Leaf::Agent(_) = leaf {
            // The agent's CSR names no trust domain yet: the cluster's.
            let uri = SanType::URI(uri.clone().try_into().map_err(CaError::Signing)?);
            for san in &mut csr.params.subject_alt_names {
                if let SanType::URI(_) = san {
                    *san = uri.clone();
                }
            }
        }
        let mut roots = lock(&self.roots);
        roots.serial += 1;
        let serial = roots.serial;
        let index = index.unwrap_or(roots.index);
        let root = roots
            .roots
            .iter()
            .find(|r| r.active)
            .ok_or(CaError::NoActiveRoot)?;
        let p = &mut csr.params;
        p.distinguished_name = DistinguishedName::new();
        p.not_before = time_of(after);
        p.not_after = time_of(before);
        p.serial_number = Some(SerialNumber::from(serial));
        p.is_ca = IsCa::ExplicitNoCa;
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
            KeyUsagePurpose::KeyAgreement,
        ];
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ClientAuth,
            ExtendedKeyUsagePurpose::ServerAuth,
        ];
        p.use_authority_key_identifier_extension = true;
        let cert = csr.signed_by(&root.issuer).map_err(CaError::Signing)?;
        let (service, agent) = match leaf {
            Leaf::Service(s) => ((s, uri.as_str()), ("", "")),
            Leaf::Agent(node) => (("", ""), (node, uri.as_str())),
        };
        let mut out = Vec::with_capacity(1200);
        let mut w = Writer(&mut out);
        w.map(14)
            .kv_str("Agent", agent.0)
            .kv_str("AgentURI", agent.1);
        w.kv_str("CertPEM", &cert.pem());
        w.kv_uint("CreateIndex", index).kv_str("Kind", "");
        w.kv_str("KindURI", "").kv_uint("ModifyIndex", index);
        w.kv_str("PrivateKeyPEM", "");
        w.kv_str("SerialNumber", &format!("{serial:02x}"));
        w.kv_str("ServerURI", "").kv_str("Service", service.0);
        w.kv_str("ServiceURI", service.1);
        w.str("ValidAfter").raw(&go_time(after));
        w.str("ValidBefore").raw(&go_time(before));
        Ok(Bytes::from(out))
    }

    /// The roots as `IndexedCARoots` in msgpack (`AutoEncrypt.Sign`'s
    /// answer holds them).
    pub(super) fn roots_msgpack(&self) -> Result<Vec<u8>, CaError> {
        Ok(agent_sim_proto::msgpack::encode_named(
            &self.roots_json().1,
        )?)
    }

    /// This server's datacenter.
    pub(super) fn datacenter(&self) -> &str {
        &self.datacenter
    }

    /// The roots as `IndexedCARoots` (JSON, for both wires).
    fn roots_json(&self) -> (u64, Value) {
        let r = lock(&self.roots);
        let active = r.roots.iter().find(|x| x.active).map(|x| x.id.clone());
        let list: Vec<Value> = r
            .roots
            .iter()
            .map(|x| {
                json!({
                    "ID": x.id,
                    "Name": x.name,
                    "SerialNumber": x.create_index,
                    "SigningKeyID": x.signing_key_id,
                    "ExternalTrustDomain": self.trust_domain.trim_end_matches(".consul"),
                    "NotBefore": x.not_before,
                    "NotAfter": x.not_after,
                    "RootCert": x.pem,
                    "IntermediateCerts": null,
                    "Active": x.active,
                    "PrivateKeyType": "ec",
                    "PrivateKeyBits": x.key_bits,
                    "CreateIndex": x.create_index,
                    "ModifyIndex": r.index,
                })
            })
            .collect();
        (
            r.index,
            json!({
                "ActiveRootID": active.unwrap_or_default(),
                "TrustDomain": self.trust_domain,
                "Roots": list,
                "Index": r.index,
                "KnownLeader": true,
                "LastContact": 0,
                "ConsistencyLevel": "",
                "NotModified": false,
                "Backend": 0,
                "ResultsFilteredByACLs": false,
            }),
        )
    }

    /// `ConnectCA.Roots`, held until the roots' index passes the query's
    /// `MinQueryIndex` (or its wait, at most 10 minutes, ends).
    pub(crate) async fn roots(
        &self,
        args: &[u8],
        shutdown: &CancellationToken,
    ) -> Result<Bytes, CaError> {
        let a: RootsArgs = agent_sim_proto::msgpack::decode(args)?;
        self.wait_past(a.min_query_index, a.max_query_time, Some(shutdown))
            .await;
        self.bump(4);
        let (_, v) = self.roots_json();
        Ok(Bytes::from(agent_sim_proto::msgpack::encode_named(&v)?))
    }

    /// A blocking `GET /v1/connect/ca/roots?index=` (its query string):
    /// held until the roots' index passes it.
    pub(crate) async fn wait_http(&self, query: &str) {
        let min = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("index="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        self.wait_past(min, 0, None).await;
    }

    /// Waits until the roots' index is past `min` (0: no wait).
    async fn wait_past(&self, min: u64, wait_ns: u64, shutdown: Option<&CancellationToken>) {
        if min == 0 {
            return;
        }
        let wait = if wait_ns == 0 {
            Duration::from_secs(300)
        } else {
            Duration::from_nanos(wait_ns).min(MAX_QUERY)
        };
        let mut rx = self.changed.subscribe();
        let passed = rx.wait_for(|i| *i > min);
        let never = CancellationToken::new();
        let cancelled = shutdown.unwrap_or(&never).cancelled();
        tokio::select! {
            _ = passed => {}
            _ = tokio::time::sleep(wait) => {}
            _ = cancelled => {}
        }
    }

    /// `PUT /v1/connect/ca/configuration`: the new provider config; a new
    /// root when the key, its type or bits changed.
    fn set_configuration(&self, body: &[u8]) -> Result<(), CaError> {
        let v: Value = serde_json::from_slice(body).map_err(CaError::ConfigDecode)?;
        let provider = v
            .get("Provider")
            .and_then(Value::as_str)
            .unwrap_or("consul");
        if provider != "consul" {
            return Err(CaError::UnknownProvider(provider.to_owned()));
        }
        let new = v
            .get("Config")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        if let Some(ttl) = new.get("LeafCertTTL").and_then(Value::as_str)
            && let Ok(d) = humantime::parse_duration(ttl)
        {
            lock(&self.cfg).leaf_ttl = d;
        }
        for (key, setter) in [("CSRMaxPerSecond", 0), ("CSRMaxConcurrent", 1)] {
            if let Some(n) = new.get(key).and_then(Value::as_f64) {
                let mut c = lock(&self.cfg);
                if setter == 0 {
                    c.csr_max_per_second = n;
                } else {
                    c.csr_max_concurrent = n as usize;
                }
            }
        }
        let mut r = lock(&self.roots);
        let identity = |m: &serde_json::Map<String, Value>| {
            ["PrivateKey", "RootCert", "PrivateKeyType", "PrivateKeyBits"]
                .map(|k| m.get(k).cloned())
        };
        let rotate = identity(&r.provider) != identity(&new);
        r.provider = new;
        if rotate {
            let index = r.index + 1;
            let serial = r.serial + 1;
            let root = new_root(&self.trust_domain, index, serial).map_err(CaError::NewRoot)?;
            for old in &mut r.roots {
                old.active = false;
            }
            r.roots.push(root);
            r.index = index;
            r.serial = serial;
            drop(r);
            self.bump(3);
            self.changed.send_replace(index);
        }
        Ok(())
    }

    /// `GET /v1/connect/ca/configuration`.
    fn configuration(&self) -> Value {
        let r = lock(&self.roots);
        json!({
            "Provider": "consul",
            "Config": r.provider,
            "State": null,
            "ForceWithoutCrossSigning": false,
            "CreateIndex": 1,
            "ModifyIndex": r.index,
        })
    }

    /// The HTTP API under `/v1/connect/ca/` (`tail`: after it): a JSON
    /// body, or why not (its status: [`CaError::status`]).
    pub(crate) fn http(&self, put: bool, tail: &str, body: &[u8]) -> Result<Value, CaError> {
        match (tail, put) {
            ("roots", false) => Ok(self.roots_json().1),
            ("configuration", false) => Ok(self.configuration()),
            ("configuration", true) => self.set_configuration(body).map(|()| Value::Bool(true)),
            _ => Err(CaError::MethodNotAllowed(tail.to_owned())),
        }
    }
}

/// A duration as Go prints whole hours (`72h`).
fn go_duration(d: Duration) -> String {
    let s = d.as_secs();
    if s.is_multiple_of(3600) {
        format!("{}h", s / 3600)
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_sim_proto::msgpack::Writer;

    /// No ACLs: every Sign may write its service.
    fn allow(_: &str, _: &str) -> Result<(), AclError> {
        Ok(())
    }

    fn sign_args(csr: &str) -> Vec<u8> {
        let mut out = Vec::new();
        Writer(&mut out)
            .map(3)
            .kv_str("CSR", csr)
            .kv_str("Datacenter", "dc1")
            .kv_str("Token", "");
        out
    }

    fn csr_for(uri: &str) -> String {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let mut p = CertificateParams::default();
        p.distinguished_name = DistinguishedName::new();
        p.subject_alt_names = vec![SanType::URI(uri.to_owned().try_into().unwrap())];
        p.serialize_request(&key).unwrap().pem().unwrap()
    }

    #[tokio::test]
    async fn signs_a_service_leaf_under_the_active_root_and_rotates() {
        let ca = Ca::new(CaConfig::default(), "abcd1234-0000", "dc1");
        let uri = "spiffe://abcd1234-0000.consul/ns/default/dc/dc1/svc/web";
        let body = ca.sign(&sign_args(&csr_for(uri)), allow).await.unwrap();
        assert!(body.len() > 500);
        assert_eq!(ca.snapshot().leaves_signed, 1);
        // Another trust domain or datacenter: refused in Consul's words.
        let other = "spiffe://other.consul/ns/default/dc/dc1/svc/web";
        let e = ca
            .sign(&sign_args(&csr_for(other)), allow)
            .await
            .unwrap_err();
        assert!(matches!(e, CaError::OtherTrustDomain { .. }), "{e}");
        assert!(
            e.to_string()
                .starts_with("SPIFFE ID in CSR from a different trust domain"),
            "{e}"
        );
        // A TTL change keeps the root; a new key type makes one.
        let (i0, _) = ca.roots_json();
        ca.set_configuration(br#"{"Provider":"consul","Config":{"LeafCertTTL":"1h"}}"#)
            .unwrap();
        assert_eq!(ca.roots_json().0, i0);
        ca.set_configuration(
            br#"{"Provider":"consul","Config":{"LeafCertTTL":"1h","PrivateKeyBits":384}}"#,
        )
        .unwrap();
        let (i1, roots) = ca.roots_json();
        assert!(i1 > i0);
        assert_eq!(roots["Roots"].as_array().unwrap().len(), 2);
        assert_eq!(ca.snapshot().roots_created, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn signing_past_the_rate_is_refused_in_the_servers_words() {
        let cfg = CaConfig {
            csr_max_per_second: 2.0,
            ..CaConfig::default()
        };
        let ca = Ca::new(cfg, "abcd1234-0000", "dc1");
        let csr = csr_for("spiffe://abcd1234-0000.consul/ns/default/dc/dc1/svc/web");
        // A burst of one, then a token every 500 ms (waited for), then
        // one that would wait 1 s: refused at once.
        let args = sign_args(&csr);
        let (a, b, c) = tokio::join!(
            ca.sign(&args, allow),
            ca.sign(&args, allow),
            ca.sign(&args, allow)
        );
        assert!(a.is_ok() && b.is_ok());
        let c = c.unwrap_err();
        assert!(matches!(c, CaError::RateLimited));
        assert_eq!(c.to_string(), RATE_LIMITED);
        assert_eq!(ca.snapshot().sign_rate_limited, 1);
    }
}
