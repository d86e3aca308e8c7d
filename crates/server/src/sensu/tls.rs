//! TLS on the Sensu agent port (`wss://`): [`server_config`] (a certificate
//! and key, and optionally the CA that signs agents' client certificates),
//! the TLS handshake of one connection ([`accept`]) and the stream a session
//! runs on, plain or TLS ([`Conn`]), with the fault switch of its TCP
//! socket underneath either way.
//!
//! Client certificates are optional, as on a backend that takes both
//! passwords and certificates: an agent that presents none goes on to the
//! password check; one that presents a certificate the CA did not sign
//! fails the handshake (counted in `tls_handshake_errors` and
//! `rejected_client_cert`).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agent_sim_net::MaybeTls;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

use super::stats::{SensuTargetStats, inc};
use crate::faults::{FaultIo, Kill};
use crate::listen;

/// Why the Sensu port's TLS settings could not be built.
#[derive(Debug, thiserror::Error)]
pub enum SensuTlsError {
    /// The certificate or key (read as the Consul side reads them).
    #[error(transparent)]
    Files(#[from] agent_sim_net::TlsError),
    /// The agent CA file could not be read or is not PEM.
    #[error("agent CA file {}: {source}", path.display())]
    AgentCa {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        source: rustls::pki_types::pem::Error,
    },
    /// The agent CA file holds no certificate rustls can use.
    #[error("agent CA file {} holds no usable CA certificate", path.display())]
    NoAgentCa {
        /// The file.
        path: PathBuf,
    },
    /// rustls refused the client certificate verifier.
    #[error("agent certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    /// rustls refused the configuration.
    #[error(transparent)]
    Rustls(#[from] rustls::Error),
}

/// The TLS settings of the Sensu port: `cert_file` / `key_file` (PEM);
/// with `agent_ca`, client certificates are asked for and, when given,
/// must chain to it.
pub fn server_config(
    cert_file: &Path,
    key_file: &Path,
    agent_ca: Option<&Path>,
) -> Result<Arc<ServerConfig>, SensuTlsError> {
    let plain = agent_sim_net::server_config(cert_file, key_file, None)?;
    let Some(ca) = agent_ca else {
        return Ok(plain);
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider.clone())
            .allow_unauthenticated()
            .build()?;
    let cfg = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(plain.cert_resolver.clone());
    Ok(Arc::new(cfg))
}

/// The CA certificates of a PEM file (at least one usable).
fn roots(path: &Path) -> Result<RootCertStore, SensuTlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|source| SensuTlsError::AgentCa {
            path: path.to_owned(),
            source,
        })?;
    let mut roots = RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(SensuTlsError::NoAgentCa {
            path: path.to_owned(),
        });
    }
    Ok(roots)
}

/// How long a client gets for its TLS handshake: agentd's HTTP server
/// bounds it by its read and write timeouts (15 s each).
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(15);

/// The stream of one agent connection: plain, or TLS (boxed: rustls's
/// state is large, and most ports are plain).
pub(super) type Conn = MaybeTls<FaultIo, TlsStream<FaultIo>>;

/// What a session asks of its connection, plain or TLS.
pub(super) trait AgentConn {
    /// The TCP socket's fault switch underneath.
    fn fault_io(&self) -> &FaultIo;
    /// The same, to enlist it.
    fn fault_io_mut(&mut self) -> &mut FaultIo;
    /// The DER certificate the client presented (rustls verified it
    /// against the agent CA during the handshake).
    fn peer_certificate(&self) -> Option<&[u8]>;
}

impl AgentConn for Conn {
    fn fault_io(&self) -> &FaultIo {
        match self {
            MaybeTls::Plain(io) => io,
            MaybeTls::Tls(t) => t.get_ref().0,
        }
    }

    fn fault_io_mut(&mut self) -> &mut FaultIo {
        match self {
            MaybeTls::Plain(io) => io,
            MaybeTls::Tls(t) => t.get_mut().0,
        }
    }

    fn peer_certificate(&self) -> Option<&[u8]> {
        match self {
            MaybeTls::Plain(_) => None,
            MaybeTls::Tls(t) => t
                .get_ref()
                .1
                .peer_certificates()?
                .first()
                .map(|c| c.as_ref()),
        }
    }
}

/// The TLS handshake of `io` (bounded as every port's is); `None` when
/// it failed (counted, and the connection closed after the alert went out)
/// or at shutdown.
pub(super) async fn accept(
    io: FaultIo,
    cfg: Arc<ServerConfig>,
    stats: &SensuTargetStats,
    shutdown: &CancellationToken,
) -> Option<Conn> {
    match listen::tls_accept(io, cfg, TLS_HANDSHAKE_TIMEOUT, shutdown).await? {
        Ok(tls) => Some(MaybeTls::Tls(Box::new(tls))),
        Err((e, io)) => {
            inc(&stats.tls_handshake_errors);
            if refused_client_cert(&e) {
                inc(&stats.rejected_client_cert);
            }
            // Read what the client sent before closing, so that the close is
            // a FIN and the alert reaches it (a close with unread data would
            // be a reset that can discard the alert on its side).
            if let Some(io) = io {
                io.refuse(Kill::Drop).await;
            }
            None
        }
    }
}

/// Whether a failed handshake refused the client's certificate.
fn refused_client_cert(e: &io::Error) -> bool {
    matches!(
        e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()),
        Some(rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented)
    )
}
