//! The crate's one error type: what can go wrong starting a mock API server.
//! Errors a client causes are not here: they are `Status` answers (`http.rs`).

use std::io;

/// Why [`crate::MockApiServer::spawn`] failed.
#[derive(Debug, thiserror::Error)]
pub enum MockK8sError {
    /// Binding `127.0.0.1:0` failed.
    #[error("binding the listener: {0}")]
    Bind(#[source] io::Error),
    /// Making the test CA or the server certificate failed.
    #[error("making the test certificates: {0}")]
    Certificate(#[from] rcgen::Error),
    /// rustls refused the configuration.
    #[error("configuring TLS: {0}")]
    Tls(#[from] rustls::Error),
}

// === impl MockK8sError ===

impl MockK8sError {
    /// A stable name for the variant (log field, metric label).
    pub fn kind(&self) -> &'static str {
        match self {
            MockK8sError::Bind(_) => "bind",
            MockK8sError::Certificate(_) => "certificate",
            MockK8sError::Tls(_) => "tls",
        }
    }
}
