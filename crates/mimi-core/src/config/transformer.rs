//! The transformer config's rules and its candle form.

use super::*;
use candle_transformers::models::mimi::transformer as candle;
use candle_transformers::models::mimi::NormType;

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
    pub fn to_candle(&self) -> candle::Config {
        candle::Config {
            d_model: self.d_model,
            num_heads: self.num_heads,
            num_layers: self.num_layers,
            causal: self.causal,
            norm_first: self.norm_first,
            bias_ff: self.bias_ff,
            bias_attn: self.bias_attn,
            layer_scale: self.layer_scale,
            positional_embedding: match self.positional_embedding {
                PositionalEmbedding::Rope => candle::PositionalEmbedding::Rope,
                PositionalEmbedding::Sin => candle::PositionalEmbedding::Sin,
                PositionalEmbedding::None => candle::PositionalEmbedding::None,
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
