//! The run's Connect certificates in the summary (`connect`), the final
//! table and the page: how long until every proxy held a certificate
//! (boot), what signing cost (latency, rate-limited answers), and a CA
//! rotation's time until every agent held a certificate of the new root.
//! The figures are filled by the run from its counters and latencies; this
//! module shows them in the table (the page's section is `html::connect`).

use std::fmt::Write as _;

use crate::summary::Summary;

fn seconds(s: Option<f64>) -> String {
    s.map_or_else(|| "not reached".to_string(), |v| format!("{v:.1}s"))
}

/// The table's line(s).
pub fn render(out: &mut String, s: &Summary) {
    let Some(c) = &s.connect else { return };
    let _ = writeln!(
        out,
        "connect    {}/{} agents hold a leaf certificate; boot {}; {} issued, {} renewed, \
         {} rate-limited; sign p50 {:.1} ms, p99 {:.1} ms",
        c.holding,
        c.agents,
        seconds(c.boot_s),
        c.issued,
        c.renewed,
        c.rate_limited,
        c.sign_p50_ms,
        c.sign_p99_ms
    );
    if let Some(r) = &c.rotation {
        let _ = writeln!(
            out,
            "rotation   CA changed at {:.1}s: {}/{} agents on the new root, all after {}{}",
            r.at_s,
            r.rotated,
            c.holding,
            seconds(r.all_after_s),
            r.error
                .as_ref()
                .map(|e| format!(" (refused: {e})"))
                .unwrap_or_default()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary::{ConnectSummary, RotationSummary};

    #[test]
    fn the_table_and_page_show_boot_and_rotation() {
        let s = Summary {
            connect: Some(ConnectSummary {
                agents: 300,
                holding: 300,
                boot_s: Some(6.25),
                issued: 300,
                renewed: 300,
                rate_limited: 41,
                sign_p50_ms: 1.5,
                sign_p99_ms: 480.0,
                rotation: Some(RotationSummary {
                    at_s: 20.0,
                    rotated: 300,
                    all_after_s: Some(31.5),
                    error: None,
                }),
            }),
            ..Summary::default()
        };
        let mut t = String::new();
        render(&mut t, &s);
        assert!(
            t.contains("300/300 agents hold a leaf certificate; boot 6.2s"),
            "{t}"
        );
        assert!(t.contains("41 rate-limited"), "{t}");
        assert!(
            t.contains("300/300 agents on the new root, all after 31.5s"),
            "{t}"
        );
        let mut none = String::new();
        render(&mut none, &Summary::default());
        assert!(none.is_empty());
    }
}
