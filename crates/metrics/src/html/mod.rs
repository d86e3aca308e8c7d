//! The report page (`agent-sim report html`, `--report-html PATH`): one
//! self-contained HTML file with inline SVG charts and CSS, no script and no
//! external resource, so it opens anywhere (also offline, also attached to a
//! ticket) and prints.
//!
//! What it shows, in this order: the headline (agents requested, connected,
//! complete, run length, targets, every assertion's verdict, the exit
//! code); each propagation probe's arrival histogram and CDF over the fleet
//! with p50/p90/p99/max marked and delivered/expected; sessions, rates and
//! latency percentiles over time; each observed server's CPU, memory and
//! latencies (`--observe`), a Consul server's view of the run's gossip
//! members and its storm figures; disruptions and reconvergence; errors by
//! kind over time with the server's words; the process's CPU and RSS over
//! time; the configuration the run used (secrets were redacted when the
//! summary was written).
//!
//! Parts, leaves first: [`svg`] (the chart writer, and why it is our own),
//! `blocks` (a section's frame, figures, tables, notes), `charts` (run
//! data to charts), `sections` (the headline, probes, the run over time,
//! the simulator and its settings), `events` (disruptions, errors and
//! warnings), `server` (the observed servers' section), `gossip` (the
//! members a Consul server saw, in that section), `storm` (what its gossip
//! layers and anti-entropy reads went through, there too). Input is a
//! [`Page`]: a summary (one run's, or merged), the verdicts, and latency
//! windows from interval logs or from the run itself.
//!
//! Size: the page grows with the number of timeline samples (at most
//! 2,000), latency windows and probes, not with the number of agents: a
//! probe's charts have at most 60 bars and one point per HDR bucket.

mod blocks;
mod capacity;
mod charts;
mod connect;
mod events;
mod gossip;
mod sections;
mod server;
mod storm;
mod study;
pub mod svg;
mod vault;

use std::fmt::Write as _;

use crate::assert::Verdict;
use crate::summary::Summary;
use crate::timeline::LatencyWindow;

/// What a page is made of.
#[derive(Debug, Clone, Copy)]
pub struct Page<'a> {
    /// The run's summary (or the merge of several).
    pub summary: &'a Summary,
    /// Verdicts of the run's assertions.
    pub verdicts: &'a [Verdict],
    /// Latency percentiles per interval (from `--hlog` files or the run).
    pub windows: &'a [LatencyWindow],
    /// Files the page was made from (empty: written by the run itself).
    pub sources: &'a [String],
}

/// Escapes text for HTML content and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const CSS: &str = r#"
:root{--ink:#1a1a1a;--muted:#555;--rule:#d0d0d0;--pass:#1e6b34;--fail:#a61b1b;--bg-pass:#e8f4ec;--bg-fail:#fbeaea}
*{box-sizing:border-box}
body{margin:0;font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;color:var(--ink);background:#fff}
main{max-width:1080px;margin:0 auto;padding:20px 24px 48px}
h1{font-size:1.6em;margin:0 0 4px}
h2{font-size:1.25em;margin:36px 0 8px;padding-bottom:4px;border-bottom:2px solid var(--ink)}
h3{font-size:1.05em;margin:22px 0 6px}
p.sub,p.note{color:var(--muted);margin:4px 0}
.banner{border:2px solid;border-radius:6px;padding:10px 14px;margin:14px 0;font-size:1.1em}
.banner.pass{border-color:var(--pass);background:var(--bg-pass)}
.banner.fail{border-color:var(--fail);background:var(--bg-fail)}
.banner b{font-size:1.15em;letter-spacing:.04em}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(128px,1fr));gap:10px;margin:12px 0}
.card{border:1px solid var(--rule);border-radius:6px;padding:8px 10px}
.card .k{color:var(--muted);font-size:.85em}
.card .v{font-size:1.35em;font-weight:600;overflow-wrap:anywhere}
.card.wide{grid-column:span 2}
.card.wide .v{font-size:1.1em}
.wide{overflow-x:auto}
table{border-collapse:collapse;margin:8px 0 12px;font-size:.93em;width:100%}
th,td{border-bottom:1px solid var(--rule);padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f2f2f2;font-weight:600}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.words{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.9em;overflow-wrap:anywhere}
.ok{color:var(--pass);font-weight:600}
.bad{color:var(--fail);font-weight:600}
figure{margin:8px 0 18px}
figcaption{color:var(--muted);font-size:.9em}
svg.chart{width:100%;height:auto;display:block;font-size:12px}
svg.chart text{fill:var(--ink)}
svg.chart .tick{fill:var(--muted)}
svg.chart .axis-title{font-size:12.5px}
svg.chart .grid line{stroke:#e4e4e4;stroke-width:1}
svg.chart .frame{fill:none;stroke:#999}
svg.chart .bar{fill:#9fb6d9;stroke:#1c4e9d;stroke-width:.8}
svg.chart .mark line{stroke:#1a1a1a;stroke-width:1.2;stroke-dasharray:3 3}
svg.chart .mark text{font-size:11.5px;font-weight:600}
svg.chart .reference line{stroke:#777;stroke-width:1.2;stroke-dasharray:6 3}
svg.chart .reference text{fill:#555;font-size:11.5px}
svg.chart .line polyline,svg.chart .legend line{fill:none;stroke:currentColor;stroke-width:2;stroke-linejoin:round}
svg.chart .line circle,svg.chart .line path{fill:currentColor;stroke:none}
svg.chart .line .hollow{fill:#fff;stroke:currentColor;stroke-width:1.5}
svg.chart .line .stroke{fill:none;stroke:currentColor;stroke-width:1.8}
dl.kv{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:6px 0}
dl.kv dt{color:var(--muted)}
dl.kv dd{margin:0}
footer{margin-top:40px;color:var(--muted);font-size:.85em}
@media print{main{max-width:none;padding:0}h2{break-after:avoid}figure,table{break-inside:avoid}.banner{background:none}}
"#;

/// The page style, for other pages of the same look (`report compare`).
pub fn css() -> &'static str {
    CSS.trim()
}

/// The whole page.
pub fn render(page: &Page<'_>) -> String {
    let s = page.summary;
    let mut o = String::with_capacity(64 * 1024);
    let title = format!(
        "agent-sim report: {} run, {} agent(s), {}",
        s.kind,
        s.agents.requested,
        if s.started_at.is_empty() {
            "start unknown"
        } else {
            &s.started_at
        }
    );
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <meta name=\"generator\" content=\"agent-sim {}\">\n<title>{}</title>\n<style>{}</style>\n</head>\n<body>\n<main>\n",
        env!("CARGO_PKG_VERSION"),
        esc(&title),
        CSS.trim()
    );
    sections::headline(&mut o, page);
    capacity::capacity(&mut o, s);
    sections::probes(&mut o, s);
    connect::page(&mut o, s);
    sections::sessions(&mut o, s);
    sections::by_server(&mut o, s);
    server::server(&mut o, s);
    vault::vault(&mut o, s);
    sections::rates(&mut o, s);
    sections::latency(&mut o, s, page.windows);
    events::disruptions(&mut o, s);
    events::errors(&mut o, s);
    sections::process(&mut o, s);
    sections::config(&mut o, s);
    study::study(&mut o, s);
    let _ = write!(
        o,
        "<footer>Written by agent-sim {}{}. Latencies are from HDR histograms (3 significant \
         figures); every chart is drawn from the data in this page's summary, with no \
         script.</footer>\n</main>\n</body>\n</html>\n",
        env!("CARGO_PKG_VERSION"),
        if page.sources.is_empty() {
            " at the end of the run".to_string()
        } else {
            format!(" from {}", esc(&page.sources.join(", ")))
        }
    );
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            esc(r#"<a href="x">'&'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
    }

    use crate::disruption::{BackAfter, DisruptionSummary};
    use crate::new_latency_histogram;
    use crate::summary::{KindEntry, LatencySummary, ProbeSummary, TimelineSample};

    /// A made-up 2,000-agent run with every section filled: three probes, a
    /// storm at 300 s, errors, latency windows and a config.
    pub(crate) fn fixture() -> (Summary, Vec<Verdict>, Vec<LatencyWindow>) {
        let mut rng = fastrand::Rng::with_seed(13);
        let mut s = Summary {
            schema: crate::summary::SCHEMA_V2.into(),
            kind: "consul".into(),
            targets: vec!["127.0.0.1:8300".into()],
            started_at: "2026-11-21T22:40:00.000Z".into(),
            duration_s: 600.0,
            ..Default::default()
        };
        s.agents.requested = 2_000;
        s.agents.connected = 1_990;
        s.agents.peak_connected = 2_000;
        s.agents.ever_connected = 2_000;
        s.agents.lost_not_back = 10;
        s.outcome.exit_code = 2;
        s.outcome.reason = Some("incomplete fleet: 1990 of 2000 agent(s) connected".into());
        s.outcome.missing.insert("connect_refused".into(), 10);
        for id in 1..=3u64 {
            let mut h = new_latency_histogram();
            for _ in 0..1_995 {
                let v = (2_000.0 * (rng.f64() * 3.0).exp() * id as f64) as u64;
                h.record(v).unwrap();
            }
            s.probes.push(ProbeSummary {
                id,
                kind: "register".into(),
                t0: format!("2026-11-21T22:4{}:00.000Z", id),
                delivered: 1_995,
                expected: 2_000,
                time_to_99pct_us: None,
                latency_us: LatencySummary::from_histogram(&h),
                ..Default::default()
            });
        }
        let mut connected = 0u64;
        for i in 1..=60u64 {
            connected = match i {
                1 => 900,
                2..=29 => 2_000,
                30 => 0,
                31 => 1_500,
                _ => 1_990,
            };
            s.timeline.push(TimelineSample {
                t_s: i as f64 * 10.0,
                connected,
                rss_bytes: (20 + i.min(5) * 10) << 20,
                cpu_s: i as f64 * 1.3,
                counters: [("events_received".to_string(), 4_000 + i * 10)].into(),
                errors: if (30..33).contains(&i) {
                    [("connect_refused".to_string(), 500 / (i - 29))].into()
                } else {
                    Default::default()
                },
                ..TimelineSample::default()
            });
        }
        assert_eq!(connected, 1_990);
        s.rates_per_s.insert("events_received".into(), 420.0);
        s.counters.insert("events_received".into(), 252_000);
        s.counters.insert("sessions_established".into(), 4_000);
        s.errors.insert(
            "connect_refused".into(),
            KindEntry {
                count: 916,
                first_seen_s: 300.2,
                sample: Some("dial tcp 127.0.0.1:8300: connection refused".into()),
                hint: Some("nothing listens on that host:port".into()),
                heals: true,
                said_by: crate::Speaker::Os,
            },
        );
        let mut h = new_latency_histogram();
        for _ in 0..2_000 {
            h.record(rng.u64(300..90_000)).unwrap();
        }
        s.latency_us
            .insert("connect".into(), LatencySummary::from_histogram(&h));
        s.disruptions.push(DisruptionSummary {
            id: 1,
            cause: "storm".into(),
            fleet: "consul".into(),
            began_s: 300.0,
            sessions_lost: 2_000,
            back: 1_990,
            back_after_s: BackAfter {
                p50: Some(4.2),
                p90: Some(9.0),
                p99: Some(15.0),
                p100: None,
            },
            reconnect_us: LatencySummary::from_histogram(&h),
            attempts: 2_450,
            snapshots: 2_000,
            missing_at_end: [("connect_refused".to_string(), 10)].into(),
            ..Default::default()
        });
        s.config = Some(
            serde_json::json!({"agents": 2000, "kind": "consul", "token": "<redacted>",
                "assert": ["agents.connected == requested", "propagation.p99 < 1s"]})
            .as_object()
            .unwrap()
            .clone(),
        );
        let verdicts = crate::assert::evaluate(
            &[
                "agents.connected == requested".parse().unwrap(),
                "connect.p99 < 1s".parse().unwrap(),
            ],
            &s,
        );
        let windows = (0..60)
            .map(|i| LatencyWindow {
                name: "connect".into(),
                start_s: i as f64 * 10.0,
                length_s: 10.0,
                count: 100,
                p50: 800 + i * 10,
                p90: 2_000,
                p99: 9_000,
                max: 20_000 + i * 1_000,
            })
            .collect();
        (s, verdicts, windows)
    }

    #[test]
    fn a_full_page_has_every_section_in_order() {
        let (s, verdicts, windows) = fixture();
        let html = render(&Page {
            summary: &s,
            verdicts: &verdicts,
            windows: &windows,
            sources: &["run.json".to_string()],
        });
        if let Ok(p) = std::env::var("AGENT_SIM_KEEP_HTML") {
            std::fs::write(p, &html).unwrap();
        }
        let order = [
            "id=\"headline\"",
            "id=\"probes\"",
            "id=\"sessions\"",
            "id=\"rates\"",
            "id=\"latency\"",
            "id=\"disruptions\"",
            "id=\"errors\"",
            "id=\"process\"",
            "id=\"config\"",
        ];
        let at: Vec<usize> = order.iter().map(|k| html.find(k).expect(k)).collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{at:?}");
        assert!(html.contains("✘ FAIL</b> exit 2"));
        assert!(html.contains("1 of 2 assertion(s) held"));
        assert_eq!(
            html.matches("<svg").count(),
            3 * 2 + 1 + 1 + 1 + 1 + 1 + 1 + 2
        );
        assert!(html.contains("dial tcp 127.0.0.1:8300: connection refused"));
        assert!(
            html.contains("the OS said: <span class=\"words\">dial tcp 127.0.0.1:8300"),
            "the refused connect in the OS's words"
        );
        assert!(html.contains("aria-label=\"Disruption #1 (storm): agents back\""));
        assert!(
            html.contains("<td class=\"n\">1990 / 2000</td>"),
            "back / lost"
        );
        assert!(html.contains("4.20s / 9.00s / 15.00s / never"));
        assert!(
            html.contains("data-label=\"#1 storm\""),
            "marked on the sessions chart"
        );
        assert!(html.contains("&lt;redacted&gt;"));
        assert!(
            !html.contains("<script") && !html.contains("http://") && !html.contains("https://")
        );
        assert!(html.len() < 200_000, "{} bytes", html.len());
    }

    #[test]
    fn an_empty_summary_still_makes_a_whole_page() {
        let s = Summary::default();
        let html = render(&Page {
            summary: &s,
            verdicts: &[],
            windows: &[],
            sources: &[],
        });
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.trim_end().ends_with("</html>"));
        assert!(!html.contains("<script"));
    }
}
