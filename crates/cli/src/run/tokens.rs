//! Each Consul agent's own ACL token (`--acl-tokens`): had before the
//! fleet's first agent boots, and the ones the run created deleted after
//! its last agent ended. A fleet whose tokens cannot be had does not start
//! (its agents would only be denied): the run ends with the cause counted.

use std::sync::Arc;

use agent_sim_consul::ConsulFactory;
use agent_sim_metrics::Metrics;
use tokio_util::sync::CancellationToken;

use crate::plan::FleetPlan;

/// The kind a fleet whose tokens could not be had counts.
pub(super) const ACL_TOKENS: agent_sim_metrics::ErrorKindSpec = agent_sim_metrics::ErrorKindSpec {
    kind: "acl_tokens",
    hint: "--acl-tokens: the agents' own tokens could not be had. node-identity creates them \
           with --token, which must be a token with acl:write (a management token) on servers \
           with ACLs on; a FILE needs one secret per line for every agent index",
    heals: false,
    said_by: agent_sim_metrics::Speaker::Server,
};

/// Gets the tokens of every Consul fleet; `false` (the cause counted as
/// [`ACL_TOKENS`]) when one fleet's could not be had.
pub(super) async fn provision(
    fleets: &[(&FleetPlan, Arc<ConsulFactory>)],
    metrics: &Metrics,
    end: &CancellationToken,
    show: bool,
) -> bool {
    for (plan, f) in fleets {
        let (first, count) = (plan.fleet.first_index, plan.fleet.agents);
        let progress = |n: u64| {
            if show && n > 0 {
                eprintln!("agent-sim: ACL tokens: {n}/{count} created");
            }
        };
        match f.provision_tokens(first, count, end, &progress).await {
            Ok(0) => {}
            Ok(n) => {
                if show {
                    eprintln!("agent-sim: ACL tokens: {n} agents carry their own");
                }
            }
            Err(e) => {
                metrics.error_with(ACL_TOKENS.kind, Some(&e.to_string()));
                if show {
                    eprintln!("agent-sim: {e}; the fleet does not start");
                }
                return false;
            }
        }
    }
    true
}

/// Deletes the tokens the run created (every fleet tried); a failure is
/// counted as [`ACL_TOKENS`], naming `agent-sim cleanup`.
pub(super) async fn release(
    fleets: &[(&FleetPlan, Arc<ConsulFactory>)],
    metrics: &Metrics,
    show: bool,
) {
    for (_, f) in fleets {
        let (deleted, failed) = f.release_tokens().await;
        if show && deleted > 0 {
            eprintln!("agent-sim: ACL tokens: {deleted} deleted");
        }
        if let Some(e) = failed {
            let words = e.words().unwrap_or_else(|| e.kind.to_owned());
            metrics.error_with(
                ACL_TOKENS.kind,
                Some(&format!(
                    "deleting the run's ACL tokens: {} ({words}); `agent-sim cleanup` removes \
                     what is left",
                    e.kind
                )),
            );
        }
    }
}
