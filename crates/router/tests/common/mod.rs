//! Helpers shared by the router's integration tests.

use std::time::Duration;

/// Polls `cond` every 25 ms for up to 10 s; panics naming `what` if it never holds.
pub(crate) async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..400 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {what}");
}
