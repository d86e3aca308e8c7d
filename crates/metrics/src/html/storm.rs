//! The page's storm figures of an observed Consul server: its gossip bytes,
//! its gossip messages by kind, serf's member events, its queue depths and
//! the anti-entropy reads it served, each per second over the run on the
//! sessions' time axis (disruptions and new leaders marked), and the
//! totals and peaks in words.

use std::fmt::Write as _;

use super::blocks::{disruption_marks, figure, kv};
use super::charts::over_time;
use super::esc;
use super::svg::{Mark, Series, Unit};
use crate::server::ServerSummary;
use crate::storm::{Count, Queue, StormSummary};
use crate::summary::Summary;

/// One chart's series: a counted figure per second at each interval, for
/// each of `counts` the server exported.
fn rates(st: &StormSummary, counts: &[(Count, &str)]) -> Vec<Series> {
    counts
        .iter()
        .filter(|(c, _)| st.total.contains_key(c))
        .map(|(c, name)| Series {
            name: name.to_string(),
            points: st
                .samples
                .iter()
                .filter_map(|x| x.per_s.get(c).map(|v| (x.t_s, *v)))
                .collect(),
            steps: false,
        })
        .filter(|x| !x.points.is_empty())
        .collect()
}

/// A mark at each interval in which the server counted a new leader.
fn new_leaders(st: &StormSummary) -> Vec<Mark> {
    st.samples
        .iter()
        .filter(|x| {
            x.per_s
                .get(&Count::NewLeaderEvents)
                .is_some_and(|v| *v > 0.0)
        })
        .map(|x| Mark {
            x: x.t_s,
            label: "new leader".into(),
        })
        .collect()
}

/// One chart: its title, the unit and title of its y axis, its series
/// and its caption.
type Spec = (&'static str, Unit, &'static str, Vec<Series>, &'static str);

/// The storm's charts, each with the series the server exported.
fn charts(st: &StormSummary) -> [Spec; 5] {
    [
        (
            "Gossip bytes per second",
            Unit::Bytes,
            "per second",
            rates(
                st,
                &[(Count::GossipBytesIn, "in"), (Count::GossipBytesOut, "out")],
            ),
            "Memberlist UDP bytes the server received and sent per interval \
             (consul_memberlist_udp_received, _sent).",
        ),
        (
            "Gossip messages per second",
            Unit::Count,
            "messages / s",
            rates(
                st,
                &[
                    (Count::AliveMsgs, "alive"),
                    (Count::SuspectMsgs, "suspect"),
                    (Count::DeadMsgs, "dead"),
                    (Count::SerfMsgs, "serf"),
                    (Count::DegradedProbes, "degraded probes"),
                    (Count::HandlerDrops, "dropped (queue full)"),
                ],
            ),
            "The alive, suspect and dead messages memberlist applied, the serf messages the \
             server received and the probes it ran with a lowered health score, per second in \
             each interval; from the embedded server also the messages its full handler queue \
             dropped (a real one only logs them).",
        ),
        (
            "Serf member events per second",
            Unit::Count,
            "members / s",
            rates(
                st,
                &[
                    (Count::MemberJoins, "joined"),
                    (Count::MemberFailed, "failed"),
                    (Count::MemberLeft, "left"),
                    (Count::TcpAccepts, "TCP accepts"),
                ],
            ),
            "Members serf saw join, declared failed and saw leave, and the TCP streams \
             (push-pulls) memberlist accepted, per second; a new leader's consul:new-leader \
             event is marked.",
        ),
        (
            "Gossip queue depths",
            Unit::Count,
            "messages queued",
            depths(st),
            "The deepest of each queue's LAN and WAN pools: the 99th percentile of the \
             server's own samples (serf samples its queues every 30 s, so the line joins the \
             intervals that had one).",
        ),
        (
            "Anti-entropy reads per second",
            Unit::Count,
            "calls / s",
            rates(
                st,
                &[(
                    Count::AeReads,
                    "Catalog.NodeServiceList + Health.NodeChecks",
                )],
            ),
            "The reads of the agents' anti-entropy syncs the server served per second \
             (consul_rpc_server_call by method): a new leader or a server's return sets off a \
             full sync of every agent, staggered.",
        ),
    ]
}

/// The charts and figures of server `i`'s storm part, if it has one.
pub(super) fn storm(o: &mut String, s: &Summary, i: usize, srv: &ServerSummary) {
    let Some(st) = &srv.storm else {
        return;
    };
    let one = s.server.len() == 1;
    let heading = if one {
        "Gossip and anti-entropy, as the server counted them".to_string()
    } else {
        format!("#{} {}: gossip and anti-entropy", i + 1, esc(&srv.kind))
    };
    let _ = writeln!(o, "<h3>{heading}</h3>");
    let leaders = new_leaders(st);
    for (what, unit, y, series, caption) in charts(st) {
        let title = if one {
            what.to_string()
        } else {
            format!("#{} {}: {what}", i + 1, srv.kind)
        };
        let mut c = over_time(&title, s.duration_s, unit, y, series);
        if let Some(c) = c.as_mut() {
            c.marks = disruption_marks(s);
            c.marks.extend(leaders.iter().cloned());
        }
        figure(o, c, caption);
    }
    kv(o, &st.figures());
}

/// Each queue's high end ([`crate::storm::Depth::high`]) at each interval
/// that had a sample of it.
fn depths(st: &StormSummary) -> Vec<Series> {
    Queue::ALL
        .iter()
        .map(|q| Series {
            name: q.words().to_string(),
            points: st
                .samples
                .iter()
                .filter_map(|x| x.queues.get(q).and_then(|d| d.high()).map(|v| (x.t_s, v)))
                .collect(),
            steps: false,
        })
        .filter(|x| !x.points.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storm::{Depth, Peak, StormSample};

    /// A join of 1,000 members at 10 s, 3 failing at 40 s, a new leader at
    /// 60 s and the anti-entropy reads it sets off.
    fn storm_summary() -> Summary {
        let mut st = StormSummary::default();
        for k in 1..=24u32 {
            let t_s = f64::from(k) * 5.0;
            let join = if (10.0..=25.0).contains(&t_s) {
                1.0
            } else {
                0.0
            };
            let mut per_s = std::collections::BTreeMap::new();
            per_s.insert(Count::GossipBytesIn, 2_000.0 + join * 60_000.0);
            per_s.insert(Count::GossipBytesOut, 1_500.0 + join * 20_000.0);
            per_s.insert(Count::AliveMsgs, 1.0 + join * 240.0);
            per_s.insert(Count::SuspectMsgs, if t_s == 40.0 { 2.0 } else { 0.0 });
            per_s.insert(Count::DeadMsgs, if t_s == 45.0 { 0.6 } else { 0.0 });
            per_s.insert(Count::SerfMsgs, 3.0 + join * 120.0);
            per_s.insert(Count::MemberJoins, join * 50.0);
            per_s.insert(Count::MemberFailed, if t_s == 45.0 { 0.6 } else { 0.0 });
            per_s.insert(Count::NewLeaderEvents, if t_s == 60.0 { 0.2 } else { 0.0 });
            per_s.insert(
                Count::AeReads,
                if (60.0..=85.0).contains(&t_s) {
                    80.0
                } else {
                    0.5
                },
            );
            let mut queues = std::collections::BTreeMap::new();
            if k % 6 == 2 {
                let depth = |v: f64| Depth {
                    p99: Some(v),
                    mean: Some(v),
                    ..Depth::default()
                };
                queues.insert(Queue::Intent, depth(if k == 2 { 2_100.0 } else { 4.0 }));
                queues.insert(Queue::Event, depth(if k == 14 { 40.0 } else { 0.0 }));
            }
            for (c, v) in &per_s {
                *st.total.entry(*c).or_default() += v * 5.0;
            }
            st.samples.push(StormSample { t_s, per_s, queues });
        }
        let peak = |value, at_s| Peak { value, at_s };
        st.peak_per_s = [
            (Count::GossipBytesIn, peak(62_000.0, 10.0)),
            (Count::AliveMsgs, peak(241.0, 10.0)),
            (Count::AeReads, peak(80.0, 60.0)),
        ]
        .into();
        st.queue_max = [
            (Queue::Intent, peak(2_100.0, 10.0)),
            (Queue::Event, peak(40.0, 70.0)),
        ]
        .into();
        Summary {
            duration_s: 120.0,
            kind: "consul".into(),
            server: vec![ServerSummary {
                kind: "consul".into(),
                target: "http://127.0.0.1:8500/v1/agent/metrics?format=prometheus".into(),
                source: "prometheus".into(),
                storm: Some(st),
                ..ServerSummary::default()
            }],
            ..Summary::default()
        }
    }

    fn section(s: &Summary) -> String {
        let mut o = String::new();
        storm(&mut o, s, 0, &s.server[0]);
        o
    }

    #[test]
    fn the_storm_is_drawn_on_the_runs_axis_with_its_figures() {
        let s = storm_summary();
        let o = section(&s);
        assert_eq!(o.matches("<svg").count(), 5, "{o}");
        assert!(o.starts_with("<h3>Gossip and anti-entropy, as the server counted them</h3>"));
        for title in [
            "Gossip bytes per second",
            "Gossip messages per second",
            "Serf member events per second",
            "Gossip queue depths",
            "Anti-entropy reads per second",
        ] {
            assert!(o.contains(&format!("aria-label=\"{title}\"")), "{title}");
        }
        for name in ["alive", "suspect", "dead", "serf", "intent", "event"] {
            assert!(o.contains(&format!(">{name}</text>")), "{name}");
        }
        assert!(
            !o.contains(">dropped (queue full)</text>"),
            "not exported: not drawn"
        );
        assert_eq!(o.matches("data-label=\"new leader\"").count(), 5);
        assert!(o.contains("<dt>anti-entropy</dt>"), "{o}");
        assert!(o.contains("<dt>queues</dt><dd>p99 max intent 2,100 at 10.0s"));
        let page = super::super::render(&super::super::Page {
            summary: &s,
            verdicts: &[],
            windows: &[],
            sources: &[],
        });
        if let Ok(p) = std::env::var("AGENT_SIM_KEEP_STORM_HTML") {
            std::fs::write(p, &page).unwrap();
        }
        assert!(page.contains("aria-label=\"Anti-entropy reads per second\""));
    }

    #[test]
    fn a_server_without_storm_figures_draws_none() {
        let mut s = storm_summary();
        s.server[0].storm = None;
        assert!(section(&s).is_empty());
        let mut s = storm_summary();
        let st = s.server[0].storm.as_mut().unwrap();
        st.total.retain(|c, _| *c == Count::MemberFailed);
        for x in &mut st.samples {
            x.queues.clear();
        }
        let o = section(&s);
        assert_eq!(o.matches("<svg").count(), 1, "{o}");
        assert!(o.contains("aria-label=\"Serf member events per second\""));
    }
}
