//! What the engine knows of each agent, shared by the agent tasks and the
//! scenario driver: whether it holds a session, its last failure (why it
//! is missing), the early-stop rules, and the reconvergence bookkeeping.
//!
//! Reconvergence: when an established session ends, the agent's outage
//! begins (`lost_at`) and is attributed to at most one disruption:
//! - the scenario's, when the driver asked for the end (storm, churn, max
//!   session length), or when the agent was frozen by a pause and lost its
//!   session between the pause's start and [`PAUSE_SETTLE`] after its end;
//! - a detected `backend` disruption: at least [`detect_threshold`]
//!   sessions lost within [`DETECT_WINDOW`] without a scenario cause open
//!   one (its start = the first of them); while losses keep coming less
//!   than [`DETECT_WINDOW`] apart they join it;
//! - none: a loss of its own (counted in `sessions_lost` only).
//!
//! When the agent is in steady state again ([`crate::SessionCx::established`])
//! its reconnect time goes to the disruption; at the end, those still out
//! are its `missing_at_end`, by the cause of their last failure.
//!
//! Per agent this costs a [`Mark`] (about 90 bytes, of which the outage
//! and the max-session deadline are 24); no per-agent allocation beyond the
//! turn's cancellation token, which replaced the agent's own.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_sim_metrics::Metrics;
use agent_sim_metrics::disruption::{CAUSE_BACKEND, DisruptionId, Resync};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::freeze::Freezer;
use crate::outcome::{CAUSE_NO_ANSWER_YET, Failure, SessionEnd, Stopped};
use crate::scenario::{SESSION_LENGTH_JITTER, Scenario};

/// Sessions lost without a scenario cause this close together belong to
/// one detected disruption.
pub const DETECT_WINDOW: Duration = Duration::from_secs(1);

/// A paused agent's session lost up to this long after its pause ended is
/// the pause's doing (the agent finds the server's close when it thaws).
pub const PAUSE_SETTLE: Duration = Duration::from_secs(10);

/// How long an attempt under way at the end of the run must have gone
/// unanswered to be why its agent is missing (`no_answer_yet`) rather than
/// the failure before it: longer than a handshake takes on a server that
/// answers.
pub const NO_ANSWER_AFTER_MS: u32 = 1_000;

/// Sessions lost within [`DETECT_WINDOW`] that make a detected disruption:
/// 5 % of the fleet, at least 3 and at most 50 (and at most the fleet).
pub fn detect_threshold(agents: u64) -> usize {
    let five_pct = agents.div_ceil(20);
    five_pct.clamp(3, 50).min(agents.max(1)) as usize
}

/// Why the scenario ended a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EndCause {
    Storm,
    Churn,
    MaxSessionLength,
    /// Ramp-down: the agent leaves for good.
    Leave,
}

impl EndCause {
    /// Its `sessions_lost` cause (and the missing cause of an agent that
    /// did not come back and had no failure since).
    pub(crate) fn session_cause(self) -> &'static str {
        match self {
            EndCause::Storm => "scenario_storm",
            EndCause::Churn => "scenario_churn",
            EndCause::MaxSessionLength => "max_session_length",
            EndCause::Leave => "ramp_down",
        }
    }
}

/// A session end the scenario asked for.
#[derive(Debug, Clone, Copy)]
struct Ending {
    cause: EndCause,
    disruption: Option<DisruptionId>,
}

/// One agent (index = local agent number).
#[derive(Debug, Default)]
struct Mark {
    up: bool,
    ever: bool,
    last: Option<&'static str>,
    /// `last` was noted inside the session still running (a stream or
    /// request failing while the connection held), not by a session that
    /// ended.
    last_in_session: bool,
    /// A session attempt is under way (dialing, handshaking, waiting for
    /// the server's first answers), not a backoff: when it began, ms from
    /// the start plus one (0: none under way).
    attempt_ms: u32,
    permanent: u8,
    /// When the first failure that cannot heal happened.
    first_permanent: Option<Instant>,
    /// Counted in `Book::given_up`.
    given_up: bool,
    /// Ramp-down asked it to leave.
    leave: bool,
    /// It left.
    left: bool,
    ending: Option<Ending>,
    /// Cancels the agent's current turn (session + the backoff after it).
    turn: Option<CancellationToken>,
    /// Max session length: when the current session ends, ms from the start.
    expires_ms: u32,
    /// Reconnect attempts since `lost_at`.
    attempts: u16,
    /// The outage's disruption; kept once the agent is back, for how its
    /// state came back when that is known only later (a silent resume is
    /// counted when the session ends, a late snapshot when it arrives).
    outage_of: Option<DisruptionId>,
    /// When its last established session was lost (it is out since).
    lost_at: Option<Instant>,
}

/// A loss that may still become part of a detected disruption.
#[derive(Debug)]
struct Candidate {
    n: usize,
    lost: Duration,
    /// Back already: (reconnect, at, attempts).
    back: Option<(Duration, Duration, u16)>,
}

#[derive(Debug, Default)]
struct Detector {
    /// The detected disruption still taking losses, and its latest loss.
    open: Option<(DisruptionId, Duration)>,
    /// Unattributed losses of the last window (at most the threshold).
    recent: VecDeque<Candidate>,
}

#[derive(Debug, Default)]
struct Book {
    marks: Vec<Mark>,
    /// Agents with two non-healing failures spanning `give_up_after`.
    given_up: u64,
    sessions_lost: BTreeMap<&'static str, u64>,
    detect: Detector,
    /// The disruption of each pause phase (in the order of the freezer's windows).
    pauses: Vec<Option<DisruptionId>>,
    left: u64,
}

/// What an agent does after a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Reconnect after the backoff.
    Retry,
    /// Stop (run over, fatal failure).
    Stop,
    /// Leave the run for good (ramp-down).
    Leave,
}

/// What the engine reports about its agents at the end.
pub(crate) struct Tally {
    pub missing: BTreeMap<&'static str, u64>,
    pub lost_not_back: u64,
    pub sessions_lost: BTreeMap<&'static str, u64>,
    pub left: u64,
}

/// The book and what decides an early stop, shared by the agent tasks.
pub(crate) struct Ledger {
    book: Mutex<Book>,
    agents: u64,
    fail_fast: bool,
    give_up_after: Duration,
    pub(crate) stop: CancellationToken,
    stopped: Mutex<Option<Stopped>>,
    ever: Arc<AtomicU64>,
    metrics: Metrics,
    start: Instant,
    label: &'static str,
    plan: Arc<Scenario>,
    freezer: Option<Arc<Freezer>>,
    threshold: usize,
}

/// Everything a ledger is made of.
pub(crate) struct LedgerSetup {
    pub agents: u64,
    pub fail_fast: bool,
    pub give_up_after: Duration,
    pub ever: Arc<AtomicU64>,
    pub metrics: Metrics,
    pub start: Instant,
    pub label: &'static str,
    pub plan: Arc<Scenario>,
    pub freezer: Option<Arc<Freezer>>,
}

impl Ledger {
    pub(crate) fn new(s: LedgerSetup) -> Self {
        let pauses = s.freezer.as_ref().map_or(0, |f| f.windows());
        Ledger {
            book: Mutex::new(Book {
                marks: (0..s.agents).map(|_| Mark::default()).collect(),
                pauses: vec![None; pauses],
                ..Book::default()
            }),
            agents: s.agents,
            fail_fast: s.fail_fast,
            give_up_after: s.give_up_after,
            stop: CancellationToken::new(),
            stopped: Mutex::new(None),
            ever: s.ever,
            metrics: s.metrics,
            start: s.start,
            label: s.label,
            plan: s.plan,
            freezer: s.freezer,
            threshold: detect_threshold(s.agents),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Time since the start of the fleet.
    pub(crate) fn since_start(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.start)
    }

    /// Milliseconds since the start of the fleet (the unit of the marks'
    /// times), saturating.
    fn ms(t: Duration) -> u32 {
        u32::try_from(t.as_millis()).unwrap_or(u32::MAX)
    }

    /// Why the fleet stopped early, if it did.
    pub(crate) fn stopped(&self) -> Option<Stopped> {
        self.stopped
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Opens a disruption of this fleet.
    pub(crate) fn open(
        &self,
        cause: &'static str,
        began: Duration,
        note: Option<String>,
    ) -> Option<DisruptionId> {
        self.metrics
            .disruptions()
            .open(cause, self.label, began, note)
    }

    /// Starts a turn of agent `n` (a session and the backoff after it):
    /// its token, a child of `run`; `None` when it was asked to leave.
    /// `retry`: the turn is not the agent's first (an attempt to come back).
    pub(crate) fn begin_turn(
        &self,
        n: usize,
        run: &CancellationToken,
        retry: bool,
    ) -> Option<CancellationToken> {
        let mut b = self.lock();
        let m = &mut b.marks[n];
        if m.leave {
            if !m.left {
                m.left = true;
                b.left += 1;
            }
            return None;
        }
        let t = run.child_token();
        m.turn = Some(t.clone());
        m.ending = None;
        if retry && m.lost_at.is_some() {
            m.attempts = m.attempts.saturating_add(1);
        }
        Some(t)
    }

    /// Agent `n` is in steady state.
    pub(crate) fn up(&self, n: usize) {
        let now = Instant::now();
        let t = self.since_start(now);
        let expires = self.session_deadline(t);
        let mut b = self.lock();
        let Book { marks, detect, .. } = &mut *b;
        let m = &mut marks[n];
        m.up = true;
        m.ever = true;
        m.expires_ms = expires;
        if let Some(lost) = m.lost_at.take() {
            let reconnect = now.saturating_duration_since(lost);
            let attempts = std::mem::take(&mut m.attempts);
            match m.outage_of {
                Some(id) => {
                    self.metrics
                        .disruptions()
                        .back(id, reconnect, t, u64::from(attempts));
                }
                None => {
                    if let Some(c) = detect
                        .recent
                        .iter_mut()
                        .find(|c| c.n == n && c.back.is_none())
                    {
                        c.back = Some((reconnect, t, attempts));
                    }
                }
            }
        }
    }

    /// Max session length: the deadline of a session up at `t`, ms from
    /// the start (0: none).
    fn session_deadline(&self, t: Duration) -> u32 {
        let Some((length, until)) = self.plan.session_length_at(t) else {
            return 0;
        };
        let j = 1.0 - SESSION_LENGTH_JITTER + 2.0 * SESSION_LENGTH_JITTER * fastrand::f64();
        let at = t + length.mul_f64(j);
        if until.is_some_and(|u| at >= u) {
            return 0;
        }
        Self::ms(at).max(1)
    }

    /// A reconnected agent's state came back this way (counted for the
    /// disruption it was lost in, if any).
    pub(crate) fn resynced(&self, n: usize, how: Resync) {
        let b = self.lock();
        let m = &b.marks[n];
        if let Some(id) = m.outage_of {
            self.metrics.disruptions().resync(id, how);
        }
    }

    /// Agent `n` starts a session attempt.
    pub(crate) fn attempt(&self, n: usize) {
        let at = Self::ms(self.since_start(Instant::now()));
        let m = &mut self.lock().marks[n];
        m.attempt_ms = at.saturating_add(1);
        m.last_in_session = false;
    }

    /// Records a failure inside a session that goes on.
    pub(crate) fn noted(&self, n: usize, f: &Failure) {
        let stop = {
            let mut b = self.lock();
            self.note_failure(&mut b, n, f, false)
        };
        self.apply_stop(stop, f);
    }

    /// A session of agent `n` ended with `end` (`was_up`: it had reached
    /// steady state); `run_over`: the run is ending. Counts it, starts the
    /// agent's outage and decides what the agent does next.
    pub(crate) fn session_ended(
        &self,
        n: usize,
        was_up: bool,
        end: &SessionEnd,
        run_over: bool,
    ) -> Next {
        self.lock().marks[n].attempt_ms = 0;
        if run_over {
            return Next::Stop;
        }
        let now = Instant::now();
        let t = self.since_start(now);
        let (next, stop) = {
            let mut b = self.lock();
            // The turn stays until the next one begins: a ramp-down
            // cancels it to cut the backoff short.
            if let Some(e) = b.marks[n].ending.take() {
                (self.scenario_end(&mut b, n, was_up, e, now), None)
            } else {
                match end {
                    SessionEnd::Shutdown => (Next::Stop, None),
                    // A move between servers is no outage: the agent stays
                    // up until its next session answers or fails.
                    SessionEnd::Moved => (Next::Retry, None),
                    SessionEnd::Lost(f) | SessionEnd::Fatal(f) => {
                        self.metrics
                            .error_said(f.kind, f.detail.as_deref(), f.said_by);
                        b.marks[n].up = false;
                        if was_up {
                            *b.sessions_lost.entry(f.kind).or_insert(0) += 1;
                            self.unplanned_loss(&mut b, n, now, t);
                        }
                        let stop = self.note_failure(&mut b, n, f, true);
                        let next = if matches!(end, SessionEnd::Fatal(_)) {
                            Next::Stop
                        } else {
                            Next::Retry
                        };
                        (next, stop.map(|s| (s, f.clone())))
                    }
                }
            }
        };
        if let Some((s, f)) = stop {
            self.apply_stop(Some(s), &f);
        }
        next
    }

    /// A session the scenario ended: counted under its own cause, never as
    /// an error, and it does not touch the give-up rules.
    fn scenario_end(&self, b: &mut Book, n: usize, was_up: bool, e: Ending, now: Instant) -> Next {
        let m = &mut b.marks[n];
        m.up = false;
        m.expires_ms = 0;
        if e.cause == EndCause::Leave {
            m.leave = true;
            if !m.left {
                m.left = true;
                b.left += 1;
            }
            if was_up {
                *b.sessions_lost.entry(e.cause.session_cause()).or_insert(0) += 1;
            }
            return Next::Leave;
        }
        if was_up {
            m.last = Some(e.cause.session_cause());
            m.last_in_session = false;
            m.lost_at = Some(now);
            m.attempts = 0;
            m.outage_of = e.disruption;
            if let Some(id) = e.disruption {
                self.metrics.disruptions().lost(id);
            }
            *b.sessions_lost.entry(e.cause.session_cause()).or_insert(0) += 1;
        }
        Next::Retry
    }

    /// An established session lost without a scenario asking: the outage
    /// goes to the pause that froze the agent, or to a detected disruption.
    fn unplanned_loss(&self, b: &mut Book, n: usize, now: Instant, t: Duration) {
        let log = self.metrics.disruptions();
        {
            let m = &mut b.marks[n];
            m.lost_at = Some(now);
            m.attempts = 0;
            m.outage_of = None;
            m.expires_ms = 0;
        }
        if let Some(w) = self
            .freezer
            .as_ref()
            .and_then(|f| f.window_of(n as u64, t, PAUSE_SETTLE))
            && let Some(id) = b.pauses.get(w).copied().flatten()
        {
            b.marks[n].outage_of = Some(id);
            log.lost(id);
            return;
        }
        let d = &mut b.detect;
        if let Some((id, last)) = d.open {
            if t.saturating_sub(last) <= DETECT_WINDOW {
                d.open = Some((id, t));
                b.marks[n].outage_of = Some(id);
                log.lost(id);
                return;
            }
            d.open = None;
        }
        while d
            .recent
            .front()
            .is_some_and(|c| t.saturating_sub(c.lost) > DETECT_WINDOW)
        {
            d.recent.pop_front();
        }
        d.recent.push_back(Candidate {
            n,
            lost: t,
            back: None,
        });
        if d.recent.len() < self.threshold {
            return;
        }
        let began = d.recent.front().map_or(t, |c| c.lost);
        let recent = std::mem::take(&mut d.recent);
        let Some(id) = self.open(CAUSE_BACKEND, began, None) else {
            return;
        };
        d.open = Some((id, t));
        for c in recent {
            log.lost(id);
            match c.back {
                Some((reconnect, at, attempts)) => {
                    log.back(id, reconnect, at, u64::from(attempts));
                }
                None => {
                    let m = &mut b.marks[c.n];
                    if m.lost_at.is_some() && m.outage_of.is_none() {
                        m.outage_of = Some(id);
                    }
                }
            }
        }
    }

    /// The failure bookkeeping of the early-stop rules; returns whether the
    /// run must stop (`Some(fail_fast)`).
    fn note_failure(&self, b: &mut Book, n: usize, f: &Failure, ended: bool) -> Option<bool> {
        let permanent = self.metrics.error_kind(f.kind).is_some_and(|k| !k.heals);
        let now = Instant::now();
        let m = &mut b.marks[n];
        if ended {
            m.up = false;
        }
        m.last = Some(f.kind);
        m.last_in_session = !ended;
        let mut gives_up = false;
        if permanent {
            m.permanent = m.permanent.saturating_add(1);
            let first = *m.first_permanent.get_or_insert(now);
            if m.permanent >= 2 && !m.given_up && now - first >= self.give_up_after {
                m.given_up = true;
                gives_up = true;
            }
        } else {
            // A cause that can heal: start over.
            m.permanent = 0;
            m.first_permanent = None;
            if m.given_up {
                m.given_up = false;
                b.given_up -= 1;
            }
        }
        if gives_up {
            b.given_up += 1;
        }
        let all_given_up = b.given_up >= self.agents;
        if permanent && self.fail_fast {
            Some(true)
        } else if all_given_up && self.ever.load(Ordering::Relaxed) == 0 {
            Some(false)
        } else {
            None
        }
    }

    fn apply_stop(&self, stop: Option<bool>, f: &Failure) {
        let Some(fail_fast) = stop else { return };
        let mut s = self.stopped.lock().unwrap_or_else(|p| p.into_inner());
        if s.is_none() {
            *s = Some(Stopped {
                fail_fast,
                failure: f.clone(),
            });
            self.stop.cancel();
        }
    }

    /// Asks agent `n`'s session to end for `cause` (it must be up).
    fn end_session(m: &mut Mark, cause: EndCause, disruption: Option<DisruptionId>) {
        m.ending = Some(Ending { cause, disruption });
        m.expires_ms = 0;
        if let Some(t) = &m.turn {
            t.cancel();
        }
    }

    fn ends(m: &Mark) -> bool {
        m.up && m.ending.is_none() && m.turn.is_some()
    }

    /// Storm: ends `share` of the sessions up now, chosen at random;
    /// returns how many.
    pub(crate) fn storm(&self, share: crate::scenario::Share, id: Option<DisruptionId>) -> u64 {
        let mut b = self.lock();
        let mut up: Vec<u32> = (0..b.marks.len())
            .filter(|&i| Self::ends(&b.marks[i]))
            .map(|i| i as u32)
            .collect();
        let k = share.of(up.len() as u64) as usize;
        for i in 0..k {
            let j = fastrand::usize(i..up.len());
            up.swap(i, j);
            Self::end_session(&mut b.marks[up[i] as usize], EndCause::Storm, id);
        }
        k as u64
    }

    /// Churn: ends the next session that is up from `cursor` on (looking
    /// at most 64 agents ahead); moves the cursor past it.
    pub(crate) fn churn_next(&self, cursor: &mut usize, id: Option<DisruptionId>) -> bool {
        let mut b = self.lock();
        let len = b.marks.len();
        for _ in 0..len.min(64) {
            let i = *cursor % len;
            *cursor = (*cursor + 1) % len;
            if Self::ends(&b.marks[i]) {
                Self::end_session(&mut b.marks[i], EndCause::Churn, id);
                return true;
            }
        }
        false
    }

    /// Max session length: ends every session whose deadline has passed;
    /// sessions already up when the phase begins get a deadline first.
    pub(crate) fn expire(&self, id: Option<DisruptionId>) -> u64 {
        let t = self.since_start(Instant::now());
        let now_ms = Self::ms(t);
        let mut b = self.lock();
        let mut n = 0;
        for m in b.marks.iter_mut().filter(|m| Self::ends(m)) {
            if m.expires_ms == 0 {
                m.expires_ms = self.session_deadline(t);
            } else if m.expires_ms <= now_ms {
                Self::end_session(m, EndCause::MaxSessionLength, id);
                n += 1;
            }
        }
        n
    }

    /// Ramp-down: agent `n` leaves (now, or when it next starts a turn).
    pub(crate) fn leave(&self, n: usize) {
        let mut b = self.lock();
        let m = &mut b.marks[n];
        if m.leave {
            return;
        }
        m.leave = true;
        m.expires_ms = 0;
        m.ending = Some(Ending {
            cause: EndCause::Leave,
            disruption: None,
        });
        if let Some(t) = &m.turn {
            t.cancel();
        }
        // Without a session to close it has left already (its task notices
        // at its next turn); with one, when the session has closed.
        if !m.up {
            m.left = true;
            b.left += 1;
        }
    }

    /// The disruption of pause window `w` (opened when it began).
    pub(crate) fn set_pause(&self, w: usize, id: Option<DisruptionId>) {
        if let Some(slot) = self.lock().pauses.get_mut(w) {
            *slot = id;
        }
    }

    /// The end-of-run tally; outages still open become their disruption's
    /// `missing_at_end`.
    pub(crate) fn tally(&self) -> Tally {
        let now_ms = Self::ms(self.since_start(Instant::now()));
        let b = self.lock();
        let log = self.metrics.disruptions();
        let mut missing: BTreeMap<&'static str, u64> = BTreeMap::new();
        let mut lost = 0;
        for m in b.marks.iter().filter(|m| !m.up && !m.left) {
            // Out while an attempt the server has not answered for
            // NO_ANSWER_AFTER is under way: a failure before it that heals
            // no longer says why (a slow server does), unless the attempt
            // itself is failing. One that cannot heal (a wrong password)
            // still does, and so does any failure before an attempt that
            // has only just begun.
            let waiting =
                m.attempt_ms > 0 && now_ms.saturating_sub(m.attempt_ms - 1) >= NO_ANSWER_AFTER_MS;
            let cause = match m.last {
                Some(kind)
                    if !waiting
                        || m.last_in_session
                        || self.metrics.error_kind(kind).is_some_and(|k| !k.heals) =>
                {
                    kind
                }
                _ => CAUSE_NO_ANSWER_YET,
            };
            *missing.entry(cause).or_insert(0) += 1;
            lost += u64::from(m.ever);
            if let (Some(id), Some(_)) = (m.outage_of, m.lost_at) {
                log.missing(id, cause, u64::from(m.attempts));
            }
        }
        Tally {
            missing,
            lost_not_back: lost,
            sessions_lost: b.sessions_lost.clone(),
            left: b.left,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_detection_threshold_scales_with_the_fleet_within_bounds() {
        assert_eq!(detect_threshold(1), 1);
        assert_eq!(detect_threshold(2), 2);
        assert_eq!(detect_threshold(10), 3);
        assert_eq!(detect_threshold(100), 5);
        assert_eq!(detect_threshold(2_000), 50);
        assert_eq!(detect_threshold(40_000), 50);
    }

    #[test]
    fn a_mark_stays_small() {
        let size = std::mem::size_of::<Mark>();
        assert!(size <= 96, "{size}");
    }
}
