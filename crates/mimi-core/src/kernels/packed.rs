//! [`Packed`]: a linear layer's weight packed once, at load, into panels of [`PANEL`] output
//! features, and the register-tiled product `y (m, n) = x (m, k) . W^T + b` over it: the
//! transformer's q/k/v, out, fc1 and fc2 over a streaming step's batch x tokens, or an
//! offline block's tokens (the register tiles walk the rows; a panel stays in cache).
//!
//! Panel `p` holds `W[16p .. 16p + 16, i]` for `i = 0..k` as `k` consecutive vectors of 16
//! weights (zero past `n`), so a micro-kernel reads one aligned vector per panel and input
//! feature, broadcasts each input row's value, and accumulates `rows x panels` vectors in
//! registers ([`gemv`](super::gemv) instead kept one accumulator per (row, weight row) and
//! re-read the input per product, which left it load-bound). 16 f32 weights are one
//! AVX-512 vector, two AVX2 vectors, and one row of a 16 x 64-byte AMX tile.
//!
//! Every output lane sums `x[r, i] * W[o, i]` for `i = 0..k` in order with one fused
//! multiply-add each, then adds the bias: a row's bits do not depend on how many rows share
//! the call, on which tile computed it, or on the instruction set (AVX-512 and AVX2 both
//! fuse). bf16 weights are widened in registers (exact) and multiplied in f32: on Intel,
//! `vdpbf16ps` runs at half the f32 FMA rate. The portable version multiplies and adds
//! separately (no FMA to rely on), so its bits may differ from the SIMD versions'.

use super::gemv::Weight;
#[cfg(test)]
use half::bf16;

/// Output features per panel.
pub const PANEL: usize = 16;

/// Rows per register tile: AVX-512 8 rows x 2 panels (16 accumulators of its 32
/// registers), AVX2 6 rows x 2 vectors (12 of its 16).
fn tile_rows(isa: Simd) -> usize {
    match isa {
        Simd::Avx2 => 6,
        _ => 8,
    }
}

/// Panels per parallel task.
const TASK_PANELS: usize = 4;

/// A weight `(n, k)` in panels (see the module doc).
#[derive(Debug)]
pub struct Packed<W> {
    n: usize,
    k: usize,
    data: Vec<W>,
}

/// The instruction set a product runs with, chosen at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Simd {
    Avx512,
    Avx2,
    Portable,
}

fn simd() -> Simd {
    #[cfg(target_arch = "x86_64")]
    {
        use super::cpu::{has, Level};
        if has(Level::Avx512) {
            return Simd::Avx512;
        }
        if has(Level::Avx2) {
            return Simd::Avx2;
        }
    }
    Simd::Portable
}

/// Where the tasks of one product write: `y (m, n)`; tasks own disjoint output columns.
#[derive(Clone, Copy)]
struct Out {
    y: *mut f32,
    n: usize,
}

// SAFETY: every task writes only its own panels' columns of `y`, which outlives the tasks.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl<W: Weight + Default> Packed<W> {
    /// Packs the rows of `parts`, one after the other, each `(rows, k)` row-major: one
    /// weight, or several stacked (q, k and v) without a copy of the stack.
    pub fn pack(parts: &[&[W]], k: usize) -> Self {
        let n = parts.iter().map(|p| p.len()).sum::<usize>() / k.max(1);
        let rows = parts.iter().flat_map(|p| p.chunks_exact(k.max(1)));
        let mut data = vec![W::default(); n.div_ceil(PANEL) * k * PANEL];
        for (o, row) in rows.enumerate() {
            let (p, lane) = (o / PANEL, o % PANEL);
            for (i, &v) in row.iter().enumerate() {
                data[(p * k + i) * PANEL + lane] = v;
            }
        }
        Self { n, k, data }
    }

    /// Output features.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input features.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The weight `(n, k)` row-major again (packing is exact).
    pub fn unpack(&self) -> Vec<W> {
        let k = self.k;
        let mut w = Vec::with_capacity(self.n * k);
        for o in 0..self.n {
            let (p, lane) = (o / PANEL, o % PANEL);
            w.extend((0..k).map(|i| self.data[(p * k + i) * PANEL + lane]));
        }
        w
    }

    /// `y (m, n) = x (m, k) . W^T + bias`.
    pub fn matmul(&self, x: &[f32], m: usize, bias: Option<&[f32]>, y: &mut [f32]) {
        self.matmul_on(simd(), x, m, bias, y)
    }

    /// [`Self::matmul`] with `isa`, which must run on this CPU.
    fn matmul_on(&self, isa: Simd, x: &[f32], m: usize, bias: Option<&[f32]>, y: &mut [f32]) {
        let (n, k) = (self.n, self.k);
        assert!(
            x.len() == m * k && y.len() == m * n && bias.is_none_or(|b| b.len() == n),
            "packed product shapes"
        );
        if crate::runtime::profile::products_skipped() {
            return;
        }
        let out = Out {
            y: y.as_mut_ptr(),
            n,
        };
        let panels = n.div_ceil(PANEL);
        let run = |t: usize| {
            let p1 = ((t + 1) * TASK_PANELS).min(panels);
            // SAFETY: panels t*TASK_PANELS..p1 are this task's alone; `isa` was detected.
            unsafe { self.panels(isa, (t * TASK_PANELS, p1), x, m, bias, out) }
        };
        let tasks = panels.div_ceil(TASK_PANELS);
        if rayon::current_num_threads() <= 1 || n * k < 1 << 16 {
            (0..tasks).for_each(run);
        } else {
            super::for_each_index(tasks, run);
        }
    }

    /// Panels `p0..p1`, for all rows: pairs of panels, then a last single one.
    ///
    /// # Safety
    /// `isa` runs on this CPU; no other task writes these panels' columns.
    unsafe fn panels(
        &self,
        isa: Simd,
        (p0, p1): (usize, usize),
        x: &[f32],
        m: usize,
        bias: Option<&[f32]>,
        out: Out,
    ) {
        let mut p = p0;
        while p < p1 {
            let np = if p + 2 <= p1 && isa == Simd::Avx512 {
                2
            } else {
                1
            };
            let mut r0 = 0;
            while r0 < m {
                let rows = (m - r0).min(tile_rows(isa));
                self.tile(isa, (p, np), (r0, rows), x, bias, out);
                r0 += rows;
            }
            p += np;
        }
    }

    /// One register tile: `rows` rows from `r0` against `np` panels from `p`.
    #[inline(always)]
    unsafe fn tile(
        &self,
        isa: Simd,
        (p, np): (usize, usize),
        (r0, rows): (usize, usize),
        x: &[f32],
        bias: Option<&[f32]>,
        out: Out,
    ) {
        macro_rules! go {
            ($np:literal) => {
                match rows {
                    1 => self.tile_of::<1, $np>(isa, p, r0, x, bias, out),
                    2 => self.tile_of::<2, $np>(isa, p, r0, x, bias, out),
                    3 => self.tile_of::<3, $np>(isa, p, r0, x, bias, out),
                    4 => self.tile_of::<4, $np>(isa, p, r0, x, bias, out),
                    5 => self.tile_of::<5, $np>(isa, p, r0, x, bias, out),
                    6 => self.tile_of::<6, $np>(isa, p, r0, x, bias, out),
                    7 => self.tile_of::<7, $np>(isa, p, r0, x, bias, out),
                    _ => self.tile_of::<8, $np>(isa, p, r0, x, bias, out),
                }
            };
        }
        match np {
            2 => go!(2),
            _ => go!(1),
        }
    }

    #[inline(always)]
    unsafe fn tile_of<const M: usize, const NP: usize>(
        &self,
        isa: Simd,
        p: usize,
        r0: usize,
        x: &[f32],
        bias: Option<&[f32]>,
        out: Out,
    ) {
        let k = self.k;
        let xs: [&[f32]; M] = std::array::from_fn(|r| &x[(r0 + r) * k..(r0 + r + 1) * k]);
        let w = &self.data[p * k * PANEL..(p + NP) * k * PANEL];
        let mut acc = [[[0f32; PANEL]; NP]; M];
        match isa {
            #[cfg(target_arch = "x86_64")]
            Simd::Avx512 => avx512::tile::<W, M, NP>(&xs, w, k, &mut acc),
            #[cfg(target_arch = "x86_64")]
            Simd::Avx2 => avx2::tile::<W, M, NP>(&xs, w, k, &mut acc),
            _ => tile_portable::<W, M, NP>(&xs, w, k, &mut acc),
        }
        for (r, acc) in acc.iter().enumerate() {
            for (q, lanes) in acc.iter().enumerate() {
                let o0 = (p + q) * PANEL;
                for (l, &v) in lanes.iter().enumerate().take(self.n.saturating_sub(o0)) {
                    let b = bias.map_or(0.0, |b| b[o0 + l]);
                    // SAFETY: row r0 + r < m, column o0 + l < n, owned by this task.
                    *out.y.add((r0 + r) * out.n + o0 + l) = v + b;
                }
            }
        }
    }
}

/// The portable tile: the same sums, multiply then add.
#[allow(clippy::needless_range_loop)] // indexed loops mirror the registers
#[inline(always)]
fn tile_portable<W: Weight, const M: usize, const NP: usize>(
    xs: &[&[f32]; M],
    w: &[W],
    k: usize,
    acc: &mut [[[f32; PANEL]; NP]; M],
) {
    for i in 0..k {
        for q in 0..NP {
            let wv = &w[(q * k + i) * PANEL..][..PANEL];
            for r in 0..M {
                let xv = xs[r][i];
                for l in 0..PANEL {
                    acc[r][q][l] += xv * wv[l].to_f32();
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Weight, PANEL};
    use std::arch::x86_64::*;

    /// Steps of the depth loop between a weight's prefetch and its load.
    const AHEAD: usize = 32;

    /// 16 weights from `p` as f32 lanes (bf16 widened: its bits become an f32's upper half).
    #[inline(always)]
    unsafe fn load16<W: Weight>(p: *const W) -> __m512 {
        if W::BF16 {
            let h = _mm256_loadu_si256(p as *const __m256i);
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        } else {
            _mm512_loadu_ps(p as *const f32)
        }
    }

    #[allow(clippy::needless_range_loop)] // indexed loops mirror the registers
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile<W: Weight, const M: usize, const NP: usize>(
        xs: &[&[f32]; M],
        w: &[W],
        k: usize,
        out: &mut [[[f32; PANEL]; NP]; M],
    ) {
        let mut acc = [[_mm512_setzero_ps(); NP]; M];
        let wp = w.as_ptr();
        for i in 0..k {
            // The weights stream from memory once per call: ask for them AHEAD steps early
            // (a prefetch past the panel's end reads the next one, or nothing; it never faults).
            for q in 0..NP {
                let ahead = wp.wrapping_add((q * k + i + AHEAD) * PANEL);
                _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8);
            }
            let wv: [__m512; NP] = std::array::from_fn(|q| load16(wp.add((q * k + i) * PANEL)));
            for r in 0..M {
                let xv = _mm512_set1_ps(*xs[r].get_unchecked(i));
                for q in 0..NP {
                    acc[r][q] = _mm512_fmadd_ps(wv[q], xv, acc[r][q]);
                }
            }
        }
        for r in 0..M {
            for q in 0..NP {
                _mm512_storeu_ps(out[r][q].as_mut_ptr(), acc[r][q]);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Weight, PANEL};
    use std::arch::x86_64::*;

    /// 8 weights from `p` as f32 lanes.
    #[inline(always)]
    unsafe fn load8<W: Weight>(p: *const W) -> __m256 {
        if W::BF16 {
            let h = _mm_loadu_si128(p as *const __m128i);
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        } else {
            _mm256_loadu_ps(p as *const f32)
        }
    }

    /// Each panel (two vectors of 8) against `M <= 6` rows (12 accumulators).
    #[allow(clippy::needless_range_loop)] // indexed loops mirror the registers
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile<W: Weight, const M: usize, const NP: usize>(
        xs: &[&[f32]; M],
        w: &[W],
        k: usize,
        out: &mut [[[f32; PANEL]; NP]; M],
    ) {
        for q in 0..NP {
            let mut acc = [[_mm256_setzero_ps(); 2]; M];
            let wp = w.as_ptr().add(q * k * PANEL);
            for i in 0..k {
                let w0 = load8(wp.add(i * PANEL));
                let w1 = load8(wp.add(i * PANEL + 8));
                for r in 0..M {
                    let xv = _mm256_set1_ps(*xs[r].get_unchecked(i));
                    acc[r][0] = _mm256_fmadd_ps(w0, xv, acc[r][0]);
                    acc[r][1] = _mm256_fmadd_ps(w1, xv, acc[r][1]);
                }
            }
            for r in 0..M {
                _mm256_storeu_ps(out[r][q].as_mut_ptr(), acc[r][0]);
                _mm256_storeu_ps(out[r][q].as_mut_ptr().add(8), acc[r][1]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::test_input;

    fn reference(x: &[f32], w: &[f32], b: &[f32], (m, k, n): (usize, usize, usize)) -> Vec<f32> {
        let mut y = vec![0f32; m * n];
        for r in 0..m {
            for o in 0..n {
                let dot: f64 = (0..k)
                    .map(|i| x[r * k + i] as f64 * w[o * k + i] as f64)
                    .sum();
                y[r * n + o] = (dot + b[o] as f64) as f32;
            }
        }
        y
    }

    fn isas() -> Vec<Simd> {
        let mut v = vec![Simd::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            use crate::kernels::cpu::{detected, Level};
            if detected() >= Level::Avx2 {
                v.push(Simd::Avx2);
            }
            if detected() >= Level::Avx512 {
                v.push(Simd::Avx512);
            }
        }
        v
    }

    #[test]
    fn packed_product_matches_the_reference_on_every_isa() {
        for (m, k, n) in [
            (1, 512, 1536),
            (2, 64, 200),
            (3, 37, 5),
            (16, 2048, 512),
            (64, 96, 33),
            (9, 7, 1),
        ] {
            let (x, w, b) = (
                test_input(1, m, k, 1),
                test_input(1, n, k, 2),
                test_input(1, 1, n, 3),
            );
            let want = reference(&x, &w, &b, (m, k, n));
            let packed = Packed::pack(&[&w], k);
            for isa in isas() {
                let mut y = vec![f32::NAN; m * n];
                packed.matmul_on(isa, &x, m, Some(&b), &mut y);
                // y starts as NaN: an output the product never writes differs by infinity.
                let d = crate::testutil::max_abs_diff_slices(&y, &want);
                assert!(
                    d < 1e-4 * (k as f32).sqrt(),
                    "{isa:?} m={m} k={k} n={n}: {d}"
                );
            }
        }
    }

    /// A row's bits are the same alone or among 64 rows, and on AVX2 and AVX-512; bf16
    /// weights give the bits of the same weights widened to f32.
    #[test]
    fn rows_keep_their_bits_whatever_shares_the_call() {
        let (m, k, n) = (64, 300, 70);
        let x = test_input(1, m, k, 4);
        let w = test_input(1, n, k, 5);
        let w16: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
        let wide: Vec<f32> = w16.iter().map(|v| v.to_f32()).collect();
        let (p32, p16, pw) = (
            Packed::pack(&[&w], k),
            Packed::pack(&[&w16], k),
            Packed::pack(&[&wide], k),
        );
        let simd: Vec<Simd> = isas()
            .into_iter()
            .filter(|&i| i != Simd::Portable)
            .collect();
        for &isa in &simd {
            let mut all = vec![0f32; m * n];
            p32.matmul_on(isa, &x, m, None, &mut all);
            let mut all16 = vec![0f32; m * n];
            p16.matmul_on(isa, &x, m, None, &mut all16);
            let mut allw = vec![0f32; m * n];
            pw.matmul_on(isa, &x, m, None, &mut allw);
            assert_eq!(all16, allw, "{isa:?}: bf16 against widened f32");
            for r in [0, 5, 8, 13, m - 1] {
                let mut alone = vec![0f32; n];
                p32.matmul_on(isa, &x[r * k..(r + 1) * k], 1, None, &mut alone);
                assert_eq!(alone, all[r * n..(r + 1) * n], "{isa:?}: row {r}");
            }
            let mut first = vec![0f32; m * n];
            p32.matmul_on(simd[0], &x, m, None, &mut first);
            assert_eq!(first, all, "{isa:?} against {:?}", simd[0]);
        }
    }
}
