//! The HTTP face of the mock API server: the two pod collection routes (the
//! custom objects' routes are `custom.rs`'s),
//! their query parameters, list pages and `continue` tokens, bearer
//! authentication and the request log. Every refusal is a [`Refusal`]
//! (`refusal.rs`, which maps it to an HTTP status and a `Status` body).
//! Streaming a watch is `watch.rs`'s; state is `store.rs`'s.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use serde_json::{Value, json};
use tracing::debug;

use crate::Shared;
use crate::base64;
use crate::custom;
use crate::refusal::Refusal;
use crate::selector::Selector;
use crate::store::{Key, Scope, Start, VersionError};
use crate::watch::{self, WatchSpec};

/// Requests remembered for [`crate::MockApiServer::requests`].
const REQUEST_LOG: usize = 1000;

/// The `v` of a continue token, as the real server writes it.
const CONTINUE_VERSION: &str = "meta.k8s.io/v1";

/// The query parameters of a pod collection request.
#[derive(Debug, Default)]
struct Params {
    selector: Selector,
    watch: bool,
    resource_version: Option<String>,
    exact: bool,
    bookmarks: bool,
    timeout: Option<Duration>,
    limit: Option<usize>,
    continue_token: Option<String>,
    send_initial_events: bool,
}

/// Where a continued list resumes.
#[derive(Debug, PartialEq, Eq)]
struct Continue {
    rv: u64,
    after: Key,
}

/// The routes, behind the request log and authentication.
pub(crate) fn router(shared: Arc<Shared>) -> axum::Router {
    axum::Router::new()
        .route("/api/v1/pods", get(all_pods).fallback(method_not_allowed))
        .route("/api/v1/namespaces/{namespace}/pods", get(namespaced_pods).fallback(method_not_allowed))
        .route(
            "/apis/{group}/{version}/namespaces/{namespace}/{plural}",
            get(custom::list_or_watch).fallback(method_not_allowed),
        )
        .route(
            "/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}",
            get(custom::get_one).fallback(method_not_allowed),
        )
        .route(
            "/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}/status",
            get(custom::get_one).patch(custom::patch_status).fallback(method_not_allowed),
        )
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(shared.clone(), record_and_authenticate))
        .with_state(shared)
}

/// Logs the request, then lets it in if it carries the token (when one is required).
async fn record_and_authenticate(State(shared): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    let target = req.uri().path_and_query().map_or_else(|| req.uri().path().to_owned(), |pq| pq.as_str().to_owned());
    debug!(method = %req.method(), target, "request");
    {
        let mut log = shared.requests.lock().unwrap_or_else(|p| p.into_inner());
        if log.len() == REQUEST_LOG {
            log.pop_front();
        }
        log.push_back(format!("{} {target}", req.method()));
    }
    if let Some(token) = &shared.token {
        let given = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        let bearer = given.and_then(|v| v.split_once(' ')).filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"));
        if bearer.is_none_or(|(_, t)| t.trim() != token) {
            return Refusal::Unauthorized.into_response();
        }
    }
    next.run(req).await
}

async fn all_pods(
    State(shared): State<Arc<Shared>>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Response {
    pods(&shared, Scope::All, query).unwrap_or_else(IntoResponse::into_response)
}

async fn namespaced_pods(
    State(shared): State<Arc<Shared>>,
    Path(namespace): Path<String>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Response {
    pods(&shared, Scope::Namespace(namespace), query).unwrap_or_else(IntoResponse::into_response)
}

async fn not_found() -> Refusal {
    Refusal::NotFound
}

async fn method_not_allowed() -> Refusal {
    Refusal::MethodNotAllowed
}

fn pods(
    shared: &Shared,
    scope: Scope,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Result<Response, Refusal> {
    let Query(query) = query.map_err(|e| Refusal::BadRequest(e.body_text()))?;
    let params = Params::parse(&query).map_err(Refusal::BadRequest)?;
    if params.watch { watch(shared, scope, params) } else { list(shared, scope, params) }
}

fn watch(shared: &Shared, scope: Scope, params: Params) -> Result<Response, Refusal> {
    if params.continue_token.is_some() {
        return Err(Refusal::BadRequest("continue is not supported for watch".into()));
    }
    let start = match params.resource_version.as_deref() {
        // A streaming list starts with the current state whatever the version.
        _ if params.send_initial_events => Start::Now,
        None | Some("" | "0") => Start::Now,
        Some(rv) => Start::After(parse_rv(rv)?),
    };
    let sub = match shared.store.subscribe(start) {
        Ok(sub) => sub,
        // Inside a 200 stream, as the real server reports it (not a 410 answer).
        Err(VersionError::TooOld { requested, oldest }) => {
            let once = futures_util::stream::once(async move {
                Ok::<Bytes, std::io::Error>(watch::expired_event(requested, oldest))
            });
            return Ok(watch_response(Body::from_stream(once)));
        }
        Err(e) => return Err(Refusal::version(e, false)),
    };
    let interval = shared.bookmark_interval;
    let spec = WatchSpec {
        scope,
        selector: params.selector,
        bookmarks: (params.bookmarks && !interval.is_zero()).then_some(interval),
        timeout: params.timeout,
        initial_events_end: params.send_initial_events,
    };
    Ok(watch_response(watch::body(spec, sub)))
}

fn watch_response(body: Body) -> Response {
    let headers = [(header::CONTENT_TYPE, "application/json"), (header::CACHE_CONTROL, "no-cache, private")];
    (StatusCode::OK, headers, body).into_response()
}

fn list(shared: &Shared, scope: Scope, params: Params) -> Result<Response, Refusal> {
    shared.lists.fetch_add(1, Ordering::SeqCst);
    let requested = params.resource_version.as_deref().filter(|rv| !rv.is_empty());
    let resume = match &params.continue_token {
        Some(_) if requested.is_some() => {
            let why = "specifying resource version is not allowed when using continue";
            return Err(Refusal::BadRequest(why.into()));
        }
        Some(token) => Some(decode_continue(token)?),
        None => None,
    };
    let at = match (&resume, requested) {
        (Some(c), _) => Some(c.rv),
        (None, Some(rv)) if params.exact => Some(parse_rv(rv)?),
        (None, Some("0")) | (None, None) => None,
        // Not older than `rv`: the current state serves, unless `rv` is yet to come.
        (None, Some(rv)) => {
            let (requested, current) = (parse_rv(rv)?, shared.store.rv());
            if requested > current {
                return Err(Refusal::TooLarge { requested, current });
            }
            None
        }
    };
    let after = resume.as_ref().map(|c| &c.after);
    let page = shared
        .store
        .list(&scope, &params.selector, at, after, params.limit)
        .map_err(|e| Refusal::version(e, resume.is_some()))?;
    let mut metadata = json!({"resourceVersion": page.rv.to_string()});
    if let Some(last) = &page.next {
        metadata["continue"] = json!(encode_continue(page.rv, last));
        if params.selector.is_empty() {
            metadata["remainingItemCount"] = json!(page.remaining);
        }
    }
    let items: Vec<Value> = page.items.iter().map(|p| p.to_json(false)).collect();
    let body = json!({"kind": "PodList", "apiVersion": "v1", "metadata": metadata, "items": items});
    Ok(([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response())
}

fn parse_rv(rv: &str) -> Result<u64, Refusal> {
    rv.parse().map_err(|_| Refusal::BadRequest(format!("invalid resource version: {rv:?}")))
}

// === impl Params ===

impl Params {
    fn parse(query: &HashMap<String, String>) -> Result<Self, String> {
        let get = |name: &str| query.get(name).map(String::as_str);
        let flag = |name: &str| get(name).map_or(Ok(false), |v| parse_bool(name, v));
        let selector = Selector::parse(get("labelSelector").unwrap_or("")).map_err(|e| e.to_string())?;
        let number = |name: &str| {
            get(name)
                .filter(|v| !v.is_empty())
                .map(|v| v.parse::<i64>().map_err(|_| format!("invalid {name}: {v:?} is not an integer")))
                .transpose()
        };
        let rv_match = get("resourceVersionMatch").unwrap_or("");
        if !matches!(rv_match, "" | "NotOlderThan" | "Exact") {
            return Err(format!("resourceVersionMatch: Unsupported value: {rv_match:?}"));
        }
        let resource_version = get("resourceVersion").map(str::to_owned);
        let (watch, bookmarks, send_initial_events) =
            (flag("watch")?, flag("allowWatchBookmarks")?, flag("sendInitialEvents")?);
        if send_initial_events {
            // The streaming-list contract (KEP-3157), as the real server validates it.
            if !watch || !bookmarks || rv_match != "NotOlderThan" {
                return Err("sendInitialEvents requires watch=true, allowWatchBookmarks=true and \
                            resourceVersionMatch=NotOlderThan"
                    .into());
            }
        } else if !rv_match.is_empty() && resource_version.as_deref().is_none_or(str::is_empty) {
            return Err("resourceVersionMatch is forbidden unless resourceVersion is provided".into());
        }
        if rv_match == "Exact" && resource_version.as_deref() == Some("0") {
            return Err("resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"".into());
        }
        Ok(Self {
            selector,
            watch,
            resource_version,
            exact: rv_match == "Exact",
            bookmarks,
            timeout: number("timeoutSeconds")?.filter(|&s| s > 0).map(|s| Duration::from_secs(s.unsigned_abs())),
            limit: number("limit")?.filter(|&n| n > 0).map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
            continue_token: get("continue").filter(|c| !c.is_empty()).map(str::to_owned),
            send_initial_events,
        })
    }
}

/// Go's `strconv.ParseBool`, which the real server's query decoding uses.
fn parse_bool(name: &str, v: &str) -> Result<bool, String> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "" | "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(format!("invalid {name}: {v:?} is not a boolean")),
    }
}

/// The real server's token: base64url of `{"v", "rv", "start"}` where
/// `start` is the last key returned followed by a NUL (the next key to read).
fn encode_continue(rv: u64, last: &Key) -> String {
    let start = format!("{}/{}\u{0}", last.0, last.1);
    base64::encode_url(json!({"v": CONTINUE_VERSION, "rv": rv, "start": start}).to_string().as_bytes())
}

fn decode_continue(token: &str) -> Result<Continue, Refusal> {
    let invalid = |why: &str| Refusal::BadRequest(format!("continue key is not valid: {why}"));
    let bytes = base64::decode_url(token).ok_or_else(|| invalid("not base64"))?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|_| invalid("not JSON"))?;
    if v["v"] != CONTINUE_VERSION {
        return Err(invalid("incorrect encoded start resourceVersion (version meta.k8s.io/v1)"));
    }
    let rv = v["rv"].as_u64().filter(|&rv| rv > 0).ok_or_else(|| invalid("bad resourceVersion"))?;
    let start = v["start"].as_str().and_then(|s| s.strip_suffix('\u{0}')).ok_or_else(|| invalid("bad start"))?;
    let (namespace, name) = start.split_once('/').ok_or_else(|| invalid("bad start"))?;
    Ok(Continue { rv, after: (namespace.to_owned(), name.to_owned()) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip_and_bad_ones_are_refused() {
        let key = ("ns".to_string(), "pod-1".to_string());
        let token = encode_continue(42, &key);
        assert!(token.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        assert_eq!(decode_continue(&token).unwrap(), Continue { rv: 42, after: key });
        for bad in ["", "!!", "bm90IGpzb24", &base64::encode_url(br#"{"v":"x","rv":1,"start":"a/b\u0000"}"#)] {
            assert!(matches!(decode_continue(bad), Err(Refusal::BadRequest(_))), "{bad}");
        }
    }

    #[test]
    fn parameters() {
        let q = |pairs: &[(&str, &str)]| {
            Params::parse(&pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
        };
        let p = q(&[("watch", "1"), ("allowWatchBookmarks", "true"), ("timeoutSeconds", "5"), ("limit", "0")]).unwrap();
        assert!(p.watch && p.bookmarks);
        assert_eq!((p.timeout, p.limit), (Some(Duration::from_secs(5)), None));
        assert!(q(&[("fieldSelector", "status.phase=Running")]).is_ok(), "field selectors are ignored");
        assert!(q(&[("watch", "yes")]).is_err());
        assert!(q(&[("limit", "x")]).is_err());
        assert!(q(&[("labelSelector", "a in (")]).is_err());
        assert!(q(&[("resourceVersionMatch", "Exact")]).is_err());
        assert!(q(&[("resourceVersionMatch", "Exact"), ("resourceVersion", "0")]).is_err());
        assert!(q(&[("resourceVersionMatch", "Exact"), ("resourceVersion", "3")]).unwrap().exact);
        let stream = [("watch", "1"), ("sendInitialEvents", "true"), ("allowWatchBookmarks", "true")];
        assert!(q(&[stream[0], stream[1], stream[2], ("resourceVersionMatch", "NotOlderThan")]).is_ok());
        assert!(q(&stream).is_err());
        assert!(q(&[stream[0], stream[1], ("resourceVersionMatch", "NotOlderThan")]).is_err());
    }
}
