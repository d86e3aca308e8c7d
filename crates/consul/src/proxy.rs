//! The Connect proxies behind one client agent (`--proxies-per-agent`): when
//! an update of the agent's watches reaches each proxy's xDS stream, as
//! Consul 1.20's `agent/proxycfg` hands it over.
//!
//! What Consul does (`agent/proxycfg/state.go` and `manager.go`, v1.20.1):
//! each proxy registered at an agent has its own state loop, fed by the
//! agent's materialized views (keyed by type, datacenter, token and request,
//! so the proxies of one agent share one Subscribe per upstream and token).
//! An update is applied to the proxy's snapshot; if no send is pending, one
//! is scheduled after `max(coalesceTimeout, the limiter's delay)`, the
//! timeout being 200 ms and the limiter the agent's (`xds.
//! update_max_per_second`, 250/s, burst 1, shared by all its proxies), its
//! token reserved when the send is scheduled. Updates that come while a send
//! is pending ride on it: its timer is not reset. When it fires, the
//! snapshot goes to the proxy's xDS stream.
//!
//! Every step is a fixed function of the instants updates reach the agent,
//! so [`Proxies::update`] works out each proxy's hand-off at once instead of
//! waiting on timers: per proxy it keeps when its pending send fires (8
//! bytes), per agent the limiter's next free token. No task, no timer and no
//! subscription of its own. Times are tokio's ([`Instant`]), so the model
//! runs on paused time in tests.
//!
//! What it is not: the xDS stream itself (Envoy's ACK and applying the
//! config are not timed), nor proxycfg's other watches (leaf certificate,
//! roots, intentions of the proxy's own service): every proxy takes every
//! update of every subscription of its agent. A send that finds the last
//! snapshot not yet taken by the stream (Consul schedules it again) does
//! not happen here: the stream is taken to keep up.
//!
//! [`ProxyConfig`] is the typed setting and its rules. A leaf: it imports
//! only [`crate::modes`].

use std::time::Duration;

use agent_sim_fleet::Rate;
use tokio::time::Instant;

use crate::modes::{AgentWire, WatchMode};

/// proxycfg's `coalesceTimeout`: the least time between an update and the
/// send it starts.
pub const COALESCE: Duration = Duration::from_millis(200);
/// Consul's default `xds.update_max_per_second`.
pub const UPDATE_RATE: f64 = 250.0;
/// Most proxies behind one agent.
pub const MAX_PER_AGENT: u32 = 10_000;
/// Longest coalescing window taken.
pub const MAX_COALESCE: Duration = Duration::from_secs(10);
/// Highest update rate taken (per second, per agent).
pub const MAX_UPDATE_RATE: f64 = 1_000_000.0;
/// `ProbeSummary::fleet` of the probe entries timed at the proxies.
pub const FLEET: &str = "proxy";

/// The proxies behind every agent of a fleet.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProxyConfig {
    /// Proxies per agent (0: none), each watching all of the agent's
    /// upstreams.
    pub per_agent: u32,
    /// proxycfg's coalescing window.
    pub coalesce: Duration,
    /// The agent's update limiter (`xds.update_max_per_second`, burst 1),
    /// shared by its proxies.
    pub update_rate: Rate,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            per_agent: 0,
            coalesce: COALESCE,
            update_rate: Rate::per_second(UPDATE_RATE),
        }
    }
}

/// Why a [`ProxyConfig`] is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProxyConfigError {
    /// More proxies per agent than [`MAX_PER_AGENT`].
    #[error("{0}: at most {MAX_PER_AGENT} per agent")]
    TooMany(u32),
    /// A coalescing window over [`MAX_COALESCE`].
    #[error("{0:?}: at most 10s (Consul's is 200ms)")]
    Coalesce(Duration),
    /// An update rate over [`MAX_UPDATE_RATE`].
    #[error("{0}: at most 1000000/s (Consul's default is 250/s)")]
    Rate(Rate),
    /// Proxies on the HTTP API wire, which is no client agent.
    #[error(
        "proxies run behind a client agent (its proxycfg), not behind an HTTP API client: \
         not with --consul-agent api"
    )]
    ApiWire,
    /// Proxies fed by HTTP long polls, which no proxycfg makes.
    #[error(
        "proxies take the agent's own watches (--watch streaming or blocking), not the long \
         polls of an HTTP API client (--watch http)"
    )]
    HttpWatch,
    /// A probe timeout no proxy delivery can beat.
    #[error(
        "the probe's timeout {timeout:?} is within the proxies' coalescing window \
         {coalesce:?}: no delivery at a proxy could count (raise --probe-timeout)"
    )]
    ProbeTimeout {
        /// The probe timeout in force.
        timeout: Duration,
        /// The coalescing window.
        coalesce: Duration,
    },
}

impl ProxyConfigError {
    /// The setting refused, spelled so that it names its flag
    /// (`proxies.per_agent` is `--proxies-per-agent`).
    pub fn field(&self) -> &'static str {
        use ProxyConfigError as E;
        match self {
            E::TooMany(_) | E::ApiWire | E::HttpWatch => "proxies.per_agent",
            E::Coalesce(_) | E::ProbeTimeout { .. } => "proxy.coalesce",
            E::Rate(_) => "proxy.update_rate",
        }
    }
}

impl ProxyConfig {
    /// Whether agents have proxies.
    pub fn is_on(&self) -> bool {
        self.per_agent > 0
    }

    /// The rules, given the agents' wire and watch mode and the probe's
    /// timeout (`None`: no probe timed at the proxies).
    pub fn check(
        &self,
        wire: AgentWire,
        watch: WatchMode,
        probe_timeout: Option<Duration>,
    ) -> Result<(), ProxyConfigError> {
        if self.per_agent > MAX_PER_AGENT {
            return Err(ProxyConfigError::TooMany(self.per_agent));
        }
        if self.coalesce > MAX_COALESCE {
            return Err(ProxyConfigError::Coalesce(self.coalesce));
        }
        let rate = self.update_rate.as_per_second();
        if !(rate.is_finite() && rate > 0.0 && rate <= MAX_UPDATE_RATE) {
            return Err(ProxyConfigError::Rate(self.update_rate));
        }
        if !self.is_on() {
            return Ok(());
        }
        // Long polls first: they make the HTTP API wire the default.
        if watch == WatchMode::Http {
            return Err(ProxyConfigError::HttpWatch);
        }
        if wire == AgentWire::Api {
            return Err(ProxyConfigError::ApiWire);
        }
        match probe_timeout {
            Some(timeout) if timeout <= self.coalesce => Err(ProxyConfigError::ProbeTimeout {
                timeout,
                coalesce: self.coalesce,
            }),
            _ => Ok(()),
        }
    }

    /// Nanoseconds between two tokens of the limiter (at least 1).
    fn interval_ns(&self) -> u64 {
        ((1e9 / self.update_rate.as_per_second()).round() as u64).max(1)
    }
}

/// The proxies behind one agent: when each one's pending send fires, and
/// the agent's update limiter (see the module docs).
#[derive(Debug)]
pub struct Proxies {
    /// The zero of the times below.
    epoch: Instant,
    /// Nanoseconds after `epoch` from which the limiter has a token again.
    next_token: u64,
    /// Per proxy: nanoseconds after `epoch` at which its last send fires;
    /// one not later than an update's time has no send pending then.
    fire: Box<[u64]>,
}

impl Proxies {
    /// `count` proxies with no send pending, times counted from `epoch`
    /// (updates before it count as at it).
    pub fn new(count: u32, epoch: Instant) -> Self {
        Proxies {
            epoch,
            next_token: 0,
            fire: vec![0; count as usize].into_boxed_slice(),
        }
    }

    /// Proxies.
    pub fn len(&self) -> usize {
        self.fire.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.fire.is_empty()
    }

    /// An update of the agent's watches reached it at `at`: a proxy with a
    /// send pending takes the update into it; any other reserves the
    /// limiter's next token and schedules a send after the longer of the
    /// coalescing window and the token's delay. Calls `handed` with the
    /// instant each proxy's xDS stream gets the update, in proxy order;
    /// returns how many sends were scheduled.
    pub fn update(
        &mut self,
        at: Instant,
        cfg: &ProxyConfig,
        mut handed: impl FnMut(Instant),
    ) -> u64 {
        let now = nanos(at.saturating_duration_since(self.epoch));
        let coalesce = nanos(cfg.coalesce);
        let interval = cfg.interval_ns();
        let mut scheduled = 0;
        for fire in self.fire.iter_mut() {
            if *fire <= now {
                // rate.Limiter.Reserve with burst 1: the token is free
                // from `next_token`; the next one an interval later.
                let token = self.next_token.max(now);
                self.next_token = token.saturating_add(interval);
                *fire = now.saturating_add(coalesce).max(token);
                scheduled += 1;
            }
            handed(self.epoch + Duration::from_nanos(*fire));
        }
        scheduled
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn handoffs(p: &mut Proxies, at: Instant, cfg: &ProxyConfig) -> (Vec<Instant>, u64) {
        let mut out = Vec::new();
        let n = p.update(at, cfg, |w| out.push(w));
        (out, n)
    }

    #[tokio::test(start_paused = true)]
    async fn one_update_reaches_each_proxy_after_the_coalescing_window() {
        let cfg = ProxyConfig {
            per_agent: 3,
            ..ProxyConfig::default()
        };
        let t = Instant::now();
        let mut p = Proxies::new(3, t);
        assert_eq!(p.len(), 3);
        tokio::time::advance(7 * MS).await;
        let at = Instant::now();
        let (got, sends) = handoffs(&mut p, at, &cfg);
        assert_eq!(sends, 3);
        // Tokens at +0, +4, +8 ms: all within the 200 ms window.
        assert_eq!(got, vec![at + 200 * MS; 3]);
    }

    #[tokio::test(start_paused = true)]
    async fn updates_within_the_window_ride_on_its_send_and_do_not_reset_it() {
        let cfg = ProxyConfig {
            per_agent: 2,
            ..ProxyConfig::default()
        };
        let t0 = Instant::now();
        let mut p = Proxies::new(2, t0);
        let mut sends = 0;
        let mut last = Vec::new();
        for _ in 0..5 {
            let (got, n) = handoffs(&mut p, Instant::now(), &cfg);
            sends += n;
            last = got;
            tokio::time::advance(40 * MS).await;
        }
        // Five updates over 160 ms: one send per proxy, at the first
        // update's +200 ms.
        assert_eq!(sends, 2);
        assert_eq!(last, vec![t0 + 200 * MS; 2]);
        // At the instant it fires, the send is gone: a new window starts.
        let at = t0 + 200 * MS;
        let (got, n) = handoffs(&mut p, at, &cfg);
        assert_eq!(n, 2);
        assert_eq!(got, vec![at + 200 * MS; 2]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_thousand_proxies_share_the_agents_limiter() {
        let cfg = ProxyConfig {
            per_agent: 1_000,
            ..ProxyConfig::default()
        };
        let at = Instant::now();
        let mut p = Proxies::new(1_000, at);
        let (got, n) = handoffs(&mut p, at, &cfg);
        assert_eq!(n, 1_000);
        // 250/s: one token every 4 ms; the first 51 proxies are within the
        // window, the last gets its token 999 × 4 ms after the update.
        assert_eq!(got[0], at + 200 * MS);
        assert_eq!(got[50], at + 200 * MS);
        assert_eq!(got[51], at + 204 * MS);
        assert_eq!(got[999], at + 3_996 * MS);
        assert!(got.windows(2).all(|w| w[0] <= w[1]));
        // An update one second later: the proxies whose send has fired
        // queue behind the tokens already reserved; the rest ride.
        let later = at + 1_000 * MS;
        let (got, n) = handoffs(&mut p, later, &cfg);
        assert_eq!(n, 251, "proxies 0..=250 had fired by then");
        assert_eq!(got[0], at + 4_000 * MS, "next token after the last one");
        assert_eq!(got[250], at + 5_000 * MS);
        assert_eq!(got[251], at + 1_004 * MS, "pending: rides its send");
        assert_eq!(got[999], at + 3_996 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_limiter_has_one_token_only() {
        // Burst 1: after a long idle time two sends still go 4 ms apart.
        let cfg = ProxyConfig {
            per_agent: 1,
            coalesce: Duration::ZERO,
            ..ProxyConfig::default()
        };
        let t = Instant::now();
        let mut a = Proxies::new(1, t);
        let (got, _) = handoffs(&mut a, t + 60_000 * MS, &cfg);
        assert_eq!(got, vec![t + 60_000 * MS]);
        let mut b = Proxies::new(2, t);
        let (got, _) = handoffs(&mut b, t + 60_000 * MS, &cfg);
        assert_eq!(got, vec![t + 60_000 * MS, t + 60_004 * MS]);
        // An update stamped before the model's zero counts as at it.
        let mut c = Proxies::new(1, t + MS);
        let (got, _) = handoffs(&mut c, t, &cfg);
        assert_eq!(got, vec![t + MS]);
    }

    #[test]
    fn rules() {
        let on = ProxyConfig {
            per_agent: 18,
            ..ProxyConfig::default()
        };
        let ok = |c: &ProxyConfig| c.check(AgentWire::Client, WatchMode::Streaming, None);
        assert_eq!(ok(&on), Ok(()));
        assert_eq!(
            on.check(AgentWire::Client, WatchMode::Blocking, Some(COALESCE * 2)),
            Ok(())
        );
        assert_eq!(
            on.check(AgentWire::Api, WatchMode::Streaming, None),
            Err(ProxyConfigError::ApiWire)
        );
        assert_eq!(
            on.check(AgentWire::Client, WatchMode::Http, None),
            Err(ProxyConfigError::HttpWatch)
        );
        let e = on
            .check(AgentWire::Client, WatchMode::Streaming, Some(COALESCE))
            .unwrap_err();
        assert_eq!(e.field(), "proxy.coalesce");
        // Off: the wire and watch do not matter.
        let off = ProxyConfig::default();
        assert_eq!(off.check(AgentWire::Api, WatchMode::Http, Some(MS)), Ok(()));
        let many = ProxyConfig {
            per_agent: MAX_PER_AGENT + 1,
            ..on
        };
        assert_eq!(ok(&many).unwrap_err().field(), "proxies.per_agent");
        let slow = ProxyConfig {
            coalesce: Duration::from_secs(11),
            ..on
        };
        assert!(matches!(ok(&slow), Err(ProxyConfigError::Coalesce(_))));
        let fast = ProxyConfig {
            update_rate: Rate::per_second(2e6),
            ..on
        };
        assert_eq!(ok(&fast).unwrap_err().field(), "proxy.update_rate");
        assert_eq!(on.interval_ns(), 4_000_000);
    }
}
