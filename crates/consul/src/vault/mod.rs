//! Simulated Vault servers using the target cluster as Vault's
//! `storage "consul"` backend does (`--vault-nodes N`): the HA lock (a
//! session and `acquire` on `<path>core/lock`, standbys waiting on it with
//! blocking reads, lock-delay respected), and the active node's storage
//! calls for tokens created at a steady rate and in bursts, renewed and
//! revoked at their TTL, every write a `/v1/txn` fenced by a session check
//! as recent Vault writes. docs/writes.md says what is matched and what is
//! simplified.
//!
//! Main parts:
//! - [`VaultConfig`] and its validation ([`Burst`]).
//! - [`client`]: the Consul HTTP calls, bounded and checked.
//! - `lock`: the session and the lock, as Consul's `api.Lock` and Vault's
//!   `ConsulLock` use them; `node`: one Vault server (standby, active).
//! - `tokens`: the keys and values a token's life writes, the live tokens.
//! - [`VaultRunner`] (`runner`): the nodes, the lock checker, the sampled
//!   read-back and the clean-up at the end, into a [`VaultSummary`].
//!
//! What it is not: Vault (no barrier, no real encryption: values are
//! random bytes of the sizes Vault's encrypted entries have).

pub mod client;
mod lock;
mod node;
mod runner;
mod tokens;

use std::time::Duration;

use agent_sim_metrics::{ErrorKindSpec, MetricsSpec};

pub use agent_sim_metrics::VaultSummary;
pub use runner::{VaultRunner, cleanup_path};

use crate::ConsulError;

/// Vault's default `max_parallel` (the permit pool of its storage calls).
pub const MAX_PARALLEL: usize = 128;
/// Vault's and Consul's lock session TTL (`api.DefaultLockSessionTTL`).
pub const SESSION_TTL: Duration = Duration::from_secs(15);
/// How long one blocking read of the lock key waits (`DefaultLockWaitTime`).
pub const LOCK_WAIT: Duration = Duration::from_secs(15);
/// Wait after an acquire refused with no holder: lock-delay in effect
/// (`DefaultLockRetryTime`).
pub const LOCK_RETRY: Duration = Duration::from_secs(5);
/// How often a standby reads the lock's value to learn the leader
/// (Vault's `leaderCheckInterval`).
pub const LEADER_CHECK: Duration = Duration::from_millis(2500);
/// Workers restoring leases when a node becomes active
/// (`consts.ExpirationRestoreWorkerCount`).
pub const RESTORE_WORKERS: usize = 64;
/// The session name of the run's Vault locks: Vault's `Vault Lock` with
/// the run's path, so `agent-sim cleanup` finds them.
pub fn session_name(path: &str) -> String {
    format!("Vault Lock {path}")
}

/// A token storm: `tokens` creates at once, `at` from the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Burst {
    /// When, from the start of the run.
    pub at: Duration,
    /// How many token creates.
    pub tokens: u32,
}

impl std::str::FromStr for Burst {
    type Err = String;
    /// `at=T,tokens=N` (both required).
    fn from_str(s: &str) -> Result<Self, String> {
        use agent_sim_fleet::scenario::{duration_of, pairs};
        let (mut at, mut tokens) = (None, None);
        for (k, v) in pairs(s, &["at", "tokens"])? {
            match k {
                "at" => at = Some(duration_of(k, v)?),
                _ => {
                    let n: u32 = v
                        .parse()
                        .map_err(|_| format!("tokens={v}: not a whole number"))?;
                    if n == 0 || n > VaultConfig::MAX_BURST {
                        return Err(format!(
                            "tokens={v}: give 1 to {} token creates",
                            VaultConfig::MAX_BURST
                        ));
                    }
                    tokens = Some(n);
                }
            }
        }
        match (at, tokens) {
            (Some(at), Some(tokens)) => Ok(Burst { at, tokens }),
            _ => Err(format!(
                "{s:?}: expected at=T,tokens=N (e.g. at=30s,tokens=5000)"
            )),
        }
    }
}

impl std::fmt::Display for Burst {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = if self.at.subsec_millis() == 0 {
            format!("{}s", self.at.as_secs())
        } else {
            format!("{}ms", self.at.as_millis())
        };
        write!(f, "at={at},tokens={}", self.tokens)
    }
}

impl<'de> serde::Deserialize<'de> for Burst {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <String as serde::Deserialize>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The Vault servers of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct VaultConfig {
    /// Vault servers (one active, the others standby).
    pub nodes: u32,
    /// Steady token creates per second on the active node (0: none).
    pub tokens_per_s: f64,
    /// A token's life: renewed once at half of it, revoked at its end.
    pub token_ttl: Duration,
    /// Token storms.
    pub bursts: Vec<Burst>,
    /// Vault's `path` (ends in `/`, no leading `/`); empty: the run's
    /// `<name-prefix>/vault/`.
    pub path: String,
    /// Vault's `max_parallel`.
    pub max_parallel: usize,
    /// The lock session's TTL (Consul bounds it: 10 s to 24 h).
    pub session_ttl: Duration,
    /// One blocking read's wait on the lock key.
    pub lock_wait: Duration,
    /// One token create in this many is read back before its revoke.
    pub read_back_every: u32,
    /// How often the checker reads the lock key from the server.
    pub check_every: Duration,
    /// The active node steps down (releases the lock, stops) at this time,
    /// as a Vault server stopped for an upgrade: the handover is measured.
    pub stop_active_at: Option<Duration>,
    /// The active node dies at this time (no release, its session left to
    /// expire): the lock frees after the session's TTL and the server's
    /// lock-delay, and the handover shows both.
    pub kill_active_at: Option<Duration>,
}

impl Default for VaultConfig {
    fn default() -> Self {
        VaultConfig {
            nodes: 3,
            tokens_per_s: 0.0,
            token_ttl: Duration::from_secs(60),
            bursts: Vec::new(),
            path: String::new(),
            max_parallel: MAX_PARALLEL,
            session_ttl: SESSION_TTL,
            lock_wait: LOCK_WAIT,
            read_back_every: 50,
            check_every: Duration::from_secs(1),
            stop_active_at: None,
            kill_active_at: None,
        }
    }
}

/// A Vault servers' client of `cfg`'s HTTP API (its address, TLS, token
/// and datacenter), with `conns` calls at once and blocking reads of up to
/// `longest_wait`.
pub fn kv_client(
    cfg: &crate::ConsulConfig,
    conns: usize,
    longest_wait: Duration,
) -> Result<client::KvClient, ConsulError> {
    let v = cfg.prepare()?;
    let tls = match (cfg.conn.tls.as_ref(), v.https) {
        (Some(t), true) => Some((
            crate::conn::tls_client_config(t)?,
            crate::conn::server_name(t, &v.http_host)?,
        )),
        _ => None,
    };
    client::KvClient::new(
        v.http_addr,
        tls,
        cfg.conn.token.as_deref(),
        &cfg.conn.datacenter,
        conns,
        longest_wait,
        None,
    )
}

/// The Vault servers of a fleet, when it has some and this process is the
/// probe's controller (one process of a sharded run runs them).
pub fn runner(
    cfg: &crate::ConsulConfig,
    metrics: agent_sim_metrics::Metrics,
) -> Result<Option<VaultRunner>, ConsulError> {
    let Some(v) = &cfg.vault else {
        return Ok(None);
    };
    if !cfg.probe.controller {
        return Ok(None);
    }
    v.validate(&cfg.conn.name_prefix)?;
    // Each node: its permit pool, its lock or monitor read, its standby
    // checks; the checker and the read-back beside them.
    let conns = v.nodes as usize * (v.max_parallel + 3) + 8;
    let client = kv_client(cfg, conns, lock::MONITOR_WAIT.max(v.lock_wait))?;
    let path = v.path_for(&cfg.conn.name_prefix);
    Ok(Some(VaultRunner::new((**v).clone(), path, client, metrics)))
}

fn invalid(field: &'static str, reason: impl Into<String>) -> ConsulError {
    ConsulError::Invalid {
        field,
        reason: reason.into(),
    }
}

impl VaultConfig {
    /// Most token creates in one burst.
    pub const MAX_BURST: u32 = 1_000_000;

    /// Checks every setting; `prefix` is the run's name prefix.
    pub fn validate(&self, prefix: &str) -> Result<(), ConsulError> {
        if !(1..=16).contains(&self.nodes) {
            return Err(invalid(
                "vault.nodes",
                format!("{} Vault servers: give 1 to 16", self.nodes),
            ));
        }
        if !self.tokens_per_s.is_finite() || !(0.0..=100_000.0).contains(&self.tokens_per_s) {
            return Err(invalid(
                "vault.tokens",
                "a rate from 0 to 100000 tokens per second",
            ));
        }
        if self.token_ttl < Duration::from_secs(1) || self.token_ttl > Duration::from_secs(86_400) {
            return Err(invalid("vault.token_ttl", "from 1s to 24h"));
        }
        for b in &self.bursts {
            if b.tokens == 0 || b.tokens > Self::MAX_BURST {
                return Err(invalid(
                    "vault.burst",
                    format!(
                        "tokens={}: give 1 to {} token creates",
                        b.tokens,
                        Self::MAX_BURST
                    ),
                ));
            }
        }
        if !(1..=4096).contains(&self.max_parallel) {
            return Err(invalid("vault.max_parallel", "from 1 to 4096"));
        }
        if self.session_ttl < Duration::from_secs(10)
            || self.session_ttl > Duration::from_secs(86_400)
        {
            return Err(invalid(
                "vault.session_ttl",
                "Consul accepts session TTLs from 10s to 24h",
            ));
        }
        if self.lock_wait < Duration::from_secs(1) || self.lock_wait > Duration::from_secs(600) {
            return Err(invalid("vault.lock_wait", "from 1s to 10m"));
        }
        if self.read_back_every == 0 {
            return Err(invalid("vault.read_back_every", "at least 1"));
        }
        if self.check_every < Duration::from_millis(100) {
            return Err(invalid("vault.check_every", "at least 100ms"));
        }
        let path = self.path_for(prefix);
        if path.len() > 200
            || !path
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "/-_.".contains(c))
            || path.contains("//")
        {
            return Err(invalid(
                "vault.path",
                format!("{path:?}: letters, digits, '/', '-', '_', '.' (no '//'), at most 200"),
            ));
        }
        if !path.starts_with(&format!("{prefix}/")) {
            return Err(invalid(
                "vault.path",
                format!(
                    "{path:?}: the run removes everything under its Vault path at the end, so \
                     the path must be the run's own, under its name prefix ({prefix}/...)"
                ),
            ));
        }
        Ok(())
    }

    /// Vault's `path` for a run with `prefix`: as given (a trailing `/`
    /// added, a leading one removed, as Vault does) or `<prefix>/vault/`.
    pub fn path_for(&self, prefix: &str) -> String {
        default_path(&self.path, prefix)
    }
}

/// Vault's `path` as given, or `<prefix>/vault/`, normalised as Vault does.
pub fn default_path(path: &str, prefix: &str) -> String {
    let mut p = if path.is_empty() {
        format!("{prefix}/vault/")
    } else {
        path.trim_start_matches('/').to_owned()
    };
    if !p.ends_with('/') {
        p.push('/');
    }
    p
}

/// Metric names of the Vault servers.
pub mod names {
    /// Tokens created.
    pub const TOKENS_CREATED: &str = "vault_tokens_created";
    /// Tokens renewed (lease rewritten).
    pub const TOKENS_RENEWED: &str = "vault_tokens_renewed";
    /// Tokens revoked at their TTL (entries deleted).
    pub const TOKENS_REVOKED: &str = "vault_tokens_revoked";
    /// Storage calls made (every get, list and txn).
    pub const KV_OPS: &str = "vault_kv_ops";
    /// Storage writes (puts and deletes, each one `/v1/txn`).
    pub const KV_WRITES: &str = "vault_kv_writes";
    /// Locks acquired.
    pub const LOCK_ACQUISITIONS: &str = "vault_lock_acquisitions";
    /// A node other than the last active one became active.
    pub const LEADERSHIP_CHANGES: &str = "vault_leadership_changes";
    /// Writes refused by the session check (the node lost the lock).
    pub const FENCED_WRITES: &str = "vault_fenced_writes";
    /// A Put (one `set`, fenced, in a `/v1/txn`), from the call's start
    /// (permit wait included, as Vault times it).
    pub const KV_PUT: &str = "kv_put";
    /// A Get.
    pub const KV_GET: &str = "kv_get";
    /// A Delete (one `delete`, fenced, in a `/v1/txn`).
    pub const KV_DELETE: &str = "kv_delete";
    /// Every `/v1/txn` round trip.
    pub const KV_TXN: &str = "kv_txn";
    /// A List (`?keys&separator=/`).
    pub const KV_LIST: &str = "kv_list";
    /// An `?acquire=` round trip.
    pub const LOCK_ACQUIRE: &str = "lock_acquire";
    /// A token create: intended start (its slot in the rate or burst) to
    /// its last write answered.
    pub const TOKEN_CREATE: &str = "vault_token_create";
}

/// Counters whose rate means something: the write traffic.
pub const RATED_COUNTERS: &[&str] = &[
    names::TOKENS_CREATED,
    names::TOKENS_RENEWED,
    names::TOKENS_REVOKED,
    names::KV_OPS,
    names::KV_WRITES,
];

/// Counters, latencies and error kinds of the Vault servers.
pub fn metrics_spec() -> MetricsSpec {
    MetricsSpec {
        counters: vec![
            names::TOKENS_CREATED,
            names::TOKENS_RENEWED,
            names::TOKENS_REVOKED,
            names::KV_OPS,
            names::KV_WRITES,
            names::LOCK_ACQUISITIONS,
            names::LEADERSHIP_CHANGES,
            names::FENCED_WRITES,
        ],
        latencies: vec![
            names::KV_PUT,
            names::KV_GET,
            names::KV_DELETE,
            names::KV_TXN,
            names::KV_LIST,
            names::LOCK_ACQUIRE,
            names::TOKEN_CREATE,
        ],
        errors: ERROR_KINDS.to_vec(),
    }
}

const ERROR_KINDS: &[ErrorKindSpec] = &[
    ErrorKindSpec {
        kind: "vault_setup",
        hint: "the Vault servers could not be set up from the fleet's settings (the sample \
               says why); none ran",
        heals: false,
    },
    ErrorKindSpec {
        kind: "vault_txn_rollback",
        hint: "a Vault storage write (a /v1/txn) was rolled back; the sample has the server's \
               words per op (a failed session check: the node lost the lock and steps down)",
        heals: true,
    },
    ErrorKindSpec {
        kind: "vault_bad_answer",
        hint: "a Consul answer to a Vault storage call did not read as Consul's (no valid \
               X-Consul-Index, not JSON, not base64): is the HTTP target a Consul API?",
        heals: true,
    },
    ErrorKindSpec {
        kind: "vault_value_too_large",
        hint: "the server answered a Vault read with a value over Consul's 512 KiB KV limit: \
               refused unread",
        heals: true,
    },
    ErrorKindSpec {
        kind: "vault_lock_conflict",
        hint: "the lock key exists without the lock's flags (Consul's \"Existing key does not \
               match lock use\"): another tool uses this key; the node waits and tries again",
        heals: true,
    },
    ErrorKindSpec {
        kind: "vault_index_reset",
        hint: "a blocking read of the lock key came back with an index lower than the one it \
               waited on (or not blocking at all): the wait starts over from 0, paced",
        heals: true,
    },
    ErrorKindSpec {
        kind: "vault_never_active",
        hint: "no simulated Vault node held the lock during the run: the lock key is held by \
               a session that is not the run's (another Vault, a killed run within its TTL \
               and lock-delay); standbys waited and the run ended on time",
        heals: false,
    },
    ErrorKindSpec {
        kind: "vault_split_brain",
        hint: "the checker saw more than one simulated Vault node believe it was active, or \
               the server's lock holder differ from the node that believed it was",
        heals: false,
    },
    ErrorKindSpec {
        kind: "vault_read_back",
        hint: "a sampled key read back lost (404) or changed before the run deleted it",
        heals: false,
    },
    ErrorKindSpec {
        kind: "vault_cleanup",
        hint: "keys under the run's Vault path or its lock sessions were left at the end: \
               `agent-sim cleanup --prefix` removes them",
        heals: false,
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_parses_and_prints_back() {
        let b: Burst = "at=30s,tokens=5000".parse().unwrap();
        assert_eq!(
            b,
            Burst {
                at: Duration::from_secs(30),
                tokens: 5000
            }
        );
        assert_eq!(b.to_string(), "at=30s,tokens=5000");
        assert!(
            "at=30s"
                .parse::<Burst>()
                .unwrap_err()
                .contains("at=T,tokens=N")
        );
        assert!("at=1s,tokens=0".parse::<Burst>().is_err());
        assert!("at=1s,tokens=x".parse::<Burst>().is_err());
        assert!("at=1s,tokens=5,drop=3".parse::<Burst>().is_err());
    }

    #[test]
    fn the_path_is_normalised_as_vault_does() {
        assert_eq!(default_path("", "run1"), "run1/vault/");
        assert_eq!(default_path("/x/y", "run1"), "x/y/");
        assert_eq!(default_path("x/", "run1"), "x/");
    }

    #[test]
    fn bad_settings_are_refused_with_the_field() {
        let ok = VaultConfig::default();
        ok.validate("p").unwrap();
        let e = |c: VaultConfig| c.validate("p").unwrap_err().to_string();
        assert!(
            e(VaultConfig {
                nodes: 0,
                ..ok.clone()
            })
            .starts_with("vault.nodes:")
        );
        assert!(
            e(VaultConfig {
                session_ttl: Duration::from_secs(5),
                ..ok.clone()
            })
            .contains("10s to 24h")
        );
        assert!(
            e(VaultConfig {
                bursts: vec![Burst {
                    at: Duration::ZERO,
                    tokens: 0
                }],
                ..ok.clone()
            })
            .starts_with("vault.burst:")
        );
        assert!(
            e(VaultConfig {
                path: "p/a b".into(),
                ..ok.clone()
            })
            .starts_with("vault.path:")
        );
        assert!(
            e(VaultConfig {
                path: "vault/".into(),
                ..ok.clone()
            })
            .contains("under its name prefix")
        );
        VaultConfig {
            path: "p/v2".into(),
            ..ok.clone()
        }
        .validate("p")
        .unwrap();
        assert!(
            e(VaultConfig {
                tokens_per_s: f64::NAN,
                ..ok
            })
            .starts_with("vault.tokens:")
        );
    }
}
