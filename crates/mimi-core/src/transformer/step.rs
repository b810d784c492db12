//! The planned step: an f32 transformer on the CPU, computed on host slices for a set of
//! rows, each a few tokens from its own position. Every product runs once over all the
//! rows' tokens (the packed weights); each row's norms, rotary angles and attention are its
//! own, so a row's bits do not depend on which other rows step or how many tokens a call
//! holds. The rings are the stream's ([`State`]); the working buffers are the caller's
//! ([`Workspace`], out of the state), sized at the first call of a shape and reused:
//! `Transformer::step_host` allocates nothing once warm (the `Tensor` entry point allocates
//! its output and a workspace of its own).
//!
//! Attention writes each token's key and value into its ring slot (`position % context`)
//! and then reads the slots its window holds, token by token, so a call of any length
//! keeps the exact window (docs/correctness.md).

use super::layer::{add_scaled, FeedForward, HostParams, Layer};
use super::model::Transformer;
use super::positions::{block_len, rope_at, sin_embedding_at};
use super::state::{ring_slot, Rings, State};
use super::step_buffers::{HostRing, Workspace};
use crate::config::PositionalEmbedding;
use crate::error::{Error, Result};
use crate::kernels::{attend_visible, gelu_erf_slice};
use candle::{CpuStorage, Tensor};

/// Grows `v` to at least `n` values (never shrinks: after the first call of a shape, no
/// allocation) and returns its first `n`.
fn take(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}

/// A raw pointer that tasks writing disjoint parts of one buffer may share.
#[derive(Clone, Copy)]
struct Shared(*mut f32);
// SAFETY: every task writes a part no other task touches (see `attend_rows`).
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

impl Shared {
    /// `len` values from `offset` (a method, so that closures capture the whole `Shared`).
    ///
    /// # Safety
    /// The range lies in the buffer, and no one else uses it while the slice lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice(&self, offset: usize, len: usize) -> &mut [f32] {
        std::slice::from_raw_parts_mut(self.0.add(offset), len)
    }
}

impl Transformer {
    /// Whether calls take the planned step: an f32 model on the CPU whose layers all have
    /// host parameters, with rotary, sinusoidal or no positional embedding.
    pub(super) fn planned(&self) -> bool {
        self.layers.iter().all(|l| l.host.is_some())
    }

    /// `xs` (n, t, d) for the batch rows `rows` (n of them, sorted, distinct), each from its
    /// own position, through every layer; advances those rows.
    pub(super) fn step_rows(
        &self,
        state: &mut State,
        xs: &Tensor,
        rows: &[usize],
        cancel: Option<&std::sync::atomic::AtomicBool>,
    ) -> Result<Tensor> {
        let (n, t, d) = xs.dims3()?;
        let xs = xs.contiguous()?;
        let (storage, layout) = xs.storage_and_layout();
        let (candle::Storage::Cpu(CpuStorage::F32(v)), Some((a, b))) =
            (&*storage, layout.contiguous_offsets())
        else {
            return Err(Error::Internal(
                "the planned step takes f32 CPU input".into(),
            ));
        };
        let (mut out, mut ws) = (vec![0f32; n * t * d], Workspace::new());
        self.step_host(state, &mut ws, &v[a..b], rows, &mut out, cancel)?;
        Ok(Tensor::from_vec(out, (n, t, d), &self.device)?)
    }

    /// The planned step on host values: `x` holds `t` tokens of `d_model` values for each
    /// of the batch rows `rows` (sorted, distinct, below the started state's batch size),
    /// row after row; `out` (the same length) gets the outputs, and those rows advance by
    /// `t`. It computes in the caller's workspace `ws` (any one: the results do not depend
    /// on it), and once `ws` has seen a call of this shape it allocates nothing (a test
    /// counts). Refused before anything changes: a model that does not take the planned
    /// step, a state not started ([`Transformer::start`]), rows out of order or range,
    /// lengths that do not match.
    pub fn step_host(
        &self,
        state: &mut State,
        ws: &mut Workspace,
        x: &[f32],
        rows: &[usize],
        out: &mut [f32],
        cancel: Option<&std::sync::atomic::AtomicBool>,
    ) -> Result<()> {
        let (d, n) = (self.cfg.d_model, rows.len());
        let t = self.check_host_call(state, rows, (x.len(), out.len()))?;
        let State { pos, rings, .. } = state;
        let Rings::Host(host) = rings else {
            return Err(Error::Internal(
                "the planned step needs its host rings".into(),
            ));
        };
        let block = block_len(self.cfg.context);
        let mut start = 0;
        while start < t {
            crate::error::check_cancel(cancel)?;
            let len = block.min(t - start);
            let xb = take(&mut ws.x, n * len * d);
            for i in 0..n {
                let src = &x[(i * t + start) * d..][..len * d];
                xb[i * len * d..][..len * d].copy_from_slice(src);
            }
            self.step_block(pos, &mut host.layers, ws, rows, len)?;
            let xb = &ws.x;
            for i in 0..n {
                let dst = &mut out[(i * t + start) * d..][..len * d];
                dst.copy_from_slice(&xb[i * len * d..][..len * d]);
            }
            rows.iter().for_each(|&r| pos[r] += len as u64);
            start += len;
        }
        Ok(())
    }

    /// [`Self::step_host`]'s checks, before anything changes; the tokens per row.
    fn check_host_call(
        &self,
        state: &State,
        rows: &[usize],
        (x_len, out_len): (usize, usize),
    ) -> Result<usize> {
        let d = self.cfg.d_model;
        let batch = state.batch().unwrap_or(0);
        if !self.planned() {
            return Err(Error::InvalidInput(
                "the host step takes an f32 model on the CPU without gating".into(),
            ));
        }
        if !self.state_fits(state) {
            return Err(Error::IncompatibleState(
                "this state was made by a model of another shape or kind".into(),
            ));
        }
        let ordered = rows.windows(2).all(|w| w[0] < w[1]);
        if rows.is_empty() || !ordered || rows.iter().any(|&r| r >= batch) {
            return Err(Error::Shape(format!(
                "rows must be sorted, distinct and below the stream's batch size {batch}, got {rows:?}"
            )));
        }
        let per_token = rows.len() * d;
        if !x_len.is_multiple_of(per_token) || out_len != x_len {
            return Err(Error::Shape(format!(
                "x and out must both hold t x {} rows x {d} values, got {x_len} and {out_len}",
                rows.len(),
            )));
        }
        Ok(x_len / per_token)
    }

    /// One block of `t` tokens per row, from `scratch.x` (rows × t, d) into itself, through
    /// each layer's `rings`.
    fn step_block(
        &self,
        pos: &[u64],
        rings: &mut [HostRing],
        scratch: &mut Workspace,
        rows: &[usize],
        t: usize,
    ) -> Result<()> {
        let (d, m) = (self.cfg.d_model, rows.len() * t);
        scratch.pos.clear();
        for &r in rows {
            scratch.pos.extend((0..t as u64).map(|i| pos[r] + i));
        }
        self.positions(scratch, m)?;
        if rings.len() != self.layers.len() {
            return Err(Error::Internal(
                "the planned step needs its host rings".into(),
            ));
        }
        for (layer, ring) in self.layers.iter().zip(rings.iter_mut()) {
            let host = layer.host.as_ref().ok_or_else(not_planned)?;
            host.norm1
                .apply(&scratch.x[..m * d], take(&mut scratch.h, m * d));
            let qkv = take(&mut scratch.qkv, m * 3 * d);
            product(&layer.attn.qkv, &scratch.h[..m * d], m, qkv)?;
            self.rotate(scratch, m);
            self.attend_rows(ring, scratch, rows, t)?;
            let h = take(&mut scratch.h, m * d);
            product(&layer.attn.out, &scratch.attn[..m * d], m, h)?;
            add_scaled(&mut scratch.x[..m * d], h, host.ls1.as_deref());
            self.feed_forward(layer, host, scratch, m)?;
        }
        Ok(())
    }

    /// The feed-forward block with its residual: `x += ls2 * fc2(gelu(fc1(norm2(x))))`.
    fn feed_forward(
        &self,
        layer: &Layer,
        host: &HostParams,
        scratch: &mut Workspace,
        m: usize,
    ) -> Result<()> {
        let (d, f) = (self.cfg.d_model, self.cfg.dim_feedforward);
        let FeedForward::Plain { fc1, fc2 } = &layer.mlp else {
            return Err(not_planned());
        };
        host.norm2
            .apply(&scratch.x[..m * d], take(&mut scratch.h, m * d));
        let ff = take(&mut scratch.ff, m * f);
        product(fc1, &scratch.h[..m * d], m, ff)?;
        let hidden = take(&mut scratch.attn, m * f);
        gelu_erf_slice(ff, hidden);
        let h = take(&mut scratch.h, m * d);
        product(fc2, &scratch.attn[..m * f], m, h)?;
        add_scaled(&mut scratch.x[..m * d], h, host.ls2.as_deref());
        Ok(())
    }

    /// Per token: the rotary cos/sin of its position, or its sinusoidal embedding added to
    /// `x` (the angles in f64 from the absolute position, as the block path computes them).
    fn positions(&self, scratch: &mut Workspace, m: usize) -> Result<()> {
        match self.cfg.positional_embedding {
            PositionalEmbedding::Rope => {
                let half = self.cfg.head_dim() / 2;
                let (cos, sin) = (
                    take(&mut scratch.cos, m * half),
                    take(&mut scratch.sin, m * half),
                );
                let pairs = cos.chunks_exact_mut(half).zip(sin.chunks_exact_mut(half));
                for (&p, (c, s)) in scratch.pos.iter().zip(pairs) {
                    rope_at(&self.cfg, p, c, s);
                }
            }
            PositionalEmbedding::Sin => {
                let (d, half) = (self.cfg.d_model, self.cfg.d_model / 2);
                // The embedding goes through the angle buffers (`d / 2` each per token).
                let (cos, sin) = (take(&mut scratch.cos, half), take(&mut scratch.sin, half));
                for (xr, &p) in scratch.x.chunks_exact_mut(d).zip(&scratch.pos) {
                    sin_embedding_at(&self.cfg, p, cos, sin);
                    let (lo, hi) = xr.split_at_mut(half);
                    lo.iter_mut().zip(&*cos).for_each(|(x, c)| *x += c);
                    hi.iter_mut().zip(&*sin).for_each(|(x, s)| *x += s);
                }
            }
            PositionalEmbedding::None => {}
        }
        Ok(())
    }

    /// Rotates q and k of every token by its angles (interleaved pairs, candle's `rope_i`)
    /// and scales q by `head_dim^-1/2`.
    fn rotate(&self, scratch: &mut Workspace, m: usize) {
        let (d, hd) = (self.cfg.d_model, self.cfg.head_dim());
        let half = hd / 2;
        let scale = (hd as f64).powf(-0.5) as f32;
        let rope = self.cfg.positional_embedding == PositionalEmbedding::Rope;
        for (i, tok) in scratch.qkv[..m * 3 * d].chunks_exact_mut(3 * d).enumerate() {
            let (q, kv) = tok.split_at_mut(d);
            if rope {
                let (cos, sin) = (
                    &scratch.cos[i * half..][..half],
                    &scratch.sin[i * half..][..half],
                );
                for head in q.chunks_exact_mut(hd).chain(kv[..d].chunks_exact_mut(hd)) {
                    for (pair, (&c, &s)) in head.chunks_exact_mut(2).zip(cos.iter().zip(sin)) {
                        let (x0, x1) = (pair[0], pair[1]);
                        pair[0] = x0 * c - x1 * s;
                        pair[1] = x0 * s + x1 * c;
                    }
                }
            }
            q.iter_mut().for_each(|v| *v *= scale);
        }
    }

    /// Each (row, head) in parallel: for each of the row's `t` tokens in order, its key and
    /// value into their ring slot, then its query over the slots its window holds.
    fn attend_rows(
        &self,
        ring: &mut HostRing,
        scratch: &mut Workspace,
        rows: &[usize],
        t: usize,
    ) -> Result<()> {
        let (d, hd, heads, c) = (
            self.cfg.d_model,
            self.cfg.head_dim(),
            self.cfg.num_heads,
            self.cfg.context,
        );
        let m = rows.len() * t;
        let attn = Shared(take(&mut scratch.attn, m * d).as_mut_ptr());
        let scores = Shared(take(&mut scratch.scores, rows.len() * heads * c).as_mut_ptr());
        let (qkv, pos) = (&scratch.qkv[..m * 3 * d], &scratch.pos[..m]);
        let len = ring.k.len().min(ring.v.len());
        if len < (rows.iter().max().map_or(0, |r| r + 1)) * heads * c * hd {
            return Err(Error::Internal("the key/value rings are too small".into()));
        }
        let (kp, vp) = (Shared(ring.k.as_mut_ptr()), Shared(ring.v.as_mut_ptr()));
        let task = |task: usize| {
            let (i, h) = (task / heads, task % heads);
            let ring = (rows[i] * heads + h) * c * hd;
            // SAFETY: rows are distinct, so each task's ring region, score region and
            // output columns (its row's tokens, its head's hd) are its own; all lie
            // within the buffers checked or sized above.
            let (kr, vr, s) = unsafe {
                (
                    kp.slice(ring, c * hd),
                    vp.slice(ring, c * hd),
                    scores.slice(task * c, c),
                )
            };
            for j in 0..t {
                let tok = i * t + j;
                let p = pos[tok];
                let slot = ring_slot(p, c) * hd;
                let new = &qkv[tok * 3 * d..][..3 * d];
                kr[slot..slot + hd].copy_from_slice(&new[d + h * hd..][..hd]);
                vr[slot..slot + hd].copy_from_slice(&new[2 * d + h * hd..][..hd]);
                let n = (p + 1).min(c as u64) as usize;
                // SAFETY: as above.
                let out = unsafe { attn.slice(tok * d + h * hd, hd) };
                attend_visible(&new[h * hd..][..hd], &kr[..n * hd], &vr[..n * hd], s, out);
            }
        };
        let tasks = rows.len() * heads;
        if tasks > 1 && rayon::current_num_threads() > 1 {
            crate::kernels::for_each_index(tasks, task);
        } else {
            (0..tasks).for_each(task);
        }
        Ok(())
    }
}

fn not_planned() -> Error {
    Error::Internal("the planned step needs host parameters in every layer".into())
}

/// `y = x W^T + b` with the packed product.
fn product(l: &crate::kernels::Linear, x: &[f32], m: usize, y: &mut [f32]) -> Result<()> {
    match l.matmul_into(x, m, y) {
        true => Ok(()),
        false => Err(not_planned()),
    }
}
