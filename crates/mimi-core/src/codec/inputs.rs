//! The rules a codec call's inputs obey, checked once per call before anything runs or any
//! state changes: the shapes of audio and codes, their size, the memory a call needs (by
//! the host calls ([`super::host_calls`]), or by a binding through [`Codec::input_shape`]
//! while it still holds the caller's array, whose [`CheckedShape`] the call then trusts),
//! then finite samples and codes in range (always by the call).

use super::model::Codec;
use crate::error::{Error, Result};
use crate::host::{check_batch_size, check_finite, check_size, CheckedShape, HostArray, HostInput};
use crate::rows::Rows;

/// A code as the codec takes it: `v` in `[0, bins)` (a binding reads wider integers first).
pub fn code_value(v: i128, bins: usize) -> Result<u32> {
    match u32::try_from(v) {
        Ok(c) if (c as usize) < bins => Ok(c),
        _ => Err(Error::InvalidInput(format!(
            "code {v} is out of range: codes must be in [0, {bins}) (the codebook size)"
        ))),
    }
}

/// Refuses `last` with a row mask: the last chunk ends every row's stream.
pub(crate) fn check_last(rows: Option<&Rows>, last: bool) -> Result<()> {
    if last && rows.is_some() {
        return Err(Error::InvalidInput(
            "last=True ends every row's stream; it cannot be combined with active=".into(),
        ));
    }
    Ok(())
}

/// What an array handed to a codec call holds, for [`Codec::input_shape`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Input {
    /// Audio: `(batch, channels, samples)`, or `(samples,)` for a mono codec.
    Pcm,
    /// Codes `(batch, num_codebooks, frames)` to turn into latents.
    Codes,
    /// Codes to decode into audio: also checks the audio's size and the decoder's memory.
    CodesToDecode,
}

impl Codec {
    /// The shape `(batch, channels or codebooks, length)` the codec reads an `input` of
    /// `shape` as, or the error naming what was wrong (the rules of [`Self::pcm_shape`] and
    /// [`Self::codes_shape`]). A binding calls it while it still holds the caller's array,
    /// and hands the result back with the values ([`HostInput::Shaped`]).
    pub fn input_shape(&self, input: Input, shape: &[usize]) -> Result<CheckedShape> {
        let dims = self.dims_of(input, shape)?;
        Ok(CheckedShape::new(dims.to_vec(), (self.id, input as u8)))
    }

    /// The rules of [`Self::input_shape`]: the shape the codec reads an `input` of `shape`
    /// as (counted, for the test that a call checks once).
    fn dims_of(&self, input: Input, shape: &[usize]) -> Result<[usize; 3]> {
        crate::runtime::profile::shape_checked();
        match input {
            Input::Pcm => self.pcm_shape(shape),
            Input::Codes => self.codes_shape(shape, false),
            Input::CodesToDecode => self.codes_shape(shape, true),
        }
    }

    /// `x` as an array of the shape the codec reads an `input` as, checked unless
    /// [`Self::input_shape`] checked it.
    fn shaped<T>(&self, x: HostInput<T>, input: Input, what: &str) -> Result<HostArray<T>> {
        x.resolve((self.id, input as u8), what, |shape| {
            let dims = self.dims_of(input, shape)?;
            if shape[..] != dims {
                *shape = dims.to_vec();
            }
            Ok(())
        })
    }

    /// Estimated peak bytes of an offline call on `batch` items of `samples` samples each.
    pub(crate) fn offline_memory(&self, batch: usize, samples: usize) -> u64 {
        let per_sample = (2048 * self.parts.cfg.seanet.n_filters as u64 / 64).max(64);
        let (in_flight, rest) = self.engine.in_flight(&self.parts, samples);
        (batch as u64).saturating_mul(in_flight.saturating_mul(per_sample).saturating_add(rest))
    }

    /// Refuses an offline call on `batch` items of `samples` samples that would not fit in
    /// the memory available (`what` and `hint` go into the message).
    pub(crate) fn check_offline_memory(
        &self,
        batch: usize,
        samples: usize,
        hint: &str,
    ) -> Result<()> {
        crate::runtime::memory::check_memory(self.offline_memory(batch, samples), "this call", hint)
    }

    /// Audio of `shape` as the codec reads it, `(batch, channels, samples)`: that shape, or
    /// `(samples,)` for a mono codec (one item). Refuses other shapes and inputs too large.
    fn pcm_shape(&self, shape: &[usize]) -> Result<[usize; 3]> {
        let c = self.config().channels;
        let shape3 = match shape {
            [s] if c == 1 => [1, 1, *s],
            [b, ch, s] if *ch == c && *b >= 1 => [*b, *ch, *s],
            _ => {
                return Err(Error::Shape(format!(
                    "pcm must have shape (batch, channels={c}, samples){}, got {shape:?}{}",
                    if c == 1 { " or (samples,)" } else { "" },
                    if shape.len() == 2 {
                        "; for mono audio of shape (batch, samples) use pcm[:, None, :]"
                    } else {
                        ""
                    }
                )))
            }
        };
        check_size(&shape3, "pcm")?;
        check_batch_size(shape3[0], "pcm")?;
        self.check_offline_memory(
            shape3[0],
            shape3[2],
            "encode long audio in chunks with encode_step (or the CLI, which streams)",
        )?;
        Ok(shape3)
    }

    /// Checks codes of `shape`, `(batch, num_codebooks, frames)`, and the audio they decode
    /// to (its size and the decoder's memory) when `decoded`.
    fn codes_shape(&self, shape: &[usize], decoded: bool) -> Result<[usize; 3]> {
        let k = self.config().quantizer_n_q;
        let [b, t] = match shape {
            [b, n, t] if *n == k && *b >= 1 => [*b, *t],
            _ => {
                return Err(Error::Shape(format!(
                    "codes must have shape (batch, num_codebooks={k}, frames), got {shape:?}"
                )))
            }
        };
        check_size(shape, "codes")?;
        check_batch_size(b, "codes")?;
        if decoded {
            let samples = t.saturating_mul(self.config().frame_size());
            check_size(&[b, self.config().channels, samples], "decoded audio")?;
            self.check_offline_memory(
                b,
                samples,
                "decode long code sequences in shorter chunks (decode_step streams them)",
            )?;
        }
        Ok([b, k, t])
    }

    /// Every input rule for audio: [`Self::pcm_shape`] (unless checked), the rows that step
    /// (`active`, all if `None`), then finite samples in those rows. Returns the array
    /// shaped `(batch, channels, samples)` and the rows.
    pub(crate) fn check_pcm(
        &self,
        pcm: HostInput<f32>,
        active: Option<Rows>,
    ) -> Result<(HostArray<f32>, Rows)> {
        let pcm = self.shaped(pcm, Input::Pcm, "pcm")?;
        let rows = Rows::or_all(active, pcm.shape[0])?;
        check_finite(&pcm.data, &pcm.shape, Some(&rows.indices()), "pcm")?;
        Ok((pcm, rows))
    }

    /// Every input rule for codes: [`Self::codes_shape`] (unless checked), the rows that step
    /// (`active`, all if `None`), then codes in range in those rows (a binding reading wider
    /// integers refuses those no `u32` holds, with [`code_value`]'s message). Returns the
    /// array and the rows.
    pub(crate) fn check_codes(
        &self,
        codes: HostInput<u32>,
        active: Option<Rows>,
        input: Input,
    ) -> Result<(HostArray<u32>, Rows)> {
        let codes = self.shaped(codes, input, "codes")?;
        let [b, k, t] = [codes.shape[0], codes.shape[1], codes.shape[2]];
        let rows = Rows::or_all(active, b)?;
        let bins = self.config().quantizer_bins;
        for &r in rows.indices().iter() {
            let row = &codes.data[r * k * t..(r + 1) * k * t];
            if let Some(&c) = row.iter().find(|&&c| c as usize >= bins) {
                return Err(code_value(c.into(), bins).unwrap_err());
            }
        }
        Ok((codes, rows))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_in_range() {
        assert_eq!(code_value(5, 6).unwrap(), 5);
        for v in [-1, 6, 1 << 40] {
            assert!(matches!(code_value(v, 6), Err(Error::InvalidInput(_))));
        }
    }
}
