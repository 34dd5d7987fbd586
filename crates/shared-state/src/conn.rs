//! Making one ready connection: TCP (no Nagle), TLS for `rediss://`, then `AUTH`, `SELECT` and
//! `CLIENT SETNAME`, all under the connect deadline; the framed [`Conn`] both the command link
//! and subscriptions read replies through; and the reconnect pacing ([`Backoff`]). What runs
//! over a connection once it is ready lives in `link` and `pubsub`.

use std::hash::{BuildHasher, RandomState};
use std::io;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::BytesMut;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tracing::warn;

use crate::resp::{self, Decoder, Limits};
use crate::{Error, Options, Reply, Target};

/// The name the router's connections show in `CLIENT LIST`.
pub(crate) const CLIENT_NAME: &str = "sgl-router";

/// Below this much free space the read buffer grows by [`READ_CHUNK`] before a read.
const MIN_READ: usize = 4 << 10;
const READ_CHUNK: usize = 64 << 10;

/// A TCP or TLS byte stream.
#[derive(Debug)]
pub(crate) enum Stream {
    Tcp(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// A connection with its read buffer and reply decoder.
#[derive(Debug)]
pub(crate) struct Conn<S> {
    pub(crate) stream: S,
    pub(crate) reader: Reader,
}

/// The read side's state: a buffer that only grows for bytes a reply really needs, and the
/// decoder (both survive a cancelled read, so `Reader::read` is cancel-safe).
#[derive(Debug)]
pub(crate) struct Reader {
    buf: BytesMut,
    decoder: Decoder,
}

/// Connection setup shared by a backend and its subscriptions: the TLS configuration is built
/// once, on the first `rediss://` connect.
#[derive(Debug)]
pub(crate) struct Connector {
    pub(crate) target: Target,
    pub(crate) opts: Options,
    tls: OnceLock<Result<Arc<rustls::ClientConfig>, String>>,
}

/// Exponential reconnect pauses between `reconnect_min` and `reconnect_max`, with up to 10%
/// jitter so replicas that lost the server together do not return in lockstep.
#[derive(Debug)]
pub(crate) struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
    seed: RandomState,
    n: u64,
}

// === impl Connector ===

impl Connector {
    pub(crate) fn new(target: Target, opts: Options) -> Self {
        Self { target, opts, tls: OnceLock::new() }
    }

    /// A connection ready for commands, or why not, within `connect_timeout`.
    pub(crate) async fn connect(&self) -> Result<Conn<Stream>, Error> {
        let deadline = self.opts.connect_timeout;
        let timed_out = || Error::io(io::Error::new(io::ErrorKind::TimedOut, "connect timed out"));
        tokio::time::timeout(deadline, self.setup()).await.map_err(|_| timed_out())?
    }

    async fn setup(&self) -> Result<Conn<Stream>, Error> {
        let t = &self.target;
        let tcp = TcpStream::connect(t.addr()).await?;
        tcp.set_nodelay(true)?;
        let stream = if t.tls {
            let name = ServerName::try_from(t.host.clone())
                .map_err(|e| Error::io(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
            let tls = TlsConnector::from(self.tls_config()?).connect(name, tcp).await?;
            Stream::Tls(Box::new(tls))
        } else {
            Stream::Tcp(tcp)
        };
        let mut conn = Conn::new(stream, Limits { max_reply_bytes: self.opts.max_reply_bytes });
        if let Some(password) = &t.password {
            let mut args = vec![b"AUTH".as_slice()];
            args.extend(t.user.as_deref().map(str::as_bytes));
            args.push(password.as_bytes());
            match conn.call(&args).await? {
                Reply::Error(e) => return Err(Error::Auth(e)),
                r if r.is_ok() => {}
                r => return Err(Error::Protocol(format!("unexpected reply to AUTH: {r:?}"))),
            }
        }
        if t.db != 0 {
            match conn.call(&[b"SELECT".as_slice(), t.db.to_string().as_bytes()]).await? {
                Reply::Error(e) => return Err(Error::Setup(format!("SELECT {}: {e}", t.db))),
                r if r.is_ok() => {}
                r => return Err(Error::Protocol(format!("unexpected reply to SELECT: {r:?}"))),
            }
        }
        // An old server or a proxy may refuse CLIENT SETNAME: only the name is lost. But a
        // server that wants a password we do not have says so here, and every command would fail.
        match conn.call(&[b"CLIENT".as_slice(), b"SETNAME", CLIENT_NAME.as_bytes()]).await? {
            Reply::Error(e) if e.starts_with("NOAUTH") => Err(Error::Auth(e)),
            _ => Ok(conn),
        }
    }

    fn tls_config(&self) -> Result<Arc<rustls::ClientConfig>, Error> {
        if let Some(config) = &self.opts.tls {
            return Ok(config.clone());
        }
        self.tls.get_or_init(system_tls).clone().map_err(Error::Setup)
    }
}

/// The system's roots, with the crypto provider named (no process-wide default needed).
fn system_tls() -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for e in &native.errors {
        warn!(error = %e, "some system root certificates could not be read");
    }
    roots.add_parsable_certificates(native.certs);
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS configuration: {e}"))?;
    Ok(Arc::new(builder.with_root_certificates(roots).with_no_client_auth()))
}

// === impl Conn ===

impl<S: AsyncRead + AsyncWrite + Unpin> Conn<S> {
    pub(crate) fn new(stream: S, limits: Limits) -> Self {
        Self { stream, reader: Reader::new(limits) }
    }

    /// Sends one command and reads its reply (setup only: no pipelining, no deadline of its own).
    pub(crate) async fn call(&mut self, args: &[&[u8]]) -> Result<Reply, Error> {
        self.send(args).await?;
        self.reader.read(&mut self.stream).await
    }

    pub(crate) async fn send(&mut self, args: &[&[u8]]) -> Result<(), Error> {
        let mut out = Vec::new();
        resp::encode(args, &mut out);
        self.stream.write_all(&out).await?;
        self.stream.flush().await?;
        Ok(())
    }
}

// === impl Reader ===

impl Reader {
    pub(crate) fn new(limits: Limits) -> Self {
        Self { buf: BytesMut::new(), decoder: Decoder::new(limits) }
    }

    /// The next reply: decoded from what is buffered, reading more as needed. Cancel-safe.
    pub(crate) async fn read<R: AsyncRead + Unpin>(&mut self, r: &mut R) -> Result<Reply, Error> {
        loop {
            if let Some(reply) = self.decoder.decode(&mut self.buf)? {
                return Ok(reply);
            }
            if self.buf.capacity() - self.buf.len() < MIN_READ {
                self.buf.reserve(READ_CHUNK);
            }
            if r.read_buf(&mut self.buf).await? == 0 {
                return Err(Error::closed());
            }
        }
    }
}

// === impl Stream ===

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

// === impl Backoff ===

impl Backoff {
    pub(crate) fn new(opts: &Options) -> Self {
        let min = opts.reconnect_min;
        Self { min, max: opts.reconnect_max.max(min), next: min, seed: RandomState::new(), n: 0 }
    }

    /// The pause before the next attempt; each call doubles the one after, up to the maximum.
    pub(crate) fn next(&mut self) -> Duration {
        let base = self.next;
        self.next = (base * 2).min(self.max);
        self.n += 1;
        let jitter = self.seed.hash_one(self.n) % 1000;
        base + base.mul_f64(jitter as f64 / 10_000.0)
    }

    /// After a connection was made: the next pause is the minimum again.
    pub(crate) fn reset(&mut self) {
        self.next = self.min;
    }
}

#[cfg(test)]
mod tests;
