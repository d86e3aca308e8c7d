//! Connect leaf certificates as a Consul 1.20 client agent keeps them for
//! its sidecars (`agent/leafcert`): a new key and CSR per certificate
//! ([`csr`]), and when to sign again ([`schedule`]): within the renewal
//! window of a certificate's life, after a root rotation within a random
//! 30 s, and on the servers' rate-limit answer by leafcert's back-off.
//!
//! With `auto_encrypt`, the agent's own certificate at boot: its CSR
//! ([`csr::new_agent_csr`]) and the wait between rounds of servers
//! ([`auto_encrypt`]).
//!
//! The calls themselves (`ConnectCA.Roots`, `ConnectCA.Sign`,
//! `AutoEncrypt.Sign`) are in [`crate::rpc::connect_ca`] and
//! [`crate::rpc::auto_encrypt`]; the agent's state and handlers in
//! `agent::connect` and `agent::auto_encrypt`. This module holds no socket
//! and no timer.

pub mod auto_encrypt;
pub mod csr;
pub mod schedule;

pub use csr::{
    Csr, CsrError, UNKNOWN_TRUST_DOMAIN, authority_key_id, new_agent_csr, new_csr, spiffe_agent_id,
    spiffe_service_id,
};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// Connect's settings of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectConfig {
    /// Agents with sidecars keep a leaf certificate (client wire only: a
    /// server's HTTP API has no endpoint that signs a client agent's CSR).
    pub leaf_certs: bool,
    /// When the run changes the CA's configuration to make a new root.
    pub rotate_at: Option<Duration>,
    /// A rotation against a target that is not the embedded backend was
    /// asked for on purpose (`--allow-ca-rotation`).
    pub allow_rotation: bool,
    /// Each client agent asks the servers for its own certificate at boot
    /// (`auto_encrypt { tls = true }`: `AutoEncrypt.Sign`) before anything
    /// else it sends (client wire only).
    pub auto_encrypt: bool,
}

impl Default for ConnectConfig {
    fn default() -> Self {
        ConnectConfig {
            leaf_certs: true,
            rotate_at: None,
            allow_rotation: false,
            auto_encrypt: false,
        }
    }
}

/// Why a CA rotation is refused: one variant per rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RotationError {
    /// No agent keeps a leaf certificate to time the rotation on.
    #[error(
        "--rotate-ca-at times the agents' leaf certificates: it needs --sidecars on the client \
         wire (--consul-agent client; the HTTP API cannot sign a client agent's CSR) and \
         --leaf-certs"
    )]
    NoLeafCerts,
    /// A real cluster's CA, without `--allow-ca-rotation`.
    #[error(
        "--rotate-ca-at changes the target's Connect CA (a new root, every leaf signed again): \
         refused against a real cluster without --allow-ca-rotation"
    )]
    RealCluster,
}

/// Why `auto_encrypt` is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AutoEncryptError {
    /// Agents on the HTTP API's wire have no boot to ask at.
    #[error(
        "--auto-encrypt is a client agent's boot step (AutoEncrypt.Sign on the server RPC \
         port): it needs --consul-agent client, not api"
    )]
    NotAClientAgent,
}

impl ConnectConfig {
    /// Whether `auto_encrypt` fits the agents' wire.
    pub fn check_auto_encrypt(
        &self,
        wire: crate::modes::AgentWire,
    ) -> Result<(), AutoEncryptError> {
        match (self.auto_encrypt, wire) {
            (true, crate::modes::AgentWire::Api) => Err(AutoEncryptError::NotAClientAgent),
            _ => Ok(()),
        }
    }

    /// Whether a rotation may run against the run's target (`embedded`:
    /// the reference backend this process serves): a shared cluster's CA
    /// is never changed by accident.
    pub fn check_rotation(
        &self,
        embedded: bool,
        wire: crate::modes::AgentWire,
        sidecars: bool,
    ) -> Result<(), RotationError> {
        let keeping = sidecars && self.leaf_certs && wire == crate::modes::AgentWire::Client;
        match self.rotate_at {
            Some(_) if !keeping => Err(RotationError::NoLeafCerts),
            Some(_) if !embedded && !self.allow_rotation => Err(RotationError::RealCluster),
            _ => Ok(()),
        }
    }
}

/// What the fleet's agents share about their certificates: the start the
/// boot time is measured from, the rotation in progress, and counts.
#[derive(Debug, Default)]
pub struct ConnectBoard {
    first_dial: OnceLock<Instant>,
    rotation: Mutex<Option<Instant>>,
    holding: AtomicU64,
    rotated: AtomicU64,
}

impl ConnectBoard {
    /// The run's first dial (the first call wins).
    pub fn dialing(&self, now: Instant) {
        let _ = self.first_dial.set(now);
    }

    /// The run's first dial.
    pub fn first_dial(&self) -> Option<Instant> {
        self.first_dial.get().copied()
    }

    /// Time from the first dial to `now`.
    pub fn since_first_dial(&self, now: Instant) -> Option<Duration> {
        self.first_dial
            .get()
            .map(|t| now.saturating_duration_since(*t))
    }

    /// The run changed the CA at `at`.
    pub fn rotation_started(&self, at: Instant) {
        *self.rotation.lock().unwrap_or_else(PoisonError::into_inner) = Some(at);
        self.rotated.store(0, Ordering::Relaxed);
    }

    /// When the run changed the CA, if it did.
    pub fn rotation(&self) -> Option<Instant> {
        *self.rotation.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An agent got its first certificate.
    pub fn holds(&self) {
        self.holding.fetch_add(1, Ordering::Relaxed);
    }

    /// An agent holds a certificate of the new root.
    pub fn rotated_one(&self) {
        self.rotated.fetch_add(1, Ordering::Relaxed);
    }

    /// Agents holding a certificate, and those of them holding one of the
    /// root the last rotation made.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.holding.load(Ordering::Relaxed),
            self.rotated.load(Ordering::Relaxed),
        )
    }
}
