//! `agent-sim report show|merge|html|compare`: render one result file,
//! merge the summaries and hlogs of several processes exactly (percentiles
//! from merged histograms, never averaged), write the report page of one
//! run or of several merged, or put two runs side by side.

use std::path::{Path, PathBuf};

use agent_sim_metrics::assert::{Assertion, evaluate};
use agent_sim_metrics::hlog::{HlogContents, read_hlog};
use agent_sim_metrics::{MetricsError, Summary};

use crate::exit;
use crate::results::write_atomically;

/// Why results could not be loaded and merged.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file or a directory that cannot be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// A directory with no summary in it.
    #[error("{}: no summary (*.json) in this directory", .0.display())]
    NoSummary(PathBuf),
    /// A summary that does not parse.
    #[error(transparent)]
    Summary(MetricsError),
    /// An interval log that does not parse.
    #[error(transparent)]
    Hlog(MetricsError),
    /// Results that do not merge.
    #[error(transparent)]
    Merge(MetricsError),
}

/// A file or directory that cannot be read, as a [`LoadError`].
fn unreadable(path: &Path) -> impl FnOnce(std::io::Error) -> LoadError + '_ {
    move |source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    }
}

fn is_json(path: &Path) -> Result<bool, LoadError> {
    let text = std::fs::read(path).map_err(unreadable(path))?;
    Ok(text.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{'))
}

/// Whether `a` and `b` name the same file, which may not exist yet.
fn same_file(a: &Path, b: &Path) -> bool {
    let dir = |p: &Path| {
        let d = p.parent().filter(|d| !d.as_os_str().is_empty());
        std::fs::canonicalize(d.unwrap_or(Path::new("."))).ok()
    };
    a.file_name() == b.file_name() && dir(a).is_some() && dir(a) == dir(b)
}

/// The files a list of arguments names: a directory stands for the summary
/// files (`*.json`) directly in it, in name order, so a merge step needs no
/// shell to expand a glob (the container image has none); but not for
/// `output`, the summary this merge writes (a merge run again into the
/// same folder must not count its last result as a shard).
fn expand(args: &[PathBuf], output: Option<&Path>) -> Result<Vec<PathBuf>, LoadError> {
    let mut out = Vec::new();
    for a in args {
        if a.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(a)
                .map_err(unreadable(a))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "json"))
                .filter(|p| !output.is_some_and(|o| same_file(p, o)))
                .collect();
            if found.is_empty() {
                return Err(LoadError::NoSummary(a.clone()));
            }
            found.sort();
            out.extend(found);
        } else {
            out.push(a.clone());
        }
    }
    Ok(out)
}

/// Summaries and hlogs read and merged.
struct Loaded {
    /// The merged summary (hlog histograms applied).
    summary: Summary,
    /// The interval logs as read.
    hlogs: Vec<HlogContents>,
    /// The files read, in order.
    files: Vec<PathBuf>,
}

/// Loads summaries and hlogs (directories: their summaries, `output` aside)
/// and merges them.
fn load(args: &[PathBuf], output: Option<&Path>) -> Result<Loaded, LoadError> {
    let files = expand(args, output)?;
    let mut summaries = Vec::new();
    let mut hlogs = Vec::new();
    for f in &files {
        if is_json(f)? {
            summaries.push(Summary::read(f).map_err(LoadError::Summary)?);
        } else {
            hlogs.push(read_hlog(f).map_err(LoadError::Hlog)?);
        }
    }
    let merged = crate::results::merge(&summaries, &hlogs).map_err(LoadError::Merge)?;
    Ok(Loaded {
        summary: merged,
        hlogs,
        files,
    })
}

/// Loads summaries and hlogs (directories: their summaries) and merges them
/// into one summary.
pub fn load_and_merge(args: &[PathBuf]) -> Result<Summary, LoadError> {
    load(args, None).map(|l| l.summary)
}

/// The run's own assertions, from its recorded config (`assert`); ones
/// that no longer parse are skipped with a message.
fn recorded_asserts(s: &Summary) -> Vec<Assertion> {
    let Some(serde_json::Value::Array(items)) = s.config.as_ref().and_then(|c| c.get("assert"))
    else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|v| v.as_str())
        .filter_map(|text| match text.parse::<Assertion>() {
            Ok(a) => Some(a),
            Err(e) => {
                eprintln!("agent-sim: the run's --assert {text:?} does not parse here: {e}");
                None
            }
        })
        .collect()
}

/// `report html FILE|DIR... -o PATH [--assert EXPR]`: the report page of
/// one run, or of several merged (their sum); latency over time from the
/// hlogs given. Verdicts: the assertions given, else the run's own.
pub fn html(files: &[PathBuf], out: &Path, asserts: &[Assertion]) -> i32 {
    let loaded = match load(files, None) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("agent-sim: {e}");
            return exit::FAILURE;
        }
    };
    let s = &loaded.summary;
    let asserts = if asserts.is_empty() {
        recorded_asserts(s)
    } else {
        asserts.to_vec()
    };
    let verdicts = evaluate(&asserts, s);
    let sources: Vec<String> = loaded
        .files
        .iter()
        .map(|f| {
            f.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| f.display().to_string())
        })
        .collect();
    let page = crate::results::page(s, &verdicts, &loaded.hlogs, &sources);
    match write_atomically(out, &page) {
        Ok(()) => {
            println!(
                "agent-sim: wrote {} ({} KiB)",
                out.display(),
                page.len().div_ceil(1024)
            );
            exit::OK
        }
        Err(e) => {
            eprintln!("agent-sim: -o {}: {e}", out.display());
            exit::FAILURE
        }
    }
}

/// `report show FILE [--verbose]`: the table, with the run's own
/// assertions judged again.
pub fn show(file: &Path, verbose: bool) -> i32 {
    match load_and_merge(&[file.to_path_buf()]) {
        Ok(s) => {
            let verdicts = evaluate(&recorded_asserts(&s), &s);
            print!(
                "{}",
                agent_sim_metrics::report::render_with(
                    &s,
                    &agent_sim_metrics::report::TableOptions {
                        verdicts: &verdicts,
                        notes: &[],
                        verbose,
                    }
                )
            );
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
    let merged = match load(files, summary) {
        Ok(l) => l.summary,
        Err(e) => {
            eprintln!("agent-sim: {e}");
            return exit::FAILURE;
        }
    };
    let verdicts = evaluate(asserts, &merged);
    print!(
        "{}",
        agent_sim_metrics::report::render_with(
            &merged,
            &agent_sim_metrics::report::TableOptions {
                verdicts: &verdicts,
                ..Default::default()
            }
        )
    );
    if let Some(p) = summary
        && let Err(e) = merged.write(p)
    {
        eprintln!("agent-sim: --summary {}: {e}", p.display());
        return exit::FAILURE;
    }
    if verdicts.iter().any(|v| !v.passed) {
        exit::SLO_FAILED
    } else {
        exit::OK
    }
}

/// `report compare A B [-o PATH] [--threshold EXPR]...`: two runs (each a
/// summary or a directory of shard summaries, merged) side by side with
/// the ratio B/A; exit 3 when B moved past a threshold.
pub fn compare(
    a: &Path,
    b: &Path,
    out: Option<&Path>,
    thresholds: &[agent_sim_metrics::gate::Threshold],
) -> i32 {
    let load_one = |p: &Path| load_and_merge(&[p.to_path_buf()]);
    let (ra, rb) = match (load_one(a), load_one(b)) {
        (Ok(x), Ok(y)) => (x, y),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("agent-sim: {e}");
            return exit::FAILURE;
        }
    };
    let names = (a.display().to_string(), b.display().to_string());
    let names = (names.0.as_str(), names.1.as_str());
    let gates = agent_sim_metrics::gate::judge(thresholds, &ra, &rb);
    print!(
        "{}{}",
        agent_sim_metrics::compare::render_text(names, &ra, &rb),
        agent_sim_metrics::gate::render(&gates)
    );
    if let Some(p) = out {
        let page = agent_sim_metrics::compare::render_html(names, &ra, &rb, &gates);
        if let Err(e) = write_atomically(p, &page) {
            eprintln!("agent-sim: -o {}: {e}", p.display());
            return exit::FAILURE;
        }
    }
    let failed = gates.iter().filter(|g| !g.passed).count();
    if failed > 0 {
        eprintln!("agent-sim: {failed} of {} thresholds failed", gates.len());
        return exit::SLO_FAILED;
    }
    exit::OK
}
