//! Two runs side by side (`agent-sim report compare A.json B.json`): the
//! figures people size and decide by, of the client and of every observed
//! server, with the ratio B/A, for before/after questions (a server
//! upgrade, a config change, streaming vs blocking queries). As a table
//! for the terminal and as a self-contained page.
//!
//! A figure present in only one run is shown with `-` on the other side;
//! the ratio is left out when A is zero or absent. Observed servers are
//! paired in order (the first of A with the first of B).

use std::fmt::Write as _;

use crate::html::esc;
use crate::server::ServerSummary;
use crate::summary::Summary;
pub use crate::units::Kind;
use crate::units::{fmt_mib, fmt_us};

/// One figure of both runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The part of the report (`agents`, `latency`, `server #1 consul`, ...).
    pub group: String,
    /// The figure (`connect p99`, `cpu cores, steady`).
    pub name: String,
    /// Run A's value.
    pub a: Option<f64>,
    /// Run B's value.
    pub b: Option<f64>,
    /// How the values read.
    pub kind: Kind,
}

impl Row {
    /// B / A, when both are there and A is not zero.
    pub fn ratio(&self) -> Option<f64> {
        match (self.a, self.b) {
            (Some(a), Some(b)) if a != 0.0 => Some(b / a),
            _ => None,
        }
    }
}

fn show(kind: Kind, v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(x) => match kind {
            Kind::Micros => fmt_us(x.max(0.0).round() as u64),
            Kind::Bytes => fmt_mib(x.max(0.0) as u64),
            Kind::Number if x.fract() == 0.0 && x.abs() < 1e15 => format!("{x:.0}"),
            Kind::Number => format!("{:.3}", x),
        },
    }
}

fn ratio_text(r: Option<f64>) -> String {
    r.map_or_else(String::new, |r| format!("{r:.2}x"))
}

struct Rows(Vec<Row>);

impl Rows {
    fn push(&mut self, group: &str, name: &str, a: Option<f64>, b: Option<f64>, kind: Kind) {
        if a.is_some() || b.is_some() {
            self.0.push(Row {
                group: group.into(),
                name: name.into(),
                a,
                b,
                kind,
            });
        }
    }
}

/// The thresholds' verdicts as the page's first table.
fn thresholds_html(o: &mut String, gates: &[crate::gate::GateVerdict]) {
    if gates.is_empty() {
        return;
    }
    o.push_str(
        "<h2>Thresholds</h2>\n<div class=\"wide\"><table><thead><tr><th>result</th>\
         <th>threshold</th><th class=\"n\">A</th><th class=\"n\">B</th>\
         <th class=\"n\">change</th><th>note</th></tr></thead><tbody>",
    );
    for g in gates {
        let (class, word) = if g.passed {
            ("n", "pass")
        } else {
            ("n bad", "FAIL")
        };
        let _ = write!(
            o,
            "<tr><td class=\"{class}\">{word}</td><td>{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
            esc(&g.threshold),
            esc(&g.a),
            esc(&g.b),
            esc(g.change.as_deref().unwrap_or("")),
            esc(g.note.as_deref().unwrap_or(""))
        );
    }
    o.push_str("</tbody></table></div>\n");
}

/// Every comparable figure of `a` and `b`, in report order.
pub fn rows(a: &Summary, b: &Summary) -> Vec<Row> {
    let mut r = Rows(Vec::new());
    agents(&mut r, a, b);
    latencies(&mut r, a, b);
    simulator(&mut r, a, b);
    for i in 0..a.server.len().max(b.server.len()) {
        server(&mut r, i, a.server.get(i), b.server.get(i));
    }
    study(&mut r, a, b);
    capacity(&mut r, a, b);
    r.0
}

/// A stepped run's answer: the capacity and the step that broke.
fn capacity(r: &mut Rows, a: &Summary, b: &Summary) {
    let figures: [(&str, Figure<'_>); 2] = [
        ("capacity (agents)", &|s| {
            s.capacity.as_ref()?.capacity.map(|c| c as f64)
        }),
        ("broke at (agents)", &|s| {
            s.capacity.as_ref()?.broke_at.map(|c| c as f64)
        }),
    ];
    for (name, f) in figures {
        r.push("capacity", name, f(a), f(b), Kind::Number);
    }
}

/// The published figures of the study both runs reproduced, each with both
/// runs' values (the published value in the figure's name).
fn study(r: &mut Rows, a: &Summary, b: &Summary) {
    let Some(st) = a.study.as_ref().or(b.study.as_ref()) else {
        return;
    };
    let same = |s: &Summary| s.study.as_ref().is_some_and(|x| x.name == st.name);
    let group = format!("study {}", st.name);
    for f in &st.figures {
        let value = |s: &Summary| {
            let (m, v) = crate::study::read(f, s).ok().filter(|_| same(s))?;
            Some((m.unit(), v))
        };
        let (va, vb) = (value(a), value(b));
        let kind = va.or(vb).map_or(Kind::Number, |x| x.0);
        let name = format!("{} (published {})", f.label, f.published);
        r.push(&group, &name, va.map(|x| x.1), vb.map(|x| x.1), kind);
    }
}

/// A figure of a run, if it has it.
type Figure<'a> = &'a dyn Fn(&Summary) -> Option<f64>;

/// A figure of an observed server, if it has it.
type ServerFigure<'a> = &'a dyn Fn(&ServerSummary) -> Option<f64>;

fn count(v: u64) -> Option<f64> {
    Some(v as f64)
}

/// The agents: requested, connected, never connected, errors, run length.
fn agents(r: &mut Rows, a: &Summary, b: &Summary) {
    let figures: [(&str, Figure<'_>); 5] = [
        ("requested", &|s| count(s.agents.requested)),
        ("connected at the end", &|s| count(s.agents.connected)),
        ("never connected", &|s| count(s.agents.never_connected)),
        ("errors", &|s| count(s.errors_total())),
        ("run length (s)", &|s| Some(s.duration_s)),
    ];
    for (name, f) in figures {
        r.push("agents", name, f(a), f(b), Kind::Number);
    }
}

/// p50, p99 and max of every latency either run has.
fn latencies(r: &mut Rows, a: &Summary, b: &Summary) {
    let mut latencies: Vec<&String> = a.latency_us.keys().chain(b.latency_us.keys()).collect();
    latencies.sort();
    latencies.dedup();
    for name in latencies {
        for (stat, pick) in [("p50", 0), ("p99", 1), ("max", 2)] {
            let get = |s: &Summary| {
                s.latency_us.get(name).filter(|l| l.count > 0).map(|l| {
                    (match pick {
                        0 => l.p50,
                        1 => l.p99,
                        _ => l.max,
                    }) as f64
                })
            };
            r.push(
                "latency",
                &format!("{name} {stat}"),
                get(a),
                get(b),
                Kind::Micros,
            );
        }
    }
}

/// The probes' delivery, the rates, bytes per agent and the simulator's
/// own cost.
fn simulator(r: &mut Rows, a: &Summary, b: &Summary) {
    let delivered = |s: &Summary| {
        s.probes
            .iter()
            .filter(|p| p.expected > 0)
            .map(|p| p.delivered as f64 / p.expected as f64)
            .reduce(f64::min)
    };
    r.push(
        "probes",
        "delivered ratio (lowest)",
        delivered(a),
        delivered(b),
        Kind::Number,
    );
    let mut rates: Vec<&String> = a.rates_per_s.keys().chain(b.rates_per_s.keys()).collect();
    rates.sort();
    rates.dedup();
    for name in rates {
        r.push(
            "rates (per second)",
            name,
            a.rates_per_s.get(name).copied(),
            b.rates_per_s.get(name).copied(),
            Kind::Number,
        );
    }
    let per_agent = |s: &Summary, counter: &str| {
        let v = *s.counters.get(counter)? as f64;
        (s.agents.requested > 0).then(|| v / s.agents.requested as f64)
    };
    for counter in ["bytes_received", "bytes_sent"] {
        r.push(
            "per agent",
            counter,
            per_agent(a, counter),
            per_agent(b, counter),
            Kind::Bytes,
        );
    }
    r.push(
        "simulator",
        "peak RSS",
        count(a.process.peak_rss_bytes),
        count(b.process.peak_rss_bytes),
        Kind::Bytes,
    );
    r.push(
        "simulator",
        "CPU seconds",
        Some(a.process.cpu_user_s + a.process.cpu_sys_s),
        Some(b.process.cpu_user_s + b.process.cpu_sys_s),
        Kind::Number,
    );
}

/// The `i`-th observed server of each run: its sizing, then p50 and p99 of
/// every latency it kept.
fn server(r: &mut Rows, i: usize, sa: Option<&ServerSummary>, sb: Option<&ServerSummary>) {
    let kind = sa.or(sb).map_or("", |s| s.kind.as_str());
    let group = format!("server #{} {kind}", i + 1);
    let sizing: [(&str, Kind, ServerFigure<'_>); 6] = [
        ("cpu cores, baseline", Kind::Number, &|s| {
            s.sizing.cpu_cores.baseline
        }),
        ("cpu cores, steady", Kind::Number, &|s| {
            s.sizing.cpu_cores.mean
        }),
        ("cpu cores, max", Kind::Number, &|s| s.sizing.cpu_cores.max),
        ("cores per 1,000 agents", Kind::Number, &|s| {
            s.sizing.cores_per_1000_agents
        }),
        ("RSS, steady", Kind::Bytes, &|s| s.sizing.rss_bytes.mean),
        ("KiB per agent", Kind::Number, &|s| {
            s.sizing.rss_per_agent_kib
        }),
    ];
    for (name, kind, f) in sizing {
        r.push(&group, name, sa.and_then(f), sb.and_then(f), kind);
    }
    let mut names: Vec<&String> = sa
        .into_iter()
        .chain(sb)
        .flat_map(|s| s.latencies.keys())
        .collect();
    names.sort();
    names.dedup();
    for name in names {
        for stat in ["p50", "p99"] {
            r.push(
                &group,
                &format!("{name} {stat}"),
                sa.and_then(|s| s.stat(name, stat)),
                sb.and_then(|s| s.stat(name, stat)),
                Kind::Micros,
            );
        }
    }
}

fn describe(s: &Summary) -> String {
    format!(
        "{} run{}, {} agent(s), {:.0}s, {}",
        s.kind,
        s.consul_modes()
            .map(|m| format!(" ({m})"))
            .unwrap_or_default(),
        s.agents.requested,
        s.duration_s,
        if s.started_at.is_empty() {
            "start unknown"
        } else {
            &s.started_at
        }
    )
}

/// The comparison as a plain-text table.
pub fn render_text(names: (&str, &str), a: &Summary, b: &Summary) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "A  {}: {}", names.0, describe(a));
    let _ = writeln!(out, "B  {}: {}", names.1, describe(b));
    let mut group = String::new();
    for row in rows(a, b) {
        if row.group != group {
            let _ = writeln!(out, "{}", row.group);
            group = row.group.clone();
        }
        let _ = writeln!(
            out,
            "  {:<44} {:>12} {:>12} {:>9}",
            row.name,
            show(row.kind, row.a),
            show(row.kind, row.b),
            ratio_text(row.ratio())
        );
    }
    out
}

/// The comparison as one self-contained HTML page.
pub fn render_html(
    names: (&str, &str),
    a: &Summary,
    b: &Summary,
    gates: &[crate::gate::GateVerdict],
) -> String {
    let mut o = String::new();
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>agent-sim: {} vs {}</title>\n<style>{}</style>\n</head>\n<body>\n<main>\n\
         <h1>Two runs compared</h1>\n<dl class=\"kv\"><dt>A</dt><dd>{}: {}</dd><dt>B</dt><dd>{}: {}</dd></dl>\n",
        esc(names.0),
        esc(names.1),
        crate::html::css(),
        esc(names.0),
        esc(&describe(a)),
        esc(names.1),
        esc(&describe(b)),
    );
    thresholds_html(&mut o, gates);
    let mut group = String::new();
    for row in rows(a, b) {
        if row.group != group {
            if !group.is_empty() {
                o.push_str("</tbody></table></div>\n");
            }
            group = row.group.clone();
            let _ = write!(
                o,
                "<h2>{}</h2>\n<div class=\"wide\"><table><thead><tr><th>figure</th>\
                 <th class=\"n\">A</th><th class=\"n\">B</th><th class=\"n\">B / A</th></tr></thead><tbody>",
                esc(&group)
            );
        }
        let ratio = row.ratio();
        let class = match ratio {
            Some(r) if r >= 1.5 || r <= 1.0 / 1.5 => " class=\"n bad\"",
            _ => " class=\"n\"",
        };
        let _ = write!(
            o,
            "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td{class}>{}</td></tr>",
            esc(&row.name),
            esc(&show(row.kind, row.a)),
            esc(&show(row.kind, row.b)),
            esc(&ratio_text(ratio))
        );
    }
    if !group.is_empty() {
        o.push_str("</tbody></table></div>\n");
    }
    o.push_str(
        "<footer>Ratios of 1.5x or more either way are marked. Written by agent-sim report \
         compare.</footer>\n</main>\n</body>\n</html>\n",
    );
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::{Level, ServerSizing, ServerSummary};

    fn run(connected: u64, p99: u64, cpu: f64) -> Summary {
        let mut h = crate::new_latency_histogram();
        h.record(p99).unwrap();
        let mut s = Summary {
            kind: "consul".into(),
            ..Summary::default()
        };
        s.agents.requested = 1000;
        s.agents.connected = connected;
        s.latency_us
            .insert("connect".into(), crate::LatencySummary::from_histogram(&h));
        s.server.push(ServerSummary {
            kind: "consul".into(),
            sizing: ServerSizing {
                cpu_cores: Level {
                    mean: Some(cpu),
                    ..Level::default()
                },
                ..ServerSizing::default()
            },
            ..ServerSummary::default()
        });
        s
    }

    #[test]
    fn figures_of_both_runs_with_the_ratio() {
        let (a, b) = (run(1000, 2_000, 0.5), run(990, 4_000, 1.0));
        let rows = rows(&a, &b);
        let find = |name: &str| rows.iter().find(|r| r.name == name).unwrap();
        assert_eq!(find("connect p99").ratio().map(|r| r.round()), Some(2.0));
        assert_eq!(find("cpu cores, steady").ratio(), Some(2.0));
        assert_eq!(find("connected at the end").b, Some(990.0));
        assert!(rows.iter().all(|r| r.name != "cores per 1,000 agents"));
        let text = render_text(("a.json", "b.json"), &a, &b);
        assert!(text.contains("server #1 consul"), "{text}");
        assert!(text.contains("2.00x"), "{text}");
        let page = render_html(("a.json", "b.json"), &a, &b, &[]);
        assert!(page.contains("<td class=\"n bad\">2.00x</td>"), "{page}");
        assert!(!page.contains("http://") && !page.contains("https://"));
    }
}
