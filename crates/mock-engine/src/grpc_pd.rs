//! The gRPC side of the disaggregated roles (`--role
//! prefill|decode` with `--grpc-listen`). SGLang's flavour: a `Generate` carrying
//! `disaggregated_params` (bootstrap host, port and room, as Shepherd Model
//! Gateway sends them to both legs of a pair) meets its peer over the same
//! rendezvous as the HTTP legs ([`crate::pd`]), with the same checks: a
//! prefill leg without a room, or with a room already in flight, is
//! `INVALID_ARGUMENT`; a leg whose peer never comes, or whose peer holds
//! another prompt or expects another rank, fails (`INTERNAL`); `Abort` by
//! request id ends a leg still waiting. The prefill leg then answers one
//! token, the decode leg generates with the KV it was handed.
//!
//! vLLM's flavour (NIXL pull) over vLLM's engine service: the prefill leg's
//! `kv_transfer_params_json` must ask `do_remote_decode`, with `max_tokens`
//! 1 and no stream (else `INVALID_ARGUMENT`); it keeps the blocks and hands
//! their parameters over on its completion (`kv_transfer_params_json`). The
//! decode leg pulls them from the prefill its parameters name, and without
//! complete parameters (or when the pull fails) prefills locally, silently,
//! as vLLM does (counted in `local_prefill_fallbacks`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use engine_grpc::proto::GenerateRequest;
use grpc_wire::Status;

use crate::engine::Engine;
use crate::pd::{self, Flavor, LegError, Pd, PdRole, RoomGuard};
use crate::reply::Release;

/// A leg admitted: its hold on the engine, and what else it keeps until its call ends.
pub(crate) struct Admitted {
    pub(crate) release: Release,
    /// A prefill leg: it answers one token (the rest is its decode peer's).
    pub(crate) prefill: bool,
    /// A prefill leg's room, in flight until the call ends.
    pub(crate) room: Option<RoomGuard>,
    /// A vLLM prefill's KV-transfer parameters for its decode peer (a JSON object).
    pub(crate) handoff: Option<String>,
}

/// Admits `asked` (its prompt `tokens`) on an engine in a disaggregated role: the rendezvous
/// with its peer first. A failed leg's status says why.
/// `kv`: the call's `kv_transfer_params_json` (vLLM's service).
pub(crate) async fn admit(
    e: &Arc<Engine>,
    pd: &Arc<Pd>,
    asked: &GenerateRequest,
    kv: Option<&str>,
    tokens: &[u32],
) -> Result<Admitted, Status> {
    if pd.config.flavor == Flavor::Vllm {
        return vllm(e, pd, asked, kv, tokens).await;
    }
    let Some(params) = asked.disaggregated_params.as_ref() else {
        pd.counters.missing_room.fetch_add(1, Ordering::Relaxed);
        return Err(Status::new(
            Status::INVALID_ARGUMENT,
            "disaggregated_params (bootstrap_room) is required in disaggregated mode",
        ));
    };
    let Ok(room) = u64::try_from(params.bootstrap_room) else {
        pd.counters.missing_room.fetch_add(1, Ordering::Relaxed);
        return Err(Status::new(
            Status::INVALID_ARGUMENT,
            format!("bootstrap_room {} is negative", params.bootstrap_room),
        ));
    };
    let digest = crate::digest(tokens);
    let abort = pd.register_rid(Some(asked.request_id.clone()));
    if pd.config.role == PdRole::Prefill {
        let Some(claimed) = pd.claim_room(room) else {
            return Err(Status::new(Status::INVALID_ARGUMENT, format!("bootstrap_room {room} is already in flight")));
        };
        let dp = e.config().dp_size.max(1);
        let routed = asked.data_parallel_rank.and_then(|r| usize::try_from(r).ok());
        let rank = routed.filter(|r| *r < dp).unwrap_or((room % dp as u64) as usize);
        let admit = async {
            let admission = e.admit(tokens, Some(rank)).await;
            let cached = admission.cached_tokens;
            (Release { engine: e.clone(), admission }, cached)
        };
        let met = crate::legs::until_aborted(pd.meet_as_prefill(room, digest, rank, routed, dp, admit), &abort).await;
        let release = met.and_then(|r| r).map_err(status)?;
        return Ok(Admitted { release, prefill: true, room: Some(claimed), handoff: None });
    }
    if params.bootstrap_host.is_empty() {
        return Err(Status::new(Status::INVALID_ARGUMENT, "bootstrap_host is required in disaggregated mode"));
    }
    let port = match u16::try_from(params.bootstrap_port) {
        Ok(p) if p != 0 => p,
        _ => match pd.config.bootstrap_port {
            0 => pd::DEFAULT_BOOTSTRAP_PORT,
            p => p,
        },
    };
    let met = pd::meet_as_decode(pd, &params.bootstrap_host, port, room, digest, None);
    let cached = crate::legs::until_aborted(met, &abort).await.and_then(|r| r).map_err(status)?;
    let release = Release { engine: e.clone(), admission: e.admit_remote(tokens, cached, false) };
    Ok(Admitted { release, prefill: false, room: None, handoff: None })
}

/// A failed leg's status: the engine's 400s are the caller's, the rest the engine's.
fn status((code, message): LegError) -> Status {
    Status::new(if code == 400 { Status::INVALID_ARGUMENT } else { Status::INTERNAL }, message)
}

/// vLLM's flavour: a prefill leg keeps its blocks and hands their parameters over; a decode leg
/// pulls them, or prefills locally.
async fn vllm(
    e: &Arc<Engine>,
    pd: &Arc<Pd>,
    asked: &GenerateRequest,
    kv: Option<&str>,
    tokens: &[u32],
) -> Result<Admitted, Status> {
    let params: serde_json::Value = match kv.map(serde_json::from_str) {
        Some(Ok(v @ serde_json::Value::Object(_))) => v,
        Some(_) => return Err(Status::new(Status::INVALID_ARGUMENT, "kv_transfer_params_json must be a JSON object")),
        None => serde_json::Value::Null,
    };
    let digest = crate::digest(tokens);
    let rank = asked.data_parallel_rank.and_then(|r| usize::try_from(r).ok());
    if pd.config.role == PdRole::Prefill {
        let max = asked.sampling_params.as_ref().and_then(|p| p.max_new_tokens);
        let shape = if params.get("do_remote_decode").and_then(serde_json::Value::as_bool) != Some(true) {
            Some("kv_transfer_params.do_remote_decode must be true on a prefill worker")
        } else if max != Some(1) {
            Some("a prefill request must have max_tokens 1")
        } else if asked.stream {
            Some("a prefill request must not stream")
        } else {
            None
        };
        if let Some(m) = shape {
            pd.counters.bad_prefill_shape.fetch_add(1, Ordering::Relaxed);
            return Err(Status::new(Status::INVALID_ARGUMENT, m));
        }
        let admission = e.admit(tokens, rank).await;
        let cached = admission.cached_tokens;
        let pages = tokens.len().div_ceil(e.config().page_size.max(1));
        let block_ids = pd.keep(&asked.request_id, digest, pages);
        let handoff = serde_json::json!({
            "do_remote_prefill": true,
            "do_remote_decode": false,
            "remote_block_ids": block_ids,
            "remote_engine_id": pd.engine_id,
            "remote_request_id": asked.request_id,
            "remote_host": "127.0.0.1",
            "remote_port": pd.bootstrap_port(),
            "tp_size": 1,
            "remote_num_tokens": tokens.len(),
            "transfer_mode": "pull",
            "remote_prefill_cached_tokens": cached,
        });
        let release = Release { engine: e.clone(), admission };
        return Ok(Admitted { release, prefill: true, room: None, handoff: Some(handoff.to_string()) });
    }
    let admission = match pd::pull(pd, &params, digest, Some(&asked.request_id)).await {
        Ok(cached) => e.admit_remote(tokens, cached, true),
        Err(why) => {
            // vLLM's silent fallback: the answer is right, the disaggregation is lost.
            tracing::debug!(why, "mock vllm decode over gRPC: prefilling locally");
            pd.counters.local_prefill_fallbacks.fetch_add(1, Ordering::Relaxed);
            e.admit(tokens, rank).await
        }
    };
    Ok(Admitted { release: Release { engine: e.clone(), admission }, prefill: false, room: None, handoff: None })
}
