//! A Consul server's own view of the run's gossip members: its
//! `/v1/agent/members` (serf's status of every LAN member) and its critical
//! `serfHealth` checks (`/v1/health/state/critical`), polled with the
//! metrics while the fleet gossips, counted into the summary's
//! [`GossipSummary`].
//!
//! Which members are the run's: a name that is one of the run's prefixes
//! followed by `-` (`agent-sim-12`). A server keeps left members for a day
//! and failed ones for three, so a run often finds names of its prefix from
//! an earlier run: those listed before the run and not alive are stale and
//! count only from the first poll that shows them in another status (a
//! stale critical `serfHealth` likewise, once it has been seen passing).
//!
//! serf's statuses, as the API numbers them (`AgentMember.Status`, serf's
//! `MemberStatus`): 0 none, 1 alive, 2 leaving, 3 left, 4 failed.
//! Memberlist's suspicion is not one of them: a suspected member stays
//! alive in this list until it is declared dead (failed) or refutes.
//!
//! Parsing is pure (tested on a captured answer of a real Consul 1.20.1);
//! the observer fetches, bounds and schedules.

use std::collections::{BTreeMap, BTreeSet};

use agent_sim_metrics::server::{GossipSample, GossipSummary};
use serde::Deserialize;

use crate::ObserveError;

/// The server's LAN members.
pub const MEMBERS_PATH: &str = "/v1/agent/members";
/// Critical checks, `serfHealth` only (the server filters; the answer is
/// filtered again here, for a server that ignores `filter`).
pub const CRITICAL_PATH: &str =
    "/v1/health/state/critical?filter=CheckID%20%3D%3D%20%22serfHealth%22";
/// The check a Consul leader keeps on every member's node.
pub const SERF_HEALTH: &str = "serfHealth";

/// serf's status of a member (`/v1/agent/members`' `Status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    /// 0: not yet known.
    None,
    /// 1: alive (suspected members too).
    Alive,
    /// 2: its leave intent seen.
    Leaving,
    /// 3: left.
    Left,
    /// 4: declared dead by the failure detector.
    Failed,
}

impl Status {
    /// The status numbered `code` (anything unknown is `None`).
    pub fn from_code(code: u64) -> Status {
        match code {
            1 => Status::Alive,
            2 => Status::Leaving,
            3 => Status::Left,
            4 => Status::Failed,
            _ => Status::None,
        }
    }
}

/// Whose members a run watches.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GossipWatch {
    /// The run's name prefixes (each Consul fleet that gossips).
    pub prefixes: Vec<String>,
    /// Whether the members leave at the end (not with
    /// `--keep-registrations`): the observer then waits a little for the
    /// server to mark them left before its last poll.
    pub expect_left: bool,
}

impl GossipWatch {
    /// Whether `name` is one of the run's members: a prefix, then `-`.
    pub fn owns(&self, name: &str) -> bool {
        self.prefixes.iter().any(|p| {
            name.strip_prefix(p.as_str())
                .is_some_and(|r| r.starts_with('-'))
        })
    }
}

#[derive(Deserialize)]
struct Member {
    #[serde(rename = "Name")]
    name: String,
    #[serde(rename = "Status", default)]
    status: u64,
}

#[derive(Deserialize)]
struct Check {
    #[serde(rename = "Node")]
    node: String,
    #[serde(rename = "CheckID")]
    check_id: String,
    #[serde(rename = "Status", default)]
    status: String,
}

/// The run's members in a `/v1/agent/members` answer, with their status.
pub fn parse_members(
    body: &[u8],
    watch: &GossipWatch,
) -> Result<Vec<(String, Status)>, ObserveError> {
    let all: Vec<Member> = serde_json::from_slice(body).map_err(|source| ObserveError::Answer {
        what: "a list of members",
        bytes: body.len(),
        source,
    })?;
    Ok(all
        .into_iter()
        .filter(|m| watch.owns(&m.name))
        .map(|m| (m.name, Status::from_code(m.status)))
        .collect())
}

/// The run's nodes with a critical `serfHealth` in a
/// `/v1/health/state/critical` answer.
pub fn parse_critical(body: &[u8], watch: &GossipWatch) -> Result<Vec<String>, ObserveError> {
    let all: Vec<Check> = serde_json::from_slice(body).map_err(|source| ObserveError::Answer {
        what: "a list of checks",
        bytes: body.len(),
        source,
    })?;
    Ok(all
        .into_iter()
        .filter(|c| c.check_id == SERF_HEALTH && c.status == "critical" && watch.owns(&c.node))
        .map(|c| c.node)
        .collect())
}

/// One poll's answers, parsed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Polled {
    /// The run's members and their status.
    pub members: Vec<(String, Status)>,
    /// The run's nodes with `serfHealth` critical.
    pub critical: Vec<String>,
}

/// The counting across a run's polls (see the module doc).
#[derive(Debug, Default)]
pub struct MembersTrack {
    /// Status before the run of each member then listed not alive.
    stale: BTreeMap<String, Status>,
    /// Nodes critical before the run and at every poll since.
    stale_critical: BTreeSet<String>,
    /// Last status of each member counted.
    last: BTreeMap<String, Status>,
    /// When each member was first seen failed.
    failed_at: BTreeMap<String, f64>,
    /// When each node was first seen with `serfHealth` critical.
    critical_at: BTreeMap<String, f64>,
    out: GossipSummary,
}

impl MembersTrack {
    /// A track for `watch`'s prefixes.
    pub fn new(watch: &GossipWatch) -> Self {
        MembersTrack {
            out: GossipSummary {
                prefixes: watch.prefixes.clone(),
                ..GossipSummary::default()
            },
            ..MembersTrack::default()
        }
    }

    /// The poll before the first agent dials: what is already listed.
    pub fn baseline(&mut self, p: Polled) {
        self.out.polls += 1;
        self.stale = p
            .members
            .into_iter()
            .filter(|(_, s)| *s != Status::Alive)
            .collect();
        self.out.stale = self.stale.len() as u64;
        self.stale_critical = p.critical.into_iter().collect();
    }

    /// A poll during (or just after) the run, `t_s` from its start.
    pub fn record(&mut self, t_s: f64, p: Polled) {
        self.out.polls += 1;
        let mut x = GossipSample {
            t_s,
            ..GossipSample::default()
        };
        for (name, status) in p.members {
            if self.stale.get(&name) == Some(&status) {
                continue;
            }
            self.stale.remove(&name);
            let before = self.last.insert(name.clone(), status);
            match status {
                Status::Alive => x.alive += 1,
                Status::Leaving => x.leaving += 1,
                Status::Left => x.left += 1,
                Status::Failed => {
                    x.failed += 1;
                    if before != Some(Status::Failed) {
                        self.out.failed_turns += 1;
                        self.failed_at.entry(name).or_insert(t_s);
                    }
                }
                Status::None => {}
            }
        }
        let now: BTreeSet<String> = p.critical.into_iter().collect();
        self.stale_critical.retain(|n| now.contains(n));
        for node in now {
            if !self.stale_critical.contains(&node) {
                x.critical += 1;
                self.critical_at.entry(node).or_insert(t_s);
            }
        }
        self.out.samples.push(x);
    }

    /// A poll that failed.
    pub fn failed(&mut self) {
        self.out.failed_polls += 1;
    }

    /// Whether the last poll still listed members alive or leaving.
    pub fn unsettled(&self) -> bool {
        self.out
            .samples
            .last()
            .is_some_and(|x| x.alive + x.leaving > 0)
    }

    /// The summary's part, its samples bounded.
    pub fn finish(mut self) -> GossipSummary {
        let span = |m: &BTreeMap<String, f64>| {
            let times = || m.values().copied();
            (times().reduce(f64::min), times().reduce(f64::max))
        };
        let o = &mut self.out;
        o.failed_ever = self.failed_at.len() as u64;
        (o.first_failed_s, o.last_failed_s) = span(&self.failed_at);
        o.critical_ever = self.critical_at.len() as u64;
        (o.first_critical_s, o.last_critical_s) = span(&self.critical_at);
        crate::figures::bound(&mut o.samples);
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watch(p: &[&str]) -> GossipWatch {
        GossipWatch {
            prefixes: p.iter().map(|s| s.to_string()).collect(),
            expect_left: true,
        }
    }

    fn polled(members: &[(&str, Status)], critical: &[&str]) -> Polled {
        Polled {
            members: members.iter().map(|(n, s)| (n.to_string(), *s)).collect(),
            critical: critical.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn a_member_is_a_prefix_then_a_dash() {
        let w = watch(&["agent-sim", "edge"]);
        assert!(w.owns("agent-sim-0") && w.owns("edge-12") && w.owns("agent-sim-x-1"));
        assert!(!w.owns("agent-sim") && !w.owns("agent-simulator-1") && !w.owns("srv1"));
        assert_eq!(Status::from_code(4), Status::Failed);
        assert_eq!(Status::from_code(9), Status::None);
    }

    #[test]
    fn other_checks_and_passing_ones_are_not_counted() {
        let body = br#"[
            {"Node": "a-1", "CheckID": "serfHealth", "Status": "critical"},
            {"Node": "a-2", "CheckID": "service:web", "Status": "critical"},
            {"Node": "a-3", "CheckID": "serfHealth", "Status": "passing"},
            {"Node": "b-1", "CheckID": "serfHealth", "Status": "critical"}
        ]"#;
        assert_eq!(parse_critical(body, &watch(&["a"])).unwrap(), vec!["a-1"]);
        let e = parse_critical(b"<html>", &watch(&["a"]))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("not a list of checks (6 bytes)"), "{e}");
        assert!(parse_members(b"{}", &watch(&["a"])).is_err());
    }

    #[test]
    fn failures_are_counted_once_per_member_and_again_per_turn() {
        let w = watch(&["a"]);
        let mut t = MembersTrack::new(&w);
        t.baseline(polled(&[], &[]));
        use Status::{Alive, Failed, Leaving, Left};
        t.record(5.0, polled(&[("a-0", Alive), ("a-1", Alive)], &[]));
        t.record(10.0, polled(&[("a-0", Failed), ("a-1", Alive)], &["a-0"]));
        t.record(15.0, polled(&[("a-0", Alive), ("a-1", Failed)], &["a-1"]));
        t.record(
            20.0,
            polled(&[("a-0", Failed), ("a-1", Failed)], &["a-0", "a-1"]),
        );
        t.record(25.0, polled(&[("a-0", Leaving), ("a-1", Left)], &[]));
        assert!(t.unsettled());
        t.record(26.0, polled(&[("a-0", Left), ("a-1", Left)], &[]));
        assert!(!t.unsettled());
        t.failed();
        let g = t.finish();
        assert_eq!((g.failed_ever, g.failed_turns), (2, 3));
        assert_eq!(
            (g.first_failed_s, g.last_failed_s),
            (Some(10.0), Some(15.0))
        );
        assert_eq!(g.critical_ever, 2);
        assert_eq!(
            (g.first_critical_s, g.last_critical_s),
            (Some(10.0), Some(15.0))
        );
        assert_eq!((g.polls, g.failed_polls), (7, 1));
        assert_eq!(g.samples[3].failed, 2);
        assert_eq!(g.samples[3].critical, 2);
        assert_eq!(g.samples[4].leaving, 1);
        assert_eq!(g.stat("not_left_at_end"), Some(0));
        assert_eq!(g.stat("alive_max"), Some(2));
        assert_eq!(g.peak().map(|x| x.t_s), Some(5.0));
    }

    #[test]
    fn members_left_by_an_earlier_run_count_only_once_they_change() {
        use Status::{Alive, Failed, Left};
        let mut t = MembersTrack::new(&watch(&["a"]));
        // An earlier run left a-0 and a-1 and lost a-2; a-2's node is critical.
        t.baseline(polled(
            &[("a-0", Left), ("a-1", Left), ("a-2", Failed)],
            &["a-2"],
        ));
        // This run has two agents: a-0 joins, a-1 has not yet.
        t.record(
            5.0,
            polled(&[("a-0", Alive), ("a-1", Left), ("a-2", Failed)], &["a-2"]),
        );
        t.record(
            10.0,
            polled(&[("a-0", Alive), ("a-1", Alive), ("a-2", Failed)], &["a-2"]),
        );
        t.record(
            15.0,
            polled(&[("a-0", Left), ("a-1", Left), ("a-2", Failed)], &["a-2"]),
        );
        let g = t.finish();
        assert_eq!(g.stale, 3);
        let counts: Vec<(u64, u64, u64, u64)> = g
            .samples
            .iter()
            .map(|x| (x.alive, x.left, x.failed, x.critical))
            .collect();
        assert_eq!(counts, vec![(1, 0, 0, 0), (2, 0, 0, 0), (0, 2, 0, 0)]);
        assert_eq!((g.failed_ever, g.critical_ever), (0, 0));
    }

    #[test]
    fn a_stale_critical_node_counts_once_it_was_passing() {
        let mut t = MembersTrack::new(&watch(&["a"]));
        t.baseline(polled(&[("a-0", Status::Failed)], &["a-0"]));
        t.record(5.0, polled(&[("a-0", Status::Alive)], &[]));
        t.record(10.0, polled(&[("a-0", Status::Failed)], &["a-0"]));
        let g = t.finish();
        assert_eq!((g.failed_ever, g.first_failed_s), (1, Some(10.0)));
        assert_eq!((g.critical_ever, g.first_critical_s), (1, Some(10.0)));
    }
}
