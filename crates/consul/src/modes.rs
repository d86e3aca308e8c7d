//! Values a Consul config names that other modules act on: what an agent
//! writes its catalog and sessions with ([`AgentWire`]), how upstreams are
//! watched ([`WatchMode`], [`crate::watch`]) and a service the run seeds
//! ([`SeedService`], [`crate::seed`]). A leaf: it imports nothing of the
//! crate.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// Formats a duration the way Go's `time.ParseDuration` reads it.
pub fn go_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// Consul's `default_query_time`: how long a blocking query is held when it
/// changes nothing.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(300);

/// What an agent writes its registration, anti-entropy, sessions and
/// checks with (`--consul-agent`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AgentWire {
    /// What a Consul 1.20 client agent sends: its own RPCs on the server's
    /// multiplexed port (`0x04`: `Catalog.Register`, anti-entropy's reads,
    /// `Session.Apply`/`Renew`, `Coordinate.Update`, `Status.Ping`).
    #[default]
    Client,
    /// Registrations through the HTTP API (`/v1/txn`, `/v1/catalog`,
    /// `/v1/session`), as an external-services monitor (consul-esm) or a
    /// catalog sync writes them; no coordinates.
    Api,
}

impl AgentWire {
    /// The wire a run uses when not told: a long-poll watcher is an HTTP
    /// API client (consul-template, Prometheus), every other agent a
    /// client agent.
    pub fn for_watch(watch: WatchMode) -> AgentWire {
        match watch {
            WatchMode::Http => AgentWire::Api,
            _ => AgentWire::Client,
        }
    }
}

impl fmt::Display for AgentWire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AgentWire::Client => "client",
            AgentWire::Api => "api",
        })
    }
}

/// Why a mode or a seeded service does not parse: one variant per mistake,
/// each naming the value as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModeError {
    /// `--consul-agent` is neither `client` nor `api`.
    #[error("agent wire {0:?}: expected client or api")]
    AgentWire(String),
    /// `--watch` is not one of the watch modes.
    #[error("watch mode {0:?}: expected streaming, blocking or http")]
    WatchMode(String),
    /// `--seed-service` without `=`.
    #[error("seed service {0:?}: expected NAME=COUNT (e.g. big=5000)")]
    SeedShape(String),
    /// `--seed-service` whose name is not a service name.
    #[error("seed service {given:?}: {name:?} is not a service name")]
    SeedName {
        /// The value as written.
        given: String,
        /// The name part.
        name: String,
    },
    /// `--seed-service` whose count is not a whole number.
    #[error("seed service {given:?}: the count must be a whole number")]
    SeedCount {
        /// The value as written.
        given: String,
        /// Why the count does not parse.
        source: std::num::ParseIntError,
    },
    /// `--seed-service` whose count is 0 or over [`MAX_SEED`].
    #[error("seed service {0:?}: the count must be 1 to {MAX_SEED}")]
    SeedRange(String),
}

impl FromStr for AgentWire {
    type Err = ModeError;
    fn from_str(s: &str) -> Result<Self, ModeError> {
        match s.trim() {
            "client" => Ok(AgentWire::Client),
            "api" => Ok(AgentWire::Api),
            o => Err(ModeError::AgentWire(o.to_owned())),
        }
    }
}

impl<'de> serde::Deserialize<'de> for AgentWire {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <String as serde::Deserialize>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// How each upstream is watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WatchMode {
    /// `Subscribe` streams on the RPC port (`0x08`, gRPC).
    #[default]
    Streaming,
    /// `Health.ServiceNodes` blocking queries on the RPC port (`0x04`,
    /// yamux, msgpack net/rpc).
    Blocking,
    /// `GET /v1/health/service/<svc>?index=&wait=` on the HTTP API.
    Http,
}

impl fmt::Display for WatchMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WatchMode::Streaming => "streaming",
            WatchMode::Blocking => "blocking",
            WatchMode::Http => "http",
        })
    }
}

impl FromStr for WatchMode {
    type Err = ModeError;
    fn from_str(s: &str) -> Result<Self, ModeError> {
        match s.trim() {
            "streaming" => Ok(WatchMode::Streaming),
            "blocking" => Ok(WatchMode::Blocking),
            "http" => Ok(WatchMode::Http),
            o => Err(ModeError::WatchMode(o.to_owned())),
        }
    }
}

impl<'de> serde::Deserialize<'de> for WatchMode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <String as serde::Deserialize>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Most instances a seeded service may have.
pub const MAX_SEED: u32 = 100_000;

/// A service the run seeds: its name and instance count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedService {
    /// Service name.
    pub name: String,
    /// Instances.
    pub count: u32,
}

impl fmt::Display for SeedService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.name, self.count)
    }
}

impl FromStr for SeedService {
    type Err = ModeError;
    fn from_str(s: &str) -> Result<Self, ModeError> {
        let (name, count) = s
            .split_once('=')
            .ok_or_else(|| ModeError::SeedShape(s.to_owned()))?;
        let name = name.trim();
        if name.is_empty() || name.contains(['/', '?', '#', ' ', '{', '}']) {
            return Err(ModeError::SeedName {
                given: s.to_owned(),
                name: name.to_owned(),
            });
        }
        let count: u32 = count
            .trim()
            .parse()
            .map_err(|source| ModeError::SeedCount {
                given: s.to_owned(),
                source,
            })?;
        if !(1..=MAX_SEED).contains(&count) {
            return Err(ModeError::SeedRange(s.to_owned()));
        }
        Ok(SeedService {
            name: name.to_owned(),
            count,
        })
    }
}

impl<'de> serde::Deserialize<'de> for SeedService {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <String as serde::Deserialize>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The key `--probe kv` changes: `<name-prefix>/probe/kv`, inside the
/// run's own part of the KV store ([`crate::kv`]).
pub fn kv_probe_key(name_prefix: &str) -> String {
    format!("{name_prefix}/probe/kv")
}

/// The prefix every agent watches with `--probe kv` and no `--watch-kv`:
/// the run's own, `<name-prefix>/`.
pub fn kv_own_prefix(name_prefix: &str) -> String {
    format!("{name_prefix}/")
}

/// A watched prefix as a path (`/v1/kv/<prefix>`) and `KVS.List`'s `Key`
/// take it: without a leading `/` (Consul's HTTP handler strips it).
pub fn kv_normal_prefix(prefix: &str) -> &str {
    prefix.trim_start_matches('/')
}

/// Most KV prefixes one agent watches.
pub const KV_MAX_PREFIXES: usize = 16;

/// The default pace of token creates (`--acl-token-rate`): each is a raft
/// write on the leader.
pub const DEFAULT_TOKEN_RATE: f64 = 200.0;

/// Where each agent's own ACL token comes from (`--acl-tokens`; the `acl`
/// module gets them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// The run creates one per agent (node identity, service identity,
    /// the run's policy) before the agents boot, and deletes them after.
    NodeIdentity,
    /// One secret per line; line `i` (from 0) is agent `i`'s.
    File(std::path::PathBuf),
}

impl FromStr for TokenSource {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "node-identity" => TokenSource::NodeIdentity,
            path => TokenSource::File(std::path::PathBuf::from(path)),
        })
    }
}

/// From a config file: the same words as the flag.
impl<'de> serde::Deserialize<'de> for TokenSource {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <String as serde::Deserialize>::deserialize(d)?;
        Ok(s.parse()
            .unwrap_or_else(|never: std::convert::Infallible| match never {}))
    }
}

impl fmt::Display for TokenSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenSource::NodeIdentity => f.write_str("node-identity"),
            TokenSource::File(p) => write!(f, "{}", p.display()),
        }
    }
}
