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
    /// This replica's control-plane base URL as the other replicas reach it (say
    /// `http://$(POD_IP):30000`): announced in the backend once it has caught up, so that a
    /// replica starting later copies its KV index from it (as from `--index-peers`).
    #[arg(long, env = "SGL_ROUTER_SHARED_STATE_ADVERTISE_URL", value_name = "URL")]
    pub(crate) shared_state_advertise_url: Option<String>,
}

impl SharedStateFlags {
    /// The backend the flags name, if any; `Err` says which flag is wrong.
    pub(crate) fn setup(&self) -> Result<Option<SharedStateSetup>, String> {
        let Some(url) = self.shared_state.as_deref().map(str::trim).filter(|u| !u.is_empty()) else {
            if self.shared_state_password_file.is_some() {
                return Err("--shared-state-password-file needs --shared-state".into());
            }
            if self.shared_state_advertise_url.is_some() {
                return Err("--shared-state-advertise-url needs --shared-state".into());
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
        let advertise = self.shared_state_advertise_url.as_deref().map(str::trim).filter(|u| !u.is_empty());
        if let Some(u) = advertise
            && !((u.starts_with("http://") || u.starts_with("https://")) && u.len() <= 512)
        {
            return Err(format!("--shared-state-advertise-url {u}: an http:// or https:// URL of at most 512 bytes"));
        }
        let advertise = advertise.map(|u| u.trim_end_matches('/').to_owned());
        Ok(Some(SharedStateSetup { target, options, prefix: prefix.to_owned(), advertise }))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn setup(args: &[&str]) -> Result<Option<SharedStateSetup>, String> {
        crate::cli::Cli::try_parse_from(std::iter::once("sgl-router").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?
            .serve
            .shared
            .setup()
    }

    #[test]
    fn the_backend_its_password_prefix_deadline_and_advertised_url() {
        assert!(setup(&[]).unwrap().is_none(), "off by default");
        let s = setup(&["--shared-state", "redis://:pw@valkey:6380/2"]).unwrap().unwrap();
        assert_eq!((s.target.host.as_str(), s.target.port, s.target.db), ("valkey", 6380, 2));
        assert_eq!(s.target.password.as_deref(), Some("pw"));
        assert_eq!(
            (s.prefix.as_str(), s.options.command_timeout, s.advertise),
            ("sgl-router", Duration::from_millis(250), None)
        );
        let file = std::env::temp_dir().join(format!("sgl-router-shared-pw-{}", std::process::id()));
        std::fs::write(&file, "s3cret\n").unwrap();
        let path = file.to_str().unwrap();
        let s = setup(&[
            "--shared-state",
            "rediss://valkey:6379",
            "--shared-state-password-file",
            path,
            "--shared-state-prefix",
            "prod-a",
            "--shared-state-timeout-ms",
            "40",
            "--shared-state-advertise-url",
            "http://10.0.0.7:30000/",
        ])
        .unwrap()
        .unwrap();
        std::fs::remove_file(&file).unwrap();
        assert!(s.target.tls);
        assert_eq!(s.target.password.as_deref(), Some("s3cret"));
        assert_eq!((s.prefix.as_str(), s.options.command_timeout), ("prod-a", Duration::from_millis(40)));
        assert_eq!(s.advertise.as_deref(), Some("http://10.0.0.7:30000"));
    }

    #[test]
    fn each_wrong_flag_is_named() {
        let err = |args: &[&str]| setup(args).unwrap_err();
        assert!(err(&["--shared-state", "http://valkey:6379"]).starts_with("--shared-state:"));
        assert!(err(&["--shared-state-password-file", "/x"]).contains("needs --shared-state"));
        assert!(err(&["--shared-state-advertise-url", "http://a:1"]).contains("needs --shared-state"));
        let with = |flag: &str, v: &str| err(&["--shared-state", "redis://v:1", flag, v]);
        assert!(with("--shared-state-prefix", "a b").starts_with("--shared-state-prefix"));
        assert!(with("--shared-state-timeout-ms", "0").starts_with("--shared-state-timeout-ms"));
        assert!(with("--shared-state-advertise-url", "10.0.0.7:30000").starts_with("--shared-state-advertise-url"));
        assert!(with("--shared-state-password-file", "/nonexistent/pw").starts_with("--shared-state-password-file"));
    }
}
