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
//! * the per-step tables (mask, rotary angles, write slots) are built on the host in one
//!   buffer each and copied to the device once per step.
//!
//! `MIMI_PY_FIXED_STEP=0` keeps the earlier paths (rings of `context` slots, attention over
//! the filled slots, masked rows gathered and scattered) for comparison.

use super::model::Transformer;
use super::positions::STEP_TOKENS;
use super::state::{ring_slot, slot_position, LayerCache};
use crate::config::PositionalEmbedding;
use crate::error::Result;
use crate::runtime::device::cast;
use candle::{Device, Tensor};

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

impl Transformer {
    /// Whether a call of `t` tokens takes the fixed-shape step.
    pub(super) fn takes_fixed_step(&self, t: usize) -> bool {
        self.fixed_step && (1..=STEP_TOKENS).contains(&t)
    }

    /// One step of `t <= STEP_TOKENS` tokens for the batch rows `rows` (sorted, distinct;
    /// `xs` holds theirs, `(rows.len(), t, d)`), each at its position in `pos` (one per batch
    /// row), over the rings `caches`, written in place. Returns the rows' outputs; the
    /// caller advances their positions.
    pub(super) fn step_fixed(
        &self,
        pos: &[u64],
        rows: &[usize],
        caches: &[LayerCache],
        xs: &Tensor,
    ) -> Result<Tensor> {
        let (n, t, d) = xs.dims3()?;
        let b = pos.len();
        let dev = &self.device;
        let every = n == b;
        let ids = Tensor::from_vec(rows.iter().map(|&r| r as u32).collect(), n, dev)?;
        let mut h = match every {
            true => xs.clone(),
            false => Tensor::zeros((b, t, d), xs.dtype(), dev)?.index_add(&ids, xs, 0)?,
        };
        let rope = match self.cfg.positional_embedding {
            PositionalEmbedding::Rope => Some(self.rope_tables(pos, t)?),
            PositionalEmbedding::Sin => {
                h = h.broadcast_add(&self.sin_embedding(pos, t)?)?;
                None
            }
            PositionalEmbedding::None => None,
        };
        let (slots, mask) = self.step_tables(pos, rows, t, dev)?;
        for (layer, cache) in self.layers.iter().zip(caches) {
            let (q, k, v) = self.project(layer, &h, rope.as_ref())?;
            cache.k.scatter_set(&slots, &k.contiguous()?, 2)?;
            cache.v.scatter_set(&slots, &v.contiguous()?, 2)?;
            let scores = q.matmul(&cache.k.t()?)?.broadcast_add(&mask)?;
            let attn = candle_nn::ops::softmax_last_dim(&scores)?.matmul(&cache.v)?;
            h = self.finish_layer(layer, h, &attn)?;
        }
        match every {
            true => Ok(h),
            false => Ok(h.index_select(&ids, 0)?),
        }
    }

    /// The step's write slots `(batch, heads, t, hd)` (u32) and mask `(batch, 1, t, slots)`
    /// (in the model's dtype) on the device.
    fn step_tables(
        &self,
        pos: &[u64],
        rows: &[usize],
        t: usize,
        dev: &Device,
    ) -> Result<(Tensor, Tensor)> {
        let (heads, hd, slots) = (self.cfg.num_heads, self.cfg.head_dim(), self.ring_slots);
        let b = pos.len();
        let write = write_slots(pos, rows, t, (heads, hd, slots));
        let write = Tensor::from_vec(write, (b, heads, t, hd), dev)?;
        let mask = step_mask(pos, t, self.cfg.context, slots);
        let mask = Tensor::from_vec(mask, (b, 1, t, slots), dev)?;
        Ok((write, cast(&mask, self.dtype)?))
    }
}
