//! TLS setup shared by the protocol crates and the embedded server (ring
//! provider everywhere).
//!
//! Client ([`client_config`], built once per factory and shared by every
//! session): roots from the given CA file (PEM), else from the platform's
//! trust store through `rustls-native-certs` (it reads the system bundle and
//! honours `SSL_CERT_FILE` / `SSL_CERT_DIR`, so a container with CA roots
//! just works); `insecure_skip_verify` installs a verifier that accepts any
//! certificate but still checks handshake signatures. An optional client
//! certificate (PEM chain + PEM key) is presented to servers that require
//! one (Consul's `verify_incoming`).
//!
//! Server ([`server_config`]): a certificate chain and key, and optionally a
//! CA that client certificates must chain to.
//!
//! What it is not: no socket handling (see [`crate::MaybeTlsStream`]), no
//! knowledge of CLI flag names (callers phrase their own hints).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

/// Why a TLS config could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read.
    #[error("reading {what} {}: {source}", path.display())]
    Read {
        /// What the file is (`CA file`, `certificate file`, `key file`).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A PEM file is not valid PEM.
    #[error("parsing {what} {}: {source}", path.display())]
    Parse {
        /// What the file is.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The PEM error.
        source: std::io::Error,
    },
    /// A certificate file holds no usable certificate.
    #[error("{what} {} holds no certificate", path.display())]
    NoCertificate {
        /// What the file is.
        what: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// A key file holds no private key.
    #[error("key file {} holds no private key", path.display())]
    NoKey {
        /// The file.
        path: PathBuf,
    },
    /// A client certificate without its key, or the other way round.
    #[error("a client certificate needs both a certificate file and a key file")]
    HalfClientCert,
    /// No CA file was given and the platform's trust store yielded nothing.
    #[error("no CA file given and no system CA certificates found")]
    NoSystemRoots,
    /// rustls refused the configuration (e.g. a key that does not match).
    #[error("{0}")]
    Rustls(#[from] rustls::Error),
    /// The client verifier could not be built.
    #[error("client certificate verifier: {0}")]
    Verifier(String),
}

/// TLS settings of a client.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTls {
    /// PEM file of the CA certificates to trust; `None`: the platform's.
    pub ca_file: Option<PathBuf>,
    /// Accept any server certificate (labs only); `ca_file` is ignored.
    pub insecure_skip_verify: bool,
    /// PEM certificate chain presented to the server.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    })
}

/// The certificates of a PEM file (at least one).
fn certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let data = read(what, path)?;
    let certs = rustls_pemfile::certs(&mut data.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Parse {
            what,
            path: path.to_owned(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            what,
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// The first private key of a PEM file.
fn key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let data = read("key file", path)?;
    rustls_pemfile::private_key(&mut data.as_slice())
        .map_err(|source| TlsError::Parse {
            what: "key file",
            path: path.to_owned(),
            source,
        })?
        .ok_or_else(|| TlsError::NoKey {
            path: path.to_owned(),
        })
}

/// A root store of the certificates in a CA file (webpki-rejected ones are
/// skipped; none usable is an error).
fn roots_from(what: &'static str, path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(certs(what, path)?);
    if added == 0 {
        return Err(TlsError::NoCertificate {
            what,
            path: path.to_owned(),
        });
    }
    Ok(roots)
}

/// The platform's trust store.
fn system_roots() -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        return Err(TlsError::NoSystemRoots);
    }
    Ok(roots)
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Builds a shared client config from `t`; `alpn`: protocols to offer, most
/// preferred first (`&[]` for none).
pub fn client_config(t: &ClientTls, alpn: &[&[u8]]) -> Result<Arc<ClientConfig>, TlsError> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = if t.insecure_skip_verify {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyCert { provider }))
    } else {
        let roots = match &t.ca_file {
            Some(path) => roots_from("CA file", path)?,
            None => system_roots()?,
        };
        builder.with_root_certificates(roots)
    };
    let mut config = match (&t.cert_file, &t.key_file) {
        (Some(c), Some(k)) => {
            builder.with_client_auth_cert(certs("certificate file", c)?, key(k)?)?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => return Err(TlsError::HalfClientCert),
    };
    // Session resumption state is per-config, not per-connection; keep the
    // default cache (it bounds itself).
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// Builds a server config from a PEM certificate chain and key; with
/// `client_ca`, clients must present a certificate that chains to it.
pub fn server_config(
    cert_file: &Path,
    key_file: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match client_ca {
        Some(ca) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots_from("client CA file", ca)?),
                provider,
            )
            .build()
            .map_err(|e| TlsError::Verifier(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(builder.with_single_cert(
        certs("certificate file", cert_file)?,
        key(key_file)?,
    )?))
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

    use agent_sim_testkit::Pki;

    #[test]
    fn file_errors_are_reported() {
        let t = ClientTls {
            ca_file: Some("/nonexistent.pem".into()),
            ..ClientTls::default()
        };
        assert!(matches!(client_config(&t, &[]), Err(TlsError::Read { .. })));
        let pki = Pki::new("errors");
        let junk = pki.path("junk.pem");
        std::fs::write(&junk, b"not a pem").unwrap();
        let t = ClientTls {
            ca_file: Some(junk.clone()),
            ..ClientTls::default()
        };
        assert!(matches!(
            client_config(&t, &[]),
            Err(TlsError::NoCertificate { .. })
        ));
        let half = ClientTls {
            ca_file: Some(pki.path("ca.pem")),
            cert_file: Some(pki.path("client.pem")),
            ..ClientTls::default()
        };
        assert!(matches!(
            client_config(&half, &[]),
            Err(TlsError::HalfClientCert)
        ));
        let no_key = ClientTls {
            key_file: Some(junk),
            ..half.clone()
        };
        assert!(matches!(
            client_config(&no_key, &[]),
            Err(TlsError::NoKey { .. })
        ));
        let mismatched = ClientTls {
            key_file: Some(pki.path("server-key.pem")),
            ..half
        };
        assert!(client_config(&mismatched, &[]).is_err());
    }

    #[test]
    fn insecure_ignores_roots_and_sets_alpn() {
        let t = ClientTls {
            ca_file: Some("/nonexistent.pem".into()),
            insecure_skip_verify: true,
            ..ClientTls::default()
        };
        let cfg = client_config(&t, &[b"h2"]).unwrap();
        assert_eq!(cfg.alpn_protocols, vec![b"h2".to_vec()]);
    }

    /// A client with the test CA and a client certificate completes a
    /// handshake with a server that requires client certificates; without
    /// one, or trusting another CA, it does not.
    #[tokio::test]
    async fn mutual_tls_handshakes_on_loopback() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let pki = Pki::new("mtls");
        let server = server_config(
            &pki.path("server.pem"),
            &pki.path("server-key.pem"),
            Some(&pki.path("ca.pem")),
        )
        .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(server);
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    if let Ok(mut tls) = acceptor.accept(tcp).await {
                        let _ = tls.write_all(b"hi").await;
                        let _ = tls.shutdown().await;
                    }
                });
            }
        });
        let name = ServerName::try_from("127.0.0.1").unwrap();
        let attempt = |t: ClientTls| {
            let name = name.clone();
            async move {
                let cfg = client_config(&t, &[]).unwrap();
                let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
                let mut tls = tokio_rustls::TlsConnector::from(cfg)
                    .connect(name, tcp)
                    .await?;
                let mut buf = Vec::new();
                tls.read_to_end(&mut buf).await?;
                Ok::<_, std::io::Error>(buf)
            }
        };
        let full = ClientTls {
            ca_file: Some(pki.path("ca.pem")),
            cert_file: Some(pki.path("client.pem")),
            key_file: Some(pki.path("client-key.pem")),
            ..ClientTls::default()
        };
        assert_eq!(attempt(full.clone()).await.unwrap(), b"hi");
        let anonymous = ClientTls {
            cert_file: None,
            key_file: None,
            ..full.clone()
        };
        assert!(attempt(anonymous).await.is_err());
        let other = Pki::new("other");
        let wrong_ca = ClientTls {
            ca_file: Some(other.path("ca.pem")),
            ..full
        };
        assert!(attempt(wrong_ca).await.is_err());
    }
}
