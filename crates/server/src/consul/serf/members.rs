//! The server's view of the LAN pool: one entry per member holding both
//! layers, memberlist's liveness (alive, suspect, dead, left: incarnations,
//! suspicions, refutations) and serf's status on top of it (alive,
//! leaving, left, failed: Lamport times, join and leave intents), changed
//! by the rules memberlist 0.5 and serf 0.10 apply, so the pool ends where
//! a Consul 1.20 server's would:
//!
//! - an alive message with a higher incarnation (or about a member that
//!   was dead or left) makes it alive; a suspect or dead one with at least
//!   its incarnation makes it suspect (a timer: `suspicion`) or dead;
//!   about the server itself, both are refuted (alive, incarnation above);
//! - serf: a member memberlist declares dead is `failed`, or `left` when
//!   its leave intent came first (`leaving`); a leave intent for a failed
//!   member makes it `left`; intents about unknown members wait for them;
//! - Consul's merge rules: a member of another datacenter, or with this
//!   server's node ID under another name, is refused.
//! - serf's user events: one fired takes the event clock's time and moves
//!   it on; one heard is witnessed by the clock, kept in the event buffer
//!   (`event`) unless too old or seen, and passed on once.
//!
//! Each change queues what to gossip (`queue`), marks the members whose
//! catalog entry must follow (`reconcile`) and, when it changed the
//! push-pull state, moves the table's version (the state's encoding is
//! kept until then: `answer`). A peer's push-pull merged and the timers'
//! work (suspicions run out, members reaped) are in `merge`; selection for
//! probes, gossip and push-pulls, the push-pull state and the views in
//! `view`.
//!
//! What it is not: no sockets, no clock of its own (callers pass `now`).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use agent_sim_gossip::serf as serf_wire;
use agent_sim_gossip::serf::event::UserEvent;
use agent_sim_gossip::wire::msgs::{Alive, Verdict, state};
use agent_sim_gossip::wire::{ip_bytes, kind};
use tokio::time::Instant;

use super::awareness::Awareness;
use super::event::Events;
use super::queue::{Key, Queue};
use super::stats::SerfCounters;
use agent_sim_gossip::pool::suspicion::{Suspicion, min_timeout};

/// memberlist's view of a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Liveness {
    /// Answers probes.
    Alive,
    /// Missed a probe; failed unless it refutes in time.
    Suspect,
    /// Declared failed by someone else.
    Dead,
    /// Said it is dead itself: it left.
    Left,
}

impl Liveness {
    /// The push-pull state byte.
    pub(crate) fn wire(self) -> u8 {
        match self {
            Liveness::Alive => state::ALIVE,
            Liveness::Suspect => state::SUSPECT,
            Liveness::Dead => state::DEAD,
            Liveness::Left => state::LEFT,
        }
    }

    fn gone(self) -> bool {
        matches!(self, Liveness::Dead | Liveness::Left)
    }
}

/// serf's status of a member (`MemberStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// Alive (suspects too: serf does not see suspicion).
    Alive,
    /// Sent its leave intent, still alive.
    Leaving,
    /// Left.
    Left,
    /// Declared dead without leaving.
    Failed,
}

impl Status {
    /// The number `/v1/agent/members` prints.
    pub(crate) fn code(self) -> u8 {
        match self {
            Status::Alive => 1,
            Status::Leaving => 2,
            Status::Left => 3,
            Status::Failed => 4,
        }
    }
}

/// One member.
#[derive(Debug, Clone)]
pub(crate) struct Member {
    /// Its address as it sent it (4 or 16 bytes; compared as bytes, as
    /// memberlist does).
    pub(crate) addr_raw: Vec<u8>,
    /// The same address.
    pub(crate) addr: IpAddr,
    pub(crate) port: u16,
    /// serf's tags, encoded.
    pub(crate) meta: Vec<u8>,
    /// pmin, pmax, pcur, dmin, dmax, dcur.
    pub(crate) vsn: [u8; 6],
    pub(crate) incarnation: u32,
    pub(crate) liveness: Liveness,
    /// When `liveness` last changed.
    pub(crate) changed: Instant,
    pub(crate) status: Status,
    pub(crate) status_ltime: u64,
    /// When it became failed or left (serf reaps after a while).
    pub(crate) gone_at: Option<Instant>,
    pub(crate) suspicion: Option<Suspicion>,
    /// Listed in the probe order.
    pub(crate) in_order: bool,
}

/// The rules and bounds of the table (from [`super::SerfConfig`] and the
/// server's settings).
#[derive(Debug, Clone)]
pub(crate) struct Rules {
    /// This server's name.
    pub(crate) me: Arc<str>,
    /// Its datacenter (members of another one are refused).
    pub(crate) datacenter: String,
    /// Its node ID (another member claiming it is refused).
    pub(crate) node_id: String,
    pub(crate) probe_interval: Duration,
    pub(crate) suspicion_mult: u32,
    pub(crate) suspicion_max_mult: u32,
    pub(crate) retransmit_mult: u32,
    /// How long dead members stay in push-pulls and gossip.
    pub(crate) gossip_to_the_dead: Duration,
    /// How long left members stay listed (serf's tombstone timeout).
    pub(crate) reap_left: Duration,
    /// How long failed members stay listed (serf's reconnect timeout).
    pub(crate) reap_failed: Duration,
    /// Most members held.
    pub(crate) max_members: usize,
}

/// Why a message about a member was not taken (a counted cause).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Its address is neither 4 nor 16 bytes.
    BadAddress,
    /// Its protocol versions are missing or impossible.
    BadVersion,
    /// Its `dc` tag is not this server's datacenter.
    WrongDc,
    /// It claims a node ID another member (or this server) has.
    ConflictingId,
    /// The table holds `max_members`.
    Full,
    /// Another address for a member that is alive.
    AddressConflict,
}

impl Refused {
    /// The counter's cause.
    pub(crate) fn cause(self) -> &'static str {
        match self {
            Refused::BadAddress => "bad_address",
            Refused::BadVersion => "malformed",
            Refused::WrongDc => "wrong_dc",
            Refused::ConflictingId => "conflicting_id",
            Refused::Full => "too_many_members",
            Refused::AddressConflict => "address_conflict",
        }
    }
}

/// An intent about a member not (yet) known.
#[derive(Debug, Clone, Copy)]
pub(super) struct Intent {
    leave: bool,
    ltime: u64,
    pub(super) at: Instant,
}

/// Intents about unknown members kept at most (serf keeps them 5 min).
const MAX_INTENTS: usize = 4096;
/// How long such an intent is kept.
pub(super) const INTENT_TIMEOUT: Duration = Duration::from_secs(300);
/// Messages waiting to be gossiped at most.
const MAX_QUEUED: usize = 8192;

/// The table. Everything about the pool changes under its one lock.
#[derive(Debug)]
pub(crate) struct Table {
    pub(super) rules: Rules,
    // Bound: `max_members` members (a new one beyond is refused), MAX_INTENTS
    // intents about unknown members, MAX_QUEUED messages to gossip; the
    // probe order and the dirty set hold names of members.
    pub(super) members: HashMap<Arc<str>, Member>,
    /// Probe order (memberlist's shuffled node list).
    pub(super) order: Vec<Arc<str>>,
    pub(super) next: usize,
    /// serf's member, event and query clocks.
    pub(super) clock: u64,
    pub(super) event_clock: u64,
    pub(super) query_clock: u64,
    /// serf's event buffer.
    pub(super) events: Events,
    /// memberlist's health awareness of this server.
    pub(crate) awareness: Awareness,
    pub(super) intents: HashMap<Arc<str>, Intent>,
    /// What to gossip.
    pub(crate) queue: Queue,
    /// Members whose catalog entry must be reconciled.
    pub(super) dirty: HashSet<Arc<str>>,
    pub(super) counters: Arc<SerfCounters>,
    /// Moves on every change of what the push-pull state holds (a member
    /// added, removed or changed; a status time; serf's clocks), so an
    /// encoded answer is reused while it stands still (`answer`).
    pub(crate) version: u64,
    /// The version of the last change that was not a member's alive news
    /// (a join, a refresh): joins may share an answer encoded since
    /// (`answer`), other changes never hide behind one.
    pub(crate) settled: u64,
}

/// An IP from memberlist's bytes (an IPv4-mapped 16-byte one as IPv4).
pub(crate) fn ip_of(raw: &[u8]) -> Option<IpAddr> {
    match raw.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(raw).ok()?)),
        16 => {
            let v6 = std::net::Ipv6Addr::from(<[u8; 16]>::try_from(raw).ok()?);
            Some(v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4))
        }
        _ => None,
    }
}

/// The protocol versions this server speaks (Consul 1.20's memberlist and
/// serf).
pub(crate) const VSN: [u8; 6] = [1, 5, 2, 2, 5, 4];

impl Table {
    /// A table holding only this server (`meta`: its tags), alive at
    /// incarnation 1.
    pub(crate) fn new(rules: Rules, meta: Vec<u8>, counters: Arc<SerfCounters>) -> Self {
        let now = Instant::now();
        let ip = IpAddr::from([127, 0, 0, 1]);
        let me = Member {
            addr_raw: ip_bytes(ip),
            addr: ip,
            port: 8301,
            meta,
            vsn: VSN,
            incarnation: 1,
            liveness: Liveness::Alive,
            changed: now,
            status: Status::Alive,
            status_ltime: 1,
            gone_at: None,
            suspicion: None,
            in_order: false,
        };
        let mut members = HashMap::new();
        members.insert(rules.me.clone(), me);
        Table {
            rules,
            members,
            order: Vec::new(),
            next: 0,
            clock: 1,
            event_clock: 1,
            query_clock: 1,
            events: Events::default(),
            awareness: Awareness::default(),
            intents: HashMap::new(),
            queue: Queue::new(MAX_QUEUED),
            dirty: HashSet::new(),
            counters,
            version: 0,
            settled: 0,
        }
    }

    /// This server's entry.
    pub(crate) fn me(&self) -> &Member {
        self.members
            .get(&self.rules.me)
            .expect("the server is always a member")
    }

    fn me_mut(&mut self) -> &mut Member {
        self.members
            .get_mut(&self.rules.me)
            .expect("the server is always a member")
    }

    /// Where this server is reached and what it says about itself; a change
    /// raises its incarnation and is gossiped.
    pub(crate) fn set_me(&mut self, addr: IpAddr, port: u16, meta: Vec<u8>) {
        let m = self.me_mut();
        if m.addr == addr && m.port == port && m.meta == meta {
            return;
        }
        m.addr = addr;
        m.addr_raw = ip_bytes(addr);
        m.port = port;
        m.meta = meta;
        m.incarnation += 1;
        self.touch();
        self.gossip_me();
    }

    /// What the push-pull state holds changed.
    pub(super) fn touch(&mut self) {
        self.version = self.version.wrapping_add(1);
        self.settled = self.version;
    }

    /// A member's alive news (or serf's clock moving on with a join)
    /// changed the push-pull state.
    pub(super) fn touch_alive(&mut self) {
        self.version = self.version.wrapping_add(1);
    }

    /// Members held (this server included).
    pub(crate) fn len(&self) -> usize {
        self.members.len()
    }

    /// How many times a gossiped message is sent.
    pub(crate) fn retransmit_limit(&self) -> u32 {
        // memberlist's, as the simulated members compute it.
        let n = self.members.len() as u64;
        agent_sim_gossip::pool::view::retransmit_limit(self.rules.retransmit_mult, n) as u32
    }

    fn gossip_me(&mut self) {
        let me = self.me();
        let mut msg = Vec::with_capacity(64 + me.meta.len());
        Alive {
            incarnation: me.incarnation,
            node: &self.rules.me,
            addr: &me.addr_raw,
            port: me.port,
            meta: &me.meta,
            vsn: &me.vsn,
        }
        .encode(&mut msg);
        let key = Key::Member(self.rules.me.clone());
        self.queue.push(key, msg);
    }

    /// Answers an accusation of this server: an incarnation above it,
    /// gossiped; memberlist takes being accused as a sign of its own poor
    /// health (awareness up one).
    fn refute(&mut self, accused: u32) {
        let m = self.me_mut();
        m.incarnation = m.incarnation.max(accused).saturating_add(1);
        self.touch();
        self.counters.bump(&self.counters.refutations);
        self.awareness.apply(1);
        self.gossip_me();
    }

    /// This server serving again after a restart: an incarnation above
    /// any the pool may have declared dead, gossiped, as a real server's
    /// refutation of its own death has it (memberlist starts over and
    /// refutes once it hears of the death; the pool kept here saves it the
    /// wait).
    pub(crate) fn return_me(&mut self) {
        let m = self.me_mut();
        m.incarnation = m.incarnation.saturating_add(1);
        self.touch();
        self.gossip_me();
    }

    /// Consul's merge rules for one member (LAN, on a server).
    pub(super) fn check_merge(&self, name: &str, meta: &[u8]) -> Result<(), Refused> {
        let Ok(tags) = serf_wire::decode_tags(meta) else {
            return Ok(());
        };
        let tag = |k: &str| tags.iter().find(|(t, _)| t == k).map(|(_, v)| v.as_str());
        let id = tag("id").unwrap_or_default();
        if !id.is_empty() && id == self.rules.node_id && !name.eq_ignore_ascii_case(&self.rules.me)
        {
            return Err(Refused::ConflictingId);
        }
        if matches!(tag("role"), Some("node" | "consul"))
            && tag("dc").unwrap_or_default() != self.rules.datacenter
        {
            return Err(Refused::WrongDc);
        }
        Ok(())
    }

    /// memberlist's `aliveNode` with serf's join and update on top.
    pub(crate) fn alive(&mut self, a: &Alive<'_>, now: Instant) -> Result<(), Refused> {
        let is_me = a.node == &*self.rules.me;
        let vsn: [u8; 6] = a.vsn.try_into().map_err(|_| Refused::BadVersion)?;
        if vsn[0] == 0 || vsn[1] == 0 || vsn[0] > vsn[1] {
            return Err(Refused::BadVersion);
        }
        let addr = ip_of(a.addr).ok_or(Refused::BadAddress)?;
        if !is_me {
            self.check_merge(a.node, a.meta)?;
        }
        let forget = self.rules.gossip_to_the_dead;
        let mut fresh = false;
        let mut moved = false;
        match self.members.get(a.node) {
            None => {
                if self.members.len() >= self.rules.max_members {
                    return Err(Refused::Full);
                }
                fresh = true;
            }
            Some(m) => {
                let forgotten = m.liveness.gone() && now.duration_since(m.changed) > forget;
                if (m.addr_raw != a.addr || m.port != a.port) && !is_me {
                    // memberlist takes a new address for a member that left,
                    // or died long enough ago (Consul's reclaim time is the
                    // gossip-to-the-dead time, 30 s).
                    if !(m.liveness == Liveness::Left || forgotten) {
                        return Err(Refused::AddressConflict);
                    }
                    moved = true;
                }
                if a.incarnation <= m.incarnation && !is_me && !moved && !forgotten {
                    return Ok(());
                }
            }
        }
        if is_me {
            let me = self.me();
            if a.incarnation < me.incarnation
                || (a.incarnation == me.incarnation && a.meta == &me.meta[..] && vsn == me.vsn)
            {
                return Ok(());
            }
            self.refute(a.incarnation);
            self.counters.bump(&self.counters.msg_alive);
            return Ok(());
        }
        self.touch_alive();
        let mut msg = Vec::with_capacity(64 + a.meta.len());
        a.encode(&mut msg);
        let name: Arc<str> = match self.members.get_key_value(a.node) {
            Some((k, _)) => k.clone(),
            None => a.node.into(),
        };
        self.queue.push(Key::Member(name.clone()), msg);
        if fresh {
            self.insert(name.clone(), a, addr, vsn, now);
        }
        let m = self.members.get_mut(&name).expect("inserted above");
        let was = m.liveness;
        let meta_changed = m.meta != a.meta;
        m.suspicion = None;
        m.vsn = vsn;
        m.incarnation = a.incarnation;
        m.addr = addr;
        m.addr_raw = a.addr.to_vec();
        m.port = a.port;
        m.meta = a.meta.to_vec();
        if m.liveness != Liveness::Alive {
            m.liveness = Liveness::Alive;
            m.changed = now;
        }
        self.counters.bump(&self.counters.msg_alive);
        if fresh || was.gone() {
            self.serf_join(&name, fresh);
        } else if meta_changed {
            self.dirty.insert(name);
        }
        Ok(())
    }

    /// A new member (memberlist: dead until the alive message is applied;
    /// serf: alive, or as a waiting intent says).
    fn insert(&mut self, name: Arc<str>, a: &Alive<'_>, addr: IpAddr, vsn: [u8; 6], now: Instant) {
        let (mut status, mut status_ltime) = (Status::Alive, 0);
        if let Some(i) = self.intents.remove(&name) {
            status_ltime = i.ltime;
            if i.leave {
                status = Status::Leaving;
            }
        }
        self.members.insert(
            name.clone(),
            Member {
                addr_raw: a.addr.to_vec(),
                addr,
                port: a.port,
                meta: a.meta.to_vec(),
                vsn,
                incarnation: a.incarnation,
                liveness: Liveness::Dead,
                changed: now,
                status,
                status_ltime,
                gone_at: None,
                suspicion: None,
                in_order: false,
            },
        );
        self.place_in_order(name);
    }

    /// Puts a member at a random place of the probe order (memberlist
    /// swaps a newcomer with a random node).
    pub(super) fn place_in_order(&mut self, name: Arc<str>) {
        if let Some(m) = self.members.get_mut(&name) {
            if m.in_order {
                return;
            }
            m.in_order = true;
        }
        self.order.push(name);
        let last = self.order.len() - 1;
        let at = fastrand::usize(..self.order.len());
        self.order.swap(at, last);
    }

    /// serf's `handleNodeJoin`: the member is alive (again); a new one as
    /// a waiting intent says.
    fn serf_join(&mut self, name: &Arc<str>, fresh: bool) {
        let Some(m) = self.members.get_mut(name) else {
            return;
        };
        if !fresh {
            m.status = Status::Alive;
        }
        m.gone_at = None;
        self.counters.bump(&self.counters.joins);
        self.dirty.insert(name.clone());
        let name = name.clone();
        self.place_in_order(name);
    }

    /// memberlist's `suspectNode`.
    pub(crate) fn suspect(&mut self, v: &Verdict<'_>, now: Instant) {
        let n = self.members.len();
        let Some((name, m)) = self.members.get_key_value(v.node) else {
            return;
        };
        let name = name.clone();
        if v.incarnation < m.incarnation {
            return;
        }
        let mut msg = Vec::with_capacity(32 + v.node.len() + v.from.len());
        v.encode(kind::SUSPECT, &mut msg);
        let m = self.members.get_mut(&name).expect("found above");
        if let Some(s) = &mut m.suspicion {
            if s.confirm(v.from) {
                self.queue.push(Key::Member(name), msg);
            }
            return;
        }
        if m.liveness != Liveness::Alive {
            return;
        }
        if name == self.rules.me {
            self.refute(v.incarnation);
            return;
        }
        m.incarnation = v.incarnation;
        m.liveness = Liveness::Suspect;
        m.changed = now;
        // `touch`, with `m` still borrowed.
        self.version = self.version.wrapping_add(1);
        self.settled = self.version;
        let r = &self.rules;
        let k = r.suspicion_mult.saturating_sub(2);
        let k = if n.saturating_sub(2) < k as usize {
            0
        } else {
            k
        };
        let min = min_timeout(r.suspicion_mult, n, r.probe_interval);
        let max = min * r.suspicion_max_mult;
        m.suspicion = Some(Suspicion::new(v.from, k, min, max, now));
        self.counters.bump(&self.counters.suspicions);
        self.queue.push(Key::Member(name), msg);
    }

    /// memberlist's `deadNode` with serf's `handleNodeLeave` on top.
    pub(crate) fn dead(&mut self, v: &Verdict<'_>, now: Instant) {
        let Some((name, m)) = self.members.get_key_value(v.node) else {
            return;
        };
        let name = name.clone();
        if v.incarnation < m.incarnation {
            return;
        }
        let m = self.members.get_mut(&name).expect("found above");
        m.suspicion = None;
        if m.liveness.gone() {
            return;
        }
        if name == self.rules.me {
            self.refute(v.incarnation);
            return;
        }
        m.incarnation = v.incarnation;
        m.liveness = if v.from == v.node {
            Liveness::Left
        } else {
            Liveness::Dead
        };
        m.changed = now;
        // `touch`, with `m` still borrowed.
        self.version = self.version.wrapping_add(1);
        self.settled = self.version;
        self.counters.bump(&self.counters.msg_dead);
        match m.status {
            Status::Leaving => {
                m.status = Status::Left;
                m.gone_at = Some(now);
                self.counters.bump(&self.counters.leaves);
                self.counters.bump(&self.counters.member_left);
            }
            Status::Alive => {
                m.status = Status::Failed;
                m.gone_at = Some(now);
                self.counters.bump(&self.counters.failures);
            }
            Status::Left | Status::Failed => {}
        }
        let mut msg = Vec::with_capacity(32 + v.node.len() + v.from.len());
        v.encode(kind::DEAD, &mut msg);
        self.queue.push(Key::Member(name.clone()), msg);
        self.dirty.insert(name);
    }

    /// serf's Lamport `Witness`: the clock past `t`; `true` when it moved.
    pub(super) fn witness(clock: &mut u64, t: u64) -> bool {
        if t >= *clock {
            *clock = t + 1;
            return true;
        }
        false
    }

    /// serf's join or leave intent (`handleNodeJoinIntent`,
    /// `handleNodeLeaveIntent`): `true` when it changed something and is
    /// worth passing on. A gossiped one is queued again here.
    pub(crate) fn intent(&mut self, leave: bool, ltime: u64, node: &str, now: Instant) -> bool {
        let fresh = self.apply_intent(leave, ltime, node, now);
        if fresh {
            let mut msg = Vec::with_capacity(32 + node.len());
            serf_wire::intent(leave, ltime, node, &mut msg);
            self.queue.push(Key::Intent(node.into()), msg);
        }
        fresh
    }

    pub(super) fn apply_intent(
        &mut self,
        leave: bool,
        ltime: u64,
        node: &str,
        now: Instant,
    ) -> bool {
        if Self::witness(&mut self.clock, ltime) {
            // serf's clock moving on is news of the same kind as a join.
            self.touch_alive();
        }
        let Some((name, m)) = self.members.get_key_value(node) else {
            return self.wait_intent(leave, ltime, node, now);
        };
        let name = name.clone();
        if ltime <= m.status_ltime {
            return false;
        }
        if leave && name == self.rules.me {
            // serf refutes an old leave intent of its own with a join one.
            let mut msg = Vec::with_capacity(32 + node.len());
            serf_wire::intent(false, self.clock, node, &mut msg);
            self.queue.push(Key::Intent(name), msg);
            return false;
        }
        let m = self.members.get_mut(&name).expect("found above");
        m.status_ltime = ltime;
        // `touch` (`touch_alive` for a join intent), with `m` still borrowed.
        self.version = self.version.wrapping_add(1);
        if leave {
            self.settled = self.version;
        }
        if !leave {
            if m.status == Status::Leaving {
                m.status = Status::Alive;
            }
            return true;
        }
        match m.status {
            Status::Alive => m.status = Status::Leaving,
            Status::Failed => {
                m.status = Status::Left;
                m.gone_at = Some(now);
                self.counters.bump(&self.counters.leaves);
                self.dirty.insert(name);
            }
            Status::Leaving | Status::Left => {}
        }
        true
    }

    /// Keeps an intent about an unknown member for when it joins.
    fn wait_intent(&mut self, leave: bool, ltime: u64, node: &str, now: Instant) -> bool {
        if let Some(i) = self.intents.get_mut(node) {
            if ltime <= i.ltime {
                return false;
            }
            *i = Intent {
                leave,
                ltime,
                at: now,
            };
            return true;
        }
        if self.intents.len() >= MAX_INTENTS {
            return false;
        }
        self.intents.insert(
            node.into(),
            Intent {
                leave,
                ltime,
                at: now,
            },
        );
        true
    }

    /// serf's `UserEvent`: `name` with `payload` at the event clock's time,
    /// the clock moved on, taken here and queued for gossip.
    pub(crate) fn fire_event(&mut self, name: &str, payload: &[u8]) {
        let ev = UserEvent {
            ltime: self.event_clock,
            name,
            payload,
            cc: false,
        };
        let mut msg = Vec::with_capacity(32 + name.len() + payload.len());
        ev.encode(&mut msg);
        self.event_clock += 1;
        self.touch();
        self.take_event(&ev);
        self.queue.push(Key::Event, msg);
    }

    /// serf's `handleUserEvent`: the clock witnesses it; `true` when it is
    /// new (kept and counted).
    pub(crate) fn take_event(&mut self, ev: &UserEvent<'_>) -> bool {
        if Self::witness(&mut self.event_clock, ev.ltime) {
            self.touch();
        }
        if !self.events.take(self.event_clock, ev) {
            return false;
        }
        self.touch();
        self.counters.event(ev.name);
        true
    }

    /// A user event heard in gossip (`body`: the user message's body, as
    /// heard): taken, and passed on when it was new.
    pub(crate) fn heard_event(&mut self, ev: &UserEvent<'_>, body: &[u8]) {
        if self.take_event(ev) {
            let mut msg = Vec::with_capacity(1 + body.len());
            msg.push(kind::USER);
            msg.extend_from_slice(body);
            self.queue.push(Key::Event, msg);
        }
    }
}
