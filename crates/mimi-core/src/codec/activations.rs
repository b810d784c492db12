//! What a streaming step passes between its stages ([`Activations`]) and what it returns
//! ([`Codes`]), in each engine's own form. The codec runs one order of stages for both
//! engines ([`super::step`]), and each engine makes its own ([`super::engine::Engine`]); the
//! native engine's activations stay the rows' [`Frames`] from the first stage to the last,
//! through the transformer's and the quantizer's host entry points, so a step converts its
//! data only at its two ends (up to `GEMV_MAX_ROWS` tokens to quantize, and a transformer
//! that takes the host step: see [`super::step`]). The candle engine's stay device tensors.

use super::bridge::{from_frames, host_f32, host_u32, to_frames};
use crate::conv::Frames;
use crate::error::{Error, Result};
use crate::host::HostArray;
use crate::rows::RowList;
use crate::runtime::device::{cast, zeros_on};
use candle::{DType, Device, Tensor};

/// A stage's activations for the stepping rows: the native engine's one [`Frames`] per
/// row `(channels, frames)`, or the candle engine's `(rows, channels, frames)` tensor.
// The rows' frames stay inline (`RowList`, about 1.3 kB, moved a few times a step): boxing
// them would allocate at every stage.
#[allow(clippy::large_enum_variant)]
pub enum Activations {
    /// The native engine's: one `(channels, frames)` per stepping row.
    Frames(RowList<Frames>),
    /// The candle engine's: `(rows, channels, frames)` on the codec's device.
    Tensor(Tensor),
}

impl Activations {
    /// The values `data` of `rows` rows of `channels` × `len` (C order) as the native
    /// engine's rows' frames.
    pub(crate) fn host_frames(data: Vec<f32>, shape: (usize, usize, usize)) -> Result<Self> {
        Ok(Self::Frames(split_rows(data, shape.0, shape.1, shape.2)?))
    }

    /// The values `data` of `shape` (C order) as the candle engine's tensor on `dev` in
    /// `dtype`.
    pub(crate) fn host_tensor(
        data: Vec<f32>,
        shape: (usize, usize, usize),
        (dev, dtype): (&Device, DType),
    ) -> Result<Self> {
        crate::runtime::profile::tensor_made();
        let t = Tensor::from_vec(data, shape, dev)?;
        Ok(Self::Tensor(cast(&t, dtype)?))
    }

    /// No frames for `rows` rows of `channels`, as the native engine's frames.
    pub(crate) fn no_frames((rows, channels): (usize, usize)) -> Self {
        Self::Frames(RowList::from_elem(Frames::empty(channels), rows))
    }

    /// The rows it holds.
    pub(crate) fn rows(&self) -> Result<usize> {
        match self {
            Self::Frames(xs) => Ok(xs.len()),
            Self::Tensor(t) => Ok(t.dim(0)?),
        }
    }

    /// Frames per row.
    pub(crate) fn len(&self) -> Result<usize> {
        match self {
            Self::Frames(xs) => Ok(xs.first().map_or(0, |f| f.len)),
            Self::Tensor(t) => Ok(t.dim(candle::D::Minus1)?),
        }
    }

    /// `Some(self)` when it holds a frame, `None` when it holds none.
    pub(crate) fn nonempty(self) -> Result<Option<Self>> {
        Ok((self.len()? > 0).then_some(self))
    }

    /// The rows' frames (a tensor's rows converted).
    pub(crate) fn into_frames(self) -> Result<RowList<Frames>> {
        match self {
            Self::Frames(xs) => Ok(xs),
            Self::Tensor(t) => to_frames(&t),
        }
    }

    /// The candle engine's tensor; the native engine's frames are refused, since a stage
    /// that takes tensors has no device to put them on.
    pub(crate) fn expect_tensor(self) -> Result<Tensor> {
        match self {
            Self::Tensor(t) => Ok(t),
            Self::Frames(_) => Err(Error::Internal(
                "the candle engine was given the native engine's frames".into(),
            )),
        }
    }

    /// The activations as a `(rows, channels, frames)` f32 tensor on `dev` (the native
    /// engine's rows' frames: one conversion, at a step's end).
    pub(crate) fn into_tensor(self, dev: &Device) -> Result<Tensor> {
        match self {
            Self::Tensor(t) => Ok(t),
            Self::Frames(xs) => match xs.first() {
                None => Err(Error::Internal("activations of no rows".into())),
                Some(f) if f.len == 0 => {
                    crate::runtime::profile::tensor_made();
                    Ok(zeros_on((xs.len(), f.channels, 0), DType::F32, dev)?)
                }
                Some(_) => from_frames(xs, dev)?
                    .ok_or_else(|| Error::Internal("frames of no length".into())),
            },
        }
    }

    /// The values as a host array `(rows, channels, frames)` in f32.
    pub(crate) fn into_host(self) -> Result<HostArray<f32>> {
        match self {
            Self::Tensor(t) => host_f32(&t),
            // Copied into one exact array: the rows' buffers stay in the stock.
            Self::Frames(xs) => {
                let (c, n) = xs.first().map_or((0, 0), |f| (f.channels, f.len));
                let mut data = Vec::with_capacity(xs.len() * c * n);
                xs.iter().for_each(|f| data.extend_from_slice(&f.data));
                Ok(HostArray::new(data, vec![xs.len(), c, n]))
            }
        }
    }
}

/// `rows` rows of `channels` × `len` values (C order) as one [`Frames`] each (more than one:
/// in buffers of the stock).
fn split_rows(data: Vec<f32>, rows: usize, channels: usize, len: usize) -> Result<RowList<Frames>> {
    let per = channels * len;
    if data.len() != rows * per {
        return Err(Error::Internal(format!(
            "{} values for {rows} rows of {channels} x {len}",
            data.len()
        )));
    }
    if rows == 1 {
        return Ok(std::iter::once(Frames::new(channels, len, data)).collect());
    }
    Ok((0..rows)
        .map(|r| {
            let mut f = Frames::uninit(channels, len);
            f.data.copy_from_slice(&data[r * per..(r + 1) * per]);
            f
        })
        .collect())
}

/// The codes a streaming encode step returns: the native engine's on the host, the candle
/// engine's (and those of the quantizer's tensor path) as a `(rows, n_q, frames)` tensor.
pub enum Codes {
    /// `(rows, n_q, frames)` on the host (the native engine's, and the host calls').
    Host(HostArray<u32>),
    /// `(rows, n_q, frames)` u32 on the codec's device.
    Tensor(Tensor),
}

impl Codes {
    /// Frames per row.
    pub(crate) fn frames(&self) -> Result<usize> {
        match self {
            Self::Host(h) => Ok(h.shape[2]),
            Self::Tensor(t) => Ok(t.dim(2)?),
        }
    }

    /// The codes as a tensor on `dev`.
    pub(crate) fn into_tensor(self, dev: &Device) -> Result<Tensor> {
        match self {
            Self::Tensor(t) => Ok(t),
            Self::Host(h) => {
                crate::runtime::profile::tensor_made();
                Ok(Tensor::from_vec(h.data, h.shape.as_slice(), dev)?)
            }
        }
    }

    /// The codes on the host.
    pub(crate) fn into_host(self) -> Result<HostArray<u32>> {
        match self {
            Self::Host(h) => Ok(h),
            Self::Tensor(t) => host_u32(&t),
        }
    }
}
