//! The typed configuration of a dataplane fleet ([`DataplaneConfig`]) and
//! its validation.
//!
//! [`DataplaneConfig::validate`] holds every rule (the CLI calls it before
//! any socket is opened); [`crate::DataplaneFactory::new`] validates again
//! and resolves the addresses.

use std::net::SocketAddr;
use std::time::Duration;

use agent_sim_consul::config::{
    NamePattern, check_connection, check_host_port, host_of, http_parts, resolve,
};
use agent_sim_consul::{ConsulTls, ProbeConfig, ProbeKind};

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
    /// `host:port` of the servers' gRPC ports (8502; 8503 with TLS);
    /// sidecar `i` starts at `targets[i % len]` and moves to the next one
    /// when a server refuses the stream (its xDS stream cap).
    pub targets: Vec<String>,
    /// The HTTP API (registration, probe): `host:port` or
    /// `https://host:port`. Empty: the first target's host on 8500 (8501
    /// with TLS).
    pub http_target: String,
    /// ACL token: gRPC metadata `x-consul-token` and the `X-Consul-Token`
    /// header.
    pub token: Option<String>,
    /// Datacenter of the HTTP calls; empty: the server's own.
    pub datacenter: String,
    /// Upstreams of each registered proxy; entries may hold `{i}`/`{i%N}`.
    pub upstreams: Vec<String>,
    /// Nodes are `<name_prefix>-dp-<index>` (meta `agent-sim-prefix`).
    pub name_prefix: String,
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
    /// TLS on the gRPC port (8503).
    pub tls: Option<ConsulTls>,
    /// HTTP/2 keepalive ping interval.
    pub keepalive_time: Duration,
    /// HTTP/2 keepalive ping timeout.
    pub keepalive_timeout: Duration,
}

impl Default for DataplaneConfig {
    fn default() -> Self {
        DataplaneConfig {
            targets: vec!["127.0.0.1:8502".into()],
            http_target: String::new(),
            token: None,
            datacenter: String::new(),
            upstreams: vec!["web".into(), "api".into()],
            name_prefix: "agent-sim".into(),
            service_name: "app".into(),
            adopt: None,
            keep_registrations: false,
            watch_servers: false,
            envoy_version: Some(ENVOY_VERSION.into()),
            probe: ProbeConfig::default(),
            tls: None,
            keepalive_time: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
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
            rpc_targets: self.targets.clone(),
            http_target: self.http_target(),
            token: self.token.clone(),
            name_prefix: self.name_prefix.clone(),
            datacenter: self.datacenter.clone(),
            tls: self.tls.clone(),
            ..agent_sim_consul::ConsulConfig::default()
        }
    }

    /// The HTTP API address in force (see [`DataplaneConfig::http_target`]).
    pub fn http_target(&self) -> String {
        if !self.http_target.is_empty() {
            return self.http_target.clone();
        }
        let (scheme, port) = if self.tls.is_some() {
            ("https://", 8501)
        } else {
            ("", 8500)
        };
        match self.targets.first().and_then(|t| t.rsplit_once(':')) {
            Some((h, _)) => format!("{scheme}{h}:{port}"),
            None => String::new(),
        }
    }

    /// The probe service a run owns: `<name_prefix>-probe`.
    pub fn own_probe_service(&self) -> String {
        format!("{}-probe", self.name_prefix)
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
        self.checked().map(|_| ())
    }

    pub(crate) fn prepare(&self) -> Result<Validated, DataplaneError> {
        let mut v = self.checked()?;
        for t in &self.targets {
            v.targets.push(resolve("targets", t)?);
            v.hosts.push(host_of(t).to_owned());
        }
        let target = self.http_target();
        let (_, hostport) = http_parts(&target);
        v.http_addr = resolve("http_target", hostport)?;
        v.http_host = host_of(hostport).to_owned();
        Ok(v)
    }

    fn checked(&self) -> Result<Validated, DataplaneError> {
        let bad =
            |field: &'static str, reason: String| Err(DataplaneError::Invalid { field, reason });
        if self.targets.is_empty() {
            return bad(
                "targets",
                "no target (host:port of a server's gRPC port 8502, or 8503 with TLS)".into(),
            );
        }
        for t in &self.targets {
            check_host_port("targets", t)?;
        }
        let target = self.http_target();
        let (https, hostport) = http_parts(&target);
        check_host_port("http_target", hostport)?;
        if https && self.tls.is_none() {
            return bad(
                "http_target",
                "https:// needs TLS settings (a CA file or insecure verification)".into(),
            );
        }
        let pattern = |field: &'static str, s: &str| {
            NamePattern::parse(s).map_err(|reason| DataplaneError::Invalid { field, reason })
        };
        let upstreams = self
            .upstreams
            .iter()
            .map(|u| pattern("upstreams", u))
            .collect::<Result<Vec<_>, _>>()?;
        if self.name_prefix.is_empty() || self.name_prefix.contains(['/', ' ']) {
            return bad(
                "name_prefix",
                format!("{:?}: empty or has '/' or ' '", self.name_prefix),
            );
        }
        let adopt = match &self.adopt {
            None => {
                if self.service_name.is_empty() || self.service_name.contains(['{', '}']) {
                    return bad(
                        "service_name",
                        format!("{:?}: must be one service name", self.service_name),
                    );
                }
                None
            }
            Some(a) => {
                if a.proxy_id.is_empty() {
                    return bad("adopt", "empty proxy service ID pattern".into());
                }
                if a.node.is_empty() {
                    return bad(
                        "adopt.node",
                        "adopting proxies needs their node (e.g. 'node-{i}'), as \
                         consul-dataplane needs -service-node-name"
                            .into(),
                    );
                }
                let (p, n) = (
                    pattern("adopt", &a.proxy_id)?,
                    pattern("adopt.node", &a.node)?,
                );
                if p.is_fixed() && n.is_fixed() {
                    return bad(
                        "adopt",
                        format!(
                            "{:?} names one proxy for every sidecar: use {{i}} (e.g. \
                             'web-sidecar-proxy-{{i}}')",
                            a.proxy_id
                        ),
                    );
                }
                Some((p, n))
            }
        };
        let envoy_version = match &self.envoy_version {
            None => None,
            Some(v) => match parse_version(v) {
                Some(t) => Some(t),
                None => return bad("envoy_version", format!("{v:?}: expected e.g. 1.29.7")),
            },
        };
        if let Err((field, reason)) = check_connection(
            self.keepalive_time,
            self.keepalive_timeout,
            self.tls.as_ref(),
        ) {
            return bad(field, reason);
        }
        let probe_service = match self.probe.kind {
            None => None,
            Some(ProbeKind::Intentions) => {
                return bad(
                    "probe",
                    "dataplane sidecars time catalog changes (their EDS updates): use \
                     --probe catalog"
                        .into(),
                );
            }
            Some(ProbeKind::Catalog) => {
                let p = &self.probe;
                if p.every < Duration::from_secs(1) {
                    return bad("probe.every", "must be at least 1s".into());
                }
                if p.timeout().is_zero() || p.timeout() > p.every {
                    return bad(
                        "probe.timeout",
                        format!(
                            "{:?} must be positive and not exceed the probe interval {:?}",
                            p.timeout(),
                            p.every
                        ),
                    );
                }
                match &p.service {
                    Some(s) if s.is_empty() || s.contains(['{', '}']) => {
                        return bad(
                            "probe.service",
                            "must be one shared service, not a per-sidecar pattern".into(),
                        );
                    }
                    _ => self.probe_service(),
                }
            }
        };
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid(c: &DataplaneConfig) -> &'static str {
        match c.validate() {
            Err(DataplaneError::Invalid { field, .. }) => field,
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
        x.targets = vec!["nohost".into()];
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
        let mut x = c.clone();
        x.probe.kind = Some(ProbeKind::Catalog);
        assert_eq!(x.probe_service().as_deref(), Some("agent-sim-probe"));
        x.probe.service = Some("svc-{i}".into());
        assert_eq!(invalid(&x), "probe.service");
        let mut x = c.clone();
        x.keepalive_time = Duration::from_secs(5);
        assert_eq!(invalid(&x), "keepalive_time");
        let mut x = c.clone();
        x.tls = Some(ConsulTls::default());
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
