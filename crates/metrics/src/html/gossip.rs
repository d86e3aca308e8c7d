//! The page's view of the run's gossip members as an observed Consul
//! server saw them: its members by serf status and its nodes with a
//! critical `serfHealth` at every poll, on the sessions' time axis
//! (disruptions and the first failure marked), and the figures in words.

use super::blocks::{disruption_marks, figure, kv, note, run_time};
use super::charts::over_time;
use super::svg::{Mark, Series, Unit};
use crate::server::{GossipSample, GossipSummary, ServerSummary};
use crate::summary::Summary;
use crate::units::fmt_count;

/// The chart and the figures of server `i`'s gossip part, if it has one.
pub(super) fn gossip(o: &mut String, s: &Summary, i: usize, srv: &ServerSummary) {
    let Some(g) = &srv.gossip else {
        return;
    };
    let line = |name: &str, f: fn(&GossipSample) -> u64| Series {
        name: name.to_string(),
        points: g.samples.iter().map(|x| (x.t_s, f(x) as f64)).collect(),
        // Lines between polls, as the other server charts: a step would
        // hide the members going from alive to left behind each other.
        steps: false,
    };
    let ever = |f: fn(&GossipSample) -> u64| g.samples.iter().any(|x| f(x) > 0);
    // Alive, failed and left always (a flat 0 says as much); the others
    // only when the server ever listed one.
    let mut series = vec![line("alive", |x| x.alive), line("failed", |x| x.failed)];
    if ever(|x| x.leaving) {
        series.push(line("leaving", |x| x.leaving));
    }
    series.push(line("left", |x| x.left));
    if ever(|x| x.critical) {
        series.push(line("serfHealth critical", |x| x.critical));
    }
    let title = if s.server.len() == 1 {
        "Gossip members as the server saw them".to_string()
    } else {
        format!("#{} {}: gossip members as it saw them", i + 1, srv.kind)
    };
    let mut chart = over_time(&title, s.duration_s, Unit::Count, "members", series);
    if let Some(c) = chart.as_mut() {
        c.marks = disruption_marks(s);
        if let Some(t) = g.first_failed_s {
            c.marks.push(Mark {
                x: t,
                label: "first failed".into(),
            });
        }
    }
    figure(
        o,
        chart,
        &format!(
            "The run's members ({}-*) in the server's /v1/agent/members by serf status at each \
             poll, and its nodes whose serfHealth check was critical. A suspected member stays \
             alive there until it is declared failed; a clean run ends with every member left.",
            g.prefixes.join("-*, ")
        ),
    );
    kv(o, &figures(g));
    if g.stale > 0 {
        note(
            o,
            &format!(
                "{} member(s) of these prefixes were listed before the run and not alive (an \
                 earlier run's): each counts from the first poll that shows it changed.",
                fmt_count(g.stale)
            ),
        );
    }
}

/// The gossip figures people look for, in words.
fn figures(g: &GossipSummary) -> Vec<(&'static str, String)> {
    let when = |first: Option<f64>, last: Option<f64>| match (first, last) {
        (Some(a), Some(b)) if b > a => {
            format!(", first at {}, last at {}", run_time(a), run_time(b))
        }
        (Some(a), _) => format!(", at {}", run_time(a)),
        _ => String::new(),
    };
    let peak = g.peak().copied().unwrap_or_default();
    let end = g.at_end().copied().unwrap_or_default();
    vec![
        (
            "most alive",
            format!(
                "{} at {} ({} failed, {} left then)",
                fmt_count(peak.alive),
                run_time(peak.t_s),
                fmt_count(peak.failed),
                fmt_count(peak.left)
            ),
        ),
        (
            "ever failed",
            format!(
                "{} member(s), {} turn(s) to failed{}",
                fmt_count(g.failed_ever),
                fmt_count(g.failed_turns),
                when(g.first_failed_s, g.last_failed_s)
            ),
        ),
        (
            "serfHealth ever critical",
            format!(
                "{} node(s){}",
                fmt_count(g.critical_ever),
                when(g.first_critical_s, g.last_critical_s)
            ),
        ),
        (
            "after the run",
            format!(
                "{} left, {} not left ({} alive, {} leaving, {} failed)",
                fmt_count(end.left),
                fmt_count(end.not_left()),
                fmt_count(end.alive),
                fmt_count(end.leaving),
                fmt_count(end.failed)
            ),
        ),
        (
            "polls",
            format!(
                "{} answered, {} failed",
                fmt_count(g.polls),
                fmt_count(g.failed_polls)
            ),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(failed: bool) -> Summary {
        let at = |t_s, alive, left, failed| GossipSample {
            critical: failed,
            ..GossipSample::at(t_s, alive, left, failed)
        };
        let mut g = GossipSummary {
            prefixes: vec!["agent-sim".into()],
            polls: 4,
            samples: vec![
                at(5.0, 1000, 0, 0),
                at(10.0, 1000 - u64::from(failed) * 3, 0, u64::from(failed) * 3),
                at(15.0, 1000, 0, 0),
                at(20.0, 0, 1000, 0),
            ],
            ..GossipSummary::default()
        };
        if failed {
            (g.failed_ever, g.failed_turns, g.critical_ever) = (3, 3, 3);
            (g.first_failed_s, g.last_failed_s) = (Some(10.0), Some(10.0));
            (g.first_critical_s, g.last_critical_s) = (Some(10.0), Some(10.0));
        }
        Summary {
            duration_s: 20.0,
            server: vec![ServerSummary {
                kind: "consul".into(),
                gossip: Some(g),
                ..ServerSummary::default()
            }],
            ..Summary::default()
        }
    }

    fn page(s: &Summary) -> String {
        let mut o = String::new();
        gossip(&mut o, s, 0, &s.server[0]);
        o
    }

    #[test]
    fn a_clean_run_draws_alive_failed_and_left() {
        let o = page(&summary(false));
        assert_eq!(o.matches("<svg").count(), 1, "{o}");
        assert!(o.contains("aria-label=\"Gossip members as the server saw them\""));
        for name in ["alive", "failed", "left"] {
            assert!(o.contains(&format!(">{name}</text>")), "{name}: {o}");
        }
        assert!(!o.contains("serfHealth critical</text>") && !o.contains("first failed"));
        assert!(o.contains("<dd>1,000 left, 0 not left (0 alive, 0 leaving, 0 failed)</dd>"));
        assert!(o.contains("(agent-sim-*)"));
    }

    #[test]
    fn failures_are_drawn_marked_and_said() {
        let o = page(&summary(true));
        assert!(o.contains("serfHealth critical</text>"), "{o}");
        assert!(o.contains("data-label=\"first failed\""), "{o}");
        assert!(
            o.contains("<dd>3 member(s), 3 turn(s) to failed, at 10.0s</dd>"),
            "{o}"
        );
        let mut s = summary(false);
        s.server[0].gossip = None;
        assert!(page(&s).is_empty());
    }
}
