//! The typed configuration of a Consul fleet ([`ConsulConfig`]), its
//! validation, and the per-agent name patterns (`svc-{i%100}`).
//!
//! Validation happens once, in [`crate::ConsulFactory::new`], before any
//! socket is opened; agents then only read the validated values.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use agent_sim_fleet::Rate;

use crate::ConsulError;

/// Shortest TTL a Consul server accepts for a session (`session_ttl_min`).
pub const SESSION_TTL_MIN: Duration = Duration::from_secs(10);
/// Longest TTL a Consul server accepts for a session.
pub const SESSION_TTL_MAX: Duration = Duration::from_secs(24 * 3600);
/// The server's keepalive `MinTime`: pinging more often earns a GOAWAY.
pub const KEEPALIVE_MIN: Duration = Duration::from_secs(15);
/// Most operations in one `/v1/txn` request.
pub const TXN_MAX_OPS: usize = 128;

/// Everything a Consul fleet can be told (see the crate docs for defaults).
#[derive(Debug, Clone)]
pub struct ConsulConfig {
    /// `host:port` of the servers' RPC ports (8300); agent `i` uses
    /// `rpc_targets[i % len]`. One TCP connection per agent.
    pub rpc_targets: Vec<String>,
    /// `host:port` of the HTTP API (8500).
    pub http_target: String,
    /// ACL token: `SubscribeRequest.Token` and the `X-Consul-Token` header.
    pub token: Option<String>,
    /// Datacenter; empty means the server's own.
    pub datacenter: String,
    /// Services every agent subscribes to; entries may hold `{i}` or `{i%N}`.
    pub upstreams: Vec<String>,
    /// Node names are `<name_prefix>-<index>`.
    pub name_prefix: String,
    /// Register node + services through the HTTP API.
    pub register: bool,
    /// Service name of each agent's own instances.
    pub service_name: String,
    /// Instances of `service_name` per agent.
    pub services_per_agent: u32,
    /// Also register a connect-proxy sidecar per instance.
    pub sidecars: bool,
    /// Leave registrations in the catalog at shutdown.
    pub keep_registrations: bool,
    /// TTL session per agent, renewed every TTL/2 (`None` = no session).
    pub session_ttl: Option<Duration>,
    /// Per-agent check flapping through catalog register (`None` = off).
    pub flap_rate: Option<Rate>,
    /// The propagation probe.
    pub probe: ProbeConfig,
    /// TLS on the RPC port (`0x03` + TLS + `0x08`).
    pub tls: Option<ConsulTls>,
    /// HTTP/2 keepalive ping interval (never below 15 s).
    pub keepalive_time: Duration,
    /// HTTP/2 keepalive ping timeout.
    pub keepalive_timeout: Duration,
}

impl Default for ConsulConfig {
    fn default() -> Self {
        ConsulConfig {
            rpc_targets: vec!["127.0.0.1:8300".into()],
            http_target: "127.0.0.1:8500".into(),
            token: None,
            datacenter: String::new(),
            upstreams: vec!["web".into(), "api".into()],
            name_prefix: "agent-sim".into(),
            register: true,
            service_name: "app".into(),
            services_per_agent: 1,
            sidecars: false,
            keep_registrations: false,
            session_ttl: Some(Duration::from_secs(30)),
            flap_rate: None,
            probe: ProbeConfig::default(),
            tls: None,
            keepalive_time: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
        }
    }
}

/// TLS settings for the RPC port.
#[derive(Debug, Clone, Default)]
pub struct ConsulTls {
    /// PEM file of the CA that signed the servers' certificates.
    pub ca_file: Option<PathBuf>,
    /// Accept any server certificate (tests, labs).
    pub insecure_skip_verify: bool,
    /// Name to verify (e.g. `server.dc1.consul`); default the target host.
    pub server_name: Option<String>,
}

/// What the propagation probe changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    /// Alternately deregister / register an instance of a shared upstream.
    Catalog,
    /// Write a `service-intentions` config entry, timed on `ServiceIntentions`
    /// subscriptions.
    Intentions,
}

impl fmt::Display for ProbeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProbeKind::Catalog => "catalog",
            ProbeKind::Intentions => "intentions",
        })
    }
}

impl std::str::FromStr for ProbeKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "catalog" => Ok(ProbeKind::Catalog),
            "intentions" => Ok(ProbeKind::Intentions),
            o => Err(format!("probe kind {o:?}: expected catalog or intentions")),
        }
    }
}

/// The propagation probe.
#[derive(Debug, Clone)]
pub struct ProbeConfig {
    /// `None` = no probe.
    pub kind: Option<ProbeKind>,
    /// Time between probes.
    pub every: Duration,
    /// Shared upstream to change; default the first upstream without a pattern.
    pub service: Option<String>,
    /// Deliveries later than this after T0 count as missing.
    pub timeout: Duration,
    /// This process makes the changes (shard 0).
    pub controller: bool,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        ProbeConfig {
            kind: None,
            every: Duration::from_secs(30),
            service: None,
            timeout: Duration::from_secs(10),
            controller: true,
        }
    }
}

/// A service name that may depend on the agent index: `svc-{i}`, `svc-{i%100}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamePattern {
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Lit(String),
    Index { modulo: Option<u64> },
}

impl NamePattern {
    /// Parses a name; `{i}` is the agent index, `{i%N}` the index modulo `N`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut rest = s;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(Part::Lit(rest[..open].to_owned()));
            }
            let close = rest[open..]
                .find('}')
                .ok_or_else(|| format!("name {s:?}: unclosed '{{'"))?
                + open;
            let inner = rest[open + 1..close].trim();
            let part = if inner == "i" {
                Part::Index { modulo: None }
            } else if let Some(m) = inner.strip_prefix("i%") {
                let n: u64 = m
                    .trim()
                    .parse()
                    .map_err(|_| format!("name {s:?}: {{{inner}}}: N must be a number"))?;
                if n == 0 {
                    return Err(format!("name {s:?}: {{i%0}} divides by zero"));
                }
                Part::Index { modulo: Some(n) }
            } else {
                return Err(format!(
                    "name {s:?}: unknown pattern {{{inner}}} (use {{i}} or {{i%N}})"
                ));
            };
            parts.push(part);
            rest = &rest[close + 1..];
        }
        if rest.contains('}') {
            return Err(format!("name {s:?}: unmatched '}}'"));
        }
        if !rest.is_empty() {
            parts.push(Part::Lit(rest.to_owned()));
        }
        if parts.is_empty() {
            return Err("empty service name".into());
        }
        Ok(NamePattern { parts })
    }

    /// Whether the name is the same for every agent.
    pub fn is_fixed(&self) -> bool {
        self.parts.iter().all(|p| matches!(p, Part::Lit(_)))
    }

    /// The name for agent `index`.
    pub fn expand(&self, index: u64) -> String {
        let mut out = String::new();
        for p in &self.parts {
            match p {
                Part::Lit(s) => out.push_str(s),
                Part::Index { modulo: None } => out.push_str(&index.to_string()),
                Part::Index { modulo: Some(n) } => out.push_str(&(index % n).to_string()),
            }
        }
        out
    }
}

/// Operations one agent's registration takes in a txn.
pub(crate) fn ops_per_agent(cfg: &ConsulConfig) -> usize {
    // Node, then per instance: service + its check (+ sidecar).
    1 + cfg.services_per_agent as usize * if cfg.sidecars { 3 } else { 2 }
}

/// Formats a duration the way Go's `time.ParseDuration` reads it.
pub(crate) fn go_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

pub(crate) fn resolve(what: &str, hostport: &str) -> Result<SocketAddr, ConsulError> {
    hostport
        .to_socket_addrs()
        .map_err(|e| ConsulError::Config(format!("{what} {hostport:?}: {e}")))?
        .next()
        .ok_or_else(|| ConsulError::Config(format!("{what} {hostport:?}: no address")))
}

/// What validation derives from a [`ConsulConfig`].
#[derive(Debug)]
pub(crate) struct Validated {
    pub rpc_addrs: Vec<SocketAddr>,
    pub rpc_hosts: Vec<String>,
    pub http_addr: SocketAddr,
    pub upstreams: Vec<NamePattern>,
    /// Probe service name (when a probe kind is set).
    pub probe_service: Option<String>,
}

pub(crate) fn validate(cfg: &ConsulConfig) -> Result<Validated, ConsulError> {
    let bad = |m: String| Err(ConsulError::Config(m));
    if cfg.rpc_targets.is_empty() {
        return bad("no RPC target (host:port of a server's port 8300)".into());
    }
    let mut rpc_addrs = Vec::new();
    let mut rpc_hosts = Vec::new();
    for t in &cfg.rpc_targets {
        rpc_addrs.push(resolve("RPC target", t)?);
        let host = t.rsplit_once(':').map(|(h, _)| h).unwrap_or(t);
        rpc_hosts.push(host.trim_matches(['[', ']']).to_owned());
    }
    let http_addr = resolve("HTTP target", &cfg.http_target)?;
    if cfg.upstreams.is_empty() {
        return bad("no upstream services to subscribe to".into());
    }
    let upstreams = cfg
        .upstreams
        .iter()
        .map(|u| NamePattern::parse(u).map_err(ConsulError::Config))
        .collect::<Result<Vec<_>, _>>()?;
    if cfg.name_prefix.is_empty() || cfg.name_prefix.contains(['/', ' ']) {
        return bad(format!(
            "name prefix {:?}: empty or has '/' or ' '",
            cfg.name_prefix
        ));
    }
    if cfg.register {
        if cfg.service_name.is_empty() {
            return bad("empty service name".into());
        }
        if cfg.services_per_agent == 0 {
            return bad("services per agent must be at least 1".into());
        }
        if ops_per_agent(cfg) > TXN_MAX_OPS {
            return bad(format!(
                "{} services per agent{} need {} txn operations; at most {TXN_MAX_OPS}",
                cfg.services_per_agent,
                if cfg.sidecars { " with sidecars" } else { "" },
                ops_per_agent(cfg)
            ));
        }
    }
    if let Some(ttl) = cfg.session_ttl
        && !(SESSION_TTL_MIN..=SESSION_TTL_MAX).contains(&ttl)
    {
        return bad(format!(
            "session TTL {ttl:?}: the server accepts 10s..24h (session_ttl_min)"
        ));
    }
    if let Some(r) = cfg.flap_rate {
        let ps = r.as_per_second();
        if !(ps.is_finite() && ps > 0.0 && ps <= 100.0) {
            return bad(format!("flap rate {r}: must be in (0, 100/s] per agent"));
        }
        if !cfg.register {
            return bad("flapping needs registered services (register = true)".into());
        }
    }
    if cfg.keepalive_time < KEEPALIVE_MIN {
        return bad(format!(
            "keepalive time {:?}: below the server's 15s MinTime (GOAWAY too_many_pings)",
            cfg.keepalive_time
        ));
    }
    if cfg.keepalive_timeout.is_zero() {
        return bad("keepalive timeout must be positive".into());
    }
    if let Some(tls) = &cfg.tls
        && tls.ca_file.is_none()
        && !tls.insecure_skip_verify
    {
        return bad("TLS needs a CA file or insecure_skip_verify".into());
    }
    let probe_service = match cfg.probe.kind {
        None => None,
        Some(kind) => {
            if cfg.probe.every.is_zero() || cfg.probe.timeout.is_zero() {
                return bad("probe interval and timeout must be positive".into());
            }
            if cfg.probe.timeout > cfg.probe.every {
                return bad(format!(
                    "probe timeout {:?} longer than the probe interval {:?}",
                    cfg.probe.timeout, cfg.probe.every
                ));
            }
            let svc = match &cfg.probe.service {
                Some(s) => s.clone(),
                None => match upstreams.iter().find(|u| u.is_fixed()) {
                    Some(u) => u.expand(0),
                    None => {
                        return bad(
                            "probe: every upstream has a per-agent pattern; name a shared \
                             probe service"
                                .into(),
                        );
                    }
                },
            };
            if kind == ProbeKind::Catalog
                && !upstreams.iter().any(|u| u.is_fixed() && u.expand(0) == svc)
            {
                return bad(format!(
                    "probe service {svc:?} is not a shared upstream (upstreams: {})",
                    cfg.upstreams.join(",")
                ));
            }
            Some(svc)
        }
    };
    Ok(Validated {
        rpc_addrs,
        rpc_hosts,
        http_addr,
        upstreams,
        probe_service,
    })
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
    fn defaults_validate_and_bad_values_are_refused() {
        let cfg = ConsulConfig::default();
        let v = validate(&cfg).unwrap();
        assert_eq!(v.rpc_addrs[0].port(), 8300);
        assert_eq!(v.rpc_hosts[0], "127.0.0.1");
        assert_eq!(v.probe_service, None);

        let mut c = cfg.clone();
        c.session_ttl = Some(Duration::from_secs(5));
        assert!(validate(&c).is_err());
        let mut c = cfg.clone();
        c.keepalive_time = Duration::from_secs(10);
        assert!(validate(&c).is_err());
        let mut c = cfg.clone();
        c.services_per_agent = 50;
        c.sidecars = true;
        assert!(validate(&c).is_err());
        let mut c = cfg.clone();
        c.tls = Some(ConsulTls::default());
        assert!(validate(&c).is_err());

        let mut c = cfg.clone();
        c.upstreams = vec!["svc-{i%10}".into(), "api".into()];
        c.probe.kind = Some(ProbeKind::Catalog);
        assert_eq!(validate(&c).unwrap().probe_service.as_deref(), Some("api"));
        c.probe.service = Some("nope".into());
        assert!(validate(&c).is_err());
        c.probe.kind = Some(ProbeKind::Intentions);
        assert_eq!(validate(&c).unwrap().probe_service.as_deref(), Some("nope"));
    }

    #[test]
    fn go_durations() {
        assert_eq!(go_duration(Duration::from_secs(30)), "30s");
        assert_eq!(go_duration(Duration::from_millis(15500)), "15500ms");
    }
}
