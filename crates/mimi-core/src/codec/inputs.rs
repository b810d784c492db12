//! The rules a codec call's inputs obey, checked by the host calls
//! ([`super::host_calls`]) before anything runs, and public so that a binding can check them
//! while it still holds the caller's array (before copying it): the shapes of audio and
//! codes, their size, the memory a call needs, finite samples and codes in range. A binding
//! that checks the shape first reads the memory estimate twice per call (three `/proc`
//! files, some µs): the price of refusing a call before copying its input.

use super::model::Codec;
use crate::error::{Error, Result};
use crate::host::{check_finite, check_size, HostArray};
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
    /// [`Self::codes_shape`]). A binding calls it while it still holds the caller's array.
    pub fn input_shape(&self, input: Input, shape: &[usize]) -> Result<[usize; 3]> {
        match input {
            Input::Pcm => self.pcm_shape(shape),
            Input::Codes => self.codes_shape(shape, false),
            Input::CodesToDecode => self.codes_shape(shape, true),
        }
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

    /// Every input rule for audio: [`Self::pcm_shape`], the rows that step (`active`, all if
    /// `None`), then finite samples in those rows. Returns the array reshaped to
    /// `(batch, channels, samples)` and the rows.
    pub(crate) fn check_pcm(
        &self,
        mut pcm: HostArray<f32>,
        active: Option<Rows>,
    ) -> Result<(HostArray<f32>, Rows)> {
        check_len(&pcm, "pcm")?;
        let shape = self.pcm_shape(&pcm.shape)?;
        if pcm.shape != shape {
            pcm.shape = shape.to_vec();
        }
        let rows = Rows::or_all(active, pcm.shape[0])?;
        check_finite(&pcm.data, &pcm.shape, Some(&rows.indices()), "pcm")?;
        Ok((pcm, rows))
    }

    /// Every input rule for codes: [`Self::codes_shape`], the rows that step (`active`, all
    /// if `None`), then codes in range in those rows. Returns the rows.
    pub(crate) fn check_codes(
        &self,
        codes: &HostArray<u32>,
        active: Option<Rows>,
        decoded: bool,
    ) -> Result<Rows> {
        check_len(codes, "codes")?;
        let [b, k, t] = self.codes_shape(&codes.shape, decoded)?;
        let rows = Rows::or_all(active, b)?;
        let bins = self.config().quantizer_bins;
        for &r in rows.indices().iter() {
            let row = &codes.data[r * k * t..(r + 1) * k * t];
            if let Some(&c) = row.iter().find(|&&c| c as usize >= bins) {
                return Err(code_value(c.into(), bins).unwrap_err());
            }
        }
        Ok(rows)
    }
}

/// Refuses an array whose values do not fill its shape (a Rust caller's mistake).
fn check_len<T>(a: &HostArray<T>, what: &str) -> Result<()> {
    let n = a
        .shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d));
    if n != Some(a.data.len()) {
        return Err(Error::Shape(format!(
            "{what} holds {} values but its shape {:?} needs {}",
            a.data.len(),
            a.shape,
            n.map_or("more than usize::MAX".into(), |n| n.to_string())
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_in_range_and_arrays_filled() {
        assert_eq!(code_value(5, 6).unwrap(), 5);
        for v in [-1, 6, 1 << 40] {
            assert!(matches!(code_value(v, 6), Err(Error::InvalidInput(_))));
        }
        assert!(check_len(&HostArray::new(vec![0f32; 3], vec![3]), "x").is_ok());
        let short = HostArray {
            data: vec![0f32; 2],
            shape: vec![3],
        };
        assert!(matches!(check_len(&short, "x"), Err(Error::Shape(_))));
    }
}
