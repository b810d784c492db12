//! Recycled buffers (activations, and the matrix-vector kernel's im2col rows and products),
//! one stock for the process, of every size. A fresh buffer costs an allocation, a `memset`
//! (and, when large, a page fault per 4 KiB: glibc maps it fresh and unmaps it on free);
//! reusing the buffers of the last step's layers removes them. The stock is shared by every
//! thread because a step's buffers change threads: a group of rows takes them on a worker
//! and the owner drops them after the frame-rate layers (a stock per thread missed there,
//! and a B = 8 frame spent ~4% zeroing fresh buffers). Offline calls empty it when they
//! end ([`release_buffers`]); streams keep it up to [`KEEP_BYTES`].
//!
//! [`Frames`](super::Frames) takes its buffers here and gives them back when dropped. The
//! rest of a warm step's allocations are counted by the `mimi_step_allocs` bench.

use crate::error::locked;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// The stock holds at most this many bytes; past it, the largest buffers go.
const KEEP_BYTES: usize = 128 << 20;

/// Free buffers by capacity, and their bytes. Steps of the real model at B = 1 to 32 left
/// 2,581 buffers (91 MB) here, many of one capacity, so a lookup goes by capacity. A list
/// that runs empty stays (its capacity comes back with the next step), so that a warm step
/// allocates no node of the map either.
#[derive(Default)]
struct Stock {
    free: BTreeMap<usize, Vec<Vec<f32>>>,
    bytes: usize,
}

impl Stock {
    /// The smallest buffer that holds `n` floats, if it is not much larger (the buffer may
    /// end up owned by a tensor, capacity and all).
    fn take(&mut self, n: usize) -> Option<Vec<f32>> {
        let list = (self.free.range_mut(n..=2 * n).map(|(_, l)| l)).find(|l| !l.is_empty())?;
        let v = list.pop()?;
        self.bytes -= 4 * v.capacity();
        Some(v)
    }

    /// Keeps `v`; returns what no longer fits in `keep` bytes (the largest buffers), for the
    /// caller to free.
    fn give(&mut self, v: Vec<f32>, keep: usize) -> Vec<Vec<f32>> {
        self.bytes += 4 * v.capacity();
        self.free.entry(v.capacity()).or_default().push(v);
        let mut dropped = Vec::new();
        while self.bytes > keep {
            let Some(w) = self.free.values_mut().rev().find_map(Vec::pop) else {
                break;
            };
            self.bytes -= 4 * w.capacity();
            dropped.push(w);
        }
        dropped
    }

    /// The buffers' capacities, ascending (tests).
    #[cfg(test)]
    fn capacities(&self) -> Vec<usize> {
        (self.free.iter())
            .flat_map(|(&c, l)| std::iter::repeat_n(c, l.len()))
            .collect()
    }
}

static STOCK: Mutex<Stock> = Mutex::new(Stock {
    free: BTreeMap::new(),
    bytes: 0,
});

/// A buffer of `n` floats with unspecified (initialised) contents.
pub(super) fn take(n: usize) -> Vec<f32> {
    if n > 0 {
        let found = locked(&STOCK).take(n); // the lock ends here
        if let Some(mut v) = found {
            // Within the capacity: no allocation; only the grown part is written.
            v.resize(n, 0.0);
            return v;
        }
    }
    vec![0f32; n]
}

/// Keeps `v` for a later [`take`], whatever its size (a warm step then allocates none of its
/// activations); past [`KEEP_BYTES`], the largest buffers go, freed outside the lock.
pub(super) fn give(v: Vec<f32>) {
    if v.capacity() > 0 {
        let dropped = locked(&STOCK).give(v, KEEP_BYTES);
        drop(dropped);
    }
}

/// Frees the recycled buffers (the end of an offline call: its buffers are sized for its
/// input, not for the next call; a stream stepping meanwhile only takes fresh ones).
pub fn release_buffers() {
    let free = std::mem::take(&mut *locked(&STOCK));
    drop(free);
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: usize = 1 << 10;

    /// On a stock of its own (the process-wide one is shared with the other tests).
    #[test]
    fn buffers_are_reused_best_fit_and_bounded() {
        let (mut s, keep) = (Stock::default(), 100 * MIN);
        let a = vec![0f32; 4 * MIN];
        let p = a.as_ptr();
        assert!(s.give(a, keep).is_empty());
        // A smaller request (within half the capacity) gets the same buffer.
        let b = s.take(3 * MIN).expect("fits");
        assert_eq!((b.as_ptr(), b.capacity()), (p, 4 * MIN));
        assert!(s.take(3 * MIN).is_none());
        s.give(b, keep);
        // Less than half the capacity, or more than it: none.
        assert!(s.take(MIN).is_none() && s.take(4 * MIN + 1).is_none());
        // Kept by capacity; past `keep` bytes the largest go first.
        s.give(vec![0.0; MIN], keep);
        s.give(vec![0.0; 2 * MIN], keep);
        let dropped = s.give(vec![0.0; 95 * MIN], keep);
        assert_eq!(
            dropped.iter().map(Vec::capacity).collect::<Vec<_>>(),
            [95 * MIN]
        );
        assert_eq!(s.capacities(), [MIN, 2 * MIN, 4 * MIN]);
        // Several of one capacity.
        s.give(vec![0.0; MIN], keep);
        assert_eq!(s.capacities(), [MIN, MIN, 2 * MIN, 4 * MIN]);
        assert_eq!(s.take(MIN).map(|v| v.capacity()), Some(MIN));
        assert_eq!(s.take(MIN).map(|v| v.capacity()), Some(MIN));
        assert_eq!(s.take(MIN).map(|v| v.capacity()), Some(2 * MIN));
        assert_eq!(s.capacities(), [4 * MIN]);
        s.give(vec![0.0; MIN], keep);
        s.give(vec![0.0; 2 * MIN], keep);
        assert_eq!(s.bytes, 4 * 7 * MIN);
        // A list that ran empty stays, and takes the next buffer of its capacity.
        assert_eq!(s.take(4 * MIN).map(|v| v.capacity()), Some(4 * MIN));
        assert!(s.free.contains_key(&(4 * MIN)) && s.take(4 * MIN).is_none());
        // The shared functions: sizes come back exact.
        let v = take(3);
        assert_eq!(v.len(), 3);
        give(v);
        assert_eq!(take(2 * MIN).len(), 2 * MIN);
    }
}
