//! SGLang's disaggregation: one body, the client's plus `bootstrap_host`,
//! `bootstrap_port` and a fresh `bootstrap_room` (one per item of a batch),
//! to the same path on the prefill and the decode worker, at once (prefill
//! answers only after decode pulled the KV: one after the other deadlocks).
//!
//! Rooms are chosen so that `room % dp_size` is the prefill rank the router
//! wants (the rank holding the prefix, or the least loaded one), which is
//! where SGLang's `follow_bootstrap_room` puts it; both legs also carry
//! `disagg_prefill_dp_rank`, and the prefill leg `routed_dp_rank`, so the
//! rank is right whatever the prefill's balancing method. Each attempt has
//! a `rid` the router set, so a leg can be aborted by `/abort_request`.
//!
//! Either leg failing (unreachable, a non-2xx head, or, after the heads, an
//! error in the prefill's answer) aborts the other at once: its connection
//! closed and `/abort_request` sent, so no leg waits out the engine's 300 s
//! bootstrap timeout. The client gets decode's answer, with prefill's prompt
//! logprobs before decode's when `return_logprob` asks for them (as SGLang's
//! own load balancer merges them, streamed or not).

use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::Response;
use router_types::DpRank;
use serde_json::{Value, json};

use super::dual::{Watch, both_heads, heads_ok};
use super::{Ctx, Failure, MAX_LEG_ANSWER, Pair, json_answer, read_answer};
use crate::h1::upstream::Extra;
use crate::pipeline::account::InFlight;
use crate::pipeline::admission::Admission;
use crate::pipeline::request::Route;
use fleet::{LoadGuard, Worker};

/// One attempt on `pair`; on failure, why, and the admission back for the next attempt.
pub(super) async fn attempt(
    ctx: &Ctx<'_>,
    pair: &Pair,
    admission: Admission,
) -> Result<Response, (Failure, Admission)> {
    let gw = ctx.gw;
    let (p, d) = (pair.prefill.chosen().clone(), pair.decode.chosen().clone());
    let (rank, dp) = rank_of(ctx, pair, &p);
    let rooms: Vec<u64> = (0..ctx.batch.unwrap_or(1)).map(|_| room_for(rank.0, dp)).collect();
    let (prefill_body, decode_body, rid) = bodies(ctx, &p, &rooms, rank, dp);
    let (p_load, d_load) = pair.charge((dp > 1).then_some(rank));
    let (prefill_extra, decode_extra) = leg_extras(&ctx.extra);
    let sent = Instant::now();
    let pf = crate::h1::answer::send(prefill_extra, &p, ctx.route, prefill_body, (dp > 1).then_some(rank));
    let df = crate::h1::answer::send(decode_extra, &d, ctx.route, decode_body, None);
    let (ph, dh) = match both_heads(gw, pf, df, &p, &d, rid.as_deref()).await {
        Ok(heads) => heads,
        Err(failure) => return Err((failure, admission)),
    };
    heads_ok(gw, ctx, sent, &p, &d);
    let guard = InFlight::new(gw.clone(), admission, d_load, ctx.route, ctx.start);
    let logprobs = ctx.route == Route::Generate && ctx.v.get("return_logprob").and_then(Value::as_bool) == Some(true);
    if logprobs {
        return Ok(merged(ctx, guard, p_load, ph, dh, &d).await);
    }
    let watch = Watch { gw: gw.clone(), prefill: p, decode: d.clone(), rid, load: p_load, push: false };
    Ok(watch.relay(guard, ph, dh))
}

/// The prefill worker's data-parallel rank the request goes to (the client's hint, the
/// policy's, the least loaded, else one at random) and its `dp_size`.
pub(super) fn rank_of(ctx: &Ctx<'_>, pair: &Pair, p: &Worker) -> (DpRank, u32) {
    let dp = p.dp_size();
    let client_rank = ctx.v.get("routed_dp_rank").and_then(Value::as_u64).and_then(|r| u32::try_from(r).ok());
    let rank = client_rank
        .map(DpRank)
        .or(pair.prefill.rank)
        .or_else(|| p.least_loaded_rank())
        .filter(|r| r.0 < dp)
        .unwrap_or_else(|| DpRank((crate::random_u64() % u64::from(dp)) as u32));
    (rank, dp)
}

/// What each leg carries besides its body: the client's headers as the workers get them, and
/// the client's rank hint for the prefill only (decode's own ranks are its business).
fn leg_extras(extra: &Extra) -> (Extra, Extra) {
    (extra.clone(), Extra { rank: None, ..extra.clone() })
}

/// A room in [0, 2^63 - 1] (SGLang's HTTP field) with `room % dp == rank`.
pub(crate) fn room_for(rank: u32, dp: u32) -> u64 {
    room_within(rank, dp, i64::MAX as u64)
}

/// A room in [0, `max`] with `room % dp == rank`: over HTTP SGLang takes any `i64`, its gRPC
/// service an `int32`.
pub(crate) fn room_within(rank: u32, dp: u32, max: u64) -> u64 {
    let dp = u64::from(dp.max(1));
    // Whole buckets of `dp` rooms: the last room, (buckets - 1) * dp + dp - 1, is at most `max`.
    let buckets = (max / dp).saturating_add(u64::from((max % dp) + 1 == dp));
    (crate::random_u64() % buckets.max(1)) * dp + u64::from(rank) % dp
}

/// The two legs' bodies and the attempt's `rid` (the client's, if it set one).
pub(super) fn bodies(
    ctx: &Ctx<'_>,
    p: &Worker,
    rooms: &[u64],
    rank: DpRank,
    dp: u32,
) -> (Bytes, Bytes, Option<String>) {
    let mut v = ctx.v.clone();
    let host = p.endpoint(ctx.route.path()).and_then(|u| u.host().map(str::to_string)).unwrap_or_default();
    let port = p.bootstrap_port().map_or(Value::Null, |p| json!(p));
    let client_rid = ctx.v.get("rid").filter(|r| !r.is_null()).cloned();
    let rid = match &client_rid {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(list)) => list.first().and_then(Value::as_str).map(str::to_string),
        _ => Some(format!("{}-{:x}", ctx.meta.id, rooms[0])),
    };
    if let Some(o) = v.as_object_mut() {
        match ctx.batch {
            Some(n) => {
                o.insert("bootstrap_host".into(), json!(vec![host; n]));
                o.insert("bootstrap_port".into(), Value::Array(vec![port; n]));
                o.insert("bootstrap_room".into(), json!(rooms));
            }
            None => {
                o.insert("bootstrap_host".into(), json!(host));
                o.insert("bootstrap_port".into(), port);
                o.insert("bootstrap_room".into(), json!(rooms[0]));
            }
        }
        if client_rid.is_none()
            && let Some(rid) = &rid
        {
            o.insert("rid".into(), json!(rid));
        }
        o.remove("routed_dp_rank");
        if dp > 1 {
            o.insert("disagg_prefill_dp_rank".into(), json!(rank.0));
        }
    }
    let decode = Bytes::from(serde_json::to_vec(&v).unwrap_or_default());
    // One body for both legs, serialized once, unless the prefill's names its rank.
    if dp <= 1 {
        return (decode.clone(), decode, rid);
    }
    if let Some(o) = v.as_object_mut() {
        o.insert("routed_dp_rank".into(), json!(rank.0));
    }
    (Bytes::from(serde_json::to_vec(&v).unwrap_or_default()), decode, rid)
}

/// `return_logprob`: prefill's prompt logprobs go before decode's, in each
/// answer of a batch, or in every event of decode's stream (SGLang's own load
/// balancer's merge). Prefill's answer is read first.
async fn merged(
    ctx: &Ctx<'_>,
    mut guard: InFlight,
    p_load: LoadGuard,
    ph: axum::http::Response<crate::relay::UpstreamBody>,
    dh: axum::http::Response<crate::relay::UpstreamBody>,
    d: &Arc<Worker>,
) -> Response {
    let status = dh.status().as_u16();
    let prefill = read_answer(ctx.gw, ph.into_body()).await;
    drop(p_load);
    let prefill: Option<Value> = prefill.ok().and_then(|b| {
        let text = std::str::from_utf8(&b).ok()?.trim().to_string();
        let first = match text.strip_prefix("data:") {
            Some(rest) => rest.split("\n\n").next()?.trim().to_string(),
            None => text,
        };
        serde_json::from_str(&first).ok()
    });
    let prefix = |i: usize| -> Option<Value> {
        let v = prefill.as_ref()?;
        let item = match v {
            Value::Array(list) => list.get(i)?,
            one => one,
        };
        item.pointer("/meta_info/input_token_logprobs").cloned()
    };
    let merge = |answer: &mut Value, i: usize| {
        if let (Some(Value::Array(mut head)), Some(Value::Array(tail))) =
            (prefix(i), answer.pointer_mut("/meta_info/input_token_logprobs").map(Value::take))
        {
            head.extend(tail);
            if let Some(slot) = answer.pointer_mut("/meta_info/input_token_logprobs") {
                *slot = Value::Array(head);
            }
        }
    };
    if !ctx.stream {
        guard.status = status;
        let body = match read_answer(ctx.gw, dh.into_body()).await {
            Ok(b) => b,
            Err(e) => {
                crate::relay::failed_mid_answer(d, &e, None);
                guard.status = 502;
                let e = crate::GatewayError::Upstream { worker: d.url.to_string(), message: e, retryable: false };
                return axum::response::IntoResponse::into_response(e);
            }
        };
        let Ok(mut answer) = serde_json::from_slice::<Value>(&body) else {
            return json_answer(status, &Value::String(String::from_utf8_lossy(&body).into_owned()));
        };
        match &mut answer {
            Value::Array(list) => list.iter_mut().enumerate().for_each(|(i, a)| merge(a, i)),
            one => merge(one, 0),
        }
        return json_answer(status, &answer);
    }
    let (parts, body) = dh.into_parts();
    let idle = ctx.gw.config.limits.upstream_idle_timeout;
    // The answer filters see the merged events, as the client does.
    let tap = crate::relay::Tap::new(guard, d.clone(), status, parts.headers.get(header::CONTENT_TYPE).cloned());
    let prefill_head = prefix(0);
    let state = (body, Events::new(MAX_LEG_ANSWER), Some(tap), prefill_head);
    let events = futures_util::stream::unfold(state, move |(mut body, mut buf, tap, prefill_head)| {
        async move {
            use http_body_util::BodyExt;
            let mut tap = tap?;
            // The worker failed: the stream ends with its error event.
            let failed =
                |tap: &mut crate::relay::Tap, e: &dyn std::fmt::Display| tap.failed(e, true).unwrap_or_default();
            loop {
                if let Some(event) = buf.next_event() {
                    let event = merge_event(&event, prefill_head.as_ref());
                    tap.data(&event);
                    return Some((Ok::<Bytes, std::io::Error>(event), (body, buf, Some(tap), prefill_head)));
                }
                if buf.over() {
                    let tail = failed(&mut tap, &format!("an event larger than {MAX_LEG_ANSWER} bytes"));
                    return Some((Ok(tail), (body, buf, None, prefill_head)));
                }
                let frame = match tokio::time::timeout(idle, body.frame()).await {
                    Ok(frame) => frame,
                    Err(_) => {
                        let tail = failed(&mut tap, &format!("no data from the worker within {idle:?}"));
                        return Some((Ok(tail), (body, buf, None, prefill_head)));
                    }
                };
                match frame {
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            buf.push(&data);
                        }
                    }
                    Some(Err(e)) => {
                        let tail = failed(&mut tap, &e);
                        return Some((Ok(tail), (body, buf, None, prefill_head)));
                    }
                    None => {
                        let rest = merge_event(&buf.rest(), prefill_head.as_ref());
                        tap.data(&rest);
                        tap.ended();
                        return Some((Ok(rest), (body, buf, None, prefill_head)));
                    }
                }
            }
        }
    });
    let mut response = Response::new(Body::from_stream(events));
    *response.status_mut() = parts.status;
    for (name, value) in &parts.headers {
        if crate::pipeline::request::relayed(name.as_str(), "") {
            response.headers_mut().insert(name.clone(), value.clone());
        }
    }
    response
}

/// A stream cut into its events (`\n\n`-ended), each byte looked at once, at most `max`
/// bytes of an unfinished event held.
struct Events {
    buf: bytes::BytesMut,
    /// Bytes of `buf` known to hold no event end (but perhaps its first `\n`).
    scanned: usize,
    max: usize,
}

impl Events {
    fn new(max: usize) -> Self {
        Self { buf: bytes::BytesMut::new(), scanned: 0, max }
    }

    fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next whole event, if one has arrived.
    fn next_event(&mut self) -> Option<Bytes> {
        let from = self.scanned.saturating_sub(1);
        match self.buf[from..].windows(2).position(|w| w == b"\n\n") {
            Some(at) => {
                self.scanned = 0;
                Some(self.buf.split_to(from + at + 2).freeze())
            }
            None => {
                self.scanned = self.buf.len();
                None
            }
        }
    }

    /// An unfinished event past the bound.
    fn over(&self) -> bool {
        self.buf.len() > self.max
    }

    /// What is left when the stream ends.
    fn rest(&mut self) -> Bytes {
        self.scanned = 0;
        self.buf.split().freeze()
    }
}

/// One event of decode's stream with `prefix` before its prompt logprobs.
fn merge_event(event: &Bytes, prefix: Option<&Value>) -> Bytes {
    let Some(Value::Array(head)) = prefix else { return event.clone() };
    let Ok(text) = std::str::from_utf8(event) else { return event.clone() };
    let Some(data) = text.trim().strip_prefix("data:") else { return event.clone() };
    let Ok(mut v) = serde_json::from_str::<Value>(data.trim()) else { return event.clone() };
    let Some(slot) = v.pointer_mut("/meta_info/input_token_logprobs") else { return event.clone() };
    let mut merged = head.clone();
    if let Value::Array(tail) = slot.take() {
        merged.extend(tail);
    }
    *slot = Value::Array(merged);
    Bytes::from(format!("data: {v}\n\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_legs_get_the_serialized_headers_and_only_the_prefill_the_rank_hint() {
        let gw = crate::testing::gateway(&["http://w:1"], crate::RetryConfig::default()).await;
        let lines = Bytes::from_static(b"authorization: Bearer k\r\nx-a: 1\r\nx-a: 2\r\n");
        let extra = Extra {
            headers: lines.clone(),
            rank: Some(Bytes::from_static(b"3")),
            tls: gw.upstream_tls.clone(),
            pool_idle: gw.config.upstream_pool_idle,
            http2: false,
        };
        let (prefill, decode) = leg_extras(&extra);
        for leg in [&prefill, &decode] {
            let sent: Vec<_> = crate::pipeline::request::header_lines(&leg.headers).collect();
            assert_eq!(sent[0], (&b"authorization"[..], &b"Bearer k"[..]));
            assert_eq!(sent.iter().filter(|(n, _)| *n == b"x-a").count(), 2);
        }
        assert_eq!(prefill.rank.as_deref(), Some(&b"3"[..]));
        assert_eq!(decode.rank, None, "decode's ranks are its own");
    }

    #[test]
    fn rooms_follow_the_rank() {
        for dp in [1u32, 2, 3, 8, 256] {
            for rank in 0..dp.min(9) {
                for _ in 0..50 {
                    let room = room_for(rank, dp);
                    assert!(room <= i64::MAX as u64);
                    assert_eq!(room % u64::from(dp), u64::from(rank));
                }
            }
        }
        assert_ne!(room_for(0, 1), room_for(0, 1), "rooms are fresh");
    }

    #[test]
    fn events_are_cut_once_each_byte_read_once_and_bounded() {
        let mut e = Events::new(64);
        e.push(b"data: 1\n");
        assert_eq!(e.next_event(), None);
        assert_eq!(e.scanned, 8);
        // The end split across two frames is found, without reading the first bytes again.
        e.push(b"\ndata: 2\n\nda");
        assert_eq!(e.next_event().as_deref(), Some(&b"data: 1\n\n"[..]));
        assert_eq!(e.next_event().as_deref(), Some(&b"data: 2\n\n"[..]));
        assert_eq!(e.next_event(), None);
        assert_eq!((e.scanned, e.over()), (2, false));
        e.push(&[b'x'; 63]);
        assert_eq!(e.next_event(), None);
        assert!(e.over(), "65 bytes of one unfinished event");
        assert_eq!(e.rest().len(), 65);
        assert_eq!(e.rest().len(), 0);
    }

    #[test]
    fn stream_events_get_prefill_logprobs_first() {
        let prefix = json!([[-0.1, 1, null], [-0.2, 2, null]]);
        let event = Bytes::from("data: {\"meta_info\": {\"input_token_logprobs\": [[-0.3, 3, null]]}}\n\n");
        let merged = merge_event(&event, Some(&prefix));
        let v: Value =
            serde_json::from_str(std::str::from_utf8(&merged).unwrap().trim().strip_prefix("data:").unwrap()).unwrap();
        assert_eq!(v["meta_info"]["input_token_logprobs"], json!([[-0.1, 1, null], [-0.2, 2, null], [-0.3, 3, null]]));
        let done = Bytes::from_static(b"data: [DONE]\n\n");
        assert_eq!(merge_event(&done, Some(&prefix)), done);
    }
}
