//! TLS towards `https://` workers (SGLang Model Gateway's `--ca-cert-paths`,
//! `--client-cert-path`, `--client-key-path`): the system's roots plus the
//! operator's CAs, and a client certificate for mutual TLS. One rustls
//! configuration serves every connection to a worker: the probes and
//! discovery (reqwest), and both front ends' proxied requests.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tracing::warn;

/// Why the TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or holds nothing usable.
    #[error("{path}: {why}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// rustls refused the configuration (a key that does not match its certificate, say).
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// Certificates of a PEM file (at least one).
pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bad = |why: String| TlsError::File { path: path.to_path_buf(), why };
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no PEM certificate in it".into()));
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsError::File { path: path.to_path_buf(), why: e.to_string() })
}

/// How the router's connections to workers are secured when a worker's URL is `https://`.
#[derive(Debug, Clone)]
pub struct WorkerTls {
    config: Arc<rustls::ClientConfig>,
}

impl WorkerTls {
    /// The system's roots plus `cas`, and the client identity (certificate
    /// chain and key) when given.
    pub fn new(cas: &[PathBuf], identity: Option<(&Path, &Path)>) -> Result<Self, TlsError> {
        let mut roots = rustls::RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        for e in &native.errors {
            warn!(error = %e, "some system root certificates could not be read");
        }
        let (_, unusable) = roots.add_parsable_certificates(native.certs);
        if unusable > 0 {
            warn!(unusable, "some system root certificates are not usable");
        }
        for path in cas {
            for cert in certificates(path)? {
                roots.add(cert).map_err(|e| TlsError::File { path: path.clone(), why: e.to_string() })?;
            }
        }
        let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
        let mut config = match identity {
            Some((cert, key)) => builder
                .with_client_auth_cert(certificates(cert)?, private_key(key)?)
                .map_err(|e| TlsError::Config(e.to_string()))?,
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self { config: Arc::new(config) })
    }

    /// The system's roots only, no client identity.
    pub fn system() -> Self {
        Self::new(&[], None).unwrap_or_else(|_| {
            let config = rustls::ClientConfig::builder()
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth();
            Self { config: Arc::new(config) }
        })
    }

    /// The rustls client configuration.
    pub fn config(&self) -> &Arc<rustls::ClientConfig> {
        &self.config
    }
}

impl Default for WorkerTls {
    fn default() -> Self {
        Self::system()
    }
}
