//! The final table printed for people, rendered from a [`Summary`].

use std::fmt::Write as _;

use crate::summary::Summary;

/// Formats microseconds with a readable unit (`850µs`, `12.3ms`, `4.20s`).
pub fn fmt_us(us: u64) -> String {
    if us < 1_000 {
        format!("{us}µs")
    } else if us < 1_000_000 {
        format!("{:.1}ms", us as f64 / 1e3)
    } else {
        format!("{:.2}s", us as f64 / 1e6)
    }
}

/// Formats a byte count as MiB with one decimal.
pub fn fmt_mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// Lines of error (or warning) kinds, most frequent first: count, when first
/// seen, the server's words and the hint.
fn kinds(out: &mut String, map: &std::collections::BTreeMap<String, crate::summary::KindEntry>) {
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
            let _ = writeln!(out, "  {:<28} server said: {sample}", "");
        }
        if let Some(hint) = &e.hint {
            let _ = writeln!(out, "  {:<28} check: {hint}", "");
        }
    }
}

/// Renders the summary as a plain-text table.
pub fn render(s: &Summary) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "agent-sim {} run: {} agent(s) over {:.1}s against {}{}",
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
            .map(|sh| format!(" (shard {sh})"))
            .unwrap_or_default()
    );
    let _ = writeln!(
        out,
        "agents     connected {}/{}  peak {}  never connected {}  lost and not back {}{}",
        s.agents.connected,
        s.agents.requested,
        s.agents.peak_connected,
        s.agents.never_connected,
        s.agents.lost_not_back,
        if s.agents.left > 0 {
            format!("  left (ramp-down) {}", s.agents.left)
        } else {
            String::new()
        }
    );
    if !s.counters.is_empty() {
        let _ = writeln!(out, "counters");
        for (k, v) in &s.counters {
            let _ = writeln!(out, "  {k:<28} {v:>12}");
        }
    }
    if !s.rates_per_s.is_empty() {
        let _ = writeln!(out, "rates");
        for (k, v) in &s.rates_per_s {
            let _ = writeln!(out, "  {:<28} {:>12.1}/s", k, v);
        }
    }
    let _ = writeln!(out, "errors     {} total", s.errors_total());
    kinds(&mut out, &s.errors);
    if !s.warnings.is_empty() {
        let total: u64 = s.warnings.values().map(|w| w.count).sum();
        let _ = writeln!(out, "warnings   {total} total");
        kinds(&mut out, &s.warnings);
    }
    let rows: Vec<_> = s.latency_us.iter().filter(|(_, l)| l.count > 0).collect();
    if !rows.is_empty() {
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
    if !s.probes.is_empty() {
        let _ = writeln!(
            out,
            "probes     {:<10} {:>11} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "kind", "delivered", "p50", "p90", "p95", "p99", "p99.9", "max", "99% at"
        );
        for p in &s.probes {
            let l = &p.latency_us;
            let _ = writeln!(
                out,
                "  #{:<3} {:<12} {:>11} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
                p.id,
                p.kind,
                format!("{}/{}", p.delivered, p.expected),
                fmt_us(l.p50),
                fmt_us(l.p90),
                fmt_us(l.p95),
                fmt_us(l.p99),
                fmt_us(l.p999),
                fmt_us(l.max),
                p.time_to_99pct_us
                    .map(fmt_us)
                    .unwrap_or_else(|| "never".into())
            );
        }
    }
    crate::disruption::render(&mut out, &s.disruptions);
    let _ = writeln!(
        out,
        "process    peak RSS {}  cpu user {:.2}s sys {:.2}s",
        fmt_mib(s.process.peak_rss_bytes),
        s.process.cpu_user_s,
        s.process.cpu_sys_s
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_are_readable() {
        assert_eq!(fmt_us(850), "850µs");
        assert_eq!(fmt_us(12_340), "12.3ms");
        assert_eq!(fmt_us(4_200_000), "4.20s");
    }

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
            },
        );
        let mut h = crate::new_latency_histogram();
        h.record(1500).unwrap();
        s.latency_us
            .insert("connect".into(), crate::LatencySummary::from_histogram(&h));
        let t = render(&s);
        assert!(t.contains("connected 9/10"), "{t}");
        assert!(t.contains("connect_refused"), "{t}");
        assert!(t.contains("first at 1.2s"), "{t}");
        assert!(t.contains("server said: dial: connection refused"), "{t}");
        assert!(t.contains("check: is the server listening?"), "{t}");
        assert!(t.contains("1.5ms"), "{t}");
    }
}
