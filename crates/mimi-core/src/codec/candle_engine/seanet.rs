//! The SEANet encoder and decoder of the candle engine, assembled from its per-row streaming
//! layers ([`super::layers`]) from the one [`Topology`]: the same functions as
//! [`crate::seanet`] (the native engine's), on batched device tensors in any dtype.

use super::layers::{Conv, ConvTr, LayerState};
use super::step_rows::StepRows;
use crate::config::SeanetConfig;
use crate::error::{check_cancel, Cancel, Error, Result};
use crate::seanet::topology::{self, Layers};
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
    /// The block `b` of the topology, under `vb` (the checkpoint's `layers`); `act`: the
    /// ELU's alpha.
    fn load(vb: &VarBuilder, b: &topology::Block, act: f64) -> Result<Self> {
        let vb = vb.pp(b.index);
        Ok(Self {
            conv1: Conv::load(vb.pp("block").pp(1), b.conv1, Some(act))?,
            conv2: Conv::load(vb.pp("block").pp(3), b.conv2, Some(act))?,
            shortcut: match b.shortcut {
                None => None,
                Some(spec) => Some(Conv::load(vb.pp("shortcut"), spec, None)?),
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

/// The candle engine's layers ([`Layers`]): each applies the ELU of alpha `act` to its
/// input where the topology says so.
struct CandleLayers {
    act: f64,
}

impl Layers for CandleLayers {
    type Conv = Conv;
    type ConvTr = ConvTr;
    type Block = ResBlock;

    fn conv(&self, vb: &VarBuilder, l: &topology::Layer) -> Result<Conv> {
        Conv::load(vb.pp(l.index), l.spec, l.act.then_some(self.act))
    }

    fn conv_tr(&self, vb: &VarBuilder, l: &topology::Layer) -> Result<ConvTr> {
        ConvTr::load(vb.pp(l.index), l.spec, l.act.then_some(self.act))
    }

    fn block(&self, vb: &VarBuilder, b: &topology::Block) -> Result<ResBlock> {
        ResBlock::load(vb, b, self.act)
    }
}

/// The SEANet encoder: audio `(B, channels, samples)` -> `(B, dimension, frames)`.
#[derive(Clone, Debug)]
pub(super) struct CandleEncoder {
    init: Conv,
    stages: Vec<(Vec<ResBlock>, Conv)>,
    last: Conv,
}

impl CandleEncoder {
    /// Bytes of its weights, as stored.
    pub fn weights_nbytes(&self) -> usize {
        let stages: usize = (self.stages.iter())
            .map(|(blocks, down)| blocks_nbytes(blocks) + down.weights_nbytes())
            .sum();
        self.init.weights_nbytes() + stages + self.last.weights_nbytes()
    }
}

impl CandleEncoder {
    pub fn load(cfg: &SeanetConfig, vb: VarBuilder) -> Result<Self> {
        let act = cfg.activation.0;
        let built = topology::build_encoder(cfg, &CandleLayers { act }, vb)?;
        Ok(Self {
            init: built.init,
            stages: built.stages,
            last: built.last,
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
pub(super) struct CandleDecoder {
    init: Conv,
    stages: Vec<(ConvTr, Vec<ResBlock>)>,
    last: Conv,
}

impl CandleDecoder {
    /// Bytes of its weights, as stored.
    pub fn weights_nbytes(&self) -> usize {
        let stages: usize = (self.stages.iter())
            .map(|(up, blocks)| up.weights_nbytes() + blocks_nbytes(blocks))
            .sum();
        self.init.weights_nbytes() + stages + self.last.weights_nbytes()
    }
}

impl CandleDecoder {
    pub fn load(cfg: &SeanetConfig, vb: VarBuilder) -> Result<Self> {
        let act = cfg.activation.0;
        let built = topology::build_decoder(cfg, &CandleLayers { act }, vb)?;
        Ok(Self {
            init: built.init,
            stages: built.stages,
            last: built.last,
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
