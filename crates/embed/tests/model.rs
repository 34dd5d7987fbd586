//! The encoder and pool on a tiny randomly initialised BERT
//! ([`embed::testing::tiny_model`]), and, when
//! `SGL_ROUTER_EMBED_MODEL` names the real all-MiniLM-L6-v2 directory, the
//! real model against the independent numpy reference
//! (`tools/embed_eval/reference.py`, `tests/fixtures/embed/minilm_reference.json`).

use std::path::Path;
use std::sync::Arc;

use embed::testing::{HIDDEN, tiny_model};
use embed::*;

#[test]
fn tokenizing_cuts_at_max_seq_length_keeps_sep_and_counts_it() {
    let e = Encoder::load(&tiny_model("tok")).unwrap();
    assert_eq!((e.dim(), e.max_tokens()), (HIDDEN, 8));
    let short = e.tokenize("The cat sat.").unwrap();
    assert_eq!(short, Tokenized { ids: vec![2, 4, 5, 6, 17, 3], tokens: 6, truncated: false });
    let long = e.tokenize("the cat sat on the mat , the dog ran far").unwrap();
    assert_eq!(long.ids, [2, 4, 5, 6, 7, 4, 8, 3], "cut to 8 keeping the final [SEP]");
    assert_eq!((long.tokens, long.truncated), (13, true));
    // A huge text is read only up to max_tokens × MAX_BYTES_PER_TOKEN bytes, and says so.
    let huge = "cat ".repeat(100_000);
    let t = e.tokenize(&huge).unwrap();
    assert!(t.truncated && t.ids.len() == 8 && t.tokens <= 8 * MAX_BYTES_PER_TOKEN, "{}", t.tokens);
    // A cut inside a multi-byte character is moved back to its start.
    let accented = "é".repeat(8 * MAX_BYTES_PER_TOKEN);
    assert!(e.tokenize(&accented).unwrap().truncated);
}

#[test]
fn loading_reports_what_is_missing() {
    let dir = tiny_model("missing");
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    let err = Encoder::load(&dir).unwrap_err();
    assert!(matches!(&err, EmbedError::Load(m) if m.contains("tokenizer.json")), "{err}");
    let err = Encoder::load(Path::new("/nonexistent/model")).unwrap_err();
    assert!(matches!(&err, EmbedError::Load(m) if m.contains("config.json")), "{err}");
}

#[cfg(not(feature = "candle"))]
#[tokio::test]
async fn without_the_model_runtime_every_embedding_is_an_error() {
    let pool = EmbedPool::new(Arc::new(Encoder::load(&tiny_model("nobuild")).unwrap()), PoolConfig::default()).unwrap();
    assert_eq!(pool.embed("the cat").await, Err(EmbedError::NotBuilt));
    assert_eq!(pool.stats().errors.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(pool.cached(), 0, "failures are not cached");
}

#[cfg(feature = "candle")]
mod with_model {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use super::*;

    fn cosine(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    #[test]
    fn embeddings_are_unit_length_deterministic_and_independent_of_the_batch() {
        let e = Encoder::load(&tiny_model("unit")).unwrap();
        let alone = e.embed_batch(&["the cat sat"]).unwrap();
        let batch = e.embed_batch(&["the cat sat", "a dog ran far on the mat", ""]).unwrap();
        let v = &alone[0].vector;
        assert_eq!(v.len(), HIDDEN);
        assert!((cosine(v, v) - 1.0).abs() < 1e-5);
        // Padding to the batch's longest changes nothing (the mask hides it).
        for (a, b) in v.iter().zip(batch[0].vector.iter()) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
        assert_eq!(e.embed_batch(&["the cat sat"]).unwrap(), alone);
        assert!(cosine(v, &batch[1].vector) < 0.9999, "different texts, different vectors");
        assert_eq!(batch[2].tokens, 2, "an empty text is [CLS] [SEP]");
    }

    #[tokio::test]
    async fn the_pool_caches_by_text_and_counts() {
        let encoder = Arc::new(Encoder::load(&tiny_model("pool")).unwrap());
        let pool = EmbedPool::new(encoder.clone(), PoolConfig::default()).unwrap();
        let first = pool.embed("the cat sat").await.unwrap();
        assert!(!first.cached);
        assert_eq!(first.embedded, encoder.embed_batch(&["the cat sat"]).unwrap()[0]);
        let again = pool.embed("the cat sat").await.unwrap();
        assert!(again.cached && again.embedded == first.embedded);
        let long = pool.embed("the cat sat on the mat , the dog ran far").await.unwrap();
        assert!(long.embedded.truncated);
        let s = pool.stats();
        let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        assert_eq!((n(&s.requests), n(&s.cache_hits), n(&s.computed), n(&s.truncated)), (3, 1, 2, 1));
        assert_eq!(pool.cached(), 2);
        assert_eq!(pool.embed_now(&["the cat sat", "a dog"]).unwrap()[0], first.embedded, "through the cache");
    }

    #[tokio::test]
    async fn a_full_queue_refuses_at_once_and_a_slow_answer_times_out() {
        let encoder = Arc::new(Encoder::load(&tiny_model("busy")).unwrap());
        let config = PoolConfig { queue: 1, batch: 1, cache_entries: 0, timeout: Duration::from_secs(30), threads: 1 };
        let pool = EmbedPool::new(encoder.clone(), config).unwrap();
        // Many at once into a queue of one: some are refused, none waits for long, the rest are answered.
        let texts: Vec<String> = (0..64).map(|i| format!("the cat {}", "sat ".repeat(i % 5))).collect();
        let all = futures_util::future::join_all(texts.iter().map(|t| pool.embed(t))).await;
        let busy = all.iter().filter(|r| matches!(r, Err(EmbedError::Busy(1)))).count();
        let ok = all.iter().filter(|r| r.is_ok()).count();
        assert!(busy > 0 && ok > 0 && busy + ok == 64, "busy {busy}, ok {ok}");
        assert_eq!(pool.stats().busy.load(Ordering::Relaxed), busy as u64);
        // A burst with a timeout of 1 ms: the callers behind give up, counted; the pool goes on.
        let hasty =
            EmbedPool::new(encoder, PoolConfig { timeout: Duration::from_millis(1), queue: 256, ..config }).unwrap();
        let texts: Vec<String> = (0..256).map(|i| format!("the dog {}", "ran far ".repeat(i % 3))).collect();
        let all = futures_util::future::join_all(texts.iter().map(|t| hasty.embed(t))).await;
        let late = all.iter().filter(|r| matches!(r, Err(EmbedError::Timeout(1)))).count();
        assert!(late > 0 && all.iter().all(|r| r.is_ok() || r == &Err(EmbedError::Timeout(1))), "{late}");
        assert_eq!(hasty.stats().timeouts.load(Ordering::Relaxed), late as u64);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(hasty.waiting(), 0, "the abandoned jobs were skipped or finished");
    }

    #[test]
    fn the_int8_and_int16_kernels_sum_exactly_on_every_shape() {
        // Rows beyond a multiple of 8, k beyond a multiple of 4, n beyond a panel of 32, and
        // the encoder's own shapes (384 and 1536 inputs, a head of 32, a sequence of 256).
        let shapes = [(1, 1, 1), (3, 5, 7), (8, 32, 32), (9, 33, 65), (17, 384, 100), (256, 32, 256), (13, 1536, 40)];
        let mut rng = router_types::SplitMix::new(1);
        for &(m, k, n) in &shapes {
            let a8: Vec<u8> = (0..m * k).map(|_| rng.next_u64() as u8).collect();
            let b8: Vec<i8> = (0..k * n).map(|_| rng.next_u64() as i8).collect();
            // 16 bits bounded so that k products cannot overflow 32 bits (the encoder's
            // probabilities sum to 32767).
            let bound = ((i32::MAX as f64 / k as f64).sqrt() as u64).min(32767);
            let mut wide = || (rng.below(2 * bound + 1) as i64 - bound as i64) as i16;
            let a16: Vec<i16> = (0..m * k).map(|_| wide()).collect();
            let b16: Vec<i16> = (0..k * n).map(|_| wide()).collect();
            for (bits, sums) in [
                (8, embed::testing::int8_gemm_sums(&a8, &b8, (m, k, n))),
                (16, embed::testing::int16_gemm_sums(&a16, &b16, (m, k, n))),
            ] {
                let (vnni, portable, naive) = sums;
                assert_eq!(portable, naive, "{bits}-bit portable kernel, {m}x{k}x{n}");
                if let Some(vnni) = vnni {
                    assert_eq!(vnni, naive, "{bits}-bit VNNI kernel, {m}x{k}x{n}");
                }
            }
        }
    }

    #[test]
    fn int8_embeddings_follow_f32_and_do_not_depend_on_the_batch() {
        let dir = tiny_model("int8");
        let (f32, int8) =
            (Encoder::load_with(&dir, Precision::F32).unwrap(), Encoder::load_with(&dir, Precision::Int8).unwrap());
        assert_eq!((f32.precision(), int8.precision()), (Precision::F32, Precision::Int8));
        let texts = ["the cat sat", "a dog ran far on the mat", "how do i solve this integral of x ?", ""];
        let (want, got) = (f32.embed_batch(&texts).unwrap(), int8.embed_batch(&texts).unwrap());
        for ((w, g), text) in want.iter().zip(&got).zip(texts) {
            let c = cosine(&w.vector, &g.vector);
            assert!(c > 0.99, "{text:?}: cosine {c}");
            assert!((cosine(&g.vector, &g.vector) - 1.0).abs() < 1e-5, "unit length");
            assert_eq!((w.tokens, w.truncated), (g.tokens, g.truncated));
        }
        // No padding: a text's vector is the same, to the bit, alone or in any batch.
        for (i, text) in texts.iter().enumerate() {
            assert_eq!(int8.embed_batch(&[text]).unwrap()[0], got[i], "{text:?}");
        }
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            Precision::Auto.resolve() == Precision::Int8,
            std::arch::is_x86_feature_detected!("avx512vnni") && std::arch::is_x86_feature_detected!("avx512bw")
        );
        assert_eq!("int8".parse::<Precision>(), Ok(Precision::Int8));
        assert!("fp16".parse::<Precision>().is_err());
    }

    /// The real model against the numpy reference, when its directory is given.
    #[test]
    fn the_real_model_equals_the_independent_reference() {
        let Some(dir) = std::env::var_os("SGL_ROUTER_EMBED_MODEL") else {
            eprintln!("SGL_ROUTER_EMBED_MODEL unset: the real-model comparison is skipped");
            return;
        };
        let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/embed/minilm_reference.json");
        let reference: serde_json::Value = serde_json::from_slice(&std::fs::read(fixture).unwrap()).unwrap();
        let e = Encoder::load_with(Path::new(&dir), Precision::F32).unwrap();
        assert_eq!(e.max_tokens(), reference["max_seq_length"].as_u64().unwrap() as usize);
        let cases = reference["cases"].as_array().unwrap();
        let texts: Vec<&str> = cases.iter().map(|c| c["text"].as_str().unwrap()).collect();
        let got = e.embed_batch(&texts).unwrap();
        let mut worst = 0f32;
        for (case, g) in cases.iter().zip(&got) {
            let ids: Vec<u32> = case["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
            let t = e.tokenize(case["text"].as_str().unwrap()).unwrap();
            assert_eq!(t.ids, ids, "{}", case["text"]);
            assert_eq!(g.truncated, case["truncated"].as_bool().unwrap(), "{}", case["text"]);
            assert_eq!(g.tokens as u64, case["tokens_untruncated"].as_u64().unwrap(), "{}", case["text"]);
            let want: Vec<f32> =
                case["embedding"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
            for (a, b) in g.vector.iter().zip(&want) {
                worst = worst.max((a - b).abs());
            }
            assert!(cosine(&g.vector, &want) > 0.99999, "{}", case["text"]);
        }
        eprintln!("{} texts, largest difference from the reference {worst:e}", cases.len());
        assert!(worst < 1e-5, "{worst}");
        // int8: within the fidelity bound of docs/model-routing.md (cosine 0.99) of the reference
        // (the empty text, two tokens, is the farthest: 0.9908; the others 0.997 and more).
        let int8 = Encoder::load_with(Path::new(&dir), Precision::Int8).unwrap().embed_batch(&texts).unwrap();
        let mut least = 1f32;
        for (case, g) in cases.iter().zip(&int8) {
            let want: Vec<f32> =
                case["embedding"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
            least = least.min(cosine(&g.vector, &want));
        }
        eprintln!("int8: least cosine to the reference {least}");
        assert!(least >= 0.99, "{least}");
    }
}
