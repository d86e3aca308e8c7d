//! Executes a validated [`RunConfig`]: starts the embedded backend when no
//! target was given, runs every fleet on the fleet engine, reports progress,
//! writes hlog intervals and the Prometheus endpoint while it runs, and on the
//! way out (deadline, Ctrl-C or SIGTERM) ALWAYS builds the summary, writes it
//! and evaluates the assertions.

use std::collections::BTreeMap;
use std::io::IsTerminal as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use agent_sim_consul::ConsulFactory;
use agent_sim_fleet::{FleetReport, FleetStatus};
use agent_sim_metrics::assert::{Verdict, evaluate, render_verdicts};
use agent_sim_metrics::hlog::HlogWriter;
use agent_sim_metrics::summary::{AgentCounts, Counters, SCHEMA_V1, rfc3339};
use agent_sim_metrics::{LatencySummary, Metrics, MetricsSpec, ProbeSummary, Summary};
use agent_sim_sensu::SensuFactory;
use agent_sim_server::consul::{ConsulState, ConsulTargetConfig};
use agent_sim_server::sensu::{CheckSpec, SensuTargetConfig, SensuTargetStats};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{FleetPlan, Protocol, RunConfig};
use crate::progress::Progress;

/// Process exit codes (documented in the README).
pub mod exit {
    /// Run completed (and every assertion held).
    pub const OK: i32 = 0;
    /// Runtime failure (no session could be established, a file could not be written, ...).
    pub const FAILURE: i32 = 1;
    /// At least one `--assert` failed.
    pub const SLO_FAILED: i32 = 3;
    /// Bad usage (flags, config file, host limits).
    pub const USAGE: i32 = 64;
}

/// Errors that end a run before it produces a summary.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Bad usage (exit 64).
    #[error(transparent)]
    Usage(#[from] crate::config::UsageError),
    /// A protocol crate refused its configuration (exit 64).
    #[error("{0}")]
    Setup(String),
    /// Local I/O (binding the embedded target, writing results).
    #[error("{0}")]
    Io(String),
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

/// The in-process backends of a demo run.
struct Embedded {
    token: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    sensu_stats: Option<Arc<SensuTargetStats>>,
    consul_state: Option<ConsulState>,
}

async fn start_embedded(cfg: &mut RunConfig) -> Result<Embedded, RunError> {
    let token = CancellationToken::new();
    let mut emb = Embedded {
        token: token.clone(),
        tasks: Vec::new(),
        sensu_stats: None,
        consul_state: None,
    };
    let local: SocketAddr = ([127, 0, 0, 1], 0).into();
    let cfg_check_interval = cfg.embedded_check_interval;
    let bind = |what: &str| {
        agent_sim_server::listen::bind(local, false)
            .map_err(|e| RunError::Io(format!("embedded {what} target: bind 127.0.0.1: {e}")))
    };
    for plan in cfg.fleets.iter_mut().filter(|p| p.embedded) {
        match &mut plan.protocol {
            Protocol::Sensu(s) => {
                let listener = bind("sensu")?;
                let addr = listener
                    .local_addr()
                    .map_err(|e| RunError::Io(e.to_string()))?;
                let tcfg = SensuTargetConfig {
                    namespaces: vec![s.namespace.clone()],
                    user: s.user.clone(),
                    password: s.password.clone(),
                    checks: vec![CheckSpec {
                        name: "agent-sim-check".into(),
                        command: "!sensu_test_check!".into(),
                        interval: cfg_check_interval,
                        subscriptions: s.subscriptions.clone(),
                    }],
                    ..SensuTargetConfig::default()
                };
                let stats = Arc::new(SensuTargetStats::default());
                emb.sensu_stats = Some(stats.clone());
                let t = token.clone();
                emb.tasks.push(tokio::spawn(async move {
                    if let Err(e) = agent_sim_server::sensu::serve(listener, tcfg, stats, t).await {
                        eprintln!("agent-sim: embedded sensu target: {e}");
                    }
                }));
                s.targets = vec![format!("ws://{addr}/")];
            }
            Protocol::Consul(c) => {
                let state = emb
                    .consul_state
                    .get_or_insert_with(|| ConsulState::new(ConsulTargetConfig::default()))
                    .clone();
                let rpc = bind("consul rpc")?;
                let http = bind("consul http")?;
                let rpc_addr = rpc.local_addr().map_err(|e| RunError::Io(e.to_string()))?;
                let http_addr = http.local_addr().map_err(|e| RunError::Io(e.to_string()))?;
                let (t1, t2, s2) = (token.clone(), token.clone(), state.clone());
                emb.tasks.push(tokio::spawn(async move {
                    if let Err(e) = agent_sim_server::consul::serve_rpc(rpc, state, t1).await {
                        eprintln!("agent-sim: embedded consul rpc target: {e}");
                    }
                }));
                emb.tasks.push(tokio::spawn(async move {
                    if let Err(e) = agent_sim_server::consul::serve_http(http, s2, t2).await {
                        eprintln!("agent-sim: embedded consul http target: {e}");
                    }
                }));
                c.rpc_targets = vec![rpc_addr.to_string()];
                c.http_target = http_addr.to_string();
            }
        }
    }
    Ok(emb)
}

fn metrics_spec(cfg: &RunConfig) -> MetricsSpec {
    let mut spec = agent_sim_fleet::metrics_spec();
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
    }
    spec
}

fn targets_of(plan: &FleetPlan) -> Vec<String> {
    match &plan.protocol {
        Protocol::Sensu(s) => s.targets.clone(),
        Protocol::Consul(c) => c.rpc_targets.clone(),
    }
}

/// Runs `cfg` until its duration elapses or `shutdown` is cancelled.
pub async fn execute(
    mut cfg: RunConfig,
    shutdown: CancellationToken,
    output: Output,
) -> Result<RunOutcome, RunError> {
    let started_wall = SystemTime::now();
    let started = Instant::now();
    let embedded = start_embedded(&mut cfg).await?;

    let threads = tokio::runtime::Handle::current().metrics().num_workers();
    let metrics = Metrics::new(&metrics_spec(&cfg), (threads * 4).max(4));

    // Protocol factories validate their own settings before any dial.
    enum Built {
        Sensu(Arc<SensuFactory>),
        Consul(Arc<ConsulFactory>),
    }
    let mut built = Vec::new();
    for plan in &cfg.fleets {
        built.push(match &plan.protocol {
            Protocol::Sensu(s) => Built::Sensu(Arc::new(
                SensuFactory::new(s.clone(), metrics.clone())
                    .map_err(|e| RunError::Setup(e.to_string()))?,
            )),
            Protocol::Consul(c) => Built::Consul(Arc::new(
                ConsulFactory::new(c.clone(), metrics.clone())
                    .map_err(|e| RunError::Setup(e.to_string()))?,
            )),
        });
    }

    // One end-of-run token for every fleet and the probe runners.
    let run_end = CancellationToken::new();
    {
        let (run_end, shutdown, duration) = (run_end.clone(), shutdown.clone(), cfg.duration);
        tokio::spawn(async move {
            match duration {
                Some(d) => tokio::select! {
                    _ = tokio::time::sleep(d) => {}
                    _ = shutdown.cancelled() => {}
                },
                None => shutdown.cancelled().await,
            }
            run_end.cancel();
        });
    }

    // Prometheus endpoint.
    let metrics_task = match cfg.metrics_addr {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| RunError::Io(format!("--metrics-addr {addr}: {e}")))?;
            let (m, t) = (metrics.clone(), run_end.clone());
            Some(tokio::spawn(async move {
                let _ = agent_sim_metrics::prometheus::serve(listener, m, async move {
                    t.cancelled().await
                })
                .await;
            }))
        }
        None => None,
    };

    // Reporter: collect every second, progress, hlog.
    let statuses: Vec<Arc<FleetStatus>> = cfg
        .fleets
        .iter()
        .map(|_| Arc::new(FleetStatus::default()))
        .collect();
    let requested: u64 = cfg.fleets.iter().map(|f| f.fleet.agents).sum();
    let mut hlog = match &cfg.hlog {
        Some(p) => Some(
            HlogWriter::create(p, started_wall)
                .map_err(|e| RunError::Io(format!("--hlog {}: {e}", p.display())))?,
        ),
        None => None,
    };
    let reporter_stop = CancellationToken::new();
    let reporter = {
        let metrics = metrics.clone();
        let statuses = statuses.clone();
        let stop = reporter_stop.clone();
        let show = output == Output::Terminal && !cfg.quiet;
        let mut progress = Progress::new(
            requested,
            std::io::stderr().is_terminal(),
            cfg.progress_every,
            cfg.kind(),
        );
        let hlog_interval = cfg.hlog_interval;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut pending: BTreeMap<&'static str, hdrhistogram::Histogram<u64>> = BTreeMap::new();
            let mut window_start = Duration::ZERO;
            loop {
                let stopping = tokio::select! {
                    _ = tick.tick() => false,
                    _ = stop.cancelled() => true,
                };
                let interval = metrics.collect();
                let now = started.elapsed();
                if let Some(w) = hlog.as_mut() {
                    for (name, h) in interval {
                        let acc = pending
                            .entry(name)
                            .or_insert_with(agent_sim_metrics::new_latency_histogram);
                        let _ = acc.add(&h);
                    }
                    if stopping || now.saturating_sub(window_start) >= hlog_interval {
                        for (name, h) in &pending {
                            if let Err(e) =
                                w.write_interval(window_start, now - window_start, name, h)
                            {
                                eprintln!("agent-sim: --hlog: {e}");
                            }
                        }
                        let _ = w.flush();
                        pending.clear();
                        window_start = now;
                    }
                }
                if show {
                    let started_agents = statuses
                        .iter()
                        .map(|s| s.started.load(std::sync::atomic::Ordering::Relaxed))
                        .sum();
                    progress.tick(now, &metrics.snapshot(), started_agents, stopping);
                }
                if stopping {
                    break;
                }
            }
        })
    };

    // Run every fleet (and the probe runners) to the end.
    let mut fleet_tasks: Vec<JoinHandle<FleetReport>> = Vec::new();
    let mut probe_tasks: Vec<JoinHandle<Vec<ProbeSummary>>> = Vec::new();
    for ((plan, b), status) in cfg.fleets.iter().zip(built).zip(&statuses) {
        let mut fc = plan.fleet.clone();
        fc.duration = None;
        fc.grace = cfg.grace;
        let (m, s, t) = (metrics.clone(), status.clone(), run_end.clone());
        match b {
            Built::Sensu(f) => fleet_tasks.push(tokio::spawn(agent_sim_fleet::run(fc, f, m, s, t))),
            Built::Consul(f) => {
                if let Some(runner) = f.probe_runner() {
                    let t = run_end.clone();
                    probe_tasks.push(tokio::spawn(async move { runner.run(t).await }));
                } else if let Some(observer) = f.probe_observer() {
                    // Another shard makes the changes; this one reports what
                    // its agents saw, by raft index, for `report merge`.
                    let t = run_end.clone();
                    probe_tasks.push(tokio::spawn(observer.run(t)));
                }
                fleet_tasks.push(tokio::spawn(agent_sim_fleet::run(fc, f, m, s, t)));
            }
        }
    }
    let mut reports = Vec::new();
    for t in fleet_tasks {
        if let Ok(r) = t.await {
            reports.push(r);
        }
    }
    let mut probes = Vec::new();
    for t in probe_tasks {
        if let Ok(p) = t.await {
            probes.extend(p);
        }
    }
    reporter_stop.cancel();
    // The reporter's last pass collected, wrote and flushed the final interval.
    let _ = reporter.await;
    embedded.token.cancel();
    for t in embedded.tasks {
        let _ = tokio::time::timeout(Duration::from_secs(3), t).await;
    }
    if let Some(t) = metrics_task {
        t.abort();
    }
    let embedded_sensu = embedded.sensu_stats.as_ref().map(|s| s.snapshot());
    let embedded_consul = embedded.consul_state.as_ref().map(|s| s.stats());

    // The summary.
    metrics.collect();
    let snap = metrics.snapshot();
    let duration_s = started.elapsed().as_secs_f64();
    let ever: u64 = reports.iter().map(|r| r.ever_connected).sum();
    let mut latency_us = BTreeMap::new();
    for (name, h) in metrics.cumulative() {
        latency_us.insert(name.to_string(), LatencySummary::from_histogram(&h));
    }
    let values: BTreeMap<String, u64> = snap
        .counters
        .iter()
        .map(|(n, v)| (n.to_string(), *v))
        .collect();
    let rates_per_s = values
        .iter()
        .filter(|(_, v)| **v > 0)
        .map(|(n, v)| (n.clone(), *v as f64 / duration_s.max(1e-9)))
        .collect();
    let summary = Summary {
        schema: SCHEMA_V1.into(),
        kind: cfg.kind().into(),
        targets: cfg.fleets.iter().flat_map(targets_of).collect(),
        started_at: rfc3339(started_wall),
        duration_s,
        agents: AgentCounts {
            requested,
            connected: reports.iter().map(|r| r.connected_at_end).sum(),
            peak_connected: snap.peak_connected.max(0) as u64,
            failed: requested.saturating_sub(ever),
        },
        counters: Counters {
            values,
            errors: snap.errors.clone(),
        },
        latency_us,
        rates_per_s,
        process: agent_sim_metrics::process::stats(),
        probes,
        shard: cfg.shard.map(|s| s.to_string()),
    };
    let mut problem = None;
    let mut exit_code = exit::OK;
    if let Some(path) = &cfg.summary
        && let Err(e) = summary.write(path)
    {
        problem = Some(format!("--summary {}: {e}", path.display()));
        exit_code = exit::FAILURE;
    }
    if requested > 0 && ever == 0 && exit_code == exit::OK {
        problem = Some("no agent could establish a session (see errors above)".into());
        exit_code = exit::FAILURE;
    }
    let verdicts = evaluate(&cfg.asserts, &summary);
    if verdicts.iter().any(|v| !v.passed) && exit_code == exit::OK {
        exit_code = exit::SLO_FAILED;
        problem = Some("at least one --assert failed".into());
    }
    if output == Output::Terminal {
        print!("{}", agent_sim_metrics::report::render(&summary));
        if let Some(r) = reports.iter().filter_map(|r| r.ramp_elapsed).max() {
            let all = if reports.iter().all(|r| r.all_connected_after.is_some()) {
                reports.iter().filter_map(|r| r.all_connected_after).max()
            } else {
                None
            };
            match all {
                Some(a) => println!(
                    "ramp       {requested} agent(s) started in {:.2}s, all connected after {:.2}s ({:.0} sessions/s)",
                    r.as_secs_f64(),
                    a.as_secs_f64(),
                    requested as f64 / a.as_secs_f64().max(1e-3)
                ),
                None => println!(
                    "ramp       {requested} agent(s) started in {:.2}s, not all connected",
                    r.as_secs_f64()
                ),
            }
        }
        if !verdicts.is_empty() {
            print!("{}", render_verdicts(&verdicts));
        }
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
