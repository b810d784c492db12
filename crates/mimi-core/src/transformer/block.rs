//! The block path: candle's operations over blocks of queries (bf16 or f16 compute, GPUs,
//! the gated feed-forward), each query attending to exactly the keys its window holds, and
//! the key/value rings on the device ([`LayerCache`]) written slot by slot.

use super::fixed;
use super::layer::Layer;
use super::model::Transformer;
use super::positions::{block_len, rope_at, sin_embedding_at};
use super::state::{ring_slot, slot_position, LayerCache, State};
use crate::config::{PositionalEmbedding, TransformerConfig};
use crate::error::{Error, Result};
use crate::kernels::{residual_add, WindowAttention};
use crate::runtime::device::cast;
use candle::{DType, Device, Tensor};

/// Writes keys/values `k`, `v` (b, heads, m, head_dim) for positions `first..first+m` into
/// their ring slots (`position % context`), wrapping around; the last `context` of them if
/// there are more.
fn write_ring(ring: &LayerCache, k: &Tensor, v: &Tensor, first: u64) -> Result<()> {
    let c = ring.k.dim(2)?;
    let m = k.dim(2)?;
    let skip = m.saturating_sub(c);
    let (m, first) = (m - skip, first + skip as u64);
    let start = ring_slot(first, c);
    let head = m.min(c - start);
    for (buf, new) in [(&ring.k, k), (&ring.v, v)] {
        let new = new.narrow(2, skip, m)?;
        buf.slice_set(&new.narrow(2, 0, head)?.contiguous()?, 2, start)?;
        if head < m {
            buf.slice_set(&new.narrow(2, head, m - head)?.contiguous()?, 2, 0)?;
        }
    }
    Ok(())
}

/// Some batch rows' places in a layer's key/value buffers `(batch, heads, context, hd)`, as
/// device index tensors built once per block of [`Transformer::block_rows`]: which rows to
/// read, and which ring slots `t` new keys per row go to. The write scatters along the ring's
/// slot axis, so each (row, head, value) is one thread of `t` steps on a GPU (candle's scatter
/// loops over the indexed axis in each thread: over a flat `(batch * heads * context, hd)` view,
/// 64 threads of `rows * heads * t` steps, about 0.5 ms a buffer at B = 64 on an H200).
pub(super) struct RingRows {
    /// `(rows,)` u32: the rows to read (`None`: every row, in order).
    select: Option<Tensor>,
    /// `(batch,)` u32: each batch row's place among the stepping rows (0 for the others,
    /// whose slots skip the write), to spread the rows' new keys over the batch.
    spread: Option<Tensor>,
    /// `(batch, heads, t, hd)` u32: each new key's ring slot; `u32::MAX` (no write) for the
    /// rows that do not step.
    slots: Tensor,
}

impl RingRows {
    pub(super) fn new(
        rows: &[usize],
        pos: &[u64],
        t: usize,
        caches: &[LayerCache],
        cfg: &TransformerConfig,
        dev: &Device,
    ) -> Result<Self> {
        let (heads, hd) = (cfg.num_heads, cfg.head_dim());
        let batch = caches.first().map_or(Ok(0), |c| c.k.dim(0))?;
        let c = caches.first().map_or(Ok(cfg.context), |c| c.k.dim(2))?;
        if t > c {
            return Err(Error::Internal(
                "a block of more steps than the context".into(),
            ));
        }
        let every = rows.len() == batch && rows.iter().enumerate().all(|(i, &r)| i == r);
        let (select, spread) = match every {
            true => (None, None),
            false => {
                let ids: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
                let mut place = vec![0u32; batch];
                rows.iter()
                    .enumerate()
                    .for_each(|(j, &r)| place[r] = j as u32);
                (
                    Some(Tensor::from_vec(ids, rows.len(), dev)?),
                    Some(Tensor::from_vec(place, batch, dev)?),
                )
            }
        };
        let mut at = vec![0; batch];
        rows.iter().zip(pos).for_each(|(&r, &p)| at[r] = p);
        let slots = fixed::write_slots(&at, rows, t, (heads, hd, c));
        let slots = Tensor::from_vec(slots, (batch, heads, t, hd), dev)?;
        Ok(Self {
            select,
            spread,
            slots,
        })
    }

    /// The rows' part of a whole-batch buffer.
    pub(super) fn select(&self, all: &Tensor) -> Result<Tensor> {
        Ok(match &self.select {
            None => all.clone(),
            Some(ids) => all.index_select(ids, 0)?,
        })
    }

    /// The rows' new keys and values `(rows, heads, t, hd)` into their ring slots, in place.
    pub(super) fn write(&self, ring: &LayerCache, k: &Tensor, v: &Tensor) -> Result<()> {
        for (buf, new) in [(&ring.k, k), (&ring.v, v)] {
            let new = match &self.spread {
                None => new.contiguous()?,
                Some(place) => new.contiguous()?.index_select(place, 0)?,
            };
            buf.scatter_set(&self.slots, &new, 2)?;
        }
        Ok(())
    }
}

impl Transformer {
    /// Rows at different positions (or some rows only), batched: the input in blocks of
    /// `block_len` steps, each one pass of [`Self::block_rows`].
    pub(super) fn uneven(
        &self,
        state: &mut State,
        xs: &Tensor,
        rows: &[usize],
        cancel: Option<&std::sync::atomic::AtomicBool>,
    ) -> Result<Tensor> {
        if self.planned() {
            return self.step_rows(state, xs, rows, cancel);
        }
        let t = xs.dim(1)?;
        let block = block_len(self.cfg.context).min(self.cfg.context);
        let mut outs = Vec::with_capacity(t.div_ceil(block));
        let mut start = 0;
        while start < t {
            crate::error::check_cancel(cancel)?;
            let len = block.min(t - start);
            let x = xs.narrow(1, start, len)?.contiguous()?;
            if self.takes_fixed_step(len) {
                let pos = state.pos.clone();
                outs.push(self.step_fixed(&pos, rows, state.rings_and_graphs(), &x)?);
            } else {
                let pos: Vec<u64> = rows.iter().map(|&r| state.pos[r]).collect();
                outs.push(self.block_rows(&pos, rows, state.device_rings(), &x)?);
            }
            rows.iter().for_each(|&r| state.pos[r] += len as u64);
            start += len;
        }
        match outs.len() {
            1 => Ok(outs.remove(0)),
            _ => Ok(Tensor::cat(&outs, 1)?),
        }
    }

    /// All rows at position `pos`: the input in blocks of `block_len` steps.
    pub(super) fn blocks(
        &self,
        pos: u64,
        state: &mut State,
        xs: &Tensor,
        cancel: Option<&std::sync::atomic::AtomicBool>,
    ) -> Result<Tensor> {
        let t = xs.dim(1)?;
        let block = block_len(self.cfg.context);
        let mut outs = Vec::with_capacity(t.div_ceil(block));
        let mut start = 0;
        while start < t {
            crate::error::check_cancel(cancel)?;
            let len = block.min(t - start);
            let p = pos + start as u64;
            let x = xs.narrow(1, start, len)?;
            if self.takes_fixed_step(len) {
                let b = x.dim(0)?;
                let all: Vec<usize> = (0..b).collect();
                outs.push(self.step_fixed(&vec![p; b], &all, state.rings_and_graphs(), &x)?);
            } else {
                outs.push(self.forward_block(p, state.device_rings(), &x)?);
            }
            start += len;
        }
        if outs.len() == 1 {
            return Ok(outs.remove(0));
        }
        Ok(Tensor::cat(&outs, 1)?)
    }

    /// cos/sin of the rotary angles for positions `p..p+t` of each row's `p` in `pos`,
    /// `(rows, t, head_dim/2)` in f32: one host buffer each, one copy to the device.
    pub(super) fn rope_tables(&self, pos: &[u64], t: usize) -> Result<(Tensor, Tensor)> {
        let (cos, sin) = self.rope_values(pos, t);
        let shape = (pos.len(), t, self.cfg.head_dim() / 2);
        Ok((
            Tensor::from_vec(cos, shape, &self.device)?,
            Tensor::from_vec(sin, shape, &self.device)?,
        ))
    }

    /// [`Self::rope_tables`]' values on the host.
    pub(super) fn rope_values(&self, pos: &[u64], t: usize) -> (Vec<f32>, Vec<f32>) {
        let half = self.cfg.head_dim() / 2;
        let n = pos.len() * t * half;
        let (mut cos, mut sin) = (vec![0f32; n], vec![0f32; n]);
        let tokens = pos.iter().flat_map(|&p| p..p + t as u64);
        let pairs = cos.chunks_exact_mut(half).zip(sin.chunks_exact_mut(half));
        for (p, (c, s)) in tokens.zip(pairs) {
            rope_at(&self.cfg, p, c, s);
        }
        (cos, sin)
    }

    /// Sinusoidal embeddings `[cos(p f), sin(p f)]` for positions `p..p+t` of each row's `p`
    /// in `pos`, `(rows, t, d)`.
    pub(super) fn sin_embedding(&self, pos: &[u64], t: usize) -> Result<Tensor> {
        let e = self.sin_values(pos, t);
        let e = Tensor::from_vec(e, (pos.len(), t, self.cfg.d_model), &self.device)?;
        Ok(cast(&e, self.dtype)?)
    }

    /// [`Self::sin_embedding`]'s values on the host, in f32.
    pub(super) fn sin_values(&self, pos: &[u64], t: usize) -> Vec<f32> {
        let d = self.cfg.d_model;
        let mut out = vec![0f32; pos.len() * t * d];
        let tokens = pos.iter().flat_map(|&p| p..p + t as u64);
        for (p, row) in tokens.zip(out.chunks_exact_mut(d)) {
            let (c, s) = row.split_at_mut(d / 2);
            sin_embedding_at(&self.cfg, p, c, s);
        }
        out
    }

    /// Additive mask for `t` queries at `pos..pos+t` over `n_old` cached keys (ring slots
    /// `0..n_old`) followed by the `t` new keys: 0 where `0 <= q - k < context`, -inf else.
    pub(super) fn chunk_mask(&self, pos: u64, t: usize, n_old: usize) -> Result<Tensor> {
        let c = self.cfg.context as u64;
        let keys = self.key_positions(pos, t, n_old);
        let n = keys.len();
        let mut mask = Vec::with_capacity(t * n);
        for i in 0..t as u64 {
            let q = pos + i;
            mask.extend(keys.iter().map(|&k| {
                if k <= q && q - k < c {
                    0f32
                } else {
                    f32::NEG_INFINITY
                }
            }));
        }
        Ok(cast(
            &Tensor::from_vec(mask, (t, n), &self.device)?,
            self.dtype,
        )?)
    }

    /// The positions of the keys a block of `t` steps from `pos` attends to: the ring's
    /// `n_old` slots (slot `j` holds the last position `≡ j` mod `context` before `pos`),
    /// then the block's own.
    pub(super) fn key_positions(&self, pos: u64, t: usize, n_old: usize) -> Vec<u64> {
        let key_pos = |j: usize| -> u64 {
            match j >= n_old {
                true => pos + (j - n_old) as u64,
                // n_old <= pos: every one of these slots holds a position already
                false => slot_position(j, pos, self.ring_slots) as u64,
            }
        };
        (0..n_old + t).map(key_pos).collect()
    }

    pub(super) fn rope(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        if self.dtype == DType::F32 {
            Ok(candle_nn::rotary_emb::rope_i(x, cos, sin)?)
        } else {
            Ok(
                candle_nn::rotary_emb::rope_i(&x.to_dtype(DType::F32)?, cos, sin)?
                    .to_dtype(self.dtype)?,
            )
        }
    }

    /// Scaled queries, keys and values of `xs` (b, t, d) as (b, heads, t, head_dim), with
    /// the rotary angles `rope` applied.
    pub(super) fn project(
        &self,
        layer: &Layer,
        xs: &Tensor,
        rope: Option<&(Tensor, Tensor)>,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let (b, t, _) = xs.dims3()?;
        let (h, hd) = (self.cfg.num_heads, self.cfg.head_dim());
        let qkv = xs
            .apply(&layer.norm1)?
            .apply(&layer.attn.qkv)?
            .reshape((b, t, 3, h, hd))?
            .permute((2, 0, 3, 1, 4))?
            .contiguous()?;
        let (mut q, mut k, v) = (qkv.get(0)?, qkv.get(1)?, qkv.get(2)?);
        if let Some((cos, sin)) = rope {
            q = self.rope(&q, cos, sin)?;
            k = self.rope(&k, cos, sin)?;
        }
        Ok(((q * (hd as f64).powf(-0.5))?, k, v))
    }

    /// The rest of a layer once attention gave `attn` (b, heads, t, head_dim): the output
    /// projection, layer scale and residual, then the MLP block with its own.
    pub(super) fn finish_layer(&self, layer: &Layer, xs: Tensor, attn: &Tensor) -> Result<Tensor> {
        let (b, _, t, _) = attn.dims4()?;
        let attn = attn
            .transpose(1, 2)?
            .reshape((b, t, self.cfg.d_model))?
            .apply(&layer.attn.out)?;
        let xs = residual_add(&xs, &attn, layer.ls1.as_ref())?;
        let ff = xs.apply(&layer.norm2)?.apply(&layer.mlp)?;
        Ok(residual_add(&xs, &ff, layer.ls2.as_ref())?)
    }

    /// Positions for `t` steps of rows starting at `pos` (one each): the rotary tables
    /// (n, t, hd/2), or `xs` (n, t, d) with its sinusoidal embeddings added.
    pub(super) fn embed_rows(
        &self,
        pos: &[u64],
        t: usize,
        xs: &Tensor,
    ) -> Result<(Option<(Tensor, Tensor)>, Tensor)> {
        match self.cfg.positional_embedding {
            PositionalEmbedding::Rope => Ok((Some(self.rope_tables(pos, t)?), xs.clone())),
            PositionalEmbedding::Sin => Ok((None, xs.broadcast_add(&self.sin_embedding(pos, t)?)?)),
            PositionalEmbedding::None => Ok((None, xs.clone())),
        }
    }

    /// Additive mask (n, 1, t, slots + t) for `t` queries of rows at `pos` over the first
    /// `slots` slots of their rings followed by the `t` new keys: 0 where the key's position
    /// `k` is one the query at `q` sees (`0 <= q - k < context`), -inf else. Ring slot `j` of a row at `p` holds the
    /// position `k < p` with `k = j (mod context)`, if there is one (a young or freshly reset
    /// row has stale or empty slots, which the mask hides).
    pub(super) fn rows_mask(&self, pos: &[u64], t: usize, slots: usize) -> Result<Tensor> {
        let c = self.cfg.context as i64;
        let mut mask = Vec::with_capacity(pos.len() * t * (slots + t));
        for &pos in pos {
            let ring = (0..slots).map(|j| slot_position(j, pos, self.ring_slots));
            let p = pos as i64;
            let keys: Vec<i64> = ring.chain((0..t as i64).map(|i| p + i)).collect();
            for q in (0..t as i64).map(|i| p + i) {
                mask.extend(keys.iter().map(|&k| {
                    if k >= 0 && k <= q && q - k < c {
                        0f32
                    } else {
                        f32::NEG_INFINITY
                    }
                }));
            }
        }
        let mask = Tensor::from_vec(mask, (pos.len(), 1, t, slots + t), &self.device)?;
        Ok(cast(&mask, self.dtype)?)
    }

    /// One block of `t <= context` steps for the batch rows `rows`, each at its own position
    /// `pos[i]`. Every operation covers all the rows at once (a GPU launches a few kernels
    /// per layer, not a few per row): the rows' rings are gathered, attention runs over the
    /// ring slots the oldest row has filled plus the new keys, masked per row, and the new
    /// keys are scattered into the rings once every layer succeeded.
    pub(super) fn block_rows(
        &self,
        pos: &[u64],
        rows: &[usize],
        caches: &[LayerCache],
        xs: &Tensor,
    ) -> Result<Tensor> {
        let t = xs.dim(1)?;
        let (rope, mut xs) = self.embed_rows(pos, t, xs)?;
        // Slots at or past a young row's position hold nothing for it: attend over the slots
        // the oldest row has filled, as an unmasked step attends over its `pos` keys.
        let slots = pos
            .iter()
            .map(|&p| p.min(self.ring_slots as u64) as usize)
            .max()
            .unwrap_or(0);
        let mask = self.rows_mask(pos, t, slots)?;
        let gather = RingRows::new(rows, pos, t, caches, &self.cfg, &self.device)?;
        let old = |ring: &Tensor, new: &Tensor| -> Result<Tensor> {
            Ok(match slots {
                0 => new.clone(), // no empty tensor: CUDA refuses its kernels
                _ => Tensor::cat(&[&gather.select(ring)?.narrow(2, 0, slots)?, new], 2)?,
            })
        };
        let mut pending = Vec::with_capacity(caches.len());
        for (layer, cache) in self.layers.iter().zip(caches) {
            let (q, k, v) = self.project(layer, &xs, rope.as_ref())?;
            let (keys, vals) = (old(&cache.k, &k)?, old(&cache.v, &v)?);
            let scores = q.matmul(&keys.t()?)?.broadcast_add(&mask)?;
            let attn = candle_nn::ops::softmax_last_dim(&scores)?.matmul(&vals)?;
            pending.push((k, v));
            xs = self.finish_layer(layer, xs, &attn)?;
        }
        for (cache, (k, v)) in caches.iter().zip(pending) {
            gather.write(cache, &k, &v)?;
        }
        Ok(xs)
    }

    /// One block of `t` steps for rows that all stand at `pos`, over their buffers `caches`
    /// (written in place).
    pub(super) fn forward_block(
        &self,
        pos: u64,
        caches: &[LayerCache],
        xs: &Tensor,
    ) -> Result<Tensor> {
        let cfg = &self.cfg;
        let t = xs.dim(1)?;
        let c = cfg.context;
        let cpos = c as u64;
        let rope = match cfg.positional_embedding {
            PositionalEmbedding::Rope => {
                let (cos, sin) = self.rope_tables(&[pos], t)?;
                Some((cos.squeeze(0)?, sin.squeeze(0)?))
            }
            _ => None,
        };
        let mut xs = match cfg.positional_embedding {
            PositionalEmbedding::Sin => xs.broadcast_add(&self.sin_embedding(&[pos], t)?)?,
            _ => xs.clone(),
        };
        let n_old = pos.min(self.ring_slots as u64) as usize;
        // On the CPU in f32, the window kernel; elsewhere candle's masked products.
        // One step's query sees every filled slot only while the rings hold `context` slots.
        let masked = t > 1 || self.ring_slots != c;
        let window = (masked && self.device.is_cpu() && self.dtype == DType::F32)
            .then(|| WindowAttention::new(pos, t, c, self.key_positions(pos, t, n_old)));
        let mask = if masked && window.is_none() {
            Some(self.chunk_mask(pos, t, n_old)?)
        } else {
            None
        };
        // New keys/values to write into the rings once every layer succeeded (t > 1).
        let mut pending: Vec<(Tensor, Tensor)> = Vec::new();
        for (layer, cache) in self.layers.iter().zip(caches.iter()) {
            let (q, k, v) = self.project(layer, &xs, rope.as_ref())?;
            let attn = if t == 1 && self.ring_slots == c {
                // Slot pos % C holds position pos - C, which no query from pos on needs,
                // so writing before the other layers ran is safe.
                let slot = ring_slot(pos, c);
                cache.k.slice_set(&k, 2, slot)?;
                cache.v.slice_set(&v, 2, slot)?;
                let n = (pos + 1).min(cpos) as usize;
                let keys = cache.k.narrow(2, 0, n)?;
                let vals = cache.v.narrow(2, 0, n)?;
                let w = candle_nn::ops::softmax_last_dim(&q.matmul(&keys.t()?)?)?;
                w.matmul(&vals)?
            } else {
                let m = t.min(c);
                pending.push((k.narrow(2, t - m, m)?, v.narrow(2, t - m, m)?));
                match &window {
                    // The rings are read in place, the new rows from one small stack.
                    Some(op) => {
                        Tensor::stack(&[&q, &k, &v], 0)?.apply_op3_no_bwd(&cache.k, &cache.v, op)?
                    }
                    None => {
                        let (keys, vals) = if n_old == 0 {
                            (k, v)
                        } else {
                            (
                                Tensor::cat(&[&cache.k.narrow(2, 0, n_old)?, &k], 2)?,
                                Tensor::cat(&[&cache.v.narrow(2, 0, n_old)?, &v], 2)?,
                            )
                        };
                        let scores = q.matmul(&keys.t()?)?;
                        let scores = match &mask {
                            Some(m) => scores.broadcast_add(m)?,
                            None => scores,
                        };
                        candle_nn::ops::softmax_last_dim(&scores)?.matmul(&vals)?
                    }
                }
            };
            xs = self.finish_layer(layer, xs, &attn)?;
        }
        // Commit the new keys/values into their slots.
        for (cache, (k, v)) in caches.iter().zip(pending) {
            write_ring(cache, &k, &v, pos + (t - k.dim(2)?) as u64)?;
        }
        Ok(xs)
    }
}
