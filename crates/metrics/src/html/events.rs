//! The page's sections on what went wrong: each disruption with how fast
//! the fleet came back, and the errors and warnings by kind over time with
//! the words of whoever spoke (the server, the OS) and what to check.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::blocks::{by_cause, close, figure, no_timeline, note, open, run_time, table};
use super::charts::{arrival_cdf, over_time};
use super::esc;
use super::sections::MAX_DRAWN;
use super::svg::{Series, Unit};
use crate::summary::{KindEntry, Summary};
use crate::units::fmt_us;

/// Error kinds with their own line in the errors chart; the rest are summed.
const ERROR_LINES: usize = 5;

fn secs(v: Option<f64>) -> String {
    v.map(|x| format!("{x:.2}s"))
        .unwrap_or_else(|| "never".into())
}

/// Each disruption: what was lost, how fast it came back.
pub(super) fn disruptions(o: &mut String, s: &Summary) {
    open(o, "disruptions", "Disruptions and reconvergence");
    if s.disruptions.is_empty() {
        note(o, "No disruption in this run.");
        close(o);
        return;
    }
    // Consul's subscription figures only where a fleet had any.
    let consul = s
        .disruptions
        .iter()
        .any(|d| d.snapshots + d.resumes + d.resumes_silent > 0);
    let rows: Vec<Vec<String>> = s
        .disruptions
        .iter()
        .map(|d| {
            let b = &d.back_after_s;
            let mut row = vec![
                d.id.to_string(),
                esc(&format!("{} ({})", d.cause, d.fleet)),
                run_time(d.began_s),
                format!("{} / {}", d.back, d.sessions_lost),
                format!(
                    "{} / {} / {} / {}",
                    secs(b.p50),
                    secs(b.p90),
                    secs(b.p99),
                    secs(b.p100)
                ),
                format!(
                    "{} / {}",
                    fmt_us(d.reconnect_us.p50),
                    fmt_us(d.reconnect_us.p99)
                ),
                d.attempts.to_string(),
            ];
            if consul {
                row.push(format!(
                    "{} / {} / {}",
                    d.snapshots, d.resumes, d.resumes_silent
                ));
            }
            row.push(esc(&by_cause(&d.missing_at_end)));
            row
        })
        .collect();
    let mut head = vec![
        "#",
        "cause (fleet)",
        ">began",
        ">back / lost",
        ">50 / 90 / 99 / 100 % back after",
        ">reconnect p50 / p99",
        ">attempts",
    ];
    if consul {
        head.push(">snapshots / resumes / silent");
    }
    head.push("missing at end");
    table(o, &head, &rows);
    for d in s.disruptions.iter().take(MAX_DRAWN) {
        let Ok(h) = d.reconnect_us.histogram() else {
            continue;
        };
        figure(
            o,
            arrival_cdf(
                &format!("Disruption #{} ({}): agents back", d.id, d.cause),
                &h,
                &d.reconnect_us,
                d.sessions_lost,
                "loss to steady state again, log scale",
            ),
            &format!(
                "Disruption #{} ({} at {}): share of the {} lost sessions back, by time from each loss.",
                d.id,
                d.cause,
                run_time(d.began_s),
                d.sessions_lost
            ),
        );
    }
    if s.disruptions.len() > MAX_DRAWN {
        note(
            o,
            &format!("The first {MAX_DRAWN} disruptions are drawn; every one is in the table."),
        );
    }
    close(o);
}

/// Errors and warnings by kind; `words` heads the sample's column. An
/// error's sample says whose words it is (`server said:`, `the OS said:`);
/// a warning's (`details`, often agent-sim's own words) goes unlabelled.
fn kinds_table(o: &mut String, m: &BTreeMap<String, KindEntry>, words: &str, say_who: bool) {
    let mut v: Vec<(&String, &KindEntry)> = m.iter().collect();
    v.sort_by(|a, b| b.1.count.cmp(&a.1.count).then(a.0.cmp(b.0)));
    let rows: Vec<Vec<String>> = v
        .iter()
        .map(|(k, e)| {
            vec![
                esc(k),
                e.count.to_string(),
                format!("{:.1}s", e.first_seen_s),
                if e.heals { "yes" } else { "no" }.to_string(),
                match (&e.sample, say_who) {
                    (Some(w), true) => format!(
                        "{}: <span class=\"words\">{}</span>",
                        e.said_by.said(),
                        esc(w)
                    ),
                    (w, _) => format!(
                        "<span class=\"words\">{}</span>",
                        esc(w.as_deref().unwrap_or(""))
                    ),
                },
                esc(e.hint.as_deref().unwrap_or("")),
            ]
        })
        .collect();
    table(
        o,
        &["kind", ">count", ">first seen", "heals", words, "check"],
        &rows,
    );
}

/// Errors by kind over time, with whose words each sample is and what to
/// check.
pub(super) fn errors(o: &mut String, s: &Summary) {
    open(o, "errors", "Errors");
    let total = s.errors_total();
    if total == 0 {
        note(o, "No error.");
    } else {
        let mut kinds: Vec<(&String, u64)> = s.errors.iter().map(|(k, e)| (k, e.count)).collect();
        kinds.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        let shown: Vec<&String> = kinds.iter().take(ERROR_LINES).map(|k| k.0).collect();
        let mut series: Vec<Series> = shown
            .iter()
            .map(|k| Series {
                name: (*k).clone(),
                points: s
                    .timeline
                    .iter()
                    .map(|t| (t.t_s, t.errors.get(*k).copied().unwrap_or(0) as f64))
                    .collect(),
                steps: false,
            })
            .collect();
        if kinds.len() > ERROR_LINES {
            series.push(Series {
                name: "other kinds".into(),
                points: s
                    .timeline
                    .iter()
                    .map(|t| {
                        let other: u64 = t
                            .errors
                            .iter()
                            .filter(|(k, _)| !shown.contains(k))
                            .map(|(_, v)| v)
                            .sum();
                        (t.t_s, other as f64)
                    })
                    .collect(),
                steps: false,
            });
        }
        if s.timeline.is_empty() {
            no_timeline(o);
        } else {
            figure(
                o,
                over_time(
                    "Errors by kind",
                    s.duration_s,
                    Unit::Count,
                    "errors per sample interval",
                    series,
                ),
                "Errors of each kind between samples.",
            );
        }
        let _ = writeln!(o, "<p>{total} error(s) in all.</p>");
        kinds_table(o, &s.errors, "words", true);
    }
    if !s.denied.is_empty() {
        let _ = writeln!(o, "<h3>Denied</h3>");
        note(
            o,
            "Calls the servers refused for the caller's credentials (unknown token, a \
             permission the token lacks, bad credentials), by what was called. Each is an \
             error above too; none is counted as a success.",
        );
        let mut rows: Vec<(&String, &u64)> = s.denied.iter().collect();
        rows.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let rows: Vec<Vec<String>> = rows
            .into_iter()
            .map(|(k, v)| vec![k.clone(), v.to_string()])
            .collect();
        table(o, &["called", ">denied"], &rows);
    }
    if !s.warnings.is_empty() {
        let _ = writeln!(o, "<h3>Warnings</h3>");
        note(o, "What a real agent logs and carries on with.");
        kinds_table(o, &s.warnings, "details", false);
    }
    close(o);
}
