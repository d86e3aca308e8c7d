//! Helpers of the dataplane integration tests: the embedded Consul target
//! (HTTP API and public gRPC port) on 127.0.0.1:0, configs, metrics, and a
//! raw Delta ADS stream for protocol tests.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::task::Poll;
use std::time::Duration;

use agent_sim_consul::conn::{Dialer, Port, Streaming};
use agent_sim_consul::h2::Got;
use agent_sim_consul::http::HttpApi;
use agent_sim_dataplane::codec::ADS_PATH;
use agent_sim_dataplane::xds;
use agent_sim_dataplane::{DataplaneConfig, metrics_spec};
use agent_sim_metrics::Metrics;
use agent_sim_server::consul::{
    ConsulState, ConsulTargetConfig, serve_grpc, serve_http, serve_rpc,
};
use bytes::Bytes;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use prost::Message as _;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub struct Target {
    pub state: ConsulState,
    pub rpc: SocketAddr,
    pub http: SocketAddr,
    pub grpc: SocketAddr,
    pub stop: CancellationToken,
}

impl Drop for Target {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Target {
    pub fn api(&self) -> HttpApi {
        HttpApi::new(self.http, None, "").unwrap()
    }

    /// The node names in the catalog.
    pub async fn nodes(&self) -> Vec<String> {
        let b = self
            .api()
            .call(http::Method::GET, "/v1/catalog/nodes", Bytes::new())
            .await
            .unwrap();
        let v: Vec<serde_json::Value> = serde_json::from_slice(&b).unwrap();
        let mut n: Vec<String> = v
            .iter()
            .map(|n| n["Node"].as_str().unwrap().to_owned())
            .collect();
        n.sort();
        n
    }

    pub async fn put(&self, path: &str, body: serde_json::Value) {
        self.api()
            .put(path, Bytes::from(body.to_string()))
            .await
            .unwrap();
    }
}

pub async fn start_with(cfg: ConsulTargetConfig) -> Target {
    let bind = || async { TcpListener::bind("127.0.0.1:0").await.unwrap() };
    let (r, h, g) = (bind().await, bind().await, bind().await);
    let state = ConsulState::new(cfg);
    let stop = CancellationToken::new();
    let t = Target {
        rpc: r.local_addr().unwrap(),
        http: h.local_addr().unwrap(),
        grpc: g.local_addr().unwrap(),
        state: state.clone(),
        stop: stop.clone(),
    };
    tokio::spawn(serve_rpc(r, state.clone(), stop.clone()));
    tokio::spawn(serve_http(h, state.clone(), stop.clone()));
    tokio::spawn(serve_grpc(g, state, stop));
    t
}

pub async fn start() -> Target {
    start_with(ConsulTargetConfig::default()).await
}

pub fn config(t: &Target) -> DataplaneConfig {
    DataplaneConfig {
        conn: agent_sim_consul::Connection {
            targets: vec![t.grpc.to_string()],
            http_target: t.http.to_string(),
            ..agent_sim_consul::Connection::to(&[])
        },
        ..DataplaneConfig::default()
    }
}

pub fn metrics() -> Metrics {
    Metrics::new(
        &metrics_spec()
            .merge(&agent_sim_consul::metrics_spec())
            .merge(&agent_sim_fleet::metrics_spec()),
        4,
    )
}

/// Registers node `node` (10.0.0.`n`) with service `svc` instance `id` and
/// its connect proxy `<id>-sidecar-proxy` on port 21000 with `upstreams`.
pub async fn register_proxy(
    t: &Target,
    node: &str,
    n: u8,
    svc: &str,
    id: &str,
    upstreams: &[&str],
) {
    let ups: Vec<_> = upstreams
        .iter()
        .map(|u| serde_json::json!({"DestinationName": u, "LocalBindPort": 9191}))
        .collect();
    let addr = format!("10.0.0.{n}");
    t.put(
        "/v1/catalog/register",
        serde_json::json!({"Node": node, "Address": addr,
            "Service": {"ID": id, "Service": svc, "Port": 8080}}),
    )
    .await;
    t.put(
        "/v1/catalog/register",
        serde_json::json!({"Node": node, "Address": addr,
            "Service": {"ID": format!("{id}-sidecar-proxy"), "Service": format!("{svc}-sidecar-proxy"),
                "Kind": "connect-proxy", "Port": 21000,
                "Proxy": {"DestinationServiceName": svc, "DestinationServiceID": id,
                          "LocalServicePort": 8080, "Upstreams": ups}}}),
    )
    .await;
}

/// A raw Delta ADS stream on the sidecars' HTTP/2 client: send requests,
/// read responses (and the status the stream ends with).
pub struct RawAds {
    requests: mpsc::UnboundedSender<Bytes>,
    responses: mpsc::UnboundedReceiver<Result<DeltaDiscoveryResponse, tonic::Status>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RawAds {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RawAds {
    /// Opens a stream to `addr` whose first request is `first`.
    pub async fn open(
        addr: SocketAddr,
        first: DeltaDiscoveryRequest,
    ) -> Result<RawAds, tonic::Status> {
        let d = Dialer::for_port(
            Port::Grpc,
            addr,
            "127.0.0.1",
            None,
            Duration::from_secs(30),
            Duration::from_secs(10),
        )
        .unwrap();
        let Streaming { mut conn, .. } = d
            .connect_streams(None, None)
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        assert!(conn.open(0, ADS_PATH, &[]));
        conn.send(0, |w| first.encode_raw(w));
        let (requests, mut queued) = mpsc::unbounded_channel::<Bytes>();
        let (told, responses) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            loop {
                let got = std::future::poll_fn(|cx| {
                    while let Poll::Ready(Some(b)) = queued.poll_recv(cx) {
                        conn.send(0, |w| w.extend_from_slice(&b));
                    }
                    conn.poll_next(cx, &mut |_, b: &[u8]| {
                        DeltaDiscoveryResponse::decode(b)
                            .map_err(|e| tonic::Status::internal(e.to_string()))
                    })
                })
                .await;
                let _ = match got {
                    Got::Started(_) => continue,
                    Got::Message(_, r) => told.send(r),
                    Got::Ended(_, s) => told.send(Err(s)),
                    Got::Closed(e) => told.send(Err(tonic::Status::unavailable(e.to_string()))),
                };
            }
        });
        Ok(RawAds {
            requests,
            responses,
            task,
        })
    }

    pub fn send(&self, r: &DeltaDiscoveryRequest) {
        self.push(xds::encode(r));
    }

    /// Sends `b` as one request, as it is.
    pub fn push(&self, b: Bytes) {
        let _ = self.requests.send(b);
    }

    /// The next response or the stream's end (`None` after `within`).
    pub async fn next_item(
        &mut self,
        within: Duration,
    ) -> Option<Result<DeltaDiscoveryResponse, tonic::Status>> {
        tokio::time::timeout(within, self.responses.recv())
            .await
            .ok()
            .flatten()
    }

    /// The next response (panics after `within` or on a stream error).
    pub async fn next(&mut self, within: Duration) -> DeltaDiscoveryResponse {
        self.next_item(within)
            .await
            .expect("a response in time")
            .expect("a response, not an error")
    }

    /// Whether no response arrives within `within`.
    pub async fn quiet_for(&mut self, within: Duration) -> bool {
        tokio::time::timeout(within, self.responses.recv())
            .await
            .is_err()
    }
}

/// Runs `fc` of `factory`'s sidecars (or agents) to its end, on `m`.
pub async fn run_fleet<F: agent_sim_fleet::AgentFactory>(
    factory: F,
    fc: agent_sim_fleet::FleetConfig,
    m: &Metrics,
) -> agent_sim_fleet::FleetReport {
    agent_sim_fleet::run(
        fc,
        std::sync::Arc::new(factory),
        m.clone(),
        std::sync::Arc::new(agent_sim_fleet::FleetStatus::default()),
        CancellationToken::new(),
    )
    .await
}
