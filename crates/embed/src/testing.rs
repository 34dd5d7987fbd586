//! A tiny sentence-transformers model for tests in this crate and others:
//! its config, a WordPiece tokenizer of a few words and random weights.
//! Not for production (its vectors mean nothing).

use std::path::{Path, PathBuf};

use tokenizers::models::wordpiece::WordPiece;
use tokenizers::normalizers::BertNormalizer;
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::processors::bert::BertProcessing;

/// The tiny model's vocabulary.
pub const WORDS: &[&str] = &[
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "cat", "sat", "on", "mat", "a", "dog", "ran", "far", "integral", "of",
    "x", "##s", ".", ",", "?", "how", "do", "i", "solve", "this",
];
/// The tiny model's vector length.
pub const HIDDEN: usize = 16;
/// The tiny model's positions.
pub const MAX_POSITIONS: usize = 12;

/// A tiny model's directory, removed when this is dropped (keep it while the model is read).
#[derive(Debug)]
pub struct TinyModel(PathBuf);

impl std::ops::Deref for TinyModel {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TinyModel {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TinyModel {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh directory under the temporary directory holding a tiny model
/// named `name` (`max_seq_length` 8, 16 dimensions, random weights; with
/// the `candle` feature off, an empty weights file: loading never reads it).
pub fn tiny_model(name: &str) -> TinyModel {
    let dir = std::env::temp_dir().join(format!("embed-tiny-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("writing the tiny model");
    let config = serde_json::json!({
        "vocab_size": WORDS.len(), "hidden_size": HIDDEN, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 32, "max_position_embeddings": MAX_POSITIONS, "type_vocab_size": 2,
        "layer_norm_eps": 1e-12, "hidden_act": "gelu", "position_embedding_type": "absolute", "model_type": "bert"
    });
    std::fs::write(dir.join("config.json"), config.to_string()).expect("writing the tiny model");
    std::fs::write(dir.join("sentence_bert_config.json"), r#"{"max_seq_length": 8, "do_lower_case": false}"#)
        .expect("writing the tiny model");
    let vocab: ahash::AHashMap<String, u32> =
        WORDS.iter().enumerate().map(|(i, w)| (w.to_string(), i as u32)).collect();
    let model = WordPiece::builder().vocab(vocab).unk_token("[UNK]".into()).build().expect("writing the tiny model");
    let mut tokenizer = tokenizers::Tokenizer::new(model);
    tokenizer.with_normalizer(Some(BertNormalizer::new(true, true, None, true)));
    tokenizer.with_pre_tokenizer(Some(BertPreTokenizer));
    tokenizer.with_post_processor(Some(BertProcessing::new(("[SEP]".into(), 3), ("[CLS]".into(), 2))));
    tokenizer.save(dir.join("tokenizer.json"), false).expect("writing the tiny model");
    write_weights(&dir);
    TinyModel(dir)
}

#[cfg(feature = "candle")]
fn write_weights(dir: &Path) {
    use candle_core::{DType, Device};
    let varmap = candle_nn::VarMap::new();
    let vb = candle_nn::VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let config: crate::bert::BertConfig =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).expect("writing the tiny model"))
            .expect("writing the tiny model");
    crate::bert::Bert::load(vb, &config).expect("writing the tiny model");
    varmap.save(dir.join("model.safetensors")).expect("writing the tiny model");
}

#[cfg(not(feature = "candle"))]
fn write_weights(dir: &Path) {
    // Without the model runtime the weights are never read, only looked for.
    std::fs::write(dir.join("model.safetensors"), b"").expect("writing the tiny model");
}

/// The int8 kernel's sums for an `m` × `k` by `k` × `n` product of bytes drawn
/// from `seed`: `(vnni, portable, naive)`, the first `None` on a CPU without
/// AVX-512 VNNI. All three must be equal (integer arithmetic).
#[cfg(feature = "candle")]
#[allow(clippy::type_complexity)]
pub fn int8_gemm_sums(m: usize, k: usize, n: usize, seed: u64) -> (Option<Vec<i32>>, Vec<i32>, Vec<i32>) {
    use crate::int8::gemm::{Packed, gemm, has_vnni, round_up};
    let mut rng = split_mix(seed);
    let mut next = move || rng() as u8;
    let lda = round_up(k, 4) + 4;
    let a: Vec<u8> = (0..m * lda).map(|_| next()).collect();
    let b: Vec<i8> = (0..k * n).map(|_| next() as i8).collect();
    // B packed from its rows and from its columns must be the same.
    let mut by_rows = Packed::default();
    by_rows.pack_rows(k, n, &b);
    let cols: Vec<i8> = (0..n).flat_map(|c| (0..k).map(move |r| (r, c))).map(|(r, c)| b[r * n + c]).collect();
    let by_cols = Packed::from_cols(k, n, &cols);
    assert_eq!(by_rows.col_sum, by_cols.col_sum, "column sums");
    let ldc = by_rows.n_padded();
    let run = |vnni: bool| {
        let mut c = vec![i32::MIN; m * ldc];
        gemm(&a, lda, m, &by_rows, &mut c, vnni);
        let mut again = vec![i32::MAX; m * ldc];
        gemm(&a, lda, m, &by_cols, &mut again, vnni);
        assert_eq!(c, again, "B packed by rows and by columns");
        (0..m).flat_map(|i| c[i * ldc..i * ldc + n].to_vec()).collect::<Vec<i32>>()
    };
    let naive = (0..m)
        .flat_map(|i| (0..n).map(move |j| (i, j)))
        .map(|(i, j)| (0..k).map(|r| i32::from(a[i * lda + r]) * i32::from(b[r * n + j])).sum())
        .collect();
    (has_vnni().then(|| run(true)), run(false), naive)
}

/// As [`int8_gemm_sums`] for the 16-bit kernel (the attention's probabilities by values): signed
/// 16-bit `A` and `B` drawn from `seed`, `(vnni, portable, naive)`.
#[cfg(feature = "candle")]
#[allow(clippy::type_complexity)]
pub fn int16_gemm_sums(m: usize, k: usize, n: usize, seed: u64) -> (Option<Vec<i32>>, Vec<i32>, Vec<i32>) {
    use crate::int8::gemm::{Packed16, gemm16, has_vnni, round_up};
    let mut rng = split_mix(seed);
    // Bounded so that k products cannot overflow 32 bits (the encoder's probabilities sum to 32767).
    let bound = (i32::MAX as f64 / k.max(1) as f64).sqrt().min(32767.0) as i32;
    let mut draw = move || ((rng() % (2 * bound as u64 + 1)) as i32 - bound) as i16;
    let lda = round_up(k, 2) + 2;
    let a: Vec<i16> = (0..m * lda).map(|_| draw()).collect();
    let b: Vec<i16> = (0..k * n).map(|_| draw()).collect();
    let mut packed = Packed16::default();
    packed.pack_rows(k, n, &b);
    let ldc = packed.n_padded();
    let run = |vnni: bool| {
        let mut c = vec![i32::MIN; m * ldc];
        gemm16(&a, lda, m, &packed, &mut c, vnni);
        (0..m).flat_map(|i| c[i * ldc..i * ldc + n].to_vec()).collect::<Vec<i32>>()
    };
    let naive = (0..m)
        .flat_map(|i| (0..n).map(move |j| (i, j)))
        .map(|(i, j)| (0..k).map(|r| i32::from(a[i * lda + r]) * i32::from(b[r * n + j])).sum())
        .collect();
    (has_vnni().then(|| run(true)), run(false), naive)
}

/// A SplitMix64 stream from `seed`.
#[cfg(feature = "candle")]
fn split_mix(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed;
    move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}
