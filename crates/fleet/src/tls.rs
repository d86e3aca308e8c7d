//! TLS client setup shared by the protocol crates: one rustls
//! [`ClientConfig`] (ring provider, no client certificate), built once per
//! factory and shared by every session.
//!
//! Roots come from the given CA file (PEM), else from the system bundle file
//! (no roots crate is bundled). A certificate in a PEM file that webpki
//! rejects is skipped; a file that yields no usable certificate is an error.
//! `insecure_skip_verify` installs a verifier that accepts any certificate
//! but still checks handshake signatures.
//!
//! What it is not: no socket handling (see [`crate::net::MaybeTlsStream`]),
//! no knowledge of CLI flag names (callers phrase their own hints).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

/// System CA bundle locations tried when no CA file is given.
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// Why a TLS client config could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The CA file could not be read.
    #[error("reading CA file {}: {source}", path.display())]
    ReadCa {
        /// The CA file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The CA file is not valid PEM.
    #[error("parsing CA file {}: {source}", path.display())]
    ParseCa {
        /// The CA file.
        path: PathBuf,
        /// The PEM error.
        source: std::io::Error,
    },
    /// The CA file holds no usable certificate.
    #[error("CA file {} holds no certificate", path.display())]
    NoCertificate {
        /// The CA file.
        path: PathBuf,
    },
    /// No CA file was given and no system CA bundle was found.
    #[error("no CA file given and no system CA bundle found")]
    NoSystemRoots,
    /// rustls refused the configuration.
    #[error("{0}")]
    Rustls(#[from] rustls::Error),
}

/// Adds the certificates of a PEM file to `roots`; returns how many were added.
fn load_pem(path: &Path, roots: &mut RootCertStore) -> Result<usize, TlsError> {
    let data = std::fs::read(path).map_err(|source| TlsError::ReadCa {
        path: path.to_owned(),
        source,
    })?;
    let mut added = 0;
    for cert in rustls_pemfile::certs(&mut data.as_slice()) {
        let cert = cert.map_err(|source| TlsError::ParseCa {
            path: path.to_owned(),
            source,
        })?;
        if roots.add(cert).is_ok() {
            added += 1;
        }
    }
    Ok(added)
}

/// Builds a shared client config.
///
/// - `insecure_skip_verify`: accept any server certificate (signatures are
///   still checked); `ca_file` is then ignored.
/// - otherwise roots come from `ca_file`, or when it is `None` from the first
///   system CA bundle that yields a certificate.
/// - `alpn`: protocols to offer, most preferred first (`&[]` for none).
pub fn client_config(
    ca_file: Option<&Path>,
    insecure_skip_verify: bool,
    alpn: &[&[u8]],
) -> Result<Arc<ClientConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let mut config = if insecure_skip_verify {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyCert { provider }))
            .with_no_client_auth()
    } else {
        let mut roots = RootCertStore::empty();
        match ca_file {
            Some(path) => {
                if load_pem(path, &mut roots)? == 0 {
                    return Err(TlsError::NoCertificate {
                        path: path.to_owned(),
                    });
                }
            }
            None => {
                let found = SYSTEM_BUNDLES
                    .iter()
                    .map(Path::new)
                    .filter(|p| p.exists())
                    .any(|p| load_pem(p, &mut roots).map(|n| n > 0).unwrap_or(false));
                if !found {
                    return Err(TlsError::NoSystemRoots);
                }
            }
        }
        builder.with_root_certificates(roots).with_no_client_auth()
    };
    // Session resumption state is per-config, not per-connection; keep the
    // default cache (it bounds itself).
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// Accepts any server certificate (`insecure_skip_verify`).
#[derive(Debug)]
struct AcceptAnyCert {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for AcceptAnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_file_errors_are_reported() {
        assert!(matches!(
            client_config(Some(Path::new("/nonexistent.pem")), false, &[]),
            Err(TlsError::ReadCa { .. })
        ));
        let path = std::env::temp_dir().join(format!("agent-sim-fleet-tls-{}", std::process::id()));
        std::fs::write(&path, b"not a pem").unwrap();
        let r = client_config(Some(&path), false, &[]);
        let _ = std::fs::remove_file(&path);
        assert!(matches!(r, Err(TlsError::NoCertificate { .. })));
    }

    #[test]
    fn insecure_ignores_roots_and_sets_alpn() {
        let cfg = client_config(Some(Path::new("/nonexistent.pem")), true, &[b"h2"]).unwrap();
        assert_eq!(cfg.alpn_protocols, vec![b"h2".to_vec()]);
        assert!(
            client_config(None, true, &[])
                .unwrap()
                .alpn_protocols
                .is_empty()
        );
    }
}
