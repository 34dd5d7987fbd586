//! `--enable-trace`: each proxied request's span exported over OTLP/gRPC to a collector built
//! on OpenTelemetry's own protocol definitions (tests/otlp/collector.py), continuing the
//! client's W3C `traceparent` or starting a trace, and the worker sent a `traceparent` naming
//! the router's span; a collector in trouble costs spans (counted), never a request.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::app::{config, engine_config, start};
use mock_engine::{MockEngine, MockEngineConfig};
use serde_json::{Value, json};
use sgl_router::app::PolicyConfig;

/// The collector, its spans as they come.
struct Collector {
    child: Child,
    port: u16,
    spans: tokio::sync::mpsc::UnboundedReceiver<Value>,
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Collector {
    fn start(python: &std::path::Path, fail: u32) -> Collector {
        let mut child = Command::new(python)
            .arg(common::app::repo("tests/otlp/collector.py"))
            .args(["--fail", &fail.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the collector starts");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let port = lines.next().expect("its port").unwrap().trim().parse().unwrap();
        let (tx, spans) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let _ = tx.send(serde_json::from_str::<Value>(&line).unwrap());
            }
        });
        Collector { child, port, spans }
    }

    /// The next span, within 10 s.
    async fn next(&mut self) -> Value {
        tokio::time::timeout(Duration::from_secs(10), self.spans.recv()).await.expect("a span within 10 s").unwrap()
    }
}

fn traced(port: u16, engine: &MockEngine) -> sgl_router::app::AppConfig {
    let mut c = config(&[engine], PolicyConfig::RoundRobin, false);
    let export = otlp::ExportConfig::new(format!("127.0.0.1:{port}"), "sgl-router-test");
    c.trace = Some(otlp::ExportConfig { delay: Duration::from_millis(20), timeout: Duration::from_secs(2), ..export });
    // A worker's failure reaches the client (and the span) as it is.
    c.retry.enabled = false;
    c
}

fn traceparent_sent(engine: &MockEngine) -> String {
    let leg = engine.engine().legs().pop().expect("the worker got the request");
    leg.headers.iter().find(|(n, _)| n == "traceparent").map(|(_, v)| v.clone()).expect("a traceparent")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requests_span_reaches_the_collector_and_its_context_the_worker() {
    let Some(python) = common::venv_python("the OTLP trace tests") else { return };
    let mut collector = Collector::start(&python, 0);
    let engine = MockEngine::spawn(MockEngineConfig { record_requests: true, ..engine_config() }).await.unwrap();
    let r = start(traced(collector.port, &engine)).await;
    let url = format!("{}/v1/chat/completions", r.url);
    let body = json!({"model": "default", "messages": [{"role": "user", "content": "trace me"}]});

    // The client's trace continued: the router's span is a child of the client's.
    let client = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let resp = reqwest::Client::new().post(&url).header("traceparent", client).json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let span = collector.next().await;
    assert_eq!(span["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736", "{span}");
    assert_eq!(span["parent_span_id"], "00f067aa0ba902b7");
    assert_eq!((span["name"].as_str(), span["kind"].as_i64()), (Some("POST /v1/chat/completions"), Some(2)));
    assert_eq!((span["service"].as_str(), span["scope"].as_str()), (Some("sgl-router-test"), Some("sgl-router")));
    let attrs = &span["attributes"];
    assert_eq!(attrs["http.response.status_code"], 200);
    assert_eq!(attrs["sgl_router.worker"].as_str(), Some(engine.url().trim_end_matches('/')), "{span}");
    assert_eq!(attrs["sgl_router.policy"], "round_robin");
    assert!(span["end"].as_u64() >= span["start"].as_u64() && span["start"].as_u64() > Some(0));
    assert_eq!(span["status"], 0, "unset: no error");
    // The worker's parent is the router's span, in the client's trace.
    let sent = traceparent_sent(&engine);
    assert_eq!(sent, format!("00-4bf92f3577b34da6a3ce929d0e0e4736-{}-01", span["span_id"].as_str().unwrap()));

    // No traceparent: a new trace, the router's span its root.
    assert_eq!(reqwest::Client::new().post(&url).json(&body).send().await.unwrap().status(), 200);
    let span = collector.next().await;
    assert_eq!(span["parent_span_id"], "", "a root span");
    assert_ne!(span["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
    let sent = traceparent_sent(&engine);
    assert_eq!(sent, format!("00-{}-{}-01", span["trace_id"].as_str().unwrap(), span["span_id"].as_str().unwrap()));

    // A worker's failure is the span's error.
    engine.engine().set_faults(mock_engine::Faults { fail_next: 1, ..Default::default() }).await;
    let resp = reqwest::Client::new().post(&url).json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 500);
    let span = collector.next().await;
    assert_eq!(span["status"], 2, "error: {span}");
    assert_eq!(span["attributes"]["http.response.status_code"], 500);
    let _ = r.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_in_trouble_costs_spans_not_requests() {
    let Some(python) = common::venv_python("the OTLP trace tests") else { return };
    // Its first two calls answered UNAVAILABLE.
    let mut collector = Collector::start(&python, 2);
    let engine = MockEngine::spawn(engine_config()).await.unwrap();
    let r = start(traced(collector.port, &engine)).await;
    let url = format!("{}/v1/chat/completions", r.url);
    let body = json!({"model": "default", "messages": [{"role": "user", "content": "trace me"}]});
    let tracer = r.gateway.config.tracer.clone().unwrap();
    for _ in 0..2 {
        assert_eq!(reqwest::Client::new().post(&url).json(&body).send().await.unwrap().status(), 200);
        // One export call per request: each waits for the one before to be answered.
        common::eventually("the export answered", async || {
            let c = &tracer.counters;
            c.failed.load(std::sync::atomic::Ordering::Relaxed) + c.exported.load(std::sync::atomic::Ordering::Relaxed)
                >= 1
        })
        .await;
    }
    common::eventually("both refused exports counted", async || {
        tracer.counters.failed.load(std::sync::atomic::Ordering::Relaxed) == 2
    })
    .await;
    let failed = common::app::metric(&r.url, "router_trace_spans_total{outcome=\"failed\"}").await;
    assert_eq!(failed, 2.0);
    // The collector is back: the next span arrives.
    assert_eq!(reqwest::Client::new().post(&url).json(&body).send().await.unwrap().status(), 200);
    let span = collector.next().await;
    assert_eq!(span["attributes"]["http.response.status_code"], 200);
    let _ = r.stop.send(());
}
