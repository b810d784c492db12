//! The step's parallel loops without rayon's fork/join: [`for_each_index`] hands `n` tasks to
//! the workers that [`super::in_pool`] keeps awake, through one shared slot.
//!
//! A streaming frame runs a few hundred small loops (each matrix's panels, each layer's
//! tiles, each head's attention), of 5-50 µs each. Through rayon, each loop pushes its halves
//! on a deque, the other worker steals them (crossbeam's epoch, the injector) and the caller
//! joins: several µs a loop, about a tenth of a B = 1 frame with its products skipped. Here
//! the caller (the thread running an `in_pool` call with spinning keepers: the *owner*)
//! publishes the loop in [`SLOT`]; the keepers poll it between rayon's jobs and claim tasks
//! with one compare-and-swap each; the owner claims too, then waits until every task is
//! done. Which thread runs a task never changes what it computes, so results do not depend
//! on the threads.
//!
//! With one thread, one task, or inside a task (a group of rows of `by_groups`, each a task
//! of one loop), the loop runs in place. On a thread that is not an owner (a call made from
//! inside the pool), or while another call holds the slot, it runs on rayon's `par_iter`. A
//! panic in a task reaches the owner with its own payload once every task is done.

use crate::error::locked;
use rayon::prelude::*;
use std::any::Any;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// A loop's tasks, as run by a worker: `&(dyn Fn(usize) + Sync)` on the owner's stack.
type Task<'a> = &'a (dyn Fn(usize) + Sync);

/// The shared slot. `state` packs the loop's sequence number, its task count and the next
/// task to claim, so that a claim (a compare-and-swap of `state`) can only take a task of
/// the loop it read, and only while that loop is unfinished: its closure is alive until
/// `done` reaches its count, which needs the claimed task.
struct Slot {
    /// An owner holds the slot (one loop at a time; other callers fall back to rayon).
    held: AtomicBool,
    /// `seq << 40 | count << 20 | next`.
    state: AtomicU64,
    /// Tasks finished in the current loop.
    done: AtomicUsize,
    /// The current loop's `Task`, behind a thin pointer.
    task: AtomicPtr<()>,
    /// A task of the current loop panicked (its payload is in `payload`).
    panicked: AtomicBool,
    /// The first panic's payload, for the owner to resume.
    payload: Mutex<Option<Box<dyn Any + Send>>>,
}

static SLOT: Slot = Slot {
    held: AtomicBool::new(false),
    state: AtomicU64::new(0),
    done: AtomicUsize::new(0),
    task: AtomicPtr::new(std::ptr::null_mut()),
    panicked: AtomicBool::new(false),
    payload: Mutex::new(None),
};

const FIELD: u32 = 20;
const MASK: u64 = (1 << FIELD) - 1;
/// Loops of more tasks than this run on rayon.
const MAX_TASKS: usize = MASK as usize;

thread_local! {
    /// This thread runs an `in_pool` call whose other workers poll the slot.
    static OWNER: Cell<bool> = const { Cell::new(false) };
    /// This thread is inside a task: nested loops run in place.
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
    /// Loops this thread ran through the slot (the tests check that it is used).
    #[cfg(test)]
    static SLOT_LOOPS: Cell<usize> = const { Cell::new(0) };
}

/// Marks this thread as the owner for the length of `f` (from `in_pool`, with keepers).
pub(super) fn as_owner<R>(f: impl FnOnce() -> R) -> R {
    super::with_flag(&OWNER, f)
}

/// `f(i)` for every `i` in `0..n`, on the kept-awake workers when this thread owns them,
/// else on rayon's pool (in place for one task, one thread, or inside another task).
pub fn for_each_index(n: usize, f: impl Fn(usize) + Sync) {
    if n <= 1 || IN_TASK.get() || rayon::current_num_threads() <= 1 {
        return (0..n).for_each(f);
    }
    if !OWNER.get() || n > MAX_TASKS || SLOT.held.swap(true, Ordering::Acquire) {
        return (0..n).into_par_iter().for_each(&f);
    }
    let task: Task = &f;
    SLOT.done.store(0, Ordering::Relaxed);
    SLOT.panicked.store(false, Ordering::Relaxed);
    SLOT.task
        .store(&task as *const Task as *mut (), Ordering::Relaxed);
    let seq = ((SLOT.state.load(Ordering::Relaxed) >> (2 * FIELD)) + 1) & MASK;
    let state = seq << (2 * FIELD) | (n as u64) << FIELD;
    SLOT.state.store(state, Ordering::Release);
    #[cfg(test)]
    SLOT_LOOPS.set(SLOT_LOOPS.get() + 1);
    while let Some(i) = claim(state) {
        run(task, i);
    }
    // The keepers' tasks borrow `f`: wait for them, a panic included.
    let mut spins = 0u32;
    while SLOT.done.load(Ordering::Acquire) < n {
        spins = spins.wrapping_add(1);
        match spins.is_multiple_of(1 << 12) {
            true => std::thread::yield_now(),
            false => std::hint::spin_loop(),
        }
    }
    let payload = match SLOT.panicked.load(Ordering::Acquire) {
        true => locked(&SLOT.payload).take(),
        false => None,
    };
    SLOT.held.store(false, Ordering::Release);
    if let Some(payload) = payload {
        std::panic::resume_unwind(payload);
    }
}

/// Claims the next task of the loop whose state was `seen` (sequence and count), if that
/// loop still has one.
fn claim(seen: u64) -> Option<usize> {
    let mut cur = SLOT.state.load(Ordering::Acquire);
    loop {
        let (next, count) = (cur & MASK, (cur >> FIELD) & MASK);
        if cur >> FIELD != seen >> FIELD || next >= count {
            return None;
        }
        match SLOT
            .state
            .compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => return Some(next as usize),
            Err(now) => cur = now,
        }
    }
}

/// Runs task `i` and counts it done (a panic is caught here, and raised by the owner).
fn run(task: Task, i: usize) {
    let outer = IN_TASK.replace(true);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| task(i)));
    IN_TASK.set(outer);
    if let Err(payload) = r {
        locked(&SLOT.payload).get_or_insert(payload);
        SLOT.panicked.store(true, Ordering::Release);
    }
    SLOT.done.fetch_add(1, Ordering::Release);
}

/// A keeper's poll: runs the current loop's unclaimed tasks; whether it ran any.
pub(super) fn help() -> bool {
    let seen = SLOT.state.load(Ordering::Acquire);
    let mut ran = false;
    while let Some(i) = claim(seen) {
        // SAFETY: the claim's compare-and-swap replaced a state of an unfinished loop (task
        // `i` was unclaimed, and the loop's count of done tasks needs it), so the owner is
        // still waiting and the task pointer, stored before that state was published,
        // points at its live `Task`.
        let task = unsafe { *(SLOT.task.load(Ordering::Acquire) as *const Task) };
        run(task, i);
        ran = true;
    }
    ran
}

/// A raw pointer that tasks writing disjoint parts of one buffer may share.
#[derive(Clone, Copy)]
struct TaskParts<T>(*mut T);
// SAFETY: each task of `for_each_chunk_mut` writes its own chunk only.
unsafe impl<T: Send> Send for TaskParts<T> {}
unsafe impl<T: Send> Sync for TaskParts<T> {}

impl<T> TaskParts<T> {
    /// Chunk `i` of `len` values (the last may be shorter) of a buffer of `total`.
    ///
    /// # Safety
    /// The buffer holds `total` values, and no one else uses this chunk meanwhile.
    #[allow(clippy::mut_from_ref)]
    unsafe fn chunk(&self, i: usize, len: usize, total: usize) -> &mut [T] {
        let start = i * len;
        std::slice::from_raw_parts_mut(self.0.add(start), len.min(total - start))
    }
}

/// `f(i, chunk)` for every `len`-value chunk of `out` (the last may be shorter), as
/// [`for_each_index`] runs its tasks.
pub fn for_each_chunk_mut<T: Send>(out: &mut [T], len: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let (total, len) = (out.len(), len.max(1));
    let parts = TaskParts(out.as_mut_ptr());
    for_each_index(total.div_ceil(len), |i| {
        // SAFETY: chunk `i` lies in `out` (i < total / len rounded up) and is task i's alone.
        f(i, unsafe { parts.chunk(i, len, total) })
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `f` as a step runs it: on the global pool's owner, with its keepers polling (with
    /// two threads or more, and `MIMI_PY_SPIN` on).
    fn on_owner(f: impl FnOnce() + Send) {
        super::super::in_pool(f);
    }

    /// Whether loops go through the slot here.
    fn slot_in_use() -> bool {
        rayon::current_num_threads() > 1 && super::super::spin()
    }

    /// Every task runs exactly once, loop after loop, the slot's or rayon's; a nested loop
    /// runs in place; chunks cover the buffer; loops go through the slot (other tests may
    /// hold it for a while: some loop of many gets it); a task's panic reaches the caller
    /// once every task is done, and the slot serves the next loop. One test, so that its
    /// parts do not hold the slot against each other.
    #[test]
    fn every_task_runs_once_and_panics_reach_the_owner() {
        on_owner(|| {
            let before = SLOT_LOOPS.get();
            for round in 0..10_000 {
                let n = [2usize, 3, 17, 200][round % 4];
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                for_each_index(n, |i| {
                    for_each_index(2, |_| {
                        hits[i].fetch_add(1, Ordering::Relaxed);
                    });
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 2), "{n}");
                if round >= 40 && (SLOT_LOOPS.get() > before || !slot_in_use()) {
                    break;
                }
            }
            // With one thread, or the keepers off, every loop runs without the slot.
            assert_eq!(
                SLOT_LOOPS.get() > before,
                slot_in_use(),
                "loops through the slot"
            );
            let mut v = vec![0usize; 1001];
            for_each_chunk_mut(&mut v, 64, |i, c| c.iter_mut().for_each(|x| *x += i + 1));
            assert!(v.iter().enumerate().all(|(j, &x)| x == j / 64 + 1));
            let r = std::panic::catch_unwind(|| {
                for_each_index(64, |i| assert!(i != 40, "task 40"));
            });
            let payload = r.expect_err("the panic reaches the caller");
            let message = payload.downcast_ref::<&str>().copied();
            assert_eq!(message, Some("task 40"), "the task's own payload");
            let count = AtomicUsize::new(0);
            for_each_index(64, |_| {
                count.fetch_add(1, Ordering::Relaxed);
            });
            assert_eq!(count.load(Ordering::Relaxed), 64);
        });
    }
}
