//! The int8 encoder's element-wise steps, written so the compiler vectorizes
//! them (sixteen-lane partial sums, branch-free `exp` and `erf`): a row's
//! quantization to bytes, LayerNorm, exact-GELU, softmax. Each is inlined
//! into the encoder's pass, which runs compiled for AVX-512 when the CPU has
//! it (`gemm::with_avx512`). Owns nothing.

const LANES: usize = 16;

/// 1.5 · 2²³: added to |x| < 2²², the sum's low mantissa bits are `x` rounded.
const SHIFT: f32 = 12_582_912.0;

/// `x` rounded to the nearest integer (ties to even), for |x| < 2²²: an add and
/// an integer subtract, so it vectorizes without SSE4.1's `round` or the
/// saturating checks of `as i32`.
#[inline(always)]
fn round_i32(x: f32) -> i32 {
    (x + SHIFT).to_bits() as i32 - SHIFT.to_bits() as i32
}

/// Sixteen lanes folded to one by halves (`f(a, b)` four times a vector wide,
/// not sixteen dependent scalar steps).
#[inline(always)]
fn fold(mut lanes: [f32; LANES], f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut half = LANES / 2;
    while half > 0 {
        for i in 0..half {
            lanes[i] = f(lanes[i], lanes[i + half]);
        }
        half /= 2;
    }
    lanes[0]
}

#[inline(always)]
fn max(a: f32, b: f32) -> f32 {
    if b > a { b } else { a }
}

#[inline(always)]
fn min(a: f32, b: f32) -> f32 {
    if b < a { b } else { a }
}

/// `f` over `x` in sixteen lanes, folded with `merge` (`init` the empty lanes).
#[inline(always)]
fn reduce(x: &[f32], init: f32, f: impl Fn(f32, f32) -> f32, merge: impl Fn(f32, f32) -> f32) -> f32 {
    let mut acc = [init; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = f(*a, v);
        }
    }
    rest.iter().fold(fold(acc, &merge), |a, &v| f(a, v))
}

/// The largest |v| of `x` (NaN ignored).
#[inline(always)]
pub(crate) fn max_abs(x: &[f32]) -> f32 {
    reduce(x, 0.0, |a, v| max(a, v.abs()), max)
}

#[inline(always)]
fn sum(x: &[f32]) -> f32 {
    reduce(x, 0.0, |a, v| a + v, |a, b| a + b)
}

/// `x` as bytes `q = round((x - lo) / scale)` over the row's own range
/// (`lo` its least value, `scale = (max - lo) / 255`): `x ≈ scale · q + lo`,
/// both returned (scale 0 for a constant row, whose bytes are 0).
#[inline(always)]
pub(crate) fn quantize_affine(x: &[f32], out: &mut [u8]) -> (f32, f32) {
    let lo = reduce(x, f32::MAX, min, min);
    let hi = reduce(x, f32::MIN, max, max);
    let scale = (hi - lo) / 255.0;
    if !(scale > 0.0 && scale.is_finite()) {
        out[..x.len()].fill(0);
        return (0.0, if lo.is_finite() { lo } else { 0.0 });
    }
    let inv = 1.0 / scale;
    let shift = -lo * inv;
    for (o, v) in out.iter_mut().zip(x) {
        *o = round_i32(v * inv + shift).clamp(0, 255) as u8;
    }
    (scale, lo)
}

/// `x` as signed bytes `round(x / scale)` with `scale = max|x| / 127` (returned).
#[inline(always)]
pub(crate) fn quantize_signed(x: &[f32], out: &mut [i8]) -> f32 {
    let max = max_abs(x);
    if max == 0.0 || !max.is_finite() {
        out[..x.len()].fill(0);
        return 0.0;
    }
    let inv = 127.0 / max;
    for (o, v) in out.iter_mut().zip(x) {
        *o = round_i32(v * inv) as i8;
    }
    max / 127.0
}

/// The largest magnitude of the 16-bit operands.
pub(crate) const WIDE_MAX: f32 = 32767.0;

/// `x` as 16-bit `round(x · inv)`, one inverse scale per column.
#[inline(always)]
pub(crate) fn quantize_wide(x: &[f32], inv: &[f32], out: &mut [i16]) {
    for ((o, v), i) in out.iter_mut().zip(x).zip(inv) {
        *o = round_i32(v * i) as i16;
    }
}

/// LayerNorm of one row in place: `(x - mean) / sqrt(var + eps) * gamma + beta`.
#[inline(always)]
pub(crate) fn layer_norm(x: &mut [f32], gamma: &[f32], beta: &[f32], eps: f32) {
    let n = x.len() as f32;
    let mean = sum(x) / n;
    let var = reduce(x, 0.0, |a, v| a + (v - mean) * (v - mean), |a, b| a + b) / n;
    let inv = 1.0 / (var + eps).sqrt();
    for ((v, g), b) in x.iter_mut().zip(gamma).zip(beta) {
        *v = (*v - mean) * inv * g + b;
    }
}

/// `e^x`, relative error under 3e-6 for x in [-87, 88] (clamped there).
#[inline(always)]
fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let x = min(max(x, -87.0), 88.0);
    let k = round_i32(x * LOG2E);
    let n = k as f32;
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, x));
    // Taylor to degree 5 over |r| ≤ ln 2 / 2 (remainder under 2.5e-6: softmax weights are
    // kept to 1/32767 and GELU's input to 8 bits), constants as products.
    const C: [f32; 4] = [1.0 / 2.0, 1.0 / 6.0, 1.0 / 24.0, 1.0 / 120.0];
    // Fused multiply-adds (one instruction each under `with_avx512`, which enables FMA).
    let p = r.mul_add(r.mul_add(r.mul_add(r.mul_add(r.mul_add(C[3], C[2]), C[1]), C[0]), 1.0), 1.0);
    p * f32::from_bits(((k + 127) as u32) << 23)
}

/// Exact (erf) GELU in place: `x / 2 · (1 + erf(x / √2))`, erf by Abramowitz and
/// Stegun 7.1.26 (absolute error under 1.5e-7).
#[inline(always)]
pub(crate) fn gelu(x: &mut [f32]) {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [0.254_829_6, -0.284_496_74, 1.421_413_8, -1.453_152, 1.061_405_4];
    for v in x.iter_mut() {
        let z = *v * std::f32::consts::FRAC_1_SQRT_2;
        let a = z.abs();
        let t = 1.0 / (1.0 + P * a);
        let poly = t * t.mul_add(t.mul_add(t.mul_add(t.mul_add(A[4], A[3]), A[2]), A[1]), A[0]);
        let erf = 1.0 - poly * exp(-a * a);
        let erf = if z < 0.0 { -erf } else { erf };
        *v = 0.5 * *v * (1.0 + erf);
    }
}

/// Softmax of one row, in 16 bits: `out[j] = round(32767 · p_j)`, so that the
/// 32-bit sums of probabilities by 16-bit values cannot overflow (Σ p = 1).
/// `x` is left holding `exp(x - max x)`.
#[inline(always)]
pub(crate) fn softmax_wide(x: &mut [f32], out: &mut [i16]) {
    let top = reduce(x, f32::MIN, max, max);
    let mut total = [0f32; LANES];
    let mut chunks = x.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for (t, v) in total.iter_mut().zip(c.iter_mut()) {
            *v = exp(*v - top);
            *t += *v;
        }
    }
    let mut rest_sum = 0.0;
    for v in chunks.into_remainder() {
        *v = exp(*v - top);
        rest_sum += *v;
    }
    let to = WIDE_MAX / (fold(total, |a, b| a + b) + rest_sum);
    for (o, v) in out.iter_mut().zip(x.iter()) {
        *o = round_i32(v * to) as i16;
    }
}
