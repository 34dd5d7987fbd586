//! Admission: whether a request may start at all, decided before its body
//! is parsed or rendered. Two limits: requests in flight
//! (`--max-concurrent-requests`, 429) and the memory of requests in
//! progress (`--max-request-memory-bytes`, 429): a request reserves its body
//! size times [`MEMORY_PER_BODY_BYTE`] (the parsed JSON, the rendered
//! prompt, its tokens and page hashes) until it ends. And the render pool:
//! large renders run off the serving threads, a bounded number at a time,
//! so one huge prompt does not stall the small ones behind it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::{Gateway, GatewayError};

/// Bytes of memory a request is charged per byte of its body: measured, a
/// 5 MB chat held about 35 MB resident while it was parsed, rendered and tokenized.
pub const MEMORY_PER_BODY_BYTE: usize = 8;
/// Bodies up to this size are parsed and rendered on the serving thread
/// (microseconds); larger ones go to the render pool.
pub const RENDER_INLINE_MAX_BYTES: usize = 64 << 10;

/// The memory of requests in progress, against a budget.
#[derive(Debug)]
pub struct Budget {
    limit: usize,
    used: AtomicUsize,
}

/// One admitted request: its slot among the requests in flight and its
/// memory reservation, both released when it is dropped.
#[derive(Debug)]
pub struct Admission {
    gw: Arc<Gateway>,
    reserved: usize,
}

// === impl Budget ===

impl Budget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self { limit, used: AtomicUsize::new(0) }
    }

    /// Bytes reserved now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// The limit.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Reserves `n` bytes if they fit; a request larger than the whole budget
    /// fits only when nothing else is reserved (it then runs alone).
    fn try_reserve(&self, n: usize) -> bool {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            if used != 0 && used.saturating_add(n) > self.limit {
                return false;
            }
            match self.used.compare_exchange_weak(used, used + n, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(now) => used = now,
            }
        }
    }

    fn release(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }
}

// === impl Admission ===

impl Admission {
    /// Admits a request whose body is `body_len` bytes, or says why not
    /// (draining: 503; too many in flight or over the memory budget: 429).
    pub fn admit(gw: &Arc<Gateway>, body_len: usize) -> Result<Self, GatewayError> {
        if gw.draining.load(Ordering::Relaxed) {
            return Err(GatewayError::Draining);
        }
        if gw.in_flight.fetch_add(1, Ordering::Relaxed) >= gw.config.max_concurrent {
            gw.in_flight.fetch_sub(1, Ordering::Relaxed);
            return Err(GatewayError::Overloaded(gw.config.max_concurrent));
        }
        let reserved = body_len.saturating_mul(MEMORY_PER_BODY_BYTE);
        if !gw.budget.try_reserve(reserved) {
            gw.in_flight.fetch_sub(1, Ordering::Relaxed);
            gw.metrics.over_budget.fetch_add(1, Ordering::Relaxed);
            return Err(GatewayError::OverBudget(gw.budget.limit()));
        }
        Ok(Self { gw: gw.clone(), reserved })
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.gw.budget.release(self.reserved);
        self.gw.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Runs `work` (parsing and rendering a body of `body_len` bytes): inline
/// when small, else on the blocking pool under one of the render slots, so
/// the serving thread goes on serving meanwhile.
pub(crate) async fn render<T: Send + 'static>(
    gw: &Arc<Gateway>,
    body_len: usize,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, GatewayError> {
    if body_len <= RENDER_INLINE_MAX_BYTES {
        return Ok(work());
    }
    let _slot =
        gw.render_slots.acquire().await.map_err(|_| GatewayError::Internal("the render pool is closed".into()))?;
    tokio::task::spawn_blocking(work).await.map_err(|e| GatewayError::Internal(format!("a render failed: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_admits_what_fits_and_one_large_request_alone() {
        let b = Budget::new(100);
        assert!(b.try_reserve(60));
        assert!(b.try_reserve(40));
        assert!(!b.try_reserve(1), "full");
        b.release(100);
        assert!(b.try_reserve(500), "alone, a request larger than the budget runs");
        assert!(!b.try_reserve(1));
        b.release(500);
        assert_eq!(b.used(), 0);
    }
}
