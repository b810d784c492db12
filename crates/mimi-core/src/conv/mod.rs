//! Mimi's convolutions computed natively on the CPU in f32: the causal convolution and
//! transposed convolution every SEANet layer and the frame-rate down/upsampling are made of.
//!
//! candle's modules (`candle_transformers::models::mimi::{seanet, conv}`) are correct but slow
//! on the CPU: every convolution materialises a full im2col copy of its input, transposed
//! convolutions go through a col2im scatter (whose batched form is wrong in candle 0.11.1),
//! the depthwise upsampling is expanded into a dense `dim x dim` kernel, and everything except
//! the matrix products runs on one thread. This module computes the same functions:
//!
//! * a convolution is a matrix product `W (cout, cin*k) x cols (cin*k, frames)`, tiled over
//!   (output channels x frames) and spread over the rayon pool; each tile builds its own small
//!   im2col block (a few MB at most) and calls the `gemm` crate (the kernel candle uses) on
//!   one thread; bias and the residual are added while the tile is still in cache;
//! * a transposed convolution with stride `s` is split into its `s` phases, each an ordinary
//!   convolution over the last `ceil(k/s)` input frames, written straight into the strided
//!   output (no col2im, no overlap-add);
//! * the ELU is computed once per element with a vectorisable exponential;
//! * few frames (a streaming step) use the matrix-vector kernel of [`crate::kernels`].
//!
//! Streaming and offline share the code: a layer's state is the tail of its (activated) input
//! that the next frames still need. The offline path pads like candle's `forward` (causal left
//! padding plus the extra right padding that completes the last stride); the streaming path
//! keeps the tail instead, so its outputs are those of the offline path for every complete
//! frame. The tests (`tests.rs`) compare both against candle's modules. [`crate::seanet`]
//!
//! The files, one component each:
//!
//! * `buffers.rs`: the process's stock of recycled activation buffers ([`release_buffers`]);
//! * `frames.rs`: [`Frames`] (the activations), a row-parallel helper, and `Padded`, a
//!   convolution's view of its input with the padding described, not copied;
//! * `activation.rs`: the ELU, AVX2 where available;
//! * `tiles.rs`: the tiling over the pool, the per-tile `gemm` product and its epilogue;
//! * `spec.rs`: [`ConvSpec`], [`ConvState`] and the weights as the checkpoints store them;
//! * `conv1d.rs`: [`Conv1d`] and its four strategies (phase-split, direct, matrix-vector,
//!   tiled im2col), and the fused residual block;
//! * `conv_tr1d.rs`: [`ConvTr1d`], phase-split transposed and depthwise;
//! * `pairs.rs`: both at `precision="medium"` (bf16 pairs, f32 sums), one strategy for all;
//! * `tests.rs`: the comparisons with candle.

pub(crate) use spec::STEP_FRAMES;

mod activation;
mod buffers;
mod conv1d;
mod conv_tr1d;
mod frames;
mod pairs;
mod spec;
mod tiles;

#[cfg(test)]
mod tests;

pub use buffers::release_buffers;
pub use conv1d::Conv1d;
pub use conv_tr1d::ConvTr1d;
pub use frames::Frames;
pub(crate) use spec::conv_weight;
pub use spec::{ConvSpec, ConvState};
pub(crate) use tiles::{as_group, rows_alone_in_group};
