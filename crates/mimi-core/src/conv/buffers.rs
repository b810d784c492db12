//! Recycled activation buffers, per thread. Large fresh allocations cost a page fault per
//! 4 KiB (glibc maps them fresh and unmaps them on free): reusing a layer's buffers for the
//! next layers removes most of that. Offline calls run on a worker thread of their own, so
//! the buffers go when the call ends; a streaming thread keeps a few small ones.
//!
//! [`Frames`](super::Frames) takes its buffers here and gives them back when dropped.

use std::cell::RefCell;

/// Buffers below this many floats are left to the allocator.
const MIN: usize = 1 << 14;
/// At most this many buffers are kept per thread.
const KEEP: usize = 6;

thread_local! {
    static FREE: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
}

/// A buffer of `n` floats with unspecified (initialised) contents.
pub(super) fn take(n: usize) -> Vec<f32> {
    if n >= MIN {
        let found = FREE.with(|f| {
            let mut f = f.borrow_mut();
            // The smallest buffer that fits, if it is not much larger than needed (the
            // buffer may end up owned by a tensor, capacity and all).
            let best = (0..f.len())
                .filter(|&i| f[i].len() >= n && f[i].capacity() <= 2 * n)
                .min_by_key(|&i| f[i].len());
            best.map(|i| f.swap_remove(i))
        });
        if let Some(mut v) = found {
            v.truncate(n);
            return v;
        }
    }
    vec![0f32; n]
}

/// Frees this thread's buffers (the end of an offline call).
fn clear() {
    FREE.with(|f| f.borrow_mut().clear());
}

/// Keeps `v` for a later [`take`] on this thread (small buffers go to the allocator; past
/// `KEEP` buffers, the smallest goes).
pub(super) fn give(v: Vec<f32>) {
    if v.len() < MIN {
        return;
    }
    FREE.with(|f| {
        let mut f = f.borrow_mut();
        f.push(v);
        if f.len() > KEEP {
            let smallest = (0..f.len()).min_by_key(|&i| f[i].len()).unwrap_or(0);
            f.swap_remove(smallest);
        }
    });
}

/// Frees the recycled buffers of the calling thread.
pub fn release_buffers() {
    clear();
}
