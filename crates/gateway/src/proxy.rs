//! The proxied routes: parse, plan, charge and forward a request (shared by
//! both HTTP front ends), and the axum front end's handler (its relay of the
//! answer is `relay.rs`).

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use policy::{Candidate, Decision, RequestInfo};
use renderer::{ChatRequest, PageHasher, Prompt};
use router_types::DpRank;
use serde_json::{Value, json};
use tracing::{Instrument, Span, debug, debug_span, warn};

use crate::admission::Admission;
use crate::pools::HeaderEdits;
pub(crate) use crate::relay::{Ending, failed_mid_answer, stream_back};
use crate::shape::Required;
use crate::{Gateway, GatewayError, RetryConfig};
use fleet::{LoadGuard, Worker};

/// The header SGLang and vLLM read a data-parallel rank hint from.
pub(crate) const RANK_HEADER: &str = "x-data-parallel-rank";

/// Headers that describe one hop of a message, not the message: never passed
/// on, in either direction. `proxy-authorization` and `proxy-authenticate`
/// are credentials for (and challenges from) a proxy on this hop: relayed,
/// they would hand a client's proxy credentials to the worker.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Request headers the router sets itself on the way to the worker.
const SET_BY_ROUTER: [&str; 4] = ["host", "content-length", "content-type", "expect"];

fn listed(name: &str, list: &[&str]) -> bool {
    list.iter().any(|n| name.eq_ignore_ascii_case(n))
}

/// Whether a client's request header goes on to the worker: end-to-end
/// headers do (`authorization`, `x-request-id`, `traceparent`, ...), hop-by-hop
/// ones, those the client's `connection` header names, and those the router
/// sets do not.
pub(crate) fn forwarded(name: &str, connection: &str) -> bool {
    !listed(name, &HOP_BY_HOP)
        && !listed(name, &SET_BY_ROUTER)
        && !connection.split(',').any(|t| t.trim().eq_ignore_ascii_case(name))
}

/// Whether a worker's answer header goes back to the client: end-to-end ones
/// do, except the length, which the relay sets from the body it sends, and
/// those the answer's own `connection` header (`connection`, its tokens
/// joined by commas) names as hop-only.
pub(crate) fn relayed(name: &str, connection: &str) -> bool {
    !listed(name, &HOP_BY_HOP)
        && !name.eq_ignore_ascii_case("content-length")
        && !connection.split(',').any(|t| t.trim().eq_ignore_ascii_case(name))
}

/// The paths requests are proxied to (every [`Route`]'s), for the fleet to parse once per worker.
pub const PROXIED_PATHS: &[&str] =
    &["/v1/chat/completions", "/v1/completions", "/generate", "/v1/embeddings", "/v1/rerank", "/v1/classify"];

/// The proxied routes. The first three carry a prompt the policy may read;
/// the others are passed through to the worker the policy picks by load
/// (their bodies are checked to be JSON objects, never rendered).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    Chat,
    Completions,
    Generate,
    Embeddings,
    Rerank,
    Classify,
}

/// A routing decision and what it was based on.
#[derive(Debug)]
pub(crate) struct Plan {
    /// The pool it chose in (its index in the gateway's pools).
    pub(crate) pool: usize,
    /// The routable workers, in the order of `candidates`.
    pub(crate) workers: Vec<Arc<Worker>>,
    pub(crate) candidates: Vec<Candidate>,
    pub(crate) decision: Decision,
    /// The position of the chosen worker in `workers` and `candidates`.
    pub(crate) chosen: usize,
    pub(crate) input_tokens: u64,
    /// The prompt's text, when the policy reads it.
    pub(crate) text: Option<String>,
    pub(crate) rank: Option<DpRank>,
}

impl Plan {
    pub(crate) fn chosen(&self) -> &Arc<Worker> {
        &self.workers[self.chosen]
    }

    /// The candidates as an explain shows them.
    pub(crate) fn candidates_json(&self) -> Vec<Value> {
        self.candidates
            .iter()
            .zip(&self.workers)
            .map(|(c, w)| json!({"worker": w.url, "id": w.id, "matched_tokens": c.matched_tokens, "in_flight": c.load.in_flight}))
            .collect()
    }

    /// What the policy saw of the request.
    pub(crate) fn request(&self) -> RequestInfo<'_> {
        RequestInfo { input_tokens: self.input_tokens, text: self.text.as_deref() }
    }

    /// Tells the policy the request really goes where it decided (never for an explain).
    pub(crate) fn commit(&self, gw: &Gateway) {
        self.commit_to(&*gw.pools[self.pool].policy);
    }

    /// Tells `policy` (the one that decided) the request really goes where it decided.
    pub(crate) fn commit_to(&self, policy: &dyn policy::Policy) {
        policy.commit(&self.decision, &self.candidates, &self.request());
    }
}

/// Load and accounting of one forwarded request, released once on drop.
pub(crate) struct InFlight {
    gw: Arc<Gateway>,
    /// Its slot and memory reservation.
    _admission: Admission,
    /// The chosen worker's load, held until the answer ends.
    pub(crate) load: LoadGuard,
    /// What the answer tells of the pool and decision (with a routing config).
    pub(crate) route_headers: Option<crate::pools::RouteHeaders>,
    route: Route,
    /// The answer's status; 0 until there is one.
    pub(crate) status: u16,
    start: Instant,
    /// Where a complete answer is kept (a response-cache miss).
    pub(crate) cache: Option<crate::cache::Ticket>,
    /// The decision's cascade judges the answer: its plan and the body the worker got.
    pub(crate) cascade: Option<Box<(crate::pools::cascade::Plan, Bytes)>>,
}

/// What `forward` did with a request.
pub(crate) enum Forwarded<T> {
    /// Sent to a worker: the request's load guard, the worker, its answer's head.
    Sent(InFlight, Arc<Worker>, T),
    /// Answered from the decision's response cache.
    Cached(crate::cache::Hit),
}

/// The outcome of parsing and routing, off the serving thread for a large body
/// (one per request, moved once: its size does not matter).
#[allow(clippy::large_enum_variant)]
enum Step {
    Send(Option<Value>, Plan, Option<crate::pools::Routed>, Bytes),
    Cached(crate::cache::Hit),
}

/// Why a request could not be delivered to a worker.
#[derive(Debug)]
pub(crate) struct SendError {
    /// Nothing reached the worker (it may be retried elsewhere).
    pub(crate) connect: bool,
    pub(crate) message: String,
}

// === impl Route ===

impl Route {
    /// Every proxied route.
    pub(crate) const ALL: [Route; 6] =
        [Route::Chat, Route::Completions, Route::Generate, Route::Embeddings, Route::Rerank, Route::Classify];

    /// Whether the route carries a prompt (rendered, tokenized, matched against the index).
    pub(crate) fn has_prompt(self) -> bool {
        matches!(self, Route::Chat | Route::Completions | Route::Generate)
    }

    /// The proxied route at `path`, if any.
    pub(crate) fn from_path(path: &str) -> Option<Route> {
        Route::ALL.into_iter().find(|r| r.path() == path)
    }

    pub(crate) fn path(self) -> &'static str {
        match self {
            Route::Chat => PROXIED_PATHS[0],
            Route::Completions => PROXIED_PATHS[1],
            Route::Generate => PROXIED_PATHS[2],
            Route::Embeddings => PROXIED_PATHS[3],
            Route::Rerank => PROXIED_PATHS[4],
            Route::Classify => PROXIED_PATHS[5],
        }
    }

    pub(crate) fn label(self) -> &'static str {
        match self {
            Route::Chat => "chat",
            Route::Completions => "completions",
            Route::Generate => "generate",
            Route::Embeddings => "embeddings",
            Route::Rerank => "rerank",
            Route::Classify => "classify",
        }
    }
}

impl InFlight {
    /// The accounting of a request about to be answered from `load`'s worker.
    pub(crate) fn new(gw: Arc<Gateway>, admission: Admission, load: LoadGuard, route: Route, start: Instant) -> Self {
        Self {
            gw,
            _admission: admission,
            load,
            route_headers: None,
            route,
            status: 0,
            start,
            cache: None,
            cascade: None,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let m = &self.gw.metrics;
        m.latency.observe(self.start.elapsed().as_secs_f64());
        // Status 0: the request failed before an answer; `handle` counts its error.
        if self.status != 0 {
            m.requests.inc(format_args!("route=\"{}\",status=\"{}\"", self.route.label(), self.status));
        }
    }
}

/// Whether a client that sent `client` may use the OpenAI routes: with
/// client keys configured it must present one (401 otherwise); without them
/// anyone may.
pub(crate) fn check_client(gw: &Gateway, client: Option<&[u8]>) -> Result<(), GatewayError> {
    gw.client_keys.check(crate::auth::Plane::Data, client)
}

/// What goes to the worker as `Authorization` for an admitted client that
/// sent `client`: with client keys configured, the workers' key
/// (`--api-key`), never the client's key; without them, the client's own
/// credentials, and the workers' key never (an anonymous client is not the router).
pub(crate) fn worker_credentials(gw: &Gateway, client: Option<&[u8]>) -> Option<Vec<u8>> {
    if gw.client_keys.is_empty() {
        client.map(<[u8]>::to_vec)
    } else {
        gw.worker_auth.as_ref().map(|v| v.as_bytes().to_vec())
    }
}

/// Reads a request body of at most `max_body_bytes`: over it is 413; a body
/// that is not valid HTTP framing (a bad chunk size, a bare LF) is the
/// client's malformed request (400), not a large one.
pub(crate) async fn read_body(gw: &Gateway, body: Body) -> Result<Bytes, GatewayError> {
    read_body_within(body, gw.config.max_body_bytes).await
}

/// [`read_body`] with its own bound (413 past `limit`).
pub(crate) async fn read_body_within(body: Body, limit: usize) -> Result<Bytes, GatewayError> {
    use http_body_util::BodyExt;
    let limited = http_body_util::Limited::new(body, limit);
    match limited.collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) => {
            let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&*e);
            while let Some(c) = cause {
                if c.is::<http_body_util::LengthLimitError>() {
                    return Err(GatewayError::TooLarge(limit));
                }
                cause = c.source();
            }
            Err(GatewayError::BadRequest(format!("the request body could not be read: {}", describe(&*e))))
        }
    }
}

pub(crate) fn parse_json(bytes: &[u8]) -> Result<Value, GatewayError> {
    let v: Value =
        serde_json::from_slice(bytes).map_err(|e| GatewayError::BadRequest(format!("invalid JSON body: {e}")))?;
    if !v.is_object() {
        return Err(GatewayError::BadRequest("the body must be a JSON object".into()));
    }
    Ok(v)
}

/// The body as far as the router needs it: the parsed JSON, or `None` when
/// the policy needs nothing from it and only its shape was checked (no tree built).
/// `parsed` is the body's JSON when it was parsed already (before routing).
pub(crate) fn parse_body(
    gw: &Gateway,
    route: Route,
    bytes: &[u8],
    parsed: Option<Value>,
) -> Result<Option<Value>, GatewayError> {
    let json = move || parsed.map_or_else(|| parse_json(bytes), Ok).map(Some);
    // `/generate` is parsed for --dp-aware too: its rank goes in the body.
    let dp_generate = route == Route::Generate && gw.fleet.dp_aware();
    let reads = |p: &Arc<crate::pools::Pool>| p.policy.needs_tokens() || p.policy.needs_text();
    if route.has_prompt() && (gw.index.is_some() || gw.pools.iter().any(reads) || dp_generate) {
        return json();
    }
    let required = match route {
        Route::Chat => Required::Messages,
        Route::Completions => Required::Prompt,
        Route::Generate => Required::TextOrIds,
        Route::Embeddings | Route::Rerank | Route::Classify => Required::Object,
    };
    crate::shape::check(bytes, required).map_err(GatewayError::BadRequest)?;
    // With a routing config every body names its model (its shape checked above: it may not be rendered).
    if gw.routing.is_some() {
        return json();
    }
    Ok(None)
}

/// A prompt's tokens (empty when not needed) and text.
pub(crate) type Rendered = (Vec<u32>, Option<String>);

/// Tokens and text of the request, by `pool`'s renderer (the tokens only
/// when the index or the pool's policy reads them).
pub(crate) fn prompt(
    gw: &Gateway,
    pool: &crate::pools::Pool,
    route: Route,
    v: &Value,
) -> Result<(Vec<u32>, Option<String>), GatewayError> {
    let need_tokens = gw.index.is_some() || pool.policy.needs_tokens();
    render_prompt(&pool.renderer, route, v, need_tokens)
}

/// Tokens (when `need_tokens`) and text of the request, by `renderer`.
pub(crate) fn render_prompt(
    renderer: &renderer::Renderer,
    route: Route,
    v: &Value,
    need_tokens: bool,
) -> Result<(Vec<u32>, Option<String>), GatewayError> {
    let vocab = renderer.tokenizer().vocab_size();
    match route {
        Route::Chat => {
            let req = ChatRequest::from_value(v)?;
            if need_tokens {
                let r = renderer.render_chat(&req)?;
                Ok((r.token_ids, Some(r.text)))
            } else {
                Ok((Vec::new(), Some(renderer.render_text(&req)?)))
            }
        }
        // Never asked: these routes' bodies are not parsed (`parse_body`).
        Route::Embeddings | Route::Rerank | Route::Classify => Ok((Vec::new(), None)),
        Route::Completions | Route::Generate => {
            let p = if route == Route::Completions {
                Prompt::from_completions(v.get("prompt").unwrap_or(&Value::Null), vocab)?
            } else {
                Prompt::from_generate(v, vocab)?
            };
            let text = match &p {
                Prompt::Text(t) => Some(t.clone()),
                Prompt::Tokens(_) => None,
            };
            let tokens = if need_tokens { renderer.prompt_tokens(&p)? } else { Vec::new() };
            Ok((tokens, text))
        }
    }
}

/// What a request carries besides its route and body.
#[derive(Debug, Clone, Default)]
pub(crate) struct Meta {
    /// Its id (`x-request-id`).
    pub(crate) id: String,
    /// The client's routing key (`x-smg-routing-key`): its worker by rendezvous hashing.
    pub(crate) routing_key: Option<Vec<u8>>,
    /// The client asked for the routing explain in the answer's headers (`x-route-debug: true`).
    pub(crate) route_debug: bool,
    /// The headers the routing config's header rules read (none without such rules).
    pub(crate) signal_headers: Vec<(String, String)>,
    /// The client's conversation id (`x-session-id`), at most 256 bytes.
    pub(crate) session: Option<Vec<u8>>,
    /// `cache-control: no-cache` or `no-store`: no response cache is read or written.
    pub(crate) cache_bypass: bool,
    /// A cascade's second attempt: this pool (an index) under this decision, not the decisions'.
    pub(crate) forced: Option<(usize, String)>,
}

/// The request header asking for the routing explain.
pub(crate) const ROUTE_DEBUG_HEADER: &str = "x-route-debug";

impl Meta {
    /// Whether an `x-route-debug` value asks for the explain.
    pub(crate) fn wants_debug(value: Option<&[u8]>) -> bool {
        value.is_some_and(|v| v.trim_ascii().eq_ignore_ascii_case(b"true") || v.trim_ascii() == b"1")
    }

    /// A routing key worth routing by: not empty, at most 256 bytes.
    pub(crate) fn key(value: Option<&[u8]>) -> Option<Vec<u8>> {
        value.map(<[u8]>::trim_ascii).filter(|k| !k.is_empty() && k.len() <= 256).map(<[u8]>::to_vec)
    }
}

/// Chooses a worker of pool `pool`: candidates with their load and cached
/// prefix, then the pool's policy, unless the client's routing key names the
/// worker. `rendered`: the prompt as the pool's renderer made it already (the
/// routing config's signals), else it is rendered here when read. `credit`: the
/// request is sent where the plan says (the chosen worker is credited with its pages).
pub(crate) fn plan(
    gw: &Gateway,
    pool: usize,
    route: Route,
    v: Option<&Value>,
    key: Option<&[u8]>,
    rendered: Option<Rendered>,
    credit: bool,
) -> Result<Plan, GatewayError> {
    let p = &gw.pools[pool];
    // Rendered only for what reads it (a body parsed for its model alone is not rendered).
    let reads = gw.index.is_some() || p.policy.needs_tokens() || p.policy.needs_text();
    let (tokens, text) = match (v, rendered) {
        (Some(_), Some(r)) if reads => r,
        (Some(v), _) if reads && route.has_prompt() => prompt(gw, p, route, v)?,
        _ => (Vec::new(), None),
    };
    let workers = routable(gw, |w| p.serves(w));
    plan_in(gw, pool, &*p.policy, workers, Prompted { v, tokens: &tokens, text, match_prefix: true, credit }, key)
}

/// The routable workers `keep` accepts.
pub(crate) fn routable(gw: &Gateway, keep: impl Fn(&Worker) -> bool) -> Vec<Arc<Worker>> {
    gw.fleet.snapshot().iter().filter(|w| keep(w) && w.is_routable()).cloned().collect()
}

/// What a plan knows of the request's prompt.
pub(crate) struct Prompted<'a> {
    /// The parsed body (`None`: not parsed, nothing to match).
    pub(crate) v: Option<&'a Value>,
    pub(crate) tokens: &'a [u32],
    pub(crate) text: Option<String>,
    /// Match the prompt against the index (false: every candidate holds nothing, as a decode
    /// worker's KV comes from its prefill, never from its own cache).
    pub(crate) match_prefix: bool,
    /// The request goes where the plan says: with `credit_pending`, the chosen worker is
    /// credited with the prompt's pages before another plan matches (not for a preview).
    pub(crate) credit: bool,
}

/// Chooses one of `workers` with `policy`: candidates with their load and
/// cached prefix, unless the client's routing key names the worker.
pub(crate) fn plan_in(
    gw: &Gateway,
    pool: usize,
    policy: &dyn policy::Policy,
    workers: Vec<Arc<Worker>>,
    prompted: Prompted<'_>,
    key: Option<&[u8]>,
) -> Result<Plan, GatewayError> {
    let Prompted { v, tokens, text, match_prefix, credit } = prompted;
    if workers.is_empty() {
        return Err(GatewayError::NoWorker);
    }
    let v = v.filter(|_| match_prefix);
    let text = text.filter(|_| match_prefix);
    let input_tokens = tokens.len() as u64;
    // The pool's page size, read once: a worker followed meanwhile may fix it.
    let block_size = gw.fleet.block_size_of(&gw.pools[pool].id);
    // A mixed fleet is matched in each mode; a worker's blocks exist in its own mode only.
    let mut chains = Vec::new();
    if let (Some(index), Some(v)) = (&gw.index, v) {
        let page = NonZeroUsize::new(block_size).unwrap_or(NonZeroUsize::MIN);
        // The request's namespace starts its chain, as the engine's does.
        let served = || {
            let mut names: Vec<String> = workers.iter().filter_map(|w| w.info()?.model_id).collect();
            names.push(gw.pools[pool].served_model.clone());
            names
        };
        let ns = crate::namespace::of_request(v, served, Some(index));
        let prior = renderer::hash::namespace_prior(ns.adapter, ns.salt);
        let memo = &gw.pools[pool].chain_memo;
        chains = gw
            .fleet
            .hash_modes()
            .modes()
            .map(|m| memo.block_hashes(&PageHasher::new(page, m), tokens, prior.as_ref()))
            .collect();
    }
    // From the match to the credit, one plan at a time (the pages hashed before): a burst
    // sharing a cold prefix would otherwise be matched before any of it is credited, and
    // spread over the workers.
    let credit = credit && match_prefix && gw.config.credit_pending;
    let _one_at_a_time = credit.then(|| gw.credit_lock.lock().unwrap_or_else(|p| p.into_inner()));
    let mut matched: HashMap<kv_index::WorkerId, (u32, Option<DpRank>)> = HashMap::new();
    if let Some(index) = &gw.index {
        for chain in &chains {
            for m in index.prefix_depths(chain, &kv_index::MatchOptions::default()) {
                let e = matched.entry(m.worker).or_insert((0, None));
                if m.blocks > e.0 {
                    *e = (m.blocks, m.rank);
                }
            }
        }
    }
    let bs = block_size as u64;
    let candidates: Vec<Candidate> = workers
        .iter()
        .map(|w| {
            let blocks = w.index_id.and_then(|id| matched.get(&id)).map_or(0, |m| u64::from(m.0));
            Candidate {
                worker: w.id,
                load: if match_prefix { w.load() } else { w.decode_load() },
                matched_tokens: (blocks * bs).min(input_tokens),
                // Nothing to match is known exactly: no text tree guesses (decode workers).
                followed: w.is_followed() || !match_prefix,
            }
        })
        .collect();
    let by_key = key.and_then(|k| policy::by_key(k, workers.iter().map(|w| (w.id, w.url.as_str()))));
    let decision = match by_key {
        Some(worker) => Decision { worker, reason: policy::Reason::RoutingKey },
        None => policy
            .select(&candidates, &RequestInfo { input_tokens, text: text.as_deref() })
            .map_err(|_| GatewayError::NoWorker)?,
    };
    let chosen = workers.iter().position(|w| w.id == decision.worker).ok_or(GatewayError::NoWorker)?;
    let rank = workers[chosen].index_id.and_then(|id| matched.get(&id)).and_then(|m| m.1);
    if credit && let (Some(index), Some(id), Some(chain)) = (&gw.index, workers[chosen].index_id, chains.first()) {
        index.credit_pending(id, chain);
    }
    Ok(Plan { pool, workers, candidates, decision, chosen, input_tokens, text, rank })
}

/// The span a proxied request runs in; `forward` fills in the decision.
/// Debug level (`RUST_LOG=gateway=debug`): at info, recording it cost about
/// 8 µs a request, a sixth of what the router adds (docs/benchmarks.md).
pub(crate) fn request_span(gw: &Gateway, route: Route) -> Span {
    debug_span!(
        "request",
        route = route.label(),
        request_id = tracing::field::Empty,
        policy = gw.default_pool().policy.name(),
        worker = tracing::field::Empty,
        matched_tokens = tracing::field::Empty,
        reason = tracing::field::Empty
    )
}

/// Counts (and logs, by side) a request that failed before any answer from a worker.
pub(crate) fn count_error(gw: &Gateway, route: Route, e: &GatewayError, id: Option<&str>) {
    gw.metrics.requests.inc(format_args!("route=\"{}\",status=\"{}\"", route.label(), e.status().as_u16()));
    let side = e.side();
    gw.metrics.errors.inc(format_args!("side=\"{}\",type=\"{}\"", side.as_str(), e.kind()));
    // A worker's or our own failure is worth a line; refusals and load shedding are not (at that rate).
    match e {
        GatewayError::Upstream { .. } | GatewayError::Timeout(_) | GatewayError::Internal(_) => {
            warn!(request_id = id, route = route.label(), kind = e.kind(), side = side.as_str(), error = %e, "request failed");
        }
        _ => {
            debug!(request_id = id, route = route.label(), kind = e.kind(), side = side.as_str(), error = %e, "request refused")
        }
    }
}

pub(crate) async fn handle(State(gw): State<Arc<Gateway>>, headers: HeaderMap, body: Body, route: Route) -> Response {
    let span = request_span(&gw, route);
    // Set by the context layer on every request.
    let id = headers.get(crate::context::REQUEST_ID_HEADER).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    span.record("request_id", id.as_str());
    async move {
        match serve(gw.clone(), headers, body, route, &id).await {
            Ok(r) => r,
            Err(e) => {
                count_error(&gw, route, &e, Some(&id));
                e.into_response()
            }
        }
    }
    .instrument(span)
    .await
}

/// The axum front end: read the body, forward with hyper's client, relay the answer.
async fn serve(
    gw: Arc<Gateway>,
    mut headers: HeaderMap,
    body: Body,
    route: Route,
    id: &str,
) -> Result<Response, GatewayError> {
    let start = Instant::now();
    // Admitted before the body is read: a chunked body of unknown size is charged the largest one.
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.trim().parse::<usize>().ok());
    let charged = declared.unwrap_or(gw.config.max_body_bytes).min(gw.config.max_body_bytes);
    let admission = Admission::admit_waiting(&gw, charged).await?;
    let bytes = read_body(&gw, body).await?;
    let client = gw.client();
    upstream_headers(&gw, &mut headers);
    let headers = Arc::new(headers);
    let meta = Meta {
        id: id.to_string(),
        routing_key: Meta::key(headers.get(policy::ROUTING_KEY_HEADER).map(HeaderValue::as_bytes)),
        route_debug: Meta::wants_debug(headers.get(ROUTE_DEBUG_HEADER).map(HeaderValue::as_bytes)),
        signal_headers: crate::pools::wanted_headers(&gw, headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes()))),
        session: Meta::key(headers.get(crate::pools::SESSION_HEADER).map(HeaderValue::as_bytes)),
        cache_bypass: crate::cache::bypassed(headers.get_all(header::CACHE_CONTROL).iter().map(HeaderValue::as_bytes)),
        forced: None,
    };
    if let Some(pd) = gw.pd.as_ref() {
        return crate::pd::serve(&gw, pd, admission, route, bytes, headers, start, &meta).await;
    }
    let send = |worker: Arc<Worker>, body: Bytes, rank: Option<DpRank>, edits: Option<Arc<HeaderEdits>>| {
        let (client, headers) = (client.clone(), headers.clone());
        async move { send_edited(&client, &headers, &worker, route, body, rank, edits).await }
    };
    let (mut guard, worker, resp) = match forward(&gw, admission, route, bytes, start, &meta, &send).await? {
        Forwarded::Sent(guard, worker, resp) => (guard, worker, resp),
        Forwarded::Cached(hit) => return Ok(hit.into_response()),
    };
    let Some((plan, sent)) = guard.cascade.take().map(|b| *b).filter(|_| resp.status() == StatusCode::OK) else {
        return Ok(relay(&gw, guard, worker, resp));
    };
    // The decision's cascade judges the first pool's whole answer.
    use crate::pools::cascade::{self, Judged};
    let verdict = match cascade::whole(&gw, guard, worker, resp, &plan, route).await? {
        Judged::Answer(answer) => return Ok(answer),
        Judged::Pass(guard, worker, resp) => return Ok(relay(&gw, guard, worker, resp)),
        Judged::Escalate(verdict) => verdict,
    };
    let body = cascade::escalated_body(&plan, &sent);
    let admission = Admission::admit_waiting(&gw, body.len()).await?;
    let meta = Meta { forced: Some((plan.to, plan.decision.clone())), ..meta };
    let Forwarded::Sent(guard, worker, resp) = forward(&gw, admission, route, body, start, &meta, &send).await? else {
        return Err(GatewayError::Internal("a forced route read a response cache".into()));
    };
    let mut answer = relay(&gw, guard, worker, resp);
    answer.headers_mut().insert(cascade::CASCADE_HEADER, verdict.header());
    Ok(answer)
}

/// A worker's answer relayed to the client, with the route headers.
fn relay(
    gw: &Gateway,
    mut guard: InFlight,
    worker: Arc<Worker>,
    resp: axum::http::Response<hyper::body::Incoming>,
) -> Response {
    let route_headers = guard.route_headers.take();
    let mut answer = stream_back(guard, worker, resp, gw.config.limits.upstream_idle_timeout, Ending::default());
    if let Some(extra) = route_headers {
        answer.headers_mut().extend(extra.0.into_iter().map(|(n, v)| (HeaderName::from_static(n), v)));
    }
    answer
}

/// [`send_to`] with a decision's header changes applied.
async fn send_edited(
    client: &crate::UpstreamClient,
    headers: &HeaderMap,
    worker: &Worker,
    route: Route,
    body: Bytes,
    rank: Option<DpRank>,
    edits: Option<Arc<HeaderEdits>>,
) -> Result<axum::http::Response<hyper::body::Incoming>, SendError> {
    match edits {
        None => send_to(client, headers, worker, route.path(), body, rank).await,
        Some(edits) => send_to(client, &edits.applied_to(headers), worker, route.path(), body, rank).await,
    }
}

/// POSTs a JSON `body` to `path` on `worker` with the client's (prepared)
/// `headers`, and the router's rank hint, which wins over one the client sent.
pub(crate) async fn send_to(
    client: &crate::UpstreamClient,
    headers: &HeaderMap,
    worker: &Worker,
    path: &str,
    body: Bytes,
    rank: Option<DpRank>,
) -> Result<axum::http::Response<hyper::body::Incoming>, SendError> {
    let Some(endpoint) = worker.endpoint(path) else {
        return Err(SendError { connect: false, message: "invalid worker URL".into() });
    };
    let mut req = axum::http::Request::post(endpoint);
    if let Some(h) = req.headers_mut() {
        h.clone_from(headers);
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(rank) = rank {
            h.insert(RANK_HEADER, HeaderValue::from(rank.0));
        }
    }
    let req =
        req.body(http_body_util::Full::new(body)).map_err(|e| SendError { connect: false, message: e.to_string() })?;
    client.request(req).await.map_err(|e| SendError { connect: e.is_connect(), message: describe(&e) })
}

/// Makes a client's headers the worker's: hop-by-hop ones out, and the
/// credentials the worker gets ([`worker_credentials`]) in.
pub(crate) fn upstream_headers(gw: &Gateway, headers: &mut HeaderMap) {
    let connection: Vec<&str> = headers.get_all(header::CONNECTION).iter().filter_map(|v| v.to_str().ok()).collect();
    let connection = connection.join(",");
    let names: Vec<HeaderName> = headers.keys().cloned().collect();
    for name in names {
        if !forwarded(name.as_str(), &connection) {
            headers.remove(&name);
        }
    }
    // The client's credentials were checked by the route's layer; what the worker gets is decided here.
    let client_auth = headers.remove(header::AUTHORIZATION);
    if let Some(auth) = worker_credentials(gw, client_auth.as_ref().map(HeaderValue::as_bytes))
        && let Ok(mut v) = HeaderValue::from_bytes(&auth)
    {
        v.set_sensitive(true);
        headers.insert(header::AUTHORIZATION, v);
    }
}

/// Routes an admitted request and delivers it: parse and plan (off the
/// serving thread when the body is large), account, then `send` it to the
/// chosen worker, again (`--retry-*`, after a backoff, on another worker when
/// there is one) while it could not be reached or answered a retryable
/// status: nothing of that answer has reached the client.
/// Returns the request's load guard, the worker, and what `send` returned
/// (the answer's head).
pub(crate) async fn forward<T, F, Fut>(
    gw: &Arc<Gateway>,
    admission: Admission,
    route: Route,
    bytes: Bytes,
    start: Instant,
    meta: &Meta,
    mut send: F,
) -> Result<Forwarded<T>, GatewayError>
where
    T: AnswerHead,
    F: FnMut(Arc<Worker>, Bytes, Option<DpRank>, Option<Arc<HeaderEdits>>) -> Fut,
    Fut: std::future::Future<Output = Result<T, SendError>>,
{
    let id = meta.id.as_str();
    let (gw2, body, key) = (gw.clone(), bytes.clone(), meta.routing_key.clone());
    let (debug, signal_headers, session) = (meta.route_debug, meta.signal_headers.clone(), meta.session.clone());
    let cache_bypass = meta.cache_bypass;
    let forced = meta.forced.clone();
    // The vectors embedding signals read, on the embedding pool's threads (none without such signals).
    let crate::pools::PreRouted { body: parsed, embeddings } = crate::pools::pre_route(gw, route, &bytes).await?;
    let step = crate::admission::render(gw, bytes.len(), move || {
        let mut v = parse_body(&gw2, route, &body, parsed)?;
        // With a routing config: the pool (the body names its model, the plugins may change it).
        let mut routed = match (gw2.routing(), v.as_mut()) {
            (Some(routing), Some(v)) if let Some((pool, decision)) = &forced => {
                Some(crate::pools::forced(&gw2, &routing, v, *pool, decision))
            }
            (Some(routing), Some(v)) => {
                let (headers, session, embeddings) = (&signal_headers, session.as_deref(), embeddings.as_ref());
                let ask = crate::pools::Asked { debug, headers, session, embeddings, cache_bypass };
                Some(crate::pools::route(&gw2, &routing, route, v, &ask, None)?)
            }
            _ => None,
        };
        // The decision's response cache holds the answer: nothing is planned or sent.
        if let Some(r) = routed.as_ref()
            && let Some(answer) = r.cache.as_ref().and_then(|(_, outcome)| outcome.answer())
        {
            let headers = crate::pools::RouteHeaders::of(r, &gw2.pools[r.pool]);
            return Ok(Step::Cached(crate::cache::Hit { answer: answer.clone(), headers }));
        }
        let (pool, rendered) = match routed.as_mut() {
            Some(r) => (r.pool, r.prompt.take()),
            None => (0, None),
        };
        let plan = plan(&gw2, pool, route, v.as_ref(), key.as_deref(), rendered, true)?;
        let bytes = match (&routed, &v) {
            (Some(r), Some(v)) if r.rewritten => Bytes::from(serde_json::to_vec(v).unwrap_or_default()),
            _ => body,
        };
        Ok::<_, GatewayError>(Step::Send(v, plan, routed, bytes))
    })
    .await??;
    let (mut v, plan, mut routed, bytes) = match step {
        Step::Cached(hit) => return Ok(Forwarded::Cached(hit)),
        Step::Send(v, plan, routed, bytes) => (v, plan, routed, bytes),
    };
    plan.commit(gw);
    let pool = &gw.pools[plan.pool];
    let chosen = plan.chosen();
    let matched = plan.candidates[plan.chosen].matched_tokens;
    let span = Span::current();
    span.record("worker", chosen.url.as_str());
    span.record("matched_tokens", matched);
    span.record("reason", plan.decision.reason.as_str());
    gw.metrics.decisions.inc(format_args!("policy=\"{}\",reason=\"{}\"", pool.policy.name(), plan.decision.reason));
    gw.metrics.matched_tokens.observe(matched as f64);
    // Tell a data-parallel engine which rank holds the prefix: SGLang's and
    // vLLM's OpenAI routes read the `X-Data-Parallel-Rank` header (rank 0 on a
    // single-rank engine is accepted by both); SGLang's native `/generate`
    // reads only the body field `routed_dp_rank`.
    let mut worker = chosen.clone();
    // No rank holds a prefix of it: with --dp-aware, the least loaded rank.
    let mut rank = plan.rank.or_else(|| worker.least_loaded_rank());
    // A rank the client put in the body is its own; the router's is set (and reset on a retry) only without one.
    let client_rank = v.as_ref().is_some_and(|v| v.get("routed_dp_rank").is_some());
    let mut body = if client_rank { bytes.clone() } else { with_rank(route, v.as_mut(), rank, &bytes) };
    let uncached = plan.input_tokens - matched;
    let load = worker.charge_on(uncached, rank);
    let route_headers = routed.as_ref().map(|r| crate::pools::RouteHeaders::of(r, pool));
    let cache = routed.as_mut().and_then(|r| r.cache.take()).map(|(ticket, _)| ticket);
    let cascade = routed.as_mut().and_then(|r| r.cascade.take()).map(|plan| Box::new((plan, bytes.clone())));
    let edits = routed.and_then(|r| r.edits);
    let mut guard = InFlight {
        gw: gw.clone(),
        _admission: admission,
        load,
        route_headers,
        route,
        status: 0,
        start,
        cache,
        cascade,
    };
    let retry = &gw.config.retry;
    // The workers tried before the current one (allocated only on a retry).
    let mut tried = Vec::new();
    let mut attempt = 1u32;
    loop {
        let may_retry = retry.enabled && attempt < retry.max_attempts();
        let attempt_sent = send(worker.clone(), body.clone(), rank, edits.clone());
        let next = match tokio::time::timeout(gw.config.request_timeout, attempt_sent).await {
            Ok(Ok(answer)) => {
                let status = answer.status();
                if status >= 500 {
                    worker.answer_failed();
                } else {
                    worker.request_succeeded();
                }
                // A retryable status goes back to the client unless another attempt is due and possible.
                let next = (may_retry && RetryConfig::retryable(status))
                    .then(|| next_worker(gw, pool, &worker, &tried))
                    .flatten();
                let Some(next) = next else {
                    gw.metrics.ttfb.observe(start.elapsed().as_secs_f64());
                    return Ok(Forwarded::Sent(guard, worker, answer));
                };
                // Nothing of this answer reached the client: it is dropped (its connection closed).
                drop(answer);
                warn!(request_id = id, worker = %worker.url, status, next = %next.url, attempt, "worker answered a retryable status, retrying");
                next
            }
            Ok(Err(e)) => {
                worker.request_failed();
                let failed =
                    GatewayError::Upstream { worker: worker.url.to_string(), message: e.message, retryable: e.connect };
                // Nothing reached the worker: again, on another worker when there is one.
                let next = (may_retry && failed.retryable_elsewhere())
                    .then(|| next_worker(gw, pool, &worker, &tried))
                    .flatten();
                let Some(next) = next else { return Err(failed) };
                warn!(request_id = id, worker = %worker.url, error = %failed, next = %next.url, attempt, "worker unreachable, retrying");
                next
            }
            Err(_) => {
                // A worker that answers its probes but not its requests must not stay in rotation.
                // Not retried: the worker may be working on it.
                worker.request_failed();
                return Err(GatewayError::Timeout(worker.url.to_string()));
            }
        };
        gw.metrics.retries.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(retry.backoff(attempt)).await;
        attempt += 1;
        // The policy learns where the request really went (the text tree, the turn taken).
        let moved = Decision { worker: next.id, reason: plan.decision.reason };
        pool.policy.commit(&moved, &plan.candidates, &plan.request());
        if !tried.contains(&worker.id) {
            tried.push(worker.id);
        }
        worker = next;
        // The rank hint was for the first worker; the next one places it itself (or, with
        // --dp-aware, its least loaded rank).
        rank = worker.least_loaded_rank();
        body = if client_rank { bytes.clone() } else { with_rank(route, v.as_mut(), rank, &bytes) };
        // The load moves: the first worker's charge is released as it is replaced.
        guard.load = worker.charge_on(uncached, rank);
    }
}

/// The body to send for `rank` on a request whose client set no rank: on
/// `/generate`, `routed_dp_rank` set in the parsed body (SGLang's native route
/// reads no header), or taken out again for a retry without one; else as it came.
fn with_rank(route: Route, v: Option<&mut Value>, rank: Option<DpRank>, bytes: &Bytes) -> Bytes {
    let Some(v) = v.filter(|_| route == Route::Generate) else { return bytes.clone() };
    let Some(fields) = v.as_object_mut() else { return bytes.clone() };
    match rank {
        Some(rank) => fields.insert("routed_dp_rank".into(), json!(rank.0)),
        None if fields.remove("routed_dp_rank").is_some() => None,
        None => return bytes.clone(),
    };
    Bytes::from(serde_json::to_vec(&*v).unwrap_or_default())
}

/// The worker of `pool` a retry after `current` goes to: the least loaded
/// routable one tried neither now nor before, else the least loaded routable
/// one (a retry may go back to a worker).
fn next_worker(
    gw: &Gateway,
    pool: &crate::pools::Pool,
    current: &Worker,
    tried: &[router_types::WorkerId],
) -> Option<Arc<Worker>> {
    let snapshot = gw.fleet.snapshot();
    let routable = || snapshot.iter().filter(|w| w.is_routable() && pool.serves(w));
    let by_load = |w: &&Arc<Worker>| (w.load().in_flight, w.load().uncached_tokens);
    routable()
        .filter(|w| w.id != current.id && !tried.contains(&w.id))
        .min_by_key(by_load)
        .or_else(|| routable().min_by_key(by_load))
        .cloned()
}

/// What `forward` needs of a worker's answer head.
pub(crate) trait AnswerHead {
    /// Its status code.
    fn status(&self) -> u16;
}

impl AnswerHead for axum::http::Response<hyper::body::Incoming> {
    fn status(&self) -> u16 {
        self.status().as_u16()
    }
}

/// An error and its causes, on one line ("client error (Connect): tcp connect error: Connection refused").
pub(crate) fn describe(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}
