//! The observer task: a baseline before the first dial, a scrape of every
//! target each interval, a last one after the run, then the figures.
//!
//! Never in the way: every fetch runs on a task of its own and is bounded
//! by a timeout of 80 % of the interval; a tick that comes while a scrape
//! is still out is skipped, never queued; parsing runs on the blocking
//! pool, off the workers that drive the agents. A failed scrape is a
//! warning with the server's words (`observe_failed`), never an error.
//!
//! When the fleet gossips, the first Consul server observed is also asked
//! for its members and critical `serfHealth` checks at every scrape (the
//! same timeout, on a task of its own, never two at once); after the last
//! scrape, while members it lists are still alive or leaving, it is asked
//! again every 500 ms for up to 2 s, so the summary's end is after the
//! leaves arrived. Members it marked failed are one warning
//! (`gossip_members_failed`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_sim_metrics::server::{ServerSample, ServerSummary};
use agent_sim_metrics::{ErrorKindSpec, Metrics};
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tokio_rustls::rustls::ClientConfig;
use tokio_util::sync::CancellationToken;

use crate::ObserveError;
use crate::fetch;
use crate::figures::{self, RunState};
use crate::kinds::{self, ServerKind};
use crate::live::{LiveStore, LiveView};
use crate::members::{self, GossipWatch, MembersTrack, Polled};
use crate::reading::{self, Reading};
use crate::storm;
use crate::target::{Endpoint, Target};

/// Warning kind of a scrape that failed.
pub const WARN_FAILED: &str = "observe_failed";
/// Warning kind of a Consul server without Prometheus metrics.
pub const WARN_NO_PROMETHEUS: &str = "observe_consul_no_prometheus";
/// Warning kind of members an observed Consul server marked failed.
pub const WARN_MEMBERS_FAILED: &str = "gossip_members_failed";

/// Time between the polls that wait for the members' leaves to arrive.
const SETTLE_EVERY: Duration = Duration::from_millis(500);
/// Longest wait for the members' leaves after the last scrape.
const SETTLE_FOR: Duration = Duration::from_secs(2);

/// The warning kinds the observer counts, with what to check.
pub fn warning_kinds() -> Vec<ErrorKindSpec> {
    vec![
        ErrorKindSpec {
            kind: WARN_FAILED,
            hint: "a scrape of an observed server failed (the run goes on without that sample): \
                   check the --observe URL, the server's HTTP port and its telemetry settings",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        ErrorKindSpec {
            kind: WARN_NO_PROMETHEUS,
            hint: "this Consul server keeps no Prometheus metrics: add telemetry { \
                   prometheus_retention_time = \"60s\" } to its config; meanwhile its JSON \
                   metrics are read, which have no process CPU or RSS (add --observe-pid on \
                   the server's host for those)",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        ErrorKindSpec {
            kind: WARN_MEMBERS_FAILED,
            hint: "a Consul server declared some of the run's gossip members dead while the \
                   run went on: when gossip_acked_late is counted too, the load box was too \
                   busy to answer probes in time (fewer agents per process, or more cores); \
                   otherwise UDP between the servers and the members' gossip addresses is \
                   dropped (firewall, conntrack table, --gossip-bind). The summary's server \
                   gossip part says when and how many",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Server,
        },
    ]
}

/// What a run observes.
#[derive(Debug, Clone)]
pub struct ObserveConfig {
    /// The endpoints and processes.
    pub targets: Vec<Target>,
    /// Time between scrapes.
    pub every: Duration,
    /// Series kept besides each kind's defaults (`--observe-metric`).
    pub extra: Vec<String>,
    /// The run's gossip members, when a fleet gossips: the first Consul
    /// target is asked for its view of them.
    pub gossip: Option<GossipWatch>,
}

/// What the observer reads of the run at each scrape.
#[derive(Clone)]
pub struct RunView {
    /// The run's time zero (its samples' `t_s` count from it).
    pub started: Instant,
    /// Agents holding a session now (the whole fleet's estimate).
    pub agents: Arc<dyn Fn() -> u64 + Send + Sync>,
    /// Whether every agent has been started.
    pub ramp_done: Arc<dyn Fn() -> bool + Send + Sync>,
    /// Cancelled when the run's end has come (agents leaving).
    pub end: CancellationToken,
}

impl std::fmt::Debug for RunView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunView").finish_non_exhaustive()
    }
}

impl RunView {
    fn now(&self) -> RunState {
        RunState {
            t_s: self.started.elapsed().as_secs_f64(),
            agents: (self.agents)(),
            ramp_done: (self.ramp_done)(),
            ending: self.end.is_cancelled(),
        }
    }
}

/// One target's state across the run.
struct Track {
    target: Target,
    tls: Option<Arc<ClientConfig>>,
    /// Reading the Consul JSON fallback instead of the URL.
    json: bool,
    prev: Option<(Reading, RunState)>,
    out: ServerSummary,
    units: BTreeMap<String, &'static str>,
    seen: BTreeSet<String>,
    gossip: Option<Gossip>,
}

/// What a track asks a Consul server of the run's members.
struct Gossip {
    watch: GossipWatch,
    members_url: String,
    critical_url: String,
    track: MembersTrack,
}

impl Gossip {
    /// Asks the server at `ep` (its API base: the URL before `/v1/`).
    fn new(ep: &Endpoint, watch: GossipWatch) -> Gossip {
        let base = ep.url.split("/v1/").next().unwrap_or(&ep.url);
        Gossip {
            members_url: format!("{base}{}", members::MEMBERS_PATH),
            critical_url: format!("{base}{}", members::CRITICAL_PATH),
            track: MembersTrack::new(&watch),
            watch,
        }
    }
}

/// A members poll's answers and the run then, or why it failed.
type Poll = Result<(Polled, RunState), Failure>;

/// What one scrape of one target brought.
enum Scraped {
    Read(Reading, RunState),
    /// The Prometheus URL answered 200 and nothing: read the JSON instead.
    Empty,
    Failed(Failure),
}

/// Why a scrape or a members poll of one target failed: the words of an
/// `observe_failed` warning, naming the URL or the process.
#[derive(Debug, thiserror::Error)]
enum Failure {
    /// The GET failed (dial, TLS, HTTP, the answer's size).
    #[error("GET {url}: {source}")]
    Get { url: String, source: ObserveError },
    /// The server answered another status than 200: its first words.
    #[error("GET {url}: HTTP {}: {words}", status.as_u16())]
    Refused {
        url: String,
        status: http::StatusCode,
        words: String,
    },
    /// No answer to a scrape within the scrape timeout.
    #[error("no answer within {0:?} (the scrape timeout, 80 % of --observe-every)")]
    ScrapeTimeout(Duration),
    /// No answer to a members poll within the scrape timeout.
    #[error(
        "GET {url}: no answer within {timeout:?} (the scrape timeout, 80 % of --observe-every)"
    )]
    PollTimeout { url: String, timeout: Duration },
    /// A task of the scrape or the poll ended without its result.
    #[error("{what} task: {source}")]
    Task {
        what: &'static str,
        source: tokio::task::JoinError,
    },
    /// The members or critical checks answer does not parse.
    #[error("GET {members} or {critical}: {source}")]
    Members {
        members: String,
        critical: String,
        source: ObserveError,
    },
    /// The process observed is gone.
    #[error("process {0} is gone")]
    Gone(u32),
    /// The answer is none of the formats read.
    #[error("GET {url}: the answer is not {format} ({bytes} bytes)")]
    Format {
        url: String,
        format: &'static str,
        bytes: usize,
    },
    /// 200 with an empty body.
    #[error("GET {0}: 200 with an empty body")]
    Empty(String),
}

impl Failure {
    /// The warning kind it is counted as: every failure of a target is
    /// `observe_failed`, its words naming the URL or the process.
    fn kind(&self) -> &'static str {
        use Failure as F;
        match self {
            F::Get { .. }
            | F::Refused { .. }
            | F::ScrapeTimeout(_)
            | F::PollTimeout { .. }
            | F::Task { .. }
            | F::Members { .. }
            | F::Gone(_)
            | F::Format { .. }
            | F::Empty(_) => WARN_FAILED,
        }
    }
}

/// The running observer (see the module doc).
pub struct Observer {
    stop: CancellationToken,
    task: JoinHandle<Vec<Track>>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer").finish_non_exhaustive()
    }
}

struct Shared {
    metrics: Metrics,
    extra: Vec<String>,
    timeout: Duration,
    view: RunView,
    /// What the scrapes read so far, for [`Observer::live`].
    live: Arc<LiveStore>,
}

impl Observer {
    /// Builds the targets' TLS, takes the baseline (two scrapes a second
    /// apart, or the interval when shorter) and starts scraping every
    /// `cfg.every` on a task of its own. Call it before the first agent
    /// dials.
    pub async fn start(
        cfg: ObserveConfig,
        metrics: Metrics,
        view: RunView,
    ) -> Result<Observer, ObserveError> {
        let mut tracks = Vec::new();
        for target in cfg.targets {
            let tls = match &target {
                Target::Http(e) if e.url.starts_with("https://") || e.tls.is_some() => {
                    let t = e.tls.clone().unwrap_or_default();
                    Some(agent_sim_net::client_config(&t, &[b"http/1.1"])?)
                }
                _ => None,
            };
            let (kind, source) = match &target {
                Target::Pid(_) => (ServerKind::Process, "proc"),
                Target::Http(e) => (e.kind.unwrap_or(ServerKind::Other), "prometheus"),
            };
            tracks.push(Track {
                out: ServerSummary {
                    target: target.name(),
                    kind: kind.to_string(),
                    source: source.into(),
                    ..ServerSummary::default()
                },
                target,
                tls,
                json: false,
                prev: None,
                units: BTreeMap::new(),
                seen: BTreeSet::new(),
                gossip: None,
            });
        }
        if let Some(watch) = cfg.gossip {
            let consul = tracks.iter_mut().find_map(|t| match &t.target {
                Target::Http(e) if e.kind == Some(ServerKind::Consul) => Some((e.clone(), t)),
                _ => None,
            });
            if let Some((e, t)) = consul {
                t.gossip = Some(Gossip::new(&e, watch));
            }
        }
        let shared = Arc::new(Shared {
            metrics,
            extra: cfg.extra,
            timeout: cfg.every.mul_f64(0.8).max(Duration::from_millis(50)),
            view,
            live: Arc::default(),
        });
        let gap = cfg.every.min(Duration::from_secs(1));
        scrape_all(&shared, &mut tracks, None).await;
        tokio::time::sleep(gap).await;
        for t in &mut tracks {
            t.out.baseline.t_s = f64::NAN;
        }
        scrape_all(&shared, &mut tracks, Some(Phase::Baseline)).await;
        shared.live.start(tracks.iter().map(|t| (&t.out, &t.units)));
        let stop = CancellationToken::new();
        let (s, every, sh) = (stop.clone(), cfg.every, shared.clone());
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        scrape_all(&sh, &mut tracks, Some(Phase::Run)).await;
                        publish(&sh, &tracks);
                    }
                    _ = s.cancelled() => break,
                }
            }
            tracks
        });
        Ok(Observer { stop, task, shared })
    }

    /// Stops the interval scrapes, takes a last one (after the last agent
    /// left) and returns every target's section of the summary.
    pub async fn finish(self) -> Vec<ServerSummary> {
        self.stop.cancel();
        let Ok(mut tracks) = self.task.await else {
            return Vec::new();
        };
        scrape_all(&self.shared, &mut tracks, Some(Phase::Run)).await;
        settle(&self.shared, &mut tracks).await;
        tracks
            .into_iter()
            .map(|mut t| {
                t.out.gossip = t.gossip.map(|g| {
                    let out = g.track.finish();
                    if let (n @ 1.., Some(first)) = (out.failed_ever, out.first_failed_s) {
                        self.shared.metrics.warn(
                            WARN_MEMBERS_FAILED,
                            Some(&format!(
                                "the server marked {n} members failed (first at {first:.1}s): \
                                 the load box may be saturated (see gossip_acked_late) or the \
                                 network drops UDP"
                            )),
                        );
                    }
                    out
                });
                for name in &self.shared.extra {
                    if !t.seen.contains(name) && !t.seen.contains(&kinds::normalize(name)) {
                        t.out.notes.push(format!(
                            "--observe-metric {name}: this server exposed no such series"
                        ));
                    }
                }
                if t.out.baseline.t_s.is_nan() {
                    t.out.baseline.t_s = 0.0;
                    t.out.notes.push(
                        "no baseline: the server did not answer before the first agent dialed"
                            .into(),
                    );
                }
                figures::bound(&mut t.out.samples);
                if let Some(st) = t.out.storm.as_mut() {
                    figures::bound(&mut st.samples);
                }
                figures::summarize(&mut t.out, &t.units);
                t.out
            })
            .collect()
    }
}

impl Observer {
    /// A view of what the scrapes read so far, for use while the run goes on.
    pub fn live(&self) -> LiveView {
        LiveView::new(self.shared.live.clone())
    }
}

/// Copies each target's newest sample (and what it learned of units) to
/// the live view.
fn publish(shared: &Shared, tracks: &[Track]) {
    for (i, t) in tracks.iter().enumerate() {
        shared
            .live
            .publish(i, t.out.samples.last(), &t.out.kind, &t.units);
    }
}

/// Where a scrape's sample goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Baseline,
    Run,
}

/// Scrapes every target at once (each on its own task, bounded), then
/// records what came back. `phase` None: a first reading, no sample.
async fn scrape_all(shared: &Arc<Shared>, tracks: &mut [Track], phase: Option<Phase>) {
    let handles: Vec<JoinHandle<Scraped>> = tracks
        .iter()
        .map(|t| {
            let (target, tls, json, sh) = (t.target.clone(), t.tls.clone(), t.json, shared.clone());
            tokio::spawn(async move { scrape(&sh, &target, tls.as_ref(), json).await })
        })
        .collect();
    let polls: Vec<Option<JoinHandle<Poll>>> = tracks
        .iter()
        .map(|t| match (&t.target, &t.gossip, phase) {
            (Target::Http(ep), Some(g), Some(_)) => Some(spawn_poll(shared, ep, t.tls.clone(), g)),
            _ => None,
        })
        .collect();
    for (t, h) in tracks.iter_mut().zip(handles) {
        let mut got = h.await.unwrap_or_else(|source| {
            Scraped::Failed(Failure::Task {
                what: "scrape",
                source,
            })
        });
        if matches!(got, Scraped::Empty)
            && let Target::Http(e) = &t.target
            && e.json_fallback.is_some()
            && !t.json
        {
            shared.metrics.warn(
                WARN_NO_PROMETHEUS,
                Some(&format!("GET {}: 200 with an empty body", e.url)),
            );
            t.json = true;
            t.out.source = "consul-json".into();
            t.out.notes.push(
                "the Prometheus URL answered 200 with an empty body (no telemetry { \
                 prometheus_retention_time }): read from /v1/agent/metrics (JSON), which has no \
                 process CPU or RSS, and whose latencies are 10-second means and maxima (shown as \
                 p50 and p99)"
                    .into(),
            );
            got = scrape(shared, &t.target, t.tls.as_ref(), true).await;
        }
        match got {
            Scraped::Read(r, run) => record(t, r, run, phase),
            Scraped::Empty => fail(shared, t, Failure::Empty(t.target.name())),
            Scraped::Failed(why) => fail(shared, t, why),
        }
    }
    for (t, h) in tracks.iter_mut().zip(polls) {
        if let (Some(h), Some(phase)) = (h, phase) {
            let got = h.await.unwrap_or_else(|source| {
                Err(Failure::Task {
                    what: "members poll",
                    source,
                })
            });
            polled(shared, t, got, phase);
        }
    }
}

/// Polls the members on a task of its own, bounded by the scrape timeout.
fn spawn_poll(
    shared: &Arc<Shared>,
    ep: &Endpoint,
    tls: Option<Arc<ClientConfig>>,
    g: &Gossip,
) -> JoinHandle<Poll> {
    let (sh, ep, watch) = (shared.clone(), ep.clone(), g.watch.clone());
    let urls = (g.members_url.clone(), g.critical_url.clone());
    tokio::spawn(async move {
        let work = poll_members(&sh, &ep, tls.as_ref(), &urls, watch);
        match tokio::time::timeout(sh.timeout, work).await {
            Ok(p) => p,
            Err(_) => Err(Failure::PollTimeout {
                url: urls.0.clone(),
                timeout: sh.timeout,
            }),
        }
    })
}

/// Records a members poll in the track (a failure is `observe_failed`).
fn polled(shared: &Shared, t: &mut Track, got: Poll, phase: Phase) {
    let Some(g) = t.gossip.as_mut() else {
        return;
    };
    match got {
        Ok((p, _)) if phase == Phase::Baseline => g.track.baseline(p),
        Ok((p, run)) => g.track.record(run.t_s, p),
        Err(why) => {
            g.track.failed();
            shared.metrics.warn(why.kind(), Some(&why.to_string()));
        }
    }
}

/// After the last scrape: while the server still lists members alive or
/// leaving, and they were to leave, asks again (bounded: see the consts).
async fn settle(shared: &Arc<Shared>, tracks: &mut [Track]) {
    let until = tokio::time::Instant::now() + SETTLE_FOR;
    for t in tracks.iter_mut() {
        while let (Target::Http(ep), Some(g)) = (&t.target, &t.gossip) {
            if !g.watch.expect_left || !g.track.unsettled() {
                break;
            }
            if tokio::time::Instant::now() + SETTLE_EVERY > until {
                break;
            }
            tokio::time::sleep(SETTLE_EVERY).await;
            let h = spawn_poll(shared, ep, t.tls.clone(), g);
            let got = h.await.unwrap_or_else(|source| {
                Err(Failure::Task {
                    what: "members poll",
                    source,
                })
            });
            polled(shared, t, got, Phase::Run);
        }
    }
}

/// GETs the members and the critical checks at once, and parses them off
/// the async workers.
async fn poll_members(
    shared: &Shared,
    ep: &Endpoint,
    tls: Option<&Arc<ClientConfig>>,
    (members_url, critical_url): &(String, String),
    watch: GossipWatch,
) -> Poll {
    let (m, c) = tokio::join!(
        fetch_ok(ep, members_url, tls),
        fetch_ok(ep, critical_url, tls)
    );
    let (m, c) = (m?, c?);
    let run = shared.view.now();
    let parsed = tokio::task::spawn_blocking(move || {
        Ok::<_, ObserveError>(Polled {
            members: members::parse_members(&m, &watch)?,
            critical: members::parse_critical(&c, &watch)?,
        })
    })
    .await
    .map_err(|source| Failure::Task {
        what: "members parse",
        source,
    })?;
    parsed.map(|p| (p, run)).map_err(|source| Failure::Members {
        members: members_url.clone(),
        critical: critical_url.clone(),
        source,
    })
}

/// The run's state at an answer, timed halfway between the request and
/// the answer: a busy server reads its counters somewhere in between, and
/// stamping them at the answer alone would shorten the next interval by the
/// whole delay (a server pinned to one core read as two).
fn at_midpoint(sent_s: f64, answered: RunState) -> RunState {
    RunState {
        t_s: sent_s + (answered.t_s - sent_s).max(0.0) / 2.0,
        ..answered
    }
}

/// A GET that answered 200, its body; else the server's words.
async fn fetch_ok(
    ep: &Endpoint,
    url: &str,
    tls: Option<&Arc<ClientConfig>>,
) -> Result<bytes::Bytes, Failure> {
    let answer = fetch::get(ep, url, tls)
        .await
        .map_err(|source| Failure::Get {
            url: url.to_owned(),
            source,
        })?;
    if answer.status != http::StatusCode::OK {
        return Err(refused(url, &answer));
    }
    Ok(answer.body)
}

/// `GET url: HTTP 403: <the server's first words>`.
fn refused(url: &str, answer: &agent_sim_net::http::Answer) -> Failure {
    let words = String::from_utf8_lossy(&answer.body[..answer.body.len().min(200)])
        .trim()
        .to_string();
    Failure::Refused {
        url: url.to_owned(),
        status: answer.status,
        words,
    }
}

fn fail(shared: &Shared, t: &mut Track, why: Failure) {
    t.out.failed += 1;
    // `why` names the URL (`GET …: …`) or the process.
    shared.metrics.warn(why.kind(), Some(&why.to_string()));
}

fn record(t: &mut Track, r: Reading, run: RunState, phase: Option<Phase>) {
    t.out.scrapes += 1;
    if let Some(k) = r.kind
        && t.out.kind != ServerKind::Process.to_string()
        && (t.out.kind == ServerKind::Other.to_string() || k != ServerKind::Other)
    {
        t.out.kind = k.to_string();
    }
    for name in r.series.keys() {
        t.seen.insert(name.clone());
        t.seen.insert(kinds::normalize(name));
        if let Some((_, unit)) = kinds::latency_unit(name) {
            t.units.insert(kinds::normalize(name), unit);
        }
    }
    let prev = t.prev.take();
    let mut s: ServerSample = figures::sample(prev.as_ref().map(|(p, st)| (p, st.t_s)), &r, run);
    if let Some((_, before)) = &prev {
        s.steady = before.ramp_done && !before.ending && !run.ending;
    }
    match phase {
        Some(Phase::Baseline) => t.out.baseline = s,
        Some(Phase::Run) => {
            t.out.samples.push(s);
            let before = prev.as_ref().map(|(p, st)| (p, st.t_s));
            storm::record(&mut t.out.storm, before, &r, run.t_s);
        }
        None => {}
    }
    t.prev = Some((r, run));
}

/// One scrape of one target, bounded by the timeout.
async fn scrape(
    shared: &Arc<Shared>,
    target: &Target,
    tls: Option<&Arc<ClientConfig>>,
    json: bool,
) -> Scraped {
    let work = async {
        match target {
            Target::Pid(pid) => {
                let pid = *pid;
                let read = tokio::task::spawn_blocking(move || {
                    agent_sim_metrics::process::read_pid(
                        std::path::Path::new("/proc"),
                        &pid.to_string(),
                    )
                })
                .await
                .ok()
                .flatten();
                match read {
                    Some(p) => Scraped::Read(reading::from_proc(&p), shared.view.now()),
                    None => Scraped::Failed(Failure::Gone(pid)),
                }
            }
            Target::Http(ep) => scrape_http(shared, ep, tls, json).await,
        }
    };
    match tokio::time::timeout(shared.timeout, work).await {
        Ok(s) => s,
        Err(_) => Scraped::Failed(Failure::ScrapeTimeout(shared.timeout)),
    }
}

async fn scrape_http(
    shared: &Arc<Shared>,
    ep: &Endpoint,
    tls: Option<&Arc<ClientConfig>>,
    json: bool,
) -> Scraped {
    let url = match (&ep.json_fallback, json) {
        (Some(j), true) => j.clone(),
        _ => ep.url.clone(),
    };
    let sent = shared.view.now().t_s;
    let answer = match fetch::get(ep, &url, tls).await {
        Ok(a) => a,
        Err(source) => return Scraped::Failed(Failure::Get { url, source }),
    };
    let run = at_midpoint(sent, shared.view.now());
    if answer.status != http::StatusCode::OK {
        return Scraped::Failed(refused(&url, &answer));
    }
    if answer.body.iter().all(u8::is_ascii_whitespace) {
        return Scraped::Empty;
    }
    let (extra, hint, bytes) = (shared.extra.clone(), ep.kind, answer.body.len());
    let parsed = tokio::task::spawn_blocking(move || {
        let text = String::from_utf8_lossy(&answer.body);
        let keep = |kind: ServerKind, name: &str| {
            let kind = if kind == ServerKind::Other {
                hint.unwrap_or(kind)
            } else {
                kind
            };
            kinds::kept(kind, name, &extra)
        };
        if json {
            reading::parse_consul_json(&text, &keep)
        } else {
            reading::parse_prometheus(&text, &keep)
        }
    })
    .await
    .unwrap_or_default();
    if parsed.exposed == 0 {
        return Scraped::Failed(Failure::Format {
            url,
            format: if json {
                "Consul's JSON metrics"
            } else {
                "the Prometheus text format"
            },
            bytes,
        });
    }
    Scraped::Read(parsed, run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_answer_is_timed_halfway() {
        let answered = RunState {
            t_s: 14.0,
            agents: 7,
            ..RunState::default()
        };
        let r = at_midpoint(10.0, answered);
        assert_eq!((r.t_s, r.agents), (12.0, 7));
        // A prompt answer keeps its own time.
        assert_eq!(at_midpoint(14.0, answered).t_s, 14.0);
    }
}
