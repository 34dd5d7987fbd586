//! Model selection per request, as the gateway runs it for `model: "auto"`
//! (the README's `examples/routing.yaml`: keyword, regex, PII and context
//! signals, five decisions): `model_select/decide/*` is reading the user's
//! turns out of the parsed body plus every reachable signal and the decision;
//! `model_select/signals_only` leaves out the decision, `model_select/pii`
//! is the PII detector alone on the same text. The bodies: a typical chat
//! (system prompt and three turns, about 1.5 KiB), one with an email (the
//! `private` decision), and a 16 KiB document.
//!
//! Run: `cargo bench -p sgl-router-benches --bench model_select`.
//! Last result: docs/benchmarks.md ("Model selection").

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use model_select::{PiiDetector, PiiType, Selector, SignalInput};
use serde_json::{Value, json};

fn selector() -> Selector {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/routing.yaml");
    let text = std::fs::read_to_string(path).expect("examples/routing.yaml");
    Selector::new(model_select::parse_yaml(&text).expect("valid")).expect("compiles")
}

fn chat(user_last: &str, pad: usize) -> Value {
    let system = "You are a helpful assistant for the operations team. Answer briefly and cite the runbook.";
    let history = "The deployment of the billing service failed twice last night during the database migration step. ";
    json!({"model": "auto", "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": history.repeat(4)},
        {"role": "assistant", "content": "The migration timed out waiting for a lock held by the reporting job."},
        {"role": "user", "content": "Can we reschedule the reporting job so that it never overlaps the migration window?"},
        {"role": "assistant", "content": "Yes: move it to 04:00 UTC and add a lock timeout of 30 seconds."},
        {"role": "user", "content": format!("{user_last} {}", "More context follows. ".repeat(pad))}
    ]})
}

fn bench(c: &mut Criterion) {
    let s = selector();
    let bodies = [
        ("typical_chat", chat("Thanks. Write the change request for it, please.", 0)),
        ("chat_with_email", chat("Send the summary to ops-lead@example.com and to +1 415 555 0100.", 0)),
        ("document_16k", chat("Summarise the incident for the postmortem.", 730)),
    ];
    let mut g = c.benchmark_group("model_select");
    for (name, body) in &bodies {
        // The token count comes from the renderer the request is rendered with anyway.
        let tokens = body.to_string().len() as u64 / 4;
        g.bench_with_input(BenchmarkId::new("decide", name), body, |b, body| {
            b.iter(|| {
                let text = model_select::signal_text(black_box(body));
                let choice = s.decide(&SignalInput::new(&text, tokens));
                black_box(choice.pools.len())
            })
        });
    }
    let (_, typical) = &bodies[0];
    let text = model_select::signal_text(typical);
    g.bench_function("signals_only/typical_chat", |b| {
        b.iter(|| black_box(s.decide(&SignalInput::new(black_box(&text), 300)).signals.iter().count()))
    });
    let detector = PiiDetector::new();
    g.bench_function("pii/typical_chat", |b| {
        b.iter(|| black_box(detector.detect(black_box(&text), &PiiType::ALL).len()))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
