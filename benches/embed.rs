//! One embedding on the calling thread (`Encoder::embed_batch` of one text), by length: a
//! short question, a paragraph, and a text cut at the model's 256 tokens; at each precision
//! (f32, the reference, and int8), in the same run. The real
//! all-MiniLM-L6-v2 when `SGL_ROUTER_EMBED_MODEL` names it (`tools/embed_eval/fetch.sh`),
//! else the tiny random model of the tests (its figures say nothing of the real one's).
//!   SGL_ROUTER_EMBED_MODEL=DIR cargo bench -p sgl-router-benches --features embed --bench embed
//! (Here, not in the `embed` crate: its criterion would be built with CI's release tests of it.)

use criterion::{Criterion, criterion_group, criterion_main};
use embed::{Encoder, Precision};

fn bench(c: &mut Criterion) {
    let tiny = embed::testing::tiny_model("bench");
    let (dir, which) = match std::env::var_os("SGL_ROUTER_EMBED_MODEL") {
        Some(d) => (std::path::PathBuf::from(d), "minilm"),
        None => (tiny.to_path_buf(), "tiny"),
    };
    for precision in [Precision::F32, Precision::Int8] {
        let encoder = Encoder::load_with(&dir, precision).expect("the model loads");
        one(c, &encoder, &format!("embed_one/{which}/{}", precision.as_str()));
    }
}

fn one(c: &mut Criterion, encoder: &Encoder, group: &str) {
    let short = "How do I reset my password?";
    let paragraph = "Our team is planning a three-day offsite in the mountains next spring. \
        We need a schedule that balances strategy sessions, team-building activities and free time, \
        and we want to keep the travel budget under control. Can you draft a plan?";
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(40);
    let mut g = c.benchmark_group(group);
    for (name, text) in [("short", short), ("paragraph", paragraph), ("truncated_256", long.as_str())] {
        let tokens = encoder.tokenize(text).expect("tokenizes").ids.len();
        g.bench_function(format!("{name}_{tokens}_tokens"), |b| {
            b.iter(|| encoder.embed_batch(&[std::hint::black_box(text)]).expect("embeds"))
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = bench
}
criterion_main!(benches);
