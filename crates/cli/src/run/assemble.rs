//! Summary assembly: the fleets' reports, the metrics, the probes and the
//! reporter's timeline of a finished run become one [`Summary`] (schema v2),
//! with the run's effective settings as its `config`.

use std::collections::BTreeMap;
use std::time::{Instant, SystemTime};

use agent_sim_fleet::FleetReport;
use agent_sim_metrics::spread::ServerLevels;
use agent_sim_metrics::summary::{AgentCounts, KindEntry, Outcome, SCHEMA_V2, TimelineSample};
use agent_sim_metrics::units::rfc3339;
use agent_sim_metrics::{KindReport, LatencySummary, Metrics, ProbeSummary, Summary};

use crate::plan::{FleetPlan, Protocol, RunConfig};

/// Everything a finished run hands to [`summary`].
pub(super) struct Finished<'a> {
    pub cfg: &'a RunConfig,
    pub metrics: &'a Metrics,
    pub reports: &'a [FleetReport],
    pub probes: Vec<ProbeSummary>,
    pub started_wall: SystemTime,
    pub started: Instant,
    pub timeline: Vec<TimelineSample>,
}

fn targets_of(plan: &FleetPlan) -> Vec<String> {
    plan.targets()
}

/// Agents that held a session at least once, over every fleet.
pub(super) fn ever_connected(reports: &[FleetReport]) -> u64 {
    reports.iter().map(|r| r.ever_connected).sum()
}

fn entries(kinds: Vec<KindReport>) -> BTreeMap<String, KindEntry> {
    kinds
        .into_iter()
        .map(|k| {
            (
                k.kind,
                KindEntry {
                    count: k.stat.count,
                    first_seen_s: k.stat.first_seen.as_secs_f64(),
                    sample: k.stat.sample,
                    hint: k.hint.map(str::to_string),
                    heals: k.heals,
                    said_by: k.said_by,
                },
            )
        })
        .collect()
}

/// Adds maps of counts by cause over the fleets.
fn add_up<'a>(
    maps: impl Iterator<Item = &'a BTreeMap<&'static str, u64>>,
) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for m in maps {
        for (k, v) in m {
            *out.entry(k.to_string()).or_insert(0) += v;
        }
    }
    out
}

/// Builds the run summary from the last collection of the metrics. The
/// outcome is left for [`super::outcome`] to decide.
pub(super) fn summary(f: Finished<'_>) -> Summary {
    f.metrics.collect();
    if f.cfg.fleets.iter().any(|p| {
        matches!(
            p.protocol,
            crate::plan::Protocol::Consul(_) | crate::plan::Protocol::Dataplane(_)
        )
    }) {
        agent_sim_consul::check_overhead(f.metrics);
    }
    let snap = f.metrics.snapshot();
    let duration_s = f.started.elapsed().as_secs_f64();
    let requested: u64 = f.cfg.fleets.iter().map(|p| p.fleet.agents).sum();
    let latency_us = f
        .metrics
        .cumulative()
        .into_iter()
        .map(|(name, h)| (name.to_string(), LatencySummary::from_histogram(&h)))
        .collect();
    let values: BTreeMap<String, u64> = snap
        .counters
        .iter()
        .map(|(n, v)| (n.to_string(), *v))
        .collect();
    let rated = rated_counters(f.cfg);
    let rates_per_s = values
        .iter()
        .filter(|(n, v)| **v > 0 && rated.contains(&n.as_str()))
        .map(|(n, v)| (n.clone(), *v as f64 / duration_s.max(1e-9)))
        .collect();
    let ever = ever_connected(f.reports);
    let connected: u64 = f.reports.iter().map(|r| r.connected_at_end).sum();
    let (server_names, at_end) = servers_at_end(f.cfg, f.reports);
    let timeline = ended_at(f.timeline, connected, &at_end);
    let by_server = agent_sim_metrics::spread::spread(&server_names, &timeline, &at_end);
    Summary {
        schema: SCHEMA_V2.into(),
        kind: f.cfg.kind().into(),
        targets: f.cfg.fleets.iter().flat_map(targets_of).collect(),
        started_at: rfc3339(f.started_wall),
        duration_s,
        agents: AgentCounts {
            requested,
            connected,
            peak_connected: snap.peak_connected.max(0) as u64,
            ever_connected: ever,
            never_connected: requested.saturating_sub(ever),
            lost_not_back: f.reports.iter().map(|r| r.lost_not_back).sum(),
            left: f.reports.iter().map(|r| r.left).sum(),
        },
        outcome: Outcome {
            missing: add_up(f.reports.iter().map(|r| &r.missing)),
            ..Outcome::default()
        },
        counters: values,
        errors: entries(f.metrics.error_report()),
        warnings: entries(f.metrics.warning_report()),
        sessions_lost: add_up(f.reports.iter().map(|r| &r.sessions_lost)),
        denied: f.metrics.denial_report(),
        latency_us,
        rates_per_s,
        process: agent_sim_metrics::process::stats(),
        probes: f.probes,
        // Filled in from the fleets' certificate boards after the run.
        connect: None,
        shard: f.cfg.shard.map(|s| s.to_string()),
        shard_from: f.cfg.shard_from.as_ref().map(ToString::to_string),
        timeline,
        by_server,
        config: Some(f.cfg.effective.clone()),
        vault: None,
        study: f.cfg.study.clone(),
        disruptions: f.metrics.disruptions().summaries(),
        // Filled in by the observer after the run, when it observed.
        server: Vec::new(),
        // Filled in by the stepped run's judge.
        capacity: None,
        step_windows: Vec::new(),
    }
}

/// The timeline's last sample is taken after shutdown (for its counters):
/// its levels are the sessions held when the run ended, not the zero the
/// simulator's own shutdown leaves.
fn ended_at(
    mut timeline: Vec<TimelineSample>,
    connected: u64,
    servers: &ServerLevels,
) -> Vec<TimelineSample> {
    if let Some(last) = timeline.last_mut() {
        last.connected = connected;
        if !last.held_by_server.is_empty() {
            last.held_by_server = servers.held.clone();
        }
    }
    timeline
}

/// The servers of the fleets that kept sessions per server (their targets
/// one after the other), and the counts when shutdown began.
fn servers_at_end(cfg: &RunConfig, reports: &[FleetReport]) -> (Vec<String>, ServerLevels) {
    let mut names = Vec::new();
    let mut levels = ServerLevels::default();
    for (plan, report) in cfg.fleets.iter().zip(reports) {
        if let Some(c) = &report.servers {
            names.extend(targets_of(plan));
            levels.held.extend(c.held.iter().copied());
            levels.connects.extend(c.connects.iter().copied());
        }
    }
    (names, levels)
}

/// Counters whose rate means something, as the fleets' protocols say.
pub(super) fn rated_counters(cfg: &RunConfig) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for plan in &cfg.fleets {
        let names = match plan.protocol {
            Protocol::Sensu(_) => agent_sim_sensu::RATED_COUNTERS,
            Protocol::Consul(_) => agent_sim_consul::RATED_COUNTERS,
            Protocol::Dataplane(_) => agent_sim_dataplane::RATED_COUNTERS,
        };
        let vault = match &plan.protocol {
            Protocol::Consul(c) if c.vault.is_some() => agent_sim_consul::vault::RATED_COUNTERS,
            _ => &[],
        };
        for n in names.iter().chain(vault) {
            if !out.contains(n) {
                out.push(n);
            }
        }
    }
    out
}
