//! cuDNN convolutions for the candle engine on CUDA (`MIMI_PY_CUDA_CUDNN`, cargo feature
//! `cudnn`), as our own op over cudarc's cuDNN bindings rather than candle's `cudnn` feature,
//! which rebuilds its descriptors, asks the heuristic and zero-fills a workspace on every call
//! and never sets a math type.
//!
//! A convolution is planned once per layer (its kernel tensor), shape and dtype, per thread
//! (a cuDNN handle serves one thread's stream): the descriptors, the algorithm the heuristic
//! picks and a workspace of the size it needs ([`PlanCache`], least recently used dropped).
//! The math type is explicit ([`math_for`]): float32 in FMA math, so float32 stays float32
//! (cuDNN's default math lets Ampere and later GPUs use TF32), unless `MIMI_PY_CUDA_TF32=1`;
//! half precision on tensor cores. Without libcudnn (the `nvidia-cudnn-cu13` wheel, or a
//! system cuDNN 9), the first call finds out and every call takes candle's path; a call cuDNN
//! refuses takes it too ([`unavailable`] says why, for the device check).
//!
//! The shapes (NCHW with H = 1) and the cache are device-independent and tested on the CPU;
//! the calls into cuDNN are behind the `cudnn` feature.

use crate::error::{Error, Result};
use candle::{DType, Tensor};

/// A 1-d convolution as cuDNN sees it: NCHW tensors with H = 1, no padding (the engine's
/// layers concatenate their history and padding first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConvShape {
    /// Rows.
    pub batch: usize,
    /// Input channels.
    pub cin: usize,
    /// Output channels.
    pub cout: usize,
    /// Taps.
    pub k: usize,
    /// Stride.
    pub stride: usize,
    /// Dilation.
    pub dilation: usize,
    /// Input columns.
    pub len: usize,
}

impl ConvShape {
    /// The shape of `x (batch, cin, len)` convolved with `w (cout, cin, k)`; a typed error
    /// for anything cuDNN's 32-bit descriptors cannot hold or that yields no column.
    pub fn of(x: &[usize], w: &[usize], stride: usize, dilation: usize) -> Result<Self> {
        let (&[batch, cin, len], &[cout, wcin, k]) = (x, w) else {
            return Err(Error::Shape(format!(
                "a cuDNN convolution takes (batch, channels, time) and (out, in, taps), got \
                 {x:?} and {w:?}"
            )));
        };
        let s = Self {
            batch,
            cin,
            cout,
            k,
            stride,
            dilation,
            len,
        };
        if wcin != cin || stride == 0 || dilation == 0 || k == 0 {
            return Err(Error::Shape(format!(
                "a cuDNN convolution needs the kernel's input channels to match ({wcin} vs \
                 {cin}) and stride, dilation and taps >= 1: {s:?}"
            )));
        }
        let too_big = [
            batch,
            cin,
            cout,
            k,
            len,
            stride,
            dilation,
            batch * cin * len,
        ]
        .iter()
        .any(|&v| v > i32::MAX as usize);
        if too_big || s.out_len() == 0 {
            return Err(Error::Shape(format!(
                "a cuDNN convolution needs sizes below 2^31 and at least {} input columns: {s:?}",
                s.span()
            )));
        }
        Ok(s)
    }

    /// The columns one output reads: `(k - 1) * dilation + 1`.
    pub fn span(&self) -> usize {
        (self.k - 1) * self.dilation + 1
    }

    /// Output columns: `(len - span) / stride + 1`, 0 when the input is shorter than a span.
    pub fn out_len(&self) -> usize {
        match self.len.checked_sub(self.span()) {
            Some(free) => free / self.stride + 1,
            None => 0,
        }
    }

    /// The input's NCHW dims.
    pub fn input_dims(&self) -> [i32; 4] {
        dims([self.batch, self.cin, 1, self.len])
    }

    /// The filter's KCRS dims.
    pub fn filter_dims(&self) -> [i32; 4] {
        dims([self.cout, self.cin, 1, self.k])
    }

    /// The output's NCHW dims.
    pub fn output_dims(&self) -> [i32; 4] {
        dims([self.batch, self.cout, 1, self.out_len()])
    }

    /// (padding, stride, dilation) of the 2-d descriptor: none along H.
    pub fn conv_params(&self) -> ([i32; 2], [i32; 2], [i32; 2]) {
        ([0, 0], [1, self.stride as i32], [1, self.dilation as i32])
    }
}

/// Sizes checked by [`ConvShape::of`] to fit.
fn dims(v: [usize; 4]) -> [i32; 4] {
    v.map(|d| d as i32)
}

/// The math a convolution is told to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Math {
    /// Plain FMA: float32 products stay float32.
    Fma,
    /// Tensor cores in the data's own type (half precision).
    TensorOp,
    /// Tensor cores with float32 data rounded to TF32 (`MIMI_PY_CUDA_TF32=1` only).
    Tf32,
}

/// The math for `dtype`: float32 in FMA math unless `tf32`, half precision on tensor cores.
pub fn math_for(dtype: DType, tf32: bool) -> Math {
    match (dtype, tf32) {
        (DType::F32, false) => Math::Fma,
        (DType::F32, true) => Math::Tf32,
        _ => Math::TensorOp,
    }
}

/// What a plan is made for: the layer (its kernel tensor), the shape and the dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PlanKey {
    /// The kernel tensor's id: one layer.
    pub layer: candle::TensorId,
    /// The call's shape.
    pub shape: ConvShape,
    /// The data's dtype.
    pub dtype: DType,
}

/// Plans per key, made once and reused; beyond `cap`, the least recently used is dropped.
pub struct PlanCache<P> {
    entries: Vec<(PlanKey, P)>,
    cap: usize,
    made: u64,
}

impl<P> PlanCache<P> {
    /// An empty cache of at most `cap` plans.
    pub fn new(cap: usize) -> Self {
        Self {
            entries: Vec::new(),
            cap: cap.max(1),
            made: 0,
        }
    }

    /// The plan for `key`, made by `plan` the first time (or after it was dropped).
    pub fn get_or_plan(
        &mut self,
        key: PlanKey,
        plan: impl FnOnce() -> Result<P>,
    ) -> Result<&mut P> {
        let entry = match self.entries.iter().position(|(k, _)| *k == key) {
            Some(i) => self.entries.remove(i),
            None => {
                let p = plan()?;
                self.made += 1;
                (key, p)
            }
        };
        self.entries.push(entry);
        if self.entries.len() > self.cap {
            self.entries.remove(0);
        }
        Ok(&mut self.entries.last_mut().expect("just pushed").1)
    }

    /// Plans made so far (a hit makes none).
    pub fn made(&self) -> u64 {
        self.made
    }

    /// Plans held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Plans a thread keeps.
pub const PLANS_PER_THREAD: usize = 256;

/// `x (batch, cin, len)` convolved with `w (cout, cin, k)` (no padding): through cuDNN when
/// `MIMI_PY_CUDA_CUDNN=1`, the build has the `cudnn` feature, `x` is on CUDA and libcudnn
/// loads; otherwise candle's `conv1d`.
pub fn conv1d(x: &Tensor, w: &Tensor, stride: usize, dilation: usize) -> Result<Tensor> {
    #[cfg(feature = "cudnn")]
    if crate::runtime::settings::get().cuda_cudnn && x.device().is_cuda() {
        if let Some(y) = cuda::conv1d(x, w, stride, dilation)? {
            return Ok(y);
        }
    }
    Ok(x.conv1d(w, 0, stride, dilation, 1)?)
}

/// Why cuDNN is not used although asked for, if so: libcudnn did not load, or the last call
/// it refused (which then took candle's path).
pub fn unavailable() -> Option<String> {
    #[cfg(feature = "cudnn")]
    return cuda::unavailable();
    #[cfg(not(feature = "cudnn"))]
    None
}

#[cfg(feature = "cudnn")]
mod cuda;

#[cfg(test)]
mod tests {
    use super::*;
    use candle::Device;

    #[test]
    fn shapes_give_cudnn_dims_and_candles_output_length() {
        let s = ConvShape::of(&[2, 3, 20], &[5, 3, 4], 2, 3).unwrap();
        assert_eq!(s.span(), 10);
        assert_eq!(s.out_len(), 6);
        assert_eq!(s.input_dims(), [2, 3, 1, 20]);
        assert_eq!(s.filter_dims(), [5, 3, 1, 4]);
        assert_eq!(s.output_dims(), [2, 5, 1, 6]);
        assert_eq!(s.conv_params(), ([0, 0], [1, 2], [1, 3]));
        // candle's own conv1d agrees on the output length, for every stride and dilation.
        for (stride, dilation, len) in [(1, 1, 7), (2, 1, 9), (4, 1, 16), (1, 3, 12), (5, 2, 30)] {
            let x = Tensor::zeros((1, 3, len), DType::F32, &Device::Cpu).unwrap();
            let w = Tensor::zeros((5, 3, 4), DType::F32, &Device::Cpu).unwrap();
            let y = x.conv1d(&w, 0, stride, dilation, 1).unwrap();
            let s = ConvShape::of(&[1, 3, len], &[5, 3, 4], stride, dilation).unwrap();
            assert_eq!(y.dim(2).unwrap(), s.out_len(), "{s:?}");
        }
    }

    #[test]
    fn shapes_cudnn_cannot_take_are_typed_errors() {
        let bad = [
            (vec![2, 3, 20], vec![5, 4, 4], 1, 1),
            (vec![2, 3, 20], vec![5, 3, 4], 0, 1),
            (vec![2, 3, 20], vec![5, 3, 4], 1, 0),
            (vec![2, 3, 3], vec![5, 3, 4], 1, 1),
            (vec![3, 20], vec![5, 3, 4], 1, 1),
            (vec![1 << 20, 1 << 10, 4], vec![5, 1 << 10, 4], 1, 1),
        ];
        for (x, w, s, d) in bad {
            match ConvShape::of(&x, &w, s, d) {
                Err(Error::Shape(msg)) => assert!(msg.contains("cuDNN"), "{msg}"),
                other => panic!("{x:?} {w:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn float32_stays_float32_unless_tf32_is_asked_for() {
        assert_eq!(math_for(DType::F32, false), Math::Fma);
        assert_eq!(math_for(DType::F32, true), Math::Tf32);
        assert_eq!(math_for(DType::BF16, false), Math::TensorOp);
        assert_eq!(math_for(DType::F16, true), Math::TensorOp);
    }

    #[test]
    fn a_layer_and_shape_is_planned_once_and_old_plans_are_dropped() {
        let w1 = Tensor::zeros((5, 3, 4), DType::F32, &Device::Cpu).unwrap();
        let w2 = Tensor::zeros((5, 3, 4), DType::F32, &Device::Cpu).unwrap();
        let shape = |len| ConvShape::of(&[1, 3, len], &[5, 3, 4], 1, 1).unwrap();
        let key = |w: &Tensor, len, dtype| PlanKey {
            layer: w.id(),
            shape: shape(len),
            dtype,
        };
        let mut cache: PlanCache<usize> = PlanCache::new(3);
        for _ in 0..4 {
            assert_eq!(
                *cache
                    .get_or_plan(key(&w1, 8, DType::F32), || Ok(8))
                    .unwrap(),
                8
            );
        }
        assert_eq!(cache.made(), 1);
        cache
            .get_or_plan(key(&w2, 8, DType::F32), || Ok(1))
            .unwrap();
        cache
            .get_or_plan(key(&w1, 8, DType::BF16), || Ok(2))
            .unwrap();
        cache
            .get_or_plan(key(&w1, 9, DType::F32), || Ok(3))
            .unwrap();
        assert_eq!((cache.made(), cache.len()), (4, 3));
        // The first was least recently used: dropped, and planned again.
        cache
            .get_or_plan(key(&w1, 8, DType::F32), || Ok(8))
            .unwrap();
        assert_eq!(cache.made(), 5);
        // A failed plan is not kept.
        let failed =
            cache.get_or_plan(key(&w2, 12, DType::F32), || Err(Error::Device("no".into())));
        assert!(failed.is_err());
        assert_eq!(cache.len(), 3);
    }

    #[test]
    fn off_cuda_the_convolution_is_candles() {
        let dev = Device::Cpu;
        let x = Tensor::randn(0f32, 1., (2, 3, 17), &dev).unwrap();
        let w = Tensor::randn(0f32, 1., (4, 3, 3), &dev).unwrap();
        let ours = conv1d(&x, &w, 2, 2)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>();
        let theirs = x
            .conv1d(&w, 0, 2, 2, 1)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>();
        assert_eq!(ours.unwrap(), theirs.unwrap());
        assert_eq!(unavailable(), None);
    }
}
