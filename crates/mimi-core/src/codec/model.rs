//! The codec itself: its weights and modules ([`Codec`]), how they are built from a tensor
//! source (the doors of [`super::open`] call [`Codec::build`]), and what a codec is
//! ([`CodecInfo`]: precision, engine, device, dtype, weight bytes, checkpoint layout, and
//! whether another codec's streams can continue in it).

use super::candle_engine::Candle;
use super::checkpoint::CheckpointLayout;
use super::engine::{Engine, EngineKind, Parts};
use super::native::cut::Offline;
use super::native::Native;
use crate::config::CodecConfig;
use crate::error::{Error, Result};
use crate::quantizer::Quantizer;
use crate::runtime::device;
use crate::runtime::precision::{MediumLayers, Precision};
use crate::transformer::Transformer;
use crate::weights::{self, QkLayout, TensorSource};
use ::candle::{DType, Device, Tensor};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The codec's weights and modules; immutable once built, shared between threads.
pub struct Codec {
    pub(super) parts: Parts,
    pub(super) engine: Arc<dyn Engine>,
    pub(super) quantizer: Quantizer,
    pub(super) precision: Precision,
    pub(super) layout: Option<CheckpointLayout>,
    /// Its identity in the input shapes it checks ([`crate::host::CheckedShape`]).
    pub(super) id: u64,
    /// [`CodecInfo::weights_nbytes`], summed once at build.
    weights_nbytes: usize,
}

impl Codec {
    /// Builds the codec on `engine`, reading every weight from `source` (already in candle's
    /// names, q/k interleaved: the doors of `open.rs` convert a checkpoint first). Refuses
    /// configs whose weights cannot fit in memory before reading anything.
    pub(super) fn build(
        cfg: &CodecConfig,
        source: TensorSource,
        (device, dtype, precision): (&Device, DType, Precision),
        engine: EngineKind,
    ) -> Result<Self> {
        cfg.transformer.check_supported()?;
        Self::check_weights_memory(cfg)?;
        let source = Arc::new(source);
        let vb = source.var_builder(dtype, device);
        // The layer groups "medium" pairs, read from the settings once for both loads below;
        // None at the other precisions (nothing is paired).
        let medium = (precision == Precision::Medium).then(MediumLayers::from_settings);
        let engine: Arc<dyn Engine> = match engine {
            EngineKind::Native => Arc::new(Native::load(cfg, &vb, precision, medium)?),
            EngineKind::Candle => Arc::new(Candle::load(cfg, &vb)?),
        };
        // The quantizer always computes in f32, whatever the codec's dtype: a code is an
        // argmin over distances to nearby centroids, so it is kept at full precision, and the
        // latents are cast to f32 on the way in (and back to `dtype` on the way out).
        let quantizer =
            Quantizer::load(cfg, &source.var_builder(DType::F32, device).pp("quantizer"))?;
        let [enc_tr, dec_tr] =
            Self::load_transformers(cfg, &source, (device, dtype, precision), medium)?;
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
        let weights_nbytes = parts.enc_tr.weights_nbytes()
            + parts.dec_tr.weights_nbytes()
            + engine.weights_nbytes()
            + quantizer.weights_nbytes();
        Ok(Self {
            parts,
            engine,
            quantizer,
            precision,
            layout: None,
            id: crate::host::owner_id(),
            weights_nbytes,
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

    /// The encoder's and decoder's transformers: reads both one's weights, then finishes
    /// reading `source` (every problem reported together, unread tensors named), and builds
    /// them. A seeded source gives each its own seed (`seed + 1`, `seed + 2`) over unprefixed
    /// names. Their matrices are stored in bf16 pairs only where `medium` (the groups
    /// `"medium"` pairs; None at the other precisions) names the transformers.
    fn load_transformers(
        cfg: &CodecConfig,
        source: &TensorSource,
        (device, dtype, precision): (&Device, DType, Precision),
        medium: Option<MediumLayers>,
    ) -> Result<[Transformer; 2]> {
        let pairs = medium.is_some_and(|layers| layers.transformers);
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
        let [enc_w, dec_w] = Self::transformer_weights(cfg, source, &spec)?;
        Self::report_unread(cfg, source);
        source.finish()?;
        let mut enc_tr = Transformer::new(&cfg.transformer, enc_w, device, dtype)?;
        let mut dec_tr = Transformer::new(&cfg.transformer, dec_w, device, dtype)?;
        if pairs {
            enc_tr.pair_pack();
            dec_tr.pair_pack();
        }
        Ok([enc_tr, dec_tr])
    }

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

    /// What this codec is: how it computes, where, and from which checkpoint layout.
    pub fn info(&self) -> CodecInfo<'_> {
        CodecInfo {
            config: &self.parts.cfg,
            precision: self.precision,
            engine: self.engine.kind(),
            device: &self.parts.device,
            dtype: self.parts.dtype,
            weights_nbytes: self.weights_nbytes,
            checkpoint_layout: self.layout,
        }
    }

    pub(crate) fn device(&self) -> &Device {
        &self.parts.device
    }

    pub(crate) fn dtype(&self) -> DType {
        self.parts.dtype
    }
}

/// What a codec is ([`Codec::info`]).
#[derive(Clone, Debug)]
pub struct CodecInfo<'a> {
    pub config: &'a CodecConfig,
    /// How its products compute and its weight matrices are stored.
    pub precision: Precision,
    /// The engine computing the convolutional parts.
    pub engine: EngineKind,
    pub device: &'a Device,
    pub dtype: DType,
    /// Bytes of the weights one frame (an encode and a decode step) reads, as stored: both
    /// transformers, the convolutions and the quantizer. Divided by the memory bandwidth, it
    /// is the floor of a one-stream frame's time.
    pub weights_nbytes: usize,
    /// The layout of the checkpoint the codec was opened from (`None` unless it came
    /// through [`Codec::open`]).
    pub checkpoint_layout: Option<CheckpointLayout>,
}

impl CodecInfo<'_> {
    /// Refuses to continue the streams of a codec described by `src` in this one: another
    /// config, checkpoint layout, device or dtype (the weights may differ: a state copy is
    /// about shapes).
    pub fn check_state_source(&self, src: &CodecInfo) -> Result<()> {
        if self.config != src.config {
            return Err(Error::IncompatibleState(
                "cannot copy the streaming state between codecs of different configs; build \
                 both from the same config"
                    .into(),
            ));
        }
        let describe = |c: &CodecInfo| {
            format!(
                "layout={}, device={}, dtype={}",
                c.checkpoint_layout.map_or("seeded", |l| l.name()),
                device::device_name(c.device),
                device::dtype_name(c.dtype),
            )
        };
        if describe(self) != describe(src) {
            return Err(Error::IncompatibleState(format!(
                "cannot copy the streaming state: the source has {} and this codec has {}",
                describe(src),
                describe(self)
            )));
        }
        Ok(())
    }
}
