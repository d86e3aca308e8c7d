//! A published experiment the run reproduces (`agent-sim study NAME`): the
//! figures as their authors published them beside ours, read from the same
//! summary row for row, with the run's scale and the differences of setup
//! stated. The summary carries the study ([`StudySummary`]); the table, the
//! page and `report compare` read it from there, so a study's section can
//! be drawn again from a summary file alone.
//!
//! A figure names what it is compared with by a path of the assertion
//! grammar ([`crate::assert::Measure`]: `propagation_proxy.p99`,
//! `server.cpu_cores.max`); a published figure nothing in the run measures
//! has no path, and its row says why.

use std::fmt::Write as _;

use crate::assert::Measure;
use crate::summary::Summary;
pub use crate::summary::{StudyFigure, StudySummary};

/// A figure's row as shown: both values written out.
#[derive(Debug, Clone, PartialEq)]
pub struct StudyRow {
    /// What was measured.
    pub label: String,
    /// As published.
    pub published: String,
    /// Ours in the path's unit, or `-`.
    pub ours: String,
    /// Ours in the path's base unit, when measured.
    pub value: Option<f64>,
    /// The figure's note, or why ours is missing.
    pub note: String,
}

/// Why a figure of ours is missing.
#[derive(Debug, thiserror::Error)]
pub enum Missing {
    /// The figure names no path: the run does not measure it.
    #[error("not measured by this run")]
    NotMeasured,
    /// The study's path does not parse.
    #[error("the study's path {path:?}: {source}")]
    BadPath {
        /// The path as the study wrote it.
        path: String,
        /// Why it does not parse.
        source: crate::assert::AssertError,
    },
    /// The summary has no such value.
    #[error(transparent)]
    Absent(#[from] crate::assert::Absent),
}

/// Our value of `figure` in `s`, parsed and read, or why there is none.
pub fn read(figure: &StudyFigure, s: &Summary) -> Result<(Measure, f64), Missing> {
    let Some(path) = &figure.ours else {
        return Err(Missing::NotMeasured);
    };
    let m: Measure = path.parse().map_err(|source| Missing::BadPath {
        path: path.clone(),
        source,
    })?;
    let v = m.read(s)?;
    Ok((m, v))
}

/// Every figure of the study of `s` as a row (none without a study).
pub fn rows(s: &Summary) -> Vec<StudyRow> {
    let Some(study) = &s.study else {
        return Vec::new();
    };
    study
        .figures
        .iter()
        .map(|f| {
            let note = f.note.clone().unwrap_or_default();
            match read(f, s) {
                Ok((m, v)) => StudyRow {
                    label: f.label.clone(),
                    published: f.published.clone(),
                    ours: m.show(v),
                    value: Some(v),
                    note,
                },
                Err(missing) => StudyRow {
                    label: f.label.clone(),
                    published: f.published.clone(),
                    ours: "-".into(),
                    value: None,
                    note: if note.is_empty() {
                        missing.to_string()
                    } else {
                        format!("{note}; {missing}")
                    },
                },
            }
        })
        .collect()
}

/// The scale in words: `as published` or `scale 0.01`.
pub fn scale_text(study: &StudySummary) -> String {
    if study.scale == 1.0 {
        "as published".into()
    } else {
        format!("scale {}", study.scale)
    }
}

/// The table's study section (the table's last part).
pub fn render(out: &mut String, s: &Summary) {
    let Some(study) = &s.study else { return };
    let _ = writeln!(
        out,
        "study      {}: {} ({})",
        study.name,
        study.title,
        scale_text(study)
    );
    let rows = rows(s);
    let w_label = rows.iter().map(|r| r.label.chars().count()).max();
    let w_label = w_label.unwrap_or(0).max(6);
    let w_pub = rows.iter().map(|r| r.published.chars().count()).max();
    let w_pub = w_pub.unwrap_or(0).max(9);
    let w_ours = rows.iter().map(|r| r.ours.chars().count()).max();
    let w_ours = w_ours.unwrap_or(0).max(4);
    let _ = writeln!(
        out,
        "  {:<w_label$}  {:>w_pub$}  {:>w_ours$}",
        "figure", "published", "ours"
    );
    for r in &rows {
        let line = format!(
            "  {:<w_label$}  {:>w_pub$}  {:>w_ours$}  {}",
            r.label, r.published, r.ours, r.note
        );
        let _ = writeln!(out, "{}", line.trim_end());
    }
    for line in &study.scaled {
        let _ = writeln!(out, "  scaled: {line}");
    }
    for line in &study.differences {
        let _ = writeln!(out, "  differs: {line}");
    }
    let _ = writeln!(out, "  source: {} ({})", study.source, study.doc);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary::LatencySummary;

    fn study() -> StudySummary {
        StudySummary {
            name: "demo".into(),
            title: "A demo".into(),
            source: "https://example.com".into(),
            doc: "docs/studies/demo.md".into(),
            scale: 0.01,
            scaled: vec!["agents: 100 of 10,000".into()],
            differences: vec!["one server, not five".into()],
            figures: vec![
                StudyFigure {
                    label: "propagation p50".into(),
                    published: "361 ms".into(),
                    ours: Some("propagation.p50".into()),
                    note: None,
                },
                StudyFigure {
                    label: "proxies updated".into(),
                    published: "under 1 s".into(),
                    ours: None,
                    note: Some("Envoy is not run".into()),
                },
                StudyFigure {
                    label: "raft transactions".into(),
                    published: "~4,000/s".into(),
                    ours: Some("server.consul_raft_commit_time_per_s.max".into()),
                    note: None,
                },
            ],
        }
    }

    fn summary() -> Summary {
        let mut s = Summary {
            study: Some(study()),
            ..Summary::default()
        };
        s.latency_us.insert(
            "propagation".into(),
            LatencySummary {
                count: 10,
                p50: 12_000,
                ..LatencySummary::default()
            },
        );
        s
    }

    #[test]
    fn rows_put_ours_beside_the_published_or_say_why_not() {
        let r = rows(&summary());
        assert_eq!(r.len(), 3);
        assert_eq!(r[0].published, "361 ms");
        assert_eq!(r[0].value, Some(12_000.0));
        assert_eq!(r[0].ours, "12.0ms");
        assert_eq!(r[1].ours, "-");
        assert!(
            r[1].note.starts_with("Envoy is not run; not measured"),
            "{}",
            r[1].note
        );
        // A server figure of a run that observed no server.
        assert_eq!(r[2].value, None);
        assert!(!r[2].note.is_empty());
    }

    #[test]
    fn the_table_section_states_scale_setup_and_source() {
        let mut out = String::new();
        render(&mut out, &summary());
        assert!(
            out.starts_with("study      demo: A demo (scale 0.01)\n"),
            "{out}"
        );
        assert!(out.contains("361 ms"), "{out}");
        assert!(out.contains("12.0ms"), "{out}");
        assert!(out.contains("scaled: agents: 100 of 10,000"), "{out}");
        assert!(out.contains("differs: one server, not five"), "{out}");
        assert!(
            out.contains("source: https://example.com (docs/studies/demo.md)"),
            "{out}"
        );
        let mut none = String::new();
        render(&mut none, &Summary::default());
        assert!(none.is_empty());
    }

    #[test]
    fn a_summary_keeps_its_study_through_json() {
        let s = summary();
        let text = serde_json::to_string(&s).unwrap();
        let back: Summary = serde_json::from_str(&text).unwrap();
        assert_eq!(back.study, s.study);
    }
}
