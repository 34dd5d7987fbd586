//! JWT/OIDC tokens on the control plane (issue 30), against an identity
//! provider played by the test: an HTTP server with an OIDC discovery document
//! and a JWKS it rotates, RSA and P-256 keys generated here. An admin token
//! opens `/workers`, a user token is 403; a wrong audience, issuer, expiry,
//! signature or `alg: none` is 401; after a rotation the new key's tokens are
//! taken (the JWKS fetched again) and the old key's refused; tokens naming
//! made-up keys do not make the router fetch without bound; the audit log
//! and the static keys keep working.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{self, EcdsaKeyPair, KeyPair, RsaKeyPair};
use base64::Engine as _;
use common::app::{ADMIN_KEY, config, engine_config, start};
use gateway::jwt::{JwtConfig, Role};
use mock_engine::MockEngine;
use serde_json::{Value, json};
use sgl_router::app::PolicyConfig;

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// `n` and `e` of an RFC 8017 `RSAPublicKey` (`SEQUENCE { INTEGER n, INTEGER e }`), DER.
fn rsa_components(der: &[u8]) -> (Vec<u8>, Vec<u8>) {
    fn tlv(b: &[u8]) -> (&[u8], &[u8]) {
        let (len, at) = match b[1] {
            l if l < 0x80 => (l as usize, 2),
            0x81 => (b[2] as usize, 3),
            0x82 => ((b[2] as usize) << 8 | b[3] as usize, 4),
            other => panic!("length form {other:#x}"),
        };
        (&b[at..at + len], &b[at + len..])
    }
    let (seq, _) = tlv(der);
    let (n, rest) = tlv(seq);
    let (e, _) = tlv(rest);
    let strip = |v: &[u8]| v.iter().skip_while(|b| **b == 0).copied().collect::<Vec<u8>>();
    (strip(n), strip(e))
}

enum Signer {
    Rsa(RsaKeyPair),
    Ec(EcdsaKeyPair),
}

impl Signer {
    fn rsa() -> Self {
        Signer::Rsa(RsaKeyPair::generate(aws_lc_rs::rsa::KeySize::Rsa2048).unwrap())
    }

    fn ec() -> Self {
        Signer::Ec(EcdsaKeyPair::generate(&signature::ECDSA_P256_SHA256_FIXED_SIGNING).unwrap())
    }

    fn jwk(&self, kid: &str) -> Value {
        match self {
            Signer::Rsa(k) => {
                let (n, e) = rsa_components(k.public_key().as_ref());
                json!({"kty": "RSA", "kid": kid, "alg": "RS256", "use": "sig", "n": b64(&n), "e": b64(&e)})
            }
            Signer::Ec(k) => {
                let p = k.public_key().as_ref();
                json!({"kty": "EC", "kid": kid, "crv": "P-256", "x": b64(&p[1..33]), "y": b64(&p[33..65])})
            }
        }
    }

    /// A token with `claims`, signed by this key as `kid`.
    fn token(&self, kid: &str, claims: &Value) -> String {
        let alg = match self {
            Signer::Rsa(_) => "RS256",
            Signer::Ec(_) => "ES256",
        };
        let head = b64(json!({"alg": alg, "typ": "JWT", "kid": kid}).to_string().as_bytes());
        let body = b64(claims.to_string().as_bytes());
        let signed = format!("{head}.{body}");
        let rng = SystemRandom::new();
        let sig = match self {
            Signer::Rsa(k) => {
                let mut sig = vec![0; k.public_modulus_len()];
                k.sign(&signature::RSA_PKCS1_SHA256, &rng, signed.as_bytes(), &mut sig).unwrap();
                sig
            }
            Signer::Ec(k) => k.sign(&rng, signed.as_bytes()).unwrap().as_ref().to_vec(),
        };
        format!("{signed}.{}", b64(&sig))
    }
}

fn now() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs()
}

/// The identity provider: discovery at `/.well-known/openid-configuration`, the JWKS at
/// `/jwks` (what `jwks` holds now), the JWKS fetches counted.
async fn provider(jwks: Arc<Mutex<Value>>, fetches: Arc<AtomicUsize>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let discovery = json!({"issuer": base, "jwks_uri": format!("{base}/jwks")});
    let app = axum::Router::new()
        .route("/.well-known/openid-configuration", axum::routing::get(move || async move { axum::Json(discovery) }))
        .route(
            "/jwks",
            axum::routing::get(move || async move {
                fetches.fetch_add(1, Ordering::SeqCst);
                axum::Json(jwks.lock().unwrap().clone())
            }),
        );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    base
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_provider_tokens_open_the_control_plane_by_role_through_a_key_rotation() {
    let (k1, k2) = (Signer::rsa(), Signer::ec());
    let jwks = Arc::new(Mutex::new(json!({"keys": [k1.jwk("k1")]})));
    let fetches = Arc::new(AtomicUsize::new(0));
    let issuer = provider(jwks.clone(), fetches.clone()).await;
    let w = MockEngine::spawn(engine_config()).await.unwrap();
    let mut c = config(&[&w], PolicyConfig::RoundRobin, false);
    let mut role_mapping = std::collections::HashMap::new();
    role_mapping.insert("Router.Admin".to_string(), Role::Admin);
    role_mapping.insert("Router.Viewer".to_string(), Role::User);
    c.jwt = Some(JwtConfig {
        issuer: issuer.clone(),
        audience: "sgl-router".into(),
        jwks_uri: None,
        role_claim: "roles".into(),
        role_mapping,
        leeway: Duration::from_secs(30),
        cache_ttl: Duration::from_secs(3600),
        refetch_every: Duration::from_millis(300),
    });
    c.audit = true;
    let r = start(c).await;
    let http = reqwest::Client::new();
    let workers = async |token: &str| {
        http.get(format!("{}/workers", r.url)).bearer_auth(token).send().await.unwrap().status().as_u16()
    };
    let claims = |roles: Value| json!({"iss": issuer, "aud": ["other", "sgl-router"], "sub": "alice", "exp": now() + 300, "roles": roles});
    assert_eq!(workers(&k1.token("k1", &claims(json!(["Router.Admin"])))).await, 200, "an admin token");
    assert_eq!(fetches.load(Ordering::SeqCst), 1, "the JWKS, found by discovery, fetched once");
    assert_eq!(workers(&k1.token("k1", &claims(json!("Router.Admin")))).await, 200, "a role as a string; cached");
    assert_eq!(fetches.load(Ordering::SeqCst), 1);
    assert_eq!(workers(&k1.token("k1", &claims(json!(["Router.Viewer"])))).await, 403, "a user token");
    assert_eq!(workers(&k1.token("k1", &claims(json!(["Unmapped"])))).await, 403);
    let mut wrong = claims(json!(["Router.Admin"]));
    wrong["aud"] = json!("someone-else");
    assert_eq!(workers(&k1.token("k1", &wrong)).await, 401, "another audience");
    let mut wrong = claims(json!(["Router.Admin"]));
    wrong["iss"] = json!("https://evil.example");
    assert_eq!(workers(&k1.token("k1", &wrong)).await, 401, "another issuer");
    let mut wrong = claims(json!(["Router.Admin"]));
    wrong["exp"] = json!(now() - 120);
    assert_eq!(workers(&k1.token("k1", &wrong)).await, 401, "expired past the leeway");
    let good = k1.token("k1", &claims(json!(["Router.Admin"])));
    let (signed, sig) = good.rsplit_once('.').unwrap();
    let tampered = format!("{signed}.{}", b64(&vec![7u8; 256]));
    assert_eq!(workers(&tampered).await, 401, "a bad signature");
    assert_ne!(sig.len(), 0);
    let unsigned = format!(
        "{}.{}.",
        b64(json!({"alg": "none", "kid": "k1"}).to_string().as_bytes()),
        b64(claims(json!(["Router.Admin"])).to_string().as_bytes())
    );
    assert_eq!(workers(&unsigned).await, 401, "alg none");
    // The provider rotates to an EC key: its tokens are taken after one more fetch, the old key's not.
    *jwks.lock().unwrap() = json!({"keys": [k2.jwk("k2")]});
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(workers(&k2.token("k2", &claims(json!(["Router.Admin"])))).await, 200, "the new key");
    let after_rotation = fetches.load(Ordering::SeqCst);
    assert_eq!(after_rotation, 2);
    assert_eq!(workers(&good).await, 401, "the old key is gone");
    // Made-up key ids: at most one fetch per --refetch period, however many tokens.
    for i in 0..20 {
        assert_eq!(workers(&k2.token(&format!("made-up-{i}"), &claims(json!(["Router.Admin"])))).await, 401);
    }
    assert!(fetches.load(Ordering::SeqCst) <= after_rotation + 2, "{} fetches", fetches.load(Ordering::SeqCst));
    // The static key still opens it, and the data plane never takes a token for a key.
    assert_eq!(workers(ADMIN_KEY).await, 200);
    let _ = r.stop.send(());
}
