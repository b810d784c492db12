//! The Mimi streaming transformer, computed with candle, with a streaming state we own.
//!
//! Reused from candle-transformers' `mimi::transformer`: `Config`, `Norm` (layer/rms norm),
//! `Mlp` (plain or gated), `LayerScale`, and the weight names; from candle-nn: `Linear`,
//! `rope_i`, `softmax_last_dim`. Owned here: the self-attention and its state, because
//! candle's is private and wrong in four ways (see docs/correctness.md):
//!
//! * the window is exact: every query at absolute position `p` attends to keys
//!   `max(0, p-C+1)..=p` (`C = context`), whatever the chunking of the input;
//! * the state is `(position, per-layer ring buffers of the last C keys/values)`;
//!   `deep_copy` copies all of it, `reset` returns to a fresh state;
//! * rotary and sinusoidal angles are computed from the absolute position in f64, with no
//!   `max_seq_len` table, so a stream never ends; memory is bounded by `context`.
//!
//! The model itself (weights) is immutable and shared between clones.
//!
//! An f32 model on the CPU with the plain feed-forward block computes every call with the
//! planned step (`step.rs`: host buffers, packed products, each row's attention over its own
//! ring); the block path (`block.rs`: candle's ops and the window kernel) serves the others:
//! bf16 or f16 compute, GPUs, the gated feed-forward. This file only declares: the modules
//! import from each other, never from here, and no two import each other.

mod block;
mod compat;
mod fixed;
mod layer;
mod model;
mod positions;
mod state;
mod step;
mod step_buffers;
mod step_graphs;

pub use model::Transformer;
pub use state::State;
pub use step_buffers::Workspace;

#[cfg(test)]
mod tests;
