//! The one membership view every simulated member of a process shares:
//! the local members (the simulated agents), the remote ones (servers and
//! any other member the servers told of), serf's clock, and for each
//! server the broadcasts it still has to receive. Pure state: no sockets,
//! no clock reads (callers pass `now`).

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::time::Instant;

use super::news::{Desk, rpc_of};
use super::seen::Seen;
use super::suspicion::Suspicions;
use crate::broadcast::Queue;
use crate::coordinate::{Coord, Vivaldi};
use crate::serf::{self, SerfState, event};
use crate::wire::msgs::{Alive, NodeState, PushPull, Verdict, state};
use crate::wire::{ip_bytes, kind, socket_addr};

/// memberlist and serf versions a Consul 1.20 agent speaks: protocol min,
/// max, current; delegate (serf) min, max, current.
pub const VSN: [u8; 6] = [1, 5, 2, 2, 5, 4];
/// How long a member that left stays in this pool's push-pulls: a server
/// forgets a left node after memberlist's gossip-to-the-dead time (30 s on
/// a LAN); listed after that, it would come back as a new member.
pub const FORGOTTEN_AFTER: std::time::Duration = std::time::Duration::from_secs(25);
/// Broadcasts waiting for one server at most (serf's queue depth); the
/// most sent, oldest ones are dropped first.
pub const QUEUE_MAX: usize = 4096;

/// How a push-pull shows the members in their leave. serf marks a member
/// left only when its leave intent came before memberlist's leave (else
/// failed, then left), and a push-pull's memberlist part is merged first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shown {
    /// Every exchange but the closing's last: a member leaving or left is
    /// shown alive (memberlist ignores an alive no newer than the leave it
    /// has), its intent in serf's part; its leave travels as a gossiped
    /// dead message, after its intent. One that left [`FORGOTTEN_AFTER`]
    /// ago is no longer listed.
    Intents,
    /// The pool's closing, last: every one of them left.
    Leaves,
}

/// A simulated member's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Not yet joined (or its join failed).
    Joining,
    /// A member.
    Alive,
    /// Its leave intent is out; its leave (dead from itself) follows.
    Leaving(Instant),
    /// Gone: since when (`None`: it never joined).
    Left(Option<Instant>),
}

/// One simulated member.
#[derive(Debug)]
pub struct Local {
    /// Node name.
    pub name: Arc<str>,
    /// Node ID (the `id` tag; the catalog's node ID).
    pub id: Box<str>,
    /// Which of the pool's endpoints it advertises.
    pub endpoint: u16,
    /// Raised to refute a suspicion.
    pub incarnation: u32,
    /// Its serf status time (its join or leave intent).
    pub status_ltime: u64,
    /// Where it is in its life.
    pub phase: Phase,
    /// Its coordinate client.
    pub vivaldi: Vivaldi,
}

/// A member this process does not simulate.
#[derive(Debug, Clone)]
pub struct Remote {
    /// Node name.
    pub name: Arc<str>,
    /// Its gossip address.
    pub addr: SocketAddr,
    /// Its metadata (serf tags).
    pub meta: Vec<u8>,
    /// Its versions.
    pub vsn: [u8; 6],
    /// Its incarnation.
    pub incarnation: u32,
    /// memberlist state (`msgs::state`).
    pub state: u8,
    /// serf's status time.
    pub status_ltime: u64,
    /// A Consul server (`role=consul`): the members the model sends to.
    pub server: bool,
    /// Its coordinate, from its last ack.
    pub coord: Coord,
}

/// Where a name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Who {
    /// A simulated member's slot.
    Local(usize),
    /// A remote member's index.
    Remote(usize),
}

/// What the servers should hear of.
#[derive(Debug, Default)]
pub struct View {
    /// Simulated members by slot.
    pub locals: Vec<Local>,
    /// Other members.
    pub remotes: Vec<Remote>,
    /// Every name.
    pub names: HashMap<Arc<str>, Who>,
    /// serf's member clock.
    pub clock: u64,
    /// Broadcasts owed, by remote index of a server (keyed by the member
    /// an alive, suspect or dead is about: the newer replaces the older).
    pub queues: HashMap<usize, Queue<Arc<str>>>,
    /// Broadcasts dropped from a full queue.
    pub dropped: u64,
    /// Suspicions of a local member refuted.
    pub refuted: u64,
    /// The advertised address of each endpoint.
    pub endpoints: Vec<SocketAddr>,
    /// The tags every member shares, `id` apart.
    pub tags: Vec<(String, String)>,
    /// Simulated members alive.
    pub alive: usize,
    /// Members believed alive, as of the last [`View::refresh_size`].
    pub size: usize,
    /// The slot of each agent index (`Pool::add`'s).
    pub by_index: HashMap<u64, usize>,
    /// Members leaving quietly, for the next batch of push-pulls.
    pub quiet: Vec<usize>,
    /// Members whose leave intent is out, in the order they left.
    pub leaving: VecDeque<usize>,
    /// (member, server): the server has taken the member's leave intent
    /// (it gossiped it back), so the member's dead message may follow.
    pub intents_taken: HashSet<(usize, usize)>,
    /// What the agents hear of the servers, and the tally for counters.
    pub news: Desk,
    /// The servers suspected, each until refuted or dead.
    pub suspicions: Suspicions,
    /// serf's event and query clocks, and what was taken in.
    pub seen: Seen,
    /// `RetransmitMult`: the limit follows the pool's size at each send (0: each keeps its own).
    pub retransmit_mult: u32,
}

/// memberlist's `retransmitLimit`: `mult × ceil(log10(n + 1))` sends of
/// a broadcast for a member that knows `n` nodes, itself included.
pub fn retransmit_limit(mult: u32, n: u64) -> u64 {
    let scale = ((n.max(1) + 1) as f64).log10().ceil() as u64;
    u64::from(mult) * scale.max(1)
}

impl View {
    /// Counts the members believed alive (simulated and remote) into
    /// [`View::size`]; the ticker calls it, so messages need not walk the view.
    pub fn refresh_size(&mut self) {
        self.size = self.alive
            + self
                .remotes
                .iter()
                .filter(|r| r.state == state::ALIVE || r.state == state::SUSPECT)
                .count();
    }

    /// Remote indexes of servers not known to be dead or gone.
    pub fn live_servers(&self) -> Vec<usize> {
        (0..self.remotes.len())
            .filter(|&i| {
                let r = &self.remotes[i];
                r.server && (r.state == state::ALIVE || r.state == state::SUSPECT)
            })
            .collect()
    }

    /// memberlist's retransmit limit for the pool's size.
    pub fn retransmit_limit(&self, mult: u32) -> u8 {
        retransmit_limit(mult, self.size as u64).clamp(1, 255) as u8
    }

    /// The metadata of local member `slot` (serf's tags with its `id`).
    pub fn meta(&self, slot: usize) -> Vec<u8> {
        let l = &self.locals[slot];
        let mut tags: Vec<(&str, &str)> = self.tags.iter().map(|(k, v)| (&k[..], &v[..])).collect();
        tags.push(("id", &l.id));
        serf::encode_tags(&tags)
    }

    /// Adds a simulated member (phase `Joining`); returns its slot.
    /// A node of that name the servers still hold (an earlier run's, failed
    /// or left) is outrun: the member starts one incarnation above it, as
    /// a restarted agent refutes its old self, and the old entry is no
    /// longer this pool's to tell of.
    pub fn add_local(&mut self, name: &str, id: &str, endpoint: u16) -> usize {
        let name: Arc<str> = name.into();
        let slot = self.locals.len();
        // memberlist starts at 1: a server takes an alive at 0 as no newer
        // than the node it has just created, and drops it.
        let mut incarnation = 1;
        if let Some(Who::Remote(i)) = self.names.insert(name.clone(), Who::Local(slot)) {
            incarnation = self.remotes[i].incarnation + 1;
        }
        self.locals.push(Local {
            name,
            id: id.into(),
            endpoint,
            incarnation,
            status_ltime: 0,
            phase: Phase::Joining,
            vivaldi: Vivaldi::default(),
        });
        slot
    }

    /// `slot`'s alive message.
    pub fn alive_msg(&self, slot: usize) -> Vec<u8> {
        let l = &self.locals[slot];
        let ep = self.endpoints[usize::from(l.endpoint)];
        let (ip, meta) = (ip_bytes(ep.ip()), self.meta(slot));
        let mut out = Vec::with_capacity(64 + meta.len());
        Alive {
            incarnation: l.incarnation,
            node: &l.name,
            addr: &ip,
            port: ep.port(),
            meta: &meta,
            vsn: &VSN,
        }
        .encode(&mut out);
        out
    }

    /// Queues `msg` for every live server but those in `except` (the one
    /// that told us, the one it is about), replacing the one queued about
    /// the same member (`about`: memberlist's alive, suspect or dead).
    pub fn broadcast(
        &mut self,
        about: Option<&Arc<str>>,
        msg: Vec<u8>,
        limit: u8,
        except: &[Option<usize>],
    ) {
        let msg: Arc<[u8]> = msg.into();
        for s in self.live_servers() {
            if except.contains(&Some(s)) {
                continue;
            }
            let q = self
                .queues
                .entry(s)
                .or_insert_with(|| Queue::new(QUEUE_MAX));
            // Bound: QUEUE_MAX broadcasts per server, the most sent dropped.
            let dropped = q.push(about.cloned(), 0, msg.clone(), u32::from(limit));
            self.dropped += u64::from(dropped);
        }
    }

    /// Broadcasts for one packet to `server`, at most `room` bytes with
    /// compound overhead, the least-sent (then newest) first; each sent as
    /// often as the larger of its own limit and the pool's at this send.
    pub fn take_broadcasts(&mut self, server: usize, room: usize) -> Vec<Arc<[u8]>> {
        // memberlist takes the limit when it sends (the nodes it knows then):
        // one queued early in a join storm goes out as often as the grown pool's.
        let grown = match self.retransmit_mult {
            0 => 0,
            m => retransmit_limit(m, self.size as u64).min(u64::from(u32::MAX)) as u32,
        };
        match self.queues.get_mut(&server) {
            Some(q) => q.take(room, 2, grown),
            None => Vec::new(),
        }
    }

    /// Marks `slot` joined: alive, with its join intent's time.
    pub fn joined(&mut self, slot: usize, limit: u8) {
        self.clock += 1;
        let ltime = self.clock;
        let l = &mut self.locals[slot];
        l.phase = Phase::Alive;
        l.status_ltime = ltime;
        self.alive += 1;
        let name = l.name.clone();
        let alive = self.alive_msg(slot);
        self.broadcast(Some(&name), alive, limit, &[]);
        let mut intent = Vec::new();
        serf::intent(false, ltime, &name, &mut intent);
        self.broadcast(None, intent, limit, &[]);
    }

    /// Starts `slot`'s leave: its leave intent goes out first; the leave
    /// itself ([`View::leave_done`]) once the intent has had time to.
    pub fn leave(&mut self, slot: usize, limit: u8, now: Instant) {
        if self.locals[slot].phase != Phase::Alive {
            self.locals[slot].phase = Phase::Left(None);
            return;
        }
        self.intents_taken.retain(|&(m, _)| m != slot);
        self.clock += 1;
        let ltime = self.clock;
        let l = &mut self.locals[slot];
        l.status_ltime = ltime;
        l.phase = Phase::Leaving(now);
        self.alive -= 1;
        self.leaving.push_back(slot);
        let mut intent = Vec::new();
        serf::intent(true, ltime, &l.name.clone(), &mut intent);
        self.broadcast(None, intent, limit, &[]);
    }

    /// Starts `slot`'s leave without gossiping it: the next batch of
    /// push-pulls tells the servers ([`View::quiet`]).
    pub fn leave_quietly(&mut self, slot: usize, now: Instant) {
        if self.locals[slot].phase != Phase::Alive {
            return;
        }
        self.clock += 1;
        let l = &mut self.locals[slot];
        l.status_ltime = self.clock;
        l.phase = Phase::Leaving(now);
        self.alive -= 1;
        self.quiet.push(slot);
    }

    /// Whether every live server has taken `slot`'s leave intent (serf's
    /// leave waits for its intent's broadcast before memberlist's leave: a
    /// server whose handler is behind takes the newest message first, and
    /// a dead message handled before the intent makes the member failed).
    pub fn intent_taken(&self, slot: usize) -> bool {
        self.live_servers()
            .into_iter()
            .all(|s| self.intents_taken.contains(&(slot, s)))
    }

    /// Drops the servers' proofs of the members no longer leaving.
    pub fn forget_taken(&mut self) {
        let locals = &self.locals;
        self.intents_taken
            .retain(|&(m, _)| matches!(locals[m].phase, Phase::Leaving(_)));
    }

    /// The memberlist leave of `slot` (a dead message from itself).
    pub fn leave_done(&mut self, slot: usize, limit: u8) {
        self.intents_taken.retain(|&(m, _)| m != slot);
        let l = &mut self.locals[slot];
        l.phase = Phase::Left(Some(Instant::now()));
        let name = l.name.clone();
        let mut out = Vec::new();
        Verdict {
            incarnation: l.incarnation,
            node: &name,
            from: &name,
        }
        .encode(kind::DEAD, &mut out);
        self.broadcast(Some(&name), out, limit, &[]);
    }

    /// A suspicion or death of a local member from someone else: refuted
    /// with a higher incarnation, as a live member does.
    fn refute(&mut self, slot: usize, incarnation: u32, limit: u8) {
        let l = &mut self.locals[slot];
        if !matches!(l.phase, Phase::Alive | Phase::Leaving(_)) || incarnation < l.incarnation {
            return;
        }
        l.incarnation = incarnation + 1;
        self.refuted += 1;
        let name = l.name.clone();
        let alive = self.alive_msg(slot);
        self.broadcast(Some(&name), alive, limit, &[]);
    }

    /// Applies a remote member's alive (from a message or a push-pull);
    /// true when it was news (to be passed on).
    pub fn on_alive(&mut self, a: &Alive<'_>, from_server: Option<usize>, limit: u8) -> bool {
        let Some(addr) = socket_addr(a.addr, a.port) else {
            return false;
        };
        match self.names.get(a.node).copied() {
            Some(Who::Local(slot)) => {
                // Someone announces one of ours with a newer incarnation.
                if a.incarnation > self.locals[slot].incarnation {
                    self.refute(slot, a.incarnation, limit);
                }
                false
            }
            Some(Who::Remote(i)) => {
                let r = &mut self.remotes[i];
                let newer = a.incarnation > r.incarnation;
                // A server is alive again only by a higher incarnation
                // (memberlist's rule: a suspicion stands until refuted).
                let revived = a.incarnation == r.incarnation
                    && !r.server
                    && r.state != state::ALIVE
                    && r.state != state::LEFT;
                if !(newer || revived || r.state == state::LEFT && a.incarnation > r.incarnation) {
                    return false;
                }
                r.incarnation = a.incarnation;
                r.state = state::ALIVE;
                r.addr = addr;
                r.meta = a.meta.to_vec();
                if r.server {
                    self.server_up(i);
                }
                self.pass_on(a, &[from_server, Some(i)], limit);
                true
            }
            None => {
                let name: Arc<str> = a.node.into();
                let server = serf::decode_tags(a.meta)
                    .map(|t| t.iter().any(|(k, v)| k == "role" && v == "consul"))
                    .unwrap_or(false);
                let mut vsn = VSN;
                if a.vsn.len() == 6 {
                    vsn.copy_from_slice(a.vsn);
                }
                self.names
                    .insert(name.clone(), Who::Remote(self.remotes.len()));
                self.remotes.push(Remote {
                    name,
                    addr,
                    meta: a.meta.to_vec(),
                    vsn,
                    incarnation: a.incarnation,
                    state: state::ALIVE,
                    status_ltime: 0,
                    server,
                    coord: Coord::default(),
                });
                let i = self.remotes.len() - 1;
                if server {
                    self.server_up(i);
                }
                self.pass_on(a, &[from_server, Some(i)], limit);
                true
            }
        }
    }

    fn pass_on(&mut self, a: &Alive<'_>, except: &[Option<usize>], limit: u8) {
        let mut out = Vec::new();
        a.encode(&mut out);
        let name: Arc<str> = a.node.into();
        self.broadcast(Some(&name), out, limit, except);
    }

    /// Server `i` alive (first seen, refuted, back): no longer suspected,
    /// and news for the agents.
    fn server_up(&mut self, i: usize) {
        self.suspicions.end(i);
        let r = &self.remotes[i];
        let tags = serf::decode_tags(&r.meta).unwrap_or_default();
        self.news.up(i, rpc_of(r.addr, &tags));
    }

    /// Server `i` suspected by `from` (its suspicion starts), or failed or
    /// left (news for the agents).
    fn server_verdict(&mut self, i: usize, new: u8, from: &str) {
        if new == state::SUSPECT {
            self.suspicions.start(i, from, self.size, Instant::now());
            self.news.tally.suspected += 1;
            return;
        }
        self.suspicions.end(i);
        self.news.tally.failed += u64::from(new == state::DEAD);
        self.news.down(i);
    }

    /// The servers whose suspicion ran out are dead: member `me` says so
    /// (a `dead` from it, gossiped).
    pub fn fail_overdue(&mut self, now: Instant, me: &str, limit: u8) {
        for i in self.suspicions.overdue(now) {
            let r = &self.remotes[i];
            if r.state == state::SUSPECT {
                let (incarnation, node) = (r.incarnation, r.name.clone());
                let v = Verdict {
                    incarnation,
                    node: &node,
                    from: me,
                };
                self.on_verdict(kind::DEAD, &v, None, limit);
            }
        }
    }

    /// A user event (gossiped or in a push-pull): true when taken in, a
    /// new leader's news for the agents.
    pub fn take_event(&mut self, ltime: u64, name: &str, payload: &[u8]) -> bool {
        if !self.seen.event(ltime, name, payload) {
            return false;
        }
        self.news.tally.user_events += 1;
        if name == event::NEW_LEADER {
            self.news.new_leader();
        }
        true
    }

    /// Applies a suspect or dead message; true when it was news.
    pub fn on_verdict(&mut self, t: u8, v: &Verdict<'_>, from: Option<usize>, limit: u8) -> bool {
        match self.names.get(v.node).copied() {
            Some(Who::Local(slot)) => {
                // Its own leave, passed back by a server, is never refuted
                // (memberlist refutes nothing once it has left): an alive
                // would bring the member back, and its dead message after
                // that, with serf's status alive again, makes it failed.
                if !(t == kind::DEAD && v.from == v.node) {
                    self.refute(slot, v.incarnation, limit);
                }
                false
            }
            Some(Who::Remote(i)) => {
                let r = &mut self.remotes[i];
                if v.incarnation < r.incarnation || r.state == state::LEFT || r.state == state::DEAD
                {
                    return false;
                }
                let server = r.server;
                let new = match t {
                    kind::SUSPECT if r.state == state::ALIVE => state::SUSPECT,
                    kind::SUSPECT if !server || !self.suspicions.confirm(i, v.from) => {
                        return false;
                    }
                    kind::SUSPECT => state::SUSPECT,
                    kind::DEAD if v.node == v.from => state::LEFT,
                    kind::DEAD => state::DEAD,
                    _ => return false,
                };
                let r = &mut self.remotes[i];
                let fresh = r.state != new;
                r.state = new;
                r.incarnation = v.incarnation;
                let mut out = Vec::new();
                v.encode(t, &mut out);
                // A server hears its suspicion too, as gossip reaches a
                // suspect member: it refutes it if it is alive.
                let about = (t == kind::DEAD || !server).then_some(i);
                let name = r.name.clone();
                self.broadcast(Some(&name), out, limit, &[from, about]);
                if server && fresh {
                    self.server_verdict(i, new, v.from);
                }
                true
            }
            None => false,
        }
    }

    /// Applies a serf join or leave intent (both move the member's status
    /// time; memberlist's own messages carry the state); true when news.
    pub fn on_intent(
        &mut self,
        (leave, ltime): (bool, u64),
        node: &str,
        raw: &[u8],
        from: Option<usize>,
        limit: u8,
    ) -> bool {
        self.clock = self.clock.max(ltime);
        let i = match self.names.get(node).copied() {
            Some(Who::Remote(i)) => i,
            Some(Who::Local(slot)) => {
                // A server gossips an intent on only once it took it: our
                // leaving member's own, back from a server, is that proof.
                let l = &self.locals[slot];
                if let (true, Some(s), Phase::Leaving(_)) = (leave, from, l.phase)
                    && ltime == l.status_ltime
                {
                    self.intents_taken.insert((slot, s));
                }
                return false;
            }
            None => return false,
        };
        let r = &mut self.remotes[i];
        if ltime <= r.status_ltime {
            return false;
        }
        r.status_ltime = ltime;
        self.broadcast(None, raw.to_vec(), limit, &[from, Some(i)]);
        true
    }

    /// Merges a peer's push-pull: its members, and serf's clocks and left
    /// members.
    pub fn merge(&mut self, pp: &PushPull<'_>, from: Option<usize>, limit: u8) {
        for n in &pp.nodes {
            let a = Alive {
                incarnation: n.incarnation,
                node: n.name,
                addr: n.addr,
                port: n.port,
                meta: n.meta,
                vsn: n.vsn,
            };
            match n.state {
                state::ALIVE => {
                    self.on_alive(&a, from, limit);
                }
                s => {
                    if !self.names.contains_key(n.name) {
                        // Learn the member first, then its state.
                        self.on_alive(&a, from, limit);
                    }
                    let (t, by) = match s {
                        state::LEFT => (kind::DEAD, n.name),
                        state::DEAD => (kind::DEAD, ""),
                        _ => (kind::SUSPECT, ""),
                    };
                    self.on_verdict(
                        t,
                        &Verdict {
                            incarnation: n.incarnation,
                            node: n.name,
                            from: by,
                        },
                        from,
                        limit,
                    );
                }
            }
        }
        if let Ok(s) = SerfState::decode(pp.user_state) {
            self.clock = self.clock.max(s.ltime);
            self.seen.event_clock.witness_state(s.event_ltime);
            self.seen.query_clock.witness_state(s.query_ltime);
            for (ltime, evs) in event::state_events(pp.user_state).unwrap_or_default() {
                evs.iter()
                    .for_each(|(n, p)| _ = self.take_event(ltime, n, p));
            }
            for (name, t) in s.status {
                if let Some(Who::Remote(i)) = self.names.get(name).copied() {
                    let r = &mut self.remotes[i];
                    r.status_ltime = r.status_ltime.max(t);
                }
            }
        }
    }

    /// This process's whole state as a push-pull: every member, and serf's
    /// part, members in their leave shown as `shown` says.
    pub fn push_pull(&self, join: bool, shown_as: Shown) -> Vec<u8> {
        let mut metas: Vec<Vec<u8>> = Vec::with_capacity(self.locals.len());
        let mut ips: Vec<Vec<u8>> = Vec::with_capacity(self.endpoints.len());
        for e in &self.endpoints {
            ips.push(ip_bytes(e.ip()));
        }
        let mut shown = Vec::new();
        let now = Instant::now();
        for (slot, l) in self.locals.iter().enumerate() {
            let recent = match l.phase {
                Phase::Left(Some(at)) => now.saturating_duration_since(at) < FORGOTTEN_AFTER,
                _ => true,
            };
            let st = match l.phase {
                Phase::Joining | Phase::Left(None) => continue,
                // Gone long enough for the servers to have forgotten it:
                // listed at all, it would come back as a new member.
                Phase::Left(_) if !recent => continue,
                Phase::Alive => state::ALIVE,
                Phase::Leaving(_) | Phase::Left(_) if shown_as == Shown::Leaves => state::LEFT,
                Phase::Leaving(_) | Phase::Left(_) => state::ALIVE,
            };
            metas.push(self.meta(slot));
            shown.push((slot, st));
        }
        let remote_ips: Vec<Vec<u8>> = self.remotes.iter().map(|r| ip_bytes(r.addr.ip())).collect();
        let mut nodes: Vec<NodeState<'_>> = Vec::with_capacity(shown.len() + self.remotes.len());
        for ((slot, st), meta) in shown.iter().zip(&metas) {
            let l = &self.locals[*slot];
            let ep = self.endpoints[usize::from(l.endpoint)];
            nodes.push(NodeState {
                name: &l.name,
                addr: &ips[usize::from(l.endpoint)],
                port: ep.port(),
                meta,
                incarnation: l.incarnation,
                state: *st,
                vsn: &VSN,
            });
        }
        let shadowed = |r: &Remote| matches!(self.names.get(&r.name), Some(Who::Local(_)));
        for (r, ip) in self.remotes.iter().zip(&remote_ips) {
            if shadowed(r) {
                continue;
            }
            nodes.push(NodeState {
                name: &r.name,
                addr: ip,
                port: r.addr.port(),
                meta: &r.meta,
                incarnation: r.incarnation,
                state: r.state,
                vsn: &r.vsn,
            });
        }
        let mut status: Vec<(&str, u64)> = Vec::with_capacity(nodes.len());
        let mut left: Vec<&str> = Vec::new();
        for (slot, _) in &shown {
            let l = &self.locals[*slot];
            status.push((&l.name, l.status_ltime));
            if matches!(l.phase, Phase::Leaving(_) | Phase::Left(_)) {
                left.push(&l.name);
            }
        }
        for r in self.remotes.iter().filter(|r| !shadowed(r)) {
            status.push((&r.name, r.status_ltime));
            if r.state == state::LEFT {
                left.push(&r.name);
            }
        }
        let mut user = Vec::new();
        SerfState {
            ltime: self.clock,
            status,
            left,
            event_ltime: self.seen.event_clock.0,
            query_ltime: self.seen.query_clock.0,
        }
        .encode(&mut user);
        let mut out = Vec::with_capacity(nodes.len() * 200 + user.len());
        PushPull {
            join,
            nodes,
            user_state: &user,
        }
        .encode(&mut out);
        out
    }

    /// A joining member's push-pull: only itself, as a fresh agent knows
    /// no one else.
    pub fn join_push_pull(&self, slot: usize) -> Vec<u8> {
        let l = &self.locals[slot];
        let ep = self.endpoints[usize::from(l.endpoint)];
        let (ip, meta) = (ip_bytes(ep.ip()), self.meta(slot));
        let mut user = Vec::new();
        SerfState {
            ltime: self.clock,
            status: vec![(&l.name, self.clock)],
            left: Vec::new(),
            event_ltime: 0,
            query_ltime: 0,
        }
        .encode(&mut user);
        let mut out = Vec::new();
        PushPull {
            join: true,
            nodes: vec![NodeState {
                name: &l.name,
                addr: &ip,
                port: ep.port(),
                meta: &meta,
                incarnation: l.incarnation,
                state: state::ALIVE,
                vsn: &VSN,
            }],
            user_state: &user,
        }
        .encode(&mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::each_message;

    fn view() -> View {
        View {
            endpoints: vec!["127.0.0.1:7946".parse().unwrap()],
            tags: vec![("role".into(), "node".into()), ("dc".into(), "dc1".into())],
            ..View::default()
        }
    }

    fn server(v: &mut View, name: &str) -> usize {
        let meta = serf::encode_tags(&[("role", "consul"), ("dc", "dc1")]);
        let a = Alive {
            incarnation: 1,
            node: name,
            addr: &[127, 0, 0, 1],
            port: 8301,
            meta: &meta,
            vsn: &VSN,
        };
        assert!(v.on_alive(&a, None, 3));
        v.remotes.len() - 1
    }

    #[test]
    fn a_join_queues_alive_and_intent_for_each_server_limit_times() {
        let mut v = view();
        let s1 = server(&mut v, "s1");
        let s2 = server(&mut v, "s2");
        v.queues.clear();
        let a = v.add_local("agent-1", "id-1", 0);
        v.joined(a, 2);
        for s in [s1, s2] {
            let mut kinds = Vec::new();
            for _ in 0..3 {
                for m in v.take_broadcasts(s, 1400) {
                    each_message(&m, &mut |t, _| kinds.push(t)).unwrap();
                }
            }
            // Newest first among equal sends (memberlist's order): the
            // intent, queued after the alive, leads each packet.
            assert_eq!(
                kinds,
                vec![kind::USER, kind::ALIVE, kind::USER, kind::ALIVE]
            );
        }
    }

    #[test]
    fn a_suspicion_of_a_member_is_refuted_with_a_higher_incarnation() {
        let mut v = view();
        server(&mut v, "s1");
        let a = v.add_local("agent-1", "id-1", 0);
        v.joined(a, 1);
        v.on_verdict(
            kind::SUSPECT,
            &Verdict {
                incarnation: 1,
                node: "agent-1",
                from: "s1",
            },
            Some(0),
            1,
        );
        assert_eq!(v.locals[a].incarnation, 2);
        assert_eq!(v.refuted, 1);
        // The refuting alive replaced the join's queued alive (by name);
        // the intent stays.
        assert_eq!(v.queues[&0].len(), 2);
        // An old suspicion (of an incarnation already refuted) changes nothing.
        let old = Verdict {
            incarnation: 1,
            node: "agent-1",
            from: "s1",
        };
        v.on_verdict(kind::SUSPECT, &old, Some(0), 1);
        assert_eq!((v.locals[a].incarnation, v.refuted), (2, 1));
    }

    #[test]
    fn a_leave_is_taken_once_every_server_gossips_its_own_intent_back() {
        let mut v = view();
        let s1 = server(&mut v, "s1");
        let s2 = server(&mut v, "s2");
        let a = v.add_local("agent-1", "id-1", 0);
        v.joined(a, 1);
        v.leave(a, 1, Instant::now());
        let ltime = v.locals[a].status_ltime;
        let mut raw = vec![kind::USER];
        serf::intent(true, ltime, "agent-1", &mut raw);
        let queued = |v: &View| v.queues.values().map(Queue::len).sum::<usize>();
        let before = queued(&v);
        // An older intent, a join, or one from no server is no proof.
        v.on_intent((true, ltime - 1), "agent-1", &raw, Some(s1), 1);
        v.on_intent((false, ltime), "agent-1", &raw, Some(s1), 1);
        v.on_intent((true, ltime), "agent-1", &raw, None, 1);
        assert!(!v.intent_taken(a));
        v.on_intent((true, ltime), "agent-1", &raw, Some(s1), 1);
        assert!(!v.intent_taken(a), "s2 has not taken it yet");
        v.on_intent((true, ltime), "agent-1", &raw, Some(s2), 1);
        assert!(v.intent_taken(a));
        // Ours is not gossiped on as a remote member's would be.
        assert_eq!(queued(&v), before);
        v.leave_done(a, 1);
        assert!(v.intents_taken.is_empty());
    }

    #[test]
    fn a_leaving_member_refutes_a_server_s_verdict_but_not_its_own_leave() {
        let mut v = view();
        server(&mut v, "s1");
        let a = v.add_local("agent-1", "id-1", 0);
        v.joined(a, 1);
        v.leave(a, 1, Instant::now());
        let inc = v.locals[a].incarnation;
        let own = Verdict {
            incarnation: inc,
            node: "agent-1",
            from: "agent-1",
        };
        v.on_verdict(kind::DEAD, &own, Some(0), 1);
        assert_eq!((v.locals[a].incarnation, v.refuted), (inc, 0));
        let theirs = Verdict { from: "s1", ..own };
        v.on_verdict(kind::DEAD, &theirs, Some(0), 1);
        assert_eq!((v.locals[a].incarnation, v.refuted), (inc + 1, 1));
    }

    #[test]
    fn a_leave_sends_the_intent_before_the_dead_message() {
        let mut v = view();
        let s = server(&mut v, "s1");
        let a = v.add_local("agent-1", "id-1", 0);
        v.joined(a, 1);
        v.take_broadcasts(s, 1400);
        let kinds = |v: &mut View| {
            let mut kinds = Vec::new();
            for m in v.take_broadcasts(s, 1400) {
                each_message(&m, &mut |t, _| kinds.push(t)).unwrap();
            }
            kinds
        };
        v.leave(a, 1, Instant::now());
        // The pool sends the leave once the intent has had gossip rounds
        // to go (`tick::finish_leaves`): a newer dead queued beside it
        // would go first (newest first, as memberlist orders).
        assert_eq!(kinds(&mut v), vec![kind::USER]);
        v.leave_done(a, 1);
        assert_eq!(kinds(&mut v), vec![kind::DEAD]);
        assert!(matches!(v.locals[a].phase, Phase::Left(Some(_))));
    }

    #[test]
    fn a_push_pull_lists_every_member_and_reads_back() {
        let mut v = view();
        server(&mut v, "s1");
        for i in 0..3 {
            let a = v.add_local(&format!("agent-{i}"), "id", 0);
            v.joined(a, 1);
        }
        v.leave(2, 1, Instant::now());
        let b = v.push_pull(false, Shown::Intents);
        let pp = PushPull::decode(&b[1..]).unwrap();
        assert_eq!(pp.nodes.len(), 4);
        let s = SerfState::decode(pp.user_state).unwrap();
        assert_eq!(s.left, vec!["agent-2"]);
        let left = v.push_pull(false, Shown::Leaves);
        let pp = PushPull::decode(&left[1..]).unwrap();
        assert_eq!(
            pp.nodes.iter().find(|n| n.name == "agent-2").unwrap().state,
            state::LEFT
        );
        // Even once its leave went out, it is left only in the closing's
        // last push-pull: the others carry its intent, never a leave that
        // could overtake it.
        v.leave_done(2, 1);
        let state_of = |v: &View, shown| {
            let b = v.push_pull(false, shown);
            let pp = PushPull::decode(&b[1..]).unwrap();
            pp.nodes.iter().find(|n| n.name == "agent-2").unwrap().state
        };
        assert_eq!(state_of(&v, Shown::Intents), state::ALIVE);
        assert_eq!(state_of(&v, Shown::Leaves), state::LEFT);
    }

    #[test]
    fn a_broadcast_is_sent_as_often_as_the_pool_it_grew_into() {
        let mut v = view();
        v.retransmit_mult = 4;
        let s = server(&mut v, "s1");
        v.size = 5;
        let limit = v.retransmit_limit(4);
        assert_eq!(limit, 4);
        v.broadcast(None, vec![kind::USER, 1], limit, &[]);
        // A join storm: 150 members before it has gone out 4 times, and
        // memberlist takes the limit when it sends: 12.
        v.size = 150;
        let sends = (0..20)
            .filter(|_| !v.take_broadcasts(s, 1400).is_empty())
            .count();
        assert_eq!(sends, 12);
        // Without the pool's mult, a broadcast keeps its own limit.
        v.retransmit_mult = 0;
        v.broadcast(None, vec![kind::USER, 2], 4, &[]);
        let sends = (0..20)
            .filter(|_| !v.take_broadcasts(s, 1400).is_empty())
            .count();
        assert_eq!(sends, 4);
    }

    #[test]
    fn news_goes_out_before_the_tail_of_old_news() {
        let mut v = view();
        let s = server(&mut v, "s1");
        for i in 0..100u8 {
            v.broadcast(None, vec![kind::USER, i], 5, &[]);
        }
        // Every old one sent once: 20 packets of 5.
        for _ in 0..20 {
            assert_eq!(v.take_broadcasts(s, 20).len(), 5);
        }
        v.broadcast(None, vec![kind::USER, 200], 5, &[]);
        let first = v.take_broadcasts(s, 20);
        assert_eq!(&first[0][..], &[kind::USER, 200]);
    }

    #[test]
    fn a_member_named_as_an_old_node_starts_above_it() {
        let mut v = view();
        server(&mut v, "s1");
        let old = Alive {
            incarnation: 7,
            node: "agent-1",
            addr: &[127, 0, 0, 1],
            port: 7946,
            meta: &[],
            vsn: &VSN,
        };
        v.on_alive(&old, None, 1);
        let a = v.add_local("agent-1", "id-1", 0);
        assert_eq!(v.locals[a].incarnation, 8);
        v.joined(a, 1);
        let pp = v.push_pull(false, Shown::Intents);
        let pp = PushPull::decode(&pp[1..]).unwrap();
        let named: Vec<_> = pp.nodes.iter().filter(|n| n.name == "agent-1").collect();
        assert_eq!(named.len(), 1);
        assert_eq!(named[0].incarnation, 8);
    }

    #[tokio::test(start_paused = true)]
    async fn a_member_gone_long_enough_is_no_longer_listed() {
        let mut v = view();
        server(&mut v, "s1");
        let a = v.add_local("agent-1", "id-1", 0);
        v.joined(a, 1);
        v.leave(a, 1, Instant::now());
        v.leave_done(a, 1);
        let listed = |v: &View| {
            let b = v.push_pull(false, Shown::Intents);
            let pp = PushPull::decode(&b[1..]).unwrap();
            pp.nodes.iter().any(|n| n.name == "agent-1")
        };
        assert!(listed(&v));
        tokio::time::advance(FORGOTTEN_AFTER).await;
        assert!(!listed(&v));
    }

    #[test]
    fn queues_are_bounded() {
        let mut v = view();
        let s = server(&mut v, "s1");
        for _ in 0..QUEUE_MAX + 10 {
            v.broadcast(None, vec![kind::USER, 0], 3, &[]);
        }
        assert_eq!(v.queues[&s].len(), QUEUE_MAX);
        assert!(v.dropped >= 10);
    }
}
