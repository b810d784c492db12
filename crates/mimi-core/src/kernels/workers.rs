//! The rayon pool helpers: [`in_pool`] runs a call on a worker of rayon's global pool with
//! the other workers kept awake (spinning in `keep_awake`, stopped by `Finish` on the way
//! out) for its length, so that its many small parallel loops do not each pay a wake-up;
//! [`spin`] says whether the keepers run (`MIMI_PY_SPIN`, read in
//! [`crate::runtime::settings`]).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

/// Runs `f` on a worker of rayon's global pool (inline when already on one, or with a
/// single thread), with the pool's other workers kept awake until it returns.
///
/// A streaming step runs a hundred small parallel loops. Started from a thread outside the
/// pool, each would hand its work over and put the caller to sleep until it is done; from
/// inside the pool the caller takes part. Between two loops the other workers go to sleep
/// (rayon parks a worker that found nothing for a few dozen rounds), and waking one costs a
/// futex call and, on a virtual machine, an interrupt to the other vCPU: 32 voluntary context
/// switches per 80 ms codec frame on a 2-core EPYC (6-10 with this). So each other worker
/// runs [`keep_awake`] for the
/// length of the call: it takes every job the call offers as soon as it is offered, and spins
/// in between instead of parking. `MIMI_PY_SPIN=0` turns the keepers off (see [`spin`]).
pub fn in_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let threads = rayon::current_num_threads();
    if threads <= 1 || rayon::current_thread_index().is_some() {
        return f();
    }
    if !spin() {
        return rayon::scope(|_| f());
    }
    let done = AtomicBool::new(false);
    let done = &done;
    // `join` moves the call onto a worker; its second half is an empty job.
    let on_worker = move || {
        let owner = rayon::current_thread_index();
        with_keepers(threads - 1, (done, owner), f)
    };
    rayon::join(on_worker, || ()).0
}

/// [`in_pool`] for a call that computes on `dev`: on the CPU in the pool, elsewhere on this
/// thread. candle's CUDA device issues work on the calling thread's own default stream
/// (`per_thread_stream`), and cudarc sees one stream for every thread, so it orders nothing
/// between threads: a call whose input was uploaded here but computed on a pool worker could
/// read it before it landed (an H200 gave garbage codes and cuBLAS failures so). A call on a
/// device stays on the thread that made its inputs, and waits for that thread's stream before
/// it returns, so that the state it leaves is whole for a call from another thread (a failed
/// wait shows again at the next operation on the device, as its error).
pub fn in_pool_on<R: Send>(dev: &candle::Device, f: impl FnOnce() -> R + Send) -> R {
    if dev.is_cpu() {
        return in_pool(f);
    }
    let r = f();
    _ = dev.synchronize();
    r
}

/// Runs `f` on this worker (`owner`) with `n` keepers ([`keep_awake`]) offered to the other
/// workers, each as the second half of a `join` (a job on this worker's stack: nothing is
/// allocated, where a scope's spawned job is boxed); `done` is set when `f` returns.
fn with_keepers<R: Send>(
    n: usize,
    (done, owner): (&AtomicBool, Option<usize>),
    f: impl FnOnce() -> R + Send,
) -> R {
    if n == 0 {
        // Set on the way out, a panic included (it resurfaces once the keepers returned).
        let _finish = Finish(done);
        return super::team::as_owner(f);
    }
    let keeper = move || keep_awake(done, owner);
    rayon::join(move || with_keepers(n - 1, (done, owner), f), keeper).0
}

/// Whether [`in_pool`] keeps the pool's other workers spinning for the length of a call (the
/// default). `MIMI_PY_SPIN=0`, read once, lets them park between parallel loops instead: the
/// same results, fewer busy cycles on a machine shared with other work, more context switches
/// (like OpenMP's `OMP_WAIT_POLICY=passive`).
pub fn spin() -> bool {
    crate::runtime::settings::get().spin
}

/// Sets its flag when dropped.
struct Finish<'a>(&'a AtomicBool);

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

thread_local! {
    static KEEPING_AWAKE: Cell<bool> = const { Cell::new(false) };
}

/// A worker's loop while an [`in_pool`] call runs on `owner`: run the tasks of the owner's
/// team loops ([`super::team::help`]) and whatever job the pool offers, spin when there is
/// none, return once `done`. It returns at once on the owner
/// itself (which may pick it up while it waits inside a join: spinning there would never
/// let the call finish) and on a worker already keeping awake.
fn keep_awake(done: &AtomicBool, owner: Option<usize>) {
    if rayon::current_thread_index() == owner || KEEPING_AWAKE.with(Cell::get) {
        return;
    }
    KEEPING_AWAKE.with(|k| k.set(true));
    let mut idle = 0u32;
    while !done.load(Ordering::Acquire) {
        if super::team::help() {
            idle = 0;
            continue;
        }
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => idle = 0,
            _ => {
                idle += 1;
                // Now and then, let another process have the core (an oversubscribed
                // machine); otherwise stay hot.
                if idle.is_multiple_of(256) {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
    }
    KEEPING_AWAKE.with(|k| k.set(false));
}
