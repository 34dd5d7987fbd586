//! What the fleet asks a gRPC worker (`grpc://host:port`, SGLang's scheduler
//! service): its health (`HealthCheck`), what it serves (`GetModelInfo`,
//! `GetServerInfo`) and its load (`GetLoads`), in the shapes the HTTP probes
//! give. The worker owns the connection ([`Worker::engine`]).

use std::time::Duration;

use engine_grpc::Engine;
use engine_grpc::proto::GetServerInfoResponse;
use grpc_wire::wkt::Struct;

use crate::liveness::RankReport;
use crate::{MAX_DP_SIZE, Worker, WorkerInfo};

/// The probe's verdict: `Ok(healthy)` when it answered (contact), `Err` when it could not be asked.
pub(crate) async fn health(engine: &Engine, timeout: Duration) -> Result<bool, String> {
    match engine.health(timeout).await {
        Ok(answer) => Ok(answer.healthy),
        // It answered, with an error status: contact, not healthy.
        Err(engine_grpc::EngineError::Status(_)) => Ok(false),
        Err(e) => Err(e.to_string()),
    }
}

/// What it serves, from its model and server info; `None` when it does not answer.
pub(crate) async fn introspect(w: &Worker, engine: &Engine, timeout: Duration) -> Option<WorkerInfo> {
    let model = engine.model_info(timeout).await.ok()?;
    let server = engine.server_info(timeout).await.ok();
    let clip = |s: &str| (!s.is_empty()).then(|| s.chars().take(256).collect::<String>());
    let mut info = server.as_ref().map(from_server_info).unwrap_or_default();
    info.model_id = clip(&model.served_model_name).or_else(|| clip(&model.model_path)).or(info.model_id);
    tracing::debug!(worker = %w.url, model = ?info.model_id, "gRPC worker introspected");
    Some(info)
}

/// The page size in its server args, if it says.
pub(crate) fn page_size(s: &GetServerInfoResponse) -> Option<usize> {
    from_server_info(s).page_size.map(|p| p as usize).filter(|p| *p > 0)
}

/// SGLang's server args as `GetServerInfo` carries them (a protobuf `Struct`), read as the
/// HTTP probe reads `/server_info` ([`crate::from_server_info`]): the texts and the
/// whole numbers among them (protobuf numbers are doubles).
fn from_server_info(s: &GetServerInfoResponse) -> WorkerInfo {
    let empty = Struct::default();
    let args = s.server_args.as_ref().unwrap_or(&empty);
    let flat: serde_json::Map<String, serde_json::Value> = args
        .fields
        .iter()
        .filter_map(|(k, v)| {
            let v = match (v.as_str(), v.as_f64()) {
                (Some(s), _) => serde_json::Value::from(s),
                (_, Some(n)) if n.fract() == 0.0 && (0.0..=u64::MAX as f64).contains(&n) => {
                    serde_json::Value::from(n as u64)
                }
                _ => return None,
            };
            Some((k.clone(), v))
        })
        .collect();
    crate::worker::from_server_info(&serde_json::Value::Object(flat))
}

/// Each rank's load (`GetLoads`), the first [`MAX_DP_SIZE`]; `Err` when it could not be asked.
pub(crate) async fn loads(engine: &Engine, timeout: Duration) -> Result<Vec<RankReport>, String> {
    let answer = engine.loads(timeout).await.map_err(|e| e.to_string())?;
    let clamp = |n: i32| u64::try_from(n).unwrap_or(0);
    Ok(answer
        .loads
        .iter()
        .take(MAX_DP_SIZE as usize)
        .map(|l| RankReport {
            dp_rank: u32::try_from(l.dp_rank).unwrap_or(0),
            running: clamp(l.num_running_reqs),
            waiting: clamp(l.num_waiting_reqs),
            uncached: clamp(l.num_waiting_uncached_tokens),
            token_usage: if l.token_usage.is_finite() { l.token_usage.clamp(0.0, 1.0) } else { 0.0 },
            gen_throughput: if l.gen_throughput.is_finite() { l.gen_throughput.max(0.0) } else { 0.0 },
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use grpc_wire::wkt::Value;

    use super::*;

    #[test]
    fn server_args_are_read_as_the_http_probe_reads_them_and_lies_are_not_believed() {
        let mut args = Struct::default();
        for (k, v) in [
            ("served_model_name", Value::string("m")),
            ("page_size", Value::number(16.0)),
            ("dp_size", Value::number(1e9)),
            ("disaggregation_mode", Value::string("null")),
            ("disaggregation_bootstrap_port", Value::number(8998.5)),
        ] {
            args.fields.insert(k.into(), v);
        }
        let info = from_server_info(&GetServerInfoResponse { server_args: Some(args), ..Default::default() });
        assert_eq!(info.model_id.as_deref(), Some("m"));
        assert_eq!(info.page_size, Some(16));
        assert_eq!(info.dp_size, None, "a data-parallel size past the bound is not believed");
        assert_eq!(info.disaggregation_mode.as_deref(), Some("null"));
        assert_eq!(info.bootstrap_port, None, "not a whole port");
    }
}
