//! Tenant rate limits held in the backend, so a tenant's limit holds across every replica:
//! the two token buckets of [`crate::pipeline::tenant_limits`] (requests and prompt tokens a
//! minute, each holding at most a minute's worth) kept as one hash per tenant and charged
//! atomically by a Lua script on the backend's clock. Out of reach, the replica's own buckets
//! decide (counted): a tenant then gets its limit per replica, never an error.

use std::sync::atomic::Ordering;

use sha2::{Digest, Sha256};
use shared_state::Reply;

use super::Shared;
use crate::pipeline::tenant_limits::{Limits, OverLimit};

/// KEYS[1]: the tenant's hash. ARGV: requests a minute, tokens a minute, tokens charged.
/// Returns 0 when charged, else the milliseconds until the charge would fit (nothing charged).
const CHARGE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rr, tr, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local v = redis.call('HMGET', KEYS[1], 'r', 't', 'at')
local r, tk, at = tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
if r == nil or tk == nil or at == nil or at > now then r = rr; tk = tr; at = now end
local dt = now - at
r = math.min(rr, r + dt * rr / 60000)
tk = math.min(tr, tk + dt * tr / 60000)
cost = math.min(cost, tr)
local wait = 0
if r < 1 then wait = math.max(wait, (1 - r) * 60000 / math.max(rr, 1)) end
if tk < cost then wait = math.max(wait, (cost - tk) * 60000 / math.max(tr, 1)) end
if wait == 0 then r = r - 1; tk = tk - cost end
redis.call('HSET', KEYS[1], 'r', tostring(r), 't', tostring(tk), 'at', tostring(now))
redis.call('PEXPIRE', KEYS[1], 120000)
return math.ceil(wait)
";

/// Charges one request of `tokens` prompt tokens to `tenant` under `limits` in the backend:
/// `Some(Ok)` charged, `Some(Err)` over the limit, `None` when the backend could not decide
/// (out of reach, late, or an answer that is not a count): the caller's own buckets then do.
pub(crate) async fn charge(
    shared: &Shared,
    tenant: &str,
    limits: Limits,
    tokens: u64,
) -> Option<Result<(), OverLimit>> {
    if !shared.is_up() {
        shared.counters.tenant_local.fetch_add(1, Ordering::Relaxed);
        return None;
    }
    // The tenant's name (a client's header) digested: keys of one bounded size.
    let digest = Sha256::digest(tenant.as_bytes());
    let id: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    let key = shared.key("tenant", &id);
    let (rr, tr, cost) =
        (limits.requests_per_minute.to_string(), limits.tokens_per_minute.to_string(), tokens.to_string());
    let args: [&[u8]; 7] = [b"EVAL", CHARGE.as_bytes(), b"1", &key, rr.as_bytes(), tr.as_bytes(), cost.as_bytes()];
    match shared.backend.cmd(&args).await {
        Ok(Reply::Int(wait_ms)) if wait_ms >= 0 => {
            shared.counters.tenant_shared.fetch_add(1, Ordering::Relaxed);
            if wait_ms == 0 {
                return Some(Ok(()));
            }
            let secs = (wait_ms as u64).div_ceil(1000).clamp(1, 3600) as u32;
            Some(Err(OverLimit { retry_after_secs: secs }))
        }
        _ => {
            shared.counters.tenant_local.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}
