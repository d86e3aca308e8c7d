//! One simulated Vault server: standby (waits for the lock, reads the
//! leader's value every [`super::LEADER_CHECK`]), then active (advertises
//! itself, restores the leases from storage, creates, renews and revokes
//! tokens through its `max_parallel` permit pool, every write fenced by a
//! session check), until it loses the lock, is stopped, or the run ends.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_sim_metrics::LatencyId;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::client::TxnOp;
use super::lock::{self, Session};
use super::shared::Shared;
use super::tokens::{self, what};

/// Most due renewals or revocations started per tick.
const DUE_PER_TICK: usize = 2_000;
/// Most token operations of a term waiting for a permit at once.
const MAX_BACKLOG: usize = 50_000;
/// Handovers kept for the summary (the count is in the counters).
const MAX_HANDOVERS: usize = 100;
/// The active node's scheduling tick.
const TICK: Duration = Duration::from_millis(10);
/// Longest wait for a term's calls in flight once it ends.
const DRAIN: Duration = Duration::from_secs(5);
/// Vault's core entries a node reads as it becomes active (mounts,
/// auth, audit, policies' index, keyring).
const CORE_READS: &[&str] = &[
    "core/keyring",
    "core/mounts",
    "core/auth",
    "core/audit",
    "core/local-mounts",
    "core/local-auth",
];

/// How an active term ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// The lock was lost, or the run ended.
    Lost,
    /// Stepped down and stopped (`stop_active_at`).
    Stopped,
    /// Killed (`kill_active_at`): nothing released, nothing destroyed.
    Killed,
}

/// One active term: the node's session, permit pool and cache.
struct Term {
    sh: Arc<Shared>,
    session: String,
    permits: Semaphore,
    /// Tokens whose entries this node has in its cache (written or read
    /// in this term): their reads do not reach Consul.
    cache: Mutex<HashSet<u64>>,
    /// Fires when the lock is lost (monitor, renewal, fenced write).
    lost: CancellationToken,
}

/// Runs node `n` until `end` (or until it is stopped as the active node).
pub(super) async fn run(sh: Arc<Shared>, n: usize, end: CancellationToken) {
    let uuid = format!("{:032x}", fastrand::u128(..));
    let uuid = format!(
        "{}-{}-{}-{}-{}",
        &uuid[..8],
        &uuid[8..12],
        &uuid[12..16],
        &uuid[16..20],
        &uuid[20..]
    );
    loop {
        let Some(session) = lock::session(&sh, &end).await else {
            return;
        };
        let standby = CancellationToken::new();
        let poll = tokio::spawn(leader_checks(sh.clone(), standby.clone()));
        let held = lock::acquire(&sh, &session, uuid.as_bytes(), &end).await;
        if held {
            // Believes itself active as soon as the server said so.
            sh.board.set(n, Some(session.id.clone()));
        }
        standby.cancel();
        poll.abort();
        if !held {
            session.close().await;
            return;
        }
        let ended = active(&sh, n, &uuid, &session, &end).await;
        if ended == Ended::Killed {
            // A crash: the session is left to expire (TTL), the lock to
            // free then, after the server's lock-delay.
            let mut dead = sh.dead.lock().unwrap_or_else(|e| e.into_inner());
            dead.insert(session.id.clone());
            drop(dead);
            session.abandon();
            return;
        }
        // Vault lets go: release the key, stop renewing, destroy.
        if let Err(r) = sh
            .client
            .lock_op(&sh.lock_key, "release", &session.id, uuid.as_bytes())
            .await
        {
            sh.metrics.error_with(r.kind, r.words.as_deref());
        }
        session.close().await;
        if ended == Ended::Stopped || end.is_cancelled() {
            return;
        }
        // Simplified: a node that lost the lock waits before competing
        // again, so a server refusing every write cannot make the nodes
        // trade the lock thousands of times a second.
        if !lock::pause(super::LOCK_RETRY, &end).await {
            return;
        }
    }
}

/// What a standby of Vault 1.18.3 also read every 10 s (each answered
/// 404 on a healthy cluster): the replication poison pills and the
/// upgrade marker.
const STANDBY_POLLED: [&str; 3] = ["core/poison-pill", "core/poison-pill-dr", "core/upgrade/1"];

/// A standby's periodic read of the lock's value, and of the leader's
/// advertisement when the value changes; every fourth time
/// ([`STANDBY_POLLED`]) its 10 s reads too.
async fn leader_checks(sh: Arc<Shared>, stop: CancellationToken) {
    let mut leader: Option<Vec<u8>> = None;
    let mut ticks = 0u64;
    while lock::pause(super::LEADER_CHECK, &stop).await {
        ticks += 1;
        if ticks.is_multiple_of(4) {
            for key in STANDBY_POLLED {
                let t = Instant::now();
                if let Err(r) = sh
                    .client
                    .get(&format!("{}{key}", sh.path), false, None)
                    .await
                {
                    sh.metrics.error_with(r.kind, r.words.as_deref());
                }
                count_read(&sh, sh.ids.get, t);
            }
        }
        let t = Instant::now();
        let r = sh.client.get(&sh.lock_key, false, None).await;
        count_read(&sh, sh.ids.get, t);
        match r {
            Ok((Some(e), _)) if e.session.is_some() && leader.as_ref() != Some(&e.value) => {
                let key = format!(
                    "{}core/leader/{}",
                    sh.path,
                    String::from_utf8_lossy(&e.value)
                );
                let t = Instant::now();
                if let Err(r) = sh.client.get(&key, false, None).await {
                    sh.metrics.error_with(r.kind, r.words.as_deref());
                }
                count_read(&sh, sh.ids.get, t);
                leader = Some(e.value);
            }
            Ok(_) => {}
            Err(r) => sh.metrics.error_with(r.kind, r.words.as_deref()),
        }
    }
}

fn count_read(sh: &Shared, lat: LatencyId, t: Instant) {
    sh.metrics.incr(sh.ids.ops);
    sh.metrics.record(lat, 0, t.elapsed());
}

/// One active term, and how it ended.
async fn active(
    sh: &Arc<Shared>,
    n: usize,
    uuid: &str,
    session: &Session,
    end: &CancellationToken,
) -> Ended {
    let now = Instant::now();
    sh.metrics.incr(sh.ids.acquisitions);
    {
        let (last, since) = *sh.last.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|l| l != n) {
            sh.metrics.incr(sh.ids.changes);
        }
        if let Some(since) = since {
            let gap = now.saturating_duration_since(since).as_secs_f64();
            let mut h = sh.handovers.lock().unwrap_or_else(|e| e.into_inner());
            if h.len() < MAX_HANDOVERS {
                h.push(gap);
            }
        }
        let mut first = sh.first_active.lock().unwrap_or_else(|e| e.into_inner());
        first.get_or_insert(now.duration_since(sh.started).as_secs_f64());
    }
    let term = Arc::new(Term {
        sh: sh.clone(),
        session: session.id.clone(),
        permits: Semaphore::new(sh.cfg.max_parallel),
        cache: Mutex::default(),
        lost: session.lost.child_token(),
    });
    let (t2, sid) = (term.clone(), session.id.clone());
    let monitor = tokio::spawn(async move {
        lock::monitor(&t2.sh, &sid, &t2.lost).await;
        t2.lost.cancel();
    });
    let leader_key = format!("{}core/leader/{uuid}", sh.path);
    let advert = tokens::value(n as u64, 9, 0, tokens::LEADER_BYTES);
    term.put(&leader_key, &advert, Instant::now()).await;
    term.takeover().await;
    let ended = term.work(end).await;
    // Believes itself active no longer, then cleans up as Vault steps down
    // (a killed node does nothing more).
    sh.board.set(n, None);
    *sh.last.lock().unwrap_or_else(|e| e.into_inner()) = (Some(n), Some(Instant::now()));
    term.lost.cancel();
    let _ = monitor.await;
    if ended == Ended::Killed {
        return ended;
    }
    let t = Instant::now();
    let r = sh.client.txn(&[TxnOp::Delete { key: &leader_key }]).await;
    term.wrote(sh.ids.delete, t, t, r.map_err(|(r, _)| (r, false)));
    ended
}

impl Term {
    /// A Put: `check-session` + `set` in one `/v1/txn`, timed from
    /// `start` (the operation's intended start, permit wait included).
    async fn put(&self, key: &str, value: &[u8], start: Instant) -> bool {
        self.fenced(TxnOp::Set { key, value }, self.sh.ids.put, start)
            .await
    }

    /// A Delete, fenced as a Put.
    async fn delete(&self, key: &str, start: Instant) -> bool {
        self.fenced(TxnOp::Delete { key }, self.sh.ids.delete, start)
            .await
    }

    /// One write behind the lock's `check-session`, under a permit.
    async fn fenced(&self, op: TxnOp<'_>, lat: LatencyId, start: Instant) -> bool {
        let _p = self.permits.acquire().await;
        let t = Instant::now();
        let check = TxnOp::CheckSession {
            key: &self.sh.lock_key,
            session: &self.session,
        };
        let r = self.sh.client.txn(&[check, op]).await;
        self.wrote(lat, start, t, r)
    }

    fn wrote(
        &self,
        lat: LatencyId,
        start: Instant,
        sent: Instant,
        r: Result<(), (crate::http::Refusal, bool)>,
    ) -> bool {
        let m = &self.sh.metrics;
        m.record(self.sh.ids.txn, 0, sent.elapsed());
        m.record(lat, 0, start.elapsed());
        m.incr(self.sh.ids.ops);
        m.incr(self.sh.ids.writes);
        match r {
            Ok(()) => true,
            Err((r, fenced)) => {
                m.error_with(r.kind, r.words.as_deref());
                if fenced {
                    // The session check failed: the lock is not ours.
                    m.incr(self.sh.ids.fenced);
                    self.lost.cancel();
                }
                false
            }
        }
    }

    /// A Get through the permit pool.
    async fn get(&self, key: &str) -> Option<Vec<u8>> {
        let t = Instant::now();
        let _p = self.permits.acquire().await;
        let r = self.sh.client.get(key, false, None).await;
        count_read(&self.sh, self.sh.ids.get, t);
        match r {
            Ok((e, _)) => e.map(|e| e.value),
            Err(r) => {
                self.sh.metrics.error_with(r.kind, r.words.as_deref());
                None
            }
        }
    }

    /// A List through the permit pool.
    async fn list(&self, prefix: &str) -> Vec<String> {
        let t = Instant::now();
        let _p = self.permits.acquire().await;
        let r = self.sh.client.keys(prefix).await;
        count_read(&self.sh, self.sh.ids.list, t);
        r.unwrap_or_else(|r| {
            self.sh.metrics.error_with(r.kind, r.words.as_deref());
            Vec::new()
        })
    }

    fn cached(&self, id: u64) -> bool {
        !self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id)
    }

    /// Becoming active: the core entries read, the leases listed level by
    /// level under `sys/expire/id/` and each read (as Vault's restore, by
    /// [`super::RESTORE_WORKERS`]); the live tokens are then cached.
    async fn takeover(self: &Arc<Self>) {
        let path = &self.sh.path;
        for k in CORE_READS {
            self.get(&format!("{path}{k}")).await;
        }
        let mut folders = vec![format!("{path}sys/expire/id/")];
        let mut leaves = Vec::new();
        while let Some(f) = folders.pop() {
            if self.lost.is_cancelled() {
                return;
            }
            for k in self.list(&f).await {
                if k.ends_with('/') {
                    folders.push(k);
                } else {
                    leaves.push(k);
                }
            }
        }
        let leaves = Arc::new(Mutex::new(leaves));
        let mut workers = JoinSet::new();
        for _ in 0..super::RESTORE_WORKERS {
            let (term, leaves) = (self.clone(), leaves.clone());
            workers.spawn(async move {
                loop {
                    let next = leaves.lock().unwrap_or_else(|e| e.into_inner()).pop();
                    let Some(k) = next else { break };
                    if term.lost.is_cancelled() {
                        break;
                    }
                    term.get(&k).await;
                }
            });
        }
        while workers.join_next().await.is_some() {}
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.extend(self.sh.registry.ids());
    }

    /// Schedules token creates, renewals and revocations until the lock is
    /// lost, the run ends or the node is stopped or killed.
    async fn work(self: &Arc<Self>, end: &CancellationToken) -> Ended {
        let sh = &self.sh;
        let began = Instant::now();
        let mut steady: u64 = 0;
        let mut tasks = JoinSet::new();
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let ended = loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = self.lost.cancelled() => break Ended::Lost,
                _ = end.cancelled() => break Ended::Lost,
            }
            let now = Instant::now();
            let run_t = now.duration_since(sh.started);
            let stop = [
                (sh.cfg.stop_active_at, Ended::Stopped),
                (sh.cfg.kill_active_at, Ended::Killed),
            ]
            .into_iter()
            .find(|(at, _)| at.is_some_and(|at| run_t >= at));
            if let Some((_, how)) = stop
                && !sh.stopped_one.swap(true, Ordering::SeqCst)
            {
                break how;
            }
            while tasks.try_join_next().is_some() {}
            // Bounded: at most MAX_BACKLOG operations wait for permits;
            // the rest wait their turn here, timed from their slot.
            let room = |t: &JoinSet<()>| MAX_BACKLOG.saturating_sub(t.len());
            let due = sh
                .registry
                .due(now, sh.cfg.token_ttl, DUE_PER_TICK.min(room(&tasks) / 2));
            for id in due.renew.into_iter().filter(|_| sh.cfg.renew) {
                tasks.spawn(self.clone().renew(id, now));
            }
            for id in due.revoke {
                tasks.spawn(self.clone().revoke(id, now));
            }
            for (i, b) in sh.bursts.iter().enumerate() {
                if run_t >= b.at && !b.fired.swap(true, Ordering::SeqCst) {
                    b.unspawned.store(u64::from(b.tokens), Ordering::SeqCst);
                }
                let take = b.take(room(&tasks) as u64);
                for _ in 0..take {
                    tasks.spawn(self.clone().create(sh.started + b.at, Some(i)));
                }
            }
            if sh.cfg.tokens_per_s > 0.0 {
                let due = (now.duration_since(began).as_secs_f64() * sh.cfg.tokens_per_s) as u64;
                while steady < due && room(&tasks) > 0 {
                    let intended =
                        began + Duration::from_secs_f64(steady as f64 / sh.cfg.tokens_per_s);
                    tasks.spawn(self.clone().create(intended, None));
                    steady += 1;
                }
            }
        };
        // Calls in flight finish (a lost lock fences them), bounded.
        let _ =
            tokio::time::timeout(DRAIN, async { while tasks.join_next().await.is_some() {} }).await;
        tasks.abort_all();
        ended
    }

    /// A token create: its four entries written, in the order a real Vault
    /// 1.18.3 wrote them (accessor, parent index, entry, lease).
    async fn create(self: Arc<Self>, intended: Instant, burst: Option<usize>) {
        let sh = &self.sh;
        let id = sh.next_token.fetch_add(1, Ordering::Relaxed);
        let k = tokens::keys(&sh.path, id);
        let start = Instant::now();
        let steps = [
            (&k.accessor, what::ACCESSOR, tokens::ACCESSOR_BYTES),
            (&k.parent, what::PARENT, tokens::PARENT_BYTES),
            (&k.entry, what::ENTRY, tokens::TOKEN_ENTRY_BYTES),
            (&k.lease, what::LEASE, tokens::LEASE_BYTES),
        ];
        for (key, w, len) in steps {
            if !self.put(key, &tokens::value(id, w, 0, len), start).await {
                return;
            }
        }
        self.cached(id);
        sh.registry.add(id, Instant::now());
        sh.metrics.incr(sh.ids.created);
        sh.metrics.record(sh.ids.create, 0, intended.elapsed());
        if id.is_multiple_of(u64::from(sh.cfg.read_back_every)) {
            let mut s = sh
                .read_back
                .sampled
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            s.insert(id);
        }
        if let Some(b) = burst.and_then(|i| sh.bursts.get(i)) {
            let done = b.created.fetch_add(1, Ordering::SeqCst) + 1;
            if done == u64::from(b.tokens) {
                let at = Instant::now().duration_since(sh.started);
                *b.done_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(at);
            }
        }
    }

    /// A renewal: the lease read (leases are read from storage every
    /// time, Vault's cache notwithstanding) and written again.
    async fn renew(self: Arc<Self>, id: u64, start: Instant) {
        let k = tokens::keys(&self.sh.path, id);
        self.get(&k.lease).await;
        let v = tokens::value(id, what::LEASE, 1, tokens::LEASE_BYTES);
        if self.put(&k.lease, &v, start).await {
            self.sh.metrics.incr(self.sh.ids.renewed);
        }
    }

    /// A revocation at the TTL: the sampled read-back, then what a real
    /// Vault 1.18.3 sent at an expiry: the lease read twice, the entry
    /// marked revoked, three folders listed (children, cubbyhole, leases),
    /// the parent index, accessor and entry deleted, and the lease deleted
    /// twice (the token store and the expiration manager each delete it).
    async fn revoke(self: Arc<Self>, id: u64, start: Instant) {
        let sh = &self.sh;
        let k = tokens::keys(&sh.path, id);
        let sampled = sh
            .read_back
            .sampled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        if sampled {
            self.read_back(id, &k.entry).await;
        }
        self.get(&k.lease).await;
        self.get(&k.lease).await;
        if !self.cached(id) {
            self.get(&k.entry).await;
        }
        let tainted = tokens::value(id, what::ENTRY, 2, tokens::TOKEN_ENTRY_BYTES);
        if !self.put(&k.entry, &tainted, start).await {
            return;
        }
        for folder in &k.listed {
            self.list(folder).await;
        }
        for key in [&k.parent, &k.accessor, &k.entry, &k.lease, &k.lease] {
            if !self.delete(key, start).await {
                return;
            }
        }
        sh.metrics.incr(sh.ids.revoked);
    }

    /// Reads a sampled token's entry back (consistent, outside Vault's
    /// traffic) and compares it with what was written.
    async fn read_back(&self, id: u64, key: &str) {
        let rb = &self.sh.read_back;
        let want = tokens::value(id, what::ENTRY, 0, tokens::TOKEN_ENTRY_BYTES);
        match self.sh.client.get(key, true, None).await {
            Ok((Some(e), _)) if e.value == want => rb.ok.fetch_add(1, Ordering::Relaxed),
            Ok((Some(e), _)) => {
                self.sh.metrics.error_with(
                    "vault_read_back",
                    Some(&format!(
                        "{key}: changed ({} bytes read, {} written)",
                        e.value.len(),
                        want.len()
                    )),
                );
                rb.changed.fetch_add(1, Ordering::Relaxed)
            }
            Ok((None, _)) => {
                self.sh
                    .metrics
                    .error_with("vault_read_back", Some(&format!("{key}: lost (404)")));
                rb.lost.fetch_add(1, Ordering::Relaxed)
            }
            Err(r) => {
                self.sh.metrics.error_with(r.kind, r.words.as_deref());
                rb.unread.fetch_add(1, Ordering::Relaxed)
            }
        };
    }
}
