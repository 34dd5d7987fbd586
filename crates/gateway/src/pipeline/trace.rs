//! A request's span (`--enable-trace`): its W3C context, continuing the client's `traceparent`
//! (or starting a trace), the `traceparent` sent on to the worker so the engine's spans join,
//! and the finished span handed to the OTLP exporter when the request's accounting ends.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::http::{HeaderName, HeaderValue};
use otlp::{Attr, SpanRecord, TraceContext};

use crate::Gateway;
use crate::pools::HeaderEdits;

/// The header a trace context travels in.
const TRACEPARENT: &str = "traceparent";

/// The span of a request whose header lines are `lines`, when tracing is on.
pub(crate) fn context<'h>(gw: &Gateway, mut lines: impl Iterator<Item = (&'h str, &'h [u8])>) -> Option<TraceContext> {
    gw.config.tracer.as_ref()?;
    let incoming = lines.find(|(n, _)| n.eq_ignore_ascii_case(TRACEPARENT)).map(|(_, v)| v);
    Some(TraceContext::child_of(incoming, crate::random_u64))
}

/// `edits` with the worker's `traceparent` set to name `ctx` as its parent (the client's
/// replaced).
pub(crate) fn edits(ctx: Option<&TraceContext>, edits: Option<Arc<HeaderEdits>>) -> Option<Arc<HeaderEdits>> {
    let Some(ctx) = ctx else { return edits };
    let Ok(value) = HeaderValue::from_str(&ctx.traceparent()) else { return edits };
    let mut merged = edits.as_deref().cloned().unwrap_or_default();
    let name = HeaderName::from_static(TRACEPARENT);
    merged.set.retain(|(n, _)| *n != name);
    merged.set.push((name, value));
    Some(Arc::new(merged))
}

/// What a request's span says besides its outcome, gathered as the request goes.
#[derive(Debug)]
pub(crate) struct Traced {
    pub(crate) ctx: TraceContext,
    pub(crate) attributes: Vec<(&'static str, Attr)>,
}

impl Traced {
    /// The span of a request decided by `plan` to `worker`.
    pub(crate) fn decided(ctx: TraceContext, id: &str, plan: &planner::Plan) -> Box<Traced> {
        let attributes = vec![
            ("sgl_router.request_id", Attr::Str(id.to_string())),
            ("sgl_router.pool", Attr::Str(plan.pool.id.to_string())),
            ("sgl_router.worker", Attr::Str(plan.chosen().url.to_string())),
            ("sgl_router.policy", Attr::Str(plan.pool.policy.name().to_string())),
            ("sgl_router.reason", Attr::Str(plan.decision.reason.as_str().to_string())),
            ("sgl_router.input_tokens", Attr::Int(plan.input_tokens as i64)),
            ("sgl_router.matched_tokens", Attr::Int(plan.matched_tokens() as i64)),
            ("sgl_router.regret_tokens", Attr::Int(plan.regret.lost_tokens() as i64)),
        ];
        Box::new(Traced { ctx, attributes })
    }

    /// The request moved to `worker` (a retry): the span names the worker that answered.
    pub(crate) fn retried(&mut self, worker: &str) {
        for (key, value) in &mut self.attributes {
            if *key == "sgl_router.worker" {
                *value = Attr::Str(worker.to_string());
            }
        }
    }

    /// The request ended with `status` (0: no answer); its span goes to the exporter.
    pub(crate) fn finish(self, gw: &Gateway, path: &str, status: u16, cut: bool, start: Instant) {
        let Some(tracer) = gw.config.tracer.as_ref().filter(|_| self.ctx.sampled()) else { return };
        let end = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let took = start.elapsed().as_nanos() as u64;
        let mut attributes = self.attributes;
        attributes.push(("http.request.method", Attr::Str("POST".into())));
        attributes.push(("url.path", Attr::Str(path.to_string())));
        if status != 0 {
            attributes.push(("http.response.status_code", Attr::Int(i64::from(status))));
        }
        let error = match (status, cut) {
            (_, true) => Some("the answer broke off".to_string()),
            (0, _) => Some("no answer".to_string()),
            (s, _) if s >= 500 => Some(format!("status {s}")),
            _ => None,
        };
        tracer.record(SpanRecord {
            ctx: self.ctx,
            name: format!("POST {path}"),
            start_unix_nanos: end.saturating_sub(took),
            end_unix_nanos: end,
            attributes,
            error,
        });
    }
}
