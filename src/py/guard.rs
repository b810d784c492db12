//! The one guard between Python and the core: detach from the interpreter, catch panics,
//! lock shared state, and let Ctrl-C interrupt long offline calls.
//!
//! Every call that computes or touches streaming state goes through [`detached`]. The lock
//! of a [`Shared`] value can only be taken with the [`Detached`] token that `detached` hands
//! out, so no thread ever waits for a lock while holding the interpreter. One poison policy
//! applies to every class: a call that panicked while holding a stream's lock may have left
//! it half-updated, so the next call resets that stream and raises `InternalError`.

use crate::py::errors::PyResult;
use mimi_core::error::{Error, Result};
use pyo3::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Proof that the current thread is detached from the interpreter (see [`detached`]).
pub struct Detached(());

/// Streaming state that can return to its fresh value.
pub trait Reset {
    /// Returns to the state of a newly built object.
    fn reset(&mut self);
}

/// Streaming state shared between Python threads.
#[derive(Default)]
pub struct Shared<T>(Mutex<T>);

impl<T: Reset> Shared<T> {
    /// Wraps a state.
    pub fn new(value: T) -> Self {
        Self(Mutex::new(value))
    }

    /// Locks the state. A poisoned lock (a panic while it was held) resets the state and
    /// reports [`Error::Internal`]; the lock is usable again afterwards.
    pub fn lock(&self, _: &Detached) -> Result<MutexGuard<'_, T>> {
        match self.0.lock() {
            Ok(g) => Ok(g),
            Err(poisoned) => {
                poisoned.into_inner().reset();
                self.0.clear_poison();
                Err(Error::Internal(
                    "an earlier call panicked while updating this stream, so the stream was \
                     reset to its fresh state; start it again"
                        .into(),
                ))
            }
        }
    }
}

impl<T: Reset> Shared<T> {
    /// Returns the state to its fresh value, poisoned or not.
    pub fn reset(&self, _: &Detached) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).reset();
        self.0.clear_poison();
    }
}

/// Runs `f`, turning a Rust panic into [`Error::Internal`].
pub fn catch_panic<R>(f: impl FnOnce() -> Result<R>) -> Result<R> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let msg = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic payload".to_string());
        Err(Error::Internal(format!("a Rust panic was caught: {msg}")))
    })
}

/// Runs `f` detached from the interpreter, with panics caught.
pub fn detached<R: Send>(
    py: Python<'_>,
    f: impl FnOnce(&Detached) -> Result<R> + Send,
) -> PyResult<R> {
    Ok(py.detach(|| catch_panic(|| f(&Detached(()))))?)
}

/// Runs `f` on a worker thread while this thread, detached from the interpreter, waits and
/// checks for signals every 50 ms. On Ctrl-C (or any signal handler raising) the call
/// returns that exception at once; `cancel` is set so that `f` stops at its next check, and
/// its result is dropped. For long offline computations whose state is private to the call,
/// so an interrupted call leaves the object usable.
pub fn interruptible<R: Send + 'static>(
    py: Python<'_>,
    f: impl FnOnce(&AtomicBool) -> Result<R> + Send + 'static,
) -> PyResult<R> {
    let cancel = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    let flag = cancel.clone();
    std::thread::Builder::new()
        .name("mimi_py-worker".into())
        .spawn(move || {
            let _ = tx.send(catch_panic(|| f(&flag)));
        })
        .map_err(|e| Error::Internal(format!("cannot start a worker thread: {e}")))?;
    py.detach(move || loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(r) => return Ok(r?),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(Error::Internal("worker thread ended without a result".into()).into())
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Err(e) = Python::attach(|py| py.check_signals()) {
                    cancel.store(true, Ordering::Relaxed);
                    return Err(e.into());
                }
            }
        }
    })
}
