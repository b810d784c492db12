//! The buffers a captured fixed-shape step reads and writes (`fixed.rs`), and each stream's
//! graphs of them (`state.rs` holds those): declared apart, so that the state does not import
//! the step that computes it.

use crate::gpu::graphs::Graphs;
use candle::Tensor;

/// What a fixed-shape step reads besides the weights and the rings, on the device: its input
/// `(n, t, d)` and the tables `fixed.rs` builds on the host (f32, cast in the step).
pub(super) struct StepInputs {
    pub(super) x: Tensor,
    pub(super) ids: Option<Tensor>,
    pub(super) rope: Option<(Tensor, Tensor)>,
    pub(super) sin: Option<Tensor>,
    pub(super) slots: Tensor,
    pub(super) mask: Tensor,
}

/// A captured step's fixed buffers: its inputs and its output `(n, t, d)`.
pub(super) struct StepBuffers {
    pub(super) inputs: StepInputs,
    pub(super) out: Tensor,
}

/// Each stream's graphs of fixed-shape steps.
pub(super) type StepGraphs = Graphs<StepBuffers>;
