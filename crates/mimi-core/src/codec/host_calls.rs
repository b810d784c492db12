//! The codec's calls on host arrays: every offline and streaming call, for a caller without
//! candle (the Python binding, a Rust user holding `Vec`s). Each checks its inputs against
//! the rules of [`super::inputs`] before anything runs or any state changes, then computes
//! on the codec's device and returns host arrays. A masked step selects the stepping rows,
//! steps them, and scatters the result back into the whole batch (inactive rows' output is
//! zeros).

use super::activations::{Activations, Codes};
use super::inputs::{check_last, Input};
use super::lengths::{check_lengths, per_item};
use super::model::Codec;
use super::stream::{DecodeStream, EncodeStream};
use crate::error::{Cancel, Result};
use crate::host::{HostArray, HostInput};
use crate::rows::Rows;

/// How one [`Codec::encode_step_host`] call steps.
#[derive(Clone, Debug, Default)]
pub struct EncodeStep {
    /// The rows that step (`None`: all); the others keep their state bit for bit. A masked
    /// step takes whole frames.
    pub active: Option<Rows>,
    /// The stream ends with this chunk: its last partial frame is padded as the offline
    /// `encode` pads it, and the stream starts afresh afterwards. Not with `active`.
    pub last: bool,
}

/// The unit of an offline call's input, in which `lengths=` counts.
#[derive(Clone, Copy)]
enum Unit {
    /// Samples of audio, giving a frame of output each `frame` of them (rounded up).
    Samples { frame: usize },
    /// Frames of codes, each giving `per_frame` columns of output.
    Frames { per_frame: usize },
}

impl Unit {
    fn name(self) -> &'static str {
        match self {
            Unit::Samples { .. } => "samples",
            Unit::Frames { .. } => "frames",
        }
    }

    /// The output's columns for an item of `l` units.
    fn columns(self, l: usize) -> usize {
        match self {
            Unit::Samples { frame } => l.div_ceil(frame),
            Unit::Frames { per_frame } => l * per_frame,
        }
    }
}

impl Codec {
    /// Audio `(B, C, S)` in the engine's form (the native engine's: no tensor).
    fn host_activations(&self, a: HostArray<f32>) -> Result<Activations> {
        let shape = (a.shape[0], a.shape[1], a.shape[2]);
        (self.engine).activations(a.data, shape, (self.device(), self.dtype()))
    }

    /// Audio `(B, C, S)` (or `(S,)`, mono) to codes `(B, n_q, ceil(S / frame_size))`. With
    /// `lengths` (samples per item), item `i` gets exactly the codes of its first
    /// `lengths[i]` samples alone, then zeros up to the longest item.
    pub fn encode_host(
        &self,
        pcm: impl Into<HostInput<f32>>,
        lengths: Option<&[usize]>,
        cancel: Cancel,
    ) -> Result<HostArray<u32>> {
        let f = |x: HostArray<f32>| {
            let codes = self.codes_of(self.host_activations(x)?, cancel)?;
            codes.into_host()
        };
        let (pcm, _) = self.check_pcm(pcm.into(), None)?;
        let out = (self.config().quantizer_n_q, self.samples());
        self.offline_host(pcm, lengths, out, &f)
    }

    /// The latents before quantization, `(B, dimension, frames)` (see [`Self::encode_host`]).
    pub fn encode_latents_host(
        &self,
        pcm: impl Into<HostInput<f32>>,
        lengths: Option<&[usize]>,
        cancel: Cancel,
    ) -> Result<HostArray<f32>> {
        let f = |x: HostArray<f32>| {
            let latents = self.latents_of(self.host_activations(x)?, cancel)?;
            latents.into_host()
        };
        let (pcm, _) = self.check_pcm(pcm.into(), None)?;
        let out = (self.config().seanet.dimension, self.samples());
        self.offline_host(pcm, lengths, out, &f)
    }

    /// The quantizer's reconstruction of codes `(B, n_q, T)`: `(B, dimension, T)`. With
    /// `lengths` (frames per item), as in [`Self::decode_host`].
    pub fn decode_latents_host(
        &self,
        codes: impl Into<HostInput<u32>>,
        lengths: Option<&[usize]>,
    ) -> Result<HostArray<f32>> {
        let (codes, _) = self.check_codes(codes.into(), None, Input::Codes)?;
        let f = |c: HostArray<u32>| self.dequantize(Codes::Host(c))?.into_host();
        let out = (
            self.config().seanet.dimension,
            Unit::Frames { per_frame: 1 },
        );
        self.offline_host(codes, lengths, out, &f)
    }

    /// Codes `(B, n_q, T)` in `[0, cardinality)` to audio `(B, C, T * frame_size)`. With
    /// `lengths` (frames per item), item `i`'s first `lengths[i] * frame_size` samples are
    /// exactly its own decode, then zeros (codes past an item's length must still be in
    /// range).
    pub fn decode_host(
        &self,
        codes: impl Into<HostInput<u32>>,
        lengths: Option<&[usize]>,
        cancel: Cancel,
    ) -> Result<HostArray<f32>> {
        let (codes, _) = self.check_codes(codes.into(), None, Input::CodesToDecode)?;
        let f = |c: HostArray<u32>| self.audio_of(Codes::Host(c), cancel)?.into_host();
        let per_frame = self.config().frame_size();
        let out = (self.config().channels, Unit::Frames { per_frame });
        self.offline_host(codes, lengths, out, &f)
    }

    /// The unit of audio input: samples, a frame of output each `frame_size`.
    fn samples(&self) -> Unit {
        let frame = self.config().frame_size();
        Unit::Samples { frame }
    }

    /// An offline call on a checked input `(B, _, n)` of `unit`s: checks `lengths`, answers
    /// `n = 0` with `(B, channels, 0)` (the output's channels), and otherwise runs `f` on the
    /// batch or on each item alone ([`per_item`]), in the pool.
    fn offline_host<T, U>(
        &self,
        x: HostArray<T>,
        lengths: Option<&[usize]>,
        (channels, unit): (usize, Unit),
        f: &(dyn Fn(HostArray<T>) -> Result<HostArray<U>> + Sync),
    ) -> Result<HostArray<U>>
    where
        T: Copy + Send + Sync,
        U: Copy + Default + Send,
    {
        let (b, n) = (x.shape[0], x.shape[2]);
        if let Some(l) = lengths {
            check_lengths(l, b, n, unit.name())?;
        }
        if n == 0 {
            return Ok(HostArray::new(vec![], vec![b, channels, 0]));
        }
        let columns = |l: usize| unit.columns(l);
        let spec = (
            channels,
            &columns as &(dyn Fn(usize) -> usize + Sync),
            self.device().is_cpu(),
        );
        self.offline(|| match lengths {
            None => f(x),
            Some(l) => per_item(&x, l, spec, f),
        })
    }

    /// One encoder step of `pcm` `(B, C, n)`: the codes `(B, n_q, frames)` of the frames it
    /// completes, `None` if none. See [`EncodeStep`] for the rows that step and the last
    /// chunk.
    pub fn encode_step_host(
        &self,
        s: &mut EncodeStream,
        pcm: impl Into<HostInput<f32>>,
        step: EncodeStep,
    ) -> Result<Option<HostArray<u32>>> {
        check_last(step.active.as_ref(), step.last)?;
        let (pcm, rows) = self.check_pcm(pcm.into(), step.active)?;
        let (b, c, n) = (pcm.shape[0], pcm.shape[1], pcm.shape[2]);
        let on = (self.device(), self.dtype());
        if step.last {
            self.check_encode_last(s, b)?;
            let x = self.engine.activations(pcm.data, (b, c, n), on)?;
            let out = self.step_encode(s, x, (n, &Rows::all(b)), true)?;
            *s = self.encode_stream();
            return out.map(Codes::into_host).transpose();
        }
        if !rows.is_masked() && n == 0 {
            s.check_batch(b, "encoder")?;
            return Ok(None);
        }
        self.check_encode_rows(s, n, &rows)?;
        let data = match rows.is_masked() {
            true => rows.select(&pcm.data, c * n),
            false => pcm.data,
        };
        let x = self.engine.activations(data, (rows.count(), c, n), on)?;
        let out = self.step_encode(s, x, (n, &rows), false)?;
        if !rows.is_masked() {
            return out.map(Codes::into_host).transpose();
        }
        let k = self.config().quantizer_n_q;
        let frames = n / self.config().frame_size();
        if frames == 0 {
            return Ok(None);
        }
        let codes = match out {
            Some(codes) => codes.into_host()?.data,
            None => vec![0; rows.count() * k * frames],
        };
        let codes = rows.scatter(codes, k * frames);
        Ok(Some(HostArray::new(codes, vec![b, k, frames])))
    }

    /// One decoder step of `codes` `(B, n_q, T)` for the rows `active` (all if `None`; the
    /// inactive rows' codes are not read): the audio `(B, C, T * frame_size)` they complete,
    /// `None` if none.
    pub fn decode_step_host(
        &self,
        s: &mut DecodeStream,
        codes: impl Into<HostInput<u32>>,
        active: Option<Rows>,
    ) -> Result<Option<HostArray<f32>>> {
        let (codes, rows) = self.check_codes(codes.into(), active, Input::CodesToDecode)?;
        let (b, k, t) = (codes.shape[0], codes.shape[1], codes.shape[2]);
        s.check_batch(b, "decoder")?;
        if t == 0 {
            return Ok(None); // no frames: the stream is not bound to this batch size
        }
        let x = match rows.is_masked() {
            true => HostArray::new(rows.select(&codes.data, k * t), vec![rows.count(), k, t]),
            false => codes,
        };
        let x = Codes::Host(x);
        let out = self.step_decode(s, x, &rows)?;
        if !rows.is_masked() {
            return out.map(Activations::into_host).transpose();
        }
        let (ch, len) = (self.config().channels, t * self.config().frame_size());
        let audio = match out {
            Some(a) => a.into_host()?.data,
            None => vec![0.0; rows.count() * ch * len],
        };
        let audio = rows.scatter(audio, ch * len);
        Ok(Some(HostArray::new(audio, vec![b, ch, len])))
    }
}
