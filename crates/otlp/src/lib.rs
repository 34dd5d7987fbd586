//! OpenTelemetry traces out over OTLP/gRPC (`--enable-trace`, `--otlp-traces-endpoint`, as
//! SGLang Model Gateway names them): the export messages ([`proto`]), W3C trace context
//! ([`TraceContext`]) and a [`Tracer`] that batches finished spans to a collector.
//!
//! The request path only hands a finished span to a bounded queue ([`Tracer::record`], never
//! waiting): a full queue drops the span and counts it. One task sends batches (up to
//! [`ExportConfig::batch`] spans, or what came within [`ExportConfig::delay`]) as unary
//! `TraceService/Export` calls, each under a deadline; a collector that is down, slow or
//! answers garbage costs the batch (counted), never memory or a request's time. No
//! knowledge of the router.

mod context;
pub mod proto;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::warn;

pub use context::{TraceContext, parse};

/// The unary export call's path.
pub const EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// Where and how spans are exported.
#[derive(Debug, Clone)]
pub struct ExportConfig {
    /// The collector, `HOST:PORT` (an `http://` prefix is accepted).
    pub endpoint: String,
    /// The resource's `service.name`.
    pub service_name: String,
    /// Spans waiting for export at most (more are dropped).
    pub queue: usize,
    /// Spans per export call at most.
    pub batch: usize,
    /// Longest a span waits for its batch to fill.
    pub delay: Duration,
    /// Deadline of one export call, connecting included.
    pub timeout: Duration,
}

impl ExportConfig {
    /// OpenTelemetry's batch defaults (a queue of 2,048, batches of 512) sent every second,
    /// each call within 10 s.
    pub fn new(endpoint: impl Into<String>, service_name: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            service_name: service_name.into(),
            queue: 2048,
            batch: 512,
            delay: Duration::from_secs(1),
            timeout: Duration::from_secs(10),
        }
    }
}

/// An attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Attr {
    Str(String),
    Int(i64),
    Bool(bool),
}

/// A finished span.
#[derive(Debug, Clone)]
pub struct SpanRecord {
    pub ctx: TraceContext,
    pub name: String,
    pub start_unix_nanos: u64,
    pub end_unix_nanos: u64,
    pub attributes: Vec<(&'static str, Attr)>,
    /// The span failed, and why.
    pub error: Option<String>,
}

/// What the exporter counted.
#[derive(Debug, Default)]
pub struct Counters {
    /// Spans a collector took.
    pub exported: AtomicU64,
    /// Spans dropped because the queue was full.
    pub dropped: AtomicU64,
    /// Spans lost to a failed export (unreachable, slow, an error status, a bad answer).
    pub failed: AtomicU64,
}

/// The request path's handle: cheap to clone, never blocks.
#[derive(Debug, Clone)]
pub struct Tracer {
    queue: mpsc::Sender<SpanRecord>,
    /// What was exported, dropped and lost.
    pub counters: Arc<Counters>,
}

impl Tracer {
    /// Starts the export task on the current runtime; it ends when every [`Tracer`] is dropped
    /// (after sending what it holds).
    pub fn start(config: ExportConfig) -> Tracer {
        let (queue, spans) = mpsc::channel(config.queue.max(1));
        let counters = Arc::new(Counters::default());
        tokio::spawn(export_loop(config, spans, counters.clone()));
        Tracer { queue, counters }
    }

    /// Hands a finished span to the exporter; dropped (and counted) when the queue is full.
    pub fn record(&self, span: SpanRecord) {
        if self.queue.try_send(span).is_err() {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Collects batches and exports them until the last [`Tracer`] is gone.
async fn export_loop(config: ExportConfig, mut spans: mpsc::Receiver<SpanRecord>, counters: Arc<Counters>) {
    let mut channel: Option<grpc_wire::Channel> = None;
    let mut batch = Vec::with_capacity(config.batch.max(1));
    while let Some(first) = spans.recv().await {
        batch.push(first);
        let deadline = tokio::time::Instant::now() + config.delay;
        while batch.len() < config.batch.max(1) {
            match tokio::time::timeout_at(deadline, spans.recv()).await {
                Ok(Some(span)) => batch.push(span),
                Ok(None) | Err(_) => break,
            }
        }
        let n = batch.len() as u64;
        let request = encode(&config, batch.drain(..));
        match tokio::time::timeout(config.timeout, export(&config.endpoint, &mut channel, &request)).await {
            Ok(Ok(())) => {
                counters.exported.fetch_add(n, Ordering::Relaxed);
            }
            Ok(Err(why)) => {
                channel = None;
                counters.failed.fetch_add(n, Ordering::Relaxed);
                warn!(endpoint = %config.endpoint, spans = n, why, "trace export failed");
            }
            Err(_) => {
                channel = None;
                counters.failed.fetch_add(n, Ordering::Relaxed);
                warn!(endpoint = %config.endpoint, spans = n, "trace export timed out");
            }
        }
    }
}

/// One `Export` call on `channel` (connected first when there is none).
async fn export(
    endpoint: &str,
    channel: &mut Option<grpc_wire::Channel>,
    request: &proto::ExportTraceServiceRequest,
) -> Result<(), String> {
    if channel.is_none() {
        let host = endpoint.trim_start_matches("http://").trim_end_matches('/');
        let addr = tokio::net::lookup_host(host)
            .await
            .map_err(|e| format!("resolving {host}: {e}"))?
            .next()
            .ok_or_else(|| format!("{host} resolves to no address"))?;
        *channel = Some(grpc_wire::Channel::connect(addr).await.map_err(|e| format!("connecting: {e}"))?);
    }
    let Some(ch) = channel.as_mut() else { return Err("no channel".into()) };
    let (head, mut answers) = ch.unary(EXPORT_PATH, request, 1 << 20).await.map_err(|e| format!("calling: {e}"))?;
    let answer = answers.next::<proto::ExportTraceServiceResponse>().await;
    // Drain to the trailers: the call's status.
    let rest = answers.next::<proto::ExportTraceServiceResponse>().await;
    let status = answers.status().or_else(|| grpc_wire::Status::from_headers(&head));
    match (answer, rest, status) {
        (Ok(_), Ok(None), Some(s)) if s.code == 0 => Ok(()),
        (_, _, Some(s)) if s.code != 0 => Err(format!("status {}: {}", s.code, s.message)),
        (Err(s), _, _) | (_, Err(s), _) => Err(format!("bad answer: {}", s.message)),
        _ => Err("no status".into()),
    }
}

/// The export request of `spans`.
fn encode(config: &ExportConfig, spans: impl Iterator<Item = SpanRecord>) -> proto::ExportTraceServiceRequest {
    use proto::any_value::Value;
    let kv = |key: &str, value: Value| proto::KeyValue {
        key: key.to_string(),
        value: Some(proto::AnyValue { value: Some(value) }),
    };
    let spans = spans
        .map(|s| proto::Span {
            trace_id: s.ctx.trace_id.to_vec(),
            span_id: s.ctx.span_id.to_vec(),
            trace_state: String::new(),
            parent_span_id: s.ctx.parent.map(|p| p.to_vec()).unwrap_or_default(),
            name: s.name,
            kind: proto::SPAN_KIND_SERVER,
            start_time_unix_nano: s.start_unix_nanos,
            end_time_unix_nano: s.end_unix_nanos,
            attributes: s
                .attributes
                .into_iter()
                .map(|(k, v)| {
                    let v = match v {
                        Attr::Str(s) => Value::StringValue(s),
                        Attr::Int(i) => Value::IntValue(i),
                        Attr::Bool(b) => Value::BoolValue(b),
                    };
                    kv(k, v)
                })
                .collect(),
            status: s.error.map(|message| proto::Status { message, code: proto::STATUS_CODE_ERROR }),
            flags: u32::from(s.ctx.flags),
        })
        .collect();
    proto::ExportTraceServiceRequest {
        resource_spans: vec![proto::ResourceSpans {
            resource: Some(proto::Resource {
                attributes: vec![kv("service.name", Value::StringValue(config.service_name.clone()))],
            }),
            scope_spans: vec![proto::ScopeSpans {
                scope: Some(proto::InstrumentationScope {
                    name: "sgl-router".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                }),
                spans,
            }],
        }],
    }
}

#[cfg(test)]
mod tests;
