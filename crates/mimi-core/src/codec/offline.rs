//! The offline calls: their one order of stages for both engines ([`encode`], [`decode`]:
//! per block of the engine's cut, the convolutions and the transformer on the engine's own
//! activations), and the call wrapper that runs inside the compute pool under the
//! working-memory policy. How the native engine cuts a call is its own
//! ([`super::native::cut`]).

use super::activations::{Activations, Codes};
use super::engine::{Engine, Parts};
use super::model::Codec;
use super::transform::transform_step;
use crate::conv;
use crate::error::{check_cancel, Cancel, Result};
use crate::rows::Rows;
use crate::transformer::{State, Workspace};

/// Runs an offline call inside the rayon pool (on the CPU: `kernels::in_pool_on`), then frees
/// the recycled buffers it left, and applies the working-memory policy
/// ([`crate::runtime::memory::trim_heap_after`]).
pub(crate) fn offline_call<R: Send>(dev: &candle::Device, f: impl FnOnce() -> R + Send) -> R {
    let before = crate::runtime::memory::resident_bytes();
    let r = crate::kernels::in_pool_on(dev, f);
    conv::release_buffers();
    crate::runtime::memory::trim_heap_after(before);
    r
}

/// Offline latents before quantization, (B, C, S) -> (B, dimension, frames), in the one
/// order of stages both engines share: per block of the engine's cut, the SEANet encoder,
/// the transformer (its stream runs on across blocks), the downsampling.
pub(crate) fn encode(
    engine: &dyn Engine,
    p: &Parts,
    pcm: Activations,
    cancel: Cancel,
) -> Result<Activations> {
    let b = pcm.rows()?;
    let mut job = engine.encode_blocks(p, pcm, cancel)?;
    let (mut tr, mut ws, all) = (State::default(), Workspace::new(), Rows::all(b));
    let blocks = job.blocks();
    let mut parts = Vec::with_capacity(blocks.len());
    for (i, &block) in blocks.iter().enumerate() {
        check_cancel(cancel)?;
        let last = i + 1 == blocks.len();
        // Empty frames still flush the downsampling's padding.
        let x = match job.seanet(block, last)? {
            Some(x) => transform_step(&p.enc_tr, (&mut tr, &mut ws), x, (&all, cancel))?,
            None => {
                let shape = (b, p.cfg.seanet.dimension);
                engine.no_activations(shape, (&p.device, p.dtype))?
            }
        };
        check_cancel(cancel)?;
        parts.extend(job.downsample(x, last)?);
    }
    job.finish(parts)
}

/// Offline audio from the quantizer's latents, (B, dimension, T) -> (B, C, T * frame), in
/// the one order of stages both engines share: per block of the engine's cut, the
/// upsampling, the transformer (its stream runs on across blocks), the SEANet decoder.
pub(crate) fn decode(
    engine: &dyn Engine,
    p: &Parts,
    latents: Activations,
    cancel: Cancel,
) -> Result<Activations> {
    let all = Rows::all(latents.rows()?);
    let mut job = engine.decode_blocks(p, latents, cancel)?;
    let (mut tr, mut ws) = (State::default(), Workspace::new());
    let mut parts = Vec::new();
    for block in job.blocks() {
        check_cancel(cancel)?;
        let Some(x) = job.upsample(block)? else {
            continue;
        };
        let x = transform_step(&p.dec_tr, (&mut tr, &mut ws), x, (&all, cancel))?;
        check_cancel(cancel)?;
        parts.push(job.seanet(x)?);
    }
    job.finish(parts)
}

impl Codec {
    /// `f` as an offline call ([`offline_call`] on the codec's device).
    pub(crate) fn offline<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        offline_call(&self.parts.device, f)
    }

    /// The offline latents of audio `(B, C, S)` in the engine's form, on fresh private state
    /// (inside [`Self::offline`]).
    pub(crate) fn latents_of(&self, pcm: Activations, cancel: Cancel) -> Result<Activations> {
        encode(&*self.engine, &self.parts, pcm, cancel)
    }

    /// The offline codes of audio `(B, C, S)`: `(B, n_q, ceil(S / frame_size))`. The last
    /// partial frame is padded, as in candle and transformers.
    pub(crate) fn codes_of(&self, pcm: Activations, cancel: Cancel) -> Result<Codes> {
        self.quantize(self.latents_of(pcm, cancel)?)
    }

    /// The offline audio of codes `(B, n_q, T)`: `(B, C, T * frame_size)`.
    pub(crate) fn audio_of(&self, codes: Codes, cancel: Cancel) -> Result<Activations> {
        let latents = self.dequantize(codes)?;
        decode(&*self.engine, &self.parts, latents, cancel)
    }
}
