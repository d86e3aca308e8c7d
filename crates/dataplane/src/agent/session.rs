//! One session of a sidecar: registration (once), dial, bootstrap params,
//! then the ADS stream (and `WatchServers`) on one HTTP/2 connection, in
//! one loop over cancellation, the connection and the streams
//! (`agent_sim_fleet::wake`) with one handler per wake.

use std::future::Future;
use std::pin::{Pin, pin};
use std::task::{Context, Poll};
use std::time::Duration;

use ::http::uri::PathAndQuery;
use agent_sim_consul::conn::{self, ConnDriver, GrpcClient, RpcConn};
use agent_sim_consul::ended::{driver_failure, server_said, status_words};
use agent_sim_consul::http as chttp;
use agent_sim_consul::probe::{Owed, ProbeBoard};
use agent_sim_consul::txn::TxnOps;
use agent_sim_consul::view::Change;
use agent_sim_fleet::wake::{self, NoCall, Woke};
use agent_sim_fleet::{Failure, SessionCx, SessionEnd};
use agent_sim_net::RxStamp;
use agent_sim_proto::consul::dataplane::{
    GetEnvoyBootstrapParamsRequest, GetEnvoyBootstrapParamsResponse,
};
use agent_sim_proto::consul::serverdiscovery::{WatchServersRequest, WatchServersResponse};
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryResponse;
use futures_util::Stream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::codec::Streaming;
use tonic::{Code, Status};

use super::{DataplaneAgent, Shared};
use crate::codec::{
    ADS_PATH, AdsCodec, BOOTSTRAP_PATH, Outbox, SmallCodec, TOKEN_HEADER, WATCH_SERVERS_PATH,
    bootstrap_request,
};
use crate::xds::{self, NodeInfo};

/// The bootstrap call and the opening of the ADS stream must be answered
/// within this.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

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

/// What the connection or a stream brought.
enum Io {
    /// The connection ended.
    Closed(Failure),
    Ads(Instant, Result<DeltaDiscoveryResponse, Status>),
    AdsEnd,
    Servers(Result<WatchServersResponse, Status>),
    ServersEnd,
}

/// The connection of a session in steady state and its streams.
struct Streams {
    driver: ConnDriver,
    /// Requests (ACKs, NACKs, subscriptions) go out on the ADS stream.
    outbox: Outbox,
    ads: Streaming<DeltaDiscoveryResponse>,
    servers: Option<Streaming<WatchServersResponse>>,
    stamp: Option<RxStamp>,
    /// When the ADS stream was asked for.
    started: Instant,
    /// The proxy has its whole first configuration.
    established: bool,
}

impl Streams {
    /// The connection, then the ADS stream, then `WatchServers`.
    fn poll(&mut self, tcx: &mut Context<'_>) -> Poll<Io> {
        if let Poll::Ready(r) = self.driver.as_mut().poll(tcx) {
            return Poll::Ready(Io::Closed(driver_failure(r)));
        }
        match Pin::new(&mut self.ads).poll_next(tcx) {
            Poll::Ready(Some(r)) => return Poll::Ready(Io::Ads(Instant::now(), r)),
            Poll::Ready(None) => return Poll::Ready(Io::AdsEnd),
            Poll::Pending => {}
        }
        if let Some(s) = self.servers.as_mut() {
            match Pin::new(s).poll_next(tcx) {
                Poll::Ready(Some(r)) => return Poll::Ready(Io::Servers(r)),
                Poll::Ready(None) => return Poll::Ready(Io::ServersEnd),
                Poll::Pending => {}
            }
        }
        Poll::Pending
    }
}

/// How a call made before the streams run came out.
enum Setup<T> {
    /// The call's own result.
    Answered(T),
    /// Not answered within [`CALL_TIMEOUT`].
    TimedOut,
    /// The connection ended first.
    Closed(Failure),
    /// The session was cancelled first.
    Cancelled,
}

/// Runs `call` within [`CALL_TIMEOUT`] while driving the connection, given
/// up when `cancel` (if any) is cancelled (checked first, as in every
/// session loop).
async fn setup_call<T>(
    driver: &mut ConnDriver,
    cancel: Option<&CancellationToken>,
    call: impl Future<Output = T>,
) -> Setup<T> {
    let mut call = pin!(tokio::time::timeout(CALL_TIMEOUT, call));
    let mut cancelled = pin!(cancel.map(CancellationToken::cancelled));
    std::future::poll_fn(|cx| {
        if let Some(c) = cancelled.as_mut().as_pin_mut()
            && c.poll(cx).is_ready()
        {
            return Poll::Ready(Setup::Cancelled);
        }
        if let Poll::Ready(r) = call.as_mut().poll(cx) {
            return Poll::Ready(match r {
                Ok(v) => Setup::Answered(v),
                Err(_) => Setup::TimedOut,
            });
        }
        if let Poll::Ready(r) = driver.as_mut().poll(cx) {
            return Poll::Ready(Setup::Closed(driver_failure(r)));
        }
        Poll::Pending
    })
    .await
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
        // tonic's words for bytes that are not a DeltaDiscoveryResponse.
        Code::Internal if msg.contains("failed to decode Protobuf") => "xds_decode",
        _ => chttp::cause_kind(msg).unwrap_or_else(|| conn::status_kind(s.code())),
    }
}

fn lost(s: &Status) -> SessionEnd {
    SessionEnd::lost_with(status_kind(s), status_words(s))
}

/// Waits until the connection takes a call.
async fn ready(g: &mut GrpcClient) -> Result<(), Status> {
    g.ready()
        .await
        .map_err(|e| Status::unavailable(format!("connection not ready: {e}")))
}

impl DataplaneAgent {
    fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        if let Some(t) = &self.shared.token {
            r.metadata_mut().insert(TOKEN_HEADER, t.clone());
        }
        r
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
        let conn = match dialer.connect_session(cx, None).await {
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
    async fn steady(&mut self, cx: &SessionCx, conn: RpcConn) -> (SessionEnd, bool) {
        let RpcConn {
            grpc,
            mut driver,
            stamp,
            ..
        } = conn;
        let node = match self.bootstrap(cx, &grpc, &mut driver).await {
            Ok(node) => node,
            Err(ended) => return ended,
        };
        let (outbox, ads, started) = match self.open_ads(cx, &grpc, &mut driver, node).await {
            Ok(opened) => opened,
            Err(end) => return (end, true),
        };
        let servers = match self.watch_servers(&grpc, &mut driver).await {
            Ok(servers) => servers,
            Err(end) => return (end, true),
        };
        let mut streams = Streams {
            driver,
            outbox,
            ads,
            servers,
            stamp,
            started,
            established: false,
        };
        let sh = self.shared.clone();
        let mut probe = ProbeCount {
            shared: &sh,
            mark: None,
        };
        let end = self.stream_loop(cx, &mut streams, &mut probe).await;
        probe.down(&mut self.probe_owed);
        streams.outbox.close();
        (end, true)
    }

    /// Step 1, bootstrap params, as consul-dataplane asks before starting
    /// Envoy: the proxy's node; else the session's end and whether the
    /// server answered.
    async fn bootstrap(
        &mut self,
        cx: &SessionCx,
        grpc: &GrpcClient,
        driver: &mut ConnDriver,
    ) -> Result<Node, (SessionEnd, bool)> {
        let sh = self.shared.clone();
        let t = Instant::now();
        let call = self.bootstrap_call(grpc);
        let params = match setup_call(driver, Some(&cx.cancel), call).await {
            Setup::Cancelled => return Err((SessionEnd::Shutdown, false)),
            Setup::Closed(f) => return Err((SessionEnd::Lost(f), false)),
            Setup::TimedOut => return Err((SessionEnd::lost("bootstrap_timeout"), false)),
            Setup::Answered(Err(s)) => {
                if s.code() == Code::NotFound && !self.adopting() {
                    // The server lost our registration: register again.
                    self.registered = false;
                }
                return Err((lost(&s), server_said(&s)));
            }
            Setup::Answered(Ok(p)) => p,
        };
        sh.metrics.incr(sh.ids.bootstraps);
        sh.metrics
            .record(sh.ids.bootstrap, self.index as usize, t.elapsed());
        let or = |s: String, d: &str| if s.is_empty() { d.to_owned() } else { s };
        Ok(NodeInfo {
            id: self.proxy_id.to_string(),
            cluster: or(params.service, &sh.cfg.service_name),
            node_name: or(params.node_name, &self.node),
            namespace: or(params.namespace, "default"),
            partition: or(params.partition, "default"),
            envoy_version: sh.envoy_version,
        }
        .node())
    }

    async fn bootstrap_call(
        &self,
        grpc: &GrpcClient,
    ) -> Result<GetEnvoyBootstrapParamsResponse, Status> {
        let mut g = grpc.clone();
        let req = self.request(bootstrap_request(&self.proxy_id, &self.node));
        ready(&mut g).await?;
        let r = g
            .unary(
                req,
                PathAndQuery::from_static(BOOTSTRAP_PATH),
                SmallCodec::<GetEnvoyBootstrapParamsRequest, GetEnvoyBootstrapParamsResponse>::default(),
            )
            .await?;
        Ok(r.into_inner())
    }

    /// Step 2, the ADS stream: its first requests are in the body before
    /// the call starts (the server answers with its first response). The
    /// outbox, the stream and when it was asked for.
    async fn open_ads(
        &mut self,
        cx: &SessionCx,
        grpc: &GrpcClient,
        driver: &mut ConnDriver,
        node: Node,
    ) -> Result<(Outbox, Streaming<DeltaDiscoveryResponse>, Instant), SessionEnd> {
        let (outbox, body) = Outbox::new();
        for r in self.xds.stream_start(node) {
            outbox.push(xds::encode(&r));
        }
        let started = Instant::now();
        let open = {
            let mut g = grpc.clone();
            let req = self.request(body);
            async move {
                ready(&mut g).await?;
                g.streaming(req, PathAndQuery::from_static(ADS_PATH), AdsCodec)
                    .await
            }
        };
        let sh = &self.shared;
        sh.metrics.incr(sh.ids.xds_streams);
        match setup_call(driver, Some(&cx.cancel), open).await {
            Setup::Cancelled => Err(SessionEnd::Shutdown),
            Setup::Closed(f) => Err(SessionEnd::Lost(f)),
            Setup::TimedOut => Err(SessionEnd::lost("xds_open_timeout")),
            Setup::Answered(Err(s)) => Err(lost(&s)),
            Setup::Answered(Ok(r)) => Ok((outbox, r.into_inner(), started)),
        }
    }

    /// Step 3, `WatchServers` when asked for (a failure here is counted,
    /// the sidecar goes on as consul-dataplane does).
    async fn watch_servers(
        &self,
        grpc: &GrpcClient,
        driver: &mut ConnDriver,
    ) -> Result<Option<Streaming<WatchServersResponse>>, SessionEnd> {
        let sh = &self.shared;
        if !sh.cfg.watch_servers {
            return Ok(None);
        }
        let mut g = grpc.clone();
        let req = self.request(WatchServersRequest { wan: false });
        let call = async move {
            ready(&mut g).await?;
            g.server_streaming(
                req,
                PathAndQuery::from_static(WATCH_SERVERS_PATH),
                SmallCodec::<WatchServersRequest, WatchServersResponse>::default(),
            )
            .await
        };
        match setup_call(driver, None, call).await {
            Setup::Closed(f) => return Err(SessionEnd::Lost(f)),
            Setup::TimedOut => sh.metrics.error("watch_servers_timeout"),
            Setup::Answered(Err(s)) => sh.metrics.error_with(status_kind(&s), Some(s.message())),
            Setup::Answered(Ok(r)) => return Ok(Some(r.into_inner())),
            // Not given a cancel: the session's loop sees it next.
            Setup::Cancelled => {}
        }
        Ok(None)
    }

    /// The streams until the session ends: one wait over cancellation, the
    /// connection and the streams, then the handler of what woke it.
    async fn stream_loop(
        &mut self,
        cx: &SessionCx,
        s: &mut Streams,
        probe: &mut ProbeCount<'_>,
    ) -> SessionEnd {
        let mut cancel = pin!(cx.cancel.cancelled());
        loop {
            let io = |tcx: &mut Context<'_>| s.poll(tcx);
            let woke = wake::next(cancel.as_mut(), io, &mut None::<NoCall>, None).await;
            let end = match woke {
                Woke::Cancelled => Some(SessionEnd::Shutdown),
                Woke::Io(io) => self.on_io(cx, s, io, probe),
                Woke::Call(never) => match never {},
                Woke::Timer => None,
            };
            if let Some(end) = end {
                return end;
            }
        }
    }

    /// What the connection or a stream brought; the session's end when it
    /// ended.
    fn on_io(
        &mut self,
        cx: &SessionCx,
        s: &mut Streams,
        io: Io,
        probe: &mut ProbeCount<'_>,
    ) -> Option<SessionEnd> {
        let ids = &self.shared.ids;
        match io {
            Io::Closed(f) => return Some(SessionEnd::Lost(f)),
            Io::AdsEnd => return Some(SessionEnd::lost("xds_stream_end")),
            Io::Ads(_, Err(status)) => return Some(lost(&status)),
            Io::Servers(Ok(_)) => self.shared.metrics.incr(ids.server_lists),
            Io::Servers(Err(status)) => {
                let kind = status_kind(&status);
                self.shared.metrics.error_with(kind, Some(status.message()));
                s.servers = None;
            }
            Io::ServersEnd => s.servers = None,
            Io::Ads(decoded, Ok(resp)) => {
                let kernel = s.stamp.as_ref().and_then(|st| st.instant(decoded));
                self.on_response(&resp, decoded, kernel, &s.outbox, probe);
                if !s.established && self.xds.ready() {
                    s.established = true;
                    let sh = &self.shared;
                    let took = s.started.elapsed();
                    sh.metrics
                        .record(sh.ids.xds_initial, self.index as usize, took);
                    cx.established();
                }
            }
        }
        None
    }

    fn on_response(
        &mut self,
        resp: &DeltaDiscoveryResponse,
        decoded: Instant,
        kernel: Option<Instant>,
        outbox: &Outbox,
        probe: &mut ProbeCount<'_>,
    ) {
        let sh = self.shared.clone();
        sh.metrics.incr(sh.ids.xds_responses);
        let h = self.xds.handle(resp);
        for r in &h.requests {
            outbox.push(xds::encode(r));
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
