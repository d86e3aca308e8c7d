//! The typed configuration of a Consul fleet ([`ConsulConfig`]), its
//! validation, and the per-agent name patterns (`svc-{i%100}`).
//!
//! [`ConsulConfig::validate`] holds every rule (the CLI calls it before any
//! socket is opened); [`crate::ConsulFactory::new`] validates again and
//! resolves the addresses; agents then only read the validated values.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use agent_sim_fleet::Rate;

use crate::ConsulError;
pub use crate::config_error::ConfigError;
use crate::modes::KV_MAX_PREFIXES;
pub use crate::modes::go_duration;
pub use crate::pattern::{NamePattern, PatternError};

/// Consul's `ae_interval`: a client agent's full anti-entropy sync period
/// (scaled up with the cluster size, see [`ae_scale`]).
pub const AE_INTERVAL: Duration = Duration::from_secs(60);
/// The server's keepalive `MinTime`: pinging more often earns a GOAWAY.
pub const KEEPALIVE_MIN: Duration = Duration::from_secs(15);
/// Most operations in one `/v1/txn` request.
pub const TXN_MAX_OPS: usize = 128;

/// Everything a Consul fleet can be told (see the crate docs for defaults).
#[derive(Debug, Clone)]
pub struct ConsulConfig {
    /// The servers, the HTTP API, token, datacenter, name prefix, TLS and
    /// keepalive. `conn.targets` are the servers' RPC ports (8300); agent
    /// `i` uses `targets[i % len]`, one TCP connection per agent; node names
    /// are `<name_prefix>-<index>`.
    pub conn: Connection,
    /// Services every agent subscribes to; entries may hold `{i}` or `{i%N}`.
    /// Empty: the agents watch nothing, as most client agents; each still
    /// holds its idle gRPC connection beside its RPC one, as a real client
    /// agent does (measured on a real 1.20.1: one per agent, no stream).
    pub upstreams: Vec<String>,
    /// Register node + services through the HTTP API.
    pub register: bool,
    /// Service name of each agent's own instances.
    pub service_name: String,
    /// Instances of `service_name` per agent.
    pub services_per_agent: u32,
    /// Chains of services, each tier calling the next (`--service-chain
    /// 10,83,85`): each agent registers instances of its tier's service
    /// (`{service_name}-{tier letter}-{chain}`, about `services_per_agent`
    /// of them) and also watches the next tier ([`crate::chain`]).
    pub service_chain: Option<crate::chain::ChainSpec>,
    /// Also register a connect-proxy sidecar per instance.
    pub sidecars: bool,
    /// Leave registrations in the catalog at shutdown.
    pub keep_registrations: bool,
    /// TTL session per agent, renewed every TTL/2 (`None` = no session).
    /// Its bounds are the server's (`session_ttl_min`, 10 s by default): a
    /// TTL out of them is refused by the server, in its words.
    pub session_ttl: Option<Duration>,
    /// Anti-entropy: every agent compares the catalog's view of its node
    /// and services with its own every interval (scaled with the cluster
    /// size and jittered, as Consul does) and registers again what is
    /// missing or different (`None` = off).
    pub anti_entropy: Option<Duration>,
    /// Agents in the whole simulated cluster (all shards), for the
    /// anti-entropy scaling; 0 = this fleet's own size is not known (1).
    pub cluster_size: u64,
    /// Per-agent check flapping through catalog register (`None` = off).
    pub flap_rate: Option<Rate>,
    /// The propagation probe.
    pub probe: ProbeConfig,
    /// What the agents write their catalog and sessions with: a client
    /// agent's RPCs (the default) or the HTTP API.
    pub agent: crate::modes::AgentWire,
    /// The router's shortest time between two rebalances (Consul's 2
    /// minutes, plus up to half of it at random; tests shorten it).
    pub rebalance_min: Duration,
    /// How each upstream is watched: `Subscribe` streams, blocking queries
    /// over the RPC port, or long polls of the HTTP API.
    pub watch: crate::modes::WatchMode,
    /// Longest a blocking query waits for a change (its `MaxQueryTime`, the
    /// HTTP `wait`; Consul's `default_query_time` is 5 min).
    pub blocking_wait: Duration,
    /// A service the run registers before its agents start and removes
    /// after them ([`crate::seed`]).
    pub seed: Option<Box<crate::modes::SeedService>>,
    /// The agents' gossip membership (client wire only; `None`: off).
    pub gossip: Option<crate::gossip::GossipConfig>,
    /// Connect leaf certificates and the CA rotation.
    pub connect: Box<crate::connect::ConnectConfig>,
    /// KV prefixes every agent watches as consul-template does
    /// (`--watch-kv`; `{i}`/`{i%N}` patterns; [`crate::kv`]).
    pub watch_kv: Vec<String>,
    /// Simulated Vault servers storing in the cluster (`--vault-nodes`;
    /// run by the probe's controller process only).
    pub vault: Option<Box<crate::vault_config::VaultConfig>>,
    /// Each agent's own ACL token (the `acl` module; `None`: every agent
    /// uses `conn.token`). Client wire only.
    pub acl_tokens: Option<Box<crate::modes::TokenSource>>,
    /// Token creates per second when the run creates them.
    pub acl_token_rate: f64,
    /// Connect proxies behind every agent, timed as proxycfg hands them
    /// their upstreams' updates ([`crate::proxy`]; `per_agent` 0: none).
    pub proxies: Box<crate::proxy::ProxyConfig>,
}

impl Default for ConsulConfig {
    fn default() -> Self {
        ConsulConfig {
            conn: Connection {
                http_target: "127.0.0.1:8500".into(),
                ..Connection::to(&["127.0.0.1:8300"])
            },
            upstreams: vec!["web".into(), "api".into()],
            register: true,
            service_name: "app".into(),
            services_per_agent: 1,
            service_chain: None,
            sidecars: false,
            keep_registrations: false,
            session_ttl: Some(Duration::from_secs(30)),
            anti_entropy: Some(AE_INTERVAL),
            cluster_size: 0,
            flap_rate: None,
            probe: ProbeConfig::default(),
            agent: crate::modes::AgentWire::default(),
            rebalance_min: agent_sim_fleet::servers::REBALANCE_MIN,
            gossip: None,
            connect: Box::default(),
            watch: crate::modes::WatchMode::default(),
            blocking_wait: crate::modes::DEFAULT_WAIT,
            seed: None,
            watch_kv: Vec::new(),
            vault: None,
            acl_tokens: None,
            acl_token_rate: crate::modes::DEFAULT_TOKEN_RATE,
            proxies: Box::default(),
        }
    }
}

/// How a fleet reaches a Consul cluster: what client agents and dataplane
/// sidecars share (the port `targets` name is each fleet's own: the RPC
/// port for agents, the gRPC port for sidecars).
#[derive(Debug, Clone)]
pub struct Connection {
    /// `host:port` of the servers' ports the sessions dial.
    pub targets: Vec<String>,
    /// The HTTP API: `host:port` (plain, 8500) or `https://host:port`
    /// (HTTPS, 8501; with the CA, verification and client certificate of
    /// [`Connection::tls`]). Empty: the first target's host on port 8500,
    /// or `https://` on 8501 when `tls` is set.
    pub http_target: String,
    /// ACL token: `SubscribeRequest.Token`, gRPC metadata
    /// `x-consul-token` and the `X-Consul-Token` header.
    pub token: Option<String>,
    /// Datacenter of the calls; empty means the server's own.
    pub datacenter: String,
    /// Prefix of the run's node names (meta `agent-sim-prefix`).
    pub name_prefix: String,
    /// TLS on the dialed port (RPC: `0x03` + TLS + `0x08`; gRPC: 8503).
    pub tls: Option<ConsulTls>,
    /// HTTP/2 keepalive ping interval (never below 15 s).
    pub keepalive_time: Duration,
    /// HTTP/2 keepalive ping timeout.
    pub keepalive_timeout: Duration,
}

impl Connection {
    /// Plain connections to `targets`, the HTTP API derived from the first,
    /// prefix `agent-sim`, keepalive 30 s / 10 s.
    pub fn to(targets: &[&str]) -> Self {
        Connection {
            targets: targets.iter().map(|t| t.to_string()).collect(),
            http_target: String::new(),
            token: None,
            datacenter: String::new(),
            name_prefix: "agent-sim".into(),
            tls: None,
            keepalive_time: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
        }
    }

    /// The HTTP API address in force: `http_target`, or the first target's
    /// host on port 8500 (`https://` on 8501 with TLS).
    pub fn http_target(&self) -> String {
        if !self.http_target.is_empty() {
            return self.http_target.clone();
        }
        let (scheme, port) = if self.tls.is_some() {
            ("https://", 8501)
        } else {
            ("", 8500)
        };
        match self.targets.first() {
            Some(t) => match t.rsplit_once(':') {
                Some((h, _)) => format!("{scheme}{h}:{port}"),
                None => format!("{scheme}{t}:{port}"),
            },
            None => String::new(),
        }
    }

    /// The probe service a run owns: `<name_prefix>-probe`.
    pub fn own_probe_service(&self) -> String {
        format!("{}-probe", self.name_prefix)
    }

    /// The rules every Consul fleet's connection follows (targets, HTTP API,
    /// name prefix, keepalive, TLS); `no_target` says which port is missing.
    pub fn check(&self, no_target: &'static str) -> Result<(), ConfigError> {
        if self.targets.is_empty() {
            return Err(ConfigError::NoTarget(no_target));
        }
        for t in &self.targets {
            check_host_port("targets", t)?;
        }
        let target = self.http_target();
        let (https, hostport) = http_parts(&target);
        check_host_port("http_target", hostport)?;
        if https && self.tls.is_none() {
            return Err(ConfigError::HttpsWithoutTls);
        }
        if self.name_prefix.is_empty() || self.name_prefix.contains(['/', ' ']) {
            return Err(ConfigError::NamePrefix(self.name_prefix.clone()));
        }
        check_connection(
            self.keepalive_time,
            self.keepalive_timeout,
            self.tls.as_ref(),
        )
    }

    /// The resolved targets with their hosts, and the HTTP API's address,
    /// host and whether it is HTTPS.
    pub fn resolved(&self) -> Result<Resolved, ConsulError> {
        let mut out = Resolved::default();
        for t in &self.targets {
            out.targets.push(resolve("targets", t)?);
            out.hosts.push(host_of(t).to_owned());
        }
        let target = self.http_target();
        let (https, hostport) = http_parts(&target);
        out.http_addr = Some(resolve("http_target", hostport)?);
        out.http_host = host_of(hostport).to_owned();
        out.https = https;
        Ok(out)
    }
}

/// What [`Connection::resolved`] finds.
#[derive(Debug, Clone, Default)]
pub struct Resolved {
    /// The targets' addresses, in order.
    pub targets: Vec<SocketAddr>,
    /// The targets' host names (TLS server names).
    pub hosts: Vec<String>,
    /// The HTTP API's address.
    pub http_addr: Option<SocketAddr>,
    /// The HTTP API's host name.
    pub http_host: String,
    /// Whether the HTTP API is HTTPS.
    pub https: bool,
}

/// TLS settings for the RPC port.
#[derive(Debug, Clone, Default)]
pub struct ConsulTls {
    /// PEM file of the CA that signed the servers' certificates.
    pub ca_file: Option<PathBuf>,
    /// Accept any server certificate (tests, labs).
    pub insecure_skip_verify: bool,
    /// PEM client certificate, for servers with `verify_incoming`.
    pub cert_file: Option<PathBuf>,
    /// PEM key of `cert_file`.
    pub key_file: Option<PathBuf>,
    /// Name to verify (e.g. `server.dc1.consul`); default the target host.
    pub server_name: Option<String>,
}

impl ConsulTls {
    /// The client settings of `agent-sim-net`.
    pub fn client(&self) -> agent_sim_net::ClientTls {
        agent_sim_net::ClientTls {
            ca_file: self.ca_file.clone(),
            insecure_skip_verify: self.insecure_skip_verify,
            cert_file: self.cert_file.clone(),
            key_file: self.key_file.clone(),
        }
    }
}

/// The HTTP API target split into its parts: whether it is HTTPS, and
/// `host:port`.
pub fn http_parts(target: &str) -> (bool, &str) {
    match target.strip_prefix("https://") {
        Some(rest) => (true, rest.trim_end_matches('/')),
        None => (
            false,
            target
                .strip_prefix("http://")
                .unwrap_or(target)
                .trim_end_matches('/'),
        ),
    }
}

/// What the propagation probe changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    /// Alternately deregister / register an instance of a shared upstream.
    Catalog,
    /// Write a `service-intentions` config entry, timed on `ServiceIntentions`
    /// subscriptions.
    Intentions,
    /// Write the run's own KV key (`<name-prefix>/probe/kv`), timed on every
    /// agent's KV watch (`--watch-kv`).
    Kv,
}

impl fmt::Display for ProbeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProbeKind::Catalog => "catalog",
            ProbeKind::Intentions => "intentions",
            ProbeKind::Kv => "kv",
        })
    }
}

impl std::str::FromStr for ProbeKind {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s.trim() {
            "catalog" => Ok(ProbeKind::Catalog),
            "intentions" => Ok(ProbeKind::Intentions),
            "kv" => Ok(ProbeKind::Kv),
            o => Err(ConfigError::ProbeKind(o.to_owned())),
        }
    }
}

/// What `--probe` takes: one kind, or `catalog,intentions`, both timed in
/// one run, each change on a board of its own (the intentions probe's
/// deliveries in their own latencies, half an interval after each catalog
/// change).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeKinds {
    /// The first probe (its deliveries are `propagation`).
    pub kind: ProbeKind,
    /// The intentions probe beside the catalog probe.
    pub also: Option<ProbeKind>,
}

impl fmt::Display for ProbeKinds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.also {
            Some(k) => write!(f, "{},{k}", self.kind),
            None => write!(f, "{}", self.kind),
        }
    }
}

impl std::str::FromStr for ProbeKinds {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        let kinds = s
            .split(',')
            .map(str::parse)
            .collect::<Result<Vec<ProbeKind>, _>>()?;
        match kinds.as_slice() {
            [k] => Ok(ProbeKinds {
                kind: *k,
                also: None,
            }),
            [ProbeKind::Catalog, ProbeKind::Intentions]
            | [ProbeKind::Intentions, ProbeKind::Catalog] => Ok(ProbeKinds {
                kind: ProbeKind::Catalog,
                also: Some(ProbeKind::Intentions),
            }),
            _ => Err(ConfigError::ProbeKinds(s.trim().to_owned())),
        }
    }
}

/// The propagation probe.
#[derive(Debug, Clone)]
pub struct ProbeConfig {
    /// `None` = no probe.
    pub kind: Option<ProbeKind>,
    /// The intentions probe timed beside the catalog probe in the same run
    /// (`--probe catalog,intentions`): its own board and runner, its
    /// deliveries in `propagation_intentions` (and `..._proxy`).
    pub also: Option<ProbeKind>,
    /// Time between probes.
    pub every: Duration,
    /// The service the probe changes: default `<name_prefix>-probe`, a
    /// service of the run's own (instances of its own probe node, or its own
    /// `service-intentions` entry). Naming another service changes that
    /// service's catalog instead (the catalog probe adds and removes its own
    /// instance of it); the intentions probe never touches an entry it did
    /// not create. Every agent subscribes to the probe service.
    pub service: Option<String>,
    /// Deliveries later than this after T0 count as missing; `None`: 10 s,
    /// or the probe interval when that is shorter (one probe at a time).
    pub timeout: Option<Duration>,
    /// This process makes the changes (shard 0, or [`Self::own_cluster`]).
    pub controller: bool,
    /// This process's servers are its own (a local process of a run on
    /// embedded servers): it makes its own changes, and their ids name
    /// nothing in another process's cluster, so its probe summaries carry
    /// none (`report merge` joins them by sequence).
    pub own_cluster: bool,
    /// Catalog probe: each change sets new metadata on the probe's own
    /// instance (`--change-every`) instead of deregistering and
    /// registering it again.
    pub meta: bool,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        ProbeConfig {
            kind: None,
            also: None,
            every: Duration::from_secs(30),
            service: None,
            timeout: None,
            controller: true,
            own_cluster: false,
            meta: false,
        }
    }
}

/// Probe timeout when none is set (capped at the probe interval).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

impl ProbeConfig {
    /// The timeout in force: the configured one, else [`PROBE_TIMEOUT`]
    /// capped at the interval (half of it with a second probe, whose
    /// changes come half an interval after the first's).
    pub fn timeout(&self) -> Duration {
        let every = match self.also {
            Some(_) => self.every / 2,
            None => self.every,
        };
        self.timeout.unwrap_or(PROBE_TIMEOUT.min(every))
    }

    /// Sets the probe kinds (`None`: no probe).
    pub fn set_kinds(&mut self, kinds: Option<ProbeKinds>) {
        self.kind = kinds.map(|k| k.kind);
        self.also = kinds.and_then(|k| k.also);
    }

    /// Whether the intentions probe runs (alone, or beside the catalog's).
    pub fn times_intentions(&self) -> bool {
        self.kind == Some(ProbeKind::Intentions) || self.also == Some(ProbeKind::Intentions)
    }
}

/// Consul's `serverUpInterval`: after a reconnect an agent syncs with the
/// catalog within this, scaled by [`ae_scale`] and staggered.
pub const AE_SERVER_UP: Duration = Duration::from_secs(3);

impl ConsulConfig {
    /// How long after a reconnect an agent may wait for the staggered sync
    /// that makes it connected again (`AE_SERVER_UP × ae_scale`): what a
    /// scenario leaves before the end of a run for churned agents to be back.
    pub fn reconnect_sync_window(&self) -> Duration {
        AE_SERVER_UP * ae_scale(self.cluster_size)
    }
}

/// Consul's anti-entropy scale factor: 1 up to 128 nodes, then one more
/// per doubling (`agent/ae`).
pub fn ae_scale(nodes: u64) -> u32 {
    if nodes <= 128 {
        return 1;
    }
    ((nodes as f64).log2() - 128f64.log2()).ceil() as u32 + 1
}

/// Operations one agent's registration takes in a txn.
pub(crate) fn ops_per_agent(cfg: &ConsulConfig) -> usize {
    // Node, then per instance: service + its check (+ sidecar).
    1 + instances_at_most(cfg) as usize * if cfg.sidecars { 3 } else { 2 }
}

/// The most instances one agent registers (its tier's share in a chain).
pub(crate) fn instances_at_most(cfg: &ConsulConfig) -> u32 {
    match &cfg.service_chain {
        Some(c) => crate::chain::Chains::new(c, cfg.services_per_agent).max_per_agent(),
        None => cfg.services_per_agent,
    }
}

/// Resolves `host:port` to its first address; a failure names `what` (the
/// config field).
pub fn resolve(what: &'static str, hostport: &str) -> Result<SocketAddr, ConfigError> {
    hostport
        .to_socket_addrs()
        .map_err(|source| ConfigError::Unresolved {
            field: what,
            value: hostport.to_owned(),
            source,
        })?
        .next()
        .ok_or_else(|| ConfigError::NoAddress {
            field: what,
            value: hostport.to_owned(),
        })
}

/// The host part of `host:port` (brackets of an IPv6 literal removed).
pub fn host_of(hostport: &str) -> &str {
    let host = hostport
        .rsplit_once(':')
        .map(|(h, _)| h)
        .unwrap_or(hostport);
    host.trim_matches(['[', ']'])
}

/// Checks that `t` is `host:port` (the error names `field`).
pub fn check_host_port(field: &'static str, t: &str) -> Result<(), ConfigError> {
    match t.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok() => Ok(()),
        _ => Err(ConfigError::NotHostPort {
            field,
            value: t.to_owned(),
        }),
    }
}

/// What preparation derives from a [`ConsulConfig`]: resolved addresses and
/// parsed patterns.
#[derive(Debug)]
pub(crate) struct Validated {
    pub rpc_addrs: Vec<SocketAddr>,
    pub rpc_hosts: Vec<String>,
    pub http_addr: SocketAddr,
    /// Host part of the HTTP target (the TLS name to verify).
    pub http_host: String,
    /// Whether the HTTP API is HTTPS.
    pub https: bool,
    pub upstreams: Vec<NamePattern>,
    /// Probe service name (when a probe kind is set).
    pub probe_service: Option<String>,
    /// The KV prefixes watched (`--watch-kv`, or the run's own with
    /// `--probe kv`).
    pub watch_kv: Vec<NamePattern>,
}

impl ConsulConfig {
    /// The HTTP API address in force (see [`Connection::http_target`]).
    pub fn http_target(&self) -> String {
        self.conn.http_target()
    }

    /// The probe service a run owns: `<name_prefix>-probe`.
    pub fn own_probe_service(&self) -> String {
        self.conn.own_probe_service()
    }

    /// Checks every setting against what a Consul 1.20 server accepts,
    /// without resolving names or opening sockets. The first problem is
    /// returned as [`ConsulError::Invalid`] naming the field.
    pub fn validate(&self) -> Result<(), ConsulError> {
        self.checked()?;
        self.kv_prefixes()?;
        Ok(())
    }

    /// The prefixes of `cfg` an agent watches, checked: `--watch-kv`'s, or the
    /// run's own with `--probe kv` and none given. With `--probe kv` every
    /// agent is timed on its first prefix that holds the probe key (one the
    /// same for every agent); a run where none does is refused, saying why.
    pub fn kv_prefixes(&self) -> Result<Vec<NamePattern>, ConfigError> {
        use crate::modes::{kv_own_prefix, kv_probe_key};
        let cfg = self;
        let probe = cfg.probe.kind == Some(ProbeKind::Kv);
        let own = kv_own_prefix(&cfg.conn.name_prefix);
        let raw: Vec<String> = match (&cfg.watch_kv[..], probe) {
            ([], true) => vec![own.clone()],
            (given, _) => given.to_vec(),
        };
        if raw.len() > KV_MAX_PREFIXES {
            return Err(ConfigError::KvPrefixes(raw.len()));
        }
        let mut out = Vec::with_capacity(raw.len());
        for r in &raw {
            if r.contains(['?', '#', ' ']) {
                return Err(ConfigError::KvPrefixChars(r.clone()));
            }
            out.push(
                NamePattern::parse(r).map_err(|source| ConfigError::KvPrefix {
                    prefix: r.clone(),
                    source,
                })?,
            );
        }
        let key = kv_probe_key(&cfg.conn.name_prefix);
        if probe && !out.iter().any(|p| p.holds(&key)) {
            return Err(ConfigError::KvProbeUnwatched {
                key,
                watched: raw.join(", "),
                own,
            });
        }
        if probe && !cfg.probe.controller {
            return Err(ConfigError::KvProbeSharded);
        }
        Ok(out)
    }

    /// [`ConsulConfig::validate`], then resolves the addresses.
    pub(crate) fn prepare(&self) -> Result<Validated, ConsulError> {
        let (upstreams, probe_service) = self.checked()?;
        let watch_kv = self.kv_prefixes()?;
        let r = self.conn.resolved()?;
        Ok(Validated {
            rpc_addrs: r.targets,
            rpc_hosts: r.hosts,
            http_addr: r.http_addr.expect("resolved() sets the HTTP address"),
            http_host: r.http_host,
            https: r.https,
            upstreams,
            probe_service,
            watch_kv,
        })
    }

    /// The rules; returns the parsed upstream patterns and the probe service.
    fn checked(&self) -> Result<(Vec<NamePattern>, Option<String>), ConfigError> {
        self.conn
            .check("no RPC target (host:port of a server's port 8300)")?;
        if let Some(v) = &self.vault {
            v.validate(&self.conn.name_prefix)?;
        }
        let upstreams = self
            .upstreams
            .iter()
            .map(|u| NamePattern::parse(u).map_err(ConfigError::Upstream))
            .collect::<Result<Vec<_>, _>>()?;
        self.check_registration()?;
        self.check_timers()?;
        self.check_probe_modes()?;
        let timed_at_proxies = matches!(
            self.probe.kind,
            Some(ProbeKind::Catalog | ProbeKind::Intentions)
        ) && self.probe.controller;
        self.proxies.check(
            self.agent,
            self.watch,
            timed_at_proxies.then(|| self.probe.timeout()),
        )?;
        let probe_service = match self.probe.kind {
            None => None,
            Some(_) => Some(self.probe_service()?),
        };
        Ok((upstreams, probe_service))
    }

    /// The registration's rules: a service, instances, a txn that holds
    /// them.
    fn check_registration(&self) -> Result<(), ConfigError> {
        if self.register {
            if self.service_name.is_empty() {
                return Err(ConfigError::ServiceName);
            }
            if self.services_per_agent == 0 {
                return Err(ConfigError::NoServices);
            }
            if ops_per_agent(self) > TXN_MAX_OPS {
                return Err(ConfigError::TxnOps {
                    services: instances_at_most(self),
                    sidecars: self.sidecars,
                    ops: ops_per_agent(self),
                    max: TXN_MAX_OPS,
                });
            }
        }
        Ok(())
    }

    /// The session TTL, the anti-entropy interval, flapping (only of
    /// registered checks) and the blocking wait.
    fn check_timers(&self) -> Result<(), ConfigError> {
        let second = Duration::from_secs(1);
        if let Some(ttl) = self.session_ttl
            && ttl < second
        {
            return Err(ConfigError::SessionTtl(ttl));
        }
        if let Some(ae) = self.anti_entropy
            && ae < second
        {
            return Err(ConfigError::AntiEntropy(ae));
        }
        if let Some(r) = self.flap_rate {
            let ps = r.as_per_second();
            if !(ps.is_finite() && ps > 0.0 && ps <= 100.0) {
                return Err(ConfigError::FlapRate(r));
            }
            if !self.register {
                return Err(ConfigError::FlapUnregistered);
            }
        }
        if !(second..=Duration::from_secs(600)).contains(&self.blocking_wait) {
            return Err(ConfigError::BlockingWait(self.blocking_wait));
        }
        Ok(())
    }

    /// What the probe and the seeded service ask of the watch mode and the
    /// upstreams.
    fn check_probe_modes(&self) -> Result<(), ConfigError> {
        if self.watch != crate::modes::WatchMode::Streaming && self.probe.times_intentions() {
            return Err(ConfigError::IntentionsNotStreaming);
        }
        if let Some(also) = self.probe.also
            && (self.probe.kind != Some(ProbeKind::Catalog) || also != ProbeKind::Intentions)
        {
            let kinds = self.probe.kind.map_or("off".to_owned(), |k| k.to_string());
            return Err(ConfigError::ProbeKinds(format!("{kinds},{also}")));
        }
        if self.probe.meta && self.probe.kind != Some(ProbeKind::Catalog) {
            return Err(ConfigError::ChangeEveryNotCatalog);
        }
        if let Some(seed) = &self.seed
            && self.upstreams.is_empty()
            && self.probe.service.as_deref() != Some(seed.name.as_str())
        {
            return Err(ConfigError::SeedUnwatched((**seed).clone()));
        }
        if self.acl_tokens.is_some() && self.agent != crate::modes::AgentWire::Client {
            return Err(ConfigError::AclTokensWire);
        }
        if !(self.acl_token_rate > 0.0 && self.acl_token_rate <= 100_000.0) {
            return Err(ConfigError::AclTokenRate(self.acl_token_rate));
        }
        Ok(())
    }

    fn probe_service(&self) -> Result<String, ConfigError> {
        let p = &self.probe;
        if p.every < Duration::from_secs(1) {
            return Err(ConfigError::ProbeEvery);
        }
        if p.timeout().is_zero() {
            return Err(ConfigError::ProbeTimeoutZero);
        }
        if p.also.is_some() && p.timeout() > p.every / 2 {
            return Err(ConfigError::ProbeTimeoutOverHalf {
                timeout: p.timeout(),
                every: p.every,
            });
        }
        if p.timeout() > p.every {
            return Err(ConfigError::ProbeTimeoutOver {
                timeout: p.timeout(),
                every: p.every,
            });
        }
        let svc = match &p.service {
            Some(s) if s.contains(['{', '}']) => return Err(ConfigError::ProbeServicePattern),
            Some(s) if s.is_empty() => return Err(ConfigError::ProbeServiceEmpty),
            Some(s) => s.clone(),
            None => self.own_probe_service(),
        };
        Ok(svc)
    }
}

/// The checks of the connection settings Consul agents and dataplane
/// sidecars share (HTTP/2 keepalive, TLS): the field and why, on failure.
pub fn check_connection(
    keepalive_time: Duration,
    keepalive_timeout: Duration,
    tls: Option<&ConsulTls>,
) -> Result<(), ConfigError> {
    if keepalive_time < KEEPALIVE_MIN {
        return Err(ConfigError::KeepaliveTime(keepalive_time));
    }
    if keepalive_timeout.is_zero() {
        return Err(ConfigError::KeepaliveTimeout);
    }
    if let Some(tls) = tls {
        if tls.ca_file.is_none() && !tls.insecure_skip_verify {
            return Err(ConfigError::NoCa);
        }
        if tls.cert_file.is_some() != tls.key_file.is_some() {
            return Err(ConfigError::HalfClientCert);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_expand_with_the_agent_index() {
        let p = NamePattern::parse("svc-{i%100}").unwrap();
        assert!(!p.is_fixed());
        assert_eq!(p.expand(0), "svc-0");
        assert_eq!(p.expand(1234), "svc-34");
        let p = NamePattern::parse("{i}-x-{i%7}").unwrap();
        assert_eq!(p.expand(15), "15-x-1");
        let p = NamePattern::parse("web").unwrap();
        assert!(p.is_fixed());
        assert_eq!(p.expand(99), "web");
        assert!(NamePattern::parse("a{i%0}").is_err());
        assert!(NamePattern::parse("a{j}").is_err());
        assert!(NamePattern::parse("a{i").is_err());
        assert!(NamePattern::parse("a}").is_err());
        assert!(NamePattern::parse("").is_err());
    }

    #[test]
    fn the_catalog_and_intentions_probes_combine_and_nothing_else_does() {
        let kinds = |s: &str| s.parse::<ProbeKinds>();
        let both = ProbeKinds {
            kind: ProbeKind::Catalog,
            also: Some(ProbeKind::Intentions),
        };
        assert_eq!(kinds("catalog,intentions").unwrap(), both);
        assert_eq!(kinds(" intentions , catalog").unwrap(), both);
        assert_eq!(both.to_string(), "catalog,intentions");
        assert_eq!(kinds("kv").unwrap().also, None);
        for bad in ["catalog,kv", "catalog,catalog", "catalog,intentions,kv"] {
            let e = kinds(bad).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("probe kinds {bad:?}: one kind, or catalog,intentions")
            );
        }
        assert!(matches!(kinds("catalog,dns"), Err(ConfigError::ProbeKind(k)) if k == "dns"));

        // Each probe's window is half the interval by default, and no more.
        let mut c = ConsulConfig::default();
        c.probe.set_kinds(Some(both));
        c.probe.every = Duration::from_secs(20);
        assert_eq!(c.probe.timeout(), PROBE_TIMEOUT);
        assert!(c.probe.times_intentions());
        assert!(c.validate().is_ok());
        c.probe.every = Duration::from_secs(4);
        assert_eq!(c.probe.timeout(), Duration::from_secs(2));
        assert!(c.validate().is_ok());
        c.probe.timeout = Some(Duration::from_secs(3));
        assert!(matches!(
            c.validate(),
            Err(ConsulError::Invalid(
                ConfigError::ProbeTimeoutOverHalf { .. }
            ))
        ));
        // Intentions are streamed only.
        let mut c = ConsulConfig::default();
        c.probe.set_kinds(Some(both));
        c.watch = crate::modes::WatchMode::Blocking;
        assert!(matches!(
            c.validate(),
            Err(ConsulError::Invalid(ConfigError::IntentionsNotStreaming))
        ));
        // Set by hand, a second kind beside anything but the catalog probe.
        let mut c = ConsulConfig::default();
        c.probe.kind = Some(ProbeKind::Kv);
        c.probe.also = Some(ProbeKind::Intentions);
        assert!(matches!(
            c.validate(),
            Err(ConsulError::Invalid(ConfigError::ProbeKinds(_)))
        ));
    }

    #[test]
    fn defaults_validate_and_bad_values_are_refused() {
        let cfg = ConsulConfig::default();
        let v = cfg.prepare().unwrap();
        assert_eq!(v.rpc_addrs[0].port(), 8300);
        assert_eq!(v.rpc_hosts[0], "127.0.0.1");
        assert_eq!(v.probe_service, None);

        // The server bounds the TTL (session_ttl_min is its setting).
        let mut c = cfg.clone();
        c.session_ttl = Some(Duration::from_secs(5));
        assert!(c.validate().is_ok());
        c.session_ttl = Some(Duration::from_millis(500));
        assert!(c.validate().is_err());
        let mut c = cfg.clone();
        c.anti_entropy = Some(Duration::from_millis(10));
        assert!(c.validate().is_err());
        let mut c = cfg.clone();
        c.conn.keepalive_time = Duration::from_secs(10);
        assert!(c.validate().is_err());
        let mut c = cfg.clone();
        c.services_per_agent = 50;
        c.sidecars = true;
        assert!(c.validate().is_err());
        let mut c = cfg.clone();
        c.conn.tls = Some(ConsulTls::default());
        assert!(c.validate().is_err());

        let mut c = cfg.clone();
        c.upstreams = vec!["svc-{i%10}".into(), "api".into()];
        c.probe.kind = Some(ProbeKind::Catalog);
        // The run's own probe service unless one is named.
        assert_eq!(
            c.prepare().unwrap().probe_service.as_deref(),
            Some("agent-sim-probe")
        );
        c.probe.service = Some("web".into());
        assert_eq!(c.prepare().unwrap().probe_service.as_deref(), Some("web"));
        c.probe.service = Some("svc-{i}".into());
        assert!(c.validate().is_err());
        c.probe.kind = Some(ProbeKind::Intentions);
        c.probe.service = None;
        assert_eq!(
            c.prepare().unwrap().probe_service.as_deref(),
            Some("agent-sim-probe")
        );
    }

    #[test]
    fn anti_entropy_scales_like_consul() {
        assert_eq!(ae_scale(0), 1);
        assert_eq!(ae_scale(128), 1);
        assert_eq!(ae_scale(129), 2);
        assert_eq!(ae_scale(256), 2);
        assert_eq!(ae_scale(257), 3);
        assert_eq!(ae_scale(10_000), 8);
        assert_eq!(ae_scale(100_000), 11);
    }

    #[test]
    fn go_durations() {
        assert_eq!(go_duration(Duration::from_secs(30)), "30s");
        assert_eq!(go_duration(Duration::from_millis(15500)), "15500ms");
    }
}
