//! The settings of a run's simulated Vault servers ([`VaultConfig`],
//! [`Burst`]) and their checks: a leaf that [`crate::config`] holds and
//! [`crate::vault`] runs (docs/writes.md#vaults-storage).

use std::time::Duration;

use crate::ConsulError;

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

impl std::str::FromStr for Burst {
    type Err = String;
    /// `at=T,tokens=N` (both required).
    fn from_str(s: &str) -> Result<Self, String> {
        use agent_sim_fleet::scenario::{duration_of, pairs};
        let (mut at, mut tokens) = (None, None);
        for (k, v) in pairs(s, &["at", "tokens"])? {
            match k {
                "at" => at = Some(duration_of(k, v)?),
                _ => {
                    let n: u32 = v
                        .parse()
                        .map_err(|_| format!("tokens={v}: not a whole number"))?;
                    if n == 0 || n > VaultConfig::MAX_BURST {
                        return Err(format!(
                            "tokens={v}: give 1 to {} token creates",
                            VaultConfig::MAX_BURST
                        ));
                    }
                    tokens = Some(n);
                }
            }
        }
        match (at, tokens) {
            (Some(at), Some(tokens)) => Ok(Burst { at, tokens }),
            _ => Err(format!(
                "{s:?}: expected at=T,tokens=N (e.g. at=30s,tokens=5000)"
            )),
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

fn invalid(field: &'static str, reason: impl Into<String>) -> ConsulError {
    ConsulError::Invalid {
        field,
        reason: reason.into(),
    }
}

impl VaultConfig {
    /// Most token creates in one burst.
    pub const MAX_BURST: u32 = 1_000_000;

    /// Checks every setting; `prefix` is the run's name prefix.
    pub fn validate(&self, prefix: &str) -> Result<(), ConsulError> {
        if !(1..=16).contains(&self.nodes) {
            return Err(invalid(
                "vault.nodes",
                format!("{} Vault servers: give 1 to 16", self.nodes),
            ));
        }
        if !self.tokens_per_s.is_finite() || !(0.0..=100_000.0).contains(&self.tokens_per_s) {
            return Err(invalid(
                "vault.tokens",
                "a rate from 0 to 100000 tokens per second",
            ));
        }
        if self.token_ttl < Duration::from_secs(1) || self.token_ttl > Duration::from_secs(86_400) {
            return Err(invalid("vault.token_ttl", "from 1s to 24h"));
        }
        for b in &self.bursts {
            if b.tokens == 0 || b.tokens > Self::MAX_BURST {
                return Err(invalid(
                    "vault.burst",
                    format!(
                        "tokens={}: give 1 to {} token creates",
                        b.tokens,
                        Self::MAX_BURST
                    ),
                ));
            }
        }
        if !(1..=4096).contains(&self.max_parallel) {
            return Err(invalid("vault.max_parallel", "from 1 to 4096"));
        }
        if self.session_ttl < Duration::from_secs(10)
            || self.session_ttl > Duration::from_secs(86_400)
        {
            return Err(invalid(
                "vault.session_ttl",
                "Consul accepts session TTLs from 10s to 24h",
            ));
        }
        if self.lock_wait < Duration::from_secs(1) || self.lock_wait > Duration::from_secs(600) {
            return Err(invalid("vault.lock_wait", "from 1s to 10m"));
        }
        if self.read_back_every == 0 {
            return Err(invalid("vault.read_back_every", "at least 1"));
        }
        if self.check_every < Duration::from_millis(100) {
            return Err(invalid("vault.check_every", "at least 100ms"));
        }
        let path = self.path_for(prefix);
        if path.len() > 200
            || !path
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "/-_.".contains(c))
            || path.contains("//")
        {
            return Err(invalid(
                "vault.path",
                format!("{path:?}: letters, digits, '/', '-', '_', '.' (no '//'), at most 200"),
            ));
        }
        if !path.starts_with(&format!("{prefix}/")) {
            return Err(invalid(
                "vault.path",
                format!(
                    "{path:?}: the run removes everything under its Vault path at the end, so \
                     the path must be the run's own, under its name prefix ({prefix}/...)"
                ),
            ));
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
        let e = |c: VaultConfig| c.validate("p").unwrap_err().to_string();
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
