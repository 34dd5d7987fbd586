//! The shared-state tests' backend: a real redis-server (Debian's, installed by `.ci/run`), and
//! a router configuration sharing state through it.

use std::time::Duration;

use sgl_router::app::AppConfig;
use sgl_router::config::SharedStateSetup;
use shared_state::testing::RedisServer;

/// A redis-server, or `None` (with a line saying `what` is skipped) when there is none here;
/// under CI (`CI` set) it must be there.
#[allow(dead_code)] // not every test binary uses it
pub(crate) fn redis(what: &str) -> Option<RedisServer> {
    use std::io::Write;
    match RedisServer::start() {
        Ok(r) => Some(r),
        Err(e) if std::env::var_os("CI").is_none() => {
            let _ = writeln!(std::io::stderr(), "SKIPPED: {what} need redis-server ({e})");
            None
        }
        Err(e) => panic!("redis-server is needed under CI: {e}"),
    }
}

/// `c` sharing state through `url` under `prefix`, with a 250 ms command deadline.
#[allow(dead_code)] // not every test binary uses it
pub(crate) fn sharing(mut c: AppConfig, url: &str, prefix: &str) -> AppConfig {
    let options = shared_state::Options { command_timeout: Duration::from_millis(250), ..Default::default() };
    let target = shared_state::Target::parse(url).unwrap();
    c.shared_state = Some(SharedStateSetup { target, options, prefix: prefix.into(), advertise: None });
    c
}
