//! The crate's one error type, with a stable `kind()` per variant (metric label and log field)
//! and whether retrying can help.

use std::path::PathBuf;
use std::sync::Arc;

/// Everything that can go wrong between the router and its shared-state server.
///
/// `Clone` because one broken connection fails every command that was waiting on it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The URL given to [`Target::parse`](crate::Target::parse) is not `redis://` or `rediss://`
    /// with a valid host, port and database.
    #[error("invalid shared-state URL: {0}")]
    Url(String),
    /// The password file could not be read or is empty (its content is never shown).
    #[error("password file {}: {why}", path.display())]
    PasswordFile { path: PathBuf, why: String },
    /// No connection is up; the command was not sent.
    #[error("shared-state backend is down")]
    Down,
    /// No reply within the command deadline; the connection is dropped and remade.
    #[error("shared-state command timed out")]
    Timeout,
    /// `max_in_flight` commands are already waiting; the command was not sent.
    #[error("shared-state backend busy: too many commands in flight")]
    Busy,
    /// The server sent bytes that are not a valid, bounded RESP2 reply; the connection is dropped.
    #[error("shared-state protocol error: {0}")]
    Protocol(String),
    /// Connecting, TLS, reading or writing failed (including the server closing the connection).
    #[error("shared-state I/O error: {0}")]
    Io(#[source] Arc<std::io::Error>),
    /// The server refused `AUTH` (wrong password or user).
    #[error("shared-state authentication failed: {0}")]
    Auth(String),
    /// The server refused `SELECT` (or another setup step) when connecting.
    #[error("shared-state connection setup failed: {0}")]
    Setup(String),
    /// The command cannot be sent on a shared connection: empty, or one that would change the
    /// connection's state (`SUBSCRIBE`, `MONITOR`, `SELECT`, `CLIENT REPLY`, ...).
    #[error("command not allowed on the shared connection: {0}")]
    Invalid(String),
}

// === impl Error ===

impl Error {
    /// A stable name for the variant: the metric label and the `error` log field.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Url(_) => "url",
            Error::PasswordFile { .. } => "password_file",
            Error::Down => "down",
            Error::Timeout => "timeout",
            Error::Busy => "busy",
            Error::Protocol(_) => "protocol",
            Error::Io(_) => "io",
            Error::Auth(_) => "auth",
            Error::Setup(_) => "setup",
            Error::Invalid(_) => "invalid",
        }
    }

    /// Whether the same command may succeed later (the backend or its connection recovers);
    /// configuration and caller errors never do.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Down | Error::Timeout | Error::Busy | Error::Protocol(_) | Error::Io(_))
    }

    pub(crate) fn io(e: std::io::Error) -> Self {
        Error::Io(Arc::new(e))
    }

    pub(crate) fn closed() -> Self {
        Error::io(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "connection closed by the server"))
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::io(e)
    }
}
