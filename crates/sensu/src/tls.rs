//! TLS client setup for `wss://` targets: one rustls `ClientConfig` (ring
//! provider) built per factory and shared by every session.
//!
//! Roots come from `--ca-file` (PEM), else from the system bundle file
//! (no roots crate is bundled); `insecure_skip_tls_verify` installs a
//! verifier that accepts any certificate but still checks handshake
//! signatures.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use crate::SensuError;

/// System CA bundle locations tried when no CA file is given.
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

fn load_pem(path: &Path, roots: &mut RootCertStore) -> Result<usize, SensuError> {
    let data = std::fs::read(path)
        .map_err(|e| SensuError::Tls(format!("reading CA file {}: {e}", path.display())))?;
    let mut rd = &data[..];
    let mut added = 0;
    for cert in rustls_pemfile::certs(&mut rd) {
        let cert =
            cert.map_err(|e| SensuError::Tls(format!("parsing CA file {}: {e}", path.display())))?;
        if roots.add(cert).is_ok() {
            added += 1;
        }
    }
    Ok(added)
}

/// Builds the shared client config.
pub(crate) fn client_config(
    ca_file: Option<&Path>,
    insecure: bool,
) -> Result<Arc<ClientConfig>, SensuError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| SensuError::Tls(e.to_string()))?;
    let mut config = if insecure {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyCert { provider }))
            .with_no_client_auth()
    } else {
        let mut roots = RootCertStore::empty();
        match ca_file {
            Some(p) => {
                if load_pem(p, &mut roots)? == 0 {
                    return Err(SensuError::Tls(format!(
                        "CA file {} holds no certificate",
                        p.display()
                    )));
                }
            }
            None => {
                let found = SYSTEM_BUNDLES
                    .iter()
                    .map(Path::new)
                    .filter(|p| p.exists())
                    .any(|p| load_pem(p, &mut roots).map(|n| n > 0).unwrap_or(false));
                if !found {
                    return Err(SensuError::Tls(
                        "wss:// target without --ca-file and no system CA bundle found \
                         (use --ca-file or --insecure-skip-tls-verify)"
                            .into(),
                    ));
                }
            }
        }
        builder.with_root_certificates(roots).with_no_client_auth()
    };
    // Session resumption state is per-config, not per-connection; keep the
    // default cache (it bounds itself).
    config.alpn_protocols.clear();
    Ok(Arc::new(config))
}

/// Accepts any server certificate (`--insecure-skip-tls-verify`).
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
        assert!(client_config(Some(Path::new("/nonexistent.pem")), false).is_err());
        let dir = std::env::temp_dir().join(format!("agent-sim-sensu-tls-{}", std::process::id()));
        std::fs::write(&dir, b"not a pem").unwrap();
        let r = client_config(Some(&dir), false);
        let _ = std::fs::remove_file(&dir);
        assert!(r.is_err());
        assert!(client_config(None, true).is_ok());
    }
}
