//! The SEANet encoder and decoder of the candle engine, assembled from its per-row streaming
//! layers ([`super::layers`]) in candle's checkpoint names: the same functions as
//! [`crate::seanet`] (the native engine's), on batched device tensors in any dtype.

use super::layers::{Conv, ConvTr, LayerState};
use super::step_rows::StepRows;
use crate::config::SeanetConfig;
use crate::conv::ConvSpec;
use crate::error::{check_cancel, Cancel, Error, Result};
use candle::Tensor;
use candle_nn::VarBuilder;
use std::slice::IterMut;

/// A stream's layer states, in the order the layers run.
pub(super) type States = Vec<LayerState>;

/// The next layer's state.
fn next<'a>(st: &mut IterMut<'a, LayerState>) -> Result<&'a mut LayerState> {
    st.next()
        .ok_or_else(|| Error::Internal("a SEANet stream lost a layer's state".into()))
}

/// A residual block: `conv2(elu(conv1(elu(x)))) + skip(x)`.
#[derive(Clone, Debug)]
struct ResBlock {
    conv1: Conv,
    conv2: Conv,
    shortcut: Option<Conv>,
}

impl ResBlock {
    fn weights_nbytes(&self) -> usize {
        (self.conv1.weights_nbytes() + self.conv2.weights_nbytes())
            + self.shortcut.as_ref().map_or(0, Conv::weights_nbytes)
    }
}

/// Bytes of a stage's residual blocks.
fn blocks_nbytes(blocks: &[ResBlock]) -> usize {
    blocks.iter().map(ResBlock::weights_nbytes).sum()
}

impl ResBlock {
    /// Block `j` of a stage of width `dim`, under `vb`.
    fn load(cfg: &SeanetConfig, vb: VarBuilder, dim: usize, j: usize) -> Result<Self> {
        let (act, pad) = (Some(cfg.activation.0), cfg.pad_mode);
        let hidden = dim / cfg.compress;
        let b = vb.pp("block");
        let conv1 = ConvSpec::new(dim, hidden, cfg.residual_kernel_size)
            .dilation(cfg.dilation_base.pow(j as u32))
            .pad(pad);
        let conv2 = ConvSpec::new(hidden, dim, 1).pad(pad);
        Ok(Self {
            conv1: Conv::load(b.pp(1), conv1, act)?,
            conv2: Conv::load(b.pp(3), conv2, act)?,
            shortcut: match cfg.true_skip {
                true => None,
                false => Some(Conv::load(
                    vb.pp("shortcut"),
                    ConvSpec::new(dim, dim, 1).pad(pad),
                    None,
                )?),
            },
        })
    }

    /// Stateful layers (the shortcut's is counted, though it keeps no columns).
    const LAYERS: usize = 3;

    #[cfg(test)]
    fn kernels(&self) -> Vec<&Tensor> {
        let mut k = vec![self.conv1.kernel(), self.conv2.kernel()];
        k.extend(self.shortcut.as_ref().map(Conv::kernel));
        k
    }

    fn step(
        &self,
        st: &mut IterMut<'_, LayerState>,
        rows: &StepRows,
        x: &Tensor,
        last: bool,
    ) -> Result<Tensor> {
        let h = self.conv1.step(next(st)?, rows, x, last)?;
        let y = self.conv2.step(next(st)?, rows, &h, last)?;
        let sc = next(st)?;
        let skip = match &self.shortcut {
            Some(c) => c.step(sc, rows, x, last)?,
            None => x.clone(),
        };
        Ok((y + skip)?)
    }
}

/// The residual blocks of one stage, at `vb.pp(*idx)` onwards (advances `idx`).
fn res_blocks(
    cfg: &SeanetConfig,
    vb: &VarBuilder,
    idx: &mut usize,
    dim: usize,
) -> Result<Vec<ResBlock>> {
    (0..cfg.n_residual_layers)
        .map(|j| {
            let block = ResBlock::load(cfg, vb.pp(*idx), dim, j);
            *idx += 1;
            block
        })
        .collect()
}

/// The SEANet encoder: audio `(B, channels, samples)` -> `(B, dimension, frames)`.
#[derive(Clone, Debug)]
pub(super) struct Encoder {
    init: Conv,
    stages: Vec<(Vec<ResBlock>, Conv)>,
    last: Conv,
}

impl Encoder {
    /// Bytes of its weights, as stored.
    pub fn weights_nbytes(&self) -> usize {
        let stages: usize = (self.stages.iter())
            .map(|(blocks, down)| blocks_nbytes(blocks) + down.weights_nbytes())
            .sum();
        self.init.weights_nbytes() + stages + self.last.weights_nbytes()
    }
}

impl Encoder {
    pub fn load(cfg: &SeanetConfig, vb: VarBuilder) -> Result<Self> {
        let (vb, nf, pad) = (vb.pp("layers"), cfg.n_filters, cfg.pad_mode);
        let act = Some(cfg.activation.0);
        let init = Conv::load(
            vb.pp(0),
            ConvSpec::new(cfg.channels, nf, cfg.kernel_size).pad(pad),
            None,
        )?;
        let (mut idx, mut mult, mut stages) = (1, 1, Vec::new());
        for &ratio in cfg.ratios.iter().rev() {
            let res = res_blocks(cfg, &vb, &mut idx, mult * nf)?;
            let down = ConvSpec::new(mult * nf, 2 * mult * nf, 2 * ratio)
                .stride(ratio)
                .pad(pad);
            stages.push((res, Conv::load(vb.pp(idx + 1), down, act)?));
            idx += 2;
            mult *= 2;
        }
        let last = ConvSpec::new(mult * nf, cfg.dimension, cfg.last_kernel_size).pad(pad);
        Ok(Self {
            init,
            stages,
            last: Conv::load(vb.pp(idx + 1), last, act)?,
        })
    }

    /// Every convolution kernel, in order.
    #[cfg(test)]
    pub fn kernels(&self) -> Vec<&Tensor> {
        let mut k = vec![self.init.kernel()];
        for (res, down) in &self.stages {
            k.extend(res.iter().flat_map(ResBlock::kernels));
            k.push(down.kernel());
        }
        k.push(self.last.kernel());
        k
    }

    fn layers(&self) -> usize {
        let res: usize = self.stages.iter().map(|(r, _)| r.len()).sum();
        2 + self.stages.len() + ResBlock::LAYERS * res
    }

    /// The frames this chunk completes for each stepping row (`last`: the audio ends here).
    pub fn step(
        &self,
        st: &mut States,
        rows: &StepRows,
        x: &Tensor,
        last: bool,
        cancel: Cancel,
    ) -> Result<Tensor> {
        st.resize_with(self.layers(), Default::default);
        let mut st = st.iter_mut();
        let mut x = self.init.step(next(&mut st)?, rows, x, last)?;
        for (res, down) in &self.stages {
            check_cancel(cancel)?;
            for r in res {
                x = r.step(&mut st, rows, &x, last)?;
            }
            x = down.step(next(&mut st)?, rows, &x, last)?;
        }
        self.last.step(next(&mut st)?, rows, &x, last)
    }
}

/// The SEANet decoder: `(B, dimension, frames)` -> audio `(B, channels, samples)`. It pads
/// nothing on the right, so any chunking gives the offline audio.
#[derive(Clone, Debug)]
pub(super) struct Decoder {
    init: Conv,
    stages: Vec<(ConvTr, Vec<ResBlock>)>,
    last: Conv,
}

impl Decoder {
    /// Bytes of its weights, as stored.
    pub fn weights_nbytes(&self) -> usize {
        let stages: usize = (self.stages.iter())
            .map(|(up, blocks)| up.weights_nbytes() + blocks_nbytes(blocks))
            .sum();
        self.init.weights_nbytes() + stages + self.last.weights_nbytes()
    }
}

impl Decoder {
    pub fn load(cfg: &SeanetConfig, vb: VarBuilder) -> Result<Self> {
        let (vb, nf, pad) = (vb.pp("layers"), cfg.n_filters, cfg.pad_mode);
        let act = Some(cfg.activation.0);
        let mut mult = 1 << cfg.ratios.len();
        let init = ConvSpec::new(cfg.dimension, mult * nf, cfg.kernel_size).pad(pad);
        let init = Conv::load(vb.pp(0), init, None)?;
        let (mut idx, mut stages) = (1, Vec::new());
        for &ratio in &cfg.ratios {
            let (cin, cout) = (mult * nf, mult * nf / 2);
            let up = ConvSpec::new(cin, cout, 2 * ratio).stride(ratio).pad(pad);
            let up = ConvTr::load(vb.pp(idx + 1), up, act)?;
            idx += 2;
            stages.push((up, res_blocks(cfg, &vb, &mut idx, cout)?));
            mult /= 2;
        }
        let last = ConvSpec::new(nf, cfg.channels, cfg.last_kernel_size).pad(pad);
        Ok(Self {
            init,
            stages,
            last: Conv::load(vb.pp(idx + 1), last, act)?,
        })
    }

    /// Every convolution kernel, in order.
    #[cfg(test)]
    pub fn kernels(&self) -> Vec<&Tensor> {
        let mut k = vec![self.init.kernel()];
        for (up, res) in &self.stages {
            k.push(up.kernel());
            k.extend(res.iter().flat_map(ResBlock::kernels));
        }
        k.push(self.last.kernel());
        k
    }

    fn layers(&self) -> usize {
        let res: usize = self.stages.iter().map(|(_, r)| r.len()).sum();
        2 + self.stages.len() + ResBlock::LAYERS * res
    }

    /// The audio these frames complete, for each stepping row.
    pub fn step(
        &self,
        st: &mut States,
        rows: &StepRows,
        x: &Tensor,
        cancel: Cancel,
    ) -> Result<Tensor> {
        st.resize_with(self.layers(), Default::default);
        let mut st = st.iter_mut();
        let mut x = self.init.step(next(&mut st)?, rows, x, false)?;
        for (up, res) in &self.stages {
            check_cancel(cancel)?;
            x = up.step(next(&mut st)?, rows, &x)?;
            for r in res {
                x = r.step(&mut st, rows, &x, false)?;
            }
        }
        self.last.step(next(&mut st)?, rows, &x, false)
    }
}
