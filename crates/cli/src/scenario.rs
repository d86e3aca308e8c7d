//! The scenario flags and `[[scenario]]` sections of a run, mapped onto
//! each fleet's [`agent_sim_fleet::Scenario`] and reconnect policy.
//!
//! Flags (`--churn`, `--max-session-length`, `--storm`, `--pause`,
//! `--ramp-down`, `--reconnect`) and the same keys at the top of a config
//! file or in a `[[fleet]]` section apply to that fleet at absolute times.
//! `[[scenario]]` sections form a timeline: each holds exactly one of
//! `churn`, `max-session-length`, `storm`, `pause`, `ramp-down` (the same
//! values as the flags), with optional `at`, `until`, `for`, and `kind`
//! (only fleets of that kind; default every fleet); a section without `at`
//! starts when the one before it ends. The rules of what a timeline may be
//! are the fleet crate's ([`Scenario::plan`]); this module only names the
//! flag or section in its one-line errors, and says how long an agent
//! takes to come back (its first reconnect delay, a handshake, and for
//! Consul the staggered sync after a reconnect), which continuous phases
//! leave before the end of the run.

use std::time::Duration;

use agent_sim_fleet::scenario::{ChurnSpec, PauseSpec, PhaseSpec, RampDownSpec, StormSpec, What};
use agent_sim_fleet::{Backoff, ReconnectPolicy, Scenario};

use crate::args::RunArgs;
use crate::plan::{FleetPlan, Protocol, UsageError};

/// Allowance for a reconnect's handshake when continuous phases settle
/// before the end of a run.
const COMEBACK_HANDSHAKE: Duration = Duration::from_secs(1);
use crate::values::{Kind, Secs};

/// One `[[scenario]]` section of the config file.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct ScenarioSection {
    /// `churn = "5%/30s"`.
    pub churn: Option<ChurnSpec>,
    /// `max-session-length = "10m"`.
    pub max_session_length: Option<Secs>,
    /// `storm = "drop=100%"` (or `"at=60s,drop=100%"`).
    pub storm: Option<StormSpec>,
    /// `pause = "for=30s,share=10%"`.
    pub pause: Option<PauseSpec>,
    /// `ramp-down = "200/s"`.
    pub ramp_down: Option<RampDownSpec>,
    /// Start, from the start of the run (default: when the section before ends).
    pub at: Option<Secs>,
    /// End of a continuous phase.
    pub until: Option<Secs>,
    /// Length of a continuous phase, a pause, or the quiet time after a storm.
    #[serde(rename = "for")]
    pub length: Option<Secs>,
    /// Only fleets of this kind.
    pub kind: Option<Kind>,
}

/// Reads `[[scenario]]` sections out of a parsed config file.
pub fn sections(value: toml::Value, file: &str) -> Result<Vec<ScenarioSection>, UsageError> {
    let toml::Value::Array(items) = value else {
        return Err(UsageError(format!(
            "--config {file}: `scenario` must be [[scenario]] sections"
        )));
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            v.try_into::<ScenarioSection>().map_err(|e| {
                let text = e.to_string();
                let one_line: Vec<&str> = text
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .collect();
                UsageError(format!(
                    "--config {file}: [[scenario]] #{}: {}",
                    i + 1,
                    one_line.join(" ")
                ))
            })
        })
        .collect()
}

/// The phases of one section (`n` from 1, for messages).
fn section_spec(s: &ScenarioSection, n: usize) -> Result<PhaseSpec, UsageError> {
    let origin = format!("[[scenario]] #{n}");
    let mut whats = Vec::new();
    if let Some(c) = s.churn {
        whats.push(What::Churn(c));
    }
    if let Some(l) = s.max_session_length {
        whats.push(What::MaxSessionLength(l.0));
    }
    if let Some(st) = s.storm {
        whats.push(What::Storm(st));
    }
    if let Some(p) = s.pause {
        whats.push(What::Pause(p));
    }
    if let Some(r) = s.ramp_down {
        whats.push(What::RampDown(r));
    }
    let [what] = whats.as_slice() else {
        return Err(UsageError(format!(
            "{origin}: give exactly one of churn, max-session-length, storm, pause, ramp-down"
        )));
    };
    Ok(PhaseSpec {
        what: *what,
        at: s.at.map(|d| d.0),
        until: s.until.map(|d| d.0),
        length: s.length.map(|d| d.0),
        chained: true,
        origin,
    })
}

/// Sets the scenario, the reconnect policy and the report label of `plan`
/// from its layered arguments `a` and the config's `sections`.
pub fn apply(
    plan: &mut FleetPlan,
    a: &RunArgs,
    sections: &[ScenarioSection],
    duration: Option<Duration>,
) -> Result<(), UsageError> {
    let kind = plan.protocol.kind();
    let mut specs = Vec::new();
    for (i, s) in sections.iter().enumerate() {
        let spec = section_spec(s, i + 1)?;
        if s.kind.is_none_or(|k| k.to_string() == kind) {
            specs.push(spec);
        }
    }
    if let Some(c) = a.churn {
        specs.push(PhaseSpec::flag(What::Churn(c), "--churn"));
    }
    if let Some(l) = a.max_session_length {
        specs.push(PhaseSpec::flag(
            What::MaxSessionLength(l.0),
            "--max-session-length",
        ));
    }
    for s in &a.storms {
        specs.push(PhaseSpec::flag(What::Storm(*s), "--storm"));
    }
    for p in &a.pauses {
        specs.push(PhaseSpec::flag(What::Pause(*p), "--pause"));
    }
    if let Some(r) = a.ramp_down {
        specs.push(PhaseSpec::flag(What::RampDown(r), "--ramp-down"));
    }
    let policy = a.reconnect.unwrap_or_default();
    let protocol = match &plan.protocol {
        Protocol::Consul(c) => c.reconnect_sync_window(),
        // A sidecar reopens its ADS stream at once, with no sync to wait for.
        Protocol::Sensu(_) | Protocol::Dataplane(_) => Duration::ZERO,
    };
    let f = &mut plan.fleet;
    f.backoff = Backoff::with_policy(policy, f.backoff.min(), f.backoff.max());
    // How long an agent whose session the scenario ended takes to be back:
    // its first delay, a handshake, and Consul's staggered sync.
    let delay = match policy {
        ReconnectPolicy::None | ReconnectPolicy::SensuAgent => Duration::ZERO,
        _ => f.backoff.min(),
    };
    let comeback = delay + protocol + COMEBACK_HANDSHAKE;
    f.scenario = Scenario::plan(&specs, duration, f.agents, comeback)
        .map_err(|e| UsageError(e.to_string()))?;
    f.label = kind;
    Ok(())
}

/// A note for a fleet whose reconnect policy makes a synchronized burst
/// (`none`, `fixed`, `sensu-agent`: its first attempt after a held session
/// goes at once) that `--max-dialing` caps below the fleet's size: the
/// comeback after a storm or a restart is then only that wide.
pub fn capped_burst(plan: &FleetPlan) -> Option<String> {
    let f = &plan.fleet;
    let name = match f.backoff.policy() {
        ReconnectPolicy::None => "none",
        ReconnectPolicy::Fixed => "fixed",
        ReconnectPolicy::SensuAgent => "sensu-agent",
        ReconnectPolicy::Exponential | ReconnectPolicy::FullJitter => return None,
    };
    let agents = usize::try_from(f.agents).unwrap_or(usize::MAX);
    (f.max_dialing < agents).then(|| {
        format!(
            "{} fleet: --reconnect {name} comes back as one burst, but --max-dialing {} lets only \
             that many of its {agents} agents handshake at once; --max-dialing {agents} makes the \
             burst the whole fleet",
            plan.protocol.kind(),
            f.max_dialing
        )
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use agent_sim_fleet::scenario::Phase;
    use agent_sim_fleet::{Rate, ReconnectPolicy};

    use crate::args::RunArgs;
    use crate::config::resolve;

    use super::capped_burst;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// Resolves a run with config file `toml` and flags `f`.
    fn with_file(
        name: &str,
        toml: &str,
        f: impl FnOnce(&mut RunArgs),
    ) -> Result<crate::plan::RunConfig, crate::plan::UsageError> {
        let dir =
            std::env::temp_dir().join(format!("agent-sim-scen-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("run.toml");
        std::fs::write(&p, toml).unwrap();
        let mut a = RunArgs {
            config: Some(p),
            ..RunArgs::default()
        };
        f(&mut a);
        let r = resolve(a, &no_env);
        let _ = std::fs::remove_dir_all(&dir);
        r
    }

    #[test]
    fn sections_and_flags_make_each_fleets_timeline() {
        let c = with_file(
            "timeline",
            "duration = \"2m\"\nreconnect = \"full-jitter\"\n\
             [[fleet]]\nkind = \"sensu\"\nagents = 10\n\
             [[fleet]]\nkind = \"consul\"\nagents = 10\nstorm = [\"at=100s\"]\n\
             [[scenario]]\nchurn = \"5%/30s\"\nat = \"10s\"\nfor = \"20s\"\n\
             [[scenario]]\nstorm = \"drop=50%\"\nfor = \"10s\"\n\
             [[scenario]]\npause = \"for=5s,share=10%\"\nkind = \"consul\"\n",
            |a| a.pauses = vec!["at=90s,for=1s".parse().unwrap()],
        )
        .unwrap();
        let sensu = &c.fleets[0].fleet;
        assert_eq!(sensu.label, "sensu");
        assert_eq!(sensu.backoff.policy(), ReconnectPolicy::FullJitter);
        assert_eq!(
            sensu.scenario.phases,
            vec![
                Phase::Churn {
                    share: 0.05,
                    period: s(30),
                    from: s(10),
                    until: Some(s(30))
                },
                Phase::Storm {
                    at: s(30),
                    share: 0.5
                },
                Phase::Pause {
                    at: s(90),
                    length: s(1),
                    share: 1.0
                },
            ]
        );
        let consul = &c.fleets[1].fleet;
        assert_eq!(consul.label, "consul");
        assert_eq!(consul.scenario.phases.len(), 5);
        assert_eq!(
            consul.scenario.phases[2],
            Phase::Pause {
                at: s(40),
                length: s(5),
                share: 0.1
            }
        );
        assert_eq!(
            consul.scenario.phases[3],
            Phase::Storm {
                at: s(100),
                share: 1.0
            }
        );
    }

    #[test]
    fn the_example_config_is_a_valid_timeline() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/scenarios.toml");
        let c = resolve(
            RunArgs {
                config: Some(path),
                ..RunArgs::default()
            },
            &no_env,
        )
        .unwrap();
        let f = &c.fleets[0].fleet;
        assert_eq!(
            f.scenario.phases,
            vec![
                Phase::Churn {
                    share: 0.05,
                    period: s(30),
                    from: s(10),
                    until: Some(s(60))
                },
                Phase::Storm {
                    at: s(60),
                    share: 1.0
                },
                Phase::Pause {
                    at: s(90),
                    length: s(20),
                    share: 0.1
                },
                Phase::RampDown {
                    at: s(190),
                    rate: Rate::per_second(100.0)
                },
            ]
        );
    }

    #[test]
    fn flags_alone_and_the_default_policy() {
        let c = resolve(
            RunArgs {
                duration: Some("60s".parse().unwrap()),
                agents: Some(100),
                ramp_down: Some("10/s".parse().unwrap()),
                max_session_length: Some("20s".parse().unwrap()),
                ..RunArgs::default()
            },
            &no_env,
        )
        .unwrap();
        let f = &c.fleets[0].fleet;
        // A Sensu fleet waits as a real sensu-agent does unless told.
        assert_eq!(f.backoff.policy(), ReconnectPolicy::SensuAgent);
        assert_eq!(f.backoff.min(), Duration::from_secs(1));
        assert_eq!(f.backoff.max(), Duration::from_secs(120));
        assert_eq!(
            f.scenario.phases,
            vec![
                Phase::MaxSessionLength {
                    length: s(20),
                    from: s(0),
                    until: Some(s(54))
                },
                Phase::RampDown {
                    at: s(50),
                    rate: Rate::per_second(10.0)
                },
            ]
        );
    }

    #[test]
    fn a_synchronized_burst_under_the_dial_cap_is_noted() {
        let plan = |policy: ReconnectPolicy, dialing: usize| {
            let c = resolve(
                RunArgs {
                    agents: Some(1000),
                    reconnect: Some(policy),
                    max_dialing: Some(dialing),
                    ..RunArgs::default()
                },
                &no_env,
            )
            .unwrap();
            capped_burst(&c.fleets[0])
        };
        assert_eq!(
            plan(ReconnectPolicy::None, 256).as_deref(),
            Some(
                "sensu fleet: --reconnect none comes back as one burst, but --max-dialing 256 \
                 lets only that many of its 1000 agents handshake at once; --max-dialing 1000 \
                 makes the burst the whole fleet"
            )
        );
        assert!(plan(ReconnectPolicy::Fixed, 999).is_some());
        assert_eq!(plan(ReconnectPolicy::None, 1000), None);
        assert_eq!(plan(ReconnectPolicy::Exponential, 256), None);
        assert_eq!(plan(ReconnectPolicy::FullJitter, 256), None);
    }

    #[test]
    fn scenario_errors_are_one_line_and_name_the_flag_or_section() {
        let flag = |f: fn(&mut RunArgs)| {
            let mut a = RunArgs::default();
            f(&mut a);
            resolve(a, &no_env).unwrap_err().0
        };
        for (e, needle) in [
            (
                flag(|a| a.ramp_down = Some("5/s".parse().unwrap())),
                "--ramp-down: needs --duration",
            ),
            (
                flag(|a| a.pauses = vec!["at=1s".parse().unwrap()]),
                "--pause: for= is required",
            ),
            (
                flag(|a| {
                    a.duration = Some("10s".parse().unwrap());
                    a.storms = vec!["at=20s".parse().unwrap()];
                }),
                "--storm: starts at 20s",
            ),
        ] {
            assert!(e.starts_with(needle) && !e.contains('\n'), "{e}");
        }
        for (toml, needle) in [
            (
                "[[scenario]]\nstorm = \"at=1s\"\nchurn = \"1%/1s\"\n",
                "[[scenario]] #1: give exactly one",
            ),
            ("[[scenario]]\nstorm = \"at=x\"\n", "[[scenario]] #1: at=x"),
            (
                "[[scenario]]\nstrom = \"at=1s\"\n",
                "[[scenario]] #1: unknown field",
            ),
            ("[[scenario]]\nchurn = \"150%/30s\"\n", "above 100%"),
            (
                "[[scenario]]\nchurn = \"1%/1s\"\n[[scenario]]\nstorm = \"drop=5%\"\n",
                "[[scenario]] #2: has no `at`",
            ),
            ("storm = \"at=x\"\n", "at=x"),
            ("scenario = 3\n", "[[scenario]] sections"),
        ] {
            let e = with_file("errors", toml, |_| {}).unwrap_err().0;
            assert!(e.contains(needle) && !e.contains('\n'), "{toml}: {e}");
        }
    }
}
