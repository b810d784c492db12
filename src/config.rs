//! `TransformerConfig`: the Python face of candle's `mimi::transformer::Config`.
//!
//! Keyword names are exactly candle's field names. Parsing and validation happen here, so an
//! invalid value is a `ConfigError` naming the field before anything is built.

use crate::errors::{Error, Result};
use candle_transformers::models::mimi::transformer::{Config, PositionalEmbedding};
use candle_transformers::models::mimi::NormType;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyString, PyTuple};

/// Activation names accepted for `gating`, and the candle activation each one means.
/// `"gelu"` is the exact (erf) GELU, as in candle's `Activation::Gelu`.
const GATINGS: &[(&str, candle_nn::Activation)] = &[
    ("silu", candle_nn::Activation::Silu),
    ("gelu", candle_nn::Activation::Gelu),
    ("gelu_pytorch_tanh", candle_nn::Activation::GeluPytorchTanh),
    ("relu", candle_nn::Activation::Relu),
    ("sigmoid", candle_nn::Activation::Sigmoid),
    ("swish", candle_nn::Activation::Swish),
];

/// The field names, in candle's order.
pub const FIELDS: &[&str] = &[
    "d_model",
    "num_heads",
    "num_layers",
    "causal",
    "norm_first",
    "bias_ff",
    "bias_attn",
    "layer_scale",
    "positional_embedding",
    "use_conv_block",
    "cross_attention",
    "conv_kernel_size",
    "use_conv_bias",
    "gating",
    "norm",
    "context",
    "max_period",
    "max_seq_len",
    "kv_repeat",
    "dim_feedforward",
    "conv_layout",
];

/// Configuration of a Mimi streaming transformer.
///
/// Keyword arguments are named exactly as the fields of candle's
/// `mimi::transformer::Config`. Every argument has the default of the real Mimi
/// encoder/decoder transformer, so `TransformerConfig()` equals `TransformerConfig.mimi()`.
/// Invalid values raise `ConfigError` naming the field.
#[pyclass(module = "mimi_py._core", frozen, eq, from_py_object)]
#[derive(Clone, Debug, PartialEq)]
pub struct TransformerConfig {
    #[pyo3(get)]
    pub d_model: usize,
    #[pyo3(get)]
    pub num_heads: usize,
    #[pyo3(get)]
    pub num_layers: usize,
    #[pyo3(get)]
    pub causal: bool,
    #[pyo3(get)]
    pub norm_first: bool,
    #[pyo3(get)]
    pub bias_ff: bool,
    #[pyo3(get)]
    pub bias_attn: bool,
    #[pyo3(get)]
    pub layer_scale: Option<f64>,
    #[pyo3(get)]
    pub positional_embedding: String,
    #[pyo3(get)]
    pub use_conv_block: bool,
    #[pyo3(get)]
    pub cross_attention: bool,
    #[pyo3(get)]
    pub conv_kernel_size: usize,
    #[pyo3(get)]
    pub use_conv_bias: bool,
    #[pyo3(get)]
    pub gating: Option<String>,
    #[pyo3(get)]
    pub norm: String,
    #[pyo3(get)]
    pub context: usize,
    #[pyo3(get)]
    pub max_period: usize,
    #[pyo3(get)]
    pub max_seq_len: usize,
    #[pyo3(get)]
    pub kv_repeat: usize,
    #[pyo3(get)]
    pub dim_feedforward: usize,
    #[pyo3(get)]
    pub conv_layout: bool,
}

impl Default for TransformerConfig {
    fn default() -> Self {
        Self::mimi_preset()
    }
}

/// A non-negative integer: Python ints and numpy integers (anything with `__index__`), but
/// not bools or floats.
pub fn get_usize(field: &str, v: &Bound<'_, PyAny>) -> Result<usize> {
    let is_int = !v.is_instance_of::<PyBool>()
        && !v.is_instance_of::<PyFloat>()
        && (v.is_instance_of::<PyInt>() || v.hasattr("__index__").unwrap_or(false))
        && !v.get_type().name().is_ok_and(|n| n.to_string() == "bool_");
    if !is_int {
        return Err(Error::config(
            field,
            format!("expected an int, got {}", describe(v)),
        ));
    }
    let i: i128 = v
        .call_method0("__index__")
        .and_then(|i| i.extract())
        .map_err(|_| Error::config(field, format!("expected an int, got {}", describe(v))))?;
    usize::try_from(i).map_err(|_| {
        Error::config(
            field,
            format!("expected a non-negative int that fits in 64 bits, got {i}"),
        )
    })
}

/// Refuses any of `fields` (name, value) that is zero, naming the first one.
pub fn require_nonzero(fields: &[(&str, usize)]) -> Result<()> {
    match fields.iter().find(|(_, v)| *v == 0) {
        Some((field, _)) => Err(Error::config(field, "must be at least 1, got 0")),
        None => Ok(()),
    }
}

/// A seed: an integer in [0, 2**64).
pub fn get_seed(v: &Bound<'_, PyAny>) -> Result<u64> {
    get_usize("seed", v).map(|s| s as u64)
}

fn get_bool(field: &str, v: &Bound<'_, PyAny>) -> Result<bool> {
    if let Ok(b) = v.cast::<PyBool>() {
        return Ok(b.is_true());
    }
    Err(Error::config(
        field,
        format!("expected True or False, got {}", describe(v)),
    ))
}

fn get_str(field: &str, v: &Bound<'_, PyAny>, allowed: &[&str]) -> Result<String> {
    let choices = allowed
        .iter()
        .map(|a| format!("{a:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    let s = v
        .cast::<PyString>()
        .map_err(|_| {
            Error::config(
                field,
                format!("expected one of {choices}, got {}", describe(v)),
            )
        })?
        .to_string();
    if allowed.contains(&s.as_str()) {
        Ok(s)
    } else {
        Err(Error::config(
            field,
            format!("expected one of {choices}, got {s:?}"),
        ))
    }
}

fn describe(v: &Bound<'_, PyAny>) -> String {
    let ty = v
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into());
    match v.repr() {
        Ok(r) => format!("{r} ({ty})"),
        Err(_) => ty,
    }
}

impl TransformerConfig {
    /// The real Mimi encoder/decoder transformer.
    pub fn mimi_preset() -> Self {
        Self {
            d_model: 512,
            num_heads: 8,
            num_layers: 8,
            causal: true,
            norm_first: true,
            bias_ff: false,
            bias_attn: false,
            layer_scale: Some(0.01),
            positional_embedding: "rope".into(),
            use_conv_block: false,
            cross_attention: false,
            conv_kernel_size: 5,
            use_conv_bias: true,
            gating: None,
            norm: "layer_norm".into(),
            context: 250,
            max_period: 10000,
            max_seq_len: 8192,
            kv_repeat: 1,
            dim_feedforward: 2048,
            conv_layout: false,
        }
    }

    /// Builds a config from keyword arguments over the Mimi defaults.
    pub fn from_kwargs(kwargs: Option<&Bound<'_, PyDict>>) -> Result<Self> {
        let mut c = Self::mimi_preset();
        if let Some(kw) = kwargs {
            for (k, v) in kw.iter() {
                let key: String = k
                    .extract()
                    .map_err(|_| Error::config("?", "keyword names must be strings"))?;
                c.set(&key, &v)?;
            }
        }
        c.validate()?;
        Ok(c)
    }

    fn set(&mut self, key: &str, v: &Bound<'_, PyAny>) -> Result<()> {
        match key {
            "d_model" => self.d_model = get_usize(key, v)?,
            "num_heads" => self.num_heads = get_usize(key, v)?,
            "num_layers" => self.num_layers = get_usize(key, v)?,
            "causal" => self.causal = get_bool(key, v)?,
            "norm_first" => self.norm_first = get_bool(key, v)?,
            "bias_ff" => self.bias_ff = get_bool(key, v)?,
            "bias_attn" => self.bias_attn = get_bool(key, v)?,
            "layer_scale" => {
                self.layer_scale = if v.is_none() {
                    None
                } else if v.is_instance_of::<PyBool>()
                    || !(v.is_instance_of::<PyFloat>() || v.is_instance_of::<PyInt>())
                {
                    return Err(Error::config(
                        key,
                        format!("expected a float or None, got {}", describe(v)),
                    ));
                } else {
                    let f: f64 = v.extract().map_err(|_| {
                        Error::config(
                            key,
                            format!("expected a float or None, got {}", describe(v)),
                        )
                    })?;
                    Some(f)
                }
            }
            "positional_embedding" => {
                self.positional_embedding = get_str(key, v, &["rope", "sin", "none"])?
            }
            "use_conv_block" => self.use_conv_block = get_bool(key, v)?,
            "cross_attention" => self.cross_attention = get_bool(key, v)?,
            "conv_kernel_size" => self.conv_kernel_size = get_usize(key, v)?,
            "use_conv_bias" => self.use_conv_bias = get_bool(key, v)?,
            "gating" => {
                self.gating = if v.is_none() {
                    None
                } else {
                    let names: Vec<&str> = GATINGS.iter().map(|(n, _)| *n).collect();
                    Some(get_str(key, v, &names)?)
                }
            }
            "norm" => self.norm = get_str(key, v, &["layer_norm", "rms_norm"])?,
            "context" => self.context = get_usize(key, v)?,
            "max_period" => self.max_period = get_usize(key, v)?,
            "max_seq_len" => self.max_seq_len = get_usize(key, v)?,
            "kv_repeat" => self.kv_repeat = get_usize(key, v)?,
            "dim_feedforward" => self.dim_feedforward = get_usize(key, v)?,
            "conv_layout" => self.conv_layout = get_bool(key, v)?,
            other => {
                return Err(Error::config(
                    other,
                    format!("unknown field; the fields are: {}", FIELDS.join(", ")),
                ))
            }
        }
        Ok(())
    }

    /// Checks the values that do not depend on what the config is used for.
    pub fn validate(&self) -> Result<()> {
        require_nonzero(&[
            ("d_model", self.d_model),
            ("num_heads", self.num_heads),
            ("num_layers", self.num_layers),
            ("context", self.context),
            ("max_period", self.max_period),
            ("max_seq_len", self.max_seq_len),
            ("kv_repeat", self.kv_repeat),
            ("dim_feedforward", self.dim_feedforward),
            ("conv_kernel_size", self.conv_kernel_size),
        ])?;
        if self.d_model % self.num_heads != 0 {
            return Err(Error::config(
                "d_model",
                format!(
                    "d_model={} must be divisible by num_heads={}",
                    self.d_model, self.num_heads
                ),
            ));
        }
        if self.num_heads % self.kv_repeat != 0 {
            return Err(Error::config(
                "kv_repeat",
                format!(
                    "num_heads={} must be divisible by kv_repeat={}",
                    self.num_heads, self.kv_repeat
                ),
            ));
        }
        let head_dim = self.d_model / self.num_heads;
        if self.positional_embedding == "rope" && head_dim % 2 != 0 {
            return Err(Error::config(
                "d_model",
                format!(
                    "rope needs an even head dimension, but d_model/num_heads = {}/{} = {head_dim}",
                    self.d_model, self.num_heads
                ),
            ));
        }
        if self.positional_embedding == "sin" && (self.d_model % 2 != 0 || self.d_model < 4) {
            return Err(Error::config(
                "d_model",
                format!(
                    "sinusoidal positions need an even d_model of at least 4, got {}",
                    self.d_model
                ),
            ));
        }
        if let Some(ls) = self.layer_scale {
            if !ls.is_finite() {
                return Err(Error::config(
                    "layer_scale",
                    format!("must be finite, got {ls}"),
                ));
            }
        }
        if self.gating.is_some() && self.gated_hidden() == 0 {
            return Err(Error::config(
                "dim_feedforward",
                format!(
                    "with gating, the hidden width 2*dim_feedforward/3 must be at least 1 \
                     (dim_feedforward={})",
                    self.dim_feedforward
                ),
            ));
        }
        Ok(())
    }

    /// Checks what mimi_py's streaming transformer can run (candle's Mimi transformer
    /// supports the same subset).
    pub fn check_supported(&self) -> Result<()> {
        if self.kv_repeat != 1 {
            return Err(Error::UnsupportedKvRepeat {
                kv_repeat: self.kv_repeat,
            });
        }
        let unsupported = [
            (
                "use_conv_block",
                self.use_conv_block,
                "use_conv_block=False",
            ),
            (
                "cross_attention",
                self.cross_attention,
                "cross_attention=False",
            ),
            ("norm_first", !self.norm_first, "norm_first=True"),
            ("causal", !self.causal, "causal=True"),
        ];
        for (field, bad, fix) in unsupported {
            if bad {
                return Err(Error::config(
                    field,
                    format!(
                        "this value is not supported by Mimi's streaming transformer \
                         (candle supports only the Mimi layout); set {fix}"
                    ),
                ));
            }
        }
        Ok(())
    }

    pub fn head_dim(&self) -> usize {
        self.d_model / self.num_heads
    }

    /// Hidden width of the gated MLP, as candle computes it.
    pub fn gated_hidden(&self) -> usize {
        if self.dim_feedforward == 4 * self.d_model {
            11 * self.d_model / 4
        } else {
            2 * self.dim_feedforward / 3
        }
    }

    pub fn activation(&self) -> Option<candle_nn::Activation> {
        let g = self.gating.as_deref()?;
        GATINGS.iter().find(|(n, _)| *n == g).map(|(_, a)| *a)
    }

    /// candle's config struct with the same values.
    pub fn to_candle(&self) -> Config {
        Config {
            d_model: self.d_model,
            num_heads: self.num_heads,
            num_layers: self.num_layers,
            causal: self.causal,
            norm_first: self.norm_first,
            bias_ff: self.bias_ff,
            bias_attn: self.bias_attn,
            layer_scale: self.layer_scale,
            positional_embedding: match self.positional_embedding.as_str() {
                "rope" => PositionalEmbedding::Rope,
                "sin" => PositionalEmbedding::Sin,
                _ => PositionalEmbedding::None,
            },
            use_conv_block: self.use_conv_block,
            cross_attention: self.cross_attention,
            conv_kernel_size: self.conv_kernel_size,
            use_conv_bias: self.use_conv_bias,
            gating: self.activation(),
            norm: if self.norm == "rms_norm" {
                NormType::RmsNorm
            } else {
                NormType::LayerNorm
            },
            context: self.context,
            max_period: self.max_period,
            max_seq_len: self.max_seq_len,
            kv_repeat: self.kv_repeat,
            dim_feedforward: self.dim_feedforward,
            conv_layout: self.conv_layout,
        }
    }

    pub(crate) fn dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("d_model", self.d_model)?;
        d.set_item("num_heads", self.num_heads)?;
        d.set_item("num_layers", self.num_layers)?;
        d.set_item("causal", self.causal)?;
        d.set_item("norm_first", self.norm_first)?;
        d.set_item("bias_ff", self.bias_ff)?;
        d.set_item("bias_attn", self.bias_attn)?;
        d.set_item("layer_scale", self.layer_scale)?;
        d.set_item("positional_embedding", &self.positional_embedding)?;
        d.set_item("use_conv_block", self.use_conv_block)?;
        d.set_item("cross_attention", self.cross_attention)?;
        d.set_item("conv_kernel_size", self.conv_kernel_size)?;
        d.set_item("use_conv_bias", self.use_conv_bias)?;
        d.set_item("gating", self.gating.as_deref())?;
        d.set_item("norm", &self.norm)?;
        d.set_item("context", self.context)?;
        d.set_item("max_period", self.max_period)?;
        d.set_item("max_seq_len", self.max_seq_len)?;
        d.set_item("kv_repeat", self.kv_repeat)?;
        d.set_item("dim_feedforward", self.dim_feedforward)?;
        d.set_item("conv_layout", self.conv_layout)?;
        Ok(d)
    }
}

#[pymethods]
impl TransformerConfig {
    #[new]
    #[pyo3(signature = (**kwargs))]
    fn py_new(kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        Ok(Self::from_kwargs(kwargs)?)
    }

    /// The real Mimi encoder/decoder transformer (d_model 512, 8 heads, 8 layers, context 250).
    #[staticmethod]
    fn mimi() -> Self {
        Self::mimi_preset()
    }

    /// The fields as a plain dict; `TransformerConfig(**cfg.to_dict()) == cfg`.
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

    /// Size of one attention head.
    #[getter(head_dim)]
    fn py_head_dim(&self) -> usize {
        self.head_dim()
    }

    fn __repr__(&self) -> String {
        let opt_f = |v: Option<f64>| v.map_or("None".to_string(), |f| format!("{f}"));
        let opt_s =
            |v: &Option<String>| v.as_ref().map_or("None".to_string(), |s| format!("'{s}'"));
        let b = |v: bool| if v { "True" } else { "False" };
        format!(
            "TransformerConfig(d_model={}, num_heads={}, num_layers={}, causal={}, \
             norm_first={}, bias_ff={}, bias_attn={}, layer_scale={}, \
             positional_embedding='{}', use_conv_block={}, cross_attention={}, \
             conv_kernel_size={}, use_conv_bias={}, gating={}, norm='{}', context={}, \
             max_period={}, max_seq_len={}, kv_repeat={}, dim_feedforward={}, conv_layout={})",
            self.d_model,
            self.num_heads,
            self.num_layers,
            b(self.causal),
            b(self.norm_first),
            b(self.bias_ff),
            b(self.bias_attn),
            opt_f(self.layer_scale),
            self.positional_embedding,
            b(self.use_conv_block),
            b(self.cross_attention),
            self.conv_kernel_size,
            b(self.use_conv_bias),
            opt_s(&self.gating),
            self.norm,
            self.context,
            self.max_period,
            self.max_seq_len,
            self.kv_repeat,
            self.dim_feedforward,
            b(self.conv_layout),
        )
    }

    /// Pickle / copy support: rebuilt from keyword arguments.
    fn __getnewargs_ex__<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(Bound<'py, PyTuple>, Bound<'py, PyDict>)> {
        Ok((PyTuple::empty(py), self.dict(py)?))
    }
}
