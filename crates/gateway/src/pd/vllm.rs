//! vLLM's disaggregation with the NIXL connector (pull, vLLM's default): the
//! prefill leg first, the client's body cut to one token (`max_tokens` 1,
//! not streamed) with `kv_transfer_params.do_remote_decode`; its answer's
//! `kv_transfer_params` name the blocks it kept; then the decode leg, the
//! client's body as it came plus those params verbatim. Both legs carry the
//! same `X-Request-Id`.
//!
//! Decode is never sent without complete params (`do_remote_prefill`, the
//! remote engine, request, host, port and a non-empty block list): vLLM
//! would prefill locally, silently, with a right answer and the
//! disaggregation lost. Prompt logprobs come from prefill (decode computed
//! none) and are merged into decode's answer, as vllm-router merges them.
//!
//! A prefill whose params say `transfer_mode: push` (NixlPushConnector)
//! pushes the KV to its decode peer, which needs only the prefill's identity
//! (engine id, side-channel host and port, parallel sizes), matched by the
//! shared request id: once a prefill worker is seen in push mode, its
//! requests send both legs at once with that identity, and fall back to two
//! stages when its answers stop saying push.

use axum::body::Bytes;
use axum::response::Response;
use serde_json::{Value, json};

use super::dual::{Watch, both_heads, heads_ok};
use super::{Ctx, Failure, Leg, MAX_LEG_ANSWER, Pair, json_answer, leg_body, leg_head, read_answer, with_params};
use crate::pipeline::account::InFlight;
use crate::pipeline::admission::Admission;
use crate::relay::{Ending, stream_back};

/// The params decode needs of prefill's answer for a real pull.
const REQUIRED: [&str; 6] =
    ["do_remote_prefill", "remote_engine_id", "remote_request_id", "remote_host", "remote_port", "remote_block_ids"];

/// Largest prefill answer read when the client asked no prompt logprobs: a one-token answer
/// and its `kv_transfer_params` (with prompt logprobs, [`MAX_LEG_ANSWER`]). Reserved in the
/// memory budget before the read.
const MAX_PREFILL_ANSWER: usize = 2 << 20;
/// Largest `kv_transfer_params` passed on to decode, as JSON: a block id per page of the
/// prompt (a 1M-token prompt in 16-token pages is about 460 KB of ids).
pub(crate) const MAX_KV_PARAMS_BYTES: usize = 1 << 20;

/// The most of prefill's answer read for the request `v`.
pub(super) fn prefill_answer_cap(v: &Value) -> usize {
    if wants_prompt_logprobs(v) { MAX_LEG_ANSWER } else { MAX_PREFILL_ANSWER }
}

/// What a push-mode decode needs of its prefill: who it is, not what it kept.
const PUSH_IDENTITY: [&str; 6] = ["remote_engine_id", "remote_host", "remote_port", "tp_size", "pp_size", "dcp_size"];

/// One attempt on `pair`; on failure, why, and the admission back for the next attempt.
pub(super) async fn attempt(
    ctx: &Ctx<'_>,
    pair: &Pair,
    admission: Admission,
) -> Result<Response, (Failure, Admission)> {
    let gw = ctx.gw;
    let (p, d) = (pair.prefill.chosen().clone(), pair.decode.chosen().clone());
    if ctx.pd.connector == super::KvConnector::Mooncake {
        return mooncake_attempt(ctx, pair, admission).await;
    }
    if let Some(identity) = push_identity(&p) {
        return push_attempt(ctx, pair, admission, identity).await;
    }
    let rank = pair.vllm_rank();
    let (p_load, d_load) = pair.charge(rank);
    let sent = std::time::Instant::now();
    let (prefill, params) = match pull_params(ctx, &p, rank).await {
        Ok(pulled) => pulled,
        Err(failure) => return Err((failure, admission)),
    };
    drop(p_load);
    let decode = with_params(&ctx.v, params);
    let resp = match leg_head(ctx, Leg::Decode, &d, decode, None).await {
        Ok(resp) => resp,
        Err(failure) => return Err((failure, admission)),
    };
    d.request_succeeded();
    gw.metrics.pd_legs.inc(format_args!("leg=\"decode\",outcome=\"ok\""));
    gw.metrics.pd_heads.observe(sent.elapsed().as_secs_f64());
    gw.metrics.ttfb.observe(ctx.start.elapsed().as_secs_f64());
    let mut guard = InFlight::new(gw.clone(), admission, d_load, ctx.route, ctx.start);
    if ctx.stream || !wants_prompt_logprobs(&ctx.v) {
        return Ok(stream_back(guard, d, resp, &gw.config.limits, Ending::default()));
    }
    let status = resp.status().as_u16();
    guard.status = status;
    let body = match read_answer(gw, resp.into_body()).await {
        Ok(b) => b,
        Err(e) => {
            crate::relay::failed_mid_answer(&d, &e, None);
            guard.status = 502;
            let e = crate::GatewayError::Upstream { worker: d.url.to_string(), message: e, retryable: false };
            return Ok(axum::response::IntoResponse::into_response(e));
        }
    };
    let Ok(mut answer) = serde_json::from_slice::<Value>(&body) else {
        return Ok(json_answer(status, &Value::String(String::from_utf8_lossy(&body).into_owned())));
    };
    merge_prompt_logprobs(&prefill, &mut answer);
    Ok(json_answer(status, &answer))
}

/// The prefill leg of a pull (one token, `do_remote_decode`): its answer, parsed, and the
/// `kv_transfer_params` decode needs, complete (else the failure: decode is never sent a leg
/// it would prefill itself). The answer is read within [`prefill_answer_cap`] (reserved in the
/// memory budget by the caller).
pub(super) async fn pull_params(
    ctx: &Ctx<'_>,
    p: &std::sync::Arc<fleet::Worker>,
    rank: Option<router_types::DpRank>,
) -> Result<(Value, Value), Failure> {
    let resp = leg_head(ctx, Leg::Prefill, p, prefill_body(&ctx.v, nixl_pull()), rank).await?;
    let answer = leg_body(ctx.gw, (Leg::Prefill, p), resp, prefill_answer_cap(&ctx.v)).await?;
    let prefill: Value = serde_json::from_slice(&answer).unwrap_or(Value::Null);
    let params = complete_params(prefill.get("kv_transfer_params")).map_err(|missing| Failure::Params {
        worker: p.clone(),
        message: format!(
            "the prefill worker answered without complete kv_transfer_params (missing {missing}); decode is not sent it (vLLM would prefill locally)"
        ),
    })?;
    p.request_succeeded();
    ctx.gw.metrics.pd_legs.inc(format_args!("leg=\"prefill\",outcome=\"ok\""));
    learn_push(p, &params);
    Ok((prefill, params))
}

/// Both legs at once to a prefill seen in push mode: decode with the
/// prefill's identity, matched to it by the shared `X-Request-Id`.
async fn push_attempt(
    ctx: &Ctx<'_>,
    pair: &Pair,
    admission: Admission,
    identity: Value,
) -> Result<Response, (Failure, Admission)> {
    let gw = ctx.gw;
    let (p, d) = (pair.prefill.chosen().clone(), pair.decode.chosen().clone());
    let rank = pair.vllm_rank();
    let decode = with_params(&ctx.v, identity);
    let (p_load, d_load) = pair.charge(rank);
    let sent = std::time::Instant::now();
    let pf = crate::h1::answer::send(ctx.extra.clone(), &p, ctx.route, prefill_body(&ctx.v, nixl_pull()), rank);
    let df = crate::h1::answer::send(ctx.extra.clone(), &d, ctx.route, decode, None);
    let (ph, dh) = match both_heads(gw, pf, df, &p, &d, None).await {
        Ok(heads) => heads,
        Err(failure) => {
            super::forget_push(&p);
            return Err((failure, admission));
        }
    };
    heads_ok(gw, ctx, sent, &p, &d);
    let guard = InFlight::new(gw.clone(), admission, d_load, ctx.route, ctx.start);
    let watch = Watch { gw: gw.clone(), prefill: p, decode: d, rid: None, load: p_load, push: true };
    Ok(watch.relay(guard, ph, dh))
}

/// Mooncake: both legs at once, linked by a fresh `transfer_id`; decode is
/// told the prefill's bootstrap address and engine id (from its `GET /query`).
async fn mooncake_attempt(ctx: &Ctx<'_>, pair: &Pair, admission: Admission) -> Result<Response, (Failure, Admission)> {
    let gw = ctx.gw;
    let (p, d) = (pair.prefill.chosen().clone(), pair.decode.chosen().clone());
    let rank = pair.vllm_rank();
    let host = p.endpoint(ctx.route.path()).and_then(|u| u.host().map(str::to_string)).unwrap_or_default();
    let addr = format!("http://{host}:{}", p.bootstrap_port().unwrap_or(MOONCAKE_BOOTSTRAP_PORT));
    let engines = match engine_ids(gw, &p, &addr).await {
        Ok(e) => e,
        Err(message) => return Err((Failure::Params { worker: p, message }, admission)),
    };
    let Some(engine_id) = engines.get(&rank.map_or(0, |r| r.0)).or_else(|| engines.values().next()).cloned() else {
        let message = format!("the prefill worker's Mooncake bootstrap server {addr} lists no engine");
        return Err((Failure::Params { worker: p, message }, admission));
    };
    let transfer_id = format!("xfer-{}.{:x}", ctx.meta.id, crate::random_u64() & 0xffff_ffff);
    let prefill =
        prefill_body(&ctx.v, json!({"do_remote_decode": true, "do_remote_prefill": false, "transfer_id": transfer_id}));
    let decode = with_params(
        &ctx.v,
        json!({"do_remote_decode": false, "do_remote_prefill": true, "remote_bootstrap_addr": addr,
                   "remote_engine_id": engine_id, "transfer_id": transfer_id}),
    );
    let (p_load, d_load) = pair.charge(rank);
    let sent = std::time::Instant::now();
    let pf = crate::h1::answer::send(ctx.extra.clone(), &p, ctx.route, prefill, rank);
    let df = crate::h1::answer::send(ctx.extra.clone(), &d, ctx.route, decode, None);
    let (ph, dh) = match both_heads(gw, pf, df, &p, &d, None).await {
        Ok(heads) => heads,
        Err(failure) => {
            // The engine may have restarted under a new id: asked again next time.
            p.update_pd_facts(|f| f.engine_ids = None);
            return Err((failure, admission));
        }
    };
    heads_ok(gw, ctx, sent, &p, &d);
    let guard = InFlight::new(gw.clone(), admission, d_load, ctx.route, ctx.start);
    let watch = Watch { gw: gw.clone(), prefill: p, decode: d, rid: None, load: p_load, push: false };
    Ok(watch.relay(guard, ph, dh))
}

/// vLLM's default Mooncake bootstrap port (`VLLM_MOONCAKE_BOOTSTRAP_PORT`).
const MOONCAKE_BOOTSTRAP_PORT: u16 = 8998;
/// Most data-parallel ranks read from a bootstrap server's `/query`.
const MAX_QUERY_RANKS: usize = 256;

/// The engine ids of prefill `p` by rank: known, or asked of its bootstrap server at `addr`.
async fn engine_ids(
    gw: &crate::Gateway,
    p: &fleet::Worker,
    addr: &str,
) -> Result<std::collections::HashMap<u32, String>, String> {
    if let Some(known) = p.pd_facts().engine_ids {
        return Ok(known);
    }
    let url = format!("{addr}/query");
    let fail = |why: String| format!("the prefill worker's Mooncake bootstrap server {url}: {why}");
    let resp = gw.fleet.client().get(&url).send().await.map_err(|e| fail(e.to_string()))?;
    if !resp.status().is_success() {
        return Err(fail(format!("answered {}", resp.status())));
    }
    let body = fleet::read_capped(resp).await.ok_or_else(|| fail("no answer within 1 MiB".into()))?;
    let v: Value = serde_json::from_slice(&body).map_err(|e| fail(e.to_string()))?;
    let ids: std::collections::HashMap<u32, String> = v
        .as_object()
        .into_iter()
        .flatten()
        .take(MAX_QUERY_RANKS)
        .filter_map(|(rank, e)| Some((rank.parse().ok()?, e.get("engine_id")?.as_str()?.chars().take(256).collect())))
        .collect();
    if ids.is_empty() {
        return Err(fail("no engine ids".into()));
    }
    p.update_pd_facts(|f| f.engine_ids = Some(ids.clone()));
    Ok(ids)
}

/// The identity a push-mode decode leg gets for prefill `p`, if `p` was seen in push mode.
pub(super) fn push_identity(p: &fleet::Worker) -> Option<Value> {
    p.pd_facts().push_identity
}

/// Remembers `p` as a push-mode prefill when its params say so, with the identity a decode needs.
fn learn_push(p: &fleet::Worker, params: &Value) {
    if params.get("transfer_mode").and_then(Value::as_str) != Some("push") {
        return;
    }
    let mut identity = serde_json::Map::new();
    identity.insert("do_remote_prefill".into(), json!(true));
    identity.insert("do_remote_decode".into(), json!(false));
    identity.insert("transfer_mode".into(), json!("push"));
    for k in PUSH_IDENTITY {
        if let Some(v) = params.get(k) {
            identity.insert(k.into(), v.clone());
        }
    }
    let needed = ["remote_engine_id", "remote_host", "remote_port", "tp_size"];
    if needed.iter().all(|k| identity.contains_key(*k)) {
        p.update_pd_facts(|f| f.push_identity = Some(Value::Object(identity)));
    }
}

/// NIXL's prefill params: keep the KV for a remote decode.
pub(super) fn nixl_pull() -> Value {
    json!({"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
           "remote_block_ids": null, "remote_host": null, "remote_port": null})
}

/// The prefill leg's body: one token, not streamed, with the connector's `params`.
fn prefill_body(v: &Value, params: Value) -> Bytes {
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        o.insert("max_tokens".into(), json!(1));
        if o.contains_key("max_completion_tokens") {
            o.insert("max_completion_tokens".into(), json!(1));
        }
        if o.get("min_tokens").and_then(Value::as_u64).is_some_and(|n| n > 1) {
            o.insert("min_tokens".into(), json!(1));
        }
        o.insert("stream".into(), json!(false));
        o.remove("stream_options");
        o.insert("kv_transfer_params".into(), params);
    }
    Bytes::from(serde_json::to_vec(&v).unwrap_or_default())
}

/// Prefill's `kv_transfer_params` (its answer's field, or its gRPC completion's) when a decode
/// can pull with them; else the fields missing.
pub(super) fn complete_params(params: Option<&Value>) -> Result<Value, String> {
    let params = params.filter(|p| p.is_object()).ok_or("kv_transfer_params")?;
    let size = serde_json::to_vec(params).map_or(usize::MAX, |b| b.len());
    if size > MAX_KV_PARAMS_BYTES {
        return Err(format!("kv_transfer_params within {MAX_KV_PARAMS_BYTES} bytes (it sent {size})"));
    }
    let missing: Vec<&str> = REQUIRED
        .into_iter()
        .filter(|k| match (*k, params.get(*k)) {
            ("do_remote_prefill", Some(v)) => v.as_bool() != Some(true),
            ("remote_port", Some(v)) => !v.is_u64(),
            ("remote_block_ids", Some(Value::Array(ids))) => ids.is_empty(),
            ("remote_block_ids", _) => true,
            (_, Some(v)) => !v.is_string(),
            (_, None) => true,
        })
        .collect();
    if missing.is_empty() { Ok(params.clone()) } else { Err(missing.join(", ")) }
}

/// Whether the client asked for prompt logprobs (`prompt_logprobs`, or completions' `echo` with `logprobs`).
pub(super) fn wants_prompt_logprobs(v: &Value) -> bool {
    let set = |k: &str| v.get(k).is_some_and(|x| !x.is_null() && x != &json!(false));
    set("prompt_logprobs") || (v.get("echo") == Some(&json!(true)) && set("logprobs"))
}

/// Prefill's prompt logprobs into decode's answer: the top-level
/// `prompt_logprobs` (chat), each choice's `prompt_logprobs`, and with
/// `echo`, the prompt part of each choice's `logprobs` before decode's.
fn merge_prompt_logprobs(prefill: &Value, decode: &mut Value) {
    let missing = |v: Option<&Value>| v.is_none_or(Value::is_null);
    if let Some(pl) = prefill.get("prompt_logprobs").filter(|p| !p.is_null())
        && missing(decode.get("prompt_logprobs"))
        && let Some(o) = decode.as_object_mut()
    {
        o.insert("prompt_logprobs".into(), pl.clone());
    }
    let (Some(pc), Some(dc)) =
        (prefill.get("choices").and_then(Value::as_array), decode.get_mut("choices").and_then(Value::as_array_mut))
    else {
        return;
    };
    for (p, d) in pc.iter().zip(dc.iter_mut()) {
        let Some(prompt) = p.get("prompt_logprobs").filter(|x| !x.is_null()) else { continue };
        let n = prompt.as_array().map_or(0, Vec::len);
        if missing(d.get("prompt_logprobs"))
            && let Some(o) = d.as_object_mut()
        {
            o.insert("prompt_logprobs".into(), prompt.clone());
        }
        let (Some(pl), Some(dl)) = (p.get("logprobs").filter(|x| x.is_object()), d.get_mut("logprobs")) else {
            continue;
        };
        let Some(dl) = dl.as_object_mut() else { continue };
        for key in ["tokens", "token_logprobs", "top_logprobs"] {
            let head: Vec<Value> =
                pl.get(key).and_then(Value::as_array).map(|a| a.iter().take(n).cloned().collect()).unwrap_or_default();
            let tail = dl.get(key).and_then(Value::as_array).cloned().unwrap_or_default();
            dl.insert(key.into(), Value::Array(head.into_iter().chain(tail).collect()));
        }
        // Decode's offsets follow the prompt's text.
        let offsets: Vec<u64> = pl
            .get("text_offset")
            .and_then(Value::as_array)
            .map(|a| a.iter().take(n).filter_map(Value::as_u64).collect())
            .unwrap_or_default();
        let last_token =
            pl.get("tokens").and_then(|t| t.get(n.checked_sub(1)?)).and_then(Value::as_str).map_or(0, str::len);
        let shift = offsets.last().map_or(0, |o| o + last_token as u64);
        let tail: Vec<Value> = dl
            .get("text_offset")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_u64).map(|o| json!(o + shift)).collect())
            .unwrap_or_default();
        if !offsets.is_empty() || !tail.is_empty() {
            dl.insert("text_offset".into(), Value::Array(offsets.into_iter().map(Value::from).chain(tail).collect()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefill_body_is_one_token_not_streamed() {
        let v = json!({"model": "m", "prompt": "hi", "max_tokens": 50, "max_completion_tokens": 50, "min_tokens": 5,
                       "stream": true, "stream_options": {"include_usage": true}});
        let b: Value = serde_json::from_slice(&prefill_body(&v, nixl_pull())).unwrap();
        assert_eq!(
            (b["max_tokens"].clone(), b["max_completion_tokens"].clone(), b["min_tokens"].clone()),
            (json!(1), json!(1), json!(1))
        );
        assert_eq!(b["stream"], false);
        assert!(b.get("stream_options").is_none());
        assert_eq!(b["kv_transfer_params"]["do_remote_decode"], true);
        assert_eq!(b["kv_transfer_params"]["remote_block_ids"], Value::Null);
    }

    #[test]
    fn incomplete_params_are_named() {
        let full = json!({"kv_transfer_params": {"do_remote_prefill": true, "do_remote_decode": false,
            "remote_engine_id": "e", "remote_request_id": "cmpl-1-abcd", "remote_host": "10.0.0.1",
            "remote_port": 5600, "remote_block_ids": [1, 2], "tp_size": 1}});
        assert!(complete_params(full.get("kv_transfer_params")).is_ok());
        assert_eq!(complete_params(json!({}).get("kv_transfer_params")).unwrap_err(), "kv_transfer_params");
        let mut huge = full.clone();
        huge["kv_transfer_params"]["remote_block_ids"] = json!(vec![123_456_789u64; 200_000]);
        assert!(
            complete_params(huge.get("kv_transfer_params")).unwrap_err().contains("within 1048576 bytes"),
            "over the bound"
        );
        let mut partial = full.clone();
        partial["kv_transfer_params"]["remote_block_ids"] = json!([]);
        partial["kv_transfer_params"].as_object_mut().unwrap().remove("remote_host");
        assert_eq!(complete_params(partial.get("kv_transfer_params")).unwrap_err(), "remote_host, remote_block_ids");
        partial = full.clone();
        partial["kv_transfer_params"]["do_remote_prefill"] = json!(false);
        assert_eq!(complete_params(partial.get("kv_transfer_params")).unwrap_err(), "do_remote_prefill");
    }

    #[test]
    fn prompt_logprobs_come_from_prefill() {
        let prefill = json!({"prompt_logprobs": [null, {"5": {"logprob": -1.0}}], "choices": [{"prompt_logprobs": [null, 1],
            "logprobs": {"tokens": ["a", "bc", "x"], "token_logprobs": [null, -1.0, -0.5], "top_logprobs": [null, {}, {}], "text_offset": [0, 1, 3]}}]});
        let mut decode = json!({"choices": [{"logprobs": {"tokens": ["y", "z"], "token_logprobs": [-0.1, -0.2], "top_logprobs": [{}, {}], "text_offset": [0, 1]}}]});
        merge_prompt_logprobs(&prefill, &mut decode);
        assert_eq!(decode["prompt_logprobs"], prefill["prompt_logprobs"]);
        let l = &decode["choices"][0]["logprobs"];
        assert_eq!(l["tokens"], json!(["a", "bc", "y", "z"]));
        assert_eq!(l["token_logprobs"], json!([null, -1.0, -0.1, -0.2]));
        assert_eq!(l["text_offset"], json!([0, 1, 3, 4]));
        assert_eq!(decode["choices"][0]["prompt_logprobs"], json!([null, 1]));
    }
}
