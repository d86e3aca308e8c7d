//! Subscribe streams of a session: starting calls, applying events to the
//! views, resubscribing after `ABORTED`, and kinds for failed calls; also
//! the session-local state of every watch ([`Slot`]) and when what it
//! brought arrived ([`Arrival`]), which blocking queries and long polls
//! share.

use std::sync::Arc;

use agent_sim_fleet::{Backoff, Failure, Resync, SessionCx, SessionEnd};
use agent_sim_proto::consul::subscribe::{Event, SubscribeRequest, event::Payload};
use tokio::time::Instant;
use tonic::{Code, Status};

use super::{ABORT_BACKOFF, ConsulAgent, Shared, Timed};
use crate::codec::{SUBSCRIBE_PATH, subscribe_request};
use crate::conn::{self, StreamConn};
use crate::ended::status_words;
use crate::http;
use crate::probe::{Expect, Owed, ProbeBoard};
use crate::proxy::Proxies;
use crate::view::{Change, Phase, Signal, View, ViewKind};
use crate::watch::Digest;

/// When an event arrived: decoded by the agent, and received by the
/// kernel (the bytes that completed it; `None` without kernel stamps).
#[derive(Debug, Clone, Copy)]
pub(super) struct Arrival {
    pub(super) decoded: Instant,
    pub(super) kernel: Option<Instant>,
}

impl Arrival {
    /// The arrival time probes are measured at: the kernel's when known.
    pub(super) fn at(&self) -> Instant {
        self.kernel.unwrap_or(self.decoded)
    }
}

/// Where a watch stands in its session.
pub(super) enum SlotState {
    /// Waiting to (re)subscribe at `at`.
    Idle { at: Instant },
    /// The call was sent; the server's headers have not come.
    Starting,
    /// The server took the call: events flow.
    Live,
    /// Not watching on this session.
    Done,
}

/// Session-local state of one subscription.
pub(super) struct Slot {
    pub(super) state: SlotState,
    /// Counted toward `established` (snapshot done, or resumed).
    pub(super) ready: bool,
    /// Live on the probe board since this mark (`sub_up`'s answer).
    pub(super) mark: Option<u64>,
    /// The probe whose board the mark is on.
    pub(super) timed: Option<Timed>,
    /// When the pending snapshot was asked for (Subscribe call or reset).
    pub(super) started: Instant,
    /// Subscribed with an index; not yet known whether it resumed. The
    /// server says so with its first message: `NewSnapshotToFollow` (a new
    /// snapshot follows) or any other event (resumed). A resumed stream is
    /// silent until the topic changes.
    pub(super) resume_pending: bool,
    /// Still pending a resume when the server answered the agent's sync:
    /// counted ready, and counted a silent resume only if no message on it
    /// says otherwise before the session ends (`NewSnapshotToFollow` makes
    /// it a snapshot, any other event a resume).
    pub(super) silent: bool,
    /// The snapshot in progress re-syncs a view that existed before.
    pub(super) resync: bool,
}

impl Slot {
    /// A slot of a new session, its snapshot asked for at `now`.
    pub(super) fn new(now: Instant) -> Self {
        Slot {
            state: SlotState::Done,
            ready: false,
            mark: None,
            timed: None,
            started: now,
            resume_pending: false,
            silent: false,
            resync: false,
        }
    }
}

/// The session's slots; dropping them takes live probe subscriptions off
/// their boards (also when the session future is dropped mid-way).
pub(super) struct Slots {
    pub(super) v: Vec<Slot>,
    /// The fleet's probe boards: the run's probe and the second one.
    boards: [Option<Arc<ProbeBoard>>; 2],
}

impl Slots {
    /// The slots `v` of a session of a fleet sharing `sh`.
    pub(super) fn new(v: Vec<Slot>, sh: &Shared) -> Self {
        Slots {
            v,
            boards: [sh.board.clone(), sh.also.clone()],
        }
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        for s in &self.v {
            let board = match s.timed {
                Some(Timed::Main) => &self.boards[0],
                Some(Timed::Also) => &self.boards[1],
                None => continue,
            };
            if let (Some(m), Some(b)) = (s.mark, board) {
                // The session future was dropped: the run is ending.
                b.sub_down(m, &mut Owed::default());
            }
        }
    }
}

/// Sends a Subscribe call for slot `i` on the streaming connection.
pub(super) fn start_call(conn: &mut StreamConn, i: usize, req: &SubscribeRequest) {
    conn.start(i, SUBSCRIBE_PATH, |w| {
        // A Vec grows as needed: encoding into it cannot fail.
        let _ = prost::Message::encode(req, w);
    });
}

impl ConsulAgent {
    pub(super) fn start_slot(&mut self, i: usize, slot: &mut Slot, conn: &mut StreamConn) {
        let sh = &self.shared;
        let sub = &mut self.subs[i];
        let index = sub.view.resume_index();
        if index == 0 {
            // A partial snapshot from a lost session cannot be resumed.
            sub.view.reset();
            slot.resync = sub.ever_synced;
        }
        slot.resume_pending = index > 0;
        slot.started = Instant::now();
        let req = subscribe_request(
            sub.topic,
            &sub.name,
            index,
            sh.token(self.index),
            &sh.cfg.conn.datacenter,
        );
        start_call(conn, i, &req);
        slot.state = SlotState::Starting;
        sh.metrics.incr(sh.ids.subscriptions);
    }

    pub(super) fn mark_ready(&self, i: usize, slot: &mut Slot) {
        slot.ready = true;
        let timed = self.subs[i].probe;
        if slot.mark.is_none()
            && let Some(b) = self.shared.board_of(timed)
        {
            slot.mark = Some(b.sub_up());
            slot.timed = timed;
        }
    }

    /// Takes subscription `i` off the probe board; the agent keeps the
    /// probe that still expects its arrival.
    pub(super) fn uncount(&mut self, i: usize, slot: &mut Slot) {
        if let (Some(m), Some(b)) = (slot.mark.take(), self.shared.board_of(slot.timed)) {
            b.sub_down(m, &mut self.subs[i].probe_owed);
        }
    }

    /// Handles a failed call or stream; `Some(end)` ends the session.
    ///
    /// As a real agent's materializer: a stream that fails while its
    /// connection lives is subscribed again on that connection — at once the
    /// first time, then after a backoff from 200 ms doubling with jitter to
    /// 60 s, until an event resets it; the backoff is the subscription's, so
    /// a new session's Subscribe waits it out too — and each failure is
    /// counted with the server's words. `ABORTED` also drops the view
    /// (resubscribe at index 0); other failures keep it (resubscribe at its
    /// index), except a snapshot in progress, which is discarded. A failing
    /// transport, or the server shutting down, ends the session (the
    /// connection goes too).
    pub(super) fn on_status(
        &mut self,
        cx: &SessionCx,
        i: usize,
        slot: &mut Slot,
        status: &Status,
        conn: &mut StreamConn,
    ) -> Option<SessionEnd> {
        let words = status_words(status);
        let aborted = status.code() == Code::Aborted;
        let kind = grpc_kind(status);
        super::link::count_denial(&self.shared.metrics, kind, "subscribe.Subscribe");
        if !aborted && (from_transport(status) || kind == "server_shutting_down") {
            return Some(SessionEnd::lost_with(kind, words));
        }
        self.retry_stream(cx, i, slot, (kind, words), aborted, conn);
        None
    }

    /// A stream failed on a live connection (`kind` and the words to count
    /// it with): subscribe again, at once or after the slot's backoff.
    pub(super) fn retry_stream(
        &mut self,
        cx: &SessionCx,
        i: usize,
        slot: &mut Slot,
        (kind, words): (&'static str, String),
        aborted: bool,
        conn: &mut StreamConn,
    ) {
        let sh = self.shared.clone();
        if aborted {
            sh.metrics.incr(sh.ids.aborts);
            sh.metrics.warn("subscription_aborted", Some(&words));
        } else {
            cx.report(&Failure {
                kind,
                detail: Some(words),
                said_by: None,
            });
        }
        let sub = &mut self.subs[i];
        if aborted || sub.view.resume_index() == 0 {
            // No whole view any more: not live until a new snapshot.
            sub.view.reset();
            slot.ready = false;
            self.uncount(i, slot);
        }
        let sub = &mut self.subs[i];
        slot.resync = sub.ever_synced;
        slot.resume_pending = false;
        slot.silent = false;
        match &mut self.subs[i].backoff {
            None => {
                self.subs[i].backoff = Some(Backoff::new(ABORT_BACKOFF.0, ABORT_BACKOFF.1));
                self.start_slot(i, slot, conn);
            }
            Some(b) => {
                slot.state = SlotState::Idle {
                    at: Instant::now() + b.next_delay(),
                };
            }
        }
    }

    /// Applies one event of subscription `i`; says how the stream resynced
    /// if this event completed a snapshot or proved a resume.
    pub(super) fn on_event(
        &mut self,
        i: usize,
        slot: &mut Slot,
        arrival: Arrival,
        ev: &Event,
    ) -> Option<Resync> {
        let sh = self.shared.clone();
        let ids = &sh.ids;
        sh.metrics.incr(ids.events_received);
        let is_nstf = matches!(ev.payload, Some(Payload::NewSnapshotToFollow(true)));
        let mut resynced = None;
        if slot.resume_pending {
            slot.resume_pending = false;
            slot.silent = false;
            if !is_nstf {
                sh.metrics.incr(ids.resumes);
                resynced = Some(Resync::Resume);
                self.subs[i].backoff = None;
                self.mark_ready(i, slot);
            }
        }
        let applied = self.apply_to_view(i, |view, on_change| view.apply(ev, on_change));
        if applied.signal == Signal::Ignored {
            let kind = self.subs[i].view.kind();
            sh.metrics
                .warn("unknown_events", Some(&ignored_words(ev, kind)));
        }
        self.settle(i, slot, arrival, applied).or(resynced)
    }

    /// Applies a blocking query's result to subscription `i` (what
    /// `on_event` is for a stream): the first is the snapshot; after a
    /// reconnect, a query re-sent at the view's index that comes back with
    /// a later one resumed, with the same one (its wait ended) resumed
    /// silently.
    pub(super) fn on_result(
        &mut self,
        i: usize,
        slot: &mut Slot,
        arrival: Arrival,
        result: &Digest,
    ) -> Option<Resync> {
        let sh = self.shared.clone();
        sh.metrics.incr(sh.ids.watch_responses);
        let mut resynced = None;
        if slot.resume_pending {
            slot.resume_pending = false;
            slot.silent = false;
            self.subs[i].backoff = None;
            if result.index == self.subs[i].view.index() {
                sh.metrics.incr(sh.ids.resumes_silent);
                resynced = Some(Resync::ResumeSilent);
            } else {
                sh.metrics.incr(sh.ids.resumes);
                resynced = Some(Resync::Resume);
            }
            self.mark_ready(i, slot);
        }
        let applied = self.apply_to_view(i, |view, on_change| {
            view.apply_result(result.index, &result.items, on_change)
        });
        if applied.signal != Signal::Unchanged {
            sh.metrics.incr(sh.ids.watch_results_changed);
        }
        self.settle(i, slot, arrival, applied).or(resynced)
    }

    /// Runs `apply` on subscription `i`'s view, noting what the changes
    /// mean for the probe board.
    fn apply_to_view(
        &mut self,
        i: usize,
        apply: impl FnOnce(&mut View, &mut dyn FnMut(Change)) -> Signal,
    ) -> Applied {
        let sh = self.shared.clone();
        let sub = &mut self.subs[i];
        let board = sh.board_of(sub.probe);
        let observing = board.is_some_and(|b| b.is_observer());
        let mut a = Applied {
            signal: Signal::Ignored,
            hit: None,
            hit_live: false,
            seen: None,
        };
        a.signal = apply(&mut sub.view, &mut |c| {
            if let Some(b) = board {
                if observing {
                    a.seen = b.observes(&c).or(a.seen);
                } else if let Some(id) = b.matches(&c) {
                    a.hit = Some(id);
                    a.hit_live = true;
                }
            }
        });
        a
    }

    /// What follows a view's change: a completed snapshot counted (and a
    /// re-sync credited to the probe), and a probe change delivered.
    fn settle(
        &mut self,
        i: usize,
        slot: &mut Slot,
        arrival: Arrival,
        a: Applied,
    ) -> Option<Resync> {
        let sh = self.shared.clone();
        let Applied {
            signal,
            mut hit,
            hit_live,
            seen,
        } = a;
        // The event's raft index (one per event, batch included).
        let index = self.subs[i].view.index();
        let mut resynced = None;
        match signal {
            Signal::EndOfSnapshot => {
                resynced = Some(Resync::Snapshot);
                hit = hit.or(self.snapshot_done(i, slot, arrival, index));
            }
            Signal::NewSnapshotToFollow => {
                slot.resync = self.subs[i].ever_synced;
                slot.started = arrival.decoded;
            }
            Signal::Item | Signal::Ignored | Signal::Unchanged => {}
        }
        let agent = self.index as usize;
        let sub = &mut self.subs[i];
        for _ in 0..sub.view.take_dropped() {
            sh.metrics.warn(
                "view_full",
                Some("more instances than one view keeps; the rest are not tracked"),
            );
        }
        let timed = sub.probe;
        let board = sh.board_of(timed);
        let arrived = arrival.at();
        // What the agent's proxycfg takes: a whole view (its snapshot
        // done) or a live change of one.
        let proxied = signal == Signal::EndOfSnapshot
            || (signal == Signal::Item && sub.view.phase() == Phase::Live);
        let mut probe_hit = None;
        if let (Some(kind), Some(b)) = (seen, board) {
            sub.probe_state = kind as u8;
            if sub.probe_seen != index
                && b.observe(index, kind, arrived, (slot.mark, sub.probe_owed))
            {
                sub.probe_seen = index;
                delivered(&sh, agent, arrival);
            }
        }
        let hit_index = if hit_live { index } else { 0 };
        if let (Some(id), Some(b)) = (hit, board)
            && sub.probe_seen != id
            && ProbeBoard::expects(slot.mark, sub.probe_owed, id)
            && b.arrive(id, arrived, hit_index)
        {
            sub.probe_seen = id;
            delivered(&sh, agent, arrival);
            probe_hit = timed.map(|t| (t, id, hit_index));
        }
        if proxied {
            self.hand_to_proxies(arrived, probe_hit);
        }
        resynced
    }

    /// The proxies behind the agent (`--proxies-per-agent`) take an update
    /// that reached it at `at`; `probe`: the probe (its board, id and raft
    /// index) whose arrival it was, timed again at each proxy's hand-off.
    fn hand_to_proxies(&mut self, at: Instant, probe: Option<(Timed, u64, u64)>) {
        let sh = &self.shared;
        let cfg = &sh.cfg.proxies;
        if !cfg.is_on() {
            return;
        }
        let extra = self.extra.get_or_insert_with(Box::default);
        let proxies = extra
            .proxies
            .get_or_insert_with(|| Proxies::new(cfg.per_agent, at));
        let mut handed = Vec::new();
        let scheduled = proxies.update(at, cfg, |h| {
            if probe.is_some() {
                handed.push(h);
            }
        });
        sh.metrics.add(sh.ids.proxy_updates, scheduled);
        if let Some((timed, id, index)) = probe
            && let Some(b) = sh.board_of(Some(timed))
        {
            b.arrive_proxied(id, index, &handed);
        }
    }

    /// Subscription `i` completed a snapshot (its last event at raft
    /// `index`): counted; the observer compares the probe's state with the
    /// one before the re-sync, the controller looks for the armed probe's
    /// change in a re-synced view (the probe id it hit); the slot is ready.
    fn snapshot_done(
        &mut self,
        i: usize,
        slot: &mut Slot,
        arrival: Arrival,
        index: u64,
    ) -> Option<u64> {
        let sh = self.shared.clone();
        let agent = self.index as usize;
        sh.metrics.incr(sh.ids.snapshots);
        sh.metrics
            .record(sh.ids.subscribe_snapshot, agent, slot.started.elapsed());
        let sub = &mut self.subs[i];
        let board = sh.board_of(sub.probe);
        let mut hit = None;
        if let Some(b) = board {
            if b.is_observer() {
                let now = b.state(&sub.view).map_or(0, |e| e as u8);
                if slot.resync
                    && sub.probe_state != 0
                    && now != sub.probe_state
                    && let Some(kind) = Expect::from_u8(now)
                    && b.observe_resync((sub.probe_seen, index), kind, arrival.at(), sub.probe_owed)
                {
                    delivered(&sh, agent, arrival);
                }
                sub.probe_state = now;
                // The view is current up to here: a later re-sync credits
                // only changes after this index.
                sub.probe_seen = index;
            } else if slot.resync {
                hit = b.matches_state(&sub.view);
            }
        }
        slot.resync = false;
        sub.backoff = None;
        sub.ever_synced = true;
        self.mark_ready(i, slot);
        hit
    }
}

/// A probe delivery to agent `agent`: the simulator's own delay (processed
/// − kernel arrival), and whether it had to be timed in user space.
pub(super) fn delivered(sh: &Shared, agent: usize, arrival: Arrival) {
    sh.metrics
        .record(sh.ids.probe_overhead, agent, arrival.at().elapsed());
    if arrival.kernel.is_none() {
        sh.metrics.incr(sh.ids.arrivals_user_time);
    }
}

/// What applying something to a view meant for the probe board.
pub(super) struct Applied {
    signal: Signal,
    /// Controller: the armed probe id it hit.
    hit: Option<u64>,
    /// And whether it came live (not from a snapshot).
    hit_live: bool,
    /// Observer: the outcome of a probe change.
    seen: Option<Expect>,
}

/// What an event a view ignored was, for the `unknown_events` sample.
fn ignored_words(ev: &Event, kind: ViewKind) -> String {
    let what = match &ev.payload {
        None => "an event without a payload this agent knows",
        Some(Payload::ServiceHealth(u)) if u.check_service_node.is_none() => {
            "a ServiceHealth event without a CheckServiceNode"
        }
        Some(Payload::ConfigEntry(u)) if u.config_entry.is_none() => {
            "a ConfigEntry event without an entry"
        }
        Some(Payload::ServiceHealth(_)) => "a ServiceHealth event",
        Some(Payload::ConfigEntry(_)) => "a ConfigEntry event",
        Some(Payload::EventBatch(_)) => "an EventBatch of nothing this view applies",
        Some(Payload::EndOfSnapshot(_)) => "EndOfSnapshot = false",
        Some(Payload::NewSnapshotToFollow(_)) => "NewSnapshotToFollow = false",
    };
    format!("{what} on a {kind:?} stream (index {})", ev.index)
}

/// Whether a status is the transport's (an HTTP/2 or connection error,
/// or our own "connection not ready"), not an answer or a broken stream.
pub(super) fn from_transport(status: &Status) -> bool {
    std::error::Error::source(status).is_some()
}

/// Error kind of a failed call or stream: the cause Consul names in its
/// message (`ACL not found` comes as code Unknown), else by code;
/// `Unimplemented: unknown service subscribe...` means the wrong port.
pub(super) fn grpc_kind(status: &Status) -> &'static str {
    if let Some(k) = http::cause_kind(status.message()) {
        return k;
    }
    // tonic's own words for a length prefix over the limit, and for bytes
    // that are not an Event.
    if status.code() == Code::OutOfRange && status.message().contains("message length too large") {
        return "message_too_large";
    }
    if status.code() == Code::Internal && status.message().contains("failed to decode Protobuf") {
        return "decode_event";
    }
    if status.code() == Code::Unimplemented && status.message().contains("unknown service") {
        return "wrong_port_grpc";
    }
    conn::status_kind(status.code())
}
