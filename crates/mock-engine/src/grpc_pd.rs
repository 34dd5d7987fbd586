//! The gRPC side of the disaggregated roles, SGLang's flavour (`--role
//! prefill|decode` with `--grpc-listen`): a `Generate` carrying
//! `disaggregated_params` (bootstrap host, port and room, as Shepherd Model
//! Gateway sends them to both legs of a pair) meets its peer over the same
//! rendezvous as the HTTP legs ([`crate::pd`]), with the same checks: a
//! prefill leg without a room, or with a room already in flight, is
//! `INVALID_ARGUMENT`; a leg whose peer never comes, or whose peer holds
//! another prompt or expects another rank, fails (`INTERNAL`); `Abort` by
//! request id ends a leg still waiting. The prefill leg then answers one
//! token, the decode leg generates with the KV it was handed.
//! vLLM's flavour over gRPC (`kv_transfer_params_json`) is not simulated:
//! such an engine refuses disaggregated calls with `UNIMPLEMENTED`.

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
}

/// Admits `asked` (its prompt `tokens`) on an engine in a disaggregated role: the rendezvous
/// with its peer first. A failed leg's status says why.
pub(crate) async fn admit(
    e: &Arc<Engine>,
    pd: &Arc<Pd>,
    asked: &GenerateRequest,
    tokens: &[u32],
) -> Result<Admitted, Status> {
    if pd.config.flavor == Flavor::Vllm {
        return Err(Status::new(
            Status::UNIMPLEMENTED,
            "the simulated engine serves vLLM's disaggregation over HTTP only (kv_transfer_params)",
        ));
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
        return Ok(Admitted { release, prefill: true, room: Some(claimed) });
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
    Ok(Admitted { release, prefill: false, room: None })
}

/// A failed leg's status: the engine's 400s are the caller's, the rest the engine's.
fn status((code, message): LegError) -> Status {
    Status::new(if code == 400 { Status::INVALID_ARGUMENT } else { Status::INTERNAL }, message)
}
