//! The SEANet config's rules and its candle form.

use super::*;
use candle_transformers::models::mimi::{conv, seanet};

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
        // The narrowest stage is `n_filters` wide; its residual blocks' hidden layer is
        // `n_filters / compress` (integer division), which must keep a channel.
        if self.n_residual_layers > 0 && self.n_filters < self.compress {
            return Err(Error::config(
                "compress",
                format!(
                    "the residual blocks' hidden layers would have no channels (n_filters / \
                     compress = {} / {} = 0); expected compress <= n_filters, or \
                     n_residual_layers = 0",
                    self.n_filters, self.compress
                ),
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
