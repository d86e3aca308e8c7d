//! The page's last section, when the run reproduced a published experiment
//! (`agent-sim study NAME`): the published figures beside ours, row for
//! row, then the scale, the differences of setup and the source.

use super::blocks::{close, kv, note, open, table};
use super::esc;
use crate::study::{rows, scale_text};
use crate::summary::Summary;

/// The study section (nothing without a study).
pub(super) fn study(o: &mut String, s: &Summary) {
    let Some(st) = &s.study else { return };
    open(o, "study", &format!("Study: {}", st.title));
    note(
        o,
        &format!(
            "agent-sim study {} ({}). Each published figure beside this run's own, read from \
             this page's summary; a figure the run does not measure says why.",
            st.name,
            scale_text(st)
        ),
    );
    let cells: Vec<Vec<String>> = rows(s)
        .into_iter()
        .map(|r| vec![esc(&r.label), esc(&r.published), esc(&r.ours), esc(&r.note)])
        .collect();
    table(o, &["figure", ">published", ">this run", "note"], &cells);
    let mut items: Vec<(&str, String)> = Vec::new();
    for line in &st.scaled {
        items.push(("scaled", line.clone()));
    }
    for line in &st.differences {
        items.push(("differs", line.clone()));
    }
    items.push(("source", st.source.clone()));
    items.push(("explained in", st.doc.clone()));
    kv(o, &items);
    close(o);
}
