//! mimi_py: Kyutai's Mimi streaming transformer and codec for Python, computed by candle.
//!
//! The computation is the `mimi-core` crate (crates/mimi-core), which knows nothing of
//! Python; `py` is the boundary. This file only registers the module. See ARCHITECTURE.md
//! for the map.

mod py;

use crate::py::errors::PyResult;
use pyo3::prelude::*;

#[pymodule(gil_used = false)]
mod _core {
    use super::*;
    use crate::py::guard;
    use pyo3::types::PyFrozenSet;

    #[pymodule_export]
    use crate::py::codec::PyMimiCodec;
    #[pymodule_export]
    use crate::py::config::{PyCodecConfig, PyTransformerConfig};
    #[pymodule_export]
    use crate::py::transformer::PyStreamingTransformer;

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add("__version__", env!("CARGO_PKG_VERSION"))?;
        let features = mimi_core::runtime::device::compiled_features();
        m.add("features", PyFrozenSet::new(m.py(), features)?)?;
        Ok(m.add("candle_version", mimi_core::CANDLE_VERSION)?)
    }

    /// The effective value of every environment switch (docs/settings.md's table), as
    /// strings: `{"MIMI_PY_SPIN": "1", "RAYON_NUM_THREADS": "2", ...}`. Each is read once, on
    /// first use, so set them before the process starts.
    #[pyfunction]
    fn settings() -> std::collections::BTreeMap<&'static str, String> {
        mimi_core::runtime::settings::get()
            .entries()
            .into_iter()
            .collect()
    }

    /// Sets the precision models built from now on take when they are given none
    /// (`"highest"`, `"high"` or `"medium"`; PyTorch's name for its own). Models already
    /// built keep theirs; models off the native CPU engine are always `"highest"`.
    #[pyfunction]
    fn set_float32_matmul_precision(precision: &str) -> PyResult<()> {
        use mimi_core::runtime::precision;
        precision::set_default(precision::Precision::parse(precision)?);
        Ok(())
    }

    /// The precision models built from now on take when they are given none.
    #[pyfunction]
    fn get_float32_matmul_precision() -> &'static str {
        mimi_core::runtime::precision::default().name()
    }

    /// The settings table: `(name, default, what it does)` for every switch.
    #[pyfunction]
    fn _settings_table() -> Vec<(&'static str, &'static str, &'static str)> {
        mimi_core::runtime::settings::TABLE
            .iter()
            .map(|s| (s.name, s.default, s.doc))
            .collect()
    }

    /// Test hook: panics inside the guarded boundary, to show that a Rust panic arrives as
    /// `InternalError` (a `MimiError`), never as `PanicException`.
    #[pyfunction]
    fn _panic_for_tests(py: Python<'_>) -> PyResult<()> {
        guard::detached(py, |_| -> mimi_core::error::Result<()> {
            panic!("forced panic for tests")
        })
    }

    /// Test hook: panics while holding `obj`'s stream lock, poisoning it, to show the one
    /// poison policy (the next call resets the stream and raises `InternalError`).
    #[pyfunction]
    fn _poison_for_tests(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<()> {
        if let Ok(t) = obj.cast::<PyStreamingTransformer>() {
            let t = t.get();
            return guard::detached(py, |d| t.poison(d));
        }
        let c = obj.cast::<PyMimiCodec>()?.get();
        guard::detached(py, |d| c.poison(d))
    }

    /// Test hook: the exception class names the Rust error mapping uses.
    #[pyfunction]
    fn _error_class_names() -> Vec<&'static str> {
        crate::py::errors::class_names()
    }

    /// Device-check hook: this process's fixed-shape transformer steps by what the graph
    /// plan did with them (`eager`, `captured`, `replayed`) and failed captures (`failed`);
    /// all zero unless `MIMI_PY_CUDA_GRAPHS=1` (scripts/gpu_graph_check.py).
    #[pyfunction]
    fn _graph_counts() -> std::collections::BTreeMap<&'static str, u64> {
        mimi_core::gpu::graphs::graph_counts().into_iter().collect()
    }

    /// Device-check hook: why cuDNN convolutions were asked for but not used (libcudnn did not
    /// load), or `None`.
    #[pyfunction]
    fn _cudnn_unavailable() -> Option<String> {
        mimi_core::gpu::cudnn::unavailable()
    }

    /// Test hook: how many input shapes the models have checked in this process.
    #[pyfunction]
    fn _shape_checks_made() -> usize {
        mimi_core::runtime::profile::shape_checks_made()
    }
}
