//! Faster CPU kernels where candle's are the bottleneck.
//!
//! candle runs Mimi correctly on every device, but on the CPU a few of its operations cost
//! more than the work in them: a general matmul for a streaming step's handful of rows,
//! masked attention products over keys a query cannot see, libm's `erff` one element at a
//! time, elementwise ops on a pool of candle's own, im2col copies for small convolutions.
//! This module replaces those, on the CPU in f32, and leaves everything else to candle.
//!
//! Files, one component each:
//! * `gemv.rs`: [`gemv`], the matrix-vector kernel of a streaming step (register tiles of
//!   weight rows x input rows, prefetching the next tile; f32 or bf16 weights), used up to
//!   [`GEMV_MAX_ROWS`] rows;
//! * `packed.rs`: [`Packed`], a weight packed once into panels of [`PANEL`] output
//!   features, and the register-tiled product over it (bias fused);
//! * `linear.rs`: [`Linear`], a linear layer held packed on the CPU (its only copy of the
//!   weight), candle's elsewhere;
//! * `attention.rs`: [`WindowAttention`], an offline block's sliding-window attention over
//!   exactly the keys each query sees, reading the key/value rings in place;
//! * `elementwise.rs`: [`gelu_erf`], [`residual_add`] and the `e^x` they share with the
//!   attention's softmax;
//! * `workers.rs`: [`in_pool`] and [`spin`], the rayon pool whose workers keep awake for the
//!   length of a call;
//! * `team.rs`: [`for_each_index`], the step's parallel loops on the workers `in_pool` keeps
//!   awake, without rayon's fork/join;
//! * `direct.rs`: [`direct`], the AVX-512 direct (im2col-free) stride-1 convolution;
//! * `scoped.rs`: `with_flag` and `with_scratch`, a thread's flag and scratch for one call;
//! * `cpu.rs`: [`cpu::Level`], the instruction sets the kernels may use, detected once;
//! * `bf16dot.rs`: [`bf16dot::PairPacked`], products with bf16 inputs and f32 sums in
//!   `vdpbf16ps`'s order, the same bits natively, on AVX2 and portably (not yet wired).
//!
//! CPU features are chosen at run time, never at build time: each SIMD kernel is an
//! `unsafe fn` compiled with `#[target_feature(enable = ...)]` (AVX2 and FMA for gemv,
//! GELU and attention; AVX-512 BF16 for gemv's bf16 weights; AVX-512F for the direct
//! convolution), called only after `cpu.rs` ([`cpu::has`]) found those features (detected
//! once, capped by `MIMI_PY_ISA`); elsewhere (another x86 CPU, another architecture, or the
//! switch set lower) a portable version of the same sums runs. The portable GELU and gemv loops
//! are `#[inline(always)]` so that the AVX2 variants, which inline them, get them compiled
//! with those features. Each kernel's tests compare it against candle or a plain reference.

mod attention;
pub mod bf16dot;
pub mod cpu;
pub mod direct;
mod elementwise;
mod gemv;
mod linear;
mod packed;
mod scoped;
mod team;
mod workers;

pub(crate) use attention::attend_visible;
pub use attention::WindowAttention;
pub(crate) use elementwise::{exp_nonpos, gelu_erf_slice};
pub use elementwise::{gelu_erf, residual_add};
pub use gemv::{gemv, gemv_into, gemv_on, Isa, Weight, GEMV_MAX_ROWS};
pub use linear::Linear;
pub use packed::{Packed, PANEL};
pub(crate) use scoped::{with_flag, with_scratch};
pub use team::{for_each_chunk_mut, for_each_index};
pub use workers::{in_pool, in_pool_on, spin};
