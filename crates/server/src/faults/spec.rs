//! The `--faults` grammar: one fault per spec, parsed and checked before any
//! socket is opened (a bad spec is a one-line [`SpecError`]).
//!
//! ```text
//! SPEC   = TARGET "=" ACTION "@" ITEM ("," ITEM)*
//!        | "restart" "@" ITEM ("," ITEM)*
//! TARGET = sensu.upgrade | sensu.session | sensu.frame
//!        | consul.rpc | consul.subscribe | consul.frame | consul.http
//!        | consul.xds | consul.kv
//! ACTION = delay:DUR | stall | drop | reset | 400..599            (upgrade, rpc, http)
//!        | aborted | unavailable | resource-exhausted | cut        (subscribe)
//!        | garbage | truncated | oversized | delay:DUR            (frame)
//!        | reset | resource-exhausted                             (xds: a stream)
//!        | garbage | bad-resource | delay:DUR                      (xds: a response)
//!        | index-back | index-zero | huge-value | lock-stuck       (kv)
//! ITEM   = N%            each unit with this probability (default 100% with a time)
//!        | at:DUR        once, DUR after serve started
//!        | every:DUR     periodically (first at at:DUR if given, else after DUR)
//!        | for:DUR       with at/every: also units arriving within DUR of each time
//!        | after:DUR     sensu.session with a rate: hit DUR into the session
//!        | path:PREFIX   consul.http, consul.kv: only request paths starting with
//!                      PREFIX (a KV call over RPC is `/v1/kv/<key>` here)
//!        | max:N         at most N injections
//!        | past:N        with a rate: only once the backend holds N or more
//!                      sessions (Sensu sessions; xDS streams for consul.xds;
//!                      multiplexed RPC connections, one per client agent,
//!                      for the other consul targets)
//!        | down:DUR      restart: how long the listeners stay closed (default 1s)
//!        | state:keep|lose  restart: keep or lose catalog, sessions and raft index
//! ```
//!
//! A unit is what the target names: an upgrade request, a session, a frame
//! the backend sends, an RPC connection, a Subscribe call or stream, an HTTP
//! request, a Delta ADS stream (`consul.xds` `reset`, `resource-exhausted`)
//! or a Delta xDS response (`consul.xds` `garbage`, `bad-resource`,
//! `delay`), a KV read (`consul.kv` `index-back`, `index-zero`,
//! `huge-value`: HTTP `GET /v1/kv` or `KVS.Get|List|ListKeys`) or a lock
//! acquire (`consul.kv` `lock-stuck`). Live units (Sensu sessions, RPC and HTTP connections,
//! Subscribe and ADS streams) are hit at each time; the others only within
//! `for:`.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A spec that cannot be used, and why (one line each).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpecError {
    /// The whole spec, and what is wrong with it (what `FaultSpec::from_str`
    /// gives back: every other variant inside this one).
    #[error("{text:?}: {source}")]
    InSpec {
        /// The spec as written (trimmed).
        text: String,
        /// What is wrong with it.
        source: Box<SpecError>,
    },
    /// No `@`: not the shape of a spec.
    #[error("expected TARGET=ACTION@WHEN (e.g. sensu.upgrade=503@10%) or restart@WHEN")]
    Shape,
    /// A target that is not one of [`Target::ALL`].
    #[error("unknown target {0:?} (one of {names})", names = target_names())]
    UnknownTarget(String),
    /// `restart=...`: a restart takes no action.
    #[error("restart takes no action: restart@at:20s,down:5s,state:lose")]
    RestartAction,
    /// A target other than restart without `=ACTION`.
    #[error("{t} needs an action: {t}=ACTION@WHEN ({actions})", t = .0, actions = .0.actions())]
    NoAction(Target),
    /// An action the target does not take.
    #[error("{target} does not take {}: use {}", .action.name(), .target.actions())]
    NotTaken {
        /// The target named.
        target: Target,
        /// The action given.
        action: Action,
    },
    /// An action that is not one of the grammar's.
    #[error("unknown action {0:?}")]
    UnknownAction(String),
    /// `delay` without its duration.
    #[error("delay needs a duration: delay:500ms")]
    DelayNeedsDuration,
    /// Three digits that are not a `u16` (cannot happen; kept for the cause).
    #[error("status {text:?}")]
    BadStatus {
        /// The digits.
        text: String,
        /// Why they did not parse.
        source: std::num::ParseIntError,
    },
    /// An HTTP status outside 400..599.
    #[error("HTTP status {0}: use 400..599 (an answer that refuses)")]
    StatusRange(u16),
    /// A duration that does not parse (`delay:`, `at:`, `every:`, ...).
    #[error("{item}:{value}: not a duration ({source}); e.g. 500ms, 30s, 2m")]
    BadDuration {
        /// The item (or action) it belongs to.
        item: String,
        /// The text after `item:`.
        value: String,
        /// Why it did not parse.
        source: humantime::DurationError,
    },
    /// An empty item (`@,` or a trailing `,`).
    #[error("empty item after '@' or ','")]
    EmptyItem,
    /// An item that is neither `N%` nor `key:value`.
    #[error(
        "{0:?}: expected N%, at:DUR, every:DUR, for:DUR, after:DUR, path:PREFIX, max:N, past:N, \
         down:DUR or state:keep|lose"
    )]
    BadItem(String),
    /// The same item twice (the rate's key is `%`).
    #[error("{0} given twice")]
    Twice(String),
    /// An item key that is not one of the grammar's.
    #[error("unknown item {0:?}")]
    UnknownItem(String),
    /// `N%` whose N is not a number.
    #[error("{item:?}: not a percentage")]
    NotPercentage {
        /// The item as written.
        item: String,
        /// Why N did not parse.
        source: std::num::ParseFloatError,
    },
    /// A percentage outside (0, 100].
    #[error("{0:?}: a rate is a percentage in (0, 100]")]
    RateRange(String),
    /// `every:` shorter than [`MIN_PERIOD`].
    #[error("every:{0}: at least {ms}ms", ms = MIN_PERIOD.as_millis())]
    PeriodTooShort(String),
    /// `path:` that does not start with `/`.
    #[error("path:{0}: a request path prefix starts with '/' (e.g. path:/v1/session/)")]
    PathNotAbsolute(String),
    /// `past:` that is not a count.
    #[error("past:{value}: a count of sessions (past:500)")]
    BadPast {
        /// The text after `past:`.
        value: String,
        /// Why it is not a count.
        source: std::num::ParseIntError,
    },
    /// `past:` with `at:`/`every:`, or on a restart.
    #[error("past: gates the units arriving with a rate (N%), not faults at a time or restarts")]
    PastWithTime,
    /// `max:` that is not a count of at least 1.
    #[error("max:{value}: a count of at least 1")]
    BadMax {
        /// The text after `max:`.
        value: String,
        /// Why it did not parse (`None`: it did, as 0).
        source: Option<std::num::ParseIntError>,
    },
    /// `state:` other than `keep` or `lose`.
    #[error("state:{0}: keep or lose")]
    BadState(String),
    /// An item that applies to one target only, given to another.
    #[error("{item}: applies to {target} only")]
    OnlyFor {
        /// The item's key.
        item: &'static str,
        /// The target it applies to.
        target: Target,
    },
    /// `path:` given to a target other than consul.http and consul.kv.
    #[error(
        "path: applies to {} and {} only",
        Target::ConsulHttp,
        Target::ConsulKv
    )]
    PathOnlyHttpKv,
    /// A restart with a rate or `for:`.
    #[error("restart happens at times only: restart@at:20s[,every:60s],down:5s,state:keep|lose")]
    RestartTimesOnly,
    /// A restart with neither `at:` nor `every:`.
    #[error("restart needs at:DUR and/or every:DUR")]
    RestartNeedsTime,
    /// A restart without `state:`.
    #[error(
        "restart needs state:keep (catalog, sessions, raft index kept) or state:lose \
         (start empty, as a consul agent -dev restart)"
    )]
    RestartNeedsState,
    /// A restart down for as long as its period, or longer.
    #[error("down:{down:?} must be shorter than every:{every:?}")]
    DownNotShorter {
        /// `down:`.
        down: Duration,
        /// `every:`.
        every: Duration,
    },
    /// A fault with neither a rate nor a time.
    #[error("needs a rate (N%) and/or a time (at:DUR, every:DUR)")]
    NoRateNorTime,
    /// `after:` with a time.
    #[error("after: goes with a rate alone (sessions hit that far into their life)")]
    AfterWithTime,
    /// `for:` without a time.
    #[error("for: needs at:DUR or every:DUR")]
    ForWithoutTime,
    /// A time without `for:` where the target has no live units to hit.
    #[error(
        "{target} has no live units to hit with {} at a time: add for:DUR (how long arriving \
         units are hit)",
        .action.name()
    )]
    NoLiveUnits {
        /// The target.
        target: Target,
        /// Its action.
        action: Action,
    },
    /// A window as long as its period, or longer.
    #[error("for:{window:?} must be shorter than every:{every:?}")]
    WindowNotShorter {
        /// `for:`.
        window: Duration,
        /// `every:`.
        every: Duration,
    },
}

/// The targets' names, for [`SpecError::UnknownTarget`].
fn target_names() -> String {
    let names: Vec<&str> = Target::ALL.iter().map(|t| t.name()).collect();
    names.join(", ")
}

/// Where a fault is injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// The Sensu WebSocket upgrade (one unit per connection).
    SensuUpgrade,
    /// An established Sensu session (live).
    SensuSession,
    /// A WebSocket message the Sensu backend sends.
    SensuFrame,
    /// A Consul RPC connection (at accept; live at a time).
    ConsulRpc,
    /// A Subscribe call (and, at a time, every live stream).
    ConsulSubscribe,
    /// A gRPC message on a Subscribe stream.
    ConsulFrame,
    /// A Consul HTTP API request (and, at a time, every live connection).
    ConsulHttp,
    /// A Delta ADS stream on the public gRPC port (`reset`,
    /// `resource-exhausted`; at a time, every live stream) or a response on
    /// it (`garbage`, `bad-resource`, `delay`).
    ConsulXds,
    /// Consul KV: a read (HTTP or RPC) answered with a wrong index or a
    /// huge value, or a lock acquire whose key is taken for good.
    ConsulKv,
    /// The whole backend: stop, stay down, start again.
    Restart,
}

impl Target {
    /// Every target, in documentation order.
    pub const ALL: [Target; 10] = [
        Target::SensuUpgrade,
        Target::SensuSession,
        Target::SensuFrame,
        Target::ConsulRpc,
        Target::ConsulSubscribe,
        Target::ConsulFrame,
        Target::ConsulHttp,
        Target::ConsulXds,
        Target::ConsulKv,
        Target::Restart,
    ];

    /// The name used in specs.
    pub fn name(self) -> &'static str {
        match self {
            Target::SensuUpgrade => "sensu.upgrade",
            Target::SensuSession => "sensu.session",
            Target::SensuFrame => "sensu.frame",
            Target::ConsulRpc => "consul.rpc",
            Target::ConsulSubscribe => "consul.subscribe",
            Target::ConsulFrame => "consul.frame",
            Target::ConsulHttp => "consul.http",
            Target::ConsulXds => "consul.xds",
            Target::ConsulKv => "consul.kv",
            Target::Restart => "restart",
        }
    }

    /// The protocol it belongs to (`None`: both).
    pub fn protocol(self) -> Option<Protocol> {
        match self {
            Target::SensuUpgrade | Target::SensuSession | Target::SensuFrame => {
                Some(Protocol::Sensu)
            }
            Target::ConsulRpc
            | Target::ConsulSubscribe
            | Target::ConsulFrame
            | Target::ConsulHttp
            | Target::ConsulXds
            | Target::ConsulKv => Some(Protocol::Consul),
            Target::Restart => None,
        }
    }

    /// The actions it accepts, as documented.
    fn actions(self) -> &'static str {
        match self {
            Target::SensuUpgrade | Target::ConsulHttp => {
                "delay:DUR, stall, drop, reset or an HTTP status 400..599"
            }
            Target::SensuSession => "drop, reset or stall",
            Target::ConsulRpc => "delay:DUR, stall, drop or reset",
            Target::ConsulSubscribe => "aborted, unavailable, resource-exhausted or cut",
            Target::SensuFrame | Target::ConsulFrame => {
                "garbage, truncated, oversized or delay:DUR"
            }
            Target::ConsulXds => {
                "reset or resource-exhausted (streams), garbage, bad-resource or delay:DUR \
                 (responses)"
            }
            Target::ConsulKv => {
                "index-back, index-zero or huge-value (reads), lock-stuck (acquires)"
            }
            Target::Restart => "none",
        }
    }

    fn accepts(self, a: &Action) -> bool {
        use Action::{
            Aborted, BadResource, Cut, Delay, Drop, Garbage, HugeValue, IndexBack, IndexZero,
            LockStuck, Oversized, Reset, ResourceExhausted, Stall, Status, Truncated, Unavailable,
        };
        match self {
            Target::SensuUpgrade | Target::ConsulHttp => {
                matches!(a, Delay(_) | Stall | Drop | Reset | Status(_))
            }
            Target::SensuSession => matches!(a, Drop | Reset | Stall),
            Target::ConsulRpc => matches!(a, Delay(_) | Stall | Drop | Reset),
            Target::ConsulSubscribe => {
                matches!(a, Aborted | Unavailable | ResourceExhausted | Cut)
            }
            Target::SensuFrame | Target::ConsulFrame => {
                matches!(a, Garbage | Truncated | Oversized | Delay(_))
            }
            Target::ConsulXds => {
                matches!(
                    a,
                    Reset | ResourceExhausted | Garbage | BadResource | Delay(_)
                )
            }
            Target::ConsulKv => matches!(a, IndexBack | IndexZero | HugeValue | LockStuck),
            Target::Restart => false,
        }
    }

    /// Whether live units of this target are hit at a time (`at:`/`every:`)
    /// with `action`, rather than only units arriving within `for:`.
    pub fn has_live_units(self, action: &Action) -> bool {
        match self {
            Target::SensuSession | Target::ConsulRpc | Target::ConsulHttp => {
                matches!(action, Action::Drop | Action::Reset | Action::Stall)
            }
            Target::ConsulSubscribe => action.grpc_code().is_some(),
            Target::ConsulXds => matches!(action, Action::Reset | Action::ResourceExhausted),
            _ => false,
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A served protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// The Sensu agent endpoint.
    Sensu,
    /// The Consul RPC port and HTTP API.
    Consul,
}

/// What happens to a hit unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Answer (or send) this much later.
    Delay(Duration),
    /// Never answer: read and discard until the client gives up.
    Stall,
    /// Close the connection without an answer (FIN).
    Drop,
    /// Reset the connection (RST: `SO_LINGER` 0, then close).
    Reset,
    /// Answer with this HTTP status.
    Status(u16),
    /// Subscribe: gRPC status `ABORTED`.
    Aborted,
    /// Subscribe: gRPC status `UNAVAILABLE`.
    Unavailable,
    /// Subscribe: gRPC status `RESOURCE_EXHAUSTED`.
    ResourceExhausted,
    /// Subscribe: the stream ends (status OK) halfway through its snapshot.
    Cut,
    /// A message whose bytes are not a valid frame.
    Garbage,
    /// A frame cut short, then the connection (or stream) ends.
    Truncated,
    /// A frame larger than any client accepts by default.
    Oversized,
    /// xDS: a response with a resource (Cluster or ClusterLoadAssignment)
    /// whose bytes do not parse as its type.
    BadResource,
    /// KV: a read answers with an index below the true one (half of it,
    /// at least 1): the index goes backwards.
    IndexBack,
    /// KV: a read answers with index 0.
    IndexZero,
    /// KV: a read answers with an 8 MiB value in its (first) entry.
    HugeValue,
    /// KV: an acquire answers `false` and its key is taken by a session
    /// that is never invalidated (a lock that never frees).
    LockStuck,
}

impl Action {
    /// The gRPC code of a Subscribe status action.
    pub fn grpc_code(&self) -> Option<tonic::Code> {
        match self {
            Action::Aborted => Some(tonic::Code::Aborted),
            Action::Unavailable => Some(tonic::Code::Unavailable),
            Action::ResourceExhausted => Some(tonic::Code::ResourceExhausted),
            _ => None,
        }
    }

    /// The name used in specs (`delay` without its duration).
    pub fn name(&self) -> &'static str {
        match self {
            Action::Delay(_) => "delay",
            Action::Stall => "stall",
            Action::Drop => "drop",
            Action::Reset => "reset",
            Action::Status(_) => "status",
            Action::Aborted => "aborted",
            Action::Unavailable => "unavailable",
            Action::ResourceExhausted => "resource-exhausted",
            Action::Cut => "cut",
            Action::Garbage => "garbage",
            Action::Truncated => "truncated",
            Action::Oversized => "oversized",
            Action::BadResource => "bad-resource",
            Action::IndexBack => "index-back",
            Action::IndexZero => "index-zero",
            Action::HugeValue => "huge-value",
            Action::LockStuck => "lock-stuck",
        }
    }
}

impl FromStr for Action {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<Self, SpecError> {
        if let Some(d) = s.strip_prefix("delay:") {
            return Ok(Action::Delay(duration("delay", d)?));
        }
        if s.len() == 3 && s.bytes().all(|b| b.is_ascii_digit()) {
            let code: u16 = s.parse().map_err(|source| SpecError::BadStatus {
                text: s.to_owned(),
                source,
            })?;
            if !(400..=599).contains(&code) {
                return Err(SpecError::StatusRange(code));
            }
            return Ok(Action::Status(code));
        }
        Ok(match s {
            "stall" => Action::Stall,
            "drop" => Action::Drop,
            "reset" => Action::Reset,
            "aborted" => Action::Aborted,
            "unavailable" => Action::Unavailable,
            "resource-exhausted" => Action::ResourceExhausted,
            "cut" => Action::Cut,
            "garbage" => Action::Garbage,
            "truncated" => Action::Truncated,
            "oversized" => Action::Oversized,
            "bad-resource" => Action::BadResource,
            "index-back" => Action::IndexBack,
            "index-zero" => Action::IndexZero,
            "huge-value" => Action::HugeValue,
            "lock-stuck" => Action::LockStuck,
            "delay" => return Err(SpecError::DelayNeedsDuration),
            _ => return Err(SpecError::UnknownAction(s.to_owned())),
        })
    }
}

/// What a restart does with the backend's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartState {
    /// Keep the catalog, sessions, config entries and the raft index.
    Keep,
    /// Start empty, raft indexes starting over (a `consul agent -dev` restart).
    Lose,
}

/// One parsed and checked `--faults` spec.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultSpec {
    /// The spec as written (trimmed): its label in the stats.
    pub text: String,
    /// Where.
    pub target: Target,
    /// What (`None` for a restart).
    pub action: Option<Action>,
    /// Probability per unit (0 < p ≤ 1); 1 when only a time is given.
    pub rate: f64,
    /// First time (from serve start).
    pub at: Option<Duration>,
    /// Period of the times.
    pub every: Option<Duration>,
    /// Window after each time in which arriving units are hit.
    pub window: Option<Duration>,
    /// Sensu sessions hit by rate: this far into the session.
    pub after: Duration,
    /// consul.http: request path prefix.
    pub path: Option<String>,
    /// Most injections (`None`: unbounded).
    pub max: Option<u64>,
    /// Only once the backend holds this many of the target's sessions or
    /// more ([`Target::load`]): a server that degrades past a size.
    pub past: Option<u64>,
    /// Restart: time down.
    pub down: Duration,
    /// Restart: what happens to the state.
    pub state: Option<RestartState>,
}

/// Shortest `every:` accepted.
pub const MIN_PERIOD: Duration = Duration::from_millis(10);
/// Default `down:` of a restart.
pub const DEFAULT_DOWN: Duration = Duration::from_secs(1);

fn duration(item: &str, s: &str) -> Result<Duration, SpecError> {
    humantime::parse_duration(s.trim()).map_err(|source| SpecError::BadDuration {
        item: item.to_owned(),
        value: s.to_owned(),
        source,
    })
}

impl FromStr for FaultSpec {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<Self, SpecError> {
        let text = s.trim();
        parse(text).map_err(|e| SpecError::InSpec {
            text: text.to_owned(),
            source: Box::new(e),
        })
    }
}

impl fmt::Display for FaultSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Parses a trimmed spec: `TARGET=ACTION@ITEMS` (or `restart@ITEMS`), each
/// item checked alone, then the items against the target ([`check`]).
fn parse(text: &str) -> Result<FaultSpec, SpecError> {
    let (head, items) = text.split_once('@').ok_or(SpecError::Shape)?;
    let (target, action) = parse_head(head)?;
    let mut spec = FaultSpec {
        text: text.to_owned(),
        target,
        action,
        rate: 1.0,
        at: None,
        every: None,
        window: None,
        after: Duration::ZERO,
        path: None,
        max: None,
        past: None,
        down: DEFAULT_DOWN,
        state: None,
    };
    let mut rate = None;
    let mut seen: Vec<&str> = Vec::new();
    for item in items.split(',').map(str::trim) {
        let (key, value) = split_item(item)?;
        if seen.contains(&key) {
            return Err(SpecError::Twice(key.to_owned()));
        }
        seen.push(key);
        if key == "%" {
            rate = Some(percentage(item)?);
        } else {
            set_item(&mut spec, key, value)?;
        }
    }
    check(&mut spec, rate, &seen)?;
    Ok(spec)
}

/// `TARGET=ACTION` (or `restart`): the target, and the action it takes.
fn parse_head(head: &str) -> Result<(Target, Option<Action>), SpecError> {
    let (target, action) = match head.split_once('=') {
        Some((t, a)) => (t.trim(), Some(a.trim())),
        None => (head.trim(), None),
    };
    let target = Target::ALL
        .into_iter()
        .find(|t| t.name() == target)
        .ok_or_else(|| SpecError::UnknownTarget(target.to_owned()))?;
    let action = match (target, action) {
        (Target::Restart, None) => None,
        (Target::Restart, Some(_)) => {
            return Err(SpecError::RestartAction);
        }
        (t, None) => return Err(SpecError::NoAction(t)),
        (t, Some(a)) => {
            let a: Action = a.parse()?;
            if !t.accepts(&a) {
                return Err(SpecError::NotTaken {
                    target: t,
                    action: a,
                });
            }
            Some(a)
        }
    };
    Ok((target, action))
}

/// One item as `(key, value)`; a bare `N%` is the key `%`.
fn split_item(item: &str) -> Result<(&str, &str), SpecError> {
    if item.is_empty() {
        return Err(SpecError::EmptyItem);
    }
    match item.split_once(':') {
        Some((k, v)) => Ok((k, v)),
        None if item.ends_with('%') => Ok(("%", item)),
        None => Err(SpecError::BadItem(item.to_owned())),
    }
}

/// `N%` as a probability in (0, 1].
fn percentage(item: &str) -> Result<f64, SpecError> {
    let n: f64 = item
        .trim_end_matches('%')
        .parse()
        .map_err(|source| SpecError::NotPercentage {
            item: item.to_owned(),
            source,
        })?;
    if !(n > 0.0 && n <= 100.0) {
        return Err(SpecError::RateRange(item.to_owned()));
    }
    Ok(n / 100.0)
}

/// Sets the field a `key:value` item names (all but the rate).
fn set_item(spec: &mut FaultSpec, key: &str, value: &str) -> Result<(), SpecError> {
    match key {
        "at" => spec.at = Some(duration(key, value)?),
        "every" => {
            let d = duration(key, value)?;
            if d < MIN_PERIOD {
                return Err(SpecError::PeriodTooShort(value.to_owned()));
            }
            spec.every = Some(d);
        }
        "for" => spec.window = Some(duration(key, value)?),
        "after" => spec.after = duration(key, value)?,
        "path" => {
            if !value.starts_with('/') {
                return Err(SpecError::PathNotAbsolute(value.to_owned()));
            }
            spec.path = Some(value.to_owned());
        }
        "max" => {
            let bad = |source| SpecError::BadMax {
                value: value.to_owned(),
                source,
            };
            let n: u64 = value.parse().map_err(|e| bad(Some(e)))?;
            if n == 0 {
                return Err(bad(None));
            }
            spec.max = Some(n);
        }
        "past" => {
            spec.past = Some(value.parse().map_err(|source| SpecError::BadPast {
                value: value.to_owned(),
                source,
            })?)
        }
        "down" => spec.down = duration(key, value)?,
        "state" => {
            spec.state = Some(match value {
                "keep" => RestartState::Keep,
                "lose" => RestartState::Lose,
                _ => return Err(SpecError::BadState(value.to_owned())),
            })
        }
        _ => return Err(SpecError::UnknownItem(key.to_owned())),
    }
    Ok(())
}

/// The rules that tie items to targets.
fn check(spec: &mut FaultSpec, rate: Option<f64>, seen: &[&str]) -> Result<(), SpecError> {
    let t = spec.target;
    let has = |k: &str| seen.contains(&k);
    let timed = spec.at.is_some() || spec.every.is_some();
    let only = |item: &'static str, target: Target| -> Result<(), SpecError> {
        if has(item) && t != target {
            return Err(SpecError::OnlyFor { item, target });
        }
        Ok(())
    };
    if has("path") && !matches!(t, Target::ConsulHttp | Target::ConsulKv) {
        return Err(SpecError::PathOnlyHttpKv);
    }
    only("down", Target::Restart)?;
    only("state", Target::Restart)?;
    only("after", Target::SensuSession)?;
    if t == Target::Restart {
        if has("past") {
            return Err(SpecError::PastWithTime);
        }
        if rate.is_some() || has("for") {
            return Err(SpecError::RestartTimesOnly);
        }
        if !timed {
            return Err(SpecError::RestartNeedsTime);
        }
        if spec.state.is_none() {
            return Err(SpecError::RestartNeedsState);
        }
        if let Some(p) = spec.every
            && spec.down >= p
        {
            return Err(SpecError::DownNotShorter {
                down: spec.down,
                every: p,
            });
        }
        return Ok(());
    }
    let action = spec.action.as_ref().expect("checked in parse");
    if has("past") && (timed || rate.is_none()) {
        return Err(SpecError::PastWithTime);
    }
    if rate.is_none() && !timed {
        return Err(SpecError::NoRateNorTime);
    }
    if let Some(r) = rate {
        spec.rate = r;
    }
    if has("after") && timed {
        return Err(SpecError::AfterWithTime);
    }
    if has("for") && !timed {
        return Err(SpecError::ForWithoutTime);
    }
    if timed && !has("for") && !t.has_live_units(action) {
        return Err(SpecError::NoLiveUnits {
            target: t,
            action: action.clone(),
        });
    }
    if let (Some(w), Some(p)) = (spec.window, spec.every)
        && w >= p
    {
        return Err(SpecError::WindowNotShorter {
            window: w,
            every: p,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::Load;

    fn ok(s: &str) -> FaultSpec {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn err(s: &str) -> String {
        match s.parse::<FaultSpec>() {
            Ok(spec) => panic!("{s} parsed: {spec:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn past_gates_a_rate_on_the_targets_sessions() {
        let s = ok("consul.frame=delay:2s@100%,past:500");
        assert_eq!((s.past, s.target.load()), (Some(500), Load::ConsulRpc));
        assert_eq!(
            ok("consul.xds=delay:1s@100%,past:3").target.load(),
            Load::XdsStreams
        );
        assert_eq!(
            ok("sensu.upgrade=503@100%,past:0").target.load(),
            Load::SensuSessions
        );
        assert!(err("consul.frame=delay:2s@100%,past:many").contains("a count of sessions"));
        for timed in [
            "consul.rpc=reset@at:5s,past:10",
            "restart@at:5s,state:keep,past:10",
        ] {
            assert!(err(timed).contains("not faults at a time"), "{timed}");
        }
    }

    #[test]
    fn the_documented_examples_parse() {
        let s = ok("sensu.upgrade=503@10%");
        assert_eq!(s.target, Target::SensuUpgrade);
        assert_eq!(s.action, Some(Action::Status(503)));
        assert!((s.rate - 0.1).abs() < 1e-12);
        assert!(s.untimed());

        let s = ok("consul.subscribe=aborted@at:30s");
        assert_eq!(s.action, Some(Action::Aborted));
        assert_eq!(s.at, Some(Duration::from_secs(30)));
        assert_eq!(s.rate, 1.0);

        let s = ok(" restart@at:20s,down:5s,state:lose ");
        assert_eq!(s.text, "restart@at:20s,down:5s,state:lose");
        assert_eq!(s.target, Target::Restart);
        assert_eq!(s.down, Duration::from_secs(5));
        assert_eq!(s.state, Some(RestartState::Lose));

        let s = ok("consul.kv=index-back@50%,path:/v1/kv/vault/");
        assert_eq!(
            (s.target, s.action),
            (Target::ConsulKv, Some(Action::IndexBack))
        );
        for a in ["index-zero", "huge-value", "lock-stuck"] {
            let s = ok(&format!("consul.kv={a}@every:10s,for:2s"));
            assert_eq!(s.action.map(|a| a.name()), Some(a));
        }

        let s = ok("consul.http=429@5%,path:/v1/session/,max:3");
        assert_eq!(s.path.as_deref(), Some("/v1/session/"));
        assert_eq!(s.max, Some(3));

        let s = ok("sensu.session=drop@every:10s,for:1s,25%");
        assert_eq!(s.every, Some(Duration::from_secs(10)));
        assert_eq!(s.window, Some(Duration::from_secs(1)));
        assert!((s.rate - 0.25).abs() < 1e-12);

        let s = ok("sensu.frame=delay:1500ms@100%");
        assert_eq!(s.action, Some(Action::Delay(Duration::from_millis(1500))));
        ok("sensu.session=reset@2%,after:5s");
        ok("consul.frame=oversized@at:1s,for:2s");
        ok("consul.rpc=drop@at:10s");
        ok("consul.subscribe=cut@50%");
        ok("restart@every:60s,state:keep");
        let s = ok("consul.xds=bad-resource@max:3,100%");
        assert_eq!(s.target, Target::ConsulXds);
        assert_eq!(s.action, Some(Action::BadResource));
        ok("consul.xds=garbage@10%");
        ok("consul.xds=delay:300ms@100%");
        ok("consul.xds=reset@at:5s");
        ok("consul.xds=resource-exhausted@every:30s,10%");
    }

    #[test]
    fn bad_specs_say_why_in_one_line() {
        for (spec, says) in [
            ("sensu.upgrade", "expected TARGET=ACTION@WHEN"),
            ("sensu.nothing=drop@1%", "unknown target"),
            ("sensu.upgrade@1%", "needs an action"),
            ("sensu.upgrade=aborted@1%", "does not take aborted"),
            ("sensu.upgrade=302@1%", "400..599"),
            ("sensu.upgrade=503@0%", "(0, 100]"),
            ("sensu.upgrade=503@150%", "(0, 100]"),
            ("sensu.upgrade=503@at:1s", "add for:DUR"),
            ("sensu.upgrade=503@for:1s", "needs a rate"),
            ("sensu.upgrade=503@1%,for:1s", "for: needs at:DUR"),
            ("sensu.upgrade=503@every:1s,for:2s", "shorter than every"),
            ("sensu.upgrade=503@every:1ms,for:0s", "at least 10ms"),
            ("sensu.upgrade=503@at:soon,for:1s", "not a duration"),
            ("sensu.upgrade=delay@1%", "needs a duration"),
            ("sensu.upgrade=503@1%,1%", "given twice"),
            (
                "sensu.upgrade=503@1%,path:/v1",
                "consul.http and consul.kv only",
            ),
            ("consul.kv=drop@1%", "index-back, index-zero"),
            ("consul.http=lock-stuck@1%", "delay:DUR, stall"),
            ("consul.kv=lock-stuck@at:1s", "add for:DUR"),
            ("consul.http=503@1%,path:v1", "starts with '/'"),
            ("consul.http=503@1%,max:0", "at least 1"),
            ("sensu.upgrade=drop@1%,after:1s", "after: applies"),
            (
                "sensu.session=drop@at:1s,after:2s",
                "after: goes with a rate",
            ),
            ("restart@at:1s", "needs state:keep"),
            ("restart@50%,state:keep", "at times only"),
            ("restart=drop@at:1s,state:keep", "takes no action"),
            ("restart@every:1s,down:2s,state:lose", "shorter than every"),
            ("restart@at:1s,state:maybe", "keep or lose"),
            ("sensu.upgrade=503@1%,bogus", "expected N%"),
            ("sensu.upgrade=503@1%,", "empty item"),
            ("consul.xds=aborted@1%", "does not take aborted"),
            ("consul.xds=bad-resource@at:1s", "add for:DUR"),
            ("consul.frame=bad-resource@1%", "does not take bad-resource"),
        ] {
            let e = err(spec);
            assert!(e.contains(says), "{spec}: {e}");
            assert!(!e.contains('\n'), "{spec}: {e}");
            assert!(e.starts_with(&format!("{spec:?}")), "{spec}: {e}");
        }
    }

    #[test]
    fn mistakes_are_variants_that_keep_their_cause() {
        use std::error::Error as _;
        let inner = |s: &str| match s.parse::<FaultSpec>() {
            Err(SpecError::InSpec { text, source }) => {
                assert_eq!(text, s.trim());
                *source
            }
            other => panic!("{s}: {other:?}"),
        };
        let e = inner("consul.http=503@at:soon,for:1s");
        assert!(matches!(&e, SpecError::BadDuration { item, value, .. }
            if item == "at" && value == "soon"));
        assert!(e.source().is_some(), "the duration's own error is kept");
        let e = inner("consul.http=503@x%");
        assert!(matches!(e, SpecError::NotPercentage { .. }));
        assert!(e.source().is_some());
        assert!(matches!(
            inner("consul.http=503@1%,max:many"),
            SpecError::BadMax {
                source: Some(_),
                ..
            }
        ));
        assert!(matches!(
            inner("consul.http=503@1%,max:0"),
            SpecError::BadMax { source: None, .. }
        ));
        assert_eq!(
            inner("sensu.session=drop@1%,down:1s"),
            SpecError::OnlyFor {
                item: "down",
                target: Target::Restart
            }
        );
        assert_eq!(
            inner("consul.kv=index-back@at:1s"),
            SpecError::NoLiveUnits {
                target: Target::ConsulKv,
                action: Action::IndexBack
            }
        );
        assert_eq!(inner(" restart@at:1s "), SpecError::RestartNeedsState);
    }

    #[test]
    fn moments_and_windows() {
        let s = ok("consul.http=503@at:5s,every:10s,for:2s");
        assert_eq!(s.moment(0), Some(Duration::from_secs(5)));
        assert_eq!(s.moment(2), Some(Duration::from_secs(25)));
        assert!(!s.in_window(Duration::from_secs(4)));
        assert!(s.in_window(Duration::from_secs(5)));
        assert!(s.in_window(Duration::from_millis(16_999)));
        assert!(!s.in_window(Duration::from_secs(17)));
        let once = ok("consul.http=503@at:1s,for:500ms");
        assert_eq!(once.moment(1), None);
        assert!(once.in_window(Duration::from_millis(1200)));
        assert!(!once.in_window(Duration::from_millis(1500)));
        let periodic = ok("sensu.session=drop@every:3s");
        assert_eq!(periodic.moment(0), Some(Duration::from_secs(3)));
        assert!(
            !periodic.in_window(Duration::from_secs(3)),
            "no for: no window"
        );
        assert_eq!(ok("consul.http=503@7%").moment(0), None);
    }
}
