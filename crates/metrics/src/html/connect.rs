//! The report page's Connect section: boot, signing, rate-limited
//! answers and a CA rotation (the `connect` section of the summary).

use std::fmt::Write as _;

use super::esc;
use crate::summary::Summary;

fn seconds(s: Option<f64>) -> String {
    s.map_or_else(|| "not reached".to_string(), |v| format!("{v:.1}s"))
}

/// The page's section.
pub fn page(o: &mut String, s: &Summary) {
    let Some(c) = &s.connect else { return };
    let mut rows = vec![
        (
            "Agents holding a certificate",
            format!("{} of {}", c.holding, c.agents),
        ),
        (
            "Boot: first dial to the last first certificate",
            seconds(c.boot_s),
        ),
        ("Issued / renewed", format!("{} / {}", c.issued, c.renewed)),
        ("Rate-limited answers", c.rate_limited.to_string()),
        (
            "Signing latency p50 / p99",
            format!("{:.1} ms / {:.1} ms", c.sign_p50_ms, c.sign_p99_ms),
        ),
    ];
    if let Some(r) = &c.rotation {
        rows.push(("CA rotation at", format!("{:.1}s", r.at_s)));
        rows.push((
            "Agents on the new root",
            format!("{} (all after {})", r.rotated, seconds(r.all_after_s)),
        ));
        if let Some(e) = &r.error {
            rows.push(("Rotation refused", e.clone()));
        }
    }
    let _ = write!(
        o,
        "<section id=\"connect\"><h2>Connect certificates</h2><table>"
    );
    for (k, v) in rows {
        let _ = write!(o, "<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(&v));
    }
    o.push_str("</table></section>\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary::{ConnectSummary, RotationSummary};

    #[test]
    fn the_section_shows_boot_and_rotation_and_is_absent_without_connect() {
        let s = Summary {
            connect: Some(ConnectSummary {
                agents: 3,
                holding: 3,
                boot_s: Some(1.25),
                rotation: Some(RotationSummary {
                    at_s: 5.0,
                    rotated: 3,
                    all_after_s: Some(31.5),
                    error: None,
                }),
                ..ConnectSummary::default()
            }),
            ..Summary::default()
        };
        let mut p = String::new();
        page(&mut p, &s);
        assert!(p.contains("id=\"connect\"") && p.contains("31.5s") && p.contains("3 of 3"));
        let mut none = String::new();
        page(&mut none, &Summary::default());
        assert!(none.is_empty());
    }
}
