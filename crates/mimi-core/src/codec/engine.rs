//! The one interface over the two engines that compute the codec's convolutional parts
//! (the SEANet encoder/decoder and the down/upsampling): [`native`](super::native), this
//! crate's CPU float32 engine, and [`candle_engine`](super::candle_engine), its own layers on candle's
//! tensor operations on any device and dtype. The codec picks one at construction; everything
//! else (the transformers, the quantizer, the order of stages offline and streaming, the
//! stream counters) is shared: only the form of the activations between stages
//! ([`Activations`]) is the engine's. Both keep one streaming state per batch row.

use super::activations::Activations;
use super::native::cut::Offline;
use crate::config::CodecConfig;
use crate::error::{Cancel, Result};
use crate::rows::Rows;
use crate::transformer::Transformer;
use candle::{DType, Device};
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

/// An engine: the convolutional parts' weights, their stages in an offline call, and fresh
/// streams.
pub(crate) trait Engine: Send + Sync {
    fn kind(&self) -> EngineKind;
    /// Bytes of the convolutions' weights, as stored.
    fn weights_nbytes(&self) -> usize;
    /// An offline encode's convolution stages over audio (B, C, S), block by block, for
    /// [`super::offline::encode`] (which runs the transformer between them).
    fn encode_blocks<'a>(
        &'a self,
        p: &'a Parts,
        pcm: Activations,
        cancel: Cancel<'a>,
    ) -> Result<Box<dyn EncodeBlocks + 'a>>;
    /// An offline decode's convolution stages over the quantizer's latents (B, dimension,
    /// T), block by block, for [`super::offline::decode`].
    fn decode_blocks<'a>(
        &'a self,
        p: &'a Parts,
        latents: Activations,
        cancel: Cancel<'a>,
    ) -> Result<Box<dyn DecodeBlocks + 'a>>;
    /// Samples of one batch item whose activations are in flight at once in an offline call
    /// of `samples`, and the other bytes per sample it holds.
    fn in_flight(&self, p: &Parts, samples: usize) -> (u64, u64);
    /// Host values `(rows, channels, len)` (C order) in this engine's form, on `on`.
    fn activations(
        &self,
        data: Vec<f32>,
        shape: (usize, usize, usize),
        on: (&Device, DType),
    ) -> Result<Activations>;
    /// No frames for `rows` rows of `channels`, in this engine's form, on `on`.
    fn no_activations(&self, shape: (usize, usize), on: (&Device, DType)) -> Result<Activations>;
    /// Fresh convolution states for an encoder stream.
    fn encode_convs(self: Arc<Self>) -> Box<dyn EncodeConvs>;
    /// Fresh convolution states for a decoder stream.
    fn decode_convs(self: Arc<Self>) -> Box<dyn DecodeConvs>;
}

/// An offline encode's stages around the transformer, on fresh private state: the blocks
/// cut the call (the native engine: blocks of `Offline::block` tokens; the candle engine: one
/// block), and every block's SEANet output goes through the transformer, then the
/// downsampling, whose stream runs on across blocks.
pub(crate) trait EncodeBlocks {
    /// The blocks' bounds in input samples, in order; the last ends at the audio's end.
    fn blocks(&self) -> Vec<(usize, usize)>;
    /// The SEANet encoder over a block (`last`: the audio ends with it); `None` when no
    /// frame comes out.
    fn seanet(&mut self, block: (usize, usize), last: bool) -> Result<Option<Activations>>;
    /// The downsampling of the transformer's output; `None` when no frame comes out.
    fn downsample(&mut self, x: Activations, last: bool) -> Result<Option<Activations>>;
    /// The latents (B, dimension, frames): the blocks' outputs along time.
    fn finish(&self, parts: Vec<Activations>) -> Result<Activations>;
}

/// An offline decode's stages around the transformer, on fresh private state: each block's
/// upsampling goes through the transformer, then the SEANet decoder.
pub(crate) trait DecodeBlocks {
    /// The blocks' bounds in latent frames, in order.
    fn blocks(&self) -> Vec<(usize, usize)>;
    /// The upsampling of a block's latents; `None` when no frame comes out.
    fn upsample(&mut self, block: (usize, usize)) -> Result<Option<Activations>>;
    /// The SEANet decoder over the transformer's output: the block's audio.
    fn seanet(&mut self, x: Activations) -> Result<Activations>;
    /// The audio (B, C, samples): the blocks' outputs along time.
    fn finish(&self, parts: Vec<Activations>) -> Result<Activations>;
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
