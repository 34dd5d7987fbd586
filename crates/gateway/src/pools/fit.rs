//! The `fit_context` plugin: a chat longer than its pool's context window cut
//! to fit (the leading system messages and the latest turns kept, the oldest
//! turns dropped from a user turn on), or refused when even its last turn alone
//! does not fit. Counted by the pool's own renderer, exactly.

use serde_json::Value;

use super::{Asked, Pool};
use crate::GatewayError;
use crate::pipeline::request::Route;

/// The answer's header saying how many messages were dropped.
pub(crate) const DROPPED_HEADER: &str = "x-route-context-dropped";

/// Cuts chat `v` to fit `pool`'s context window with the tokens it may generate
/// (`max_tokens`); returns how many messages were dropped (`None`: nothing to cut: it fits,
/// the pool has no window, or it is no chat). The fewest turns are dropped: a binary search
/// over the cuts, each rendered by the pool's renderer.
pub(super) fn context(
    pool: &Pool,
    route: Route,
    v: &mut Value,
    ask: &Asked<'_>,
) -> Result<Option<usize>, GatewayError> {
    let Some(window) = pool.context_window.filter(|_| route == Route::Chat) else { return Ok(None) };
    let max_tokens = super::choose::max_tokens(v);
    let fits = |v: &Value| -> Result<bool, GatewayError> {
        let tokens = ask.planner.render(&pool.renderer, route, v, true)?.tokens;
        Ok(tokens.len() as u64 + max_tokens <= window)
    };
    let prompt = ask.renders.tokens(ask.planner, &pool.renderer, route, v)?.tokens.len() as u64;
    if prompt + max_tokens <= window {
        return Ok(None);
    }
    let Some(messages) = v.get("messages").and_then(Value::as_array) else { return Ok(None) };
    let role = |m: &Value| m.get("role").and_then(Value::as_str).unwrap_or_default().to_owned();
    let leading = messages.iter().take_while(|m| matches!(role(m).as_str(), "system" | "developer")).count();
    // A cut drops the `d` turns after the system messages; the first turn kept is a user's
    // (no assistant answer nor tool result left without what it answered), the last is kept.
    let cuts: Vec<usize> =
        (1..messages.len().saturating_sub(leading)).filter(|&d| role(&messages[leading + d]) == "user").collect();
    let cut = |d: usize| -> Value {
        let mut out = v.clone();
        if let Some(list) = out.get_mut("messages").and_then(Value::as_array_mut) {
            list.drain(leading..leading + d);
        }
        out
    };
    // The fewest dropped that fits: fewer turns never render longer.
    let (mut lo, mut hi) = (0, cuts.len());
    while lo < hi {
        let mid = (lo + hi) / 2;
        if fits(&cut(cuts[mid]))? {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    let Some(&dropped) = cuts.get(lo) else {
        return Err(GatewayError::BadRequest(format!(
            "the chat does not fit pool `{}`'s context window of {window} tokens ({prompt} prompt + {max_tokens} \
             max tokens), not even with only its system messages and its last turn",
            pool.id
        )));
    };
    *v = cut(dropped);
    Ok(Some(dropped))
}
