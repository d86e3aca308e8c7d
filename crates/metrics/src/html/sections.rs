//! The sections of the report page on the run itself, in page order: the
//! headline, the probes, sessions, rates and latency over time, the
//! simulator process and the settings. Each writes one `<section>` with its
//! tables and charts, or says why it has nothing.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::blocks::{
    by_cause, close, disruption_marks, figure, kv, no_timeline, note, open, run_time, table,
};
use super::charts::{self, arrival_cdf, arrival_histogram, over_time, rate_points};
use super::svg::{Axis, Chart, Scale, Series, Unit};
use super::{Page, esc};
use crate::summary::{LatencySummary, ProbeSummary, Summary};
use crate::timeline::LatencyWindow;
use crate::units::{fmt_mib, fmt_us};

/// Probes (and disruptions) drawn one by one up to this many; beyond it,
/// the slowest few are drawn and every one is in the table.
pub(super) const MAX_DRAWN: usize = 12;
/// How many of the slowest are drawn when there are more than [`MAX_DRAWN`].
const SLOWEST_DRAWN: usize = 6;

/// What the exit code means (the outcome contract, docs/results.md).
fn exit_meaning(code: i32) -> &'static str {
    match code {
        0 => "the fleet was complete and every assertion held",
        1 => "nothing could run",
        2 => "the run finished with an incomplete fleet",
        3 => "an assertion failed",
        _ => "unknown exit code",
    }
}

/// Agents, run length, targets, verdicts, exit code.
pub(super) fn headline(o: &mut String, page: &Page<'_>) {
    let s = page.summary;
    let a = &s.agents;
    title(o, page);
    banner(o, page);
    cards(o, s);
    kv(
        o,
        &[
            ("peak connected", a.peak_connected.to_string()),
            ("ever connected", a.ever_connected.to_string()),
            ("never connected", a.never_connected.to_string()),
            ("lost and not back", a.lost_not_back.to_string()),
            ("missing at the end", by_cause(&s.outcome.missing)),
        ],
    );
    verdicts(o, page);
    close(o);
}

/// The section's opening: what ran, when, which shard, from how many files.
fn title(o: &mut String, page: &Page<'_>) {
    let s = page.summary;
    let _ = writeln!(
        o,
        "<section id=\"headline\">\n<h1>agent-sim {} run{}</h1>",
        esc(&s.kind),
        s.consul_modes()
            .map(|m| format!(" ({})", esc(&m)))
            .unwrap_or_default()
    );
    let mut sub = vec![format!(
        "started {}",
        if s.started_at.is_empty() {
            "(unknown)"
        } else {
            &s.started_at
        }
    )];
    if let Some(sh) = &s.shard {
        sub.push(match &s.shard_from {
            Some(from) => format!("shard {sh} from {from}"),
            None => format!("shard {sh}"),
        });
    }
    if page.sources.len() > 1 {
        sub.push(format!("merged from {} files", page.sources.len()));
    }
    let _ = writeln!(o, "<p class=\"sub\">{}</p>", esc(&sub.join(" · ")));
}

/// Pass or fail: the exit code, why, and how many assertions held.
fn banner(o: &mut String, page: &Page<'_>) {
    let s = page.summary;
    let passed = page.verdicts.iter().filter(|v| v.passed).count();
    let ok = s.outcome.exit_code == 0;
    let why = match (&s.outcome.reason, &s.capacity) {
        (Some(r), _) => r.clone(),
        // A stepped run's fleet past its knee is its result.
        (None, Some(c)) => format!("a stepped run: {}", c.answer),
        (None, None) => exit_meaning(s.outcome.exit_code).to_string(),
    };
    let _ = writeln!(
        o,
        "<div class=\"banner {}\" id=\"verdict\"><b>{}</b> exit {}: {}{}</div>",
        if ok { "pass" } else { "fail" },
        if ok { "✔ PASS" } else { "✘ FAIL" },
        s.outcome.exit_code,
        esc(&why),
        if page.verdicts.is_empty() {
            String::new()
        } else {
            format!(" · {passed} of {} assertion(s) held", page.verdicts.len())
        }
    );
}

/// The headline's cards: agents, completeness, run length, exit code,
/// targets.
fn cards(o: &mut String, s: &Summary) {
    let a = &s.agents;
    let targets = if s.targets.is_empty() {
        "(none)".to_string()
    } else {
        s.targets.join(", ")
    };
    let cards = [
        ("agents requested", a.requested.to_string()),
        ("connected at end", a.connected.to_string()),
        (
            "complete",
            if s.outcome.complete { "yes" } else { "no" }.to_string(),
        ),
        ("run length", run_time(s.duration_s)),
        ("exit code", s.outcome.exit_code.to_string()),
        (
            if s.targets.len() > 1 {
                "targets"
            } else {
                "target"
            },
            targets,
        ),
    ];
    o.push_str("<div class=\"cards\">");
    for (k, v) in cards {
        // Addresses get a card twice as wide, so they do not break.
        let wide = if k.starts_with("target") { " wide" } else { "" };
        let _ = write!(
            o,
            "<div class=\"card{wide}\"><div class=\"k\">{}</div><div class=\"v\">{}</div></div>",
            esc(k),
            esc(&v)
        );
    }
    o.push_str("</div>\n");
}

/// The assertions' verdicts, or that none was given.
fn verdicts(o: &mut String, page: &Page<'_>) {
    if page.verdicts.is_empty() {
        note(o, "No --assert was given.");
    } else {
        let _ = writeln!(o, "<h3>Assertions</h3>");
        let rows: Vec<Vec<String>> = page
            .verdicts
            .iter()
            .map(|v| {
                vec![
                    if v.passed {
                        "<span class=\"ok\">✔ pass</span>".to_string()
                    } else {
                        "<span class=\"bad\">✘ FAIL</span>".to_string()
                    },
                    esc(&v.assertion),
                    esc(&v.actual_text()),
                    esc(&v.expected),
                    esc(v.note.as_deref().unwrap_or("")),
                ]
            })
            .collect();
        table(
            o,
            &["verdict", "assertion", ">actual", "expected", "note"],
            &rows,
        );
    }
}

/// Seconds from the run start of an RFC 3339 time, if both parse.
fn offset_s(started_at: &str, t: &str) -> Option<f64> {
    let a = humantime::parse_rfc3339(started_at).ok()?;
    let b = humantime::parse_rfc3339(t).ok()?;
    Some(match b.duration_since(a) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    })
}

fn probe_heading(p: &ProbeSummary) -> String {
    let share = if p.expected > 0 {
        format!(" ({:.1} %)", 100.0 * p.delivered as f64 / p.expected as f64)
    } else {
        String::new()
    };
    format!(
        "Probe #{} ({}, at the {}): delivered {} of {}{}, 99 % {}",
        p.id,
        p.kind,
        probe_place(p),
        p.delivered,
        p.expected,
        share,
        p.time_to_99pct_us
            .map(|t| format!("by {}", fmt_us(t)))
            .unwrap_or_else(|| "never reached".into())
    )
}

/// Per probe: a histogram and a CDF of arrival times over the fleet.
pub(super) fn probes(o: &mut String, s: &Summary) {
    open(o, "probes", "Propagation probes");
    if s.probes.is_empty() {
        note(
            o,
            "No propagation probe in this run (Consul fleets probe every --probe-every).",
        );
        close(o);
        return;
    }
    probe_table(o, s);
    if s.probes.iter().any(|p| p.written_us.is_some()) {
        note(
            o,
            "written: T0 until the server answered the write (its leader's raft commit and \
             apply); first: T0 until the first agent received the change. From the answer to \
             the first delivery is the server's publishing; from there to the p99, the fan-out.",
        );
    }
    for line in crate::late::late_lines(&s.probes) {
        note(o, &line);
    }
    if s.probes.len() > 1 {
        figure(
            o,
            probe_overview(s),
            "Each probe's percentiles over the fleet, at the time of its change (its p99 alone \
             when the probes were timed at the agents and behind them, or were of two kinds).",
        );
    }
    let mut drawn: Vec<&ProbeSummary> = s.probes.iter().collect();
    if drawn.len() > MAX_DRAWN {
        drawn.sort_by_key(|p| std::cmp::Reverse(p.latency_us.max));
        drawn.truncate(SLOWEST_DRAWN);
        drawn.sort_by_key(|p| p.id);
        note(
            o,
            &format!(
                "{} probes: the {SLOWEST_DRAWN} with the latest arrival are drawn below; every probe is in the table.",
                s.probes.len()
            ),
        );
    }
    for p in drawn {
        probe_charts(o, p);
    }
    close(o);
}

/// Where a probe entry was timed: the agents, or the fleet named (the
/// proxies behind the agents, dataplane sidecars).
fn probe_place(p: &ProbeSummary) -> &str {
    p.fleet.as_deref().unwrap_or("agents")
}

/// One row per probe: when, how many got it, its percentiles, its note.
fn probe_table(o: &mut String, s: &Summary) {
    let rows: Vec<Vec<String>> = s
        .probes
        .iter()
        .map(|p| {
            let l = &p.latency_us;
            vec![
                p.id.to_string(),
                esc(&p.kind),
                esc(probe_place(p)),
                esc(&p.t0),
                format!("{}/{}", p.delivered, p.expected),
                p.written_us.map(fmt_us).unwrap_or_else(|| "-".into()),
                p.first_us().map(fmt_us).unwrap_or_else(|| "-".into()),
                fmt_us(l.p50),
                fmt_us(l.p90),
                fmt_us(l.p99),
                fmt_us(l.max),
                p.time_to_99pct_us
                    .map(fmt_us)
                    .unwrap_or_else(|| "never".into()),
                esc(p.note.as_deref().unwrap_or("")),
            ]
        })
        .collect();
    table(
        o,
        &[
            "#",
            "kind",
            "at",
            "T0",
            ">delivered",
            ">written",
            ">first",
            ">p50",
            ">p90",
            ">p99",
            ">max",
            ">99 % at",
            "note",
        ],
        &rows,
    );
}

/// One probe's heading, its arrivals by time and the share of the fleet
/// that has the change.
fn probe_charts(o: &mut String, p: &ProbeSummary) {
    let _ = writeln!(
        o,
        "<h3 class=\"probe\" data-probe=\"{}\">{}</h3>",
        p.id,
        esc(&probe_heading(p))
    );
    let Ok(h) = p.latency_us.histogram() else {
        note(
            o,
            "No arrival was recorded (or the summary carries no histogram for it).",
        );
        return;
    };
    let zero = if p.is_observer() {
        "after this process's first arrival"
    } else {
        "after T0 (the change was written)"
    };
    figure(
        o,
        arrival_histogram(
            &format!("Probe #{}: arrivals by time", p.id),
            &h,
            &p.latency_us,
            &format!("arrival time {zero}, log scale"),
        ),
        &format!(
            "Agents by arrival time (log-spaced bins); {} arrivals, p50/p90/p99/max marked.",
            p.delivered
        ),
    );
    figure(
        o,
        arrival_cdf(
            &format!("Probe #{}: share of the fleet that has the change", p.id),
            &h,
            &p.latency_us,
            p.expected,
            &format!("time {zero}, log scale"),
        ),
        &format!(
            "Cumulative share of the {} expected agents; it ends at {} of {} delivered.",
            p.expected, p.delivered, p.expected
        ),
    );
    if let Some(n) = &p.note {
        note(o, n);
    }
}

/// p50/p90/p99/max of every probe at its T0 (run time, or probe number
/// when T0 does not parse).
fn probe_overview(s: &Summary) -> Option<Chart> {
    let xs: Vec<Option<f64>> = s
        .probes
        .iter()
        .map(|p| offset_s(&s.started_at, &p.t0))
        .collect();
    let by_time = xs.iter().all(Option::is_some);
    let x_of = |i: usize| {
        if by_time {
            xs[i].unwrap_or(0.0)
        } else {
            s.probes[i].id as f64
        }
    };
    // One line per place the probes were timed at and per kind of change
    // (intentions apart from the catalog's), so no line joins the agents'
    // arrivals to the proxies' or one kind's to the other's.
    let group = |p: &ProbeSummary| (probe_place(p).to_owned(), p.kind == "intentions");
    let mut groups: Vec<(String, bool)> = s.probes.iter().map(group).collect();
    groups.sort();
    groups.dedup();
    let kinds_differ = groups.iter().any(|g| g.1) && groups.iter().any(|g| !g.1);
    let line = |name: String, g: &(String, bool), f: fn(&LatencySummary) -> u64| Series {
        name,
        points: s
            .probes
            .iter()
            .enumerate()
            .filter(|(_, p)| p.latency_us.count > 0 && group(p) == *g)
            .map(|(i, p)| (x_of(i), f(&p.latency_us) as f64))
            .collect(),
        steps: false,
    };
    let series = match groups.as_slice() {
        [only] => vec![
            line("p50".into(), only, |l| l.p50),
            line("p90".into(), only, |l| l.p90),
            line("p99".into(), only, |l| l.p99),
            line("max".into(), only, |l| l.max),
        ],
        // Several: the p99 of each (one legend row holds four).
        _ => groups
            .iter()
            .map(|g| {
                let name = match (kinds_differ, g.1) {
                    (true, true) => format!("p99 intentions, {}", g.0),
                    (true, false) => format!("p99 catalog, {}", g.0),
                    (false, _) => format!("p99, {}", g.0),
                };
                line(name, g, |l| l.p99)
            })
            .collect(),
    };
    let lo = s
        .probes
        .iter()
        .filter(|p| p.latency_us.count > 0)
        .map(|p| p.latency_us.p50)
        .min()? as f64;
    let hi = s.probes.iter().map(|p| p.latency_us.max).max()? as f64;
    let x = if by_time {
        charts::run_time_axis(s.duration_s.max(x_of(s.probes.len() - 1)))
    } else {
        Axis {
            scale: Scale::Linear {
                min: 0.0,
                max: s.probes.iter().map(|p| p.id).max().unwrap_or(1) as f64 + 1.0,
            },
            unit: Unit::Count,
            title: "probe".into(),
        }
    };
    Some(Chart {
        title: "Propagation of every probe".into(),
        x,
        y: Axis {
            scale: Scale::log_covering(lo, hi),
            unit: Unit::Micros,
            title: "arrival time".into(),
        },
        series,
        bars: Vec::new(),
        marks: Vec::new(),
        reference: None,
    })
}

/// Sessions held over the run, with the requested fleet and disruptions.
pub(super) fn sessions(o: &mut String, s: &Summary) {
    open(o, "sessions", "Sessions over time");
    if s.timeline.is_empty() {
        no_timeline(o);
    } else {
        let series = vec![Series {
            name: "connected".into(),
            points: s
                .timeline
                .iter()
                .map(|t| (t.t_s, t.connected as f64))
                .collect(),
            steps: false,
        }];
        let mut chart = over_time(
            "Sessions held",
            s.duration_s,
            Unit::Count,
            "sessions",
            series,
        );
        if let Some(c) = chart.as_mut() {
            let top = (s.agents.requested.max(s.agents.peak_connected) as f64).max(1.0);
            c.y.scale = Scale::linear_from_zero(top);
            c.reference = Some((
                s.agents.requested as f64,
                format!("{} requested", s.agents.requested),
            ));
            c.marks = disruption_marks(s);
        }
        figure(
            o,
            chart,
            "Sessions held at each sample; the dashed line is the fleet requested; marks are \
             disruptions. The last sample comes after shutdown has closed the sessions.",
        );
    }
    kv(
        o,
        &[
            ("peak connected", s.agents.peak_connected.to_string()),
            ("sessions lost, by cause", by_cause(&s.sessions_lost)),
        ],
    );
    close(o);
}

/// Sessions per server when the run had several: held over time (a
/// failover's surge on the survivors, the return and the rebalance), and
/// each server's figures.
pub(super) fn by_server(o: &mut String, s: &Summary) {
    if s.by_server.is_empty() {
        return;
    }
    open(o, "servers", "Sessions per server");
    let series = s
        .by_server
        .iter()
        .enumerate()
        .map(|(i, srv)| Series {
            name: srv.target.clone(),
            points: s
                .timeline
                .iter()
                .filter(|t| !t.held_by_server.is_empty())
                .map(|t| (t.t_s, t.held_by_server.get(i).copied().unwrap_or(0) as f64))
                .collect(),
            steps: false,
        })
        .collect();
    let mut chart = over_time(
        "Sessions held per server",
        s.duration_s,
        Unit::Count,
        "sessions",
        series,
    );
    if let Some(c) = chart.as_mut() {
        c.marks = disruption_marks(s);
    }
    figure(
        o,
        chart,
        "Sessions held on each server at each sample; marks are disruptions. A server that \
         goes down sends its agents to the others; after it returns, rebalances bring its \
         share back.",
    );
    let secs = |v: Option<f64>| v.map_or("–".to_string(), |x| format!("{x:.1} s"));
    let rows: Vec<Vec<String>> = s
        .by_server
        .iter()
        .map(|srv| {
            vec![
                srv.target.clone(),
                srv.held_at_end.to_string(),
                srv.peak_held.to_string(),
                srv.connects.to_string(),
                format!("{:.1}", srv.peak_connects_per_s),
                secs(srv.down_at_s),
                secs(srv.back_at_s),
                secs(srv.even_after_s),
            ]
        })
        .collect();
    table(
        o,
        &[
            "server",
            "held at the end",
            "peak held",
            "sessions established",
            "peak new sessions /s",
            "down at",
            "back at",
            "even again after",
        ],
        &rows,
    );
    close(o);
}

/// Counters whose rate means something (those the run put in
/// `rates_per_s`), per second over time.
pub(super) fn rates(o: &mut String, s: &Summary) {
    open(o, "rates", "Rates over time");
    let names: Vec<&String> = s.rates_per_s.keys().collect();
    if names.is_empty() {
        note(o, "No rate was recorded.");
        close(o);
        return;
    }
    if s.timeline.is_empty() {
        no_timeline(o);
    } else {
        let (bytes, events): (Vec<&String>, Vec<&String>) =
            names.iter().copied().partition(|n| n.starts_with("bytes"));
        for (group, unit, y_title) in [
            (events, Unit::Count, "per second"),
            (bytes, Unit::Bytes, "bytes per second"),
        ] {
            for (n, chunk) in group.chunks(super::svg::STYLES.len()).enumerate() {
                let series = chunk
                    .iter()
                    .map(|name| Series {
                        name: (*name).clone(),
                        points: rate_points(&s.timeline, |t| {
                            t.counters.get(*name).copied().unwrap_or(0) as f64
                        }),
                        steps: false,
                    })
                    .collect();
                figure(
                    o,
                    over_time(
                        &format!("Rates{}", if n > 0 { " (continued)" } else { "" }),
                        s.duration_s,
                        unit,
                        y_title,
                        series,
                    ),
                    "Per second between samples.",
                );
            }
        }
    }
    let rows: Vec<Vec<String>> = names
        .iter()
        .map(|n| {
            vec![
                esc(n),
                s.counters.get(*n).copied().unwrap_or(0).to_string(),
                format!("{:.1}/s", s.rates_per_s[*n]),
            ]
        })
        .collect();
    table(o, &["counter", ">total", ">average over the run"], &rows);
    close(o);
}

/// Whole-run percentiles, and per interval where windows exist.
pub(super) fn latency(o: &mut String, s: &Summary, windows: &[LatencyWindow]) {
    open(o, "latency", "Latency");
    let rows: Vec<Vec<String>> = s
        .latency_us
        .iter()
        .filter(|(_, l)| l.count > 0)
        .map(|(n, l)| {
            vec![
                esc(n),
                l.count.to_string(),
                fmt_us(l.p50),
                fmt_us(l.p90),
                fmt_us(l.p99),
                fmt_us(l.p999),
                fmt_us(l.max),
            ]
        })
        .collect();
    if rows.is_empty() {
        note(o, "No latency was recorded.");
    } else {
        table(
            o,
            &[
                "latency", ">count", ">p50", ">p90", ">p99", ">p99.9", ">max",
            ],
            &rows,
        );
    }
    let mut by_name: BTreeMap<&str, Vec<&LatencyWindow>> = BTreeMap::new();
    for w in windows {
        by_name.entry(&w.name).or_default().push(w);
    }
    if by_name.is_empty() && !rows.is_empty() {
        note(
            o,
            "Percentiles over time come from interval logs: run with --hlog PATH and pass the file to `agent-sim report html` (a run's own --report-html has them).",
        );
    }
    for (name, ws) in by_name {
        let _ = writeln!(o, "<h3>{}</h3>", esc(name));
        figure(
            o,
            charts::latency_over_time(name, s.duration_s, &ws),
            &format!("{name}: p50, p90, p99 and max of each interval (log scale)."),
        );
    }
    close(o);
}

/// The simulator's own CPU and memory.
pub(super) fn process(o: &mut String, s: &Summary) {
    open(o, "process", "The simulator process");
    kv(
        o,
        &[
            ("peak RSS", fmt_mib(s.process.peak_rss_bytes)),
            (
                "CPU",
                format!(
                    "{:.2}s user, {:.2}s system",
                    s.process.cpu_user_s, s.process.cpu_sys_s
                ),
            ),
        ],
    );
    if s.timeline.is_empty() {
        no_timeline(o);
    } else {
        let mut prev = 0.0;
        let cpu = Series {
            name: "CPU".into(),
            points: rate_points(&s.timeline, |t| {
                let used = (t.cpu_s - prev).max(0.0);
                prev = t.cpu_s;
                used
            }),
            steps: false,
        };
        figure(
            o,
            over_time("CPU", s.duration_s, Unit::Cores, "cores busy", vec![cpu]),
            "CPU time (user + system) per second of run time: 1 = one core busy.",
        );
        let rss = Series {
            name: "RSS".into(),
            points: s
                .timeline
                .iter()
                .map(|t| (t.t_s, t.rss_bytes as f64))
                .collect(),
            steps: false,
        };
        figure(
            o,
            over_time(
                "Resident memory",
                s.duration_s,
                Unit::Bytes,
                "RSS",
                vec![rss],
            ),
            "Resident set size at each sample.",
        );
    }
    close(o);
}

fn json_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(a) => a.iter().map(json_text).collect::<Vec<_>>().join(", "),
        serde_json::Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// The settings the run used.
pub(super) fn config(o: &mut String, s: &Summary) {
    open(o, "config", "Configuration");
    let Some(c) = &s.config else {
        note(o, "This summary does not record its configuration.");
        close(o);
        return;
    };
    note(
        o,
        "The run's effective settings (defaults, --config file, environment and flags), in the config file's keys; secrets are redacted.",
    );
    let rows: Vec<Vec<String>> = c
        .iter()
        .filter(|(k, _)| k.as_str() != "fleet")
        .map(|(k, v)| vec![esc(k), esc(&json_text(v))])
        .collect();
    table(o, &["setting", "value"], &rows);
    if let Some(serde_json::Value::Array(fleets)) = c.get("fleet") {
        for (i, f) in fleets.iter().enumerate() {
            let Some(f) = f.as_object() else { continue };
            let _ = writeln!(o, "<h3>[[fleet]] #{}</h3>", i + 1);
            let rows: Vec<Vec<String>> = f
                .iter()
                .map(|(k, v)| vec![esc(k), esc(&json_text(v))])
                .collect();
            table(o, &["setting", "value"], &rows);
        }
    }
    close(o);
}
