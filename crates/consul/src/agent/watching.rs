//! One session of an agent that watches with blocking queries (`--watch
//! blocking`: one RPC connection, `0x04` and yamux, a stream per watched
//! service) or HTTP long polls (`--watch http`: a kept-alive connection per
//! watched service). Registration, TTL session, anti-entropy and the probe
//! work as with streaming; each answer is a whole result, applied to the
//! view as a snapshot (the first) or as the changes it holds.
//!
//! A query is sent again as soon as the last one returns, at the index it
//! returned (Consul's rules: an index that went backwards restarts the
//! watch at 0; after an answer the index is at least 1). An error answered
//! is retried on the same stream with Consul's agent-cache backoff; a
//! broken stream or connection is opened again. After a reconnect each
//! query is re-sent at the view's index: an answer at a later index
//! resumed the watch, one at the same index (its wait ended) resumed it
//! silently; like a silent stream, it counts as live once the server
//! answered the agent's sync.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use agent_sim_fleet::{Failure, SessionCx, SessionEnd};
use agent_sim_net::RxStamp;
use agent_sim_net::http::{Dest, Peer};
use tokio::time::Instant;

use super::ConsulAgent;
use super::session::{Watches, far_future};
use super::subscriptions::{Arrival, Slot, Slots};
use crate::modes::AgentWire;
use crate::rpc::mux::{CallError, Mux};
use crate::watch::http::{HttpWatch, PollFuture};
use crate::watch::msgpack::ServiceNodesArgs;
use crate::watch::rpc::{self, CallFuture};
use crate::watch::{self, WatchMode};

pub(super) type HttpConnect = Pin<
    Box<dyn Future<Output = Result<(HttpWatch, Option<agent_sim_net::RxStamp>), CallError>> + Send>,
>;

/// Where one watched service's query is.
enum Call {
    /// Waiting to be sent (a backoff after a failure, or a new session).
    Idle { at: Instant },
    /// A blocking query in flight.
    Rpc(CallFuture),
    /// An HTTP connection being made.
    Connecting(HttpConnect),
    /// An HTTP long poll in flight.
    Http(PollFuture),
}

/// Session state of one watched service.
struct Watch {
    call: Call,
    /// The stream or connection kept for the next query.
    stream: Option<yamux::Stream>,
    http: Option<HttpWatch>,
    /// Kernel receive stamps of the slot's HTTP connection.
    stamp: Option<agent_sim_net::RxStamp>,
    /// net/rpc sequence of the stream.
    seq: u64,
    /// Failures in a row (Consul's backoff).
    failures: u32,
    /// The index the next query asks past.
    index: u64,
}

/// What a watch brought.
enum Io {
    Answer(
        usize,
        Instant,
        Option<yamux::Stream>,
        Result<rpc::Answer, CallError>,
    ),
    Polled(
        usize,
        Instant,
        Option<HttpWatch>,
        Result<rpc::Answer, CallError>,
    ),
    Connected(
        usize,
        Result<(HttpWatch, Option<agent_sim_net::RxStamp>), CallError>,
    ),
}

/// The watches of a watching session (blocking: on the agent's RPC
/// connection, which the session's loop holds; HTTP: each makes its own
/// connection).
struct Watching {
    watches: Vec<Watch>,
    /// Blocking queries (on the agent's RPC connection), not long polls.
    blocking: bool,
    /// Kernel receive stamps of the RPC connection.
    stamp: Option<RxStamp>,
    /// The session's source address.
    bind: Option<IpAddr>,
}

impl ConsulAgent {
    /// A session watching with blocking queries or HTTP long polls.
    pub(super) async fn watch_session(&mut self, cx: &SessionCx) -> SessionEnd {
        let sh = self.shared.clone();
        // Blocking queries ride the agent's RPC connection, which a client
        // agent holds for its own calls in any watch mode.
        let blocking = sh.cfg.watch == WatchMode::Blocking;
        let link = if blocking || sh.cfg.agent == AgentWire::Client {
            match self.open_link(cx, self.server(), blocking).await {
                Ok(l) => Some(l),
                Err(end) => return end,
            }
        } else {
            None
        };
        let stamp = link.as_ref().and_then(|l| l.stamp.clone());
        let now = Instant::now();
        let (mut slots, watches) = self.watch_slots(now, &stamp);
        let mut w = Watching {
            watches,
            blocking,
            stamp,
            bind: cx.bind_addr,
        };
        self.run_watches(cx, now, &mut slots.v, &mut w, link).await
    }

    /// Sends watch `i`'s next query (an HTTP watch without a connection
    /// first makes one, from `bind`).
    fn start_query(
        &mut self,
        i: usize,
        w: &mut Watch,
        mux: Option<&mut Mux>,
        bind: Option<IpAddr>,
    ) -> Result<(), CallError> {
        let sh = self.shared.clone();
        let sub = &self.subs[i];
        match sh.cfg.watch {
            WatchMode::Blocking => {
                let stream = match w.stream.take() {
                    Some(s) => s,
                    None => {
                        let Some(m) = mux else {
                            return Err(CallError {
                                kind: "conn_closed",
                                detail: "no connection".into(),
                                said_by: None,
                            });
                        };
                        match m.open_now() {
                            Some(Ok(s)) => s,
                            Some(Err(e)) => return Err(e),
                            None => {
                                w.call = Call::Idle {
                                    at: Instant::now() + Duration::from_millis(50),
                                };
                                return Ok(());
                            }
                        }
                    }
                };
                w.seq += 1;
                let args = ServiceNodesArgs {
                    datacenter: &sh.cfg.conn.datacenter,
                    service: &sub.name,
                    min_index: w.index,
                    max_query_time_ns: sh.cfg.blocking_wait.as_nanos() as u64,
                    token: self.token(),
                };
                w.call = Call::Rpc(rpc::call(stream, w.seq, args));
            }
            WatchMode::Http => match w.http.take() {
                Some(conn) => {
                    let path = watch::http::path(
                        &sub.name,
                        &sh.cfg.conn.datacenter,
                        w.index,
                        sh.cfg.blocking_wait.as_secs(),
                    );
                    let token = Some(self.token().to_owned()).filter(|t| !t.is_empty());
                    w.call = Call::Http(watch::http::poll(conn, path, token));
                }
                None => {
                    w.call = Call::Connecting(self.http_connect(bind));
                    return Ok(());
                }
            },
            WatchMode::Streaming => unreachable!("streaming sessions do not watch"),
        }
        sh.metrics.incr(sh.ids.watch_calls);
        Ok(())
    }

    /// A connection of its own to the HTTP API, from the session's source
    /// address, for one long poll after another.
    pub(super) fn http_connect(&self, bind: Option<std::net::IpAddr>) -> HttpConnect {
        let sh = self.shared.clone();
        Box::pin(async move {
            let api = &sh.watch_api;
            let peer = Peer {
                dest: Dest::Addr(api.addr),
                bind,
                tls: api.tls.clone(),
            };
            HttpWatch::connect(peer, api.host.clone(), Some(sh.bytes(true))).await
        })
    }

    /// The session's slots and watches: each query starts at the view's
    /// index (a resume after a reconnect), or at 0 with the view reset.
    fn watch_slots(&mut self, now: Instant, stamp: &Option<RxStamp>) -> (Slots, Vec<Watch>) {
        let mut slots = Slots::new(Vec::with_capacity(self.subs.len()), &self.shared);
        let mut watches: Vec<Watch> = Vec::with_capacity(self.subs.len());
        for sub in &mut self.subs {
            let index = sub.view.resume_index();
            let resync = index == 0 && sub.ever_synced;
            if index == 0 {
                sub.view.reset();
            }
            slots.v.push(Slot {
                resume_pending: index > 0,
                resync,
                ..Slot::new(now)
            });
            watches.push(Watch {
                call: Call::Idle { at: now },
                stream: None,
                http: None,
                stamp: stamp.clone(),
                seq: 0,
                failures: 0,
                index,
            });
        }
        (slots, watches)
    }

    /// Sends the queries that are due; the next instant one is.
    fn start_due(
        &mut self,
        watches: &mut [Watch],
        mut mux: Option<&mut Mux>,
        bind: Option<IpAddr>,
        now: Instant,
    ) -> Instant {
        let mut next = far_future();
        for (i, w) in watches.iter_mut().enumerate() {
            if let Call::Idle { at } = w.call
                && at <= now
                && let Err(e) = self.start_query(i, w, mux.as_deref_mut(), bind)
            {
                self.shared.metrics.error_with(e.kind, Some(&e.detail));
                w.failures += 1;
                w.call = Call::Idle {
                    at: now + watch::backoff(w.failures).max(Duration::from_millis(200)),
                };
            }
            if let Call::Idle { at } = w.call {
                next = next.min(at);
            }
        }
        next
    }

    /// An answer (or a failed query) of watched service `i`.
    fn on_answer(
        &mut self,
        cx: &SessionCx,
        i: usize,
        slot: &mut Slot,
        w: &mut Watch,
        arrival: Arrival,
        r: Result<rpc::Answer, CallError>,
    ) {
        let sh = self.shared.clone();
        let digest = match r {
            Ok(rpc::Answer { result: Ok(d), .. }) => d,
            Ok(rpc::Answer { result: Err(e), .. }) | Err(e) => {
                super::link::count_denial(
                    &sh.metrics,
                    e.kind,
                    crate::watch::msgpack::SERVICE_NODES,
                );
                // Counted once, with the agent's last cause.
                cx.report(&Failure {
                    kind: e.kind,
                    detail: Some(e.detail.clone()),
                    said_by: e.said_by,
                });
                w.failures += 1;
                w.call = Call::Idle {
                    at: Instant::now() + watch::backoff(w.failures),
                };
                return;
            }
        };
        w.failures = 0;
        w.call = Call::Idle { at: Instant::now() };
        let next = watch::next_index(w.index, digest.index);
        if next == 0 && w.index > 0 {
            // The index went backwards: the watch starts over at 0 and the
            // view with it (Consul's rule), as after NewSnapshotToFollow.
            sh.metrics.warn(
                "watch_index_reset",
                Some(&format!(
                    "{}: the index went from {} to {}: watching again from 0",
                    self.subs[i].name, w.index, digest.index
                )),
            );
            let sub = &mut self.subs[i];
            sub.view.reset();
            slot.resync = sub.ever_synced;
            slot.started = arrival.decoded;
            slot.resume_pending = false;
            w.index = 0;
            return;
        }
        if let Some(how) = self.on_result(i, slot, arrival, &digest) {
            cx.resynced(how);
        }
        w.index = next;
    }
}

impl Watches for Watching {
    type Io = Io;

    fn due(
        &mut self,
        agent: &mut ConsulAgent,
        _: &mut [Slot],
        mux: Option<&mut Mux>,
        now: Instant,
    ) -> Instant {
        agent.start_due(&mut self.watches, mux, self.bind, now)
    }

    fn poll(&mut self, _: &mut [Slot], rotate: usize, tcx: &mut Context<'_>) -> Poll<Io> {
        poll_watches(&mut self.watches, rotate, tcx)
    }

    fn on_io(
        &mut self,
        agent: &mut ConsulAgent,
        cx: &SessionCx,
        slots: &mut [Slot],
        io: Io,
    ) -> Option<SessionEnd> {
        let watches = &mut self.watches;
        match io {
            Io::Answer(i, decoded, stream, r) => {
                watches[i].stream = stream;
                let kernel = self.stamp.as_ref().and_then(|s| s.instant(decoded));
                let arrival = Arrival { decoded, kernel };
                agent.on_answer(cx, i, &mut slots[i], &mut watches[i], arrival, r);
            }
            Io::Polled(i, decoded, conn, r) => {
                watches[i].http = conn;
                let kernel = watches[i].stamp.as_ref().and_then(|s| s.instant(decoded));
                let arrival = Arrival { decoded, kernel };
                agent.on_answer(cx, i, &mut slots[i], &mut watches[i], arrival, r);
            }
            Io::Connected(i, Ok((conn, s))) => {
                let w = &mut watches[i];
                w.http = Some(conn);
                w.stamp = s;
                if let Err(e) = agent.start_query(i, w, None, self.bind) {
                    agent.shared.metrics.error_with(e.kind, Some(&e.detail));
                }
            }
            Io::Connected(i, Err(e)) => {
                let w = &mut watches[i];
                agent.shared.metrics.error_with(e.kind, Some(&e.detail));
                w.failures += 1;
                w.call = Call::Idle {
                    at: Instant::now() + watch::backoff(w.failures).max(Duration::from_millis(500)),
                };
            }
        }
        None
    }

    fn on_timer(&mut self, _: &mut ConsulAgent, _: &mut [Slot]) {}

    /// A query re-sent at its index waits only for the sync.
    fn waiting(s: &Slot) -> bool {
        s.resume_pending
    }

    /// Blocking queries ride the agent's RPC connection.
    fn on_link(&self) -> bool {
        self.blocking
    }
}

/// The first query of `watches` that finished, starting at `rotate` (so
/// no slot starves the others).
fn poll_watches(watches: &mut [Watch], rotate: usize, tcx: &mut Context<'_>) -> Poll<Io> {
    let n = watches.len();
    for j in 0..n {
        let i = (j + rotate) % n;
        match &mut watches[i].call {
            Call::Rpc(f) => {
                if let Poll::Ready((s, r)) = f.as_mut().poll(tcx) {
                    return Poll::Ready(Io::Answer(i, Instant::now(), s, r));
                }
            }
            Call::Http(f) => {
                if let Poll::Ready((c, r)) = f.as_mut().poll(tcx) {
                    return Poll::Ready(Io::Polled(i, Instant::now(), c, r));
                }
            }
            Call::Connecting(f) => {
                if let Poll::Ready(r) = f.as_mut().poll(tcx) {
                    return Poll::Ready(Io::Connected(i, r));
                }
            }
            Call::Idle { .. } => {}
        }
    }
    Poll::Pending
}
