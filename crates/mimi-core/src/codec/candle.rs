//! The candle engine: candle-transformers' SEANet and down/upsampling modules, on any device
//! and dtype (GPUs, half precision). Their streaming state lives inside the modules and is
//! batched, so this engine has no per-row streams.

use super::engine::{Capabilities, DecodeConvs, EncodeConvs, Engine, EngineKind, Parts};
use super::offline::per_item;
use super::transform;
use crate::config::CodecConfig;
use crate::error::{check_cancel, Cancel, Result};
use crate::rows::Rows;
use crate::transformer::State;
use candle::{Module, StreamTensor, StreamingModule, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::mimi::conv::{ConvDownsample1d, ConvTrUpsample1d};
use candle_transformers::models::mimi::seanet::{SeaNetDecoder, SeaNetEncoder};
use std::sync::Arc;

/// candle's modules, holding the weights (and, in a stream's clones, the streaming state).
pub(crate) struct Candle {
    encoder: SeaNetEncoder,
    decoder: SeaNetDecoder,
    downsample: ConvDownsample1d,
    upsample: ConvTrUpsample1d,
}

impl Candle {
    pub(crate) fn load(cfg: &CodecConfig, vb: &VarBuilder) -> Result<Self> {
        let (dim, stride) = (cfg.seanet.dimension, cfg.downsample_stride());
        let ccfg = cfg.seanet.to_candle();
        Ok(Self {
            encoder: SeaNetEncoder::new(&ccfg, vb.pp("encoder"))?,
            decoder: SeaNetDecoder::new(&ccfg, vb.pp("decoder"))?,
            downsample: ConvDownsample1d::new(stride, dim, true, true, vb.pp("downsample"))?,
            upsample: ConvTrUpsample1d::new(stride, dim, true, true, vb.pp("upsample"))?,
        })
    }
}

/// A module's streaming output, `None` when it holds no frame.
fn nonempty(x: StreamTensor) -> Result<Option<Tensor>> {
    match x.as_option() {
        Some(t) if t.dim(candle::D::Minus1)? > 0 => Ok(Some(t.clone())),
        _ => Ok(None),
    }
}

impl Engine for Candle {
    fn kind(&self) -> EngineKind {
        EngineKind::Candle
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { per_row: false }
    }

    fn encode(&self, p: &Parts, pcm: &Tensor, cancel: Cancel) -> Result<Tensor> {
        let x = self.encoder.forward(pcm)?;
        check_cancel(cancel)?;
        let x = transform(&p.enc_tr, &mut State::default(), &x, cancel)?;
        check_cancel(cancel)?;
        Ok(self.downsample.forward(&x)?)
    }

    /// candle 0.11.1's CPU `conv_transpose1d` gives wrong results for batch items after the
    /// first (its col2im path), so transposed convolutions run on one item at a time.
    fn decode(&self, p: &Parts, x: &Tensor, cancel: Cancel) -> Result<Tensor> {
        let x = per_item(x, |xi| Ok(self.upsample.forward(xi)?))?;
        let x = transform(&p.dec_tr, &mut State::default(), &x, cancel)?;
        per_item(&x, |xi| {
            check_cancel(cancel)?;
            Ok(self.decoder.forward(xi)?)
        })
    }

    /// The whole call's activations at once, about 2 KB per sample (see the native engine).
    fn in_flight(&self, _p: &Parts, samples: usize) -> (u64, u64) {
        (samples as u64, 0)
    }

    fn encode_convs(self: Arc<Self>) -> Box<dyn EncodeConvs> {
        Box::new(CandleEncode {
            encoder: self.encoder.clone(),
            downsample: self.downsample.clone(),
        })
    }

    fn decode_convs(self: Arc<Self>) -> Box<dyn DecodeConvs> {
        Box::new(CandleDecode {
            engine: self,
            items: Vec::new(),
        })
    }
}

/// An encoder stream on candle's modules (batched state: every step takes all rows).
struct CandleEncode {
    encoder: SeaNetEncoder,
    downsample: ConvDownsample1d,
}

impl EncodeConvs for CandleEncode {
    fn seanet(&mut self, _rows: &Rows, pcm: &Tensor, _last: bool) -> Result<Option<Tensor>> {
        nonempty(self.encoder.step(&pcm.clone().into())?)
    }

    fn downsample(&mut self, _rows: &Rows, x: &Tensor, _last: bool) -> Result<Option<Tensor>> {
        nonempty(self.downsample.step(&x.clone().into())?)
    }

    fn reset_row(&mut self, _r: usize) {}

    fn deep_copy(&self) -> Box<dyn EncodeConvs> {
        Box::new(CandleEncode {
            encoder: self.encoder.clone(),
            downsample: self.downsample.clone(),
        })
    }
}

/// A decoder stream on candle's modules: one module pair per batch item, because of the
/// transposed-convolution bug (see [`Candle::decode`]).
struct CandleDecode {
    engine: Arc<Candle>,
    items: Vec<(ConvTrUpsample1d, SeaNetDecoder)>,
}

impl DecodeConvs for CandleDecode {
    fn upsample(&mut self, rows: &Rows, x: &Tensor) -> Result<Option<Tensor>> {
        while self.items.len() < rows.batch() {
            let e = &self.engine;
            self.items.push((e.upsample.clone(), e.decoder.clone()));
        }
        let mut ups = Vec::with_capacity(self.items.len());
        for (i, (up, _)) in self.items.iter_mut().enumerate() {
            match nonempty(up.step(&x.narrow(0, i, 1)?.into())?)? {
                Some(y) => ups.push(y),
                None => return Ok(None),
            }
        }
        Ok(Some(Tensor::cat(&ups, 0)?))
    }

    fn seanet(&mut self, _rows: &Rows, x: &Tensor) -> Result<Option<Tensor>> {
        let mut outs = Vec::with_capacity(self.items.len());
        for (i, (_, dec)) in self.items.iter_mut().enumerate() {
            match nonempty(dec.step(&x.narrow(0, i, 1)?.into())?)? {
                Some(y) => outs.push(y),
                None => return Ok(None),
            }
        }
        Ok(Some(Tensor::cat(&outs, 0)?))
    }

    fn reset_row(&mut self, _r: usize) {}

    fn deep_copy(&self) -> Box<dyn DecodeConvs> {
        Box::new(CandleDecode {
            engine: self.engine.clone(),
            items: self.items.clone(),
        })
    }
}
