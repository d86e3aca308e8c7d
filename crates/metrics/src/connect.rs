//! The run's Connect certificates in the summary (`connect`), the final
//! table and the page: how long until every proxy held a certificate
//! (boot), what signing cost (latency, rate-limited answers), and a CA
//! rotation's time until every agent held a certificate of the new root.
//! The figures are filled by the run from its counters and latencies; this
//! module only holds and shows them.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::summary::Summary;

/// The `connect` section of the summary.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConnectSummary {
    /// Agents that keep a certificate (their sidecars share one).
    pub agents: u64,
    /// Of those, agents that held one at the end.
    pub holding: u64,
    /// Seconds from the run's first dial to the last agent's first
    /// certificate (`None`: not every agent got one).
    pub boot_s: Option<f64>,
    /// First certificates signed.
    pub issued: u64,
    /// Certificates signed again (renewals, rotations).
    pub renewed: u64,
    /// Signs the servers answered with their rate limit.
    pub rate_limited: u64,
    /// Signing latency, milliseconds: median and 99th percentile.
    pub sign_p50_ms: f64,
    /// 99th percentile.
    pub sign_p99_ms: f64,
    /// The run's CA rotation, if it made one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotation: Option<RotationSummary>,
}

/// A CA rotation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RotationSummary {
    /// When the run changed the CA (seconds from the first dial).
    pub at_s: f64,
    /// Agents holding a certificate of the new root at the end.
    pub rotated: u64,
    /// Seconds from the change to the last agent's certificate of the new
    /// root (`None`: not every agent holding a certificate got one).
    pub all_after_s: Option<f64>,
    /// What failed, in the server's words, when the change was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

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
        let _ = write!(
            o,
            "<tr><th>{}</th><td>{}</td></tr>",
            crate::html::esc(k),
            crate::html::esc(&v)
        );
    }
    o.push_str("</table></section>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let mut p = String::new();
        page(&mut p, &s);
        assert!(p.contains("id=\"connect\"") && p.contains("31.5s"));
        let mut none = String::new();
        render(&mut none, &Summary::default());
        assert!(none.is_empty());
    }
}
