//! Where the backend is: `redis://[user[:password]@]host[:port][/db]` (or `rediss://` for TLS)
//! parsed into a [`Target`], an optional password file, and a `Display`/`Debug` that never
//! show the password. Not the connecting itself (see `conn`).

use std::fmt;
use std::path::Path;

use crate::Error;

/// The port when the URL names none.
pub const DEFAULT_PORT: u16 = 6379;

/// A shared-state server and how to log in to it.
#[derive(Clone, PartialEq, Eq)]
pub struct Target {
    /// Host name or IP address (an IPv6 address without its brackets).
    pub host: String,
    pub port: u16,
    /// The logical database `SELECT`ed after connecting (0: none sent).
    pub db: u32,
    /// `rediss://`: TLS, the host name checked against the server's certificate.
    pub tls: bool,
    /// ACL user for `AUTH user password` (`None`: `AUTH password`, the `default` user).
    pub user: Option<String>,
    /// `None`: no `AUTH` is sent.
    pub password: Option<String>,
}

// === impl Target ===

impl Target {
    /// Parses `redis://[user[:password]@]host[:port][/db]` or `rediss://...`; user and password
    /// may be percent-encoded. The port defaults to 6379 and the database to 0.
    pub fn parse(url: &str) -> Result<Target, Error> {
        let bad = |why: &str| Error::Url(format!("{why} (expected redis://[user:password@]host:port[/db])"));
        let (tls, rest) = if let Some(rest) = strip_prefix_ci(url, "redis://") {
            (false, rest)
        } else if let Some(rest) = strip_prefix_ci(url, "rediss://") {
            (true, rest)
        } else {
            return Err(bad("the scheme must be redis:// or rediss://"));
        };
        if rest.contains(['?', '#']) {
            return Err(bad("query parameters and fragments are not supported"));
        }
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (mut user, mut password) = (None, None);
        if let Some(userinfo) = userinfo {
            let (u, p) = match userinfo.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (userinfo, None),
            };
            user = Some(percent_decode(u).ok_or_else(|| bad("the user is not valid percent-encoded UTF-8"))?)
                .filter(|u| !u.is_empty());
            if let Some(p) = p {
                password =
                    Some(percent_decode(p).ok_or_else(|| bad("the password is not valid percent-encoded UTF-8"))?)
                        .filter(|p| !p.is_empty());
            }
        }
        let (host, port) = split_host_port(hostport).map_err(bad)?;
        let db = match path {
            "" => 0,
            p if p.bytes().all(|b| b.is_ascii_digit()) => {
                p.parse().map_err(|_| bad("the database number is out of range"))?
            }
            _ => return Err(bad("the path must be a database number")),
        };
        Ok(Target { host, port, db, tls, user, password })
    }

    /// The same target with the password read from `path` (its content with surrounding
    /// whitespace trimmed), replacing any password from the URL.
    pub fn with_password_file(self, path: &Path) -> Result<Target, Error> {
        let err = |why: String| Error::PasswordFile { path: path.to_path_buf(), why };
        let raw = std::fs::read(path).map_err(|e| err(e.to_string()))?;
        let text = String::from_utf8(raw).map_err(|_| err("not UTF-8".into()))?;
        let password = text.trim();
        if password.is_empty() {
            return Err(err("empty".into()));
        }
        Ok(Target { password: Some(password.to_owned()), ..self })
    }

    /// `host:port` as `TcpStream::connect` takes it (IPv6 in brackets).
    pub(crate) fn addr(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// The URL with the password shown as `***`.
impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.tls { "rediss://" } else { "redis://" })?;
        match (&self.user, &self.password) {
            (Some(u), Some(_)) => write!(f, "{u}:***@")?,
            (Some(u), None) => write!(f, "{u}@")?,
            (None, Some(_)) => f.write_str(":***@")?,
            (None, None) => {}
        }
        f.write_str(&self.addr())?;
        if self.db != 0 {
            write!(f, "/{}", self.db)?;
        }
        Ok(())
    }
}

/// Like `Display`: the password is never printed.
impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("db", &self.db)
            .field("tls", &self.tls)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix).then(|| &s[prefix.len()..])
}

fn split_host_port(s: &str) -> Result<(String, u16), &'static str> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or("an IPv6 address must end with ']'")?;
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err("the address in brackets is not IPv6");
        }
        match after {
            "" => (host, None),
            p => (host, Some(p.strip_prefix(':').ok_or("expected ':' and a port after ']'")?)),
        }
    } else {
        match s.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    if host.is_empty() {
        return Err("the host is empty");
    }
    if host.contains(|c: char| c.is_whitespace() || c.is_control() || "/@[]%\\".contains(c)) {
        return Err("the host is not a valid name or address");
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
            p.parse().ok().filter(|p| *p != 0).ok_or("the port must be 1..=65535")?
        }
        Some(_) => return Err("the port must be a number"),
    };
    Ok((host.to_owned(), port))
}

/// `%XX` decoded; `None` for a bad escape or bytes that are not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok().filter(|_| hex.bytes().all(|b| b.is_ascii_hexdigit()))?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests;
