//! mimi_py: Kyutai's Mimi streaming transformer for Python, computed by candle.
//!
//! One file per concern: `errors` (the exception hierarchy and the one error mapping),
//! `config` (`TransformerConfig`), `convert` (numpy <-> host buffers), `device` (devices,
//! dtypes, compiled features), `weights` (names, shapes, loading, q/k layouts), `model` (the
//! transformer and its streaming state, pure Rust) and `transformer` (the Python class).

pub mod codec;
pub mod codec_config;
pub mod codec_py;
pub mod config;
pub mod convert;
pub mod device;
pub mod errors;
pub mod kernels;
pub mod model;
pub mod seanet;
pub mod transformer;
pub mod weights;

use pyo3::prelude::*;

#[pymodule(gil_used = false)]
mod _core {
    use super::*;
    use pyo3::types::PyFrozenSet;

    #[pymodule_export]
    use crate::codec_config::CodecConfig;
    #[pymodule_export]
    use crate::codec_py::MimiCodec;
    #[pymodule_export]
    use crate::config::TransformerConfig;
    #[pymodule_export]
    use crate::transformer::StreamingTransformer;

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add("__version__", env!("CARGO_PKG_VERSION"))?;
        m.add(
            "features",
            PyFrozenSet::new(m.py(), device::compiled_features())?,
        )?;
        m.add("candle_version", "0.11.1")?;
        errors::register(m)
    }

    /// Test hook: panics inside the guarded boundary, to show that a Rust panic arrives as
    /// `InternalError` (a `MimiError`), never as `PanicException`.
    #[pyfunction]
    fn _panic_for_tests(py: Python<'_>) -> PyResult<()> {
        py.detach(|| {
            errors::guarded(|| -> errors::Result<()> { panic!("forced panic for tests") })
        })?;
        Ok(())
    }
}
