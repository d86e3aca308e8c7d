//! Connect in a run: the `--rotate-ca-at` timer (the CA configuration
//! changed once, from the fleets' first dial, so that the servers make a
//! new root) and the summary's `connect` section, read from the fleets'
//! certificate boards and the run's latencies.

use std::sync::{Arc, Mutex, PoisonError};

use agent_sim_consul::ca_rotation::rotate_ca;
use agent_sim_consul::connect::ConnectBoard;
use agent_sim_metrics::summary::{ConnectSummary, RotationSummary};
use agent_sim_metrics::{Metrics, Summary};
use tokio_util::sync::CancellationToken;

use super::Built;
use crate::plan::{Protocol, RunConfig};

/// Why a fleet's sidecars hold no certificate (a warning of the run,
/// `no_leaf_certs`): on the HTTP API's wire nothing signs a client
/// agent's CSR.
fn api_wire_note(plan: &crate::plan::FleetPlan) -> Option<String> {
    let Protocol::Consul(c) = &plan.protocol else {
        return None;
    };
    (c.sidecars && c.connect.leaf_certs && c.agent == agent_sim_consul::modes::AgentWire::Api).then(
        || {
            "--sidecars on --consul-agent api: the agents keep no leaf certificate (a server's \
             HTTP API has no endpoint that signs a client agent's CSR; ConnectCA.Sign is on the \
             client wire)"
                .to_string()
        },
    )
}

/// The fleets' boards and what the rotation did.
pub(super) struct Connect {
    boards: Vec<(Arc<ConnectBoard>, u64)>,
    refused: Arc<Mutex<Option<String>>>,
}

/// Starts the rotation timer of the first Consul fleet that asks for one
/// (its board times the agents); the boards of every fleet keeping
/// certificates are kept for the summary.
pub(super) fn start(
    cfg: &RunConfig,
    built: &[Built],
    metrics: &Metrics,
    end: &CancellationToken,
) -> Connect {
    let refused = Arc::new(Mutex::new(None));
    let mut boards = Vec::new();
    let mut timer_set = false;
    for (plan, b) in cfg.fleets.iter().zip(built) {
        if let Some(note) = api_wire_note(plan) {
            metrics.warn("no_leaf_certs", Some(&note));
        }
        let (Protocol::Consul(c), Built::Consul(f)) = (&plan.protocol, b) else {
            continue;
        };
        let Some(board) = f.connect_board() else {
            continue;
        };
        boards.push((board.clone(), plan.fleet.agents));
        let Some(at) = c.connect.rotate_at.filter(|_| !timer_set) else {
            continue;
        };
        timer_set = true;
        let api = agent_sim_consul::http_api(c);
        let (end, metrics, refused) = (end.clone(), metrics.clone(), refused.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = end.cancelled() => return,
                _ = tokio::time::sleep(at) => {}
            }
            let r = match api {
                Ok(api) => rotate_ca(&api, Some(&board)).await.map_err(|e| {
                    metrics.error_with("ca_rotation_failed", e.words().as_deref());
                    e.words().unwrap_or_else(|| e.kind.to_string())
                }),
                Err(e) => Err(e.to_string()),
            };
            if let Err(words) = r {
                *refused.lock().unwrap_or_else(PoisonError::into_inner) = Some(words);
            }
        });
    }
    Connect { boards, refused }
}

impl Connect {
    /// The summary's `connect` section (none when no fleet keeps
    /// certificates).
    pub(super) fn summary(&self, s: &Summary) -> Option<ConnectSummary> {
        if self.boards.is_empty() {
            return None;
        }
        let agents: u64 = self.boards.iter().map(|(_, n)| n).sum();
        let (holding, rotated) = self
            .boards
            .iter()
            .map(|(b, _)| b.counts())
            .fold((0, 0), |a, c| (a.0 + c.0, a.1 + c.1));
        let lat = |n: &str| s.latency_us.get(n);
        let max_s = |n: &str| lat(n).filter(|l| l.count > 0).map(|l| l.max as f64 / 1e6);
        let ms = |v: u64| v as f64 / 1e3;
        let counter = |n: &str| s.counters.get(n).copied().unwrap_or(0);
        let sign = lat(agent_sim_consul::names::LEAF_SIGN);
        let rotation = self.boards.iter().find_map(|(b, _)| {
            let at = b.rotation()?;
            let at_s = b
                .first_dial()
                .map_or(0.0, |d| at.saturating_duration_since(d).as_secs_f64());
            Some(RotationSummary {
                at_s,
                rotated,
                all_after_s: max_s(agent_sim_consul::names::LEAF_ROTATION)
                    .filter(|_| holding > 0 && rotated == holding),
                error: self
                    .refused
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone(),
            })
        });
        Some(ConnectSummary {
            agents,
            holding,
            boot_s: max_s(agent_sim_consul::names::LEAF_BOOT).filter(|_| holding == agents),
            issued: counter(agent_sim_consul::names::LEAF_CERTS_ISSUED),
            renewed: counter(agent_sim_consul::names::LEAF_CERTS_RENEWED),
            rate_limited: counter(agent_sim_consul::names::LEAF_RATE_LIMITED),
            sign_p50_ms: sign.map_or(0.0, |l| ms(l.p50)),
            sign_p99_ms: sign.map_or(0.0, |l| ms(l.p99)),
            rotation,
        })
    }
}
