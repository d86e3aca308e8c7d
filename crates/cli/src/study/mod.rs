//! `agent-sim study NAME`: a published experiment as one command.
//!
//! Each study is a config file of `configs/studies/` built into the binary:
//! the run at the published size (keys as in any `--config` file) and a
//! `[study]` table with what was published (title, source, the figures,
//! the differences of setup). `--scale F` multiplies the fleet and the
//! keys the study names by F (the study's `default-scale` without it), and
//! the durations it names too, so that the per-second rates stay the
//! published ones; what changed is stated in the summary, the table and
//! the page. Flags given after the name beat the study's settings, as they
//! beat a `--config` file's.

use std::time::Duration;

use agent_sim_metrics::study::{StudyFigure, StudySummary};
use serde::Deserialize;

use crate::args::StudyArgs;
use crate::config::{FileLayers, layers_of, one_line, resolve_with};
use crate::plan::{RunConfig, UsageError, usage};

mod scale;

/// The studies built into the binary: name and file text.
pub const STUDIES: &[(&str, &str)] = &[
    (
        "consul-global-scale",
        include_str!("../../../../configs/studies/consul-global-scale.toml"),
    ),
    (
        "sensu-scaling",
        include_str!("../../../../configs/studies/sensu-scaling.toml"),
    ),
    (
        "criteo-streaming",
        include_str!("../../../../configs/studies/criteo-streaming.toml"),
    ),
    (
        "vault-outage",
        include_str!("../../../../configs/studies/vault-outage.toml"),
    ),
    (
        "auth-cost",
        include_str!("../../../../configs/studies/auth-cost.toml"),
    ),
];

/// A study file's `[study]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct StudyDef {
    /// What the original was.
    pub title: String,
    /// One line for `--list`.
    pub about: String,
    /// Where it was published.
    pub source: String,
    /// Its page in docs/studies/.
    pub doc: String,
    /// The scale without `--scale`.
    pub default_scale: f64,
    /// Keys multiplied by the scale besides `agents` (`seed-service`,
    /// `vault-tokens`, `vault-burst`, `ramp`).
    #[serde(default)]
    pub scale: Vec<String>,
    /// Durations multiplied by the scale (`boot-window`), so that what
    /// happens in them happens at the published rate.
    #[serde(default)]
    pub timed: Vec<String>,
    /// Time after the boot window; the run's duration is the (scaled) boot
    /// window plus this, unless `duration` is given.
    #[serde(default)]
    pub steady: Option<crate::values::Secs>,
    /// How the run differs from the original, one line each.
    #[serde(default)]
    pub differences: Vec<String>,
    /// The published figures.
    #[serde(default, rename = "figure")]
    pub figures: Vec<StudyFigure>,
}

/// A study read: its table and the run's layers at the published size.
pub struct Study {
    /// The study's name.
    pub name: &'static str,
    /// Its `[study]` table.
    pub def: StudyDef,
    /// The run at the published size.
    pub layers: FileLayers,
}

/// Reads the study `name` (a refusal names the known ones).
pub fn load(name: &str) -> Result<Study, UsageError> {
    let Some((name, text)) = STUDIES.iter().find(|(n, _)| *n == name) else {
        let known: Vec<&str> = STUDIES.iter().map(|(n, _)| *n).collect();
        return usage(format!(
            "no study {name:?} (the studies: {}; agent-sim study --list)",
            known.join(", ")
        ));
    };
    let origin = format!("study {name}");
    let mut table: toml::Table =
        toml::from_str(text).or_else(|e| usage(format!("{origin}: {}", one_line(e))))?;
    let Some(def) = table.remove("study") else {
        return usage(format!("{origin}: no [study] table"));
    };
    let def: StudyDef = def
        .try_into()
        .or_else(|e| usage(format!("{origin}: [study]: {}", one_line(e))))?;
    for f in &def.figures {
        if let Some(path) = &f.ours
            && let Err(e) = path.parse::<agent_sim_metrics::assert::Measure>()
        {
            return usage(format!("{origin}: figure {:?}: {e}", f.label));
        }
    }
    let layers = layers_of(table, &origin)?;
    Ok(Study { name, def, layers })
}

/// The studies, one line each, for `agent-sim study --list`.
pub fn list() -> Result<String, UsageError> {
    let mut out = String::new();
    for (name, _) in STUDIES {
        let s = load(name)?;
        out.push_str(&format!(
            "{name:<20} {} (default scale {}; {})\n",
            s.def.about, s.def.default_scale, s.def.doc
        ));
    }
    Ok(out)
}

/// The study's run, resolved like any other: its layers scaled, the flags
/// given after the name on top; the summary carries the study.
pub fn resolve(
    args: StudyArgs,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<RunConfig, UsageError> {
    let Some(name) = &args.name else {
        return usage("agent-sim study NAME: which study? (agent-sim study --list)");
    };
    if args.run.config.is_some() {
        return usage("study: --config cannot be given: the study is the run's config file");
    }
    let study = load(name)?;
    let factor = args.scale.unwrap_or(study.def.default_scale);
    if !(factor > 0.0 && factor <= 1.0) {
        return usage(format!("--scale {factor}: a factor above 0 and at most 1"));
    }
    let (layers, scaled) = scale::apply(&study, factor, &args.run)?;
    let mut cfg = resolve_with(args.run, env, layers)?;
    cfg.study = Some(StudySummary {
        name: study.name.to_string(),
        title: study.def.title,
        source: study.def.source,
        doc: study.def.doc,
        scale: factor,
        scaled,
        differences: study.def.differences,
        figures: study.def.figures,
    });
    Ok(cfg)
}

/// `d` written as the study files write durations (`26m`, `15.6s`).
fn show(d: Duration) -> String {
    let tenths = (d.as_secs_f64() * 10.0).round() as u64;
    let (m, rest) = (tenths / 600, tenths % 600);
    let secs = if rest % 10 == 0 {
        format!("{}s", rest / 10)
    } else {
        format!("{}.{}s", rest / 10, rest % 10)
    };
    match (m, rest) {
        (0, _) => secs,
        (m, 0) => format!("{m}m"),
        (m, _) => format!("{m}m{secs}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_built_in_study_reads_and_lists() {
        for (name, _) in STUDIES {
            let s = load(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(!s.def.figures.is_empty(), "{name}: no figures");
            assert!(s.def.doc.starts_with("docs/studies/"), "{name}");
            assert!(s.def.default_scale > 0.0 && s.def.default_scale <= 1.0);
        }
        let l = list().unwrap();
        assert_eq!(l.lines().count(), STUDIES.len());
    }

    #[test]
    fn an_unknown_study_names_the_known_ones() {
        let Err(e) = load("nope") else { panic!() };
        assert!(e.0.contains("consul-global-scale"), "{e}");
    }

    #[test]
    fn durations_read_as_the_files_write_them() {
        assert_eq!(show(Duration::from_secs(1560)), "26m");
        assert_eq!(show(Duration::from_millis(15_600)), "15.6s");
        assert_eq!(show(Duration::from_millis(135_600)), "2m15.6s");
        assert_eq!(show(Duration::from_secs(3)), "3s");
    }
}
