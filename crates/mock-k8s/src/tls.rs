//! HTTPS for the mock API server: a throwaway CA and a server certificate
//! for `127.0.0.1` and `localhost` made with rcgen at spawn, and a listener
//! that completes TLS handshakes off the accept loop (a slow handshake never
//! holds up the next connection) and hands finished streams to axum.
//! Owns certificates and handshakes; what is served over them is `http.rs`'s.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::MockK8sError;

/// How long a client has to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Finished handshakes waiting for axum to take them.
const ACCEPTED_BUFFER: usize = 64;

/// The certificates of one server.
#[derive(Debug)]
pub(crate) struct Pki {
    /// The CA's certificate, PEM: what a client trusts.
    pub(crate) ca_pem: String,
    pub(crate) config: Arc<rustls::ServerConfig>,
}

/// Connections whose TLS handshake is done.
#[derive(Debug)]
pub(crate) struct TlsListener {
    accepted: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    addr: SocketAddr,
}

// === impl Pki ===

impl Pki {
    /// A new CA and a server certificate it signed for `127.0.0.1`, `::1` and `localhost`.
    pub(crate) fn generate() -> Result<Self, MockK8sError> {
        let ca_key = KeyPair::generate()?;
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, "mock-k8s-ca");
        let ca_cert = ca.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec!["127.0.0.1".into(), "::1".into(), "localhost".into()])?;
        params.distinguished_name.push(DnType::CommonName, "kube-apiserver");
        let cert = params.signed_by(&key, &issuer)?;
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone(), ca_cert.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )?;
        Ok(Self { ca_pem: ca_cert.pem(), config: Arc::new(config) })
    }
}

// === impl TlsListener ===

impl TlsListener {
    /// Accepts on `tcp` until `cancel`, each handshake in a task of its own.
    pub(crate) fn spawn(
        tcp: TcpListener,
        config: Arc<rustls::ServerConfig>,
        cancel: CancellationToken,
    ) -> io::Result<Self> {
        let addr = tcp.local_addr()?;
        let acceptor = TlsAcceptor::from(config);
        let (tx, accepted) = mpsc::channel(ACCEPTED_BUFFER);
        tokio::spawn(async move {
            loop {
                let (stream, peer) = tokio::select! {
                    biased;
                    () = cancel.cancelled() => break,
                    r = tcp.accept() => match r {
                        Ok(accepted) => accepted,
                        Err(e) => {
                            debug!(error = %e, "accept failed");
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            continue;
                        }
                    },
                };
                let _ = stream.set_nodelay(true);
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => debug!(%peer, "TLS handshake too slow"),
                    }
                });
            }
            debug!("TLS accept loop stopped");
        });
        Ok(Self { accepted, addr })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.accepted.recv().await {
            Some(accepted) => accepted,
            // Stopped: axum's graceful shutdown ends the serve loop instead.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.addr)
    }
}
