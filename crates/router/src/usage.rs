//! The one error a command-line mistake is: every module that reads flags
//! returns it, and `main` reports it with exit status 64. A leaf: it knows
//! no flags and no module.

/// A command-line mistake: reported with exit status 64.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct UsageError(pub(crate) String);
