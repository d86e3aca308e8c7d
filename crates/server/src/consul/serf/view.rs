//! What the member table answers the server's tasks: whom to probe next
//! (memberlist's round robin over a shuffled list, reshuffled at each
//! wrap), whom to ask for indirect probes, gossip to or push-pull with
//! (random picks, as memberlist's `kRandomNodes`), the push-pull state it
//! sends (every member it has not forgotten, and serf's clocks, status
//! times, left members and event buffer), and the rows of `/v1/agent/members`, of the
//! reconcile and of the gauges.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use agent_sim_gossip::serf::SerfState;
use agent_sim_gossip::wire::msgs::{NodeState, PushPull};
use tokio::time::Instant;

use super::event::encode_state;
use super::members::{Liveness, Member, Status, Table};
use super::stats::Census;

/// A member to probe.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) name: Arc<str>,
    pub(crate) to: SocketAddr,
    pub(crate) addr_raw: Vec<u8>,
    pub(crate) incarnation: u32,
    /// Suspected: the ping carries the suspicion so it can refute.
    pub(crate) suspect: bool,
    /// Highest protocol it speaks (TCP pings from 3, nacks from 4).
    pub(crate) pmax: u8,
}

/// A member as `/v1/agent/members` lists it (tags still encoded).
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) name: String,
    pub(crate) addr: IpAddr,
    pub(crate) port: u16,
    pub(crate) meta: Vec<u8>,
    pub(crate) status: Status,
    pub(crate) vsn: [u8; 6],
}

fn socket_of(m: &Member) -> SocketAddr {
    SocketAddr::new(m.addr, m.port)
}

impl Table {
    fn forgotten(&self, m: &Member, now: Instant) -> bool {
        matches!(m.liveness, Liveness::Dead | Liveness::Left)
            && now.duration_since(m.changed) > self.rules.gossip_to_the_dead
    }

    /// memberlist's `resetNodes`: the order again, without the members
    /// dead long enough to be forgotten, shuffled.
    fn reshuffle(&mut self, now: Instant) {
        let keep: Vec<Arc<str>> = self
            .members
            .iter()
            .filter(|(n, m)| **n != self.rules.me && !self.forgotten(m, now))
            .map(|(n, _)| n.clone())
            .collect();
        for m in self.members.values_mut() {
            m.in_order = false;
        }
        for n in &keep {
            if let Some(m) = self.members.get_mut(n) {
                m.in_order = true;
            }
        }
        self.order = keep;
        fastrand::shuffle(&mut self.order);
        self.next = 0;
    }

    /// The next member to probe: alive or suspect, never this server.
    pub(crate) fn next_probe(&mut self, now: Instant) -> Option<Target> {
        let mut checked = 0;
        loop {
            if checked > self.order.len() {
                return None;
            }
            if self.next >= self.order.len() {
                self.reshuffle(now);
                checked += 1;
                if self.order.is_empty() {
                    return None;
                }
                continue;
            }
            let name = self.order[self.next].clone();
            self.next += 1;
            match self.members.get(&name) {
                Some(m)
                    if name != self.rules.me
                        && !matches!(m.liveness, Liveness::Dead | Liveness::Left) =>
                {
                    return Some(Target {
                        to: socket_of(m),
                        addr_raw: m.addr_raw.clone(),
                        incarnation: m.incarnation,
                        suspect: m.liveness == Liveness::Suspect,
                        pmax: m.vsn[1],
                        name,
                    });
                }
                _ => checked += 1,
            }
        }
    }

    /// Up to `k` different members of the order that `keep` accepts,
    /// picked at random (at most 3 × the order's length tries).
    fn sample(&self, k: usize, keep: impl Fn(&str, &Member) -> bool) -> Vec<&Member> {
        let mut out: Vec<(&str, &Member)> = Vec::with_capacity(k);
        let len = self.order.len();
        if len == 0 {
            return Vec::new();
        }
        // Random picks as memberlist's kRandomNodes makes them (3n tries);
        // then a walk from a random place, so that k eligible members
        // always give k (the tries alone can miss one now and then).
        let start = fastrand::usize(..len);
        let picks = (0..3 * len)
            .map(|_| fastrand::usize(..len))
            .chain((0..len).map(|i| (start + i) % len));
        for i in picks {
            if out.len() >= k {
                break;
            }
            let name = &self.order[i];
            let Some(m) = self.members.get(name) else {
                continue;
            };
            if **name == *self.rules.me || !keep(name, m) || out.iter().any(|(n, _)| *n == &**name)
            {
                continue;
            }
            out.push((name, m));
        }
        out.into_iter().map(|(_, m)| m).collect()
    }

    /// Members to ask for an indirect probe of `target`: alive, other than
    /// it; with the highest protocol each speaks.
    pub(crate) fn indirect_peers(&self, k: usize, target: &str) -> Vec<(SocketAddr, u8)> {
        self.sample(k, |n, m| n != target && m.liveness == Liveness::Alive)
            .into_iter()
            .map(|m| (socket_of(m), m.vsn[1]))
            .collect()
    }

    /// Members to gossip to: alive, suspect, or dead not long ago.
    pub(crate) fn gossip_targets(&self, k: usize, now: Instant) -> Vec<SocketAddr> {
        let dead_for = self.rules.gossip_to_the_dead;
        self.sample(k, |_, m| match m.liveness {
            Liveness::Alive | Liveness::Suspect => true,
            Liveness::Dead => now.duration_since(m.changed) <= dead_for,
            Liveness::Left => false,
        })
        .into_iter()
        .map(socket_of)
        .collect()
    }

    /// A member to push-pull with: alive.
    pub(crate) fn push_pull_target(&self) -> Option<SocketAddr> {
        self.sample(1, |_, m| m.liveness == Liveness::Alive)
            .first()
            .map(|m| socket_of(m))
    }

    /// The push-pull message this server sends (type byte first): every
    /// member not forgotten, then serf's state.
    pub(crate) fn local_state(&self, join: bool, now: Instant) -> Vec<u8> {
        let nodes: Vec<NodeState<'_>> = self
            .members
            .iter()
            .filter(|(_, m)| !self.forgotten(m, now))
            .map(|(n, m)| NodeState {
                name: n,
                addr: &m.addr_raw,
                port: m.port,
                meta: &m.meta,
                incarnation: m.incarnation,
                state: m.liveness.wire(),
                vsn: &m.vsn,
            })
            .collect();
        let serf = SerfState {
            ltime: self.clock,
            status: self
                .members
                .iter()
                .map(|(n, m)| (&**n, m.status_ltime))
                .collect(),
            left: self
                .members
                .iter()
                .filter(|(_, m)| m.status == Status::Left)
                .map(|(n, _)| &**n)
                .collect(),
            event_ltime: self.event_clock,
            query_ltime: self.query_clock,
        };
        let mut user = Vec::with_capacity(1200 + 24 * self.members.len());
        encode_state(&serf, &self.events, &mut user);
        let mut out = Vec::with_capacity(user.len() + 160 * nodes.len() + 32);
        PushPull {
            join,
            nodes,
            user_state: &user,
        }
        .encode(&mut out);
        out
    }

    /// Until when [`Table::local_state`] stays what it is at `now` while
    /// the version stands still: the moment the first dead or left member
    /// it holds is forgotten (`None`: it holds none).
    pub(crate) fn local_state_until(&self, now: Instant) -> Option<Instant> {
        self.members
            .values()
            .filter(|m| matches!(m.liveness, Liveness::Dead | Liveness::Left))
            .filter(|m| !self.forgotten(m, now))
            .filter_map(|m| m.changed.checked_add(self.rules.gossip_to_the_dead))
            .min()
    }

    /// Every member as `/v1/agent/members` lists it.
    pub(crate) fn rows(&self) -> Vec<Row> {
        self.members
            .iter()
            .map(|(n, m)| Row {
                name: n.to_string(),
                addr: m.addr,
                port: m.port,
                meta: m.meta.clone(),
                status: m.status,
                vsn: m.vsn,
            })
            .collect()
    }

    /// One member as the reconcile needs it; `None` once it is gone.
    pub(crate) fn row(&self, name: &str) -> Option<Row> {
        let m = self.members.get(name)?;
        Some(Row {
            name: name.to_owned(),
            addr: m.addr,
            port: m.port,
            meta: m.meta.clone(),
            status: m.status,
            vsn: m.vsn,
        })
    }

    /// Members by state (this server included).
    pub(crate) fn census(&self) -> Census {
        let mut c = Census::default();
        for m in self.members.values() {
            match (m.status, m.liveness) {
                (Status::Alive, Liveness::Suspect) => c.suspect += 1,
                (Status::Alive, _) => c.alive += 1,
                (Status::Leaving, _) => c.leaving += 1,
                (Status::Left, _) => c.left += 1,
                (Status::Failed, _) => c.failed += 1,
            }
        }
        c
    }
}

/// A member as Consul's `/v1/agent/members` prints it (serf's `Member`:
/// status 1 alive, 2 leaving, 3 left, 4 failed; a suspect is alive).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct SerfMember {
    /// Its node name.
    pub name: String,
    /// Its gossip address.
    pub addr: IpAddr,
    /// Its gossip port.
    pub port: u16,
    /// Its serf tags.
    pub tags: std::collections::BTreeMap<String, String>,
    /// serf's status.
    pub status: u8,
    /// memberlist protocol versions it speaks: lowest,
    pub protocol_min: u8,
    /// highest,
    pub protocol_max: u8,
    /// and current;
    pub protocol_cur: u8,
    /// serf's (the delegate's) likewise.
    pub delegate_min: u8,
    /// Highest.
    pub delegate_max: u8,
    /// Current.
    pub delegate_cur: u8,
}

impl From<Row> for SerfMember {
    fn from(r: Row) -> Self {
        let tags = agent_sim_gossip::serf::decode_tags(&r.meta)
            .unwrap_or_default()
            .into_iter()
            .collect();
        let [pmin, pmax, pcur, dmin, dmax, dcur] = r.vsn;
        SerfMember {
            name: r.name,
            addr: r.addr,
            port: r.port,
            tags,
            status: r.status.code(),
            protocol_min: pmin,
            protocol_max: pmax,
            protocol_cur: pcur,
            delegate_min: dmin,
            delegate_max: dmax,
            delegate_cur: dcur,
        }
    }
}
