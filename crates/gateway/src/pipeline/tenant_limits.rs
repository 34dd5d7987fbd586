//! Per-tenant rate limits (Shepherd Model Gateway 1.13's
//! `--tenant-rate-limit-enabled`, `--tenant-rate-limit-config`): each tenant
//! has two token buckets, requests per minute and prompt tokens per minute,
//! each holding at most one minute of its rate and refilled continuously. A
//! request is charged one request and its estimated prompt tokens (its body's
//! bytes over [`BYTES_PER_TOKEN`]) at admission, before its body is read; over
//! either, it is answered 429 `tenant_rate_limit_exceeded` with `Retry-After`.
//! Tenants are keyed as SMG keys them: `auth:ID` (its `--tenant-api-key`),
//! `header:ID` (the trusted tenant header) and `anonymous`. A tenant the
//! configuration names has its own limits; every other one gets the default
//! policy's, in buckets of its own, up to [`MAX_TENANTS`]; past it they share
//! one.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Bytes of a body counted as one prompt token when it is charged.
pub const BYTES_PER_TOKEN: usize = 4;
/// Tenants with buckets of their own, besides the configured ones.
pub const MAX_TENANTS: usize = 10_000;

/// The prompt tokens a body of `body_len` bytes is charged.
pub fn tokens_of(body_len: usize) -> u64 {
    (body_len / BYTES_PER_TOKEN).max(1) as u64
}

/// One policy: its rates per minute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Requests per minute.
    pub requests_per_minute: u32,
    /// Prompt tokens per minute.
    pub tokens_per_minute: u32,
}

/// The configuration: the default policy and the named tenants' (keyed `auth:ID`, `header:ID`, `anonymous`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantLimitsConfig {
    /// Every tenant the configuration does not name.
    pub default: Limits,
    /// Each named tenant's.
    pub tenants: HashMap<String, Limits>,
}

/// A bucket of `rate` a minute, holding at most a minute's worth.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    level: f64,
    at: Instant,
}

impl Bucket {
    fn full(per_minute: u32, now: Instant) -> Self {
        Self { level: f64::from(per_minute), at: now }
    }

    fn refill(&mut self, per_minute: u32, now: Instant) {
        let rate = f64::from(per_minute) / 60.0;
        self.level = (self.level + now.duration_since(self.at).as_secs_f64() * rate).min(f64::from(per_minute));
        self.at = now;
    }

    /// How long until `n` fit (zero: they fit now).
    fn wait_for(&self, n: f64, per_minute: u32) -> Duration {
        if self.level >= n {
            return Duration::ZERO;
        }
        let rate = f64::from(per_minute.max(1)) / 60.0;
        Duration::from_secs_f64(((n - self.level) / rate).min(3600.0))
    }
}

#[derive(Debug, Clone, Copy)]
struct TenantBuckets {
    requests: Bucket,
    tokens: Bucket,
}

/// The limiter.
#[derive(Debug)]
pub struct TenantLimiter {
    config: TenantLimitsConfig,
    buckets: Mutex<HashMap<String, TenantBuckets>>,
}

/// Why a request is over its tenant's limit, and when to retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverLimit {
    /// Seconds until the charge would fit (at least 1).
    pub retry_after_secs: u32,
}

/// The key of the tenants past [`MAX_TENANTS`], who share one pair of buckets.
const OVERFLOW: &str = "\u{0}overflow";

impl TenantLimiter {
    /// A limiter with `config`.
    pub fn new(config: TenantLimitsConfig) -> Self {
        Self { config, buckets: Mutex::new(HashMap::new()) }
    }

    /// Charges one request of `body_len` bytes to `tenant` (its key, `auth:ID`, `header:ID` or
    /// `anonymous`), or says when it would fit. Nothing is charged when it does not.
    pub fn charge(&self, tenant: &str, body_len: usize) -> Result<(), OverLimit> {
        let limits = self.limits_of(tenant);
        let tokens = tokens_of(body_len) as f64;
        let now = Instant::now();
        let mut all = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let named = self.config.tenants.contains_key(tenant);
        let key = if named || all.contains_key(tenant) || all.len() < MAX_TENANTS + self.config.tenants.len() {
            tenant
        } else {
            OVERFLOW
        };
        let b = all.entry(key.to_string()).or_insert_with(|| TenantBuckets {
            requests: Bucket::full(limits.requests_per_minute, now),
            tokens: Bucket::full(limits.tokens_per_minute, now),
        });
        b.requests.refill(limits.requests_per_minute, now);
        b.tokens.refill(limits.tokens_per_minute, now);
        // A prompt larger than a whole minute's tokens is charged the minute's worth: it runs
        // when the bucket is full, alone.
        let tokens = tokens.min(f64::from(limits.tokens_per_minute));
        let wait = b
            .requests
            .wait_for(1.0, limits.requests_per_minute)
            .max(b.tokens.wait_for(tokens, limits.tokens_per_minute));
        if !wait.is_zero() {
            return Err(OverLimit { retry_after_secs: wait.as_secs_f64().ceil().max(1.0) as u32 });
        }
        b.requests.level -= 1.0;
        b.tokens.level -= tokens;
        Ok(())
    }

    /// `tenant`'s limits: its own if the configuration names it, else the default policy's.
    pub fn limits_of(&self, tenant: &str) -> Limits {
        self.config.tenants.get(tenant).copied().unwrap_or(self.config.default)
    }

    /// Tenants with buckets now.
    pub fn tenants(&self) -> usize {
        self.buckets.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter() -> TenantLimiter {
        let mut tenants = HashMap::new();
        tenants.insert("auth:small".to_string(), Limits { requests_per_minute: 3, tokens_per_minute: 1_000_000 });
        tenants.insert("auth:thin".to_string(), Limits { requests_per_minute: 1000, tokens_per_minute: 100 });
        TenantLimiter::new(TenantLimitsConfig {
            default: Limits { requests_per_minute: 1000, tokens_per_minute: 1_000_000 },
            tenants,
        })
    }

    #[test]
    fn each_tenant_has_its_own_buckets_of_requests_and_tokens() {
        let l = limiter();
        for _ in 0..3 {
            l.charge("auth:small", 100).unwrap();
        }
        let over = l.charge("auth:small", 100).unwrap_err();
        assert_eq!(over.retry_after_secs, 20, "one request a 20 s");
        // Another tenant is not charged for it.
        for _ in 0..10 {
            l.charge("auth:other", 100).unwrap();
        }
        // Tokens: 100 a minute, a 400-byte body is 100 of them.
        l.charge("auth:thin", 400).unwrap();
        assert!(l.charge("auth:thin", 4).is_err(), "the minute's tokens are spent");
        // A prompt larger than the minute's tokens is charged the minute's worth.
        let fresh = limiter();
        fresh.charge("auth:thin", 1 << 20).unwrap();
    }

    #[test]
    fn tenants_past_the_bound_share_one_pair_of_buckets() {
        let l = TenantLimiter::new(TenantLimitsConfig {
            default: Limits { requests_per_minute: 1, tokens_per_minute: 1_000_000 },
            tenants: HashMap::new(),
        });
        for i in 0..MAX_TENANTS {
            l.charge(&format!("header:t{i}"), 10).unwrap();
        }
        assert_eq!(l.tenants(), MAX_TENANTS);
        l.charge("header:late-1", 10).unwrap();
        assert!(l.charge("header:late-2", 10).is_err(), "the overflow bucket is shared");
        assert_eq!(l.tenants(), MAX_TENANTS + 1);
    }
}
