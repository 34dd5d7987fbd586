//! The fleet's control routes: `/workers` (list, add, remove), `/index/snapshot`
//! (for a peer replica catching up), `/flush_cache` (every worker's at once)
//! and `/get_loads` (what the fleet knows of each worker's load).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use fleet::{Events, Worker};
use futures_util::future::join_all;
use gateway::{Gateway, GatewayError};
use router_types::WorkerUrl;
use serde::Deserialize;
use serde_json::{Value, json};

/// Longest a worker may take on `/flush_cache`.
const WORKER_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// `POST /workers`' body.
#[derive(Debug, Deserialize)]
struct AddWorker {
    url: String,
    /// The pool it serves, by name or served model (SMG's `model_id`); the default pool without.
    #[serde(default, alias = "model_id")]
    pool: Option<String>,
}

/// `POST /flush_cache`: every worker's `/flush_cache` at once. 200 when all
/// flushed, 206 with the failures otherwise (SGLang Model Gateway's answer).
pub(crate) async fn flush_cache(State(gw): State<Arc<Gateway>>) -> Response {
    let workers = gw.fleet.snapshot();
    let calls = workers.iter().map(|w| {
        let client = gw.fleet.client().clone();
        async move {
            let sent = client.post(w.endpoint_url("/flush_cache")).timeout(WORKER_CALL_TIMEOUT).send().await;
            let outcome = match sent {
                Ok(r) if r.status().is_success() => Ok(()),
                Ok(r) => Err(format!("HTTP {}", r.status())),
                Err(e) => Err(e.to_string()),
            };
            (w.url.to_string(), outcome)
        }
    });
    let results = join_all(calls).await;
    let total = results.len();
    let (ok, failed): (Vec<_>, Vec<_>) = results.into_iter().partition(|(_, r)| r.is_ok());
    let successful: Vec<&String> = ok.iter().map(|(u, _)| u).collect();
    if failed.is_empty() {
        let body = json!({
            "status": "success",
            "message": format!("Cache flushed on all {total} workers"),
            "workers_flushed": total,
            "total_http_workers": total,
            "total_workers": total,
        });
        return (StatusCode::OK, Json(body)).into_response();
    }
    let failures: Vec<Value> = failed
        .iter()
        .map(|(u, r)| json!({"worker": u, "error": r.as_ref().err().cloned().unwrap_or_default()}))
        .collect();
    tracing::warn!(failed = failures.len(), total, "flush_cache failed on some workers");
    let body = json!({
        "status": "partial_success",
        "message": format!("Cache flushed on {} of {total} workers", successful.len()),
        "workers_flushed": successful.len(),
        "total_http_workers": total,
        "total_workers": total,
        "successful": successful,
        "failed": failures,
    });
    (StatusCode::PARTIAL_CONTENT, Json(body)).into_response()
}

/// `GET /get_loads`: each worker's load as the fleet knows it, in SGLang
/// Model Gateway's shape (`load`: the prefill tokens the worker reports
/// queued, -1 when it reports none) with this router's own view beside it.
pub(crate) async fn get_loads(State(gw): State<Arc<Gateway>>) -> Json<Value> {
    let workers: Vec<Value> = gw
        .fleet
        .snapshot()
        .iter()
        .map(|w| {
            let load = w.load();
            let reported = if w.reports_load() { w.reported_uncached_tokens() as i64 } else { -1 };
            json!({
                "worker": w.url,
                "load": reported,
                "in_flight": load.in_flight,
                "uncached_tokens": w.own_uncached_tokens(),
                "healthy": w.is_routable(),
            })
        })
        .collect();
    Json(json!({"workers": workers}))
}

pub(crate) async fn list(State(gw): State<Arc<Gateway>>) -> Json<Value> {
    let list: Vec<Value> = gw
        .fleet
        .all()
        .iter()
        .map(|w| {
            let mut v = describe(w, gw.fleet.liveness());
            v["kv_streams_connected"] = json!(gw.fleet.connected_streams(w));
            let history: Vec<Value> = gw
                .fleet
                .stream_history(w)
                .into_iter()
                .map(|(rank, h)| match h {
                    fleet::StreamHistory::Missed { batches } => json!({"dp_rank": rank.0, "missed_batches": batches}),
                    fleet::StreamHistory::Resumed { after } => json!({"dp_rank": rank.0, "resumed_after_seq": after}),
                    fleet::StreamHistory::SnapshotReset => json!({"dp_rank": rank.0, "snapshot_reset": true}),
                })
                .collect();
            if !history.is_empty() {
                v["kv_history"] = json!(history);
            }
            v
        })
        .collect();
    Json(json!({"workers": list}))
}

/// `GET /index/snapshot`: a consistent snapshot of the KV index for a peer
/// replica starting late (`--index-peers`), in the binary form of
/// `kv_ingest::snapshot`, within `--index-snapshot-max-blocks` and
/// `--index-snapshot-timeout-secs`. 503 when the router follows no events
/// or the pump does not answer in time.
pub(crate) async fn index_snapshot(State(gw): State<Arc<Gateway>>) -> Result<Response, GatewayError> {
    let limits = gw.config.index_snapshot;
    let started = std::time::Instant::now();
    let Some(taken) = gw.fleet.snapshot_index(limits.max_blocks, limits.timeout).await else {
        gw.fleet.metrics.snapshots_refused.fetch_add(1, Ordering::Relaxed);
        return Err(GatewayError::Unavailable(
            "no index snapshot: this router follows no KV events, or its pump did not answer in time".into(),
        ));
    };
    let (streams, blocks) = (taken.snapshot.streams.len(), taken.snapshot.blocks());
    let body = tokio::task::spawn_blocking(move || taken.snapshot.encode())
        .await
        .map_err(|e| GatewayError::Internal(format!("snapshot encoding: {e}")))?;
    gw.fleet.metrics.snapshots_served.fetch_add(1, Ordering::Relaxed);
    tracing::info!(streams, blocks, left_out = taken.left_out, bytes = body.len(), took = ?started.elapsed(), "kv index: snapshot served");
    let mut r = Response::new(Body::from(body));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    h.insert("x-index-streams", HeaderValue::from(streams));
    h.insert("x-index-blocks", HeaderValue::from(blocks));
    h.insert("x-index-streams-left-out", HeaderValue::from(taken.left_out));
    Ok(r)
}

/// A worker as `/workers` shows it.
fn describe(w: &Worker, liveness: &fleet::liveness::LivenessConfig) -> Value {
    let load = w.load();
    let info = w.info().unwrap_or_default();
    let (events, streams, reason) = match w.events() {
        Events::Off => ("off", None, None),
        Events::Discovering => ("discovering", None, None),
        Events::Followed { streams } => ("followed", Some(streams), None),
        Events::NotFollowed(reason) => ("not_followed", None, Some(reason)),
        Events::Refused(reason) => ("refused", None, Some(reason)),
    };
    json!({
        "id": w.id,
        "url": w.url,
        "role": w.role.as_str(),
        "pool": w.pool,
        "state": w.state().as_str(),
        "healthy": w.is_routable(),
        "circuit": w.breaker_state().as_str(),
        "circuit_opened": w.breaker_opened(),
        "down_for_s": w.down_for().map(|d| d.as_secs()),
        "in_flight": load.in_flight,
        "uncached_tokens": w.own_uncached_tokens(),
        "reported_uncached_tokens": w.reported_uncached_tokens(),
        // The other replicas' share of `in_flight` (`--shared-state`), and the prefill they owe.
        "remote_in_flight": w.remote_load().in_flight,
        "remote_uncached_tokens": w.remote_load().uncached_tokens,
        "model_id": info.model_id,
        "dp_size": info.dp_size,
        "page_size": info.page_size,
        "kv_events": events,
        "kv_streams": streams,
        "kv_events_reason": reason,
        "veto": w.veto(liveness).map(fleet::liveness::Veto::as_str),
        "warmup": w.warmup().as_str(),
        "silent_ms": w.liveness.silent_for().map(|d| d.as_millis() as u64),
        "load_reported": w.liveness.polled(),
        "reported_waiting_requests": w.liveness.waiting(),
        "reported_token_usage": w.liveness.token_usage(),
        // Whether it answered HTTP/2 (`--upstream-http2`); null: not asked.
        "upstream_http2": w.upstream_http2(),
    })
}

/// How long `POST /workers` waits for a new worker's publishers to be found
/// before answering 202 (still discovering; followed when it comes up).
const ADD_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

pub(crate) async fn add(State(gw): State<Arc<Gateway>>, body: Body) -> Result<Response, GatewayError> {
    let bytes = gateway::read_body(&gw, body).await?;
    let req: AddWorker = serde_json::from_slice(&bytes)
        .map_err(|e| GatewayError::BadRequest(format!("expected {{\"url\": ...}}: {e}")))?;
    let url = gateway::check_worker_url(&req.url).map_err(GatewayError::BadRequest)?;
    let pool = match req.pool.as_deref() {
        None => gw.default_pool().id.clone(),
        Some(name) => {
            let found = gw.pools.iter().find(|p| p.id.0 == name || p.served_model == name);
            found.ok_or_else(|| GatewayError::BadRequest(format!("no pool is named or serves `{name}`")))?.id.clone()
        }
    };
    let added = gw.fleet.add_in(url.clone(), router_types::Role::Regular, pool.clone(), fleet::Source::Admin);
    if !added.new {
        let (id, serves) = (added.worker.id, &added.worker.pool);
        if req.pool.is_some() && *serves != pool {
            // A URL is one worker, in one pool.
            let message = format!("worker {url} is already in the fleet, serving pool {serves}; remove it first");
            let body = json!({"error": {"message": message, "type": "conflict", "code": 409}, "pool": serves});
            return Ok((StatusCode::CONFLICT, Json(body)).into_response());
        }
        return Ok(
            (StatusCode::OK, Json(json!({"url": url, "id": id, "added": false, "pool": serves}))).into_response()
        );
    }
    // Follow its KV events first: routing to it before would be blind.
    let status = match gw.fleet.wait_discovered(&added.worker, ADD_WAIT).await {
        Events::Refused(reason) => {
            gw.fleet.remove(&url).await;
            return Err(GatewayError::Unprocessable(format!("worker {url} refused: {reason}")));
        }
        Events::Discovering => StatusCode::ACCEPTED,
        _ => StatusCode::CREATED,
    };
    let body = json!({"url": url, "id": added.worker.id, "added": true, "worker": describe(&added.worker, gw.fleet.liveness())});
    Ok((status, Json(body)).into_response())
}

pub(crate) async fn remove(
    State(gw): State<Arc<Gateway>>,
    Path(url): Path<String>,
) -> Result<Json<Value>, GatewayError> {
    // The URL as listed by `/workers` (or any spelling of it).
    let url = WorkerUrl::parse(&url).unwrap_or_else(|_| WorkerUrl::new(url.as_str()));
    let Some(w) = gw.fleet.remove(&url).await else {
        return Err(GatewayError::NotFound(format!("worker {url}")));
    };
    Ok(Json(json!({"removed": url, "id": w.id, "in_flight": w.load().in_flight})))
}
