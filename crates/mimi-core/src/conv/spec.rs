//! What both convolutions are built from: their shape ([`ConvSpec`]), their streaming state
//! ([`ConvState`]), and their weights as candle's Mimi modules store them ([`conv_weight`],
//! plain or weight-norm, read into a host `Vec` by [`to_vec`]).

use crate::rows::RowList;
use candle::{DType, Device, Result, Tensor};
use candle_nn::VarBuilder;
use std::sync::Arc;

use crate::kernels::Packed;

use super::frames::Frames;
use crate::config::PadMode;

/// Output frames up to which a convolution takes the matrix-vector kernel: one row's
/// streaming step (its other strategies measured faster for more frames). Below the kernel's
/// own limit ([`crate::kernels::GEMV_MAX_ROWS`]), which the transformer's batched steps use.
pub(crate) const STEP_FRAMES: usize = 8;

/// The streaming state of one convolution: the activated input frames the next output
/// frames still need.
#[derive(Clone, Debug, Default)]
pub struct ConvState {
    /// The frames kept from the previous chunks (`None` before the first).
    pub(super) prev: Option<Frames>,
    /// Input frames received so far (what the offline padding of the last chunk needs).
    pub(super) seen: usize,
}

/// The shape of one convolution: channels, kernel, stride, dilation, bias, padding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvSpec {
    /// Input channels.
    pub cin: usize,
    /// Output channels.
    pub cout: usize,
    /// Kernel size.
    pub k: usize,
    /// Stride.
    pub stride: usize,
    /// Dilation.
    pub dilation: usize,
    /// Whether there is a bias.
    pub bias: bool,
    /// Causal padding mode.
    pub pad: PadMode,
}

impl ConvSpec {
    /// `cin -> cout` with kernel `k`: stride 1, no dilation, a bias, zero padding.
    pub fn new(cin: usize, cout: usize, k: usize) -> Self {
        Self {
            cin,
            cout,
            k,
            stride: 1,
            dilation: 1,
            bias: true,
            pad: PadMode::Constant,
        }
    }

    /// The same with stride `stride`.
    pub fn stride(self, stride: usize) -> Self {
        Self { stride, ..self }
    }

    /// The same with dilation `dilation`.
    pub fn dilation(self, dilation: usize) -> Self {
        Self { dilation, ..self }
    }

    /// The same without a bias.
    pub fn no_bias(self) -> Self {
        Self {
            bias: false,
            ..self
        }
    }

    /// The same with left padding `pad`.
    pub fn pad(self, pad: PadMode) -> Self {
        Self { pad, ..self }
    }
}

/// A convolution weight as candle's Mimi modules read it: `weight`, or the weight-norm pair
/// `weight_g`/`weight_v` (norm over all but the first dimension).
pub(crate) fn conv_weight(vb: &VarBuilder, shape: (usize, usize, usize)) -> Result<Tensor> {
    if vb.contains_tensor("weight") {
        return vb.get(shape, "weight");
    }
    let g = vb.get((shape.0, 1, 1), "weight_g")?;
    let v = vb.get(shape, "weight_v")?;
    let norm = v.sqr()?.sum_keepdim((1, 2))?.sqrt()?;
    v.broadcast_mul(&g)?.broadcast_div(&norm)
}

/// `t` as f32 values on the host, flattened.
pub(super) fn to_vec(t: &Tensor) -> Result<Vec<f32>> {
    t.to_dtype(DType::F32)?
        .to_device(&Device::Cpu)?
        .flatten_all()?
        .to_vec1::<f32>()
}

/// The frame-rate layers (few frames per step, large weights: `seanet`'s `store_bf16`, the
/// codec's down/upsampling) at or above this many values are stored in bf16 with
/// `weights_dtype="bfloat16"`: about 23 M of the real codec's 26 M convolution weights. The
/// high-rate layers stay f32 whatever their size: the strategies their many frames take read
/// f32 (and the last decoder layers, next to the audio, keep full precision).
pub(crate) const BF16_MIN_WEIGHTS: usize = 1 << 20;

/// A convolution's weight matrix `(n, k)`, in f32 or bf16 (see [`BF16_MIN_WEIGHTS`]); row-major,
/// or packed once at load for the packed product ([`Packed`]: the frame-rate layers).
#[derive(Clone, Debug)]
pub(crate) enum Matrix {
    F32(Vec<f32>),
    BF16(Vec<half::bf16>),
    PackedF32(Arc<Packed<f32>>),
    PackedBF16(Arc<Packed<half::bf16>>),
}

impl Matrix {
    /// Bytes held.
    pub(crate) fn nbytes(&self) -> usize {
        match self {
            Self::F32(_) | Self::PackedF32(_) => 4 * self.len(),
            Self::BF16(_) | Self::PackedBF16(_) => 2 * self.len(),
        }
    }

    /// Values held.
    pub(crate) fn len(&self) -> usize {
        match self {
            Self::F32(w) => w.len(),
            Self::BF16(w) => w.len(),
            Self::PackedF32(w) => w.n() * w.k(),
            Self::PackedBF16(w) => w.n() * w.k(),
        }
    }

    /// The values in f32, row-major: borrowed, or widened or unpacked for this call (a
    /// strategy other than the product's; no packed layer takes one, see
    /// [`Self::gemv_frames`]).
    pub(crate) fn f32(&self) -> std::borrow::Cow<'_, [f32]> {
        let widen = |w: &[half::bf16]| w.iter().map(|v| v.to_f32()).collect();
        match self {
            Self::F32(w) => std::borrow::Cow::Borrowed(w),
            Self::BF16(w) => widen(w),
            Self::PackedF32(w) => std::borrow::Cow::Owned(w.unpack()),
            Self::PackedBF16(w) => widen(&w.unpack()),
        }
    }

    /// Packs a matrix of rows of `k` values if it holds at least [`BF16_MIN_WEIGHTS`] (the
    /// frame-rate layers, whose weights every step reads): every call of the layer then
    /// takes the packed product, which reads the weights once for all of a step's rows and
    /// gives a row the same bits whatever its neighbours.
    pub(crate) fn pack(&mut self, k: usize) {
        self.pack_from(BF16_MIN_WEIGHTS, k)
    }

    /// [`Self::pack`] for matrices of at least `min` values.
    pub(crate) fn pack_from(&mut self, min: usize, k: usize) {
        if self.len() < min || k == 0 || !self.len().is_multiple_of(k) {
            return;
        }
        match self {
            Self::F32(w) => *self = Self::PackedF32(Arc::new(Packed::pack(&[w], k))),
            Self::BF16(w) => *self = Self::PackedBF16(Arc::new(Packed::pack(&[w], k))),
            Self::PackedF32(_) | Self::PackedBF16(_) => {}
        }
    }

    /// The same values in bf16 if there are at least [`BF16_MIN_WEIGHTS`] of them.
    pub(crate) fn store_bf16(&mut self) {
        self.store_bf16_from(BF16_MIN_WEIGHTS)
    }

    /// The same values in bf16 if there are at least `min` of them.
    pub(crate) fn store_bf16_from(&mut self, min: usize) {
        let narrow =
            |w: &[f32]| -> Vec<half::bf16> { w.iter().map(|&v| half::bf16::from_f32(v)).collect() };
        match self {
            Self::F32(w) if w.len() >= min => *self = Self::BF16(narrow(w)),
            Self::PackedF32(w) if w.n() * w.k() >= min => {
                let k = w.k();
                *self = Self::PackedBF16(Arc::new(Packed::pack(&[&narrow(&w.unpack())], k)));
            }
            _ => {}
        }
    }

    /// `x (m, k) . self (n, k)^T`: the matrix-vector kernel, or the packed product, into a
    /// buffer of the stock (`m` rows of `n`).
    pub(crate) fn gemv(&self, x: &[f32], m: usize, k: usize, n: usize) -> Frames {
        let mut y = Frames::uninit(m, n);
        match self {
            Self::F32(w) => crate::kernels::gemv_into(x, w, (m, k, n), &mut y.data),
            Self::BF16(w) => crate::kernels::gemv_into(x, w, (m, k, n), &mut y.data),
            Self::PackedF32(w) => w.matmul(x, m, None, &mut y.data),
            Self::PackedBF16(w) => w.matmul(x, m, None, &mut y.data),
        }
        y
    }

    /// Rows one product call takes: the matrix-vector kernel's limit, or all of them.
    fn max_rows(&self) -> usize {
        match self {
            Self::F32(_) | Self::BF16(_) => crate::kernels::GEMV_MAX_ROWS,
            Self::PackedF32(_) | Self::PackedBF16(_) => usize::MAX,
        }
    }

    /// [`Self::gemv`] of several rows' inputs (`cols[r]`: `ns[r]` rows of `k`) in as few
    /// calls as the kernel's row limit allows, so the weights are read once per call rather
    /// than once per row; `out(y, ns[r])` makes row `r`'s result from its `(ns[r], n)`
    /// products, the bits its own call gives (the kernel's rows do not depend on their
    /// neighbours).
    pub(crate) fn gemv_rows(
        &self,
        cols: &[Frames],
        ns: &[usize],
        (k, n): (usize, usize),
        mut out: impl FnMut(&[f32], usize) -> Frames,
    ) -> RowList<Frames> {
        let mut rows = RowList::with_capacity(ns.len());
        let mut i = 0;
        while i < ns.len() {
            let (mut j, mut total) = (i + 1, ns[i]);
            while j < ns.len() && total + ns[j] <= self.max_rows() {
                total += ns[j];
                j += 1;
            }
            let mut x = Frames::uninit(total, k);
            let mut at = 0;
            for c in &cols[i..j] {
                x.data[at..at + c.data.len()].copy_from_slice(&c.data);
                at += c.data.len();
            }
            let y = self.gemv(&x.data, total, k, n);
            let mut at = 0;
            for &m in &ns[i..j] {
                rows.push(out(&y.data[at * n..(at + m) * n], m));
                at += m;
            }
            i = j;
        }
        rows
    }

    /// Output frames up to which a call takes the matrix-vector kernel: a bf16 layer up to
    /// the kernel's limit (its other strategies would widen it every call).
    pub(crate) fn gemv_frames(&self) -> usize {
        match self {
            Self::F32(_) => STEP_FRAMES,
            Self::BF16(_) => crate::kernels::GEMV_MAX_ROWS,
            // Offline calls too: the packed product is as fast as the tiled one there.
            Self::PackedF32(_) | Self::PackedBF16(_) => usize::MAX,
        }
    }
}
