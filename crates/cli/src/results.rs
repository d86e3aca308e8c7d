//! The one merge → report path: the results of several processes (their
//! summaries and interval logs) made into one summary and one page, for
//! `report merge`, `report html` and the parent of local processes alike;
//! and result files written whole.
//!
//! The rule it rests on: every summary embeds the histogram of each latency
//! it reports (`hdr`), so summaries alone merge exactly, percentiles taken
//! from the added histograms ([`merge_summaries`]). Interval logs given to
//! [`merge`] replace the latencies of their tags with the sum of their
//! intervals ([`apply_hlogs`]), which is how a run recorded with `--hlog`
//! and no summary is read. The page takes its latency over time from the
//! interval logs whichever way the summary was made.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use agent_sim_metrics::assert::Verdict;
use agent_sim_metrics::hlog::HlogContents;
use agent_sim_metrics::merge::{apply_hlogs, merge_summaries};
use agent_sim_metrics::summary::SCHEMA_V2;
use agent_sim_metrics::{MetricsError, Summary};

/// The summaries as one, the interval logs' histograms applied over it
/// when any are given (see the module docs). With no summary, the summary
/// of the interval logs alone.
pub fn merge(summaries: &[Summary], hlogs: &[HlogContents]) -> Result<Summary, MetricsError> {
    let mut merged = if summaries.is_empty() {
        Summary {
            schema: SCHEMA_V2.into(),
            // hlogs carry no kind; "mixed" is the schema's catch-all.
            kind: "mixed".into(),
            ..Default::default()
        }
    } else {
        merge_summaries(summaries)?
    };
    if !hlogs.is_empty() {
        let mut by_tag = BTreeMap::new();
        for h in hlogs {
            for (tag, hist) in h.merged_by_tag() {
                let acc = by_tag
                    .entry(tag)
                    .or_insert_with(agent_sim_metrics::new_latency_histogram);
                acc.add(&hist)
                    .map_err(|e| MetricsError::Merge(format!("hlogs: {e:?}")))?;
            }
        }
        apply_hlogs(&mut merged, &by_tag);
    }
    Ok(merged)
}

/// The report page of a (merged) summary: its verdicts, latency over time
/// from the interval logs (on the summary's start), and the files it was
/// read from (none for a run's own page).
pub fn page(
    summary: &Summary,
    verdicts: &[Verdict],
    hlogs: &[HlogContents],
    sources: &[String],
) -> String {
    let zero = humantime::parse_rfc3339(&summary.started_at)
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_secs_f64());
    let windows = agent_sim_metrics::timeline::windows_from_hlogs(hlogs, zero);
    agent_sim_metrics::html::render(&agent_sim_metrics::html::Page {
        summary,
        verdicts,
        windows: &windows,
        sources,
    })
}

/// Writes `text` to `path` through a temporary file and a rename, so a
/// reader never sees half a file.
pub fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}
