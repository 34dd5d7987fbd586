//! The shared-state flags (`--shared-state`): router replicas share their placements and
//! loads, the response cache's answers and the tenants' rate limits through a Valkey or
//! Redis server: a flag group of [`super::ServeArgs`].

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use sgl_router::config::SharedStateSetup;

/// Where the replicas' shared state lives.
#[derive(Debug, Args)]
pub(crate) struct SharedStateFlags {
    /// Share state with the other router replicas through this Valkey or Redis server:
    /// `redis://[USER:PASSWORD@]HOST:PORT[/DB]` (`rediss://` for TLS). Off: every replica
    /// routes on its own view.
    #[arg(long, env = "SGL_ROUTER_SHARED_STATE", value_name = "URL")]
    pub(crate) shared_state: Option<String>,
    /// Read the backend's password from this file (trimmed), instead of the URL.
    #[arg(long, env = "SGL_ROUTER_SHARED_STATE_PASSWORD_FILE", value_name = "PATH")]
    pub(crate) shared_state_password_file: Option<PathBuf>,
    /// Every key and channel starts with it: replicas of one deployment share one prefix,
    /// and nothing with a deployment using another.
    #[arg(long, env = "SGL_ROUTER_SHARED_STATE_PREFIX", default_value = "sgl-router", value_name = "PREFIX")]
    pub(crate) shared_state_prefix: String,
    /// Longest wait for one answer of the backend (a request waits at most this for a shared
    /// cache lookup or tenant charge; past it the backend is reconnected and the replica
    /// decides alone meanwhile).
    #[arg(long, env = "SGL_ROUTER_SHARED_STATE_TIMEOUT_MS", default_value_t = 250, value_name = "MS")]
    pub(crate) shared_state_timeout_ms: u64,
}

impl SharedStateFlags {
    /// The backend the flags name, if any; `Err` says which flag is wrong.
    pub(crate) fn setup(&self) -> Result<Option<SharedStateSetup>, String> {
        let Some(url) = self.shared_state.as_deref().map(str::trim).filter(|u| !u.is_empty()) else {
            if self.shared_state_password_file.is_some() {
                return Err("--shared-state-password-file needs --shared-state".into());
            }
            return Ok(None);
        };
        let mut target = shared_state::Target::parse(url).map_err(|e| format!("--shared-state: {e}"))?;
        if let Some(path) = &self.shared_state_password_file {
            target = target.with_password_file(path).map_err(|e| format!("--shared-state-password-file: {e}"))?;
        }
        let prefix = self.shared_state_prefix.trim();
        if prefix.is_empty() || prefix.len() > 128 || prefix.contains(char::is_whitespace) {
            return Err("--shared-state-prefix: 1 to 128 characters, no spaces".into());
        }
        if !(1..=60_000).contains(&self.shared_state_timeout_ms) {
            return Err("--shared-state-timeout-ms: 1 to 60000".into());
        }
        let options = shared_state::Options {
            command_timeout: Duration::from_millis(self.shared_state_timeout_ms),
            ..shared_state::Options::default()
        };
        Ok(Some(SharedStateSetup { target, options, prefix: prefix.to_owned() }))
    }
}
