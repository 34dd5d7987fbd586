//! The model's tokenizer asked of the gRPC workers (`GetTokenizer`) when the
//! router is given none: before it serves, a configuration whose gRPC workers
//! have no model directory (`--tokenizer-path`, a pool's `tokenizer_path`)
//! gets one, the archive a worker hands over unpacked into a directory named
//! by its fingerprint. Workers that answer without one leave the built-in
//! model in place, with a warning.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use engine_grpc::{Engine, EngineError, MAX_TOKENIZER_BYTES};
use router_types::WorkerUrl;
use tracing::{info, warn};

use crate::config::AppConfig;

/// Longest one `GetTokenizer` call may take (the engine builds the archive on its first call).
const CALL_DEADLINE: Duration = Duration::from_secs(120);
/// Longest wait for a connection to a worker.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Between two rounds over workers none of which could be reached.
const RETRY_EVERY: Duration = Duration::from_secs(1);

/// Gives `config` a model directory wherever gRPC workers need one and it names none: the
/// router's own (`--tokenizer-path`) for its `--worker-urls`, each routing pool's for its
/// workers. Waits for a worker to answer up to `--worker-startup-timeout-secs` (`Err` when none
/// did, or an archive was hostile); when the workers answer with no tokenizer to hand over
/// (an engine started without a model directory, a servicer without the method), the built-in
/// model stays, with a warning.
pub(crate) async fn resolve(config: &mut AppConfig) -> anyhow::Result<()> {
    let within = config.health.startup.timeout;
    let inherited = config.tokenizer_path.is_some();
    if let Some(routing) = config.routing.as_mut().filter(|_| !inherited) {
        for pool in routing.pools.iter_mut().filter(|p| p.tokenizer_path.is_none()) {
            let grpc = authorities(&pool.workers);
            if !grpc.is_empty() {
                pool.tokenizer_path = fetch(&grpc, within).await.with_context(|| format!("pool {}", pool.name))?;
            }
        }
    }
    let grpc = authorities(&config.workers);
    if !inherited && !grpc.is_empty() {
        config.tokenizer_path = fetch(&grpc, within).await?;
    }
    Ok(())
}

/// The `host:port` of each gRPC worker among `workers`.
fn authorities(workers: &[WorkerUrl]) -> Vec<String> {
    workers.iter().filter_map(|w| w.as_str().strip_prefix("grpc://")).map(|a| a.trim_end_matches('/').into()).collect()
}

/// The first archive one of `workers` hands over, unpacked: rounds over them every second
/// while none can be reached, for at most `within`. `None` when they answered without one.
async fn fetch(workers: &[String], within: Duration) -> anyhow::Result<Option<PathBuf>> {
    let until = Instant::now() + within;
    let mut waited = false;
    loop {
        let mut failures = Vec::new();
        let mut refused = 0;
        for at in workers {
            // Each call within what is left of the wait (a second at least, to be asked at all).
            let left = until.saturating_duration_since(Instant::now()).max(Duration::from_secs(1));
            let engine = Engine::new(at.as_str(), CONNECT_TIMEOUT.min(left));
            match engine.tokenizer(MAX_TOKENIZER_BYTES, CALL_DEADLINE.min(left)).await {
                Ok((archive, digest)) => return unpack(&archive, &digest, at).map(Some),
                Err(e @ EngineError::Malformed(..)) => {
                    return Err(e).context("the tokenizer a gRPC worker handed over");
                }
                Err(e) => {
                    refused += usize::from(matches!(e, EngineError::Status(_)));
                    failures.push(format!("{at}: {e}"));
                }
            }
        }
        if refused > 0 {
            warn!(why = %failures.join("; "),
                "no gRPC worker hands its tokenizer over: prompts are tokenized by the built-in byte-level model, \
                 not the workers' (give --tokenizer-path)");
            return Ok(None);
        }
        if Instant::now() >= until {
            bail!(
                "no gRPC worker handed its tokenizer over within {within:?} (or give --tokenizer-path): {}",
                failures.join("; ")
            );
        }
        if !waited {
            warn!(workers = ?workers, "waiting for a gRPC worker to hand its tokenizer over (no --tokenizer-path)");
            waited = true;
        }
        tokio::time::sleep(RETRY_EVERY.min(until.saturating_duration_since(Instant::now()))).await;
    }
}

/// Unpacks `archive` into the temporary directory named by its fingerprint (made once per
/// archive: written beside it, then renamed into place, so a directory there is whole).
fn unpack(archive: &[u8], digest: &str, from: &str) -> anyhow::Result<PathBuf> {
    let root = std::env::temp_dir();
    let dir = root.join(format!("sgl-router-tokenizer-{}", &digest[..digest.len().min(32)]));
    if !dir.join("tokenizer.json").is_file() {
        let staging = root.join(format!("sgl-router-tokenizer-{}.{}", std::process::id(), digest.len()));
        let _ = std::fs::remove_dir_all(&staging);
        let files = renderer::bundle::unpack(archive, &staging).with_context(|| format!("from {from}"))?;
        if let Err(e) = std::fs::rename(&staging, &dir) {
            // Another router unpacked the same archive first: its directory serves.
            let _ = std::fs::remove_dir_all(&staging);
            if !dir.join("tokenizer.json").is_file() {
                return Err(e).with_context(|| format!("unpacking the tokenizer into {}", dir.display()));
            }
        }
        info!(worker = from, bytes = archive.len(), sha256 = digest, files = ?files, dir = %dir.display(),
            "the tokenizer, from a gRPC worker");
    }
    Ok(dir)
}
