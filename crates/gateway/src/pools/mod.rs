//! Model pools: each pool's served model, policy, renderer and chain memo
//! (its workers are the fleet's, tagged with the pool), and, with a routing
//! config, which pool serves a request: the `model` it names, or for an
//! auto name the decision over its signals, the decision's plugins (block,
//! PII placeholders, system prompt, header changes) and the `static`
//! algorithm over the pools that can serve it (a routable worker, a window
//! that holds the prompt and `max_tokens`).
//!
//! ```text
//! body.model ─► Target: Pool ───────────────────────────────┐
//!                       Auto ─► signals ─► decision ─► plugins ─► candidates ─► first eligible ─► Routed
//!                       Unknown ─► 400 model_not_found      │
//!                                                            └► body.model = pool.served_model
//! ```

use std::sync::Arc;
use std::time::Instant;

use axum::http::{HeaderName, HeaderValue};
use model_select::{PluginConfig, Selector, SignalInput, Target};
use serde_json::Value;

mod callers;
pub(crate) mod cascade;
mod choose;
mod embedding;
pub mod feedback;
mod fit;
mod reload;
pub(crate) mod response_guard;
mod sticky;
#[cfg(test)]
mod tests;

pub use crate::metrics::RoutingMetrics;
use crate::pipeline::request::Route;
pub(crate) use crate::pipeline::request::RouteHeaders;
use crate::{Gateway, GatewayError};
pub use embedding::Examples;
pub(crate) use embedding::{PreRouted, pre_route, render as render_embedding};
pub use planner::Pool;
pub use reload::{Reloaded, RoutingSlot, RoutingSource, apply, reload};

/// The decision label of a request that named a pool's model.
pub const EXPLICIT: &str = "explicit";
/// The decision label of a request without a `model` (the default pool serves it).
pub const NO_MODEL: &str = "no_model";

/// A routing config at work: the selector, its pools, each decision's header changes, and what
/// it counts.
#[derive(Debug)]
pub struct Routing {
    /// The compiled config.
    pub selector: Selector,
    /// The config's pools, in its order (its decisions name them by position), each the
    /// gateway's pool of that name: resolved by id once, when the config is put in force.
    pools: Vec<Arc<Pool>>,
    /// Per decision (by index): the headers its `header_mutation` plugins change.
    edits: Vec<Option<Arc<HeaderEdits>>>,
    /// The conversations seen lately and their pools.
    pub(crate) sessions: Arc<sticky::Sessions>,
    /// Counters (kept across reloads).
    pub metrics: Arc<RoutingMetrics>,
    /// Per decision (by index): its `response_cache` plugin's answers (a reload starts them afresh).
    pub(crate) caches: Vec<Option<Arc<crate::cache::Store>>>,
    /// Per decision (by index): its `cascade` plugin, its `to` pool resolved.
    cascades: Vec<Option<cascade::Spec>>,
    /// Per decision (by index): its `response_guard` plugin.
    guards: Vec<Option<Arc<response_guard::Spec>>>,
}

/// Headers a decision sets and removes on the request to the worker.
#[derive(Debug, Clone, Default)]
pub struct HeaderEdits {
    /// Set, replacing the client's.
    pub set: Vec<(HeaderName, HeaderValue)>,
    /// Removed.
    pub remove: Vec<HeaderName>,
}

/// Which pool serves a request, and why.
#[derive(Debug)]
pub(crate) struct Routed {
    /// The pool.
    pub(crate) pool: Arc<Pool>,
    /// The decision's name ([`EXPLICIT`] and [`NO_MODEL`] without signals).
    pub(crate) decision: String,
    /// The body was changed (model name, plugins): it is sent re-encoded.
    pub(crate) rewritten: bool,
    /// Header changes for the worker.
    pub(crate) edits: Option<Arc<HeaderEdits>>,
    /// What `x-route-debug` shows: the signals matched, the confidence, the candidates.
    pub(crate) debug: Option<Explain>,
    /// The winning decision's index (auto routing).
    pub(crate) index: Option<usize>,
    /// The decision's response cache: the request's ticket and what the lookup found.
    pub(crate) cache: Option<(crate::cache::Ticket, crate::cache::Outcome)>,
    /// The answer's `x-route-id`, for feedback.
    pub(crate) route_id: Option<u64>,
    /// The decision's cascade, when it judges this request's answer.
    pub(crate) cascade: Option<cascade::Plan>,
    /// The decision's `response_guard`, which reads the answer.
    pub(crate) guard: Option<Arc<response_guard::Spec>>,
    /// Messages `fit_context` dropped to fit the pool's window (`x-route-context-dropped`).
    pub(crate) context_dropped: Option<usize>,
}

/// The explain a request asked for with `x-route-debug: true`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Explain {
    pub(crate) signals: Vec<String>,
    pub(crate) confidence: f64,
    pub(crate) candidates: Vec<String>,
}

// === impl Routing ===

impl Routing {
    /// The routing config at work over `pools` (the gateway's: each of the config's pools is
    /// the one of its name); its header changes are compiled here (the config was validated:
    /// every name and value is sound). `Err` names a pool of the config `pools` lacks.
    pub fn new(selector: Selector, pools: &[Arc<Pool>]) -> Result<Self, String> {
        Routing::new_counting(selector, pools, Arc::new(RoutingMetrics::new()))
    }

    /// The routing config at work, counting into `metrics`.
    fn new_counting(selector: Selector, all: &[Arc<Pool>], metrics: Arc<RoutingMetrics>) -> Result<Self, String> {
        let pools = selector
            .config()
            .pools
            .iter()
            .map(|c| all.iter().find(|p| p.id.0 == c.name).cloned().ok_or_else(|| format!("no pool `{}`", c.name)))
            .collect::<Result<Vec<_>, _>>()?;
        let edits = selector
            .config()
            .decisions
            .iter()
            .map(|d| {
                let mut edits = HeaderEdits::default();
                for p in &d.plugins {
                    if let PluginConfig::HeaderMutation(m) = p {
                        for (name, value) in &m.set {
                            if let (Ok(n), Ok(v)) = (HeaderName::try_from(name.as_str()), HeaderValue::from_str(value))
                            {
                                edits.set.push((n, v));
                            }
                        }
                        edits.remove.extend(m.remove.iter().filter_map(|n| HeaderName::try_from(n.as_str()).ok()));
                    }
                }
                (!edits.set.is_empty() || !edits.remove.is_empty()).then(|| Arc::new(edits))
            })
            .collect();
        let sessions = Arc::new(sticky::Sessions::new(selector.config().stickiness));
        let caches: Vec<Option<Arc<crate::cache::Store>>> = selector
            .config()
            .decisions
            .iter()
            .map(|d| {
                d.plugins.iter().find_map(|p| match p {
                    PluginConfig::ResponseCache(c) => {
                        Some(Arc::new(crate::cache::Store::new(c, &d.name, metrics.clone())))
                    }
                    _ => None,
                })
            })
            .collect();
        let cascades: Vec<_> = selector.config().decisions.iter().map(|d| cascade::Spec::of(d, &pools)).collect();
        let guards = selector.config().decisions.iter().map(response_guard::Spec::of).collect();
        Ok(Routing { selector, pools, edits, sessions, metrics, caches, cascades, guards })
    }

    /// The config's pool at `i` (a position its decisions and algorithms use).
    pub(crate) fn pool(&self, i: usize) -> &Arc<Pool> {
        &self.pools[i]
    }

    /// The pool of requests that name none.
    pub(crate) fn default_pool(&self) -> &Arc<Pool> {
        self.pool(self.selector.default_pool())
    }

    /// The pool's configured quality, which seeds its feedback arm.
    fn quality(&self, pool: &Pool) -> Option<f64> {
        self.selector.config().pools.iter().find(|c| c.name == pool.id.0).and_then(|c| c.quality)
    }

    /// Whether a decision caches answers (the fast path then hands requests to
    /// the front end that records them).
    pub(crate) fn caches_answers(&self) -> bool {
        self.caches.iter().any(Option::is_some)
    }

    /// The config after `old` (a reload): its counters go on, and so do the
    /// conversations it remembers unless stickiness was reconfigured.
    /// `Err` names a pool the new config has and the old had not.
    pub(crate) fn succeeding(selector: Selector, old: &Routing) -> Result<Self, String> {
        let mut next = Routing::new_counting(selector, &old.pools, old.metrics.clone())?;
        if next.selector.config().stickiness == old.selector.config().stickiness {
            next.sessions = old.sessions.clone();
        }
        Ok(next)
    }
}

// === impl Routed ===

impl Routed {
    /// The gateway's only pool, without a routing config.
    pub(crate) fn default_pool(gw: &Gateway) -> Self {
        Routed::to(gw.pools[0].clone(), NO_MODEL)
    }

    /// To `pool` by `decision`, nothing else known yet.
    fn to(pool: Arc<Pool>, decision: &str) -> Self {
        Routed {
            pool,
            decision: decision.to_owned(),
            rewritten: false,
            edits: None,
            debug: None,
            index: None,
            cache: None,
            route_id: None,
            cascade: None,
            guard: None,
            context_dropped: None,
        }
    }
}

// === impl HeaderEdits ===

impl HeaderEdits {
    /// Header lines (`name: value\r\n`, what the router's client sends) with these changes.
    pub(crate) fn applied_to_lines(&self, lines: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(lines.len() + 64);
        for line in lines.split_inclusive(|&b| b == b'\n') {
            let name = line.split(|&b| b == b':').next().unwrap_or_default();
            let name = std::str::from_utf8(name).unwrap_or_default().trim();
            let touched = self.remove.iter().chain(self.set.iter().map(|(n, _)| n));
            if !touched.into_iter().any(|n| n.as_str().eq_ignore_ascii_case(name)) {
                out.extend_from_slice(line);
            }
        }
        for (name, value) in &self.set {
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out
    }
}

// === impl RouteHeaders ===

impl RouteHeaders {
    /// The headers of an answer routed as `routed`.
    pub(crate) fn of(routed: &Routed) -> Self {
        let pool = &routed.pool;
        let value = |s: &str| HeaderValue::from_str(s).unwrap_or(HeaderValue::from_static("-"));
        let mut out = vec![
            ("x-route-pool", value(&pool.id.0)),
            ("x-route-decision", value(&routed.decision)),
            ("x-selected-model", value(&pool.served_model)),
        ];
        if let Some(d) = &routed.debug {
            if !d.signals.is_empty() {
                out.push(("x-route-signals", value(&d.signals.join(","))));
            }
            out.push(("x-route-confidence", value(&format!("{:.3}", d.confidence))));
            out.push(("x-route-candidates", value(&d.candidates.join(","))));
        }
        if let Some((_, outcome)) = &routed.cache {
            out.push((crate::cache::CACHE_HEADER, outcome.header()));
        }
        if let Some(id) = routed.route_id {
            out.push((feedback::ROUTE_ID_HEADER, value(&feedback::format_id(id))));
        }
        if let Some(n) = routed.context_dropped {
            out.push((fit::DROPPED_HEADER, value(&n.to_string())));
        }
        RouteHeaders(out)
    }
}

/// What a preview (`POST /v1/route/preview`) learns on the way: every
/// signal computed, every decision's outcome, and why pools were passed over.
#[derive(Debug, Default)]
pub(crate) struct Preview {
    pub(crate) signals: serde_json::Map<String, Value>,
    pub(crate) decisions: Vec<Value>,
    pub(crate) candidates: Vec<String>,
    pub(crate) passed_over: Vec<String>,
    /// `multi_factor`'s scores.
    pub(crate) scores: Vec<Value>,
    /// What stickiness found and did.
    pub(crate) session: Value,
    /// The decision that matched.
    pub(crate) decision: Option<String>,
}

/// Chooses the pool for a request with a routing config (see the module
/// doc). With `preview`, nothing is counted and the explain is filled in.
/// The body is changed in place (model name, plugins); `Routed::rewritten` says so.
pub(crate) fn route(
    gw: &Gateway,
    routing: &Routing,
    route: Route,
    v: &mut Value,
    ask: &Asked<'_>,
    mut preview: Option<&mut Preview>,
) -> Result<Routed, GatewayError> {
    let selector = &routing.selector;
    let model = match v.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(m)) => Some(m.as_str()),
        Some(_) => return Err(GatewayError::BadRequest("`model` must be a string".into())),
    };
    let routed = match selector.target(model) {
        Target::Unknown => return Err(GatewayError::UnknownModel(model.unwrap_or_default().to_owned())),
        Target::Pool(i) => {
            let mut routed = Routed::to(routing.pool(i).clone(), if model.is_some() { EXPLICIT } else { NO_MODEL });
            if selector.config().guard_all_requests && route.has_prompt() {
                routed.rewritten |= guard(routing, route, v, ask, preview.is_some())?;
            }
            routed
        }
        // Only prompts have signals: an auto embedding (or rerank) goes to the default pool.
        Target::Auto if !route.has_prompt() => Routed::to(routing.default_pool().clone(), model_select::NO_DECISION),
        Target::Auto => auto(gw, routing, route, v, ask, preview.as_deref_mut())?,
    };
    let mut routed = finish(routing, v, routed, preview.is_some());
    if preview.is_none() {
        routed.cache = look_up(routing, route, v, &routed, ask, gw.shared.as_ref());
        // A cache hit gets no route id: feedback on a stored answer would steer the decision
        // without an engine call behind it.
        if routed.cache.as_ref().and_then(|(_, o)| o.answer()).is_none() {
            routed.route_id = if ask.probe { None } else { issue_route_id(gw, routing, &routed, ask.caller.copied()) };
            routed.cascade = plan_cascade(routing, route, v, &mut routed);
        }
        routed.guard = routed.index.and_then(|i| routing.guards.get(i).cloned().flatten());
    }
    Ok(routed)
}

/// A cascade's second attempt: `pool` under `decision`, the decisions not asked again (the
/// body is the one the first pool got, plugins applied); it gets its own route id.
pub(crate) fn forced(
    gw: &Gateway,
    routing: &Routing,
    v: &mut Value,
    (pool, decision): (Arc<Pool>, &str),
    caller: Option<[u8; 32]>,
) -> Routed {
    let mut routed = Routed::to(pool, decision);
    // The decision's header changes apply to this attempt too (a reload since may have dropped it).
    let index = routing.selector.config().decisions.iter().position(|d| d.name == decision);
    routed.edits = index.and_then(|i| routing.edits.get(i).cloned().flatten());
    let mut routed = finish(routing, v, routed, false);
    routed.route_id = issue_route_id(gw, routing, &routed, caller);
    routed
}

/// The `x-route-id` of an answer routed as `routed` (the pool's configured quality seeds its arm).
fn issue_route_id(gw: &Gateway, routing: &Routing, routed: &Routed, caller: Option<[u8; 32]>) -> Option<u64> {
    let quality = routing.quality(&routed.pool);
    let learning = gw.routing.as_ref()?.learning();
    Some(learning.issue_for(&routed.decision, &routed.pool.id.0, quality, caller))
}

/// The decision's cascade for this request, if it has one that applies (counted when not):
/// logprobs are asked of the first pool.
fn plan_cascade(routing: &Routing, route: Route, v: &mut Value, routed: &mut Routed) -> Option<cascade::Plan> {
    let spec = routing.cascades.get(routed.index?)?.as_ref()?;
    if spec.to.id == routed.pool.id {
        return None; // already the larger pool: nothing to escalate to
    }
    let skip = match route {
        Route::Chat | Route::Completions if v.get("stream").and_then(Value::as_bool) == Some(true) => "skip_stream",
        Route::Chat | Route::Completions => {
            let added_logprobs = cascade::ask_logprobs(route, v);
            routed.rewritten |= added_logprobs;
            return Some(spec.plan(&routed.decision, added_logprobs, routed.route_id));
        }
        _ => "skip_route",
    };
    routing.metrics.count_cascade(&routed.decision, skip);
    None
}

/// The decision's response cache, if it has one: the request's ticket and
/// what the cache holds for it (counted).
fn look_up(
    routing: &Routing,
    route: Route,
    v: &Value,
    routed: &Routed,
    ask: &Asked<'_>,
    shared: Option<&Arc<crate::shared::Shared>>,
) -> Option<(crate::cache::Ticket, crate::cache::Outcome)> {
    use crate::cache::{Outcome, Skip};
    let store = routing.caches.get(routed.index?)?.as_ref()?;
    let vector = ask.embeddings.and_then(|e| e.last.as_ref()).and_then(|l| l.as_ref().ok()).cloned();
    let pool = &routed.pool.id.0;
    let asker =
        crate::cache::Asker { caller: ask.caller, route: route.path(), decision: &routed.decision, pool, shared };
    let ticket = if ask.cache_bypass { Err(Skip::Bypass) } else { store.ticket(v, asker, vector) };
    let (found, outcome) = match ticket {
        Ok(ticket) => {
            let outcome = ticket.lookup();
            let label = match outcome {
                Outcome::Exact(_) => "hit_exact",
                Outcome::Semantic(..) => "hit_semantic",
                Outcome::Miss => "miss",
            };
            (Some((ticket, outcome)), label)
        }
        Err(Skip::Sampling) => (None, "skip_sampling"),
        Err(Skip::Choices) => (None, "skip_choices"),
        Err(Skip::Bypass) => (None, "skip_bypass"),
    };
    let decision = crate::metrics::escape(&routed.decision);
    routing.metrics.cache_lookups.inc(format_args!("decision=\"{decision}\",outcome=\"{outcome}\""));
    found
}

/// The signals the routing config reads (only those), and the decision they make.
fn decide<'r>(
    routing: &'r Routing,
    route: Route,
    v: &Value,
    ask: &Asked<'_>,
) -> Result<model_select::Choice<'r>, GatewayError> {
    let selector = &routing.selector;
    // Anthropic's request is read as the chat the engine makes of it (its tool results are
    // tool turns, its system prompt a system turn); its guards read the body as it goes out.
    let chat;
    let as_chat = if route == Route::Messages && (selector.needs_text() || selector.needs_shape()) {
        chat = routing.default_pool().renderer.anthropic_chat(v)?;
        &chat
    } else {
        v
    };
    let text = if selector.needs_text() { model_select::signal_text(as_chat) } else { String::new() };
    let guard = selector.needs_guard_text().then(|| model_select::guard_text(v));
    // Exact, by the default pool's tokenizer: for context signals, and for load signals' TTFT.
    let tokens = if selector.needs_tokens() || selector.needs_load() {
        let default = routing.default_pool();
        ask.renders.tokens(ask.planner, &default.renderer, route, v)?.tokens.len() as u64
    } else {
        0
    };
    let shape = if selector.needs_shape() { model_select::shape(as_chat) } else { model_select::Shape::default() };
    let pools =
        if selector.needs_load() { choose::pool_states(ask.planner.workers, routing, tokens) } else { Vec::new() };
    let input = SignalInput {
        text: &text,
        guard_text: guard.as_deref(),
        tokens,
        shape,
        headers: ask.headers,
        pools: &pools,
        embeddings: ask.embeddings,
    };
    Ok(selector.decide(&input))
}

/// `guard_all_requests`: a request that named its pool is decided too, and the winning
/// decision's guards run (`block` refuses, `pii_redact` redacts); true when the body changed.
fn guard(routing: &Routing, route: Route, v: &mut Value, ask: &Asked<'_>, dry: bool) -> Result<bool, GatewayError> {
    let choice = decide(routing, route, v, ask)?;
    let guards: Vec<PluginConfig> = choice
        .plugins()
        .iter()
        .filter(|p| matches!(p, PluginConfig::Block { .. } | PluginConfig::PiiRedact { .. }))
        .cloned()
        .collect();
    let changed = apply_plugins(routing, choice.name(), &guards, v, dry)?;
    if changed {
        ask.renders.forget();
    }
    Ok(changed)
}

/// An auto name's route: signals, the decision, its plugins, the algorithm and stickiness.
fn auto(
    gw: &Gateway,
    routing: &Routing,
    route: Route,
    v: &mut Value,
    ask: &Asked<'_>,
    mut preview: Option<&mut Preview>,
) -> Result<Routed, GatewayError> {
    let dry = preview.is_some();
    let start = Instant::now();
    let choice = decide(routing, route, v, ask)?;
    if !dry {
        routing.metrics.signal_seconds.observe(start.elapsed().as_secs_f64());
    }
    let name = choice.name().to_owned();
    if let Some(p) = preview.as_deref_mut() {
        p.decision = Some(name.clone());
        for (signal, r) in choice.signals.iter() {
            let value = serde_json::json!({"matched": r.matched, "confidence": r.confidence, "value": r.value});
            p.signals.insert(signal.to_string(), value);
        }
        for (signal, error) in choice.signals.errors() {
            p.signals.insert(signal.to_string(), serde_json::json!({"matched": false, "error": error}));
        }
        for signal in choice.signals.not_computed() {
            p.signals.insert(signal.to_string(), serde_json::json!({"matched": false, "not_computed": true}));
        }
        p.decisions = choice
            .trace
            .iter()
            .map(|t| serde_json::json!({"name": t.name, "matched": t.matched, "confidence": t.confidence, "failed": t.failed}))
            .collect();
        p.candidates = choice.pools.iter().map(|&i| routing.pool(i).id.0.clone()).collect();
    }
    let changed = plugins(routing, &choice, v, dry)?;
    if changed {
        ask.renders.forget();
    }
    let chosen = choose::pool(gw, routing, &choice, (route, v, ask), preview.as_deref_mut())?;
    let key = sticky::key(ask.session, v);
    let session = preview.map(|p| &mut p.session);
    let (pool, outcome) = sticky::apply(gw, routing, &choice, &chosen, (route, v, ask), key, session);
    if !dry && key.is_some() {
        routing.metrics.sessions.inc(format_args!("outcome=\"{}\"", outcome.as_str()));
    }
    // `fit_context`: the chat cut to the chosen pool's window.
    let context_dropped = if choice.fits_context() { fit::context(routing.pool(pool), route, v, ask)? } else { None };
    if context_dropped.is_some() {
        ask.renders.forget();
    }
    let debug = ask.debug.then(|| Explain {
        signals: choice.signals.iter().filter(|(_, r)| r.matched).map(|(s, _)| s.to_string()).collect(),
        confidence: choice.index.map_or(0.0, |i| choice.trace[i].confidence),
        candidates: choice.pools.iter().map(|&i| routing.pool(i).id.0.clone()).collect(),
    });
    Ok(Routed {
        pool: routing.pool(pool).clone(),
        decision: name,
        rewritten: changed || context_dropped.is_some(),
        edits: choice.index.and_then(|i| routing.edits.get(i).cloned().flatten()),
        debug,
        index: choice.index,
        cache: None,
        route_id: None,
        cascade: None,
        guard: None,
        context_dropped,
    })
}

/// Runs the decision's plugins on the body; true when they changed it. A
/// block answers before any other plugin runs (nothing redacted, counted or sent).
fn plugins(
    routing: &Routing,
    choice: &model_select::Choice<'_>,
    v: &mut Value,
    dry: bool,
) -> Result<bool, GatewayError> {
    apply_plugins(routing, choice.name(), choice.plugins(), v, dry)
}

/// Runs decision `name`'s `plugins` on the body (a block first); true when they changed it.
fn apply_plugins(
    routing: &Routing,
    name: &str,
    plugins: &[PluginConfig],
    v: &mut Value,
    dry: bool,
) -> Result<bool, GatewayError> {
    if let Some((status, message)) = plugins.iter().find_map(|p| match p {
        PluginConfig::Block { status, message } => Some((*status, message.clone())),
        _ => None,
    }) {
        if !dry {
            routing.metrics.blocks.inc(format_args!("decision=\"{}\"", crate::metrics::escape(name)));
        }
        return Err(GatewayError::Blocked { status, message, decision: name.to_owned() });
    }
    let mut changed = false;
    for plugin in plugins {
        match plugin {
            PluginConfig::PiiRedact { types } => {
                let types = model_select::redact_types(types);
                let r = model_select::redact(v, routing.selector.detector(), &types);
                changed |= r.total() > 0;
                if !dry {
                    for (ty, n) in r.counts {
                        routing.metrics.redactions.add(format_args!("type=\"{}\"", ty.as_str()), n as u64);
                    }
                }
            }
            PluginConfig::SystemPrompt { prompt, mode } => changed |= model_select::set_system_prompt(v, prompt, *mode),
            PluginConfig::Block { .. }
            | PluginConfig::HeaderMutation(_)
            | PluginConfig::ResponseCache(_)
            | PluginConfig::Cascade(_)
            | PluginConfig::FitContext {}
            | PluginConfig::ResponseGuard(_) => {}
        }
    }
    Ok(changed)
}

/// What the request asked of routing besides its body.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Asked<'a> {
    /// `x-route-debug: true`: the explain in the answer's headers.
    pub(crate) debug: bool,
    /// The headers header rules read (lowercase name, value).
    pub(crate) headers: &'a [(String, String)],
    /// The client's `x-session-id`.
    pub(crate) session: Option<&'a [u8]>,
    /// The request's vectors, computed before routing when the decisions read them.
    pub(crate) embeddings: Option<&'a model_select::RequestEmbeddings>,
    /// `cache-control: no-cache` or `no-store`: no response cache is read or written.
    pub(crate) cache_bypass: bool,
    /// The caller's identity, part of a response cache's key.
    pub(crate) caller: Option<&'a [u8; 32]>,
    /// The request's prompt, rendered at most once per renderer.
    pub(crate) renders: &'a planner::Renders,
    /// What its plans read: the request's one snapshot of the fleet among them.
    pub(crate) planner: planner::Planner<'a>,
    /// `x-route-mode: probe`: routed and sent, but no plugin storage written (no route id,
    /// no conversation remembered; the cache is bypassed through `cache_bypass`).
    pub(crate) probe: bool,
}

/// The headers of a request that header rules read: none without such rules
/// (the common case costs one branch).
pub(crate) fn wanted_headers<'h>(
    routing: Option<&Routing>,
    headers: impl Iterator<Item = (&'h str, &'h [u8])>,
) -> Vec<(String, String)> {
    let Some(routing) = routing else { return Vec::new() };
    let names = routing.selector.header_names();
    if names.is_empty() {
        return Vec::new();
    }
    headers
        .filter_map(|(name, value)| {
            let name = name.trim().to_ascii_lowercase();
            let value = std::str::from_utf8(value).ok()?.trim();
            names.contains(&name).then(|| (name, value.to_owned()))
        })
        .collect()
}

/// Names the pool's served model in the body, and counts the request.
fn finish(routing: &Routing, v: &mut Value, mut routed: Routed, dry: bool) -> Routed {
    let pool = routed.pool.clone();
    if let Some(fields) = v.as_object_mut()
        && fields.get("model").and_then(Value::as_str) != Some(pool.served_model.as_str())
    {
        fields.insert("model".into(), Value::String(pool.served_model.clone()));
        routed.rewritten = true;
    }
    if !dry {
        let labels = format_args!(
            "pool=\"{}\",decision=\"{}\"",
            crate::metrics::escape(&pool.id.0),
            crate::metrics::escape(&routed.decision)
        );
        routing.metrics.requests.inc(labels);
    }
    routed
}
