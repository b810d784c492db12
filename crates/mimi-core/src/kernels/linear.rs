//! [`Linear`]: a linear layer that, for a few input rows on the CPU in f32 (a streaming step:
//! batch x time <= [`PACKED_MAX_ROWS`]), runs on its weight packed once at load
//! ([`Packed`]) instead of candle's general matmul. Otherwise (more rows, other dtypes, GPUs)
//! it is candle's `Linear`, except that a widening layer with many rows runs its product
//! transposed (`WideGemm`). Both products are candle custom ops on the CPU storage.
//!
//! Its weight may be stored in bf16 while it computes in f32 (`weights_dtype="bfloat16"`):
//! the packed product then reads the bf16 weights as they are (half the bytes a streaming
//! step reads); a call with more rows widens the weight to f32 for that call.
use super::elementwise::{f32_slices, CpuOperand};
use super::packed::{Packed, PACKED_MAX_ROWS};
use candle::{CpuStorage, CustomOp1, CustomOp2, DType, Layout, Module, Result, Shape, Tensor};
use half::bf16;
use std::sync::Arc;

/// A weight packed once at load ([`Packed`]), in its stored type, with its bias in f32:
/// the product of a streaming step's rows (up to [`PACKED_MAX_ROWS`]), bias fused.
#[derive(Debug)]
enum PackedLinear {
    F32(Packed<f32>, Option<Vec<f32>>),
    BF16(Packed<bf16>, Option<Vec<f32>>),
}

impl PackedLinear {
    /// Packs a contiguous CPU `weight` (n, k) in f32 or bf16.
    fn new(weight: &Tensor, bias: Option<&Tensor>) -> Result<Self> {
        let (n, k) = weight.dims2()?;
        let bias = bias
            .map(|b| b.to_dtype(DType::F32)?.to_vec1::<f32>())
            .transpose()?;
        let flat = weight.flatten_all()?;
        Ok(match weight.dtype() {
            DType::BF16 => Self::BF16(Packed::pack(&flat.to_vec1::<bf16>()?, n, k), bias),
            _ => Self::F32(
                Packed::pack(&flat.to_dtype(DType::F32)?.to_vec1::<f32>()?, n, k),
                bias,
            ),
        })
    }
}

impl CustomOp1 for PackedLinear {
    fn name(&self) -> &'static str {
        "mimi-packed-linear"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (m, k) = l.shape().dims2()?;
        let (CpuStorage::F32(x), Some((a, b))) = (s, l.contiguous_offsets()) else {
            candle::bail!("mimi-packed-linear: an f32 contiguous input only")
        };
        if m > PACKED_MAX_ROWS || b - a != m * k {
            candle::bail!("mimi-packed-linear: bad input shape {:?}", l.shape())
        }
        let x = &x[a..b];
        let (n, y) = match self {
            Self::F32(w, bias) => (w.n(), Self::run(w, x, m, bias)),
            Self::BF16(w, bias) => (w.n(), Self::run(w, x, m, bias)),
        };
        Ok((CpuStorage::F32(y), Shape::from((m, n))))
    }
}

impl PackedLinear {
    fn run<W: super::Weight + Default>(
        w: &Packed<W>,
        x: &[f32],
        m: usize,
        bias: &Option<Vec<f32>>,
    ) -> Vec<f32> {
        let mut y = vec![0f32; m * w.n()];
        w.matmul(x, m, bias.as_deref(), &mut y);
        y
    }
}

/// `x`, `W` and `(m, k, n)` of a product `x (m, k) . W (n, k)^T`.
type Operands<'a> = (&'a [f32], &'a [f32], (usize, usize, usize));

/// The operands of a product op: both f32, contiguous, `m > 0`, the same `k`.
fn product_operands<'a>(
    op: &str,
    (s1, l1): CpuOperand<'a, '_>,
    (s2, l2): CpuOperand<'a, '_>,
) -> Result<Operands<'a>> {
    let shape = product_shape(op, l1, l2)?;
    let (x, w) = f32_slices(op, (s1, l1), (s2, l2))?;
    Ok((x, w, shape))
}

/// `(m, k, n)` of a product `x (m, k) . W (n, k)^T`: `m > 0` and the same `k`.
fn product_shape(op: &str, l1: &Layout, l2: &Layout) -> Result<(usize, usize, usize)> {
    let (m, k) = l1.shape().dims2()?;
    let (n, k2) = l2.shape().dims2()?;
    if k != k2 || m == 0 {
        candle::bail!("{op}: bad shapes {:?} {:?}", l1.shape(), l2.shape())
    }
    Ok((m, k, n))
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
        let (x, w, (m, k, n)) = product_operands(self.name(), (s1, l1), (s2, l2))?;
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

/// A linear layer (`y = x W^T + b`) with the fast path described in the module docs.
#[derive(Clone, Debug)]
pub struct Linear {
    inner: candle_nn::Linear,
    /// The weight packed for a few rows: the fast path, for an f32 or bf16 weight on the CPU.
    packed: Option<Arc<PackedLinear>>,
    /// For a bf16 weight computing in f32: the bias in f32 (converted once).
    bias32: Option<Tensor>,
}

impl Linear {
    /// A layer of `weight` `(out, in)` and an optional `bias` `(out)`; the fast path is taken
    /// when the weight is f32 or bf16 on the CPU (made contiguous here, once).
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Result<Self> {
        let fast = weight.device().is_cpu() && matches!(weight.dtype(), DType::F32 | DType::BF16);
        let weight = if fast { weight.contiguous()? } else { weight };
        let bias32 = match (&bias, weight.dtype()) {
            (Some(b), DType::BF16) => Some(b.to_dtype(DType::F32)?),
            _ => None,
        };
        let packed = match fast {
            true => Some(Arc::new(PackedLinear::new(&weight, bias.as_ref())?)),
            false => None,
        };
        Ok(Self {
            inner: candle_nn::Linear::new(weight, bias),
            packed,
            bias32,
        })
    }

    /// The same layer as candle's `l` (its weight and bias shared, not copied).
    pub fn from_candle(l: &candle_nn::Linear) -> Result<Self> {
        Self::new(l.weight().clone(), l.bias().cloned())
    }

    /// The dtype the weight is stored in.
    pub fn weight_dtype(&self) -> DType {
        self.inner.weight().dtype()
    }

    /// `x (rows, k) W^T` in f32 for rows beyond the packed product, the weight `w`
    /// in f32: transposed on `gemm` for a widening layer, candle's matmul otherwise.
    fn many_rows(x2: &Tensor, w: &Tensor, k: usize) -> Result<Tensor> {
        if w.dim(0)? >= 2 * k {
            x2.apply_op2_no_bwd(w, &WideGemm)
        } else {
            x2.matmul(&w.t()?)
        }
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dims = x.dims();
        let k = *dims.last().unwrap_or(&0);
        let rows = x.elem_count() / k.max(1);
        let w = self.inner.weight();
        let mixed = w.dtype() == DType::BF16 && x.dtype() == DType::F32;
        let Some(packed) = &self.packed else {
            return self.inner.forward(x);
        };
        if rows == 0 || (x.dtype() != DType::F32 && !mixed) {
            return self.inner.forward(x);
        }
        let n = w.dim(0)?;
        if rows > PACKED_MAX_ROWS && n < 2 * k && !mixed {
            return self.inner.forward(x);
        }
        let x2 = x.contiguous()?.reshape((rows, k))?;
        let y = if rows <= PACKED_MAX_ROWS {
            // The bias is added in the product's store.
            x2.apply_op1_no_bwd(packed.as_ref())?
        } else {
            let y = match mixed {
                true => Self::many_rows(&x2, &w.to_dtype(DType::F32)?, k)?,
                false => x2.apply_op2_no_bwd(w, &WideGemm)?,
            };
            match if mixed {
                self.bias32.as_ref()
            } else {
                self.inner.bias()
            } {
                Some(b) => y.broadcast_add(b)?,
                None => y,
            }
        };
        let mut out_dims = dims.to_vec();
        *out_dims.last_mut().expect("rank >= 1") = n;
        y.reshape(out_dims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle::Device;

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

    /// A bf16 weight computing in f32 gives candle's f32 product of the widened weight, for
    /// the matrix-vector kernel's rows and beyond.
    #[test]
    fn bf16_weight_matches_widened_f32() {
        let dev = Device::Cpu;
        for (m, k, n) in [
            (1, 512, 1536),
            (16, 64, 200),
            (32, 96, 40),
            (40, 64, 200),
            (33, 64, 20),
        ] {
            let x =
                Tensor::from_vec(crate::testutil::test_input(1, m, k, 1), (m, k), &dev).unwrap();
            let w = Tensor::from_vec(crate::testutil::test_input(1, n, k, 2), (n, k), &dev)
                .unwrap()
                .to_dtype(DType::BF16)
                .unwrap();
            let b = Tensor::from_vec(crate::testutil::test_input(1, 1, n, 3), n, &dev)
                .unwrap()
                .to_dtype(DType::BF16)
                .unwrap();
            let wide = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
            let reference = candle_nn::Linear::new(wide(&w), Some(wide(&b)));
            let ours = Linear::new(w, Some(b)).unwrap();
            let got = ours.forward(&x).unwrap();
            assert_eq!(got.dtype(), DType::F32);
            let d = crate::testutil::max_abs_diff(&got, &reference.forward(&x).unwrap());
            // The packed product widens the bf16 weight exactly and multiplies in f32.
            assert!(
                d < 1e-4 * (k as f32).sqrt(),
                "m={m} k={k} n={n}: max diff {d}"
            );
        }
    }
}
