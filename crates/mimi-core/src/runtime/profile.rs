//! Where a streaming step's time goes, layer by layer: each SEANet layer, the down/upsampling,
//! the transformers and the quantizer time themselves through [`time`] into one table that
//! [`take`] empties. Off unless a benchmark turns it on ([`enable`]; the `mimi_step_profile`
//! binary does): then each timed call costs one relaxed atomic load and nothing else.
//!
//! The table is keyed by label, in order of first appearance. A label names a layer (not a
//! row), so a layer run once per row adds each row's time to the same entry, and a layer run
//! once for all rows adds one: the totals compare directly across the two.

use crate::error::locked;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static ON: AtomicBool = AtomicBool::new(false);
static SKIP_PRODUCTS: AtomicBool = AtomicBool::new(false);
static TABLE: Mutex<Vec<Entry>> = Mutex::new(Vec::new());
static TENSORS: AtomicUsize = AtomicUsize::new(0);
static SHAPE_CHECKS: AtomicUsize = AtomicUsize::new(0);

/// Counts a candle tensor made from host values or a native engine's frames at the codec's
/// edges (`codec::bridge`, the host calls): a test reads [`tensors_made`] to see that a
/// native call made none.
pub(crate) fn tensor_made() {
    TENSORS.fetch_add(1, Ordering::Relaxed);
}

/// The tensors counted by [`tensor_made`] since the process started.
pub fn tensors_made() -> usize {
    TENSORS.load(Ordering::Relaxed)
}

/// Counts a check of an input's shape, size and memory (`Codec::input_shape`,
/// `Transformer::check_call`): a test reads [`shape_checks_made`] to see that a call
/// through the binding checks its input once.
pub(crate) fn shape_checked() {
    SHAPE_CHECKS.fetch_add(1, Ordering::Relaxed);
}

/// The checks counted by [`shape_checked`] since the process started.
pub fn shape_checks_made() -> usize {
    SHAPE_CHECKS.load(Ordering::Relaxed)
}

thread_local! {
    /// This thread is inside a call into the `gemm` crate ([`in_gemm`]).
    static IN_GEMM: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`, a call into the `gemm` crate (the convolutions' tiles), marked as one on this
/// thread, profiling on or off. `gemm` allocates on every call (gemm-common 0.19,
/// `gemm_basic_generic`: its `did_pack_lhs` flags, and packing buffers for some shapes):
/// the only allocations of a warm streaming step besides the arrays it returns. The
/// allocation test and `mimi_step_allocs` tell them apart by [`inside_gemm`].
#[inline]
pub(crate) fn in_gemm<R>(f: impl FnOnce() -> R) -> R {
    IN_GEMM.set(true);
    let out = f();
    IN_GEMM.set(false);
    out
}

/// Whether this thread is inside a call into the `gemm` crate (see [`in_gemm`]): what a
/// counting allocator asks to tell `gemm`'s allocations from the rest. Allocates nothing.
pub fn inside_gemm() -> bool {
    IN_GEMM.get()
}

/// A global allocator for the allocation tests and `mimi_step_allocs`: it counts heap
/// allocations (`alloc`, `alloc_zeroed`, `realloc`), those made inside calls into `gemm`
/// apart ([`inside_gemm`]), and forwards every call to the system allocator unchanged. A test
/// or bench binary installs it (`#[global_allocator] static A: CountingAlloc =
/// CountingAlloc::new();`) and reads [`CountingAlloc::counts`]; the library never does.
pub struct CountingAlloc {
    total: AtomicUsize,
    in_gemm: AtomicUsize,
    hook: Option<fn()>,
}

/// What a [`CountingAlloc`] has counted; `after - before` is what happened in between.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocCounts {
    /// Every allocation.
    pub total: usize,
    /// Those made inside calls into `gemm` ([`inside_gemm`]).
    pub in_gemm: usize,
}

impl AllocCounts {
    /// Those made outside calls into `gemm`.
    pub fn outside_gemm(self) -> usize {
        self.total - self.in_gemm
    }
}

impl std::ops::Sub for AllocCounts {
    type Output = AllocCounts;
    fn sub(self, before: AllocCounts) -> AllocCounts {
        AllocCounts {
            total: self.total - before.total,
            in_gemm: self.in_gemm - before.in_gemm,
        }
    }
}

impl CountingAlloc {
    pub const fn new() -> Self {
        Self::with_hook(None)
    }

    /// Also calls `hook` on each allocation, after counting it (the bench's list of where
    /// allocations are made; a hook that allocates must guard against its own calls).
    pub const fn with_hook(hook: Option<fn()>) -> Self {
        Self {
            total: AtomicUsize::new(0),
            in_gemm: AtomicUsize::new(0),
            hook,
        }
    }

    /// The counts so far, of every thread.
    pub fn counts(&self) -> AllocCounts {
        AllocCounts {
            total: self.total.load(Ordering::SeqCst),
            in_gemm: self.in_gemm.load(Ordering::SeqCst),
        }
    }

    fn count(&self) {
        self.total.fetch_add(1, Ordering::SeqCst);
        if inside_gemm() {
            self.in_gemm.fetch_add(1, Ordering::SeqCst);
        }
        if let Some(hook) = self.hook {
            hook();
        }
    }
}

impl Default for CountingAlloc {
    fn default() -> Self {
        Self::new()
    }
}

// SAFETY: every call is forwarded to the system allocator unchanged; counting allocates
// nothing.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.count();
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.count();
        System.alloc_zeroed(layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        self.count();
        System.realloc(ptr, layout, new_size)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

/// One timed label: its total wall time and how many calls made it.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub label: String,
    pub total: Duration,
    pub calls: u64,
}

/// Turns the timers on or off (process-wide).
pub fn enable(on: bool) {
    ON.store(on, Ordering::Relaxed);
}

/// A bench mode: while on, every matrix product on the CPU (the packed product, the
/// matrix-vector kernel, the convolutions' `gemm` tiles and direct kernel) returns without
/// computing, leaving its output as it was. What a step costs then is the plan's overhead:
/// copies, norms, attention, bookkeeping, synchronisation. The results are meaningless, so
/// only `mimi_step_profile` turns it on.
pub fn skip_products(on: bool) {
    SKIP_PRODUCTS.store(on, Ordering::Relaxed);
}

/// Whether [`skip_products`] is on (one relaxed atomic load).
#[inline]
pub fn products_skipped() -> bool {
    SKIP_PRODUCTS.load(Ordering::Relaxed)
}

/// Whether the timers are on.
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Runs `f`; while the timers are on, adds its wall time to `label()`'s entry (`label` is
/// only called then, so building it costs nothing otherwise).
#[inline]
pub fn time<R>(label: impl FnOnce() -> String, f: impl FnOnce() -> R) -> R {
    if !enabled() {
        return f();
    }
    let t0 = Instant::now();
    let out = f();
    record(label(), t0.elapsed());
    out
}

fn record(label: String, dt: Duration) {
    let mut table = locked(&TABLE);
    match table.iter_mut().find(|e| e.label == label) {
        Some(e) => {
            e.total += dt;
            e.calls += 1;
        }
        None => table.push(Entry {
            label,
            total: dt,
            calls: 1,
        }),
    }
}

/// The table since the last `take` (labels in order of first appearance), emptied.
pub fn take() -> Vec<Entry> {
    std::mem::take(&mut *locked(&TABLE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_only_while_enabled_and_sums_per_label() {
        // The only test touching the process-wide switch.
        take();
        time(|| "off".into(), || ());
        assert!(take().is_empty());
        enable(true);
        for _ in 0..3 {
            time(
                || "a".into(),
                || std::thread::sleep(Duration::from_millis(1)),
            );
        }
        let v = time(|| "b".into(), || 7);
        enable(false);
        assert_eq!(v, 7);
        let t = take();
        assert_eq!(
            t.iter()
                .map(|e| (e.label.as_str(), e.calls))
                .collect::<Vec<_>>(),
            [("a", 3), ("b", 1)]
        );
        assert!(t[0].total >= Duration::from_millis(3));
        assert!(take().is_empty());
    }
}
