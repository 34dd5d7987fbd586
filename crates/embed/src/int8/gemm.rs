//! The int8 matrix product of the int8 encoder: `C = A · B` with `A` unsigned
//! bytes (rows of activations), `B` signed bytes packed once ([`Packed`]) and
//! `C` 32-bit sums. AVX-512 VNNI (`vpdpbusd`) when the CPU has it, else the
//! same sums in portable code (bit-identical: integer arithmetic). Owns no
//! model state.

/// Columns of one packed panel (two 16-lane registers).
pub(crate) const PANEL: usize = 32;
/// Rows of `A` one kernel call keeps in registers.
const ROWS: usize = 8;

/// An element of `B` and the element of `A` it is multiplied by: signed bytes by
/// unsigned ones (`vpdpbusd`, 4 per 32-bit lane), or 16-bit by 16-bit
/// (`vpdpwssd`, 2 per lane). Either way a group (`K` values) is 4 bytes.
pub(crate) trait Lane: Copy + Default + Into<i32> {
    /// `A`'s element.
    type A: Copy + Default + Into<i32>;
    /// Values per group.
    const K: usize;
}

impl Lane for i8 {
    type A = u8;
    const K: usize = 4;
}

impl Lane for i16 {
    type A = i16;
    const K: usize = 2;
}

/// `B` (`k` × `n`) in the kernel's order: panels of 32 columns, each as groups of
/// `K` values of `k` per column (`[panel][k / K][column][K]`: a group of a panel is
/// 128 bytes), zero-padded to whole panels and groups.
#[derive(Debug, Clone, Default)]
pub(crate) struct Packed<T> {
    k: usize,
    n: usize,
    data: Vec<T>,
    /// Σ over `k` of each column (length `n`; bytes only: what an unsigned offset in `A` adds).
    pub(crate) col_sum: Vec<i32>,
}

/// `x` rounded up to a multiple of `m`.
pub(crate) fn round_up(x: usize, m: usize) -> usize {
    x.div_ceil(m) * m
}

impl<T: Lane> Packed<T> {
    /// Zeroed buffers for `k` × `n`; returns the groups per panel.
    fn reset(&mut self, k: usize, n: usize) -> usize {
        let groups = round_up(k, T::K) / T::K;
        (self.k, self.n) = (k, n);
        self.data.clear();
        self.data.resize(round_up(n, PANEL) / PANEL * groups * PANEL * T::K, T::default());
        groups
    }

    pub(crate) fn n(&self) -> usize {
        self.n
    }

    /// `n` rounded up to whole panels: the row stride `gemm` writes `C` with.
    pub(crate) fn n_padded(&self) -> usize {
        round_up(self.n, PANEL)
    }
}

impl Packed<i8> {
    /// Packs `n` columns of `k` values each, column after column (`cols[c * k + r]`
    /// is `B[r][c]`: a weight matrix's rows, or keys by token).
    pub(crate) fn from_cols(k: usize, n: usize, cols: &[i8]) -> Packed<i8> {
        let mut p = Packed::default();
        p.pack_cols(k, n, cols);
        p
    }

    /// As [`from_cols`](Self::from_cols), into this one's buffers.
    #[inline(always)]
    pub(crate) fn pack_cols(&mut self, k: usize, n: usize, cols: &[i8]) {
        let groups = self.reset(k, n);
        self.col_sum.clear();
        for (col, values) in cols.chunks_exact(k).take(n).enumerate() {
            let base = (col / PANEL) * groups * PANEL * 4 + (col % PANEL) * 4;
            for (g, four) in values.chunks(4).enumerate() {
                let at = base + g * PANEL * 4;
                self.data[at..at + four.len()].copy_from_slice(four);
            }
            self.col_sum.push(values.iter().map(|&v| i32::from(v)).sum());
        }
    }
}

impl Packed<i16> {
    /// Packs `k` rows of `n` values each, row after row (`rows[r * n + c]` is
    /// `B[r][c]`: values by token), two rows at a time interleaved column by column.
    #[inline(always)]
    pub(crate) fn pack_rows(&mut self, k: usize, n: usize, rows: &[i16]) {
        let groups = self.reset(k, n);
        for (g, pair) in rows[..k * n].chunks(2 * n).enumerate() {
            let (first, second) = pair.split_at(n);
            for (panel, (a, b)) in
                first.chunks(PANEL).zip(second.chunks(PANEL).chain(std::iter::repeat(&[][..]))).enumerate()
            {
                let out = &mut self.data[(panel * groups + g) * PANEL * 2..][..PANEL * 2];
                for (c, &v) in a.iter().enumerate() {
                    out[2 * c] = v;
                    out[2 * c + 1] = b.get(c).copied().unwrap_or(0);
                }
            }
        }
    }
}

/// Whether this CPU runs the VNNI kernel.
pub(crate) fn has_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `c[i][j] = Σ_r a[i][r] · b[r][j]` for `m` rows of `a` (stride `lda`, at
/// least `round_up(b.k, K)` values readable per row; the padding is multiplied
/// by zeros) into `c` (`m` × `b.n_padded()`, overwritten).
pub(crate) fn gemm<T: Lane>(a: &[T::A], lda: usize, m: usize, b: &Packed<T>, c: &mut [i32], vnni: bool) {
    let (groups, ldc) = (round_up(b.k, T::K) / T::K, b.n_padded());
    // What the kernel reads and writes stays inside `a` and `c` (`b` is whole panels by
    // construction): the safety of its `unsafe`.
    let row = groups * T::K;
    assert!(lda >= row && (m == 0 || a.len() >= (m - 1) * lda + row), "int8 gemm: A too short");
    assert!(c.len() >= m * ldc, "int8 gemm: C too short");
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    if vnni {
        let (ap, bp) = (a.as_ptr().cast::<u8>(), b.data.as_ptr().cast::<u8>());
        let kernel = if T::K == 2 { vnni::gemm::<true> } else { vnni::gemm::<false> };
        // SAFETY: the CPU has AVX-512 F, BW and VNNI (`has_vnni`, checked by the caller's
        // `vnni`); the asserts above bound every read of `a` (a group is 4 bytes of a row, `lda`
        // in bytes below) and write of `c`, and `b` holds whole panels of 128-byte groups.
        unsafe { kernel(ap, lda * size_of::<T::A>(), m, bp, groups, c, ldc) };
        return;
    }
    let _ = vnni;
    portable(a, lda, m, b, groups, c, ldc);
}

/// The kernel's sums in portable code.
fn portable<T: Lane>(a: &[T::A], lda: usize, m: usize, b: &Packed<T>, groups: usize, c: &mut [i32], ldc: usize) {
    let k = T::K;
    for panel in 0..ldc / PANEL {
        let bp = &b.data[panel * groups * PANEL * k..(panel + 1) * groups * PANEL * k];
        for i in 0..m {
            let row = &a[i * lda..i * lda + groups * k];
            let out = &mut c[i * ldc + panel * PANEL..i * ldc + (panel + 1) * PANEL];
            out.fill(0);
            for (av, bg) in row.chunks_exact(k).zip(bp.chunks_exact(PANEL * k)) {
                for (o, bj) in out.iter_mut().zip(bg.chunks_exact(k)) {
                    *o += av.iter().zip(bj).map(|(&x, &y)| x.into() * y.into()).sum::<i32>();
                }
            }
        }
    }
}

/// Work [`with_avx512`] compiles for AVX-512: its `run` must be
/// `#[inline(always)]` (and so what it calls), to be compiled into the caller.
pub(crate) trait Pass {
    type Out;
    fn run(self) -> Self::Out;
}

/// Runs `p` compiled for AVX-512 (F, BW, VL, VNNI) and FMA: what its `run`
/// inlines (the encoder's pass and its element-wise steps) is vectorized 16
/// lanes wide. Only when [`has_vnni`].
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
pub(crate) fn with_avx512<P: Pass>(p: P) -> P::Out {
    assert!(has_vnni(), "with_avx512 on a CPU without AVX-512 VNNI");
    // SAFETY: the CPU has the features (checked just above).
    unsafe { vnni::run(p) }
}

/// As above, on a CPU that cannot have them: never called (`has_vnni` is false).
#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn with_avx512<P: Pass>(p: P) -> P::Out {
    p.run()
}

/// The one place the project runs `unsafe` code: AVX-512 VNNI intrinsics read
/// and write through pointers the caller bounds-checked.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod vnni {
    use std::arch::x86_64::{
        __m512i, _mm512_dpbusd_epi32, _mm512_dpwssd_epi32, _mm512_loadu_si512, _mm512_set1_epi32, _mm512_setzero_si512,
        _mm512_storeu_si512,
    };

    use super::{PANEL, Pass, ROWS};

    /// # Safety
    /// The CPU has AVX-512 F, BW, VL and VNNI, AVX2 and FMA.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    pub(super) unsafe fn run<P: Pass>(p: P) -> P::Out {
        p.run()
    }

    /// Every row of A by every panel of B, `ROWS` rows at a time: unsigned by signed bytes
    /// (`vpdpbusd`) or, `WIDE`, signed 16-bit pairs (`vpdpwssd`); either way a group is 4
    /// bytes of a row of A (`lda` in bytes) and 128 bytes of a panel of B.
    ///
    /// # Safety
    /// AVX-512 F, BW and VNNI present; `a`, `b`, `c` as `super::gemm` checked them.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn gemm<const WIDE: bool>(
        ap: *const u8,
        lda: usize,
        m: usize,
        bp: *const u8,
        groups: usize,
        c: &mut [i32],
        ldc: usize,
    ) {
        let cp = c.as_mut_ptr();
        let mut i = 0;
        while i < m {
            let rows = (m - i).min(ROWS);
            for panel in 0..ldc / PANEL {
                // SAFETY: rows i..i+rows of A, this panel of B, and the matching tile of C are
                // inside the slices (checked by super::gemm).
                unsafe {
                    let (a, b, c) =
                        (ap.add(i * lda), bp.add(panel * groups * PANEL * 4), cp.add(i * ldc + panel * PANEL));
                    match rows {
                        8 => tile::<8, WIDE>(a, lda, b, groups, c, ldc),
                        7 => tile::<7, WIDE>(a, lda, b, groups, c, ldc),
                        6 => tile::<6, WIDE>(a, lda, b, groups, c, ldc),
                        5 => tile::<5, WIDE>(a, lda, b, groups, c, ldc),
                        4 => tile::<4, WIDE>(a, lda, b, groups, c, ldc),
                        3 => tile::<3, WIDE>(a, lda, b, groups, c, ldc),
                        2 => tile::<2, WIDE>(a, lda, b, groups, c, ldc),
                        _ => tile::<1, WIDE>(a, lda, b, groups, c, ldc),
                    }
                }
            }
            i += rows;
        }
    }

    /// `R` rows of A by one panel of B: 2·R accumulators of 16 sums.
    ///
    /// # Safety
    /// As `gemm`; `a` has `R` rows of `4 * groups` bytes at stride `lda`, `b` one
    /// panel of `groups` groups, `c` `R` rows of 32 sums at stride `ldc`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    unsafe fn tile<const R: usize, const WIDE: bool>(
        a: *const u8,
        lda: usize,
        b: *const u8,
        groups: usize,
        c: *mut i32,
        ldc: usize,
    ) {
        let mut acc: [[__m512i; 2]; R] = [[_mm512_setzero_si512(); 2]; R];
        for g in 0..groups {
            // SAFETY: within the panel and the rows (see above).
            unsafe {
                let b0 = _mm512_loadu_si512(b.add(g * PANEL * 4).cast());
                let b1 = _mm512_loadu_si512(b.add(g * PANEL * 4 + 64).cast());
                for (r, acc) in acc.iter_mut().enumerate() {
                    let four = a.add(r * lda + g * 4).cast::<i32>().read_unaligned();
                    let av = _mm512_set1_epi32(four);
                    if WIDE {
                        acc[0] = _mm512_dpwssd_epi32(acc[0], av, b0);
                        acc[1] = _mm512_dpwssd_epi32(acc[1], av, b1);
                    } else {
                        acc[0] = _mm512_dpbusd_epi32(acc[0], av, b0);
                        acc[1] = _mm512_dpbusd_epi32(acc[1], av, b1);
                    }
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            // SAFETY: row r of the C tile (32 sums) is inside C.
            unsafe {
                _mm512_storeu_si512(c.add(r * ldc).cast(), acc[0]);
                _mm512_storeu_si512(c.add(r * ldc + 16).cast(), acc[1]);
            }
        }
    }
}
