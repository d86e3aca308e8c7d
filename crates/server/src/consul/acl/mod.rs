//! ACLs of the embedded server, as a Consul 1.20 server with
//! `default_policy = "deny"` enforces them: the tokens and policies it
//! holds, what a request's token may do, and the denials in Consul's
//! words.
//!
//! - [`Acl`]: the store (`book`: tokens by secret and accessor, policies,
//!   bounded) and [`Acl::resolve`], a request's token to an [`Authz`]:
//!   everything with ACLs off or a management token (`--acl-token`, or
//!   one linking `global-management`), nothing for the anonymous token,
//!   else the token's rules (`rules`: its node and service identities
//!   and policies, merged). An unknown secret is [`AclError::NotFound`].
//! - [`Authz::check`]: one permission on one resource, or a [`Denied`]
//!   whose Display is Consul's (`Permission denied: token with AccessorID
//!   '...' lacks permission 'node:write' on "n1"`, the anonymous token's
//!   own wording without a token).
//! - `vet`: what each catalog, session and txn write needs, checked as
//!   Consul's endpoints check it (both the HTTP API and the RPC port).
//! - Counters ([`AclSnapshot`]): resolutions, unknown tokens, denials by
//!   permission.
//!
//! Not here: the HTTP endpoints (`http::acl`), roles, auth methods,
//! token expiry, replication, `ACL.*` RPCs.

mod book;
mod error;
mod rules;
pub(crate) mod vet;
mod view;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use serde::Serialize;

pub(crate) use book::{Book, Grants, Token, decode_policy, decode_token};
pub(crate) use error::BookError;
pub(crate) use rules::{Access, Resource};

use book::ANONYMOUS_SECRET;
#[cfg(test)]
use book::GLOBAL_MANAGEMENT_ID;
use rules::Rules;

/// The rules of Consul's built-in `global-management` policy, as the
/// server prints them (`builtin/global-read-only`: `read` for `write`).
pub(crate) const GLOBAL_MANAGEMENT_RULES: &str = "
acl = \"write\"
agent_prefix \"\" {
\tpolicy = \"write\"
}
event_prefix \"\" {
\tpolicy = \"write\"
}
key_prefix \"\" {
\tpolicy = \"write\"
}
keyring = \"write\"
node_prefix \"\" {
\tpolicy = \"write\"
}
operator = \"write\"
mesh = \"write\"
peering = \"write\"
query_prefix \"\" {
\tpolicy = \"write\"
}
service_prefix \"\" {
\tpolicy = \"write\"
\tintentions = \"write\"
}
session_prefix \"\" {
\tpolicy = \"write\"
}";

/// The permissions denials are counted by: resource × access.
const RESOURCES: [Resource; 7] = [
    Resource::Acl,
    Resource::Node,
    Resource::Service,
    Resource::Session,
    Resource::Key,
    Resource::Mesh,
    Resource::Intentions,
];
const ACCESSES: [Access; 3] = [Access::Read, Access::List, Access::Write];

fn slot(r: Resource, a: Access) -> usize {
    let ri = RESOURCES.iter().position(|x| *x == r).unwrap_or(0);
    let ai = ACCESSES.iter().position(|x| *x == a).unwrap_or(0);
    ri * ACCESSES.len() + ai
}

/// The ACL counters of a server (kept across restarts).
#[derive(Default, Debug)]
pub(crate) struct AclCounters {
    resolutions: AtomicU64,
    not_found: AtomicU64,
    denied: [AtomicU64; RESOURCES.len() * ACCESSES.len()],
}

/// ACL counters since the server started.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AclSnapshot {
    /// Tokens resolved (requests with ACLs on, anonymous ones included).
    pub resolutions: u64,
    /// Requests whose token the server does not hold (`ACL not found`).
    pub not_found: u64,
    /// Denials by permission (`node:write`, `session:write`, ...).
    pub denied: BTreeMap<String, u64>,
    /// Tokens held (gauge; the anonymous token included).
    pub tokens: u64,
    /// Policies held (gauge; the built-in ones included).
    pub policies: u64,
}

/// A request's token, resolved: what it may do.
#[derive(Clone)]
pub(crate) struct Authz {
    who: Who,
    counters: Option<Arc<AclCounters>>,
}

#[derive(Clone)]
enum Who {
    /// ACLs off, or a management token.
    All,
    /// No token under default deny.
    Anonymous,
    /// A token's rules.
    Token {
        accessor: Arc<str>,
        rules: Arc<Rules>,
    },
}

impl fmt::Debug for Authz {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.who {
            Who::All => f.write_str("Authz::All"),
            Who::Anonymous => f.write_str("Authz::Anonymous"),
            Who::Token { accessor, .. } => write!(f, "Authz::Token({accessor})"),
        }
    }
}

impl Authz {
    /// Everything allowed (ACLs off).
    pub(crate) fn all() -> Self {
        Self {
            who: Who::All,
            counters: None,
        }
    }

    /// Whether this is the anonymous token.
    pub(crate) fn is_anonymous(&self) -> bool {
        matches!(self.who, Who::Anonymous)
    }

    /// Whether everything is allowed.
    pub(crate) fn is_all(&self) -> bool {
        matches!(self.who, Who::All)
    }

    /// Whether `need` on `resource` `name` is allowed (no counting: for
    /// filtering).
    pub(crate) fn allows(&self, resource: Resource, need: Access, name: &str) -> bool {
        match &self.who {
            Who::All => true,
            Who::Anonymous => false,
            Who::Token { rules, .. } => rules.allows(resource, need, name),
        }
    }

    /// `need` on `resource` `name`, or the denial (counted).
    pub(crate) fn check(&self, resource: Resource, need: Access, name: &str) -> Result<(), Denied> {
        if self.allows(resource, need, name) {
            return Ok(());
        }
        Err(self.denied(resource, need, Some(name)))
    }

    /// `<resource>:<need>` without a name (`acl:write`, `mesh:write`),
    /// or the denial.
    pub(crate) fn check_unnamed(&self, resource: Resource, need: Access) -> Result<(), Denied> {
        if self.allows(resource, need, "") {
            return Ok(());
        }
        Err(self.denied(resource, need, None))
    }

    /// Writing every key under `prefix` (Consul's `KeyWritePrefix`, a
    /// recursive delete), or the denial.
    pub(crate) fn check_key_write_prefix(&self, prefix: &str) -> Result<(), Denied> {
        let ok = match &self.who {
            Who::All => true,
            Who::Anonymous => false,
            Who::Token { rules, .. } => rules.allows_key_write_prefix(prefix),
        };
        if ok {
            return Ok(());
        }
        Err(self.denied(Resource::Key, Access::Write, Some(prefix)))
    }

    fn denied(&self, resource: Resource, need: Access, name: Option<&str>) -> Denied {
        if let Some(c) = &self.counters {
            c.denied[slot(resource, need)].fetch_add(1, Ordering::Relaxed);
        }
        Denied {
            accessor: match &self.who {
                Who::Token { accessor, .. } => Some(accessor.clone()),
                _ => None,
            },
            resource,
            need,
            name: name.map(str::to_owned),
        }
    }
}

/// A permission a token lacks: Consul's `PermissionDeniedError`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Denied {
    /// `None`: the anonymous token.
    accessor: Option<Arc<str>>,
    resource: Resource,
    need: Access,
    /// `None`: a permission without a resource name (`acl:write`).
    name: Option<String>,
}

impl fmt::Display for Denied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Permission denied: ")?;
        match &self.accessor {
            None => f.write_str("anonymous token")?,
            Some(a) => write!(f, "token with AccessorID '{a}'")?,
        }
        write!(
            f,
            " lacks permission '{}:{}'",
            self.resource.name(),
            self.need.name()
        )?;
        if let Some(n) = self.name.as_deref().filter(|n| !n.is_empty()) {
            write!(f, " on \"{n}\"")?;
        }
        if self.accessor.is_none() {
            f.write_str(
                ". The anonymous token is used implicitly when a request does not specify a \
                 token.",
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for Denied {}

/// Why a request's token may not do what it asks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AclError {
    /// The server holds no such token.
    #[error("ACL not found")]
    NotFound,
    /// The token lacks a permission.
    #[error(transparent)]
    Denied(#[from] Denied),
    /// A deregister (without node write) of a service the node lacks.
    #[error("Unknown service ID '{0}'")]
    UnknownServiceId(String),
    /// A deregister (without node write) of a check the node lacks.
    #[error("Unknown check ID '{0}'")]
    UnknownCheckId(String),
}

/// The ACL state of one server: on or off, its datacenter, its tokens
/// and policies.
pub(crate) struct Acl {
    on: bool,
    datacenter: String,
    /// Lock order: after the store and the sessions (never held while
    /// taking them).
    book: RwLock<Book>,
    counters: Arc<AclCounters>,
}

impl Acl {
    /// ACLs on when `management` is set (its tokens manage everything);
    /// the built-ins written at raft `index`.
    pub(crate) fn new(
        management: Option<&[String]>,
        datacenter: &str,
        index: u64,
        counters: Arc<AclCounters>,
    ) -> Self {
        Self {
            on: management.is_some(),
            datacenter: datacenter.to_owned(),
            book: RwLock::new(Book::new(management.unwrap_or_default(), index)),
            counters,
        }
    }

    /// Whether ACLs are on.
    pub(crate) fn on(&self) -> bool {
        self.on
    }

    /// The datacenter node identities must name to apply.
    pub(crate) fn datacenter(&self) -> &str {
        &self.datacenter
    }

    /// The book, to read.
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Book> {
        self.book.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The book, to write.
    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, Book> {
        self.book.write().unwrap_or_else(|p| p.into_inner())
    }

    /// What the token of secret `token` may do (`""`: anonymous).
    pub(crate) fn resolve(&self, token: &str) -> Result<Authz, AclError> {
        if !self.on {
            return Ok(Authz::all());
        }
        let c = &self.counters;
        c.resolutions.fetch_add(1, Ordering::Relaxed);
        let counters = Some(c.clone());
        if token.is_empty() || token == ANONYMOUS_SECRET {
            return Ok(Authz {
                who: Who::Anonymous,
                counters,
            });
        }
        let book = self.read();
        let Some(t) = book.by_secret(token) else {
            c.not_found.fetch_add(1, Ordering::Relaxed);
            return Err(AclError::NotFound);
        };
        let who = match &t.grants {
            Grants::All => Who::All,
            Grants::Rules(rules) => Who::Token {
                accessor: t.accessor.clone(),
                rules: rules.clone(),
            },
        };
        Ok(Authz { who, counters })
    }

    /// The counters and sizes.
    pub(crate) fn snapshot(&self) -> AclSnapshot {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut denied = BTreeMap::new();
        for r in RESOURCES {
            for a in ACCESSES {
                let n = get(&c.denied[slot(r, a)]);
                if n > 0 {
                    denied.insert(format!("{}:{}", r.name(), a.name()), n);
                }
            }
        }
        let (tokens, policies) = if self.on { self.read().sizes() } else { (0, 0) };
        AclSnapshot {
            resolutions: get(&c.resolutions),
            not_found: get(&c.not_found),
            denied,
            tokens: tokens as u64,
            policies: policies as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl() -> Acl {
        Acl::new(Some(&["root".to_owned()]), "dc1", 1, Arc::default())
    }

    fn create(a: &Acl, body: serde_json::Value) -> String {
        let b = decode_token(body.to_string().as_bytes()).unwrap();
        let t = a.write().create_token(b, 5, "dc1").unwrap();
        t.secret.clone()
    }

    #[test]
    fn off_allows_everything_and_management_too() {
        let off = Acl::new(None, "dc1", 1, Arc::default());
        assert!(off.resolve("").unwrap().is_all());
        assert!(off.resolve("whatever").unwrap().is_all());
        let a = acl();
        assert!(a.resolve("root").unwrap().is_all());
        assert!(a.resolve("").unwrap().is_anonymous());
        assert!(a.resolve("anonymous").unwrap().is_anonymous());
        assert_eq!(a.resolve("nope").unwrap_err(), AclError::NotFound);
        assert_eq!(AclError::NotFound.to_string(), "ACL not found");
        let s = a.snapshot();
        assert_eq!((s.resolutions, s.not_found), (4, 1));
        // Anonymous, the management token; two built-in policies.
        assert_eq!((s.tokens, s.policies), (2, 2));
    }

    #[test]
    fn a_node_identity_of_another_datacenter_grants_nothing() {
        let a = acl();
        let here = create(
            &a,
            serde_json::json!({"NodeIdentities": [{"NodeName": "n1", "Datacenter": "dc1"}]}),
        );
        let there = create(
            &a,
            serde_json::json!({"NodeIdentities": [{"NodeName": "n1", "Datacenter": "dc2"}]}),
        );
        let here = a.resolve(&here).unwrap();
        assert!(here.check(Resource::Node, Access::Write, "n1").is_ok());
        assert!(here.check(Resource::Service, Access::Read, "web").is_ok());
        let there = a.resolve(&there).unwrap();
        assert!(!there.allows(Resource::Node, Access::Write, "n1"));
    }

    #[test]
    fn denials_say_who_lacks_what_in_consuls_words() {
        let a = acl();
        let secret = create(
            &a,
            serde_json::json!({"NodeIdentities": [{"NodeName": "n1", "Datacenter": "dc1"}]}),
        );
        let authz = a.resolve(&secret).unwrap();
        let accessor = a.read().by_secret(&secret).unwrap().accessor.clone();
        let e = authz
            .check(Resource::Node, Access::Write, "n2")
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "Permission denied: token with AccessorID '{accessor}' lacks permission \
                 'node:write' on \"n2\""
            )
        );
        let e = authz
            .check_unnamed(Resource::Acl, Access::Write)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "Permission denied: token with AccessorID '{accessor}' lacks permission 'acl:write'"
            )
        );
        let anon = a.resolve("").unwrap();
        assert_eq!(
            anon.check(Resource::Key, Access::Read, "k")
                .unwrap_err()
                .to_string(),
            "Permission denied: anonymous token lacks permission 'key:read' on \"k\". The \
             anonymous token is used implicitly when a request does not specify a token."
        );
        let denied = a.snapshot().denied;
        assert_eq!(denied["node:write"], 1);
        assert_eq!(denied["acl:write"], 1);
        assert_eq!(denied["key:read"], 1);
    }

    #[test]
    fn deleting_a_policy_takes_its_rules_from_the_tokens_that_linked_it() {
        let a = acl();
        let p = a
            .write()
            .create_policy(
                decode_policy(
                    br#"{"Name": "sessions", "Rules": "session_prefix \"\" { policy = \"write\" }"}"#,
                )
                .unwrap(),
                3,
            )
            .unwrap();
        let secret = create(&a, serde_json::json!({"Policies": [{"Name": "sessions"}]}));
        let before = a.resolve(&secret).unwrap();
        assert!(before.allows(Resource::Session, Access::Write, "n1"));
        a.write().delete_policy(&p.id, "dc1").unwrap();
        let after = a.resolve(&secret).unwrap();
        assert!(!after.allows(Resource::Session, Access::Write, "n1"));
        let book = a.read();
        let t = book.by_secret(&secret).unwrap();
        assert!(t.policies.is_empty());
    }

    #[test]
    fn a_token_linking_global_management_manages() {
        let a = acl();
        let secret = create(
            &a,
            serde_json::json!({"Policies": [{"ID": GLOBAL_MANAGEMENT_ID}]}),
        );
        assert!(a.resolve(&secret).unwrap().is_all());
    }
}
