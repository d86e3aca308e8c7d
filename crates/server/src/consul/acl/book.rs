//! The tokens and policies of the embedded server: what `PUT
//! /v1/acl/token` and `PUT /v1/acl/policy` create, checked as Consul
//! 1.20's token writer and policy endpoint check them (in their words),
//! and the JSON views the HTTP API answers with (field order and
//! omissions as Go's structs print them).
//!
//! Bounded ([`MAX_TOKENS`], [`MAX_POLICIES`]); a token is found by its
//! secret in O(1). What a token may do is compiled when it is written (and
//! again when a policy it links goes), so resolving it on a request is a
//! map lookup and an `Arc` clone.
//!
//! Not here: roles, auth methods, expiry, token and policy updates,
//! enterprise namespaces.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::error::BookError;
use super::rules::{self, Parsed, Rules};
use crate::consul::fields::nullable;

/// Most tokens held (management and anonymous included).
pub(crate) const MAX_TOKENS: usize = 1_000_000;
/// Most policies held (the built-in ones included).
pub(crate) const MAX_POLICIES: usize = 100_000;

/// The anonymous token's accessor, as every Consul cluster has it.
pub(crate) const ANONYMOUS_ACCESSOR: &str = "00000000-0000-0000-0000-000000000002";
/// The anonymous token's secret.
pub(crate) const ANONYMOUS_SECRET: &str = "anonymous";
/// The built-in `global-management` policy's ID.
pub(crate) const GLOBAL_MANAGEMENT_ID: &str = "00000000-0000-0000-0000-000000000001";
/// The built-in `builtin/global-read-only` policy's ID.
const GLOBAL_READ_ONLY_ID: &str = "00000000-0000-0000-0000-000000000002";
/// IDs with this prefix are Consul's own.
const RESERVED_PREFIX: &str = "00000000-0000-0000-0000-0000000000";

/// A node identity (`NodeIdentities`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct NodeIdentity {
    #[serde(rename = "NodeName", deserialize_with = "nullable")]
    pub(crate) node_name: String,
    #[serde(rename = "Datacenter", deserialize_with = "nullable")]
    pub(crate) datacenter: String,
}

/// A service identity (`ServiceIdentities`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct ServiceIdentity {
    #[serde(rename = "ServiceName", deserialize_with = "nullable")]
    pub(crate) service_name: String,
    #[serde(
        rename = "Datacenters",
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub(crate) datacenters: Vec<String>,
}

/// A link to a policy or role, as a request names it.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct LinkBody {
    #[serde(rename = "ID", deserialize_with = "nullable")]
    id: String,
    #[serde(rename = "Name", deserialize_with = "nullable")]
    name: String,
}

/// The body of `PUT /v1/acl/token` (the fields this server reads).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct TokenBody {
    #[serde(rename = "AccessorID", deserialize_with = "nullable")]
    accessor: String,
    #[serde(rename = "SecretID", deserialize_with = "nullable")]
    secret: String,
    #[serde(rename = "Description", deserialize_with = "nullable")]
    description: String,
    #[serde(rename = "Policies", deserialize_with = "nullable")]
    policies: Vec<LinkBody>,
    #[serde(rename = "Roles", deserialize_with = "nullable")]
    roles: Vec<LinkBody>,
    #[serde(rename = "ServiceIdentities", deserialize_with = "nullable")]
    service_identities: Vec<ServiceIdentity>,
    #[serde(rename = "NodeIdentities", deserialize_with = "nullable")]
    node_identities: Vec<NodeIdentity>,
    #[serde(rename = "Local", deserialize_with = "nullable")]
    local: bool,
}

/// The body of `PUT /v1/acl/policy`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct PolicyBody {
    #[serde(rename = "ID", deserialize_with = "nullable")]
    id: String,
    #[serde(rename = "Name", deserialize_with = "nullable")]
    name: String,
    #[serde(rename = "Description", deserialize_with = "nullable")]
    description: String,
    #[serde(rename = "Rules", deserialize_with = "nullable")]
    rules: String,
    #[serde(rename = "Datacenters", deserialize_with = "nullable")]
    datacenters: Vec<String>,
}

/// What a token may do.
#[derive(Clone, Debug)]
pub(crate) enum Grants {
    /// Everything (it links `global-management`).
    All,
    /// Its rules, merged.
    Rules(Arc<Rules>),
}

/// A stored token.
#[derive(Debug)]
pub(crate) struct Token {
    pub(crate) accessor: Arc<str>,
    pub(crate) secret: String,
    pub(crate) description: String,
    /// Linked policies' IDs.
    pub(crate) policies: Vec<String>,
    pub(crate) service_identities: Vec<ServiceIdentity>,
    pub(crate) node_identities: Vec<NodeIdentity>,
    pub(crate) local: bool,
    pub(crate) create_time: String,
    pub(crate) hash: String,
    pub(crate) create_index: u64,
    pub(crate) modify_index: u64,
    pub(crate) grants: Grants,
}

/// A stored policy.
#[derive(Debug)]
pub(crate) struct Policy {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) description: String,
    pub(crate) rules: String,
    pub(crate) datacenters: Vec<String>,
    pub(crate) hash: String,
    pub(crate) create_index: u64,
    pub(crate) modify_index: u64,
    pub(crate) parsed: Parsed,
}

/// Consul's `^[a-z0-9]([a-z0-9\-_]*[a-z0-9])?$`, at most 256 long.
fn identity_name_ok(name: &str) -> bool {
    let b = name.as_bytes();
    let edge = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && b.len() <= 256
        && b.first().is_some_and(edge)
        && b.last().is_some_and(edge)
        && b.iter().all(|c| edge(c) || *c == b'-' || *c == b'_')
}

/// Consul's policy name rules.
fn check_policy_name(name: &str) -> Result<(), BookError> {
    if name.is_empty() || name.len() > 128 {
        return Err(BookError::PolicyNameLength);
    }
    if name.starts_with('/') || name.starts_with("builtin/") {
        return Err(BookError::PolicyNameReserved);
    }
    let word = |s: &str| {
        s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
    };
    let ok = match name.split_once('/') {
        None => word(name),
        Some((head, tail)) => !head.is_empty() && word(head) && word(tail),
    };
    if ok {
        Ok(())
    } else {
        Err(BookError::PolicyNameChars)
    }
}

/// A UUID as Go's `ParseUUID` takes it: 36 characters, hyphenated.
fn is_uuid(s: &str) -> bool {
    s.len() == 36 && uuid::Uuid::try_parse(s).is_ok()
}

/// Now, as Go prints a `time.Time` in JSON (RFC 3339, nanoseconds without
/// trailing zeros, UTC).
pub(crate) fn now_go() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128);
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let frac = format!("{:09}", t.nanosecond());
    let frac = frac.trim_end_matches('0');
    let dot = if frac.is_empty() { "" } else { "." };
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}{dot}{frac}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

fn hash_of(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
    }
    STANDARD.encode(h.finalize())
}

/// The rules text of Consul's built-in global policies (`write` or `read`).
fn global_rules(level: &str) -> String {
    super::GLOBAL_MANAGEMENT_RULES.replace("write", level)
}

/// Every token and policy.
#[derive(Default)]
pub(crate) struct Book {
    /// By secret: what a request's token is looked up by.
    by_secret: HashMap<String, Arc<Token>>,
    /// By accessor, in order (the listing's).
    by_accessor: BTreeMap<Arc<str>, Arc<Token>>,
    policies: BTreeMap<String, Arc<Policy>>,
    policy_names: HashMap<String, String>,
}

impl Book {
    /// A book with Consul's built-in policies, the anonymous token and
    /// `management` tokens (written at `index`).
    pub(crate) fn new(management: &[String], index: u64) -> Self {
        let mut b = Book::default();
        for (id, name, desc, level) in [
            (
                GLOBAL_MANAGEMENT_ID,
                "global-management",
                "A built-in policy that grants read and write access to all Consul features",
                "write",
            ),
            (
                GLOBAL_READ_ONLY_ID,
                "builtin/global-read-only",
                "A built-in policy that grants read-only access to all Consul features",
                "read",
            ),
        ] {
            let rules = global_rules(level);
            let parsed = rules::parse(&rules).unwrap_or_default();
            b.insert_policy(Policy {
                id: id.into(),
                name: name.into(),
                description: desc.into(),
                hash: hash_of(&[name, desc, &rules]),
                rules,
                datacenters: Vec::new(),
                create_index: index,
                modify_index: index,
                parsed,
            });
        }
        b.insert_builtin_token(
            ANONYMOUS_ACCESSOR,
            ANONYMOUS_SECRET,
            "Anonymous Token",
            index,
        );
        for secret in management {
            let accessor = uuid::Uuid::new_v4().to_string();
            b.insert_builtin_token(&accessor, secret, "Initial Management Token", index);
        }
        b
    }

    /// The anonymous token (no policy), or a management token (linking
    /// `global-management`), as the server has them from its start.
    fn insert_builtin_token(
        &mut self,
        accessor: &str,
        secret: &str,
        description: &str,
        index: u64,
    ) {
        let manage = accessor != ANONYMOUS_ACCESSOR;
        let policies = if manage {
            vec![GLOBAL_MANAGEMENT_ID.to_owned()]
        } else {
            Vec::new()
        };
        let hash = hash_of(&[description, "global", &policies.concat()]);
        self.insert_token(Token {
            accessor: Arc::from(accessor),
            secret: secret.to_owned(),
            description: description.to_owned(),
            grants: if manage {
                Grants::All
            } else {
                Grants::Rules(Arc::default())
            },
            policies,
            service_identities: Vec::new(),
            node_identities: Vec::new(),
            local: false,
            create_time: now_go(),
            hash,
            create_index: index,
            modify_index: index,
        });
    }

    fn insert_token(&mut self, t: Token) {
        let t = Arc::new(t);
        self.by_secret.insert(t.secret.clone(), t.clone());
        self.by_accessor.insert(t.accessor.clone(), t);
    }

    fn insert_policy(&mut self, p: Policy) {
        self.policy_names.insert(p.name.clone(), p.id.clone());
        self.policies.insert(p.id.clone(), Arc::new(p));
    }

    /// The token of a secret.
    pub(crate) fn by_secret(&self, secret: &str) -> Option<&Arc<Token>> {
        self.by_secret.get(secret)
    }

    /// The token of an accessor.
    pub(crate) fn token(&self, accessor: &str) -> Result<&Arc<Token>, BookError> {
        if accessor.is_empty() {
            return Err(BookError::NoAccessor);
        }
        self.by_accessor.get(accessor).ok_or(BookError::NoToken)
    }

    /// Every token, by accessor.
    pub(crate) fn tokens(&self) -> impl Iterator<Item = &Arc<Token>> {
        self.by_accessor.values()
    }

    /// A policy by ID.
    pub(crate) fn policy(&self, id: &str) -> Result<&Arc<Policy>, BookError> {
        if id.is_empty() {
            return Err(BookError::NoPolicyId);
        }
        self.policies.get(id).ok_or(BookError::NoPolicy)
    }

    /// A policy by name.
    pub(crate) fn policy_named(&self, name: &str) -> Result<&Arc<Policy>, BookError> {
        let id = self.policy_names.get(name).ok_or(BookError::NoPolicy)?;
        self.policy(id)
    }

    /// Every policy, by ID.
    pub(crate) fn policies(&self) -> impl Iterator<Item = &Arc<Policy>> {
        self.policies.values()
    }

    /// Counts: tokens, policies.
    pub(crate) fn sizes(&self) -> (usize, usize) {
        (self.by_accessor.len(), self.policies.len())
    }

    /// What linking `policies` and holding the identities grants in `dc`
    /// (identities and policies of other datacenters ignored, as Consul
    /// ignores them).
    fn grants(
        &self,
        policies: &[String],
        nodes: &[NodeIdentity],
        services: &[ServiceIdentity],
        dc: &str,
    ) -> Grants {
        if policies.iter().any(|p| p == GLOBAL_MANAGEMENT_ID) {
            return Grants::All;
        }
        let mut r = Rules::default();
        for n in nodes.iter().filter(|n| n.datacenter == dc) {
            r.add(&rules::node_identity(&n.node_name));
        }
        let in_dc = |dcs: &[String]| dcs.is_empty() || dcs.iter().any(|d| d == dc);
        for s in services.iter().filter(|s| in_dc(&s.datacenters)) {
            r.add(&rules::service_identity(&s.service_name));
        }
        for p in policies.iter().filter_map(|id| self.policies.get(id)) {
            if in_dc(&p.datacenters) {
                r.add_parsed(&p.parsed);
            }
        }
        Grants::Rules(Arc::new(r))
    }

    /// Checks a new token's IDs: Consul's UUIDs, not reserved, not in use.
    fn check_new_id(&self, id: &str, field: &'static str) -> Result<(), BookError> {
        if id.starts_with(RESERVED_PREFIX) {
            let reason =
                "UUIDs with the prefix \"00000000-0000-0000-0000-0000000000\" are reserved";
            return Err(BookError::BadTokenId { field, reason });
        }
        if !is_uuid(id) {
            let reason = "not a valid UUID";
            return Err(BookError::BadTokenId { field, reason });
        }
        if self.by_accessor.contains_key(id) || self.by_secret.contains_key(id) {
            return Err(BookError::TokenIdInUse(field));
        }
        Ok(())
    }

    /// The linked policies' IDs, each once, checked as Consul's token
    /// writer checks them.
    fn policy_links(&self, links: &[LinkBody]) -> Result<Vec<String>, BookError> {
        let mut ids: Vec<String> = Vec::with_capacity(links.len());
        for l in links {
            let id = if l.id.is_empty() {
                self.policy_names
                    .get(&l.name)
                    .cloned()
                    .ok_or_else(|| BookError::NoPolicyNamed(l.name.clone()))?
            } else if self.policies.contains_key(&l.id) {
                l.id.clone()
            } else {
                return Err(BookError::NoPolicyWithId(l.id.clone()));
            };
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        Ok(ids)
    }

    /// `PUT /v1/acl/token`: the token created at raft `index`.
    pub(crate) fn create_token(
        &mut self,
        b: TokenBody,
        index: u64,
        dc: &str,
    ) -> Result<Arc<Token>, BookError> {
        if self.by_accessor.len() >= MAX_TOKENS {
            let (what, max) = ("tokens", MAX_TOKENS);
            return Err(BookError::Full { what, max });
        }
        let accessor = if b.accessor.is_empty() {
            uuid::Uuid::new_v4().to_string()
        } else {
            self.check_new_id(&b.accessor, "AccessorID")?;
            b.accessor
        };
        let secret = if b.secret.is_empty() {
            uuid::Uuid::new_v4().to_string()
        } else {
            self.check_new_id(&b.secret, "SecretID")?;
            b.secret
        };
        if let Some(r) = b.roles.first() {
            return Err(if r.id.is_empty() {
                BookError::NoRoleNamed(r.name.clone())
            } else {
                BookError::NoRoleWithId(r.id.clone())
            });
        }
        let policies = self.policy_links(&b.policies)?;
        let services = checked_services(b.service_identities, b.local)?;
        let nodes = checked_nodes(b.node_identities)?;
        let mut parts: Vec<&str> = vec![&b.description, if b.local { "local" } else { "global" }];
        parts.extend(policies.iter().map(String::as_str));
        for s in &services {
            parts.push(&s.service_name);
            parts.extend(s.datacenters.iter().map(String::as_str));
        }
        for n in &nodes {
            parts.extend([n.node_name.as_str(), n.datacenter.as_str()]);
        }
        let hash = hash_of(&parts);
        let token = Token {
            accessor: Arc::from(accessor.as_str()),
            secret,
            description: b.description,
            grants: self.grants(&policies, &nodes, &services, dc),
            policies,
            service_identities: services,
            node_identities: nodes,
            local: b.local,
            create_time: now_go(),
            hash,
            create_index: index,
            modify_index: index,
        };
        self.insert_token(token);
        Ok(self.by_accessor[accessor.as_str()].clone())
    }

    /// `DELETE /v1/acl/token/<accessor>` by a request whose token's secret
    /// is `requester`.
    pub(crate) fn delete_token(
        &mut self,
        accessor: &str,
        requester: &str,
    ) -> Result<(), BookError> {
        if accessor.is_empty() {
            return Err(BookError::NoAccessor);
        }
        if !is_uuid(accessor) {
            return Err(BookError::DeleteBadAccessor);
        }
        if accessor == ANONYMOUS_ACCESSOR {
            return Err(BookError::DeleteAnonymous);
        }
        let t = self.by_accessor.get(accessor).ok_or(BookError::TokenGone)?;
        if t.secret == requester {
            return Err(BookError::DeleteOwnToken);
        }
        let secret = t.secret.clone();
        self.by_accessor.remove(accessor);
        self.by_secret.remove(&secret);
        Ok(())
    }

    /// `PUT /v1/acl/policy`: the policy created at raft `index`.
    pub(crate) fn create_policy(
        &mut self,
        b: PolicyBody,
        index: u64,
    ) -> Result<Arc<Policy>, BookError> {
        if b.name.is_empty() {
            return Err(BookError::PolicyNoName);
        }
        check_policy_name(&b.name)?;
        if self.policy_names.contains_key(&b.name) {
            return Err(BookError::PolicyNameTaken(b.name));
        }
        let parsed = rules::parse(&b.rules)?;
        if self.policies.len() >= MAX_POLICIES {
            let (what, max) = ("policies", MAX_POLICIES);
            return Err(BookError::Full { what, max });
        }
        let mut parts = vec![b.name.as_str(), &b.description, &b.rules];
        parts.extend(b.datacenters.iter().map(String::as_str));
        let p = Policy {
            id: uuid::Uuid::new_v4().to_string(),
            hash: hash_of(&parts),
            name: b.name,
            description: b.description,
            rules: b.rules,
            datacenters: b.datacenters,
            create_index: index,
            modify_index: index,
            parsed,
        };
        let id = p.id.clone();
        self.insert_policy(p);
        Ok(self.policies[&id].clone())
    }

    /// `DELETE /v1/acl/policy/<id>`: gone, and every token that linked it
    /// loses its rules (the link is dropped, as Consul drops links to
    /// missing policies when it reads a token).
    pub(crate) fn delete_policy(&mut self, id: &str, dc: &str) -> Result<(), BookError> {
        if id.is_empty() {
            return Err(BookError::NoPolicyId);
        }
        let p = self.policies.get(id).ok_or(BookError::PolicyGone)?;
        if id == GLOBAL_MANAGEMENT_ID || id == GLOBAL_READ_ONLY_ID {
            return Err(BookError::DeleteBuiltin(p.name.clone()));
        }
        let name = p.name.clone();
        self.policies.remove(id);
        self.policy_names.remove(&name);
        let linked: Vec<Arc<Token>> = self
            .by_accessor
            .values()
            .filter(|t| t.policies.iter().any(|p| p == id))
            .cloned()
            .collect();
        for t in linked {
            let policies: Vec<String> = t.policies.iter().filter(|p| *p != id).cloned().collect();
            let grants = self.grants(&policies, &t.node_identities, &t.service_identities, dc);
            self.insert_token(Token {
                accessor: t.accessor.clone(),
                secret: t.secret.clone(),
                description: t.description.clone(),
                policies,
                service_identities: t.service_identities.clone(),
                node_identities: t.node_identities.clone(),
                local: t.local,
                create_time: t.create_time.clone(),
                hash: t.hash.clone(),
                create_index: t.create_index,
                modify_index: t.modify_index,
                grants,
            });
        }
        Ok(())
    }
}

/// A body as Go's decoder reads it (blank: every field empty).
fn decode<T: for<'de> Deserialize<'de> + Default>(body: &[u8]) -> Result<T, serde_json::Error> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body)
}

/// A `PUT /v1/acl/token` body, decoded as the HTTP handler decodes it
/// (before any ACL check).
pub(crate) fn decode_token(body: &[u8]) -> Result<TokenBody, BookError> {
    decode(body).map_err(BookError::TokenDecode)
}

/// A `PUT /v1/acl/policy` body, decoded and checked as the HTTP handler
/// does (before any ACL check).
pub(crate) fn decode_policy(body: &[u8]) -> Result<PolicyBody, BookError> {
    let b: PolicyBody = decode(body).map_err(BookError::PolicyDecode)?;
    if !b.id.is_empty() {
        return Err(BookError::PolicyIdOnCreate);
    }
    Ok(b)
}

fn checked_services(
    ids: Vec<ServiceIdentity>,
    local: bool,
) -> Result<Vec<ServiceIdentity>, BookError> {
    let mut out: Vec<ServiceIdentity> = Vec::with_capacity(ids.len());
    for s in ids {
        if s.service_name.is_empty() {
            return Err(BookError::ServiceIdentityNoName);
        }
        if local && !s.datacenters.is_empty() {
            return Err(BookError::ServiceIdentityLocalDcs(s.service_name));
        }
        if !identity_name_ok(&s.service_name) {
            return Err(BookError::ServiceIdentityName(s.service_name));
        }
        match out.iter_mut().find(|o| o.service_name == s.service_name) {
            // One identity per service, its datacenters merged.
            Some(o) => {
                for d in s.datacenters {
                    if !o.datacenters.contains(&d) {
                        o.datacenters.push(d);
                    }
                }
            }
            None => out.push(s),
        }
    }
    Ok(out)
}

fn checked_nodes(ids: Vec<NodeIdentity>) -> Result<Vec<NodeIdentity>, BookError> {
    let mut out: Vec<NodeIdentity> = Vec::with_capacity(ids.len());
    for n in ids {
        if n.node_name.is_empty() {
            return Err(BookError::NodeIdentityNoName);
        }
        if n.datacenter.is_empty() {
            return Err(BookError::NodeIdentityNoDatacenter);
        }
        if !identity_name_ok(&n.node_name) {
            return Err(BookError::NodeIdentityName);
        }
        if !out.contains(&n) {
            out.push(n);
        }
    }
    Ok(out)
}
