//! Offline calls on batches of items of different lengths (`lengths=`): each item is computed
//! alone, on its own length, so its result is exactly the one it would get in a batch of one;
//! the batch runs its items in parallel (each item's segments too), and the output is padded
//! with zeros to the longest item.

use super::activations::Codes;
use super::model::Codec;
use super::offline::offline_call;
use crate::error::{Cancel, Error, Result};
use crate::runtime::device::zeros_on;
use candle::{DType, Tensor};
use rayon::prelude::*;

/// The rule for `lengths=`, declared once (the Python binding reads the integers and calls
/// it too): one entry per batch item, each in `[0, max]` (`what` names the unit in the
/// message: samples, frames). Returns them as `usize`.
pub fn checked_lengths<T>(values: &[T], batch: usize, max: usize, what: &str) -> Result<Vec<usize>>
where
    T: Copy + std::fmt::Display + TryInto<usize>,
{
    if values.len() != batch {
        return Err(Error::Shape(format!(
            "lengths must hold one entry per batch item ({batch}), got {}",
            values.len()
        )));
    }
    let one = |(i, &v): (usize, &T)| match v.try_into() {
        Ok(l) if l <= max => Ok(l),
        _ => Err(Error::Shape(format!(
            "lengths[{i}] = {v} is outside [0, {max}] (the input's {what})"
        ))),
    };
    values.iter().enumerate().map(one).collect()
}

/// [`checked_lengths`] of lengths already in `usize`.
pub fn check_lengths(lengths: &[usize], batch: usize, max: usize, what: &str) -> Result<()> {
    checked_lengths(lengths, batch, max, what).map(drop)
}

/// `f` on each item's first `lengths[i]` columns (dim 2) alone, in parallel on the CPU; each
/// output padded with zeros along dim 2 to the longest, then stacked. An item of length 0
/// gives zeros (`out_len(0)` columns, `channels` rows).
fn per_item_padded(
    x: &Tensor,
    lengths: &[usize],
    (channels, dtype): (usize, DType),
    out_len: impl Fn(usize) -> usize + Sync,
    f: impl Fn(&Tensor) -> Result<Tensor> + Sync,
) -> Result<Tensor> {
    let item = |(i, &l): (usize, &usize)| match l {
        0 => Ok(None),
        l => f(&x.narrow(0, i, 1)?.narrow(2, 0, l)?).map(Some),
    };
    // On a GPU the items stay on this thread (see `kernels::in_pool_on`).
    let outs = match x.device().is_cpu() {
        true => lengths.par_iter().enumerate().map(item).collect(),
        false => lengths
            .iter()
            .enumerate()
            .map(item)
            .collect::<Result<Vec<_>>>(),
    }?;
    let width = lengths.iter().map(|&l| out_len(l)).max().unwrap_or(0);
    let padded = outs
        .into_iter()
        .map(|y| match y {
            None => Ok(zeros_on((1, channels, width), dtype, x.device())?),
            Some(y) if y.dim(2)? == width => Ok(y),
            Some(y) => {
                let pad = zeros_on((1, y.dim(1)?, width - y.dim(2)?), y.dtype(), y.device())?;
                Ok(Tensor::cat(&[&y, &pad], 2)?)
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Tensor::cat(&padded, 0)?)
}

impl Codec {
    fn frames_of(&self, samples: usize) -> usize {
        samples.div_ceil(self.parts.cfg.frame_size())
    }

    /// [`Self::encode_latents`] of items of `lengths` samples: (B, dimension, max frames).
    pub(crate) fn encode_latents_lengths(
        &self,
        pcm: &Tensor,
        lengths: &[usize],
        cancel: Cancel,
    ) -> Result<Tensor> {
        check_lengths(lengths, pcm.dim(0)?, pcm.dim(2)?, "samples")?;
        let p = &self.parts;
        let spec = (p.cfg.seanet.dimension, p.dtype);
        offline_call(&self.parts.device, || {
            let f = |x: &Tensor| {
                let x = super::offline::encode(&*self.engine, p, self.activations_of(x)?, cancel)?;
                x.into_tensor(&p.device)
            };
            per_item_padded(pcm, lengths, spec, |l| self.frames_of(l), f)
        })
    }

    /// [`Self::encode`] of items of `lengths` samples: (B, n_q, max_i ceil(L_i / frame_size))
    /// u32; item i's first `ceil(L_i / frame_size)` frames are its codes alone, the rest 0.
    pub(crate) fn encode_lengths(
        &self,
        pcm: &Tensor,
        lengths: &[usize],
        cancel: Cancel,
    ) -> Result<Tensor> {
        check_lengths(lengths, pcm.dim(0)?, pcm.dim(2)?, "samples")?;
        let p = &self.parts;
        let spec = (p.cfg.quantizer_n_q, DType::U32);
        offline_call(&self.parts.device, || {
            let f = |x: &Tensor| {
                let latents =
                    super::offline::encode(&*self.engine, p, self.activations_of(x)?, cancel)?;
                self.quantize(latents)?.into_tensor(&p.device)
            };
            per_item_padded(pcm, lengths, spec, |l| self.frames_of(l), f)
        })
    }

    /// [`Self::decode_latents`] of items of `frames` code frames: (B, dimension, max frames).
    pub(crate) fn decode_latents_lengths(
        &self,
        codes: &Tensor,
        frames: &[usize],
    ) -> Result<Tensor> {
        check_lengths(frames, codes.dim(0)?, codes.dim(2)?, "frames")?;
        let spec = (self.parts.cfg.seanet.dimension, DType::F32);
        per_item_padded(codes, frames, spec, |f| f, |c| self.decode_latents(c))
    }

    /// [`Self::decode`] of items of `frames` code frames: (B, C, max_i F_i * frame_size);
    /// item i's first `F_i * frame_size` samples are its audio alone, the rest 0.
    pub(crate) fn decode_lengths(
        &self,
        codes: &Tensor,
        frames: &[usize],
        cancel: Cancel,
    ) -> Result<Tensor> {
        check_lengths(frames, codes.dim(0)?, codes.dim(2)?, "frames")?;
        let p = &self.parts;
        let spec = (p.cfg.channels, p.dtype);
        let fs = p.cfg.frame_size();
        offline_call(&self.parts.device, || {
            let f = |c: &Tensor| {
                let latents = self.dequantize(Codes::Tensor(c.clone()))?;
                super::offline::decode(&*self.engine, p, latents, cancel)?.into_tensor(&p.device)
            };
            per_item_padded(codes, frames, spec, |f| f * fs, f)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_one_per_item_and_within_the_input() {
        assert!(check_lengths(&[3, 5], 2, 5, "samples").is_ok());
        assert!(matches!(
            check_lengths(&[3], 2, 5, "samples"),
            Err(Error::Shape(_))
        ));
        assert!(matches!(
            check_lengths(&[3, 6], 2, 5, "samples"),
            Err(Error::Shape(_))
        ));
        match checked_lengths(&[3i64, -1], 2, 5, "frames") {
            Err(Error::Shape(m)) => assert!(m.contains("lengths[1] = -1 is outside [0, 5]"), "{m}"),
            other => panic!("expected a shape error, got {other:?}"),
        }
        assert_eq!(checked_lengths(&[0i64, 5], 2, 5, "frames").unwrap(), [0, 5]);
    }
}
