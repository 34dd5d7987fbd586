//! JWT/OIDC bearer tokens on the control plane (Shepherd Model Gateway 1.13's
//! `--jwt-issuer`, `--jwt-audience`, `--jwt-jwks-uri`, `--jwt-role-mapping`):
//! besides the `--control-plane-api-keys`, an identity provider's token whose
//! mapped role is `admin` opens the control plane. A token is verified
//! against the provider's JWKS (RS256 or ES256; no other algorithm, never
//! `none`), its issuer, audience, expiry and not-before checked with 30 s of
//! leeway, and its roles claim mapped to `admin` or `user`.
//!
//! The JWKS (the explicit URI, or the issuer's OIDC discovery document's
//! `jwks_uri`) is fetched with a deadline and a size bound, kept for an hour,
//! and fetched again when it is older or a token names a key it lacks (the
//! provider rotated its keys), at most once every `refetch_every` ([`REFETCH_EVERY`]): tokens
//! naming made-up keys cannot make the router fetch without bound.

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::{Duration, Instant, SystemTime};

use base64::Engine as _;
use serde_json::Value;

/// Longest token taken (bytes).
pub const MAX_TOKEN_BYTES: usize = 16 << 10;
/// Longest JWKS or discovery document read (bytes), and most keys kept from it.
pub const MAX_JWKS_BYTES: usize = 1 << 20;
const MAX_KEYS: usize = 64;
/// Deadline of one fetch.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Least time between two fetches caused by unknown keys.
pub const REFETCH_EVERY: Duration = Duration::from_secs(10);

/// What a token's holder may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The control plane.
    Admin,
    /// Nothing on the control plane.
    User,
}

/// The identity provider.
#[derive(Debug, Clone, PartialEq)]
pub struct JwtConfig {
    /// `--jwt-issuer`: the tokens' `iss`, and where OIDC discovery looks.
    pub issuer: String,
    /// `--jwt-audience`: one of the tokens' `aud`.
    pub audience: String,
    /// `--jwt-jwks-uri` (none: discovered from the issuer).
    pub jwks_uri: Option<String>,
    /// The claim holding the roles (`roles`).
    pub role_claim: String,
    /// `--jwt-role-mapping IDP_ROLE=admin|user`.
    pub role_mapping: HashMap<String, Role>,
    /// Clock skew allowed on `exp` and `nbf`.
    pub leeway: Duration,
    /// How long a fetched JWKS is kept.
    pub cache_ttl: Duration,
    /// Least time between two fetches caused by unknown keys ([`REFETCH_EVERY`]).
    pub refetch_every: Duration,
}

/// Why a token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwtError {
    /// Not a JWT, or a part that does not decode.
    #[error("malformed token: {0}")]
    Malformed(&'static str),
    /// An algorithm other than RS256 and ES256.
    #[error("token algorithm {0} is not accepted (RS256, ES256)")]
    Algorithm(String),
    /// No key of the provider's JWKS has its `kid`.
    #[error("no key of the identity provider's JWKS signs this token")]
    UnknownKey,
    /// The signature does not verify.
    #[error("bad token signature")]
    Signature,
    /// Issuer, audience or validity.
    #[error("token refused: {0}")]
    Claims(&'static str),
    /// The JWKS could not be fetched.
    #[error("the identity provider's keys are unavailable: {0}")]
    Jwks(String),
}

/// A public key of the JWKS.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Key {
    Rsa {
        n: Vec<u8>,
        e: Vec<u8>,
    },
    /// An uncompressed P-256 point.
    Ec(Vec<u8>),
}

#[derive(Debug, Default)]
struct Cache {
    keys: HashMap<String, Key>,
    fetched: Option<Instant>,
    tried: Option<Instant>,
}

/// The verifier, with its JWKS cache.
#[derive(Debug)]
pub struct JwtVerifier {
    config: JwtConfig,
    client: reqwest::Client,
    cache: RwLock<Cache>,
    /// One fetch at a time.
    fetching: tokio::sync::Mutex<()>,
}

fn b64(part: &str) -> Result<Vec<u8>, JwtError> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part.trim_end_matches('='))
        .map_err(|_| JwtError::Malformed("base64"))
}

impl JwtVerifier {
    /// A verifier for `config`.
    pub fn new(config: JwtConfig) -> Self {
        let client = reqwest::Client::builder().timeout(FETCH_TIMEOUT).build().unwrap_or_default();
        Self { config, client, cache: RwLock::new(Cache::default()), fetching: tokio::sync::Mutex::new(()) }
    }

    /// Verifies `token`: its holder's subject (when it has one) and role.
    pub async fn verify(&self, token: &str) -> Result<(Option<String>, Role), JwtError> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(JwtError::Malformed("too long"));
        }
        let mut parts = token.split('.');
        let (Some(h), Some(p), Some(s), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
            return Err(JwtError::Malformed("not three parts"));
        };
        let header: Value = serde_json::from_slice(&b64(h)?).map_err(|_| JwtError::Malformed("header"))?;
        let alg = header.get("alg").and_then(Value::as_str).unwrap_or("");
        if alg != "RS256" && alg != "ES256" {
            return Err(JwtError::Algorithm(alg.chars().take(16).collect()));
        }
        let kid = header.get("kid").and_then(Value::as_str).unwrap_or("").to_string();
        let key = self.key(&kid).await?;
        let signed = &token.as_bytes()[..h.len() + 1 + p.len()];
        verify_signature(alg, &key, signed, &b64(s)?)?;
        let claims: Value = serde_json::from_slice(&b64(p)?).map_err(|_| JwtError::Malformed("claims"))?;
        self.check_claims(&claims)?;
        let role = self.role(&claims);
        Ok((claims.get("sub").and_then(Value::as_str).map(str::to_owned), role))
    }

    fn check_claims(&self, claims: &Value) -> Result<(), JwtError> {
        if claims.get("iss").and_then(Value::as_str) != Some(self.config.issuer.as_str()) {
            return Err(JwtError::Claims("issuer"));
        }
        let aud = &self.config.audience;
        let audience_ok = match claims.get("aud") {
            Some(Value::String(a)) => a == aud,
            Some(Value::Array(all)) => all.iter().any(|a| a.as_str() == Some(aud)),
            _ => false,
        };
        if !audience_ok {
            return Err(JwtError::Claims("audience"));
        }
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_secs_f64();
        let leeway = self.config.leeway.as_secs_f64();
        match claims.get("exp").and_then(Value::as_f64) {
            Some(exp) if exp + leeway > now => {}
            Some(_) => return Err(JwtError::Claims("expired")),
            None => return Err(JwtError::Claims("no expiry")),
        }
        if claims.get("nbf").and_then(Value::as_f64).is_some_and(|nbf| nbf - leeway > now) {
            return Err(JwtError::Claims("not yet valid"));
        }
        Ok(())
    }

    /// The highest role its roles claim maps to (`user` when none maps).
    fn role(&self, claims: &Value) -> Role {
        let roles: Vec<&str> = match claims.get(&self.config.role_claim) {
            Some(Value::String(r)) => vec![r.as_str()],
            Some(Value::Array(all)) => all.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        let admin = roles.iter().any(|r| self.config.role_mapping.get(*r) == Some(&Role::Admin));
        if admin { Role::Admin } else { Role::User }
    }

    /// The key `kid` names: from the cache while it is fresh, else after a fetch.
    async fn key(&self, kid: &str) -> Result<Key, JwtError> {
        let cached = |c: &Cache| {
            c.keys.get(kid).cloned().filter(|_| c.fetched.is_some_and(|t| t.elapsed() < self.config.cache_ttl))
        };
        if let Some(k) = cached(&self.cache.read().unwrap_or_else(|p| p.into_inner())) {
            return Ok(k);
        }
        let _one = self.fetching.lock().await;
        {
            let cache = self.cache.read().unwrap_or_else(|p| p.into_inner());
            if let Some(k) = cached(&cache) {
                return Ok(k);
            }
            // Fetched (or tried) moments ago: an unknown key stays unknown until the next turn.
            if cache.tried.is_some_and(|t| t.elapsed() < self.config.refetch_every) {
                let stale = cache.keys.get(kid).cloned();
                return stale.ok_or(JwtError::UnknownKey);
            }
        }
        self.cache.write().unwrap_or_else(|p| p.into_inner()).tried = Some(Instant::now());
        let keys = self.fetch().await?;
        let mut cache = self.cache.write().unwrap_or_else(|p| p.into_inner());
        cache.keys = keys;
        cache.fetched = Some(Instant::now());
        cache.keys.get(kid).cloned().ok_or(JwtError::UnknownKey)
    }

    async fn fetch(&self) -> Result<HashMap<String, Key>, JwtError> {
        let uri = match &self.config.jwks_uri {
            Some(u) => u.clone(),
            None => {
                let discovery =
                    format!("{}/.well-known/openid-configuration", self.config.issuer.trim_end_matches('/'));
                let doc = self.get_json(&discovery).await?;
                doc.get("jwks_uri")
                    .and_then(Value::as_str)
                    .ok_or_else(|| JwtError::Jwks("no jwks_uri in the discovery document".into()))?
                    .to_string()
            }
        };
        let jwks = self.get_json(&uri).await?;
        let mut keys = HashMap::new();
        for k in jwks.get("keys").and_then(Value::as_array).into_iter().flatten().take(MAX_KEYS) {
            let field = |name: &str| k.get(name).and_then(Value::as_str).and_then(|v| b64(v).ok());
            let kid = k.get("kid").and_then(Value::as_str).unwrap_or("").to_string();
            let key = match k.get("kty").and_then(Value::as_str) {
                Some("RSA") => match (field("n"), field("e")) {
                    (Some(n), Some(e)) => Key::Rsa { n, e },
                    _ => continue,
                },
                Some("EC") if k.get("crv").and_then(Value::as_str) == Some("P-256") => match (field("x"), field("y")) {
                    (Some(x), Some(y)) if x.len() == 32 && y.len() == 32 => Key::Ec([&[4u8][..], &x, &y].concat()),
                    _ => continue,
                },
                _ => continue,
            };
            keys.insert(kid, key);
        }
        tracing::info!(keys = keys.len(), uri = %uri, "identity provider's JWKS fetched");
        Ok(keys)
    }

    async fn get_json(&self, uri: &str) -> Result<Value, JwtError> {
        let fail = |e: String| JwtError::Jwks(format!("{uri}: {e}"));
        let mut resp = self.client.get(uri).send().await.map_err(|e| fail(e.to_string()))?;
        if !resp.status().is_success() {
            return Err(fail(format!("status {}", resp.status())));
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| fail(e.to_string()))? {
            if body.len() + chunk.len() > MAX_JWKS_BYTES {
                return Err(fail(format!("larger than {MAX_JWKS_BYTES} bytes")));
            }
            body.extend_from_slice(&chunk);
        }
        serde_json::from_slice(&body).map_err(|e| fail(e.to_string()))
    }
}

fn verify_signature(alg: &str, key: &Key, signed: &[u8], sig: &[u8]) -> Result<(), JwtError> {
    use aws_lc_rs::signature;
    let ok = match (alg, key) {
        ("RS256", Key::Rsa { n, e }) => signature::RsaPublicKeyComponents { n: n.as_slice(), e: e.as_slice() }
            .verify(&signature::RSA_PKCS1_2048_8192_SHA256, signed, sig)
            .is_ok(),
        ("ES256", Key::Ec(point)) => {
            signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point).verify(signed, sig).is_ok()
        }
        // A key of another type than the token's algorithm.
        _ => false,
    };
    if ok { Ok(()) } else { Err(JwtError::Signature) }
}
