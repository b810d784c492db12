//! Causal convolutions that stream over batched candle tensors on any device and dtype, with
//! a state of their own per batch row. candle-transformers' streaming modules keep one
//! batched state we cannot reach per row, so the candle engine owns its layers: each layer
//! keeps the last activated input columns of every row (`history`, a `(batch, cin, h)`
//! tensor) and how many columns each row has seen, and a step runs candle's unpadded
//! `conv1d` over `[history ++ new input]`. The semantics are the native engine's
//! ([`crate::conv`]): the same causal left padding (zeros, or the first column replicated),
//! and with `last` the same right padding as the offline call.
//!
//! The convolution itself is candle's `conv1d`, or on CUDA with `MIMI_PY_CUDA_CUDNN=1` our
//! cuDNN op ([`crate::gpu::cudnn`]), planned once per layer and shape.
//!
//! A transposed convolution of stride `s` is computed as an ordinary convolution with `s`
//! output channels per channel (its phases), interleaved afterwards: one batched `conv1d`,
//! never candle's `conv_transpose1d` (wrong for batch items after the first on the CPU in
//! candle 0.11, a naive kernel on CUDA). The depthwise upsampling is a sum of broadcast
//! products over its taps. Every kernel is made contiguous at load: candle's CUDA
//! convolutions compute wrong results for non-contiguous kernels.

use super::step_rows::{cat_time, take, StepRows};
use crate::config::PadMode;
use crate::conv::ConvSpec;
use crate::error::{Error, Result};
use crate::gpu::cudnn::conv1d;
use crate::runtime::device::zeros_on;
use candle::{Tensor, D};
use candle_nn::VarBuilder;

/// One layer's streaming state, per batch row.
#[derive(Clone, Debug, Default)]
pub(super) struct LayerState {
    /// `(batch, cin, history)`: each row's last activated input columns (`None` before the
    /// stream's first step).
    hist: Option<Tensor>,
    /// Input columns each row has received since its start or reset (0: fresh; its history is
    /// rebuilt from the padding at its next step).
    seen: Vec<u64>,
}

impl LayerState {
    /// Row `r` starts afresh at its next step.
    pub fn reset_row(&mut self, r: usize) {
        if let Some(s) = self.seen.get_mut(r) {
            *s = 0;
        }
    }
}

/// A convolution weight as the checkpoints store it (plain or weight-norm), contiguous.
fn weight(vb: &VarBuilder, shape: (usize, usize, usize)) -> Result<Tensor> {
    Ok(crate::conv::conv_weight(vb, shape)?.contiguous()?)
}

/// The input side every layer shares: the rows' histories, updated with the new columns.
#[derive(Clone, Debug)]
struct Input {
    cin: usize,
    /// Columns kept per row.
    history: usize,
    act: Option<f64>,
    replicate: bool,
}

impl Input {
    /// The activated chunk and the stepping rows' histories (fresh rows from the padding).
    /// Stores the updated histories and counts in `st`.
    fn prepare(&self, st: &mut LayerState, rows: &StepRows, x: &Tensor) -> Result<Prepared> {
        let x = match self.act {
            Some(alpha) => x.elu(alpha)?,
            None => x.clone(),
        };
        if st.seen.len() != rows.batch {
            st.seen = vec![0; rows.batch];
            st.hist = None;
        }
        let seen: Vec<u64> = rows.idx.iter().map(|&i| st.seen[i]).collect();
        let hist = self.history(st, rows, &x, &seen)?;
        let (n, h) = (x.dim(2)?, self.history);
        if h > 0 && n > 0 {
            let new = if n >= h {
                x.narrow(2, n - h, h)?
            } else {
                Tensor::cat(&[&hist.narrow(2, n, h - n)?, &x], 2)?
            }
            .contiguous()?;
            let all = match &st.hist {
                Some(all) => rows.put(all, &new)?,
                None => rows.put(&self.zeros(rows.batch, &x)?, &new)?,
            };
            st.hist = Some(all.contiguous()?);
        } else if st.hist.is_none() {
            st.hist = Some(self.zeros(rows.batch, &x)?);
        }
        for &i in &rows.idx {
            st.seen[i] += n as u64;
        }
        Ok(Prepared { x, hist, seen })
    }

    /// `(rows, cin, history)` zeros in `x`'s dtype, on its device.
    fn zeros(&self, rows: usize, x: &Tensor) -> Result<Tensor> {
        Ok(zeros_on(
            (rows, self.cin, self.history),
            x.dtype(),
            x.device(),
        )?)
    }

    /// The stepping rows' histories before the chunk `x` (activated): the state's, or for a
    /// fresh row (`seen` 0) the causal padding, zeros or `x`'s first column.
    fn history(
        &self,
        st: &LayerState,
        rows: &StepRows,
        x: &Tensor,
        seen: &[u64],
    ) -> Result<Tensor> {
        let (r, h) = (x.dim(0)?, self.history);
        let fresh: Vec<u8> = seen.iter().map(|&s| u8::from(s == 0)).collect();
        let old = match &st.hist {
            Some(all) if h > 0 && fresh.contains(&0) => rows.select(all)?,
            _ => return self.padding(r, x),
        };
        if !fresh.contains(&1) {
            return Ok(old);
        }
        let m = Tensor::from_vec(fresh, (r, 1, 1), x.device())?;
        Ok(m.broadcast_as(old.shape())?
            .where_cond(&self.padding(r, x)?, &old)?)
    }

    /// A fresh row's history: the causal left padding.
    fn padding(&self, r: usize, x: &Tensor) -> Result<Tensor> {
        let (n, h) = (x.dim(2)?, self.history);
        if self.replicate && n > 0 && h > 0 {
            Ok(x.narrow(2, 0, 1)?
                .broadcast_as((r, self.cin, h))?
                .contiguous()?)
        } else {
            self.zeros(r, x)
        }
    }
}

/// A step's input after [`Input::prepare`]: the activated chunk, the rows' histories before it
/// and their counts before it.
struct Prepared {
    x: Tensor,
    hist: Tensor,
    seen: Vec<u64>,
}

/// A causal convolution (candle's `StreamableConv1d`): kernel `k`, stride, dilation, bias,
/// padding mode, and an optional ELU on its input.
#[derive(Clone, Debug)]
pub(super) struct Conv {
    input: Input,
    w: Tensor,
    b: Option<Tensor>,
    cout: usize,
    stride: usize,
    dilation: usize,
    keff: usize,
}

impl Conv {
    /// Reads `conv.weight` (or its weight-norm pair) and `conv.bias` under `vb`; `act`: an ELU
    /// (its alpha) applied to the input.
    pub fn load(vb: VarBuilder, s: ConvSpec, act: Option<f64>) -> Result<Self> {
        if s.k < s.stride || s.stride == 0 || s.dilation == 0 {
            return Err(Error::config(
                "seanet",
                format!(
                    "a convolution needs stride >= 1, dilation >= 1 and kernel >= stride, got \
                     kernel {}, stride {}, dilation {}",
                    s.k, s.stride, s.dilation
                ),
            ));
        }
        let vb = vb.pp("conv");
        let keff = (s.k - 1) * s.dilation + 1;
        Ok(Self {
            input: Input {
                cin: s.cin,
                history: keff - 1,
                act,
                replicate: s.pad == PadMode::Replicate,
            },
            w: weight(&vb, (s.cout, s.cin, s.k))?,
            b: match s.bias {
                true => Some(vb.get(s.cout, "bias")?.reshape((1, s.cout, 1))?),
                false => None,
            },
            cout: s.cout,
            stride: s.stride,
            dilation: s.dilation,
            keff,
        })
    }

    /// The kernel `conv1d` takes (tests check it is contiguous).
    #[cfg(test)]
    pub fn kernel(&self) -> &Tensor {
        &self.w
    }

    /// The output columns this chunk completes for each stepping row; with `last`, the input
    /// ends here and is padded on the right as offline. Rows whose counts differ modulo the
    /// stride run as separate groups (after a per-row reset).
    pub fn step(
        &self,
        st: &mut LayerState,
        rows: &StepRows,
        x: &Tensor,
        last: bool,
    ) -> Result<Tensor> {
        let (r, n) = (x.dim(0)?, x.dim(2)?);
        if n == 0 && !last {
            return Ok(zeros_on((r, self.cout, 0), x.dtype(), x.device())?);
        }
        let p = self.input.prepare(st, rows, x)?;
        let s = self.stride as u64;
        let key = |seen: u64| (seen % s, seen + n as u64 == 0);
        let first = key(p.seen[0]);
        if p.seen.iter().all(|&v| key(v) == first) {
            return self.run(&p.hist, &p.x, p.seen[0], last);
        }
        let mut groups: Vec<((u64, bool), Vec<usize>)> = Vec::new();
        for (j, &v) in p.seen.iter().enumerate() {
            match groups.iter_mut().find(|(k, _)| *k == key(v)) {
                Some((_, g)) => g.push(j),
                None => groups.push((key(v), vec![j])),
            }
        }
        let mut ys = Vec::with_capacity(groups.len());
        for (_, g) in &groups {
            ys.push(self.run(&take(&p.hist, g)?, &take(&p.x, g)?, p.seen[g[0]], last)?);
        }
        // Row j of the step is row order[j] of the groups' outputs, concatenated.
        let mut order = vec![0usize; r];
        for (i, j) in groups.iter().flat_map(|(_, g)| g).enumerate() {
            order[*j] = i;
        }
        let lens: Vec<usize> = ys.iter().map(|y| y.dim(2)).collect::<candle::Result<_>>()?;
        if lens.iter().any(|&l| l != lens[0]) {
            return Err(Error::Shape(
                "rows at different partial frames must step by whole frames".into(),
            ));
        }
        take(&Tensor::cat(&ys, 0)?, &order)
    }

    /// The convolution of rows that share their count modulo the stride (`seen` before this
    /// chunk).
    fn run(&self, hist: &Tensor, x: &Tensor, seen: u64, last: bool) -> Result<Tensor> {
        let (r, n) = (x.dim(0)?, x.dim(2)?);
        let (s, keff) = (self.stride, self.keff);
        // The columns of the history the next output still reads.
        let keep = keff - s + (seen % s as u64) as usize;
        let mut parts = vec![hist.narrow(2, hist.dim(2)? - keep, keep)?, x.clone()];
        let total = seen + n as u64;
        let extra = if last && total > 0 {
            ((s as u64 - total % s as u64) % s as u64) as usize
        } else {
            0
        };
        if extra > 0 {
            let cin = self.input.cin;
            let pad = if self.input.replicate {
                let full = cat_time(&parts)?;
                full.narrow(2, full.dim(2)? - 1, 1)?
                    .broadcast_as((r, cin, extra))?
                    .contiguous()?
            } else {
                Tensor::zeros((r, cin, extra), x.dtype(), x.device())?
            };
            parts.push(pad);
        }
        let full = cat_time(&parts)?;
        if full.dim(2)? < keff {
            return Ok(zeros_on((r, self.cout, 0), x.dtype(), x.device())?);
        }
        let y = conv1d(&full, &self.w, s, self.dilation)?;
        Ok(match &self.b {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}

/// A causal transposed convolution (`StreamableConvTranspose1d`, kernel `k`, stride `s`) as
/// the ordinary convolution of its `s` phases: output column `t * s + j` of channel `co` is
/// channel `co * s + j` at column `t` of a `conv1d` with `ceil(k / s)` taps.
#[derive(Clone, Debug)]
pub(super) struct ConvTr {
    input: Input,
    /// `(cout * s, cin, taps)`, contiguous.
    w: Tensor,
    b: Option<Tensor>,
    cout: usize,
    stride: usize,
}

/// `(cin, cout, k)` weights of a transposed convolution as `(cout, s, cin, taps)`: tap `m`
/// of phase `j` is `W[.., .., j + m * s]` (zero past the kernel), taps reversed so that an
/// ordinary convolution over `[history ++ input]` computes the phase.
fn phase_taps(w: &Tensor, s: usize) -> Result<Tensor> {
    let (cin, cout, k) = w.dims3()?;
    let taps = k.div_ceil(s);
    let w = if taps * s > k {
        let zeros = zeros_on((cin, cout, taps * s - k), w.dtype(), w.device())?;
        Tensor::cat(&[w, &zeros], 2)?
    } else {
        w.clone()
    };
    let rev: Vec<u32> = (0..taps as u32).rev().collect();
    let rev = Tensor::from_vec(rev, taps, w.device())?;
    let w = w.reshape((cin, cout, taps, s))?.permute((1, 3, 0, 2))?;
    Ok(w.contiguous()?.index_select(&rev, 3)?.contiguous()?)
}

impl ConvTr {
    /// Reads `conv.weight` (or its weight-norm pair) and `conv.bias` under `vb`; `act` as for
    /// [`Conv::load`].
    pub fn load(vb: VarBuilder, s: ConvSpec, act: Option<f64>) -> Result<Self> {
        let vb = vb.pp("conv");
        let raw = weight(&vb, (s.cin, s.cout, s.k))?;
        let taps = s.k.div_ceil(s.stride);
        let w = phase_taps(&raw, s.stride)?.reshape((s.cout * s.stride, s.cin, taps))?;
        Ok(Self {
            input: Input {
                cin: s.cin,
                history: taps - 1,
                act,
                replicate: false,
            },
            w: w.contiguous()?,
            b: match s.bias {
                true => Some(vb.get(s.cout, "bias")?.reshape((1, s.cout, 1))?),
                false => None,
            },
            cout: s.cout,
            stride: s.stride,
        })
    }

    /// The phase kernel `conv1d` takes (tests check it is contiguous).
    #[cfg(test)]
    pub fn kernel(&self) -> &Tensor {
        &self.w
    }

    /// `n * stride` output columns for `n` input columns, as the offline call gives them.
    pub fn step(&self, st: &mut LayerState, rows: &StepRows, x: &Tensor) -> Result<Tensor> {
        let (r, n) = (x.dim(0)?, x.dim(2)?);
        if n == 0 {
            return Ok(zeros_on((r, self.cout, 0), x.dtype(), x.device())?);
        }
        let p = self.input.prepare(st, rows, x)?;
        let full = cat_time(&[p.hist, p.x])?;
        let y = conv1d(&full, &self.w, 1, 1)?;
        let s = self.stride;
        let y = y
            .reshape((r, self.cout, s, n))?
            .transpose(2, 3)?
            .reshape((r, self.cout, n * s))?;
        Ok(match &self.b {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}

/// The depthwise transposed convolution of `ConvTrUpsample1d` (kernel `2 * stride`, one
/// filter per channel, no bias): per tap, a broadcast product with the shifted input.
#[derive(Clone, Debug)]
pub(super) struct Depthwise {
    input: Input,
    /// Per tap `m`: `(1, dim, 1, s)`, phase `j` holding `w[c, j + m * s]`.
    taps: Vec<Tensor>,
    stride: usize,
}

impl Depthwise {
    /// Reads `conv.weight` `(dim, 1, 2 * stride)` under `vb`.
    pub fn load(vb: VarBuilder, dim: usize, stride: usize) -> Result<Self> {
        let raw = vb.pp("conv").get((dim, 1, 2 * stride), "weight")?;
        let (taps, k) = (2, 2 * stride);
        let w = raw.reshape((dim, k))?;
        let taps = (0..taps)
            .map(|m| {
                Ok(w.narrow(1, m * stride, stride)?
                    .reshape((1, dim, 1, stride))?
                    .contiguous()?)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            input: Input {
                cin: dim,
                history: 1,
                act: None,
                replicate: false,
            },
            taps,
            stride,
        })
    }

    /// `n * stride` output columns for `n` input columns.
    pub fn step(&self, st: &mut LayerState, rows: &StepRows, x: &Tensor) -> Result<Tensor> {
        let (r, c, n) = x.dims3()?;
        if n == 0 {
            return Ok(x.clone());
        }
        let p = self.input.prepare(st, rows, x)?;
        let full = cat_time(&[p.hist, p.x])?;
        let last = self.taps.len() - 1;
        let mut y: Option<Tensor> = None;
        for (m, w) in self.taps.iter().enumerate() {
            let t = full
                .narrow(2, last - m, n)?
                .unsqueeze(D::Minus1)?
                .broadcast_mul(w)?;
            y = Some(match y {
                None => t,
                Some(y) => (y + t)?,
            });
        }
        let y = y.ok_or_else(|| Error::Internal("a depthwise upsampling without taps".into()))?;
        Ok(y.reshape((r, c, n * self.stride))?)
    }
}

/// Bytes of a tensor as stored.
fn tensor_nbytes(t: &Tensor) -> usize {
    t.elem_count() * t.dtype().size_in_bytes()
}

/// Bytes of a weight and its optional bias.
fn pair_nbytes(w: &Tensor, b: &Option<Tensor>) -> usize {
    tensor_nbytes(w) + b.as_ref().map_or(0, tensor_nbytes)
}

impl Conv {
    /// Bytes of its weights, as stored.
    pub(super) fn weights_nbytes(&self) -> usize {
        pair_nbytes(&self.w, &self.b)
    }
}

impl ConvTr {
    /// Bytes of its weights, as stored.
    pub(super) fn weights_nbytes(&self) -> usize {
        pair_nbytes(&self.w, &self.b)
    }
}

impl Depthwise {
    /// Bytes of its weights, as stored.
    pub(super) fn weights_nbytes(&self) -> usize {
        self.taps.iter().map(tensor_nbytes).sum()
    }
}
