//! What the nodes of a run share: the settings, the client, the metric
//! ids, the live tokens, who believes it is active (the checker's side),
//! the read-back's tallies, the bursts, the handovers.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use agent_sim_metrics::{CounterId, LatencyId, Metrics};
use tokio::time::Instant;

use super::client::KvClient;
use super::tokens::Registry;
use super::{VaultConfig, names};

/// The metric ids the nodes use.
pub(super) struct Ids {
    pub created: CounterId,
    pub renewed: CounterId,
    pub revoked: CounterId,
    pub ops: CounterId,
    pub writes: CounterId,
    pub acquisitions: CounterId,
    pub changes: CounterId,
    pub fenced: CounterId,
    pub put: LatencyId,
    pub get: LatencyId,
    pub delete: LatencyId,
    pub txn: LatencyId,
    pub list: LatencyId,
    pub create: LatencyId,
}

impl Ids {
    pub fn resolve(m: &Metrics) -> Self {
        Ids {
            created: m.counter(names::TOKENS_CREATED),
            renewed: m.counter(names::TOKENS_RENEWED),
            revoked: m.counter(names::TOKENS_REVOKED),
            ops: m.counter(names::KV_OPS),
            writes: m.counter(names::KV_WRITES),
            acquisitions: m.counter(names::LOCK_ACQUISITIONS),
            changes: m.counter(names::LEADERSHIP_CHANGES),
            fenced: m.counter(names::FENCED_WRITES),
            put: m.latency(names::KV_PUT),
            get: m.latency(names::KV_GET),
            delete: m.latency(names::KV_DELETE),
            txn: m.latency(names::KV_TXN),
            list: m.latency(names::KV_LIST),
            create: m.latency(names::TOKEN_CREATE),
        }
    }
}

/// Which node believes it is active, with its session: what the checker
/// compares with the server's lock holder.
#[derive(Debug, Default)]
pub(super) struct Board {
    active: Mutex<Vec<Option<String>>>,
    /// Bumped on every change.
    pub generation: AtomicU64,
}

impl Board {
    pub fn new(nodes: usize) -> Self {
        Board {
            active: Mutex::new(vec![None; nodes]),
            generation: AtomicU64::new(0),
        }
    }

    pub fn set(&self, node: usize, session: Option<String>) {
        let mut a = self.active.lock().unwrap_or_else(|e| e.into_inner());
        a[node] = session;
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// The sessions of the nodes that believe they are active.
    pub fn believers(&self) -> Vec<String> {
        let a = self.active.lock().unwrap_or_else(|e| e.into_inner());
        a.iter().flatten().cloned().collect()
    }
}

/// The sampled read-back's tallies.
#[derive(Debug, Default)]
pub(super) struct ReadBack {
    pub sampled: Mutex<HashSet<u64>>,
    pub ok: AtomicU64,
    pub lost: AtomicU64,
    pub changed: AtomicU64,
    pub unread: AtomicU64,
}

/// A burst and how far it got.
#[derive(Debug)]
pub(super) struct BurstState {
    pub at: Duration,
    pub tokens: u32,
    pub fired: AtomicBool,
    pub created: AtomicU64,
    pub done_at: Mutex<Option<Duration>>,
    /// Creates fired but not yet started (the backlog was full).
    pub unspawned: AtomicU64,
}

impl BurstState {
    /// Takes up to `n` of the creates not yet started.
    pub fn take(&self, n: u64) -> u64 {
        let mut got = 0;
        let _ = self
            .unspawned
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                got = left.min(n);
                Some(left - got)
            });
        got
    }
}

/// What the nodes of a run share.
pub(super) struct Shared {
    pub cfg: VaultConfig,
    pub path: String,
    pub lock_key: String,
    pub session_name: String,
    pub client: KvClient,
    pub metrics: Metrics,
    pub ids: Ids,
    pub registry: Registry,
    pub board: Board,
    pub read_back: ReadBack,
    pub bursts: Vec<BurstState>,
    pub next_token: AtomicU64,
    pub started: Instant,
    /// The last active node, when it stepped down (for the handover).
    pub last: Mutex<(Option<usize>, Option<Instant>)>,
    pub handovers: Mutex<Vec<f64>>,
    pub first_active: Mutex<Option<f64>>,
    /// A node already stopped at `stop_active_at` (or killed).
    pub stopped_one: AtomicBool,
    /// Every session the nodes created.
    pub sessions: Mutex<HashSet<String>>,
    /// Sessions of killed nodes (left to expire).
    pub dead: Mutex<HashSet<String>>,
}

impl Shared {
    /// Whether `id` is the session of a killed node.
    pub fn dead(&self, id: &str) -> bool {
        let d = self.dead.lock().unwrap_or_else(|e| e.into_inner());
        d.contains(id)
    }

    /// Whether `id` is a session one of the nodes created.
    pub fn sessions_ever(&self, id: &str) -> bool {
        let s = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        s.contains(id)
    }
}
