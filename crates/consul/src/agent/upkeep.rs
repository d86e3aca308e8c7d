//! Catalog upkeep of an agent: registration (batched), the TTL session and
//! its renewals, check flaps, and the cleanup when the run ends.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use ::http::Method;
use agent_sim_fleet::{Backoff, Failure, SessionCx};
use bytes::Bytes;
use tokio::time::Instant;

use super::{ConsulAgent, jitter};
use crate::config;
use crate::http::{self, Refusal, Registration};
use crate::txn::TxnOps;

pub(super) enum HttpDone {
    Registered(Result<(), Refusal>),
    /// Anti-entropy: whether the catalog holds the node as registered (or,
    /// without registration, whether the server names a leader).
    Synced(Result<bool, Refusal>),
    SessionCreated(Result<String, Refusal>),
    Renewed(Result<(), Refusal>, Duration),
    Flapped(Result<(), Refusal>),
}

pub(super) type HttpFuture = Pin<Box<dyn Future<Output = HttpDone> + Send>>;

/// Session-local HTTP scheduling.
pub(super) struct HttpSched {
    pub(super) retry_at: Instant,
    pub(super) backoff: Backoff,
    pub(super) flap_due: Option<Instant>,
    /// Next anti-entropy sync.
    pub(super) ae_due: Option<Instant>,
    /// A sync was answered in this session: the server is there and has a
    /// leader (resubscribed streams that stay silent are then resumed).
    pub(super) ae_answered: bool,
}

pub(super) use crate::config::AE_SERVER_UP;
/// Consul's `retryFailInterval`: a failed sync is retried after this plus a
/// random part of it (scaled).
pub(super) const AE_RETRY: Duration = Duration::from_secs(15);

/// A call the server refused: counted, and kept as the agent's last cause
/// (a registration the server refuses keeps the agent from being
/// connected); the next call after the backoff.
fn refused(cx: &SessionCx, hs: &mut HttpSched, r: Refusal, now: Instant) {
    cx.report(&Failure {
        kind: r.kind,
        detail: r.words,
    });
    hs.retry_at = now + hs.backoff.next_delay();
}

/// A random part of `d` scaled with the cluster size (Consul's stagger).
pub(super) fn stagger(d: Duration, cluster: u64) -> Duration {
    (d * config::ae_scale(cluster)).mul_f64(fastrand::f64())
}

impl ConsulAgent {
    /// When the next HTTP action is due (none when nothing is scheduled).
    pub(super) fn http_due(&self, hs: &HttpSched) -> Option<Instant> {
        let cfg = &self.shared.cfg;
        if cfg.register && !self.registered {
            return Some(hs.retry_at);
        }
        if self.shared.ttl.is_some() && self.session_id.is_none() {
            return Some(hs.retry_at);
        }
        let renew = if self.session_id.is_some() {
            self.renew_due
        } else {
            None
        };
        [renew, hs.flap_due, hs.ae_due]
            .into_iter()
            .flatten()
            .min()
            .map(|t| t.max(hs.retry_at))
    }

    /// The first sync of a session: after a reconnect, within Consul's
    /// staggered `serverUpInterval` (the server may have lost our state, and
    /// silent resubscribed streams wait for a server answer); else one
    /// interval after registering.
    pub(super) fn first_sync(&self, now: Instant, reconnect: bool) -> Option<Instant> {
        let sh = &self.shared;
        let cluster = sh.cfg.cluster_size;
        if reconnect {
            Some(now + stagger(AE_SERVER_UP, cluster))
        } else if sh.cfg.register {
            self.next_sync(now)
        } else {
            None
        }
    }

    /// When the periodic sync after one at `now` is due (registered agents
    /// with anti-entropy on only).
    fn next_sync(&self, now: Instant) -> Option<Instant> {
        let sh = &self.shared;
        let iv = sh.cfg.anti_entropy.filter(|_| sh.cfg.register)?;
        Some(now + iv + stagger(iv, sh.cfg.cluster_size))
    }

    /// The registration of this agent as the catalog should hold it.
    fn with_registration<T>(&self, f: impl FnOnce(&Registration<'_>) -> T) -> T {
        let sh = &self.shared;
        let upstreams: Vec<String> = self.subs.iter().map(|s| s.name.to_string()).collect();
        let node = self.node();
        let address = http::node_address(self.index);
        f(&Registration {
            node: &node,
            address: &address,
            index: self.index,
            service: &sh.cfg.service_name,
            instances: sh.cfg.services_per_agent,
            sidecars: sh.cfg.sidecars,
            upstreams: &upstreams,
            prefix: &sh.cfg.conn.name_prefix,
        })
    }

    /// The HTTP call due at `now`, if any, in this order: registration,
    /// anti-entropy sync, TTL session create, renew, check flap.
    pub(super) fn next_http(&mut self, hs: &mut HttpSched, now: Instant) -> Option<HttpFuture> {
        let due = self.http_due(hs)?;
        if due > now {
            return None;
        }
        let sh = self.shared.clone();
        if sh.cfg.register && !self.registered {
            let ops = self.with_registration(http::registration_ops);
            self.maybe_registered = true;
            return Some(Box::pin(async move {
                HttpDone::Registered(sh.batcher().submit(TxnOps::new(ops)).await)
            }));
        }
        if hs.ae_due.is_some_and(|t| t <= now) {
            hs.ae_due = None;
            return Some(self.sync_call());
        }
        if let Some((_, ttl)) = &sh.ttl
            && self.session_id.is_none()
        {
            let body = Bytes::from(http::session_create_body(&self.node(), ttl));
            return Some(Box::pin(async move {
                let r = match sh.http.put("/v1/session/create", body).await {
                    Ok(b) => serde_json::from_slice::<http::SessionCreated>(&b)
                        .map(|s| s.id)
                        .map_err(|_| Refusal::kind("http_decode")),
                    Err(e) => Err(e.into()),
                };
                HttpDone::SessionCreated(r)
            }));
        }
        if let (Some(id), Some(t)) = (&self.session_id, self.renew_due)
            && t <= now
        {
            let path = format!("/v1/session/renew/{id}");
            return Some(Box::pin(async move {
                let start = Instant::now();
                let r = sh
                    .http
                    .put(&path, Bytes::new())
                    .await
                    .map(|_| ())
                    .map_err(Refusal::from);
                HttpDone::Renewed(r, start.elapsed())
            }));
        }
        if hs.flap_due.is_some_and(|t| t <= now) {
            return Some(self.flap_call());
        }
        None
    }

    /// Anti-entropy: the catalog's node compared with the registration,
    /// or, with nothing registered, whether the server has a leader.
    fn sync_call(&self) -> HttpFuture {
        let sh = self.shared.clone();
        if !sh.cfg.register {
            return Box::pin(async move {
                let r = match sh
                    .http
                    .call(Method::GET, "/v1/status/leader", Bytes::new())
                    .await
                {
                    Ok(b) => serde_json::from_slice::<String>(&b)
                        .map(|l| !l.is_empty())
                        .map_err(|_| Refusal::kind("http_decode")),
                    Err(e) => Err(e.into()),
                };
                HttpDone::Synced(r)
            });
        }
        let expected = self.with_registration(http::expected_services);
        let address = http::node_address(self.index);
        let path = format!("/v1/catalog/node/{}", self.node());
        Box::pin(async move {
            let r = match sh.http.call(Method::GET, &path, Bytes::new()).await {
                Ok(b) => http::node_in_sync(&b, &address, &expected).map_err(Refusal::kind),
                Err(e) => Err(e.into()),
            };
            HttpDone::Synced(r)
        })
    }

    /// The next check flap: the agent's instances in turn, each to
    /// `warning` and back to `passing`.
    fn flap_call(&self) -> HttpFuture {
        let sh = self.shared.clone();
        let n = sh.cfg.services_per_agent.max(1);
        let k = self.flaps % n;
        let status = if (self.flaps / n).is_multiple_of(2) {
            "warning"
        } else {
            "passing"
        };
        let id = http::instance_id(&sh.cfg.service_name, self.index, k);
        let body = Bytes::from(http::check_status_body(
            &self.node(),
            &http::node_address(self.index),
            &id,
            &sh.cfg.service_name,
            status,
        ));
        Box::pin(async move {
            let r = sh
                .http
                .put("/v1/catalog/register", body)
                .await
                .map(|_| ())
                .map_err(Refusal::from);
            HttpDone::Flapped(r)
        })
    }

    /// An HTTP call finished: one handler per call.
    pub(super) fn on_http(&mut self, cx: &SessionCx, hs: &mut HttpSched, done: HttpDone) {
        let now = Instant::now();
        match done {
            HttpDone::Registered(Ok(())) => self.on_registered(hs, now),
            HttpDone::Registered(Err(r)) => refused(cx, hs, r, now),
            HttpDone::Synced(r) => self.on_synced(hs, r, now),
            HttpDone::SessionCreated(Err(r)) if r.kind == "missing_node_registration" => {
                // The server lost the node: sync at once (a real agent's
                // anti-entropy registers it again), then create.
                refused(cx, hs, r, now);
                hs.ae_due = Some(now);
            }
            HttpDone::SessionCreated(Ok(id)) => {
                let sh = &self.shared;
                sh.metrics.incr(sh.ids.sessions_created);
                self.session_id = Some(id.into_boxed_str());
                if let Some((ttl, _)) = sh.ttl {
                    self.renew_due = Some(now + ttl / 2);
                }
                hs.backoff.reset();
            }
            HttpDone::SessionCreated(Err(r)) => refused(cx, hs, r, now),
            HttpDone::Renewed(r, took) => self.on_renewed(hs, r, took, now),
            HttpDone::Flapped(r) => self.on_flapped(hs, r, now),
        }
    }

    fn on_registered(&mut self, hs: &mut HttpSched, now: Instant) {
        let sh = self.shared.clone();
        self.registered = true;
        if std::mem::take(&mut self.repairing) {
            sh.metrics.incr(sh.ids.reregistrations);
        } else {
            sh.metrics.incr(sh.ids.registrations);
        }
        hs.backoff.reset();
        if hs.ae_due.is_none() {
            hs.ae_due = self.next_sync(now);
        }
        if let Some(iv) = sh.flap_interval {
            hs.flap_due = Some(now + iv.mul_f64(fastrand::f64()));
        }
    }

    fn on_synced(&mut self, hs: &mut HttpSched, r: Result<bool, Refusal>, now: Instant) {
        let sh = self.shared.clone();
        let in_sync = match r {
            Ok(in_sync) => in_sync,
            Err(r) => {
                sh.metrics.error_with(r.kind, r.words.as_deref());
                hs.ae_due = Some(now + AE_RETRY + stagger(AE_RETRY, sh.cfg.cluster_size));
                return;
            }
        };
        sh.metrics.incr(sh.ids.anti_entropy_syncs);
        if sh.cfg.register {
            hs.ae_answered = true;
            if !in_sync {
                // Lost or changed on the server: register again now.
                self.registered = false;
                self.repairing = true;
                hs.retry_at = now;
            }
            hs.ae_due = self.next_sync(now);
        } else if in_sync {
            hs.ae_answered = true;
        } else {
            // No leader yet: ask again shortly.
            hs.ae_due = Some(now + jitter(Duration::from_secs(1)));
        }
    }

    fn on_renewed(
        &mut self,
        hs: &mut HttpSched,
        r: Result<(), Refusal>,
        took: Duration,
        now: Instant,
    ) {
        let sh = self.shared.clone();
        let half = sh
            .ttl
            .as_ref()
            .map(|(t, _)| *t / 2)
            .unwrap_or(Duration::from_secs(15));
        match r {
            Ok(()) => {
                sh.metrics.incr(sh.ids.sessions_renewed);
                sh.metrics
                    .record(sh.ids.session_renew, self.index as usize, took);
                // Timed from the intended time, not from the reply.
                let next = self.renew_due.map_or(now + half, |t| t + half);
                self.renew_due = Some(if next <= now { now + half } else { next });
                hs.backoff.reset();
            }
            Err(r) if r.kind == "http_404" => {
                // Expired, or the server lost its state: check the
                // registration at once before a new session.
                sh.metrics.incr(sh.ids.sessions_expired);
                sh.metrics.warn("session_expired", r.words.as_deref());
                self.session_id = None;
                self.renew_due = None;
                if sh.cfg.register {
                    hs.ae_due = Some(now);
                }
            }
            Err(r) => {
                sh.metrics.error_with(r.kind, r.words.as_deref());
                self.renew_due = Some(now + jitter(Duration::from_secs(1)).min(half));
            }
        }
    }

    fn on_flapped(&mut self, hs: &mut HttpSched, r: Result<(), Refusal>, now: Instant) {
        let sh = &self.shared;
        let iv = sh.flap_interval.unwrap_or(Duration::from_secs(60));
        match r {
            Ok(()) => {
                sh.metrics.incr(sh.ids.flaps);
                self.flaps = self.flaps.wrapping_add(1);
            }
            Err(r) => sh.metrics.error_with(r.kind, r.words.as_deref()),
        }
        let next = hs.flap_due.map_or(now, |t| t) + jitter(iv);
        hs.flap_due = Some(if next <= now { now + jitter(iv) } else { next });
    }

    pub(super) async fn finish_inner(&mut self) {
        let sh = self.shared.clone();
        let node = self.node();
        let dereg = async {
            if self.maybe_registered && !sh.cfg.keep_registrations {
                let ops = TxnOps::new(vec![http::deregistration_op(&node)]);
                match sh.batcher().submit(ops).await {
                    Ok(()) => {
                        sh.metrics.incr(sh.ids.deregistrations);
                        true
                    }
                    Err(r) => {
                        sh.metrics.error_with(r.kind, r.words.as_deref());
                        false
                    }
                }
            } else {
                false
            }
        };
        let destroy = async {
            if let Some(id) = &self.session_id {
                let path = format!("/v1/session/destroy/{id}");
                if let Err(e) = sh.http.put(&path, Bytes::new()).await {
                    sh.metrics.error_with(e.kind, e.words().as_deref());
                }
            }
        };
        let (deregistered, ()) = futures_util::future::join(dereg, destroy).await;
        if deregistered {
            self.registered = false;
            self.maybe_registered = false;
        }
        self.session_id = None;
    }
}
