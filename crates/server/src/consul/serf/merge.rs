//! What changes the table in bulk: a peer's push-pull merged (memberlist's
//! `mergeRemoteState`: each member as an alive, dead or suspect message,
//! then serf's clocks and intents; a join's state refused whole when one of
//! its members breaks Consul's merge rules), suspicions that ran out, and
//! serf's reaper.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use agent_sim_gossip::serf::{self as serf_wire, SerfState};
use agent_sim_gossip::wire::msgs::{PushPull, Verdict, state};
use tokio::time::Instant;

use super::members::{INTENT_TIMEOUT, Refused, Status, Table};

impl Table {
    /// Merges a peer's push-pull (memberlist's `mergeRemoteState`, then
    /// serf's `MergeRemoteState`). A join's state is refused whole when one
    /// of its members breaks Consul's merge rules. Returns the refusals of
    /// single members.
    pub(crate) fn merge(
        &mut self,
        pp: &PushPull<'_>,
        serf: Option<&SerfState<'_>>,
        now: Instant,
    ) -> Result<Vec<Refused>, Refused> {
        if pp.join {
            let mut ids = HashSet::new();
            for n in pp.nodes.iter().filter(|n| n.state != state::LEFT) {
                self.check_merge(n.name, n.meta)?;
                let id = serf_wire::decode_tags(n.meta)
                    .ok()
                    .and_then(|t| t.into_iter().find(|(k, _)| k == "id").map(|(_, v)| v))
                    .filter(|id| !id.is_empty());
                if let Some(id) = id
                    && !ids.insert(id)
                {
                    return Err(Refused::ConflictingId);
                }
            }
        }
        let mut refused = Vec::new();
        let me = self.rules.me.clone();
        for n in &pp.nodes {
            match n.state {
                state::ALIVE => {
                    if let Err(e) = self.alive(&n.alive(), now) {
                        refused.push(e);
                    }
                }
                state::LEFT => self.dead(
                    &Verdict {
                        incarnation: n.incarnation,
                        node: n.name,
                        from: n.name,
                    },
                    now,
                ),
                _ => self.suspect(
                    &Verdict {
                        incarnation: n.incarnation,
                        node: n.name,
                        from: &me,
                    },
                    now,
                ),
            }
        }
        if let Some(s) = serf {
            self.merge_serf(s, now);
        }
        Ok(refused)
    }

    fn merge_serf(&mut self, s: &SerfState<'_>, now: Instant) {
        let mut moved = false;
        if s.ltime > 0 {
            moved |= Self::witness(&mut self.clock, s.ltime - 1);
        }
        if s.event_ltime > 0 {
            moved |= Self::witness(&mut self.event_clock, s.event_ltime - 1);
        }
        if s.query_ltime > 0 {
            moved |= Self::witness(&mut self.query_clock, s.query_ltime - 1);
        }
        if moved {
            // A joiner's clocks: news of the same kind as its join.
            self.touch_alive();
        }
        let times: HashMap<&str, u64> = s.status.iter().copied().collect();
        let left: HashSet<&str> = s.left.iter().copied().collect();
        for name in &s.left {
            let t = times.get(name).copied().unwrap_or(0) + 1;
            self.apply_intent(true, t, name, now);
        }
        for (name, t) in &s.status {
            if !left.contains(name) {
                self.apply_intent(false, *t, name, now);
            }
        }
    }

    /// Declares failed the suspects whose time ran out; returns how many.
    pub(crate) fn expire(&mut self, now: Instant) -> usize {
        let due: Vec<(Arc<str>, u32)> = self
            .members
            .iter()
            .filter(|(_, m)| m.suspicion.as_ref().is_some_and(|s| s.deadline <= now))
            .map(|(n, m)| (n.clone(), m.incarnation))
            .collect();
        let me = self.rules.me.clone();
        for (name, incarnation) in &due {
            self.dead(
                &Verdict {
                    incarnation: *incarnation,
                    node: name,
                    from: &me,
                },
                now,
            );
        }
        due.len()
    }

    /// The earliest suspicion deadline.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.members
            .values()
            .filter_map(|m| m.suspicion.as_ref().map(|s| s.deadline))
            .min()
    }

    /// serf's reaper: left members after `reap_left`, failed ones after
    /// `reap_failed` leave the table (and the catalog); old intents go.
    pub(crate) fn reap(&mut self, now: Instant) {
        let (left, failed) = (self.rules.reap_left, self.rules.reap_failed);
        let gone: Vec<Arc<str>> = self
            .members
            .iter()
            .filter(|(_, m)| {
                let after = match m.status {
                    Status::Left => left,
                    Status::Failed => failed,
                    _ => return false,
                };
                m.gone_at.is_some_and(|t| now.duration_since(t) >= after)
            })
            .map(|(n, _)| n.clone())
            .collect();
        if !gone.is_empty() {
            self.touch();
        }
        for name in gone {
            self.members.remove(&name);
            self.dirty.insert(name);
        }
        self.intents
            .retain(|_, i| now.duration_since(i.at) < INTENT_TIMEOUT);
    }

    /// The members whose catalog entry must be reconciled (taken).
    pub(crate) fn take_dirty(&mut self) -> Vec<Arc<str>> {
        self.dirty.drain().collect()
    }
}
