//! The BERT encoder with int8 matrix products (`--embedding-precision int8`):
//! every linear layer's weights quantized once per output channel, the
//! activations per token over their own range, the attention's two products
//! per head (queries by keys in 8 bits, each per token; probabilities by values
//! in 16 bits, the probabilities to 1/32767, the values per dimension), sums in 32 bits, everything else (the
//! residual stream, LayerNorm, GELU, softmax, pooling) in f32. The sequences
//! of a batch are not padded: the linear layers run over all their tokens at
//! once, the attention per sequence. Owns the quantized weights.

pub(crate) mod gemm;
mod math;

use candle_core::Tensor;
use candle_nn::VarBuilder;

use self::gemm::{Packed, gemm, round_up};
use self::math::WIDE_MAX;
use crate::bert::{BertConfig, Result};

pub(crate) use self::gemm::has_vnni;

/// One linear layer: `y = x · Wᵀ + b`, `W` quantized per output row.
#[derive(Debug)]
struct Linear {
    w: Packed<i8>,
    scale: Vec<f32>,
    /// Each output's column sum times its scale: what an input's `low` adds to it.
    sum_scale: Vec<f32>,
    bias: Vec<f32>,
}

/// A LayerNorm's parameters.
#[derive(Debug)]
struct Norm {
    gamma: Vec<f32>,
    beta: Vec<f32>,
}

#[derive(Debug)]
struct Layer {
    /// Queries, keys and values in one product (`3 · hidden` outputs).
    qkv: Linear,
    attn_out: Linear,
    attn_norm: Norm,
    up: Linear,
    down: Linear,
    out_norm: Norm,
}

/// The encoder.
#[derive(Debug)]
pub(crate) struct Bert {
    words: Vec<f32>,
    positions: Vec<f32>,
    types: Vec<f32>,
    norm: Norm,
    layers: Vec<Layer>,
    hidden: usize,
    heads: usize,
    eps: f32,
    vnni: bool,
}

fn vec1(t: Tensor) -> Result<Vec<f32>> {
    t.flatten_all()?.to_vec1::<f32>()
}

impl Linear {
    /// From f32 rows `w` (`n` × `k`, one per output) and their bias.
    fn new(w: &[f32], bias: Vec<f32>, n: usize, k: usize) -> Linear {
        let mut q = vec![0i8; n * k];
        let scale: Vec<f32> =
            (0..n).map(|o| math::quantize_signed(&w[o * k..(o + 1) * k], &mut q[o * k..(o + 1) * k])).collect();
        let w = Packed::from_cols(k, n, &q);
        let sum_scale = w.col_sum.iter().zip(&scale).map(|(&cs, &s)| cs as f32 * s).collect();
        Linear { w, scale, sum_scale, bias }
    }

    fn load(vb: VarBuilder<'_>, n: usize, k: usize) -> Result<Linear> {
        let (w, bias) = Linear::part(vb, n, k)?;
        Ok(Linear::new(&w, bias, n, k))
    }

    /// Stacks layers with the same inputs (their outputs side by side).
    fn stack(parts: &[(Vec<f32>, Vec<f32>)], k: usize) -> Linear {
        let w: Vec<f32> = parts.iter().flat_map(|(w, _)| w.iter().copied()).collect();
        let bias: Vec<f32> = parts.iter().flat_map(|(_, b)| b.iter().copied()).collect();
        let n = bias.len();
        Linear::new(&w, bias, n, k)
    }

    fn part(vb: VarBuilder<'_>, n: usize, k: usize) -> Result<(Vec<f32>, Vec<f32>)> {
        Ok((vec1(vb.get((n, k), "weight")?)?, vec1(vb.get(n, "bias")?)?))
    }

    /// `out` (rows × n) = `x · Wᵀ + b`, plus `out`'s old values when `residual`.
    #[inline(always)]
    fn forward(&self, x: &Rows, out: &mut [f32], acc: &mut Vec<i32>, vnni: bool, residual: bool) {
        let (n, ldc) = (self.w.n(), self.w.n_padded());
        acc.resize(x.rows * ldc, 0);
        gemm(&x.data, x.lda, x.rows, &self.w, acc, vnni);
        for i in 0..x.rows {
            let (a, o) = (&acc[i * ldc..i * ldc + n], &mut out[i * n..(i + 1) * n]);
            let (sx, lo) = (x.scale[i], x.low[i]);
            let terms = a.iter().zip(&self.sum_scale).zip(&self.scale).zip(&self.bias);
            for (o, (((&a, &ss), &sw), &b)) in o.iter_mut().zip(terms) {
                // (a·sx + Σw·lo)·sw + b, as two fused multiply-adds.
                let y = (a as f32 * sx).mul_add(sw, lo.mul_add(ss, b));
                *o = if residual { *o + y } else { y };
            }
        }
    }
}

/// Rows of activations quantized each over its own range (`x ≈ scale · q + low`).
#[derive(Debug, Default)]
struct Rows {
    data: Vec<u8>,
    lda: usize,
    rows: usize,
    scale: Vec<f32>,
    low: Vec<f32>,
}

impl Rows {
    #[inline(always)]
    fn quantize(&mut self, x: &[f32], cols: usize) {
        self.rows = x.len() / cols;
        self.lda = round_up(cols, 4);
        self.data.clear();
        self.data.resize(self.rows * self.lda, 0);
        self.scale.clear();
        self.low.clear();
        for (row, out) in x.chunks_exact(cols).zip(self.data.chunks_exact_mut(self.lda)) {
            let (scale, low) = math::quantize_affine(row, out);
            self.scale.push(scale);
            self.low.push(low);
        }
    }
}

impl Norm {
    fn load(vb: VarBuilder<'_>, n: usize) -> Result<Norm> {
        Ok(Norm { gamma: vec1(vb.get(n, "weight")?)?, beta: vec1(vb.get(n, "bias")?)? })
    }

    #[inline(always)]
    fn apply(&self, x: &mut [f32], eps: f32) {
        for row in x.chunks_exact_mut(self.gamma.len()) {
            math::layer_norm(row, &self.gamma, &self.beta, eps);
        }
    }
}

/// One head's attention scratch, reused across heads and sequences.
#[derive(Debug, Default)]
struct Scratch {
    q: Vec<u8>,
    q_scale: Vec<f32>,
    q_low: Vec<f32>,
    k: Vec<i8>,
    k_scale: Vec<f32>,
    /// Each key's sum times its scale (what a query's `low` adds to its score).
    k_sum_scale: Vec<f32>,
    keys: Packed<i8>,
    v: Vec<i16>,
    v_inv: Vec<f32>,
    v_scale: Vec<f32>,
    values: Packed<i16>,
    p: Vec<i16>,
    scores: Vec<f32>,
    acc: Vec<i32>,
}

/// The encoder's pass as [`gemm::Pass`] (compiled into `with_avx512`).
struct Forward<'a> {
    bert: &'a Bert,
    seqs: &'a [&'a [u32]],
}

impl gemm::Pass for Forward<'_> {
    type Out = Result<Vec<Vec<f32>>>;

    #[inline(always)]
    fn run(self) -> Self::Out {
        self.bert.forward(self.seqs)
    }
}

impl Bert {
    /// Loads and quantizes the weights under `vb` (the names `bert::Bert::load` reads).
    pub(crate) fn load(vb: VarBuilder<'_>, c: &BertConfig, vnni: bool) -> Result<Bert> {
        let (h, inner) = (c.hidden_size, c.intermediate_size);
        let e = vb.pp("embeddings");
        let norm = Norm::load(e.pp("LayerNorm"), h)?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let l = vb.pp(format!("encoder.layer.{i}"));
            let a = l.pp("attention");
            let [q, k, v] = ["self.query", "self.key", "self.value"].map(|name| Linear::part(a.pp(name), h, h));
            let attn_norm = Norm::load(a.pp("output.LayerNorm"), h)?;
            layers.push(Layer {
                qkv: Linear::stack(&[q?, k?, v?], h),
                attn_out: Linear::load(a.pp("output.dense"), h, h)?,
                up: Linear::load(l.pp("intermediate.dense"), inner, h)?,
                attn_norm,
                down: Linear::load(l.pp("output.dense"), h, inner)?,
                out_norm: Norm::load(l.pp("output.LayerNorm"), h)?,
            });
        }
        let table = |name: &str, rows: usize| vec1(e.pp(name).get((rows, h), "weight")?);
        Ok(Bert {
            words: table("word_embeddings", c.vocab_size)?,
            positions: table("position_embeddings", c.max_position_embeddings)?,
            types: table("token_type_embeddings", c.type_vocab_size)?,
            norm,
            layers,
            hidden: h,
            heads: c.num_attention_heads,
            eps: c.layer_norm_eps as f32,
            vnni,
        })
    }

    /// One unit-length sentence vector per sequence of ids (each at most the
    /// model's positions long): the last hidden states averaged, L2-normalised.
    /// Compiled for AVX-512 (the element-wise steps too) when the CPU has VNNI.
    pub(crate) fn embed(&self, seqs: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        if self.vnni {
            return gemm::with_avx512(Forward { bert: self, seqs });
        }
        self.forward(seqs)
    }

    #[inline(always)]
    fn forward(&self, seqs: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        let h = self.hidden;
        let rows: usize = seqs.iter().map(|s| s.len()).sum();
        let mut x = Vec::with_capacity(rows * h);
        for s in seqs {
            for (pos, &id) in s.iter().enumerate() {
                let id = id as usize;
                if (id + 1) * h > self.words.len() || (pos + 1) * h > self.positions.len() {
                    candle_core::bail!("token id {id} at position {pos} is outside the model");
                }
                let (w, p, t) = (&self.words[id * h..][..h], &self.positions[pos * h..][..h], &self.types[..h]);
                x.extend(w.iter().zip(p).zip(t).map(|((w, p), t)| w + p + t));
            }
        }
        self.norm.apply(&mut x, self.eps);
        let (mut quant, mut acc, mut scratch) = (Rows::default(), Vec::new(), Scratch::default());
        let (mut qkv, mut ctx) = (vec![0f32; rows * 3 * h], vec![0f32; rows * h]);
        let mut up = vec![0f32; rows * self.layers.first().map_or(0, |l| l.up.w.n())];
        for l in &self.layers {
            quant.quantize(&x, h);
            l.qkv.forward(&quant, &mut qkv, &mut acc, self.vnni, false);
            let mut start = 0;
            for s in seqs {
                for head in 0..self.heads {
                    self.attend(&qkv, &mut ctx, start, s.len(), head, &mut scratch);
                }
                start += s.len();
            }
            quant.quantize(&ctx, h);
            l.attn_out.forward(&quant, &mut x, &mut acc, self.vnni, true);
            l.attn_norm.apply(&mut x, self.eps);
            quant.quantize(&x, h);
            up.resize(rows * l.up.w.n(), 0.0);
            l.up.forward(&quant, &mut up, &mut acc, self.vnni, false);
            math::gelu(&mut up);
            quant.quantize(&up, l.up.w.n());
            l.down.forward(&quant, &mut x, &mut acc, self.vnni, true);
            l.out_norm.apply(&mut x, self.eps);
        }
        let mut start = 0;
        let mut out = Vec::with_capacity(seqs.len());
        for s in seqs {
            let mut mean = vec![0f32; h];
            for row in x[start * h..(start + s.len()) * h].chunks_exact(h) {
                mean.iter_mut().zip(row).for_each(|(m, v)| *m += v);
            }
            let n = (s.len().max(1)) as f32;
            mean.iter_mut().for_each(|m| *m /= n);
            let norm = mean.iter().map(|m| m * m).sum::<f32>().sqrt().max(1e-12);
            mean.iter_mut().for_each(|m| *m /= norm);
            out.push(mean);
            start += s.len();
        }
        Ok(out)
    }

    /// One head of self-attention over the `len` tokens from row `start`, its
    /// context written into `ctx`'s columns of that head. Scores: queries (each
    /// over its own range) by keys (each symmetric) in int8. Probabilities by
    /// values in 16 bits (the probabilities to 1/32767, the values per dimension):
    /// an 8-bit probability drops the many small weights beside an attention sink,
    /// which the embedding feels.
    #[inline(always)]
    fn attend(&self, qkv: &[f32], ctx: &mut [f32], start: usize, len: usize, head: usize, s: &mut Scratch) {
        let (h, d) = (self.hidden, self.hidden / self.heads);
        let (d4, len2) = (round_up(d, 4), round_up(len, 2));
        let row = |t: usize, which: usize| &qkv[(start + t) * 3 * h + which * h + head * d..][..d];
        s.q.clear();
        s.q.resize(len * d4, 0);
        s.k.clear();
        s.k.resize(len * d, 0);
        s.q_scale.clear();
        s.q_low.clear();
        s.k_scale.clear();
        for t in 0..len {
            let (scale, low) = math::quantize_affine(row(t, 0), &mut s.q[t * d4..]);
            s.q_scale.push(scale);
            s.q_low.push(low);
            s.k_scale.push(math::quantize_signed(row(t, 1), &mut s.k[t * d..]));
        }
        s.keys.pack_cols(d, len, &s.k);
        s.k_sum_scale.clear();
        s.k_sum_scale.extend(s.keys.col_sum.iter().zip(&s.k_scale).map(|(&cs, &sk)| cs as f32 * sk));
        s.v_scale.clear();
        s.v_scale.resize(d, 0.0);
        for t in 0..len {
            for (m, v) in s.v_scale.iter_mut().zip(row(t, 2)) {
                *m = m.max(v.abs());
            }
        }
        s.v_inv.clear();
        s.v_inv.extend(s.v_scale.iter().map(|&m| if m > 0.0 { WIDE_MAX / m } else { 0.0 }));
        s.v_scale.iter_mut().for_each(|m| *m /= WIDE_MAX);
        s.v.clear();
        s.v.resize(len * d, 0);
        for t in 0..len {
            math::quantize_wide(row(t, 2), &s.v_inv, &mut s.v[t * d..(t + 1) * d]);
        }
        s.values.pack_rows(len, d, &s.v);
        let ldc = s.keys.n_padded();
        s.acc.resize(len * ldc.max(s.values.n_padded()), 0);
        gemm(&s.q, d4, len, &s.keys, &mut s.acc, self.vnni);
        let scale = 1.0 / (d as f32).sqrt();
        s.p.clear();
        s.p.resize(len * len2, 0);
        s.scores.resize(len, 0.0);
        for i in 0..len {
            let a = &s.acc[i * ldc..i * ldc + len];
            let (sq, lq) = (s.q_scale[i] * scale, s.q_low[i] * scale);
            let terms = a.iter().zip(&s.k_sum_scale).zip(&s.k_scale);
            for (o, ((&a, &ks), &sk)) in s.scores.iter_mut().zip(terms) {
                *o = (a as f32 * sq).mul_add(sk, lq * ks);
            }
            math::softmax_wide(&mut s.scores, &mut s.p[i * len2..]);
        }
        let ldv = s.values.n_padded();
        gemm(&s.p, len2, len, &s.values, &mut s.acc, self.vnni);
        for i in 0..len {
            let out = &mut ctx[(start + i) * h + head * d..][..d];
            // The probabilities are in 1/32767ths (`softmax_wide`), the values in their scales.
            for ((o, &a), &sv) in out.iter_mut().zip(&s.acc[i * ldv..]).zip(&s.v_scale) {
                *o = a as f32 * (1.0 / WIDE_MAX) * sv;
            }
        }
    }
}
