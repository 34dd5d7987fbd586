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
    tokenizer.with_normalizer(Some(BertNormalizer::new(true, true, None, true))).expect("writing the tiny model");
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

/// A kernel check's sums, row-major `m` × `n`: `(vnni, portable, naive)`, the
/// first `None` on a CPU without AVX-512 VNNI. All three must be equal
/// (integer arithmetic).
pub type Sums = (Option<Vec<i32>>, Vec<i32>, Vec<i32>);

/// The int8 kernel's sums of `a` (`m` × `k` unsigned bytes, row-major) by `b`
/// (`k` × `n` signed bytes, row-major), `b` packed as the encoder packs weights.
#[cfg(feature = "candle")]
pub fn int8_gemm_sums(a: &[u8], b: &[i8], (m, k, n): (usize, usize, usize)) -> Sums {
    let cols: Vec<i8> = (0..n).flat_map(|c| (0..k).map(move |r| b[r * n + c])).collect();
    sums(a, b, (m, k, n), crate::int8::gemm::Packed::from_cols(k, n, &cols))
}

/// As [`int8_gemm_sums`] for the 16-bit kernel (the attention's probabilities by
/// values), `b` packed as the encoder packs values.
#[cfg(feature = "candle")]
pub fn int16_gemm_sums(a: &[i16], b: &[i16], (m, k, n): (usize, usize, usize)) -> Sums {
    let mut packed = crate::int8::gemm::Packed::default();
    packed.pack_rows(k, n, b);
    sums(a, b, (m, k, n), packed)
}

/// `a` by `packed` (which holds `b`) through the kernel, with a row stride longer
/// than a row, against the naive sums.
#[cfg(feature = "candle")]
fn sums<T: crate::int8::gemm::Lane>(
    a: &[T::A],
    b: &[T],
    (m, k, n): (usize, usize, usize),
    packed: crate::int8::gemm::Packed<T>,
) -> Sums {
    use crate::int8::gemm::{gemm, has_vnni, round_up};
    let lda = round_up(k, T::K) + T::K;
    let mut strided = vec![T::A::default(); m * lda];
    for (row, src) in strided.chunks_exact_mut(lda).zip(a.chunks_exact(k.max(1))) {
        row[..k].copy_from_slice(&src[..k]);
    }
    let ldc = packed.n_padded();
    let run = |vnni: bool| {
        let mut c = vec![i32::MIN; m * ldc];
        gemm(&strided, lda, m, &packed, &mut c, vnni);
        (0..m).flat_map(|i| c[i * ldc..i * ldc + n].to_vec()).collect::<Vec<i32>>()
    };
    let naive = (0..m)
        .flat_map(|i| (0..n).map(move |j| (i, j)))
        .map(|(i, j)| (0..k).map(|r| a[i * k + r].into() * b[r * n + j].into()).sum())
        .collect();
    (has_vnni().then(|| run(true)), run(false), naive)
}
