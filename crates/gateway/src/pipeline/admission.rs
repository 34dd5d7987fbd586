//! Admission: whether a request may start at all, decided before its body
//! is parsed or rendered. Two limits: requests in flight
//! (`--max-concurrent-requests`; past it a request waits in a queue of
//! `--queue-size` for up to `--queue-timeout-secs`, 408 after, and 429 when
//! the queue is full) and the memory of requests in
//! progress (`--max-request-memory-bytes`, 429): a request reserves its body
//! size times [`MEMORY_PER_BODY_BYTE`] (the body, the parsed JSON, the
//! rendered prompt, its tokens and page hashes) until it ends, and a large
//! body that will be tokenized its size times [`RENDER_MEMORY_PER_BODY_BYTE`]
//! more (the tokenizer's own working memory) until it is rendered: both at
//! admission, so a request never waits for memory while holding some. And the render pool: large
//! renders run off the serving threads, a bounded number at a time, so one
//! huge prompt does not stall the small ones behind it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::{Gateway, GatewayError};

/// Bytes of memory a request is charged per byte of its body from admission to its end: the
/// body, its parsed JSON, the rendered prompt, its tokens (4 bytes each: up to one per body byte
/// with the built-in byte-level model) and page hashes.
pub const MEMORY_PER_BODY_BYTE: usize = 8;
/// Bytes a large body (over [`RENDER_INLINE_MAX_BYTES`]) that will be tokenized is charged per
/// body byte from admission until it is rendered: the tokenizer's working memory. Measured on a
/// release build (peak RSS over the idle router, one request at a time, docs/security.md):
/// 153 per byte for a 1 MB completion with the built-in byte-level model (the `tokenizers`
/// pipeline keeps offsets, strings and alignments for every token), 113 at 5 MB, 89 for a 5 MB
/// completion with Qwen3's tokenizer, 24 for a 5 MB Qwen3 chat (the router's own BPE path).
pub const RENDER_MEMORY_PER_BODY_BYTE: usize = 160;
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
    /// The part of `reserved` for the tokenizer's working memory, given back once rendered.
    render: usize,
    /// Its slot in the priority scheduler, when it is on (else one of `in_flight`'s).
    slot: Option<crate::pipeline::scheduler::Slot>,
}

/// What admission reads of who sends a request: its priority class header, the
/// trusted tenant header and its credentials (the scheduler's class and tenant).
#[derive(Debug, Clone, Copy, Default)]
pub struct Who<'a> {
    /// `x-smg-priority`.
    pub priority: Option<&'a [u8]>,
    /// The trusted tenant header's value.
    pub tenant_header: Option<&'a [u8]>,
    /// `Authorization` (an `x-api-key` as `Bearer KEY`).
    pub authorization: Option<&'a [u8]>,
}

impl<'a> Who<'a> {
    /// Read from a request's headers (the hyper front end).
    pub fn from_headers(gw: &Gateway, headers: &'a axum::http::HeaderMap) -> Self {
        let get = |name: &str| headers.get(name).map(axum::http::HeaderValue::as_bytes);
        let tenant_header = gw.config.tenants.trusted_header.as_deref().and_then(get);
        Who {
            priority: get(h1_codec::PRIORITY_HEADER),
            tenant_header,
            // `x-api-key` is `Authorization` by now (the data plane's key check moved it there).
            authorization: get("authorization"),
        }
    }
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
    /// Admits a request whose body is `body_len` bytes at once, or says why
    /// not (draining: 503; too many in flight or over the memory budget: 429).
    pub fn admit(gw: &Arc<Gateway>, body_len: usize) -> Result<Self, GatewayError> {
        Self::admit_as(gw, body_len, false)
    }

    fn admit_as(gw: &Arc<Gateway>, body_len: usize, tokenized: bool) -> Result<Self, GatewayError> {
        if gw.draining.load(Ordering::Relaxed) {
            return Err(GatewayError::Draining);
        }
        take(gw).map_err(Wait::refusal(gw))?;
        Self::reserve(gw, body_len, tokenized)
    }

    /// Admits a request, waiting for a slot in the queue when every slot is
    /// taken: 429 when the queue is full, 408 when no slot frees in time.
    pub async fn admit_waiting(gw: &Arc<Gateway>, body_len: usize) -> Result<Self, GatewayError> {
        Self::admit_waiting_as(gw, body_len, false).await
    }

    /// [`Admission::admit_waiting`] for a request from `who`: with the priority scheduler on,
    /// admitted by its class (see [`crate::pipeline::scheduler`]).
    pub async fn admit_waiting_for(gw: &Arc<Gateway>, body_len: usize, who: Who<'_>) -> Result<Self, GatewayError> {
        // The tenant, once, and only for what reads it.
        let tenant = (gw.tenant_limiter.is_some() || gw.scheduler.is_some())
            .then(|| gw.config.tenants.tenant(who.tenant_header, who.authorization))
            .flatten();
        if let Some(limiter) = &gw.tenant_limiter {
            let key = crate::pipeline::scheduler::Tenant::key(tenant);
            // Shared by every replica when the backend can say; this replica's buckets otherwise.
            let shared = match &gw.shared {
                Some(shared) => {
                    let (limits, tokens) =
                        (limiter.limits_of(&key), crate::pipeline::tenant_limits::tokens_of(body_len));
                    crate::shared::tenants::charge(shared, &key, limits, tokens).await
                }
                None => None,
            };
            if let Err(over) = shared.unwrap_or_else(|| limiter.charge(&key, body_len)) {
                gw.metrics.tenant_rate_limited.fetch_add(1, Ordering::Relaxed);
                return Err(GatewayError::TenantRateLimited(over.retry_after_secs));
            }
        }
        let Some(sched) = &gw.scheduler else { return Self::admit_waiting_as(gw, body_len, false).await };
        if gw.draining.load(Ordering::Relaxed) {
            return Err(GatewayError::Draining);
        }
        if let Some(bucket) = &gw.rate {
            bucket
                .take_share(rate_share(gw))
                .map_err(|_| GatewayError::RateLimited(gw.config.rate_limit.unwrap_or(0)))?;
        }
        let class = sched.class_of(who.priority, tenant.map(crate::pipeline::scheduler::Tenant::name));
        let started = std::time::Instant::now();
        let slot = sched.admit(class).await.map_err(|refused| {
            use crate::pipeline::scheduler::Refused;
            match refused {
                Refused::QueueFull(c) => {
                    gw.metrics.queue_full.fetch_add(1, Ordering::Relaxed);
                    GatewayError::ClassQueueFull(c.as_str())
                }
                Refused::Timeout(_, d) => {
                    gw.metrics.queue_timeouts.fetch_add(1, Ordering::Relaxed);
                    GatewayError::QueueTimeout(d)
                }
                Refused::Preempted(c) => GatewayError::Preempted(c.as_str()),
            }
        })?;
        gw.metrics.queue_wait.observe(started.elapsed().as_secs_f64());
        gw.in_flight.fetch_add(1, Ordering::AcqRel);
        Self::reserve_with(gw, body_len, false, Some(slot))
    }

    /// [`Admission::admit_waiting`] for a request that is tokenized whatever the policy (`/v1/tokenize`).
    pub(crate) async fn admit_waiting_to_tokenize(gw: &Arc<Gateway>, body_len: usize) -> Result<Self, GatewayError> {
        Self::admit_waiting_as(gw, body_len, true).await
    }

    async fn admit_waiting_as(gw: &Arc<Gateway>, body_len: usize, tokenized: bool) -> Result<Self, GatewayError> {
        match Self::admit_as(gw, body_len, tokenized) {
            Err(GatewayError::Overloaded(_) | GatewayError::RateLimited(_)) if gw.config.queue_size > 0 => {}
            other => return other,
        }
        let queue = &gw.queue;
        if queue.waiting.fetch_add(1, Ordering::AcqRel) >= gw.config.queue_size {
            queue.waiting.fetch_sub(1, Ordering::AcqRel);
            gw.metrics.queue_full.fetch_add(1, Ordering::Relaxed);
            return Err(GatewayError::QueueFull(gw.config.max_concurrent, gw.config.queue_size));
        }
        let _waiting = Waiting(queue);
        let started = std::time::Instant::now();
        let wait = async {
            loop {
                let freed = queue.freed.notified();
                tokio::pin!(freed);
                // Registered before the check: a slot freed in between wakes it.
                freed.as_mut().enable();
                if gw.draining.load(Ordering::Relaxed) {
                    return Err(GatewayError::Draining);
                }
                match take(gw) {
                    Ok(()) => return Ok(()),
                    Err(Wait::Slot) => freed.await,
                    // The next token is due then (a slot freed meanwhile changes nothing).
                    Err(Wait::Token(due)) => tokio::time::sleep(due).await,
                }
            }
        };
        let waited = tokio::time::timeout(gw.config.queue_timeout, wait).await;
        gw.metrics.queue_wait.observe(started.elapsed().as_secs_f64());
        match waited {
            Ok(Ok(())) => Self::reserve(gw, body_len, tokenized),
            Ok(Err(e)) => Err(e),
            Err(_) => {
                gw.metrics.queue_timeouts.fetch_add(1, Ordering::Relaxed);
                Err(GatewayError::QueueTimeout(gw.config.queue_timeout))
            }
        }
    }

    /// With a slot taken: reserves the request's memory (with the tokenizer's for a large body
    /// that will be tokenized: `tokenized` anyway, or by the gateway's setup), or gives the slot
    /// back. Only a large body asks whether the setup tokenizes.
    fn reserve(gw: &Arc<Gateway>, body_len: usize, tokenized: bool) -> Result<Self, GatewayError> {
        Self::reserve_with(gw, body_len, tokenized, None)
    }

    /// [`Admission::reserve`] with the scheduler's `slot` when it holds one.
    fn reserve_with(
        gw: &Arc<Gateway>,
        body_len: usize,
        tokenized: bool,
        slot: Option<crate::pipeline::scheduler::Slot>,
    ) -> Result<Self, GatewayError> {
        let render = match body_len > RENDER_INLINE_MAX_BYTES && (tokenized || tokenizes(gw)) {
            true => body_len.saturating_mul(RENDER_MEMORY_PER_BODY_BYTE),
            false => 0,
        };
        let reserved = body_len.saturating_mul(MEMORY_PER_BODY_BYTE).saturating_add(render);
        if !gw.budget.try_reserve(reserved) {
            match slot {
                // The scheduler's slot goes back as it drops.
                Some(_) => {
                    gw.in_flight.fetch_sub(1, Ordering::AcqRel);
                }
                None => release_slot(gw),
            }
            gw.metrics.over_budget.fetch_add(1, Ordering::Relaxed);
            return Err(GatewayError::OverBudget(gw.budget.limit()));
        }
        Ok(Self { gw: gw.clone(), reserved, render, slot })
    }

    /// The prompt is rendered: the tokenizer's working memory is given back.
    pub(crate) fn rendered(&mut self) {
        let render = std::mem::take(&mut self.render);
        self.gw.budget.release(render);
        self.reserved -= render;
    }

    /// Reserves `n` more bytes for this request (a worker's answer the router reads whole),
    /// released with the rest when it ends; 429 when the budget has no room.
    pub(crate) fn grow(&mut self, n: usize) -> Result<(), GatewayError> {
        if !self.gw.budget.try_reserve(n) {
            self.gw.metrics.over_budget.fetch_add(1, Ordering::Relaxed);
            return Err(GatewayError::OverBudget(self.gw.budget.limit()));
        }
        self.reserved += n;
        Ok(())
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.gw.budget.release(self.reserved);
        match self.slot.take() {
            Some(slot) => {
                self.gw.in_flight.fetch_sub(1, Ordering::AcqRel);
                drop(slot);
            }
            None => release_slot(&self.gw),
        }
    }
}

/// Requests waiting for a slot.
#[derive(Debug, Default)]
pub struct Queue {
    /// How many wait now.
    pub waiting: AtomicUsize,
    /// Woken when a slot frees while some wait.
    freed: tokio::sync::Notify,
}

/// One place in the queue, given back on drop.
struct Waiting<'a>(&'a Queue);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a request waits for.
#[derive(Debug, Clone, Copy)]
enum Wait {
    /// A slot (another request to end).
    Slot,
    /// A rate-limit token, due in this long.
    Token(std::time::Duration),
}

impl Wait {
    /// The refusal of a request that may not wait.
    fn refusal(gw: &Gateway) -> impl Fn(Wait) -> GatewayError + '_ {
        move |w| match w {
            Wait::Slot => GatewayError::Overloaded(gw.config.max_concurrent),
            Wait::Token(_) => GatewayError::RateLimited(gw.config.rate_limit.unwrap_or(0)),
        }
    }
}

/// Takes a rate-limit token (when limited) and a slot, or says which is missing.
fn take(gw: &Gateway) -> Result<(), Wait> {
    let share = rate_share(gw);
    if let Some(bucket) = &gw.rate {
        bucket.take_share(share).map_err(Wait::Token)?;
    }
    if take_slot(gw) {
        return Ok(());
    }
    if let Some(bucket) = &gw.rate {
        bucket.give_back(share);
    }
    Err(Wait::Slot)
}

/// The replicas `--rate-limit-tokens-per-second` is split among: with `--shared-state`, this
/// one and the peers heard from lately (the limit is the deployment's); 1 alone.
fn rate_share(gw: &Gateway) -> u32 {
    gw.shared.as_ref().map_or(1, |s| 1 + s.live_peers())
}

/// A token bucket (`--rate-limit-tokens-per-second`): `rate` tokens a
/// second, at most one second of them held (the burst).
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    state: std::sync::Mutex<(f64, std::time::Instant)>,
}

impl TokenBucket {
    /// A full bucket of `rate` tokens, refilled at `rate` a second.
    pub fn per_second(rate: u32) -> Self {
        let rate = f64::from(rate.max(1));
        Self { rate, state: std::sync::Mutex::new((rate, std::time::Instant::now())) }
    }

    /// Takes a token from this replica's `1 / share` of the rate (and of the burst), or says
    /// how long until one is due.
    pub fn take_share(&self, share: u32) -> Result<(), std::time::Duration> {
        let rate = self.rate / f64::from(share.max(1));
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = std::time::Instant::now();
        s.0 = (s.0 + now.duration_since(s.1).as_secs_f64() * rate).min(rate.max(1.0));
        s.1 = now;
        if s.0 >= 1.0 {
            s.0 -= 1.0;
            return Ok(());
        }
        Err(std::time::Duration::from_secs_f64((1.0 - s.0) / rate))
    }

    /// Returns a token taken for a request that did not start.
    fn give_back(&self, share: u32) {
        let rate = self.rate / f64::from(share.max(1));
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.0 = (s.0 + 1.0).min(rate.max(1.0));
    }
}

/// Takes one of the `--max-concurrent-requests` slots if one is free.
/// Never counts past the limit, even for a moment: a waiter woken by a freed
/// slot cannot lose it to a request that is about to be refused.
fn take_slot(gw: &Gateway) -> bool {
    let mut n = gw.in_flight.load(Ordering::Relaxed);
    loop {
        if n >= gw.config.max_concurrent {
            return false;
        }
        match gw.in_flight.compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(now) => n = now,
        }
    }
}

/// Gives a slot back, and wakes a waiter if any (no cost when none waits).
fn release_slot(gw: &Gateway) {
    gw.in_flight.fetch_sub(1, Ordering::AcqRel);
    if gw.queue.waiting.load(Ordering::Acquire) > 0 {
        gw.queue.freed.notify_one();
    }
}

/// What a request is charged before its body is read: its declared length, or the largest
/// body when it declares none (chunked), never more than the largest body.
pub(crate) fn declared_charge(gw: &Gateway, headers: &axum::http::HeaderMap) -> usize {
    let declared =
        headers.get(axum::http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.trim().parse::<usize>().ok());
    declared.unwrap_or(gw.config.max_body_bytes).min(gw.config.max_body_bytes)
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

/// Whether a request's prompt may be tokenized: an index to match, a policy that reads tokens,
/// or a routing config whose signals count them.
fn tokenizes(gw: &Gateway) -> bool {
    gw.index.is_some()
        || gw.pools.iter().any(|p| p.policy.needs_tokens())
        || gw.routing().is_some_and(|r| r.selector.needs_tokens() || r.selector.needs_load())
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

    #[test]
    fn a_token_bucket_holds_one_second_and_refills() {
        let b = TokenBucket::per_second(4);
        for _ in 0..4 {
            assert!(b.take_share(1).is_ok());
        }
        let due = b.take_share(1).unwrap_err();
        assert!(due <= std::time::Duration::from_millis(250) && due > std::time::Duration::ZERO, "{due:?}");
        std::thread::sleep(due + std::time::Duration::from_millis(5));
        assert!(b.take_share(1).is_ok(), "refilled");
        b.give_back(1);
        assert!(b.take_share(1).is_ok(), "given back");
    }

    #[test]
    fn replicas_sharing_a_rate_each_take_their_share_of_it_and_its_burst() {
        let b = TokenBucket::per_second(8);
        // Two replicas: four of the eight a second, four at once.
        for _ in 0..4 {
            assert!(b.take_share(2).is_ok());
        }
        let due = b.take_share(2).unwrap_err();
        assert!(due <= std::time::Duration::from_millis(250) && due > std::time::Duration::from_millis(200), "{due:?}");
        // More replicas than tokens a second: still one at a time, at the replica's pace.
        let lone = TokenBucket::per_second(2);
        assert!(lone.take_share(4).is_ok());
        let due = lone.take_share(4).unwrap_err();
        assert!(due > std::time::Duration::from_millis(1900), "half a token a second: {due:?}");
    }
}
