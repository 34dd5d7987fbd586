//! The BERT encoder of a sentence-transformers model (all-MiniLM-L6-v2's
//! shape: absolute positions, post-LayerNorm, exact GELU) on candle's CPU
//! backend, and the mean pooling over the attention mask with L2
//! normalisation that the model's sentence-transformers modules apply. Owns
//! the weights; knows nothing of tokens beyond their ids.

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{Embedding, LayerNorm, Linear, VarBuilder, embedding, layer_norm, linear};
use serde::Deserialize;

/// The fields of a HF BERT `config.json` the encoder reads.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub(crate) struct BertConfig {
    pub(crate) vocab_size: usize,
    pub(crate) hidden_size: usize,
    pub(crate) num_hidden_layers: usize,
    pub(crate) num_attention_heads: usize,
    pub(crate) intermediate_size: usize,
    pub(crate) max_position_embeddings: usize,
    #[serde(default = "two")]
    pub(crate) type_vocab_size: usize,
    #[serde(default = "eps")]
    pub(crate) layer_norm_eps: f64,
    #[serde(default = "gelu")]
    pub(crate) hidden_act: String,
    #[serde(default = "absolute")]
    pub(crate) position_embedding_type: String,
}

fn two() -> usize {
    2
}
fn eps() -> f64 {
    1e-12
}
fn gelu() -> String {
    "gelu".to_owned()
}
fn absolute() -> String {
    "absolute".to_owned()
}

/// The encoder.
#[derive(Debug)]
pub(crate) struct Bert {
    words: Embedding,
    positions: Embedding,
    types: Embedding,
    norm: LayerNorm,
    layers: Vec<Layer>,
    heads: usize,
    head_dim: usize,
    device: Device,
}

#[derive(Debug)]
struct Layer {
    query: Linear,
    key: Linear,
    value: Linear,
    attn_out: Linear,
    attn_norm: LayerNorm,
    up: Linear,
    down: Linear,
    out_norm: LayerNorm,
}

/// Why the encoder failed (candle's error, as text).
pub(crate) type Result<T> = std::result::Result<T, candle_core::Error>;

impl Bert {
    /// Loads the weights under `vb` (HF names: `embeddings.*`, `encoder.layer.N.*`).
    pub(crate) fn load(vb: VarBuilder<'_>, c: &BertConfig) -> Result<Bert> {
        if c.hidden_act != "gelu" || c.position_embedding_type != "absolute" {
            candle_core::bail!(
                "unsupported BERT variant: hidden_act {} with {} positions (gelu, absolute supported)",
                c.hidden_act,
                c.position_embedding_type
            );
        }
        if c.num_attention_heads == 0 || !c.hidden_size.is_multiple_of(c.num_attention_heads) {
            candle_core::bail!("{} heads do not divide a hidden size of {}", c.num_attention_heads, c.hidden_size);
        }
        let h = c.hidden_size;
        let e = vb.pp("embeddings");
        let layers = (0..c.num_hidden_layers)
            .map(|i| {
                let l = vb.pp(format!("encoder.layer.{i}"));
                let a = l.pp("attention");
                Ok(Layer {
                    query: linear(h, h, a.pp("self.query"))?,
                    key: linear(h, h, a.pp("self.key"))?,
                    value: linear(h, h, a.pp("self.value"))?,
                    attn_out: linear(h, h, a.pp("output.dense"))?,
                    attn_norm: layer_norm(h, c.layer_norm_eps, a.pp("output.LayerNorm"))?,
                    up: linear(h, c.intermediate_size, l.pp("intermediate.dense"))?,
                    down: linear(c.intermediate_size, h, l.pp("output.dense"))?,
                    out_norm: layer_norm(h, c.layer_norm_eps, l.pp("output.LayerNorm"))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Bert {
            words: embedding(c.vocab_size, h, e.pp("word_embeddings"))?,
            positions: embedding(c.max_position_embeddings, h, e.pp("position_embeddings"))?,
            types: embedding(c.type_vocab_size, h, e.pp("token_type_embeddings"))?,
            norm: layer_norm(h, c.layer_norm_eps, e.pp("LayerNorm"))?,
            layers,
            heads: c.num_attention_heads,
            head_dim: h / c.num_attention_heads,
            device: vb.device().clone(),
        })
    }

    /// One unit-length sentence vector per sequence of ids (padded here to the
    /// longest, the padding masked): the last hidden states averaged over the
    /// real tokens, then L2-normalised.
    pub(crate) fn embed(&self, seqs: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        let width = seqs.iter().map(|s| s.len()).max().unwrap_or(0);
        let lens: Vec<usize> = seqs.iter().map(|s| s.len()).collect();
        let mut ids = Vec::with_capacity(width * seqs.len());
        for s in seqs {
            ids.extend_from_slice(s);
            ids.resize(ids.len() + width - s.len(), 0);
        }
        let batch = lens.len();
        let ids = Tensor::from_slice(&ids, (batch, width), &self.device)?;
        let mask: Vec<f32> =
            lens.iter().flat_map(|&n| (0..width).map(move |j| if j < n { 1.0 } else { 0.0 })).collect();
        let mask = Tensor::from_vec(mask, (batch, width), &self.device)?;
        let positions = Tensor::arange(0u32, width as u32, &self.device)?.unsqueeze(0)?.broadcast_as((batch, width))?;
        let types = ids.zeros_like()?;
        let mut x = self.words.forward(&ids)?;
        x = ((x + self.positions.forward(&positions)?)? + self.types.forward(&types)?)?;
        x = self.norm.forward(&x)?;
        // Padding adds a large negative score before the softmax (HF: (1 - mask) * finfo.min).
        let bias = ((mask.ones_like()? - &mask)? * f64::from(f32::MIN))?.reshape((batch, 1, 1, width))?;
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        for l in &self.layers {
            let split = |t: Tensor| -> Result<Tensor> {
                t.reshape((batch, width, self.heads, self.head_dim))?.transpose(1, 2)?.contiguous()
            };
            let q = split(l.query.forward(&x)?)?;
            let k = split(l.key.forward(&x)?)?;
            let v = split(l.value.forward(&x)?)?;
            let scores = (q.matmul(&k.t()?)? * scale)?.broadcast_add(&bias)?;
            let probs = candle_nn::ops::softmax_last_dim(&scores)?;
            let context =
                probs.matmul(&v)?.transpose(1, 2)?.contiguous()?.reshape((batch, width, self.heads * self.head_dim))?;
            let attended = l.attn_norm.forward(&(l.attn_out.forward(&context)? + &x)?)?;
            let up = l.up.forward(&attended)?.gelu_erf()?;
            x = l.out_norm.forward(&(l.down.forward(&up)? + &attended)?)?;
        }
        let m = mask.unsqueeze(2)?;
        let summed = x.broadcast_mul(&m)?.sum(1)?;
        let counts = m.sum(1)?.clamp(1e-9, f64::MAX)?;
        let mean = summed.broadcast_div(&counts)?;
        let norm = mean.sqr()?.sum_keepdim(1)?.sqrt()?.clamp(1e-12, f64::MAX)?;
        mean.broadcast_div(&norm)?.to_dtype(DType::F32)?.to_vec2::<f32>()
    }
}
