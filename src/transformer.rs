//! `StreamingTransformer`: the Python class around [`crate::model::Model`].
//!
//! Arguments are extracted and validated while attached; every piece of candle work runs in
//! `py.detach`, with the state's lock taken inside the detached closure (so a thread waiting
//! for the lock never holds the GIL) and panics caught at the boundary.

use crate::config::TransformerConfig;
use crate::convert::{self, HostArray};
use crate::device;
use crate::errors::{guarded, Error, Result};
use crate::model::{Model, State};
use crate::weights::{self, QkLayout, WeightSource};
use candle::{DType, Tensor};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyMapping, PyString};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// Kyutai's Mimi streaming transformer, computed by candle, with an exact streaming state.
///
/// Every query attends to exactly the last ``context`` positions (itself included), however
/// the input is split into calls; ``reset_state()`` returns to a fresh stream;
/// ``copy_state()`` / ``clone()`` copy the whole state (independent afterwards); a stream
/// can run for any number of steps with memory bounded by ``context``.
///
/// Objects can be shared between threads: calls on one object serialize, and the GIL is
/// released while computing.
#[pyclass(module = "mimi_py._core", frozen)]
pub struct StreamingTransformer {
    model: Arc<Model>,
    state: Mutex<State>,
    config: TransformerConfig,
    device_name: String,
    dtype_name: &'static str,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic while holding the lock is caught and reported; the state it left behind may be
    // half-updated, so start a fresh stream rather than continue from it.
    m.lock().unwrap_or_else(|poisoned| {
        let mut g = poisoned.into_inner();
        g.reset();
        g
    })
}

fn read_weights_mapping(
    mapping: &Bound<'_, PyMapping>,
    prefix: &str,
) -> PyResult<HashMap<String, HostArray>> {
    let mut out = HashMap::new();
    for item in mapping.items()?.iter() {
        let (k, v): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item.extract()?;
        let key = k.cast::<PyString>().map_err(|_| {
            PyTypeError::new_err(format!(
                "weights mapping keys must be str, got {}",
                k.get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default()
            ))
        })?;
        let key = key.to_string();
        if !key.starts_with(prefix) {
            continue;
        }
        let arr = convert::as_ndarray(&v, &format!("weights[{key:?}]"))?;
        let arr = convert::read_f32(&arr, &format!("weights[{key:?}]")).map_err(|e| {
            Python::attach(|py| {
                if e.is_instance_of::<PyTypeError>(py) {
                    Error::Weights(format!(
                        "tensor {key:?} has a non-floating dtype: {}",
                        e.value(py)
                    ))
                    .into_pyerr(py)
                } else {
                    e
                }
            })
        })?;
        out.insert(key, arr);
    }
    Ok(out)
}

impl StreamingTransformer {
    fn check_input(&self, shape: &[usize]) -> Result<()> {
        let d = self.config.d_model;
        let ok = shape.len() == 3 && shape[2] == d && shape[0] >= 1;
        if !ok {
            return Err(Error::Shape(format!(
                "expected an input of shape (batch, time, d_model={d}) with batch >= 1, got {shape:?}"
            )));
        }
        Ok(())
    }

    /// Converts, validates and runs one call; `None` for an empty step.
    fn run<'py>(&self, py: Python<'py>, x: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let arr = convert::as_ndarray(x, "x")?;
        convert::check_float(&arr, "x")?;
        self.check_input(&convert::shape_of(&arr))?;
        let shape = convert::shape_of(&arr);
        let (b, t, d) = (shape[0] as u64, shape[1] as u64, shape[2] as u64);
        // input copy, tensor, output and its copy (4 x 4 bytes) plus the activations of one block
        let block = (self.config.context.max(64) as u64).min(t);
        let heads = self.config.num_heads as u64;
        let needed = (16 * b).saturating_mul(t).saturating_mul(d).saturating_add(
            (4 * b)
                .saturating_mul(block)
                .saturating_mul(16 * d + 3 * heads * (block + self.config.context as u64)),
        );
        device::check_memory(
            needed,
            "this call",
            "split the input into shorter chunks (results do not depend on chunking)",
        )?;
        let host = convert::read_f32_finite(&arr, "x")?;
        let model = self.model.clone();
        let state = &self.state;
        let (data, shape) = py.detach(move || {
            guarded(|| {
                let mut st = lock(state);
                let (b, t, d) = (host.shape[0], host.shape[1], host.shape[2]);
                if let Some(sb) = st.batch() {
                    if sb != b {
                        return Err(Error::Shape(format!(
                            "this stream holds state for batch size {sb}, got an input of batch \
                             size {b}; call reset_state() before streaming another batch size"
                        )));
                    }
                }
                let xs = Tensor::from_vec(host.data, (b, t, d), model.device())?
                    .to_dtype(model.dtype())?;
                let ys = model.forward(&mut st, &xs)?;
                drop(st);
                let data = ys.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
                Ok((data, vec![b, t, d]))
            })
        })?;
        Ok(convert::to_numpy(py, data, &shape)?)
    }

    fn fork(&self, py: Python<'_>) -> PyResult<Self> {
        let state = &self.state;
        let copied = py.detach(|| guarded(|| Ok(lock(state).deep_copy()?)))?;
        Ok(Self {
            model: self.model.clone(),
            state: Mutex::new(copied),
            config: self.config.clone(),
            device_name: self.device_name.clone(),
            dtype_name: self.dtype_name,
        })
    }
}

#[pymethods]
impl StreamingTransformer {
    #[new]
    #[pyo3(signature = (config=None, weights=None, *, seed=None, device="cpu", dtype="float32", prefix="", qk_layout="interleaved"))]
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
    ) -> PyResult<Self> {
        let config = match config {
            None => TransformerConfig::mimi_preset(),
            Some(c) => match c.cast::<TransformerConfig>() {
                Ok(c) => c.get().clone(),
                Err(_) => {
                    if let Ok(d) = c.cast::<PyDict>() {
                        TransformerConfig::from_kwargs(Some(d))?
                    } else {
                        return Err(PyTypeError::new_err(format!(
                            "config must be a TransformerConfig or a dict, got {}",
                            c.get_type().name()?
                        )));
                    }
                }
            },
        };
        config.check_supported()?;
        let seed = seed.map(crate::config::get_seed).transpose()?.unwrap_or(0);
        let layout = QkLayout::parse(qk_layout)?;
        let (dtype, dtype_name) = device::parse_dtype(dtype)?;
        let source = match weights {
            None => WeightSource::Seed(seed),
            Some(w) => {
                if let Ok(m) = w.cast::<PyMapping>() {
                    WeightSource::Arrays(read_weights_mapping(m, prefix)?)
                } else if w.is_instance_of::<PyString>() || w.hasattr("__fspath__").unwrap_or(false)
                {
                    let path: std::path::PathBuf = py
                        .import("os")?
                        .call_method1("fspath", (w,))?
                        .extract()
                        .map_err(|_| PyTypeError::new_err("weights path must be a str path"))?;
                    WeightSource::File(path)
                } else {
                    return Err(PyTypeError::new_err(format!(
                        "weights must be a path to a .safetensors file, a mapping of names to \
                         numpy arrays, or None; got {}",
                        w.get_type().name()?
                    )));
                }
            }
        };
        let params: u64 = weights::expected_tensors(&config)
            .iter()
            .map(|(_, s)| s.iter().map(|&d| d as u64).product::<u64>())
            .sum();
        device::check_memory(
            params * 8,
            &format!("a transformer with {params} parameters"),
            "check the config's sizes",
        )?;
        let device_spec = device.to_string();
        let prefix = prefix.to_string();
        let cfg = config.clone();
        let (model, device_name) = py.detach(move || {
            guarded(|| {
                let (dev, device_name) = device::parse_device(&device_spec)?;
                let w = weights::load(&cfg, source, &prefix, layout, &dev, dtype)?;
                Ok((Model::new(&cfg, w, &dev, dtype)?, device_name))
            })
        })?;
        Ok(Self {
            model: Arc::new(model),
            state: Mutex::new(State::default()),
            config,
            device_name,
            dtype_name,
        })
    }

    /// Runs ``x`` of shape (batch, time, d_model) through the transformer, continuing the
    /// stream; returns a new float32 array of the same shape. Any real floating dtype and
    /// any memory layout is accepted.
    fn forward<'py>(&self, py: Python<'py>, x: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        self.run(py, x)
    }

    /// Like ``forward``; ``step(None)`` returns ``None`` (an empty stream step).
    #[pyo3(signature = (x))]
    fn step<'py>(
        &self,
        py: Python<'py>,
        x: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        match x {
            None => Ok(None),
            Some(x) => self.run(py, x).map(Some),
        }
    }

    /// Starts a fresh stream: afterwards the transformer behaves exactly like a newly built
    /// one with the same weights (position 0, empty history, any batch size).
    fn reset_state(&self, py: Python<'_>) {
        let state = &self.state;
        py.detach(|| lock(state).reset());
    }

    /// Makes this transformer continue exactly as ``other`` would: copies ``other``'s whole
    /// streaming state (position and key/value history of every layer) into this one.
    ///
    /// This is a copy, not shared-until-write: it costs one copy of the state (at most
    /// ``2 * num_layers * batch * context * d_model`` values), never a recomputation, and
    /// the two transformers are independent afterwards. The weights are not copied.
    /// Raises ``DepthMismatchError`` if the depths differ and ``IncompatibleStateError`` if
    /// the states have other shapes (heads, context, dtype, device); neither state changes.
    fn copy_state(&self, py: Python<'_>, other: &Bound<'_, StreamingTransformer>) -> PyResult<()> {
        let other = other.get();
        if std::ptr::eq(other, self) {
            return Ok(());
        }
        let (dst, src) = (self.model.num_layers(), other.model.num_layers());
        if dst != src {
            return Err(Error::DepthMismatch { dst, src }.into());
        }
        let (a, b) = (&self.config, &other.config);
        if a.d_model != b.d_model
            || a.num_heads != b.num_heads
            || a.context != b.context
            || self.dtype_name != other.dtype_name
            || self.device_name != other.device_name
        {
            return Err(Error::IncompatibleState(format!(
                "cannot copy the streaming state: the source has d_model={}, num_heads={}, \
                 context={}, dtype={}, device={} and this transformer has d_model={}, \
                 num_heads={}, context={}, dtype={}, device={}; build both from the same \
                 config, dtype and device",
                b.d_model,
                b.num_heads,
                b.context,
                other.dtype_name,
                other.device_name,
                a.d_model,
                a.num_heads,
                a.context,
                self.dtype_name,
                self.device_name
            ))
            .into());
        }
        let (src_state, dst_state) = (&other.state, &self.state);
        let model = self.model.clone();
        py.detach(move || {
            guarded(|| {
                // Snapshot the source, then install it: never hold both locks at once.
                let copied = lock(src_state).deep_copy()?;
                if !model.state_fits(&copied) {
                    return Err(Error::IncompatibleState(
                        "cannot copy the streaming state: its buffers do not fit this transformer"
                            .into(),
                    ));
                }
                *lock(dst_state) = copied;
                Ok(())
            })
        })?;
        Ok(())
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
        ))
    }

    /// The weights as a dict of float32 numpy arrays, under candle's tensor names (no
    /// prefix) with q/k in the interleaved layout.
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let model = self.model.clone();
        let tensors = py.detach(move || {
            guarded(|| {
                model
                    .weights()
                    .iter()
                    .map(|(k, t)| {
                        let data = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
                        Ok((k.clone(), data, t.dims().to_vec()))
                    })
                    .collect::<Result<Vec<_>>>()
            })
        })?;
        let d = PyDict::new(py);
        for (k, data, shape) in tensors {
            d.set_item(k, convert::to_numpy(py, data, &shape)?)?;
        }
        Ok(d)
    }

    #[getter]
    fn config(&self) -> TransformerConfig {
        self.config.clone()
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

    /// Time steps consumed since construction or the last ``reset_state()``.
    #[getter]
    fn position(&self, py: Python<'_>) -> u64 {
        let state = &self.state;
        py.detach(|| lock(state).position())
    }

    /// Batch size of the current stream, or ``None`` before the first call.
    #[getter]
    fn batch_size(&self, py: Python<'_>) -> Option<usize> {
        let state = &self.state;
        py.detach(|| lock(state).batch())
    }

    /// Bytes held by the streaming state (bounded by ``context``, not by the stream length).
    #[getter]
    fn state_nbytes(&self, py: Python<'_>) -> usize {
        let state = &self.state;
        py.detach(|| lock(state).nbytes())
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
