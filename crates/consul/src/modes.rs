//! Values a Consul config names that other modules act on: what an agent
//! writes its catalog and sessions with ([`AgentWire`]), how upstreams are
//! watched ([`WatchMode`], [`crate::watch`]) and a service the run seeds
//! ([`SeedService`], [`crate::seed`]). A leaf: it imports nothing of the
//! crate.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

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

impl FromStr for AgentWire {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "client" => Ok(AgentWire::Client),
            "api" => Ok(AgentWire::Api),
            o => Err(format!("agent wire {o:?}: expected client or api")),
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
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "streaming" => Ok(WatchMode::Streaming),
            "blocking" => Ok(WatchMode::Blocking),
            "http" => Ok(WatchMode::Http),
            o => Err(format!(
                "watch mode {o:?}: expected streaming, blocking or http"
            )),
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
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (name, count) = s
            .split_once('=')
            .ok_or_else(|| format!("seed service {s:?}: expected NAME=COUNT (e.g. big=5000)"))?;
        let name = name.trim();
        if name.is_empty() || name.contains(['/', '?', '#', ' ', '{', '}']) {
            return Err(format!(
                "seed service {s:?}: {name:?} is not a service name"
            ));
        }
        let count: u32 = count
            .trim()
            .parse()
            .map_err(|_| format!("seed service {s:?}: the count must be a whole number"))?;
        if !(1..=MAX_SEED).contains(&count) {
            return Err(format!(
                "seed service {s:?}: the count must be 1 to {MAX_SEED}"
            ));
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
