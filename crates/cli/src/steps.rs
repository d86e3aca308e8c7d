//! A stepped run's plan (`--steps`, `--step-hold`, `--step-settle`,
//! `--slo`, `--steps-past`): the steps' counts and times, laid out once
//! from the whole fleet's figures so that every process of the run (local
//! children, `--shard` boxes) keeps the same clock.
//!
//! Step `k` starts at `at_k`; its new agents start on the fleet's boot
//! (`--ramp`: the step's new agents at the rate; `--boot-window`: within
//! the window; `--ramp all`: at once); `--step-settle` later its window
//! opens and lasts `--step-hold`; the next step starts when it closes. A
//! process takes its share of every step (agents in proportion to the
//! slice of the fleet it holds, the shares adding up to the step exactly).
//!
//! What it is not: the judging (`run::stepper`) or the answer's figures
//! (`agent_sim_metrics::capacity`).

use std::time::Duration;

use agent_sim_fleet::{Boot, FleetConfig, Step};
use agent_sim_metrics::assert::Assertion;

use crate::args::RunArgs;
use crate::plan::{FleetPlan, Protocol, StepPlan, StepTimes, UsageError};

/// The SLOs of a kind when none are given.
pub fn default_slos(protocol: &Protocol) -> Vec<&'static str> {
    let mut out = vec!["agents.connected == requested", "errors.total == 0"];
    // A latency each window has samples of: the keepalives, the probes'
    // deliveries (a step's connects fall before its window).
    out.extend(match protocol {
        Protocol::Sensu(_) => Some("keepalive_lateness.p99 < 1s"),
        Protocol::Consul(c) => c.probe.kind.map(|_| "propagation.p99 < 1s"),
        Protocol::Dataplane(d) => d.probe.kind.map(|_| "propagation_xds.p99 < 1s"),
    });
    out
}

/// The agent count a stepped run asks the fleet for (its last step), or
/// the refusal of steps that cannot be run.
pub fn fleet_agents(top: &RunArgs, agents_given: bool) -> Result<Option<u64>, UsageError> {
    let Some(&last) = top.steps.last() else {
        if !top.slos.is_empty() {
            return Err(UsageError(
                "--slo judges the steps of --steps; give --steps too (--assert judges a whole run)"
                    .into(),
            ));
        }
        return Ok(None);
    };
    if top.steps[0] == 0 || top.steps.windows(2).any(|w| w[0] >= w[1]) {
        return Err(UsageError(format!(
            "--steps {}: each step must hold more agents than the one before, the first at least 1",
            join(&top.steps)
        )));
    }
    if agents_given && top.agents != Some(last) {
        return Err(UsageError(format!(
            "--agents {} and --steps ending at {last}: a stepped run's fleet is its last step; drop --agents",
            top.agents.unwrap_or_default()
        )));
    }
    if top.duration.is_some() {
        return Err(UsageError(
            "--duration and --steps: a stepped run lasts as its steps do (--step-settle and --step-hold each)".into(),
        ));
    }
    Ok(Some(last))
}

fn join(v: &[u64]) -> String {
    v.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

/// The plan of a stepped run over `fleets` (one), with this process's
/// share of each step handed to its engine.
pub fn plan(top: &RunArgs, fleets: &mut [FleetPlan]) -> Result<Option<StepPlan>, UsageError> {
    if top.steps.is_empty() {
        return Ok(None);
    }
    let [plan] = fleets else {
        return Err(UsageError(
            "--steps grows one fleet: [[fleet]] sections cannot be stepped".into(),
        ));
    };
    let hold = top.step_hold.map(|s| s.0).unwrap_or_default();
    if hold.is_zero() {
        return Err(UsageError("--step-hold must be longer than zero".into()));
    }
    let settle = top.step_settle.map(|s| s.0).unwrap_or_default();
    let steps = lay_out(&top.steps, &plan.fleet, plan.total_agents, settle, hold);
    plan.fleet.steps = steps
        .iter()
        .map(|s| Step {
            agents: s.here,
            at: s.at,
        })
        .collect();
    let default_slos = top.slos.is_empty();
    let slos = if default_slos {
        default_slos_of(&plan.protocol)
    } else {
        top.slos.clone()
    };
    Ok(Some(StepPlan {
        steps,
        hold,
        settle,
        slos,
        default_slos,
        past: top.steps_past.unwrap_or_default(),
    }))
}

fn default_slos_of(protocol: &Protocol) -> Vec<Assertion> {
    default_slos(protocol)
        .into_iter()
        .map(|s| s.parse().expect("the default SLOs parse"))
        .collect()
}

/// The steps' times and this process's shares. `fleet` is this process's
/// slice (its first index and agents) of `total` agents, its ramp the
/// whole fleet's rate.
fn lay_out(
    counts: &[u64],
    fleet: &FleetConfig,
    total: u64,
    settle: Duration,
    hold: Duration,
) -> Vec<StepTimes> {
    let (first, end) = (fleet.first_index, fleet.first_index + fleet.agents);
    let total = total.max(1);
    // Agents of `c` that fall in this slice: the shares of all slices add
    // up to `c`.
    let share = |c: u64| {
        let upto = |i: u64| (u128::from(c) * u128::from(i) / u128::from(total)) as u64;
        upto(end) - upto(first)
    };
    let mut at = Duration::ZERO;
    let mut before = 0;
    counts
        .iter()
        .map(|&c| {
            let boot = match fleet.boot() {
                Boot::AllAtOnce => Duration::ZERO,
                Boot::Ramp(rate) => rate.interval().mul_f64((c - before) as f64),
                Boot::Window(w) => w,
            };
            let open = at + boot + settle;
            let step = StepTimes {
                agents: c,
                here: share(c),
                at,
                window: (open, open + hold),
            };
            (at, before) = (open + hold, c);
            step
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_sim_fleet::Rate;

    fn fleet(first: u64, agents: u64, ramp: Option<f64>) -> FleetConfig {
        FleetConfig {
            first_index: first,
            agents,
            ramp: ramp.map(Rate::per_second),
            ..FleetConfig::default()
        }
    }

    #[test]
    fn each_step_ramps_its_new_agents_then_settles_then_holds() {
        let s = Duration::from_secs;
        let steps = lay_out(&[100, 300], &fleet(0, 300, Some(100.0)), 300, s(5), s(30));
        assert_eq!(steps[0].at, s(0));
        assert_eq!(steps[0].window, (s(6), s(36)), "1 s of ramp, 5 s settling");
        assert_eq!(steps[1].at, s(36));
        assert_eq!(steps[1].window, (s(36 + 2 + 5), s(36 + 2 + 5 + 30)));
        assert_eq!((steps[0].here, steps[1].here), (100, 300));
    }

    #[test]
    fn the_shards_shares_add_up_to_every_step() {
        let (total, counts) = (1_000, [7, 333, 1_000]);
        let slices = [(0, 334), (334, 333), (667, 333)];
        for (k, &c) in counts.iter().enumerate() {
            let sum: u64 = slices
                .iter()
                .map(|&(f, n)| {
                    let z = Duration::ZERO;
                    lay_out(
                        &counts,
                        &fleet(f, n, None),
                        total,
                        z,
                        Duration::from_secs(1),
                    )[k]
                        .here
                })
                .sum();
            assert_eq!(sum, c, "step {k}");
        }
        // The last step is each slice whole.
        let last = lay_out(
            &counts,
            &fleet(334, 333, None),
            total,
            Duration::ZERO,
            Duration::from_secs(1),
        );
        assert_eq!(last[2].here, 333);
    }

    #[test]
    fn each_kind_has_slos_its_windows_have_samples_of() {
        let consul = |probe: Option<agent_sim_consul::ProbeKind>| {
            let mut c = agent_sim_consul::ConsulConfig::default();
            c.probe.kind = probe;
            Protocol::Consul(Box::new(c))
        };
        let first = ["agents.connected == requested", "errors.total == 0"];
        let sensu = default_slos(&Protocol::Sensu(Default::default()));
        assert_eq!(sensu[..2], first);
        assert_eq!(sensu[2], "keepalive_lateness.p99 < 1s");
        let probed = default_slos(&consul(Some(agent_sim_consul::ProbeKind::Catalog)));
        assert_eq!(probed[2], "propagation.p99 < 1s");
        assert_eq!(
            default_slos(&consul(None)),
            first,
            "no probe, no propagation SLO"
        );
        let mut dp = agent_sim_dataplane::DataplaneConfig::default();
        dp.probe.kind = Some(agent_sim_consul::ProbeKind::Catalog);
        assert_eq!(
            default_slos(&Protocol::Dataplane(dp))[2],
            "propagation_xds.p99 < 1s"
        );
        for slo in sensu.iter().chain(&probed) {
            slo.parse::<Assertion>().unwrap();
        }
    }

    #[test]
    fn steps_that_do_not_grow_or_fight_other_flags_are_refused() {
        let args = |f: fn(&mut RunArgs)| {
            let mut a = RunArgs {
                steps: vec![10, 20],
                agents: Some(20),
                ..RunArgs::default()
            };
            f(&mut a);
            a
        };
        let refused = |a: RunArgs, given: bool| fleet_agents(&a, given).unwrap_err().0;
        assert!(
            refused(args(|a| a.steps = vec![10, 10]), false)
                .contains("more agents than the one before")
        );
        assert!(refused(args(|a| a.steps = vec![0, 10]), false).contains("the first at least 1"));
        assert!(refused(args(|a| a.agents = Some(30)), true).contains("drop --agents"));
        assert!(
            refused(args(|a| a.duration = Some("1m".parse().unwrap())), false)
                .contains("lasts as its steps do")
        );
        assert!(
            refused(
                RunArgs {
                    slos: vec!["errors.total == 0".parse().unwrap()],
                    ..RunArgs::default()
                },
                false
            )
            .contains("give --steps too")
        );
        assert_eq!(fleet_agents(&args(|_| {}), true).unwrap(), Some(20));
    }
}
