//! The configurations: the transformer's, SEANet's and the codec's, each declared once.
//!
//! A config is a table of fields ([`config_table!`]): from that one declaration come the
//! struct, its defaults (the real Mimi model), the list of field names, reading and writing a
//! field by name from a dynamic [`Value`], and the ordered `(name, value)` list that the
//! binding turns into `to_dict`, `replace`, `__repr__` and pickling. Field names are
//! candle's. Strings such as `"rope"` or `"weight_norm"` are parsed into enums here, once.

use crate::error::{Error, Result};
use candle_transformers::models::mimi::{conv, seanet, transformer, NormType};

/// A dynamic value, as a Python keyword argument or a JSON value holds it.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    List(Vec<Value>),
    /// Ordered key/value pairs.
    Dict(Vec<(String, Value)>),
    /// Anything else, kept for messages: its type name and `repr`.
    Other {
        type_name: String,
        repr: String,
    },
}

impl Value {
    /// The value as a literal, for messages (JSON's notation: `null`, `true`, `"text"`,
    /// `[1, 2]`, `{"k": 1}`); a value the caller could not map keeps the caller's own text.
    pub fn literal(&self) -> String {
        match self {
            Value::None => "null".into(),
            Value::Bool(b) => b.to_string(),
            Value::Int(i) => i.to_string(),
            Value::Float(f) if f.is_nan() => "nan".into(),
            Value::Float(f) if f.is_infinite() => (if *f > 0.0 { "inf" } else { "-inf" }).into(),
            Value::Float(f) => format!("{f:?}"),
            Value::Str(s) => format!("{s:?}"),
            Value::List(l) => format!("[{}]", join(l.iter().map(Value::literal))),
            Value::Dict(d) => format!(
                "{{{}}}",
                join(d.iter().map(|(k, v)| format!("{k:?}: {}", v.literal())))
            ),
            Value::Other { repr, .. } => repr.clone(),
        }
    }

    /// The value and its kind, for messages: `1.5 (float)`.
    pub fn describe(&self) -> String {
        let ty = match self {
            Value::None => "null",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "string",
            Value::List(_) => "list",
            Value::Dict(_) => "dict",
            Value::Other { type_name, .. } => type_name,
        };
        format!("{} ({ty})", self.literal())
    }

    /// The entry `key` of a dict, `None` if absent or not a dict.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Dict(d) => d.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

fn join(items: impl Iterator<Item = String>) -> String {
    items.collect::<Vec<_>>().join(", ")
}

/// A config field's type: how it is read from a [`Value`] and written back.
pub trait Field: Sized {
    /// Reads the field `field` from `v`, or a [`Error::Config`] naming it.
    fn parse(field: &str, v: &Value) -> Result<Self>;
    /// The field as a value.
    fn value(&self) -> Value;
}

impl Field for usize {
    fn parse(field: &str, v: &Value) -> Result<Self> {
        match v {
            Value::Int(i) => usize::try_from(*i).map_err(|_| {
                Error::config(
                    field,
                    format!("expected a non-negative int that fits in 64 bits, got {i}"),
                )
            }),
            _ => Err(Error::config(
                field,
                format!("expected an int, got {}", v.describe()),
            )),
        }
    }
    fn value(&self) -> Value {
        Value::Int(*self as i128)
    }
}

impl Field for u64 {
    fn parse(field: &str, v: &Value) -> Result<Self> {
        usize::parse(field, v).map(|s| s as u64)
    }
    fn value(&self) -> Value {
        Value::Int(*self as i128)
    }
}

impl Field for bool {
    fn parse(field: &str, v: &Value) -> Result<Self> {
        match v {
            Value::Bool(b) => Ok(*b),
            _ => Err(Error::config(
                field,
                format!("expected a bool, got {}", v.describe()),
            )),
        }
    }
    fn value(&self) -> Value {
        Value::Bool(*self)
    }
}

impl Field for f64 {
    fn parse(field: &str, v: &Value) -> Result<Self> {
        match v {
            Value::Float(f) => Ok(*f),
            Value::Int(i) => Ok(*i as f64),
            _ => Err(Error::config(
                field,
                format!("expected a number, got {}", v.describe()),
            )),
        }
    }
    fn value(&self) -> Value {
        Value::Float(*self)
    }
}

impl<T: Field> Field for Option<T> {
    fn parse(field: &str, v: &Value) -> Result<Self> {
        match v {
            Value::None => Ok(None),
            v => T::parse(field, v).map(Some),
        }
    }
    fn value(&self) -> Value {
        self.as_ref().map_or(Value::None, Field::value)
    }
}

impl Field for Vec<usize> {
    fn parse(field: &str, v: &Value) -> Result<Self> {
        match v {
            Value::List(items) => items.iter().map(|i| usize::parse(field, i)).collect(),
            _ => Err(Error::config(
                field,
                format!("expected a list of ints, got {}", v.describe()),
            )),
        }
    }
    fn value(&self) -> Value {
        Value::List(self.iter().map(Field::value).collect())
    }
}

fn choice_error(field: &str, names: &[&str], v: &Value) -> Error {
    let choices = join(names.iter().map(|n| format!("{n:?}")));
    let got = match v {
        Value::Str(s) => format!("{s:?}"),
        v => v.describe(),
    };
    Error::config(field, format!("expected one of {choices}, got {got}"))
}

/// An enum read from one of a fixed set of strings.
macro_rules! choice {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident = $s:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum $name { $($(#[$vm])* $variant),+ }

        impl $name {
            /// The accepted strings.
            pub const NAMES: &'static [&'static str] = &[$($s),+];
            /// The string of this choice.
            pub fn name(self) -> &'static str {
                match self { $(Self::$variant => $s),+ }
            }
        }

        impl Field for $name {
            fn parse(field: &str, v: &Value) -> Result<Self> {
                match v {
                    $(Value::Str(s) if s == $s => Ok(Self::$variant),)+
                    _ => Err(choice_error(field, Self::NAMES, v)),
                }
            }
            fn value(&self) -> Value {
                Value::Str(self.name().into())
            }
        }
    };
}

/// A config struct declared as a table of `name: Type = default` fields (see the module doc).
macro_rules! config_table {
    ([$($_ignored:tt)*] $(#[$m:meta])* pub struct $name:ident {
        $($(#[doc = $doc:expr])* $field:ident: $ty:ty = $default:expr,)+
    }) => {
        $(#[$m])*
        #[derive(Clone, Debug, PartialEq)]
        pub struct $name { $($(#[doc = $doc])* pub $field: $ty,)+ }

        impl Default for $name {
            fn default() -> Self {
                Self { $($field: $default,)+ }
            }
        }

        impl $name {
            /// The field names, in declaration order.
            pub const FIELDS: &'static [&'static str] = &[$(stringify!($field)),+];

            /// Sets the field `key` from `v` (not validated together with the others).
            pub fn set(&mut self, key: &str, v: &Value) -> Result<()> {
                match key {
                    $(stringify!($field) => self.$field = Field::parse(key, v)?,)+
                    other => return Err(Error::config(other, format!(
                        "unknown field; the fields are: {}", Self::FIELDS.join(", ")))),
                }
                Ok(())
            }

            /// Every field with its value, in declaration order.
            pub fn values(&self) -> Vec<(&'static str, Value)> {
                vec![$((stringify!($field), Field::value(&self.$field)),)+]
            }

            /// The defaults with the `(name, value)` pairs applied, then validated.
            pub fn from_values<'a>(
                values: impl IntoIterator<Item = (&'a str, &'a Value)>,
            ) -> Result<Self> {
                let mut c = Self::default();
                for (k, v) in values {
                    c.set(k, v)?;
                }
                c.validate()?;
                Ok(c)
            }

        }

        /// A nested config: a dict of its fields over the defaults.
        impl Field for $name {
            fn parse(field: &str, v: &Value) -> Result<Self> {
                match v {
                    Value::Dict(d) => Self::from_values(d.iter().map(|(k, v)| (k.as_str(), v)))
                        .map_err(|e| e.nested(field)),
                    _ => Err(Error::config(field, format!(
                        "expected a {} or a dict of its fields, got {}",
                        stringify!($name), v.describe()))),
                }
            }
            fn value(&self) -> Value {
                Value::Dict(self.values().into_iter().map(|(k, v)| (k.to_string(), v)).collect())
            }
        }
    };
}

choice!(
    /// How the transformer encodes positions.
    PositionalEmbedding { Rope = "rope", Sin = "sin", None = "none" }
);
choice!(
    /// The transformer's normalisation.
    Norm { LayerNorm = "layer_norm", RmsNorm = "rms_norm" }
);
choice!(
    /// The activation of a gated MLP (`"gelu"` is the exact erf GELU).
    Gating {
        Silu = "silu",
        Gelu = "gelu",
        GeluPytorchTanh = "gelu_pytorch_tanh",
        Relu = "relu",
        Sigmoid = "sigmoid",
        Swish = "swish",
    }
);
choice!(
    /// SEANet's weight normalisation (folded into plain weights at load).
    SeanetNorm { WeightNorm = "weight_norm", None = "none" }
);
choice!(
    /// How causal convolutions pad on the left (what candle's streaming convolutions do).
    PadMode { Constant = "constant", Replicate = "replicate" }
);
choice!(
    /// How the codec resamples latents to the frame rate.
    ResampleMethod { Conv = "conv" }
);

impl Gating {
    /// candle's activation of the same name.
    pub fn activation(self) -> candle_nn::Activation {
        use candle_nn::Activation as A;
        match self {
            Gating::Silu => A::Silu,
            Gating::Gelu => A::Gelu,
            Gating::GeluPytorchTanh => A::GeluPytorchTanh,
            Gating::Relu => A::Relu,
            Gating::Sigmoid => A::Sigmoid,
            Gating::Swish => A::Swish,
        }
    }
}

/// SEANet's activation: ELU with `alpha`, written `{"elu": alpha}` (candle's serde form) or
/// `"elu"` (alpha 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Elu(pub f64);

impl Field for Elu {
    fn parse(field: &str, v: &Value) -> Result<Self> {
        let only = || {
            Error::config(
                field,
                "only the ELU activation ({\"elu\": alpha}) is supported",
            )
        };
        match v {
            Value::Str(s) if s == "elu" => Ok(Elu(1.0)),
            Value::Dict(d) if d.len() == 1 => {
                let alpha = f64::parse(field, v.get("elu").ok_or_else(only)?)?;
                Ok(Elu(positive(field, alpha)?))
            }
            Value::Dict(_) => Err(only()),
            _ => Err(choice_error(field, &["elu"], v)),
        }
    }
    fn value(&self) -> Value {
        Value::Dict(vec![("elu".into(), Value::Float(self.0))])
    }
}

/// A field that only accepts `None` (SEANet's `final_activation`).
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct NoneOnly;

impl Field for NoneOnly {
    fn parse(field: &str, v: &Value) -> Result<Self> {
        match v {
            Value::None => Ok(NoneOnly),
            _ => Err(Error::config(field, "only None is supported")),
        }
    }
    fn value(&self) -> Value {
        Value::None
    }
}

fn positive(field: &str, f: f64) -> Result<f64> {
    if f.is_finite() && f > 0.0 {
        Ok(f)
    } else {
        Err(Error::config(
            field,
            format!("expected a positive finite number, got {f}"),
        ))
    }
}

/// Refuses any of `fields` (name, value) that is zero, naming the first one.
fn require_nonzero(fields: &[(&str, usize)]) -> Result<()> {
    match fields.iter().find(|(_, v)| *v == 0) {
        Some((field, _)) => Err(Error::config(field, "must be at least 1, got 0")),
        None => Ok(()),
    }
}

/// The field table of [`TransformerConfig`]: calls `$m! { [args] struct ... }` (the binding builds its
/// getters from the same table).
#[macro_export]
macro_rules! transformer_fields {
    ($m:ident $(, $arg:tt)*) => {
        $m! { [$($arg)*]
            /// Configuration of a Mimi streaming transformer (candle's `mimi::transformer::Config`).
            /// The defaults are the real Mimi encoder/decoder transformer.
            pub struct TransformerConfig {
                d_model: usize = 512,
                num_heads: usize = 8,
                num_layers: usize = 8,
                causal: bool = true,
                norm_first: bool = true,
                bias_ff: bool = false,
                bias_attn: bool = false,
                layer_scale: Option<f64> = Some(0.01),
                positional_embedding: PositionalEmbedding = PositionalEmbedding::Rope,
                use_conv_block: bool = false,
                cross_attention: bool = false,
                conv_kernel_size: usize = 5,
                use_conv_bias: bool = true,
                gating: Option<Gating> = None,
                norm: Norm = Norm::LayerNorm,
                context: usize = 250,
                max_period: usize = 10000,
                max_seq_len: usize = 8192,
                kv_repeat: usize = 1,
                dim_feedforward: usize = 2048,
                conv_layout: bool = false,
            }
        }
    };
}
transformer_fields!(config_table);

/// The field table of [`SeanetConfig`]: calls `$m! { [args] struct ... }` (the binding builds its
/// getters from the same table).
#[macro_export]
macro_rules! seanet_fields {
    ($m:ident $(, $arg:tt)*) => {
        $m! { [$($arg)*]
            /// SEANet encoder/decoder settings (candle's `seanet::Config`).
            pub struct SeanetConfig {
                dimension: usize = 512,
                channels: usize = 1,
                causal: bool = true,
                n_filters: usize = 64,
                n_residual_layers: usize = 1,
                activation: Elu = Elu(1.0),
                compress: usize = 2,
                dilation_base: usize = 2,
                disable_norm_outer_blocks: usize = 0,
                final_activation: NoneOnly = NoneOnly,
                kernel_size: usize = 7,
                residual_kernel_size: usize = 3,
                last_kernel_size: usize = 3,
                lstm: usize = 0,
                norm: SeanetNorm = SeanetNorm::WeightNorm,
                pad_mode: PadMode = PadMode::Constant,
                ratios: Vec<usize> = vec![8, 6, 5, 4],
                true_skip: bool = true,
            }
        }
    };
}
seanet_fields!(config_table);

/// The field table of [`CodecConfig`]: calls `$m! { [args] struct ... }` (the binding builds its
/// getters from the same table).
#[macro_export]
macro_rules! codec_fields {
    ($m:ident $(, $arg:tt)*) => {
        $m! { [$($arg)*]
            /// Configuration of the Mimi codec (candle's `mimi::Config`). The defaults are the real
            /// model (24 kHz, 12.5 Hz frames, 8 of its 32 codebooks).
            pub struct CodecConfig {
                channels: usize = 1,
                sample_rate: f64 = 24000.0,
                frame_rate: f64 = 12.5,
                renormalize: bool = true,
                resample_method: ResampleMethod = ResampleMethod::Conv,
                seanet: SeanetConfig = SeanetConfig::default(),
                transformer: TransformerConfig = TransformerConfig { conv_layout: true, ..Default::default() },
                quantizer_n_q: usize = 8,
                quantizer_bins: usize = 2048,
                quantizer_dim: usize = 256,
            }
        }
    };
}
codec_fields!(config_table);

impl TransformerConfig {
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
        if !self.d_model.is_multiple_of(self.num_heads) {
            return Err(Error::config(
                "d_model",
                format!(
                    "d_model={} must be divisible by num_heads={}",
                    self.d_model, self.num_heads
                ),
            ));
        }
        if !self.num_heads.is_multiple_of(self.kv_repeat) {
            return Err(Error::config(
                "kv_repeat",
                format!(
                    "num_heads={} must be divisible by kv_repeat={}",
                    self.num_heads, self.kv_repeat
                ),
            ));
        }
        self.validate_positions()?;
        if let Some(ls) = self.layer_scale.filter(|ls| !ls.is_finite()) {
            return Err(Error::config(
                "layer_scale",
                format!("must be finite, got {ls}"),
            ));
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

    fn validate_positions(&self) -> Result<()> {
        let head_dim = self.head_dim();
        match self.positional_embedding {
            PositionalEmbedding::Rope if !head_dim.is_multiple_of(2) => Err(Error::config(
                "d_model",
                format!(
                    "rope needs an even head dimension, but d_model/num_heads = {}/{} = {head_dim}",
                    self.d_model, self.num_heads
                ),
            )),
            PositionalEmbedding::Sin if !self.d_model.is_multiple_of(2) || self.d_model < 4 => {
                Err(Error::config(
                    "d_model",
                    format!(
                        "sinusoidal positions need an even d_model of at least 4, got {}",
                        self.d_model
                    ),
                ))
            }
            _ => Ok(()),
        }
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
        match unsupported.iter().find(|(_, bad, _)| *bad) {
            Some((field, _, fix)) => Err(Error::config(
                field,
                format!(
                    "this value is not supported by Mimi's streaming transformer \
                     (candle supports only the Mimi layout); set {fix}"
                ),
            )),
            None => Ok(()),
        }
    }

    /// Size of one attention head.
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

    /// candle's config struct with the same values.
    pub fn to_candle(&self) -> transformer::Config {
        transformer::Config {
            d_model: self.d_model,
            num_heads: self.num_heads,
            num_layers: self.num_layers,
            causal: self.causal,
            norm_first: self.norm_first,
            bias_ff: self.bias_ff,
            bias_attn: self.bias_attn,
            layer_scale: self.layer_scale,
            positional_embedding: match self.positional_embedding {
                PositionalEmbedding::Rope => transformer::PositionalEmbedding::Rope,
                PositionalEmbedding::Sin => transformer::PositionalEmbedding::Sin,
                PositionalEmbedding::None => transformer::PositionalEmbedding::None,
            },
            use_conv_block: self.use_conv_block,
            cross_attention: self.cross_attention,
            conv_kernel_size: self.conv_kernel_size,
            use_conv_bias: self.use_conv_bias,
            gating: self.gating.map(Gating::activation),
            norm: match self.norm {
                Norm::RmsNorm => NormType::RmsNorm,
                Norm::LayerNorm => NormType::LayerNorm,
            },
            context: self.context,
            max_period: self.max_period,
            max_seq_len: self.max_seq_len,
            kv_repeat: self.kv_repeat,
            dim_feedforward: self.dim_feedforward,
            conv_layout: self.conv_layout,
        }
    }
}

impl SeanetConfig {
    /// Checks the fields together.
    pub fn validate(&self) -> Result<()> {
        require_nonzero(&[
            ("dimension", self.dimension),
            ("channels", self.channels),
            ("n_filters", self.n_filters),
            ("kernel_size", self.kernel_size),
            ("residual_kernel_size", self.residual_kernel_size),
            ("last_kernel_size", self.last_kernel_size),
            ("dilation_base", self.dilation_base),
            ("compress", self.compress),
        ])?;
        if !self.causal {
            return Err(Error::config(
                "causal",
                "a non-causal SEANet cannot stream (its streaming and offline results would \
                 differ); set causal=True",
            ));
        }
        if self.lstm != 0 {
            return Err(Error::config(
                "lstm",
                "LSTM layers are not supported (candle's SEANet has none); use 0",
            ));
        }
        if self.ratios.is_empty() || self.ratios.contains(&0) {
            return Err(Error::config(
                "ratios",
                format!("expected positive ints, got {:?}", self.ratios),
            ));
        }
        Ok(())
    }

    /// Samples per latent step of the SEANet (the product of the ratios).
    pub fn hop_length(&self) -> usize {
        self.ratios.iter().product()
    }

    /// candle's config struct with the same values.
    pub fn to_candle(&self) -> seanet::Config {
        seanet::Config {
            dimension: self.dimension,
            channels: self.channels,
            causal: self.causal,
            n_filters: self.n_filters,
            n_residual_layers: self.n_residual_layers,
            ratios: self.ratios.clone(),
            activation: candle_nn::Activation::Elu(self.activation.0),
            norm: conv::Norm::WeightNorm,
            kernel_size: self.kernel_size,
            residual_kernel_size: self.residual_kernel_size,
            last_kernel_size: self.last_kernel_size,
            dilation_base: self.dilation_base,
            pad_mode: match self.pad_mode {
                PadMode::Replicate => conv::PadMode::Replicate,
                PadMode::Constant => conv::PadMode::Constant,
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
    /// The codebooks the real Mimi model (kyutai/mimi) holds.
    pub const MIMI_CODEBOOKS: usize = 32;

    /// The real Mimi codec with `n_q` codebooks.
    pub fn mimi(n_q: usize) -> Self {
        Self {
            quantizer_n_q: n_q,
            ..Self::default()
        }
    }

    /// The real Mimi codec with `n_q` of its [`Self::MIMI_CODEBOOKS`] codebooks (the
    /// config's default number when `None`), refusing a number outside that range.
    pub fn mimi_checked(n_q: Option<usize>) -> Result<Self> {
        let n = n_q.unwrap_or(Self::default().quantizer_n_q);
        if n == 0 || n > Self::MIMI_CODEBOOKS {
            return Err(Error::config(
                "num_codebooks",
                format!(
                    "the real Mimi model has 1 to {} codebooks, got {n}",
                    Self::MIMI_CODEBOOKS
                ),
            ));
        }
        Ok(Self::mimi(n))
    }

    /// Refuses a requested number of codebooks below 1 (above what a checkpoint holds is
    /// refused when it is read).
    pub fn check_codebooks(n: Option<usize>) -> Result<Option<usize>> {
        if n == Some(0) {
            return Err(Error::config("num_codebooks", "must be at least 1"));
        }
        Ok(n)
    }

    /// Checks the fields together.
    pub fn validate(&self) -> Result<()> {
        self.seanet.validate().map_err(|e| e.nested("seanet"))?;
        require_nonzero(&[
            ("channels", self.channels),
            ("quantizer_n_q", self.quantizer_n_q),
            ("quantizer_bins", self.quantizer_bins),
            ("quantizer_dim", self.quantizer_dim),
        ])?;
        positive("sample_rate", self.sample_rate)?;
        positive("frame_rate", self.frame_rate)?;
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
        self.validate_stride()
    }

    fn validate_stride(&self) -> Result<()> {
        let stride = self.downsample_stride_f();
        if (stride - stride.round()).abs() > 1e-9 || stride.round() < 1.0 {
            return Err(Error::config(
                "frame_rate",
                format!(
                    "sample_rate / prod(seanet.ratios) / frame_rate = {} / {} / {} must be a \
                     positive integer",
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

    /// Stride of the latent downsampling (2 for the real model).
    pub fn downsample_stride(&self) -> usize {
        self.downsample_stride_f().round() as usize
    }

    /// Samples per code frame (1920 for the real model).
    pub fn frame_size(&self) -> usize {
        self.seanet.hop_length() * self.downsample_stride()
    }
}

/// The fields of a Hugging Face `MimiConfig` (`config.json` of kyutai/mimi), as
/// `(json key, our field path)`.
const HF_FIELDS: &[(&str, &str)] = &[
    ("audio_channels", "channels"),
    ("audio_channels", "seanet.channels"),
    ("sampling_rate", "sample_rate"),
    ("hidden_size", "seanet.dimension"),
    ("hidden_size", "transformer.d_model"),
    ("num_filters", "seanet.n_filters"),
    ("num_residual_layers", "seanet.n_residual_layers"),
    ("kernel_size", "seanet.kernel_size"),
    ("residual_kernel_size", "seanet.residual_kernel_size"),
    ("last_kernel_size", "seanet.last_kernel_size"),
    ("dilation_growth_rate", "seanet.dilation_base"),
    ("compress", "seanet.compress"),
    ("pad_mode", "seanet.pad_mode"),
    ("upsampling_ratios", "seanet.ratios"),
    ("num_attention_heads", "transformer.num_heads"),
    ("num_hidden_layers", "transformer.num_layers"),
    ("intermediate_size", "transformer.dim_feedforward"),
    ("sliding_window", "transformer.context"),
    ("max_position_embeddings", "transformer.max_seq_len"),
    ("layer_scale_initial_scale", "transformer.layer_scale"),
    ("codebook_size", "quantizer_bins"),
    ("vector_quantization_hidden_dimension", "quantizer_dim"),
    ("num_quantizers", "quantizer_n_q"),
    ("frame_rate", "frame_rate"),
    ("_frame_rate", "frame_rate"),
];

impl CodecConfig {
    /// A config from a Hugging Face `MimiConfig` (`config.json` of kyutai/mimi), with
    /// `n_q` codebooks if given (else the file's `num_quantizers`).
    pub fn from_hf(json: &Value, n_q: Option<usize>) -> Result<Self> {
        let present = |k: &str| json.get(k).filter(|v| **v != Value::None);
        let mut c = Self::default();
        for (key, path) in HF_FIELDS {
            if let Some(v) = present(key) {
                c.set_path(path, v)
                    .map_err(|e| rename_field(e, &format!("config.json:{key}")))?;
            }
        }
        if let Some(v) = present("use_causal_conv") {
            if !bool::parse("config.json:use_causal_conv", v)? {
                return Err(Error::config(
                    "config.json:use_causal_conv",
                    "a non-causal SEANet is not supported",
                ));
            }
        }
        let theta = json
            .get("rope_parameters")
            .and_then(|p| p.get("rope_theta"))
            .or_else(|| present("rope_theta"));
        if let Some(t) = theta {
            let t = f64::parse("config.json:rope_theta", t)?;
            c.transformer.max_period = positive("config.json:rope_theta", t)? as usize;
        }
        if let Some(n) = n_q {
            c.quantizer_n_q = n;
        }
        c.transformer
            .validate()
            .map_err(|e| e.nested("transformer"))?;
        c.validate()?;
        Ok(c)
    }

    /// Sets a field by its dotted path (`seanet.ratios`).
    fn set_path(&mut self, path: &str, v: &Value) -> Result<()> {
        match path.split_once('.') {
            Some(("seanet", f)) => self.seanet.set(f, v),
            Some(("transformer", f)) => self.transformer.set(f, v),
            _ => self.set(path, v),
        }
    }
}

fn rename_field(e: Error, field: &str) -> Error {
    match e {
        Error::Config { msg, .. } => Error::config(field, msg),
        e => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_real_model() {
        let c = CodecConfig::default();
        assert_eq!(c.frame_size(), 1920);
        assert!(c.transformer.conv_layout);
        assert_eq!(TransformerConfig::default().head_dim(), 64);
        c.validate().unwrap();
    }

    #[test]
    fn values_round_trip_through_the_table() {
        let c = CodecConfig::mimi(16);
        let back = CodecConfig::from_values(c.values().iter().map(|(k, v)| (*k, v))).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn errors_name_nested_fields() {
        let seanet = Value::Dict(vec![("ratios".into(), Value::List(vec![Value::Int(0)]))]);
        let e = CodecConfig::from_values([("seanet", &seanet)]).unwrap_err();
        assert!(e.to_string().contains("`seanet.ratios`"), "{e}");
        let e = TransformerConfig::from_values([("norm", &Value::Str("batch".into()))]);
        assert!(e.unwrap_err().to_string().contains("`norm`"));
    }
}
