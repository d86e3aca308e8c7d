//! One session of an agent: the entry the engine calls, and the loop every
//! watch mode runs. A watch mode brings its connection and watches as a
//! [`Watches`] (`streaming`: Subscribe streams; `watching`: blocking
//! queries or HTTP long polls); the catalog upkeep, the rule for when the
//! session is established and the watches' end on the probe board are
//! here, the same for all.
//!
//! The loop, top to bottom, each turn: start what is due (`turn_due`),
//! one wait over the agent's RPC connection, the roots query, gossip's
//! news of the servers ([`super::news`]), the watches,
//! the KV reads, at most one upkeep call and one timer
//! (`agent_sim_fleet::wake`), then one handler per wake (`on_woke`), which
//! says what the session does next ([`Next`]): stay, move the agent off a
//! server ([`Move`]) or end. Every move between servers, in the loop and
//! at a session's end, is made in one place: `move_to`.

use std::pin::{Pin, pin};
use std::task::{Context, Poll};
use std::time::Duration;

use agent_sim_fleet::wake::{self, Woke};
use agent_sim_fleet::{Agent, Backoff, BoxFuture, Resync, SessionCx, SessionEnd};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::WaitForCancellationFuture;

use super::kv::{KvIo, KvSession};
use super::link::Link;
use super::news::NewsWatch;
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
    /// Gossip's news of the servers changed.
    News(tokio::sync::watch::Receiver<agent_sim_gossip::News>),
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

/// What a handler of a wake asks of the session.
enum Next {
    /// The session goes on.
    Stay,
    /// The agent leaves a server (the session ends if the move says so).
    MoveTo(Move),
    /// The session ends.
    End(SessionEnd),
}

/// Why the agent leaves a server: Consul's router moves that server to
/// the end of its list, and the next call (or session) goes to the one in
/// front. Every such move is made by [`ConsulAgent::move_to`].
enum Move {
    /// The session on this server was lost (failed over: the next server
    /// kept the agent's state; a real agent syncs when a server joins, not
    /// when it leaves one).
    Lost(usize),
    /// The agent's RPC connection to this server closed under watches that
    /// go on (a client agent): its pool dials again on the next call.
    LinkClosed(usize),
    /// Dialing the RPC connection again failed: the server in front.
    RedialFailed,
    /// An RPC of the upkeep failed on this server (Consul's client): the
    /// calls follow the router, the streams stay where they are.
    CallFailed(usize),
    /// A rebalance put another server in front: the session ends, and the
    /// next one keeps the connection the move checked it on, if any.
    Rebalanced(Option<Box<Link>>),
}

/// The state of one session's loop, built once at its start: what it
/// drives (`w`'s watches, their `slots`, the RPC connection, the KV reads,
/// the upkeep's call, the roots query, gossip's news) and where the
/// session stands.
struct Turns<'s, W> {
    cx: &'s SessionCx,
    slots: &'s mut [Slot],
    w: &'s mut W,
    /// The agent's RPC connection, when the run's wire or watches use one.
    link: Option<Box<Link>>,
    /// The end of `link` is the session's (the watches or the KV reads
    /// ride it).
    on_link: bool,
    kv: KvSession,
    /// The upkeep's schedule, and its call in flight.
    hs: Sched,
    call: Option<UpkeepCall>,
    /// The blocking roots query in flight (agents keeping a leaf).
    roots: Option<Exchange>,
    /// Gossip's news of the servers (client agents that gossip).
    news: Option<NewsWatch>,
    /// An earlier session ran ([`ConsulAgent::session_sched`]).
    reconnect: bool,
    /// The engine was told the session is established.
    established: bool,
    /// Where the next poll of the watches starts.
    rotate: usize,
}

impl<W: Watches> Turns<'_, W> {
    /// The next wake: cancellation, then the RPC connection, the roots
    /// query, gossip's news, the watches (from the next in turn) and the
    /// KV reads, then the upkeep's call, then `timer`.
    async fn wait(
        &mut self,
        cancel: Pin<&mut WaitForCancellationFuture<'_>>,
        timer: Pin<&mut Sleep>,
    ) -> Woke<Either<W::Io>, Done> {
        self.rotate = self.rotate.wrapping_add(1);
        let rotate = self.rotate;
        let io = |tcx: &mut Context<'_>| {
            if let Some(l) = self.link.as_mut()
                && let Poll::Ready(r) = l.mux.poll_driver(tcx)
            {
                return Poll::Ready(Either::Link(r));
            }
            if let Some(f) = self.roots.as_mut()
                && let Poll::Ready((_, r)) = f.as_mut().poll(tcx)
            {
                return Poll::Ready(Either::Roots(r));
            }
            if let Some(n) = self.news.as_mut()
                && let Poll::Ready(rx) = n.poll(tcx)
            {
                return Poll::Ready(Either::News(rx));
            }
            if let Poll::Ready(io) = self.w.poll(self.slots, rotate, tcx) {
                return Poll::Ready(Either::Watch(io));
            }
            self.kv.poll(rotate, tcx).map(Either::Kv)
        };
        wake::next(cancel, io, &mut self.call, Some(timer)).await
    }

    /// The agent's RPC connection ended: the session's end when the
    /// watches ride it; otherwise (a client agent's pool dials again on the
    /// next call) a move off its server.
    fn on_link_end(&mut self, r: Result<(), CallError>) -> Next {
        if self.on_link {
            return Next::End(match r {
                Ok(()) => SessionEnd::lost("conn_closed"),
                Err(e) => lost(e),
            });
        }
        match self.link.take() {
            Some(l) => Next::MoveTo(Move::LinkClosed(l.server)),
            None => Next::Stay,
        }
    }
}

/// The session's end for a broken RPC connection.
fn lost(e: CallError) -> SessionEnd {
    SessionEnd::Lost(agent_sim_fleet::Failure {
        kind: e.kind,
        detail: Some(e.detail),
        said_by: e.said_by,
    })
}

impl ConsulAgent {
    /// One session, in the watch mode of the run, on the server in front
    /// of the agent's router; a session lost there moves that server to the
    /// end of the list (a real agent's next call goes to the next one).
    async fn session(&mut self, cx: &SessionCx) -> SessionEnd {
        // A real agent asks for its certificate before it joins or calls.
        if let Some(asking) = self.auto_encrypt(cx)
            && let Err(end) = asking.await
        {
            return end;
        }
        if let Err(end) = self.ensure_member().await {
            return end;
        }
        if let Some(b) = &self.shared.connect {
            b.dialing(Instant::now());
        }
        self.follow_now();
        let server = self.router.current();
        // Router indexes are u16 (at most 65,535 servers).
        self.session_server = server as u16;
        cx.on_server(server);
        let end = if self.shared.cfg.watch == WatchMode::Streaming {
            self.stream_session(cx).await
        } else {
            self.watch_session(cx).await
        };
        if let SessionEnd::Lost(_) = end {
            self.move_to(Move::Lost(server), &mut None, false);
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
        link: Option<Box<Link>>,
    ) -> SessionEnd {
        let mut s = self.turns(cx, now, slots, w, link);
        let mut timer = pin!(tokio::time::sleep_until(far_future()));
        let mut cancel = pin!(cx.cancel.cancelled());
        let end = loop {
            let due = match self.turn_due(&mut s, Instant::now()) {
                Ok(due) => due,
                Err(end) => break end,
            };
            wake::arm(timer.as_mut(), due);
            let woke = s.wait(cancel.as_mut(), timer.as_mut()).await;
            let next = self.on_woke(&mut s, woke);
            if let Some(end) = self.go(&mut s, next) {
                break end;
            }
            self.settle_established(&mut s);
        };
        self.close_slots(cx, s.slots);
        self.kv_close(&mut s.kv);
        end
    }

    /// The loop's state at the start of a session at `now`.
    fn turns<'s, W: Watches>(
        &mut self,
        cx: &'s SessionCx,
        now: Instant,
        slots: &'s mut [Slot],
        w: &'s mut W,
        link: Option<Box<Link>>,
    ) -> Turns<'s, W> {
        let (reconnect, mut hs) = self.session_sched(now);
        let news = self.news_watch(&mut hs, now);
        let stamp = link.as_ref().and_then(|l| l.stamp.clone());
        let kv = self.kv_session(now, stamp, cx.bind_addr);
        Turns {
            on_link: w.on_link() || kv.on_link(),
            cx,
            slots,
            w,
            link,
            kv,
            hs,
            call: None,
            roots: None,
            news,
            reconnect,
            established: false,
            rotate: 0,
        }
    }

    /// The top of a turn: the RPC connection gets a call stream, and what
    /// is due starts (the watches, the KV reads, the upkeep's next call,
    /// the roots query); when the next thing is due, or the session's end
    /// when the connection broke.
    fn turn_due<W: Watches>(
        &mut self,
        s: &mut Turns<'_, W>,
        now: Instant,
    ) -> Result<Instant, SessionEnd> {
        if let Some(l) = s.link.as_mut() {
            l.refill().map_err(lost)?;
        }
        let due =
            s.w.due(self, s.slots, s.link.as_mut().map(|l| &mut l.mux), now);
        let due = due.min(self.kv_due(&mut s.kv, s.link.as_mut().map(|l| &mut l.mux), now));
        let mut due = self.upkeep_due(
            &mut s.hs,
            &mut s.call,
            s.link.as_deref(),
            s.cx.bind_addr,
            now,
            due,
        );
        if s.roots.is_none()
            && let Some(l) = s.link.as_mut()
        {
            s.roots = self.roots_call(&mut l.mux, &l.line, now);
            if s.roots.is_none()
                && let Some(t) = self.roots_retry_at()
            {
                due = due.min(t);
            }
        }
        Ok(due)
    }

    /// One handler per wake; what the session does next.
    fn on_woke<W: Watches>(
        &mut self,
        s: &mut Turns<'_, W>,
        woke: Woke<Either<W::Io>, Done>,
    ) -> Next {
        match woke {
            Woke::Cancelled => Next::End(SessionEnd::Shutdown),
            Woke::Io(Either::Link(r)) => s.on_link_end(r),
            Woke::Io(Either::Roots(r)) => {
                s.roots = None;
                self.on_roots(r, Instant::now());
                Next::Stay
            }
            Woke::Io(Either::Watch(io)) => match s.w.on_io(self, s.cx, s.slots, io) {
                Some(end) => Next::End(end),
                None => Next::Stay,
            },
            Woke::Io(Either::Kv(io)) => {
                self.on_kv(&mut s.kv, io);
                Next::Stay
            }
            Woke::Io(Either::News(rx)) => {
                s.news = Some(self.on_news(&mut s.hs, rx, Instant::now()));
                Next::Stay
            }
            Woke::Call(done) => self.on_call(s, done),
            Woke::Timer => {
                s.w.on_timer(self, s.slots);
                Next::Stay
            }
        }
    }

    /// A call of the upkeep finished: a new RPC connection is the
    /// session's; a rebalance, a failed dial or a failed RPC moves the
    /// agent off a server. The upkeep handles every other result, and the
    /// failures before their move is made (the order changes nothing: the
    /// upkeep moves a server itself only for a failed ping on the API's
    /// wire, where the only RPC connection is the session's own server's).
    fn on_call<W: Watches>(&mut self, s: &mut Turns<'_, W>, done: Done) -> Next {
        let why = match done {
            Done::Redialed(Ok(l)) => {
                s.link = Some(l);
                return Next::Stay;
            }
            Done::Moved(checked) => return Next::MoveTo(Move::Rebalanced(checked)),
            Done::Redialed(Err(_)) => Some(Move::RedialFailed),
            ref d if d.failed_call().is_some() => {
                s.link.as_ref().map(|l| Move::CallFailed(l.server))
            }
            _ => None,
        };
        self.on_upkeep(s.cx, &mut s.hs, s.slots, done);
        why.map_or(Next::Stay, Next::MoveTo)
    }

    /// Does what a handler asked; the session's end, if it ends.
    fn go<W: Watches>(&mut self, s: &mut Turns<'_, W>, next: Next) -> Option<SessionEnd> {
        match next {
            Next::Stay => None,
            Next::MoveTo(why) => self.move_to(why, &mut s.link, s.on_link),
            Next::End(end) => Some(end),
        }
    }

    /// The agent leaves a server, for `why`: the one place the agent moves
    /// between servers. `link` is the session's RPC connection (none at a
    /// session's end) and `on_link` whether the session rides it; the
    /// session's end when the move ends it (a rebalance).
    fn move_to(
        &mut self,
        why: Move,
        link: &mut Option<Box<Link>>,
        on_link: bool,
    ) -> Option<SessionEnd> {
        match why {
            Move::Lost(server) => {
                self.router.failed(server);
                self.moved = self.router.current() != server;
            }
            Move::LinkClosed(server) => self.router.failed(server),
            Move::RedialFailed => self.router.failed(self.router.current()),
            Move::CallFailed(server) => {
                self.router.failed(server);
                // The next call goes to the one in front now, on a
                // connection dialed there (unless the session rides this
                // one).
                if !on_link && self.router.current() != server {
                    *link = None;
                }
            }
            Move::Rebalanced(checked) => {
                // The rebalance dialed the router's new current server.
                self.moved_link = checked.filter(|l| l.server == self.router.current());
                self.moved = true;
                return Some(SessionEnd::Moved);
            }
        }
        None
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
            server_up_pending: false,
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
    fn settle_established<W: Watches>(&self, s: &mut Turns<'_, W>) {
        if s.established {
            return;
        }
        if s.slots.iter().all(|s| s.ready) {
            let registration_ok = !self.shared.cfg.register
                || (self.registered && (!s.reconnect || s.hs.ae_answered));
            if registration_ok {
                s.established = true;
                s.cx.established();
            } else {
                s.cx.release_dial_slot();
            }
        } else if s.slots.iter().all(|slot| slot.ready || W::waiting(slot)) {
            s.cx.release_dial_slot();
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
