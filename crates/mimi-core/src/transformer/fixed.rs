//! The fixed-shape step of the candle path: a streaming step of up to [`STEP_TOKENS`] tokens
//! for the whole batch, whose shapes depend only on the batch size and the token count, never
//! on the rows' positions nor on which rows step (moshi's `RingKVCache` and vLLM-Omni's
//! batched Mimi work the same way). What makes that possible:
//!
//! * the rings hold [`ring_slots`] >= `context + STEP_TOKENS - 1` slots, so a step's new keys
//!   are written into them first (in place, one scatter per buffer) without overwriting a key
//!   any of its queries still needs: slot `(p + i) % slots` held position `p + i - slots`,
//!   which is at least `context` before every query of the step;
//! * every query attends over the whole ring, with an additive mask built from each row's
//!   position (a young row's empty slots, keys past the window and the step's later keys
//!   hidden), so no ring is copied, gathered or narrowed;
//! * rows that do not step are computed too (from zeros) and dropped; their slots are not
//!   written (`u32::MAX`, which candle's scatter skips) and their positions do not move;
//! * the per-step tables (mask, rotary angles, write slots, the stepping rows) are built on
//!   the host in one buffer each ([`HostTables`]) and copied to the device once per step; the
//!   step itself ([`Transformer::run_fixed`]) reads only device tensors, so it can be
//!   captured as a CUDA graph (`MIMI_PY_CUDA_GRAPHS`, [`crate::gpu::graphs`]) and replayed
//!   with the next step's tables written into the captured buffers ([`StepBuffers`]).
//!
//! `MIMI_PY_FIXED_STEP=0` keeps the earlier paths (rings of `context` slots, attention over
//! the filled slots, masked rows gathered and scattered) for comparison.

use super::model::Transformer;
use super::positions::STEP_TOKENS;
use super::state::{ring_slot, slot_position, LayerCache};
use super::step_graphs::{StepBuffers, StepGraphs, StepInputs};
use crate::config::PositionalEmbedding;
use crate::error::Result;
use crate::gpu::graphs::{with_param_cache, Action, GraphKey};
use crate::runtime::device::cast;
use candle::Tensor;

/// Each batch row's ring slot for the `t` new keys of a step from `pos[r]`, repeated over
/// heads and head values as candle's scatter wants it (`(batch, heads, t, hd)`); `u32::MAX`
/// (no write) for the rows not in `rows`.
pub(super) fn write_slots(
    pos: &[u64],
    rows: &[usize],
    t: usize,
    (heads, hd, slots): (usize, usize, usize),
) -> Vec<u32> {
    let per_row = heads * t * hd;
    let mut out = vec![u32::MAX; pos.len() * per_row];
    for &r in rows {
        let row = &mut out[r * per_row..][..per_row];
        for (i, key) in row.chunks_exact_mut(hd).enumerate() {
            key.fill(ring_slot(pos[r] + (i % t) as u64, slots) as u32);
        }
    }
    out
}

/// The additive mask `(batch, 1, t, slots)` of a step whose new keys are already in the
/// rings: 0 where slot `j` of row `r` holds a position `k` the query at `q = pos[r] + i`
/// sees (`0 <= k <= q`, `q - k < context`), -inf elsewhere. Rows that do not step get the
/// mask of a step too: their queries only need finite results, which are dropped.
pub(super) fn step_mask(pos: &[u64], t: usize, context: usize, slots: usize) -> Vec<f32> {
    let mut mask = Vec::with_capacity(pos.len() * t * slots);
    for &p in pos {
        let after = p + t as u64;
        for q in (0..t as i64).map(|i| p as i64 + i) {
            mask.extend((0..slots).map(|j| {
                let k = slot_position(j, after, slots);
                match k >= 0 && k <= q && q - k < context as i64 {
                    true => 0f32,
                    false => f32::NEG_INFINITY,
                }
            }));
        }
    }
    mask
}

/// A step's tables on the host: the stepping rows (when not all), the rotary angles or the
/// sinusoidal embedding of each row's tokens, the ring slots its keys go to, and the mask.
struct HostTables {
    ids: Option<Vec<u32>>,
    rope: Option<(Vec<f32>, Vec<f32>)>,
    sin: Option<Vec<f32>>,
    slots: Vec<u32>,
    mask: Vec<f32>,
}

impl Transformer {
    /// Whether a call of `t` tokens takes the fixed-shape step.
    pub(super) fn takes_fixed_step(&self, t: usize) -> bool {
        self.fixed_step && (1..=STEP_TOKENS).contains(&t)
    }

    /// One step of `t <= STEP_TOKENS` tokens for the batch rows `rows` (sorted, distinct;
    /// `xs` holds theirs, `(rows.len(), t, d)`), each at its position in `pos` (one per batch
    /// row), over the rings `caches`, written in place. With graphs on, the step runs as the
    /// stream's plan says (`graphs`). Returns the rows' outputs; the caller advances their
    /// positions.
    pub(super) fn step_fixed(
        &self,
        pos: &[u64],
        rows: &[usize],
        (caches, graphs): (&[LayerCache], &mut StepGraphs),
        xs: &Tensor,
    ) -> Result<Tensor> {
        let (n, t, _) = xs.dims3()?;
        let tables = self.host_tables(pos, rows, t);
        let key = match (self.graphs, caches.first()) {
            (true, Some(ring)) => GraphKey {
                batch: pos.len(),
                rows: n,
                tokens: t,
                dtype: self.dtype,
                rings: ring.k.id(),
            },
            _ => return self.run_fixed(&self.upload(&tables, xs)?, caches),
        };
        let dev = &self.device;
        let eager = || {
            let inputs = self.upload(&tables, xs)?;
            with_param_cache(dev, || self.run_fixed(&inputs, caches))
        };
        let step = |b: &StepBuffers| {
            with_param_cache(dev, || {
                let h = self.run_fixed(&b.inputs, caches)?.contiguous()?;
                Ok(b.out.slice_set(&h, 0, 0)?)
            })
        };
        let fill = |b: &StepBuffers| self.write(&b.inputs, &tables, xs);
        let bufs = match graphs.decide(key) {
            Action::Eager => return eager(),
            Action::Replay => graphs.replay(dev, key, fill, step)?,
            Action::Capture => {
                let make = || self.buffers(&tables, xs);
                match graphs.capture(dev, key, make, step)? {
                    Some(b) => b,
                    None => return eager(),
                }
            }
        };
        Ok(bufs.out.copy()?)
    }

    /// The step over device inputs only (what a graph captures): scatters the rows in,
    /// writes the new keys into the rings, attends over the whole rings, gathers the rows out.
    fn run_fixed(&self, inp: &StepInputs, caches: &[LayerCache]) -> Result<Tensor> {
        let (_, t, d) = inp.x.dims3()?;
        let b = inp.slots.dim(0)?;
        let mut h = match &inp.ids {
            None => inp.x.clone(),
            Some(ids) => {
                Tensor::zeros((b, t, d), inp.x.dtype(), &self.device)?.index_add(ids, &inp.x, 0)?
            }
        };
        if let Some(sin) = &inp.sin {
            h = h.broadcast_add(&cast(sin, self.dtype)?)?;
        }
        let mask = cast(&inp.mask, self.dtype)?;
        for (layer, cache) in self.layers.iter().zip(caches) {
            let (q, k, v) = self.project(layer, &h, inp.rope.as_ref())?;
            cache.k.scatter_set(&inp.slots, &k.contiguous()?, 2)?;
            cache.v.scatter_set(&inp.slots, &v.contiguous()?, 2)?;
            let scores = q.matmul(&cache.k.t()?)?.broadcast_add(&mask)?;
            let attn = candle_nn::ops::softmax_last_dim(&scores)?.matmul(&cache.v)?;
            h = self.finish_layer(layer, h, &attn)?;
        }
        match &inp.ids {
            None => Ok(h),
            Some(ids) => Ok(h.index_select(ids, 0)?),
        }
    }

    /// The step's tables, on the host.
    fn host_tables(&self, pos: &[u64], rows: &[usize], t: usize) -> HostTables {
        let (heads, hd, slots) = (self.cfg.num_heads, self.cfg.head_dim(), self.ring_slots);
        let every = rows.len() == pos.len();
        let (rope, sin) = match self.cfg.positional_embedding {
            PositionalEmbedding::Rope => (Some(self.rope_values(pos, t)), None),
            PositionalEmbedding::Sin => (None, Some(self.sin_values(pos, t))),
            PositionalEmbedding::None => (None, None),
        };
        HostTables {
            ids: (!every).then(|| rows.iter().map(|&r| r as u32).collect()),
            rope,
            sin,
            slots: write_slots(pos, rows, t, (heads, hd, slots)),
            mask: step_mask(pos, t, self.cfg.context, slots),
        }
    }

    /// The tables and a contiguous copy of `xs` as new device tensors.
    fn upload(&self, tab: &HostTables, xs: &Tensor) -> Result<StepInputs> {
        let (n, t, d) = xs.dims3()?;
        let (b, dev) = (tab.mask.len() / (t * self.ring_slots), &self.device);
        let (heads, hd, half) = (
            self.cfg.num_heads,
            self.cfg.head_dim(),
            self.cfg.head_dim() / 2,
        );
        let f32s = |v: &[f32], shape: &[usize]| Tensor::from_slice(v, shape, dev);
        Ok(StepInputs {
            x: xs.copy()?,
            ids: match &tab.ids {
                Some(ids) => Some(Tensor::from_slice(ids, n, dev)?),
                None => None,
            },
            rope: match &tab.rope {
                Some((c, s)) => Some((f32s(c, &[b, t, half])?, f32s(s, &[b, t, half])?)),
                None => None,
            },
            sin: match &tab.sin {
                Some(e) => Some(f32s(e, &[b, t, d])?),
                None => None,
            },
            slots: Tensor::from_slice(&tab.slots, (b, heads, t, hd), dev)?,
            mask: f32s(&tab.mask, &[b, 1, t, self.ring_slots])?,
        })
    }

    /// A captured step's buffers: its first inputs, and an output of the rows' shape.
    fn buffers(&self, tab: &HostTables, xs: &Tensor) -> Result<StepBuffers> {
        Ok(StepBuffers {
            inputs: self.upload(tab, xs)?,
            out: Tensor::zeros(xs.shape(), self.dtype, &self.device)?,
        })
    }

    /// Writes a step's tables and input into a captured step's buffers, in place (outside
    /// the graph, before it is replayed).
    fn write(&self, bufs: &StepInputs, tab: &HostTables, xs: &Tensor) -> Result<()> {
        let new = self.upload(tab, xs)?;
        let pairs = [
            (&bufs.x, &new.x),
            (&bufs.slots, &new.slots),
            (&bufs.mask, &new.mask),
        ];
        let rope = match (&bufs.rope, &new.rope) {
            (Some((c, s)), Some((nc, ns))) => vec![(c, nc), (s, ns)],
            _ => vec![],
        };
        let opt = [(&bufs.ids, &new.ids), (&bufs.sin, &new.sin)];
        let opt = opt.iter().filter_map(|(a, b)| a.as_ref().zip(b.as_ref()));
        for (dst, src) in pairs.into_iter().chain(rope).chain(opt) {
            dst.slice_set(src, 0, 0)?;
        }
        Ok(())
    }
}
