//! The streaming state ([`State`]): each row's position and each layer's key/value rings,
//! on the device for the block path ([`LayerCache`]) or on the host for the planned step.
//! Only what the stream remembers: the planned step's working memory is its caller's
//! ([`super::Workspace`]), so a copy of a state copies no scratch.

use super::step_buffers::HostRing;
use super::step_graphs::StepGraphs;
use crate::error::Result;
use candle::Tensor;

/// The ring slot of position `pos` in a window of `context` keys: every ring (the block
/// path's, the masked rows', the planned step's) keeps position `p` in slot `p % context`.
pub(super) fn ring_slot(pos: u64, context: usize) -> usize {
    (pos % context as u64) as usize
}

/// The position that slot `slot` holds for a row about to step at `pos` (the rule's inverse):
/// the last position before `pos` that [`ring_slot`] puts there, negative while the row has
/// not reached the slot.
pub(super) fn slot_position(slot: usize, pos: u64, context: usize) -> i64 {
    let (p, c) = (pos as i64, context as i64);
    (p - 1) - (p - 1 - slot as i64).rem_euclid(c)
}

/// One layer's ring buffers of keys and values, `(batch, heads, context, head_dim)`.
/// Slot [`ring_slot`]`(p)` holds position `p`.
#[derive(Clone)]
pub(super) struct LayerCache {
    pub(super) k: Tensor,
    pub(super) v: Tensor,
}

/// The streaming state: each row's position (steps since its own start or reset) and the last
/// `context` keys/values of each layer, in the rings of the path that computes it (allocated
/// at the first call, when the batch size is known). A row's ring slots past its position
/// hold stale values that no query reads, so a per-row reset only sets that row's position
/// to 0.
#[derive(Clone, Default)]
pub struct State {
    pub(super) pos: Vec<u64>,
    pub(super) rings: Rings,
    /// The fixed-shape steps' CUDA graphs over these rings (`MIMI_PY_CUDA_GRAPHS`); a copy
    /// of the state starts with none.
    pub(super) graphs: StepGraphs,
}

/// Each layer's key/value rings, as the path that computes the model keeps them.
#[derive(Clone, Default)]
pub(super) enum Rings {
    /// No call yet: any batch size may follow.
    #[default]
    Unstarted,
    /// The block path's: candle tensors, one [`LayerCache`] per layer, any device and dtype.
    Device(Vec<LayerCache>),
    /// The planned step's: host values.
    Host(HostRings),
}

/// The planned step's rings: one [`HostRing`] per layer and their `(batch, heads, context,
/// head_dim)`.
#[derive(Clone)]
pub(super) struct HostRings {
    pub(super) layers: Vec<HostRing>,
    pub(super) dims: Vec<usize>,
}

impl State {
    /// The stream's position: its rows' largest (all rows share it unless some were reset
    /// on their own or stepped with an `active` mask).
    pub fn position(&self) -> u64 {
        self.pos.iter().copied().max().unwrap_or(0)
    }

    /// Each row's steps since its own start or reset (empty before the first call).
    pub fn positions(&self) -> &[u64] {
        &self.pos
    }

    /// The batch size of the current stream, if one was started.
    pub fn batch(&self) -> Option<usize> {
        (!matches!(self.rings, Rings::Unstarted)).then_some(self.pos.len())
    }

    /// Bytes held by the key/value buffers.
    pub fn nbytes(&self) -> usize {
        match &self.rings {
            Rings::Unstarted => 0,
            Rings::Host(h) => h.layers.iter().map(HostRing::nbytes).sum(),
            Rings::Device(caches) => (caches.iter())
                .map(|c| (c.k.elem_count() + c.v.elem_count()) * c.k.dtype().size_in_bytes())
                .sum(),
        }
    }

    /// A fresh stream: any batch size may follow.
    pub fn reset(&mut self) {
        *self = State::default();
    }

    /// Returns `rows` (indices below the batch size) to the start of a stream; the other
    /// rows continue untouched.
    pub fn reset_rows(&mut self, rows: &[usize]) {
        for &r in rows {
            if let Some(p) = self.pos.get_mut(r) {
                *p = 0;
            }
        }
    }

    /// An independent copy: new buffers, same contents and positions.
    pub fn deep_copy(&self) -> Result<State> {
        let rings = match &self.rings {
            Rings::Unstarted => Rings::Unstarted,
            Rings::Host(h) => Rings::Host(h.clone()),
            Rings::Device(caches) => Rings::Device(copy_caches(caches)?),
        };
        Ok(State {
            pos: self.pos.clone(),
            rings,
            graphs: StepGraphs::default(),
        })
    }

    /// The block path's rings (none before the first call or on the planned step).
    pub(super) fn device_rings(&self) -> &[LayerCache] {
        match &self.rings {
            Rings::Device(caches) => caches,
            _ => &[],
        }
    }

    /// The block path's rings with the stream's graphs over them (the fixed-shape step's).
    pub(super) fn rings_and_graphs(&mut self) -> (&[LayerCache], &mut StepGraphs) {
        let rings = match &self.rings {
            Rings::Device(caches) => &caches[..],
            _ => &[],
        };
        (rings, &mut self.graphs)
    }

    /// `(num_layers, batch, heads, context, head_dim)` of the buffers, if allocated.
    pub fn layout(&self) -> Option<(usize, Vec<usize>)> {
        self.dims().map(|(n, dims)| (n, dims.to_vec()))
    }

    /// [`Self::layout`], borrowed (no allocation: the planned step checks it every call).
    pub(super) fn dims(&self) -> Option<(usize, &[usize])> {
        match &self.rings {
            Rings::Unstarted => None,
            Rings::Device(caches) => caches.first().map(|c| (caches.len(), c.k.dims())),
            Rings::Host(h) => Some((h.layers.len(), &h.dims[..])),
        }
    }
}

/// New buffers with the same contents. On a GPU the copies (and whatever this thread queued
/// before them, such as a codec stream's convolution states) are queued on this thread's
/// stream: it waits for them, so that another thread may use the copy
/// (`kernels::in_pool_on`).
fn copy_caches(caches: &[LayerCache]) -> Result<Vec<LayerCache>> {
    let copies = (caches.iter())
        .map(|c| {
            Ok(LayerCache {
                k: c.k.copy()?,
                v: c.v.copy()?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    if let Some(c) = copies.first().filter(|c| !c.k.device().is_cpu()) {
        c.k.device().synchronize()?;
    }
    Ok(copies)
}
