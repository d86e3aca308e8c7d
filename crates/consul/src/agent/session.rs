//! One session of an agent: dial, then one loop that polls the connection
//! driver, every stream, at most one HTTP call and one timer together.

use super::*;

pub(super) enum Wake {
    Cancelled,
    ConnClosed(&'static str, Option<String>),
    Started(usize, Result<Streaming<Event>, Status>),
    Event(usize, Instant, Result<Event, Status>),
    StreamEnd(usize),
    Http(HttpDone),
    Timer,
}

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

pub(super) fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(3600)
}

impl ConsulAgent {
    pub(super) async fn session(&mut self, cx: &SessionCx) -> SessionEnd {
        let sh = self.shared.clone();
        if sh.cfg.watch != crate::watch::WatchMode::Streaming {
            return self.watch_session(cx).await;
        }
        let dialer = &sh.dialers[(self.index as usize) % sh.dialers.len()];
        let t = Instant::now();
        let conn = match dialer.connect_session(cx, Some(sh.bytes(true))).await {
            Ok(c) => c,
            Err(end) => return end,
        };
        sh.metrics
            .record(sh.ids.connect, self.index as usize, t.elapsed());
        let first_bytes = conn.first_bytes.clone();
        let (end, answered) = self.steady(cx, conn).await;
        match end {
            // Ended before the server answered any call: say what was on
            // the other end when the first bytes tell (HTTP port, a
            // connection cap that closes at once, a gRPC port). A keepalive
            // timeout is a server that stalls, not one that closed.
            SessionEnd::Lost(f) if !answered && f.kind != "keepalive_timeout" => {
                match conn::what_answered(&first_bytes) {
                    Some((kind, words)) => SessionEnd::lost_with(
                        kind,
                        match f.detail {
                            Some(d) => format!("{words} ({}: {d})", f.kind),
                            None => format!("{words} ({})", f.kind),
                        },
                    ),
                    None => SessionEnd::Lost(f),
                }
            }
            end => end,
        }
    }

    /// The session on an established connection; also whether the server
    /// answered any call (a stream event or a call's reply).
    pub(super) async fn steady(&mut self, cx: &SessionCx, conn: RpcConn) -> (SessionEnd, bool) {
        let RpcConn {
            grpc,
            mut driver,
            stamp,
            ..
        } = conn;
        let mut answered = false;
        let now = Instant::now();
        let slots: Vec<Slot> = (0..self.subs.len())
            .map(|_| Slot {
                state: SlotState::Done,
                ready: false,
                mark: None,
                started: now,
                resume_pending: false,
                silent: false,
                resync: false,
                backoff: None,
            })
            .collect();
        // Uncounts live probe subscriptions however the session ends.
        let mut slots = Slots {
            v: slots,
            board: self.shared.board.clone(),
        };
        let slots = &mut slots.v;
        for (i, slot) in slots.iter_mut().enumerate() {
            self.start_slot(i, slot, &grpc);
        }
        let (reconnect, mut hs) = self.session_sched(now);
        let mut http_op: Option<HttpFuture> = None;
        let mut established = false;
        let mut sleep = pin!(tokio::time::sleep_until(far_future()));
        let mut cancel = pin!(cx.cancel.cancelled());
        let mut rotate = 0usize;
        let end = loop {
            let now = Instant::now();
            let mut deadline = far_future();
            for slot in slots.iter() {
                if let SlotState::Idle { at } = slot.state {
                    deadline = deadline.min(at);
                }
            }
            let deadline = self.upkeep_due(&mut hs, &mut http_op, now, deadline);
            if sleep.deadline() != deadline {
                sleep.as_mut().reset(deadline);
            }
            rotate = rotate.wrapping_add(1);
            let wake = std::future::poll_fn(|tcx| {
                if cancel.as_mut().poll(tcx).is_ready() {
                    return Poll::Ready(Wake::Cancelled);
                }
                if let Poll::Ready(r) = driver.as_mut().poll(tcx) {
                    // A server going away says so on its streams before it
                    // closes: that is the cause, in its words.
                    if let Some((i, status)) = shutting_down(slots, tcx) {
                        return Poll::Ready(Wake::Event(i, Instant::now(), Err(status)));
                    }
                    let (kind, words) = driver_kind(r);
                    return Poll::Ready(Wake::ConnClosed(kind, words));
                }
                let n = slots.len();
                for j in 0..n {
                    let i = (j + rotate) % n;
                    match &mut slots[i].state {
                        SlotState::Starting(f) => {
                            if let Poll::Ready(r) = f.as_mut().poll(tcx) {
                                return Poll::Ready(Wake::Started(i, r));
                            }
                        }
                        SlotState::Live(s) => match Pin::new(s).poll_next(tcx) {
                            Poll::Ready(Some(r)) => {
                                return Poll::Ready(Wake::Event(i, Instant::now(), r));
                            }
                            Poll::Ready(None) => return Poll::Ready(Wake::StreamEnd(i)),
                            Poll::Pending => {}
                        },
                        SlotState::Idle { .. } | SlotState::Done => {}
                    }
                }
                if let Some(op) = http_op.as_mut()
                    && let Poll::Ready(done) = op.as_mut().poll(tcx)
                {
                    return Poll::Ready(Wake::Http(done));
                }
                if sleep.as_mut().poll(tcx).is_ready() {
                    return Poll::Ready(Wake::Timer);
                }
                Poll::Pending
            })
            .await;
            match wake {
                Wake::Cancelled => break SessionEnd::Shutdown,
                Wake::ConnClosed(kind, None) => break SessionEnd::lost(kind),
                Wake::ConnClosed(kind, Some(words)) => break SessionEnd::lost_with(kind, words),
                Wake::Started(i, Ok(stream)) => {
                    answered = true;
                    slots[i].state = SlotState::Live(stream);
                }
                Wake::Started(i, Err(status)) => {
                    answered |= server_said(&status);
                    let slot = &mut slots[i];
                    slot.state = SlotState::Done;
                    if let Some(end) = self.on_status(cx, i, slot, &status, &grpc) {
                        break end;
                    }
                }
                Wake::Event(i, decoded, Ok(ev)) => {
                    answered = true;
                    let kernel = stamp.as_ref().and_then(|s| s.instant(decoded));
                    if let Some(how) =
                        self.on_event(i, &mut slots[i], Arrival { decoded, kernel }, &ev)
                    {
                        // Counted for the disruption this agent was lost in.
                        cx.resynced(how);
                    }
                }
                Wake::Event(i, _, Err(status)) => {
                    answered |= server_said(&status);
                    let slot = &mut slots[i];
                    slot.state = SlotState::Done;
                    if let Some(end) = self.on_status(cx, i, slot, &status, &grpc) {
                        break end;
                    }
                }
                Wake::StreamEnd(i) => {
                    // The server ended the stream (status OK): a stream
                    // failure like any other, in our words (it said none).
                    answered = true;
                    let words = if self.subs[i].view.resume_index() == 0 {
                        "the server ended the stream (status OK) before EndOfSnapshot"
                    } else {
                        "the server ended the stream (status OK)"
                    };
                    let slot = &mut slots[i];
                    slot.state = SlotState::Done;
                    self.retry_stream(cx, i, slot, ("stream_end", words.into()), false, &grpc);
                }
                Wake::Http(done) => {
                    http_op = None;
                    self.on_http(cx, &mut hs, done);
                    if hs.ae_answered {
                        // The server answered: a stream still silent after
                        // its resubscribe is live. Whether it resumed is
                        // known from its first message (a new snapshot may
                        // still come from a slow server) or, if none comes,
                        // when the session ends.
                        for (i, slot) in slots.iter_mut().enumerate() {
                            if slot.resume_pending && !slot.ready {
                                slot.silent = true;
                                self.mark_ready(i, slot);
                            }
                        }
                    }
                }
                Wake::Timer => {
                    let now = Instant::now();
                    for (i, slot) in slots.iter_mut().enumerate() {
                        if let SlotState::Idle { at } = slot.state
                            && at <= now
                        {
                            self.start_slot(i, slot, &grpc);
                        }
                    }
                }
            }
            // A resubscribe accepted waits only for the sync.
            self.settle_established(cx, slots, &mut established, reconnect, &hs, |s| {
                s.resume_pending && matches!(s.state, SlotState::Live(_))
            });
        };
        self.close_slots(cx, slots);
        (end, answered)
    }

    /// Starts the next HTTP call (registration, session, flap, sync) when
    /// none is in flight; `due` brought forward to when one is due.
    pub(super) fn upkeep_due(
        &mut self,
        hs: &mut HttpSched,
        http_op: &mut Option<HttpFuture>,
        now: Instant,
        due: Instant,
    ) -> Instant {
        if http_op.is_none() {
            *http_op = self.next_http(hs, now);
        }
        match self.http_due(hs) {
            Some(t) if http_op.is_none() => due.min(t),
            _ => due,
        }
    }

    /// The HTTP schedule of a new session, and whether an earlier one ran
    /// (`reconnect`): the server may have lost what we registered, and a
    /// silent resubscribe is confirmed only by a server answer (the first
    /// anti-entropy sync).
    pub(super) fn session_sched(&self, now: Instant) -> (bool, HttpSched) {
        let reconnect = self.registered || self.subs.iter().any(|s| s.ever_synced);
        let mut hs = HttpSched {
            retry_at: now,
            backoff: Backoff::new(HTTP_BACKOFF.0, HTTP_BACKOFF.1),
            flap_due: None,
            ae_due: self.first_sync(now, reconnect),
            ae_answered: false,
        };
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
    pub(super) fn settle_established(
        &self,
        cx: &SessionCx,
        slots: &[Slot],
        established: &mut bool,
        reconnect: bool,
        hs: &HttpSched,
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
    pub(super) fn close_slots(&mut self, cx: &SessionCx, slots: &mut [Slot]) {
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

/// On a connection that has closed: a stream whose last word was the
/// server shutting down (events still buffered before it are dropped: the
/// session ends here).
fn shutting_down(slots: &mut [Slot], tcx: &mut std::task::Context<'_>) -> Option<(usize, Status)> {
    for (i, slot) in slots.iter_mut().enumerate() {
        let SlotState::Live(s) = &mut slot.state else {
            continue;
        };
        loop {
            match Pin::new(&mut *s).poll_next(tcx) {
                Poll::Ready(Some(Ok(_))) => continue,
                Poll::Ready(Some(Err(status)))
                    if subscriptions::grpc_kind(&status) == "server_shutting_down" =>
                {
                    return Some((i, status));
                }
                _ => break,
            }
        }
    }
    None
}

/// Kind of a finished connection driver, and the transport's words when it
/// failed (what hyper/h2 say: a reset, a GOAWAY and its reason, an I/O error).
pub(super) fn driver_kind(r: Result<(), hyper::Error>) -> (&'static str, Option<String>) {
    match r {
        Ok(()) => ("conn_closed", None),
        Err(e) if e.is_timeout() => ("keepalive_timeout", Some(http::error_chain(&e))),
        Err(e) => ("conn_error", Some(http::error_chain(&e))),
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
