//! The settings of a run's simulated Vault servers ([`VaultConfig`],
//! [`Burst`]) and their checks: a leaf that [`crate::config`] holds and
//! [`crate::vault`] runs (docs/writes.md#vaults-storage).

use std::time::Duration;

/// Vault's default `max_parallel` (the permit pool of its storage calls).
pub const MAX_PARALLEL: usize = 128;
/// Vault's and Consul's lock session TTL (`api.DefaultLockSessionTTL`).
pub const SESSION_TTL: Duration = Duration::from_secs(15);
/// How long one blocking read of the lock key waits (`DefaultLockWaitTime`).
pub const LOCK_WAIT: Duration = Duration::from_secs(15);
/// The session name of the run's Vault locks: Vault's `Vault Lock` with
/// the run's path, so `agent-sim cleanup` finds them.
pub fn session_name(path: &str) -> String {
    format!("Vault Lock {path}")
}

/// A token storm: `tokens` creates at once, `at` from the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Burst {
    /// When, from the start of the run.
    pub at: Duration,
    /// How many token creates.
    pub tokens: u32,
}

/// Why a Vault setting is refused, or a burst does not parse: one variant
/// per rule, its words without the field ([`VaultConfigError::field`]
/// names it).
#[derive(Debug, thiserror::Error)]
pub enum VaultConfigError {
    /// A burst that is not `key=value` pairs of `at` and `tokens` (the
    /// scenario parser's words).
    #[error("{0}")]
    BurstSyntax(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A burst's `tokens` that is not a whole number.
    #[error("tokens={given}: not a whole number")]
    BurstTokens {
        /// The value as written.
        given: String,
        /// Why it does not parse.
        source: std::num::ParseIntError,
    },
    /// A burst of 0 or more than [`VaultConfig::MAX_BURST`] token creates.
    #[error("tokens={0}: give 1 to {max} token creates", max = VaultConfig::MAX_BURST)]
    BurstSize(u32),
    /// A burst without `at` or without `tokens`.
    #[error("{0:?}: expected at=T,tokens=N (e.g. at=30s,tokens=5000)")]
    BurstShape(String),
    /// Not 1 to 16 Vault servers.
    #[error("{0} Vault servers: give 1 to 16")]
    Nodes(u32),
    /// A token rate out of 0 to 100000 per second.
    #[error("a rate from 0 to 100000 tokens per second")]
    TokenRate,
    /// A token TTL out of 1 s to 24 h.
    #[error("from 1s to 24h")]
    TokenTtl,
    /// `max_parallel` out of 1 to 4096.
    #[error("from 1 to 4096")]
    MaxParallel,
    /// A lock session TTL Consul refuses.
    #[error("Consul accepts session TTLs from 10s to 24h")]
    SessionTtl,
    /// A lock wait out of 1 s to 10 min.
    #[error("from 1s to 10m")]
    LockWait,
    /// `read_back_every` of 0.
    #[error("at least 1")]
    ReadBackEvery,
    /// A check interval under 100 ms.
    #[error("at least 100ms")]
    CheckEvery,
    /// A path with characters Vault's path does not take, or too long.
    #[error("{0:?}: letters, digits, '/', '-', '_', '.' (no '//'), at most 200")]
    PathChars(String),
    /// A path outside the run's own part of the KV store.
    #[error(
        "{path:?}: the run removes everything under its Vault path at the end, so the path \
         must be the run's own, under its name prefix ({prefix}/...)"
    )]
    PathNotOwn {
        /// The path in force.
        path: String,
        /// The run's name prefix.
        prefix: String,
    },
}

impl VaultConfigError {
    /// The [`VaultConfig`] setting refused (as the CLI names its flag).
    pub fn field(&self) -> &'static str {
        use VaultConfigError as E;
        match self {
            E::BurstSyntax(_) | E::BurstTokens { .. } | E::BurstSize(_) | E::BurstShape(_) => {
                "vault.burst"
            }
            E::Nodes(_) => "vault.nodes",
            E::TokenRate => "vault.tokens",
            E::TokenTtl => "vault.token_ttl",
            E::MaxParallel => "vault.max_parallel",
            E::SessionTtl => "vault.session_ttl",
            E::LockWait => "vault.lock_wait",
            E::ReadBackEvery => "vault.read_back_every",
            E::CheckEvery => "vault.check_every",
            E::PathChars(_) | E::PathNotOwn { .. } => "vault.path",
        }
    }
}

/// A scenario parser's refusal of a burst (its own error type, or text).
fn syntax(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> VaultConfigError {
    VaultConfigError::BurstSyntax(e.into())
}

impl std::str::FromStr for Burst {
    type Err = VaultConfigError;
    /// `at=T,tokens=N` (both required).
    fn from_str(s: &str) -> Result<Self, VaultConfigError> {
        use agent_sim_fleet::scenario::{duration_of, pairs};
        let (mut at, mut tokens) = (None, None);
        for (k, v) in pairs(s, &["at", "tokens"]).map_err(syntax)? {
            match k {
                "at" => at = Some(duration_of(k, v).map_err(syntax)?),
                _ => {
                    let n: u32 = v.parse().map_err(|source| VaultConfigError::BurstTokens {
                        given: v.to_owned(),
                        source,
                    })?;
                    if n == 0 || n > VaultConfig::MAX_BURST {
                        return Err(VaultConfigError::BurstSize(n));
                    }
                    tokens = Some(n);
                }
            }
        }
        match (at, tokens) {
            (Some(at), Some(tokens)) => Ok(Burst { at, tokens }),
            _ => Err(VaultConfigError::BurstShape(s.to_owned())),
        }
    }
}

impl std::fmt::Display for Burst {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = if self.at.subsec_millis() == 0 {
            format!("{}s", self.at.as_secs())
        } else {
            format!("{}ms", self.at.as_millis())
        };
        write!(f, "at={at},tokens={}", self.tokens)
    }
}

impl<'de> serde::Deserialize<'de> for Burst {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <String as serde::Deserialize>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The Vault servers of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct VaultConfig {
    /// Vault servers (one active, the others standby).
    pub nodes: u32,
    /// Steady token creates per second on the active node (0: none).
    pub tokens_per_s: f64,
    /// A token's life: renewed once at half of it (with `renew`),
    /// revoked at its end.
    pub token_ttl: Duration,
    /// Each token renewed once at half its TTL, as a client that keeps its
    /// token (Nomad's allocations) does; `false`: created and left to expire.
    pub renew: bool,
    /// Token storms.
    pub bursts: Vec<Burst>,
    /// Vault's `path` (ends in `/`, no leading `/`); empty: the run's
    /// `<name-prefix>/vault/`.
    pub path: String,
    /// Vault's `max_parallel`.
    pub max_parallel: usize,
    /// The lock session's TTL (Consul bounds it: 10 s to 24 h).
    pub session_ttl: Duration,
    /// One blocking read's wait on the lock key.
    pub lock_wait: Duration,
    /// One token create in this many is read back before its revoke.
    pub read_back_every: u32,
    /// How often the checker reads the lock key from the server.
    pub check_every: Duration,
    /// The active node steps down (releases the lock, stops) at this time,
    /// as a Vault server stopped for an upgrade: the handover is measured.
    pub stop_active_at: Option<Duration>,
    /// The active node dies at this time (no release, its session left to
    /// expire): the lock frees after the session's TTL and the server's
    /// lock-delay, and the handover shows both.
    pub kill_active_at: Option<Duration>,
}

impl Default for VaultConfig {
    fn default() -> Self {
        VaultConfig {
            nodes: 3,
            tokens_per_s: 0.0,
            token_ttl: Duration::from_secs(60),
            renew: true,
            bursts: Vec::new(),
            path: String::new(),
            max_parallel: MAX_PARALLEL,
            session_ttl: SESSION_TTL,
            lock_wait: LOCK_WAIT,
            read_back_every: 50,
            check_every: Duration::from_secs(1),
            stop_active_at: None,
            kill_active_at: None,
        }
    }
}

impl VaultConfig {
    /// Most token creates in one burst.
    pub const MAX_BURST: u32 = 1_000_000;

    /// Checks every setting; `prefix` is the run's name prefix.
    pub fn validate(&self, prefix: &str) -> Result<(), VaultConfigError> {
        use VaultConfigError as E;
        let within = |d: Duration, lo: Duration, hi: Duration| (lo..=hi).contains(&d);
        let (second, day) = (Duration::from_secs(1), Duration::from_secs(86_400));
        if !(1..=16).contains(&self.nodes) {
            return Err(E::Nodes(self.nodes));
        }
        if !self.tokens_per_s.is_finite() || !(0.0..=100_000.0).contains(&self.tokens_per_s) {
            return Err(E::TokenRate);
        }
        if !within(self.token_ttl, second, day) {
            return Err(E::TokenTtl);
        }
        if let Some(b) = self
            .bursts
            .iter()
            .find(|b| b.tokens == 0 || b.tokens > Self::MAX_BURST)
        {
            return Err(E::BurstSize(b.tokens));
        }
        if !(1..=4096).contains(&self.max_parallel) {
            return Err(E::MaxParallel);
        }
        if !within(self.session_ttl, Duration::from_secs(10), day) {
            return Err(E::SessionTtl);
        }
        if !within(self.lock_wait, second, Duration::from_secs(600)) {
            return Err(E::LockWait);
        }
        if self.read_back_every == 0 {
            return Err(E::ReadBackEvery);
        }
        if self.check_every < Duration::from_millis(100) {
            return Err(E::CheckEvery);
        }
        let path = self.path_for(prefix);
        if path.len() > 200
            || !path
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "/-_.".contains(c))
            || path.contains("//")
        {
            return Err(E::PathChars(path));
        }
        if !path.starts_with(&format!("{prefix}/")) {
            return Err(E::PathNotOwn {
                path,
                prefix: prefix.to_owned(),
            });
        }
        Ok(())
    }

    /// Vault's `path` for a run with `prefix`: as given (a trailing `/`
    /// added, a leading one removed, as Vault does) or `<prefix>/vault/`.
    pub fn path_for(&self, prefix: &str) -> String {
        default_path(&self.path, prefix)
    }
}

/// Vault's `path` as given, or `<prefix>/vault/`, normalised as Vault does.
pub fn default_path(path: &str, prefix: &str) -> String {
    let mut p = if path.is_empty() {
        format!("{prefix}/vault/")
    } else {
        path.trim_start_matches('/').to_owned()
    };
    if !p.ends_with('/') {
        p.push('/');
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_parses_and_prints_back() {
        let b: Burst = "at=30s,tokens=5000".parse().unwrap();
        assert_eq!(
            b,
            Burst {
                at: Duration::from_secs(30),
                tokens: 5000
            }
        );
        assert_eq!(b.to_string(), "at=30s,tokens=5000");
        assert!(
            "at=30s"
                .parse::<Burst>()
                .unwrap_err()
                .to_string()
                .contains("at=T,tokens=N")
        );
        assert!("at=1s,tokens=0".parse::<Burst>().is_err());
        assert!("at=1s,tokens=x".parse::<Burst>().is_err());
        assert!("at=1s,tokens=5,drop=3".parse::<Burst>().is_err());
    }

    #[test]
    fn the_path_is_normalised_as_vault_does() {
        assert_eq!(default_path("", "run1"), "run1/vault/");
        assert_eq!(default_path("/x/y", "run1"), "x/y/");
        assert_eq!(default_path("x/", "run1"), "x/");
    }

    #[test]
    fn bad_settings_are_refused_with_the_field() {
        let ok = VaultConfig::default();
        ok.validate("p").unwrap();
        let e = |c: VaultConfig| {
            let e = c.validate("p").unwrap_err();
            format!("{}: {e}", e.field())
        };
        assert!(
            e(VaultConfig {
                nodes: 0,
                ..ok.clone()
            })
            .starts_with("vault.nodes:")
        );
        assert!(
            e(VaultConfig {
                session_ttl: Duration::from_secs(5),
                ..ok.clone()
            })
            .contains("10s to 24h")
        );
        assert!(
            e(VaultConfig {
                bursts: vec![Burst {
                    at: Duration::ZERO,
                    tokens: 0
                }],
                ..ok.clone()
            })
            .starts_with("vault.burst:")
        );
        assert!(
            e(VaultConfig {
                path: "p/a b".into(),
                ..ok.clone()
            })
            .starts_with("vault.path:")
        );
        assert!(
            e(VaultConfig {
                path: "vault/".into(),
                ..ok.clone()
            })
            .contains("under its name prefix")
        );
        VaultConfig {
            path: "p/v2".into(),
            ..ok.clone()
        }
        .validate("p")
        .unwrap();
        assert!(
            e(VaultConfig {
                tokens_per_s: f64::NAN,
                ..ok
            })
            .starts_with("vault.tokens:")
        );
    }
}
