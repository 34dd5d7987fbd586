//! What the concurrent dispatches share (SGLang's two legs, vLLM's NIXL push
//! mode): both legs' heads or the first failure (the other leg then aborted
//! at once), and after the heads, decode's answer relayed while the prefill's
//! answer is watched: an error in it cuts decode's answer and aborts decode.

use std::sync::Arc;
use std::time::Instant;

use axum::response::Response;
use futures_util::FutureExt;
use serde_json::Value;
use tokio::sync::oneshot;

use super::{Ctx, Failure, Leg, MAX_LEG_ANSWER, abort, read_all, status_failure};
use crate::Gateway;
use crate::pipeline::account::InFlight;
use crate::relay::{Ending, stream_back};
use crate::send::SendError;
use fleet::{LoadGuard, Worker};

type Answer = axum::http::Response<crate::relay::UpstreamBody>;

/// How long the prefill's answer may still take once decode's has ended, before it is aborted.
const PREFILL_END_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Waits for both legs' answer heads; on the first failure (unreachable, a
/// non-2xx head, the request timeout) the other leg is dropped (its
/// connection closed) and told to abort `rid`, and the failure returned.
pub(super) async fn both_heads<P, D>(
    gw: &Gateway,
    pf: P,
    df: D,
    p: &Arc<Worker>,
    d: &Arc<Worker>,
    rid: Option<&str>,
) -> Result<(Answer, Answer), Failure>
where
    P: std::future::Future<Output = Result<Answer, SendError>>,
    D: std::future::Future<Output = Result<Answer, SendError>>,
{
    let mut pf = Box::pin(pf);
    let mut df = Box::pin(df);
    let deadline = tokio::time::sleep(gw.config.request_timeout);
    tokio::pin!(deadline);
    let (mut ph, mut dh) = (None, None);
    let failed = loop {
        if ph.is_some() && dh.is_some() {
            break None;
        }
        tokio::select! {
            r = &mut pf, if ph.is_none() => match r {
                Ok(resp) if resp.status().is_success() => ph = Some(resp),
                r => break Some((Leg::Prefill, r)),
            },
            r = &mut df, if dh.is_none() => match r {
                Ok(resp) if resp.status().is_success() => dh = Some(resp),
                r => break Some((Leg::Decode, r)),
            },
            () = &mut deadline => {
                let leg = if ph.is_none() { Leg::Prefill } else { Leg::Decode };
                break Some((leg, Err(SendError { connect: false, message: String::new() })));
            }
        }
    };
    // The legs still in flight are cancelled here: their connections close.
    drop((pf, df));
    let Some((leg, r)) = failed else {
        return match (ph, dh) {
            (Some(ph), Some(dh)) => Ok((ph, dh)),
            _ => Err(Failure::Timeout { leg: Leg::Prefill, worker: p.clone() }),
        };
    };
    let timed_out = deadline.is_elapsed();
    // The other leg first: its connection closes now, and it is told to abort.
    drop((ph, dh));
    let (worker, other) = match leg {
        Leg::Prefill => (p, d),
        Leg::Decode => (d, p),
    };
    abort(gw, leg.other(), other, rid);
    Err(match r {
        _ if timed_out => Failure::Timeout { leg, worker: worker.clone() },
        Ok(resp) => status_failure(leg, worker, resp).await,
        Err(error) => Failure::Transport { leg, worker: worker.clone(), error },
    })
}

/// Both heads came: the legs' workers and counters hear of it.
pub(super) fn heads_ok(gw: &Gateway, ctx: &Ctx<'_>, sent: Instant, p: &Worker, d: &Worker) {
    gw.metrics.pd_heads.observe(sent.elapsed().as_secs_f64());
    gw.metrics.ttfb.observe(ctx.start.elapsed().as_secs_f64());
    for (leg, w) in [(Leg::Prefill, p), (Leg::Decode, d)] {
        w.request_succeeded();
        gw.metrics.pd_legs.inc(format_args!("leg=\"{}\",outcome=\"ok\"", leg.as_str()));
    }
}

/// Whether a vLLM prefill's answer still reports push mode.
fn still_push(bytes: &[u8]) -> bool {
    serde_json::from_slice::<Value>(bytes)
        .ok()
        .and_then(|v| v.pointer("/kv_transfer_params/transfer_mode").and_then(Value::as_str).map(|m| m == "push"))
        .unwrap_or(false)
}

/// The prefill leg after both heads came: its answer read to the end (its
/// load released then); an error in it cuts decode's answer and aborts decode;
/// decode's answer ending first leaves it [`PREFILL_END_GRACE`] to end, then aborts it.
pub(super) struct Watch {
    pub(super) gw: Arc<Gateway>,
    pub(super) prefill: Arc<Worker>,
    pub(super) decode: Arc<Worker>,
    pub(super) rid: Option<String>,
    pub(super) load: LoadGuard,
    /// vLLM push mode: the prefill's identity is forgotten when its answer
    /// fails or no longer says `transfer_mode: push` (the next request goes two-stage).
    pub(super) push: bool,
}

impl Watch {
    /// Relays decode's answer while this watches the prefill's.
    pub(super) fn relay(
        self,
        guard: InFlight,
        ph: axum::http::Response<crate::relay::UpstreamBody>,
        dh: axum::http::Response<crate::relay::UpstreamBody>,
    ) -> Response {
        let (cut_tx, cut_rx) = oneshot::channel::<String>();
        let (ended_tx, ended_rx) = oneshot::channel::<()>();
        let (decode, limits) = (self.decode.clone(), self.gw.config.limits);
        tokio::spawn(self.run(ph, cut_tx, ended_rx));
        let cut = async move {
            match cut_rx.await {
                Ok(why) => why,
                Err(_) => std::future::pending().await,
            }
        };
        let ending = Ending { cut: Some(cut.boxed()), _ended: Some(ended_tx) };
        stream_back(guard, decode, dh, &limits, ending)
    }

    async fn run(
        self,
        resp: axum::http::Response<crate::relay::UpstreamBody>,
        cut: oneshot::Sender<String>,
        mut ended: oneshot::Receiver<()>,
    ) {
        let mut body = Box::pin(read_all(resp.into_body(), MAX_LEG_ANSWER));
        let limit = tokio::time::sleep(self.gw.config.request_timeout);
        let read = tokio::select! {
            r = &mut body => r,
            _ = &mut ended => {
                // Decode's answer is over (or its client left) before prefill's. Decode answered, so
                // the prefill handed its KV over and its own answer is due: read to its end within a
                // grace, its connection pooled again and nothing aborted (an `/abort_request` per
                // request cost the router an HTTP request and the engines a call). One that does not
                // end in time is dropped and aborted.
                if tokio::time::timeout(PREFILL_END_GRACE, &mut body).await.is_err() {
                    drop(body);
                    abort(&self.gw, Leg::Prefill, &self.prefill, self.rid.as_deref());
                }
                return;
            }
            () = limit => Err(format!("no end of its answer within {:?}", self.gw.config.request_timeout)),
        };
        drop(self.load);
        let why = match read {
            Ok(bytes) => {
                if self.push && !still_push(&bytes) {
                    super::forget_push(&self.prefill);
                }
                failed_in(&bytes)
            }
            Err(e) => {
                self.prefill.request_failed();
                Some(e)
            }
        };
        if let Some(why) = why {
            self.prefill.answer_failed();
            self.gw.metrics.pd_legs.inc(format_args!("leg=\"prefill\",outcome=\"failed_after_head\""));
            let _ = cut.send(format!("the prefill leg on {} failed: {why}", self.prefill.url));
            abort(&self.gw, Leg::Decode, &self.decode, self.rid.as_deref());
        }
    }
}

/// The error an answer body reports, if any: an `error` object, or an
/// aborted finish (SGLang reports a failed transfer as either), in a JSON
/// answer, a batch of them, or any event of a stream.
pub(super) fn failed_in(bytes: &[u8]) -> Option<String> {
    let check = |v: &Value| -> Option<String> {
        let items: Vec<&Value> = match v {
            Value::Array(list) => list.iter().collect(),
            one => vec![one],
        };
        items.into_iter().find_map(|v| {
            if let Some(e) = v.get("error") {
                return Some(e.get("message").and_then(Value::as_str).map_or_else(|| e.to_string(), str::to_string));
            }
            let finish = v.pointer("/meta_info/finish_reason")?;
            (finish.get("type").and_then(Value::as_str) == Some("abort"))
                .then(|| finish.get("message").and_then(Value::as_str).unwrap_or("aborted").to_string())
        })
    };
    // Most answers report nothing: without either word there is nothing to parse for.
    let has = |word: &[u8]| bytes.windows(word.len()).any(|w| w == word);
    if !has(b"\"error\"") && !has(b"abort") {
        return None;
    }
    let text = std::str::from_utf8(bytes).ok()?;
    if text.trim_start().starts_with("data:") {
        return text
            .split("\n\n")
            .filter_map(|e| e.trim().strip_prefix("data:"))
            .filter(|d| d.trim() != "[DONE]")
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .find_map(|v| check(&v));
    }
    serde_json::from_slice::<Value>(bytes).ok().and_then(|v| check(&v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_inside_answers() {
        assert_eq!(failed_in(br#"{"text": "a", "meta_info": {"finish_reason": {"type": "length"}}}"#), None);
        assert_eq!(failed_in(br#"{"error": {"message": "boom"}}"#).as_deref(), Some("boom"));
        let abort =
            br#"{"text": "", "meta_info": {"finish_reason": {"type": "abort", "message": "KV transfer failed"}}}"#;
        assert_eq!(failed_in(abort).as_deref(), Some("KV transfer failed"));
        let sse = b"data: {\"text\": \"a\"}\n\ndata: {\"error\": {\"message\": \"late\"}}\n\ndata: [DONE]\n\n";
        assert_eq!(failed_in(sse).as_deref(), Some("late"));
        assert_eq!(failed_in(b"data: {\"text\": \"a\"}\n\ndata: [DONE]\n\n"), None);
        assert_eq!(failed_in(br#"[{"text": "a"}, {"error": "second"}]"#).as_deref(), Some("\"second\""));
        assert!(still_push(br#"{"kv_transfer_params": {"transfer_mode": "push"}}"#));
        assert!(!still_push(br#"{"kv_transfer_params": {"transfer_mode": "pull"}}"#));
    }
}
