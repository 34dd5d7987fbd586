//! Route feedback shared by every replica (`--shared-state`): the route ids one gives out
//! (written to the backend, so that any replica takes their feedback), each judged once
//! whichever replica is asked (claimed in the backend by one Lua script, leaving a tombstone),
//! and every (decision, pool) arm's evidence summed in the backend (one hash per arm, and a
//! sorted set of the arms, the least recently updated out first past `max_arms`), read back by
//! every replica. Plain data in and out: the feedback module owns the routes and the evidence
//! and calls this, never the other way. Nothing here waits past the backend's command
//! deadline; with the backend out of reach every call says so at once.
//!
//! ```text
//! PREFIX:route:<16 hex>   "SGR1 <caller: 64 hex | 64 '-'>\n<quality | ->\n<decision>\n<pool>"  PX ttl
//! PREFIX:judged:<16 hex>  "1", as long as the route's record had left
//! PREFIX:arm:<32 hex>     hash d, p, q (names, quality), a, b, e, n (alpha, beta, Elo, updates added)
//! PREFIX:arms             sorted set of <32 hex>, by last update (ms)
//! ```

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use model_select::Evidence;
use sha2::{Digest, Sha256};
use shared_state::Reply;

use super::Shared;

/// The first bytes of a route's record (the format's version is its fourth byte).
const MAGIC: &[u8] = b"SGR1 ";
/// Longest decision or pool name shared (a longer one's routes and arm stay local).
pub(crate) const MAX_NAME: usize = 256;
/// Longest record believed.
const MAX_RECORD: usize = 70 + 32 + 2 * MAX_NAME + 2;
/// Arms read in one pipeline at most.
const CHUNK: usize = 128;
/// Largest shared total believed (a billion verdicts an arm is far past any real one).
const MAX_TOTAL: f64 = 1e12;

/// KEYS: (route, judged) per route id. ARGV[1]: the record's head for the caller; ARGV[2]: how
/// long a tombstone lasts when its record had no expiry left (ms); ARGV[2 + i]: `1` when the
/// asking replica holds route i for this caller. Returns `{'judged', i}`, `{'unknown', i}` (no
/// record, or another caller's, and not held), or `{'claimed', record or '' ...}`: the records
/// taken, each replaced by a tombstone living as long as the record would have.
const CLAIM: &str = r"
local n = #KEYS / 2
for i = 1, n do
  if redis.call('EXISTS', KEYS[2 * i]) == 1 then return {'judged', i} end
end
local out = {'claimed'}
for i = 1, n do
  local rec = redis.call('GET', KEYS[2 * i - 1])
  if rec then
    if string.sub(rec, 1, #ARGV[1]) ~= ARGV[1] then return {'unknown', i} end
    out[i + 1] = rec
  elseif ARGV[2 + i] == '1' then
    out[i + 1] = ''
  else
    return {'unknown', i}
  end
end
for i = 1, n do
  local ttl = redis.call('PTTL', KEYS[2 * i - 1])
  if ttl <= 0 then ttl = tonumber(ARGV[2]) end
  redis.call('DEL', KEYS[2 * i - 1])
  redis.call('SET', KEYS[2 * i], '1', 'PX', ttl)
end
return out
";

/// KEYS: (route, judged) per route id; ARGV[i]: route i's record ('' when none was taken).
/// Undoes a claim: the records back for what their tombstones had left, the tombstones gone.
const PUT_BACK: &str = r"
for i = 1, #KEYS / 2 do
  local ttl = redis.call('PTTL', KEYS[2 * i])
  if ARGV[i] ~= '' and ttl > 0 then redis.call('SET', KEYS[2 * i - 1], ARGV[i], 'PX', ttl) end
  redis.call('DEL', KEYS[2 * i])
end
return 1
";

/// KEYS[1]: the arm's hash; KEYS[2]: the arms by last update. ARGV: decision, pool, quality
/// ('' none); alpha, beta, Elo and updates added; arms kept at most; the arm's member; the
/// prefix of arm keys. Returns the arm's totals after: alpha, beta, Elo, updates.
const ADD: &str = r"
redis.call('HSET', KEYS[1], 'd', ARGV[1], 'p', ARGV[2], 'q', ARGV[3])
local a = redis.call('HINCRBYFLOAT', KEYS[1], 'a', ARGV[4])
local b = redis.call('HINCRBYFLOAT', KEYS[1], 'b', ARGV[5])
local e = redis.call('HINCRBYFLOAT', KEYS[1], 'e', ARGV[6])
local n = redis.call('HINCRBY', KEYS[1], 'n', ARGV[7])
local t = redis.call('TIME')
redis.call('ZADD', KEYS[2], tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), ARGV[9])
local over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[8])
if over > 0 then
  for _, m in ipairs(redis.call('ZRANGE', KEYS[2], 0, over - 1)) do redis.call('DEL', ARGV[10] .. m) end
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, over - 1)
end
return {a, b, e, n}
";

/// What a route id stands for, as the backend keeps it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Route {
    pub(crate) decision: String,
    pub(crate) pool: String,
    /// The pool's configured quality (its arm's prior).
    pub(crate) quality: Option<f64>,
    /// Who got the answer (a digest of its credentials; `None`: anonymous).
    pub(crate) caller: Option<[u8; 32]>,
}

/// What a claim of one or two route ids found.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Claim {
    /// Taken (tombstones left): each route's record, `None` where the asking replica holds the
    /// route and the backend had no record of it (not written yet, or not at all).
    Claimed(Vec<Option<Route>>),
    /// The route at this index was judged already, on some replica.
    Judged(usize),
    /// The route at this index is unknown: never given out, expired, another caller's, or
    /// its record unreadable; and not held by the asking replica.
    Unknown(usize),
    /// The backend could not say (out of reach, late, failing): the replica decides alone.
    Unavailable,
}

/// One arm's evidence as the backend sums it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Totals {
    pub(crate) decision: String,
    pub(crate) pool: String,
    pub(crate) quality: Option<f64>,
    pub(crate) evidence: Evidence,
}

/// Writes route `id`'s record to expire after `ttl`, in the background; not at all past
/// too many writes under way, with the backend out of reach or a name too long (counted).
pub(crate) fn write(shared: &Arc<Shared>, id: u64, route: &Route, ttl: Duration) {
    let c = &shared.counters;
    let Some(record) = encode(route) else {
        c.routes_unwritten.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let args = vec![b"SET".to_vec(), route_key(shared, id), record, b"PX".to_vec(), super::ttl_ms(ttl)];
    let done = |c: &super::Counters, ok: bool| {
        let counter = if ok { &c.routes_written } else { &c.routes_unwritten };
        counter.fetch_add(1, Ordering::Relaxed);
    };
    if !shared.write_behind(args, shared_state::Reply::is_ok, done) {
        c.routes_unwritten.fetch_add(1, Ordering::Relaxed);
    }
}

/// Claims route `ids` (one, or two distinct) for `caller`, all or none; `held[i]`: the asking
/// replica holds `ids[i]` for `caller` (its own record may not be written yet). A tombstone
/// whose record had no expiry left lasts `ttl`. Counted by outcome.
pub(crate) async fn claim(
    shared: &Shared,
    ids: &[u64],
    caller: Option<&[u8; 32]>,
    held: &[bool],
    ttl: Duration,
) -> Claim {
    let outcome = if shared.is_up() { try_claim(shared, ids, caller, held, ttl).await } else { Claim::Unavailable };
    let c = &shared.counters;
    let counter = match outcome {
        Claim::Claimed(_) => &c.claims_claimed,
        Claim::Judged(_) => &c.claims_judged,
        Claim::Unknown(_) => &c.claims_unknown,
        Claim::Unavailable => &c.claims_local,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    outcome
}

async fn try_claim(shared: &Shared, ids: &[u64], caller: Option<&[u8; 32]>, held: &[bool], ttl: Duration) -> Claim {
    let keys = claim_keys(shared, ids);
    let (head, ttl_ms, n) = (head(caller), ttl.as_millis().max(1).to_string(), keys.len().to_string());
    let mut args: Vec<&[u8]> = vec![b"EVAL", CLAIM.as_bytes(), n.as_bytes()];
    args.extend(keys.iter().map(Vec::as_slice));
    args.extend([head.as_slice(), ttl_ms.as_bytes()]);
    args.extend(held.iter().map(|&h| if h { &b"1"[..] } else { b"0" }));
    match shared.backend.cmd(&args).await {
        Ok(Reply::Array(parts)) => claimed(&parts, ids.len()),
        _ => Claim::Unavailable,
    }
}

/// Undoes a claim the asking replica then refused (another caller's weight, a pair of one
/// pool): `routes` as [`Claim::Claimed`] gave them. Within the command deadline; false when
/// the backend could not (the routes are then judged as far as the backend knows).
pub(crate) async fn put_back(shared: &Shared, ids: &[u64], routes: &[Option<Route>]) -> bool {
    let keys = claim_keys(shared, ids);
    let records: Vec<Vec<u8>> = routes.iter().map(|r| r.as_ref().and_then(encode).unwrap_or_default()).collect();
    let n = keys.len().to_string();
    let mut args: Vec<&[u8]> = vec![b"EVAL", PUT_BACK.as_bytes(), n.as_bytes()];
    args.extend(keys.iter().map(Vec::as_slice));
    args.extend(records.iter().map(Vec::as_slice));
    let done = matches!(shared.backend.cmd(&args).await, Ok(Reply::Int(1)));
    let c = &shared.counters;
    let counter = if done { &c.claims_returned } else { &c.claims_unreturned };
    counter.fetch_add(1, Ordering::Relaxed);
    done
}

/// Adds `delta` to the arm's shared evidence (the arm made the most recently updated of at
/// most `max_arms`); its totals after, or `None` when the backend could not (counted).
pub(crate) async fn add(
    shared: &Shared,
    (decision, pool, quality): (&str, &str, Option<f64>),
    delta: &Evidence,
    max_arms: usize,
) -> Option<Evidence> {
    let c = &shared.counters;
    let totals = if shared.is_up() && fits(decision) && fits(pool) {
        let member = arm_id(decision, pool);
        let (arm, arms, prefix) = (shared.key("arm", &member), arms_key(shared), shared.key("arm", ""));
        let q = quality.map(|q| q.to_string()).unwrap_or_default();
        let nums = [delta.alpha.to_string(), delta.beta.to_string(), delta.elo.to_string(), delta.updates.to_string()];
        let max = max_arms.max(1).to_string();
        let mut args: Vec<&[u8]> =
            vec![b"EVAL", ADD.as_bytes(), b"2", &arm, &arms, decision.as_bytes(), pool.as_bytes()];
        args.push(q.as_bytes());
        args.extend(nums.iter().map(String::as_bytes));
        args.extend([max.as_bytes(), member.as_bytes(), &prefix]);
        match shared.backend.cmd(&args).await {
            Ok(Reply::Array(parts)) => evidence(&parts),
            _ => None,
        }
    } else {
        None
    };
    let counter = if totals.is_some() { &c.evidence_shared } else { &c.evidence_local };
    counter.fetch_add(1, Ordering::Relaxed);
    totals
}

/// Every arm's totals, the most recently updated `max_arms` at most: one command for the
/// arms, then pipelines of [`CHUNK`] reads. `None` when the backend could not say (counted).
pub(crate) async fn read(shared: &Shared, max_arms: usize) -> Option<Vec<Totals>> {
    let c = &shared.counters;
    let totals = if shared.is_up() { try_read(shared, max_arms).await } else { None };
    let counter = if totals.is_some() { &c.arm_refreshes } else { &c.arm_refresh_failures };
    counter.fetch_add(1, Ordering::Relaxed);
    totals
}

async fn try_read(shared: &Shared, max_arms: usize) -> Option<Vec<Totals>> {
    let last = max_arms.clamp(1, 1 << 20) - 1;
    let members = match shared.backend.cmd(&[b"ZREVRANGE", &arms_key(shared), b"0", last.to_string().as_bytes()]).await
    {
        Ok(Reply::Array(members)) => members,
        _ => return None,
    };
    let members: Vec<&str> = members
        .iter()
        .take(last + 1)
        .filter_map(|m| std::str::from_utf8(m.as_bytes()?).ok())
        .filter(|m| m.len() == 32 && m.bytes().all(|b| b.is_ascii_hexdigit()))
        .collect();
    let mut out = Vec::with_capacity(members.len());
    for chunk in members.chunks(CHUNK) {
        let cmds: Vec<Vec<Vec<u8>>> = chunk
            .iter()
            .map(|m| {
                let mut cmd = vec![b"HMGET".to_vec(), shared.key("arm", m)];
                cmd.extend(["d", "p", "q", "a", "b", "e", "n"].map(|f| f.as_bytes().to_vec()));
                cmd
            })
            .collect();
        let replies = shared.backend.pipeline(&cmds).await.ok()?;
        for (member, reply) in chunk.iter().zip(&replies) {
            let Reply::Array(fields) = reply else { return None };
            out.extend(totals(fields).filter(|t| arm_id(&t.decision, &t.pool) == *member));
        }
    }
    Some(out)
}

/// The arm's member in the arms' set, and the end of its hash's key: 16 bytes of a SHA-256
/// over its names, in hex (keys of one bounded size whatever the names).
pub(crate) fn arm_id(decision: &str, pool: &str) -> String {
    let len = (decision.len() as u64).to_le_bytes();
    let digest = Sha256::new().chain_update(len).chain_update(decision).chain_update(pool).finalize();
    hex(&digest[..16])
}

fn arms_key(shared: &Shared) -> Vec<u8> {
    format!("{}:arms", shared.prefix).into_bytes()
}

fn route_key(shared: &Shared, id: u64) -> Vec<u8> {
    shared.key("route", &format!("{id:016x}"))
}

/// (route, judged) per id.
fn claim_keys(shared: &Shared, ids: &[u64]) -> Vec<Vec<u8>> {
    ids.iter().flat_map(|&id| [route_key(shared, id), shared.key("judged", &format!("{id:016x}"))]).collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A digest from 64 lowercase hex digits (as [`hex`] writes it).
fn unhex(text: &[u8]) -> Option<[u8; 32]> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; 32];
    for (o, pair) in out.iter_mut().zip(text.chunks_exact(2)) {
        *o = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    (text.len() == 64).then_some(out)
}

/// A name that can be shared: not empty, at most [`MAX_NAME`] bytes, no line break.
fn fits(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_NAME && !name.contains('\n')
}

/// A record's first line, which names its caller (the claim compares it in the backend).
fn head(caller: Option<&[u8; 32]>) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    match caller {
        Some(c) => out.extend_from_slice(hex(c).as_bytes()),
        None => out.extend_from_slice(&[b'-'; 64]),
    }
    out.push(b'\n');
    out
}

/// A route's record; `None` when a name cannot be shared or the quality is not one.
pub(crate) fn encode(route: &Route) -> Option<Vec<u8>> {
    if !fits(&route.decision) || !fits(&route.pool) || route.quality.is_some_and(|q| !(0.0..=1.0).contains(&q)) {
        return None;
    }
    let mut out = head(route.caller.as_ref());
    out.extend_from_slice(route.quality.map_or_else(|| "-".to_owned(), |q| q.to_string()).as_bytes());
    out.push(b'\n');
    out.extend_from_slice(route.decision.as_bytes());
    out.push(b'\n');
    out.extend_from_slice(route.pool.as_bytes());
    Some(out)
}

/// The route `bytes` records, if they are one: whole, bounded, every part sound.
pub(crate) fn decode(bytes: &[u8]) -> Option<Route> {
    if bytes.len() > MAX_RECORD || !bytes.starts_with(MAGIC) {
        return None;
    }
    let (caller, rest) = bytes[MAGIC.len()..].split_at_checked(64)?;
    let rest = rest.strip_prefix(b"\n")?;
    let caller = if caller == [b'-'; 64] { None } else { Some(unhex(caller)?) };
    let text = std::str::from_utf8(rest).ok()?;
    let mut parts = text.split('\n');
    let (quality, decision, pool) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !fits(decision) || !fits(pool) {
        return None;
    }
    let quality = match quality {
        "-" => None,
        q => Some(q.parse::<f64>().ok().filter(|q| (0.0..=1.0).contains(q))?),
    };
    Some(Route { decision: decision.to_owned(), pool: pool.to_owned(), quality, caller })
}

/// A claim's answer, for `n` route ids.
fn claimed(parts: &[Reply], n: usize) -> Claim {
    let index =
        |r: Option<&Reply>| r.and_then(Reply::as_int).and_then(|i| usize::try_from(i - 1).ok()).filter(|i| *i < n);
    match parts.first().and_then(Reply::as_bytes) {
        Some(b"judged") => index(parts.get(1)).map_or(Claim::Unavailable, Claim::Judged),
        Some(b"unknown") => index(parts.get(1)).map_or(Claim::Unavailable, Claim::Unknown),
        Some(b"claimed") if parts.len() == n + 1 => {
            let mut routes = Vec::with_capacity(n);
            for (i, part) in parts[1..].iter().enumerate() {
                match part.as_bytes() {
                    Some(b"") => routes.push(None),
                    // Taken, and unreadable: as good as never given out.
                    Some(bytes) => match decode(bytes) {
                        Some(route) => routes.push(Some(route)),
                        None => return Claim::Unknown(i),
                    },
                    None => return Claim::Unavailable,
                }
            }
            Claim::Claimed(routes)
        }
        _ => Claim::Unavailable,
    }
}

/// A number the backend sent (a bulk string or an integer), if it is a believable total.
fn number(reply: &Reply) -> Option<f64> {
    let x = match reply {
        Reply::Int(i) => *i as f64,
        r => std::str::from_utf8(r.as_bytes()?).ok()?.trim().parse::<f64>().ok()?,
    };
    (x.is_finite() && x.abs() <= MAX_TOTAL).then_some(x)
}

/// An arm's totals from the four numbers of [`ADD`]'s answer (alpha, beta, Elo, updates).
fn evidence(parts: &[Reply]) -> Option<Evidence> {
    let [a, b, e, n] = parts else { return None };
    let updates = number(n).filter(|n| *n >= 0.0 && n.fract() == 0.0)? as u64;
    Some(Evidence { alpha: number(a)?, beta: number(b)?, elo: number(e)?, updates })
}

/// An arm's totals from its hash's fields d, p, q, a, b, e, n; `None` when it is gone or unsound.
fn totals(fields: &[Reply]) -> Option<Totals> {
    let [d, p, q, rest @ ..] = fields else { return None };
    let name = |r: &Reply| std::str::from_utf8(r.as_bytes()?).ok().filter(|n| fits(n)).map(str::to_owned);
    let (decision, pool) = (name(d)?, name(p)?);
    let quality = match q.as_bytes()? {
        b"" => None,
        _ => Some(number(q).filter(|q| (0.0..=1.0).contains(q))?),
    };
    Some(Totals { decision, pool, quality, evidence: evidence(rest)? })
}

#[cfg(test)]
mod tests;
