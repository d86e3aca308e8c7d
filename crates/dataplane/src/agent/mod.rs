//! One simulated sidecar ([`DataplaneAgent`]) and the factory that builds
//! them ([`DataplaneFactory`]).
//!
//! A sidecar's life: register its node, service and connect-proxy (once;
//! or adopt an existing proxy), then sessions: dial its server's gRPC port
//! (boxed connect step), `GetEnvoyBootstrapParams`, then one loop polling
//! the connection driver, the ADS stream, the optional `WatchServers`
//! stream and cancellation. State that survives a reconnect — the xDS
//! versions, the registration — lives in the agent; streams live in the
//! session (`session`).

mod session;

use std::sync::{Arc, OnceLock};

use agent_sim_consul::config::NamePattern;
use agent_sim_consul::conn::{Dialer, Port};
use agent_sim_consul::http::{self, HttpApi, Registration};
use agent_sim_consul::probe::{ProbeBoard, ProbeRunner, RunnerSetup};
use agent_sim_consul::txn::TxnBatcher;
use agent_sim_consul::{ConsulFactory, ProbeKind};
use agent_sim_fleet::{Agent, AgentFactory, BoxFuture, SessionCx, SessionEnd};
use agent_sim_metrics::{CounterId, LatencyId, Metrics};
use tonic::metadata::AsciiMetadataValue;

use crate::config::DataplaneConfig;
use crate::xds::{ProbeWatch, XdsState};
use crate::{DataplaneError, names};

/// Metric ids resolved once.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ids {
    bootstraps: CounterId,
    xds_streams: CounterId,
    xds_responses: CounterId,
    xds_acks: CounterId,
    xds_nacks: CounterId,
    eds_updates: CounterId,
    server_lists: CounterId,
    registrations: CounterId,
    deregistrations: CounterId,
    arrivals_user_time: CounterId,
    connect: LatencyId,
    bootstrap: LatencyId,
    xds_initial: LatencyId,
    probe_overhead: LatencyId,
}

impl Ids {
    fn resolve(m: &Metrics) -> Result<Self, DataplaneError> {
        agent_sim_consul::check_declared(m, &crate::metrics_spec())?;
        Ok(Ids {
            bootstraps: m.counter(names::BOOTSTRAPS),
            xds_streams: m.counter(names::XDS_STREAMS),
            xds_responses: m.counter(names::XDS_RESPONSES),
            xds_acks: m.counter(names::XDS_ACKS),
            xds_nacks: m.counter(names::XDS_NACKS),
            eds_updates: m.counter(names::EDS_UPDATES),
            server_lists: m.counter(names::SERVER_LISTS),
            registrations: m.counter(names::REGISTRATIONS),
            deregistrations: m.counter(names::DEREGISTRATIONS),
            arrivals_user_time: m.counter(names::ARRIVALS_USER_TIME),
            connect: m.latency(names::CONNECT),
            bootstrap: m.latency(names::BOOTSTRAP),
            xds_initial: m.latency(names::XDS_INITIAL),
            probe_overhead: m.latency(names::PROBE_OVERHEAD),
        })
    }
}

/// What every sidecar of a fleet shares.
pub(crate) struct Shared {
    cfg: DataplaneConfig,
    dialers: Vec<Dialer>,
    upstreams: Vec<NamePattern>,
    adopt: Option<(NamePattern, NamePattern)>,
    http: Arc<HttpApi>,
    batcher: OnceLock<TxnBatcher>,
    board: Option<Arc<ProbeBoard>>,
    probe_service: Option<String>,
    metrics: Metrics,
    ids: Ids,
    /// The ACL token of every call (checked as a gRPC metadata value).
    token: Option<Box<str>>,
    envoy_version: Option<(u32, u32, u32)>,
}

impl Shared {
    fn batcher(&self) -> &TxnBatcher {
        self.batcher
            .get_or_init(|| TxnBatcher::spawn(self.http.clone(), self.metrics.clone()))
    }
}

/// Creates [`DataplaneAgent`]s; see [`DataplaneFactory::new`].
pub struct DataplaneFactory {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for DataplaneFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataplaneFactory")
            .field("targets", &self.shared.cfg.conn.targets)
            .field("upstreams", &self.shared.cfg.upstreams)
            .finish()
    }
}

/// Node name of sidecar `index`: apart from the Consul agents' `<prefix>-<i>`
/// nodes, so both fleets can run with one prefix.
pub fn node_name(prefix: &str, index: u64) -> String {
    format!("{prefix}-dp-{index}")
}

/// A unique address of sidecar `index` (10.128.0.0/9, apart from the Consul
/// agents' addresses).
pub fn node_address(index: u64) -> String {
    format!(
        "10.{}.{}.{}",
        128 | ((index >> 16) & 0x7f),
        (index >> 8) & 0xff,
        index & 0xff
    )
}

impl DataplaneFactory {
    /// Validates `cfg` and builds what the sidecars share: dialers (TLS
    /// with ALPN h2), the HTTP client, the registration batcher (started on
    /// first use) and the probe board. `metrics` must declare
    /// [`crate::metrics_spec`].
    pub fn new(cfg: DataplaneConfig, metrics: Metrics) -> Result<Self, DataplaneError> {
        let v = cfg.prepare()?;
        let ids = Ids::resolve(&metrics)?;
        let dialers = v
            .targets
            .iter()
            .zip(&v.hosts)
            .map(|(a, h)| {
                Dialer::for_port(
                    Port::Grpc,
                    *a,
                    h,
                    cfg.conn.tls.as_ref(),
                    cfg.conn.keepalive_time,
                    cfg.conn.keepalive_timeout,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let http = Arc::new(agent_sim_consul::api_client(
            v.http_addr,
            &v.http_host,
            v.https,
            cfg.conn.tls.as_ref(),
            cfg.conn.token.as_deref(),
            &cfg.conn.datacenter,
        )?);
        // Only the controller measures: other shards have no raft index to
        // join EDS arrivals on (docs/dataplane.md).
        let board = match &v.probe_service {
            Some(svc) if cfg.probe.controller => Some(Arc::new(ProbeBoard::new(
                ProbeKind::Catalog,
                svc,
                &cfg.conn.name_prefix,
            ))),
            _ => None,
        };
        let token = match cfg.conn.token.as_deref() {
            Some(t) if !t.is_empty() => {
                AsciiMetadataValue::try_from(t).map_err(crate::config::ConfigError::Token)?;
                Some(t.into())
            }
            _ => None,
        };
        Ok(DataplaneFactory {
            shared: Arc::new(Shared {
                dialers,
                upstreams: v.upstreams,
                adopt: v.adopt,
                http,
                batcher: OnceLock::new(),
                board,
                probe_service: v.probe_service,
                metrics,
                ids,
                token,
                envoy_version: v.envoy_version,
                cfg,
            }),
        })
    }

    /// The probe board the sidecars report to (when this process probes).
    pub fn probe_board(&self) -> Option<Arc<ProbeBoard>> {
        self.shared.board.clone()
    }

    /// The probe service, when a probe runs.
    pub fn probe_service(&self) -> Option<&str> {
        self.shared.probe_service.as_deref()
    }

    /// A probe runner of this fleet's own (a run without a Consul fleet on
    /// the same probe service): deliveries recorded in `propagation_xds`,
    /// probes marked `fleet = consul-dataplane`.
    pub fn probe_runner(&self) -> Option<ProbeRunner> {
        let s = &self.shared;
        let board = s.board.clone()?;
        Some(ProbeRunner::new(
            board,
            s.http.clone(),
            s.metrics.clone(),
            RunnerSetup {
                every: s.cfg.probe.every,
                timeout: s.cfg.probe.timeout(),
                prefix: s.cfg.conn.name_prefix.clone(),
                keep: s.cfg.keep_registrations,
                own_cluster: s.cfg.probe.own_cluster,
            },
            names::PROPAGATION_XDS,
            Some(crate::KIND.into()),
        ))
    }

    /// Hands this fleet's board to `runner` (another fleet's, on the same
    /// probe service): one change, timed at both fleets. False when the
    /// runner probes another service (then use [`Self::probe_runner`]).
    pub fn attach_to(&self, runner: &mut ProbeRunner) -> bool {
        let Some(board) = self.shared.board.clone() else {
            return false;
        };
        if runner.kind() != ProbeKind::Catalog || runner.service() != board.service() {
            return false;
        }
        runner.watch_also(board, names::PROPAGATION_XDS, crate::KIND);
        true
    }

    /// Like [`Self::attach_to`] with a Consul fleet's runner.
    pub fn attach_to_consul(&self, consul: &ConsulFactory) -> Option<ProbeRunner> {
        let mut r = consul.probe_runner()?;
        self.attach_to(&mut r).then_some(r)
    }
}

/// One simulated consul-dataplane with its Envoy.
pub struct DataplaneAgent {
    index: u64,
    shared: Arc<Shared>,
    proxy_id: Box<str>,
    node: Box<str>,
    xds: XdsState,
    registered: bool,
    /// A registration was sent (it may be in the catalog even if its answer
    /// never came: the exit cleanup removes the node then too).
    maybe_registered: bool,
    /// Last probe id this sidecar recorded an arrival for.
    probe_seen: u64,
    /// The probes that expected this sidecar's arrival when its session
    /// last ended (see `ProbeBoard::sub_down`); a sidecar whose probe
    /// cluster went live after a probe was armed is not among its expected
    /// ones, and its arrival is not counted.
    probe_owed: agent_sim_consul::probe::Owed,
}

impl std::fmt::Debug for DataplaneAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataplaneAgent")
            .field("index", &self.index)
            .field("proxy_id", &self.proxy_id)
            .field("registered", &self.registered)
            .finish()
    }
}

impl DataplaneAgent {
    /// The proxy's xDS state (tests, debugging).
    pub fn xds(&self) -> &XdsState {
        &self.xds
    }

    /// The proxy service ID this sidecar serves.
    pub fn proxy_id(&self) -> &str {
        &self.proxy_id
    }

    fn adopting(&self) -> bool {
        self.shared.adopt.is_some()
    }

    /// The txn ops of this sidecar's registration: node (with the run's
    /// meta) and the service instance with a passing check.
    fn registration_ops(&self) -> Vec<String> {
        let sh = &self.shared;
        let address = node_address(self.index);
        http::registration_ops(&Registration {
            node: &self.node,
            address: &address,
            index: self.index,
            service: &sh.cfg.service_name,
            instances: 1,
            sidecars: false,
            upstreams: &[],
            prefix: &sh.cfg.conn.name_prefix,
        })
    }

    /// `PUT /v1/catalog/register` body of this sidecar's connect-proxy with
    /// its upstreams (the probe service among them). Not a txn op: Consul
    /// 1.20's `/v1/txn` keeps a proxy's destination but drops its
    /// `Upstreams` (seen on a real server), and without upstreams a proxy
    /// gets no clusters to watch.
    fn proxy_body(&self) -> String {
        let sh = &self.shared;
        let mut upstreams: Vec<String> =
            sh.upstreams.iter().map(|p| p.expand(self.index)).collect();
        if let Some(p) = &sh.probe_service
            && !upstreams.contains(p)
        {
            upstreams.push(p.clone());
        }
        let ups: Vec<_> = upstreams
            .iter()
            .enumerate()
            .map(|(j, u)| serde_json::json!({"DestinationName": u, "LocalBindPort": 9191 + j}))
            .collect();
        let service = &sh.cfg.service_name;
        let id = http::instance_id(service, self.index, 0);
        serde_json::json!({"Node": &*self.node, "Address": node_address(self.index),
            "SkipNodeUpdate": true,
            "Service": {"ID": &*self.proxy_id, "Service": format!("{service}-sidecar-proxy"),
                "Kind": "connect-proxy", "Port": 21000, "Address": node_address(self.index),
                "Proxy": {"DestinationServiceName": service, "DestinationServiceID": id,
                          "LocalServiceAddress": "127.0.0.1", "LocalServicePort": 8080,
                          "Upstreams": ups}}})
        .to_string()
    }

    async fn finish_inner(&mut self) {
        let sh = self.shared.clone();
        if !self.maybe_registered || sh.cfg.keep_registrations || self.adopting() {
            return;
        }
        let ops = agent_sim_consul::txn::TxnOps::new(vec![http::deregistration_op(&self.node)]);
        match sh.batcher().submit(ops).await {
            Ok(()) => {
                sh.metrics.incr(sh.ids.deregistrations);
                self.registered = false;
                self.maybe_registered = false;
            }
            Err(r) => sh.metrics.error_with(r.kind, r.words.as_deref()),
        }
    }
}

impl AgentFactory for DataplaneFactory {
    type Agent = DataplaneAgent;

    fn create(&self, index: u64) -> DataplaneAgent {
        let s = &self.shared;
        let (proxy_id, node) = match &s.adopt {
            Some((p, n)) => (p.expand(index), n.expand(index)),
            None => (
                format!(
                    "{}-sidecar-proxy",
                    http::instance_id(&s.cfg.service_name, index, 0)
                ),
                node_name(&s.cfg.conn.name_prefix, index),
            ),
        };
        let probe = s
            .board
            .as_ref()
            .map(|b| ProbeWatch::new(b.service(), http::PROBE_ENDPOINT));
        DataplaneAgent {
            index,
            shared: s.clone(),
            proxy_id: proxy_id.into(),
            node: node.into(),
            xds: XdsState::new(probe),
            registered: false,
            maybe_registered: false,
            probe_seen: 0,
            probe_owed: Default::default(),
        }
    }
}

impl Agent for DataplaneAgent {
    fn run_session<'a>(&'a mut self, cx: &'a SessionCx) -> BoxFuture<'a, SessionEnd> {
        Box::pin(self.session(cx))
    }

    fn finish<'a>(&'a mut self, _cx: &'a SessionCx) -> BoxFuture<'a, ()> {
        Box::pin(self.finish_inner())
    }
}
