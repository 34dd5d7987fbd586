//! The HTTP face of custom objects (`objects.rs` owns their state):
//! `GET /apis/{group}/{version}/namespaces/{ns}/{plural}` lists or watches
//! (`watch`, `resourceVersion`, `timeoutSeconds`, a `metadata.name` field
//! selector; no bookmarks, no pages), `GET .../{plural}/{name}` reads one, and
//! `PATCH .../{plural}/{name}/status` merge-patches its status
//! (`application/merge-patch+json` only: 415 otherwise).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::Shared;
use crate::objects::{Collection, Start, name_selector};
use crate::refusal::Refusal;

type Query_ = Result<Query<HashMap<String, String>>, QueryRejection>;

fn collection(group: String, version: String, namespace: String, plural: String) -> Collection {
    (format!("{group}/{version}"), plural, namespace)
}

fn json_response(code: StatusCode, body: &Value) -> Response {
    (code, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// `GET .../{plural}`: a list, or a watch with `watch=1`.
pub(crate) async fn list_or_watch(
    State(shared): State<Arc<Shared>>,
    Path((group, version, namespace, plural)): Path<(String, String, String, String)>,
    query: Query_,
) -> Result<Response, Refusal> {
    let Query(q) = query.map_err(|e| Refusal::BadRequest(e.body_text()))?;
    let name = name_selector(q.get("fieldSelector").map(String::as_str))?;
    let c = collection(group, version, namespace, plural);
    let watch = matches!(q.get("watch").map(String::as_str), Some("1" | "true" | "True" | "t"));
    if !watch {
        let (items, rv) = shared.objects.list(&c, name.as_deref());
        let body =
            json!({"kind": "List", "apiVersion": c.0, "metadata": {"resourceVersion": rv.to_string()}, "items": items});
        return Ok(json_response(StatusCode::OK, &body));
    }
    let start = match q.get("resourceVersion").map(String::as_str) {
        None | Some("" | "0") => Start::Now,
        Some(rv) => {
            let rv: u64 = rv.parse().map_err(|_| Refusal::BadRequest(format!("invalid resource version: {rv:?}")))?;
            let current = shared.objects.rv();
            if rv > current {
                return Err(Refusal::TooLarge { requested: rv, current });
            }
            Start::After(rv)
        }
    };
    let timeout = match q.get("timeoutSeconds").filter(|v| !v.is_empty()) {
        None => None,
        Some(v) => {
            let s: u64 = v.parse().map_err(|_| Refusal::BadRequest(format!("invalid timeoutSeconds: {v:?}")))?;
            (s > 0).then(|| Duration::from_secs(s))
        }
    };
    let body = shared.objects.watch(c, name, start, timeout);
    let headers = [(header::CONTENT_TYPE, "application/json"), (header::CACHE_CONTROL, "no-cache, private")];
    Ok((StatusCode::OK, headers, body).into_response())
}

/// `GET .../{plural}/{name}` (and its `/status`): the object.
pub(crate) async fn get_one(
    State(shared): State<Arc<Shared>>,
    Path((group, version, namespace, plural, name)): Path<(String, String, String, String, String)>,
) -> Result<Response, Refusal> {
    let c = collection(group, version, namespace, plural);
    let object = shared.objects.get(&c, &name).ok_or(Refusal::NotFound)?;
    Ok(json_response(StatusCode::OK, &object))
}

/// `PATCH .../{plural}/{name}/status`: a JSON merge patch of the status.
pub(crate) async fn patch_status(
    State(shared): State<Arc<Shared>>,
    Path((group, version, namespace, plural, name)): Path<(String, String, String, String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, Refusal> {
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    if content_type.split(';').next().map(str::trim) != Some("application/merge-patch+json") {
        return Err(Refusal::UnsupportedMediaType(content_type.to_owned()));
    }
    let patch: Value =
        serde_json::from_slice(&body).map_err(|e| Refusal::BadRequest(format!("the patch is not JSON: {e}")))?;
    let c = collection(group, version, namespace, plural);
    let object = shared.objects.patch_status(c, &name, &patch).ok_or(Refusal::NotFound)?;
    Ok(json_response(StatusCode::OK, &object))
}
