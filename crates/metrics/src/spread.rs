//! Where a run's sessions were, per server, when it had several: each
//! server's sessions held over the timeline, the surge of new sessions it
//! took (a failover sends the lost server's agents to the others), when it
//! went down and came back, and how long until the spread was even again
//! (every server within 10 % of an even share) after its return.
//!
//! Computed from the timeline's per-server samples (`held_by_server`,
//! `connects_by_server`) and the counts at the end; nothing here knows a
//! protocol or how agents choose their servers.

use crate::summary::{ServerSpread, TimelineSample};

/// How far from an even share (held / servers) a server may be for the
/// spread to count as even.
pub const EVEN_WITHIN: f64 = 0.10;

/// Sessions per server at one moment: held, and established so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerLevels {
    /// Sessions held now, per server.
    pub held: Vec<u64>,
    /// Sessions established so far, per server.
    pub connects: Vec<u64>,
}

/// Whether every server holds within [`EVEN_WITHIN`] of an even share of
/// the sessions held (at least one session each).
pub fn even(held: &[u64]) -> bool {
    let total: u64 = held.iter().sum();
    if held.len() < 2 || total == 0 {
        return false;
    }
    let share = total as f64 / held.len() as f64;
    held.iter()
        .all(|h| (*h as f64 - share).abs() <= share * EVEN_WITHIN + 1e-9)
}

/// The per-server view of a run whose servers are named `targets`, from
/// its timeline and the counts at the end.
pub fn spread(
    targets: &[String],
    timeline: &[TimelineSample],
    end: &ServerLevels,
) -> Vec<ServerSpread> {
    if targets.len() < 2 {
        return Vec::new();
    }
    targets
        .iter()
        .enumerate()
        .map(|(i, target)| {
            let at = |s: &TimelineSample| s.held_by_server.get(i).copied().unwrap_or(0);
            let peak_held = timeline.iter().map(at).max().unwrap_or(0);
            let mut peak_rate = 0.0f64;
            for w in timeline.windows(2) {
                let dt = w[1].t_s - w[0].t_s;
                let n = w[1].connects_by_server.get(i).copied().unwrap_or(0);
                if dt > 0.0 {
                    peak_rate = peak_rate.max(n as f64 / dt);
                }
            }
            let (down_at_s, back_at_s) = down_and_back(timeline, at);
            let even_after_s = back_at_s.and_then(|back| {
                timeline
                    .iter()
                    .find(|s| s.t_s >= back && even(&s.held_by_server))
                    .map(|s| s.t_s - back)
            });
            ServerSpread {
                target: target.clone(),
                held_at_end: end.held.get(i).copied().unwrap_or(0),
                peak_held,
                connects: end.connects.get(i).copied().unwrap_or(0),
                peak_connects_per_s: peak_rate,
                down_at_s,
                back_at_s,
                even_after_s,
            }
        })
        .collect()
}

/// The table's lines: one per server, sessions held at the end and at the
/// peak, new sessions (and the highest rate of them), and when it went down,
/// came back and the spread was even again.
pub fn render(out: &mut String, servers: &[ServerSpread]) {
    use std::fmt::Write as _;
    if servers.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "servers    {:<28} {:>8} {:>8} {:>9} {:>11}  failover",
        "", "held", "peak", "connects", "surge /s"
    );
    for s in servers {
        let mut events = Vec::new();
        if let Some(d) = s.down_at_s {
            events.push(format!("down at {d:.1}s"));
        }
        if let Some(b) = s.back_at_s {
            events.push(format!("back at {b:.1}s"));
            events.push(match s.even_after_s {
                Some(e) => format!("even again {e:.1}s later"),
                None => "not even again within the run".into(),
            });
        }
        let _ = writeln!(
            out,
            "           {:<28} {:>8} {:>8} {:>9} {:>11.1}  {}",
            s.target,
            s.held_at_end,
            s.peak_held,
            s.connects,
            s.peak_connects_per_s,
            if events.is_empty() {
                "-".into()
            } else {
                events.join(", ")
            }
        );
    }
}

/// When a server first went from holding sessions to none while the others
/// held some (every server empty is the run's own end), and when it held
/// some again after that.
fn down_and_back(
    timeline: &[TimelineSample],
    at: impl Fn(&TimelineSample) -> u64,
) -> (Option<f64>, Option<f64>) {
    let mut held_before = false;
    let mut down = None;
    for s in timeline {
        let h = at(s);
        let others = s.held_by_server.iter().sum::<u64>() > h;
        match down {
            None if h > 0 => held_before = true,
            None if held_before && others => down = Some(s.t_s),
            Some(d) if h > 0 => return (Some(d), Some(s.t_s)),
            _ => {}
        }
    }
    (down, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t_s: f64, held: &[u64], connects: &[u64]) -> TimelineSample {
        TimelineSample {
            t_s,
            held_by_server: held.to_vec(),
            connects_by_server: connects.to_vec(),
            ..TimelineSample::default()
        }
    }

    #[test]
    fn evenness_is_within_a_tenth_of_the_share() {
        assert!(even(&[100, 100, 100]));
        assert!(even(&[95, 105, 100]));
        assert!(!even(&[80, 110, 110]));
        assert!(!even(&[0, 0]));
        assert!(!even(&[300]));
    }

    #[test]
    fn a_failover_and_the_return_are_found_in_the_timeline() {
        let targets = vec!["a".to_string(), "b".into(), "c".into()];
        let timeline = vec![
            sample(0.0, &[0, 0, 0], &[]),
            sample(1.0, &[100, 100, 100], &[100, 100, 100]),
            // c goes down at 2 s: its 100 agents land on a and b.
            sample(2.0, &[150, 150, 0], &[50, 50, 0]),
            sample(3.0, &[150, 150, 0], &[0, 0, 0]),
            // c is back at 4 s; rebalances bring it its share by 6 s.
            sample(4.0, &[140, 140, 20], &[0, 0, 20]),
            sample(5.0, &[120, 120, 60], &[0, 0, 40]),
            sample(6.0, &[100, 105, 95], &[0, 5, 35]),
        ];
        let end = ServerLevels {
            held: vec![100, 105, 95],
            connects: vec![150, 155, 195],
        };
        let s = spread(&targets, &timeline, &end);
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].peak_held, 150);
        assert_eq!(s[0].peak_connects_per_s, 100.0);
        assert_eq!((s[0].down_at_s, s[0].back_at_s), (None, None));
        let c = &s[2];
        assert_eq!((c.down_at_s, c.back_at_s), (Some(2.0), Some(4.0)));
        assert_eq!(c.even_after_s, Some(2.0));
        assert_eq!(c.connects, 195);
        assert!(spread(&targets[..1], &timeline, &end).is_empty());
    }
}
