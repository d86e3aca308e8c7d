//! Summary assembly: the fleets' reports, the metrics and the probes of a
//! finished run become one [`Summary`] (schema v1).

use std::collections::BTreeMap;
use std::time::{Instant, SystemTime};

use agent_sim_fleet::FleetReport;
use agent_sim_metrics::summary::{AgentCounts, Counters, SCHEMA_V1, rfc3339};
use agent_sim_metrics::{LatencySummary, Metrics, ProbeSummary, Summary};

use crate::config::{FleetPlan, Protocol, RunConfig};

/// Everything a finished run hands to [`summary`].
pub(super) struct Finished<'a> {
    pub cfg: &'a RunConfig,
    pub metrics: &'a Metrics,
    pub reports: &'a [FleetReport],
    pub probes: Vec<ProbeSummary>,
    pub started_wall: SystemTime,
    pub started: Instant,
}

fn targets_of(plan: &FleetPlan) -> Vec<String> {
    match &plan.protocol {
        Protocol::Sensu(s) => s.targets.clone(),
        Protocol::Consul(c) => c.rpc_targets.clone(),
    }
}

/// Agents that held a session at least once, over every fleet.
pub(super) fn ever_connected(reports: &[FleetReport]) -> u64 {
    reports.iter().map(|r| r.ever_connected).sum()
}

/// Builds the run summary from the last collection of the metrics.
pub(super) fn summary(f: Finished<'_>) -> Summary {
    f.metrics.collect();
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
    let rates_per_s = values
        .iter()
        .filter(|(_, v)| **v > 0)
        .map(|(n, v)| (n.clone(), *v as f64 / duration_s.max(1e-9)))
        .collect();
    Summary {
        schema: SCHEMA_V1.into(),
        kind: f.cfg.kind().into(),
        targets: f.cfg.fleets.iter().flat_map(targets_of).collect(),
        started_at: rfc3339(f.started_wall),
        duration_s,
        agents: AgentCounts {
            requested,
            connected: f.reports.iter().map(|r| r.connected_at_end).sum(),
            peak_connected: snap.peak_connected.max(0) as u64,
            failed: requested.saturating_sub(ever_connected(f.reports)),
        },
        counters: Counters {
            values,
            errors: snap.errors.clone(),
        },
        latency_us,
        rates_per_s,
        process: agent_sim_metrics::process::stats(),
        probes: f.probes,
        shard: f.cfg.shard.map(|s| s.to_string()),
    }
}
