//! Runs a run's Vault servers ([`VaultRunner`]): the nodes, the checker
//! that reads the lock key from the server every `check_every` and
//! compares its holder with the node that believes it is active, and at
//! the end the removal of every key under the path and every lock session
//! of the run, verified; all of it into a [`VaultSummary`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use agent_sim_metrics::Metrics;
use agent_sim_metrics::vault::{BurstSummary, LockCheck, ReadBackSummary, VaultCleanup};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::client::KvClient;
use super::node;
use super::shared::{Board, BurstState, Ids, ReadBack, Shared};
use super::tokens::Registry;
use super::{VaultConfig, VaultSummary, session_name};

/// Starts a run's Vault servers and reports them.
pub struct VaultRunner {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for VaultRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VaultRunner")
            .field("path", &self.shared.path)
            .finish()
    }
}

impl VaultRunner {
    /// Vault servers of `cfg` storing under `path` through `client`.
    pub fn new(cfg: VaultConfig, path: String, client: KvClient, metrics: Metrics) -> Self {
        let bursts = cfg
            .bursts
            .iter()
            .map(|b| BurstState {
                at: b.at,
                tokens: b.tokens,
                fired: AtomicBool::new(false),
                created: AtomicU64::new(0),
                done_at: Mutex::new(None),
                unspawned: AtomicU64::new(0),
            })
            .collect();
        let ids = Ids::resolve(&metrics);
        VaultRunner {
            shared: Arc::new(Shared {
                lock_key: format!("{path}core/lock"),
                session_name: session_name(&path),
                board: Board::new(cfg.nodes as usize),
                cfg,
                path,
                client,
                metrics,
                ids,
                registry: Registry::default(),
                read_back: ReadBack::default(),
                bursts,
                next_token: AtomicU64::new(1),
                started: Instant::now(),
                last: Mutex::new((None, None)),
                handovers: Mutex::default(),
                first_active: Mutex::default(),
                stopped_one: AtomicBool::new(false),
                sessions: Mutex::default(),
                dead: Mutex::default(),
            }),
        }
    }

    /// Runs the nodes and the checker until `end`, then removes what they
    /// wrote and reports.
    pub async fn run(self, end: CancellationToken) -> VaultSummary {
        let sh = self.shared;
        let mut nodes = tokio::task::JoinSet::new();
        for n in 0..sh.cfg.nodes as usize {
            nodes.spawn(node::run(sh.clone(), n, end.clone()));
        }
        let checks = tokio::spawn(check(sh.clone(), end.clone()));
        while nodes.join_next().await.is_some() {}
        let lock = checks.await.unwrap_or_default();
        let cleanup = remove_all(&sh.client, &sh.path, &sh.session_name).await;
        if cleanup.keys_left > 0 || cleanup.sessions_left > 0 || cleanup.error.is_some() {
            sh.metrics.error_with(
                "vault_cleanup",
                Some(&format!(
                    "{} keys under {} and {} sessions left{}",
                    cleanup.keys_left,
                    sh.path,
                    cleanup.sessions_left,
                    cleanup
                        .error
                        .as_deref()
                        .map(|e| format!(" ({e})"))
                        .unwrap_or_default()
                )),
            );
        }
        summary(&sh, lock, cleanup)
    }
}

fn summary(sh: &Shared, lock: LockCheck, cleanup: VaultCleanup) -> VaultSummary {
    let m = &sh.metrics;
    let get = |id| m.get(id);
    let first_active_s = *sh.first_active.lock().unwrap_or_else(|e| e.into_inner());
    if first_active_s.is_none() {
        m.error_with(
            "vault_never_active",
            Some(&format!(
                "{}: no simulated node acquired it within the run",
                sh.lock_key
            )),
        );
    }
    let rb = &sh.read_back;
    let pending = rb.sampled.lock().unwrap_or_else(|e| e.into_inner()).len() as u64;
    VaultSummary {
        nodes: sh.cfg.nodes,
        path: sh.path.clone(),
        tokens_per_s: sh.cfg.tokens_per_s,
        token_ttl_s: sh.cfg.token_ttl.as_secs_f64(),
        tokens_created: get(sh.ids.created),
        tokens_renewed: get(sh.ids.renewed),
        tokens_revoked: get(sh.ids.revoked),
        tokens_live_at_end: sh.registry.len() as u64,
        kv_ops: get(sh.ids.ops),
        kv_writes: get(sh.ids.writes),
        lock_acquisitions: get(sh.ids.acquisitions),
        leadership_changes: get(sh.ids.changes),
        fenced_writes: get(sh.ids.fenced),
        first_active_s,
        handovers_s: sh
            .handovers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone(),
        lock_check: lock,
        read_back: ReadBackSummary {
            ok: rb.ok.load(Ordering::Relaxed),
            lost: rb.lost.load(Ordering::Relaxed),
            changed: rb.changed.load(Ordering::Relaxed),
            unread: rb.unread.load(Ordering::Relaxed),
            pending_at_end: pending,
        },
        bursts: sh
            .bursts
            .iter()
            .map(|b| BurstSummary {
                at_s: b.at.as_secs_f64(),
                tokens: b.tokens,
                created: b.created.load(Ordering::SeqCst),
                done_s: b
                    .done_at
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .map(|d| d.as_secs_f64()),
            })
            .collect(),
        cleanup,
    }
}

/// Reads the lock key every `check_every` and compares its holder with
/// the nodes' beliefs (a change of belief during the read: in transition).
async fn check(sh: Arc<Shared>, end: CancellationToken) -> LockCheck {
    let mut c = LockCheck::default();
    let mut tick = tokio::time::interval(sh.cfg.check_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = end.cancelled() => return c,
        }
        let gen0 = sh.board.generation.load(Ordering::SeqCst);
        let before = sh.board.believers();
        let read = tokio::select! {
            r = sh.client.get(&sh.lock_key, true, None) => r,
            _ = end.cancelled() => return c,
        };
        let moved = sh.board.generation.load(Ordering::SeqCst) != gen0;
        let holder = match read {
            Ok((e, _)) => e.and_then(|e| e.session),
            Err(r) => {
                sh.metrics.error_with(r.kind, r.words.as_deref());
                c.unread += 1;
                continue;
            }
        };
        c.checks += 1;
        // A holder no node believes in is another's (a session of this
        // run not believing itself active is a mismatch only when a node
        // does believe).
        if before.len() > 1 {
            c.split_brain += 1;
            sh.metrics.error_with(
                "vault_split_brain",
                Some(&format!("{} nodes believed they were active", before.len())),
            );
        } else if moved {
            c.in_transition += 1;
        } else {
            match (before.first(), holder.as_deref()) {
                (Some(b), Some(h)) if b == h => c.agree += 1,
                (None, None) => c.none_held += 1,
                (None, Some(h)) if !sh.sessions_ever(h) => c.held_by_other += 1,
                (None, Some(h)) if sh.dead(h) => c.held_by_dead += 1,
                (b, h) if settles(&sh, gen0, &end).await => {
                    let _ = (b, h);
                    c.in_transition += 1;
                }
                (b, h) => {
                    c.mismatch += 1;
                    sh.metrics.error_with(
                        "vault_split_brain",
                        Some(&format!(
                            "the server's holder of {} is {:?}, the node believing it is \
                             active has {:?}",
                            sh.lock_key, h, b
                        )),
                    );
                }
            }
        }
    }
}

/// Whether the nodes' beliefs change within [`SETTLE`] of a read that
/// disagreed with them: the read fell between the server's answer to an
/// acquire (or a loss) and the node learning it.
async fn settles(sh: &Shared, gen0: u64, end: &CancellationToken) -> bool {
    let until = Instant::now() + SETTLE;
    while Instant::now() < until {
        if sh.board.generation.load(Ordering::SeqCst) != gen0 {
            return true;
        }
        if !super::lock::pause(std::time::Duration::from_millis(10), end).await {
            return true;
        }
    }
    false
}

/// How long a disagreement may last before it counts as a mismatch: the
/// round trip in which a node learns the server's answer (a monitor's
/// blocking read returns at once on a change).
const SETTLE: std::time::Duration = std::time::Duration::from_secs(1);

/// Removes every key under `path` and every session named for it, then
/// checks that none is left.
pub async fn remove_all(client: &KvClient, path: &str, session: &str) -> VaultCleanup {
    let mut out = VaultCleanup::default();
    let mut errors = Vec::new();
    match client.all_keys(path).await {
        Ok(k) => out.keys_removed = k.len() as u64,
        Err(r) => errors.push(r.words.unwrap_or_else(|| r.kind.to_owned())),
    }
    if let Err(r) = client.delete_tree(path).await {
        errors.push(r.words.unwrap_or_else(|| r.kind.to_owned()));
    }
    match client.session_list().await {
        Ok(list) => {
            for s in list.iter().filter(|s| s.name == session) {
                match client.session_destroy(&s.id).await {
                    Ok(()) => out.sessions_removed += 1,
                    Err(r) => errors.push(r.words.unwrap_or_else(|| r.kind.to_owned())),
                }
            }
        }
        Err(r) => errors.push(r.words.unwrap_or_else(|| r.kind.to_owned())),
    }
    match client.all_keys(path).await {
        Ok(k) => out.keys_left = k.len() as u64,
        Err(r) => errors.push(r.words.unwrap_or_else(|| r.kind.to_owned())),
    }
    match client.session_list().await {
        Ok(list) => out.sessions_left = list.iter().filter(|s| s.name == session).count() as u64,
        Err(r) => errors.push(r.words.unwrap_or_else(|| r.kind.to_owned())),
    }
    if !errors.is_empty() {
        out.error = Some(errors.join("; "));
    }
    out
}

/// `agent-sim cleanup`'s part: what a killed run with `prefix` left under
/// its Vault path (`path`, empty for the default) and its lock sessions.
pub async fn cleanup_path(
    client: &KvClient,
    path: &str,
    prefix: &str,
    dry_run: bool,
) -> VaultCleanup {
    let path = super::default_path(path, prefix);
    let name = session_name(&path);
    if !dry_run {
        return remove_all(client, &path, &name).await;
    }
    let mut out = VaultCleanup::default();
    match client.all_keys(&path).await {
        Ok(k) => out.keys_left = k.len() as u64,
        Err(r) => out.error = Some(r.words.unwrap_or_else(|| r.kind.to_owned())),
    }
    if let Ok(list) = client.session_list().await {
        out.sessions_left = list.iter().filter(|s| s.name == name).count() as u64;
    }
    out
}
