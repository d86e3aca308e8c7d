//! The run's Connect certificates in the summary (`connect`), the final
//! table and the page: how long until every proxy held a certificate
//! (boot), what signing cost (latency, rate-limited answers), and a CA
//! rotation's time until every agent held a certificate of the new root.
//! The figures are filled by the run from its counters and latencies; this
//! module shows them in the table (the page's section is `html::connect`).

use std::fmt::Write as _;

use crate::summary::{ConnectSummary, RotationSummary, Summary};

fn seconds(s: Option<f64>) -> String {
    s.map_or_else(|| "not reached".to_string(), |v| format!("{v:.1}s"))
}

/// The shards' sections as one: counts added, the boot and the rotation
/// the last shard's (`None` when any shard did not get there), the
/// signing percentiles from `merged`'s joined `leaf_sign` latency.
pub fn merge(parts: &[Summary], merged: &Summary) -> Option<ConnectSummary> {
    let all: Vec<&ConnectSummary> = parts.iter().filter_map(|p| p.connect.as_ref()).collect();
    if all.is_empty() {
        return None;
    }
    let sum = |f: fn(&ConnectSummary) -> u64| all.iter().map(|c| f(c)).sum::<u64>();
    let latest = |v: Vec<Option<f64>>| -> Option<f64> {
        v.iter().try_fold(0.0f64, |m, x| x.map(|x| m.max(x)))
    };
    let rotations: Vec<&RotationSummary> = all.iter().filter_map(|c| c.rotation.as_ref()).collect();
    let sign = merged.latency_us.get("leaf_sign");
    Some(ConnectSummary {
        agents: sum(|c| c.agents),
        holding: sum(|c| c.holding),
        boot_s: latest(all.iter().map(|c| c.boot_s).collect()),
        issued: sum(|c| c.issued),
        renewed: sum(|c| c.renewed),
        rate_limited: sum(|c| c.rate_limited),
        sign_p50_ms: sign.map_or(0.0, |l| l.p50 as f64 / 1e3),
        sign_p99_ms: sign.map_or(0.0, |l| l.p99 as f64 / 1e3),
        rotation: rotations.first().map(|first| RotationSummary {
            at_s: first.at_s,
            rotated: rotations.iter().map(|r| r.rotated).sum(),
            all_after_s: latest(rotations.iter().map(|r| r.all_after_s).collect()),
            error: rotations.iter().find_map(|r| r.error.clone()),
        }),
    })
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

    #[test]
    fn shards_add_up_and_the_slowest_boot_counts() {
        let part = |boot: Option<f64>| Summary {
            connect: Some(ConnectSummary {
                agents: 10,
                holding: 10,
                boot_s: boot,
                issued: 10,
                rate_limited: 3,
                ..ConnectSummary::default()
            }),
            ..Summary::default()
        };
        let m = merge(&[part(Some(2.0)), part(Some(5.0))], &Summary::default()).unwrap();
        assert_eq!((m.agents, m.issued, m.rate_limited), (20, 20, 6));
        assert_eq!(m.boot_s, Some(5.0));
        let m = merge(&[part(Some(2.0)), part(None)], &Summary::default()).unwrap();
        assert_eq!(m.boot_s, None);
        assert!(merge(&[Summary::default()], &Summary::default()).is_none());
    }
}
