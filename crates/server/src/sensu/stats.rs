//! Counters of the Sensu endpoint: atomics updated by sessions and schedulers, and a
//! plain copy ([`SensuTargetSnapshot`]) for reports.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use serde::Serialize;

/// Live counters. All are totals since [`super::serve`] started, except
/// `sessions_active` (a gauge).
#[derive(Debug, Default)]
pub struct SensuTargetStats {
    /// Upgrades that completed with `101` (sessions started).
    pub upgrades_accepted: AtomicU64,
    /// Upgrades answered 404 or 401 (sum of the two below).
    pub upgrades_rejected: AtomicU64,
    /// Upgrades answered 404 (missing or unknown `Sensu-Namespace`).
    pub rejected_namespace: AtomicU64,
    /// Upgrades answered 401 (missing or wrong credentials).
    pub rejected_credentials: AtomicU64,
    /// Of `upgrades_accepted`, those let in by their password.
    pub accepted_password: AtomicU64,
    /// Of `upgrades_accepted`, those let in by a verified client
    /// certificate (no password check).
    pub accepted_certificate: AtomicU64,
    /// Password checks made with bcrypt (`password_cost` set), right or
    /// wrong.
    pub bcrypt_checks: AtomicU64,
    /// CPU time of those checks, in microseconds.
    pub bcrypt_cpu_us: AtomicU64,
    /// TLS handshakes that failed (`tls` set), whatever the cause.
    pub tls_handshake_errors: AtomicU64,
    /// Of those, the ones that refused the client's certificate (not
    /// signed by the agent CA, expired, ...).
    pub rejected_client_cert: AtomicU64,
    /// Connections that failed before a session started for another reason (not a
    /// WebSocket request, timeout, I/O error).
    pub handshake_errors: AtomicU64,
    /// Failed `accept` calls (e.g. out of file descriptors).
    pub accept_errors: AtomicU64,
    /// Sessions now open.
    pub sessions_active: AtomicI64,
    /// Sessions that ended on a protocol or I/O error (not a close or EOF).
    pub session_errors: AtomicU64,
    /// Valid keepalives (frame `keepalive`, or an `event` whose check is `keepalive`).
    pub keepalives_received: AtomicU64,
    /// Valid non-keepalive events.
    pub events_received: AtomicU64,
    /// Keepalives and events that failed validation (sum of `rejected_by_reason`).
    pub events_rejected: AtomicU64,
    /// `entity_config` frames sent (placeholder and updated).
    pub entity_configs_sent: AtomicU64,
    /// Check publications by the schedulers (one per check per interval).
    pub check_requests_published: AtomicU64,
    /// `check_request` frames written to sessions.
    pub check_requests_sent: AtomicU64,
    /// Valid events whose check name is a scheduled check.
    pub check_replies_received: AtomicU64,
    /// Of those, the ones whose `check.issued` equals the latest publication of that check.
    pub check_replies_current: AtomicU64,
    /// Frames that could not be used: no `type\n` prefix, unknown type, body that does
    /// not decode.
    pub frames_invalid: AtomicU64,
    /// WebSocket message payload bytes received (data messages only, without framing).
    pub bytes_received: AtomicU64,
    /// Validation failures by reason (as returned by `codec::validate_event`).
    rejected_by_reason: Mutex<BTreeMap<&'static str, u64>>,
}

/// A plain copy of [`SensuTargetStats`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SensuTargetSnapshot {
    pub upgrades_accepted: u64,
    pub upgrades_rejected: u64,
    pub rejected_namespace: u64,
    pub rejected_credentials: u64,
    /// Accepted upgrades by the way in: `password`, `certificate`.
    pub upgrades_accepted_by_auth: BTreeMap<String, u64>,
    pub bcrypt_checks: u64,
    pub bcrypt_cpu_us: u64,
    pub tls_handshake_errors: u64,
    pub rejected_client_cert: u64,
    pub handshake_errors: u64,
    pub accept_errors: u64,
    /// Clamped at 0.
    pub sessions_active: u64,
    pub session_errors: u64,
    pub keepalives_received: u64,
    pub events_received: u64,
    pub events_rejected: u64,
    pub entity_configs_sent: u64,
    pub check_requests_published: u64,
    pub check_requests_sent: u64,
    pub check_replies_received: u64,
    pub check_replies_current: u64,
    pub frames_invalid: u64,
    pub bytes_received: u64,
    /// Validation failures by reason, e.g. `"invalid_timestamp" → 3`.
    pub rejected_by_reason: BTreeMap<String, u64>,
}

impl SensuTargetSnapshot {
    /// The counts of two backends together.
    pub fn add(&self, o: &SensuTargetSnapshot) -> SensuTargetSnapshot {
        let sum = |a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>| {
            let mut out = a.clone();
            for (k, v) in b {
                *out.entry(k.clone()).or_insert(0) += v;
            }
            out
        };
        let rejected_by_reason = sum(&self.rejected_by_reason, &o.rejected_by_reason);
        SensuTargetSnapshot {
            upgrades_accepted: self.upgrades_accepted + o.upgrades_accepted,
            upgrades_rejected: self.upgrades_rejected + o.upgrades_rejected,
            rejected_namespace: self.rejected_namespace + o.rejected_namespace,
            rejected_credentials: self.rejected_credentials + o.rejected_credentials,
            upgrades_accepted_by_auth: sum(
                &self.upgrades_accepted_by_auth,
                &o.upgrades_accepted_by_auth,
            ),
            bcrypt_checks: self.bcrypt_checks + o.bcrypt_checks,
            bcrypt_cpu_us: self.bcrypt_cpu_us + o.bcrypt_cpu_us,
            tls_handshake_errors: self.tls_handshake_errors + o.tls_handshake_errors,
            rejected_client_cert: self.rejected_client_cert + o.rejected_client_cert,
            handshake_errors: self.handshake_errors + o.handshake_errors,
            accept_errors: self.accept_errors + o.accept_errors,
            sessions_active: self.sessions_active + o.sessions_active,
            session_errors: self.session_errors + o.session_errors,
            keepalives_received: self.keepalives_received + o.keepalives_received,
            events_received: self.events_received + o.events_received,
            events_rejected: self.events_rejected + o.events_rejected,
            entity_configs_sent: self.entity_configs_sent + o.entity_configs_sent,
            check_requests_published: self.check_requests_published + o.check_requests_published,
            check_requests_sent: self.check_requests_sent + o.check_requests_sent,
            check_replies_received: self.check_replies_received + o.check_replies_received,
            check_replies_current: self.check_replies_current + o.check_replies_current,
            frames_invalid: self.frames_invalid + o.frames_invalid,
            bytes_received: self.bytes_received + o.bytes_received,
            rejected_by_reason,
        }
    }
}

impl SensuTargetStats {
    /// Copies every counter (each one atomically, not all at one instant).
    pub fn snapshot(&self) -> SensuTargetSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        SensuTargetSnapshot {
            upgrades_accepted: get(&self.upgrades_accepted),
            upgrades_rejected: get(&self.upgrades_rejected),
            rejected_namespace: get(&self.rejected_namespace),
            rejected_credentials: get(&self.rejected_credentials),
            upgrades_accepted_by_auth: [
                ("password", &self.accepted_password),
                ("certificate", &self.accepted_certificate),
            ]
            .into_iter()
            .map(|(k, c)| (k.to_owned(), get(c)))
            .collect(),
            bcrypt_checks: get(&self.bcrypt_checks),
            bcrypt_cpu_us: get(&self.bcrypt_cpu_us),
            tls_handshake_errors: get(&self.tls_handshake_errors),
            rejected_client_cert: get(&self.rejected_client_cert),
            handshake_errors: get(&self.handshake_errors),
            accept_errors: get(&self.accept_errors),
            sessions_active: self.sessions_active.load(Ordering::Relaxed).max(0) as u64,
            session_errors: get(&self.session_errors),
            keepalives_received: get(&self.keepalives_received),
            events_received: get(&self.events_received),
            events_rejected: get(&self.events_rejected),
            entity_configs_sent: get(&self.entity_configs_sent),
            check_requests_published: get(&self.check_requests_published),
            check_requests_sent: get(&self.check_requests_sent),
            check_replies_received: get(&self.check_replies_received),
            check_replies_current: get(&self.check_replies_current),
            frames_invalid: get(&self.frames_invalid),
            bytes_received: get(&self.bytes_received),
            rejected_by_reason: self
                .rejected_by_reason
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .map(|(k, v)| ((*k).to_owned(), *v))
                .collect(),
        }
    }

    /// Counts one keepalive or event that failed validation.
    pub(super) fn reject(&self, reason: &'static str) {
        self.events_rejected.fetch_add(1, Ordering::Relaxed);
        *self
            .rejected_by_reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(reason)
            .or_insert(0) += 1;
    }
}

/// Adds 1 to a counter.
pub(super) fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Keeps `sessions_active` up while alive.
pub(super) struct ActiveGuard<'a>(&'a AtomicI64);

impl<'a> ActiveGuard<'a> {
    pub(super) fn new(gauge: &'a AtomicI64) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        Self(gauge)
    }
}

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_copies_counters_and_reasons() {
        let s = SensuTargetStats::default();
        inc(&s.keepalives_received);
        s.reject("invalid_timestamp");
        s.reject("invalid_timestamp");
        s.reject("invalid_id");
        {
            let _g = ActiveGuard::new(&s.sessions_active);
            assert_eq!(s.snapshot().sessions_active, 1);
        }
        let snap = s.snapshot();
        assert_eq!(snap.sessions_active, 0);
        assert_eq!(snap.keepalives_received, 1);
        assert_eq!(snap.events_rejected, 3);
        assert_eq!(snap.rejected_by_reason["invalid_timestamp"], 2);
        assert_eq!(snap.rejected_by_reason["invalid_id"], 1);
        let json = serde_json::to_value(&snap).unwrap();
        assert_eq!(json["rejected_by_reason"]["invalid_id"], 1);
    }
}
