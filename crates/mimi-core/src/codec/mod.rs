//! The Mimi codec (audio <-> tokens): [`Codec`], its offline and streaming calls.
//!
//! Owned here: the two transformers (this crate's [`Transformer`], exact window, unbounded
//! streams), the quantizer ([`Quantizer`]), the wiring, the checkpoint readers for both real
//! layouts ([`checkpoint`]), the streams ([`stream`]) and their rows ([`Rows`]). The
//! convolutional parts (SEANet encoder/decoder, down/upsampling) run on one of two engines
//! behind one interface ([`engine`]): the [`native`] CPU engine, or the [`candle`] engine
//! (its own layers on candle's tensor operations) on GPUs and in half precision. Both keep
//! one streaming state per batch row.
//!
//! Offline calls use fresh, private state and never touch the streaming state; streaming
//! calls go through [`EncodeStream`] / [`DecodeStream`].

pub mod activations;
mod bridge;
pub mod candle_engine;
pub mod checkpoint;
pub mod engine;
pub mod host_calls;
pub mod inputs;
pub mod lengths;
pub mod native;
mod offline;
pub mod open;
pub mod step;
pub mod stream;
#[cfg(test)]
mod tests;

pub use crate::rows::Rows;
pub use checkpoint::{Checkpoint, CheckpointDir, CheckpointLayout};
pub use engine::EngineKind;
pub use host_calls::EncodeStep;
pub use open::OpenOptions;
pub use stream::{DecodeStream, EncodeStream};

use self::candle_engine::Candle;
use crate::config::CodecConfig;
use crate::error::{Cancel, Result};
use crate::host::HostArray;
use crate::quantizer::Quantizer;
use crate::runtime::device::cast;
use crate::runtime::precision::{MediumLayers, Precision};
use crate::transformer::{State, Transformer};
use crate::weights::{self, QkLayout, TensorSource};
use ::candle::{DType, Device, Tensor};
use engine::{Engine, Parts};
use native::Native;
use offline::{offline_call, Offline};
use std::collections::BTreeMap;
use std::sync::Arc;
use stream::Stream;

/// (B, D, T) -> the transformer over time -> (B, D, T), continuing `state`.
pub(crate) fn transform(
    model: &Transformer,
    state: &mut State,
    xs: &Tensor,
    cancel: Cancel,
) -> Result<Tensor> {
    let x = xs.transpose(1, 2)?.contiguous()?;
    let y = model.forward_cancellable(state, &x, cancel)?;
    Ok(y.transpose(1, 2)?.contiguous()?)
}

/// A tensor's values on the host, as f32 or u32.
fn host_f32(t: &Tensor) -> Result<HostArray<f32>> {
    let data = cast(t, DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    Ok(HostArray::new(data, t.dims().to_vec()))
}

fn host_u32(t: &Tensor) -> Result<HostArray<u32>> {
    Ok(HostArray::new(
        t.flatten_all()?.to_vec1::<u32>()?,
        t.dims().to_vec(),
    ))
}

/// The codec's weights and modules; immutable once built, shared between threads.
pub struct Codec {
    parts: Parts,
    engine: Arc<dyn Engine>,
    quantizer: Quantizer,
    precision: Precision,
    layout: Option<CheckpointLayout>,
}

impl Codec {
    /// Builds the codec on `engine`, reading every weight from `source` (already in candle's
    /// names, q/k interleaved: the doors of `open.rs` convert a checkpoint first). Refuses
    /// configs whose weights cannot fit in memory before reading anything.
    fn build(
        cfg: &CodecConfig,
        source: TensorSource,
        (device, dtype, precision): (&Device, DType, Precision),
        engine: EngineKind,
    ) -> Result<Self> {
        cfg.transformer.check_supported()?;
        Self::check_weights_memory(cfg)?;
        let source = Arc::new(source);
        let vb = source.var_builder(dtype, device);
        let engine: Arc<dyn Engine> = match engine {
            EngineKind::Native => Arc::new(Native::load(cfg, &vb, precision)?),
            EngineKind::Candle => Arc::new(Candle::load(cfg, &vb)?),
        };
        // The quantizer always computes in f32, whatever the codec's dtype: a code is an
        // argmin over distances to nearby centroids, so it is kept at full precision, and the
        // latents are cast to f32 on the way in (and back to `dtype` on the way out).
        let quantizer =
            Quantizer::load(cfg, &source.var_builder(DType::F32, device).pp("quantizer"))?;
        // "medium" stores the transformers' matrices in bf16 only where it pairs them.
        let pairs = precision == Precision::Medium && MediumLayers::from_settings().transformers;
        let spec = weights::LoadSpec {
            prefix: "",
            layout: QkLayout::Interleaved,
            device,
            dtype,
            precision: match precision {
                Precision::Medium if !pairs => Precision::Highest,
                p => p,
            },
        };
        let [enc_w, dec_w] = Self::transformer_weights(cfg, &source, &spec)?;
        Self::report_unread(cfg, &source);
        source.finish()?;
        let mut enc_tr = Transformer::new(&cfg.transformer, enc_w, device, dtype)?;
        let mut dec_tr = Transformer::new(&cfg.transformer, dec_w, device, dtype)?;
        if pairs {
            enc_tr.pair_pack();
            dec_tr.pair_pack();
        }
        let parts = Parts {
            cfg: cfg.clone(),
            offline: Offline::default(),
            enc_tr,
            dec_tr,
            device: device.clone(),
            dtype,
        };
        // Loading freed every weight it read once packed or converted: give those pages back.
        crate::runtime::memory::trim_heap();
        // On a GPU the weights were queued on this thread's stream: wait for them, so that
        // calls from other threads read them whole (`kernels::in_pool_on`).
        device.synchronize()?;
        Ok(Self {
            parts,
            engine,
            quantizer,
            precision,
            layout: None,
        })
    }

    /// Refuses configs whose weights cannot fit in memory.
    fn check_weights_memory(cfg: &CodecConfig) -> Result<()> {
        let tr_params = weights::transformer_params(&cfg.transformer);
        let codebooks = (cfg.quantizer_n_q as u64)
            .saturating_mul(cfg.quantizer_bins as u64)
            .saturating_mul(cfg.quantizer_dim as u64 + 2);
        weights::check_load_memory(
            2 * tr_params + codebooks,
            "this codec's weights",
            "check the config's sizes (quantizer_bins, quantizer_dim, transformer)",
        )
    }

    /// The encoder's and decoder's transformer weights. A seeded source gives each its own
    /// seed (`seed + 1`, `seed + 2`) over unprefixed names.
    fn transformer_weights(
        cfg: &CodecConfig,
        source: &TensorSource,
        spec: &weights::LoadSpec,
    ) -> Result<[BTreeMap<String, Tensor>; 2]> {
        let tcfg = &cfg.transformer;
        let load = |i: u64, prefix| match source.seed() {
            Some(seed) => {
                let own = TensorSource::seeded(seed.wrapping_add(1 + i), tcfg.layer_scale);
                weights::load_transformer(tcfg, &own, spec)
            }
            None => weights::load_transformer(tcfg, source, &weights::LoadSpec { prefix, ..*spec }),
        };
        Ok([
            load(0, "encoder_transformer.")?,
            load(1, "decoder_transformer.")?,
        ])
    }

    /// Records the checkpoint's tensors that nobody read: a checkpoint that does not match
    /// the config. Unused codebooks (`num_codebooks` below what the file holds) are fine.
    fn report_unread(cfg: &CodecConfig, source: &TensorSource) {
        let unused_codebook = |n: &str| {
            n.strip_prefix("quantizer.acoustic_residual_vector_quantizer.layers.")
                .and_then(|r| r.split('.').next())
                .and_then(|i| i.parse::<usize>().ok())
                .is_some_and(|i| i + 1 >= cfg.quantizer_n_q)
        };
        source.report_unread(|n| !unused_codebook(n), "the config does not read it");
    }

    /// The codec's config.
    pub fn config(&self) -> &CodecConfig {
        &self.parts.cfg
    }

    /// How its products compute and its weight matrices are stored.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Bytes of the weights one frame (an encode and a decode step) reads, as stored: both
    /// transformers, the convolutions and the quantizer. Divided by the memory bandwidth, it
    /// is the floor of a one-stream frame's time.
    pub fn weights_nbytes(&self) -> usize {
        let transformers = self.parts.enc_tr.weights_nbytes() + self.parts.dec_tr.weights_nbytes();
        transformers + self.engine.weights_nbytes() + self.quantizer.weights_nbytes()
    }

    /// The engine computing the convolutional parts.
    pub fn engine(&self) -> EngineKind {
        self.engine.kind()
    }

    pub fn device(&self) -> &Device {
        &self.parts.device
    }

    pub fn dtype(&self) -> DType {
        self.parts.dtype
    }

    /// Estimated peak bytes of an offline call on `batch` items of `samples` samples each.
    pub fn offline_memory(&self, batch: usize, samples: usize) -> u64 {
        let per_sample = (2048 * self.parts.cfg.seanet.n_filters as u64 / 64).max(64);
        let (in_flight, rest) = self.engine.in_flight(&self.parts, samples);
        (batch as u64).saturating_mul(in_flight.saturating_mul(per_sample).saturating_add(rest))
    }

    /// Refuses an offline call on `batch` items of `samples` samples that would not fit in
    /// the memory available (`what` and `hint` go into the message).
    pub fn check_offline_memory(&self, batch: usize, samples: usize, hint: &str) -> Result<()> {
        crate::runtime::memory::check_memory(self.offline_memory(batch, samples), "this call", hint)
    }

    /// Latents before quantization: (B, C, S) -> (B, dimension, frames).
    pub fn encode_latents(&self, pcm: &Tensor, cancel: Cancel) -> Result<Tensor> {
        offline_call(&self.parts.device, || {
            offline::encode(&*self.engine, &self.parts, pcm, cancel)
        })
    }

    /// (B, C, S) -> codes (B, n_q, ceil(S / frame_size)) u32. The last partial frame is
    /// padded, as in candle and transformers.
    pub fn encode(&self, pcm: &Tensor, cancel: Cancel) -> Result<Tensor> {
        let latents = self.encode_latents(pcm, cancel)?;
        self.quantizer.encode(&cast(&latents, DType::F32)?)
    }

    /// The quantizer's reconstruction of codes: (B, n_q, T) -> (B, dimension, T).
    pub fn decode_latents(&self, codes: &Tensor) -> Result<Tensor> {
        self.quantizer.decode(codes)
    }

    /// codes (B, n_q, T) u32 -> audio (B, C, T * frame_size).
    pub fn decode(&self, codes: &Tensor, cancel: Cancel) -> Result<Tensor> {
        offline_call(&self.parts.device, || {
            let x = cast(&self.decode_latents(codes)?, self.parts.dtype)?;
            offline::decode(&*self.engine, &self.parts, &x, cancel)
        })
    }

    /// A fresh encoder stream.
    pub fn encode_stream(&self) -> EncodeStream {
        Stream::new(self.engine.clone().encode_convs())
    }

    /// A fresh decoder stream.
    pub fn decode_stream(&self) -> DecodeStream {
        Stream::new(self.engine.clone().decode_convs())
    }
}
