//! The page's "Server" section: each observed server's CPU, memory and
//! kept latencies over the run, on the sessions' time axis (disruptions
//! marked), its baseline as the dashed line, and what each agent cost it;
//! a Consul server's view of the run's gossip members ([`super::gossip`])
//! and its storm figures ([`super::storm`]).

use super::blocks::{close, disruption_marks, figure, kv, note, open, table};
use super::charts::over_time;
use super::esc;
use super::svg::{Series, Unit};
use crate::server::ServerSummary;
use crate::summary::Summary;
use crate::units::{fmt_mib, fmt_us};

fn points(
    srv: &ServerSummary,
    f: impl Fn(&crate::server::ServerSample) -> Option<f64>,
) -> Vec<(f64, f64)> {
    srv.samples
        .iter()
        .filter_map(|p| f(p).map(|v| (p.t_s.max(0.0), v)))
        .collect()
}

/// One series per observed server (named by its kind when there is one).
fn per_server(
    s: &Summary,
    f: impl Fn(&crate::server::ServerSample) -> Option<f64> + Copy,
) -> Vec<Series> {
    s.server
        .iter()
        .enumerate()
        .map(|(i, srv)| Series {
            name: if s.server.len() == 1 {
                srv.kind.clone()
            } else {
                format!("#{} {}", i + 1, srv.kind)
            },
            points: points(srv, f),
            steps: false,
        })
        .filter(|x| !x.points.is_empty())
        .collect()
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "-".into(), f)
}

fn us(v: Option<f64>) -> String {
    opt(v, |x| fmt_us(x.max(0.0).round() as u64))
}

/// A chart of one quantity of every server, the baseline dashed when one
/// server is observed.
fn level_chart(
    o: &mut String,
    s: &Summary,
    (title, unit, y_title): (&str, Unit, &str),
    value: impl Fn(&crate::server::ServerSample) -> Option<f64> + Copy,
    baseline: Option<(f64, String)>,
    caption: &str,
) {
    let mut chart = over_time(title, s.duration_s, unit, y_title, per_server(s, value));
    if let Some(c) = chart.as_mut() {
        c.marks = disruption_marks(s);
        // Bytes are rescaled to KiB/MiB by the chart: no reference there.
        if s.server.len() == 1 && !matches!(unit, Unit::Bytes) {
            c.reference = baseline;
        }
    }
    figure(o, chart, caption);
}

/// What every observed server did, on the run's time axis.
pub(super) fn server(o: &mut String, s: &Summary) {
    if s.server.is_empty() {
        return;
    }
    open(o, "server", "Server");
    sizing_table(o, s);
    let one = (s.server.len() == 1).then(|| &s.server[0]);
    level_chart(
        o,
        s,
        ("Server CPU", Unit::Cores, "cores busy"),
        |p| p.cpu_cores,
        one.and_then(|x| x.sizing.cpu_cores.baseline)
            .map(|b| (b, format!("baseline {b:.2}"))),
        "CPU of each observed server per interval; the dashed line is its baseline before the \
         first agent dialed; marks are disruptions.",
    );
    level_chart(
        o,
        s,
        ("Server resident memory", Unit::Bytes, "RSS"),
        |p| p.rss_bytes.map(|b| b as f64),
        None,
        "Resident memory of each observed server at each scrape.",
    );
    latency_charts(o, s);
    for (i, srv) in s.server.iter().enumerate() {
        super::gossip::gossip(o, s, i, srv);
        super::storm::storm(o, s, i, srv);
    }
    for (i, srv) in s.server.iter().enumerate() {
        details(o, i, srv);
    }
    close(o);
}

/// One row per server: scrapes, CPU and memory at baseline and steady, and
/// what each agent cost it.
fn sizing_table(o: &mut String, s: &Summary) {
    let rows: Vec<Vec<String>> = s
        .server
        .iter()
        .enumerate()
        .map(|(i, srv)| {
            let z = &srv.sizing;
            vec![
                format!(
                    "#{} {} ({})<br><small>{}</small>",
                    i + 1,
                    esc(&srv.kind),
                    esc(&srv.source),
                    esc(&srv.target)
                ),
                format!("{} / {}", srv.scrapes, srv.failed),
                opt(z.cpu_cores.baseline, |c| format!("{c:.2}")),
                opt(z.cpu_cores.mean, |c| format!("{c:.2}")),
                opt(z.cores_per_1000_agents, |c| format!("{c:.3}")),
                opt(z.rss_bytes.baseline, |b| fmt_mib(b as u64)),
                opt(z.rss_bytes.mean, |b| fmt_mib(b as u64)),
                opt(z.rss_per_agent_kib, |k| format!("{k:.1}")),
                opt(z.cpu_ms_per_connect, |ms| format!("{ms:.1}")),
            ]
        })
        .collect();
    table(
        o,
        &[
            "server",
            ">scrapes / failed",
            ">CPU baseline",
            ">CPU steady",
            ">cores / 1,000 agents",
            ">RSS baseline",
            ">RSS steady",
            ">KiB / agent",
            ">CPU ms / connect",
        ],
        &rows,
    );
}

/// One chart per latency the servers keep: p50 and p99 of each server.
fn latency_charts(o: &mut String, s: &Summary) {
    let mut names: Vec<&String> = s
        .server
        .iter()
        .flat_map(|srv| srv.latencies.keys())
        .collect();
    names.sort();
    names.dedup();
    for name in names {
        let mut series = Vec::new();
        for (i, srv) in s.server.iter().enumerate() {
            for (q, pick) in [("p50", 0usize), ("p99", 1)] {
                let pts = points(srv, |p| {
                    p.latencies.get(name.as_str()).and_then(|l| {
                        if pick == 0 {
                            l.p50.or(l.mean)
                        } else {
                            l.p99.or(l.max)
                        }
                    })
                });
                if !pts.is_empty() {
                    series.push(Series {
                        name: if s.server.len() == 1 {
                            q.to_string()
                        } else {
                            format!("#{} {q}", i + 1)
                        },
                        points: pts,
                        steps: false,
                    });
                }
            }
        }
        let mut chart = over_time(name, s.duration_s, Unit::Micros, "latency", series);
        if let Some(c) = chart.as_mut() {
            c.marks = disruption_marks(s);
        }
        figure(
            o,
            chart,
            &format!(
                "{name}: the server's own latency per interval (its summaries' sliding-window \
                 quantiles, or quantiles of the histogram buckets that filled in the interval; \
                 Consul's JSON gives mean and max)."
            ),
        );
    }
}

/// Server `i`'s latencies at baseline and under load, its steady state and
/// its notes.
fn details(o: &mut String, i: usize, srv: &ServerSummary) {
    if !srv.latencies.is_empty() {
        let rows: Vec<Vec<String>> = srv
            .latencies
            .iter()
            .map(|(n, l)| {
                vec![
                    esc(n),
                    us(l.baseline_p50),
                    us(l.baseline_p99),
                    us(l.p50),
                    us(l.p99),
                    format!("{:.0}", l.count),
                ]
            })
            .collect();
        let _ = std::fmt::Write::write_fmt(
            o,
            format_args!("<h3>#{} {}: latencies</h3>\n", i + 1, esc(&srv.kind)),
        );
        table(
            o,
            &[
                "latency",
                ">baseline p50",
                ">baseline p99",
                ">under load p50",
                ">under load p99",
                ">observations",
            ],
            &rows,
        );
    }
    if let Some((a, b)) = srv.sizing.steady_s {
        let label = format!("#{} {}: steady state", i + 1, srv.kind);
        kv(
            o,
            &[(
                label.as_str(),
                format!(
                    "{a:.1}s to {b:.1}s, {:.0} agent(s) held on average",
                    srv.sizing.agents
                ),
            )],
        );
    }
    for n in &srv.notes {
        note(o, n);
    }
}
