//! An agent's leaf certificate, kept as a Consul 1.20 client agent keeps
//! its sidecars' (`agent/leafcert` over the agent cache's roots watch):
//! the roots watched by a blocking `ConnectCA.Roots` on a stream of its
//! own, a `ConnectCA.Sign` on the agent's call stream when the trust
//! domain is known, again in the renewal window, within a random 30 s of
//! a new active root, and on the servers' rate-limit answer by leafcert's
//! back-off. The agent's sidecars are all of one service, so they share
//! one certificate, as the agent's leaf cache keys it by service.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use super::ConsulAgent;
use super::link::{self, CallLine};
use crate::connect::schedule::{backoff_wait, rate_limited_retry, renew_in, rotation_delay};
use crate::connect::{authority_key_id, new_csr, spiffe_service_id};
use crate::http::Refusal;
use crate::modes::AgentWire;
use crate::rpc::connect_ca::{self, RATE_LIMITED, decode_roots, decode_sign};
use crate::rpc::mux::{CallError, Exchange, Mux, Reply, exchange};

/// When a sign whose answer never came is tried again (longer than a
/// call's timeout).
const UNANSWERED_SIGN: Duration = Duration::from_secs(30);

/// Largest roots answer read (a few roots with intermediates: ≈4 KiB each).
const MAX_ROOTS_ANSWER: usize = 1 << 20;

/// What an agent knows of the CA and its certificate.
#[derive(Debug, Default)]
pub(super) struct Leaf {
    /// The roots' index to block from (0: not fetched yet).
    roots_index: u64,
    trust_domain: String,
    /// The active root's signing key ID.
    active_key: Option<String>,
    roots_failures: u32,
    roots_retry_at: Option<Instant>,
    /// The key that signed the certificate held (`None`: none held).
    authority: Option<String>,
    /// When to sign next.
    due: Option<Instant>,
    /// Failed signs in a row (first certificate: leafcert's back-off).
    sign_failures: u32,
    /// Rate-limited renewals in a row, and when the first of them (or the
    /// rotation that asked for them) started.
    rate_limited: u32,
    refused_since: Option<Instant>,
    /// The run's rotation this agent's next certificate answers.
    rotation: Option<Instant>,
}

/// A sign's result: the certificate's authority and validity (Unix s).
pub(super) struct Signed {
    authority: Option<String>,
    valid_after: i64,
    valid_before: i64,
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

impl ConsulAgent {
    /// Whether this agent keeps a certificate: sidecars on a client
    /// agent's wire.
    pub(super) fn keeps_leaf(&self) -> bool {
        let cfg = &self.shared.cfg;
        cfg.sidecars && cfg.connect.leaf_certs && cfg.agent == AgentWire::Client
    }

    /// When the next sign is due, once the trust domain is known.
    pub(super) fn leaf_due(&self) -> Option<Instant> {
        let l = self.extra.as_ref().and_then(|e| e.leaf.as_ref())?;
        if l.trust_domain.is_empty() {
            return None;
        }
        l.due
    }

    /// Takes the due sign: its answer reschedules it; a sign whose answer
    /// never comes (the session ended under it) is tried again later.
    pub(super) fn take_leaf_due(&mut self, now: Instant) -> bool {
        match self.extra.as_mut().and_then(|e| e.leaf.as_mut()) {
            Some(l) if !l.trust_domain.is_empty() && l.due.is_some_and(|t| t <= now) => {
                l.due = Some(now + UNANSWERED_SIGN);
                true
            }
            _ => false,
        }
    }

    /// The sign's request: a new key and CSR for the agent's service.
    pub(super) fn sign_request(&self) -> Result<(String, String), Refusal> {
        let l = self
            .extra
            .as_ref()
            .and_then(|e| e.leaf.as_ref())
            .ok_or_else(no_roots)?;
        let cfg = &self.shared.cfg;
        // The datacenter the agent is in (a real agent's default when the
        // run names none).
        let dc = match cfg.conn.datacenter.as_str() {
            "" => "dc1",
            dc => dc,
        };
        let id = spiffe_service_id(&l.trust_domain, dc, &self.shared.own(self.index).service);
        let csr = new_csr(&id).map_err(|e| Refusal {
            kind: e.kind(),
            words: Some(e.to_string()),
        })?;
        Ok((csr.pem, dc.to_owned()))
    }

    /// The roots query due, if any: on a new stream of `mux`, blocking
    /// from the last index (the first one answers at once).
    pub(super) fn roots_call(
        &mut self,
        mux: &mut Mux,
        line: &CallLine,
        now: Instant,
    ) -> Option<Exchange> {
        if !self.keeps_leaf() || !self.registered {
            return None;
        }
        let l = self
            .extra
            .get_or_insert_default()
            .leaf
            .get_or_insert_default();
        if l.roots_retry_at.is_some_and(|t| t > now) {
            return None;
        }
        let stream = mux.open_now()?.ok()?;
        let seq = link::next_seq(line);
        let mut req = Vec::with_capacity(400);
        let sh = &self.shared;
        connect_ca::encode_roots(
            seq,
            &sh.cfg.conn.datacenter,
            l.roots_index,
            self.token(),
            &mut req,
        );
        Some(exchange(stream, seq, req, MAX_ROOTS_ANSWER))
    }

    /// When a failed roots query is tried again.
    pub(super) fn roots_retry_at(&self) -> Option<Instant> {
        self.extra
            .as_ref()
            .and_then(|e| e.leaf.as_ref())?
            .roots_retry_at
    }

    /// A roots query answered: a new active root asks for a new
    /// certificate within the rotation window (the first one at once).
    pub(super) fn on_roots(&mut self, r: Result<Reply, CallError>, now: Instant) {
        let sh = self.shared.clone();
        let Some(l) = self.extra.as_mut().and_then(|e| e.leaf.as_mut()) else {
            return;
        };
        let roots = match r {
            Ok(reply) if reply.header.error.is_empty() => {
                decode_roots(&reply.body).map_err(Refusal::from)
            }
            Ok(reply) => Err(Refusal {
                kind: crate::http::cause_kind(&reply.header.error).unwrap_or("rpc_error"),
                words: Some(reply.header.error),
            }),
            Err(e) => Err(e.into()),
        };
        let roots = match roots {
            Ok(r) => r,
            Err(r) => {
                sh.metrics.error_with(r.kind, r.words.as_deref());
                l.roots_failures += 1;
                let wait =
                    backoff_wait(l.roots_failures, fastrand::f64()).max(Duration::from_secs(1));
                l.roots_retry_at = Some(now + wait);
                return;
            }
        };
        l.roots_failures = 0;
        l.roots_retry_at = None;
        l.roots_index = roots.index;
        l.trust_domain = roots.trust_domain.clone();
        let active = roots.active_signing_key().map(str::to_owned);
        if active == l.active_key {
            return;
        }
        l.active_key = active;
        match &l.authority {
            None if l.due.is_none() => l.due = Some(now),
            Some(held) if Some(held) != l.active_key.as_ref() => {
                // leafcert: a new active root, a new certificate within a
                // random stagger (sooner if the renewal was sooner).
                l.rotation = sh.connect.as_ref().and_then(|b| b.rotation());
                l.refused_since = Some(now);
                let at = now + rotation_delay(fastrand::f64());
                l.due = Some(l.due.map_or(at, |t| t.min(at)));
            }
            _ => {}
        }
    }

    /// A sign answered: the certificate held and its renewal scheduled, or
    /// the servers' rate limit backed off from as leafcert does.
    pub(super) fn on_signed(&mut self, r: Result<Signed, Refusal>, now: Instant) {
        let sh = self.shared.clone();
        let Some(l) = self.extra.as_mut().and_then(|e| e.leaf.as_mut()) else {
            return;
        };
        let first = l.authority.is_none();
        match r {
            Ok(s) => {
                let board = sh.connect.as_deref();
                if first {
                    sh.metrics.incr(sh.ids.leaf_issued);
                    if let Some(b) = board {
                        b.holds();
                        if let Some(d) = b.since_first_dial(now) {
                            sh.metrics.record(sh.ids.leaf_boot, self.index as usize, d);
                        }
                    }
                } else {
                    sh.metrics.incr(sh.ids.leaf_renewed);
                }
                if let (Some(at), Some(b)) = (l.rotation.take(), board)
                    && s.authority.is_some()
                    && s.authority == l.active_key
                {
                    b.rotated_one();
                    let d = now.saturating_duration_since(at);
                    sh.metrics
                        .record(sh.ids.leaf_rotation, self.index as usize, d);
                }
                l.authority = Some(s.authority.unwrap_or_default());
                l.sign_failures = 0;
                l.rate_limited = 0;
                l.refused_since = None;
                let wait = renew_in(s.valid_after, s.valid_before, unix_now(), fastrand::f64());
                l.due = Some(now + wait);
            }
            Err(r) if r.words.as_deref() == Some(RATE_LIMITED) => {
                sh.metrics.incr(sh.ids.leaf_rate_limited);
                sh.metrics.warn("csr_rate_limited", r.words.as_deref());
                if first {
                    l.sign_failures += 1;
                    l.due = Some(now + backoff_wait(l.sign_failures, fastrand::f64()));
                } else {
                    let since = *l.refused_since.get_or_insert(now);
                    l.rate_limited += 1;
                    let at = since + rate_limited_retry(l.rate_limited, fastrand::f64());
                    l.due = Some(at.max(now));
                }
            }
            Err(r) => {
                sh.metrics.error_with(r.kind, r.words.as_deref());
                l.sign_failures += 1;
                let wait = backoff_wait(l.sign_failures, fastrand::f64());
                // A broken connection is not hammered: a second at least.
                l.due = Some(now + wait.max(Duration::from_secs(1)));
            }
        }
    }
}

fn no_roots() -> Refusal {
    Refusal {
        kind: "csr_failed",
        words: Some("no CA roots yet".into()),
    }
}

/// Reads a sign's answer.
pub(super) fn signed(reply: &Reply) -> Result<Signed, Refusal> {
    let c = decode_sign(&reply.body)?;
    Ok(Signed {
        authority: authority_key_id(&c.cert_pem),
        valid_after: c.valid_after.0,
        valid_before: c.valid_before.0,
    })
}
