//! The mapping from the core's [`Error`] to Python exceptions.
//!
//! The classes are declared once, in `python/mimi_py/errors.py`; here each error kind names
//! its class, and the class is looked up in that module when an error is raised. The test
//! hook `_core._error_class_names()` exposes [`CLASS_NAMES`] so that a test can check that
//! the two sides agree.

use mimi_core::error::Error;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// Every class name the mapping uses (checked against `mimi_py.errors.__all__` by a test).
pub const CLASS_NAMES: &[&str] = &[
    "ComputeError",
    "ConfigError",
    "DTypeError",
    "DepthMismatchError",
    "DeviceError",
    "IncompatibleStateError",
    "InternalError",
    "InvalidInputError",
    "ResourceError",
    "ShapeError",
    "UnsupportedKvRepeatError",
    "WeightsError",
];

/// The Python class of each error kind.
fn class_name(e: &Error) -> &'static str {
    match e {
        Error::Config { .. } => "ConfigError",
        Error::UnsupportedKvRepeat { .. } => "UnsupportedKvRepeatError",
        Error::DepthMismatch { .. } => "DepthMismatchError",
        Error::IncompatibleState(_) => "IncompatibleStateError",
        Error::Shape(_) => "ShapeError",
        Error::DType(_) => "DTypeError",
        Error::InvalidInput(_) => "InvalidInputError",
        Error::Resource(_) => "ResourceError",
        Error::Weights(_) | Error::WeightsIo { .. } => "WeightsError",
        Error::Device(_) => "DeviceError",
        Error::Candle(_) => "ComputeError",
        Error::Internal(_) => "InternalError",
        // Never seen in Python: an interrupted call raises the signal handler's exception.
        Error::Cancelled => "InternalError",
    }
}

static ERRORS_MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// The class `name` of `mimi_py.errors`.
fn class<'py>(py: Python<'py>, name: &str) -> pyo3::PyResult<Bound<'py, PyType>> {
    let module =
        ERRORS_MODULE.get_or_try_init(py, || py.import("mimi_py.errors").map(Bound::unbind))?;
    Ok(module.bind(py).getattr(name)?.cast_into::<PyType>()?)
}

/// Converts a core error into its Python exception (an `OSError` cause for I/O failures).
pub fn to_pyerr(py: Python<'_>, e: Error) -> PyErr {
    let ty = match class(py, class_name(&e)) {
        Ok(ty) => ty,
        Err(import_failed) => return import_failed,
    };
    let err = PyErr::from_type(ty, e.to_string());
    if let Error::WeightsIo { source, .. } = &e {
        let io = std::io::Error::new(source.kind(), source.to_string());
        err.set_cause(py, Some(PyErr::from(io)));
    }
    err
}

/// The binding's error: a core [`Error`] (mapped to its class when it reaches Python) or an
/// exception raised by Python itself. The core's `Error` cannot convert into `PyErr` directly
/// (both types are foreign to this crate), so binding functions return [`PyResult`], whose
/// `?` accepts both.
pub enum PyError {
    Core(Error),
    Py(PyErr),
}

/// The result type of every binding function (pyo3 accepts any error that becomes a `PyErr`).
pub type PyResult<T> = std::result::Result<T, PyError>;

impl From<Error> for PyError {
    fn from(e: Error) -> Self {
        PyError::Core(e)
    }
}

impl From<PyErr> for PyError {
    fn from(e: PyErr) -> Self {
        PyError::Py(e)
    }
}

impl<'a, 'py> From<pyo3::CastError<'a, 'py>> for PyError {
    fn from(e: pyo3::CastError<'a, 'py>) -> Self {
        PyError::Py(e.into())
    }
}

impl From<numpy::BorrowError> for PyError {
    fn from(e: numpy::BorrowError) -> Self {
        PyError::Py(e.into())
    }
}

impl From<std::convert::Infallible> for PyError {
    fn from(e: std::convert::Infallible) -> Self {
        match e {}
    }
}

impl From<PyError> for PyErr {
    fn from(e: PyError) -> PyErr {
        match e {
            PyError::Core(e) => Python::attach(|py| to_pyerr(py, e)),
            PyError::Py(e) => e,
        }
    }
}
