//! The HA lock as a Vault server holds it: its own session (`Vault Lock`,
//! the TTL, Consul's default lock-delay), renewed every TTL/2 and
//! destroyed when the node lets go; the wait (`GET` the key, blocking on
//! its index while another session holds it; `?acquire=`; refused with no
//! holder = lock-delay: wait [`super::LOCK_RETRY`]); and the monitor of a
//! held lock (consistent blocking reads until the key is no longer ours).

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::client::LOCK_FLAGS;
use super::shared::Shared;
use super::{LOCK_RETRY, names};

/// Wait after a failed lock call before the next (Vault's
/// `lockRetryInterval`).
const ERROR_RETRY: Duration = Duration::from_secs(10);
/// A blocking read that came back sooner than this, at the index it
/// waited on, did not block: the next one is paced.
const TOO_FAST: Duration = Duration::from_millis(50);
/// The pace of reads that did not block.
const PACE: Duration = Duration::from_secs(1);
/// The monitor's reads wait the server's longest (no `wait` given:
/// Consul's `default_query_time`, 5 minutes).
pub const MONITOR_WAIT: Duration = Duration::from_secs(300);
/// Failed monitor reads ridden out (`MonitorRetries` of Vault's lock).
const MONITOR_RETRIES: u32 = 5;
/// Between them (`DefaultMonitorRetryTime`).
const MONITOR_RETRY: Duration = Duration::from_secs(2);

/// A session of one node: renewed until `done`, then destroyed;
/// `lost` fires when a renewal finds it gone.
pub(super) struct Session {
    pub id: String,
    pub lost: CancellationToken,
    done: CancellationToken,
    renewer: JoinHandle<()>,
}

impl Session {
    /// Stops the renewals and leaves the session to expire (a crash).
    pub fn abandon(self) {
        self.renewer.abort();
    }

    /// Stops the renewals and destroys the session (bounded).
    pub async fn close(self) {
        self.done.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(15), self.renewer).await;
    }
}

/// Sleeps `d` unless `stop` fires first; false when stopped.
pub(super) async fn pause(d: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => true,
        _ = stop.cancelled() => false,
    }
}

/// Creates the node's session (retried until `stop`).
pub(super) async fn session(sh: &Arc<Shared>, stop: &CancellationToken) -> Option<Session> {
    let id = loop {
        match sh
            .client
            .session_create(&sh.session_name, sh.cfg.session_ttl)
            .await
        {
            Ok(id) => {
                let mut all = sh.sessions.lock().unwrap_or_else(|e| e.into_inner());
                all.insert(id.clone());
                break id;
            }
            Err(r) => {
                sh.metrics.error_with(r.kind, r.words.as_deref());
                if !pause(ERROR_RETRY, stop).await {
                    return None;
                }
            }
        }
    };
    let (lost, done) = (CancellationToken::new(), CancellationToken::new());
    let (sh2, id2, lost2, done2) = (sh.clone(), id.clone(), lost.clone(), done.clone());
    let renewer = tokio::spawn(async move {
        let every = sh2.cfg.session_ttl / 2;
        loop {
            if !pause(every, &done2).await {
                break;
            }
            if let Err(r) = sh2.client.session_renew(&id2).await {
                sh2.metrics.error_with(r.kind, r.words.as_deref());
                if r.kind == "http_404" {
                    lost2.cancel();
                    return;
                }
            }
        }
        if let Err(r) = sh2.client.session_destroy(&id2).await {
            sh2.metrics.error_with(r.kind, r.words.as_deref());
        }
    });
    Some(Session {
        id,
        lost,
        done,
        renewer,
    })
}

/// Waits for the lock with `session` until it is held (`true`) or `stop`
/// or the session's loss (`false`).
pub(super) async fn acquire(
    sh: &Arc<Shared>,
    session: &Session,
    value: &[u8],
    stop: &CancellationToken,
) -> bool {
    let acquire_lat = sh.metrics.latency(names::LOCK_ACQUIRE);
    let mut wait_index = 0u64;
    loop {
        if stop.is_cancelled() || session.lost.is_cancelled() {
            return false;
        }
        let asked = Instant::now();
        let block = (wait_index > 0).then_some((wait_index, sh.cfg.lock_wait));
        let read = tokio::select! {
            r = sh.client.get(&sh.lock_key, false, block) => r,
            _ = stop.cancelled() => return false,
            _ = session.lost.cancelled() => return false,
        };
        let (entry, index) = match read {
            Ok(x) => x,
            Err(r) => {
                sh.metrics.error_with(r.kind, r.words.as_deref());
                wait_index = 0;
                if !pause(ERROR_RETRY, stop).await {
                    return false;
                }
                continue;
            }
        };
        if let Some(e) = &entry {
            if e.flags != LOCK_FLAGS {
                sh.metrics.error_with(
                    "vault_lock_conflict",
                    Some(&format!(
                        "{}: Existing key does not match lock use (flags {})",
                        sh.lock_key, e.flags
                    )),
                );
                if !pause(LOCK_RETRY, stop).await {
                    return false;
                }
                continue;
            }
            if e.session.as_deref() == Some(session.id.as_str()) {
                return true;
            }
            if e.session.is_some() {
                wait_index = next_index(sh, wait_index, index, asked.elapsed(), stop).await;
                continue;
            }
        }
        let t = Instant::now();
        let got = sh
            .client
            .lock_op(&sh.lock_key, "acquire", &session.id, value)
            .await;
        sh.metrics.record(acquire_lat, 0, t.elapsed());
        match got {
            Ok(true) => return true,
            Ok(false) => {
                // Held by another again (wait on it), or no holder: a
                // lock-delay is in effect, a timed wait.
                match sh.client.get(&sh.lock_key, false, None).await {
                    Ok((Some(e), idx)) if e.session.is_some() => wait_index = idx,
                    _ => {
                        wait_index = 0;
                        if !pause(LOCK_RETRY, stop).await {
                            return false;
                        }
                    }
                }
            }
            Err(r) => {
                sh.metrics.error_with(r.kind, r.words.as_deref());
                if !pause(ERROR_RETRY, stop).await {
                    return false;
                }
            }
        }
    }
}

/// The index to wait on next: the answer's, unless it went backwards or
/// the read did not block (then paced, from 0).
async fn next_index(
    sh: &Shared,
    waited: u64,
    got: u64,
    took: Duration,
    stop: &CancellationToken,
) -> u64 {
    let backwards = got < waited;
    let not_blocking = waited > 0 && got == waited && took < TOO_FAST;
    if backwards || not_blocking || got == 0 {
        sh.metrics.error_with(
            "vault_index_reset",
            Some(&format!(
                "{}: waited at index {waited}, answered index {got} after {} ms",
                sh.lock_key,
                took.as_millis()
            )),
        );
        pause(PACE, stop).await;
        return if backwards || got == 0 { 0 } else { got };
    }
    got
}

/// Watches a held lock: returns when the key is no longer held by
/// `session` (or reads failed past the retries), or at `stop`.
pub(super) async fn monitor(sh: &Arc<Shared>, session: &str, stop: &CancellationToken) {
    let mut index = 0u64;
    let mut retries = MONITOR_RETRIES;
    loop {
        let asked = Instant::now();
        let block = (index > 0).then_some((index, MONITOR_WAIT));
        let read = tokio::select! {
            r = sh.client.get(&sh.lock_key, true, block) => r,
            _ = stop.cancelled() => return,
        };
        match read {
            Ok((Some(e), idx)) if e.session.as_deref() == Some(session) => {
                retries = MONITOR_RETRIES;
                index = next_index(sh, index, idx, asked.elapsed(), stop).await;
            }
            Ok(_) => return,
            Err(r) => {
                sh.metrics.error_with(r.kind, r.words.as_deref());
                // Consul's lock rides out server errors (500s) only.
                let server_error = matches!(
                    r.kind,
                    "http_5xx" | "no_cluster_leader" | "server_shutting_down"
                );
                if retries == 0 || !server_error {
                    return;
                }
                retries -= 1;
                index = 0;
                if !pause(MONITOR_RETRY, stop).await {
                    return;
                }
            }
        }
    }
}
