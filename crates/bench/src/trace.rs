//! Mooncake-format traces: one JSON object per line with `timestamp` (ms),
//! `input_length`, `output_length` and `hash_ids` (one id per 512-token
//! block; equal ids mean an equal prefix up to and including that block).

use std::path::Path;

use anyhow::{Context, Result};
use serde::Deserialize;

/// Tokens per trace block.
pub(crate) const TRACE_BLOCK: u64 = 512;

/// One request of the trace.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct TraceRequest {
    /// Arrival, milliseconds from the trace start.
    pub(crate) timestamp: u64,
    /// Prompt tokens.
    pub(crate) input_length: u64,
    /// Generated tokens.
    pub(crate) output_length: u64,
    /// Prefix-block ids.
    pub(crate) hash_ids: Vec<u64>,
}

/// Reads a trace file.
pub(crate) fn load(path: &Path) -> Result<Vec<TraceRequest>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).with_context(|| format!("{}:{}: not a trace record", path.display(), i + 1))
        })
        .collect()
}
