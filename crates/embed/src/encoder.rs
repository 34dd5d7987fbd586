//! A sentence-transformers model directory, loaded: its tokenizer (HF
//! `tokenizer.json`, truncated at the model's `max_seq_length`, truncation
//! counted) and its BERT encoder (with the `candle` feature). Owns the model;
//! runs on whatever thread calls it (the pool's, see `pool`).

use std::path::{Path, PathBuf};

use serde::Deserialize;
use tokenizers::Tokenizer;

use crate::{EmbedError, Embedded};

/// The longest input sentence-transformers feeds all-MiniLM-L6-v2 when the
/// directory does not say (`sentence_bert_config.json`'s `max_seq_length`).
pub const DEFAULT_MAX_SEQ_LENGTH: usize = 256;

/// How many bytes of text per token the tokenizer is given at most: a text
/// longer than `max_tokens` times this is cut before tokenizing (and counted truncated).
pub const MAX_BYTES_PER_TOKEN: usize = 64;

/// The longest prefix of `text` of at most `max` bytes that ends on a char boundary.
fn prefix(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A loaded model.
#[derive(Debug)]
pub struct Encoder {
    tokenizer: Tokenizer,
    max_tokens: usize,
    dim: usize,
    dir: PathBuf,
    precision: Precision,
    #[cfg(feature = "candle")]
    model: Model,
}

/// How the encoder computes (`--embedding-precision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// `int8` where the CPU has AVX-512 VNNI, else `f32`.
    #[default]
    Auto,
    /// Matrix products in int8 (docs/model-routing.md: the fidelity table);
    /// without AVX-512 VNNI the same sums in portable code, several times slower.
    Int8,
    /// Everything in f32 (candle's CPU backend): the reference.
    F32,
}

impl Precision {
    /// What `Auto` means on this CPU (the others as they are).
    pub fn resolve(self) -> Precision {
        match self {
            #[cfg(feature = "candle")]
            Precision::Auto if crate::int8::has_vnni() => Precision::Int8,
            Precision::Auto => Precision::F32,
            other => other,
        }
    }

    /// Its name (`auto`, `int8`, `f32`).
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Auto => "auto",
            Precision::Int8 => "int8",
            Precision::F32 => "f32",
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = String;

    fn from_str(s: &str) -> Result<Precision, String> {
        match s {
            "auto" => Ok(Precision::Auto),
            "int8" => Ok(Precision::Int8),
            "f32" => Ok(Precision::F32),
            other => Err(format!("unknown embedding precision {other:?} (auto, int8, f32)")),
        }
    }
}

#[cfg(feature = "candle")]
#[derive(Debug)]
enum Model {
    F32(crate::bert::Bert),
    Int8(crate::int8::Bert),
}

/// A text as the model reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tokenized {
    /// The ids fed to the model ([CLS] … [SEP]), at most `max_tokens`.
    pub ids: Vec<u32>,
    /// Tokens in the text the tokenizer read (before the cut to `max_tokens`).
    pub tokens: usize,
    /// Some of the text was not read: more than `max_tokens` tokens, or longer
    /// than `max_tokens` × [`MAX_BYTES_PER_TOKEN`] bytes.
    pub truncated: bool,
}

/// The sizes of `config.json` every build reads.
#[derive(Deserialize)]
struct Sizes {
    hidden_size: usize,
    max_position_embeddings: usize,
}

#[derive(Deserialize)]
struct SentenceConfig {
    max_seq_length: Option<usize>,
}

// === impl Encoder ===

impl Encoder {
    /// Loads `dir` at [`Precision::Auto`].
    pub fn load(dir: &Path) -> Result<Encoder, EmbedError> {
        Encoder::load_with(dir, Precision::Auto)
    }

    /// Loads `dir`: `config.json`, `model.safetensors`, `tokenizer.json` and,
    /// if present, `sentence_bert_config.json`; the weights quantized when
    /// `precision` resolves to `Int8`.
    pub fn load_with(dir: &Path, precision: Precision) -> Result<Encoder, EmbedError> {
        let precision = precision.resolve();
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read(&path).map_err(|e| EmbedError::Load(format!("{}: {e}", path.display())))
        };
        let config_bytes = read("config.json")?;
        let bad_config = |e: serde_json::Error| EmbedError::Load(format!("{}/config.json: {e}", dir.display()));
        let config: Sizes = serde_json::from_slice(&config_bytes).map_err(bad_config)?;
        let sentence: Option<SentenceConfig> =
            std::fs::read(dir.join("sentence_bert_config.json")).ok().and_then(|b| serde_json::from_slice(&b).ok());
        let max_tokens = sentence
            .and_then(|s| s.max_seq_length)
            .unwrap_or(DEFAULT_MAX_SEQ_LENGTH)
            .min(config.max_position_embeddings)
            .max(2);
        let mut tokenizer = Tokenizer::from_bytes(read("tokenizer.json")?)
            .map_err(|e| EmbedError::Load(format!("{}/tokenizer.json: {e}", dir.display())))?;
        // The file's own padding and truncation (all-MiniLM-L6-v2's pads every input to 128
        // and cuts there) are not sentence-transformers': it pads a batch to its longest and
        // cuts at max_seq_length. We cut ourselves, to count it.
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(None)
            .map_err(|e| EmbedError::Load(format!("{}/tokenizer.json: {e}", dir.display())))?;
        #[cfg(feature = "candle")]
        let model = {
            let device = candle_core::Device::Cpu;
            let vb = candle_nn::VarBuilder::from_buffered_safetensors(
                read("model.safetensors")?,
                candle_core::DType::F32,
                &device,
            )
            .map_err(|e| EmbedError::Load(format!("{}/model.safetensors: {e}", dir.display())))?;
            let vb = if vb.contains_tensor("bert.embeddings.word_embeddings.weight") { vb.pp("bert") } else { vb };
            let bert_config: crate::bert::BertConfig = serde_json::from_slice(&config_bytes).map_err(bad_config)?;
            let model = match precision {
                Precision::Int8 => crate::int8::Bert::load(vb, &bert_config, crate::int8::has_vnni()).map(Model::Int8),
                _ => crate::bert::Bert::load(vb, &bert_config).map(Model::F32),
            };
            model.map_err(|e| EmbedError::Load(format!("{}/model.safetensors: {e}", dir.display())))?
        };
        #[cfg(not(feature = "candle"))]
        if !dir.join("model.safetensors").is_file() {
            return Err(EmbedError::Load(format!("{}/model.safetensors: not found", dir.display())));
        }
        Ok(Encoder {
            tokenizer,
            max_tokens,
            dim: config.hidden_size,
            dir: dir.to_owned(),
            precision,
            #[cfg(feature = "candle")]
            model,
        })
    }

    /// The vector length.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The longest input in tokens ([CLS] and [SEP] included); longer ones are cut.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// How it computes (`Int8` or `F32`: `Auto` resolved at load).
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Where it was loaded from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `text` as the model sees it: its token ids cut to
    /// [`max_tokens`](Self::max_tokens) (keeping the final [SEP]).
    pub fn tokenize(&self, text: &str) -> Result<Tokenized, EmbedError> {
        // Whatever the length of the text, the model reads `max_tokens` of it: the tokenizer
        // reads a bounded prefix (a word piece is rarely longer than 16 bytes).
        let read = prefix(text, self.max_tokens * MAX_BYTES_PER_TOKEN);
        let encoding = self.tokenizer.encode(read, true).map_err(|e| EmbedError::Tokenize(e.to_string()))?;
        let ids = encoding.get_ids();
        let tokens = ids.len();
        let truncated = tokens > self.max_tokens || read.len() < text.len();
        let ids = if tokens > self.max_tokens {
            let mut cut = ids[..self.max_tokens - 1].to_vec();
            cut.push(ids[tokens - 1]);
            cut
        } else {
            ids.to_vec()
        };
        Ok(Tokenized { ids, tokens, truncated })
    }

    /// One embedding per text, computed together (padded to the longest).
    pub fn embed_batch(&self, texts: &[&str]) -> Result<Vec<Embedded>, EmbedError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let tokenized = texts.iter().map(|t| self.tokenize(t)).collect::<Result<Vec<_>, _>>()?;
        let vectors = self.run(&tokenized)?;
        Ok(tokenized
            .iter()
            .zip(vectors)
            .map(|(t, v)| Embedded { vector: v.into(), tokens: t.tokens, truncated: t.truncated })
            .collect())
    }

    #[cfg(feature = "candle")]
    fn run(&self, tokenized: &[Tokenized]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let seqs: Vec<&[u32]> = tokenized.iter().map(|t| t.ids.as_slice()).collect();
        let vectors = match &self.model {
            Model::F32(bert) => bert.embed(&seqs),
            Model::Int8(bert) => bert.embed(&seqs),
        };
        vectors.map_err(|e| EmbedError::Model(e.to_string()))
    }

    #[cfg(not(feature = "candle"))]
    fn run(&self, _tokenized: &[Tokenized]) -> Result<Vec<Vec<f32>>, EmbedError> {
        Err(EmbedError::NotBuilt)
    }
}
