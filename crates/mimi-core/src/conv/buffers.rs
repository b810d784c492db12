//! Recycled activation buffers, one stock for the process. A fresh buffer costs a `memset`
//! (and, when large, a page fault per 4 KiB: glibc maps it fresh and unmaps it on free);
//! reusing the buffers of the last step's layers removes both. The stock is shared by every
//! thread because a step's buffers change threads: a group of rows takes them on a worker
//! and the owner drops them after the frame-rate layers (a stock per thread missed there,
//! and a B = 8 frame spent ~4% zeroing fresh buffers). Offline calls empty it when they
//! end ([`release_buffers`]); streams keep it up to [`KEEP_BYTES`].
//!
//! [`Frames`](super::Frames) takes its buffers here and gives them back when dropped.

use std::sync::{Mutex, MutexGuard};

/// Buffers below this many floats are left to the allocator (a few hundred ns each).
const MIN: usize = 1 << 10;
/// The stock holds at most this many bytes; past it, the largest buffers go.
const KEEP_BYTES: usize = 256 << 20;

/// Free buffers, by capacity (ascending), and their bytes.
#[derive(Default)]
struct Stock {
    free: Vec<Vec<f32>>,
    bytes: usize,
}

impl Stock {
    /// The smallest buffer that holds `n` floats, if it is not much larger (the buffer may
    /// end up owned by a tensor, capacity and all).
    fn take(&mut self, n: usize) -> Option<Vec<f32>> {
        let i = self.free.partition_point(|v| v.capacity() < n);
        let cap = self.free.get(i)?.capacity();
        if cap > 2 * n {
            return None;
        }
        self.bytes -= 4 * cap;
        Some(self.free.remove(i))
    }

    /// Keeps `v`; returns what no longer fits in `keep` bytes (the largest buffers), for the
    /// caller to free.
    fn give(&mut self, v: Vec<f32>, keep: usize) -> Vec<Vec<f32>> {
        let i = self.free.partition_point(|w| w.capacity() < v.capacity());
        self.bytes += 4 * v.capacity();
        self.free.insert(i, v);
        let mut dropped = Vec::new();
        while self.bytes > keep {
            let Some(w) = self.free.pop() else { break };
            self.bytes -= 4 * w.capacity();
            dropped.push(w);
        }
        dropped
    }
}

static STOCK: Mutex<Stock> = Mutex::new(Stock {
    free: Vec::new(),
    bytes: 0,
});

/// The stock; a panic while it was held left it consistent (its changes do not panic
/// midway), so a poisoned lock is taken as it is.
fn stock() -> MutexGuard<'static, Stock> {
    STOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A buffer of `n` floats with unspecified (initialised) contents.
pub(super) fn take(n: usize) -> Vec<f32> {
    if n >= MIN {
        if let Some(mut v) = stock().take(n) {
            // Within the capacity: no allocation; only the grown part is written.
            v.resize(n, 0.0);
            return v;
        }
    }
    vec![0f32; n]
}

/// Keeps `v` for a later [`take`] (small buffers go to the allocator; past [`KEEP_BYTES`],
/// the largest buffers go, freed outside the lock).
pub(super) fn give(v: Vec<f32>) {
    if v.capacity() >= MIN {
        let dropped = stock().give(v, KEEP_BYTES);
        drop(dropped);
    }
}

/// Frees the recycled buffers (the end of an offline call: its buffers are sized for its
/// input, not for the next call; a stream stepping meanwhile only takes fresh ones).
pub fn release_buffers() {
    let free = std::mem::take(&mut *stock());
    drop(free);
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let caps = |v: &[Vec<f32>]| v.iter().map(Vec::capacity).collect::<Vec<_>>();
        assert_eq!(caps(&dropped), [95 * MIN]);
        assert_eq!(caps(&s.free), [MIN, 2 * MIN, 4 * MIN]);
        assert_eq!(s.bytes, 4 * 7 * MIN);
        // The shared functions: small buffers are not kept, sizes come back exact.
        let v = take(MIN - 1);
        assert_eq!(v.len(), MIN - 1);
        give(v);
        assert_eq!(take(2 * MIN).len(), 2 * MIN);
    }
}
