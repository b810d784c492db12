//! Elementwise custom ops on the CPU in f32, branch-free so that their loops over slices
//! compile to AVX2 (the GELU slice loop is compiled a second time with AVX2/FMA, chosen at
//! run time): [`gelu_erf`], [`residual_add`], the `e^x` they and the attention's softmax
//! share (`exp_nonpos`), and `f32_slices`, the operand check of every two-input op here.

use candle::{CpuStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape, Tensor};

/// One operand of a custom op: its CPU storage and its layout.
pub(super) type CpuOperand<'s, 'l> = (&'s CpuStorage, &'l Layout);

/// The values of two contiguous f32 CPU operands of a custom op named `op`.
pub(super) fn f32_slices<'a>(
    op: &str,
    (s1, l1): CpuOperand<'a, '_>,
    (s2, l2): CpuOperand<'a, '_>,
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

pub(crate) fn gelu_erf_slice(src: &[f32], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if super::cpu::has(super::cpu::Level::Avx2) {
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
            super::for_each_chunk_mut(&mut out, CHUNK, |i, d| {
                gelu_erf_slice(&src[i * CHUNK..][..d.len()], d)
            });
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
        let (x, y) = f32_slices(self.name(), (s1, l1), (s2, l2))?;
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
            super::for_each_chunk_mut(&mut out, block, |i, o| {
                let (xb, yb) = (&x[i * block..][..o.len()], &y[i * block..][..o.len()]);
                self.rows(xb, yb, o)
            });
        }
        Ok((CpuStorage::F32(out), l1.shape().clone()))
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
            assert_eq!(crate::testutil::max_abs_diff(&plain, &want), 0.0);
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
}
