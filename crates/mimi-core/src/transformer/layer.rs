//! One transformer layer's weights as the step computes with them: the attention's q/k/v
//! (one stacked product) and output projections, the feed-forward block (plain or gated), the
//! norms and layer scales, loaded under candle's names; and [`Layer::linears`], which names
//! the matrices each linear layer holds (for the weights map and `weights()`).

use crate::config::{Norm as NormKind, TransformerConfig};
use crate::error::Result;
use crate::kernels::Linear;
use candle::{IndexOp, Module, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::mimi::transformer::Norm;

pub(super) struct Attention {
    /// q, k and v projections fused into one `(3d, d)` matmul.
    pub(super) qkv: Linear,
    pub(super) out: Linear,
}

/// The feed-forward block: candle's `Mlp`, with its names, run with our `Linear`.
pub(super) enum FeedForward {
    Plain {
        fc1: Linear,
        fc2: Linear,
    },
    Gated {
        lin_in: Linear,
        lin_out: Linear,
        act: candle_nn::Activation,
    },
}

impl FeedForward {
    /// candle's `Mlp` weights (`mlp.fc1`/`fc2` or `gating.linear_in`/`out`): the matrices
    /// from `vbw` (their storage dtype), the biases from `vb`.
    pub(super) fn load(cfg: &TransformerConfig, vb: &VarBuilder, vbw: &VarBuilder) -> Result<Self> {
        let (d, ff) = (cfg.d_model, cfg.dim_feedforward);
        let linear = |name: &str, (o, i): (usize, usize), bias: bool| -> Result<Linear> {
            let w = vbw.get((o, i), &format!("{name}.weight"))?;
            let b = bias
                .then(|| vb.get(o, &format!("{name}.bias")))
                .transpose()?;
            Ok(Linear::new(w, b)?)
        };
        Ok(match cfg.gating {
            None => Self::Plain {
                fc1: linear("mlp.fc1", (ff, d), cfg.bias_ff)?,
                fc2: linear("mlp.fc2", (d, ff), cfg.bias_ff)?,
            },
            Some(g) => {
                let h = cfg.gated_hidden();
                Self::Gated {
                    lin_in: linear("gating.linear_in", (2 * h, d), false)?,
                    lin_out: linear("gating.linear_out", (d, h), false)?,
                    act: g.activation(),
                }
            }
        })
    }
}

impl Module for FeedForward {
    fn forward(&self, xs: &Tensor) -> candle::Result<Tensor> {
        match self {
            Self::Plain { fc1, fc2 } => crate::kernels::gelu_erf(&xs.apply(fc1)?)?.apply(fc2),
            Self::Gated {
                lin_in,
                lin_out,
                act,
            } => {
                let h = xs.apply(lin_in)?;
                let (b, t, _) = h.dims3()?;
                let h = h.reshape((b, t, 2, ()))?;
                (h.i((.., .., 0))?.apply(act)? * h.i((.., .., 1))?)?.apply(lin_out)
            }
        }
    }
}

pub(super) struct Layer {
    pub(super) norm1: Norm,
    pub(super) norm2: Norm,
    pub(super) attn: Attention,
    pub(super) mlp: FeedForward,
    /// Layer scales (candle's `LayerScale` weights, one value per feature).
    pub(super) ls1: Option<Tensor>,
    pub(super) ls2: Option<Tensor>,
}

impl Attention {
    /// q, k and v as one product (`q_proj`, `k_proj`, `v_proj` stacked), then `o_proj`;
    /// the matrices from `vbw` (their storage dtype), the biases from `vb`.
    pub(super) fn load(cfg: &TransformerConfig, vb: &VarBuilder, vbw: &VarBuilder) -> Result<Self> {
        let d = cfg.d_model;
        let parts = |vb: &VarBuilder, suffix: &str, shape: &[usize]| -> Result<Vec<Tensor>> {
            Ok(["q_proj", "k_proj", "v_proj"]
                .iter()
                .map(|p| vb.get(shape, &format!("{p}.{suffix}")))
                .collect::<candle::Result<Vec<_>>>()?)
        };
        let (qkv_b, out_b) = match cfg.bias_attn {
            true => (
                Some(Tensor::cat(&parts(vb, "bias", &[d])?, 0)?),
                Some(vb.get(d, "o_proj.bias")?),
            ),
            false => (None, None),
        };
        Ok(Self {
            qkv: Linear::stacked(parts(vbw, "weight", &[d, d])?, qkv_b)?,
            out: Linear::new(vbw.get((d, d), "o_proj.weight")?, out_b)?,
        })
    }
}

impl Layer {
    /// The layer's linear layers, each with the names of the matrices it holds (q, k and v
    /// stacked in one, in that order).
    pub(super) fn linears(&self) -> Vec<(&Linear, &'static [&'static str])> {
        let mut out: Vec<(&Linear, &'static [&'static str])> = vec![
            (
                &self.attn.qkv,
                &[
                    "self_attn.q_proj.weight",
                    "self_attn.k_proj.weight",
                    "self_attn.v_proj.weight",
                ],
            ),
            (&self.attn.out, &["self_attn.o_proj.weight"]),
        ];
        match &self.mlp {
            FeedForward::Plain { fc1, fc2 } => {
                out.push((fc1, &["mlp.fc1.weight"]));
                out.push((fc2, &["mlp.fc2.weight"]));
            }
            FeedForward::Gated {
                lin_in, lin_out, ..
            } => {
                out.push((lin_in, &["gating.linear_in.weight"]));
                out.push((lin_out, &["gating.linear_out.weight"]));
            }
        }
        out
    }

    /// Layer `vb` (`layers.{i}`) with candle's names; its matrices from `vbw`.
    pub(super) fn load(cfg: &TransformerConfig, vb: VarBuilder, vbw: VarBuilder) -> Result<Self> {
        let ccfg = cfg.to_candle();
        let d = cfg.d_model;
        let (n1, n2) = match cfg.norm {
            NormKind::RmsNorm => ("input_rmsnorm", "post_attention_rmsnorm"),
            NormKind::LayerNorm => ("input_layernorm", "post_attention_layernorm"),
        };
        let scale = |name: &str| match cfg.layer_scale {
            Some(_) => vb.pp(name).get(d, "scale").map(Some),
            None => Ok(None),
        };
        Ok(Self {
            norm1: Norm::new(d, &ccfg, vb.pp(n1))?,
            norm2: Norm::new(d, &ccfg, vb.pp(n2))?,
            attn: Attention::load(cfg, &vb.pp("self_attn"), &vbw.pp("self_attn"))?,
            mlp: FeedForward::load(cfg, &vb, &vbw)?,
            ls1: scale("self_attn_layer_scale")?,
            ls2: scale("mlp_layer_scale")?,
        })
    }
}
