//! Executes a validated [`RunConfig`]: starts the embedded backend when no
//! target was given, runs every fleet on the fleet engine, reports progress,
//! writes hlog intervals and the Prometheus endpoint while it runs, and on the
//! way out (deadline, Ctrl-C or SIGTERM) ALWAYS builds the summary, writes it
//! and evaluates the assertions.
//!
//! Parts: `embedded` (the in-process backends), `observe` (the servers
//! watched during the run, `--observe`), `reporter` (progress,
//! hlog, timeline and latency windows task), `assemble` (the summary),
//! `outcome` (exit code and the final table); [`execute`] only sequences
//! them, and writes the report page (`--report-html`) last.

mod assemble;
mod connect;
mod embedded;
mod observe;
mod outcome;
mod reporter;
mod stepper;
mod taken;
mod tokens;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use agent_sim_consul::{ConsulFactory, ProbeRunner};
use agent_sim_dataplane::DataplaneFactory;
use agent_sim_fleet::{FleetReport, FleetStatus};
use agent_sim_metrics::assert::{Verdict, evaluate};
use agent_sim_metrics::hlog::HlogWriter;
use agent_sim_metrics::{Metrics, MetricsSpec, ProbeSummary, Summary};
use agent_sim_sensu::SensuFactory;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::plan::{Protocol, RunConfig};
use reporter::{Reporter, ReporterSetup};

pub use crate::exit;
pub(crate) use outcome::decide;
pub use taken::NamesTaken;

/// Errors that end a run before it produces a summary.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Bad usage (exit 64).
    #[error(transparent)]
    Usage(#[from] crate::plan::UsageError),
    /// The Sensu crate refused its configuration (exit 64).
    #[error(transparent)]
    Sensu(#[from] agent_sim_sensu::SensuError),
    /// The Consul crate refused its configuration (exit 64).
    #[error(transparent)]
    Consul(#[from] agent_sim_consul::ConsulError),
    /// The dataplane crate refused its configuration (exit 64).
    #[error(transparent)]
    Dataplane(#[from] agent_sim_dataplane::DataplaneError),
    /// The gossip settings cannot make the embedded servers' (exit 64).
    #[error(transparent)]
    Gossip(#[from] agent_sim_consul::gossip::GossipError),
    /// The servers to observe cannot be watched (exit 64).
    #[error("--observe: {0}")]
    Observe(#[source] agent_sim_observe::ObserveError),
    /// Node names the run would register exist already (exit 64).
    #[error(transparent)]
    Taken(#[from] NamesTaken),
    /// An embedded backend cannot listen.
    #[error("embedded {what} target: bind 127.0.0.1: {source}")]
    EmbeddedBind {
        /// Which backend (`sensu`, `consul`).
        what: &'static str,
        /// What the socket said.
        source: std::io::Error,
    },
    /// The Prometheus endpoint cannot listen.
    #[error("--metrics-addr {addr}: {source}")]
    MetricsAddr {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// What the socket said.
        source: std::io::Error,
    },
    /// The interval log cannot be created.
    #[error("--hlog {}: {source}", path.display())]
    Hlog {
        /// The path asked for.
        path: std::path::PathBuf,
        /// Why it cannot be written.
        source: agent_sim_metrics::MetricsError,
    },
}

impl RunError {
    /// Whether the run was refused as asked (bad usage, exit 64) rather
    /// than failed on this host.
    pub fn is_usage(&self) -> bool {
        !matches!(
            self,
            RunError::EmbeddedBind { .. } | RunError::MetricsAddr { .. } | RunError::Hlog { .. }
        )
    }
}

/// What a finished run produced.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// The run summary (also written to `--summary`).
    pub summary: Summary,
    /// Verdicts of the `--assert` expressions.
    pub verdicts: Vec<Verdict>,
    /// The exit code the binary uses.
    pub exit_code: i32,
    /// Why the exit code is not 0, in one line.
    pub problem: Option<String>,
    /// What the embedded Sensu target counted (demo runs).
    pub embedded_sensu: Option<agent_sim_server::sensu::SensuTargetSnapshot>,
    /// What the embedded Consul target counted (demo runs).
    pub embedded_consul: Option<agent_sim_server::consul::ConsulTargetSnapshot>,
}

/// Where human output goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// Live progress on stderr and the final table on stdout.
    Terminal,
    /// Nothing printed (library use, tests).
    Silent,
}

/// A seeded service (`--seed-service`) not registered or not removed.
const SEED_FAILED: agent_sim_metrics::ErrorKindSpec = agent_sim_metrics::ErrorKindSpec {
    kind: "seed_failed",
    hint: "--seed-service: the seeded service could not be registered (the agents watched \
           less than asked) or removed (`agent-sim cleanup` removes it); the sample names \
           the step and the answer",
    heals: false,
    said_by: agent_sim_metrics::Speaker::Server,
};

fn metrics_spec(cfg: &RunConfig) -> MetricsSpec {
    let mut spec = agent_sim_fleet::metrics_spec();
    if cfg.observe.is_some() {
        spec = spec.merge(&MetricsSpec {
            errors: agent_sim_observe::warning_kinds(),
            ..MetricsSpec::default()
        });
    }
    if cfg
        .fleets
        .iter()
        .any(|f| matches!(f.protocol, Protocol::Sensu(_)))
    {
        spec = spec.merge(&agent_sim_sensu::metrics_spec());
    }
    if cfg
        .fleets
        .iter()
        .any(|f| matches!(f.protocol, Protocol::Consul(_)))
    {
        spec = spec.merge(&agent_sim_consul::metrics_spec());
        if cfg
            .fleets
            .iter()
            .any(|f| matches!(&f.protocol, Protocol::Consul(c) if c.seed.is_some()))
        {
            spec = spec.merge(&MetricsSpec {
                errors: vec![SEED_FAILED],
                ..MetricsSpec::default()
            });
        }
        if cfg
            .fleets
            .iter()
            .any(|f| matches!(&f.protocol, Protocol::Consul(c) if c.acl_tokens.is_some()))
        {
            spec = spec.merge(&MetricsSpec {
                errors: vec![tokens::ACL_TOKENS],
                ..MetricsSpec::default()
            });
        }
    }
    if cfg
        .fleets
        .iter()
        .any(|f| matches!(&f.protocol, Protocol::Consul(c) if c.vault.is_some()))
    {
        spec = spec.merge(&agent_sim_consul::vault::metrics_spec());
    }
    if cfg
        .fleets
        .iter()
        .any(|f| matches!(f.protocol, Protocol::Dataplane(_)))
    {
        spec = spec.merge(&agent_sim_dataplane::metrics_spec());
    }
    spec
}

/// The protocol factories of a run's fleets (each validated its settings).
enum Built {
    Sensu(Arc<SensuFactory>),
    Consul(Arc<ConsulFactory>),
    Dataplane(Arc<DataplaneFactory>),
}

fn build_factories(cfg: &RunConfig, metrics: &Metrics) -> Result<Vec<Built>, RunError> {
    cfg.fleets
        .iter()
        .map(|plan| {
            Ok(match &plan.protocol {
                Protocol::Sensu(s) => {
                    Built::Sensu(Arc::new(SensuFactory::new(s.clone(), metrics.clone())?))
                }
                Protocol::Consul(c) => Built::Consul(Arc::new(ConsulFactory::new(
                    (**c).clone(),
                    metrics.clone(),
                )?)),
                Protocol::Dataplane(c) => {
                    Built::Dataplane(Arc::new(DataplaneFactory::new(c.clone(), metrics.clone())?))
                }
            })
        })
        .collect()
}

/// A token cancelled when the run's duration has elapsed or `shutdown` fires.
fn run_end(duration: Option<Duration>, shutdown: CancellationToken) -> CancellationToken {
    let end = CancellationToken::new();
    let fire = end.clone();
    tokio::spawn(async move {
        match duration {
            Some(d) => tokio::select! {
                _ = tokio::time::sleep(d) => {}
                _ = shutdown.cancelled() => {}
            },
            None => shutdown.cancelled().await,
        }
        fire.cancel();
    });
    end
}

/// Serves Prometheus `/metrics` until `end`.
async fn serve_metrics(
    addr: std::net::SocketAddr,
    metrics: &Metrics,
    end: &CancellationToken,
) -> Result<JoinHandle<()>, RunError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| RunError::MetricsAddr { addr, source })?;
    let (m, t) = (metrics.clone(), end.clone());
    Ok(tokio::spawn(async move {
        let _ =
            agent_sim_metrics::prometheus::serve(listener, m, async move { t.cancelled().await })
                .await;
    }))
}

/// The probe runners of a run: one per probed service (and a Consul
/// fleet's second probe kind). A dataplane fleet probing the same service
/// as another fleet hands its board to that fleet's runner, so one change
/// is timed at Subscribe agents and sidecars alike (a probe summary per
/// fleet).
fn probe_runners(built: &[Built]) -> Vec<ProbeRunner> {
    let mut runners: Vec<ProbeRunner> = built
        .iter()
        .flat_map(|b| match b {
            Built::Consul(f) => f.probe_runners(),
            _ => Vec::new(),
        })
        .collect();
    for b in built {
        if let Built::Dataplane(f) = b
            && !runners.iter_mut().any(|r| f.attach_to(r))
            && let Some(r) = f.probe_runner()
        {
            runners.push(r);
        }
    }
    runners
}

/// What the probe runners and observers measured, in the order the
/// changes were made (a second probe kind's come between the first's); the
/// entries of one change stay together.
async fn probes_made(tasks: Vec<JoinHandle<Vec<ProbeSummary>>>) -> Vec<ProbeSummary> {
    let mut probes = Vec::new();
    for t in tasks {
        if let Ok(p) = t.await {
            probes.extend(p);
        }
    }
    probes.sort_by_key(|p| p.t0_unix_us);
    probes
}

/// The Vault servers of the run's Consul fleets (`--vault-nodes`); a
/// fleet whose settings cannot make them counts the reason.
fn vault_runners(cfg: &RunConfig, metrics: &Metrics) -> Vec<agent_sim_consul::vault::VaultRunner> {
    cfg.fleets
        .iter()
        .filter_map(|plan| match &plan.protocol {
            Protocol::Consul(c) => agent_sim_consul::vault::runner(c, metrics.clone())
                .unwrap_or_else(|e| {
                    metrics.error_with("vault_setup", Some(&e.to_string()));
                    None
                }),
            _ => None,
        })
        .collect()
}

/// What the fleets' run produced besides the summary's own figures.
struct Ran {
    reports: Vec<FleetReport>,
    capacity: Option<stepper::Judged>,
    probes: Vec<ProbeSummary>,
    vault: Option<agent_sim_metrics::VaultSummary>,
    connect: connect::Connect,
}

/// Runs every fleet (and the probe runners or observers of Consul fleets)
/// until `end`, and returns the fleets' reports and the probes.
async fn run_fleets(
    cfg: &RunConfig,
    built: Vec<Built>,
    metrics: &Metrics,
    statuses: &[Arc<FleetStatus>],
    beside: &Beside,
    show: bool,
) -> Ran {
    let end = &beside.end;
    let mut fleet_tasks: tokio::task::JoinSet<FleetReport> = tokio::task::JoinSet::new();
    let mut probe_tasks: Vec<JoinHandle<Vec<ProbeSummary>>> = Vec::new();
    // Seeded services are in the catalog before the first agent dials.
    let seeded: Vec<Arc<agent_sim_consul::ConsulFactory>> = built
        .iter()
        .filter_map(|b| match b {
            Built::Consul(f) => Some(f.clone()),
            _ => None,
        })
        .collect();
    // Each agent's own ACL token is had before it boots; without them the
    // fleets do not start.
    let consul_fleets: Vec<_> = cfg
        .fleets
        .iter()
        .zip(&built)
        .filter_map(|(p, b)| match b {
            Built::Consul(f) => Some((p, f.clone())),
            _ => None,
        })
        .collect();
    if !tokens::provision(&consul_fleets, metrics, end, show).await {
        end.cancel();
    }
    for f in &seeded {
        if let Err(e) = f.seed().await {
            seed_failed(metrics, "registering", &e);
        }
    }
    for runner in probe_runners(&built) {
        let t = end.clone();
        probe_tasks.push(tokio::spawn(async move { runner.run(t).await }));
    }
    let vault_tasks: Vec<JoinHandle<agent_sim_metrics::VaultSummary>> = vault_runners(cfg, metrics)
        .into_iter()
        .map(|r| tokio::spawn(r.run(end.clone())))
        .collect();
    // A --rotate-ca-at is timed from here, as the fleets' first dial.
    let connect = connect::start(cfg, &built, metrics, end);
    // Its clock starts with the fleets', as the engine's steps do.
    let judge = start_judge(cfg, metrics, beside, show);
    for ((plan, b), status) in cfg.fleets.iter().zip(built).zip(statuses) {
        let mut fc = plan.fleet.clone();
        fc.duration = None;
        fc.grace = cfg.grace;
        // With several servers, where the sessions are is kept per server.
        fc.servers = plan.targets();
        let (m, s, t) = (metrics.clone(), status.clone(), end.clone());
        match b {
            Built::Sensu(f) => {
                fleet_tasks.spawn(agent_sim_fleet::run(fc, f, m, s, t));
            }
            Built::Dataplane(f) => {
                fleet_tasks.spawn(agent_sim_fleet::run(fc, f, m, s, t));
            }
            Built::Consul(f) => {
                for observer in f.probe_observers() {
                    // Another shard makes the changes; this one reports what
                    // its agents saw, by change id, for `report merge`.
                    probe_tasks.push(tokio::spawn(observer.run(end.clone())));
                }
                fleet_tasks.spawn(agent_sim_fleet::run(fc, f, m, s, t));
            }
        }
    }
    let reports = fleet_reports(fleet_tasks, cfg.fleets.len(), end).await;
    let capacity = match judge {
        Some(j) => j.await.ok(),
        None => None,
    };
    let vault = vault_made(vault_tasks).await;
    let probes = probes_made(probe_tasks).await;
    for f in &seeded {
        f.close_gossip().await;
    }
    for f in &seeded {
        if let Err(e) = f.unseed().await {
            seed_failed(metrics, "removing", &e);
        }
    }
    tokens::release(&consul_fleets, metrics, show).await;
    Ran {
        reports,
        capacity,
        probes,
        vault,
        connect,
    }
}

/// The Vault study's summary, from the last of its runners that ended.
async fn vault_made(
    tasks: Vec<JoinHandle<agent_sim_metrics::VaultSummary>>,
) -> Option<agent_sim_metrics::VaultSummary> {
    let mut vault = None;
    for t in tasks {
        if let Ok(v) = t.await {
            vault = Some(v);
        }
    }
    vault
}

/// The judge of a stepped run (`--steps`), its clock starting now.
fn start_judge(
    cfg: &RunConfig,
    metrics: &Metrics,
    beside: &Beside,
    show: bool,
) -> Option<JoinHandle<stepper::Judged>> {
    let plan = cfg.steps.clone()?;
    let judge = stepper::Judge {
        plan,
        kind: cfg.kind().to_string(),
        rated: assemble::rated_counters(cfg),
        metrics: metrics.clone(),
        live: beside
            .observer
            .as_ref()
            .map(agent_sim_observe::Observer::live),
        started: beside.started,
        end: beside.end.clone(),
        show,
        sharded: cfg.shard.is_some(),
    };
    Some(judge.start())
}

/// The reports of the `total` fleets as they end. A fleet that stopped
/// early ends the run when it was fail-fast, or when every fleet has
/// stopped (nothing else is left to measure).
async fn fleet_reports(
    mut fleet_tasks: tokio::task::JoinSet<FleetReport>,
    total: usize,
    end: &CancellationToken,
) -> Vec<FleetReport> {
    let mut reports = Vec::new();
    let mut stopped = 0;
    while let Some(r) = fleet_tasks.join_next().await {
        let Ok(r) = r else { continue };
        if let Some(s) = &r.stopped {
            stopped += 1;
            if s.fail_fast || stopped == total {
                end.cancel();
            }
        }
        reports.push(r);
    }
    reports
}

/// A seeded service that could not be registered or removed: an error in
/// the server's words (`agent-sim cleanup` removes what is left).
fn seed_failed(metrics: &Metrics, doing: &str, e: &agent_sim_consul::http::HttpError) {
    let words = e.words().unwrap_or_else(|| e.kind.to_owned());
    metrics.error_with(
        SEED_FAILED.kind,
        Some(&format!("{doing} the seeded service: {} ({words})", e.kind)),
    );
}

/// Writes `--report-html` (atomically); the error in one line, if any.
fn report_page(
    cfg: &RunConfig,
    summary: &Summary,
    verdicts: &[Verdict],
    windows: &[agent_sim_metrics::timeline::LatencyWindow],
) -> Option<String> {
    let path = cfg.report_html.as_ref()?;
    let page = agent_sim_metrics::html::render(&agent_sim_metrics::html::Page {
        summary,
        verdicts,
        windows,
        sources: &[],
    });
    crate::results::write_atomically(path, &page)
        .err()
        .map(|e| format!("--report-html {}: {e}", path.display()))
}

/// Secrets never reach a sample of the server's words.
fn add_secrets(cfg: &RunConfig, metrics: &Metrics) {
    for plan in &cfg.fleets {
        match &plan.protocol {
            Protocol::Sensu(s) => metrics.add_secret(&s.password),
            Protocol::Consul(c) => {
                metrics.add_secret(c.conn.token.as_deref().unwrap_or_default());
                for k in c.gossip.iter().flat_map(|g| &g.keys) {
                    metrics.add_secret(k);
                }
            }
            Protocol::Dataplane(c) => {
                metrics.add_secret(c.conn.token.as_deref().unwrap_or_default())
            }
        }
    }
}

/// Runs `cfg` until its duration elapses or `shutdown` is cancelled, then
/// ALWAYS builds the summary, writes it and evaluates the assertions.
pub async fn execute(
    mut cfg: RunConfig,
    shutdown: CancellationToken,
    output: Output,
) -> Result<RunOutcome, RunError> {
    let started_wall = SystemTime::now();
    let started = Instant::now();
    let mut embedded = embedded::start(&mut cfg).await?;

    let threads = tokio::runtime::Handle::current().metrics().num_workers();
    let metrics = Metrics::new(&metrics_spec(&cfg), (threads * 4).max(4));
    add_secrets(&cfg, &metrics);
    let built = build_factories(&cfg, &metrics)?;
    taken::refuse_taken(&cfg.fleets).await?;
    let statuses: Vec<Arc<FleetStatus>> = cfg
        .fleets
        .iter()
        .map(|_| Arc::new(FleetStatus::default()))
        .collect();
    let clock = Clock {
        started,
        started_wall,
    };
    let beside = Beside::start(&cfg, &metrics, &statuses, clock, shutdown, output).await?;

    // A --server-down's time is from the fleets' first dial, as a storm's.
    embedded.schedule_downs(&cfg.server_downs, tokio::time::Instant::now());
    let show = output == Output::Terminal && !cfg.quiet;
    let ran = run_fleets(&cfg, built, &metrics, &statuses, &beside, show).await;

    let (recorded, servers) = beside.finish().await;
    let (embedded_sensu, embedded_consul) = embedded.stop().await;
    let mut summary = assemble::summary(assemble::Finished {
        cfg: &cfg,
        metrics: &metrics,
        reports: &ran.reports,
        probes: ran.probes,
        started_wall,
        started,
        timeline: recorded.timeline,
    });
    summary.server = servers;
    // What each Sensu connect cost the backend (a bcrypt check each with
    // passwords): the run's connects over the server's CPU above baseline.
    if let Some(&connects) = summary.counters.get("connects")
        && summary.kind == "sensu"
    {
        for s in &mut summary.server {
            s.set_cpu_per_connect(connects);
        }
    }
    summary.vault = ran.vault;
    if let Some(j) = ran.capacity {
        summary.capacity = Some(j.capacity);
        summary.step_windows = j.windows;
    }
    summary.connect = ran.connect.summary(&summary);
    let verdicts = conclude(&cfg, &mut summary, &ran.reports, &recorded.windows);
    let (exit_code, problem) = (summary.outcome.exit_code, summary.outcome.reason.clone());
    if output == Output::Terminal {
        outcome::print_report(&summary, &ran.reports, &verdicts, cfg.verbose);
    }
    Ok(RunOutcome {
        summary,
        verdicts,
        exit_code,
        problem,
        embedded_sensu,
        embedded_consul,
    })
}

/// When the run started, by the monotonic clock and by the wall's.
#[derive(Clone, Copy)]
struct Clock {
    started: Instant,
    started_wall: SystemTime,
}

/// What runs beside the fleets until the run's end: the servers observed
/// (`--observe`), the Prometheus endpoint and the reporter.
struct Beside {
    /// Cancelled when the run's duration has elapsed or on shutdown.
    end: CancellationToken,
    /// The run's time zero.
    started: Instant,
    observer: Option<agent_sim_observe::Observer>,
    metrics_task: Option<JoinHandle<()>>,
    reporter: Reporter,
}

impl Beside {
    /// Starts them; the observer's baseline is read before the run's clock
    /// starts and any agent dials.
    async fn start(
        cfg: &RunConfig,
        metrics: &Metrics,
        statuses: &[Arc<FleetStatus>],
        clock: Clock,
        shutdown: CancellationToken,
        output: Output,
    ) -> Result<Beside, RunError> {
        let ending = CancellationToken::new();
        let observer = match &cfg.observe {
            Some(o) => {
                let (o, e) = (o.clone(), ending.clone());
                Some(observe::start(o, cfg, metrics, statuses, clock.started, e).await?)
            }
            None => None,
        };
        let end = run_end(cfg.duration, shutdown);
        let e = end.clone();
        tokio::spawn(async move {
            e.cancelled().await;
            ending.cancel();
        });
        let metrics_task = match cfg.metrics_addr {
            Some(addr) => Some(serve_metrics(addr, metrics, &end).await?),
            None => None,
        };
        let hlog = match &cfg.hlog {
            Some(p) => Some(HlogWriter::create(p, clock.started_wall).map_err(|source| {
                RunError::Hlog {
                    path: p.clone(),
                    source,
                }
            })?),
            None => None,
        };
        let reporter = Reporter::start(ReporterSetup {
            cfg,
            metrics: metrics.clone(),
            statuses: statuses.to_vec(),
            hlog,
            started: clock.started,
            show: output == Output::Terminal && !cfg.quiet,
            windows: cfg.report_html.is_some(),
            end: end.clone(),
        });
        Ok(Beside {
            end,
            started: clock.started,
            observer,
            metrics_task,
            reporter,
        })
    }

    /// Stops them: what the reporter recorded and what the observer saw.
    async fn finish(
        self,
    ) -> (
        reporter::Recorded,
        Vec<agent_sim_metrics::server::ServerSummary>,
    ) {
        let recorded = self.reporter.finish().await;
        let servers = match self.observer {
            Some(o) => o.finish().await,
            None => Vec::new(),
        };
        if let Some(t) = self.metrics_task {
            t.abort();
        }
        (recorded, servers)
    }
}

/// Judges the run: the verdicts of its assertions and its outcome, with
/// the summary and the report page written (a failed write is part of the
/// outcome).
fn conclude(
    cfg: &RunConfig,
    summary: &mut Summary,
    reports: &[FleetReport],
    windows: &[agent_sim_metrics::timeline::LatencyWindow],
) -> Vec<Verdict> {
    let verdicts = evaluate(&cfg.asserts, summary);
    let stopped = reports
        .iter()
        .filter_map(|r| r.stopped.as_ref())
        .min_by_key(|s| !s.fail_fast)
        .cloned();
    summary.outcome = outcome::decide(summary, stopped.as_ref(), None, &verdicts);
    let write_error = cfg.summary.as_ref().and_then(|path| {
        summary
            .write(path)
            .err()
            .map(|e| format!("--summary {}: {e}", path.display()))
    });
    if write_error.is_some() {
        summary.outcome =
            outcome::decide(summary, stopped.as_ref(), write_error.clone(), &verdicts);
    }
    if let Some(e) = report_page(cfg, summary, &verdicts, windows) {
        let errors = [write_error, Some(e)]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>();
        summary.outcome = outcome::decide(
            summary,
            stopped.as_ref(),
            Some(errors.join("; ")),
            &verdicts,
        );
    }
    verdicts
}
