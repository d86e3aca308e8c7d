//! A session of an agent that watches with Subscribe streams (the default,
//! as a client agent with `use_streaming_backend`): dial the agent's server
//! (boxed connect step), one stream per upstream on that single HTTP/2
//! connection, then the session's loop (`session`) over the connection
//! driver and every stream.

use std::task::{Context, Poll};

use agent_sim_fleet::{Failure, SessionCx, SessionEnd};
use agent_sim_metrics::Metrics;
use agent_sim_net::RxStamp;
use agent_sim_proto::consul::subscribe::Event;
use tokio::time::Instant;
use tonic::{Code, Status};

use super::ConsulAgent;
use super::link::Link;
use super::session::{Watches, far_future};
use super::subscriptions::{Arrival, Slot, SlotState, Slots};
use crate::codec::decode_event;
use crate::conn::{self, StreamConn, Streaming};
use crate::ended::server_said;
use crate::h2::Got;
use crate::modes::AgentWire;
use crate::rpc::mux::Mux;

/// What the connection or a stream brought.
// Made by one poll and handled at once: an event is not boxed to be moved
// one step.
#[allow(clippy::large_enum_variant)]
pub(super) enum Io {
    /// The connection ended.
    Closed(Failure),
    /// The server took call `i` (its headers).
    Started(usize),
    Event(usize, Instant, Result<Event, Status>),
    /// The server ended stream `i` with status OK.
    StreamEnd(usize),
}

/// The connection of a streaming session, and whether the server answered
/// any call on it (a stream event or a call's reply).
struct Streams {
    conn: Box<StreamConn>,
    stamp: Option<RxStamp>,
    answered: bool,
    /// Where unknown fields of events are warned.
    metrics: Metrics,
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
        let dial = dialer.connect_streams(cx.bind_addr, Some(sh.bytes(true)));
        let conn = match conn::within_session(cx, dial).await {
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
        conn: Streaming,
        link: Option<Box<Link>>,
    ) -> (SessionEnd, bool) {
        let Streaming {
            mut conn, stamp, ..
        } = conn;
        let now = Instant::now();
        // Uncounts live probe subscriptions however the session ends.
        let mut slots = Slots::new(
            (0..self.subs.len()).map(|_| Slot::new(now)).collect(),
            &self.shared,
        );
        for (i, slot) in slots.v.iter_mut().enumerate() {
            // A stream that kept failing waits out its backoff here too.
            match &mut self.subs[i].backoff {
                Some(b) => {
                    slot.state = SlotState::Idle {
                        at: now + b.next_delay(),
                    }
                }
                None => self.start_slot(i, slot, &mut conn),
            }
        }
        let mut streams = Streams {
            conn,
            stamp,
            answered: false,
            metrics: self.shared.metrics.clone(),
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
        let mut due = self.conn.keepalive_due().unwrap_or_else(far_future);
        for slot in slots.iter() {
            if let SlotState::Idle { at } = slot.state {
                due = due.min(at);
            }
        }
        due
    }

    /// The connection brings everything in the order its frames came (so
    /// no call starves another, and a status the server sent before it
    /// closed is told before the close).
    fn poll(&mut self, _: &mut [Slot], _: usize, tcx: &mut Context<'_>) -> Poll<Io> {
        let Streams { conn, metrics, .. } = self;
        let got =
            std::task::ready!(conn.poll_next(tcx, &mut |_, msg| decode_event(msg, Some(metrics))));
        Poll::Ready(match got {
            Got::Started(i) => Io::Started(i),
            Got::Message(i, r) => Io::Event(i, Instant::now(), r),
            Got::Ended(i, status) if status.code() == Code::Ok => Io::StreamEnd(i),
            Got::Ended(i, status) => Io::Event(i, Instant::now(), Err(status)),
            Got::Closed(e) => Io::Closed(Failure::of(e.kind(), &e)),
        })
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
            Io::Started(i) => {
                self.answered = true;
                slots[i].state = SlotState::Live;
            }
            Io::Event(i, _, Err(status)) => {
                self.answered |= server_said(&status);
                // A message that did not decode leaves its call open.
                self.conn.cancel(i);
                let slot = &mut slots[i];
                slot.state = SlotState::Done;
                return agent.on_status(cx, i, slot, &status, &mut self.conn);
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
                agent.retry_stream(cx, i, slot, failure, false, &mut self.conn);
            }
        }
        None
    }

    fn on_timer(&mut self, agent: &mut ConsulAgent, slots: &mut [Slot]) {
        let now = Instant::now();
        self.conn.on_timer(now);
        for (i, slot) in slots.iter_mut().enumerate() {
            if let SlotState::Idle { at } = slot.state
                && at <= now
            {
                agent.start_slot(i, slot, &mut self.conn);
            }
        }
    }

    /// A resubscribe accepted waits only for the sync.
    fn waiting(s: &Slot) -> bool {
        s.resume_pending && matches!(s.state, SlotState::Live)
    }
}
