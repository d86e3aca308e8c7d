//! The probe runner: makes the changes, takes T0, and summarizes each probe.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ::http::Method;
use agent_sim_metrics::summary::ROLE_CONTROLLER;
use agent_sim_metrics::units::unix_us;
use agent_sim_metrics::{Metrics, ProbeSummary};
use bytes::Bytes;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::ProbeKind;
use crate::http::{self, HttpApi};

use super::stats::{common_index, micros_after, summarize};
use super::{Expect, ProbeBoard};

/// A board the runner arms for each change: the fleet whose agents report
/// to it, and the latency its deliveries are recorded in.
pub(crate) struct Watched {
    board: Arc<ProbeBoard>,
    latency: &'static str,
    /// The latency of its deliveries at the proxies behind the agents.
    proxy_latency: &'static str,
    /// `ProbeSummary::fleet` of its probes (`None`: the Consul agents).
    fleet: Option<String>,
}

/// Makes the probe changes and measures them (see the module docs).
pub struct ProbeRunner {
    pub(crate) board: Arc<ProbeBoard>,
    /// Boards of other fleets watching the same change (dataplane sidecars).
    pub(crate) others: Vec<Watched>,
    pub(crate) http: Arc<HttpApi>,
    pub(crate) metrics: Metrics,
    pub(crate) every: Duration,
    pub(crate) timeout: Duration,
    pub(crate) instance_id: String,
    /// The run's name prefix: the probe node is `<prefix>-probe`, and what
    /// the probe creates carries it as meta.
    pub(crate) prefix: String,
    pub(crate) keep: bool,
    /// The latency the board's deliveries are recorded in.
    pub(crate) latency: &'static str,
    /// The latency its deliveries at the proxies behind the agents are
    /// recorded in.
    pub(crate) proxy_latency: &'static str,
    /// The first change comes this long after `every` (a second probe's
    /// changes fall between the first's).
    pub(crate) offset: Duration,
    /// The first probe id and the step between ids (two probes of one run
    /// take the odd and the even ids).
    pub(crate) ids: (u64, u64),
    /// `ProbeSummary::fleet` of the board's probes.
    pub(crate) fleet: Option<String>,
    /// Catalog: a change is new metadata on the instance (`--change-every`).
    pub(crate) meta: bool,
    /// Changes made so far (the metadata's version).
    pub(crate) changes: std::sync::atomic::AtomicU64,
    /// The servers are this process's own ([`crate::ProbeConfig::own_cluster`]):
    /// the summaries carry no change id.
    pub(crate) own_cluster: bool,
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
    /// The intentions entry exists and is not ours: no probe runs.
    Refused,
}

/// Why a probe change was not made.
enum ChangeError {
    Http(http::HttpError),
    /// The entry is not ours (or changed under us): words for the report.
    NotOurs(String),
}

/// How one probe went.
enum Probed {
    /// The change was not made (counted); the next probe tries again.
    Failed,
    /// The run ended inside the probe's window before every agent had it
    /// (counted in `probes_interrupted`): the last probe.
    Interrupted,
    /// One summary per board.
    Done(Vec<ProbeSummary>),
}

/// The change a probe makes, and its kind's name in the summary: `on` is
/// whether the catalog instance is registered (or the intention `allow`).
fn change_of(kind: ProbeKind, on: bool, meta: bool) -> (Expect, &'static str) {
    match (kind, on) {
        // A new version of the instance, which stays registered.
        (ProbeKind::Catalog, _) if meta => (Expect::Register, "meta"),
        (ProbeKind::Catalog, true) => (Expect::Deregister, "deregister"),
        (ProbeKind::Catalog, false) => (Expect::Register, "register"),
        (ProbeKind::Intentions, true) => (Expect::Deny, "intentions"),
        (ProbeKind::Intentions, false) => (Expect::Allow, "intentions"),
        (ProbeKind::Kv, _) => (Expect::KvSet, "kv"),
    }
}

/// What one probe brought to one board's agents, or to the proxies behind
/// them: one summary each.
struct Got {
    arrivals: Vec<(Instant, u64)>,
    expected: u64,
    latency: &'static str,
    fleet: Option<String>,
}

/// Disarms every board and collects what its probe brought (`expected`:
/// each board's, as armed); a board that times the proxies behind its
/// agents adds their entry right after its own, keeping only the hand-offs
/// made by now (the window can end early, at the end of the run).
fn disarm(watched: &[Watched], expected: Vec<u64>) -> Vec<Got> {
    let now = Instant::now();
    let mut got = Vec::with_capacity(watched.len() + 1);
    for (w, expected) in watched.iter().zip(expected) {
        got.push(Got {
            arrivals: w.board.disarm(),
            expected,
            latency: w.latency,
            fleet: w.fleet.clone(),
        });
        if let Some((expected, mut arrivals)) = w.board.take_proxied() {
            arrivals.retain(|&(a, _)| a <= now);
            got.push(Got {
                arrivals,
                expected,
                latency: w.proxy_latency,
                fleet: Some(crate::proxy::FLEET.into()),
            });
        }
    }
    got
}

/// Metadata changes: every one looks alike, so one that reached a watcher
/// after the next probe was armed (a saturated run) carries an older raft
/// index than this probe's change, the newest in the window. It is not
/// this probe's: only the newest index (or none) is kept.
fn newest_change_only(arrivals: &mut Vec<(Instant, u64)>) {
    if let Some(top) = arrivals.iter().map(|&(_, i)| i).max() {
        arrivals.retain(|&(_, i)| i == 0 || i == top);
    }
}

/// What a [`ProbeRunner`] needs besides its board (see [`ProbeRunner::new`]).
#[derive(Debug, Clone)]
pub struct RunnerSetup {
    /// Time between probes.
    pub every: Duration,
    /// Deliveries later than this after T0 are missing.
    pub timeout: Duration,
    /// The run's name prefix (probe node `<prefix>-probe`, meta).
    pub prefix: String,
    /// Leave the probe's objects in place at the end.
    pub keep: bool,
    /// The servers are this process's own
    /// ([`crate::ProbeConfig::own_cluster`]).
    pub own_cluster: bool,
}

impl ProbeRunner {
    /// A runner for `board` (a controller's board) that writes through
    /// `http`; its deliveries are recorded in `latency` and its probes carry
    /// `fleet` (see [`ProbeRunner::watch_also`]). The Consul fleet's own
    /// runner comes from [`crate::ConsulFactory::probe_runner`].
    pub fn new(
        board: Arc<ProbeBoard>,
        http: Arc<HttpApi>,
        metrics: Metrics,
        setup: RunnerSetup,
        latency: &'static str,
        fleet: Option<String>,
    ) -> Self {
        ProbeRunner {
            board: board.clone(),
            others: Vec::new(),
            http,
            metrics,
            every: setup.every,
            timeout: setup.timeout,
            instance_id: http::probe_instance_id(&setup.prefix),
            prefix: setup.prefix,
            keep: setup.keep,
            latency,
            proxy_latency: crate::names::PROPAGATION_PROXY,
            fleet,
            meta: false,
            changes: Default::default(),
            offset: Duration::ZERO,
            ids: (1, 1),
            own_cluster: setup.own_cluster,
        }
    }

    /// Also arms `board` (another fleet's agents watching the same probe
    /// service, e.g. dataplane sidecars) for every change: each change then
    /// gives one [`ProbeSummary`] per board, the other's carrying `fleet`,
    /// its deliveries recorded in `latency`.
    pub fn watch_also(&mut self, board: Arc<ProbeBoard>, latency: &'static str, fleet: &str) {
        self.others.push(Watched {
            board,
            latency,
            proxy_latency: crate::names::PROPAGATION_PROXY,
            fleet: Some(fleet.to_owned()),
        });
    }

    /// The probed service.
    pub fn service(&self) -> &str {
        self.board.service()
    }

    /// The probe kind.
    pub fn kind(&self) -> ProbeKind {
        self.board.kind()
    }

    /// Runs a probe every `every` until `cancel`; returns every finished
    /// probe. One still inside its timeout at cancel is reported with what
    /// arrived if every expected subscriber had it, and otherwise counted in
    /// `probes_interrupted` and left out.
    pub async fn run(mut self, cancel: CancellationToken) -> Vec<ProbeSummary> {
        let mut out = Vec::new();
        let start = Instant::now();
        let mut state = Setup::Pending;
        self.setup(&mut state).await;
        let mut watched = vec![Watched {
            board: self.board.clone(),
            latency: self.latency,
            proxy_latency: self.proxy_latency,
            fleet: self.fleet.take(),
        }];
        watched.append(&mut self.others);
        let (mut next_id, step) = self.ids;
        for k in 1u32.. {
            let due = start + self.offset + self.every * k;
            tokio::select! {
                _ = tokio::time::sleep_until(due) => {}
                _ = cancel.cancelled() => break,
            }
            if matches!(state, Setup::Pending) {
                self.setup(&mut state).await;
            }
            let Setup::Done(on) = state else { continue };
            // Intentions: the entry must still be ours, at a known index.
            let cas = match self.own_entry().await {
                Ok(c) => c,
                Err(e) => {
                    self.report(e, &mut state);
                    continue;
                }
            };
            let id = next_id;
            next_id += step;
            match self
                .probe(&watched, id, (on, cas), &mut state, &cancel)
                .await
            {
                Probed::Failed => continue,
                Probed::Interrupted => break,
                Probed::Done(summaries) => out.extend(summaries),
            }
            if cancel.is_cancelled() {
                break;
            }
        }
        if !self.keep {
            let _ = tokio::time::timeout(Duration::from_secs(3), self.cleanup()).await;
        }
        out
    }

    /// Probe `id`: arms the boards, makes the change (the instance `on`
    /// now, the entry at `cas`), waits out the timeout (or `cancel`) and
    /// summarizes what arrived at each board.
    async fn probe(
        &self,
        watched: &[Watched],
        id: u64,
        (on, cas): (bool, Option<u64>),
        state: &mut Setup,
        cancel: &CancellationToken,
    ) -> Probed {
        let (expect, kind) = change_of(self.board.kind, on, self.meta);
        // Expected: the subscriptions live when the probe is armed
        // (those that come live later have the change in their snapshot).
        let expected: Vec<u64> = watched.iter().map(|w| w.board.arm(id, expect)).collect();
        // T0: the instant the write is sent; its round trip apart.
        let t0 = Instant::now();
        let t0_wall = SystemTime::now();
        if let Err(e) = self.change(expect, cas, id).await {
            for w in watched {
                w.board.disarm();
            }
            self.report(e, state);
            return Probed::Failed;
        }
        // The server answered once its leader committed and applied the
        // write: the first leg of the probe's time (metrics' `late`).
        let written = t0.elapsed();
        let write = self.metrics.latency(crate::names::PROBE_WRITE);
        self.metrics.record(write, 0, written);
        let written_us = u64::try_from(written.as_micros()).unwrap_or(u64::MAX);
        *state = Setup::Done(!on || self.meta);
        let interrupted = tokio::select! {
            _ = tokio::time::sleep_until(t0 + self.timeout) => false,
            _ = cancel.cancelled() => true,
        };
        let mut got = disarm(watched, expected);
        if self.meta {
            for g in &mut got {
                newest_change_only(&mut g.arrivals);
            }
        }
        if interrupted
            && got
                .iter()
                .any(|g| (g.arrivals.len() as u64) < g.expected || g.expected == 0)
        {
            // The run ended inside this probe's window while agents were
            // closing: its figures would be wrong, so it is counted, not
            // reported.
            self.metrics
                .incr(self.metrics.counter(crate::names::PROBES_INTERRUPTED));
            return Probed::Interrupted;
        }
        let timeout_us = u64::try_from(self.timeout.as_micros()).unwrap_or(u64::MAX);
        let mut out = Vec::with_capacity(got.len());
        for Got {
            arrivals,
            expected,
            latency,
            fleet,
        } in got
        {
            let propagation = self.metrics.latency(latency);
            let lat: Vec<u64> = arrivals.iter().map(|&(a, _)| micros_after(t0, a)).collect();
            for (i, &l) in lat.iter().enumerate() {
                if l <= timeout_us {
                    self.metrics.record_us(propagation, i, l);
                }
            }
            let mut summary = summarize(id, kind, t0_wall, expected, lat, timeout_us);
            // Another process's cluster has its own raft indexes, which
            // may coincide with these: such probes join by sequence.
            summary.change_id = common_index(&arrivals).filter(|_| !self.own_cluster);
            summary.role = Some(ROLE_CONTROLLER.into());
            summary.t0_unix_us = Some(unix_us(t0_wall));
            summary.fleet = fleet;
            summary.written_us = Some(written_us);
            out.push(summary);
        }
        Probed::Done(out)
    }

    /// Catalog: registers the probe instance. Intentions: creates the
    /// probe's entry only if none exists (`cas=0`); an entry that exists
    /// already belongs to someone else and stops the probe.
    async fn setup(&self, state: &mut Setup) {
        let r = match self.board.kind {
            ProbeKind::Catalog => self.change(Expect::Register, None, 0).await,
            ProbeKind::Intentions => self.change(Expect::Allow, Some(0), 0).await,
            // Each probe writes the key; nothing before.
            ProbeKind::Kv => Ok(()),
        };
        match r {
            Ok(()) => *state = Setup::Done(true),
            Err(e) => self.report(e, state),
        }
    }

    fn report(&self, e: ChangeError, state: &mut Setup) {
        match e {
            ChangeError::Http(e) => self.metrics.error_with(e.kind, e.words().as_deref()),
            ChangeError::NotOurs(words) => {
                self.metrics.error_with("probe_entry_exists", Some(&words));
                *state = Setup::Refused;
            }
        }
    }

    fn entry_path(&self) -> String {
        format!("/v1/config/service-intentions/{}", self.board.service)
    }

    /// Intentions: the ModifyIndex of the probe's entry, checked to be this
    /// run's own (its meta names our prefix). Catalog: nothing to check.
    async fn own_entry(&self) -> Result<Option<u64>, ChangeError> {
        if self.board.kind != ProbeKind::Intentions {
            return Ok(None);
        }
        let body = self
            .http
            .call(Method::GET, &self.entry_path(), Bytes::new())
            .await
            .map_err(ChangeError::Http)?;
        let head: http::EntryHead = serde_json::from_slice(&body)
            .map_err(|_| ChangeError::Http(http::HttpError::io("http_decode")))?;
        if !http::marked_by(&head.meta, &self.prefix) {
            return Err(self.not_ours());
        }
        Ok(Some(head.modify_index))
    }

    fn not_ours(&self) -> ChangeError {
        ChangeError::NotOurs(format!(
            "service-intentions {:?} exists and was not created by this run; left as it is",
            self.board.service
        ))
    }

    /// One change (probe `id`); intentions writes are check-and-set at
    /// `cas`; the KV probe writes `id` into the run's own key.
    async fn change(&self, expect: Expect, cas: Option<u64>, id: u64) -> Result<(), ChangeError> {
        let svc = &self.board.service;
        let p = &self.prefix;
        let intentions = |allow| match cas {
            Some(i) => (
                format!("/v1/config?cas={i}"),
                http::intentions_body(p, svc, allow),
            ),
            None => (
                "/v1/config".to_owned(),
                http::intentions_body(p, svc, allow),
            ),
        };
        let change = self.meta.then(|| {
            self.changes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        });
        let (path, body) = match expect {
            Expect::Register => (
                "/v1/catalog/register".to_owned(),
                http::probe_change_body(p, svc, &self.instance_id, change),
            ),
            Expect::Deregister => (
                "/v1/catalog/deregister".to_owned(),
                http::probe_deregister_body(p, &self.instance_id),
            ),
            Expect::Allow => intentions(true),
            Expect::Deny => intentions(false),
            Expect::KvSet => (format!("/v1/kv/{svc}"), id.to_string()),
        };
        let answer = self
            .http
            .put(&path, Bytes::from(body))
            .await
            .map_err(ChangeError::Http)?;
        // A check-and-set that lost answers `false`.
        if cas.is_some() && http::parse_bool(&answer) != Ok(true) {
            return Err(self.not_ours());
        }
        Ok(())
    }

    /// Removes what the probe created: the whole probe node (catalog), or
    /// the probe's own entry if it is still ours and unchanged since we
    /// read it (intentions, `DELETE ?cas=`).
    async fn cleanup(&self) {
        let r = match self.board.kind {
            ProbeKind::Catalog => self
                .http
                .put(
                    "/v1/catalog/deregister",
                    Bytes::from(http::node_deregister_body(&http::probe_node(&self.prefix))),
                )
                .await
                .map(|_| ())
                .map_err(ChangeError::Http),
            ProbeKind::Intentions => match self.own_entry().await {
                Ok(Some(idx)) => self
                    .http
                    .call(
                        Method::DELETE,
                        &format!("{}?cas={idx}", self.entry_path()),
                        Bytes::new(),
                    )
                    .await
                    .map(|_| ())
                    .map_err(ChangeError::Http),
                Ok(None) => Ok(()),
                // Gone already, or never ours: nothing of ours to remove.
                Err(ChangeError::Http(e)) if e.status == Some(404) => Ok(()),
                Err(ChangeError::NotOurs(_)) => Ok(()),
                Err(e) => Err(e),
            },
            ProbeKind::Kv => self
                .http
                .call(
                    Method::DELETE,
                    &format!("/v1/kv/{}", self.board.service),
                    Bytes::new(),
                )
                .await
                .map(|_| ())
                .map_err(ChangeError::Http),
        };
        if let Err(ChangeError::Http(e)) = r {
            self.metrics.error_with(e.kind, e.words().as_deref());
        }
    }
}
