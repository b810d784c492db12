//! [`Linear`]: a linear layer whose weight, on the CPU in f32 or bf16, is packed once at load
//! ([`Packed`]) and multiplied by the packed product for any number of rows: a streaming
//! step's few rows and an offline block's hundreds alike (measured against candle's and
//! `gemm`'s products, offline encode + decode of 10 s: 0.97x the time in f32, 0.94x with bf16
//! weights). The packed weight replaces the row-major one, so the weights are held once.
//! Elsewhere (GPUs, f16 weights) it is candle's `Linear`.
//!
//! Its weight may be stored in bf16 while it computes in f32 (`precision="high"`):
//! the packed product reads the bf16 weights as they are (half the bytes a step reads) and
//! widens them in registers. A model computing in bf16 on the CPU gets its input widened to
//! f32 and its output rounded back. With `precision="medium"` the weight is held in pairs
//! ([`PairPacked`]) and its input rounded to bf16 pairs, for products with f32 sums.
use super::bf16dot::{round_pairs, PairInput, PairPacked};
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
    Pairs(PairPacked, Option<Vec<f32>>),
}

thread_local! {
    /// The input rounded to pairs, kept between calls (a warm step allocates nothing).
    static PAIRS: std::cell::Cell<Vec<u32>> = const { std::cell::Cell::new(Vec::new()) };
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

    /// The same weight in pairs (`precision="medium"`; a pair-packed one stays).
    fn to_pairs(&self) -> Self {
        match self {
            Self::F32(w, b) => Self::Pairs(PairPacked::pack(&w.unpack(), w.n(), w.k()), b.clone()),
            Self::BF16(w, b) => {
                let wide: Vec<f32> = w.unpack().iter().map(|v| v.to_f32()).collect();
                Self::Pairs(PairPacked::pack(&wide, w.n(), w.k()), b.clone())
            }
            Self::Pairs(w, b) => Self::Pairs(w.clone(), b.clone()),
        }
    }

    /// `y (m, n) = x (m, k) . W^T + bias` into `y`, whatever the weight's form.
    fn matmul(&self, x: &[f32], m: usize, y: &mut [f32]) {
        match self {
            Self::F32(w, b) => w.matmul(x, m, b.as_deref(), y),
            Self::BF16(w, b) => w.matmul(x, m, b.as_deref(), y),
            Self::Pairs(w, b) => super::with_scratch(&PAIRS, |xp| {
                let k = w.dims().1;
                round_pairs(x, m, k, xp);
                w.matmul(PairInput::rows(xp, k.div_ceil(2)), m, b.as_deref(), y)
            }),
        }
    }

    fn dims(&self) -> (usize, usize) {
        match self {
            Self::F32(w, _) => (w.n(), w.k()),
            Self::BF16(w, _) => (w.n(), w.k()),
            Self::Pairs(w, _) => w.dims(),
        }
    }

    /// The weight `(n, k)` row-major, in its stored dtype, on the CPU.
    fn weight(&self) -> Result<Tensor> {
        match self {
            Self::F32(w, _) => Tensor::from_vec(w.unpack(), (w.n(), w.k()), &Device::Cpu),
            Self::BF16(w, _) => Tensor::from_vec(w.unpack(), (w.n(), w.k()), &Device::Cpu),
            Self::Pairs(w, _) => {
                Tensor::from_vec(w.unpack(), w.dims(), &Device::Cpu)?.to_dtype(DType::BF16)
            }
        }
    }

    fn dtype(&self) -> DType {
        match self {
            Self::F32(..) => DType::F32,
            Self::BF16(..) | Self::Pairs(..) => DType::BF16,
        }
    }

    /// Bytes of the weight as stored (without the panels' padding).
    fn nbytes(&self) -> usize {
        match self {
            Self::F32(w, _) => 4 * w.n() * w.k(),
            Self::BF16(w, _) => 2 * w.n() * w.k(),
            Self::Pairs(w, _) => w.nbytes(),
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
        let (n, wk) = self.dims();
        if wk != k || b - a != m * k {
            candle::bail!("mimi-packed-linear: bad input shape {:?}", l.shape())
        }
        let mut y = vec![0f32; m * n];
        self.matmul(&x[a..b], m, &mut y);
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

    /// Holds the weight in bf16 pairs for products with f32 sums (`precision="medium"`);
    /// a weight candle holds stays.
    pub fn pair_pack(&mut self) {
        if let Imp::Packed(p) = &self.0 {
            self.0 = Imp::Packed(Arc::new(p.to_pairs()));
        }
    }

    /// Whether the weight is held in bf16 pairs ([`Self::pair_pack`]).
    pub fn is_pairs(&self) -> bool {
        matches!(&self.0, Imp::Packed(p) if matches!(**p, PackedLinear::Pairs(..)))
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
                p.matmul(x, m, y);
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

    /// `precision="medium"`: a pair-packed layer is within bf16's rounding of the f32 one, and
    /// each row of a batch gets the bits it gets alone (any number of rows).
    #[test]
    fn pair_packed_rows_are_their_own() {
        let dev = Device::Cpu;
        let (m, k, n) = (13, 96, 40);
        let x = Tensor::from_vec(crate::testutil::test_input(1, m, k, 1), (m, k), &dev).unwrap();
        let w = Tensor::from_vec(crate::testutil::test_input(1, n, k, 2), (n, k), &dev).unwrap();
        let b = Tensor::from_vec(crate::testutil::test_input(1, 1, n, 3), n, &dev).unwrap();
        let f32 = Linear::new(w.clone(), Some(b.clone())).unwrap();
        let mut ours = Linear::new(w, Some(b)).unwrap();
        ours.pair_pack();
        assert!(ours.is_pairs() && ours.weight_dtype() == DType::BF16);
        let (want, got) = (f32.forward(&x).unwrap(), ours.forward(&x).unwrap());
        let d = crate::testutil::max_abs_diff(&got, &want);
        assert!(d < 2f32.powi(-7) * (k as f32).sqrt(), "max diff {d}");
        let rows = got.to_vec2::<f32>().unwrap();
        for (r, row) in rows.iter().enumerate() {
            let alone = ours.forward(&x.narrow(0, r, 1).unwrap()).unwrap();
            assert_eq!(&alone.to_vec2::<f32>().unwrap()[0], row, "row {r}");
        }
    }
}
