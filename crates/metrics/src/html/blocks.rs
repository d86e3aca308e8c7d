//! The building blocks every section of the report page is written with:
//! a section's frame, a figure with its caption, a note, a table, a list of
//! names and values; and the few words and marks several sections share.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::esc;
use super::svg::{Chart, Mark, Unit, label};
use crate::summary::Summary;

/// A chart with its caption (nothing when there is no chart).
pub(super) fn figure(o: &mut String, chart: Option<Chart>, caption: &str) {
    if let Some(c) = chart {
        let _ = writeln!(
            o,
            "<figure>{}<figcaption>{}</figcaption></figure>",
            c.render(),
            esc(caption)
        );
    }
}

/// A note in small print.
pub(super) fn note(o: &mut String, text: &str) {
    let _ = writeln!(o, "<p class=\"note\">{}</p>", esc(text));
}

/// Opens a section (`id` is its anchor).
pub(super) fn open(o: &mut String, id: &str, title: &str) {
    let _ = writeln!(o, "<section id=\"{id}\">\n<h2>{}</h2>", esc(title));
}

/// Closes the section [`open`] began.
pub(super) fn close(o: &mut String) {
    o.push_str("</section>\n");
}

/// A table: header cells (a leading `>` marks a right-aligned, numeric
/// column) and rows of already escaped cells.
pub(super) fn table(o: &mut String, head: &[&str], rows: &[Vec<String>]) {
    let numeric: Vec<bool> = head.iter().map(|h| h.starts_with('>')).collect();
    o.push_str("<div class=\"wide\"><table><thead><tr>");
    for h in head {
        let (class, text) = match h.strip_prefix('>') {
            Some(t) => (" class=\"n\"", t),
            None => ("", *h),
        };
        let _ = write!(o, "<th{class}>{}</th>", esc(text));
    }
    o.push_str("</tr></thead><tbody>");
    for r in rows {
        o.push_str("<tr>");
        for (i, c) in r.iter().enumerate() {
            let class = if numeric.get(i).copied().unwrap_or(false) {
                " class=\"n\""
            } else {
                ""
            };
            let _ = write!(o, "<td{class}>{c}</td>");
        }
        o.push_str("</tr>");
    }
    o.push_str("</tbody></table></div>\n");
}

/// Names and values as a definition list.
pub(super) fn kv(o: &mut String, items: &[(&str, String)]) {
    o.push_str("<dl class=\"kv\">");
    for (k, v) in items {
        let _ = write!(o, "<dt>{}</dt><dd>{}</dd>", esc(k), esc(v));
    }
    o.push_str("</dl>\n");
}

/// A time into the run: seconds below a minute, else as the charts label
/// run time.
pub(super) fn run_time(s: f64) -> String {
    if s < 60.0 {
        format!("{s:.1}s")
    } else {
        label(Unit::RunTime, s)
    }
}

/// Counts by cause, most first; `none` when there is none.
pub(super) fn by_cause(m: &BTreeMap<String, u64>) -> String {
    if m.is_empty() {
        return "none".into();
    }
    crate::units::by_count(m)
}

/// A mark on a chart over time at each disruption's start.
pub(super) fn disruption_marks(s: &Summary) -> Vec<Mark> {
    s.disruptions
        .iter()
        .map(|d| Mark {
            x: d.began_s,
            label: format!("#{} {}", d.id, d.cause),
        })
        .collect()
}

/// Says the summary has no timeline to draw.
pub(super) fn no_timeline(o: &mut String) {
    note(
        o,
        "This summary has no timeline (written by an older agent-sim, or the run ended before its first sample).",
    );
}
