//! The candle engine: the convolutional parts on candle's tensor operations, on any device
//! and dtype (GPUs, half precision), with one streaming state per batch row held as batched
//! device tensors: masked steps, per-row resets and `last=True` endings, as the native
//! engine has them.
//!
//! The layers are this engine's own ([`layers`]: causal and transposed convolutions over
//! `[history ++ input]` with candle's `conv1d`), assembled into the SEANets ([`seanet`]); the
//! rows a step touches are device index tensors ([`rows`]). An offline call is one step of a
//! fresh stream with `last`, which pads as candle's offline modules do.

mod layers;
mod seanet;
mod step_rows;
#[cfg(test)]
mod tests;

use super::activations::Activations;
use super::engine::{
    DecodeBlocks, DecodeConvs, EncodeBlocks, EncodeConvs, Engine, EngineKind, Parts,
};
use crate::config::{CodecConfig, PadMode};
use crate::conv::ConvSpec;
use crate::error::{Cancel, Result};
use crate::rows::Rows;
use crate::runtime::device::zeros_on;
use candle::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use layers::{Conv, Depthwise, LayerState};
use seanet::{CandleDecoder, CandleEncoder, States};
use std::sync::Arc;
use step_rows::StepRows;

/// The engine's layers, holding the weights (immutable, shared by its streams).
pub(crate) struct Candle {
    encoder: CandleEncoder,
    decoder: CandleDecoder,
    downsample: Conv,
    upsample: Depthwise,
}

impl Candle {
    /// The SEANets and the down/upsampling from `vb`, in its dtype and on its device.
    pub(crate) fn load(cfg: &CodecConfig, vb: &VarBuilder) -> Result<Self> {
        let (dim, stride) = (cfg.seanet.dimension, cfg.downsample_stride());
        let down = ConvSpec::new(dim, dim, 2 * stride)
            .stride(stride)
            .no_bias()
            .pad(PadMode::Replicate);
        Ok(Self {
            encoder: CandleEncoder::load(&cfg.seanet, vb.pp("encoder"))?,
            decoder: CandleDecoder::load(&cfg.seanet, vb.pp("decoder"))?,
            downsample: Conv::load(vb.pp("downsample"), down, None)?,
            upsample: Depthwise::load(vb.pp("upsample"), dim, stride)?,
        })
    }
}

/// A phase's output, `None` when it holds no frame.
fn nonempty(x: Tensor) -> Result<Option<Activations>> {
    Activations::Tensor(x).nonempty()
}

impl Engine for Candle {
    fn kind(&self) -> EngineKind {
        EngineKind::Candle
    }

    fn weights_nbytes(&self) -> usize {
        (self.encoder.weights_nbytes() + self.decoder.weights_nbytes())
            + (self.downsample.weights_nbytes() + self.upsample.weights_nbytes())
    }

    /// One block: the whole call, as one step of a fresh stream with `last`.
    fn encode_blocks<'a>(
        &'a self,
        p: &'a Parts,
        pcm: Activations,
        cancel: Cancel<'a>,
    ) -> Result<Box<dyn EncodeBlocks + 'a>> {
        let pcm = pcm.expect_tensor()?;
        Ok(Box::new(CandleEncodeBlocks {
            engine: self,
            p,
            rows: StepRows::new(&Rows::all(pcm.dim(0)?), pcm.device())?,
            pcm,
            seanet: States::new(),
            downsample: LayerState::default(),
            cancel,
        }))
    }

    /// One block: the whole call, as one step of a fresh stream.
    fn decode_blocks<'a>(
        &'a self,
        p: &'a Parts,
        latents: Activations,
        cancel: Cancel<'a>,
    ) -> Result<Box<dyn DecodeBlocks + 'a>> {
        let latents = latents.expect_tensor()?;
        Ok(Box::new(CandleDecodeBlocks {
            engine: self,
            p,
            rows: StepRows::new(&Rows::all(latents.dim(0)?), latents.device())?,
            latents,
            upsample: LayerState::default(),
            seanet: States::new(),
            cancel,
        }))
    }

    /// The whole call's activations at once, about 2 KB per sample (see the native engine).
    fn in_flight(&self, _p: &Parts, samples: usize) -> (u64, u64) {
        (samples as u64, 0)
    }

    fn activations(
        &self,
        data: Vec<f32>,
        shape: (usize, usize, usize),
        on: (&Device, DType),
    ) -> Result<Activations> {
        Activations::host_tensor(data, shape, on)
    }

    fn no_activations(
        &self,
        (rows, channels): (usize, usize),
        (dev, dtype): (&Device, DType),
    ) -> Result<Activations> {
        Ok(Activations::Tensor(zeros_on(
            (rows, channels, 0),
            dtype,
            dev,
        )?))
    }

    fn encode_convs(self: Arc<Self>) -> Box<dyn EncodeConvs> {
        Box::new(CandleEncode {
            engine: self,
            seanet: States::new(),
            downsample: LayerState::default(),
        })
    }

    fn decode_convs(self: Arc<Self>) -> Box<dyn DecodeConvs> {
        Box::new(CandleDecode {
            engine: self,
            upsample: LayerState::default(),
            seanet: States::new(),
        })
    }
}

/// The one block's output of an offline call, or no frames of `channels`.
fn only_block(parts: Vec<Activations>, p: &Parts, (b, channels): (usize, usize)) -> Result<Tensor> {
    match parts.into_iter().next() {
        Some(x) => x.expect_tensor(),
        None => Ok(zeros_on((b, channels, 0), p.dtype, &p.device)?),
    }
}

/// An offline encode on the candle engine: the audio and a fresh stream's states.
struct CandleEncodeBlocks<'a> {
    engine: &'a Candle,
    p: &'a Parts,
    rows: StepRows,
    pcm: Tensor,
    seanet: States,
    downsample: LayerState,
    cancel: Cancel<'a>,
}

impl EncodeBlocks for CandleEncodeBlocks<'_> {
    fn blocks(&self) -> Vec<(usize, usize)> {
        vec![(0, self.pcm.dims().last().copied().unwrap_or(0))]
    }

    fn seanet(&mut self, _: (usize, usize), last: bool) -> Result<Option<Activations>> {
        let enc = &self.engine.encoder;
        nonempty(enc.step(&mut self.seanet, &self.rows, &self.pcm, last, self.cancel)?)
    }

    fn downsample(&mut self, x: Activations, last: bool) -> Result<Option<Activations>> {
        let down = &self.engine.downsample;
        let x = x.expect_tensor()?;
        nonempty(down.step(&mut self.downsample, &self.rows, &x, last)?)
    }

    fn finish(&self, parts: Vec<Activations>) -> Result<Activations> {
        let shape = (self.rows.batch, self.p.cfg.seanet.dimension);
        Ok(Activations::Tensor(only_block(parts, self.p, shape)?))
    }
}

/// An offline decode on the candle engine: the latents and a fresh stream's states.
struct CandleDecodeBlocks<'a> {
    engine: &'a Candle,
    p: &'a Parts,
    rows: StepRows,
    latents: Tensor,
    upsample: LayerState,
    seanet: States,
    cancel: Cancel<'a>,
}

impl DecodeBlocks for CandleDecodeBlocks<'_> {
    fn blocks(&self) -> Vec<(usize, usize)> {
        vec![(0, self.latents.dims().last().copied().unwrap_or(0))]
    }

    fn upsample(&mut self, _: (usize, usize)) -> Result<Option<Activations>> {
        let up = &self.engine.upsample;
        nonempty(up.step(&mut self.upsample, &self.rows, &self.latents)?)
    }

    fn seanet(&mut self, x: Activations) -> Result<Activations> {
        let dec = &self.engine.decoder;
        let y = dec.step(
            &mut self.seanet,
            &self.rows,
            &x.expect_tensor()?,
            self.cancel,
        )?;
        Ok(Activations::Tensor(y))
    }

    fn finish(&self, parts: Vec<Activations>) -> Result<Activations> {
        let shape = (self.rows.batch, self.p.cfg.channels);
        Ok(Activations::Tensor(only_block(parts, self.p, shape)?))
    }
}

/// An encoder stream on the candle engine: every layer's per-row state.
#[derive(Clone)]
struct CandleEncode {
    engine: Arc<Candle>,
    seanet: States,
    downsample: LayerState,
}

impl EncodeConvs for CandleEncode {
    fn seanet(&mut self, rows: &Rows, pcm: Activations, last: bool) -> Result<Option<Activations>> {
        let pcm = pcm.expect_tensor()?;
        let rows = StepRows::new(rows, pcm.device())?;
        let enc = &self.engine.encoder;
        nonempty(enc.step(&mut self.seanet, &rows, &pcm, last, None)?)
    }

    fn downsample(
        &mut self,
        rows: &Rows,
        x: Activations,
        last: bool,
    ) -> Result<Option<Activations>> {
        let x = x.expect_tensor()?;
        let rows = StepRows::new(rows, x.device())?;
        let down = &self.engine.downsample;
        nonempty(down.step(&mut self.downsample, &rows, &x, last)?)
    }

    fn reset_row(&mut self, r: usize) {
        for st in self.seanet.iter_mut() {
            st.reset_row(r);
        }
        self.downsample.reset_row(r);
    }

    fn deep_copy(&self) -> Box<dyn EncodeConvs> {
        Box::new(self.clone())
    }
}

/// A decoder stream on the candle engine: every layer's per-row state.
#[derive(Clone)]
struct CandleDecode {
    engine: Arc<Candle>,
    upsample: LayerState,
    seanet: States,
}

impl DecodeConvs for CandleDecode {
    fn upsample(&mut self, rows: &Rows, x: Activations) -> Result<Option<Activations>> {
        let x = x.expect_tensor()?;
        let rows = StepRows::new(rows, x.device())?;
        nonempty(self.engine.upsample.step(&mut self.upsample, &rows, &x)?)
    }

    fn seanet(&mut self, rows: &Rows, x: Activations) -> Result<Option<Activations>> {
        let x = x.expect_tensor()?;
        let rows = StepRows::new(rows, x.device())?;
        let dec = &self.engine.decoder;
        nonempty(dec.step(&mut self.seanet, &rows, &x, None)?)
    }

    fn reset_row(&mut self, r: usize) {
        self.upsample.reset_row(r);
        for st in self.seanet.iter_mut() {
            st.reset_row(r);
        }
    }

    fn deep_copy(&self) -> Box<dyn DecodeConvs> {
        Box::new(self.clone())
    }
}
