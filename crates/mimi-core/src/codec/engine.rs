//! The one interface over the two engines that compute the codec's convolutional parts
//! (the SEANet encoder/decoder and the down/upsampling): [`native`](super::native), this
//! crate's CPU float32 engine, and [`candle_engine`](super::candle_engine), its own layers on candle's
//! tensor operations on any device and dtype. The codec picks one at construction; everything else (the transformers, the
//! quantizer, the wiring, the stream counters) is shared and never asks which it is. Both
//! keep one streaming state per batch row.

use super::activations::Activations;
use super::offline::Offline;
use crate::config::CodecConfig;
use crate::error::{Cancel, Result};
use crate::rows::Rows;
use crate::transformer::Transformer;
use candle::{DType, Device, Tensor};
use std::sync::Arc;

/// Which implementation computes the convolutional parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    /// This crate's CPU engine ([`crate::seanet`]); CPU and f32 only.
    Native,
    /// This crate's layers on candle's tensor operations (any device, any dtype).
    Candle,
}

impl EngineKind {
    /// The engine a codec gets unless asked: native on the CPU in f32, candle otherwise.
    pub fn default_for(device: &Device, dtype: DType) -> Self {
        if device.is_cpu() && dtype == DType::F32 {
            Self::Native
        } else {
            Self::Candle
        }
    }
}

/// The parts of a codec that every engine uses: the config, the two transformers, the
/// offline plan and where it computes.
pub(crate) struct Parts {
    pub cfg: CodecConfig,
    pub offline: Offline,
    pub enc_tr: Transformer,
    pub dec_tr: Transformer,
    pub device: Device,
    pub dtype: DType,
}

/// An engine: the convolutional parts' weights, their offline calls, and fresh streams.
pub(crate) trait Engine: Send + Sync {
    fn kind(&self) -> EngineKind;
    /// Bytes of the convolutions' weights, as stored.
    fn weights_nbytes(&self) -> usize;
    /// Offline latents before quantization: (B, C, S) -> (B, dimension, frames).
    fn encode(&self, p: &Parts, pcm: &Tensor, cancel: Cancel) -> Result<Tensor>;
    /// Offline audio from the quantizer's latents: (B, dimension, T) -> (B, C, T * frame).
    fn decode(&self, p: &Parts, latents: &Tensor, cancel: Cancel) -> Result<Tensor>;
    /// Samples of one batch item whose activations are in flight at once in an offline call
    /// of `samples`, and the other bytes per sample it holds.
    fn in_flight(&self, p: &Parts, samples: usize) -> (u64, u64);
    /// Fresh convolution states for an encoder stream.
    fn encode_convs(self: Arc<Self>) -> Box<dyn EncodeConvs>;
    /// Fresh convolution states for a decoder stream.
    fn decode_convs(self: Arc<Self>) -> Box<dyn DecodeConvs>;
}

/// An encoder stream's convolution states, by phase around the transformer. Each phase
/// takes the rows that step, in the engine's own [`Activations`] (the codec gives each
/// engine its own form), and returns `None` when no frame comes out.
pub trait EncodeConvs: Send {
    /// The SEANet encoder over new audio (the stepping rows of a `(rows, C, n)` chunk).
    fn seanet(&mut self, rows: &Rows, pcm: Activations, last: bool) -> Result<Option<Activations>>;
    /// The downsampling of the transformer's output.
    fn downsample(
        &mut self,
        rows: &Rows,
        x: Activations,
        last: bool,
    ) -> Result<Option<Activations>>;
    /// Returns row `r` to a fresh state (if it has one yet).
    fn reset_row(&mut self, r: usize);
    /// An independent copy.
    fn deep_copy(&self) -> Box<dyn EncodeConvs>;
}

/// A decoder stream's convolution states, by phase around the transformer.
pub trait DecodeConvs: Send {
    /// The upsampling of the quantizer's latents.
    fn upsample(&mut self, rows: &Rows, x: Activations) -> Result<Option<Activations>>;
    /// The SEANet decoder over the transformer's output.
    fn seanet(&mut self, rows: &Rows, x: Activations) -> Result<Option<Activations>>;
    /// Returns row `r` to a fresh state (if it has one yet).
    fn reset_row(&mut self, r: usize);
    /// An independent copy.
    fn deep_copy(&self) -> Box<dyn DecodeConvs>;
}

/// The convolution states of either direction, for [`super::stream::Stream`].
pub trait Convolutions: Send {
    fn reset_row(&mut self, r: usize);
    fn copy(&self) -> Self;
}

impl Convolutions for Box<dyn EncodeConvs> {
    fn reset_row(&mut self, r: usize) {
        (**self).reset_row(r)
    }
    fn copy(&self) -> Self {
        self.deep_copy()
    }
}

impl Convolutions for Box<dyn DecodeConvs> {
    fn reset_row(&mut self, r: usize) {
        (**self).reset_row(r)
    }
    fn copy(&self) -> Self {
        self.deep_copy()
    }
}
