//! Who an agent is: a verified client certificate (its CN), or the
//! `Authorization: Basic` credentials checked the way a Sensu backend does.
//!
//! - [`Passwords`]: the agent user and its password, compared as plain text
//!   (the default, free) or, with a bcrypt cost, hashed once at start and
//!   checked with bcrypt on every connect, as sensu-go 6.12's
//!   `AuthenticateUser` does (cost 10 there: ~50-80 ms of CPU a connect).
//!   An unknown user is refused without a bcrypt check, as there. Checks
//!   run on the blocking pool, at most one per core at once, so they cost
//!   CPU like the real thing without stalling the sessions' threads; each
//!   is counted with the CPU time of its thread.
//! - [`common_name`]: the CN of a client certificate rustls has verified.
//!
//! What it is not: no user store, no RBAC, no certificate revocation.

use std::io;
use std::ops::RangeInclusive;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use super::stats::{SensuTargetStats, inc};

/// The bcrypt costs `--sensu-password-cost` takes (sensu-go hashes at 10).
pub const PASSWORD_COSTS: RangeInclusive<u32> = 4..=14;

/// The agent user and how its password is checked.
pub(super) struct Passwords {
    user: String,
    check: Check,
}

enum Check {
    /// Compared as text.
    Plain(String),
    /// A bcrypt hash, and the permits of the checks running at once.
    Bcrypt {
        hash: Arc<str>,
        slots: Arc<Semaphore>,
    },
}

impl Passwords {
    /// The plain check of `password`, or with `cost` a bcrypt hash of it
    /// (made on the blocking pool: at cost 14 it takes about a second).
    /// Errors: a cost outside [`PASSWORD_COSTS`] (`InvalidInput`).
    pub(super) async fn new(user: String, password: String, cost: Option<u32>) -> io::Result<Self> {
        let Some(cost) = cost else {
            return Ok(Passwords {
                user,
                check: Check::Plain(password),
            });
        };
        if !PASSWORD_COSTS.contains(&cost) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "password cost {cost}: must be {}..={}",
                    PASSWORD_COSTS.start(),
                    PASSWORD_COSTS.end()
                ),
            ));
        }
        let hash = tokio::task::spawn_blocking(move || bcrypt::hash(password, cost))
            .await
            .map_err(io::Error::other)?
            .map_err(io::Error::other)?;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(Passwords {
            user,
            check: Check::Bcrypt {
                hash: hash.into(),
                slots: Arc::new(Semaphore::new(cores)),
            },
        })
    }

    /// Whether `user` / `password` are the agent's credentials. A bcrypt
    /// check waits for a free core, then is counted (`bcrypt_checks`,
    /// `bcrypt_cpu_us`) whatever its answer.
    pub(super) async fn check(&self, user: &str, password: &str, stats: &SensuTargetStats) -> bool {
        if user != self.user {
            return false;
        }
        let (hash, slots) = match &self.check {
            Check::Plain(p) => return p == password,
            Check::Bcrypt { hash, slots } => (hash.clone(), slots.clone()),
        };
        let Ok(permit) = slots.acquire_owned().await else {
            return false;
        };
        let password = password.to_owned();
        // The permit goes with the check: a connection that leaves while
        // it runs does not let another one start before it ends.
        let done = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let clock = ThreadClock::start();
            let ok = bcrypt::verify(password, &hash).unwrap_or(false);
            (ok, clock.elapsed())
        })
        .await;
        let Ok((ok, spent)) = done else {
            return false;
        };
        inc(&stats.bcrypt_checks);
        let us = u64::try_from(spent.as_micros()).unwrap_or(u64::MAX);
        stats.bcrypt_cpu_us.fetch_add(us, Ordering::Relaxed);
        ok
    }
}

/// The CPU time of the calling thread since [`ThreadClock::start`] (its wall
/// time where the platform has no per-thread clock).
struct ThreadClock {
    cpu: Option<Duration>,
    wall: Instant,
}

impl ThreadClock {
    fn start() -> Self {
        ThreadClock {
            cpu: thread_cpu(),
            wall: Instant::now(),
        }
    }

    fn elapsed(&self) -> Duration {
        match (self.cpu, thread_cpu()) {
            (Some(a), Some(b)) => b.saturating_sub(a),
            _ => self.wall.elapsed(),
        }
    }
}

/// CPU time of the calling thread (`CLOCK_THREAD_CPUTIME_ID`).
#[cfg(unix)]
#[allow(unsafe_code)]
fn thread_cpu() -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return None;
    }
    Some(Duration::new(
        u64::try_from(ts.tv_sec).ok()?,
        u32::try_from(ts.tv_nsec).ok()?,
    ))
}

#[cfg(not(unix))]
fn thread_cpu() -> Option<Duration> {
    None
}

/// The first CN of the subject of a DER certificate (one rustls has
/// already verified), if it has one that is text.
pub(super) fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn plain_passwords_compare_and_bcrypt_ones_are_counted_with_their_cpu() {
        let stats = SensuTargetStats::default();
        let plain = Passwords::new("agent".into(), "pw".into(), None)
            .await
            .unwrap();
        assert!(plain.check("agent", "pw", &stats).await);
        assert!(!plain.check("agent", "nope", &stats).await);
        assert_eq!(stats.bcrypt_checks.load(Ordering::Relaxed), 0);

        let hashed = Passwords::new("agent".into(), "pw".into(), Some(4))
            .await
            .unwrap();
        assert!(hashed.check("agent", "pw", &stats).await);
        assert!(!hashed.check("agent", "nope", &stats).await);
        // An unknown user costs no check, as on the real backend.
        assert!(!hashed.check("other", "pw", &stats).await);
        assert_eq!(stats.bcrypt_checks.load(Ordering::Relaxed), 2);
        assert!(stats.bcrypt_cpu_us.load(Ordering::Relaxed) > 0);
    }

    #[tokio::test]
    async fn costs_outside_the_range_are_refused() {
        for cost in [3, 15] {
            let e = Passwords::new("a".into(), "b".into(), Some(cost))
                .await
                .err()
                .expect("refused");
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
            assert!(e.to_string().contains("4..=14"), "{e}");
        }
    }

    #[test]
    fn the_common_name_is_read_from_the_subject() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["x".to_owned()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "agent-7");
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(common_name(cert.der()), Some("agent-7".to_owned()));
        assert_eq!(common_name(b"not a certificate"), None);
    }
}
