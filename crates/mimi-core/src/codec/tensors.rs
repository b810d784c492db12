//! The codec's calls on candle tensors, for the tests only (`cfg(test)`): they compare the
//! engines and step streams on tensors. Every other caller uses the host calls.

use super::activations::{Activations, Codes};
use super::bridge::host_f32;
use super::model::Codec;
use super::stream::{DecodeStream, EncodeStream};
use crate::error::{Cancel, Error, Result};
use crate::rows::Rows;
use crate::runtime::device::cast;
use candle::{DType, Tensor};

impl Codec {
    /// `pcm` (rows, C, n) in the engine's form (through the host, as the host calls take it).
    pub(crate) fn activations_of(&self, pcm: &Tensor) -> Result<Activations> {
        let shape = pcm.dims3()?;
        let data = host_f32(pcm)?.data;
        (self.engine).activations(data, shape, (self.device(), self.dtype()))
    }

    /// The quantizer's reconstruction of codes: (B, n_q, T) -> (B, dimension, T).
    pub(crate) fn decode_latents(&self, codes: &Tensor) -> Result<Tensor> {
        self.quantizer.decode(codes)
    }

    /// Latents before quantization: (B, C, S) -> (B, dimension, frames).
    pub(crate) fn encode_latents(&self, pcm: &Tensor, cancel: Cancel) -> Result<Tensor> {
        let x = self.activations_of(pcm)?;
        self.offline(|| self.latents_of(x, cancel)?.into_tensor(self.device()))
    }

    /// (B, C, S) -> codes (B, n_q, ceil(S / frame_size)) u32. The last partial frame is
    /// padded, as in candle and transformers.
    pub(crate) fn encode(&self, pcm: &Tensor, cancel: Cancel) -> Result<Tensor> {
        let x = self.activations_of(pcm)?;
        self.offline(|| self.codes_of(x, cancel)?.into_tensor(self.device()))
    }

    /// codes (B, n_q, T) u32 -> audio (B, C, T * frame_size).
    pub(crate) fn decode(&self, codes: &Tensor, cancel: Cancel) -> Result<Tensor> {
        let codes = Codes::Tensor(codes.clone());
        self.offline(|| self.audio_of(codes, cancel)?.into_tensor(self.device()))
    }

    /// Feeds audio (B, C, n) to the streaming encoder; returns the codes of every frame
    /// completed by this chunk (possibly none).
    pub(crate) fn encode_step(&self, s: &mut EncodeStream, pcm: &Tensor) -> Result<Option<Tensor>> {
        self.encode_step_rows(s, pcm, &Rows::all(pcm.dim(0)?))
    }

    /// [`Self::encode_step`] for the rows `rows` of the stream (`pcm` holds those rows, in
    /// order): each continues its own stream, the others are untouched. A masked step takes
    /// whole frames.
    pub(crate) fn encode_step_rows(
        &self,
        s: &mut EncodeStream,
        pcm: &Tensor,
        rows: &Rows,
    ) -> Result<Option<Tensor>> {
        let n = pcm.dim(2)?;
        check_row_count(pcm.dim(0)?, rows, "pcm")?;
        self.check_encode_rows(s, n, rows)?;
        let x = self.activations_of(pcm)?;
        let out = self.step_encode(s, x, (n, rows), false)?;
        out.map(|c| c.into_tensor(self.device())).transpose()
    }

    /// The stream's last chunk (possibly empty): the codes of every frame it completes, then
    /// of the last partial frame, padded as the offline `encode` pads it (every layer's right
    /// padding). The concatenated codes of a stream ended this way are `encode`'s. The stream
    /// is spent afterwards: start a new one.
    pub(crate) fn encode_last(&self, s: &mut EncodeStream, pcm: &Tensor) -> Result<Option<Tensor>> {
        let b = pcm.dim(0)?;
        self.check_encode_last(s, b)?;
        let x = self.activations_of(pcm)?;
        let out = self.step_encode(s, x, (pcm.dim(2)?, &Rows::all(b)), true)?;
        out.map(|c| c.into_tensor(self.device())).transpose()
    }

    /// Feeds codes (B, n_q, T) to the streaming decoder; returns the audio they complete.
    pub(crate) fn decode_step(
        &self,
        s: &mut DecodeStream,
        codes: &Tensor,
    ) -> Result<Option<Tensor>> {
        self.decode_step_rows(s, codes, &Rows::all(codes.dim(0)?))
    }

    /// [`Self::decode_step`] for the rows `rows` of the stream (see
    /// [`Self::encode_step_rows`]).
    pub(crate) fn decode_step_rows(
        &self,
        s: &mut DecodeStream,
        codes: &Tensor,
        rows: &Rows,
    ) -> Result<Option<Tensor>> {
        check_row_count(codes.dim(0)?, rows, "codes")?;
        // Codes of any integer dtype, as u32 (a negative code becomes one out of range).
        let codes = match codes.dtype() {
            DType::U32 => codes.clone(),
            DType::U8 | DType::I64 => cast(codes, DType::U32)?,
            other => {
                return Err(Error::DType(format!(
                    "codes must hold integers (u8, u32 or i64), got {other:?}"
                )))
            }
        };
        let out = self.step_decode(s, Codes::Tensor(codes), rows)?;
        out.map(|a| a.into_tensor(self.device())).transpose()
    }
}

/// Refuses `what` of `n` rows for a step of `rows` (it holds the stepping rows, in order).
fn check_row_count(n: usize, rows: &Rows, what: &str) -> Result<()> {
    match n == rows.count() {
        true => Ok(()),
        false => Err(Error::Shape(format!(
            "{what} holds {n} rows, but the step advances {} of the stream's {}",
            rows.count(),
            rows.batch()
        ))),
    }
}
