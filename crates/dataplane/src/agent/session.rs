//! One session of a sidecar: registration (once), dial, bootstrap params,
//! then the ADS stream (and `WatchServers`) on one HTTP/2 connection.

use std::future::Future;
use std::pin::{Pin, pin};
use std::task::Poll;
use std::time::Duration;

use ::http::uri::PathAndQuery;
use agent_sim_consul::conn::{self, GrpcClient, RpcConn};
use agent_sim_consul::http as chttp;
use agent_sim_consul::probe::{Owed, ProbeBoard};
use agent_sim_consul::txn::TxnOps;
use agent_sim_consul::view::Change;
use agent_sim_fleet::{SessionCx, SessionEnd};
use agent_sim_net::RxStamp;
use agent_sim_proto::consul::dataplane::{
    GetEnvoyBootstrapParamsRequest, GetEnvoyBootstrapParamsResponse,
};
use agent_sim_proto::consul::serverdiscovery::{WatchServersRequest, WatchServersResponse};
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryResponse;
use futures_util::Stream;
use tokio::time::Instant;
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

enum Wake {
    Cancelled,
    ConnClosed(&'static str, Option<String>),
    Ads(Instant, Result<DeltaDiscoveryResponse, Status>),
    AdsEnd,
    Servers(Result<WatchServersResponse, Status>),
    ServersEnd,
}

/// Runs `fut` while driving the connection; `Err` when the connection ended
/// first (its kind and words).
async fn driven<T>(
    driver: &mut conn::ConnDriver,
    fut: impl Future<Output = T>,
) -> Result<T, (&'static str, Option<String>)> {
    let mut fut = pin!(fut);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(v) = fut.as_mut().poll(cx) {
            return Poll::Ready(Ok(v));
        }
        if let Poll::Ready(r) = driver.as_mut().poll(cx) {
            return Poll::Ready(Err(driver_kind(r)));
        }
        Poll::Pending
    })
    .await
}

fn driver_kind(r: Result<(), hyper::Error>) -> (&'static str, Option<String>) {
    match r {
        Ok(()) => ("conn_closed", None),
        Err(e) if e.is_timeout() => ("keepalive_timeout", Some(chttp::error_chain(&e))),
        Err(e) => ("conn_error", Some(chttp::error_chain(&e))),
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
        // tonic's words for bytes that are not a DeltaDiscoveryResponse.
        Code::Internal if msg.contains("failed to decode Protobuf") => "xds_decode",
        _ => chttp::cause_kind(msg).unwrap_or_else(|| conn::status_kind(s.code())),
    }
}

fn lost(s: &Status) -> SessionEnd {
    SessionEnd::lost_with(
        status_kind(s),
        format!("gRPC {:?}: {}", s.code(), s.message()),
    )
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
        let sh = self.shared.clone();
        if !self.adopting() && !self.registered {
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
                _ = cx.cancel.cancelled() => return SessionEnd::Shutdown,
            };
            match r {
                Ok(()) => {
                    self.registered = true;
                    sh.metrics.incr(sh.ids.registrations);
                }
                Err(r) => {
                    return SessionEnd::Lost(agent_sim_fleet::Failure {
                        kind: r.kind,
                        detail: r.words,
                    });
                }
            }
        }
        // Start at this sidecar's server; after a failed session, the next
        // one (a server at its stream cap said RESOURCE_EXHAUSTED).
        let n = sh.dialers.len();
        let dialer = &sh.dialers[(self.index as usize + cx.attempt as usize) % n];
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

    /// The session on an established connection; also whether the server
    /// answered anything.
    async fn steady(&mut self, cx: &SessionCx, conn: RpcConn) -> (SessionEnd, bool) {
        let sh = self.shared.clone();
        let RpcConn {
            grpc,
            mut driver,
            stamp,
            ..
        } = conn;
        let closed = |(kind, words): (&'static str, Option<String>)| match words {
            Some(w) => SessionEnd::lost_with(kind, w),
            None => SessionEnd::lost(kind),
        };

        // 1. Bootstrap params, as consul-dataplane asks before starting Envoy.
        let t = Instant::now();
        let boot = self.bootstrap(&grpc);
        let boot = tokio::select! {
            r = driven(&mut driver, tokio::time::timeout(CALL_TIMEOUT, boot)) => r,
            _ = cx.cancel.cancelled() => return (SessionEnd::Shutdown, false),
        };
        let params = match boot {
            Err(c) => return (closed(c), false),
            Ok(Err(_)) => return (SessionEnd::lost("bootstrap_timeout"), false),
            Ok(Ok(Err(s))) => {
                if s.code() == Code::NotFound && !self.adopting() {
                    // The server lost our registration: register again.
                    self.registered = false;
                }
                return (lost(&s), answered_status(&s));
            }
            Ok(Ok(Ok(p))) => p,
        };
        sh.metrics.incr(sh.ids.bootstraps);
        sh.metrics
            .record(sh.ids.bootstrap, self.index as usize, t.elapsed());
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

        // 2. The ADS stream: its first requests are in the body before the
        // call starts (the server answers with its first response).
        let (outbox, body) = Outbox::new();
        for r in self.xds.stream_start(node) {
            outbox.push(xds::encode(&r));
        }
        let started = Instant::now();
        let open = {
            let mut g = grpc.clone();
            let req = self.request(body);
            async move {
                g.ready()
                    .await
                    .map_err(|e| Status::unavailable(format!("connection not ready: {e}")))?;
                g.streaming(req, PathAndQuery::from_static(ADS_PATH), AdsCodec)
                    .await
            }
        };
        sh.metrics.incr(sh.ids.xds_streams);
        let opened = tokio::select! {
            r = driven(&mut driver, tokio::time::timeout(CALL_TIMEOUT, open)) => r,
            _ = cx.cancel.cancelled() => return (SessionEnd::Shutdown, true),
        };
        let mut ads: Streaming<DeltaDiscoveryResponse> = match opened {
            Err(c) => return (closed(c), true),
            Ok(Err(_)) => return (SessionEnd::lost("xds_open_timeout"), true),
            Ok(Ok(Err(s))) => return (lost(&s), true),
            Ok(Ok(Ok(r))) => r.into_inner(),
        };

        // 3. WatchServers, when asked for (a failure here is counted, the
        // sidecar goes on as consul-dataplane does).
        let mut servers: Option<Streaming<WatchServersResponse>> = None;
        if sh.cfg.watch_servers {
            let mut g = grpc.clone();
            let req = self.request(WatchServersRequest { wan: false });
            let call = async move {
                g.ready()
                    .await
                    .map_err(|e| Status::unavailable(format!("connection not ready: {e}")))?;
                g.server_streaming(
                    req,
                    PathAndQuery::from_static(WATCH_SERVERS_PATH),
                    SmallCodec::<WatchServersRequest, WatchServersResponse>::default(),
                )
                .await
            };
            match driven(&mut driver, tokio::time::timeout(CALL_TIMEOUT, call)).await {
                Err(c) => return (closed(c), true),
                Ok(Err(_)) => sh.metrics.error("watch_servers_timeout"),
                Ok(Ok(Err(s))) => sh.metrics.error_with(status_kind(&s), Some(s.message())),
                Ok(Ok(Ok(r))) => servers = Some(r.into_inner()),
            }
        }

        let sh = self.shared.clone();
        let mut probe = ProbeCount {
            shared: &sh,
            mark: None,
        };
        let end = self
            .stream_loop(
                cx,
                &mut driver,
                &outbox,
                &mut ads,
                &mut servers,
                &stamp,
                started,
                &mut probe,
            )
            .await;
        probe.down(&mut self.probe_owed);
        outbox.close();
        (end, true)
    }

    async fn bootstrap(
        &self,
        grpc: &GrpcClient,
    ) -> Result<GetEnvoyBootstrapParamsResponse, Status> {
        let mut g = grpc.clone();
        let req = self.request(bootstrap_request(&self.proxy_id, &self.node));
        g.ready()
            .await
            .map_err(|e| Status::unavailable(format!("connection not ready: {e}")))?;
        let r = g
            .unary(
                req,
                PathAndQuery::from_static(BOOTSTRAP_PATH),
                SmallCodec::<GetEnvoyBootstrapParamsRequest, GetEnvoyBootstrapParamsResponse>::default(),
            )
            .await?;
        Ok(r.into_inner())
    }

    #[allow(clippy::too_many_arguments)]
    async fn stream_loop(
        &mut self,
        cx: &SessionCx,
        driver: &mut conn::ConnDriver,
        outbox: &Outbox,
        ads: &mut Streaming<DeltaDiscoveryResponse>,
        servers: &mut Option<Streaming<WatchServersResponse>>,
        stamp: &Option<RxStamp>,
        started: Instant,
        probe: &mut ProbeCount<'_>,
    ) -> SessionEnd {
        let sh = self.shared.clone();
        let mut established = false;
        let mut cancel = pin!(cx.cancel.cancelled());
        loop {
            let wake = std::future::poll_fn(|tcx| {
                if cancel.as_mut().poll(tcx).is_ready() {
                    return Poll::Ready(Wake::Cancelled);
                }
                if let Poll::Ready(r) = driver.as_mut().poll(tcx) {
                    let (kind, words) = driver_kind(r);
                    return Poll::Ready(Wake::ConnClosed(kind, words));
                }
                match Pin::new(&mut *ads).poll_next(tcx) {
                    Poll::Ready(Some(r)) => return Poll::Ready(Wake::Ads(Instant::now(), r)),
                    Poll::Ready(None) => return Poll::Ready(Wake::AdsEnd),
                    Poll::Pending => {}
                }
                if let Some(s) = servers.as_mut() {
                    match Pin::new(s).poll_next(tcx) {
                        Poll::Ready(Some(r)) => return Poll::Ready(Wake::Servers(r)),
                        Poll::Ready(None) => return Poll::Ready(Wake::ServersEnd),
                        Poll::Pending => {}
                    }
                }
                Poll::Pending
            })
            .await;
            match wake {
                Wake::Cancelled => return SessionEnd::Shutdown,
                Wake::ConnClosed(kind, None) => return SessionEnd::lost(kind),
                Wake::ConnClosed(kind, Some(w)) => return SessionEnd::lost_with(kind, w),
                Wake::AdsEnd => return SessionEnd::lost("xds_stream_end"),
                Wake::Ads(_, Err(s)) => return lost(&s),
                Wake::Servers(Ok(_)) => sh.metrics.incr(sh.ids.server_lists),
                Wake::Servers(Err(s)) => {
                    sh.metrics.error_with(status_kind(&s), Some(s.message()));
                    *servers = None;
                }
                Wake::ServersEnd => *servers = None,
                Wake::Ads(decoded, Ok(resp)) => {
                    let kernel = stamp.as_ref().and_then(|s| s.instant(decoded));
                    self.on_response(&resp, decoded, kernel, outbox, probe);
                    if !established && self.xds.ready() {
                        established = true;
                        sh.metrics.record(
                            sh.ids.xds_initial,
                            self.index as usize,
                            started.elapsed(),
                        );
                        cx.established();
                    }
                }
            }
        }
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
                sh.metrics.error_with("xds_nack", Some(why));
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

/// Whether a status came from the server rather than a broken transport.
fn answered_status(s: &Status) -> bool {
    !matches!(s.code(), Code::Unavailable | Code::Cancelled) && !s.message().contains("transport")
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
