//! The summary's storm figures of an observed Consul server: what its
//! gossip layers (memberlist and serf) and its anti-entropy reads went
//! through during the run, as the server's own metrics say, per interval
//! and in total; and their lines of the final table.
//!
//! A storm (a join of thousands of nodes, a leader change, a server lost
//! and back) is judged by these: the gossip bytes and the alive, suspect
//! and dead messages the server received, serf's messages and its queue
//! depths, members joining, failing and leaving, the messages its handler
//! queue dropped, and the anti-entropy reads a full sync of every agent
//! makes. Each [`Count`] is a rate per interval, a total and a peak; each
//! [`Queue`] a depth per interval and its highest 99th percentile.
//!
//! What it is not: the reading of the server's series (`agent-sim-observe`
//! maps them onto these figures); a figure whose series the server never
//! exported is absent, never zero.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::units::fmt_count;

/// A counted figure: a rate per interval, a total over the run, a peak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Count {
    /// Memberlist UDP bytes received (`consul_memberlist_udp_received`).
    GossipBytesIn,
    /// Memberlist UDP bytes sent (`consul_memberlist_udp_sent`).
    GossipBytesOut,
    /// TCP streams memberlist accepted: push-pulls mostly
    /// (`consul_memberlist_tcp_accept`).
    TcpAccepts,
    /// Alive messages memberlist applied (`consul_memberlist_msg_alive`).
    AliveMsgs,
    /// Suspect messages (`consul_memberlist_msg_suspect`).
    SuspectMsgs,
    /// Dead messages (`consul_memberlist_msg_dead`).
    DeadMsgs,
    /// Probes run at a lowered health score (`consul_memberlist_degraded_probe`).
    DegradedProbes,
    /// Serf messages received (`consul_serf_msgs_received`, its count).
    SerfMsgs,
    /// Members serf saw join (`consul_serf_member_join`).
    MemberJoins,
    /// Members serf declared failed (`consul_serf_member_failed`).
    MemberFailed,
    /// Members serf saw leave (`consul_serf_member_left`).
    MemberLeft,
    /// Serf user events (`consul_serf_events`).
    SerfEvents,
    /// `consul:new-leader` user events (`consul_serf_events_consul:new_leader`).
    NewLeaderEvents,
    /// Messages dropped on a full handler queue: the embedded server's
    /// `agent_sim_memberlist_handler_queue_dropped` (a real one only logs it).
    HandlerDrops,
    /// Anti-entropy reads: `Catalog.NodeServiceList` and `Health.NodeChecks`
    /// calls (`consul_rpc_server_call` by `method`).
    AeReads,
}

impl Count {
    /// Every figure, in the order the table and the page say them.
    pub const ALL: [Count; 15] = [
        Count::GossipBytesIn,
        Count::GossipBytesOut,
        Count::TcpAccepts,
        Count::AliveMsgs,
        Count::SuspectMsgs,
        Count::DeadMsgs,
        Count::DegradedProbes,
        Count::SerfMsgs,
        Count::MemberJoins,
        Count::MemberFailed,
        Count::MemberLeft,
        Count::SerfEvents,
        Count::NewLeaderEvents,
        Count::HandlerDrops,
        Count::AeReads,
    ];

    /// Whether it counts bytes (else messages, members or calls).
    pub fn is_bytes(self) -> bool {
        matches!(self, Count::GossipBytesIn | Count::GossipBytesOut)
    }
}

/// A queue whose depth the server samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Queue {
    /// Memberlist's broadcasts (`consul_memberlist_queue_broadcasts`).
    Broadcasts,
    /// Serf's join and leave intents (`consul_serf_queue_Intent`).
    Intent,
    /// Serf's user events (`consul_serf_queue_Event`).
    Event,
    /// Serf's queries (`consul_serf_queue_Query`).
    Query,
}

impl Queue {
    /// Every queue, in the order the table and the page say them.
    pub const ALL: [Queue; 4] = [Queue::Intent, Queue::Event, Queue::Query, Queue::Broadcasts];

    /// Its name in a few words.
    pub fn words(self) -> &'static str {
        match self {
            Queue::Broadcasts => "broadcasts",
            Queue::Intent => "intent",
            Queue::Event => "event",
            Queue::Query => "query",
        }
    }
}

/// A queue's depth in one interval, in messages queued: the server's
/// summary quantiles at the scrape (its sliding window), the mean of the
/// depths it sampled in the interval; Consul's JSON gives mean and max.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Depth {
    /// Median.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p50: Option<f64>,
    /// 90th percentile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p90: Option<f64>,
    /// 99th percentile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99: Option<f64>,
    /// Largest (Consul's JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
    /// Mean of the depths sampled in the interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean: Option<f64>,
}

impl Depth {
    /// The high end of the interval: its 99th percentile, else its largest,
    /// else its mean.
    pub fn high(&self) -> Option<f64> {
        self.p99.or(self.max).or(self.mean)
    }
}

/// The storm figures of one interval (between two scrapes).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StormSample {
    /// Seconds from the run start (the scrape that ends the interval).
    pub t_s: f64,
    /// Each counted figure per second over the interval.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub per_s: BTreeMap<Count, f64>,
    /// Each queue's depth in the interval (serf samples its queues every
    /// 30 s, so most intervals of a few seconds have none).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub queues: BTreeMap<Queue, Depth>,
}

/// A highest value and when it was.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Peak {
    /// The value (per second for a count, messages for a queue).
    pub value: f64,
    /// Seconds from the run start (the end of its interval).
    pub at_s: f64,
}

/// One server's storm figures over the run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StormSummary {
    /// Every interval, in time order (at most 2,000; longer runs keep
    /// every other one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub samples: Vec<StormSample>,
    /// Each counted figure over every interval of the run (bytes for the
    /// byte figures), from every interval, also those dropped from
    /// `samples`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub total: BTreeMap<Count, f64>,
    /// Each counted figure's highest rate per second, and when.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub peak_per_s: BTreeMap<Count, Peak>,
    /// Each queue's highest depth ([`Depth::high`]) over the run, and when.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub queue_max: BTreeMap<Queue, Peak>,
}

impl StormSummary {
    /// Moves every time by `by` seconds (a merge onto another clock).
    pub fn shift(&mut self, by: f64) {
        for x in &mut self.samples {
            x.t_s += by;
        }
        for p in self
            .peak_per_s
            .values_mut()
            .chain(self.queue_max.values_mut())
        {
            p.at_s += by;
        }
    }

    /// Its lines of the final table, one per kind of figure ([`Self::figures`]).
    pub fn table_lines(&self) -> Vec<String> {
        self.figures()
            .into_iter()
            .map(|(what, text)| format!("storm      {what:<12} {text}"))
            .collect()
    }

    /// The figures in words, one entry per kind (`gossip` bytes,
    /// `messages`, `queues`, `members`, `anti-entropy`): totals, with the
    /// peaks that were above zero; none for a kind the server exported
    /// nothing of.
    pub fn figures(&self) -> Vec<(&'static str, String)> {
        use Count::{
            AeReads, AliveMsgs, DeadMsgs, DegradedProbes, GossipBytesIn, GossipBytesOut,
            HandlerDrops, MemberFailed, MemberJoins, MemberLeft, NewLeaderEvents, SerfEvents,
            SerfMsgs, SuspectMsgs, TcpAccepts,
        };
        let mut out = Vec::new();
        let mut kind = |what: &'static str, parts: Vec<Option<String>>| {
            let parts: Vec<String> = parts.into_iter().flatten().collect();
            if !parts.is_empty() {
                out.push((what, parts.join("; ")));
            }
        };
        let said = |c, one, many, peak| self.said(c, (one, many), peak);
        kind(
            "gossip",
            vec![
                list([
                    said(GossipBytesIn, "in", "in", true),
                    said(GossipBytesOut, "out", "out", true),
                ]),
                said(TcpAccepts, "TCP accept", "TCP accepts", false),
            ],
        );
        kind(
            "messages",
            vec![
                list([
                    said(AliveMsgs, "alive", "alive", true),
                    said(SuspectMsgs, "suspect", "suspect", false),
                    said(DeadMsgs, "dead", "dead", false),
                ]),
                said(SerfMsgs, "serf", "serf", true),
                said(DegradedProbes, "degraded probe", "degraded probes", false),
                said(
                    HandlerDrops,
                    "dropped (handler queue full)",
                    "dropped (handler queue full)",
                    true,
                ),
            ],
        );
        kind("queues", vec![self.queue_words()]);
        kind(
            "members",
            vec![
                list([
                    said(MemberJoins, "joined", "joined", true),
                    said(MemberFailed, "failed", "failed", false),
                    said(MemberLeft, "left", "left", false),
                ]),
                said(SerfEvents, "serf event", "serf events", false),
                said(
                    NewLeaderEvents,
                    "new-leader event",
                    "new-leader events",
                    false,
                ),
            ],
        );
        kind("anti-entropy", vec![said(AeReads, "read", "reads", true)]);
        out
    }

    /// `N words`, with `(peak R/s at T)` when asked and above zero; bytes
    /// in their unit; absent when the server exported none.
    fn said(&self, c: Count, (one, many): (&str, &str), peak: bool) -> Option<String> {
        let v = self.total.get(&c)?.max(0.0);
        let mut s = if c.is_bytes() {
            format!("{} {many}", fmt_bytes(v))
        } else {
            let n = v.round();
            format!(
                "{} {}",
                fmt_count(n as u64),
                if n == 1.0 { one } else { many }
            )
        };
        if let Some(p) = self.peak_per_s.get(&c).filter(|p| peak && p.value > 0.0) {
            let r = if c.is_bytes() {
                fmt_bytes(p.value)
            } else {
                fmt_rate(p.value)
            };
            let _ = write!(s, " (peak {r}/s at {:.1}s)", p.at_s);
        }
        Some(s)
    }

    /// Each queue's highest depth, and when.
    fn queue_words(&self) -> Option<String> {
        let each: Vec<String> = Queue::ALL
            .iter()
            .filter_map(|q| {
                let p = self.queue_max.get(q)?;
                let v = fmt_count(p.value.max(0.0).round() as u64);
                Some(if p.value > 0.0 {
                    format!("{} {v} at {:.1}s", q.words(), p.at_s)
                } else {
                    format!("{} {v}", q.words())
                })
            })
            .collect();
        (!each.is_empty()).then(|| format!("p99 max {}", each.join(", ")))
    }
}

/// The parts there are, joined by commas.
fn list<const N: usize>(parts: [Option<String>; N]) -> Option<String> {
    let parts: Vec<String> = parts.into_iter().flatten().collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// Bytes in a readable binary unit (`512 B`, `337.0 KiB`, `1.2 MiB`).
pub fn fmt_bytes(b: f64) -> String {
    let b = b.max(0.0);
    if b < 1024.0 {
        format!("{b:.0} B")
    } else if b < 1024.0 * 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else if b < 1024.0 * 1024.0 * 1024.0 {
        format!("{:.1} MiB", b / (1024.0 * 1024.0))
    } else {
        format!("{:.2} GiB", b / (1024.0 * 1024.0 * 1024.0))
    }
}

/// A rate: whole above 100 (`1,250`), one decimal below (`12.5`).
pub fn fmt_rate(v: f64) -> String {
    if v >= 100.0 {
        fmt_count(v.round() as u64)
    } else {
        format!("{v:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn storm() -> StormSummary {
        let peak = |value, at_s| Peak { value, at_s };
        StormSummary {
            samples: vec![StormSample {
                t_s: 5.0,
                per_s: [(Count::AliveMsgs, 240.0)].into(),
                queues: [(
                    Queue::Intent,
                    Depth {
                        p99: Some(2100.0),
                        ..Depth::default()
                    },
                )]
                .into(),
            }],
            total: [
                (Count::GossipBytesIn, 345_088.0),
                (Count::GossipBytesOut, 122_880.0),
                (Count::TcpAccepts, 100.0),
                (Count::AliveMsgs, 1200.0),
                (Count::SuspectMsgs, 10.0),
                (Count::DeadMsgs, 0.0),
                (Count::SerfMsgs, 3400.0),
                (Count::DegradedProbes, 35.0),
                (Count::HandlerDrops, 0.0),
                (Count::MemberJoins, 100.0),
                (Count::MemberFailed, 3.0),
                (Count::MemberLeft, 0.0),
                (Count::SerfEvents, 1.0),
                (Count::NewLeaderEvents, 1.0),
                (Count::AeReads, 124.0),
            ]
            .into(),
            peak_per_s: [
                (Count::GossipBytesIn, peak(46_080.0, 3.0)),
                (Count::AliveMsgs, peak(240.0, 3.0)),
                (Count::SerfMsgs, peak(800.0, 3.0)),
                (Count::AeReads, peak(12.0, 31.0)),
                (Count::DeadMsgs, peak(0.0, 5.0)),
            ]
            .into(),
            queue_max: [
                (Queue::Intent, peak(2100.0, 30.0)),
                (Queue::Event, peak(0.0, 30.0)),
            ]
            .into(),
        }
    }

    #[test]
    fn the_table_says_one_line_per_kind() {
        let lines = storm().table_lines();
        assert_eq!(
            lines,
            [
                "storm      gossip       337.0 KiB in (peak 45.0 KiB/s at 3.0s), 120.0 KiB out; \
                 100 TCP accepts",
                "storm      messages     1,200 alive (peak 240/s at 3.0s), 10 suspect, 0 dead; \
                 3,400 serf (peak 800/s at 3.0s); 35 degraded probes; 0 dropped (handler \
                 queue full)",
                "storm      queues       p99 max intent 2,100 at 30.0s, event 0",
                "storm      members      100 joined, 3 failed, 0 left; 1 serf event; \
                 1 new-leader event",
                "storm      anti-entropy 124 reads (peak 12.0/s at 31.0s)",
            ]
        );
    }

    #[test]
    fn absent_figures_are_not_said() {
        let s = StormSummary {
            total: [(Count::MemberFailed, 2.0)].into(),
            ..StormSummary::default()
        };
        assert_eq!(s.table_lines(), ["storm      members      2 failed"]);
        assert!(StormSummary::default().table_lines().is_empty());
    }

    #[test]
    fn figures_keep_their_names_in_json_and_shift_with_a_merge() {
        let mut s = storm();
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["total"]["alive_msgs"], 1200.0);
        assert_eq!(v["samples"][0]["queues"]["intent"]["p99"], 2100.0);
        assert_eq!(v["queue_max"]["intent"]["at_s"], 30.0);
        let back: StormSummary = serde_json::from_value(v).unwrap();
        assert_eq!(back, s);
        s.shift(2.0);
        assert_eq!(s.samples[0].t_s, 7.0);
        assert_eq!(s.peak_per_s[&Count::AeReads].at_s, 33.0);
        assert_eq!(s.queue_max[&Queue::Intent].at_s, 32.0);
    }
}
