//! The embedding model on the request path: which of a request's texts the
//! decisions read ([`model_select::EmbeddingNeeds`]), embedded on the pool's
//! own threads while the serving thread awaits, and the config's examples
//! embedded when a config is compiled. The pool itself (queue, cache,
//! threads) is `embed`'s; the routing slot owns it.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use embed::EmbedPool;
use model_select::{EmbeddingNeeds, RequestEmbeddings, Vector};
use serde_json::Value;

use crate::metrics::head;

/// The pool as the config compiler's [`model_select::Embedder`]: on the
/// calling thread, through the cache (reloads run on the blocking pool).
#[derive(Debug, Clone, Copy)]
pub struct Examples<'a>(pub &'a EmbedPool);

impl model_select::Embedder for Examples<'_> {
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, String> {
        let embedded = self.0.embed_now(texts).map_err(|e| e.to_string())?;
        Ok(embedded.into_iter().map(|e| e.vector.to_vec()).collect())
    }
}

/// The vectors `needs` asks for of the request `v`: the last user turn, the
/// one before (none in a one-turn chat), all of them together; each an
/// error when the pool is missing, full, slow or failing.
async fn embed_request(pool: Option<&EmbedPool>, v: &Value, needs: EmbeddingNeeds) -> RequestEmbeddings {
    let turns = model_select::user_turns(v);
    let one = |text: Option<String>| async move {
        let text = text?;
        Some(match pool {
            None => Err("the router has no embedding model (--embedding-model-path)".to_owned()) as Vector,
            Some(pool) => pool.embed(&text).await.map(|l| l.embedded.vector).map_err(|e| e.to_string()),
        })
    };
    let last = needs.last.then(|| turns.last().cloned().unwrap_or_default());
    let previous = (needs.previous && turns.len() >= 2).then(|| turns[turns.len() - 2].clone());
    let history = needs.history.then(|| turns.join("\n"));
    let (last, previous, history) = tokio::join!(one(last), one(previous), one(history));
    RequestEmbeddings { last, previous, history }
}

/// The pool's series for `/metrics`.
pub(crate) fn render(pool: &EmbedPool, out: &mut String) {
    let s = pool.stats();
    let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    head(out, "router_embedding_requests_total", "counter", "Embeddings asked for, by outcome.");
    let computed = n(&s.computed);
    for (outcome, v) in [
        ("cached", n(&s.cache_hits)),
        ("computed", computed),
        ("busy", n(&s.busy)),
        ("timeout", n(&s.timeouts)),
        ("error", n(&s.errors)),
    ] {
        let _ = writeln!(out, "router_embedding_requests_total{{outcome=\"{outcome}\"}} {v}");
    }
    head(out, "router_embedding_truncated_total", "counter", "Embedded texts cut at the model's max_seq_length.");
    let _ = writeln!(out, "router_embedding_truncated_total {}", n(&s.truncated));
    head(out, "router_embedding_batches_total", "counter", "Model runs (each embeds a batch of texts).");
    let _ = writeln!(out, "router_embedding_batches_total {}", n(&s.batches));
    head(out, "router_embedding_compute_seconds_total", "counter", "Time the model ran.");
    let _ = writeln!(out, "router_embedding_compute_seconds_total {:.6}", n(&s.compute_micros) as f64 / 1e6);
    head(out, "router_embedding_waiting", "gauge", "Texts queued or being embedded now.");
    let _ = writeln!(out, "router_embedding_waiting {}", pool.waiting());
    head(out, "router_embedding_cache_entries", "gauge", "Embeddings cached now.");
    let _ = writeln!(out, "router_embedding_cache_entries {}", pool.cached());
}

/// What routing reads of a request before it is routed: its parsed body
/// (when this had to parse it: the route reuses it) and its vectors.
#[derive(Debug, Default)]
pub(crate) struct PreRouted {
    /// The body as parsed here (a JSON object), for the route to reuse.
    pub(crate) body: Option<Value>,
    /// The vectors the reachable decisions read (an auto model only).
    pub(crate) embeddings: Option<RequestEmbeddings>,
}

/// Before routing: the request's vectors, when the reachable decisions read
/// them and the body names an auto model (else nothing, at the cost of one
/// branch). The body is parsed here (off the serving thread when large) and
/// handed on; a body that is not a JSON object is left for the route to report.
pub(crate) async fn pre_route(
    gw: &std::sync::Arc<crate::Gateway>,
    routing: Option<&super::Routing>,
    route: crate::pipeline::request::Route,
    bytes: &bytes::Bytes,
) -> Result<PreRouted, crate::GatewayError> {
    let (Some(slot), Some(routing)) = (&gw.routing, routing) else { return Ok(PreRouted::default()) };
    let needs = routing.selector.embedding_needs();
    if !needs.any() || !route.has_prompt() {
        return Ok(PreRouted::default());
    }
    let body = bytes.clone();
    let parsed =
        crate::pipeline::admission::render(gw, bytes.len(), move || crate::pipeline::body::parse_json(&body).ok())
            .await?;
    let Some(v) = parsed else { return Ok(PreRouted::default()) };
    let model = v.get("model").and_then(Value::as_str);
    let embeddings = match routing.selector.target(model) {
        // Anthropic's request read as the chat the engine makes of it (tool results are no user text).
        model_select::Target::Auto if route == crate::pipeline::request::Route::Messages => {
            let chat = routing.default_pool().renderer.anthropic_chat(&v).unwrap_or_default();
            Some(embed_request(slot.embedder(), &chat, needs).await)
        }
        model_select::Target::Auto => Some(embed_request(slot.embedder(), &v, needs).await),
        _ => None,
    };
    Ok(PreRouted { body: Some(v), embeddings })
}
