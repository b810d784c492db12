//! The SEANet's layers in the order they run, with their places in the checkpoint and their
//! shapes: the one description of the encoder and the decoder that both engines build from
//! ([`super::Encoder`] here, the candle engine's in `codec::candle_engine::seanet`), each
//! through [`build_encoder`] / [`build_decoder`] with its own [`Layers`].

use crate::config::SeanetConfig;
use crate::conv::ConvSpec;
use crate::error::Result;
use candle_nn::VarBuilder;

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

/// An engine's layer constructors: each builds its own kind of layer from the layer's place
/// in the topology, under `vb` (the checkpoint's `layers`).
pub trait Layers {
    /// A convolution (the first and last ones, the encoder's down-sampling).
    type Conv;
    /// A transposed convolution (the decoder's up-sampling).
    type ConvTr;
    /// A residual block.
    type Block;
    /// The convolution `l`.
    fn conv(&self, vb: &VarBuilder, l: &Layer) -> Result<Self::Conv>;
    /// The transposed convolution `l`.
    fn conv_tr(&self, vb: &VarBuilder, l: &Layer) -> Result<Self::ConvTr>;
    /// The residual block `b`.
    fn block(&self, vb: &VarBuilder, b: &Block) -> Result<Self::Block>;
}

/// A SEANet's layers as an engine built them, in the topology's order; `S`: a stage's
/// layers, in the order they run.
pub struct Built<C, S> {
    /// The first convolution.
    pub init: C,
    /// Each stage's layers.
    pub stages: Vec<S>,
    /// The last convolution.
    pub last: C,
}

/// An encoder stage's layers: its residual blocks, then its down-sampling.
pub type EncoderStage<L> = (Vec<<L as Layers>::Block>, <L as Layers>::Conv);
/// A decoder stage's layers: its up-sampling, then its residual blocks.
pub type DecoderStage<L> = (<L as Layers>::ConvTr, Vec<<L as Layers>::Block>);

/// The encoder of `cfg`, by `layers`, from the checkpoint's encoder folder `vb`.
pub fn build_encoder<L: Layers>(
    cfg: &SeanetConfig,
    layers: &L,
    vb: VarBuilder,
) -> Result<Built<L::Conv, EncoderStage<L>>> {
    let vb = vb.pp("layers");
    build(&Topology::encoder(cfg), layers, &vb, |s| {
        let blocks = build_blocks(layers, &vb, &s.blocks)?;
        Ok((blocks, layers.conv(&vb, &s.resample)?))
    })
}

/// The decoder of `cfg`, by `layers`, from the checkpoint's decoder folder `vb`.
pub fn build_decoder<L: Layers>(
    cfg: &SeanetConfig,
    layers: &L,
    vb: VarBuilder,
) -> Result<Built<L::Conv, DecoderStage<L>>> {
    let vb = vb.pp("layers");
    build(&Topology::decoder(cfg), layers, &vb, |s| {
        let up = layers.conv_tr(&vb, &s.resample)?;
        Ok((up, build_blocks(layers, &vb, &s.blocks)?))
    })
}

/// Every layer of `t` under `vb` (the checkpoint's `layers`): each stage by `stage`, then
/// the first and the last convolution.
fn build<L: Layers, S>(
    t: &Topology,
    layers: &L,
    vb: &VarBuilder,
    stage: impl Fn(&Stage) -> Result<S>,
) -> Result<Built<L::Conv, S>> {
    let stages = t.stages.iter().map(stage).collect::<Result<Vec<_>>>()?;
    Ok(Built {
        init: layers.conv(vb, &t.init)?,
        stages,
        last: layers.conv(vb, &t.last)?,
    })
}

/// A stage's residual blocks, under `vb` (the checkpoint's `layers`).
fn build_blocks<L: Layers>(layers: &L, vb: &VarBuilder, blocks: &[Block]) -> Result<Vec<L::Block>> {
    blocks.iter().map(|b| layers.block(vb, b)).collect()
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
