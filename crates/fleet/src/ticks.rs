//! A period for the fleet's background loops (probes, load polls, warm-up).

use std::time::Duration;

/// A period for a background loop: late ticks are delayed, not bunched.
pub(crate) struct Ticks {
    interval: tokio::time::Interval,
    cancel: tokio_util::sync::CancellationToken,
}

impl Ticks {
    pub(crate) fn new(period: Duration, cancel: tokio_util::sync::CancellationToken) -> Self {
        let mut interval = tokio::time::interval(period);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self { interval, cancel }
    }

    /// Waits for the next tick; false once cancelled.
    pub(crate) async fn next(&mut self) -> bool {
        tokio::select! {
            biased;
            _ = self.cancel.cancelled() => false,
            _ = self.interval.tick() => true,
        }
    }
}
