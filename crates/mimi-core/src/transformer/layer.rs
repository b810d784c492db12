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
    /// The norms and scales as host values, for the planned step (f32 on the CPU only).
    pub(super) host: Option<HostParams>,
}

/// A norm's parameters as host values, applied as candle's CPU kernels compute it (the same
/// sums in the same order, so the same bits).
pub(super) struct HostNorm {
    weight: Vec<f32>,
    /// The layer norm's bias; `None` for an RMS norm.
    bias: Option<Vec<f32>>,
    eps: f32,
}

impl HostNorm {
    fn load(kind: NormKind, d: usize, vb: &VarBuilder) -> Result<Self> {
        let host = |t: Tensor| -> Result<Vec<f32>> { Ok(t.flatten_all()?.to_vec1::<f32>()?) };
        Ok(match kind {
            NormKind::LayerNorm => Self {
                weight: host(vb.get(d, "weight")?)?,
                bias: Some(host(vb.get(d, "bias")?)?),
                eps: 1e-5,
            },
            NormKind::RmsNorm => Self {
                weight: host(vb.get((1, 1, d), "alpha")?)?,
                bias: None,
                eps: 1e-8,
            },
        })
    }

    /// `y` = the norm of each row of `x` (rows of the norm's width).
    pub(super) fn apply(&self, x: &[f32], y: &mut [f32]) {
        let d = self.weight.len();
        for (xr, yr) in x.chunks_exact(d).zip(y.chunks_exact_mut(d)) {
            match &self.bias {
                Some(bias) => {
                    let (mut sum, mut sum2) = (0f32, 0f32);
                    for &v in xr {
                        sum += v;
                        sum2 += v * v;
                    }
                    let mean = sum / d as f32;
                    let inv_std = (sum2 / d as f32 - mean * mean + self.eps).sqrt().recip();
                    for ((o, &v), (&a, &b)) in
                        yr.iter_mut().zip(xr).zip(self.weight.iter().zip(bias))
                    {
                        *o = (v - mean) * inv_std * a + b;
                    }
                }
                None => {
                    let sum2 = xr.iter().map(|&v| v * v).sum::<f32>();
                    let m = (sum2 / d as f32 + self.eps).sqrt();
                    for ((o, &v), &a) in yr.iter_mut().zip(xr).zip(&self.weight) {
                        *o = v / m * a;
                    }
                }
            }
        }
    }
}

/// A layer's norms and layer scales as host values (see [`Layer::host`]).
pub(super) struct HostParams {
    pub(super) norm1: HostNorm,
    pub(super) norm2: HostNorm,
    pub(super) ls1: Option<Vec<f32>>,
    pub(super) ls2: Option<Vec<f32>>,
}

/// `x += y * scale` (per feature, over rows of the scale's width), or `x += y`: candle's
/// residual sum, element by element.
pub(super) fn add_scaled(x: &mut [f32], y: &[f32], scale: Option<&[f32]>) {
    match scale {
        Some(s) => {
            for (xr, yr) in x.chunks_exact_mut(s.len()).zip(y.chunks_exact(s.len())) {
                for ((a, &b), &c) in xr.iter_mut().zip(yr).zip(s) {
                    *a += b * c;
                }
            }
        }
        None => x.iter_mut().zip(y).for_each(|(a, &b)| *a += b),
    }
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
    /// Holds every matrix in bf16 pairs (`precision="medium"`).
    pub(super) fn pair_pack(&mut self) {
        self.attn.qkv.pair_pack();
        self.attn.out.pair_pack();
        match &mut self.mlp {
            FeedForward::Plain { fc1, fc2 } => {
                fc1.pair_pack();
                fc2.pair_pack();
            }
            FeedForward::Gated {
                lin_in, lin_out, ..
            } => {
                lin_in.pair_pack();
                lin_out.pair_pack();
            }
        }
    }

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
        let attn = Attention::load(cfg, &vb.pp("self_attn"), &vbw.pp("self_attn"))?;
        let mlp = FeedForward::load(cfg, &vb, &vbw)?;
        let (ls1, ls2) = (scale("self_attn_layer_scale")?, scale("mlp_layer_scale")?);
        // The planned step: an f32 model on the CPU whose matrices are all packed, with the
        // plain feed-forward block (the gated one runs candle's ops).
        let packed = attn.qkv.is_packed() && attn.out.is_packed();
        let plain =
            matches!(&mlp, FeedForward::Plain { fc1, fc2 } if fc1.is_packed() && fc2.is_packed());
        let host = (packed && plain && vb.dtype() == candle::DType::F32 && vb.device().is_cpu())
            .then(|| -> Result<HostParams> {
                let host = |t: &Option<Tensor>| t.as_ref().map(|t| t.to_vec1::<f32>()).transpose();
                Ok(HostParams {
                    norm1: HostNorm::load(cfg.norm, d, &vb.pp(n1))?,
                    norm2: HostNorm::load(cfg.norm, d, &vb.pp(n2))?,
                    ls1: host(&ls1)?,
                    ls2: host(&ls2)?,
                })
            })
            .transpose()?;
        Ok(Self {
            host,
            norm1: Norm::new(d, &ccfg, vb.pp(n1))?,
            norm2: Norm::new(d, &ccfg, vb.pp(n2))?,
            attn,
            mlp,
            ls1,
            ls2,
        })
    }
}
