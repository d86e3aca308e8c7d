//! `agent-sim report show|merge`: render one result file, or merge the
//! summaries and hlogs of several processes exactly (percentiles from merged
//! histograms, never averaged).

use std::path::{Path, PathBuf};

use agent_sim_metrics::Summary;
use agent_sim_metrics::assert::{Assertion, evaluate, render_verdicts};
use agent_sim_metrics::hlog::read_hlog;
use agent_sim_metrics::merge::{apply_hlogs, merge_summaries};
use agent_sim_metrics::summary::SCHEMA_V2;

use crate::run::exit;

fn is_json(path: &Path) -> Result<bool, String> {
    let text = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(text.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{'))
}

/// The files a list of arguments names: a directory stands for the summary
/// files (`*.json`) directly in it, in name order, so a merge step needs no
/// shell to expand a glob (the container image has none).
fn expand(args: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    for a in args {
        if a.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(a)
                .map_err(|e| format!("{}: {e}", a.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "json"))
                .collect();
            if found.is_empty() {
                return Err(format!(
                    "{}: no summary (*.json) in this directory",
                    a.display()
                ));
            }
            found.sort();
            out.extend(found);
        } else {
            out.push(a.clone());
        }
    }
    Ok(out)
}

/// Loads summaries and hlogs (directories: their summaries) and merges them
/// into one summary.
pub fn load_and_merge(args: &[PathBuf]) -> Result<Summary, String> {
    let mut summaries = Vec::new();
    let mut hlogs = Vec::new();
    for f in &expand(args)? {
        if is_json(f)? {
            summaries.push(Summary::read(f).map_err(|e| e.to_string())?);
        } else {
            hlogs.push(read_hlog(f).map_err(|e| e.to_string())?);
        }
    }
    let mut merged = if summaries.is_empty() {
        Summary {
            schema: SCHEMA_V2.into(),
            // hlogs carry no kind; "mixed" is the schema's catch-all.
            kind: "mixed".into(),
            ..Default::default()
        }
    } else {
        merge_summaries(&summaries).map_err(|e| e.to_string())?
    };
    if !hlogs.is_empty() {
        let mut by_tag = std::collections::BTreeMap::new();
        for h in &hlogs {
            for (tag, hist) in h.merged_by_tag() {
                let acc = by_tag
                    .entry(tag)
                    .or_insert_with(agent_sim_metrics::new_latency_histogram);
                acc.add(&hist)
                    .map_err(|e| format!("merging hlogs: {e:?}"))?;
            }
        }
        apply_hlogs(&mut merged, &by_tag);
    }
    Ok(merged)
}

/// `report show FILE`.
pub fn show(file: &Path) -> i32 {
    match load_and_merge(&[file.to_path_buf()]) {
        Ok(s) => {
            print!("{}", agent_sim_metrics::report::render(&s));
            exit::OK
        }
        Err(e) => {
            eprintln!("agent-sim: {e}");
            exit::FAILURE
        }
    }
}

/// `report merge FILE|DIR... [--summary PATH] [--assert EXPR]`.
pub fn merge(files: &[PathBuf], summary: Option<&Path>, asserts: &[Assertion]) -> i32 {
    let merged = match load_and_merge(files) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("agent-sim: {e}");
            return exit::FAILURE;
        }
    };
    print!("{}", agent_sim_metrics::report::render(&merged));
    if let Some(p) = summary
        && let Err(e) = merged.write(p)
    {
        eprintln!("agent-sim: --summary {}: {e}", p.display());
        return exit::FAILURE;
    }
    let verdicts = evaluate(asserts, &merged);
    if !verdicts.is_empty() {
        print!("{}", render_verdicts(&verdicts));
    }
    if verdicts.iter().any(|v| !v.passed) {
        exit::SLO_FAILED
    } else {
        exit::OK
    }
}
