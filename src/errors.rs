//! The one place where failures are classified and turned into Python exceptions.
//!
//! Rust code returns [`Error`]; conditions are checked *before* candle sees the data, so the
//! mapping never depends on candle's message strings. Anything candle still reports ends up
//! as [`Error::Candle`] (a `ComputeError`), and a panic as [`Error::Panic`] (an
//! `InternalError`); neither ever reaches Python as `PanicException`.
//!
//! The Python classes derive from `MimiError` *and* from the builtin they refine
//! (`ValueError`, `TypeError`, `RuntimeError`), which `create_exception!` cannot express,
//! so they are built once with `type(name, bases, dict)` and cached.

use pyo3::exceptions::{PyMemoryError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use std::fmt;

/// Every failure mimi_py can report.
#[derive(Debug)]
pub enum Error {
    /// An invalid configuration value; `field` names the offending keyword.
    Config { field: String, msg: String },
    /// `kv_repeat != 1`: candle's Mimi attention only supports `kv_repeat = 1`.
    UnsupportedKvRepeat { kv_repeat: usize },
    /// `copy_state` between transformers of different depths.
    DepthMismatch { dst: usize, src: usize },
    /// `copy_state` between transformers whose states have other incompatible shapes.
    IncompatibleState(String),
    /// An input of the wrong shape.
    Shape(String),
    /// An input of a dtype that cannot be converted.
    DType(String),
    /// An input with values outside what is accepted (codes out of range, non-finite audio).
    InvalidInput(String),
    /// Not enough memory for what was asked (checked up front where possible).
    Resource(String),
    /// A missing, mis-shaped or mistyped tensor, or an unreadable checkpoint.
    Weights(String),
    /// A checkpoint that could not be read from disk (raised as `WeightsError` chained
    /// from an `OSError`).
    WeightsIo { msg: String, source: std::io::Error },
    /// A device that is unknown, not compiled in, or fails to initialise.
    Device(String),
    /// Any other failure reported by candle.
    Candle(candle::Error),
    /// A Rust panic caught at the Python boundary.
    Panic(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn config(field: &str, msg: impl Into<String>) -> Self {
        Error::Config {
            field: field.to_string(),
            msg: msg.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config { field, msg } => write!(f, "invalid config field `{field}`: {msg}"),
            Error::UnsupportedKvRepeat { kv_repeat } => write!(
                f,
                "kv_repeat={kv_repeat} is not supported: Mimi's streaming attention only \
                 supports kv_repeat=1 (one key/value head per query head); set kv_repeat=1"
            ),
            Error::DepthMismatch { dst, src } => write!(
                f,
                "cannot copy the streaming state of a transformer with {src} layers into one \
                 with {dst} layers; build both transformers from the same config"
            ),
            Error::IncompatibleState(msg) => write!(f, "{msg}"),
            Error::Shape(msg)
            | Error::DType(msg)
            | Error::InvalidInput(msg)
            | Error::Resource(msg)
            | Error::Weights(msg)
            | Error::Device(msg) => {
                write!(f, "{msg}")
            }
            Error::WeightsIo { msg, source } => write!(f, "{msg}: {source}"),
            Error::Candle(e) => write!(f, "candle error: {e}"),
            Error::Panic(msg) => write!(
                f,
                "internal error (a Rust panic was caught; please report it): {msg}"
            ),
        }
    }
}

impl std::error::Error for Error {}

impl From<candle::Error> for Error {
    fn from(e: candle::Error) -> Self {
        Error::Candle(e)
    }
}

/// Runs `f`, turning a Rust panic into [`Error::Panic`].
pub fn guarded<R>(f: impl FnOnce() -> Result<R>) -> Result<R> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let msg = if let Some(s) = payload.downcast_ref::<&str>() {
                (*s).to_string()
            } else if let Some(s) = payload.downcast_ref::<String>() {
                s.clone()
            } else {
                "unknown panic payload".to_string()
            };
            Err(Error::Panic(msg))
        }
    }
}

/// Runs `f` on a worker thread while this thread, detached from the interpreter, waits and
/// checks for signals every 50 ms. On Ctrl-C (or any signal handler raising) the call
/// returns that exception at once; `cancel` is set so that `f` stops at its next check, and
/// its result is dropped. For long offline computations whose state is private to the call,
/// so an interrupted call leaves the object usable.
pub fn interruptible<R: Send + 'static>(
    py: Python<'_>,
    f: impl FnOnce(&std::sync::atomic::AtomicBool) -> Result<R> + Send + 'static,
) -> PyResult<R> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{mpsc, Arc};
    let cancel = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    let flag = cancel.clone();
    std::thread::Builder::new()
        .name("mimi_py-worker".into())
        .spawn(move || {
            let r = guarded(|| f(&flag));
            crate::device::trim_heap();
            let _ = tx.send(r);
        })
        .map_err(|e| Error::Panic(format!("cannot start a worker thread: {e}")))?;
    py.detach(move || loop {
        match rx.recv_timeout(std::time::Duration::from_millis(50)) {
            Ok(r) => return r.map_err(PyErr::from),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(Error::Panic("worker thread ended without a result".into()).into())
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Err(e) = Python::attach(|py| py.check_signals()) {
                    cancel.store(true, Ordering::Relaxed);
                    return Err(e);
                }
            }
        }
    })
}

/// Returns an error if `cancel` was set (the caller was interrupted).
pub fn check_cancel(cancel: Option<&std::sync::atomic::AtomicBool>) -> candle::Result<()> {
    if cancel.is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed)) {
        candle::bail!("cancelled")
    }
    Ok(())
}

/// The exception classes, created once per interpreter.
pub struct ExceptionTypes {
    pub mimi: Py<PyType>,
    pub config: Py<PyType>,
    pub unsupported_kv_repeat: Py<PyType>,
    pub incompatible_state: Py<PyType>,
    pub depth_mismatch: Py<PyType>,
    pub shape: Py<PyType>,
    pub dtype: Py<PyType>,
    pub invalid_input: Py<PyType>,
    pub resource: Py<PyType>,
    pub weights: Py<PyType>,
    pub device: Py<PyType>,
    pub compute: Py<PyType>,
    pub internal: Py<PyType>,
}

static TYPES: PyOnceLock<ExceptionTypes> = PyOnceLock::new();

fn make_type<'py>(
    py: Python<'py>,
    name: &str,
    bases: &[Bound<'py, PyAny>],
    doc: &str,
) -> PyResult<Py<PyType>> {
    let dict = PyDict::new(py);
    dict.set_item("__module__", "mimi_py")?;
    dict.set_item("__doc__", doc)?;
    let bases = PyTuple::new(py, bases)?;
    let ty = py
        .import("builtins")?
        .getattr("type")?
        .call1((name, bases, dict))?;
    Ok(ty.cast_into::<PyType>()?.unbind())
}

fn build_types(py: Python<'_>) -> PyResult<ExceptionTypes> {
    let exc = py.get_type::<pyo3::exceptions::PyException>().into_any();
    let value = py.get_type::<PyValueError>().into_any();
    let type_err = py.get_type::<PyTypeError>().into_any();
    let runtime = py.get_type::<PyRuntimeError>().into_any();

    let mimi = make_type(
        py,
        "MimiError",
        &[exc],
        "Base class of every error raised by mimi_py.",
    )?;
    let m = mimi.bind(py).clone().into_any();
    let config = make_type(
        py,
        "ConfigError",
        &[m.clone(), value.clone()],
        "An invalid or unsupported configuration value; the message names the field.",
    )?;
    let unsupported_kv_repeat = make_type(
        py,
        "UnsupportedKvRepeatError",
        &[config.bind(py).clone().into_any()],
        "The config asks for kv_repeat != 1, which Mimi's streaming attention does not support.",
    )?;
    let incompatible_state = make_type(
        py,
        "IncompatibleStateError",
        &[m.clone(), value.clone()],
        "copy_state between transformers whose streaming states have different shapes.",
    )?;
    let depth_mismatch = make_type(
        py,
        "DepthMismatchError",
        &[
            incompatible_state.bind(py).clone().into_any(),
            value.clone(),
        ],
        "copy_state between transformers with different numbers of layers.",
    )?;
    let shape = make_type(
        py,
        "ShapeError",
        &[m.clone(), value.clone()],
        "An input array of the wrong shape; the message gives the expected shape.",
    )?;
    let dtype = make_type(
        py,
        "DTypeError",
        &[m.clone(), type_err],
        "An input array whose dtype is not a real floating type.",
    )?;
    let invalid_input = make_type(
        py,
        "InvalidInputError",
        &[m.clone(), value.clone()],
        "An input whose values are not accepted (codes out of range, NaN/Inf audio).",
    )?;
    let resource = make_type(
        py,
        "ResourceError",
        &[m.clone(), py.get_type::<PyMemoryError>().into_any()],
        "A call that needs more memory than is available; the message says how much.",
    )?;
    let weights = make_type(
        py,
        "WeightsError",
        &[m.clone(), value],
        "A missing, mis-shaped or mistyped tensor, or an unreadable checkpoint.",
    )?;
    let device = make_type(
        py,
        "DeviceError",
        &[m.clone(), runtime.clone()],
        "A device that is unknown, not compiled into this build, or failed to initialise.",
    )?;
    let compute = make_type(
        py,
        "ComputeError",
        &[m.clone(), runtime.clone()],
        "A failure reported by candle while computing.",
    )?;
    let internal = make_type(
        py,
        "InternalError",
        &[m, runtime],
        "A bug in mimi_py (a Rust panic caught at the boundary); please report it.",
    )?;
    Ok(ExceptionTypes {
        mimi,
        config,
        unsupported_kv_repeat,
        incompatible_state,
        depth_mismatch,
        shape,
        dtype,
        invalid_input,
        resource,
        weights,
        device,
        compute,
        internal,
    })
}

pub fn types(py: Python<'_>) -> &ExceptionTypes {
    TYPES.get_or_init(py, || {
        build_types(py).expect("creating mimi_py's exception classes")
    })
}

/// Registers the exception classes on the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let t = types(py);
    for ty in [
        &t.mimi,
        &t.config,
        &t.unsupported_kv_repeat,
        &t.incompatible_state,
        &t.depth_mismatch,
        &t.shape,
        &t.dtype,
        &t.invalid_input,
        &t.resource,
        &t.weights,
        &t.device,
        &t.compute,
        &t.internal,
    ] {
        let ty = ty.bind(py);
        m.add(ty.name()?, ty)?;
    }
    Ok(())
}

impl Error {
    pub fn into_pyerr(self, py: Python<'_>) -> PyErr {
        let t = types(py);
        let ty = match &self {
            Error::Config { .. } => &t.config,
            Error::UnsupportedKvRepeat { .. } => &t.unsupported_kv_repeat,
            Error::DepthMismatch { .. } => &t.depth_mismatch,
            Error::IncompatibleState(_) => &t.incompatible_state,
            Error::Shape(_) => &t.shape,
            Error::DType(_) => &t.dtype,
            Error::InvalidInput(_) => &t.invalid_input,
            Error::Resource(_) => &t.resource,
            Error::Weights(_) | Error::WeightsIo { .. } => &t.weights,
            Error::Device(_) => &t.device,
            Error::Candle(_) => &t.compute,
            Error::Panic(_) => &t.internal,
        };
        let err = PyErr::from_type(ty.bind(py).clone(), self.to_string());
        if let Error::WeightsIo { source, .. } = &self {
            let io = std::io::Error::new(source.kind(), source.to_string());
            err.set_cause(py, Some(PyErr::from(io)));
        }
        err
    }
}

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        Python::attach(|py| e.into_pyerr(py))
    }
}
