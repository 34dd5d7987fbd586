//! Connection setup: `rediss://` against a TLS-only `redis-server` with certificates made here
//! (trusted through `Options::tls`; refused by the system's roots; a TLS client on a plain
//! port), and the reconnect pacing.

use std::path::PathBuf;

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

use super::*;
use crate::test_support::{DEADLINE, opts};
use crate::testing::{RedisServer, Tls, eventually};
use crate::{Backend, Reply};

/// A CA and a certificate it signed for `localhost`, as PEM files; removed on drop.
struct Pki {
    dir: PathBuf,
    ca: rustls::pki_types::CertificateDer<'static>,
}

impl Pki {
    fn new(name: &str) -> Pki {
        let dir = std::env::temp_dir().join(format!("shared-state-tls-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = params.self_signed(&ca_key).unwrap();
        std::fs::write(dir.join("ca.pem"), ca_cert.pem()).unwrap();
        let issuer = Issuer::new(params, ca_key);
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["localhost".to_string()]).unwrap().signed_by(&key, &issuer).unwrap();
        std::fs::write(dir.join("server.pem"), cert.pem()).unwrap();
        std::fs::write(dir.join("server.key"), key.serialize_pem()).unwrap();
        Pki { ca: ca_cert.der().clone(), dir }
    }

    fn files(&self) -> Tls {
        Tls { cert: self.dir.join("server.pem"), key: self.dir.join("server.key"), ca: self.dir.join("ca.pem") }
    }

    /// A client configuration that trusts this CA only.
    fn client(&self) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca.clone()).unwrap();
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider).with_safe_default_protocol_versions();
        Arc::new(builder.unwrap().with_root_certificates(roots).with_no_client_auth())
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test]
async fn rediss_with_a_trusted_ca_works_and_with_the_system_roots_is_refused() {
    let pki = Pki::new("trusted");
    let server = RedisServer::start_tls(pki.files(), &["--requirepass", "pw"]).unwrap();
    let url = format!("rediss://:pw@localhost:{}/1", server.port());
    let b = Backend::start(Target::parse(&url).unwrap(), Options { tls: Some(pki.client()), ..opts() });
    assert!(b.wait_up(DEADLINE).await, "{:?}", b.last_error());
    assert!(b.cmd(&[b"SET", b"k", b"over tls"]).await.unwrap().is_ok());
    assert_eq!(b.cmd(&[b"GET", b"k"]).await.unwrap(), Reply::Bulk("over tls".into()));

    // The system's roots do not know the test CA: the handshake fails, precisely, no panic.
    let b = Backend::start(Target::parse(&url).unwrap(), opts());
    assert!(eventually(DEADLINE, async || b.stats().connect_failures >= 2).await);
    match b.last_error() {
        Some(Error::Io(e)) => assert!(e.to_string().contains("UnknownIssuer"), "{e}"),
        other => panic!("{other:?}"),
    }
    assert!(!b.is_up());
}

#[tokio::test]
async fn rediss_to_a_plain_text_server_fails_without_panicking() {
    let server = RedisServer::start().unwrap();
    let url = server.url().replace("redis://", "rediss://");
    let b = Backend::start(Target::parse(&url).unwrap(), opts());
    assert!(eventually(DEADLINE, async || b.stats().connect_failures >= 2).await);
    assert!(matches!(b.last_error(), Some(Error::Io(_))), "{:?}", b.last_error());
    assert!(matches!(b.cmd(&[b"PING"]).await, Err(Error::Down)));
}

#[test]
fn backoff_doubles_to_the_maximum_with_a_little_jitter_and_resets() {
    let ms = Duration::from_millis;
    let mut b = Backoff::new(&Options { reconnect_min: ms(100), reconnect_max: ms(1000), ..Options::default() });
    let pauses: Vec<Duration> = (0..6).map(|_| b.next()).collect();
    for (pause, base) in pauses.iter().zip([100, 200, 400, 800, 1000, 1000]) {
        assert!(*pause >= ms(base) && *pause <= ms(base) + ms(base) / 10, "{pauses:?}");
    }
    b.reset();
    assert!(b.next() < ms(111));
    // A maximum below the minimum is the minimum.
    let mut b = Backoff::new(&Options { reconnect_min: ms(50), reconnect_max: ms(10), ..Options::default() });
    assert!((0..3).all(|_| b.next() < ms(56)));
}
