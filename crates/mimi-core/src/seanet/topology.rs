//! The SEANet's layers in the order they run, with their places in the checkpoint and their
//! shapes: the one description of the encoder and the decoder that both engines build from
//! ([`super::Encoder`] here, the candle engine's in `codec::candle_engine::seanet`).

use crate::config::SeanetConfig;
use crate::conv::ConvSpec;

/// One convolution at `layers.{index}`; `act`: the ELU is applied to its input.
#[derive(Clone, Copy, Debug)]
pub struct Layer {
    pub index: usize,
    pub spec: ConvSpec,
    pub act: bool,
}

/// A residual block at `layers.{index}`: `block.1` (`conv1`, then the ELU), `block.3`
/// (`conv2`, pointwise), both on activated inputs, and a pointwise `shortcut` unless the
/// config's `true_skip`.
#[derive(Clone, Copy, Debug)]
pub struct Block {
    pub index: usize,
    pub conv1: ConvSpec,
    pub conv2: ConvSpec,
    pub shortcut: Option<ConvSpec>,
}

/// A stage at one rate: its residual blocks and its resampling by the stage's ratio (the
/// encoder runs the blocks then the strided down-sampling; the decoder the transposed
/// up-sampling then the blocks).
#[derive(Clone, Debug)]
pub struct Stage {
    pub blocks: Vec<Block>,
    pub resample: Layer,
}

/// A whole SEANet: the first convolution, the stages, the last convolution.
#[derive(Clone, Debug)]
pub struct Topology {
    pub init: Layer,
    pub stages: Vec<Stage>,
    pub last: Layer,
}

impl Topology {
    /// The encoder: audio `channels` -> `dimension`, stages by the reversed `ratios`.
    pub fn encoder(cfg: &SeanetConfig) -> Self {
        let (nf, pad) = (cfg.n_filters, cfg.pad_mode);
        let init = ConvSpec::new(cfg.channels, nf, cfg.kernel_size).pad(pad);
        let (mut idx, mut mult, mut stages) = (1, 1, Vec::new());
        for &ratio in cfg.ratios.iter().rev() {
            let blocks = blocks(cfg, &mut idx, mult * nf);
            let down = ConvSpec::new(mult * nf, 2 * mult * nf, 2 * ratio)
                .stride(ratio)
                .pad(pad);
            stages.push(Stage {
                blocks,
                resample: layer(idx + 1, down, true),
            });
            idx += 2;
            mult *= 2;
        }
        let last = ConvSpec::new(mult * nf, cfg.dimension, cfg.last_kernel_size).pad(pad);
        Self {
            init: layer(0, init, false),
            stages,
            last: layer(idx + 1, last, true),
        }
    }

    /// The decoder: `dimension` -> audio `channels`, stages by `ratios` (transposed
    /// up-sampling; its spec's padding does not apply).
    pub fn decoder(cfg: &SeanetConfig) -> Self {
        let (nf, pad) = (cfg.n_filters, cfg.pad_mode);
        let mut mult = 1 << cfg.ratios.len();
        let init = ConvSpec::new(cfg.dimension, mult * nf, cfg.kernel_size).pad(pad);
        let (mut idx, mut stages) = (1, Vec::new());
        for &ratio in &cfg.ratios {
            let (cin, cout) = (mult * nf, mult * nf / 2);
            let up = layer(
                idx + 1,
                ConvSpec::new(cin, cout, 2 * ratio).stride(ratio),
                true,
            );
            idx += 2;
            stages.push(Stage {
                blocks: blocks(cfg, &mut idx, cout),
                resample: up,
            });
            mult /= 2;
        }
        let last = ConvSpec::new(nf, cfg.channels, cfg.last_kernel_size).pad(pad);
        Self {
            init: layer(0, init, false),
            stages,
            last: layer(idx + 1, last, true),
        }
    }
}

fn layer(index: usize, spec: ConvSpec, act: bool) -> Layer {
    Layer { index, spec, act }
}

/// The residual blocks of a stage of width `dim`, at `layers.{idx}` onwards (advances `idx`).
fn blocks(cfg: &SeanetConfig, idx: &mut usize, dim: usize) -> Vec<Block> {
    let (hidden, pad) = (dim / cfg.compress, cfg.pad_mode);
    (0..cfg.n_residual_layers)
        .map(|j| {
            let block = Block {
                index: *idx,
                conv1: ConvSpec::new(dim, hidden, cfg.residual_kernel_size)
                    .dilation(cfg.dilation_base.pow(j as u32))
                    .pad(pad),
                conv2: ConvSpec::new(hidden, dim, 1).pad(pad),
                shortcut: (!cfg.true_skip).then(|| ConvSpec::new(dim, dim, 1).pad(pad)),
            };
            *idx += 1;
            block
        })
        .collect()
}
