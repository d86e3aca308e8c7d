//! One session of an agent: the entry the engine calls, and the loop every
//! watch mode runs. The loop is one wait over the connection, every watch,
//! at most one HTTP call and one timer (`agent_sim_fleet::wake`), then one
//! handler per wake. A watch mode brings its connection and watches as a
//! [`Watches`] (`streaming`: Subscribe streams; `watching`: blocking
//! queries or HTTP long polls); the catalog upkeep, the rule for when the
//! session is established and the watches' end on the probe board are
//! here, the same for all.

use std::pin::pin;
use std::task::{Context, Poll};
use std::time::Duration;

use agent_sim_fleet::wake::{self, Woke};
use agent_sim_fleet::{Agent, Backoff, BoxFuture, Resync, SessionCx, SessionEnd};
use tokio::time::Instant;

use super::kv::KvIo;
use super::link::Link;
use super::subscriptions::Slot;
use super::upkeep::{Done, Sched, UpkeepCall};
use super::{ConsulAgent, HTTP_BACKOFF};
use crate::rpc::mux::{CallError, Exchange, Mux, Reply};
use crate::watch::WatchMode;

/// A deadline that never comes within a session (the timer when nothing is
/// due).
pub(super) fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(3600)
}

/// What woke the loop on its connections: the agent's RPC connection
/// ended, or the watch mode's connection or a watch brought something.
enum Either<Io> {
    Link(Result<(), CallError>),
    Watch(Io),
    Kv(KvIo),
    /// The blocking roots query answered (agents keeping a leaf).
    Roots(Result<Reply, CallError>),
}

/// The connection of one session and the watches on it, as the session's
/// loop drives them; `slots` are the watches' session state, one per
/// subscription of the agent.
pub(super) trait Watches {
    /// What the connection or a watch brought.
    type Io;
    /// Starts what is due at the top of a turn (blocking queries open
    /// their streams on the agent's RPC connection, `mux`); when the next
    /// thing is.
    fn due(
        &mut self,
        agent: &mut ConsulAgent,
        slots: &mut [Slot],
        mux: Option<&mut Mux>,
        now: Instant,
    ) -> Instant;
    /// The connection, then every watch from `rotate` on (so that none
    /// starves the others).
    fn poll(&mut self, slots: &mut [Slot], rotate: usize, tcx: &mut Context<'_>) -> Poll<Self::Io>;
    /// Handles what [`Watches::poll`] gave; the session's end when it ended.
    fn on_io(
        &mut self,
        agent: &mut ConsulAgent,
        cx: &SessionCx,
        slots: &mut [Slot],
        io: Self::Io,
    ) -> Option<SessionEnd>;
    /// The timer's deadline passed.
    fn on_timer(&mut self, agent: &mut ConsulAgent, slots: &mut [Slot]);
    /// Whether `slot` only waits for the agent's sync to count as ready.
    fn waiting(slot: &Slot) -> bool;
    /// Whether the watches ride the agent's RPC connection (blocking
    /// queries): its end is then the session's. Otherwise the session goes
    /// on and the upkeep dials it again when a call needs it.
    fn on_link(&self) -> bool {
        false
    }
}

impl ConsulAgent {
    /// One session, in the watch mode of the run, on the server in front
    /// of the agent's router; a session lost there moves that server to the
    /// end of the list (a real agent's next call goes to the next one).
    async fn session(&mut self, cx: &SessionCx) -> SessionEnd {
        self.ensure_member().await;
        if let Some(b) = &self.shared.connect {
            b.dialing(Instant::now());
        }
        let server = self.router.current();
        self.session_server = server;
        cx.on_server(server);
        let end = if self.shared.cfg.watch == WatchMode::Streaming {
            self.stream_session(cx).await
        } else {
            self.watch_session(cx).await
        };
        match end {
            SessionEnd::Lost(_) => {
                // Failed over: the next server kept the agent's state (a
                // real agent syncs when a server joins, not when it
                // leaves one).
                self.router.failed(server);
                self.moved = self.router.current() != server;
            }
            SessionEnd::Moved => self.moved = true,
            _ => {}
        }
        end
    }

    /// The loop of a session started at `now`: `w`'s connection and
    /// watches (their state in `slots`) and the agent's RPC connection
    /// (`link`, when the run's wire or watches use one) with the catalog
    /// upkeep, until the session ends; the watches are off the probe board
    /// when it returns.
    pub(super) async fn run_watches<W: Watches>(
        &mut self,
        cx: &SessionCx,
        now: Instant,
        slots: &mut [Slot],
        w: &mut W,
        mut link: Option<Box<Link>>,
    ) -> SessionEnd {
        let (reconnect, mut hs) = self.session_sched(now);
        let mut call: Option<UpkeepCall> = None;
        let mut established = false;
        let mut timer = pin!(tokio::time::sleep_until(far_future()));
        let mut cancel = pin!(cx.cancel.cancelled());
        let mut rotate = 0usize;
        let stamp = link.as_ref().and_then(|l| l.stamp.clone());
        let mut kv = self.kv_session(now, stamp, cx.bind_addr);
        let on_link = w.on_link() || kv.on_link();
        let mut roots: Option<Exchange> = None;
        let end = loop {
            let now = Instant::now();
            if let Some(l) = link.as_mut()
                && let Err(e) = l.refill()
            {
                break SessionEnd::lost_with(e.kind, e.detail);
            }
            let due = w.due(self, slots, link.as_mut().map(|l| &mut l.mux), now);
            let due = due.min(self.kv_due(&mut kv, link.as_mut().map(|l| &mut l.mux), now));
            let mut due =
                self.upkeep_due(&mut hs, &mut call, link.as_deref(), cx.bind_addr, now, due);
            if roots.is_none()
                && let Some(l) = link.as_mut()
            {
                roots = self.roots_call(&mut l.mux, &l.line, now);
                if roots.is_none()
                    && let Some(t) = self.roots_retry_at()
                {
                    due = due.min(t);
                }
            }
            wake::arm(timer.as_mut(), due);
            rotate = rotate.wrapping_add(1);
            let io = |tcx: &mut Context<'_>| {
                if let Some(l) = link.as_mut()
                    && let Poll::Ready(r) = l.mux.poll_driver(tcx)
                {
                    return Poll::Ready(Either::Link(r));
                }
                if let Some(f) = roots.as_mut()
                    && let Poll::Ready((_, r)) = f.as_mut().poll(tcx)
                {
                    return Poll::Ready(Either::Roots(r));
                }
                if let Poll::Ready(io) = w.poll(slots, rotate, tcx) {
                    return Poll::Ready(Either::Watch(io));
                }
                kv.poll(rotate, tcx).map(Either::Kv)
            };
            let woke = wake::next(cancel.as_mut(), io, &mut call, Some(timer.as_mut())).await;
            let end = match woke {
                Woke::Cancelled => Some(SessionEnd::Shutdown),
                Woke::Io(Either::Link(r)) if on_link => Some(match r {
                    Ok(()) => SessionEnd::lost("conn_closed"),
                    Err(e) => SessionEnd::lost_with(e.kind, e.detail),
                }),
                Woke::Io(Either::Link(_)) => {
                    // A client agent's pool dials again on the next call,
                    // to the next server if this one was in front.
                    if let Some(l) = link.take() {
                        self.router.failed(l.server);
                    }
                    None
                }
                Woke::Call(Done::Redialed(Ok(l))) => {
                    link = Some(l);
                    None
                }
                Woke::Call(done @ Done::Redialed(Err(_))) => {
                    self.router.failed(self.router.current());
                    self.on_upkeep(cx, &mut hs, slots, done);
                    None
                }
                Woke::Call(Done::Moved(checked)) => {
                    // The rebalance dialed the router's new current server.
                    self.moved_link = checked.filter(|l| l.server == self.router.current());
                    Some(SessionEnd::Moved)
                }
                Woke::Io(Either::Watch(io)) => w.on_io(self, cx, slots, io),
                Woke::Io(Either::Kv(io)) => {
                    self.on_kv(&mut kv, io);
                    None
                }
                Woke::Io(Either::Roots(r)) => {
                    roots = None;
                    self.on_roots(r, Instant::now());
                    None
                }
                Woke::Call(done) => {
                    if done.failed_call().is_some()
                        && let Some(server) = link.as_ref().map(|l| l.server)
                    {
                        // Consul's client: a failed RPC moves its server to
                        // the end of the list, and the next call goes to the
                        // one in front (the streams stay where they are).
                        self.router.failed(server);
                        if !on_link && self.router.current() != server {
                            link = None;
                        }
                    }
                    self.on_upkeep(cx, &mut hs, slots, done);
                    None
                }
                Woke::Timer => {
                    w.on_timer(self, slots);
                    None
                }
            };
            if let Some(end) = end {
                break end;
            }
            self.settle_established(cx, slots, &mut established, reconnect, &hs, W::waiting);
        };
        self.close_slots(cx, slots);
        self.kv_close(&mut kv);
        end
    }

    /// A call of the upkeep finished. Once the server answered a sync, a
    /// watch still silent after its resubscribe (or its query re-sent at
    /// its index) is live. Whether a stream resumed is known from its
    /// first message (a new snapshot may still come from a slow server) or,
    /// if none comes, when the session ends.
    fn on_upkeep(&mut self, cx: &SessionCx, hs: &mut Sched, slots: &mut [Slot], done: Done) {
        self.on_done(cx, hs, done);
        if hs.ae_answered {
            for (i, slot) in slots.iter_mut().enumerate() {
                if slot.resume_pending && !slot.ready {
                    slot.silent = true;
                    self.mark_ready(i, slot);
                }
            }
        }
    }

    /// Starts the upkeep's next call (registration, sync, session, flap,
    /// coordinate, ping) when none is in flight; `due` brought forward to
    /// when one is due.
    fn upkeep_due(
        &mut self,
        hs: &mut Sched,
        call: &mut Option<UpkeepCall>,
        link: Option<&Link>,
        bind: Option<std::net::IpAddr>,
        now: Instant,
        due: Instant,
    ) -> Instant {
        if call.is_none() {
            *call = self.next_call(hs, link.map(|l| &l.line), bind, now);
        }
        match self.upkeep_due_at(hs) {
            Some(t) if call.is_none() => due.min(t),
            _ => due,
        }
    }

    /// The HTTP schedule of a new session, and whether an earlier one ran
    /// (`reconnect`): the server may have lost what we registered, and a
    /// silent resubscribe is confirmed only by a server answer (the first
    /// anti-entropy sync).
    ///
    /// After a move to another server (a rebalance, or a failover to the
    /// router's next server), the cluster kept the agent's state: no
    /// staggered sync, but the router's ping of the new server at once,
    /// whose answer confirms it as a sync's would.
    fn session_sched(&mut self, now: Instant) -> (bool, Sched) {
        let moved = std::mem::take(&mut self.moved);
        let reconnect = self.registered || self.subs.iter().any(|s| s.ever_synced);
        let mut hs = Sched {
            retry_at: now,
            backoff: Backoff::new(HTTP_BACKOFF.0, HTTP_BACKOFF.1),
            flap_due: None,
            ae_due: self.first_sync(now, reconnect && !moved),
            coord_due: None,
            ping_due: None,
            ae_answered: false,
            confirm_by_ping: moved,
            checking: false,
        };
        self.client_schedule(&mut hs, now);
        if moved {
            hs.ping_due = Some(now);
        }
        if self.registered
            && let Some(iv) = self.shared.flap_interval
        {
            hs.flap_due = Some(now + iv.mul_f64(fastrand::f64()));
        }
        (reconnect, hs)
    }

    /// Connected = the server has answered: every watch has its snapshot
    /// (or resumed) and the registration is in place (after a reconnect:
    /// confirmed by a sync). The dial slot is freed with the snapshots, so
    /// a registration that keeps failing does not hold up other agents'
    /// handshakes; and once every watch is ready or only `waiting` for the
    /// staggered sync (a timer, not a handshake), or a storm's comeback
    /// would queue behind up to 12 s of stagger per slot.
    fn settle_established(
        &self,
        cx: &SessionCx,
        slots: &[Slot],
        established: &mut bool,
        reconnect: bool,
        hs: &Sched,
        waiting: impl Fn(&Slot) -> bool,
    ) {
        if *established {
            return;
        }
        if slots.iter().all(|s| s.ready) {
            let registration_ok =
                !self.shared.cfg.register || (self.registered && (!reconnect || hs.ae_answered));
            if registration_ok {
                *established = true;
                cx.established();
            } else {
                cx.release_dial_slot();
            }
        } else if slots.iter().all(|s| s.ready || waiting(s)) {
            cx.release_dial_slot();
        }
    }

    /// The end of a session's watches: those that stayed silent to the end
    /// resumed (the server sent neither a new snapshot nor an event on
    /// them), and every one goes off the probe board here rather than in
    /// `Slots`' drop (the agent keeps the probe still owed its arrival for
    /// its next session).
    fn close_slots(&mut self, cx: &SessionCx, slots: &mut [Slot]) {
        for slot in slots.iter_mut().filter(|s| s.silent && s.resume_pending) {
            slot.silent = false;
            self.shared.metrics.incr(self.shared.ids.resumes_silent);
            cx.resynced(Resync::ResumeSilent);
        }
        for (i, slot) in slots.iter_mut().enumerate() {
            self.uncount(i, slot);
        }
    }
}

impl Agent for ConsulAgent {
    fn run_session<'a>(&'a mut self, cx: &'a SessionCx) -> BoxFuture<'a, SessionEnd> {
        Box::pin(self.session(cx))
    }

    fn finish<'a>(&'a mut self, _cx: &'a SessionCx) -> BoxFuture<'a, ()> {
        Box::pin(self.finish_inner())
    }
}
