//! The typed configuration of a dataplane fleet ([`DataplaneConfig`]) and
//! its validation.
//!
//! [`DataplaneConfig::validate`] holds every rule (the CLI calls it before
//! any socket is opened); [`crate::DataplaneFactory::new`] validates again
//! and resolves the addresses.

use std::net::SocketAddr;
use std::time::Duration;

use agent_sim_consul::config::{Connection, NamePattern, PatternError, http_parts};
use agent_sim_consul::{ProbeConfig, ProbeKind};

use crate::DataplaneError;

/// The Envoy version consul-dataplane 1.6 ships with, supported by Consul
/// 1.20 (it refuses versions it does not support).
pub const ENVOY_VERSION: &str = "1.29.7";

/// Existing proxies the sidecars take over instead of registering their own
/// (as consul-dataplane is given `-proxy-service-id` and
/// `-service-node-name`): nothing is registered and nothing removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adopt {
    /// The proxy service ID of sidecar `i` (`web-sidecar-proxy-{i}`).
    pub proxy_id: String,
    /// The catalog node of that proxy (`node-{i}`).
    pub node: String,
}

/// Everything a dataplane fleet can be told.
#[derive(Debug, Clone)]
pub struct DataplaneConfig {
    /// The servers, the HTTP API (registration, probe), token, datacenter,
    /// name prefix, TLS (gRPC on 8503) and keepalive. `conn.targets` are
    /// the servers' gRPC ports (8502; 8503 with TLS); sidecar `i` starts at
    /// `targets[i % len]` and moves to the next one when a server refuses
    /// the stream (its xDS stream cap); nodes are `<name_prefix>-dp-<index>`.
    pub conn: Connection,
    /// Upstreams of each registered proxy; entries may hold `{i}`/`{i%N}`.
    pub upstreams: Vec<String>,
    /// The service each registered proxy fronts (`<svc>-<i>-0`, its proxy
    /// `<svc>-<i>-0-sidecar-proxy`).
    pub service_name: String,
    /// Take over existing proxies instead of registering (`None`: register).
    pub adopt: Option<Adopt>,
    /// Leave registrations in the catalog at shutdown.
    pub keep_registrations: bool,
    /// Hold a `WatchServers` stream per sidecar, as consul-dataplane does.
    pub watch_servers: bool,
    /// The Envoy version announced in `node.user_agent_build_version`
    /// (`None`: not sent; the server then assumes a supported one).
    pub envoy_version: Option<String>,
    /// The propagation probe (kind `catalog` only: an endpoint of the probe
    /// service appears and disappears in the sidecars' EDS).
    pub probe: ProbeConfig,
}

impl Default for DataplaneConfig {
    fn default() -> Self {
        DataplaneConfig {
            conn: Connection::to(&["127.0.0.1:8502"]),
            upstreams: vec!["web".into(), "api".into()],
            service_name: "app".into(),
            adopt: None,
            keep_registrations: false,
            watch_servers: false,
            envoy_version: Some(ENVOY_VERSION.into()),
            probe: ProbeConfig::default(),
        }
    }
}

/// What preparation derives from a [`DataplaneConfig`].
#[derive(Debug)]
pub(crate) struct Validated {
    pub targets: Vec<SocketAddr>,
    pub hosts: Vec<String>,
    pub http_addr: SocketAddr,
    pub http_host: String,
    pub https: bool,
    pub upstreams: Vec<NamePattern>,
    pub adopt: Option<(NamePattern, NamePattern)>,
    pub probe_service: Option<String>,
    pub envoy_version: Option<(u32, u32, u32)>,
}

/// Parses `major.minor.patch`.
pub fn parse_version(v: &str) -> Option<(u32, u32, u32)> {
    let mut it = v.trim().split('.').map(|p| p.parse::<u32>().ok());
    let out = (it.next()??, it.next()??, it.next()??);
    it.next().is_none().then_some(out)
}

impl DataplaneConfig {
    /// The settings a Consul fleet with this fleet's servers, token, TLS,
    /// datacenter and name prefix has: what `agent-sim cleanup` and the
    /// run's check for leftovers list this fleet's nodes with.
    pub fn as_consul(&self) -> agent_sim_consul::ConsulConfig {
        agent_sim_consul::ConsulConfig {
            conn: Connection {
                http_target: self.http_target(),
                ..self.conn.clone()
            },
            ..agent_sim_consul::ConsulConfig::default()
        }
    }

    /// The HTTP API address in force (see [`Connection::http_target`]).
    pub fn http_target(&self) -> String {
        self.conn.http_target()
    }

    /// The probe service a run owns: `<name_prefix>-probe`.
    pub fn own_probe_service(&self) -> String {
        self.conn.own_probe_service()
    }

    /// The probe service in force, when a probe runs.
    pub fn probe_service(&self) -> Option<String> {
        self.probe.kind?;
        Some(
            self.probe
                .service
                .clone()
                .unwrap_or_else(|| self.own_probe_service()),
        )
    }

    /// Checks every setting without resolving names or opening sockets;
    /// the first problem names the field.
    pub fn validate(&self) -> Result<(), DataplaneError> {
        self.checked()?;
        Ok(())
    }

    pub(crate) fn prepare(&self) -> Result<Validated, DataplaneError> {
        let mut v = self.checked()?;
        let r = self.conn.resolved()?;
        v.targets = r.targets;
        v.hosts = r.hosts;
        v.http_addr = r.http_addr.expect("resolved() sets the HTTP address");
        v.http_host = r.http_host;
        Ok(v)
    }

    fn checked(&self) -> Result<Validated, ConfigError> {
        self.conn
            .check("no target (host:port of a server's gRPC port 8502, or 8503 with TLS)")?;
        let (https, _) = http_parts(&self.http_target());
        let upstreams = self
            .upstreams
            .iter()
            .map(|u| NamePattern::parse(u).map_err(ConfigError::Upstream))
            .collect::<Result<Vec<_>, _>>()?;
        let adopt = self.adopted()?;
        let envoy_version = match &self.envoy_version {
            None => None,
            Some(v) => Some(parse_version(v).ok_or_else(|| ConfigError::EnvoyVersion(v.clone()))?),
        };
        let probe_service = self.checked_probe()?;
        Ok(Validated {
            targets: Vec::new(),
            hosts: Vec::new(),
            http_addr: ([127, 0, 0, 1], 8500).into(),
            http_host: String::new(),
            https,
            upstreams,
            adopt,
            probe_service,
            envoy_version,
        })
    }

    /// The proxies taken over (their ID and node patterns), or the service
    /// each registered proxy fronts checked (`None`).
    fn adopted(&self) -> Result<Option<(NamePattern, NamePattern)>, ConfigError> {
        let Some(a) = &self.adopt else {
            if self.service_name.is_empty() || self.service_name.contains(['{', '}']) {
                return Err(ConfigError::ServiceName(self.service_name.clone()));
            }
            return Ok(None);
        };
        if a.proxy_id.is_empty() {
            return Err(ConfigError::AdoptNoProxy);
        }
        if a.node.is_empty() {
            return Err(ConfigError::AdoptNoNode);
        }
        let p = NamePattern::parse(&a.proxy_id).map_err(ConfigError::AdoptProxy)?;
        let n = NamePattern::parse(&a.node).map_err(ConfigError::AdoptNode)?;
        if p.is_fixed() && n.is_fixed() {
            return Err(ConfigError::AdoptOneProxy(a.proxy_id.clone()));
        }
        Ok(Some((p, n)))
    }

    /// The probe's rules (catalog only); the probe service when one runs.
    fn checked_probe(&self) -> Result<Option<String>, ConfigError> {
        if self.probe.also.is_some() {
            return Err(ConfigError::ProbeKind);
        }
        match self.probe.kind {
            None => Ok(None),
            Some(ProbeKind::Intentions | ProbeKind::Kv) => Err(ConfigError::ProbeKind),
            Some(ProbeKind::Catalog) => {
                let p = &self.probe;
                if p.every < Duration::from_secs(1) {
                    return Err(ConfigError::ProbeEvery);
                }
                if p.timeout().is_zero() || p.timeout() > p.every {
                    return Err(ConfigError::ProbeTimeout {
                        timeout: p.timeout(),
                        every: p.every,
                    });
                }
                match &p.service {
                    Some(s) if s.is_empty() || s.contains(['{', '}']) => {
                        Err(ConfigError::ProbeService)
                    }
                    _ => Ok(self.probe_service()),
                }
            }
        }
    }
}

/// Why a [`DataplaneConfig`] is refused: one variant per rule, its words
/// without the field ([`ConfigError::field`] names it;
/// [`DataplaneError::Invalid`] says both).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A connection rule shared with the Consul agents.
    #[error(transparent)]
    Connection(#[from] agent_sim_consul::ConfigError),
    /// An upstream pattern that does not parse.
    #[error(transparent)]
    Upstream(PatternError),
    /// A service name that is empty or a pattern.
    #[error("{0:?}: must be one service name")]
    ServiceName(String),
    /// Adoption without a proxy service ID pattern.
    #[error("empty proxy service ID pattern")]
    AdoptNoProxy,
    /// Adoption without the proxies' node.
    #[error(
        "adopting proxies needs their node (e.g. 'node-{{i}}'), as consul-dataplane needs \
         -service-node-name"
    )]
    AdoptNoNode,
    /// An adopted proxy ID pattern that does not parse.
    #[error(transparent)]
    AdoptProxy(PatternError),
    /// An adopted node pattern that does not parse.
    #[error(transparent)]
    AdoptNode(PatternError),
    /// One proxy named for every sidecar.
    #[error("{0:?} names one proxy for every sidecar: use {{i}} (e.g. 'web-sidecar-proxy-{{i}}')")]
    AdoptOneProxy(String),
    /// An Envoy version that is not `major.minor.patch`.
    #[error("{0:?}: expected e.g. 1.29.7")]
    EnvoyVersion(String),
    /// A probe kind the sidecars do not time.
    #[error("dataplane sidecars time catalog changes (their EDS updates): use --probe catalog")]
    ProbeKind,
    /// A probe interval under 1 s.
    #[error("must be at least 1s")]
    ProbeEvery,
    /// A probe timeout of zero or longer than the probe interval.
    #[error("{timeout:?} must be positive and not exceed the probe interval {every:?}")]
    ProbeTimeout {
        /// The timeout in force.
        timeout: Duration,
        /// The probe interval.
        every: Duration,
    },
    /// A probe service that is empty or a per-sidecar pattern.
    #[error("must be one shared service, not a per-sidecar pattern")]
    ProbeService,
    /// A token that gRPC metadata cannot carry.
    #[error("not a valid gRPC metadata value")]
    Token(#[source] tonic::metadata::errors::InvalidMetadataValue),
}

impl ConfigError {
    /// The [`DataplaneConfig`] field refused (as named in the struct,
    /// `adopt.node` for nested ones).
    pub fn field(&self) -> &'static str {
        use ConfigError as E;
        match self {
            E::Connection(e) => e.field(),
            E::Upstream(_) => "upstreams",
            E::ServiceName(_) => "service_name",
            E::AdoptNoProxy | E::AdoptProxy(_) | E::AdoptOneProxy(_) => "adopt",
            E::AdoptNoNode | E::AdoptNode(_) => "adopt.node",
            E::EnvoyVersion(_) => "envoy_version",
            E::ProbeKind => "probe",
            E::ProbeEvery => "probe.every",
            E::ProbeTimeout { .. } => "probe.timeout",
            E::ProbeService => "probe.service",
            E::Token(_) => "token",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid(c: &DataplaneConfig) -> &'static str {
        match c.validate() {
            Err(DataplaneError::Invalid(e)) => e.field(),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn defaults_validate_and_bad_values_name_their_field() {
        let c = DataplaneConfig::default();
        let v = c.prepare().unwrap();
        assert_eq!(v.targets[0].port(), 8502);
        assert_eq!(v.http_addr.port(), 8500);
        assert_eq!(v.envoy_version, Some((1, 29, 7)));
        assert_eq!(v.probe_service, None);

        let mut x = c.clone();
        x.conn.targets = vec!["nohost".into()];
        assert_eq!(invalid(&x), "targets");
        let mut x = c.clone();
        x.adopt = Some(Adopt {
            proxy_id: "web-sidecar-proxy-{i}".into(),
            node: String::new(),
        });
        assert_eq!(invalid(&x), "adopt.node");
        x.adopt = Some(Adopt {
            proxy_id: "web-sidecar-proxy".into(),
            node: "n1".into(),
        });
        assert_eq!(invalid(&x), "adopt");
        let mut x = c.clone();
        x.envoy_version = Some("1.29".into());
        assert_eq!(invalid(&x), "envoy_version");
        let mut x = c.clone();
        x.probe.kind = Some(ProbeKind::Intentions);
        assert_eq!(invalid(&x), "probe");
        // The catalog probe with the intentions probe beside it.
        let mut x = c.clone();
        x.probe.kind = Some(ProbeKind::Catalog);
        x.probe.also = Some(ProbeKind::Intentions);
        assert_eq!(invalid(&x), "probe");
        let mut x = c.clone();
        x.probe.kind = Some(ProbeKind::Catalog);
        assert_eq!(x.probe_service().as_deref(), Some("agent-sim-probe"));
        x.probe.service = Some("svc-{i}".into());
        assert_eq!(invalid(&x), "probe.service");
        let mut x = c.clone();
        x.conn.keepalive_time = Duration::from_secs(5);
        assert_eq!(invalid(&x), "keepalive_time");
        let mut x = c.clone();
        x.conn.tls = Some(agent_sim_consul::ConsulTls::default());
        assert_eq!(invalid(&x), "tls");
        let mut x = c;
        x.service_name = "a{i}".into();
        assert_eq!(invalid(&x), "service_name");
    }

    #[test]
    fn versions_parse() {
        assert_eq!(parse_version("1.29.7"), Some((1, 29, 7)));
        assert_eq!(parse_version("1.29"), None);
        assert_eq!(parse_version("1.29.7.1"), None);
        assert_eq!(parse_version("x.1.2"), None);
    }
}
