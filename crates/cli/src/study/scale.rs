//! `--scale F`: a study's fleet, topology and named durations multiplied by
//! F, each change stated in a line of the summary's `study.scaled`.

use std::time::Duration;

use agent_sim_fleet::Rate;

use super::{Study, show};
use crate::args::RunArgs;
use crate::config::FileLayers;
use crate::plan::{UsageError, usage};
use crate::values::{Ramp, Secs};

/// Keys a study may name in `scale`.
const SCALABLE: &[&str] = &["seed-service", "vault-tokens", "vault-burst", "ramp"];
/// Keys a study may name in `timed`.
const TIMED: &[&str] = &["boot-window"];

/// `n` × `f`, at least 1.
fn times(n: u64, f: f64) -> u64 {
    ((n as f64 * f).round() as u64).max(1)
}

fn rate_times(r: Rate, f: f64) -> Rate {
    Rate::per_second(r.as_per_second() * f)
}

/// The study's layers at scale `f`, and what changed, one line each.
/// Keys set by `cli` are left to it (and said so).
pub(super) fn apply(
    study: &Study,
    f: f64,
    cli: &RunArgs,
) -> Result<(FileLayers, Vec<String>), UsageError> {
    for k in &study.def.scale {
        if !SCALABLE.contains(&k.as_str()) {
            return usage(format!(
                "study {}: cannot scale {k:?} (one of agents, {})",
                study.name,
                SCALABLE.join(", ")
            ));
        }
    }
    for k in &study.def.timed {
        if !TIMED.contains(&k.as_str()) {
            return usage(format!(
                "study {}: cannot scale the duration {k:?} (one of {})",
                study.name,
                TIMED.join(", ")
            ));
        }
    }
    let (top, fleets, scenarios) = study.layers.clone();
    let mut top = top;
    let mut lines = given(cli);
    layer(&mut top, study, f, "", &mut lines);
    let many = fleets.len() > 1;
    let fleets = fleets
        .into_iter()
        .enumerate()
        .map(|(i, mut l)| {
            let kind = l.kind.map(|k| format!(" ({k})")).unwrap_or_default();
            let who = if many {
                format!("fleet {}{kind} ", i + 1)
            } else {
                String::new()
            };
            layer(&mut l, study, f, &who, &mut lines);
            l
        })
        .collect();
    if let Some(steady) = study.def.steady
        && top.duration.is_none()
        && cli.duration.is_none()
    {
        let boot = top.boot_window.map(|w| w.0).unwrap_or_default();
        top.duration = Some(Secs(boot + steady.0));
        lines.push(format!(
            "duration: {} (the boot window and {} after it)",
            show(boot + steady.0),
            show(steady.0)
        ));
    }
    Ok(((top, fleets, scenarios), lines))
}

/// What the command line set of what a scale changes, one line each: the
/// flags beat the study's scaled values.
fn given(cli: &RunArgs) -> Vec<String> {
    let mut set = Vec::new();
    let mut flag = |name: &str, v: Option<String>| {
        if let Some(v) = v {
            set.push(format!("--{name} {v}"));
        }
    };
    flag("agents", cli.agents.map(|n| n.to_string()));
    flag("boot-window", cli.boot_window.map(|w| show(w.0)));
    flag("duration", cli.duration.map(|w| show(w.0)));
    flag(
        "seed-service",
        cli.seed_service.as_ref().map(|s| s.to_string()),
    );
    flag("ramp", cli.ramp.map(|r| r.to_string()));
    if set.is_empty() {
        Vec::new()
    } else {
        vec![format!(
            "set on the command line, not scaled: {}",
            set.join(", ")
        )]
    }
}

/// One layer scaled; `who` names the fleet in the lines.
fn layer(l: &mut RunArgs, study: &Study, f: f64, who: &str, lines: &mut Vec<String>) {
    let named = |k: &str| study.def.scale.iter().any(|x| x == k);
    if let Some(n) = l.agents {
        let to = times(n, f);
        lines.push(format!("{who}agents: {to} of {n}"));
        l.agents = Some(to);
    }
    if named("seed-service")
        && let Some(s) = l.seed_service.as_mut()
    {
        let to = times(u64::from(s.count), f) as u32;
        lines.push(format!(
            "{who}seed service {}: {to} of {} instances",
            s.name, s.count
        ));
        s.count = to;
    }
    if named("vault-tokens")
        && let Some(r) = l.vault_tokens
    {
        let to = rate_times(r, f);
        lines.push(format!(
            "{who}Vault token creates: {:.1}/s of {}/s",
            to.as_per_second(),
            r.as_per_second()
        ));
        l.vault_tokens = Some(to);
    }
    if named("vault-burst") {
        for b in &mut l.vault_bursts {
            let to = times(u64::from(b.tokens), f) as u32;
            lines.push(format!("{who}Vault burst: {to} of {} tokens", b.tokens));
            b.tokens = to;
        }
    }
    if named("ramp")
        && let Some(Ramp::Rate(r)) = l.ramp
    {
        let to = rate_times(r, f);
        lines.push(format!(
            "{who}ramp: {:.1}/s of {}/s",
            to.as_per_second(),
            r.as_per_second()
        ));
        l.ramp = Some(Ramp::Rate(to));
    }
    if study.def.timed.iter().any(|k| k == "boot-window")
        && let Some(w) = l.boot_window
    {
        let to = Duration::from_secs_f64((w.0.as_secs_f64() * f).max(1.0));
        lines.push(format!(
            "{who}boot window: {} of {} (agents join at the published rate)",
            show(to),
            show(w.0)
        ));
        l.boot_window = Some(Secs(to));
    }
}

#[cfg(test)]
mod tests {
    use super::super::load;
    use super::*;

    #[test]
    fn a_scale_shrinks_the_fleet_and_the_named_keys_and_says_so() {
        let s = load("consul-global-scale").unwrap();
        let ((top, _, _), lines) = apply(&s, 0.01, &RunArgs::default()).unwrap();
        assert_eq!(top.agents, Some(100));
        assert!(
            lines.iter().any(|l| l == "agents: 100 of 10000"),
            "{lines:?}"
        );
        let w = top.boot_window.unwrap().0;
        assert_eq!(w, Duration::from_millis(15_600));
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("boot window: 15.6s of 26m")),
            "{lines:?}"
        );
        // The duration is the scaled boot window and the steady time.
        let steady = s.def.steady.unwrap().0;
        assert_eq!(top.duration.unwrap().0, w + steady);
        // As published, nothing but the stated lines change.
        let ((full, _, _), _) = apply(&s, 1.0, &RunArgs::default()).unwrap();
        assert_eq!(full.agents, Some(10_000));
        // A flag is said to be the command line's.
        let cli = RunArgs {
            agents: Some(7),
            ..RunArgs::default()
        };
        let (_, lines) = apply(&s, 0.01, &cli).unwrap();
        assert_eq!(lines[0], "set on the command line, not scaled: --agents 7");
    }

    #[test]
    fn a_tiny_scale_keeps_at_least_one_of_everything() {
        assert_eq!(times(10_000, 1e-9), 1);
        assert_eq!(times(5000, 0.1), 500);
    }
}
