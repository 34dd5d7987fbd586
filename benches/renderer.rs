//! Renderer hot path: chat template → tokens → page hashes.
//!
//! Run: `cargo bench -p sgl-router-benches --bench renderer`; baseline:
//! `python3 benches/renderer_transformers.py` (same chats, HF transformers).
//! Groups: `render_cold/*` (segment cache off: template + full tokenization +
//! hashing), `render_warm/*` (cache on, the conversation so far already seen,
//! only the last user message is new, as in a live chat), `hash/*` (the
//! SHA-256 page chain alone, throughput in bytes of token ids), `tokenize_16k/*`
//! (issue 29's 16 KiB prompt through the split and the BPE, no segment cache), `vision/*`
//! (a chat with an image: its placeholders and vLLM identifier, the keyed chain).
//! Last result (2-core VM): see docs/benchmarks.md.

use std::hint::black_box;
use std::num::NonZeroUsize;
use std::path::PathBuf;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use renderer::{ChatRequest, HashMode, ModelConfig, PageHasher, Renderer, TextTokenizer};
use serde_json::{Value, json};

fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn renderer(cache_entries: usize) -> Renderer {
    let dir = root().join("tests/fixtures/tokenizers/qwen3");
    let json = std::fs::read(dir.join("tokenizer.json")).expect("qwen3 tokenizer fixture");
    let bounds = renderer::CacheBounds { segment_entries: cache_entries, ..Default::default() };
    let tok = TextTokenizer::from_bytes_with(&json, bounds).unwrap();
    Renderer::new(tok, ModelConfig::load(&dir, None).unwrap())
}

fn chats() -> Vec<(String, Value)> {
    let path = root().join("benches/data/renderer_chats.json");
    let doc: Value = serde_json::from_slice(&std::fs::read(path).expect("renderer_chats.json")).unwrap();
    doc["chats"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// The chat with its last user message made unique by `i`.
fn variant(messages: &Value, i: u64) -> ChatRequest {
    let mut messages = messages.clone();
    let last = messages.as_array_mut().unwrap().last_mut().unwrap();
    let text = format!("{} (variant {i})", last["content"].as_str().unwrap());
    last["content"] = Value::String(text);
    ChatRequest::from_value(&json!({"messages": messages})).unwrap()
}

fn render_and_hash(r: &Renderer, hasher: &PageHasher, req: &ChatRequest) -> usize {
    let out = r.render_chat(req).unwrap();
    hasher.block_hashes(&out.token_ids, None).unwrap().len()
}

fn bench_render(c: &mut Criterion) {
    let hasher = PageHasher::new(NonZeroUsize::new(16).unwrap(), HashMode::Unigram);
    for (group, cache) in [("render_cold", 0), ("render_warm", 16_384)] {
        let mut g = c.benchmark_group(group);
        g.sample_size(20);
        for (name, messages) in chats() {
            let r = renderer(cache);
            let bytes = r.render_text(&variant(&messages, 0)).unwrap().len() as u64;
            g.throughput(Throughput::Bytes(bytes));
            // Warm: the conversation so far has been seen once.
            black_box(render_and_hash(&r, &hasher, &variant(&messages, 0)));
            let mut i = 1u64;
            g.bench_function(BenchmarkId::from_parameter(&name), |b| {
                b.iter(|| {
                    i += 1;
                    black_box(render_and_hash(&r, &hasher, &variant(&messages, i)))
                })
            });
        }
        g.finish();
    }
}

fn bench_hash(c: &mut Criterion) {
    let mut g = c.benchmark_group("hash");
    let tokens: Vec<u32> = (0..37_256u32).map(|i| i.wrapping_mul(2_654_435_761) % 151_000).collect();
    for (name, size, mode) in
        [("page16", 16, HashMode::Unigram), ("page64", 64, HashMode::Unigram), ("bigram16", 16, HashMode::Bigram)]
    {
        let hasher = PageHasher::new(NonZeroUsize::new(size).unwrap(), mode);
        g.throughput(Throughput::Bytes((tokens.len() * 4) as u64));
        let mut out = Vec::with_capacity(tokens.len());
        g.bench_function(BenchmarkId::new(name, tokens.len()), |b| {
            b.iter(|| {
                out.clear();
                hasher.block_hashes_into(black_box(&tokens), None, &mut out).unwrap();
                out.len()
            })
        });
    }
    // A request's chain for a worker hashing with a lookahead of one token (vLLM with EAGLE):
    // what a fleet with such workers adds per request.
    let page = NonZeroUsize::new(16).unwrap();
    g.bench_function(BenchmarkId::new("lookahead1_page16", tokens.len()), |b| {
        b.iter(|| renderer::lookahead::lookahead_block_hashes(page, black_box(&tokens), 1, None).unwrap().len())
    });
    // vLLM's own hash of the same pages (pickle, SHA-256), as the pump checks a vLLM store.
    let wide: Vec<u64> = tokens.iter().map(|t| u64::from(*t)).collect();
    g.bench_function(BenchmarkId::new("vllm_sha256_page16", tokens.len()), |b| {
        b.iter(|| {
            let mut parent = renderer::vllm_hash::none_hash();
            for chunk in black_box(&wide).chunks_exact(16) {
                parent = renderer::vllm_hash::block_hash(&parent, chunk, &[], &[]);
            }
            parent
        })
    });
    g.finish();
}

/// Where the cold time goes: the template alone, and tokenization alone (fast path, no segment cache).
fn bench_parts(c: &mut Criterion) {
    let mut g = c.benchmark_group("render_parts");
    g.sample_size(20);
    let r = renderer(0);
    for (name, messages) in chats() {
        let req = variant(&messages, 0);
        let text = r.render_text(&req).unwrap();
        g.throughput(Throughput::Bytes(text.len() as u64));
        g.bench_function(BenchmarkId::new("template", &name), |b| {
            b.iter(|| black_box(r.render_text(&req).unwrap().len()))
        });
        g.bench_function(BenchmarkId::new("tokenize", &name), |b| {
            b.iter(|| black_box(r.tokenizer().encode(&text, false).unwrap().len()))
        });
        g.bench_function(BenchmarkId::new("tokenize_reference", &name), |b| {
            b.iter(|| black_box(r.tokenizer().encode_uncached(&text, false).unwrap().len()))
        });
    }
    g.finish();
}

/// Issue 29's prompt as the tokenizer sees it: 16 KiB of English (a shared system prompt)
/// and a user message of random six-digit numbers (Qwen splits digits one by one), plain
/// ASCII; and the same with one non-ASCII character per line (the splitter's segments).
fn bench_split(c: &mut Criterion) {
    let mut g = c.benchmark_group("tokenize_16k");
    g.sample_size(30);
    let r = renderer(0);
    let english = "You are a careful assistant. Answer the user's questions about the attached \
                   documents, cite the section you used, and say so when you don't know.\n";
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut numbers = String::new();
    while numbers.len() < 3_300 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        numbers.push_str(&format!("{:06} ", state % 1_000_000));
    }
    let ascii = english.repeat(13_100 / english.len()) + &numbers;
    let mixed = ascii.replace(".\n", ". \u{2014} é\n");
    for (name, text) in [("ascii", ascii), ("mixed", mixed)] {
        g.throughput(Throughput::Bytes(text.len() as u64));
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| black_box(r.tokenizer().encode(&text, false).unwrap().len()))
        });
    }
    g.finish();
}

/// What an image costs a request: the golden's one-image chat (a 640 by 480 PNG, 24 KB) rendered
/// with the image expanded and identified, against the same chat without the vision settings
/// (one pad per image); vLLM's identifier of 1 MiB of image bytes; the keyed chain against the
/// plain one over the expanded prompt.
fn bench_vision(c: &mut Criterion) {
    use renderer::vision::{ImageHash, VisionConfig, identifiers, keyed_block_hashes};
    let mut g = c.benchmark_group("vision");
    let dir = root().join("tests/fixtures/kv_multimodal");
    let doc: Value = serde_json::from_slice(&std::fs::read(dir.join("mm_golden.json")).unwrap()).unwrap();
    let mut text = json!({"messages": doc["chats"][0]["messages"]}).to_string();
    for image in doc["images"].as_array().unwrap() {
        let url = format!("\"data:image/png;base64,{}\"", image["b64"].as_str().unwrap());
        text = text.replace(&format!("\"@{}\"", image["name"].as_str().unwrap()), &url);
    }
    let req = ChatRequest::from_value(&serde_json::from_str(&text).unwrap()).unwrap();
    let template = dir.join("qwen2_vl_template.jinja");
    let plain = Renderer::from_dir(&root().join("tests/fixtures/tokenizers/qwen3"), Some(&template)).unwrap();
    let vision = VisionConfig::load(&dir, plain.tokenizer().token_to_id("<|image_pad|>"));
    let vl = Renderer::from_dir(&root().join("tests/fixtures/tokenizers/qwen3"), Some(&template))
        .unwrap()
        .with_vision(vision);
    g.bench_function("chat_one_image/template_only", |b| {
        b.iter(|| plain.render_chat(black_box(&req)).unwrap().token_ids.len())
    });
    g.bench_function("chat_one_image/expanded", |b| {
        b.iter(|| vl.render_chat(black_box(&req)).unwrap().token_ids.len())
    });
    let bytes: Vec<u8> = (0..1u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    g.throughput(Throughput::Bytes(bytes.len() as u64));
    g.bench_function("identifier_1mib", |b| {
        b.iter(|| ImageHash::new(black_box(&bytes), true).identifier("Qwen/Qwen2.5-VL-7B-Instruct"))
    });
    let rendered = vl.render_chat(&req).unwrap();
    let hasher = PageHasher::new(NonZeroUsize::new(16).unwrap(), HashMode::Unigram);
    g.throughput(Throughput::Elements(rendered.token_ids.len() as u64));
    g.bench_function("chain/plain", |b| {
        b.iter(|| hasher.block_hashes(black_box(&rendered.token_ids), None).unwrap().len())
    });
    g.bench_function("chain/keyed", |b| {
        b.iter(|| {
            keyed_block_hashes(
                &hasher,
                black_box(&rendered.token_ids),
                None,
                &rendered.mm,
                &identifiers(&rendered.mm, "Qwen/Qwen2.5-VL-7B-Instruct"),
            )
            .len()
        })
    });
    g.finish();
}

criterion_group!(benches, bench_render, bench_parts, bench_hash, bench_split, bench_vision);
criterion_main!(benches);
