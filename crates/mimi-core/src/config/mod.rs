//! The configurations: the transformer's, SEANet's and the codec's, each declared once.
//!
//! A config is a table of fields ([`config_table!`]): from that one declaration come the
//! struct, its defaults (the real Mimi model), the list of field names, reading and writing a
//! field by name from a dynamic [`Value`], and the ordered `(name, value)` list that the
//! binding turns into `to_dict`, `replace`, `__repr__` and pickling. Field names are
//! candle's. Strings such as `"rope"` or `"weight_norm"` are parsed into enums here, once.
//!
//! The files: `value` (the dynamic [`Value`] and how each field type reads it), this module
//! (the tables, the structs they declare, the enums), then one file per config's rules
//! (`transformer`, `seanet`, `codec`) and `hf` (a Hugging Face `config.json`).

use crate::error::{Error, Result};

mod value;
pub(super) use value::choice_error;
use value::{positive, require_nonzero};
pub use value::{Elu, Field, NoneOnly, Value};

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

mod codec;
mod hf;
mod seanet;
mod transformer;

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
