//! The matrix-vector kernel of a streaming step: `y (m, n) = x (m, k) . w (n, k)^T` for a
//! few input rows (`m <=` [`GEMV_MAX_ROWS`]).
//!
//! Such a product is bound by reading the weights once from memory, so the kernel streams
//! each weight row exactly once for all input rows: register tiles of `R` weight rows x `M`
//! input rows with AVX2/FMA (chosen at run time), prefetching the next tile's rows, split
//! across the rayon pool by blocks of `BLOCK` output features; a portable version of the
//! same sums elsewhere. Every row sums in the same order whatever its neighbours, so a
//! row's result does not depend on how many rows share the call.

use rayon::prelude::*;

/// Input rows up to which the matrix-vector kernel is used.
pub const GEMV_MAX_ROWS: usize = 8;

/// Output features per parallel task.
const BLOCK: usize = 64;

#[allow(clippy::needless_range_loop)] // lane-indexed loops mirror the SIMD registers
#[inline(always)]
fn dot_rows<const M: usize>(xs: &[&[f32]; M], w: &[f32], out: &mut [f32; M]) {
    // Plain multiply-add (no `mul_add`, which is a libm call without FMA). 4 x 8 independent
    // accumulators per input row so the compiler can keep them in vector registers and pipeline the FMAs.
    let k = w.len();
    let mut acc = [[[0f32; 8]; 4]; M];
    let main = k / 32 * 32;
    let mut i = 0;
    while i < main {
        for j in 0..4 {
            let wv = &w[i + 8 * j..i + 8 * j + 8];
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
            total += xs[r][t] * w[t];
        }
        out[r] = total;
    }
}

/// One block of output features: `out[o * m + r] = x_r . w_o` (transposed layout).
/// Inlined into the AVX2 variant so that it is compiled with those features.
#[inline(always)]
fn gemv_block_generic<const M: usize>(x: &[f32], w: &[f32], k: usize, out: &mut [f32]) {
    let xs: [&[f32]; M] = std::array::from_fn(|r| &x[r * k..(r + 1) * k]);
    for (o, wrow) in w.chunks_exact(k).enumerate() {
        let mut res = [0f32; M];
        dot_rows::<M>(&xs, wrow, &mut res);
        out[o * M..(o + 1) * M].copy_from_slice(&res);
    }
}

/// `R` weight rows against `M` input rows, starting at weight row `o`: one 8-lane accumulator
/// per (weight row, input row) pair, so each weight load serves `M` products and each input
/// load `R`, and `R` weight streams are in flight at once (one stream at a time leaves the
/// loads waiting on memory). Every pair sums in the same order (8 lanes, then the same
/// horizontal sum, then the tail), so a row's result does not depend on how many rows share
/// the call or which tile computed it.
#[allow(clippy::needless_range_loop)] // lane-indexed loops mirror the SIMD registers
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn gemv_tile_avx2<const R: usize, const M: usize>(
    x: &[f32],
    w: &[f32],
    k: usize,
    o: usize,
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    let xs: [&[f32]; M] = std::array::from_fn(|r| &x[r * k..(r + 1) * k]);
    let ws: [&[f32]; R] = std::array::from_fn(|j| &w[(o + j) * k..(o + j + 1) * k]);
    let main = k / 8 * 8;
    let mut acc = [[_mm256_setzero_ps(); M]; R];
    let next = w.len().min((o + 2 * R) * k);
    let mut i = 0;
    while i < main {
        if i % 16 == 0 {
            // The next tile's rows, one cache line each: with only R (2 to 8) streams of
            // demand loads, a core leaves most of its memory bandwidth unused.
            for j in 0..R {
                let at = (o + R + j) * k + i;
                if at < next {
                    _mm_prefetch::<_MM_HINT_T0>(w.as_ptr().add(at) as *const i8);
                }
            }
        }
        // SAFETY: i + 8 <= k, and every row of x and w has k elements.
        let wv: [__m256; R] = std::array::from_fn(|j| _mm256_loadu_ps(ws[j].as_ptr().add(i)));
        for r in 0..M {
            let xv = _mm256_loadu_ps(xs[r].as_ptr().add(i));
            for j in 0..R {
                acc[j][r] = _mm256_fmadd_ps(wv[j], xv, acc[j][r]);
            }
        }
        i += 8;
    }
    for j in 0..R {
        for r in 0..M {
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), acc[j][r]);
            let mut total = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
                + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
            for t in main..k {
                total += xs[r][t] * ws[j][t];
            }
            out[(o + j) * M + r] = total;
        }
    }
}

/// `M` input rows against a block of weight rows, `R` weight rows per tile, so that the
/// `R x M` accumulators (8 at most) fit in AVX2's sixteen registers with the loads (5 to 8
/// input rows: one weight row per tile); the rows left over one at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gemv_block_avx2<const R: usize, const M: usize>(
    x: &[f32],
    w: &[f32],
    k: usize,
    out: &mut [f32],
) {
    let rows = w.len() / k;
    let mut o = 0;
    while o + R <= rows {
        gemv_tile_avx2::<R, M>(x, w, k, o, out);
        o += R;
    }
    while o < rows {
        gemv_tile_avx2::<1, M>(x, w, k, o, out);
        o += 1;
    }
}

fn gemv_block<const M: usize>(x: &[f32], w: &[f32], k: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports the features the function was compiled for.
            return unsafe {
                match M {
                    1 => gemv_block_avx2::<8, M>(x, w, k, out),
                    2 | 3 => gemv_block_avx2::<4, M>(x, w, k, out),
                    4 => gemv_block_avx2::<2, M>(x, w, k, out),
                    _ => gemv_block_avx2::<1, M>(x, w, k, out),
                }
            };
        }
    }
    gemv_block_generic::<M>(x, w, k, out)
}

/// `y (m, n) = x (m, k) . w (n, k)^T`.
pub fn gemv(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut yt = vec![0f32; n * m];
    let f: fn(&[f32], &[f32], usize, &mut [f32]) = match m {
        1 => gemv_block::<1>,
        2 => gemv_block::<2>,
        3 => gemv_block::<3>,
        4 => gemv_block::<4>,
        5 => gemv_block::<5>,
        6 => gemv_block::<6>,
        7 => gemv_block::<7>,
        _ => gemv_block::<8>,
    };
    // Handing work to the pool costs a wake-up and a context switch per call; with one thread
    // (or a small matrix) run on the calling thread instead.
    if rayon::current_num_threads() <= 1 || n * k < 1 << 16 {
        yt.chunks_mut(BLOCK * m)
            .zip(w.chunks(BLOCK * k))
            .for_each(|(out, wblock)| f(x, wblock, k, out));
    } else {
        yt.par_chunks_mut(BLOCK * m)
            .zip(w.par_chunks(BLOCK * k))
            .for_each(|(out, wblock)| f(x, wblock, k, out));
    }
    if m == 1 {
        return yt;
    }
    let mut y = vec![0f32; m * n];
    for o in 0..n {
        for r in 0..m {
            y[r * n + o] = yt[o * m + r];
        }
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A streaming step's rows share one matrix-vector call: each row's result must be the
    /// same bits whether it came alone or with others, in whichever tile of weight rows.
    #[test]
    fn gemv_rows_do_not_depend_on_their_neighbours() {
        use crate::testutil::test_input;
        for (n, k) in [(1, 7), (13, 37), (67, 515), (130, 64)] {
            let w = test_input(1, n, k, 5);
            let x = test_input(1, 8, k, 6);
            let alone: Vec<Vec<f32>> = (0..8)
                .map(|r| gemv(&x[r * k..(r + 1) * k], &w, 1, k, n))
                .collect();
            for m in 2..=8 {
                let y = gemv(&x[..m * k], &w, m, k, n);
                for (r, want) in alone.iter().enumerate().take(m) {
                    assert_eq!(&y[r * n..(r + 1) * n], want.as_slice(), "n {n} k {k} m {m}");
                }
            }
            // and the products themselves, against a sum in f64
            for (r, got) in alone.iter().enumerate() {
                for (o, &g) in got.iter().enumerate() {
                    let want: f64 = (0..k)
                        .map(|i| x[r * k + i] as f64 * w[o * k + i] as f64)
                        .sum();
                    assert!(
                        (g as f64 - want).abs() < 1e-5 * (k as f64).sqrt(),
                        "{g} vs {want}"
                    );
                }
            }
        }
    }
}
