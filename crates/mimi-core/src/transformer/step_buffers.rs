//! The planned step's host buffers: each layer's key/value rings ([`HostRing`], what a
//! stream remembers, in its [`super::State`]) and the step's working memory ([`Workspace`],
//! the caller's, kept out of the state), grown to the largest call seen.

/// One layer's key and value rings on the host, `(batch, heads, context, head_dim)` each:
/// slot `p % context` of a row and head holds position `p`.
#[derive(Clone, Default)]
pub(super) struct HostRing {
    pub(super) k: Vec<f32>,
    pub(super) v: Vec<f32>,
}

impl HostRing {
    pub(super) fn zeros(n: usize) -> Self {
        Self {
            k: vec![0.0; n],
            v: vec![0.0; n],
        }
    }

    pub(super) fn nbytes(&self) -> usize {
        4 * (self.k.len() + self.v.len())
    }
}

/// The planned step's working memory ([`super::Transformer::step_host`] takes it from its
/// caller, as XNNPACK's operators take their workspace): grown to the largest call seen and
/// never shrunk, so that a caller who keeps one allocates nothing once warm. It holds
/// nothing between calls that a result depends on, so one workspace serves any model and
/// any stream, one call at a time; callers that step at the same time need one each.
#[derive(Default)]
pub struct Workspace {
    /// The residual stream (tokens, d), and a second (tokens, d) for norms and outputs.
    pub(super) x: Vec<f32>,
    pub(super) h: Vec<f32>,
    /// q, k and v of every token (tokens, 3d), q rotated and scaled, k rotated.
    pub(super) qkv: Vec<f32>,
    /// Attention output (tokens, d), the feed-forward's hidden (tokens, ff).
    pub(super) attn: Vec<f32>,
    pub(super) ff: Vec<f32>,
    /// Rotary cos and sin per token (tokens, hd/2 each).
    pub(super) cos: Vec<f32>,
    pub(super) sin: Vec<f32>,
    /// Softmax scores, one ring's worth per (row, head).
    pub(super) scores: Vec<f32>,
    /// Each token's position.
    pub(super) pos: Vec<u64>,
}

impl Workspace {
    /// An empty workspace: the first call of each larger shape grows it.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes its buffers hold (their capacity).
    pub fn nbytes(&self) -> usize {
        let f32s = [
            &self.x,
            &self.h,
            &self.qkv,
            &self.attn,
            &self.ff,
            &self.cos,
            &self.sin,
            &self.scores,
        ];
        4 * f32s.iter().map(|v| v.capacity()).sum::<usize>() + 8 * self.pos.capacity()
    }
}
