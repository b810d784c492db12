//! Position rules both paths share: the block length, the rotary angles and the sinusoidal
//! embedding at an absolute position, computed in f64 so a stream never ends.

use crate::config::TransformerConfig;

/// Queries processed per internal block when a call is longer than this; results do not
/// depend on it (the computation is chunk-invariant), only memory does.
pub(super) fn block_len(context: usize) -> usize {
    context.max(64)
}

/// The rotary angles' cos and sin at position `p`, one per interleaved pair of a head
/// (`head_dim / 2` each), in f64 from the absolute position: the one rule of both paths.
pub(super) fn rope_at(cfg: &TransformerConfig, p: u64, cos: &mut [f32], sin: &mut [f32]) {
    let (theta, hd) = (cfg.max_period as f64, cfg.head_dim());
    for (j, (c, s)) in cos.iter_mut().zip(sin.iter_mut()).enumerate() {
        let a = p as f64 * (1.0 / theta.powf((2 * j) as f64 / hd as f64));
        (*c, *s) = (a.cos() as f32, a.sin() as f32);
    }
}

/// The sinusoidal embedding of position `p`: `cos` and `sin` (`d_model / 2` each) of its
/// angles, in f64 from the absolute position: the one rule of both paths.
pub(super) fn sin_embedding_at(cfg: &TransformerConfig, p: u64, cos: &mut [f32], sin: &mut [f32]) {
    let theta = cfg.max_period as f64;
    let half = cfg.d_model / 2;
    for (j, (c, s)) in cos.iter_mut().zip(sin.iter_mut()).enumerate() {
        let a = p as f64 * (1.0 / theta.powf(j as f64 / (half - 1) as f64));
        (*c, *s) = (a.cos() as f32, a.sin() as f32);
    }
}

/// The most tokens a fixed-shape step takes (two codec frames of the 25 Hz transformer);
/// longer calls take the block path, over the same rings.
pub(super) const STEP_TOKENS: usize = 4;

/// Ring slots per layer and row on the candle path: `context`, plus room for a step's new
/// keys when the fixed-shape step is on, rounded up to a multiple of 16 (256 for Mimi's 250:
/// on the CPU, candle's bf16 products over 253 slots took 1.35x the time of 256 at B = 1).
pub(super) fn ring_slots(context: usize, fixed_step: bool) -> usize {
    match fixed_step {
        true => (context + STEP_TOKENS - 1).next_multiple_of(16),
        false => context,
    }
}
