//! A session of an agent that watches with Subscribe streams (the default,
//! as a client agent with `use_streaming_backend`): dial the agent's server
//! (boxed connect step), one stream per upstream on that single HTTP/2
//! connection, then the session's loop (`session`) over the connection
//! driver and every stream.

use std::pin::Pin;
use std::task::{Context, Poll};

use agent_sim_fleet::{Failure, SessionCx, SessionEnd};
use agent_sim_net::RxStamp;
use agent_sim_proto::consul::subscribe::Event;
use futures_util::Stream;
use tokio::time::Instant;
use tonic::Status;
use tonic::codec::Streaming;

use super::ConsulAgent;
use super::link::Link;
use super::session::{Watches, far_future};
use super::subscriptions::{Arrival, Slot, SlotState, Slots, grpc_kind};
use crate::conn::{self, ConnDriver, GrpcClient, RpcConn};
use crate::ended::{driver_failure, server_said};
use crate::modes::AgentWire;
use crate::rpc::mux::Mux;

/// What the connection or a stream brought.
pub(super) enum Io {
    /// The connection ended.
    Closed(Failure),
    Started(usize, Result<Streaming<Event>, Status>),
    Event(usize, Instant, Result<Event, Status>),
    /// The server ended stream `i` with status OK.
    StreamEnd(usize),
}

/// The connection of a streaming session, and whether the server answered
/// any call on it (a stream event or a call's reply).
struct Streams {
    grpc: GrpcClient,
    driver: ConnDriver,
    stamp: Option<RxStamp>,
    answered: bool,
}

impl ConsulAgent {
    /// Dial, then the streams until the session ends. A session that ends
    /// before the server answered anything says what was on the other end
    /// when the first bytes tell.
    pub(super) async fn stream_session(&mut self, cx: &SessionCx) -> SessionEnd {
        let sh = self.shared.clone();
        let server = self.server();
        let dialer = &sh.dialers[server];
        let t = Instant::now();
        let conn = match dialer.connect_session(cx, Some(sh.bytes(true))).await {
            Ok(c) => c,
            Err(end) => return end,
        };
        sh.metrics
            .record(sh.ids.connect, self.index as usize, t.elapsed());
        let first_bytes = conn.first_bytes.clone();
        // A client agent also holds its RPC connection for its own calls.
        let link = match sh.cfg.agent {
            AgentWire::Client => match self.open_link(cx, server, false).await {
                Ok(l) => Some(l),
                Err(end) => return end,
            },
            AgentWire::Api => None,
        };
        let (end, answered) = self.steady(cx, conn, link).await;
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
    /// answered any call.
    async fn steady(
        &mut self,
        cx: &SessionCx,
        conn: RpcConn,
        link: Option<Box<Link>>,
    ) -> (SessionEnd, bool) {
        let RpcConn {
            grpc,
            driver,
            stamp,
            ..
        } = conn;
        let now = Instant::now();
        // Uncounts live probe subscriptions however the session ends.
        let mut slots = Slots {
            v: (0..self.subs.len()).map(|_| Slot::new(now)).collect(),
            board: self.shared.board.clone(),
        };
        for (i, slot) in slots.v.iter_mut().enumerate() {
            self.start_slot(i, slot, &grpc);
        }
        let mut streams = Streams {
            grpc,
            driver,
            stamp,
            answered: false,
        };
        let end = self
            .run_watches(cx, now, &mut slots.v, &mut streams, link)
            .await;
        (end, streams.answered)
    }
}

impl Watches for Streams {
    type Io = Io;

    fn due(
        &mut self,
        _: &mut ConsulAgent,
        slots: &mut [Slot],
        _: Option<&mut Mux>,
        _: Instant,
    ) -> Instant {
        let mut due = far_future();
        for slot in slots.iter() {
            if let SlotState::Idle { at } = slot.state {
                due = due.min(at);
            }
        }
        due
    }

    fn poll(&mut self, slots: &mut [Slot], rotate: usize, tcx: &mut Context<'_>) -> Poll<Io> {
        if let Poll::Ready(r) = self.driver.as_mut().poll(tcx) {
            // A server going away says so on its streams before it
            // closes: that is the cause, in its words.
            if let Some((i, status)) = shutting_down(slots, tcx) {
                return Poll::Ready(Io::Event(i, Instant::now(), Err(status)));
            }
            return Poll::Ready(Io::Closed(driver_failure(r)));
        }
        let n = slots.len();
        for j in 0..n {
            let i = (j + rotate) % n;
            match &mut slots[i].state {
                SlotState::Starting(f) => {
                    if let Poll::Ready(r) = f.as_mut().poll(tcx) {
                        return Poll::Ready(Io::Started(i, r));
                    }
                }
                SlotState::Live(s) => match Pin::new(s).poll_next(tcx) {
                    Poll::Ready(Some(r)) => return Poll::Ready(Io::Event(i, Instant::now(), r)),
                    Poll::Ready(None) => return Poll::Ready(Io::StreamEnd(i)),
                    Poll::Pending => {}
                },
                SlotState::Idle { .. } | SlotState::Done => {}
            }
        }
        Poll::Pending
    }

    fn on_io(
        &mut self,
        agent: &mut ConsulAgent,
        cx: &SessionCx,
        slots: &mut [Slot],
        io: Io,
    ) -> Option<SessionEnd> {
        match io {
            Io::Closed(f) => return Some(SessionEnd::Lost(f)),
            Io::Started(i, Ok(stream)) => {
                self.answered = true;
                slots[i].state = SlotState::Live(stream);
            }
            Io::Started(i, Err(status)) | Io::Event(i, _, Err(status)) => {
                self.answered |= server_said(&status);
                let slot = &mut slots[i];
                slot.state = SlotState::Done;
                return agent.on_status(cx, i, slot, &status, &self.grpc);
            }
            Io::Event(i, decoded, Ok(ev)) => {
                self.answered = true;
                let kernel = self.stamp.as_ref().and_then(|s| s.instant(decoded));
                let arrival = Arrival { decoded, kernel };
                if let Some(how) = agent.on_event(i, &mut slots[i], arrival, &ev) {
                    // Counted for the disruption this agent was lost in.
                    cx.resynced(how);
                }
            }
            Io::StreamEnd(i) => {
                // The server ended the stream (status OK): a stream failure
                // like any other, in our words (it said none).
                self.answered = true;
                let words = if agent.subs[i].view.resume_index() == 0 {
                    "the server ended the stream (status OK) before EndOfSnapshot"
                } else {
                    "the server ended the stream (status OK)"
                };
                let slot = &mut slots[i];
                slot.state = SlotState::Done;
                let failure = ("stream_end", words.into());
                agent.retry_stream(cx, i, slot, failure, false, &self.grpc);
            }
        }
        None
    }

    fn on_timer(&mut self, agent: &mut ConsulAgent, slots: &mut [Slot]) {
        let now = Instant::now();
        for (i, slot) in slots.iter_mut().enumerate() {
            if let SlotState::Idle { at } = slot.state
                && at <= now
            {
                agent.start_slot(i, slot, &self.grpc);
            }
        }
    }

    /// A resubscribe accepted waits only for the sync.
    fn waiting(s: &Slot) -> bool {
        s.resume_pending && matches!(s.state, SlotState::Live(_))
    }
}

/// On a connection that has closed: a stream whose last word was the
/// server shutting down (events still buffered before it are dropped: the
/// session ends here).
fn shutting_down(slots: &mut [Slot], tcx: &mut Context<'_>) -> Option<(usize, Status)> {
    for (i, slot) in slots.iter_mut().enumerate() {
        let SlotState::Live(s) = &mut slot.state else {
            continue;
        };
        loop {
            match Pin::new(&mut *s).poll_next(tcx) {
                Poll::Ready(Some(Ok(_))) => continue,
                Poll::Ready(Some(Err(status))) if grpc_kind(&status) == "server_shutting_down" => {
                    return Some((i, status));
                }
                _ => break,
            }
        }
    }
    None
}
