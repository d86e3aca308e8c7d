//! Before a run registers anything in a Consul cluster: refuse when nodes
//! this run would register already exist, marked as an agent-sim run's of
//! the same prefix (a killed run's leftovers, or a concurrent run over the
//! same indexes). Registering them again would take over objects this run
//! did not create, and its cleanup would delete them.

use std::time::Duration;

use agent_sim_consul::ConsulConfig;
use agent_sim_consul::cleanup::cleanup;

use crate::plan::{FleetPlan, Protocol};

/// How long the catalog may take to answer; a cluster that does not answer
/// in time is not checked (the agents' own retries report it).
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// The refusal: node names a fleet would register that already exist,
/// marked as an agent-sim run's of the same prefix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{count} node(s) this run would register already exist, marked as an agent-sim run's \
     with prefix {prefix:?} (e.g. {example}): a killed run left them or another run uses \
     the same names. Remove them with `agent-sim cleanup --kind {kind} --target ...` \
     (try --dry-run first), or choose another --name-prefix"
)]
pub struct NamesTaken {
    /// How many of the fleet's node names exist.
    pub count: usize,
    /// The run's name prefix.
    pub prefix: String,
    /// One of them.
    pub example: String,
    /// The fleet's kind, as `cleanup --kind` names it.
    pub kind: &'static str,
}

/// The node name of agent `i` of a run with a prefix.
type NodeName = fn(&str, u64) -> String;

/// The Consul settings to list a fleet's nodes with, and its node names;
/// `None` for fleets that register nothing.
fn registering(plan: &FleetPlan) -> Option<(ConsulConfig, NodeName)> {
    match &plan.protocol {
        Protocol::Consul(c) if c.register && !plan.embedded => {
            Some(((**c).clone(), agent_sim_consul::http::node_name))
        }
        Protocol::Dataplane(d) if d.adopt.is_none() && !plan.embedded => {
            Some((d.as_consul(), agent_sim_dataplane::node_name))
        }
        _ => None,
    }
}

/// The refusal, in one line, if a fleet's node names are taken.
pub(super) async fn refuse_taken(fleets: &[FleetPlan]) -> Result<(), NamesTaken> {
    for plan in fleets {
        let Some((c, name_of)) = registering(plan) else {
            continue;
        };
        let Ok(api) = agent_sim_consul::http_api(&c) else {
            continue;
        };
        let found =
            match tokio::time::timeout(CHECK_TIMEOUT, cleanup(&api, &c.conn.name_prefix, true))
                .await
            {
                Ok(Ok(r)) => r,
                _ => continue,
            };
        let first = plan.fleet.first_index;
        let ours: std::collections::HashSet<String> = (first..first + plan.fleet.agents)
            .map(|i| name_of(&c.conn.name_prefix, i))
            .collect();
        let taken: Vec<&String> = found.nodes.iter().filter(|n| ours.contains(*n)).collect();
        if let Some(example) = taken.first() {
            return Err(NamesTaken {
                count: taken.len(),
                prefix: c.conn.name_prefix.clone(),
                example: example.to_string(),
                kind: match plan.protocol {
                    Protocol::Dataplane(_) => "consul-dataplane",
                    _ => "consul",
                },
            });
        }
    }
    Ok(())
}
