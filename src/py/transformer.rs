//! `StreamingTransformer`: the Python class around [`Transformer`].
//!
//! Arguments are extracted and validated while attached; every piece of candle work runs
//! through [`guard::detached`], which takes the state's lock only while detached and
//! catches panics.

use crate::py::config::{self as pyconfig, PyTransformerConfig};
use crate::py::convert;
use crate::py::errors::PyResult;
use crate::py::guard::{self, Detached, Reset, Shared};
use crate::py::row_args;
use crate::py::weights::WeightsArg;
use mimi_core::config::TransformerConfig;
use mimi_core::error::Result;
use mimi_core::host::HostInput;
use mimi_core::runtime::device;
use mimi_core::runtime::precision::Precision;
use mimi_core::transformer::{State, Transformer, Workspace};
use mimi_core::weights::{LoadSpec, QkLayout, TensorSource};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::{Arc, Mutex};

/// Kyutai's Mimi streaming transformer, computed by candle, with an exact streaming state.
///
/// Every query attends to exactly the last ``context`` positions (itself included), however
/// the input is split into calls; ``reset_state()`` returns to a fresh stream;
/// ``copy_state()`` / ``clone()`` copy the whole state (independent afterwards); a stream
/// can run for any number of steps with memory bounded by ``context``.
///
/// Objects can be shared between threads: calls on one object serialize, and the GIL is
/// released while computing.
#[pyclass(name = "StreamingTransformer", module = "mimi_py._core", frozen)]
pub struct PyStreamingTransformer {
    model: Arc<Transformer>,
    state: Shared<State>,
    /// The planned step's working memory, used under the state's lock (holding nothing
    /// between calls, so a panic inside one leaves nothing to repair).
    ws: Mutex<Workspace>,
    config: TransformerConfig,
    device_name: String,
    dtype_name: &'static str,
}

impl Reset for State {
    fn reset(&mut self) {
        State::reset(self)
    }
}

impl PyStreamingTransformer {
    /// Converts, validates and runs one call; with `active`, only those rows step.
    fn run<'py>(
        &self,
        py: Python<'py>,
        x: &Bound<'py, PyAny>,
        active: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let arr = convert::as_ndarray(x, "x")?;
        convert::check_float(&arr, "x")?;
        let shape = self.model.check_call(&convert::shape_of(&arr))?;
        let active = row_args::active(active, shape.dims()[0])?;
        let host = HostInput::Shaped(shape, convert::copy_f32(&arr, "x")?);
        let (model, state, ws) = (self.model.clone(), &self.state, &self.ws);
        let out = guard::detached(py, move |d| {
            let mut state = state.lock(d)?;
            let mut ws = ws.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            model.forward_host((&mut state, &mut ws), host, active)
        })?;
        Ok(convert::to_numpy(py, out.data, &out.shape)?)
    }

    fn fork(&self, py: Python<'_>) -> PyResult<Self> {
        let state = &self.state;
        let copied = guard::detached(py, |d| state.lock(d)?.deep_copy())?;
        Ok(Self {
            model: self.model.clone(),
            state: Shared::new(copied),
            ws: Mutex::default(),
            config: self.config.clone(),
            device_name: self.device_name.clone(),
            dtype_name: self.dtype_name,
        })
    }

    /// Test hook: panics while holding the state's lock (see `_poison_for_tests`).
    pub(crate) fn poison(&self, d: &Detached) -> Result<()> {
        let _held = self.state.lock(d)?;
        panic!("forced panic while holding the stream's lock")
    }
}

#[pymethods]
impl PyStreamingTransformer {
    #[new]
    #[pyo3(signature = (config=None, weights=None, *, seed=None, device="cpu", dtype="float32", prefix="", qk_layout="interleaved", precision=None, weights_dtype=None))]
    #[allow(clippy::too_many_arguments)]
    fn py_new(
        py: Python<'_>,
        config: Option<&Bound<'_, PyAny>>,
        weights: Option<&Bound<'_, PyAny>>,
        seed: Option<&Bound<'_, PyAny>>,
        device: &str,
        dtype: &str,
        prefix: &str,
        qk_layout: &str,
        precision: Option<String>,
        weights_dtype: Option<String>,
    ) -> PyResult<Self> {
        let config = pyconfig::transformer_config(config)?;
        let seed = seed.map(|s| pyconfig::arg::<u64>("seed", s)).transpose()?;
        let layout = QkLayout::parse(qk_layout)?;
        let (dtype, dtype_name) = device::parse_dtype(dtype)?;
        let expected = "a path to a .safetensors file";
        let source = crate::py::weights::read(weights, seed.unwrap_or(0), prefix, expected)?;
        let (device_spec, prefix, cfg) = (device.to_string(), prefix.to_string(), config.clone());
        let (model, device_name) = guard::detached(py, move |_| {
            let (dev, device_name) = device::parse_device(&device_spec)?;
            let (p, w) = (precision.as_deref(), weights_dtype.as_deref());
            let precision = Precision::from_args(p, w, &dev, dtype)?;
            let src = match source {
                WeightsArg::Seed(seed) => TensorSource::seeded(seed, cfg.layer_scale),
                WeightsArg::Path(path) => TensorSource::file(&path)?,
                WeightsArg::Mapping(m) => TensorSource::host(m, "weights mapping")?,
            };
            let spec = LoadSpec {
                prefix: &prefix,
                layout,
                device: &dev,
                dtype,
                precision,
            };
            let model = Transformer::load(&cfg, &src, &spec)?;
            Ok((model, device_name))
        })?;
        Ok(Self {
            model: Arc::new(model),
            state: Shared::default(),
            ws: Mutex::default(),
            config,
            device_name,
            dtype_name,
        })
    }

    /// Runs ``x`` of shape (batch, time, d_model) through the transformer, continuing the
    /// stream; returns a new float32 array of the same shape. Any real floating dtype and
    /// any memory layout is accepted.
    fn forward<'py>(&self, py: Python<'py>, x: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        self.run(py, x, None)
    }

    /// Like ``forward``; ``step(None)`` returns ``None`` (an empty stream step).
    ///
    /// ``active``: a boolean array of shape ``(batch,)``. Only the rows where it is True step;
    /// the others keep their state bit for bit, whatever ``x`` holds there, and their output
    /// rows are zeros. Each row continues its own stream at its own position.
    #[pyo3(signature = (x, *, active=None))]
    fn step<'py>(
        &self,
        py: Python<'py>,
        x: Option<&Bound<'py, PyAny>>,
        active: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        match x {
            None => Ok(None),
            Some(x) => self.run(py, x, active).map(Some),
        }
    }

    /// Starts a fresh stream: afterwards the transformer behaves exactly like a newly built
    /// one with the same weights (position 0, empty history, any batch size).
    ///
    /// ``rows`` (row indices or a boolean mask over the batch) resets only those rows: each
    /// starts a fresh stream at position 0, and the other rows continue untouched.
    #[pyo3(signature = (rows=None))]
    fn reset_state(&self, py: Python<'_>, rows: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let rows = row_args::rows(rows)?;
        let state = &self.state;
        guard::detached(py, |d| match rows {
            None => {
                state.reset(d);
                Ok(())
            }
            Some(rows) => {
                let mut st = state.lock(d)?;
                let rows = rows.resolve(st.batch())?;
                st.reset_rows(&rows);
                Ok(())
            }
        })
    }

    /// Makes this transformer continue exactly as ``other`` would: copies ``other``'s whole
    /// streaming state (position and key/value history of every layer) into this one.
    ///
    /// This is a copy, not shared-until-write: it costs one copy of the state (at most
    /// ``2 * num_layers * batch * context * d_model`` values), never a recomputation, and
    /// the two transformers are independent afterwards. The weights are not copied.
    /// Raises ``DepthMismatchError`` if the depths differ and ``IncompatibleStateError`` if
    /// the states have other shapes (heads, context, dtype, device); neither state changes.
    fn copy_state(
        &self,
        py: Python<'_>,
        other: &Bound<'_, PyStreamingTransformer>,
    ) -> PyResult<()> {
        let other = other.get();
        if std::ptr::eq(other, self) {
            return Ok(());
        }
        self.model.check_state_source(&other.model)?;
        let (src_state, dst_state) = (&other.state, &self.state);
        let model = self.model.clone();
        guard::detached(py, move |d| {
            // Snapshot the source, then install it: never hold both locks at once.
            let copied = model.fitting(src_state.lock(d)?.deep_copy()?)?;
            *dst_state.lock(d)? = copied;
            Ok(())
        })
    }

    /// A new transformer sharing these (immutable) weights, with a copy of the current
    /// streaming state; the two are independent afterwards.
    fn clone(&self, py: Python<'_>) -> PyResult<Self> {
        self.fork(py)
    }

    fn __copy__(&self, py: Python<'_>) -> PyResult<Self> {
        self.fork(py)
    }

    fn __deepcopy__(&self, py: Python<'_>, _memo: &Bound<'_, PyAny>) -> PyResult<Self> {
        self.fork(py)
    }

    fn __reduce__(&self) -> PyResult<()> {
        Err(PyTypeError::new_err(
            "a StreamingTransformer cannot be pickled; save its weights with state_dict() and \
             rebuild it with StreamingTransformer(config, weights)",
        )
        .into())
    }

    /// The weights as a dict of float32 numpy arrays, under candle's tensor names (no
    /// prefix) with q/k in the interleaved layout.
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let model = self.model.clone();
        let tensors = guard::detached(py, move |_| model.weights_host())?;
        let d = PyDict::new(py);
        for (k, a) in tensors {
            d.set_item(k, convert::to_numpy(py, a.data, &a.shape)?)?;
        }
        Ok(d)
    }

    #[getter]
    fn config(&self) -> PyTransformerConfig {
        PyTransformerConfig(self.config.clone())
    }

    #[getter]
    fn num_layers(&self) -> usize {
        self.config.num_layers
    }

    #[getter]
    fn d_model(&self) -> usize {
        self.config.d_model
    }

    #[getter]
    fn context(&self) -> usize {
        self.config.context
    }

    #[getter]
    fn device(&self) -> String {
        self.device_name.clone()
    }

    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype_name
    }

    /// How the linear layers' weights are stored: "float32" or "bfloat16".
    #[getter]
    fn weights_dtype(&self) -> &'static str {
        self.model.precision().weights_dtype()
    }

    /// How the linear layers compute: "highest", "high" or "medium".
    #[getter]
    fn precision(&self) -> &'static str {
        self.model.precision().name()
    }

    /// The instruction set the products run with; `None` off the native CPU path.
    #[getter]
    fn kernel_isa(&self) -> Option<&'static str> {
        let m = &self.model;
        mimi_core::kernels::bf16dot::kernel_isa(m.precision(), m.device(), m.dtype())
    }

    /// Bytes of the weights one step reads, as stored.
    #[getter]
    fn weights_nbytes(&self) -> usize {
        self.model.weights_nbytes()
    }

    /// Time steps consumed since construction or the last ``reset_state()``. For a batch whose
    /// rows were reset or masked on their own, the largest of ``positions``.
    #[getter]
    fn position(&self, py: Python<'_>) -> PyResult<u64> {
        let state = &self.state;
        guard::detached(py, |d| Ok(state.lock(d)?.position()))
    }

    /// Each row's steps since its own start or ``reset_state``, int64 of shape ``(batch,)``
    /// (empty before the first call).
    #[getter]
    fn positions<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let state = &self.state;
        let pos = guard::detached(py, |d| Ok(state.lock(d)?.positions().to_vec()))?;
        let pos: Vec<i64> = pos.into_iter().map(|p| p as i64).collect();
        let n = pos.len();
        Ok(convert::to_numpy(py, pos, &[n])?)
    }

    /// Batch size of the current stream, or ``None`` before the first call.
    #[getter]
    fn batch_size(&self, py: Python<'_>) -> PyResult<Option<usize>> {
        let state = &self.state;
        guard::detached(py, |d| Ok(state.lock(d)?.batch()))
    }

    /// Bytes held by the streaming state (bounded by ``context``, not by the stream length).
    #[getter]
    fn state_nbytes(&self, py: Python<'_>) -> PyResult<usize> {
        let state = &self.state;
        guard::detached(py, |d| Ok(state.lock(d)?.nbytes()))
    }

    fn __repr__(&self) -> String {
        format!(
            "StreamingTransformer(d_model={}, num_heads={}, num_layers={}, context={}, \
             device='{}', dtype='{}')",
            self.config.d_model,
            self.config.num_heads,
            self.config.num_layers,
            self.config.context,
            self.device_name,
            self.dtype_name
        )
    }
}
