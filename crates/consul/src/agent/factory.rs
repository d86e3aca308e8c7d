//! The factory of Consul agents: validates the config once and builds what
//! every agent shares.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use agent_sim_fleet::AgentFactory;
use agent_sim_fleet::servers::Router;
use agent_sim_metrics::Metrics;
use agent_sim_proto::consul::subscribe::Topic;

use super::{ConsulAgent, Ids, Shared, Sub, Timed, WatchApi};
use crate::ConsulError;
use crate::config::{self, ConsulConfig, ProbeKind};
use crate::conn::{self, Dialer};
use crate::http::{self, HttpApi};
use crate::probe::{ProbeBoard, ProbeObserver, ProbeRunner};
use crate::view::ViewKind;

/// Creates [`ConsulAgent`]s; see [`ConsulFactory::new`].
pub struct ConsulFactory {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ConsulFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsulFactory")
            .field("rpc_targets", &self.shared.cfg.conn.targets)
            .field("upstreams", &self.shared.cfg.upstreams)
            .finish()
    }
}

impl ConsulFactory {
    /// Validates `cfg` and builds what the agents share: dialers (TLS
    /// config), the HTTP client, the registration batcher (started on first
    /// use) and the probe board. `metrics` must declare [`crate::metrics_spec`].
    pub fn new(cfg: ConsulConfig, metrics: Metrics) -> Result<Self, ConsulError> {
        let v = cfg.prepare()?;
        let ids = Ids::resolve(&metrics)?;
        let dialers = v
            .rpc_addrs
            .iter()
            .zip(&v.rpc_hosts)
            .map(|(a, h)| {
                Dialer::new(
                    *a,
                    h,
                    cfg.conn.tls.as_ref(),
                    cfg.conn.keepalive_time,
                    cfg.conn.keepalive_timeout,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let ids_bytes = crate::conn::ByteCounters {
            metrics: metrics.clone(),
            rx: ids.bytes_rx,
            tx: ids.bytes_tx,
            class: None,
        };
        let http = Arc::new(http_client(&cfg, &v, Some(ids_bytes))?);
        let watch_api = WatchApi {
            addr: v.http_addr,
            tls: match (cfg.conn.tls.as_ref(), v.https) {
                (Some(t), true) => Some((
                    tokio_rustls::TlsConnector::from(conn::tls_client_config(t)?),
                    conn::server_name(t, &v.http_host)?,
                )),
                _ => None,
            },
            host: v.http_addr.to_string(),
        };
        let board = new_board(&cfg, cfg.probe.kind, v.probe_service.as_deref());
        let also = new_board(&cfg, cfg.probe.also, v.probe_service.as_deref());
        let upstreams = v
            .upstreams
            .into_iter()
            .map(|p| {
                let fixed = p.is_fixed().then(|| Arc::<str>::from(p.expand(0)));
                (p, fixed)
            })
            .collect();
        let ttl = cfg.session_ttl.map(|d| (d, config::go_duration(d)));
        let gossip = match (&cfg.gossip, cfg.agent) {
            (Some(g), crate::modes::AgentWire::Client) => Some(crate::gossip::Gossip::new(
                g.clone(),
                v.rpc_addrs.clone(),
                &cfg.conn.datacenter,
                metrics.clone(),
            )?),
            _ => None,
        };
        let flap_interval = cfg.flap_rate.map(|r| r.interval());
        let connect = (cfg.sidecars
            && cfg.connect.leaf_certs
            && cfg.agent == crate::modes::AgentWire::Client)
            .then(Arc::default);
        let kv = super::kv::KvShared::new(&cfg, v.watch_kv);
        Ok(ConsulFactory {
            shared: Arc::new(Shared {
                chains: cfg
                    .service_chain
                    .as_ref()
                    .map(|c| crate::chain::Chains::new(c, cfg.services_per_agent)),
                auto_encrypt: super::auto_encrypt::insecure_tls(&cfg, &dialers, &v.rpc_hosts)?,
                token: cfg.conn.token.clone().unwrap_or_default(),
                cfg,
                dialers,
                upstreams,
                http,
                batcher: OnceLock::new(),
                board,
                also,
                metrics,
                ids,
                ttl,
                flap_interval,
                watch_api,
                gossip,
                connect,
                kv,
                tokens: OnceLock::new(),
                acl_created: Default::default(),
            }),
        })
    }

    /// Ends the agents' gossip at the end of the run, after every agent has
    /// finished: the members still in leave (unless registrations are
    /// kept), and the pool stops.
    pub async fn close_gossip(&self) {
        if let Some(g) = &self.shared.gossip {
            g.close(self.shared.cfg.keep_registrations).await;
        }
    }

    /// The probe controller, when a probe kind is set and this process is
    /// the controller.
    pub fn probe_runner(&self) -> Option<ProbeRunner> {
        self.runner_of(self.shared.board.clone()?)
    }

    /// Every probe controller of this process: the run's probe, and the
    /// intentions probe beside the catalog probe (`--probe
    /// catalog,intentions`); none when this process is not the controller.
    pub fn probe_runners(&self) -> Vec<ProbeRunner> {
        [self.probe_runner(), self.second_probe_runner()]
            .into_iter()
            .flatten()
            .collect()
    }

    /// The intentions probe's controller when it runs beside the catalog
    /// probe: its changes half an interval after the catalog probe's, its
    /// ids the even ones between them, its deliveries in their own
    /// latencies.
    fn second_probe_runner(&self) -> Option<ProbeRunner> {
        let s = &self.shared;
        let mut r = self.runner_of(s.also.clone()?)?;
        r.latency = crate::names::PROPAGATION_INTENTIONS;
        r.proxy_latency = crate::names::PROPAGATION_INTENTIONS_PROXY;
        r.offset = s.cfg.probe.every / 2;
        r.ids = (2, 2);
        Some(r)
    }

    /// The runner of one of the fleet's boards, when this process is the
    /// controller; the first probe's timing, names and ids (1, 2, 3, ...
    /// or the odd ones beside a second probe).
    fn runner_of(&self, board: Arc<ProbeBoard>) -> Option<ProbeRunner> {
        let s = &self.shared;
        if !s.cfg.probe.controller {
            return None;
        }
        Some(ProbeRunner {
            board,
            others: Vec::new(),
            http: s.http.clone(),
            metrics: s.metrics.clone(),
            every: s.cfg.probe.every,
            timeout: s.cfg.probe.timeout(),
            instance_id: http::probe_instance_id(&s.cfg.conn.name_prefix),
            prefix: s.cfg.conn.name_prefix.clone(),
            keep: s.cfg.keep_registrations,
            latency: crate::names::PROPAGATION,
            proxy_latency: crate::names::PROPAGATION_PROXY,
            fleet: None,
            meta: s.cfg.probe.meta,
            changes: Default::default(),
            offset: Duration::ZERO,
            ids: (1, if s.also.is_some() { 2 } else { 1 }),
            own_cluster: s.cfg.probe.own_cluster,
        })
    }

    /// Registers the run's seeded service (`--seed-service`), when one is
    /// set and this process is the probe's controller (shard 0).
    pub async fn seed(&self) -> Result<(), http::HttpError> {
        let s = &self.shared;
        match &s.cfg.seed {
            Some(seed) if s.cfg.probe.controller => {
                crate::seed::seed(&s.http, &s.cfg.conn.name_prefix, seed).await
            }
            _ => Ok(()),
        }
    }

    /// Gets each agent's own ACL token before the agents `first..first +
    /// count` boot (`--acl-tokens`): reads them from the file, or creates
    /// them through the HTTP API at the configured rate, calling
    /// `progress` with the count made. Nothing to do without per-agent
    /// tokens. On a failure what was made stays recorded, to be deleted by
    /// [`ConsulFactory::release_tokens`].
    pub async fn provision_tokens(
        &self,
        first: u64,
        count: u64,
        end: &tokio_util::sync::CancellationToken,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<usize, crate::acl::AclError> {
        use crate::acl::{self, TokenSource};
        let s = &self.shared;
        let tokens = match s.cfg.acl_tokens.as_deref() {
            None => return Ok(0),
            Some(TokenSource::File(path)) => acl::read_file(path, first, count)?,
            Some(TokenSource::NodeIdentity) => {
                let plan = self.token_plan().await?;
                let (made, failed) = acl::create(&s.http, &plan, first, count, end, progress).await;
                *s.acl_created.lock().unwrap_or_else(|p| p.into_inner()) =
                    (made.accessors, made.policy.into_iter().collect());
                if let Some(e) = failed {
                    return Err(e);
                }
                made.tokens
            }
        };
        let n = tokens.len();
        let _ = s.tokens.set(tokens);
        Ok(n)
    }

    /// What each created token holds: the node identity in the servers'
    /// datacenter (asked of them when not configured), the agents' service
    /// when they register one, and the rules the run's features need.
    async fn token_plan(&self) -> Result<crate::acl::TokenPlan, crate::acl::AclError> {
        let s = &self.shared;
        let cfg = &s.cfg;
        let datacenter = match cfg.conn.datacenter.as_str() {
            "" => crate::acl::server_datacenter(&s.http).await?,
            dc => dc.to_owned(),
        };
        let mut kv_reads = cfg.watch_kv.clone();
        if cfg.probe.kind == Some(ProbeKind::Kv) {
            kv_reads.push(crate::kv::probe_key(&cfg.conn.name_prefix));
        }
        Ok(crate::acl::TokenPlan {
            prefix: cfg.conn.name_prefix.clone(),
            datacenter,
            service: (cfg.register && cfg.services_per_agent > 0).then(|| cfg.service_name.clone()),
            chains: s.chains.clone(),
            rules: crate::acl::needed_rules(
                &cfg.conn.name_prefix,
                cfg.session_ttl.is_some(),
                &kv_reads,
            ),
            rate: cfg.acl_token_rate,
        })
    }

    /// Deletes the ACL tokens (and policy) the run created: how many
    /// tokens, and the first failure.
    pub async fn release_tokens(&self) -> (usize, Option<http::HttpError>) {
        let s = &self.shared;
        let (accessors, policies) =
            std::mem::take(&mut *s.acl_created.lock().unwrap_or_else(|p| p.into_inner()));
        if accessors.is_empty() && policies.is_empty() {
            return (0, None);
        }
        crate::acl::delete(&s.http, &accessors, &policies).await
    }

    /// Removes what [`ConsulFactory::seed`] registered (unless the run
    /// keeps its registrations).
    pub async fn unseed(&self) -> Result<(), http::HttpError> {
        let s = &self.shared;
        match &s.cfg.seed {
            Some(seed) if s.cfg.probe.controller && !s.cfg.keep_registrations => {
                crate::seed::unseed(&s.http, &s.cfg.conn.name_prefix, seed).await
            }
            _ => Ok(()),
        }
    }

    /// Every probe observer of this process, when a probe kind is set and
    /// this process is not the controller (another shard makes the changes;
    /// this one measures its own agents and reports each change by raft
    /// index): the run's probe's, and the intentions probe's beside the
    /// catalog probe's.
    pub fn probe_observers(&self) -> Vec<ProbeObserver> {
        let s = &self.shared;
        if s.cfg.probe.controller {
            return Vec::new();
        }
        [&s.board, &s.also]
            .into_iter()
            .flatten()
            .map(|b| ProbeObserver {
                board: b.clone(),
                metrics: s.metrics.clone(),
            })
            .collect()
    }

    /// The fleet's certificates, when its agents keep leaf certificates
    /// (sidecars on the client wire): the rotation is started and its
    /// figures read there.
    pub fn connect_board(&self) -> Option<Arc<crate::connect::ConnectBoard>> {
        self.shared.connect.clone()
    }

    /// The probe board (for tests and status displays).
    pub fn probe_board(&self) -> Option<Arc<ProbeBoard>> {
        self.shared.board.clone()
    }
}

/// The HTTP API client of `cfg` (plain or HTTPS, token, datacenter).
fn http_client(
    cfg: &ConsulConfig,
    v: &config::Validated,
    bytes: Option<crate::conn::ByteCounters>,
) -> Result<HttpApi, ConsulError> {
    let http_tls = match (cfg.conn.tls.as_ref(), v.https) {
        (Some(t), true) => Some((
            conn::tls_client_config(t)?,
            conn::server_name(t, &v.http_host)?,
        )),
        _ => None,
    };
    HttpApi::counted(
        v.http_addr,
        http_tls,
        cfg.conn.token.as_deref(),
        &cfg.conn.datacenter,
        bytes,
    )
}

/// An HTTP API client for the resolved `addr` (`host`: the name to verify
/// over HTTPS), with the TLS settings, token and datacenter of a fleet.
pub fn api_client(
    addr: std::net::SocketAddr,
    host: &str,
    https: bool,
    tls: Option<&config::ConsulTls>,
    token: Option<&str>,
    datacenter: &str,
) -> Result<HttpApi, ConsulError> {
    let http_tls = match (tls, https) {
        (Some(t), true) => Some((conn::tls_client_config(t)?, conn::server_name(t, host)?)),
        _ => None,
    };
    HttpApi::with_tls(addr, http_tls, token, datacenter)
}

/// The probe's board: the controller's (which arms changes and collects
/// arrivals), an observer's, or none when the run has no probe.
fn new_board(
    cfg: &ConsulConfig,
    kind: Option<ProbeKind>,
    probe_service: Option<&str>,
) -> Option<Arc<ProbeBoard>> {
    match (kind, probe_service) {
        (Some(ProbeKind::Kv), _) => Some(Arc::new(ProbeBoard::new(
            ProbeKind::Kv,
            &crate::kv::probe_key(&cfg.conn.name_prefix),
            &cfg.conn.name_prefix,
        ))),
        (Some(kind), Some(svc)) if cfg.probe.controller => Some(Arc::new(
            ProbeBoard::new(kind, svc, &cfg.conn.name_prefix).with_proxies(cfg.proxies.per_agent),
        )),
        (Some(kind), Some(svc)) => Some(Arc::new(ProbeBoard::new_observer(
            kind,
            svc,
            &cfg.conn.name_prefix,
            cfg.probe.timeout(),
        ))),
        _ => None,
    }
}

/// Validates `cfg` and builds its HTTP API client alone (for
/// [`crate::cleanup`]).
pub fn http_api(cfg: &ConsulConfig) -> Result<HttpApi, ConsulError> {
    http_client(cfg, &cfg.prepare()?, None)
}

impl AgentFactory for ConsulFactory {
    type Agent = ConsulAgent;

    fn create(&self, index: u64) -> ConsulAgent {
        let s = &self.shared;
        let probe_svc = s.board.as_ref().map(|b| b.service());
        let mut subs: Vec<Sub> = Vec::with_capacity(s.upstreams.len() + 2);
        // In a service chain, the next tier of the agent's own chain first.
        if let Some(c) = &s.chains
            && let Some(next) = c.upstream(&s.cfg.service_name, c.place(index))
        {
            subs.push(Sub::new(
                Arc::from(next),
                Topic::ServiceHealth,
                ViewKind::Health,
                None,
            ));
        }
        let mut probe_taken = false;
        for (pattern, fixed) in &s.upstreams {
            let name = match fixed {
                Some(n) => n.clone(),
                None => Arc::from(pattern.expand(index)),
            };
            let probe = !probe_taken
                && fixed.is_some()
                && s.board.as_ref().map(|b| b.kind()) == Some(ProbeKind::Catalog)
                && probe_svc == Some(&*name);
            probe_taken |= probe;
            subs.push(Sub::new(
                name,
                Topic::ServiceHealth,
                ViewKind::Health,
                probe.then_some(Timed::Main),
            ));
        }
        // Every agent watches the catalog probe's service.
        if !probe_taken
            && let Some(b) = &s.board
            && b.kind() == ProbeKind::Catalog
        {
            subs.push(Sub::new(
                Arc::from(b.service()),
                Topic::ServiceHealth,
                ViewKind::Health,
                Some(Timed::Main),
            ));
        }
        // The intentions probe's subscription, alone or beside the
        // catalog probe's.
        for (b, timed) in [(&s.board, Timed::Main), (&s.also, Timed::Also)] {
            if let Some(b) = b
                && b.kind() == ProbeKind::Intentions
            {
                subs.push(Sub::new(
                    Arc::from(b.service()),
                    Topic::ServiceIntentions,
                    ViewKind::Intentions,
                    Some(timed),
                ));
            }
        }
        ConsulAgent {
            index,
            shared: s.clone(),
            subs: subs.into_boxed_slice(),
            registered: false,
            maybe_registered: false,
            repairing: false,
            session_id: None,
            renew_due: None,
            flaps: 0,
            extra: None,
            router: Router::new(s.dialers.len(), index.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            session_server: 0,
            news_seen: Default::default(),
            moved: false,
            moved_link: None,
            kv: s.kv.watches(index),
        }
    }
}
