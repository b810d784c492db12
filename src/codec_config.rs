//! `CodecConfig`: the Python face of candle's `mimi::Config` (the whole codec).
//!
//! The field names are candle's: `channels, sample_rate, frame_rate, renormalize,
//! resample_method, seanet={...}, transformer={...}, quantizer_n_q, quantizer_bins,
//! quantizer_dim`. `seanet` is a dict with the fields of candle's `seanet::Config`, and
//! `transformer` is a `TransformerConfig` (or a dict of its fields).

use crate::config::TransformerConfig;
use crate::errors::{Error, Result};
use candle_transformers::models::mimi::conv::{Norm, PadMode};
use candle_transformers::models::mimi::{encodec, seanet};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

/// SEANet encoder/decoder settings (candle's `seanet::Config`).
#[derive(Clone, Debug, PartialEq)]
pub struct SeanetConfig {
    pub dimension: usize,
    pub channels: usize,
    pub causal: bool,
    pub n_filters: usize,
    pub n_residual_layers: usize,
    pub activation_elu_alpha: f64,
    pub compress: usize,
    pub dilation_base: usize,
    pub disable_norm_outer_blocks: usize,
    pub kernel_size: usize,
    pub residual_kernel_size: usize,
    pub last_kernel_size: usize,
    pub lstm: usize,
    pub norm: String,
    pub pad_mode: String,
    pub ratios: Vec<usize>,
    pub true_skip: bool,
}

impl SeanetConfig {
    fn mimi() -> Self {
        Self {
            dimension: 512,
            channels: 1,
            causal: true,
            n_filters: 64,
            n_residual_layers: 1,
            activation_elu_alpha: 1.0,
            compress: 2,
            dilation_base: 2,
            disable_norm_outer_blocks: 0,
            kernel_size: 7,
            residual_kernel_size: 3,
            last_kernel_size: 3,
            lstm: 0,
            norm: "weight_norm".into(),
            pad_mode: "constant".into(),
            ratios: vec![8, 6, 5, 4],
            true_skip: true,
        }
    }

    pub fn hop_length(&self) -> usize {
        self.ratios.iter().product()
    }
}

/// Configuration of the Mimi codec.
///
/// `CodecConfig()` / `CodecConfig.mimi(num_codebooks=8)` is the real model (24 kHz, 12.5 Hz
/// frames, 2048-entry codebooks of dimension 256). Invalid values raise `ConfigError` naming
/// the field (nested ones as `seanet.ratios`, `transformer.d_model`, ...).
#[pyclass(module = "mimi_py._core", frozen, eq, from_py_object)]
#[derive(Clone, Debug, PartialEq)]
pub struct CodecConfig {
    #[pyo3(get)]
    pub channels: usize,
    #[pyo3(get)]
    pub sample_rate: f64,
    #[pyo3(get)]
    pub frame_rate: f64,
    #[pyo3(get)]
    pub renormalize: bool,
    #[pyo3(get)]
    pub resample_method: String,
    pub seanet: SeanetConfig,
    #[pyo3(get)]
    pub transformer: TransformerConfig,
    #[pyo3(get)]
    pub quantizer_n_q: usize,
    #[pyo3(get)]
    pub quantizer_bins: usize,
    #[pyo3(get)]
    pub quantizer_dim: usize,
}

fn usize_of(field: &str, v: &Bound<'_, PyAny>) -> Result<usize> {
    crate::config::get_usize(field, v)
}

fn bool_of(field: &str, v: &Bound<'_, PyAny>) -> Result<bool> {
    v.cast::<PyBool>()
        .map(|b| b.is_true())
        .map_err(|_| Error::config(field, format!("expected True or False, got {v}")))
}

fn float_of(field: &str, v: &Bound<'_, PyAny>) -> Result<f64> {
    if v.is_instance_of::<PyBool>()
        || !(v.is_instance_of::<PyFloat>() || v.is_instance_of::<PyInt>())
    {
        return Err(Error::config(field, format!("expected a number, got {v}")));
    }
    let f: f64 = v
        .extract()
        .map_err(|_| Error::config(field, format!("expected a number, got {v}")))?;
    if !f.is_finite() || f <= 0.0 {
        return Err(Error::config(
            field,
            format!("expected a positive finite number, got {f}"),
        ));
    }
    Ok(f)
}

fn str_of(field: &str, v: &Bound<'_, PyAny>, allowed: &[&str]) -> Result<String> {
    let s = v
        .cast::<PyString>()
        .map_err(|_| Error::config(field, format!("expected one of {allowed:?}, got {v}")))?
        .to_string();
    if allowed.contains(&s.as_str()) {
        Ok(s)
    } else {
        Err(Error::config(
            field,
            format!("expected one of {allowed:?}, got {s:?}"),
        ))
    }
}

const SEANET_FIELDS: &[&str] = &[
    "dimension",
    "channels",
    "causal",
    "n_filters",
    "n_residual_layers",
    "activation",
    "compress",
    "dilation_base",
    "disable_norm_outer_blocks",
    "final_activation",
    "kernel_size",
    "residual_kernel_size",
    "last_kernel_size",
    "lstm",
    "norm",
    "pad_mode",
    "ratios",
    "true_skip",
];

const CODEC_FIELDS: &[&str] = &[
    "channels",
    "sample_rate",
    "frame_rate",
    "renormalize",
    "resample_method",
    "seanet",
    "transformer",
    "quantizer_n_q",
    "quantizer_bins",
    "quantizer_dim",
];

impl SeanetConfig {
    fn set(&mut self, key: &str, v: &Bound<'_, PyAny>) -> Result<()> {
        let f = format!("seanet.{key}");
        let f = f.as_str();
        match key {
            "dimension" => self.dimension = usize_of(f, v)?,
            "channels" => self.channels = usize_of(f, v)?,
            "causal" => {
                self.causal = bool_of(f, v)?;
                if !self.causal {
                    return Err(Error::config(f, "a non-causal SEANet cannot stream (its streaming and offline results would differ); set causal=True"));
                }
            }
            "n_filters" => self.n_filters = usize_of(f, v)?,
            "n_residual_layers" => self.n_residual_layers = usize_of(f, v)?,
            "activation" => {
                // {"elu": alpha} (candle's serde form) or "elu"
                if let Ok(d) = v.cast::<PyDict>() {
                    let alpha = d
                        .get_item("elu")
                        .map_err(|e| Error::config(f, e.to_string()))?
                        .ok_or_else(|| {
                            Error::config(
                                f,
                                "only the ELU activation ({\"elu\": alpha}) is supported",
                            )
                        })?;
                    if d.len() != 1 {
                        return Err(Error::config(
                            f,
                            "only the ELU activation ({\"elu\": alpha}) is supported",
                        ));
                    }
                    self.activation_elu_alpha = float_of(f, &alpha)?;
                } else {
                    str_of(f, v, &["elu"])?;
                    self.activation_elu_alpha = 1.0;
                }
            }
            "compress" => self.compress = usize_of(f, v)?,
            "dilation_base" => self.dilation_base = usize_of(f, v)?,
            "disable_norm_outer_blocks" => self.disable_norm_outer_blocks = usize_of(f, v)?,
            "final_activation" => {
                if !v.is_none() {
                    return Err(Error::config(f, "only None is supported"));
                }
            }
            "kernel_size" => self.kernel_size = usize_of(f, v)?,
            "residual_kernel_size" => self.residual_kernel_size = usize_of(f, v)?,
            "last_kernel_size" => self.last_kernel_size = usize_of(f, v)?,
            "lstm" => {
                self.lstm = usize_of(f, v)?;
                if self.lstm != 0 {
                    return Err(Error::config(
                        f,
                        "LSTM layers are not supported (candle's SEANet has none); use 0",
                    ));
                }
            }
            "norm" => self.norm = str_of(f, v, &["weight_norm", "none"])?,
            // candle's streaming convolutions implement constant and replicate padding only.
            "pad_mode" => self.pad_mode = str_of(f, v, &["constant", "replicate"])?,
            "ratios" => {
                let items: Vec<Bound<'_, PyAny>> = if let Ok(l) = v.cast::<PyList>() {
                    l.iter().collect()
                } else if let Ok(t) = v.cast::<PyTuple>() {
                    t.iter().collect()
                } else {
                    return Err(Error::config(
                        f,
                        format!("expected a list of ints, got {v}"),
                    ));
                };
                self.ratios = items
                    .iter()
                    .map(|i| usize_of(f, i))
                    .collect::<Result<_>>()?;
            }
            "true_skip" => self.true_skip = bool_of(f, v)?,
            other => {
                return Err(Error::config(
                    &format!("seanet.{other}"),
                    format!(
                        "unknown field; the fields are: {}",
                        SEANET_FIELDS.join(", ")
                    ),
                ))
            }
        }
        Ok(())
    }

    fn validate(&self) -> Result<()> {
        crate::config::require_nonzero(&[
            ("seanet.dimension", self.dimension),
            ("seanet.channels", self.channels),
            ("seanet.n_filters", self.n_filters),
            ("seanet.kernel_size", self.kernel_size),
            ("seanet.residual_kernel_size", self.residual_kernel_size),
            ("seanet.last_kernel_size", self.last_kernel_size),
            ("seanet.dilation_base", self.dilation_base),
            ("seanet.compress", self.compress),
        ])?;
        if self.ratios.is_empty() || self.ratios.contains(&0) {
            return Err(Error::config(
                "seanet.ratios",
                format!("expected positive ints, got {:?}", self.ratios),
            ));
        }
        Ok(())
    }

    fn dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("dimension", self.dimension)?;
        d.set_item("channels", self.channels)?;
        d.set_item("causal", self.causal)?;
        d.set_item("n_filters", self.n_filters)?;
        d.set_item("n_residual_layers", self.n_residual_layers)?;
        let act = PyDict::new(py);
        act.set_item("elu", self.activation_elu_alpha)?;
        d.set_item("activation", act)?;
        d.set_item("compress", self.compress)?;
        d.set_item("dilation_base", self.dilation_base)?;
        d.set_item("disable_norm_outer_blocks", self.disable_norm_outer_blocks)?;
        d.set_item("final_activation", py.None())?;
        d.set_item("kernel_size", self.kernel_size)?;
        d.set_item("residual_kernel_size", self.residual_kernel_size)?;
        d.set_item("last_kernel_size", self.last_kernel_size)?;
        d.set_item("lstm", self.lstm)?;
        d.set_item("norm", &self.norm)?;
        d.set_item("pad_mode", &self.pad_mode)?;
        d.set_item("ratios", self.ratios.clone())?;
        d.set_item("true_skip", self.true_skip)?;
        Ok(d)
    }

    pub fn to_candle(&self) -> seanet::Config {
        seanet::Config {
            dimension: self.dimension,
            channels: self.channels,
            causal: self.causal,
            n_filters: self.n_filters,
            n_residual_layers: self.n_residual_layers,
            ratios: self.ratios.clone(),
            activation: candle_nn::Activation::Elu(self.activation_elu_alpha),
            norm: Norm::WeightNorm,
            kernel_size: self.kernel_size,
            residual_kernel_size: self.residual_kernel_size,
            last_kernel_size: self.last_kernel_size,
            dilation_base: self.dilation_base,
            pad_mode: match self.pad_mode.as_str() {
                "reflect" => PadMode::Reflect,
                "replicate" => PadMode::Replicate,
                _ => PadMode::Constant,
            },
            true_skip: self.true_skip,
            compress: self.compress,
            lstm: self.lstm,
            disable_norm_outer_blocks: self.disable_norm_outer_blocks,
            final_activation: None,
        }
    }
}

impl CodecConfig {
    /// The real Mimi codec with `n_q` codebooks.
    pub fn mimi_preset(n_q: usize) -> Self {
        let mut transformer = TransformerConfig::mimi_preset();
        transformer.conv_layout = true;
        Self {
            channels: 1,
            sample_rate: 24000.0,
            frame_rate: 12.5,
            renormalize: true,
            resample_method: "conv".into(),
            seanet: SeanetConfig::mimi(),
            transformer,
            quantizer_n_q: n_q,
            quantizer_bins: 2048,
            quantizer_dim: 256,
        }
    }

    pub fn from_kwargs(kwargs: Option<&Bound<'_, PyDict>>) -> Result<Self> {
        let mut c = Self::mimi_preset(8);
        if let Some(kw) = kwargs {
            for (k, v) in kw.iter() {
                let key: String = k
                    .extract()
                    .map_err(|_| Error::config("?", "keyword names must be strings"))?;
                match key.as_str() {
                    "channels" => c.channels = usize_of(&key, &v)?,
                    "sample_rate" => c.sample_rate = float_of(&key, &v)?,
                    "frame_rate" => c.frame_rate = float_of(&key, &v)?,
                    "renormalize" => c.renormalize = bool_of(&key, &v)?,
                    "resample_method" => c.resample_method = str_of(&key, &v, &["conv"])?,
                    "seanet" => {
                        let d = v
                            .cast::<PyDict>()
                            .map_err(|_| Error::config("seanet", "expected a dict"))?;
                        let mut s = SeanetConfig::mimi();
                        for (sk, sv) in d.iter() {
                            let sk: String = sk
                                .extract()
                                .map_err(|_| Error::config("seanet", "keys must be strings"))?;
                            s.set(&sk, &sv)?;
                        }
                        c.seanet = s;
                    }
                    "transformer" => {
                        c.transformer = if let Ok(t) = v.cast::<TransformerConfig>() {
                            t.get().clone()
                        } else if let Ok(d) = v.cast::<PyDict>() {
                            TransformerConfig::from_kwargs(Some(d)).map_err(|e| match e {
                                Error::Config { field, msg } => Error::Config {
                                    field: format!("transformer.{field}"),
                                    msg,
                                },
                                e => e,
                            })?
                        } else {
                            return Err(Error::config(
                                "transformer",
                                "expected a TransformerConfig or a dict",
                            ));
                        }
                    }
                    "quantizer_n_q" => c.quantizer_n_q = usize_of(&key, &v)?,
                    "quantizer_bins" => c.quantizer_bins = usize_of(&key, &v)?,
                    "quantizer_dim" => c.quantizer_dim = usize_of(&key, &v)?,
                    other => {
                        return Err(Error::config(
                            other,
                            format!("unknown field; the fields are: {}", CODEC_FIELDS.join(", ")),
                        ))
                    }
                }
            }
        }
        c.validate()?;
        Ok(c)
    }

    pub fn validate(&self) -> Result<()> {
        self.seanet.validate()?;
        crate::config::require_nonzero(&[
            ("channels", self.channels),
            ("quantizer_n_q", self.quantizer_n_q),
            ("quantizer_bins", self.quantizer_bins),
            ("quantizer_dim", self.quantizer_dim),
        ])?;
        if self.channels != self.seanet.channels {
            return Err(Error::config(
                "channels",
                format!(
                    "channels={} must equal seanet.channels={}",
                    self.channels, self.seanet.channels
                ),
            ));
        }
        if self.transformer.d_model != self.seanet.dimension {
            return Err(Error::config(
                "transformer.d_model",
                format!(
                    "must equal seanet.dimension={} (got {})",
                    self.seanet.dimension, self.transformer.d_model
                ),
            ));
        }
        if self.quantizer_bins > u32::MAX as usize {
            return Err(Error::config("quantizer_bins", "must fit in uint32"));
        }
        let stride = self.downsample_stride_f();
        if (stride - stride.round()).abs() > 1e-9 || stride.round() < 1.0 {
            return Err(Error::config(
                "frame_rate",
                format!(
                    "sample_rate / prod(seanet.ratios) / frame_rate = {} / {} / {} must be a positive integer",
                    self.sample_rate,
                    self.seanet.hop_length(),
                    self.frame_rate
                ),
            ));
        }
        Ok(())
    }

    fn downsample_stride_f(&self) -> f64 {
        self.sample_rate / self.seanet.hop_length() as f64 / self.frame_rate
    }

    pub fn downsample_stride(&self) -> usize {
        self.downsample_stride_f().round() as usize
    }

    /// Samples per code frame (1920 for the real model).
    pub fn frame_size(&self) -> usize {
        self.seanet.hop_length() * self.downsample_stride()
    }

    pub fn to_candle(&self) -> encodec::Config {
        encodec::Config {
            channels: self.channels,
            sample_rate: self.sample_rate,
            frame_rate: self.frame_rate,
            renormalize: self.renormalize,
            resample_method: encodec::ResampleMethod::Conv,
            seanet: self.seanet.to_candle(),
            transformer: self.transformer.to_candle(),
            quantizer_n_q: self.quantizer_n_q,
            quantizer_bins: self.quantizer_bins,
            quantizer_dim: self.quantizer_dim,
        }
    }

    fn dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("channels", self.channels)?;
        d.set_item("sample_rate", self.sample_rate)?;
        d.set_item("frame_rate", self.frame_rate)?;
        d.set_item("renormalize", self.renormalize)?;
        d.set_item("resample_method", &self.resample_method)?;
        d.set_item("seanet", self.seanet.dict(py)?)?;
        d.set_item("transformer", self.transformer.dict(py)?)?;
        d.set_item("quantizer_n_q", self.quantizer_n_q)?;
        d.set_item("quantizer_bins", self.quantizer_bins)?;
        d.set_item("quantizer_dim", self.quantizer_dim)?;
        Ok(d)
    }

    /// A config from a Hugging Face `MimiConfig` (`config.json` of kyutai/mimi).
    pub fn from_hf(d: &Bound<'_, PyDict>, n_q: Option<usize>) -> Result<Self> {
        let get = |k: &str| -> Option<Bound<'_, PyAny>> {
            d.get_item(k).ok().flatten().filter(|v| !v.is_none())
        };
        let mut c = Self::mimi_preset(8);
        let u = |k: &str, dst: &mut usize| -> Result<()> {
            if let Some(v) = get(k) {
                *dst = usize_of(&format!("config.json:{k}"), &v)?;
            }
            Ok(())
        };
        u("audio_channels", &mut c.channels)?;
        c.seanet.channels = c.channels;
        if let Some(v) = get("sampling_rate") {
            c.sample_rate = float_of("config.json:sampling_rate", &v)?;
        }
        u("hidden_size", &mut c.seanet.dimension)?;
        c.transformer.d_model = c.seanet.dimension;
        u("num_filters", &mut c.seanet.n_filters)?;
        u("num_residual_layers", &mut c.seanet.n_residual_layers)?;
        u("kernel_size", &mut c.seanet.kernel_size)?;
        u("residual_kernel_size", &mut c.seanet.residual_kernel_size)?;
        u("last_kernel_size", &mut c.seanet.last_kernel_size)?;
        u("dilation_growth_rate", &mut c.seanet.dilation_base)?;
        u("compress", &mut c.seanet.compress)?;
        if let Some(v) = get("pad_mode") {
            c.seanet.pad_mode = str_of(
                "config.json:pad_mode",
                &v,
                &["constant", "reflect", "replicate"],
            )?;
        }
        if let Some(v) = get("use_causal_conv") {
            if !bool_of("config.json:use_causal_conv", &v)? {
                return Err(Error::config(
                    "config.json:use_causal_conv",
                    "a non-causal SEANet is not supported",
                ));
            }
        }
        if let Some(v) = get("upsampling_ratios") {
            let l: Vec<usize> = v.extract().map_err(|_| {
                Error::config("config.json:upsampling_ratios", "expected a list of ints")
            })?;
            c.seanet.ratios = l;
        }
        u("num_attention_heads", &mut c.transformer.num_heads)?;
        u("num_hidden_layers", &mut c.transformer.num_layers)?;
        u("intermediate_size", &mut c.transformer.dim_feedforward)?;
        u("sliding_window", &mut c.transformer.context)?;
        u("max_position_embeddings", &mut c.transformer.max_seq_len)?;
        if let Some(v) = get("layer_scale_initial_scale") {
            c.transformer.layer_scale =
                Some(float_of("config.json:layer_scale_initial_scale", &v)?);
        }
        let theta = get("rope_parameters")
            .and_then(|p| p.get_item("rope_theta").ok())
            .or_else(|| get("rope_theta"));
        if let Some(t) = theta {
            c.transformer.max_period = float_of("config.json:rope_theta", &t)? as usize;
        }
        u("codebook_size", &mut c.quantizer_bins)?;
        u("vector_quantization_hidden_dimension", &mut c.quantizer_dim)?;
        u("num_quantizers", &mut c.quantizer_n_q)?;
        if let Some(v) = get("frame_rate").or_else(|| get("_frame_rate")) {
            c.frame_rate = float_of("config.json:frame_rate", &v)?;
        }
        if let Some(n) = n_q {
            c.quantizer_n_q = n;
        }
        c.transformer.validate()?;
        c.validate()?;
        Ok(c)
    }
}

#[pymethods]
impl CodecConfig {
    #[new]
    #[pyo3(signature = (**kwargs))]
    fn py_new(kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        Ok(Self::from_kwargs(kwargs)?)
    }

    /// The real Mimi codec (kyutai/mimi) using `num_codebooks` of its 32 codebooks.
    #[staticmethod]
    #[pyo3(signature = (num_codebooks=None))]
    fn mimi(num_codebooks: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let num_codebooks = match num_codebooks {
            None => 8,
            Some(v) => usize_of("num_codebooks", v)?,
        };
        if num_codebooks == 0 || num_codebooks > 32 {
            return Err(Error::config(
                "num_codebooks",
                format!("the real Mimi model has 1 to 32 codebooks, got {num_codebooks}"),
            )
            .into());
        }
        Ok(Self::mimi_preset(num_codebooks))
    }

    /// A config from a Hugging Face `MimiConfig` dict (the `config.json` of kyutai/mimi).
    #[staticmethod]
    #[pyo3(name = "from_hf", signature = (config, num_codebooks=None))]
    fn py_from_hf(
        config: &Bound<'_, PyDict>,
        num_codebooks: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let n = num_codebooks
            .map(|v| usize_of("num_codebooks", v))
            .transpose()?;
        if n == Some(0) {
            return Err(Error::config("num_codebooks", "must be at least 1").into());
        }
        Ok(Self::from_hf(config, n)?)
    }

    /// The SEANet settings as a dict.
    #[getter]
    fn seanet<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.seanet.dict(py)
    }

    /// Samples per code frame (`sample_rate / frame_rate`, 1920 for the real model).
    #[getter(frame_size)]
    fn py_frame_size(&self) -> usize {
        self.frame_size()
    }

    /// The fields as a plain dict; `CodecConfig(**cfg.to_dict()) == cfg`.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.dict(py)
    }

    /// A copy with some fields changed (validated like the constructor).
    #[pyo3(signature = (**changes))]
    fn replace(&self, py: Python<'_>, changes: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let d = self.dict(py)?;
        if let Some(ch) = changes {
            d.update(ch.as_mapping())?;
        }
        Ok(Self::from_kwargs(Some(&d))?)
    }

    fn __repr__(&self) -> String {
        format!(
            "CodecConfig(sample_rate={}, frame_rate={}, channels={}, quantizer_n_q={}, quantizer_bins={}, quantizer_dim={}, seanet.dimension={}, transformer.num_layers={})",
            self.sample_rate, self.frame_rate, self.channels, self.quantizer_n_q, self.quantizer_bins, self.quantizer_dim, self.seanet.dimension, self.transformer.num_layers
        )
    }

    fn __getnewargs_ex__<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(Bound<'py, PyTuple>, Bound<'py, PyDict>)> {
        Ok((PyTuple::empty(py), self.dict(py)?))
    }
}
