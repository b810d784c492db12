//! Faster CPU kernels where candle's are the bottleneck.
//!
//! [`Linear`]: a linear layer that, for a few input rows on the CPU in f32 (a streaming step:
//! batch x time <= [`GEMV_MAX_ROWS`]), uses a matrix-vector kernel instead of candle's
//! general matmul. Such a step is bound by reading the weights once from memory; the kernel
//! streams each weight row exactly once for all input rows, with AVX2/FMA when the CPU has
//! them, split across the rayon thread pool by blocks of output features. Otherwise
//! (more rows, other dtypes, GPUs) it is candle's `Linear`, except that a widening layer
//! with many rows runs its product transposed (`WideGemm`).
//!
//! [`WindowAttention`]: the attention of an offline transformer block (many queries at
//! once) on the CPU in f32, over exactly the keys each query's window holds, heads in
//! parallel, instead of candle's full masked products.

use candle::{CpuStorage, CustomOp1, CustomOp2, DType, Layout, Module, Result, Shape, Tensor};
use rayon::prelude::*;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

/// Input rows up to which the matrix-vector kernel is used.
pub const GEMV_MAX_ROWS: usize = 8;

/// Output features per parallel task.
const BLOCK: usize = 64;

/// `y = x W^T` for `x: (m, k)` and `W: (n, k)`, both f32 and contiguous.
struct Gemv;

/// `x`, `W` and `(m, k, n)` of a product `x (m, k) . W (n, k)^T`.
type Operands<'a> = (&'a [f32], &'a [f32], (usize, usize, usize));

/// The operands of a product op: both f32, contiguous, `m > 0`, the same `k`.
fn product_operands<'a>(
    op: &str,
    s1: &'a CpuStorage,
    l1: &Layout,
    s2: &'a CpuStorage,
    l2: &Layout,
) -> Result<Operands<'a>> {
    let (m, k) = l1.shape().dims2()?;
    let (n, k2) = l2.shape().dims2()?;
    if k != k2 || m == 0 {
        candle::bail!("{op}: bad shapes {:?} {:?}", l1.shape(), l2.shape())
    }
    let (x, w) = f32_slices(op, s1, l1, s2, l2)?;
    Ok((x, w, (m, k, n)))
}

/// The values of two contiguous f32 CPU operands of a custom op named `op`.
fn f32_slices<'a>(
    op: &str,
    s1: &'a CpuStorage,
    l1: &Layout,
    s2: &'a CpuStorage,
    l2: &Layout,
) -> Result<(&'a [f32], &'a [f32])> {
    let (CpuStorage::F32(x), CpuStorage::F32(y)) = (s1, s2) else {
        candle::bail!("{op}: f32 only")
    };
    let (Some((xa, xb)), Some((ya, yb))) = (l1.contiguous_offsets(), l2.contiguous_offsets())
    else {
        candle::bail!("{op}: contiguous inputs only")
    };
    Ok((&x[xa..xb], &y[ya..yb]))
}

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

impl CustomOp2 for Gemv {
    fn name(&self) -> &'static str {
        "mimi-gemv"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (x, w, (m, k, n)) = product_operands(self.name(), s1, l1, s2, l2)?;
        if m > GEMV_MAX_ROWS {
            candle::bail!("mimi-gemv: {m} rows, at most {GEMV_MAX_ROWS}")
        }
        let y = gemv(x, w, m, k, n);
        Ok((CpuStorage::F32(y), Shape::from((m, n))))
    }
}

/// `y = x W^T` for many rows of a widening layer (`W: (n, k)`, n >= 2k), computed as
/// `y^T = W x^T` with `gemm` on the pool: the weight is the left operand in its stored order.
/// candle's matmul takes it as `W^T` on the right. Isolated products, 250 rows, best of 30:
/// (1536, 512) 2.11 -> 1.65 ms at 2 threads and 3.86 -> 2.95 ms at 1; (2048, 512) 2.62 ->
/// 2.09 ms at 2 threads, the same at 1. The narrowing layers ((512, 512), (512, 2048)) were
/// slower this way and stay with candle.
struct WideGemm;

impl CustomOp2 for WideGemm {
    fn name(&self) -> &'static str {
        "mimi-wide-gemm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (x, w, (m, k, n)) = product_operands(self.name(), s1, l1, s2, l2)?;
        let mut y = vec![0f32; m * n];
        let par = match rayon::current_num_threads() {
            1 => gemm::Parallelism::None,
            t => gemm::Parallelism::Rayon(t),
        };
        let (k_, n_) = (k as isize, n as isize);
        // SAFETY: y^T (n, m) column-major is y (m, n); W (n, k) row-major; x^T (k, m) is
        // x (m, k) row-major: all inside their slices.
        unsafe {
            gemm::gemm(
                n,
                m,
                k,
                y.as_mut_ptr(),
                n_,
                1,
                false,
                w.as_ptr(),
                1,
                k_,
                x.as_ptr(),
                k_,
                1,
                0f32,
                1f32,
                false,
                false,
                false,
                par,
            )
        }
        Ok((CpuStorage::F32(y), Shape::from((m, n))))
    }
}

// ---------------------------------------------------------------------------------------
// Vectorisable elementwise math (branch-free, so that loops over slices compile to AVX2).

/// `e^x` for `x <= 0` (clamped to [-87, 0]): Cody-Waite range reduction and a degree-6
/// polynomial (Cephes' `expf`), within 2 ulp.
#[inline(always)]
pub(crate) fn exp_nonpos(x: f32) -> f32 {
    let x = x.clamp(-87.0, 0.0);
    // Round x / ln 2 to the nearest integer with the 1.5 * 2^23 trick: `t`'s low mantissa
    // bits then hold that integer, so neither libm nor a (scalarised, saturating) float to
    // int conversion is needed.
    let t = x * std::f32::consts::LOG2_E + 12582912.0;
    let n = t - 12582912.0;
    let ni = t.to_bits() as i32 - 0x4B40_0000;
    let r = x - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    e * f32::from_bits(((ni + 127) as u32) << 23)
}

/// `x * Phi(x)` (the erf form of GELU, as candle's `gelu_erf`): Abramowitz-Stegun 7.1.26
/// for erf, absolute error below 5e-7 of `x` over the whole line.
#[inline(always)]
fn gelu_erf_one(x: f32) -> f32 {
    let z = x.abs() * std::f32::consts::FRAC_1_SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * z);
    let mut p = 1.061_405_4f32;
    p = p * t - 1.453_152;
    p = p * t + 1.421_413_8;
    p = p * t - 0.284_496_74;
    p = p * t + 0.254_829_6;
    let erf_abs = 1.0 - p * t * exp_nonpos(-z * z);
    let erf = if x < 0.0 { -erf_abs } else { erf_abs };
    0.5 * x * (1.0 + erf)
}

#[inline(always)]
fn gelu_erf_slice_generic(src: &[f32], dst: &mut [f32]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = gelu_erf_one(x);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gelu_erf_slice_avx2(src: &[f32], dst: &mut [f32]) {
    gelu_erf_slice_generic(src, dst)
}

fn gelu_erf_slice(src: &[f32], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports the features the function was compiled for.
            return unsafe { gelu_erf_slice_avx2(src, dst) };
        }
    }
    gelu_erf_slice_generic(src, dst)
}

/// candle's CPU `gelu_erf` calls libm's `erff` once per element on one thread, a quarter of
/// an offline transformer pass; this one is vectorised and split over the pool.
struct GeluErf;

impl CustomOp1 for GeluErf {
    fn name(&self) -> &'static str {
        "mimi-gelu-erf"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(v) = s else {
            candle::bail!("mimi-gelu-erf: f32 only")
        };
        let Some((a, b)) = l.contiguous_offsets() else {
            candle::bail!("mimi-gelu-erf: contiguous input only")
        };
        let src = &v[a..b];
        let mut out = vec![0f32; src.len()];
        const CHUNK: usize = 1 << 14;
        if src.len() > CHUNK && rayon::current_num_threads() > 1 {
            out.par_chunks_mut(CHUNK)
                .zip(src.par_chunks(CHUNK))
                .for_each(|(d, s)| gelu_erf_slice(s, d));
        } else {
            gelu_erf_slice(src, &mut out);
        }
        Ok((CpuStorage::F32(out), l.shape().clone()))
    }
}

/// GELU (erf form): the vectorised kernel for f32 on the CPU, candle's elsewhere.
pub fn gelu_erf(x: &Tensor) -> Result<Tensor> {
    if x.device().is_cpu() && x.dtype() == DType::F32 {
        x.contiguous()?.apply_op1_no_bwd(&GeluErf)
    } else {
        x.gelu_erf()
    }
}

/// `x + y * scale` (`scale`: one value per feature, broadcast over the rows; a layer scale)
/// or `x + y`: a residual connection in one pass.
///
/// On the CPU in f32 it runs in our pool, with the bits of candle's `x + y.broadcast_mul(s)`
/// (the product rounded, then the sum; no fused multiply-add). candle runs its elementwise
/// ops of 64K values or more on a barrier pool of its own, whose worker then spins for 25 000
/// rounds beside ours: on 2 cores the transformer's offline pass (4 such ops per layer) lost
/// about a quarter of its time to it.
pub fn residual_add(x: &Tensor, y: &Tensor, scale: Option<&Tensor>) -> Result<Tensor> {
    let cpu_f32 = |t: &Tensor| t.device().is_cpu() && t.dtype() == DType::F32;
    let d = x.dims().last().copied().unwrap_or(0);
    let fast = cpu_f32(x)
        && cpu_f32(y)
        && x.dims() == y.dims()
        && scale.is_none_or(|s| cpu_f32(s) && s.dims() == [d]);
    if !fast {
        return match scale {
            Some(s) => x + y.broadcast_mul(s)?,
            None => x + y,
        };
    }
    let scale = scale.map(|s| s.to_vec1::<f32>()).transpose()?;
    let op = ResidualAdd { scale, d };
    x.contiguous()?.apply_op2_no_bwd(&y.contiguous()?, &op)
}

/// See [`residual_add`]: the per-feature scale (if any) over rows of `d` values.
struct ResidualAdd {
    scale: Option<Vec<f32>>,
    d: usize,
}

impl ResidualAdd {
    /// Rows of `x`, `y` into `out`, all of `d` values.
    fn rows(&self, x: &[f32], y: &[f32], out: &mut [f32]) {
        let d = self.d;
        let rows = out
            .chunks_exact_mut(d)
            .zip(x.chunks_exact(d).zip(y.chunks_exact(d)));
        match &self.scale {
            Some(s) => rows.for_each(|(o, (xr, yr))| {
                for j in 0..d {
                    o[j] = xr[j] + yr[j] * s[j];
                }
            }),
            None => rows.for_each(|(o, (xr, yr))| {
                for j in 0..d {
                    o[j] = xr[j] + yr[j];
                }
            }),
        }
    }
}

impl CustomOp2 for ResidualAdd {
    fn name(&self) -> &'static str {
        "mimi-residual-add"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (x, y) = f32_slices(self.name(), s1, l1, s2, l2)?;
        if l1.shape() != l2.shape() || self.d == 0 || x.len() % self.d != 0 {
            candle::bail!(
                "{}: bad shapes {:?} {:?}",
                self.name(),
                l1.shape(),
                l2.shape()
            )
        }
        let mut out = vec![0f32; x.len()];
        // Blocks of about 16K values: one pass over memory, split only when it is large.
        let block = self.d * (16384 / self.d).max(1);
        if x.len() < 4 * block || rayon::current_num_threads() <= 1 {
            self.rows(x, y, &mut out);
        } else {
            out.par_chunks_mut(block)
                .zip(x.par_chunks(block).zip(y.par_chunks(block)))
                .for_each(|(o, (xb, yb))| self.rows(xb, yb, o));
        }
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

/// Runs `f` on a worker of rayon's global pool (inline when already on one, or with a
/// single thread), with the pool's other workers kept awake until it returns.
///
/// A streaming step runs a hundred small parallel loops. Started from a thread outside the
/// pool, each would hand its work over and put the caller to sleep until it is done; from
/// inside the pool the caller takes part. Between two loops the other workers go to sleep
/// (rayon parks a worker that found nothing for a few dozen rounds), and waking one costs a
/// futex call and, on a virtual machine, an interrupt to the other vCPU: 32 voluntary context
/// switches per 80 ms codec frame on a 2-core EPYC (6-10 with this). So each other worker
/// runs [`keep_awake`] for the
/// length of the call: it takes every job the call offers as soon as it is offered, and spins
/// in between instead of parking. `MIMI_PY_SPIN=0` turns the keepers off (see [`spin`]).
pub fn in_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let threads = rayon::current_num_threads();
    if threads <= 1 || rayon::current_thread_index().is_some() {
        return f();
    }
    if !spin() {
        return rayon::scope(|_| f());
    }
    let done = AtomicBool::new(false);
    let done = &done;
    rayon::scope(|s| {
        let owner = rayon::current_thread_index();
        for _ in 1..threads {
            s.spawn(move |_| keep_awake(done, owner));
        }
        // Set on the way out, a panic included (it resurfaces once the keepers returned).
        let _finish = Finish(done);
        f()
    })
}

/// Whether [`in_pool`] keeps the pool's other workers spinning for the length of a call (the
/// default). `MIMI_PY_SPIN=0`, read once, lets them park between parallel loops instead: the
/// same results, fewer busy cycles on a machine shared with other work, more context switches
/// (like OpenMP's `OMP_WAIT_POLICY=passive`).
pub fn spin() -> bool {
    crate::runtime::settings::get().spin
}

/// Sets its flag when dropped.
struct Finish<'a>(&'a AtomicBool);

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

thread_local! {
    static KEEPING_AWAKE: Cell<bool> = const { Cell::new(false) };
}

/// A worker's loop while an [`in_pool`] call runs on `owner`: run whatever job the pool
/// offers, spin when there is none, return once `done`. It returns at once on the owner
/// itself (which may pick it up while it waits inside a join: spinning there would never
/// let the call finish) and on a worker already keeping awake.
fn keep_awake(done: &AtomicBool, owner: Option<usize>) {
    if rayon::current_thread_index() == owner || KEEPING_AWAKE.with(Cell::get) {
        return;
    }
    KEEPING_AWAKE.with(|k| k.set(true));
    let mut idle = 0u32;
    while !done.load(Ordering::Acquire) {
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => idle = 0,
            _ => {
                idle += 1;
                // Now and then, let another process have the core (an oversubscribed
                // machine); otherwise stay hot.
                if idle.is_multiple_of(256) {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
    }
    KEEPING_AWAKE.with(|k| k.set(false));
}

// ---------------------------------------------------------------------------------------
// Sliding-window attention for many queries at once (an offline transformer pass).

/// `softmax(q k^T + mask) v` for queries at positions `pos..pos + t`, over keys at
/// positions `key_pos` (any order: a ring buffer's old keys, then the new ones): query `p`
/// sees the keys at positions `(p - context, p]`. Inputs, all f32 and contiguous: the new
/// rows `(q, k, v)` stacked (3, b, heads, t, hd), q already scaled; the key and value rings
/// (b, heads, slots, hd), whose first `key_pos.len() - t` slots per head are the old keys
/// (read in place: no copy of the rings per call). Per query it computes only the span of
/// keys it can see (half of the work of the masked product for a pass from position 0), with
/// no (t, n) mask tensor, and the heads run in parallel.
pub struct WindowAttention {
    pos: u64,
    context: u64,
    key_pos: Vec<u64>,
    /// Per query, the first and one-past-last key it sees (`(0, 0)` for none).
    spans: Vec<(usize, usize)>,
}

impl WindowAttention {
    pub fn new(pos: u64, t: usize, context: usize, key_pos: Vec<u64>) -> Self {
        let mut op = Self {
            pos,
            context: context as u64,
            key_pos,
            spans: Vec::new(),
        };
        op.spans = op.spans(t);
        op
    }

    /// Whether query `i` sees key `j`.
    fn sees(&self, i: usize, j: usize) -> bool {
        let (q, k) = (self.pos + i as u64, self.key_pos[j]);
        k <= q && q - k < self.context
    }

    fn spans(&self, t: usize) -> Vec<(usize, usize)> {
        (0..t)
            .map(|i| {
                let mut seen = (0..self.key_pos.len()).filter(|&j| self.sees(i, j));
                match seen.next() {
                    None => (0, 0),
                    Some(lo) => (lo, seen.next_back().unwrap_or(lo) + 1),
                }
            })
            .collect()
    }
}

/// The keys (or values) of one head, in key order: the ring's `n_old` oldest slots, then
/// the call's new rows; read in place, so a streaming step copies no ring.
#[derive(Clone, Copy)]
struct Rows<'a> {
    old: &'a [f32],
    new: &'a [f32],
    hd: usize,
}

impl<'a> Rows<'a> {
    fn len(&self) -> usize {
        (self.old.len() + self.new.len()) / self.hd
    }

    #[inline(always)]
    fn row(&self, j: usize) -> &'a [f32] {
        let n_old = self.old.len() / self.hd;
        match j.checked_sub(n_old) {
            None => &self.old[j * self.hd..][..self.hd],
            Some(i) => &self.new[i * self.hd..][..self.hd],
        }
    }

    fn iter(&self) -> impl Iterator<Item = &'a [f32]> {
        let (old, new) = (self.old, self.new);
        old.chunks_exact(self.hd).chain(new.chunks_exact(self.hd))
    }
}

/// `kt` (hd rows of `stride`, zero past the `n` keys) = the keys `k` (n, hd) transposed.
#[inline(always)]
fn transpose_keys(k: Rows, hd: usize, stride: usize, kt: &mut Vec<f32>) {
    kt.clear();
    kt.resize(hd * stride, 0.0);
    for (j, row) in k.iter().enumerate() {
        for (d, &x) in row.iter().enumerate() {
            kt[d * stride + j] = x;
        }
    }
}

/// Query `i`'s scores `s` of keys `lo..`, masked (keys its window does not hold, in a ring's
/// order, get -inf) and exponentiated in place; returns 1 / their sum.
#[inline(always)]
fn softmax_span(op: &WindowAttention, i: usize, lo: usize, s: &mut [f32]) -> f32 {
    for (j, sj) in (lo..).zip(s.iter_mut()) {
        if !op.sees(i, j) {
            *sj = f32::NEG_INFINITY;
        }
    }
    let max = s.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    s.iter_mut().for_each(|x| *x = exp_nonpos(*x - max));
    let mut lanes = [0f32; 8];
    for c in s.chunks(8) {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l += x;
        }
    }
    1.0 / lanes.iter().sum::<f32>()
}

/// One head: `kt` is scratch for the keys transposed (hd, n), `scores` for one query's.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn attend_head_generic(
    op: &WindowAttention,
    q: &[f32],
    k: Rows,
    v: Rows,
    hd: usize,
    kt: &mut Vec<f32>,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let n = k.len();
    transpose_keys(k, hd, n, kt);
    scores.resize(n, 0.0);
    for (i, (qi, oi)) in q.chunks_exact(hd).zip(out.chunks_exact_mut(hd)).enumerate() {
        let (lo, hi) = op.spans[i];
        oi.fill(0.0);
        if lo == hi {
            continue;
        }
        // Scores of the span, 8 keys at a time: s[j] += q[d] * kt[d][j].
        let s = &mut scores[lo..hi];
        s.fill(0.0);
        for (d, &qd) in qi.iter().enumerate() {
            for (sj, &kj) in s.iter_mut().zip(&kt[d * n + lo..d * n + hi]) {
                *sj += qd * kj;
            }
        }
        let inv = softmax_span(op, i, lo, s);
        for (&w, vj) in s.iter().zip((lo..hi).map(|j| v.row(j))) {
            for (o, &x) in oi.iter_mut().zip(vj) {
                *o += w * x;
            }
        }
        oi.iter_mut().for_each(|o| *o *= inv);
    }
}

/// [`attend_head_generic`] with AVX2/FMA: 32 scores at a time in registers over the head
/// dimension, and the weighted sum of values in registers, 64 dimensions at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)] // indices mirror the registers
unsafe fn attend_head_avx2(
    op: &WindowAttention,
    q: &[f32],
    k: Rows,
    v: Rows,
    hd: usize,
    kt: &mut Vec<f32>,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    let n = k.len();
    // Keys transposed, rows padded so that 32 scores from any multiple of 8 stay inside;
    // for a few queries (a streaming step) transposing costs more than it saves, and each
    // score is a dot product of rows.
    let transposed = q.len() / hd >= 8;
    let np = n.next_multiple_of(8) + 32;
    if transposed {
        transpose_keys(k, hd, np, kt);
    }
    scores.clear();
    scores.resize(np, 0.0);
    let (ktp, sp) = (kt.as_ptr(), scores.as_mut_ptr());
    for (i, (qi, oi)) in q.chunks_exact(hd).zip(out.chunks_exact_mut(hd)).enumerate() {
        let (lo, hi) = op.spans[i];
        oi.fill(0.0);
        if lo == hi {
            continue;
        }
        if !transposed {
            for j in lo..hi {
                let kj = k.row(j);
                let (qp, kp) = (qi.as_ptr(), kj.as_ptr());
                let mut acc = _mm256_setzero_ps();
                let mut d = 0;
                while d + 8 <= hd {
                    // SAFETY: d + 8 <= hd, within query i and key row j.
                    acc = _mm256_fmadd_ps(
                        _mm256_loadu_ps(qp.add(d)),
                        _mm256_loadu_ps(kp.add(d)),
                        acc,
                    );
                    d += 8;
                }
                let mut lanes = [0f32; 8];
                _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
                let tail: f32 = (d..hd).map(|e| qi[e] * kj[e]).sum();
                scores[j] = lanes.iter().sum::<f32>() + tail;
            }
        }
        let mut j0 = if transposed { lo / 8 * 8 } else { hi };
        while j0 < hi {
            let mut acc = [_mm256_setzero_ps(); 4];
            for (d, &qd) in qi.iter().enumerate() {
                let qv = _mm256_set1_ps(qd);
                // SAFETY: j0 + 32 <= np, and kt has hd rows of np.
                let row = ktp.add(d * np + j0);
                for (r, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(qv, _mm256_loadu_ps(row.add(8 * r)), *a);
                }
            }
            for (r, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(sp.add(j0 + 8 * r), *a);
            }
            j0 += 32;
        }
        let s = &mut scores[lo..hi];
        let inv = softmax_span(op, i, lo, s);
        // Weighted values, 64 dimensions (8 registers) at a time, then the rest by lanes.
        let mut d0 = 0;
        while d0 + 8 <= hd {
            let w8 = ((hd - d0) / 8).min(8);
            let mut acc = [_mm256_setzero_ps(); 8];
            for (j, &w) in (lo..hi).zip(s.iter()) {
                let wv = _mm256_set1_ps(w);
                // SAFETY: d0 + 8 * w8 <= hd, within value row j.
                let row = v.row(j).as_ptr().add(d0);
                for (r, a) in acc.iter_mut().enumerate().take(w8) {
                    *a = _mm256_fmadd_ps(wv, _mm256_loadu_ps(row.add(8 * r)), *a);
                }
            }
            let iv = _mm256_set1_ps(inv);
            for (r, a) in acc.iter().enumerate().take(w8) {
                _mm256_storeu_ps(oi.as_mut_ptr().add(d0 + 8 * r), _mm256_mul_ps(*a, iv));
            }
            d0 += 8 * w8;
        }
        for d in d0..hd {
            let dot: f32 = (lo..hi).zip(s.iter()).map(|(j, &w)| w * v.row(j)[d]).sum();
            oi[d] = dot * inv;
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn attend_head(
    op: &WindowAttention,
    q: &[f32],
    k: Rows,
    v: Rows,
    hd: usize,
    kt: &mut Vec<f32>,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports the features the function was compiled for.
            return unsafe { attend_head_avx2(op, q, k, v, hd, kt, scores, out) };
        }
    }
    attend_head_generic(op, q, k, v, hd, kt, scores, out)
}

impl candle::CustomOp3 for WindowAttention {
    fn name(&self) -> &'static str {
        "mimi-window-attention"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (three, b, h, t, hd) = l1.shape().dims5()?;
        let (b2, h2, slots, hd2) = l2.shape().dims4()?;
        let n_old = self.key_pos.len().checked_sub(t);
        let fits = n_old.is_some_and(|n_old| n_old <= slots);
        if three != 3 || (b2, h2, hd2) != (b, h, hd) || l3.shape() != l2.shape() || !fits {
            candle::bail!(
                "mimi-window-attention: shapes {:?} {:?} for {} keys",
                l1.shape(),
                l2.shape(),
                self.key_pos.len()
            )
        }
        let n_old = n_old.unwrap_or(0);
        let (CpuStorage::F32(new), CpuStorage::F32(k), CpuStorage::F32(v)) = (s1, s2, s3) else {
            candle::bail!("mimi-window-attention: f32 only")
        };
        let offsets = (
            l1.contiguous_offsets(),
            l2.contiguous_offsets(),
            l3.contiguous_offsets(),
        );
        let (Some((na, nb)), Some((ka, kb)), Some((va, vb))) = offsets else {
            candle::bail!("mimi-window-attention: contiguous inputs only")
        };
        if t != self.spans.len() {
            candle::bail!(
                "mimi-window-attention: {t} queries, built for {}",
                self.spans.len()
            )
        }
        let (new, k, v) = (&new[na..nb], &k[ka..kb], &v[va..vb]);
        let (q, knew, vnew) = (
            &new[..b * h * t * hd],
            &new[b * h * t * hd..2 * b * h * t * hd],
            &new[2 * b * h * t * hd..],
        );
        let mut out = vec![0f32; b * h * t * hd];
        let head = |(i, o): (usize, &mut [f32])| {
            let (mut kt, mut scores) = (Vec::new(), Vec::new());
            let (qs, ring) = (t * hd, slots * hd);
            let k = Rows {
                old: &k[i * ring..][..n_old * hd],
                new: &knew[i * qs..][..qs],
                hd,
            };
            let v = Rows {
                old: &v[i * ring..][..n_old * hd],
                new: &vnew[i * qs..][..qs],
                hd,
            };
            attend_head(self, &q[i * qs..][..qs], k, v, hd, &mut kt, &mut scores, o);
        };
        if b * h > 1 && rayon::current_num_threads() > 1 {
            out.par_chunks_mut(t * hd).enumerate().for_each(head);
        } else {
            out.chunks_mut(t * hd).enumerate().for_each(head);
        }
        Ok((CpuStorage::F32(out), Shape::from((b, h, t, hd))))
    }
}

/// A linear layer (`y = x W^T + b`) with the fast path described in the module docs.
#[derive(Clone, Debug)]
pub struct Linear {
    inner: candle_nn::Linear,
    fast: bool,
}

impl Linear {
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Result<Self> {
        let fast = weight.device().is_cpu() && weight.dtype() == DType::F32;
        let weight = if fast { weight.contiguous()? } else { weight };
        Ok(Self {
            inner: candle_nn::Linear::new(weight, bias),
            fast,
        })
    }

    pub fn from_candle(l: &candle_nn::Linear) -> Result<Self> {
        Self::new(l.weight().clone(), l.bias().cloned())
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dims = x.dims();
        let k = *dims.last().unwrap_or(&0);
        let rows = x.elem_count() / k.max(1);
        if !self.fast || rows == 0 || x.dtype() != DType::F32 {
            return self.inner.forward(x);
        }
        let w = self.inner.weight();
        let n = w.dim(0)?;
        if rows > GEMV_MAX_ROWS && n < 2 * k {
            return self.inner.forward(x);
        }
        let x2 = x.contiguous()?.reshape((rows, k))?;
        let y = if rows > GEMV_MAX_ROWS {
            x2.apply_op2_no_bwd(w, &WideGemm)?
        } else {
            x2.apply_op2_no_bwd(w, &Gemv)?
        };
        let y = match self.inner.bias() {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        };
        let mut out_dims = dims.to_vec();
        *out_dims.last_mut().expect("rank >= 1") = n;
        y.reshape(out_dims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn residual_add_has_candles_bits() {
        let dev = candle::Device::Cpu;
        // Odd sizes; a transposed (non-contiguous) y; small and pool-sized inputs.
        for (rows, d) in [(3usize, 7usize), (250, 512), (1, 1), (97, 130)] {
            let x = Tensor::randn(0f32, 1., (1, rows, d), &dev).unwrap();
            let y = Tensor::randn(0f32, 1., (1, d, rows), &dev)
                .unwrap()
                .transpose(1, 2)
                .unwrap();
            let s = Tensor::randn(0f32, 0.1, d, &dev).unwrap();
            let want = (&x + y.broadcast_mul(&s).unwrap()).unwrap();
            let got = residual_add(&x, &y, Some(&s)).unwrap();
            assert_eq!(got.dims(), want.dims());
            let (g, w): (Vec<f32>, Vec<f32>) = (
                got.flatten_all().unwrap().to_vec1().unwrap(),
                want.flatten_all().unwrap().to_vec1().unwrap(),
            );
            assert!(g.iter().zip(&w).all(|(a, b)| a.to_bits() == b.to_bits()));
            let plain = residual_add(&x, &y, None).unwrap();
            let want = (&x + &y).unwrap();
            let diff = (plain - want).unwrap().abs().unwrap().max_all().unwrap();
            assert_eq!(diff.to_scalar::<f32>().unwrap(), 0.0);
        }
        // Other dtypes go to candle's ops.
        let x = Tensor::ones((2, 4), DType::F64, &dev).unwrap();
        let got = residual_add(&x, &x, None).unwrap();
        assert_eq!(got.to_vec2::<f64>().unwrap(), vec![vec![2.0; 4]; 2]);
    }

    #[test]
    fn gelu_erf_matches_candle() {
        let xs: Vec<f32> = (-40000..=40000)
            .map(|i| i as f32 * 3e-4)
            .chain([-1e4, 1e4, 0.0, -30.0])
            .collect();
        let t = Tensor::new(xs.as_slice(), &candle::Device::Cpu).unwrap();
        let want: Vec<f32> = t.gelu_erf().unwrap().to_vec1().unwrap();
        let got: Vec<f32> = gelu_erf(&t).unwrap().to_vec1().unwrap();
        for ((x, g), w) in xs.iter().zip(&got).zip(&want) {
            assert!(
                (g - w).abs() <= 5e-7 * x.abs().max(1.0),
                "x={x}: {g} vs {w}"
            );
        }
    }

    #[test]
    fn exp_nonpos_is_accurate() {
        for i in 0..=86_990 {
            let x = -(i as f32) * 1e-3;
            let want = (x as f64).exp();
            let got = exp_nonpos(x) as f64;
            assert!(
                (got - want).abs() <= 2.5e-7 * want,
                "x={x}: {got} vs {want}"
            );
        }
    }
    use candle::Device;

    /// The window kernel against candle's masked softmax product, on odd head sizes (the
    /// register blocks' remainders), keys in ring order, and queries that see no key.
    #[test]
    fn window_attention_matches_candle_masked_softmax() {
        let dev = Device::Cpu;
        let input = |seed, shape: (usize, usize, usize, usize)| {
            let (a, b, c, d) = shape;
            let data = crate::testutil::test_input(a * b, c, d, seed);
            Tensor::from_vec(data, shape, &dev).unwrap()
        };
        // (pos, t, context, key positions): a fresh pass; a ring of 5 old keys (slot order)
        // then 7 new ones; keys a query cannot see at all.
        let cases: [(u64, usize, usize, Vec<u64>); 3] = [
            (0, 37, 250, (0..37).collect()),
            (12, 7, 5, vec![10, 11, 7, 8, 9, 12, 13, 14, 15, 16, 17, 18]),
            (100, 3, 2, vec![1, 2, 100, 101, 102]),
        ];
        for hd in [5, 13, 64, 72] {
            for (pos, t, context, key_pos) in cases.iter().cloned() {
                let n = key_pos.len();
                let (q, k, v) = (
                    input(1, (2, 3, t, hd)),
                    input(2, (2, 3, n, hd)),
                    input(3, (2, 3, n, hd)),
                );
                let mask: Vec<f32> = (0..t as u64)
                    .flat_map(|i| {
                        key_pos.iter().map(move |&kp| {
                            let p = pos + i;
                            if kp <= p && p - kp < context as u64 {
                                0.0
                            } else {
                                f32::NEG_INFINITY
                            }
                        })
                    })
                    .collect();
                let mask = Tensor::from_vec(mask, (t, n), &dev).unwrap();
                let scores = q
                    .matmul(&k.t().unwrap())
                    .unwrap()
                    .broadcast_add(&mask)
                    .unwrap();
                let rows = |x: Tensor| x.flatten_to(2).unwrap().to_vec2::<f32>().unwrap();
                let want = rows(
                    candle_nn::ops::softmax_last_dim(&scores)
                        .unwrap()
                        .matmul(&v)
                        .unwrap(),
                );
                // The op reads the old keys from rings with spare slots (which must not be
                // read) and the new ones from the stacked (q, k, v).
                let op = WindowAttention::new(pos, t, context, key_pos.clone());
                let n_old = n - t;
                let ring = |x: &Tensor| {
                    let spare = (x.narrow(2, 0, n_old.min(1)).unwrap() * f64::NAN).unwrap();
                    Tensor::cat(&[&x.narrow(2, 0, n_old).unwrap(), &spare], 2).unwrap()
                };
                let new = |x: &Tensor| x.narrow(2, n_old, t).unwrap();
                let stacked = Tensor::stack(&[&q, &new(&k), &new(&v)], 0).unwrap();
                let got4 = rows(stacked.apply_op3_no_bwd(&ring(&k), &ring(&v), &op).unwrap());
                // Queries that see no key: zeros (candle gives NaN there).
                // The portable fallback computes the same, head by head.
                let (qf, kf, vf) = (
                    rows(q.clone()).concat(),
                    rows(k.clone()).concat(),
                    rows(v.clone()).concat(),
                );
                for h in 0..6 {
                    let mut o = vec![0f32; t * hd];
                    fn split(x: &[f32], at: usize, hd: usize) -> Rows<'_> {
                        let (old, new) = x.split_at(at * hd);
                        Rows { old, new, hd }
                    }
                    let (kh, vh) = (&kf[h * n * hd..][..n * hd], &vf[h * n * hd..][..n * hd]);
                    let qh = &qf[h * t * hd..][..t * hd];
                    let (mut kt, mut sc) = (Vec::new(), Vec::new());
                    let (kh, vh) = (split(kh, n_old, hd), split(vh, n_old, hd));
                    attend_head_generic(&op, qh, kh, vh, hd, &mut kt, &mut sc, &mut o);
                    for (a, b) in o.iter().zip(got4[h * t..(h + 1) * t].concat()) {
                        assert!(
                            (a - b).abs() <= 1e-5,
                            "generic, hd {hd} pos {pos}: {a} vs {b}"
                        );
                    }
                }
                for (row, (g, w)) in got4.iter().zip(&want).enumerate() {
                    for (a, b) in g.iter().zip(w) {
                        let ok = if b.is_nan() {
                            *a == 0.0
                        } else {
                            (a - b).abs() <= 1e-5
                        };
                        assert!(ok, "hd {hd} pos {pos} row {row}: {a} vs {b}");
                    }
                }
            }
        }
    }

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

    #[test]
    fn linear_matches_candle_matmul() {
        let dev = Device::Cpu;
        for (m, k, n) in [
            (1, 512, 1536),
            (2, 64, 200),
            (3, 37, 5),
            (4, 2048, 512),
            (1, 7, 1),
            // More rows: the widening product (n >= 2k) and candle's.
            (5, 37, 80),
            (33, 64, 200),
            (250, 512, 1536),
            (9, 16, 16),
        ] {
            let x =
                Tensor::from_vec(crate::testutil::test_input(1, m, k, 1), (m, k), &dev).unwrap();
            let w =
                Tensor::from_vec(crate::testutil::test_input(1, n, k, 2), (n, k), &dev).unwrap();
            let b = Tensor::from_vec(crate::testutil::test_input(1, 1, n, 3), n, &dev).unwrap();
            let reference = candle_nn::Linear::new(w.clone(), Some(b.clone()));
            let ours = Linear::new(w, Some(b)).unwrap();
            for shape in [vec![m, k], vec![1, m, k]] {
                let xs = x.reshape(shape.as_slice()).unwrap();
                let d = crate::testutil::max_abs_diff(
                    &ours.forward(&xs).unwrap(),
                    &reference.forward(&xs).unwrap(),
                );
                assert!(
                    d < 1e-4 * (k as f32).sqrt(),
                    "m={m} k={k} n={n}: max diff {d}"
                );
            }
        }
    }
}
