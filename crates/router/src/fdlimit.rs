//! How many client connections the open-file limit leaves room for: the soft
//! `RLIMIT_NOFILE` less a reserve for everything else the router opens
//! (upstream connections, KV-event subscribers, probes, listeners, logs).
//! A `--max-connections` above it lets clients take every descriptor: accepts
//! fail with EMFILE ("Too many open files"), and so do the router's own
//! connections to its workers, the probes included. Reads the limit (no
//! unsafe code: rustix's `getrlimit`); never raises it.

use crate::defaults::{FD_RESERVE_DIVISOR, FD_RESERVE_MIN};

/// The soft limit on open files; `None` when unlimited or unknown.
pub(crate) fn nofile_soft_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        rustix::process::getrlimit(rustix::process::Resource::Nofile).current
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// The connection cap of each of `listeners` client-facing listeners (each
/// has a cap of its own): `flag`, or less when `soft_limit` less the reserve
/// (a [`FD_RESERVE_DIVISOR`]th of it, at least [`FD_RESERVE_MIN`]) shared
/// by the listeners is smaller. At least 1: a listener that could never
/// accept would be a router that never answers.
pub(crate) fn connection_cap(flag: usize, soft_limit: Option<u64>, listeners: usize) -> usize {
    let Some(limit) = soft_limit else { return flag };
    let reserve = (limit / FD_RESERVE_DIVISOR).max(FD_RESERVE_MIN);
    let room = limit.saturating_sub(reserve) / listeners.max(1) as u64;
    flag.min(usize::try_from(room).unwrap_or(usize::MAX)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unlimited_or_unknown_limit_keeps_the_flag() {
        assert_eq!(connection_cap(16_384, None, 1), 16_384);
        assert_eq!(connection_cap(7, None, 2), 7);
    }

    #[test]
    fn a_quarter_of_the_limit_is_kept_for_the_rest() {
        assert_eq!(connection_cap(16_384, Some(256), 1), 192);
        assert_eq!(connection_cap(16_384, Some(1024), 1), 768);
        // The common container default of 20,000 lowers the flag's default too.
        assert_eq!(connection_cap(16_384, Some(20_000), 1), 15_000);
        assert_eq!(connection_cap(16_384, Some(1 << 20), 1), 16_384);
        // A smaller flag stands.
        assert_eq!(connection_cap(100, Some(1024), 1), 100);
    }

    #[test]
    fn the_reserve_is_at_least_the_minimum() {
        // A quarter of 200 is 50, less than the minimum of 64.
        assert_eq!(connection_cap(16_384, Some(200), 1), 136);
        assert_eq!(connection_cap(16_384, Some(FD_RESERVE_MIN), 1), 1, "never 0");
        assert_eq!(connection_cap(16_384, Some(0), 1), 1);
    }

    #[test]
    fn listeners_with_caps_of_their_own_share_the_room() {
        // --admin-port: the client and the admin listener each hold up to the cap.
        assert_eq!(connection_cap(16_384, Some(1024), 2), 384);
        assert_eq!(connection_cap(16_384, Some(1024), 0), 768, "0 listeners counts as 1");
    }

    #[test]
    fn the_limit_is_read() {
        // Whatever this process's limit is, reading it never fails on unix.
        if cfg!(unix) {
            let limit = nofile_soft_limit();
            assert!(limit.is_none_or(|l| l > 0), "{limit:?}");
        }
    }
}
