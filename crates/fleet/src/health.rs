//! The fleet's probes: every worker's `/health` (concurrently; a worker out
//! of rotation is probed every second, so one that starts after the router,
//! or restarts, is back within a second; or, with `remove_unhealthy`, a
//! worker taken out of rotation by its probes leaves the fleet), what each worker serves (asked
//! once: `/server_info`, else `/v1/models`), the index state of a worker
//! down past the retention period (dropped; kept until then, since a worker
//! that comes back keeps its cache), the retained workers whose requests are
//! done (removed), and each worker's own report of its queued prefill.

use crate::ticks::Ticks;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use serde_json::Value;
use tracing::{debug, info, warn};

use router_types::Role;

use crate::{Fleet, State, Worker, WorkerInfo};

/// How often a worker out of rotation is probed.
const DOWN_PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// Largest answer read from a worker's `/server_info`, `/v1/models`, `/v1/loads`
/// (or, by the gateway, `/get_model_info`).
pub const MAX_ANSWER_BYTES: usize = 1 << 20;

/// The body of a worker's answer, `None` past [`MAX_ANSWER_BYTES`] or when it
/// breaks off (a broken or hostile worker cannot make the router buffer an
/// endless answer).
pub async fn read_capped(mut response: reqwest::Response) -> Option<Vec<u8>> {
    if response.content_length().is_some_and(|n| n > MAX_ANSWER_BYTES as u64) {
        return None;
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.ok()? {
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return None;
        }
        body.extend_from_slice(&chunk);
    }
    Some(body)
}

/// Probes every worker each health interval, and the workers out of
/// rotation every second (at most every interval), until the fleet stops.
/// With the probes off (`--disable-health-check`), only brings back every
/// second the workers whose quarantine after failed requests is over.
pub(crate) async fn health_loop(fleet: Arc<Fleet>) {
    let interval = fleet.config.health.interval;
    let fast = interval.min(DOWN_PROBE_INTERVAL);
    let mut ticks = Ticks::new(fast, fleet.cancel.clone());
    let timeout = fleet.config.health.timeout.max(Duration::from_millis(100));
    let mut models_seen = Vec::new();
    let mut last_full: Option<Instant> = None;
    while ticks.next().await {
        let all = fleet.snapshot();
        if !fleet.config.health.enabled {
            for w in all.iter().filter(|w| !w.is_routable() && !w.quarantined()) {
                w.set_probe_result(true);
            }
            introspect_all(&fleet, &all, timeout).await;
            fleet.sweep_retained();
            continue;
        }
        // A worker that never came up within --worker-startup-timeout-secs failed to register.
        let startup = fleet.config.health.startup;
        for w in all.iter().filter(|w| w.state() != State::Retained) {
            if w.starting().is_some_and(|age| age >= startup.timeout) {
                warn!(worker = %w.url, timeout_s = startup.timeout.as_secs(), "worker never healthy within --worker-startup-timeout-secs: removed");
                fleet.remove(&w.url).await;
            }
        }
        let full = last_full.is_none_or(|t| t.elapsed() + fast / 2 >= interval);
        if full {
            last_full = Some(Instant::now());
            // Not a worker still in its --worker-startup-delay (its first probe waits).
            let waiting = |w: &Worker| w.starting().is_some_and(|age| age < startup.delay);
            join_all(all.iter().filter(|w| !waiting(w)).map(|w| check(&fleet, w, timeout))).await;
            warn_mixed_models(&all, &mut models_seen);
        } else {
            // Still starting: probed every --worker-startup-check-interval (at most every tick).
            // (not before --worker-startup-delay: its first probe waits that long).
            let due = |w: &Worker| match w.starting() {
                None => true,
                Some(age) => {
                    age >= startup.delay && w.since_probe().is_none_or(|d| d + fast / 2 >= startup.check_interval)
                }
            };
            let down = all.iter().filter(|w| !w.is_routable() && w.state() != State::Retained && due(w));
            join_all(down.map(|w| check(&fleet, w, timeout.min(fast.max(Duration::from_millis(500)))))).await;
        }
        fleet.sweep_retained();
    }
    info!("health checks stopped");
}

/// A new worker's first probe, at once (not at the next tick).
pub(crate) async fn first_probe(fleet: Arc<Fleet>, w: Arc<Worker>) {
    if !fleet.config.health.enabled {
        // Without probes a disaggregated worker is still checked against its role first.
        if w.role.is_pd() {
            let timeout = fleet.config.health.timeout.max(Duration::from_millis(100));
            introspect_checked(&fleet, &w, timeout).await;
        }
        w.set_probe_result(true);
        return;
    }
    let timeout = fleet.config.health.timeout.max(Duration::from_millis(100));
    let delay = fleet.config.health.startup.delay;
    tokio::select! {
        biased;
        () = w.cancel.cancelled() => {}
        () = async {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            check(&fleet, &w, timeout).await
        } => {}
    }
}

async fn check(fleet: &Arc<Fleet>, w: &Arc<Worker>, timeout: Duration) {
    w.probed_now();
    // A gRPC worker's `HealthCheck`; an HTTP worker's health endpoint.
    let probe = match w.engine() {
        Some(engine) => crate::grpc::health(engine, timeout).await,
        None => match get(fleet, w, &fleet.config.health.endpoint, timeout).await {
            Ok(r) => Ok(r.status().is_success()),
            Err(e) => Err(e.to_string()),
        },
    };
    // Any answer is contact; no answer after a silence stalls it (`--worker-stall-secs`).
    match &probe {
        Ok(_) => w.liveness.contact(),
        Err(_) => w.liveness.transport_failed(fleet.config.liveness.stall),
    }
    let ok = probe == Ok(true);
    if ok {
        // Asked before it enters rotation: a disaggregated worker's role and bootstrap port
        // are known before its first request.
        if w.info().is_none() {
            introspect_checked(fleet, w, timeout).await;
        }
        // A disaggregated worker enters rotation only once its report was checked against its role.
        let was_down = w.down_for().is_some();
        w.set_probe_result(!w.role.is_pd() || w.info().is_some());
        // Back after being down: its engine may have restarted with its publishers elsewhere.
        // Or up all along while its publishers went quiet: they may have moved without it failing a probe.
        if (was_down && w.down_for().is_none()) || crate::follow::stale(fleet, w) {
            let (fleet, w) = (fleet.clone(), w.clone());
            w.tasks.clone().spawn(crate::follow::refollow(fleet, w));
        }
        return;
    }
    let went_down = w.set_probe_result(false);
    if went_down && fleet.config.health.remove_unhealthy {
        warn!(worker = %w.url, failed_probes = fleet.config.health.failure_threshold, "worker unhealthy: removed (--remove-unhealthy-workers)");
        fleet.remove(&w.url).await;
        return;
    }
    let retention = fleet.config.index_retention;
    if let Some(ev) = &fleet.events
        && w.down_for().is_some_and(|d| d >= retention)
        && w.mark_index_cleared()
    {
        let ended = ev.index.clear_worker(&w.url);
        warn!(worker = %w.url, holdings = ended, retention_s = retention.as_secs(), "worker down past retention: its index state dropped");
    }
}

/// A GET of `path` on `w` with the probes' client: over HTTP/2 to a worker that answers it
/// (`HealthConfig::http2`). One never asked is asked over HTTP/2 first and, on no answer,
/// over HTTP/1.1; what it showed is remembered for its probes, polls and requests alike (the
/// relay asks the same way at a first request).
async fn get(fleet: &Fleet, w: &Worker, path: &str, timeout: Duration) -> reqwest::Result<reqwest::Response> {
    let url = w.endpoint_url(path);
    let (Some(h2), None) = (fleet.h2_client.as_ref(), w.upstream_http2()) else {
        return fleet.client_for(w).get(url).timeout(timeout).send().await;
    };
    match h2.get(url.clone()).timeout(timeout).send().await {
        Ok(answer) => {
            w.set_upstream_http2(true);
            info!(worker = %w.url, "the worker speaks HTTP/2: its probes, polls and requests go over it");
            Ok(answer)
        }
        Err(_) => {
            let answer = fleet.client.get(url).timeout(timeout).send().await;
            if answer.is_ok() {
                w.set_upstream_http2(false);
                warn!(worker = %w.url, "the worker does not answer HTTP/2 (--upstream-http2): it stays on HTTP/1.1");
            }
            answer
        }
    }
}

/// What every worker serves, asked of those not yet introspected (with the
/// probes off, nothing else asks).
async fn introspect_all(fleet: &Fleet, all: &[Arc<Worker>], timeout: Duration) {
    let pending = all.iter().filter(|w| w.info().is_none() && w.is_routable());
    join_all(pending.map(|w| introspect_checked(fleet, w, timeout))).await;
}

/// Asks a worker what it serves, records it, and refuses the worker when its
/// report contradicts its role.
async fn introspect_checked(fleet: &Fleet, w: &Worker, timeout: Duration) {
    let Some(found) = introspect(fleet.client_for(w), w, timeout).await else { return };
    info!(worker = %w.url, model = ?found.model_id, dp_size = ?found.dp_size, page_size = ?found.page_size, mode = ?found.disaggregation_mode, "worker introspected");
    if let Some(why) = contradiction(w.role, found.disaggregation_mode.as_deref()) {
        w.refuse(&why);
    }
    w.set_info(found);
}

/// Polls every healthy worker's SGLang `/v1/loads` each load-poll period
/// until the fleet stops, recording the uncached prompt tokens it has queued
/// (over all its data-parallel ranks): the load other routers put on it,
/// which this router cannot see. A worker without the endpoint (404: vLLM,
/// older SGLang) is not asked again; a failed poll forgets the last report.
pub(crate) async fn load_loop(fleet: Arc<Fleet>) {
    let every = fleet.config.load_poll;
    let mut ticks = Ticks::new(every, fleet.cancel.clone());
    let timeout = every.max(Duration::from_millis(250));
    while ticks.next().await {
        let all = fleet.snapshot();
        let due = all.iter().filter(|w| w.is_routable() && w.reports_load());
        join_all(due.map(|w| poll_load(w, fleet.client_for(w), timeout, fleet.config.liveness.stall))).await;
        // Requests waiting for a queue under the cap look again (least_load's waiting cap).
        fleet.load_polled.notify_waiters();
    }
}

async fn poll_load(w: &Worker, client: &reqwest::Client, timeout: Duration, stall: Duration) {
    if let Some(engine) = w.engine() {
        match crate::grpc::loads(engine, timeout).await {
            Ok(ranks) => {
                w.liveness.contact();
                loaded(w, ranks);
            }
            Err(e) => lost(w, &e, stall),
        }
        return;
    }
    let resp = match client.get(w.endpoint_url("/v1/loads?include=core")).timeout(timeout).send().await {
        Ok(r) => r,
        Err(e) => return lost(w, &e.to_string(), stall),
    };
    w.liveness.contact();
    if matches!(resp.status().as_u16(), 404 | 405) {
        info!(worker = %w.url, "worker has no /v1/loads: routing on this router's own view of its load");
        w.set_no_load_reports();
        return;
    }
    // SGLang: {"loads": [{"dp_rank": 0, "num_waiting_uncached_tokens": N, ...}, ...]}
    let body = read_capped(resp).await;
    let value = body.as_deref().and_then(|b| serde_json::from_slice::<Value>(b).ok());
    let ranks = value.as_ref().map(crate::liveness::RankReport::parse).unwrap_or_default();
    loaded(w, ranks);
}

/// A load poll failed: nothing reported is believed any more.
fn lost(w: &Worker, error: &str, stall: Duration) {
    debug!(worker = %w.url, error, "load poll failed");
    w.set_reported_uncached_tokens(0);
    w.set_reported_requests(0);
    w.liveness.report_lost();
    w.liveness.transport_failed(stall);
}

/// What a load poll found on each rank, recorded.
fn loaded(w: &Worker, ranks: Vec<crate::liveness::RankReport>) {
    let sum = |f: fn(&crate::liveness::RankReport) -> u64| ranks.iter().map(f).fold(0u64, u64::saturating_add);
    w.set_reported_requests(u32::try_from(sum(|r| r.running.saturating_add(r.waiting))).unwrap_or(u32::MAX));
    w.set_reported_uncached_tokens(sum(|r| r.uncached));
    let per_rank: Vec<(usize, u64)> = ranks.iter().map(|r| (r.dp_rank as usize, r.uncached)).collect();
    w.set_reported_rank_loads(&per_rank);
    // What was sent before this report is in it: the tally since starts afresh.
    w.since_poll.reported(ranks.iter().map(|r| r.gen_throughput).sum());
    // Overload protection's signals: queued requests over the ranks, their mean KV usage.
    w.liveness.set_rank_reports(ranks);
}

/// Warns (once per set of models) when the workers serve different models: one
/// router renders and hashes for one model, so the others would never match.
fn warn_mixed_models(all: &[Arc<Worker>], last: &mut Vec<String>) {
    let mut models: Vec<String> = all.iter().filter_map(|w| w.info()?.model_id).collect();
    models.sort_unstable();
    models.dedup();
    if models.len() > 1 && *last != models {
        warn!(?models, "workers serve different models: requests are rendered and hashed for one model only");
    }
    *last = models;
}

/// Asks a worker what it serves: SGLang's `/server_info` first, then the
/// OpenAI `/v1/models` list. `None` when neither answers (tried again next tick).
pub async fn introspect(client: &reqwest::Client, w: &Worker, timeout: Duration) -> Option<WorkerInfo> {
    if let Some(engine) = w.engine() {
        return crate::grpc::introspect(w, engine, timeout).await;
    }
    let get = |path: &'static str| {
        let url = w.endpoint_url(path);
        async move {
            let r = client.get(url).timeout(timeout).send().await.ok()?;
            if !r.status().is_success() {
                return None;
            }
            serde_json::from_slice::<Value>(&read_capped(r).await?).ok()
        }
    };
    if let Some(v) = get("/server_info").await {
        let info = crate::worker::from_server_info(&v);
        if info.model_id.is_some() {
            return Some(info);
        }
    }
    let models = get("/v1/models").await;
    debug!(worker = %w.url, found = models.is_some(), "no /server_info; asked /v1/models");
    models.map(|v| WorkerInfo {
        model_id: v.pointer("/data/0/id").and_then(Value::as_str).map(|s| s.chars().take(256).collect()),
        model_path: v.pointer("/data/0/root").and_then(Value::as_str).map(|s| s.chars().take(1024).collect()),
        ..WorkerInfo::default()
    })
}

/// Why a worker added as `role` cannot be what it reports (`disaggregation_mode`), if it cannot.
/// A worker that reports no mode (vLLM, older SGLang) is taken at its word.
pub(crate) fn contradiction(role: Role, mode: Option<&str>) -> Option<String> {
    let mode = mode?;
    let fits = match role {
        Role::Regular => mode == "null",
        Role::Prefill { .. } => mode == "prefill",
        Role::Decode => mode == "decode",
    };
    (!fits).then(|| format!("added as {} but its /server_info says disaggregation_mode {mode:?}", role.as_str()))
}

#[cfg(test)]
mod tests {
    use crate::worker::from_server_info;

    use super::*;
    use serde_json::json;

    #[test]
    fn roles_against_reports() {
        assert_eq!(contradiction(Role::PREFILL, Some("prefill")), None);
        assert_eq!(contradiction(Role::Decode, Some("decode")), None);
        assert_eq!(contradiction(Role::Regular, Some("null")), None);
        assert_eq!(contradiction(Role::Decode, None), None);
        assert!(contradiction(Role::PREFILL, Some("decode")).unwrap().contains("added as prefill"));
        assert!(contradiction(Role::Decode, Some("null")).is_some());
        assert!(contradiction(Role::Regular, Some("prefill")).is_some());
    }

    #[test]
    fn server_info_fields() {
        let v = json!({"model_path": "/models/qwen", "served_model_name": "qwen", "dp_size": 4, "page_size": 64});
        let i = from_server_info(&v);
        assert_eq!(
            i,
            WorkerInfo {
                model_id: Some("qwen".into()),
                model_path: Some("/models/qwen".into()),
                dp_size: Some(4),
                page_size: Some(64),
                ..WorkerInfo::default()
            }
        );
        let v = json!({"model_path": "m", "disaggregation_mode": "prefill", "disaggregation_bootstrap_port": 8998});
        let i = from_server_info(&v);
        assert_eq!((i.disaggregation_mode.as_deref(), i.bootstrap_port), (Some("prefill"), Some(8998)));
        assert_eq!(from_server_info(&json!({"disaggregation_bootstrap_port": 70000})).bootstrap_port, None);
        // SGLang leaves served_model_name empty-ish in some versions: fall back to the path.
        let v = json!({"model_path": "/models/qwen", "served_model_name": "", "page_size": 1});
        let i = from_server_info(&v);
        assert_eq!(i.model_id.as_deref(), Some("/models/qwen"));
        assert_eq!(i.dp_size, None);
        assert_eq!(from_server_info(&json!({"dp_size": -1})), WorkerInfo::default());
        // A worker cannot make the router believe in a million ranks.
        assert_eq!(from_server_info(&json!({"dp_size": 1_000_000})).dp_size, None);
    }
}
