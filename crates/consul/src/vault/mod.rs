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
//!   `ConsulLock` use them; `node`: one Vault server (standby, active);
//!   `shared`: what the nodes share.
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
mod shared;
mod tokens;

use std::time::Duration;

use agent_sim_metrics::{ErrorKindSpec, MetricsSpec};

pub use agent_sim_metrics::VaultSummary;
pub use runner::{VaultRunner, cleanup_path};

use crate::ConsulError;
pub use crate::vault_config::{
    Burst, LOCK_WAIT, MAX_PARALLEL, SESSION_TTL, VaultConfig, VaultConfigError, default_path,
    session_name,
};

/// Wait after an acquire refused with no holder: lock-delay in effect
/// (`DefaultLockRetryTime`).
pub const LOCK_RETRY: Duration = Duration::from_secs(5);
/// How often a standby reads the lock's value to learn the leader
/// (Vault's `leaderCheckInterval`).
pub const LEADER_CHECK: Duration = Duration::from_millis(2500);
/// Workers restoring leases when a node becomes active
/// (`consts.ExpirationRestoreWorkerCount`).
pub const RESTORE_WORKERS: usize = 64;
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
        said_by: agent_sim_metrics::Speaker::Local,
    },
    ErrorKindSpec {
        kind: "vault_txn_rollback",
        hint: "a Vault storage write (a /v1/txn) was rolled back; the sample has the server's \
               words per op (a failed session check: the node lost the lock and steps down)",
        heals: true,
        said_by: agent_sim_metrics::Speaker::Server,
    },
    ErrorKindSpec {
        kind: "vault_bad_answer",
        hint: "a Consul answer to a Vault storage call did not read as Consul's (no valid \
               X-Consul-Index, not JSON, not base64): is the HTTP target a Consul API?",
        heals: true,
        said_by: agent_sim_metrics::Speaker::Server,
    },
    ErrorKindSpec {
        kind: "vault_value_too_large",
        hint: "the server answered a Vault read with a value over Consul's 512 KiB KV limit: \
               refused unread",
        heals: true,
        said_by: agent_sim_metrics::Speaker::Server,
    },
    ErrorKindSpec {
        kind: "vault_lock_conflict",
        hint: "the lock key exists without the lock's flags (Consul's \"Existing key does not \
               match lock use\"): another tool uses this key; the node waits and tries again",
        heals: true,
        said_by: agent_sim_metrics::Speaker::Server,
    },
    ErrorKindSpec {
        kind: "vault_index_reset",
        hint: "a blocking read of the lock key came back with an index lower than the one it \
               waited on (or not blocking at all): the wait starts over from 0, paced",
        heals: true,
        said_by: agent_sim_metrics::Speaker::Server,
    },
    ErrorKindSpec {
        kind: "vault_never_active",
        hint: "no simulated Vault node held the lock during the run: the lock key is held by \
               a session that is not the run's (another Vault, a killed run within its TTL \
               and lock-delay); standbys waited and the run ended on time",
        heals: false,
        said_by: agent_sim_metrics::Speaker::Server,
    },
    ErrorKindSpec {
        kind: "vault_split_brain",
        hint: "the checker saw more than one simulated Vault node believe it was active, or \
               the server's lock holder differ from the node that believed it was",
        heals: false,
        said_by: agent_sim_metrics::Speaker::Server,
    },
    ErrorKindSpec {
        kind: "vault_read_back",
        hint: "a sampled key read back lost (404) or changed before the run deleted it",
        heals: false,
        said_by: agent_sim_metrics::Speaker::Server,
    },
    ErrorKindSpec {
        kind: "vault_cleanup",
        hint: "keys under the run's Vault path or its lock sessions were left at the end: \
               `agent-sim cleanup --prefix` removes them",
        heals: false,
        said_by: agent_sim_metrics::Speaker::Server,
    },
];
