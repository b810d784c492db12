//! The matrix-vector kernel of a streaming step: `y (m, n) = x (m, k) . w (n, k)^T` for a
//! few input rows (`m <=` [`GEMV_MAX_ROWS`]), with float32 or bfloat16 weights ([`Weight`]).
//!
//! Such a product is bound by reading the weights once from memory, so the kernel streams
//! each weight row exactly once for all input rows: register tiles of `R` weight rows x `G`
//! input rows (up to [`GROUP`]); more input rows run group after group over the same tile of
//! weight rows, which is still in L1, so memory still sees each weight once. Tiles prefetch
//! the next tile's rows, and blocks of `BLOCK` output features split across the rayon pool.
//!
//! The instruction set is chosen at run time ([`Isa`]): with bf16 weights, AVX-512 BF16's
//! `vdpbf16ps` where the CPU has it (each activation split into two bf16 parts, `hi + lo`,
//! so it keeps 16 significant bits, and accumulated in f32); AVX2/FMA otherwise, widening
//! each weight to f32 in registers; a portable version of the same sums elsewhere. Every
//! (weight row, input row) pair sums in the same order whatever its neighbours, so a row's
//! result does not depend on how many rows share the call or which tile computed it.

use half::bf16;

/// Input rows up to which the matrix-vector kernel is used.
pub const GEMV_MAX_ROWS: usize = 32;

/// Input rows of one register tile; more rows run in groups of this many.
const GROUP: usize = 8;

/// Output features per parallel task.
const BLOCK: usize = 64;

/// A weight element the kernel reads: f32, or bf16 (widened to f32 exactly).
pub trait Weight: Copy + Send + Sync + 'static {
    /// Whether the element is a bf16 (16 bits, the upper half of an f32).
    const BF16: bool;
    /// The element's value.
    fn to_f32(self) -> f32;
}

impl Weight for f32 {
    const BF16: bool = false;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl Weight for bf16 {
    const BF16: bool = true;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
}

/// The instruction sets the kernel has a version for, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512F with AVX-512 BF16 (`vdpbf16ps`): bf16 weights only.
    Avx512Bf16,
    /// AVX2 and FMA.
    Avx2,
    /// Plain Rust.
    Portable,
}

impl Isa {
    /// The best version this CPU runs for weights `W`.
    pub fn detect<W: Weight>() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            use super::cpu::{has, Level};
            if W::BF16 && has(Level::Avx512Bf16) {
                return Isa::Avx512Bf16;
            }
            if has(Level::Avx2) {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }

    /// Whether this CPU runs `self` for weights `W`.
    pub fn available<W: Weight>(self) -> bool {
        match self {
            Isa::Portable => true,
            Isa::Avx2 => Isa::detect::<f32>() == Isa::Avx2,
            Isa::Avx512Bf16 => W::BF16 && Isa::detect::<W>() == Isa::Avx512Bf16,
        }
    }
}

#[allow(clippy::needless_range_loop)] // lane-indexed loops mirror the SIMD registers
#[inline(always)]
fn dot_rows<W: Weight, const M: usize>(xs: &[&[f32]; M], w: &[W], out: &mut [f32; M]) {
    // Plain multiply-add (no `mul_add`, which is a libm call without FMA). 4 x 8 independent
    // accumulators per input row so the compiler can keep them in vector registers and pipeline the FMAs.
    let k = w.len();
    let mut acc = [[[0f32; 8]; 4]; M];
    let main = k / 32 * 32;
    let mut i = 0;
    while i < main {
        for j in 0..4 {
            let wv: [f32; 8] = std::array::from_fn(|l| w[i + 8 * j + l].to_f32());
            for r in 0..M {
                let xv = &xs[r][i + 8 * j..i + 8 * j + 8];
                for l in 0..8 {
                    acc[r][j][l] += xv[l] * wv[l];
                }
            }
        }
        i += 32;
    }
    for r in 0..M {
        let mut s = [0f32; 8];
        for j in 0..4 {
            for l in 0..8 {
                s[l] += acc[r][j][l];
            }
        }
        let mut total = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
        for t in main..k {
            total += xs[r][t] * w[t].to_f32();
        }
        out[r] = total;
    }
}

/// What every tile of one call reads: the input rows (and their bf16 parts for
/// `vdpbf16ps`), the block's weight rows, and where the block's outputs go.
struct Call<'a, W> {
    /// `(m, k)` input rows.
    x: &'a [f32],
    /// `x` rounded to bf16, and the bf16 rounding of what that left (`Avx512Bf16` only).
    hi: &'a [bf16],
    lo: &'a [bf16],
    /// This block's weight rows, `(rows, k)`.
    w: &'a [W],
    k: usize,
    m: usize,
}

/// Rows `r0 .. r0 + G` against the weight row `o` of the block, portably.
#[inline(always)]
fn tile_generic<W: Weight, const G: usize>(c: &Call<W>, o: usize, r0: usize, out: &mut [f32]) {
    let k = c.k;
    let xs: [&[f32]; G] = std::array::from_fn(|r| &c.x[(r0 + r) * k..(r0 + r + 1) * k]);
    let mut res = [0f32; G];
    dot_rows::<W, G>(&xs, &c.w[o * k..(o + 1) * k], &mut res);
    out[o * c.m + r0..o * c.m + r0 + G].copy_from_slice(&res);
}

/// 8 weights from `p` as f32 lanes (bf16 widened: its bits become an f32's upper half).
#[cfg(target_arch = "x86_64")]
macro_rules! load8 {
    ($w:ty, $p:expr) => {{
        use std::arch::x86_64::*;
        if <$w as Weight>::BF16 {
            let h = _mm_loadu_si128($p as *const __m128i);
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        } else {
            _mm256_loadu_ps($p as *const f32)
        }
    }};
}

/// `R` weight rows (from `o`) against `G` input rows (from `r0`): one 8-lane accumulator per
/// (weight row, input row) pair, so each weight load serves `G` products and each input
/// load `R`, and `R` weight streams are in flight at once (one stream at a time leaves the
/// loads waiting on memory). Every pair sums in the same order (8 lanes, then the same
/// horizontal sum, then the tail), so a row's result does not depend on how many rows share
/// the call or which tile computed it. `prefetch`: the first group of the tile fetches the
/// next tile's rows.
#[allow(clippy::needless_range_loop)] // lane-indexed loops mirror the SIMD registers
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn tile_avx2<W: Weight, const R: usize, const G: usize>(
    c: &Call<W>,
    o: usize,
    r0: usize,
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    let (k, w) = (c.k, c.w);
    let xs: [&[f32]; G] = std::array::from_fn(|r| &c.x[(r0 + r) * k..(r0 + r + 1) * k]);
    let ws: [&[W]; R] = std::array::from_fn(|j| &w[(o + j) * k..(o + j + 1) * k]);
    let main = k / 8 * 8;
    let line = 64 / std::mem::size_of::<W>();
    let mut acc = [[_mm256_setzero_ps(); G]; R];
    let next = w.len().min((o + 2 * R) * k);
    let mut i = 0;
    while i < main {
        if r0 == 0 && i % line == 0 {
            // The next tile's rows, one cache line each: with only R (1 to 8) streams of
            // demand loads, a core leaves most of its memory bandwidth unused.
            for j in 0..R {
                let at = (o + R + j) * k + i;
                if at < next {
                    _mm_prefetch::<_MM_HINT_T0>(w.as_ptr().add(at) as *const i8);
                }
            }
        }
        // SAFETY: i + 8 <= k, and every row of x and w has k elements.
        let wv: [__m256; R] = std::array::from_fn(|j| load8!(W, ws[j].as_ptr().add(i)));
        for r in 0..G {
            let xv = _mm256_loadu_ps(xs[r].as_ptr().add(i));
            for j in 0..R {
                acc[j][r] = _mm256_fmadd_ps(wv[j], xv, acc[j][r]);
            }
        }
        i += 8;
    }
    for j in 0..R {
        for r in 0..G {
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), acc[j][r]);
            let mut total = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
                + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
            for t in main..k {
                total += xs[r][t] * ws[j][t].to_f32();
            }
            out[(o + j) * c.m + r0 + r] = total;
        }
    }
}

/// [`tile_avx2`] with `vdpbf16ps`: 32 bf16 weights per load, each multiplied by the input's
/// `hi` and `lo` parts into one f32 accumulator per pair (16 lanes, each the sum of two
/// adjacent products); then the same 16-lane reduction and the f32 tail for every pair.
#[allow(clippy::needless_range_loop)] // lane-indexed loops mirror the SIMD registers
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
#[inline]
unsafe fn tile_bf16<W: Weight, const R: usize, const G: usize>(
    c: &Call<W>,
    o: usize,
    r0: usize,
    out: &mut [f32],
) {
    use std::arch::x86_64::{
        __m512bh, _mm512_dpbf16_ps, _mm512_loadu_si512, _mm512_reduce_add_ps, _mm512_setzero_ps,
        _mm_prefetch, _MM_HINT_T0,
    };
    let (k, w) = (c.k, c.w);
    let row = |s: &[bf16], r: usize| s[(r0 + r) * k..(r0 + r + 1) * k].as_ptr();
    let his: [*const bf16; G] = std::array::from_fn(|r| row(c.hi, r));
    let los: [*const bf16; G] = std::array::from_fn(|r| row(c.lo, r));
    let ws: [*const W; R] = std::array::from_fn(|j| w[(o + j) * k..].as_ptr());
    let main = k / 32 * 32;
    let mut acc = [[_mm512_setzero_ps(); G]; R];
    let next = w.len().min((o + 2 * R) * k);
    let bh = |p: *const bf16| -> __m512bh { std::mem::transmute(_mm512_loadu_si512(p as _)) };
    let mut i = 0;
    while i < main {
        if r0 == 0 {
            for j in 0..R {
                let at = (o + R + j) * k + i;
                if at < next {
                    _mm_prefetch::<_MM_HINT_T0>(w.as_ptr().add(at) as *const i8);
                }
            }
        }
        // SAFETY: i + 32 <= k; every row has k elements; W is bf16 (checked by the caller).
        let wv: [__m512bh; R] = std::array::from_fn(|j| bh(ws[j].add(i) as *const bf16));
        for r in 0..G {
            let (xh, xl) = (bh(his[r].add(i)), bh(los[r].add(i)));
            for j in 0..R {
                acc[j][r] = _mm512_dpbf16_ps(acc[j][r], wv[j], xh);
                acc[j][r] = _mm512_dpbf16_ps(acc[j][r], wv[j], xl);
            }
        }
        i += 32;
    }
    for j in 0..R {
        let wr = std::slice::from_raw_parts(ws[j], k);
        for r in 0..G {
            let mut total = _mm512_reduce_add_ps(acc[j][r]);
            let xr = &c.x[(r0 + r) * k..(r0 + r + 1) * k];
            for t in main..k {
                total += xr[t] * wr[t].to_f32();
            }
            out[(o + j) * c.m + r0 + r] = total;
        }
    }
}

/// One tile of `R` weight rows from `o` against every input row, group after group.
///
/// # Safety
/// `isa` is available on this CPU for `W`.
#[inline(always)]
unsafe fn tile_rows<W: Weight, const R: usize>(isa: Isa, c: &Call<W>, o: usize, out: &mut [f32]) {
    macro_rules! group {
        ($g:literal, $r0:expr) => {
            match isa {
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512Bf16 => tile_bf16::<W, R, $g>(c, o, $r0, out),
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => tile_avx2::<W, R, $g>(c, o, $r0, out),
                _ => (0..R).for_each(|j| tile_generic::<W, $g>(c, o + j, $r0, out)),
            }
        };
    }
    let mut r0 = 0;
    while r0 < c.m {
        match (c.m - r0).min(GROUP) {
            1 => group!(1, r0),
            2 => group!(2, r0),
            3 => group!(3, r0),
            4 => group!(4, r0),
            5 => group!(5, r0),
            6 => group!(6, r0),
            7 => group!(7, r0),
            _ => group!(8, r0),
        }
        r0 += GROUP;
    }
}

/// Weight rows per tile for `m` input rows: the `R x G` accumulators fit the registers with
/// the loads (AVX2's sixteen, AVX-512's thirty-two).
fn tile_height(isa: Isa, m: usize) -> usize {
    match (isa, m) {
        (_, 1) => 8,
        (_, 2 | 3) => 4,
        (Isa::Avx512Bf16, 4) => 4,
        (_, 4) | (Isa::Avx512Bf16, _) => 2,
        _ => 1,
    }
}

/// One block of weight rows, `out[o * m + r] = x_r . w_o` (transposed layout).
///
/// # Safety
/// `isa` is available on this CPU for `W`.
unsafe fn block<W: Weight>(isa: Isa, c: &Call<W>, out: &mut [f32]) {
    let rows = c.w.len() / c.k;
    let r = tile_height(isa, c.m);
    let mut o = 0;
    while o + r <= rows {
        match r {
            8 => tile_rows::<W, 8>(isa, c, o, out),
            4 => tile_rows::<W, 4>(isa, c, o, out),
            2 => tile_rows::<W, 2>(isa, c, o, out),
            _ => tile_rows::<W, 1>(isa, c, o, out),
        }
        o += r;
    }
    while o < rows {
        tile_rows::<W, 1>(isa, c, o, out);
        o += 1;
    }
}

/// The bf16 parts of `x` for `vdpbf16ps`: `hi = bf16(x)`, `lo = bf16(x - hi)`.
fn split_bf16(x: &[f32], hi: &mut Vec<bf16>, lo: &mut Vec<bf16>) {
    hi.clear();
    hi.extend(x.iter().map(|&v| bf16::from_f32(v)));
    lo.clear();
    lo.extend(
        x.iter()
            .zip(&*hi)
            .map(|(&v, h)| bf16::from_f32(v - h.to_f32())),
    );
}

/// A thread's buffers for [`gemv_into`]: the bf16 parts of the input and the transposed
/// output, kept between calls.
#[derive(Default)]
struct GemvScratch {
    hi: Vec<bf16>,
    lo: Vec<bf16>,
    yt: Vec<f32>,
}

thread_local! {
    /// Taken while a call uses it ([`super::with_scratch`]).
    static SCRATCH: std::cell::Cell<GemvScratch> = std::cell::Cell::new(GemvScratch::default());
}

/// `y (m, n) = x (m, k) . w (n, k)^T`, on the best [`Isa`] of this CPU.
pub fn gemv<W: Weight>(x: &[f32], w: &[W], m: usize, k: usize, n: usize) -> Vec<f32> {
    gemv_on(Isa::detect::<W>(), x, w, m, k, n)
}

/// [`gemv`] on `isa`, which must be available (else the portable version runs).
pub fn gemv_on<W: Weight>(isa: Isa, x: &[f32], w: &[W], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut y = vec![0f32; m * n];
    gemv_into_on(isa, x, w, (m, k, n), &mut y);
    y
}

/// [`gemv`] into `y` (`m * n` values, all written): once warm, a call allocates nothing.
pub fn gemv_into<W: Weight>(x: &[f32], w: &[W], (m, k, n): (usize, usize, usize), y: &mut [f32]) {
    gemv_into_on(Isa::detect::<W>(), x, w, (m, k, n), y)
}

fn gemv_into_on<W: Weight>(
    isa: Isa,
    x: &[f32],
    w: &[W],
    (m, k, n): (usize, usize, usize),
    y: &mut [f32],
) {
    assert!(
        m <= GEMV_MAX_ROWS && x.len() == m * k && w.len() == n * k && y.len() == m * n,
        "gemv shapes"
    );
    if m == 0 || k == 0 || crate::runtime::profile::products_skipped() {
        return y.fill(0.0);
    }
    let isa = if isa.available::<W>() {
        isa
    } else {
        Isa::Portable
    };
    super::with_scratch(&SCRATCH, |s| {
        if isa == Isa::Avx512Bf16 {
            split_bf16(x, &mut s.hi, &mut s.lo);
        }
        let GemvScratch { hi, lo, yt } = s;
        let call = Call { x, hi, lo, w, k, m };
        if m == 1 {
            return blocks(isa, &call, n, y); // (n, 1) is (1, n)
        }
        yt.resize(n * m, 0.0);
        blocks(isa, &call, n, yt);
        for o in 0..n {
            for r in 0..m {
                y[r * n + o] = yt[o * m + r];
            }
        }
    })
}

/// Every block of `BLOCK` weight rows of `c` into `yt (n, m)`, over the pool when it pays.
fn blocks<W: Weight>(isa: Isa, c: &Call<W>, n: usize, yt: &mut [f32]) {
    let (k, m) = (c.k, c.m);
    let run = |(out, wblock): (&mut [f32], &[W])| {
        let call = Call { w: wblock, ..*c };
        // SAFETY: `isa` is available (checked by the caller).
        unsafe { block(isa, &call, out) }
    };
    // Handing work to the pool costs a wake-up and a context switch per call; with one thread
    // (or a small matrix) run on the calling thread instead.
    let yt = &mut yt[..n * m];
    if rayon::current_num_threads() <= 1 || n * k < 1 << 16 {
        yt.chunks_mut(BLOCK * m)
            .zip(c.w.chunks(BLOCK * k))
            .for_each(run);
    } else {
        super::for_each_chunk_mut(yt, BLOCK * m, |i, y| {
            run((y, &c.w[i * BLOCK * k..((i + 1) * BLOCK * k).min(c.w.len())]))
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::test_input;

    /// Each row against an f64 sum of the same (widened) weights.
    fn check_products<W: Weight>(x: &[f32], w: &[W], y: &[f32], (m, k, n): (usize, usize, usize)) {
        for r in 0..m {
            for o in 0..n {
                let want: f64 = (0..k)
                    .map(|i| x[r * k + i] as f64 * w[o * k + i].to_f32() as f64)
                    .sum();
                let g = y[r * n + o] as f64;
                // bf16 weights: the activations' two bf16 parts keep 16 bits (vdpbf16ps).
                let tol = if W::BF16 { 4e-5 } else { 1e-5 } * (k as f64).sqrt();
                assert!((g - want).abs() < tol, "{g} vs {want}");
            }
        }
    }

    /// A streaming step's rows share one matrix-vector call: each row's result must be the
    /// same bits whether it came alone or with others, in whichever tile and group, on every
    /// instruction set this CPU has, for both weight types.
    fn rows_independent<W: Weight>(conv: fn(f32) -> W) {
        for isa in [Isa::Avx512Bf16, Isa::Avx2, Isa::Portable] {
            if !isa.available::<W>() {
                continue;
            }
            for (n, k) in [(1, 7), (13, 37), (67, 515), (130, 64), (9, 96)] {
                let w: Vec<W> = test_input(1, n, k, 5).into_iter().map(conv).collect();
                let x = test_input(1, GEMV_MAX_ROWS, k, 6);
                let alone: Vec<Vec<f32>> = (0..GEMV_MAX_ROWS)
                    .map(|r| gemv_on(isa, &x[r * k..(r + 1) * k], &w, 1, k, n))
                    .collect();
                for m in [2, 3, 5, 8, 9, 12, 16, 17, 24, 31, 32] {
                    let y = gemv_on(isa, &x[..m * k], &w, m, k, n);
                    for (r, want) in alone.iter().enumerate().take(m) {
                        let got = &y[r * n..(r + 1) * n];
                        assert_eq!(got, want.as_slice(), "{isa:?} n {n} k {k} m {m} row {r}");
                    }
                }
                let all: Vec<f32> = alone.concat();
                check_products(&x, &w, &all, (GEMV_MAX_ROWS, k, n));
            }
        }
    }

    #[test]
    fn gemv_rows_do_not_depend_on_their_neighbours() {
        rows_independent::<f32>(|v| v);
    }

    #[test]
    fn bf16_rows_do_not_depend_on_their_neighbours() {
        rows_independent::<bf16>(bf16::from_f32);
    }

    /// The bf16 versions agree with each other to the activations' bf16 split (16 bits).
    #[test]
    fn bf16_isas_agree() {
        let (m, k, n) = (5, 1536, 70);
        let w: Vec<bf16> = test_input(1, n, k, 7)
            .into_iter()
            .map(bf16::from_f32)
            .collect();
        let x = test_input(1, m, k, 8);
        let portable = gemv_on(Isa::Portable, &x, &w, m, k, n);
        for isa in [Isa::Avx512Bf16, Isa::Avx2] {
            let y = gemv_on(isa, &x, &w, m, k, n);
            for (a, b) in y.iter().zip(&portable) {
                assert!((a - b).abs() < 1e-4, "{isa:?}: {a} vs {b}");
            }
        }
    }
}
