//! The final table printed for people, rendered from a [`Summary`], in the
//! order and with the judgment of the report page ([`crate::html`]): the
//! headline first, then the figures that matter; a rate only where a rate
//! means something (the counters the run put in `rates_per_s`, not
//! `sessions_established 66.4/s`); every counter with `--verbose`.

use std::fmt::Write as _;

use crate::assert::Verdict;
use crate::summary::{KindEntry, Summary};
use crate::units::{fmt_count, fmt_mib, fmt_us};

/// Lines of error (or warning) kinds, most frequent first: count, when first
/// seen, the sample labelled by `said` (for errors whose words they are:
/// `server said`, `the OS said`; for warnings `details`, their sample often
/// agent-sim's own words, e.g. `probe_overhead_high`), and what to check.
fn kinds(
    out: &mut String,
    map: &std::collections::BTreeMap<String, KindEntry>,
    said: fn(&KindEntry) -> &'static str,
) {
    let mut rows: Vec<_> = map.iter().collect();
    rows.sort_by(|a, b| b.1.count.cmp(&a.1.count).then(a.0.cmp(b.0)));
    for (k, e) in rows {
        let _ = writeln!(
            out,
            "  {k:<28} {:>12}  first at {:.1}s{}",
            e.count,
            e.first_seen_s,
            if e.heals {
                ""
            } else {
                "  (will not heal by itself)"
            }
        );
        if let Some(sample) = &e.sample {
            let _ = writeln!(out, "  {:<28} {}: {sample}", "", said(e));
        }
        if let Some(hint) = &e.hint {
            let _ = writeln!(out, "  {:<28} check: {hint}", "");
        }
    }
}

/// What the table shows besides the summary itself.
#[derive(Debug, Clone, Copy, Default)]
pub struct TableOptions<'a> {
    /// Verdicts of the run's assertions, shown in the headline.
    pub verdicts: &'a [Verdict],
    /// More headline lines, already formatted (the run's ramp line).
    pub notes: &'a [String],
    /// Every counter with its total and average rate (`--verbose`).
    pub verbose: bool,
}

/// Renders the summary as a plain-text table (no verdicts, not verbose).
pub fn render(s: &Summary) -> String {
    render_with(s, &TableOptions::default())
}

/// Renders the summary as a plain-text table, in the report page's order:
/// the headline (what ran, the exit code and why, agents, verdicts), the
/// probes, latency, rates where a rate means something, errors and
/// warnings, sessions lost, the process; `--verbose` adds every counter.
pub fn render_with(s: &Summary, opts: &TableOptions<'_>) -> String {
    let mut out = String::new();
    headline(&mut out, s, opts);
    probes(&mut out, s);
    crate::connect::render(&mut out, s);
    crate::disruption::render(&mut out, &s.disruptions);
    crate::spread::render(&mut out, &s.by_server);
    server(&mut out, s);
    if let Some(v) = &s.vault {
        for line in v.table_lines() {
            let _ = writeln!(out, "{line}");
        }
    }
    latency(&mut out, s);
    rates(&mut out, s);
    errors(&mut out, s);
    process(&mut out, s);
    if opts.verbose {
        counters(&mut out, s);
    }
    crate::study::render(&mut out, s);
    if let Some(c) = &s.capacity {
        let _ = writeln!(
            out,
            "\nCapacity (each step judged over its own {:.0} s window)",
            c.hold_s
        );
        out.push_str(&c.table());
    }
    out
}

/// What ran, its result, the agents, the verdicts.
fn headline(out: &mut String, s: &Summary, opts: &TableOptions<'_>) {
    let _ = writeln!(
        out,
        "agent-sim {} run: {} agent(s) over {:.1}s against {}{}{}",
        s.kind,
        s.agents.requested,
        s.duration_s,
        if s.targets.is_empty() {
            "(none)".to_string()
        } else {
            s.targets.join(", ")
        },
        s.shard
            .as_ref()
            .map(|sh| match &s.shard_from {
                Some(from) => format!(" (shard {sh} from {from})"),
                None => format!(" (shard {sh})"),
            })
            .unwrap_or_default(),
        s.consul_modes()
            .map(|m| format!(", {m}"))
            .unwrap_or_default()
    );
    let o = &s.outcome;
    let _ = writeln!(
        out,
        "outcome    {} exit {}: {}",
        if o.exit_code == 0 { "PASS" } else { "FAIL" },
        o.exit_code,
        o.reason.as_deref().unwrap_or(match o.exit_code {
            0 => "the fleet was complete and every assertion held",
            1 => "nothing could run",
            2 => "the fleet was incomplete",
            _ => "an assertion failed",
        })
    );
    let a = &s.agents;
    let _ = writeln!(
        out,
        "agents     connected {}/{}{}  peak {}  never connected {}  lost and not back {}{}",
        a.connected,
        a.requested,
        if o.complete { " (complete)" } else { "" },
        a.peak_connected,
        a.never_connected,
        a.lost_not_back,
        if a.left > 0 {
            format!("  left (ramp-down) {}", a.left)
        } else {
            String::new()
        }
    );
    if !o.missing.is_empty() {
        let _ = writeln!(
            out,
            "           missing at the end: {}",
            crate::units::by_count(&o.missing)
        );
    }
    for n in opts.notes {
        let _ = writeln!(out, "{n}");
    }
    if !opts.verdicts.is_empty() {
        out.push_str(&crate::assert::render_verdicts(opts.verdicts));
    }
}

fn probes(out: &mut String, s: &Summary) {
    if s.probes.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "probes     {:<14} {:>11} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "kind", "delivered", "written", "first", "p50", "p90", "p99", "p99.9", "max", "99% at"
    );
    for p in &s.probes {
        let l = &p.latency_us;
        // Entries timed at another fleet's agents (dataplane sidecars) say
        // so beside the kind.
        let kind = match p.fleet.as_deref() {
            Some("consul-dataplane") => format!("{} xds", p.kind),
            Some(f) => format!("{} {f}", p.kind),
            None => p.kind.clone(),
        };
        let _ = writeln!(
            out,
            "  #{:<3} {:<16} {:>11} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            p.id,
            kind,
            format!("{}/{}", p.delivered, p.expected),
            p.written_us.map(fmt_us).unwrap_or_else(|| "-".into()),
            p.first_us().map(fmt_us).unwrap_or_else(|| "-".into()),
            fmt_us(l.p50),
            fmt_us(l.p90),
            fmt_us(l.p99),
            fmt_us(l.p999),
            fmt_us(l.max),
            p.time_to_99pct_us
                .map(fmt_us)
                .unwrap_or_else(|| "never".into())
        );
    }
    for line in crate::late::late_lines(&s.probes) {
        let _ = writeln!(out, "  {line}");
    }
}

fn latency(out: &mut String, s: &Summary) {
    let rows: Vec<_> = s.latency_us.iter().filter(|(_, l)| l.count > 0).collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "latency    {:<22} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "", "count", "min", "p50", "p90", "p99", "p99.9", "max"
    );
    for (name, l) in rows {
        let _ = writeln!(
            out,
            "  {:<30} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            name,
            l.count,
            fmt_us(l.min),
            fmt_us(l.p50),
            fmt_us(l.p90),
            fmt_us(l.p99),
            fmt_us(l.p999),
            fmt_us(l.max)
        );
    }
}

/// Rates of the counters the run rated (`rates_per_s`) with their totals,
/// then the other non-zero counters as totals only.
fn rates(out: &mut String, s: &Summary) {
    if !s.rates_per_s.is_empty() {
        let _ = writeln!(
            out,
            "rates      {:<22} {:>12} {:>12}",
            "", "total", "average"
        );
        for (k, v) in &s.rates_per_s {
            let total = s
                .counters
                .get(k)
                .map(u64::to_string)
                .unwrap_or_else(|| "-".into());
            let _ = writeln!(out, "  {k:<30} {total:>12} {:>10.1}/s", v);
        }
    }
    let totals: Vec<String> = s
        .counters
        .iter()
        .filter(|(k, v)| **v > 0 && !s.rates_per_s.contains_key(*k))
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    wrapped(out, "totals", &totals);
    if !s.sessions_lost.is_empty() {
        let _ = writeln!(
            out,
            "sessions   lost: {}",
            crate::units::by_count(&s.sessions_lost)
        );
    }
}

/// `label` then items, wrapped at about 100 columns under each other.
fn wrapped(out: &mut String, label: &str, items: &[String]) {
    if items.is_empty() {
        return;
    }
    let mut line = format!("{label:<10}");
    let mut first = true;
    for it in items {
        if !first && line.chars().count() + 2 + it.chars().count() > 100 {
            let _ = writeln!(out, "{line}");
            line = " ".repeat(10);
            first = true;
        }
        line.push_str(if first { " " } else { "  " });
        line.push_str(it);
        first = false;
    }
    let _ = writeln!(out, "{line}");
}

fn errors(out: &mut String, s: &Summary) {
    let _ = writeln!(out, "errors     {} total", s.errors_total());
    kinds(out, &s.errors, |e| e.said_by.said());
    if !s.denied.is_empty() {
        let _ = writeln!(
            out,
            "denied     {} (refused for credentials: not successes)",
            crate::units::by_count(&s.denied)
        );
    }
    if !s.warnings.is_empty() {
        let total: u64 = s.warnings.values().map(|w| w.count).sum();
        let _ = writeln!(out, "warnings   {total} total");
        kinds(out, &s.warnings, |_| "details");
    }
}

fn process(out: &mut String, s: &Summary) {
    let _ = writeln!(
        out,
        "process    peak RSS {}  cpu user {:.2}s sys {:.2}s",
        fmt_mib(s.process.peak_rss_bytes),
        s.process.cpu_user_s,
        s.process.cpu_sys_s
    );
}

/// A number of cores, or `-`.
fn cores(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |c| format!("{c:.2}"))
}

/// A size, or `-`.
fn bytes(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |b| fmt_mib(b.max(0.0) as u64))
}

/// A latency in µs, or `-`.
fn us(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |x| fmt_us(x.max(0.0).round() as u64))
}

/// One line of a server's level (`cpu`, `rss`): at baseline (with its
/// unit), steady and at most, then what each agent cost; none when the
/// level was never read.
fn level(
    out: &mut String,
    (name, unit): (&str, &str),
    l: &crate::server::Level,
    show: fn(Option<f64>) -> String,
    per_agent: Option<String>,
) {
    if l.max.is_some() || l.baseline.is_some() {
        let _ = writeln!(
            out,
            "  {name:<8} baseline {}{unit}, steady {}, max {}{}",
            show(l.baseline),
            show(l.mean),
            show(l.max),
            per_agent.unwrap_or_default()
        );
    }
}

/// Each observed server: CPU and RSS at baseline, at steady state and at
/// their highest, what each agent cost it, and its kept latencies at
/// baseline and under load.
fn server(out: &mut String, s: &Summary) {
    for srv in &s.server {
        let _ = writeln!(
            out,
            "server     {} {} ({}, {} scrape(s), {} failed)",
            srv.kind, srv.target, srv.source, srv.scrapes, srv.failed
        );
        let z = &srv.sizing;
        level(
            out,
            ("cpu", " cores"),
            &z.cpu_cores,
            cores,
            z.cores_per_1000_agents
                .map(|c| format!(": {c:.3} cores per 1,000 agents")),
        );
        level(
            out,
            ("rss", ""),
            &z.rss_bytes,
            bytes,
            z.rss_per_agent_kib
                .map(|k| format!(": {k:.1} KiB per agent")),
        );
        if let Some(ms) = z.cpu_ms_per_connect {
            let _ = writeln!(
                out,
                "  connect  {ms:.1} ms of server CPU per agent connect (over the run, above baseline)"
            );
        }
        if let Some((a, b)) = z.steady_s {
            let _ = writeln!(
                out,
                "  steady   {a:.1}s .. {b:.1}s, {:.0} agent(s) held on average",
                z.agents
            );
        }
        if !srv.latencies.is_empty() {
            let _ = writeln!(
                out,
                "  {:<44} {:>19}  {:>19}",
                "latency", "baseline p50 / p99", "under load p50 / p99"
            );
            for (name, l) in &srv.latencies {
                let _ = writeln!(
                    out,
                    "  {name:<44} {:>19}  {:>19}",
                    format!("{} / {}", us(l.baseline_p50), us(l.baseline_p99)),
                    format!("{} / {}", us(l.p50), us(l.p99)),
                );
            }
        }
        let steady: Vec<&crate::server::ServerSample> =
            srv.samples.iter().filter(|x| x.steady).collect();
        let mut sums: std::collections::BTreeMap<&str, (f64, u32)> = Default::default();
        for x in &steady {
            for (k, v) in &x.values {
                let e = sums.entry(k.as_str()).or_default();
                e.0 += v;
                e.1 += 1;
            }
        }
        let items: Vec<String> = sums
            .iter()
            .map(|(k, (sum, n))| (k, sum / f64::from(*n)))
            .filter(|(_, mean)| *mean != 0.0)
            .map(|(k, mean)| format!("{k} {}", (mean * 100.0).round() / 100.0))
            .collect();
        wrapped(out, "  series", &items);
        for n in &srv.notes {
            let _ = writeln!(out, "  note     {n}");
        }
        if let Some(g) = &srv.gossip {
            gossip(out, g);
        }
        for line in srv.storm.iter().flat_map(|st| st.table_lines()) {
            let _ = writeln!(out, "{line}");
        }
    }
}

/// The server's view of the run's gossip members in one line: by status at
/// the poll with the most alive, the members and nodes ever failed or
/// critical, and what it listed at the end.
fn gossip(out: &mut String, g: &crate::server::GossipSummary) {
    let n = fmt_count;
    let peak = g.peak().copied().unwrap_or_default();
    let when = |first: Option<f64>, last: Option<f64>| match (first, last) {
        (Some(a), Some(b)) if b > a => format!(" (first at {a:.1}s, last at {b:.1}s)"),
        (Some(a), _) => format!(" (at {a:.1}s)"),
        _ => String::new(),
    };
    let turns = if g.failed_turns > g.failed_ever {
        format!(", {} turns to failed", n(g.failed_turns))
    } else {
        String::new()
    };
    let end = g.at_end().copied().unwrap_or_default();
    let after: Vec<String> = [
        (end.left, "left"),
        (end.alive, "alive"),
        (end.leaving, "leaving"),
        (end.failed, "failed"),
    ]
    .iter()
    .filter(|(c, _)| *c > 0)
    .map(|(c, what)| format!("{} {what}", n(*c)))
    .collect();
    let _ = writeln!(
        out,
        "gossip     server sees {} alive, {} leaving, {} failed, {} left at peak; {} ever failed{}{turns}; \
         {} serfHealth ever critical{}; after: {}",
        n(peak.alive),
        n(peak.leaving),
        n(peak.failed),
        n(peak.left),
        n(g.failed_ever),
        when(g.first_failed_s, g.last_failed_s),
        n(g.critical_ever),
        when(g.first_critical_s, g.last_critical_s),
        if after.is_empty() {
            "none listed".to_string()
        } else {
            after.join(", ")
        }
    );
    let mut notes = Vec::new();
    if g.stale > 0 {
        notes.push(format!(
            "{} member(s) of {} were listed before the run, not alive (an earlier run's): \
             counted once their status changed",
            n(g.stale),
            g.prefixes.join(", ")
        ));
    }
    if g.failed_polls > 0 {
        notes.push(format!(
            "{} of {} member polls failed (warning observe_failed)",
            n(g.failed_polls),
            n(g.polls + g.failed_polls)
        ));
    }
    for note in notes {
        let _ = writeln!(out, "           {note}");
    }
}

/// Every counter with its total and its average over the run (`--verbose`).
fn counters(out: &mut String, s: &Summary) {
    if s.counters.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "counters   {:<22} {:>12} {:>12}",
        "", "total", "average"
    );
    for (k, v) in &s.counters {
        let _ = writeln!(
            out,
            "  {k:<30} {v:>12} {:>10.1}/s",
            *v as f64 / s.duration_s.max(1e-9)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_shows_agents_errors_and_latency() {
        let mut s = Summary {
            kind: "sensu".into(),
            targets: vec!["ws://127.0.0.1:8081/".into()],
            ..Default::default()
        };
        s.agents.requested = 10;
        s.agents.connected = 9;
        s.errors.insert(
            "connect_refused".into(),
            crate::summary::KindEntry {
                count: 2,
                first_seen_s: 1.25,
                sample: Some("dial: connection refused".into()),
                hint: Some("is the server listening?".into()),
                heals: true,
                said_by: crate::Speaker::Os,
            },
        );
        s.errors.insert(
            "upgrade_401".into(),
            crate::summary::KindEntry {
                count: 1,
                sample: Some("wrong password".into()),
                ..Default::default()
            },
        );
        let mut h = crate::new_latency_histogram();
        h.record(1500).unwrap();
        s.latency_us
            .insert("connect".into(), crate::LatencySummary::from_histogram(&h));
        let t = render(&s);
        assert!(t.contains("server said: wrong password"), "{t}");
        assert!(!t.contains("server said: dial"), "the OS's words: {t}");
        assert!(t.contains("connected 9/10"), "{t}");
        assert!(t.contains("connect_refused"), "{t}");
        assert!(t.contains("first at 1.2s"), "{t}");
        assert!(t.contains("the OS said: dial: connection refused"), "{t}");
        assert!(t.contains("check: is the server listening?"), "{t}");
        assert!(t.contains("1.5ms"), "{t}");
    }

    #[test]
    fn the_headline_names_the_shard_and_where_its_index_came_from() {
        let mut s = Summary {
            kind: "sensu".into(),
            shard: Some("1/3".into()),
            ..Default::default()
        };
        assert!(render(&s).lines().next().unwrap().ends_with("(shard 1/3)"));
        s.shard_from = Some("AGENT_SIM_SHARD_SLOT=2 (Docker Swarm task slot)".into());
        let first = render(&s).lines().next().unwrap().to_string();
        assert!(
            first.ends_with("(shard 1/3 from AGENT_SIM_SHARD_SLOT=2 (Docker Swarm task slot))"),
            "{first}"
        );
    }

    #[test]
    fn headline_first_rates_only_where_rated_every_counter_when_verbose() {
        let mut s = Summary {
            kind: "sensu".into(),
            duration_s: 10.0,
            ..Default::default()
        };
        s.agents.requested = 10;
        s.agents.connected = 10;
        s.outcome.complete = true;
        s.counters.insert("keepalives_sent".into(), 500);
        s.counters.insert("sessions_established".into(), 10);
        s.counters.insert("check_requests_dropped".into(), 0);
        s.rates_per_s.insert("keepalives_sent".into(), 50.0);
        s.sessions_lost.insert("pong_timeout".into(), 2);
        let verdicts =
            crate::assert::evaluate(&["agents.connected == requested".parse().unwrap()], &s);
        let notes = ["ramp       10 agent(s) started in 0.10s".to_string()];
        let t = render_with(
            &s,
            &TableOptions {
                verdicts: &verdicts,
                notes: &notes,
                verbose: false,
            },
        );
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[1].starts_with("outcome    PASS exit 0"), "{t}");
        assert!(lines[2].contains("connected 10/10 (complete)"), "{t}");
        assert_eq!(lines[3], notes[0]);
        assert!(t.contains("SLO: 1 of 1 assertions passed"), "{t}");
        assert!(t.contains("50.0/s"), "{t}");
        assert!(
            !t.contains("sessions_established   "),
            "no rate for it: {t}"
        );
        assert!(t.contains("totals     sessions_established 10\n"), "{t}");
        assert!(t.contains("sessions   lost: pong_timeout 2"), "{t}");
        assert!(!t.contains("check_requests_dropped"), "{t}");
        let v = render_with(
            &s,
            &TableOptions {
                verbose: true,
                ..Default::default()
            },
        );
        assert!(v.contains("check_requests_dropped"), "{v}");
        assert!(
            v.contains("1.0/s"),
            "sessions_established averaged when asked: {v}"
        );
        assert!(v.find("outcome").unwrap() < v.find("counters").unwrap());
    }

    #[test]
    fn a_servers_storm_figures_are_a_few_lines_when_present() {
        use crate::server::ServerSummary;
        use crate::storm::{Count, Peak, StormSummary};
        let table = |storm: Option<StormSummary>| {
            render(&Summary {
                server: vec![ServerSummary {
                    kind: "consul".into(),
                    storm,
                    ..ServerSummary::default()
                }],
                ..Summary::default()
            })
        };
        let storm = StormSummary {
            total: [
                (Count::GossipBytesIn, 345_088.0),
                (Count::AliveMsgs, 1200.0),
                (Count::MemberFailed, 3.0),
                (Count::HandlerDrops, 0.0),
            ]
            .into(),
            peak_per_s: [(
                Count::AliveMsgs,
                Peak {
                    value: 240.0,
                    at_s: 3.0,
                },
            )]
            .into(),
            ..StormSummary::default()
        };
        let t = table(Some(storm));
        assert!(
            t.contains(
                "storm      gossip       337.0 KiB in\n\
                 storm      messages     1,200 alive (peak 240/s at 3.0s); \
                 0 dropped (handler queue full)\n\
                 storm      members      3 failed\n"
            ),
            "{t}"
        );
        assert!(!table(None).contains("storm"), "{}", table(None));
    }

    #[test]
    fn the_servers_view_of_the_gossip_members_is_one_line() {
        use crate::server::{GossipSample, GossipSummary, ServerSummary};
        let at = GossipSample::at;
        let mut g = GossipSummary {
            prefixes: vec!["agent-sim".into()],
            polls: 4,
            samples: vec![
                at(5.0, 1000, 0, 0),
                at(10.0, 1000, 0, 0),
                at(15.0, 0, 1000, 0),
            ],
            ..GossipSummary::default()
        };
        let table = |g: &GossipSummary| {
            render(&Summary {
                server: vec![ServerSummary {
                    gossip: Some(g.clone()),
                    ..ServerSummary::default()
                }],
                ..Summary::default()
            })
        };
        let t = table(&g);
        assert!(
            t.contains(
                "gossip     server sees 1,000 alive, 0 leaving, 0 failed, 0 left at peak; \
                 0 ever failed; 0 serfHealth ever critical; after: 1,000 left\n"
            ),
            "{t}"
        );
        g.samples = vec![
            at(5.0, 1000, 0, 0),
            at(10.0, 990, 0, 10),
            at(15.0, 995, 0, 5),
        ];
        (g.failed_ever, g.failed_turns, g.critical_ever) = (12, 15, 10);
        (g.first_failed_s, g.last_failed_s) = (Some(10.0), Some(15.0));
        g.first_critical_s = Some(10.0);
        (g.stale, g.failed_polls) = (40, 1);
        let t = table(&g);
        assert!(
            t.contains(
                "12 ever failed (first at 10.0s, last at 15.0s), 15 turns to failed; \
                 10 serfHealth ever critical (at 10.0s); after: 995 alive, 5 failed\n"
            ),
            "{t}"
        );
        assert!(
            t.contains("40 member(s) of agent-sim were listed before the run"),
            "{t}"
        );
        assert!(t.contains("1 of 5 member polls failed"), "{t}");
    }
}
