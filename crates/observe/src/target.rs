//! What to observe: [`ObserveSpec`] is a value of `--observe` as typed
//! (a URL, or a shorthand the run expands from its own targets), and
//! [`Target`] what the observer reads (an HTTP endpoint with its headers
//! and TLS, or a process on this host).

use std::fmt;
use std::str::FromStr;

use agent_sim_net::ClientTls;

use crate::ObserveError;
use crate::kinds::ServerKind;

/// Consul's Prometheus path (answers an empty 200 without
/// `telemetry { prometheus_retention_time }`).
pub const CONSUL_PROMETHEUS_PATH: &str = "/v1/agent/metrics?format=prometheus";
/// Consul's JSON metrics path (always served; no process CPU or RSS).
pub const CONSUL_JSON_PATH: &str = "/v1/agent/metrics";
/// Sensu's Prometheus path on its API port.
pub const SENSU_PATH: &str = "/metrics";
/// A Sensu backend's API port, where `/metrics` is.
pub const SENSU_API_PORT: u16 = 8080;

/// One value of `--observe`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObserveSpec {
    /// A Prometheus text endpoint, `http(s)://host:port/path`.
    Url(String),
    /// `consul`: each Consul server of the run (its HTTP API), or
    /// `consul=ADDR` one named server's HTTP API (`host:port` or a URL).
    Consul(Option<String>),
    /// `sensu`: each Sensu backend of the run (its API port 8080), or
    /// `sensu=ADDR` the API address when it is elsewhere.
    Sensu(Option<String>),
}

impl FromStr for ObserveSpec {
    type Err = ObserveError;
    fn from_str(s: &str) -> Result<Self, ObserveError> {
        let s = s.trim();
        let named = |rest: &str| -> Result<Option<String>, ObserveError> {
            if rest.is_empty() {
                return Err(ObserveError::SpecNoAddress(s.to_owned()));
            }
            Ok(Some(rest.to_string()))
        };
        match s.split_once('=') {
            None if s == "consul" => Ok(ObserveSpec::Consul(None)),
            None if s == "sensu" => Ok(ObserveSpec::Sensu(None)),
            Some(("consul", rest)) => Ok(ObserveSpec::Consul(named(rest)?)),
            Some(("sensu", rest)) => Ok(ObserveSpec::Sensu(named(rest)?)),
            _ if s.starts_with("http://") || s.starts_with("https://") => {
                let uri: http::Uri = s.parse().map_err(|source| ObserveError::SpecUrl {
                    spec: s.to_string(),
                    source,
                })?;
                if uri.host().is_none() {
                    return Err(ObserveError::SpecNoHost(s.to_owned()));
                }
                Ok(ObserveSpec::Url(s.to_string()))
            }
            _ => Err(ObserveError::SpecUnknown(s.to_owned())),
        }
    }
}

impl fmt::Display for ObserveSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ObserveSpec::Url(u) => f.write_str(u),
            ObserveSpec::Consul(None) => f.write_str("consul"),
            ObserveSpec::Consul(Some(a)) => write!(f, "consul={a}"),
            ObserveSpec::Sensu(None) => f.write_str("sensu"),
            ObserveSpec::Sensu(Some(a)) => write!(f, "sensu={a}"),
        }
    }
}

impl<'de> serde::Deserialize<'de> for ObserveSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <String as serde::Deserialize>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// An HTTP endpoint the observer scrapes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The URL read (no credentials in it: a token goes in `headers`).
    pub url: String,
    /// The kind of server, when the spec said (else told by the series).
    pub kind: Option<ServerKind>,
    /// Extra request headers (`X-Consul-Token`).
    pub headers: Vec<(String, String)>,
    /// TLS settings for `https://` (default: the platform's roots).
    pub tls: Option<ClientTls>,
    /// The name to verify in the server's certificate (default: the host).
    pub server_name: Option<String>,
    /// Where to read instead when the URL answers 200 with an empty body
    /// (a Consul server without Prometheus retention: its JSON format).
    pub json_fallback: Option<String>,
}

impl Endpoint {
    /// A plain endpoint at `url`.
    pub fn url(url: impl Into<String>) -> Self {
        Endpoint {
            url: url.into(),
            kind: None,
            headers: Vec::new(),
            tls: None,
            server_name: None,
            json_fallback: None,
        }
    }

    /// A Consul server's metrics on its HTTP API `base` (`host:port`,
    /// `http://host:port` or `https://host:port`), with the run's token.
    pub fn consul(base: &str, token: Option<&str>, tls: Option<ClientTls>) -> Self {
        let base = with_scheme(base, tls.is_some());
        let mut e = Endpoint::url(format!("{base}{CONSUL_PROMETHEUS_PATH}"));
        e.kind = Some(ServerKind::Consul);
        e.json_fallback = Some(format!("{base}{CONSUL_JSON_PATH}"));
        if let Some(t) = token.filter(|t| !t.is_empty()) {
            e.headers.push(("X-Consul-Token".into(), t.to_string()));
        }
        e.tls = tls;
        e
    }

    /// A Sensu backend's `/metrics` on its API address `base`.
    pub fn sensu(base: &str, tls: Option<ClientTls>) -> Self {
        let base = with_scheme(base, tls.is_some());
        let mut e = Endpoint::url(format!("{base}{SENSU_PATH}"));
        e.kind = Some(ServerKind::Sensu);
        e.tls = tls;
        e
    }
}

/// `host:port` as a URL base (`https://` when `tls`); a URL stays as it is,
/// less a trailing `/`.
fn with_scheme(base: &str, tls: bool) -> String {
    let base = base.trim().trim_end_matches('/');
    if base.starts_with("http://") || base.starts_with("https://") {
        base.to_string()
    } else if tls {
        format!("https://{base}")
    } else {
        format!("http://{base}")
    }
}

/// What the observer reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A metrics endpoint.
    Http(Endpoint),
    /// A process on this host (`/proc/PID`): CPU, RSS, threads, fds.
    Pid(u32),
}

impl Target {
    /// How it is named in reports and warnings.
    pub fn name(&self) -> String {
        match self {
            Target::Http(e) => e.url.clone(),
            Target::Pid(p) => format!("pid {p}"),
        }
    }
}

/// The host of `host:port` (IPv6 in brackets kept as it is).
pub fn host_of(hostport: &str) -> &str {
    let hp = hostport
        .trim()
        .trim_start_matches("ws://")
        .trim_start_matches("wss://")
        .trim_start_matches("http://")
        .trim_start_matches("https://");
    let hp = hp.split('/').next().unwrap_or(hp);
    match hp.rsplit_once(':') {
        Some((h, p)) if p.chars().all(|c| c.is_ascii_digit()) => h,
        _ => hp,
    }
}

/// Refuses a spec the run cannot observe, in one line.
pub fn check_pid(pid: u32) -> Result<(), ObserveError> {
    match agent_sim_metrics::process::read_pid(std::path::Path::new("/proc"), &pid.to_string()) {
        Some(_) => Ok(()),
        None => Err(ObserveError::NoProcess(pid)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_print_back() {
        for s in [
            "consul",
            "sensu",
            "consul=10.0.0.1:8500",
            "sensu=https://api:8080",
            "http://127.0.0.1:9100/metrics",
        ] {
            let spec: ObserveSpec = s.parse().unwrap();
            assert_eq!(spec.to_string(), s);
        }
        assert!("consul=".parse::<ObserveSpec>().is_err());
        assert!("127.0.0.1:8500".parse::<ObserveSpec>().is_err());
        assert!("nomad".parse::<ObserveSpec>().is_err());
    }

    #[test]
    fn consul_and_sensu_endpoints_are_built_from_an_address() {
        let e = Endpoint::consul("10.0.0.1:8500", Some("secret"), None);
        assert_eq!(
            e.url,
            "http://10.0.0.1:8500/v1/agent/metrics?format=prometheus"
        );
        assert_eq!(
            e.json_fallback.as_deref(),
            Some("http://10.0.0.1:8500/v1/agent/metrics")
        );
        assert_eq!(e.headers, vec![("X-Consul-Token".into(), "secret".into())]);
        let tls = ClientTls {
            insecure_skip_verify: true,
            ..ClientTls::default()
        };
        let e = Endpoint::consul("h:8501", None, Some(tls));
        assert!(e.url.starts_with("https://h:8501/") && e.headers.is_empty());
        assert_eq!(
            Endpoint::sensu("http://api:8080/", None).url,
            "http://api:8080/metrics"
        );
        assert_eq!(host_of("wss://backend:8081/"), "backend");
        assert_eq!(host_of("10.0.0.1:8300"), "10.0.0.1");
        assert_eq!(host_of("[::1]:8300"), "[::1]");
    }

    #[test]
    fn a_pid_that_does_not_exist_is_refused() {
        assert!(check_pid(std::process::id()).is_ok());
        assert!(check_pid(u32::MAX - 1).is_err());
    }
}
