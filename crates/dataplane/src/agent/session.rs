//! One session of a sidecar: registration (once), dial, bootstrap params,
//! then the ADS stream (and `WatchServers`) on one HTTP/2 connection (the
//! project's lean client, `agent_sim_consul::h2`: no buffer held while
//! idle, no task of its own), in one loop over cancellation, the
//! connection and the phase's deadline (`agent_sim_fleet::wake`) with one
//! handler per wake.
//!
//! The calls on the connection, as consul-dataplane and Envoy make them:
//! `GetEnvoyBootstrapParams` (unary), then the Delta ADS stream (requests
//! and ACKs on the open stream), then `WatchServers` (server-streaming).

use std::pin::pin;
use std::task::Context;
use std::time::Duration;

use agent_sim_consul::conn::{self, StreamConn, Streaming};
use agent_sim_consul::ended::{server_said, status_words};
use agent_sim_consul::h2::Got;
use agent_sim_consul::http as chttp;
use agent_sim_consul::probe::{Owed, ProbeBoard};
use agent_sim_consul::txn::TxnOps;
use agent_sim_consul::view::Change;
use agent_sim_fleet::wake::{self, NoCall, Woke};
use agent_sim_fleet::{Failure, SessionCx, SessionEnd};
use agent_sim_net::RxStamp;
use agent_sim_proto::consul::dataplane::GetEnvoyBootstrapParamsResponse;
use agent_sim_proto::consul::serverdiscovery::{WatchServersRequest, WatchServersResponse};
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryResponse;
use prost::Message as _;
use tokio::time::Instant;
use tonic::{Code, Status};

use super::{DataplaneAgent, Shared};
use crate::codec::{ADS_PATH, BOOTSTRAP_PATH, TOKEN_HEADER, WATCH_SERVERS_PATH, bootstrap_request};
use crate::xds::NodeInfo;

/// The bootstrap call and the opening of the ADS stream must be answered
/// within this (and `WatchServers` must have started).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The tags of a session's calls on its connection.
const BOOTSTRAP: usize = 0;
const ADS: usize = 1;
const SERVERS: usize = 2;

/// Takes a live probe subscription off the board however the session ends
/// (a session that ends by itself takes it off with [`ProbeCount::down`],
/// which keeps the probe still owed its arrival).
struct ProbeCount<'a> {
    shared: &'a Shared,
    /// Live on the board since this mark (`sub_up`'s answer).
    mark: Option<u64>,
}

impl ProbeCount<'_> {
    /// Counts the sidecar live on the board, once.
    fn up(&mut self) {
        if self.mark.is_none()
            && let Some(b) = &self.shared.board
        {
            self.mark = Some(b.sub_up());
        }
    }

    /// Takes the sidecar off the board; `owed` takes the probes that were
    /// counting on it.
    fn down(&mut self, owed: &mut Owed) {
        if let (Some(b), Some(m)) = (&self.shared.board, self.mark.take()) {
            b.sub_down(m, owed);
        }
    }
}

impl Drop for ProbeCount<'_> {
    fn drop(&mut self) {
        // Dropped mid-session: the run is ending.
        self.down(&mut Owed::default());
    }
}

/// A message of one of the session's calls, decoded as its tag says.
// Made by one poll and handled at once: a response is not boxed to be
// moved one step.
#[allow(clippy::large_enum_variant)]
enum Msg {
    Bootstrap(Result<GetEnvoyBootstrapParamsResponse, Status>),
    Ads(Result<DeltaDiscoveryResponse, Status>),
    Servers(Result<WatchServersResponse, Status>),
}

fn decode(tag: usize, b: &[u8]) -> Msg {
    match tag {
        BOOTSTRAP => Msg::Bootstrap(decode_as(b)),
        ADS => Msg::Ads(decode_as(b)),
        _ => Msg::Servers(decode_as(b)),
    }
}

/// A message as prost reads it; a failure in the words tonic used for
/// it (the kind `xds_decode` is told by them).
fn decode_as<T: prost::Message + Default>(b: &[u8]) -> Result<T, Status> {
    T::decode(b).map_err(|e| Status::internal(format!("failed to decode Protobuf message: {e}")))
}

/// Where a session is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// `GetEnvoyBootstrapParams` asked, not answered.
    Bootstrap,
    /// Answered; the ADS stream asked for, its headers not yet come.
    Opening,
    /// The ADS stream is open.
    Streaming,
}

/// The connection of a session and where its calls are.
struct Calls {
    conn: Box<StreamConn>,
    stamp: Option<RxStamp>,
    phase: Phase,
    /// When the phase's call must have been answered (none once streaming).
    due: Option<Instant>,
    /// When `WatchServers` must have started (none once it has, or when
    /// not asked for).
    servers_due: Option<Instant>,
    /// When the bootstrap call, then the ADS stream, was asked for.
    asked: Instant,
    /// The proxy has its whole first configuration.
    established: bool,
    /// The server answered a call (a response, or its own status).
    answered: bool,
}

impl Calls {
    /// The loop's next deadline: the phase's, `WatchServers`', the
    /// keepalive's.
    fn deadline(&self) -> Instant {
        [self.due, self.servers_due, self.conn.keepalive_due()]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400))
    }
}

/// The error kind of a failed call or stream, in the server's words.
pub(crate) fn status_kind(s: &Status) -> &'static str {
    let msg = s.message();
    match s.code() {
        Code::ResourceExhausted => "xds_stream_cap",
        Code::NotFound => "proxy_not_found",
        // Consul 1.20: "Envoy 1.20.0 is too old and is not supported by Consul".
        Code::InvalidArgument if msg.contains("not supported by Consul") => {
            "envoy_version_unsupported"
        }
        Code::InvalidArgument => "xds_invalid_request",
        // Bytes that are not a DeltaDiscoveryResponse.
        Code::Internal if msg.contains("failed to decode Protobuf") => "xds_decode",
        _ => chttp::cause_kind(msg).unwrap_or_else(|| conn::status_kind(s.code())),
    }
}

fn lost(s: &Status) -> SessionEnd {
    SessionEnd::lost_with(status_kind(s), status_words(s))
}

impl DataplaneAgent {
    /// The ACL token's header on every call, when the fleet has a token.
    fn metadata(&self) -> Vec<(&'static str, &str)> {
        match &self.shared.token {
            Some(t) => vec![(TOKEN_HEADER, t.as_ref())],
            None => Vec::new(),
        }
    }

    pub(super) async fn session(&mut self, cx: &SessionCx) -> SessionEnd {
        if !self.adopting()
            && !self.registered
            && let Err(end) = self.register(cx).await
        {
            return end;
        }
        // Start at this sidecar's server; after a lost or failed session,
        // the next one (a server gone, or at its stream cap), as
        // consul-dataplane moves to another server of its list.
        let sh = self.shared.clone();
        let n = sh.dialers.len();
        let server = (self.index as usize + cx.attempt as usize) % n;
        cx.on_server(server);
        let dialer = &sh.dialers[server];
        let t = Instant::now();
        let dial = dialer.connect_streams(cx.bind_addr, None);
        let conn = match conn::within_session(cx, dial).await {
            Ok(c) => c,
            Err(end) => return end,
        };
        sh.metrics
            .record(sh.ids.connect, self.index as usize, t.elapsed());
        let first = conn.first_bytes.clone();
        let (end, answered) = self.steady(cx, conn).await;
        match end {
            SessionEnd::Lost(f) if !answered => match conn::what_answered(&first) {
                // A Consul RPC port (8300) closes a connection that does not
                // start with its 0x08 byte.
                Some(("rpc_closed_at_once", _)) => SessionEnd::lost_with(
                    "wrong_port_rpc",
                    format!(
                        "the server closed the connection at once, without a byte ({}): is \
                         --target the server RPC port 8300 instead of the gRPC port 8502?",
                        f.kind
                    ),
                ),
                Some((kind, words)) => SessionEnd::lost_with(kind, words),
                None => SessionEnd::Lost(f),
            },
            end => end,
        }
    }

    /// Registers the sidecar's node, service and connect-proxy (once).
    async fn register(&mut self, cx: &SessionCx) -> Result<(), SessionEnd> {
        let sh = self.shared.clone();
        self.maybe_registered = true;
        let ops = TxnOps::new(self.registration_ops());
        let body = bytes::Bytes::from(self.proxy_body());
        let register = async {
            sh.batcher().submit(ops).await?;
            sh.http
                .put("/v1/catalog/register", body)
                .await
                .map(|_| ())
                .map_err(chttp::Refusal::from)
        };
        let r = tokio::select! {
            r = register => r,
            _ = cx.cancel.cancelled() => return Err(SessionEnd::Shutdown),
        };
        match r {
            Ok(()) => {
                self.registered = true;
                sh.metrics.incr(sh.ids.registrations);
                Ok(())
            }
            Err(r) => Err(SessionEnd::Lost(Failure {
                kind: r.kind,
                detail: r.words,
                said_by: None,
            })),
        }
    }

    /// The session on an established connection: bootstrap params, the ADS
    /// stream, `WatchServers`, then the streams until the session ends;
    /// also whether the server answered anything.
    async fn steady(&mut self, cx: &SessionCx, conn: Streaming) -> (SessionEnd, bool) {
        let Streaming {
            mut conn, stamp, ..
        } = conn;
        let req = bootstrap_request(&self.proxy_id, &self.node);
        conn.start_with(BOOTSTRAP, BOOTSTRAP_PATH, &self.metadata(), |w| {
            req.encode_raw(w)
        });
        let now = Instant::now();
        let mut calls = Calls {
            conn,
            stamp,
            phase: Phase::Bootstrap,
            due: Some(now + CALL_TIMEOUT),
            servers_due: None,
            asked: now,
            established: false,
            answered: false,
        };
        let sh = self.shared.clone();
        let mut probe = ProbeCount {
            shared: &sh,
            mark: None,
        };
        let end = self.call_loop(cx, &mut calls, &mut probe).await;
        probe.down(&mut self.probe_owed);
        (end, calls.answered)
    }

    /// The calls until the session ends: one wait over cancellation, the
    /// connection and the deadline, then the handler of what woke it.
    async fn call_loop(
        &mut self,
        cx: &SessionCx,
        c: &mut Calls,
        probe: &mut ProbeCount<'_>,
    ) -> SessionEnd {
        let mut cancel = pin!(cx.cancel.cancelled());
        let mut timer = pin!(tokio::time::sleep_until(c.deadline()));
        loop {
            wake::arm(timer.as_mut(), c.deadline());
            let Calls { conn, .. } = c;
            let io = |tcx: &mut Context<'_>| conn.poll_next(tcx, &mut decode);
            let woke = wake::next(
                cancel.as_mut(),
                io,
                &mut None::<NoCall>,
                Some(timer.as_mut()),
            )
            .await;
            let end = match woke {
                Woke::Cancelled => Some(SessionEnd::Shutdown),
                Woke::Io(got) => self.on_got(cx, c, got, probe),
                Woke::Call(never) => match never {},
                Woke::Timer => self.on_timer(c),
            };
            if let Some(end) = end {
                return end;
            }
        }
    }

    /// A deadline passed: the phase's call unanswered, `WatchServers` not
    /// started, or the keepalive's.
    fn on_timer(&mut self, c: &mut Calls) -> Option<SessionEnd> {
        let now = Instant::now();
        if c.due.is_some_and(|d| d <= now) {
            return Some(SessionEnd::lost(match c.phase {
                Phase::Bootstrap => "bootstrap_timeout",
                _ => "xds_open_timeout",
            }));
        }
        if c.servers_due.is_some_and(|d| d <= now) {
            // Counted; the sidecar goes on without it, as consul-dataplane.
            c.servers_due = None;
            c.conn.cancel(SERVERS);
            self.shared.metrics.error("watch_servers_timeout");
        }
        c.conn.on_timer(now);
        None
    }

    /// What the connection brought; the session's end when it ended.
    fn on_got(
        &mut self,
        cx: &SessionCx,
        c: &mut Calls,
        got: Got<Msg>,
        probe: &mut ProbeCount<'_>,
    ) -> Option<SessionEnd> {
        match got {
            Got::Closed(e) => Some(SessionEnd::Lost(Failure::of(e.kind(), &e))),
            Got::Started(ADS) => {
                c.answered = true;
                c.phase = Phase::Streaming;
                c.due = None;
                self.watch_servers(c);
                None
            }
            Got::Started(SERVERS) => {
                c.servers_due = None;
                None
            }
            Got::Started(_) => None,
            Got::Message(_, Msg::Bootstrap(r)) if c.phase == Phase::Bootstrap => {
                // The server has answered: the dial is over. The first
                // configuration waits for the server's pacing, as a booting
                // fleet's does, without holding back the next sidecars'
                // dials (held, starts ran at max_dialing / xds_initial).
                cx.release_dial_slot();
                self.on_bootstrap(c, r)
            }
            Got::Message(_, Msg::Bootstrap(_)) => None,
            Got::Message(_, Msg::Ads(Err(status))) => Some(lost(&status)),
            Got::Message(_, Msg::Ads(Ok(resp))) => {
                let decoded = Instant::now();
                let kernel = c.stamp.as_ref().and_then(|st| st.instant(decoded));
                self.on_response(&resp, decoded, kernel, &mut c.conn, probe);
                if !c.established && self.xds.ready() {
                    c.established = true;
                    let sh = &self.shared;
                    let took = c.asked.elapsed();
                    sh.metrics
                        .record(sh.ids.xds_initial, self.index as usize, took);
                    cx.established();
                }
                None
            }
            Got::Message(_, Msg::Servers(Ok(_))) => {
                self.shared.metrics.incr(self.shared.ids.server_lists);
                None
            }
            Got::Message(_, Msg::Servers(Err(status))) => {
                c.conn.cancel(SERVERS);
                self.servers_failed(c, &status);
                None
            }
            Got::Ended(tag, status) => self.on_ended(c, tag, &status),
        }
    }

    /// The bootstrap call's answer: the ADS stream opens on it.
    fn on_bootstrap(
        &mut self,
        c: &mut Calls,
        r: Result<GetEnvoyBootstrapParamsResponse, Status>,
    ) -> Option<SessionEnd> {
        let params = match r {
            Ok(p) => p,
            Err(status) => return Some(lost(&status)),
        };
        c.answered = true;
        let sh = self.shared.clone();
        sh.metrics.incr(sh.ids.bootstraps);
        sh.metrics
            .record(sh.ids.bootstrap, self.index as usize, c.asked.elapsed());
        let or = |s: String, d: &str| if s.is_empty() { d.to_owned() } else { s };
        let node = NodeInfo {
            id: self.proxy_id.to_string(),
            cluster: or(params.service, &sh.cfg.service_name),
            node_name: or(params.node_name, &self.node),
            namespace: or(params.namespace, "default"),
            partition: or(params.partition, "default"),
            envoy_version: sh.envoy_version,
        }
        .node();
        // The ADS stream's first requests go out with its headers (the
        // server answers with its first response).
        let now = Instant::now();
        c.phase = Phase::Opening;
        c.due = Some(now + CALL_TIMEOUT);
        c.asked = now;
        sh.metrics.incr(sh.ids.xds_streams);
        if c.conn.open(ADS, ADS_PATH, &self.metadata()) {
            for r in self.xds.stream_start(node) {
                c.conn.send(ADS, |w| r.encode_raw(w));
            }
        }
        None
    }

    /// Step 3, `WatchServers` when asked for.
    fn watch_servers(&self, c: &mut Calls) {
        if !self.shared.cfg.watch_servers {
            return;
        }
        let req = WatchServersRequest { wan: false };
        c.conn
            .start_with(SERVERS, WATCH_SERVERS_PATH, &self.metadata(), |w| {
                req.encode_raw(w)
            });
        c.servers_due = Some(Instant::now() + CALL_TIMEOUT);
    }

    /// `WatchServers` failed: counted, the sidecar goes on without it (as
    /// consul-dataplane does).
    fn servers_failed(&self, c: &mut Calls, status: &Status) {
        c.servers_due = None;
        let kind = status_kind(status);
        self.shared.metrics.error_with(kind, Some(status.message()));
    }

    /// Call `tag` ended with `status`.
    fn on_ended(&mut self, c: &mut Calls, tag: usize, status: &Status) -> Option<SessionEnd> {
        let ok = status.code() == Code::Ok;
        match tag {
            BOOTSTRAP if c.phase != Phase::Bootstrap => None,
            BOOTSTRAP => {
                c.answered = server_said(status);
                if ok {
                    let s = Status::internal("the server ended the call without a response");
                    return Some(lost(&s));
                }
                if status.code() == Code::NotFound && !self.adopting() {
                    // The server lost our registration: register again.
                    self.registered = false;
                }
                Some(lost(status))
            }
            ADS if ok => Some(SessionEnd::lost("xds_stream_end")),
            ADS => Some(lost(status)),
            _ if ok => {
                c.servers_due = None;
                None
            }
            _ => {
                self.servers_failed(c, status);
                None
            }
        }
    }

    fn on_response(
        &mut self,
        resp: &DeltaDiscoveryResponse,
        decoded: Instant,
        kernel: Option<Instant>,
        conn: &mut StreamConn,
        probe: &mut ProbeCount<'_>,
    ) {
        let sh = self.shared.clone();
        sh.metrics.incr(sh.ids.xds_responses);
        let h = self.xds.handle(resp);
        for r in &h.requests {
            conn.send(ADS, |w| r.encode_raw(w));
        }
        match &h.nacked {
            None => sh.metrics.incr(sh.ids.xds_acks),
            Some(why) => {
                sh.metrics.incr(sh.ids.xds_nacks);
                sh.metrics.error_with(why.kind(), Some(&why.to_string()));
            }
        }
        if h.eds {
            sh.metrics.incr(sh.ids.eds_updates);
        }
        if self.xds.watches_probe() {
            probe.up();
        }
        let (Some(present), Some(board)) = (h.probe, sh.board.as_deref()) else {
            return;
        };
        let key = board.target();
        let change = if present {
            Change::Register {
                key,
                snapshot: false,
            }
        } else {
            Change::Deregister { key }
        };
        let Some(id) = board.matches(&change) else {
            return;
        };
        let arrived = kernel.unwrap_or(decoded);
        if self.probe_seen != id
            && ProbeBoard::expects(probe.mark, self.probe_owed, id)
            && board.arrive(id, arrived, 0)
        {
            self.probe_seen = id;
            sh.metrics.record(
                sh.ids.probe_overhead,
                self.index as usize,
                arrived.elapsed(),
            );
            if kernel.is_none() {
                sh.metrics.incr(sh.ids.arrivals_user_time);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_get_kinds_from_consuls_words() {
        let k = |c, m: &str| status_kind(&Status::new(c, m));
        assert_eq!(
            k(
                Code::InvalidArgument,
                "Envoy 1.20.0 is too old and is not supported by Consul"
            ),
            "envoy_version_unsupported"
        );
        assert_eq!(
            k(Code::InvalidArgument, "type URL is required for ADS"),
            "xds_invalid_request"
        );
        assert_eq!(k(Code::NotFound, "Service not found"), "proxy_not_found");
        assert_eq!(
            k(
                Code::ResourceExhausted,
                "this server has too many xDS streams open, please try another"
            ),
            "xds_stream_cap"
        );
        assert_eq!(k(Code::Unauthenticated, "ACL not found"), "acl_not_found");
        assert_eq!(
            k(
                Code::Internal,
                "failed to decode Protobuf message: invalid wire type value: 7"
            ),
            "xds_decode"
        );
    }
}
