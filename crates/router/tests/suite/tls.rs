//! TLS both ways, with certificates made here (rcgen): the router serving
//! HTTPS (`--tls-cert-path`, `--tls-key-path`) and talking to an `https://`
//! worker that requires a client certificate (`--ca-cert-paths`,
//! `--client-cert-path`, `--client-key-path`), on both front ends. The
//! worker is a simulated engine behind a real TLS terminator (tokio-rustls)
//! that checks the client's certificate against the test CA.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::app::{chat, config, engine_config, start};
use mock_engine::MockEngine;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use router_types::WorkerUrl;
use sgl_router::app::PolicyConfig;

/// A CA, and certificates it signed for the server name `localhost` and for a client.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn new(name: &str) -> Pki {
        let dir = std::env::temp_dir().join(format!("sgl-router-tls-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        std::fs::write(dir.join("ca.pem"), ca_cert.pem()).unwrap();
        for (who, names) in [("server", vec!["localhost".to_string()]), ("client", vec!["router".to_string()])] {
            let key = KeyPair::generate().unwrap();
            let cert = CertificateParams::new(names).unwrap().signed_by(&key, &issuer).unwrap();
            std::fs::write(dir.join(format!("{who}.pem")), cert.pem()).unwrap();
            std::fs::write(dir.join(format!("{who}.key")), key.serialize_pem()).unwrap();
        }
        Pki { dir }
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn certs(path: &Path) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    fleet::certificates(path).unwrap()
}

/// An `https://localhost:PORT` worker: TLS that requires a client certificate of the CA's,
/// in front of `engine`, offering the application protocols `alpn` (none: no ALPN). Counts
/// the handshakes it completed.
async fn https_worker(pki: &Pki, engine: &MockEngine, alpn: &[&[u8]]) -> (String, Arc<AtomicUsize>) {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(certs(&pki.path("ca.pem"))[0].clone()).unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots)).build().unwrap();
    let config = rustls::ServerConfig::builder()
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs(&pki.path("server.pem")), fleet::private_key(&pki.path("server.key")).unwrap())
        .unwrap();
    let mut config = config;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let backend = engine.url().trim_start_matches("http://").to_string();
    let handshakes = Arc::new(AtomicUsize::new(0));
    let done = handshakes.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, backend, done) = (acceptor.clone(), backend.clone(), done.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                done.fetch_add(1, Ordering::SeqCst);
                let Ok(mut plain) = tokio::net::TcpStream::connect(&backend).await else { return };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    (format!("https://localhost:{port}"), handshakes)
}

/// A client that trusts the test CA only.
fn client(pki: &Pki) -> reqwest::Client {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(certs(&pki.path("ca.pem"))[0].clone()).unwrap();
    let tls = rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
    reqwest::Client::builder().tls_backend_preconfigured(tls).build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_in_front_and_mutual_tls_to_the_workers_on_both_front_ends() {
    let pki = Pki::new("both");
    let engine = MockEngine::spawn(engine_config()).await.unwrap();
    let (worker, handshakes) = https_worker(&pki, &engine, &[]).await;
    // HTTPS in front goes through hyper; plain HTTP in front takes the fast path, which then
    // speaks TLS to the worker itself.
    for (fast, https_front) in [(true, true), (false, true), (true, false), (false, false)] {
        let mut cfg = config(&[], PolicyConfig::RoundRobin, false);
        cfg.workers = vec![WorkerUrl::parse(&worker).unwrap()];
        cfg.fast_proxy = fast;
        if https_front {
            cfg.tls = Some(gateway::tls::server_config(&pki.path("server.pem"), &pki.path("server.key")).unwrap());
        }
        let identity = (pki.path("client.pem"), pki.path("client.key"));
        cfg.worker_tls =
            fleet::WorkerTls::new(&[pki.path("ca.pem")], Some((identity.0.as_path(), identity.1.as_path()))).unwrap();
        let r = start(cfg).await;
        assert!(r.gateway.fleet.all()[0].is_routable(), "probed over mutual TLS");
        let port = r.url.rsplit(':').next().unwrap().to_string();
        let (base, c) = if https_front {
            (format!("https://localhost:{port}"), client(&pki))
        } else {
            (r.url.clone(), reqwest::Client::new())
        };
        let before = handshakes.load(Ordering::SeqCst);
        for n in 0..3 {
            let answer = c.post(format!("{base}/v1/chat/completions")).json(&chat("sys", &format!("q{n}"))).send();
            let answer = answer.await.unwrap();
            assert_eq!(answer.status(), 200, "fast path {fast}, https in front {https_front}");
            let v: serde_json::Value = answer.json().await.unwrap();
            assert!(v["choices"][0]["message"]["content"].is_string(), "{v}");
        }
        assert!(handshakes.load(Ordering::SeqCst) > before, "the requests went over TLS to the worker");
        if https_front {
            // Plain HTTP on the HTTPS port gets nowhere.
            assert!(reqwest::Client::new().get(format!("http://127.0.0.1:{port}/health")).send().await.is_err());
        }
        let _ = r.stop.send(());
    }
    assert!(handshakes.load(Ordering::SeqCst) >= 2, "the worker saw the router's TLS");
    assert!(engine.engine().requests.load(Ordering::Relaxed) >= 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_the_router_cannot_verify_or_that_refuses_it_is_not_routed_to() {
    let pki = Pki::new("refused");
    let engine = MockEngine::spawn(engine_config()).await.unwrap();
    let (worker, handshakes) = https_worker(&pki, &engine, &[]).await;
    // Without the CA the worker's certificate is not trusted; without a client certificate
    // the worker refuses the router. Either way: never in rotation, 503 to the client.
    let cases = [
        fleet::WorkerTls::new(&[], Some((pki.path("client.pem").as_path(), pki.path("client.key").as_path()))).unwrap(),
        fleet::WorkerTls::new(&[pki.path("ca.pem")], None).unwrap(),
    ];
    for worker_tls in cases {
        let mut cfg = config(&[], PolicyConfig::RoundRobin, false);
        cfg.workers = vec![WorkerUrl::parse(&worker).unwrap()];
        cfg.worker_tls = worker_tls;
        let r = start(cfg).await;
        assert!(!r.gateway.fleet.all()[0].is_routable());
        let answer = reqwest::Client::new()
            .post(format!("{}/v1/chat/completions", r.url))
            .json(&chat("sys", "q"))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 503);
        let _ = r.stop.send(());
    }
    assert_eq!(handshakes.load(Ordering::SeqCst), 0, "no handshake completed");
    assert_eq!(engine.engine().requests.load(Ordering::Relaxed), 0);
}

/// `--upstream-http2` towards `https://` workers (SMG's option): HTTP/2 where the worker's TLS
/// chooses `h2` by ALPN, every request over it; HTTP/1.1 where it offers only `http/1.1`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_http2_is_chosen_by_alpn_towards_https_workers() {
    let pki = Pki::new("alpn");
    // Both engines speak HTTP/1.1 and HTTP/2: their TLS decides.
    let speaks_both = || MockEngine::spawn(mock_engine::MockEngineConfig { http2: true, ..engine_config() });
    let (e2, e1) = (speaks_both().await.unwrap(), speaks_both().await.unwrap());
    let (w2, _) = https_worker(&pki, &e2, &[b"h2", b"http/1.1"]).await;
    let (w1, _) = https_worker(&pki, &e1, &[b"http/1.1"]).await;
    let mut cfg = config(&[], PolicyConfig::RoundRobin, false);
    cfg.workers = vec![WorkerUrl::parse(&w2).unwrap(), WorkerUrl::parse(&w1).unwrap()];
    cfg.upstream_http2 = true;
    let identity = (pki.path("client.pem"), pki.path("client.key"));
    cfg.worker_tls =
        fleet::WorkerTls::new(&[pki.path("ca.pem")], Some((identity.0.as_path(), identity.1.as_path()))).unwrap();
    let r = start(cfg).await;
    let http = reqwest::Client::new();
    for n in 0..8 {
        let mut q = chat("sys", &format!("q{n}"));
        q["stream"] = serde_json::json!(n % 2 == 1);
        let answer = http.post(format!("{}/v1/chat/completions", r.url)).json(&q).send().await.unwrap();
        assert_eq!(answer.status(), 200);
        let text = answer.text().await.unwrap();
        assert!(text.contains("content"), "{text}");
    }
    let (n2, n1) = (e2.engine().requests.load(Ordering::Relaxed), e1.engine().requests.load(Ordering::Relaxed));
    assert_eq!(n2 + n1, 8);
    assert!(n2 >= 3 && n1 >= 3, "round robin: {n2} and {n1}");
    // Every request to the h2 worker over HTTP/2, its probes and polls too.
    assert!(e2.engine().http2_requests.load(Ordering::Relaxed) > n2, "the requests and at least one probe");
    assert_eq!(e2.engine().http1_requests.load(Ordering::Relaxed), 0, "nothing over HTTP/1.1");
    assert_eq!(e1.engine().http2_requests.load(Ordering::Relaxed), 0, "its TLS chose http/1.1");
    let said = |u: &str| r.gateway.fleet.all().iter().find(|w| w.url.as_str() == u).unwrap().upstream_http2();
    assert_eq!((said(&w2), said(&w1)), (Some(true), Some(false)));
    let _ = r.stop.send(());
}
