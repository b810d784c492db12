//! The mapping from the core's [`Error`] to Python exceptions.
//!
//! The classes are declared in `python/mimi_py/errors.py`, under the names of the core's one
//! table, [`ErrorKind`]: each error's kind names its class, looked up in that module when the
//! error is raised. The test hook `_core._error_class_names()` gives the table's names, so
//! that a test checks the two sides (and the README's table) agree.

use mimi_core::error::{Error, ErrorKind};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// Every class name the mapping uses, from the core's table.
pub fn class_names() -> Vec<&'static str> {
    ErrorKind::ALL.iter().map(|k| k.class_name()).collect()
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
    let ty = match class(py, e.kind().class_name()) {
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
