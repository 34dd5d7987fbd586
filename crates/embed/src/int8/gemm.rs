//! The int8 matrix product of the int8 encoder: `C = A · B` with `A` unsigned
//! bytes (rows of activations), `B` signed bytes packed once ([`Packed`]) and
//! `C` 32-bit sums. AVX-512 VNNI (`vpdpbusd`) when the CPU has it, else the
//! same sums in portable code (bit-identical: integer arithmetic). Owns no
//! model state.

/// Columns of one packed panel (two 16-lane registers).
pub(crate) const PANEL: usize = 32;
/// Rows of `A` one kernel call keeps in registers.
const ROWS: usize = 8;

/// `B` (`k` × `n` signed bytes) in the kernel's order: panels of 32 columns,
/// each as groups of 4 `k` values per column (`[panel][k / 4][column][4]`),
/// zero-padded to a multiple of 32 columns and of 4 rows; and each column's sum
/// (what an unsigned offset in `A` adds to it).
#[derive(Debug, Clone, Default)]
pub(crate) struct Packed {
    k: usize,
    n: usize,
    data: Vec<i8>,
    /// Σ over `k` of each column (length `n`).
    pub(crate) col_sum: Vec<i32>,
}

/// `x` rounded up to a multiple of `m`.
pub(crate) fn round_up(x: usize, m: usize) -> usize {
    x.div_ceil(m) * m
}

impl Packed {
    /// Packs `n` columns of `k` values each, column after column (`cols[c * k + r]`
    /// is `B[r][c]`: a weight matrix's rows, or keys by token).
    pub(crate) fn from_cols(k: usize, n: usize, cols: &[i8]) -> Packed {
        let mut p = Packed::default();
        p.pack_cols(k, n, cols);
        p
    }

    fn reset(&mut self, k: usize, n: usize) -> usize {
        let groups = round_up(k, 4) / 4;
        let panels = round_up(n, PANEL) / PANEL;
        self.k = k;
        self.n = n;
        self.data.clear();
        self.data.resize(panels * groups * PANEL * 4, 0);
        self.col_sum.clear();
        self.col_sum.resize(n, 0);
        groups
    }

    /// As [`from_cols`](Self::from_cols), into this one's buffers.
    #[inline(always)]
    pub(crate) fn pack_cols(&mut self, k: usize, n: usize, cols: &[i8]) {
        let groups = self.reset(k, n);
        for (col, values) in cols.chunks_exact(k).take(n).enumerate() {
            let base = (col / PANEL) * groups * PANEL * 4 + (col % PANEL) * 4;
            for (g, four) in values.chunks(4).enumerate() {
                let at = base + g * PANEL * 4;
                self.data[at..at + four.len()].copy_from_slice(four);
            }
            self.col_sum[col] = values.iter().map(|&v| i32::from(v)).sum();
        }
    }

    /// Packs `k` rows of `n` values each, row after row (`rows[r * n + c]` is
    /// `B[r][c]`: values by token), into this one's buffers.
    #[inline(always)]
    pub(crate) fn pack_rows(&mut self, k: usize, n: usize, rows: &[i8]) {
        let groups = self.reset(k, n);
        for (r, values) in rows.chunks_exact(n).take(k).enumerate() {
            let (g, lane) = (r / 4, r % 4);
            for (col, &v) in values.iter().enumerate() {
                self.data[((col / PANEL) * groups + g) * PANEL * 4 + (col % PANEL) * 4 + lane] = v;
                self.col_sum[col] += i32::from(v);
            }
        }
    }

    pub(crate) fn n(&self) -> usize {
        self.n
    }

    /// `n` rounded up to whole panels: the row stride `gemm` writes `C` with.
    pub(crate) fn n_padded(&self) -> usize {
        round_up(self.n, PANEL)
    }
}

/// `B` (`k` × `n` 16-bit values) in the 16-bit kernel's order: as [`Packed`]
/// with groups of 2 `k` values per column (`[panel][k / 2][column][2]`), so a
/// group is 128 bytes too.
#[derive(Debug, Clone, Default)]
pub(crate) struct Packed16 {
    k: usize,
    n: usize,
    data: Vec<i16>,
}

impl Packed16 {
    /// Packs `k` rows of `n` values each, row after row (`rows[r * n + c]` is `B[r][c]`).
    #[inline(always)]
    pub(crate) fn pack_rows(&mut self, k: usize, n: usize, rows: &[i16]) {
        let groups = round_up(k, 2) / 2;
        self.k = k;
        self.n = n;
        self.data.clear();
        self.data.resize(round_up(n, PANEL) / PANEL * groups * PANEL * 2, 0);
        // Two rows at a time, interleaved column by column into each panel.
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

    pub(crate) fn n_padded(&self) -> usize {
        round_up(self.n, PANEL)
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

/// What the kernels read and write stays inside `a` (`len` values, rows at stride `lda`, each
/// `row` values read) and `c` (`m` rows at stride `ldc`): the safety of their `unsafe`.
fn check_bounds((len, lda, row): (usize, usize, usize), m: usize, (c_len, ldc): (usize, usize)) {
    assert!(lda >= row && (m == 0 || len >= (m - 1) * lda + row), "int8 gemm: A too short");
    assert!(c_len >= m * ldc, "int8 gemm: C too short");
}

/// `c[i][j] = Σ_r a[i][r] · b[r][j]` for `m` rows of `a` (stride `lda`, at
/// least `round_up(b.k(), 4)` bytes readable per row; the padding bytes are
/// multiplied by zeros) into `c` (`m` × `b.n_padded()`, overwritten).
pub(crate) fn gemm(a: &[u8], lda: usize, m: usize, b: &Packed, c: &mut [i32], vnni: bool) {
    let (groups, ldc) = (round_up(b.k, 4) / 4, b.n_padded());
    check_bounds((a.len(), lda, groups * 4), m, (c.len(), ldc));
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    if vnni {
        // SAFETY: the CPU has AVX-512 F, BW and VNNI (`has_vnni`, checked by the caller's
        // `vnni`), and the asserts above bound every read of `a` and `b` and write of `c`.
        unsafe { vnni::gemm::<false>(a.as_ptr(), lda, m, b.data.as_ptr().cast(), groups, c, ldc) };
        return;
    }
    let _ = vnni;
    portable::<_, _, 4>(a, lda, m, &b.data, groups, c, ldc);
}

/// As [`gemm`] in 16 bits: `c[i][j] = Σ_r a[i][r] · b[r][j]` for `m` rows of
/// signed 16-bit `a` (stride `lda` values, at least `round_up(b.k, 2)` readable).
pub(crate) fn gemm16(a: &[i16], lda: usize, m: usize, b: &Packed16, c: &mut [i32], vnni: bool) {
    let (groups, ldc) = (round_up(b.k, 2) / 2, b.n_padded());
    check_bounds((a.len(), lda, groups * 2), m, (c.len(), ldc));
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    if vnni {
        // SAFETY: as in `gemm`; a group is 4 bytes of a row of A and 128 bytes of B here too.
        unsafe { vnni::gemm::<true>(a.as_ptr().cast(), lda * 2, m, b.data.as_ptr().cast(), groups, c, ldc) };
        return;
    }
    let _ = vnni;
    portable::<_, _, 2>(a, lda, m, &b.data, groups, c, ldc);
}

/// The kernels' sums in portable code: `K` values of a row of A by `K` of each column of B per
/// group (4 bytes, or 2 16-bit values).
fn portable<A, B, const K: usize>(a: &[A], lda: usize, m: usize, b: &[B], groups: usize, c: &mut [i32], ldc: usize)
where
    A: Copy + Into<i32>,
    B: Copy + Into<i32>,
{
    for panel in 0..ldc / PANEL {
        let bp = &b[panel * groups * PANEL * K..(panel + 1) * groups * PANEL * K];
        for i in 0..m {
            let row = &a[i * lda..i * lda + groups * K];
            let out = &mut c[i * ldc + panel * PANEL..i * ldc + (panel + 1) * PANEL];
            out.fill(0);
            for (av, bg) in row.chunks_exact(K).zip(bp.chunks_exact(PANEL * K)) {
                for (o, bj) in out.iter_mut().zip(bg.chunks_exact(K)) {
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

    /// Unsigned by signed bytes (`WIDE` false: `vpdpbusd`) or signed 16-bit
    /// pairs (`WIDE`: `vpdpwssd`); either way a group is 4 bytes of a row of A
    /// (`lda` in bytes) and 128 bytes of a panel of B.
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
