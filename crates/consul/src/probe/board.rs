//! The board shared by the probe runner (or observer) and every agent of
//! the process: what the armed probe expects, and the arrivals.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use agent_sim_metrics::ProbeSummary;
use agent_sim_metrics::summary::ROLE_OBSERVER;
use agent_sim_metrics::units::unix_us;
use tokio::time::Instant;

use crate::codec::instance_key;
use crate::config::ProbeKind;
use crate::http::{self, PROBE_SOURCE};
use crate::view::{Change, View, source_key};

use super::Expect;
use super::stats::{micros_after, summarize};

#[derive(Debug, Default)]
struct Arrivals {
    id: u64,
    /// Controller: the last probe armed; observer: the number of changes
    /// opened (0: none yet). It only grows, so a subscription that came live
    /// under mark `m` was live when every probe (change) `> m` began.
    epoch: u64,
    /// Arrival instant and raft index of the event (0: arrived by a re-sync
    /// snapshot, index unknown).
    at: Vec<(Instant, u64)>,
    /// The same at the proxies behind the agents: the hand-off to each
    /// proxy's xDS stream, and the raft index of its agent's arrival.
    proxied: Vec<(Instant, u64)>,
    /// Proxies the armed probe expects: behind the live subscriptions.
    proxied_expected: u64,
}

/// Arrivals of one change seen by an observer, keyed by raft index.
#[derive(Debug)]
struct Group {
    kind: Expect,
    /// The board's epoch this change opened (see [`ProbeBoard::expects`]).
    seq: u64,
    /// Probe subscriptions live when the change first arrived here.
    expected: u64,
    at: Vec<Instant>,
    /// (monotonic, wall clock) read together when the group was opened.
    anchor: (Instant, SystemTime),
}

impl Group {
    /// The observer's summary of change `raft_index`: latencies after this
    /// process's first arrival, whose wall-clock time is derived from the
    /// group's anchor (one monotonic clock inside the process, one
    /// wall-clock reading).
    fn summary(self, raft_index: u64, timeout: Duration) -> ProbeSummary {
        let first = self.at.iter().copied().min().unwrap_or(self.anchor.0);
        let lat: Vec<u64> = self.at.iter().map(|&a| micros_after(first, a)).collect();
        let timeout_us = u64::try_from(timeout.as_micros()).unwrap_or(u64::MAX);
        let (anchor, anchor_wall) = self.anchor;
        let first_wall = if first >= anchor {
            anchor_wall + (first - anchor)
        } else {
            anchor_wall
                .checked_sub(anchor - first)
                .unwrap_or(SystemTime::UNIX_EPOCH)
        };
        let kind = self.kind.kind_name();
        let mut s = summarize(0, kind, first_wall, self.expected, lat, timeout_us);
        // No T0 is known here: the controller's entry has it.
        s.t0 = String::new();
        s.change_id = Some(raft_index);
        s.role = Some(ROLE_OBSERVER.into());
        s.first_arrival_unix_us = Some(unix_us(first_wall));
        s
    }
}

/// Most changes an observer keeps open at once: one probe per
/// `--probe-every` (≥ 1 s) inside a 10 s window needs ≤ 10; a server sending
/// ever new raft indexes on the probe service is not measured beyond it.
pub const MAX_OPEN_CHANGES: usize = 64;
/// Most changes an observer summarizes over a run (a probe every second for
/// 18 hours); later ones are not measured.
pub const MAX_OBSERVED_CHANGES: usize = 65_536;

/// What an observer board collects.
#[derive(Debug, Default)]
struct Observed {
    // Bound: MAX_OPEN_CHANGES groups, each with at most one arrival per live
    // probe subscription; MAX_OBSERVED_CHANGES summaries.
    open: BTreeMap<u64, Group>,
    done: Vec<ProbeSummary>,
    /// Groups still inside their window with missing deliveries when the
    /// board closed.
    interrupted: u64,
    closed: bool,
}

/// The probes that counted a subscription among their expected ones and
/// were still open when it went down: those in `(after, upto]` (controller:
/// probe ids; observer: changes in the order they opened). Its arrival for
/// them still counts, typically by the re-sync after it is back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Owed {
    after: u64,
    upto: u64,
}

impl Owed {
    fn covers(&self, id: u64) -> bool {
        self.after < id && id <= self.upto
    }
}

/// Shared between the runner (or observer) and every agent of the process.
#[derive(Debug)]
pub struct ProbeBoard {
    pub(super) kind: ProbeKind,
    pub(super) service: String,
    target: u64,
    armed: AtomicU64,
    expect: AtomicU8,
    live: AtomicI64,
    arrivals: Mutex<Arrivals>,
    /// `Some` in observe mode (this process is not the controller), with the
    /// delivery window.
    observer: Option<(Mutex<Observed>, Duration)>,
    /// Proxies behind each agent that also time the probe (0: none).
    proxies: u64,
}

impl ProbeBoard {
    /// A controller's board for probes of `kind` on `service`; `prefix`
    /// names the controller's probe instance.
    pub fn new(kind: ProbeKind, service: &str, prefix: &str) -> Self {
        let target = match kind {
            ProbeKind::Catalog => {
                instance_key(&http::probe_node(prefix), &http::probe_instance_id(prefix))
            }
            ProbeKind::Intentions => source_key(PROBE_SOURCE),
            // The board's "service" is the probe key.
            ProbeKind::Kv => source_key(service),
        };
        ProbeBoard {
            kind,
            service: service.to_owned(),
            target,
            armed: AtomicU64::new(0),
            expect: AtomicU8::new(0),
            live: AtomicI64::new(0),
            arrivals: Mutex::new(Arrivals::default()),
            observer: None,
            proxies: 0,
        }
    }

    /// This controller's board also times the probe at the `per_agent`
    /// proxies behind every agent ([`ProbeBoard::arrive_proxied`]).
    pub fn with_proxies(mut self, per_agent: u32) -> Self {
        self.proxies = u64::from(per_agent);
        self
    }

    /// An observer's board: the same probe instance (derived from the same
    /// `prefix`, as every shard of a run shares it), no arming; arrivals
    /// later than `timeout` after this process's first arrival of a change
    /// count as missing.
    pub fn new_observer(kind: ProbeKind, service: &str, prefix: &str, timeout: Duration) -> Self {
        ProbeBoard {
            observer: Some((Mutex::new(Observed::default()), timeout)),
            ..ProbeBoard::new(kind, service, prefix)
        }
    }

    /// Whether this board observes (the process is not the controller).
    pub fn is_observer(&self) -> bool {
        self.observer.is_some()
    }

    /// Probe kind.
    pub fn kind(&self) -> ProbeKind {
        self.kind
    }

    /// The probed service.
    pub fn service(&self) -> &str {
        &self.service
    }

    /// Key of the probe instance (catalog) or probe source (intentions).
    pub fn target(&self) -> u64 {
        self.target
    }

    /// An agent's probe subscription went live; returns its mark (the last
    /// probe armed before, 0 none), which [`ProbeBoard::expects`] and
    /// [`ProbeBoard::sub_down`] take.
    pub fn sub_up(&self) -> u64 {
        // Under the arrivals' lock, so that a probe's expected count and
        // the marks agree on which subscriptions were live when it was armed.
        let a = self.arrivals.lock().unwrap_or_else(|p| p.into_inner());
        self.live.fetch_add(1, Ordering::Relaxed);
        a.epoch
    }

    /// An agent's probe subscription, live since `mark`, stopped: `owed`
    /// (the agent's, kept across its sessions) takes the probes that were
    /// counting on it.
    pub fn sub_down(&self, mark: u64, owed: &mut Owed) {
        let a = self.arrivals.lock().unwrap_or_else(|p| p.into_inner());
        self.live.fetch_sub(1, Ordering::Relaxed);
        if mark == owed.upto {
            // Back up and down again with no probe begun in between: the
            // probes it owed before still wait.
            owed.upto = a.epoch;
        } else {
            *owed = Owed {
                after: mark,
                upto: a.epoch,
            };
        }
    }

    /// Whether probe (observer: change) `id` expects an arrival from a
    /// subscription live since `mark` (`None`: not live now) whose agent
    /// owes `owed`: it was live when that probe began. One that came live
    /// later is in neither the probe's expected nor its delivered count:
    /// the change reached it in its snapshot, not by propagation.
    pub fn expects(mark: Option<u64>, owed: Owed, id: u64) -> bool {
        mark.is_some_and(|m| m < id) || owed.covers(id)
    }

    /// Agents whose probe subscription is live now.
    pub fn live(&self) -> u64 {
        self.live.load(Ordering::Relaxed).max(0) as u64
    }

    /// The armed probe, if any.
    pub fn armed(&self) -> Option<(u64, Expect)> {
        let id = self.armed.load(Ordering::Acquire);
        if id == 0 {
            return None;
        }
        Expect::from_u8(self.expect.load(Ordering::Acquire)).map(|e| (id, e))
    }

    /// Arms probe `id` (> 0, greater than every probe armed before):
    /// arrivals from now on count for it. Returns how many arrivals it
    /// expects: the probe subscriptions live now.
    pub fn arm(&self, id: u64, expect: Expect) -> u64 {
        let expected = {
            let mut a = self.arrivals.lock().unwrap_or_else(|p| p.into_inner());
            let live = self.live();
            a.id = id;
            a.epoch = id;
            a.at = Vec::with_capacity(live as usize);
            a.proxied = Vec::new();
            a.proxied_expected = live * self.proxies;
            live
        };
        self.expect.store(expect as u8, Ordering::Release);
        self.armed.store(id, Ordering::Release);
        expected
    }

    /// Disarms and returns the arrivals of the armed probe (instant, raft
    /// index or 0).
    pub fn disarm(&self) -> Vec<(Instant, u64)> {
        self.armed.store(0, Ordering::Release);
        let mut a = self.arrivals.lock().unwrap_or_else(|p| p.into_inner());
        a.id = 0;
        std::mem::take(&mut a.at)
    }

    /// Records an arrival for probe `id` with the raft index of its event
    /// (0 when it came by a re-sync snapshot); false if that probe is no
    /// longer armed.
    pub fn arrive(&self, id: u64, at: Instant, index: u64) -> bool {
        let mut a = self.arrivals.lock().unwrap_or_else(|p| p.into_inner());
        if a.id != id {
            return false;
        }
        a.at.push((at, index));
        true
    }

    /// The proxies behind an agent whose arrival for probe `id` (raft
    /// `index`, or 0) was recorded get it at the instants `handed`; false if
    /// that probe is no longer armed.
    pub fn arrive_proxied(&self, id: u64, index: u64, handed: &[Instant]) -> bool {
        let mut a = self.arrivals.lock().unwrap_or_else(|p| p.into_inner());
        if a.id != id {
            return false;
        }
        a.proxied.extend(handed.iter().map(|&h| (h, index)));
        true
    }

    /// After [`ProbeBoard::disarm`]: the disarmed probe's expected count
    /// and arrivals at the proxies, when this board times them.
    pub fn take_proxied(&self) -> Option<(u64, Vec<(Instant, u64)>)> {
        if self.proxies == 0 {
            return None;
        }
        let mut a = self.arrivals.lock().unwrap_or_else(|p| p.into_inner());
        Some((a.proxied_expected, std::mem::take(&mut a.proxied)))
    }

    /// Observe mode: the outcome of `change` (a change on the probe
    /// subscription) if it is a live change of the probe instance / source.
    pub fn observes(&self, change: &Change) -> Option<Expect> {
        self.observer.as_ref()?;
        match *change {
            Change::Register {
                key,
                snapshot: false,
            } if key == self.target => Some(Expect::Register),
            Change::Deregister { key } if key == self.target => Some(Expect::Deregister),
            Change::Intention {
                source,
                allow: Some(a),
                snapshot: false,
            } if source == self.target => Some(if a { Expect::Allow } else { Expect::Deny }),
            _ => None,
        }
    }

    /// The state of the probe instance / source in `view`, as the outcome of
    /// the change that led there (`None`: no intention for the source).
    pub fn state(&self, view: &View) -> Option<Expect> {
        match self.kind {
            ProbeKind::Catalog => Some(if view.instance(self.target).is_some() {
                Expect::Register
            } else {
                Expect::Deregister
            }),
            ProbeKind::Intentions => view
                .intention(self.target)
                .map(|a| if a { Expect::Allow } else { Expect::Deny }),
            // No view holds KV.
            ProbeKind::Kv => None,
        }
    }

    /// Observe mode: an agent's view received the change of raft `index`
    /// with outcome `kind` at `at`; its subscription stands as `standing`
    /// (its mark, what its agent owes). False when not observing or closed,
    /// when the change's window here is over (a missing delivery), or when
    /// the subscription came live after the change opened here.
    pub fn observe(
        &self,
        index: u64,
        kind: Expect,
        at: Instant,
        standing: (Option<u64>, Owed),
    ) -> bool {
        let Some((obs, timeout)) = &self.observer else {
            return false;
        };
        let mut o = obs.lock().unwrap_or_else(|p| p.into_inner());
        if o.closed {
            return false;
        }
        let now = Instant::now();
        if !o.open.contains_key(&index) {
            if o.done.iter().any(|d| d.change_id == Some(index)) {
                // Its window is over and summarized: a missing delivery.
                return false;
            }
            if o.open.len() >= MAX_OPEN_CHANGES || o.done.len() >= MAX_OBSERVED_CHANGES {
                return false;
            }
            // A new change: the windows of earlier ones are over by now,
            // unless changes come faster than the timeout.
            let over: Vec<u64> = o
                .open
                .iter()
                .filter(|(_, g)| g.anchor.0 + *timeout <= now)
                .map(|(&i, _)| i)
                .collect();
            for i in over {
                if let Some(g) = o.open.remove(&i) {
                    o.done.push(g.summary(i, *timeout));
                }
            }
            // The subscriptions live now are the change's expected ones.
            let (seq, expected) = {
                let mut a = self.arrivals.lock().unwrap_or_else(|p| p.into_inner());
                a.epoch += 1;
                (a.epoch, self.live())
            };
            o.open.insert(
                index,
                Group {
                    kind,
                    seq,
                    expected,
                    at: Vec::with_capacity(expected as usize),
                    anchor: (now, SystemTime::now()),
                },
            );
        }
        let g = o.open.get_mut(&index).expect("inserted above");
        if g.kind != kind || !Self::expects(standing.0, standing.1, g.seq) {
            // Not the same change (cannot happen with one raft index), or
            // not one of its expected subscriptions.
            return false;
        }
        g.at.push(at);
        true
    }

    /// Observe mode: a re-synced view (complete snapshot after a reset) is
    /// in state `kind`, unlike before the reset: the change arrived by the
    /// snapshot. It is credited to the open change of that outcome with the
    /// greatest raft index in `(after, upto]` (`after`: last index this
    /// subscription recorded; `upto`: the snapshot's index) if it expected
    /// this subscription (`owed`, see [`ProbeBoard::sub_down`]); with none,
    /// it is not counted (a missing delivery here).
    pub fn observe_resync(
        &self,
        (after, upto): (u64, u64),
        kind: Expect,
        at: Instant,
        owed: Owed,
    ) -> bool {
        let Some((obs, _)) = &self.observer else {
            return false;
        };
        let mut o = obs.lock().unwrap_or_else(|p| p.into_inner());
        if o.closed {
            return false;
        }
        match o
            .open
            .range_mut(after.saturating_add(1)..=upto)
            .rev()
            .find(|(_, g)| g.kind == kind)
        {
            Some((_, g)) if Self::expects(None, owed, g.seq) => {
                g.at.push(at);
                true
            }
            _ => false,
        }
    }

    /// Observe mode: stops accepting arrivals and returns every observed
    /// change, in raft-index order. A change still inside its window with
    /// missing deliveries is left out and counted (like the controller's
    /// interrupted probe); the count is returned too.
    pub fn close_observer(&self) -> (Vec<ProbeSummary>, u64) {
        let Some((obs, timeout)) = &self.observer else {
            return (Vec::new(), 0);
        };
        let mut o = obs.lock().unwrap_or_else(|p| p.into_inner());
        o.closed = true;
        let now = Instant::now();
        for (i, g) in std::mem::take(&mut o.open) {
            if g.anchor.0 + *timeout > now && (g.at.len() as u64) < g.expected {
                o.interrupted += 1;
                continue;
            }
            o.done.push(g.summary(i, *timeout));
        }
        let mut done = std::mem::take(&mut o.done);
        done.sort_by_key(|d| d.change_id);
        (done, std::mem::take(&mut o.interrupted))
    }

    /// The armed probe id if `change` (a live change on the probe
    /// subscription) is the one it expects.
    pub fn matches(&self, change: &Change) -> Option<u64> {
        let (id, expect) = self.armed()?;
        let hit = match (*change, expect) {
            (
                Change::Register {
                    key,
                    snapshot: false,
                },
                Expect::Register,
            ) => key == self.target,
            (Change::Deregister { key }, Expect::Deregister) => key == self.target,
            (
                Change::Intention {
                    source,
                    allow: Some(a),
                    snapshot: false,
                },
                Expect::Allow | Expect::Deny,
            ) => source == self.target && a == (expect == Expect::Allow),
            _ => false,
        };
        hit.then_some(id)
    }

    /// The armed probe id if a freshly re-synced `view` (complete snapshot
    /// after a reset) is in the expected state.
    pub fn matches_state(&self, view: &View) -> Option<u64> {
        let (id, expect) = self.armed()?;
        let hit = match expect {
            Expect::Register => view.instance(self.target).is_some(),
            Expect::Deregister => view.instance(self.target).is_none(),
            Expect::Allow => view.intention(self.target) == Some(true),
            Expect::Deny => view.intention(self.target) == Some(false),
            // No view holds KV (the agents' KV watches arrive themselves).
            Expect::KvSet => false,
        };
        hit.then_some(id)
    }
}
