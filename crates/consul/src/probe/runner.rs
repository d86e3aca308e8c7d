//! The probe runner: makes the changes, takes T0, and summarizes each probe.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ::http::Method;
use agent_sim_metrics::summary::{ROLE_CONTROLLER, unix_us};
use agent_sim_metrics::{Metrics, ProbeSummary};
use bytes::Bytes;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::ProbeKind;
use crate::http::{self, HttpApi};

use super::stats::{common_index, micros_after, summarize};
use super::{Expect, ProbeBoard};

/// Makes the probe changes and measures them (see the module docs).
pub struct ProbeRunner {
    pub(crate) board: Arc<ProbeBoard>,
    pub(crate) http: Arc<HttpApi>,
    pub(crate) metrics: Metrics,
    pub(crate) every: Duration,
    pub(crate) timeout: Duration,
    pub(crate) instance_id: String,
    pub(crate) keep: bool,
}

impl std::fmt::Debug for ProbeRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeRunner")
            .field("kind", &self.board.kind)
            .field("service", &self.board.service)
            .field("every", &self.every)
            .finish()
    }
}

enum Setup {
    Pending,
    /// Catalog: whether the instance is registered now; intentions: whether
    /// the source is `allow` now.
    Done(bool),
}

impl ProbeRunner {
    /// Runs a probe every `every` until `cancel`; returns every finished
    /// probe. One still inside its timeout at cancel is reported with what
    /// arrived if every expected subscriber had it, and otherwise counted in
    /// `probes_interrupted` and left out.
    pub async fn run(self, cancel: CancellationToken) -> Vec<ProbeSummary> {
        let mut out = Vec::new();
        let start = Instant::now();
        let mut state = Setup::Pending;
        self.setup(&mut state).await;
        let propagation = self.metrics.latency("propagation");
        let mut next_id = 1u64;
        for k in 1u32.. {
            let due = start + self.every * k;
            tokio::select! {
                _ = tokio::time::sleep_until(due) => {}
                _ = cancel.cancelled() => break,
            }
            if matches!(state, Setup::Pending) {
                self.setup(&mut state).await;
            }
            let Setup::Done(on) = state else { continue };
            let (expect, kind) = match (self.board.kind, on) {
                (ProbeKind::Catalog, true) => (Expect::Deregister, "deregister"),
                (ProbeKind::Catalog, false) => (Expect::Register, "register"),
                (ProbeKind::Intentions, true) => (Expect::Deny, "intentions"),
                (ProbeKind::Intentions, false) => (Expect::Allow, "intentions"),
            };
            let id = next_id;
            next_id += 1;
            let capacity = self.board.live() as usize;
            self.board.arm(id, expect, capacity);
            if let Err(e) = self.change(expect).await {
                self.metrics.error_with(e.kind, e.words().as_deref());
                self.board.disarm();
                continue;
            }
            let t0 = Instant::now();
            let t0_wall = SystemTime::now();
            let expected = self.board.live();
            state = Setup::Done(!on);
            let interrupted = tokio::select! {
                _ = tokio::time::sleep_until(t0 + self.timeout) => false,
                _ = cancel.cancelled() => true,
            };
            let arrivals = self.board.disarm();
            if interrupted && (arrivals.len() as u64) < expected {
                // The run ended inside this probe's window while agents were
                // closing: its figures would be wrong, so it is counted, not
                // reported.
                self.metrics
                    .incr(self.metrics.counter(crate::names::PROBES_INTERRUPTED));
                break;
            }
            let lat: Vec<u64> = arrivals.iter().map(|&(a, _)| micros_after(t0, a)).collect();
            let timeout_us = u64::try_from(self.timeout.as_micros()).unwrap_or(u64::MAX);
            for (i, &l) in lat.iter().enumerate() {
                if l <= timeout_us {
                    self.metrics.record_us(propagation, i, l);
                }
            }
            let mut summary = summarize(id, kind, t0_wall, expected, lat, timeout_us);
            summary.change_id = common_index(&arrivals);
            summary.role = Some(ROLE_CONTROLLER.into());
            summary.t0_unix_us = Some(unix_us(t0_wall));
            out.push(summary);
            if cancel.is_cancelled() {
                break;
            }
        }
        if !self.keep {
            let _ = tokio::time::timeout(Duration::from_secs(3), self.cleanup()).await;
        }
        out
    }

    async fn setup(&self, state: &mut Setup) {
        let r = match self.board.kind {
            ProbeKind::Catalog => self.change(Expect::Register).await,
            ProbeKind::Intentions => self.change(Expect::Allow).await,
        };
        match r {
            Ok(()) => *state = Setup::Done(true),
            Err(e) => self.metrics.error_with(e.kind, e.words().as_deref()),
        }
    }

    async fn change(&self, expect: Expect) -> Result<(), http::HttpError> {
        let svc = &self.board.service;
        let (path, body) = match expect {
            Expect::Register => (
                "/v1/catalog/register",
                http::probe_register_body(svc, &self.instance_id),
            ),
            Expect::Deregister => (
                "/v1/catalog/deregister",
                http::probe_deregister_body(&self.instance_id),
            ),
            Expect::Allow => ("/v1/config", http::intentions_body(svc, true)),
            Expect::Deny => ("/v1/config", http::intentions_body(svc, false)),
        };
        self.http.put(path, Bytes::from(body)).await.map(|_| ())
    }

    async fn cleanup(&self) {
        let r = match self.board.kind {
            ProbeKind::Catalog => self.change(Expect::Deregister).await,
            ProbeKind::Intentions => {
                let path = format!("/v1/config/service-intentions/{}", self.board.service);
                self.http
                    .call(Method::DELETE, &path, Bytes::new())
                    .await
                    .map(|_| ())
            }
        };
        if let Err(e) = r {
            self.metrics.error_with(e.kind, e.words().as_deref());
        }
    }
}
