//! The export request as the protocol lays it out, and the exporter's bounds: a full queue
//! drops spans, an unreachable collector costs the batch, both counted.

use std::sync::atomic::Ordering;
use std::time::Duration;

use prost::Message;

use super::*;

fn span(n: u64) -> SpanRecord {
    SpanRecord {
        ctx: TraceContext::child_of(None, || n),
        name: "POST /v1/chat/completions".into(),
        start_unix_nanos: 1_000,
        end_unix_nanos: 2_000,
        attributes: vec![("http.response.status_code", Attr::Int(502)), ("sgl_router.worker", Attr::Str("w".into()))],
        error: Some("upstream".into()),
    }
}

#[test]
fn a_span_is_encoded_with_its_ids_times_attributes_and_status() {
    let config = ExportConfig::new("127.0.0.1:4317", "router-a");
    let bytes = encode(&config, [span(7)].into_iter()).encode_to_vec();
    let decoded = proto::ExportTraceServiceRequest::decode(bytes.as_slice()).unwrap();
    let rs = &decoded.resource_spans[0];
    let service = &rs.resource.as_ref().unwrap().attributes[0];
    assert_eq!(service.key, "service.name");
    let s = &rs.scope_spans[0].spans[0];
    assert_eq!(s.span_id, 7u64.to_be_bytes().to_vec());
    assert_eq!(s.trace_id.len(), 16);
    assert!(s.parent_span_id.is_empty(), "a root");
    assert_eq!((s.start_time_unix_nano, s.end_time_unix_nano, s.kind), (1_000, 2_000, proto::SPAN_KIND_SERVER));
    assert_eq!(s.attributes.len(), 2);
    assert_eq!(s.status.as_ref().map(|st| st.code), Some(proto::STATUS_CODE_ERROR));
    assert_eq!(s.flags, 1);
}

#[tokio::test]
async fn a_collector_that_cannot_be_reached_costs_the_batch_and_a_full_queue_drops() {
    // A port nobody listens on (the discard port: a port bound then let go could be handed to
    // another test's socket meanwhile).
    let port = 9;
    let config = ExportConfig {
        queue: 4,
        batch: 2,
        delay: Duration::from_millis(10),
        ..ExportConfig::new(format!("127.0.0.1:{port}"), "r")
    };
    let tracer = Tracer::start(config);
    for n in 0..2 {
        tracer.record(span(n));
    }
    for _ in 0..500 {
        if tracer.counters.failed.load(Ordering::Relaxed) == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(tracer.counters.failed.load(Ordering::Relaxed), 2, "the batch is lost, counted");
    assert_eq!(tracer.counters.exported.load(Ordering::Relaxed), 0);
    // Far more than the queue holds, at once: the rest are dropped, never queued.
    for n in 0..100 {
        tracer.record(span(n));
    }
    assert!(tracer.counters.dropped.load(Ordering::Relaxed) >= 90, "{:?}", tracer.counters);
}
