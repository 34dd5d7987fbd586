//! Who may call what: the bearer keys of the control plane
//! (`--control-plane-api-keys`: fleet changes, `/workers`, `/debug/route`,
//! `/metrics`) and of the data plane (`--client-api-keys`: the OpenAI routes),
//! checked in constant time, and what `Authorization` a worker gets for an
//! admitted client.
//!
//! With no control-plane key configured, the control plane is closed (403
//! naming the flag), never open. With no client key configured, the data
//! plane is open and a client's own `Authorization` passes through to the
//! worker; the workers' key (`--api-key`) is attached only to requests of
//! clients that presented a client key.

use axum::http::HeaderMap;

use crate::{Gateway, GatewayError};

/// A set of accepted bearer keys.
#[derive(Clone, Default)]
pub struct Keys(Vec<Vec<u8>>);

/// Which key set guards a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plane {
    /// Fleet changes, topology and explain routes.
    Control,
    /// The OpenAI-compatible routes.
    Data,
}

// === impl Keys ===

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the keys themselves.
        write!(f, "Keys({} configured)", self.0.len())
    }
}

impl Keys {
    /// The keys, empty ones dropped.
    pub fn new<S: AsRef<str>>(keys: &[S]) -> Self {
        Self(keys.iter().map(|k| k.as_ref().trim().as_bytes().to_vec()).filter(|k| !k.is_empty()).collect())
    }

    /// No key configured.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether an `Authorization` header value (`Bearer KEY`) carries one of the keys.
    pub fn accepts(&self, authorization: Option<&[u8]>) -> bool {
        authorization.and_then(bearer_token).is_some_and(|token| self.holds(token))
    }

    /// Whether `value` is one of the keys, bare or as `Bearer KEY`.
    pub fn accepts_key(&self, value: &[u8]) -> bool {
        let token = bearer_token(value).unwrap_or_else(|| value.trim_ascii());
        !token.is_empty() && self.holds(token)
    }

    /// Whether `token` is one of the keys: every key is compared (no early exit), each in time
    /// independent of where it differs.
    fn holds(&self, token: &[u8]) -> bool {
        self.0.iter().fold(false, |found, key| found | constant_time_eq(key, token))
    }

    /// Checks a request to a route of `plane`: `Ok` when it may proceed.
    pub fn check(&self, plane: Plane, authorization: Option<&[u8]>) -> Result<(), GatewayError> {
        match plane {
            Plane::Control if self.is_empty() => Err(GatewayError::Forbidden(
                "the control plane is closed: start the router with --control-plane-api-keys KEY to use it".into(),
            )),
            Plane::Data if self.is_empty() => Ok(()),
            _ if self.accepts(authorization) => Ok(()),
            Plane::Control => Err(GatewayError::Unauthorized(
                "this route needs `Authorization: Bearer KEY` with a key from --control-plane-api-keys".into(),
            )),
            Plane::Data => Err(GatewayError::Unauthorized(
                "this route needs `Authorization: Bearer KEY` with a key from --client-api-keys".into(),
            )),
        }
    }

    /// [`Keys::check`] on a header map.
    pub fn check_headers(&self, plane: Plane, headers: &HeaderMap) -> Result<(), GatewayError> {
        let value = headers.get(axum::http::header::AUTHORIZATION).map(|v| v.as_bytes());
        self.check(plane, value)
    }
}

/// The token of `Bearer TOKEN` (scheme case-insensitive, surrounding blanks ignored).
pub(crate) fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let value = value.trim_ascii();
    let (scheme, rest) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || !rest.first().is_some_and(|b| *b == b' ' || *b == b'\t') {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// Equality whose time depends on the lengths only.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether a client that sent `client` may use the OpenAI routes: with
/// client keys configured it must present one (401 otherwise); without them
/// anyone may.
pub(crate) fn check_client(gw: &Gateway, client: Option<&[u8]>) -> Result<(), GatewayError> {
    gw.client_keys.check(Plane::Data, client)
}

/// What goes to the worker as `Authorization` for an admitted client that
/// sent `client`: with client keys configured, the workers' key
/// (`--api-key`), never the client's key; without them, the client's own
/// credentials, and the workers' key never (an anonymous client is not the router).
pub(crate) fn worker_credentials(gw: &Gateway, client: Option<&[u8]>) -> Option<Vec<u8>> {
    if gw.client_keys.is_empty() {
        client.map(<[u8]>::to_vec)
    } else {
        gw.worker_auth.as_ref().map(|v| v.as_bytes().to_vec())
    }
}

/// The caller's identity, as a response cache keys its answers (a caller never gets another's
/// stored answer): a digest, keyed with a secret drawn at start, of the client key it
/// presented (with `--client-api-keys`) or of its whole `Authorization` value (passed through
/// to the workers without them). `None`: no credentials, an anonymous caller. Worked out only
/// with a routing config (where caches live).
pub(crate) fn caller(gw: &Gateway, authorization: Option<&[u8]>) -> Option<[u8; 32]> {
    use sha2::{Digest, Sha256};
    static SECRET: std::sync::OnceLock<[u64; 4]> = std::sync::OnceLock::new();
    gw.routing.as_ref()?;
    let value = authorization?;
    let credential = if gw.client_keys.is_empty() { value } else { bearer_token(value)? };
    let secret = SECRET.get_or_init(secret_words);
    let mut d = Sha256::new();
    for word in secret {
        d.update(word.to_le_bytes());
    }
    d.update(credential);
    Some(d.finalize().into())
}

/// 256 bits from the operating system's random source (the std hasher's keys, themselves
/// drawn from it, where `/dev/urandom` cannot be read).
fn secret_words() -> [u64; 4] {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    if std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes)).is_ok() {
        return std::array::from_fn(|i| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap_or_default()));
    }
    std::array::from_fn(|i| {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_usize(i);
        h.finish()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_keys_are_matched_exactly() {
        let keys = Keys::new(&["k1", "second-key", ""]);
        assert!(keys.accepts(Some(b"Bearer k1")));
        assert!(keys.accepts(Some(b"bearer   second-key ")));
        for bad in [&b"Bearer k"[..], b"Bearer k12", b"k1", b"Basic k1", b"Bearerk1", b"Bearer ", b""] {
            assert!(!keys.accepts(Some(bad)), "{:?}", String::from_utf8_lossy(bad));
        }
        assert!(!keys.accepts(None));
        // The empty key was dropped: it cannot be presented.
        assert_eq!(format!("{keys:?}"), "Keys(2 configured)");
    }

    #[test]
    fn a_closed_control_plane_names_the_flag() {
        let none = Keys::default();
        let e = none.check(Plane::Control, Some(b"Bearer anything")).unwrap_err();
        assert_eq!(e.status().as_u16(), 403);
        assert!(e.to_string().contains("--control-plane-api-keys"), "{e}");
        // An open data plane lets anyone through.
        assert!(none.check(Plane::Data, None).is_ok());
        let keys = Keys::new(&["a"]);
        assert_eq!(keys.check(Plane::Data, None).unwrap_err().status().as_u16(), 401);
        assert_eq!(keys.check(Plane::Control, Some(b"Bearer b")).unwrap_err().status().as_u16(), 401);
        assert!(keys.check(Plane::Control, Some(b"Bearer a")).is_ok());
    }
}
