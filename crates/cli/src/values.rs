//! Typed values of flags, environment variables and config-file keys, parsed
//! once where they enter the program: clap uses their [`FromStr`], the TOML
//! reader their [`serde::Deserialize`] (which goes through the same
//! [`FromStr`], so a value means the same in every layer).
//!
//! - [`Secs`]: a duration in human units (`20s`, `500ms`, `1m30s`; a bare
//!   number is seconds), parsed by [`agent_sim_fleet::parse_duration`].
//! - [`Ramp`]: `500/s` or `all`; [`Toggle`]: a value or `off`.
//! - [`List`]: comma-separated names (or a TOML array).
//! - [`Kind`], [`ShardSpec`], [`AddrRange`], [`ServerDown`];
//! - [`ValueError`]: why one of these does not parse (durations and rates
//!   say it with the fleet's [`UnitError`]).
//!
//! What it is not: no rule about what a protocol accepts (each protocol
//! crate validates its own config) and no defaults (see [`crate::defaults`]).

use std::fmt;
use std::net::{AddrParseError, IpAddr, Ipv4Addr};
use std::str::FromStr;
use std::time::Duration;

use agent_sim_fleet::Rate;
use agent_sim_fleet::scenario::SpecError;
use agent_sim_fleet::units::UnitError;

/// Why a protocol, a shard, a source address or a server outage does not
/// parse (each carries the text as given).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValueError {
    /// A protocol this program does not simulate.
    #[error("{0:?}: expected sensu, consul or consul-dataplane")]
    Kind(String),
    /// A shard not written `I/N`.
    #[error("{0:?}: expected I/N, e.g. 0/4")]
    ShardForm(String),
    /// A shard of zero processes, or an index not below the count.
    #[error("{0:?}: need 0 <= I < N")]
    ShardRange(String),
    /// A range whose ends are not both IPv4 addresses.
    #[error("{text:?}: bad IPv4 range")]
    Ipv4Range {
        /// The range as given.
        text: String,
        /// What the address parser said.
        source: AddrParseError,
    },
    /// A range that ends before it starts, or over [`MAX_RANGE`] addresses.
    #[error("{0:?}: empty or too large range")]
    RangeSize(String),
    /// A source address that is not an IP address.
    #[error("{text:?}: not an IP address")]
    NotIp {
        /// The address as given.
        text: String,
        /// What the address parser said.
        source: AddrParseError,
    },
    /// `key=value` pairs that do not parse (the scenario parser's words).
    #[error(transparent)]
    Pairs(#[from] SpecError),
    /// A `server=` that is not a server number.
    #[error("server={text}: expected a server number (0, 1, ...)")]
    ServerNumber {
        /// The value as given.
        text: String,
        /// What the number parser said.
        source: std::num::ParseIntError,
    },
    /// A server outage without one of its keys.
    #[error("{text:?}: {key}= is missing (at=T,server=I,for=D)")]
    OutageKey {
        /// The outage as given.
        text: String,
        /// The missing key.
        key: &'static str,
    },
    /// A server outage of length zero.
    #[error("for= must be above zero")]
    OutageLength,
}

/// Deserializes any `T: FromStr` from a TOML string, integer, float or bool
/// (numbers and bools are read as their text), so `agents = 20`,
/// `keepalive-interval = "20s"` and `keepalive-interval = 20` all work.
pub(crate) fn from_text<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: FromStr,
    T::Err: fmt::Display,
{
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Raw {
        S(String),
        I(i64),
        F(f64),
        B(bool),
    }
    let text = match <Raw as serde::Deserialize>::deserialize(d)? {
        Raw::S(s) => s,
        Raw::I(i) => i.to_string(),
        Raw::F(f) => f.to_string(),
        Raw::B(b) => b.to_string(),
    };
    text.parse().map_err(serde::de::Error::custom)
}

/// Implements `Deserialize` through `FromStr` (see [`from_text`]).
macro_rules! deserialize_from_str {
    ($($t:ty),* $(,)?) => {$(
        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                from_text(d)
            }
        }
    )*};
}

/// A duration written in human units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Secs(pub Duration);

impl FromStr for Secs {
    type Err = UnitError;
    fn from_str(s: &str) -> Result<Self, UnitError> {
        agent_sim_fleet::parse_duration(s).map(Secs)
    }
}

impl fmt::Display for Secs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

impl From<Duration> for Secs {
    fn from(d: Duration) -> Self {
        Secs(d)
    }
}

/// How fast agents start: a rate, or `all` at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Ramp {
    /// Start every agent at once.
    All,
    /// Agents started per unit of time.
    Rate(Rate),
}

impl Ramp {
    /// `n` agents per second.
    pub fn per_second(n: f64) -> Self {
        Ramp::Rate(Rate::per_second(n))
    }

    /// The engine's form: `None` starts all at once.
    pub fn rate(self) -> Option<Rate> {
        match self {
            Ramp::All => None,
            Ramp::Rate(r) => Some(r),
        }
    }
}

impl FromStr for Ramp {
    type Err = UnitError;
    fn from_str(s: &str) -> Result<Self, UnitError> {
        match s.trim() {
            "all" | "none" | "0" => Ok(Ramp::All),
            t => t.parse().map(Ramp::Rate),
        }
    }
}

impl fmt::Display for Ramp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ramp::All => f.write_str("all"),
            Ramp::Rate(r) => write!(f, "{r}"),
        }
    }
}

/// A setting that can be switched off: `off` (or `none`) or a value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Toggle<T> {
    /// Switched off.
    Off,
    /// On, with this value.
    On(T),
}

impl<T> Toggle<T> {
    /// `None` when off.
    pub fn into_option(self) -> Option<T> {
        match self {
            Toggle::Off => None,
            Toggle::On(v) => Some(v),
        }
    }
}

impl<T: FromStr> FromStr for Toggle<T> {
    type Err = T::Err;
    fn from_str(s: &str) -> Result<Self, T::Err> {
        match s.trim() {
            "off" | "none" => Ok(Toggle::Off),
            t => t.parse().map(Toggle::On),
        }
    }
}

impl<T: fmt::Display> fmt::Display for Toggle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Toggle::Off => f.write_str("off"),
            Toggle::On(v) => v.fmt(f),
        }
    }
}

impl<'de, T> serde::Deserialize<'de> for Toggle<T>
where
    T: FromStr,
    T::Err: fmt::Display,
{
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_text(d)
    }
}

/// A list of names: `a,b,c` on the command line, a string or an array in TOML.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct List(pub Vec<String>);

impl FromStr for List {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(List(
            s.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect(),
        ))
    }
}

impl fmt::Display for List {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join(","))
    }
}

impl<'de> serde::Deserialize<'de> for List {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            One(String),
            Many(Vec<String>),
        }
        Ok(match <Raw as serde::Deserialize>::deserialize(d)? {
            Raw::One(s) => s.parse().unwrap_or_default(),
            Raw::Many(v) => List(
                v.into_iter()
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect(),
            ),
        })
    }
}

/// The agent protocol of a fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Kind {
    /// Sensu Go agents (WebSocket).
    #[default]
    Sensu,
    /// Consul client agents (gRPC Subscribe, catalog, sessions).
    Consul,
    /// Consul dataplane sidecars (Envoy Delta xDS on the gRPC port).
    ConsulDataplane,
}

impl FromStr for Kind {
    type Err = ValueError;
    fn from_str(s: &str) -> Result<Self, ValueError> {
        match s.trim() {
            "sensu" => Ok(Kind::Sensu),
            "consul" => Ok(Kind::Consul),
            "consul-dataplane" => Ok(Kind::ConsulDataplane),
            o => Err(ValueError::Kind(o.into())),
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Sensu => "sensu",
            Kind::Consul => "consul",
            Kind::ConsulDataplane => "consul-dataplane",
        })
    }
}

/// `--shard I/N`, or `N` / `/N` / `auto/N` with the index taken from the
/// environment when the run is resolved (see [`crate::shard::resolve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardSpec {
    /// This process's index, if given.
    pub index: Option<u64>,
    /// Number of processes.
    pub count: u64,
}

impl FromStr for ShardSpec {
    type Err = ValueError;
    fn from_str(v: &str) -> Result<Self, ValueError> {
        let bad = || ValueError::ShardForm(v.into());
        let num = |s: &str| s.trim().parse::<u64>().map_err(|_| bad());
        let spec = match v.split_once('/') {
            Some((i, n)) => ShardSpec {
                index: match i.trim() {
                    "" | "auto" => None,
                    i => Some(num(i)?),
                },
                count: num(n)?,
            },
            None => ShardSpec {
                index: None,
                count: num(v)?,
            },
        };
        if spec.count == 0 || spec.index.is_some_and(|i| i >= spec.count) {
            return Err(ValueError::ShardRange(v.into()));
        }
        Ok(spec)
    }
}

impl fmt::Display for ShardSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.index {
            Some(i) => write!(f, "{i}/{}", self.count),
            None => write!(f, "{}", self.count),
        }
    }
}

/// One source address, or an inclusive IPv4 range `127.0.0.2-127.0.0.9`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddrRange {
    first: IpAddr,
    last: IpAddr,
}

/// Largest range one `--source-addr` item may expand to.
const MAX_RANGE: u32 = 65_535;

impl AddrRange {
    /// The addresses of the range, in order.
    pub fn addrs(&self) -> Vec<IpAddr> {
        match (self.first, self.last) {
            (IpAddr::V4(a), IpAddr::V4(b)) => (u32::from(a)..=u32::from(b))
                .map(|x| IpAddr::V4(Ipv4Addr::from(x)))
                .collect(),
            (a, _) => vec![a],
        }
    }
}

impl FromStr for AddrRange {
    type Err = ValueError;
    fn from_str(item: &str) -> Result<Self, ValueError> {
        let item = item.trim();
        match item.split_once('-') {
            Some((a, b)) => {
                let ip = |s: &str| {
                    s.trim()
                        .parse::<Ipv4Addr>()
                        .map_err(|source| ValueError::Ipv4Range {
                            text: item.into(),
                            source,
                        })
                };
                let (a, b) = (ip(a)?, ip(b)?);
                let (x, y) = (u32::from(a), u32::from(b));
                if y < x || y - x > MAX_RANGE {
                    return Err(ValueError::RangeSize(item.into()));
                }
                Ok(AddrRange {
                    first: a.into(),
                    last: b.into(),
                })
            }
            None => {
                let ip: IpAddr = item.parse().map_err(|source| ValueError::NotIp {
                    text: item.into(),
                    source,
                })?;
                Ok(AddrRange {
                    first: ip,
                    last: ip,
                })
            }
        }
    }
}

impl fmt::Display for AddrRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

deserialize_from_str!(Secs, Ramp, Kind, ShardSpec, AddrRange);

/// `storm = "at=60s"` or `storm = ["at=60s", "at=2m"]` in a config file
/// (each item parsed as on the command line, with its own message).
pub fn one_or_many<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Raw {
        One(String),
        Many(Vec<String>),
    }
    let items = match <Raw as serde::Deserialize>::deserialize(d)? {
        Raw::One(s) => vec![s],
        Raw::Many(v) => v,
    };
    items
        .iter()
        .map(|s| s.parse().map_err(serde::de::Error::custom))
        .collect()
}

/// `--server-down at=T,server=I,for=D`: the embedded backend's server `I`
/// (0-based, of `--embedded-servers`) stops at `T`, its connections closed
/// as a real server's are, and starts again `D` later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerDown {
    /// When it stops, from the run's first dial.
    pub at: Duration,
    /// Which server.
    pub server: usize,
    /// How long it stays down.
    pub down: Duration,
}

impl FromStr for ServerDown {
    type Err = ValueError;
    fn from_str(s: &str) -> Result<Self, ValueError> {
        use agent_sim_fleet::scenario::{duration_of, pairs};
        let (mut at, mut server, mut down) = (None, None, None);
        for (k, v) in pairs(s, &["at", "server", "for"])? {
            match k {
                "at" => at = Some(duration_of(k, v)?),
                "server" => {
                    server =
                        Some(
                            v.parse::<usize>()
                                .map_err(|source| ValueError::ServerNumber {
                                    text: v.into(),
                                    source,
                                })?,
                        );
                }
                _ => down = Some(duration_of(k, v)?),
            }
        }
        let missing = |key| ValueError::OutageKey {
            text: s.into(),
            key,
        };
        let down = down.ok_or_else(|| missing("for"))?;
        if down.is_zero() {
            return Err(ValueError::OutageLength);
        }
        Ok(ServerDown {
            at: at.ok_or_else(|| missing("at"))?,
            server: server.ok_or_else(|| missing("server"))?,
            down,
        })
    }
}

impl fmt::Display for ServerDown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "at={},server={},for={}",
            humantime::format_duration(self.at),
            self.server,
            humantime::format_duration(self.down)
        )
    }
}

impl<'de> serde::Deserialize<'de> for ServerDown {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_text(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_parse_from_text_and_toml_alike() {
        assert_eq!("1m30s".parse::<Secs>().unwrap().0, Duration::from_secs(90));
        assert_eq!("15".parse::<Secs>().unwrap().0, Duration::from_secs(15));
        assert_eq!("all".parse::<Ramp>().unwrap(), Ramp::All);
        assert_eq!(
            "200/s".parse::<Ramp>().unwrap().rate(),
            Some(Rate::per_second(200.0))
        );
        assert!("fast".parse::<Ramp>().is_err());
        assert_eq!("off".parse::<Toggle<Secs>>().unwrap(), Toggle::Off);
        assert_eq!(
            "30s".parse::<Toggle<Secs>>().unwrap(),
            Toggle::On(Secs(Duration::from_secs(30)))
        );
        assert_eq!(
            " a, b ,,c".parse::<List>().unwrap().0,
            vec!["a".to_string(), "b".into(), "c".into()]
        );

        #[derive(serde::Deserialize)]
        struct T {
            d: Secs,
            n: Secs,
            l: List,
            m: List,
            t: Toggle<Secs>,
        }
        let t: T =
            toml::from_str("d = \"500ms\"\nn = 20\nl = \"x,y\"\nm = [\"x\", \"y\"]\nt = \"off\"\n")
                .unwrap();
        assert_eq!(t.d.0, Duration::from_millis(500));
        assert_eq!(t.n.0, Duration::from_secs(20));
        assert_eq!(t.l, t.m);
        assert_eq!(t.t, Toggle::Off);
        let e = toml::from_str::<T>("d = \"10 parsecs\"\nn=1\nl=\"\"\nm=[]\nt=\"off\"")
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("parsecs"), "{e}");
    }

    #[test]
    fn shards_and_source_ranges() {
        assert_eq!(
            "2/4".parse::<ShardSpec>().unwrap(),
            ShardSpec {
                index: Some(2),
                count: 4
            }
        );
        assert_eq!("4".parse::<ShardSpec>().unwrap().index, None);
        assert_eq!("auto/4".parse::<ShardSpec>().unwrap().count, 4);
        assert!("4/4".parse::<ShardSpec>().is_err());
        assert!("0/0".parse::<ShardSpec>().is_err());
        assert!("x/2".parse::<ShardSpec>().is_err());
        let r: AddrRange = "127.0.0.2-127.0.0.4".parse().unwrap();
        assert_eq!(r.addrs().len(), 3);
        assert_eq!(r.to_string(), "127.0.0.2-127.0.0.4");
        assert!("127.0.0.9-127.0.0.2".parse::<AddrRange>().is_err());
        assert!("nope".parse::<AddrRange>().is_err());
        assert_eq!("::1".parse::<AddrRange>().unwrap().addrs().len(), 1);
    }
}
