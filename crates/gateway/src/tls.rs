//! TLS in the gateway: the HTTPS listener (`--tls-cert-path`,
//! `--tls-key-path`; served by the hyper path, the handshake under the
//! client's head deadline) and the fast path's connections to `https://`
//! workers (with the fleet's [`fleet::WorkerTls`]). [`Conn`] is a worker
//! connection in the clear or in TLS; [`ClientStream`] a client's.

use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The router's HTTPS server configuration from a PEM certificate chain and key.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, fleet::TlsError> {
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(fleet::certificates(cert)?, fleet::private_key(key)?)
        .map_err(|e| fleet::TlsError::Config(e.to_string()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// `AsyncRead` and `AsyncWrite` for a stream that is plain or TLS.
macro_rules! either_io {
    ($name:ident) => {
        impl AsyncRead for $name {
            fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $name::Plain(s) => Pin::new(s).poll_read(cx, buf),
                    $name::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
                }
            }
        }

        impl AsyncWrite for $name {
            fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    $name::Plain(s) => Pin::new(s).poll_write(cx, buf),
                    $name::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
                }
            }

            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    $name::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
                    $name::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
                }
            }

            fn is_write_vectored(&self) -> bool {
                match self {
                    $name::Plain(s) => s.is_write_vectored(),
                    $name::Tls(s) => s.is_write_vectored(),
                }
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $name::Plain(s) => Pin::new(s).poll_flush(cx),
                    $name::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
                }
            }

            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $name::Plain(s) => Pin::new(s).poll_shutdown(cx),
                    $name::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
                }
            }
        }
    };
}

/// A connection to a worker.
#[derive(Debug)]
pub(crate) enum Conn {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}
either_io!(Conn);

impl Conn {
    /// A TLS connection on which the worker chose HTTP/2 (ALPN `h2`).
    pub(crate) fn chose_h2(&self) -> bool {
        matches!(self, Conn::Tls(s) if s.get_ref().1.alpn_protocol() == Some(b"h2"))
    }
}

/// The connectors towards `https://` workers, with the fleet's TLS settings: one for
/// HTTP/1.1 (no ALPN, as before HTTP/2), one offering `h2` then `http/1.1` (`--upstream-http2`).
#[derive(Clone)]
pub(crate) struct WorkerConnectors {
    pub(crate) http1: tokio_rustls::TlsConnector,
    pub(crate) h2: tokio_rustls::TlsConnector,
}

impl WorkerConnectors {
    pub(crate) fn new(config: &Arc<rustls::ClientConfig>) -> Self {
        let mut h2 = (**config).clone();
        h2.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Self {
            http1: tokio_rustls::TlsConnector::from(config.clone()),
            h2: tokio_rustls::TlsConnector::from(Arc::new(h2)),
        }
    }
}

/// A client's connection.
#[derive(Debug)]
pub(crate) enum ClientStream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}
either_io!(ClientStream);

impl Conn {
    /// The TCP connection under it.
    fn tcp(&self) -> &TcpStream {
        match self {
            Conn::Plain(s) => s,
            Conn::Tls(s) => s.get_ref().0,
        }
    }

    /// Whether an idle pooled connection still looks open: nothing to read
    /// (data, a TLS alert, or the end of stream all mean the worker closed it).
    pub(crate) fn looks_open(&self) -> bool {
        let mut byte = [0u8; 1];
        let mut buf = ReadBuf::new(&mut byte);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        matches!(self.tcp().poll_peek(&mut cx, &mut buf), Poll::Pending)
    }
}
