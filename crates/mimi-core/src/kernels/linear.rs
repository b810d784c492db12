//! [`Linear`]: a linear layer whose weight, on the CPU in f32 or bf16, is packed once at load
//! ([`Packed`]) and multiplied by the packed product for any number of rows: a streaming
//! step's few rows and an offline block's hundreds alike (measured against candle's and
//! `gemm`'s products, offline encode + decode of 10 s: 0.97x the time in f32, 0.94x with bf16
//! weights). The packed weight replaces the row-major one, so the weights are held once.
//! Elsewhere (GPUs, f16 weights) it is candle's `Linear`.
//!
//! Its weight may be stored in bf16 while it computes in f32 (`weights_dtype="bfloat16"`):
//! the packed product reads the bf16 weights as they are (half the bytes a step reads) and
//! widens them in registers. A model computing in bf16 on the CPU gets its input widened to
//! f32 and its output rounded back.
use super::packed::Packed;
use candle::{CpuStorage, CustomOp1, DType, Device, Layout, Module, Result, Shape, Tensor};
use half::bf16;
use std::sync::Arc;

/// A weight packed once at load ([`Packed`]), in its stored type, with its bias in f32; the
/// bias is added in the product's store.
#[derive(Debug)]
enum PackedLinear {
    F32(Packed<f32>, Option<Vec<f32>>),
    BF16(Packed<bf16>, Option<Vec<f32>>),
}

/// The data of contiguous CPU tensors of dtype `W`, if they all are (`guards`: their storage
/// and layout, as `Tensor::storage_and_layout` gives them).
fn slices<'a, W: 'static, G: std::ops::Deref<Target = candle::Storage>>(
    guards: &'a [(G, &Layout)],
    data: impl Fn(&CpuStorage) -> Option<&[W]>,
) -> Option<Vec<&'a [W]>> {
    let one = |(s, l): &'a (G, &Layout)| {
        let (a, b) = l.contiguous_offsets()?;
        match &**s {
            candle::Storage::Cpu(c) => data(c)?.get(a..b),
            _ => None,
        }
    };
    guards.iter().map(one).collect()
}

impl PackedLinear {
    /// Packs CPU weights `(rows, k)` in f32 or bf16, stacked in order, read in place.
    fn new(parts: &[Tensor], bias: Option<&Tensor>) -> Result<Self> {
        let k = parts.first().map_or(Ok(0), |t| t.dim(1))?;
        let bias = bias
            .map(|b| b.to_dtype(DType::F32)?.to_vec1::<f32>())
            .transpose()?;
        let parts = parts
            .iter()
            .map(Tensor::contiguous)
            .collect::<Result<Vec<_>>>()?;
        let guards: Vec<_> = parts.iter().map(Tensor::storage_and_layout).collect();
        let f32s = slices(&guards, |c| match c {
            CpuStorage::F32(v) => Some(v.as_slice()),
            _ => None,
        });
        let bf16s = slices(&guards, |c| match c {
            CpuStorage::BF16(v) => Some(v.as_slice()),
            _ => None,
        });
        match (f32s, bf16s) {
            (Some(w), _) => Ok(Self::F32(Packed::pack(&w, k), bias)),
            (None, Some(w)) => Ok(Self::BF16(Packed::pack(&w, k), bias)),
            _ => candle::bail!("mimi-packed-linear: f32 or bf16 CPU weights of one dtype only"),
        }
    }

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

    /// The weight `(n, k)` row-major, in its stored dtype, on the CPU.
    fn weight(&self) -> Result<Tensor> {
        match self {
            Self::F32(w, _) => Tensor::from_vec(w.unpack(), (w.n(), w.k()), &Device::Cpu),
            Self::BF16(w, _) => Tensor::from_vec(w.unpack(), (w.n(), w.k()), &Device::Cpu),
        }
    }

    fn dtype(&self) -> DType {
        match self {
            Self::F32(..) => DType::F32,
            Self::BF16(..) => DType::BF16,
        }
    }

    /// Bytes of the weight as stored (without the panels' padding).
    fn nbytes(&self) -> usize {
        match self {
            Self::F32(w, _) => 4 * w.n() * w.k(),
            Self::BF16(w, _) => 2 * w.n() * w.k(),
        }
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
        let (n, y) = match self {
            Self::F32(w, bias) if w.k() == k && b - a == m * k => {
                (w.n(), Self::run(w, &x[a..b], m, bias))
            }
            Self::BF16(w, bias) if w.k() == k && b - a == m * k => {
                (w.n(), Self::run(w, &x[a..b], m, bias))
            }
            _ => candle::bail!("mimi-packed-linear: bad input shape {:?}", l.shape()),
        };
        Ok((CpuStorage::F32(y), Shape::from((m, n))))
    }
}

/// A linear layer (`y = x W^T + b`): packed on the CPU, candle's elsewhere (module doc).
#[derive(Clone, Debug)]
pub struct Linear(Imp);

#[derive(Clone, Debug)]
enum Imp {
    Packed(Arc<PackedLinear>),
    Candle(candle_nn::Linear),
}

impl Linear {
    /// A layer of `weight` `(out, in)` and an optional `bias` `(out)`, packed when the weight
    /// is f32 or bf16 on the CPU.
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Result<Self> {
        Self::stacked(vec![weight], bias)
    }

    /// A layer whose weight is `parts` stacked along the output features (q, k and v as one
    /// product); packed from the parts in place on the CPU, concatenated for candle elsewhere.
    pub fn stacked(parts: Vec<Tensor>, bias: Option<Tensor>) -> Result<Self> {
        let packable =
            |t: &Tensor| t.device().is_cpu() && matches!(t.dtype(), DType::F32 | DType::BF16);
        if parts.iter().all(packable) {
            let packed = PackedLinear::new(&parts, bias.as_ref())?;
            return Ok(Self(Imp::Packed(Arc::new(packed))));
        }
        let weight = match parts.len() {
            1 => parts.into_iter().next().expect("one part"),
            _ => Tensor::cat(&parts, 0)?,
        };
        Ok(Self(Imp::Candle(candle_nn::Linear::new(weight, bias))))
    }

    /// The same layer as candle's `l`.
    pub fn from_candle(l: &candle_nn::Linear) -> Result<Self> {
        Self::new(l.weight().clone(), l.bias().cloned())
    }

    /// The dtype the weight is stored in.
    pub fn weight_dtype(&self) -> DType {
        match &self.0 {
            Imp::Packed(p) => p.dtype(),
            Imp::Candle(l) => l.weight().dtype(),
        }
    }

    /// Whether the weight is held packed (then [`Self::weight`] rebuilds the row-major one).
    pub fn is_packed(&self) -> bool {
        matches!(self.0, Imp::Packed(_))
    }

    /// The weight `(out, in)` in its stored dtype: candle's, or unpacked (a copy).
    pub fn weight(&self) -> Result<Tensor> {
        match &self.0 {
            Imp::Packed(p) => p.weight(),
            Imp::Candle(l) => Ok(l.weight().clone()),
        }
    }

    /// `y (m, out) = x (m, in) . W^T + b` on host slices, with the packed product; `false`
    /// (nothing written) when the weight is not packed.
    pub fn matmul_into(&self, x: &[f32], m: usize, y: &mut [f32]) -> bool {
        match &self.0 {
            Imp::Packed(p) => {
                match p.as_ref() {
                    PackedLinear::F32(w, b) => w.matmul(x, m, b.as_deref(), y),
                    PackedLinear::BF16(w, b) => w.matmul(x, m, b.as_deref(), y),
                }
                true
            }
            Imp::Candle(_) => false,
        }
    }

    /// Bytes of the weight matrix as stored.
    pub fn weight_nbytes(&self) -> usize {
        match &self.0 {
            Imp::Packed(p) => p.nbytes(),
            Imp::Candle(l) => l.weight().elem_count() * l.weight().dtype().size_in_bytes(),
        }
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let packed = match &self.0 {
            Imp::Packed(p) => p,
            Imp::Candle(l) => return l.forward(x),
        };
        let dims = x.dims();
        let k = *dims.last().unwrap_or(&0);
        let rows = x.elem_count() / k.max(1);
        let x2 = x.to_dtype(DType::F32)?.contiguous()?.reshape((rows, k))?;
        let y = x2.apply_op1_no_bwd(packed.as_ref())?;
        let mut out_dims = dims.to_vec();
        *out_dims.last_mut().expect("rank >= 1") = y.dim(1)?;
        y.reshape(out_dims)?.to_dtype(x.dtype())
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
