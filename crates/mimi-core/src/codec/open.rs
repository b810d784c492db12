//! The codec's doors, the only ways to build one: [`Codec::open`] takes a checkpoint file or
//! directory, detects its layout (Hugging Face kyutai/mimi or Kyutai's moshi file), reads the
//! directory's `config.json`, converts names and q/k rows, and applies [`OpenOptions`];
//! [`Codec::open_arrays`] does the same for tensors handed over as host arrays;
//! [`Codec::seeded`] builds seeded weights (tests, benchmarks). A checkpoint is never read
//! as it is: kyutai/mimi's `model.safetensors` has candle's names but half-split q/k, which
//! would compute the wrong attention without any error.

use super::checkpoint::{Checkpoint, CheckpointDir};
use super::engine::EngineKind;
use super::model::Codec;
use crate::config::CodecConfig;
use crate::error::Result;
use crate::host::HostArray;
use crate::runtime::precision::Precision;
use crate::weights::{self, TensorSource};
use ::candle::{DType, Device};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// How [`Codec::open`] builds a codec. `OpenOptions::default()` is the CPU in f32 with f32
/// weights, the checkpoint's own config and number of codebooks, and the default engine.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// Where the codec computes.
    pub device: Device,
    /// What it computes in.
    pub dtype: DType,
    /// How its products compute and weights are stored (below `"highest"`: the native
    /// engine only).
    pub precision: Precision,
    /// How many of the checkpoint's codebooks to use (`None`: the config's).
    pub num_codebooks: Option<usize>,
    /// The engine for the convolutions (`None`: native on the CPU in f32, candle otherwise).
    pub engine: Option<EngineKind>,
    /// The config, when the checkpoint has no `config.json` beside it or it should be
    /// overridden (`None`: the directory's `config.json`, else the real Mimi's).
    pub config: Option<CodecConfig>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self {
            device: Device::Cpu,
            dtype: DType::F32,
            precision: Precision::Highest,
            num_codebooks: None,
            engine: None,
            config: None,
        }
    }
}

/// A checkpoint on disk, resolved: the weights file and the config it is opened with.
pub struct Resolved {
    /// The safetensors file.
    pub weights: PathBuf,
    /// `options.config`, else the directory's `config.json`, else the real Mimi's; with
    /// `options.num_codebooks` applied.
    pub config: CodecConfig,
}

/// Finds the weights and the config of `path` (a file, or a directory holding
/// `model.safetensors` and optionally `config.json`).
pub fn resolve(path: &Path, options: &OpenOptions) -> Result<Resolved> {
    let (weights, found) = if path.is_dir() {
        let dir = CheckpointDir::open(path, options.num_codebooks)?;
        (dir.weights, dir.config)
    } else {
        // A missing file is reported by the reader, with the OS's error.
        (path.to_path_buf(), None)
    };
    let config = options.config_or(found);
    Ok(Resolved { weights, config })
}

impl OpenOptions {
    /// `self.config`, else `found`, else the real Mimi's; with `num_codebooks` applied.
    fn config_or(&self, found: Option<CodecConfig>) -> CodecConfig {
        let mut config = self.config.clone().or(found).unwrap_or_default();
        if let Some(n) = self.num_codebooks {
            config.quantizer_n_q = n;
        }
        config
    }

    fn engine_kind(&self) -> EngineKind {
        (self.engine).unwrap_or_else(|| EngineKind::default_for(&self.device, self.dtype))
    }
}

impl Codec {
    /// Opens a checkpoint file or directory (see the module doc): the real kyutai/mimi
    /// folder or `model.safetensors`, or Kyutai's moshi tokenizer file.
    pub fn open(path: impl AsRef<Path>, options: &OpenOptions) -> Result<Self> {
        let resolved = resolve(path.as_ref(), options)?;
        let cfg = &resolved.config;
        options
            .precision
            .check_engine(&options.device, options.dtype)?;
        let checkpoint = Checkpoint::read(&resolved.weights, cfg)?;
        Self::open_checkpoint(checkpoint, cfg, options)
    }

    /// [`Codec::open`] for a checkpoint's tensors handed over as host arrays (f32, C order),
    /// in either layout, under the checkpoint's own names. The config is `options.config`,
    /// else the real Mimi's.
    pub fn open_arrays(
        arrays: HashMap<String, HostArray<f32>>,
        options: &OpenOptions,
    ) -> Result<Self> {
        let cfg = &options.config_or(None);
        options
            .precision
            .check_engine(&options.device, options.dtype)?;
        let tensors = weights::host_tensors(arrays)?;
        let checkpoint = Checkpoint::from_tensors(tensors, "weights mapping".into(), cfg)?;
        Self::open_checkpoint(checkpoint, cfg, options)
    }

    /// A codec of seeded weights (tests, benchmarks): `options.config`, else the real
    /// Mimi's shape.
    pub fn seeded(seed: u64, options: &OpenOptions) -> Result<Self> {
        let cfg = &options.config_or(None);
        options
            .precision
            .check_engine(&options.device, options.dtype)?;
        let source = TensorSource::seeded(seed, cfg.transformer.layer_scale);
        let spec = (&options.device, options.dtype, options.precision);
        Self::build(cfg, source, spec, options.engine_kind())
    }

    fn open_checkpoint(
        checkpoint: Checkpoint,
        cfg: &CodecConfig,
        options: &OpenOptions,
    ) -> Result<Self> {
        let spec = (&options.device, options.dtype, options.precision);
        let mut codec = Self::build(cfg, checkpoint.source, spec, options.engine_kind())?;
        codec.layout = Some(checkpoint.layout);
        Ok(codec)
    }
}

#[cfg(test)]
impl Codec {
    /// Test hook: [`Codec::seeded`] of `cfg` on the CPU in `dtype` on `engine`.
    pub(crate) fn seeded_on(
        cfg: &CodecConfig,
        seed: u64,
        dtype: DType,
        engine: EngineKind,
    ) -> Self {
        let options = OpenOptions {
            config: Some(cfg.clone()),
            dtype,
            engine: Some(engine),
            ..Default::default()
        };
        Self::seeded(seed, &options).expect("a seeded codec")
    }
}
