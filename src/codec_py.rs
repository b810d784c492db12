//! `MimiCodec`: the Python class around [`crate::codec::Codec`].

use crate::codec::{self, CheckpointLayout, Codec, CodecWeights, DecodeStream, EncodeStream};
use crate::codec_config::CodecConfig;
use crate::convert::{self, HostArray};
use crate::device;
use crate::errors::{guarded, interruptible, Error, Result};
use candle::{DType, Device, Tensor};
use numpy::ndarray::{ArrayD, IxDyn};
use numpy::{
    IntoPyArray, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyMapping, PyString};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

/// The Mimi audio codec: 24 kHz audio <-> discrete codes at 12.5 Hz, offline and streaming.
///
/// Offline calls (``encode``/``decode``) use private state: they never disturb, and are not
/// disturbed by, the streaming state, and several threads may run them on one codec at once
/// (the GIL is released). Streaming calls (``encode_step``/``decode_step``) continue one
/// encoder stream and one decoder stream; calls on each serialize.
#[pyclass(module = "mimi_py._core", frozen)]
pub struct MimiCodec {
    codec: Arc<Codec>,
    enc: Mutex<Option<EncodeStream>>,
    dec: Mutex<Option<DecodeStream>>,
    device_name: String,
    dtype_name: &'static str,
    layout: Option<CheckpointLayout>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

enum RawSource {
    File(PathBuf),
    Arrays(HashMap<String, HostArray>),
    Seed(u64),
}

fn read_file_tensors(path: &Path) -> Result<HashMap<String, Tensor>> {
    let st = crate::weights::open_safetensors(path)?;
    let mut out = HashMap::new();
    for (name, view) in st.tensors() {
        let t = st.load(&name, &Device::Cpu).map_err(|e| {
            Error::Weights(format!(
                "checkpoint {}: could not read tensor {name:?}: {e}",
                path.display()
            ))
        })?;
        // The tensor is copied out: give its pages of the mapping back, so that the file
        // does not add its whole size to the peak memory of loading.
        crate::weights::release_mapped(view.data());
        out.insert(name, t);
    }
    Ok(out)
}

fn check_codes_dtype(a: &Bound<'_, PyUntypedArray>) -> PyResult<()> {
    let kind = a.dtype().kind();
    if kind != b'i' && kind != b'u' {
        let name = a.dtype().str().map(|s| s.to_string()).unwrap_or_default();
        return Err(Error::DType(format!(
            "codes must be an integer array (e.g. uint32 or int64), got dtype {name}"
        ))
        .into());
    }
    Ok(())
}

/// Reads integer codes into u32, checking the range.
fn read_codes(a: &Bound<'_, PyUntypedArray>, bins: usize) -> PyResult<Vec<u32>> {
    check_codes_dtype(a)?;
    convert::check_size(a.shape(), "codes")?;
    let out_of_range = |v: &dyn std::fmt::Display| -> PyErr {
        Error::InvalidInput(format!(
            "code {v} is out of range: codes must be in [0, {bins}) (the codebook size)"
        ))
        .into()
    };
    let mut out = Vec::with_capacity(a.len());
    if a.dtype().kind() == b'u' {
        let conv = a.call_method1("astype", ("uint64", "C"))?;
        let arr = conv.cast_into::<PyArrayDyn<u64>>().map_err(PyErr::from)?;
        let ro = arr.try_readonly()?;
        for &v in ro.as_array().iter() {
            if v >= bins as u64 {
                return Err(out_of_range(&v));
            }
            out.push(v as u32);
        }
    } else {
        let conv = a.call_method1("astype", ("int64", "C"))?;
        let arr = conv.cast_into::<PyArrayDyn<i64>>().map_err(PyErr::from)?;
        let ro = arr.try_readonly()?;
        for &v in ro.as_array().iter() {
            if v < 0 || v as u64 >= bins as u64 {
                return Err(out_of_range(&v));
            }
            out.push(v as u32);
        }
    }
    Ok(out)
}

fn u32_to_numpy<'py>(
    py: Python<'py>,
    data: Vec<u32>,
    shape: &[usize],
) -> PyResult<Bound<'py, PyAny>> {
    let arr = ArrayD::from_shape_vec(IxDyn(shape), data)
        .map_err(|e| Error::Shape(format!("internal shape error: {e}")))?;
    Ok(arr.into_pyarray(py).into_any())
}

fn tensor_f32(t: &Tensor) -> Result<(Vec<f32>, Vec<usize>)> {
    Ok((
        t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?,
        t.dims().to_vec(),
    ))
}

fn tensor_u32(t: &Tensor) -> Result<(Vec<u32>, Vec<usize>)> {
    Ok((t.flatten_all()?.to_vec1::<u32>()?, t.dims().to_vec()))
}

impl MimiCodec {
    fn n_channels(&self) -> usize {
        self.codec.config().channels
    }

    /// pcm: (batch, channels, samples) or (samples,) -> checked host array (B, C, S).
    fn read_pcm(&self, x: &Bound<'_, PyAny>) -> PyResult<HostArray> {
        let arr = convert::as_ndarray(x, "pcm")?;
        convert::check_float(&arr, "pcm")?;
        let shape = convert::shape_of(&arr);
        let c = self.n_channels();
        let shape3 = match shape.as_slice() {
            [s] if c == 1 => vec![1, 1, *s],
            [b, ch, s] if *ch == c && *b >= 1 => vec![*b, *ch, *s],
            _ => {
                return Err(Error::Shape(format!(
                    "pcm must have shape (batch, channels={c}, samples){}, got {shape:?}{}",
                    if c == 1 { " or (samples,)" } else { "" },
                    if shape.len() == 2 {
                        "; for mono audio of shape (batch, samples) use pcm[:, None, :]"
                    } else {
                        ""
                    }
                ))
                .into())
            }
        };
        convert::check_size(&shape3, "pcm")?;
        let needed = self.codec.offline_memory(shape3[0], shape3[2]);
        device::check_memory(
            needed,
            "this call",
            "encode long audio in chunks with encode_step (or the CLI, which streams)",
        )?;
        let mut host = convert::read_f32_finite(&arr, "pcm")?;
        host.shape = shape3;
        Ok(host)
    }

    /// Refuses decodes whose audio, or the decoder's activations, cannot fit in memory.
    fn check_decode_size(&self, shape: &[usize]) -> PyResult<()> {
        let samples = shape[2].saturating_mul(self.codec.config().frame_size());
        convert::check_size(&[shape[0], self.n_channels(), samples], "decoded audio")?;
        device::check_memory(
            self.codec.offline_memory(shape[0], samples),
            "this call",
            "decode long code sequences in shorter chunks (decode_step streams them)",
        )?;
        Ok(())
    }

    /// codes: (batch, num_codebooks, frames) integers -> (data, shape).
    fn read_codes_arg(&self, x: &Bound<'_, PyAny>) -> PyResult<(Vec<u32>, Vec<usize>)> {
        let arr = convert::as_ndarray(x, "codes")?;
        check_codes_dtype(&arr)?;
        let shape = convert::shape_of(&arr);
        let k = self.codec.config().quantizer_n_q;
        match shape.as_slice() {
            [b, n, _] if *n == k && *b >= 1 => {}
            _ => {
                return Err(Error::Shape(format!(
                    "codes must have shape (batch, num_codebooks={k}, frames), got {shape:?}"
                ))
                .into())
            }
        }
        let data = read_codes(&arr, self.codec.config().quantizer_bins)?;
        Ok((data, shape))
    }
}

#[pymethods]
impl MimiCodec {
    #[new]
    #[pyo3(signature = (weights=None, *, config=None, num_codebooks=None, seed=None, device="cpu", dtype="float32"))]
    #[allow(clippy::too_many_arguments)]
    fn py_new(
        py: Python<'_>,
        weights: Option<&Bound<'_, PyAny>>,
        config: Option<&Bound<'_, PyAny>>,
        num_codebooks: Option<&Bound<'_, PyAny>>,
        seed: Option<&Bound<'_, PyAny>>,
        device: &str,
        dtype: &str,
    ) -> PyResult<Self> {
        let (dtype, dtype_name) = device::parse_dtype(dtype)?;
        if dtype != DType::F32 {
            // candle's SEANet convolutions mix float32 padding with the weights' dtype and fail
            // at the first call; refuse up front until the codec has its own conv path.
            return Err(Error::config(
                "dtype",
                format!("the codec computes in float32 only for now, got {dtype_name:?}; use dtype=\"float32\""),
            )
            .into());
        }
        let seed = seed.map(crate::config::get_seed).transpose()?.unwrap_or(0);
        let num_codebooks = num_codebooks
            .map(|v| crate::config::get_usize("num_codebooks", v))
            .transpose()?;
        let mut cfg: Option<CodecConfig> = match config {
            None => None,
            Some(c) => Some(if let Ok(c) = c.cast::<CodecConfig>() {
                c.get().clone()
            } else if let Ok(d) = c.cast::<PyDict>() {
                CodecConfig::from_kwargs(Some(d))?
            } else {
                return Err(PyTypeError::new_err(
                    "config must be a CodecConfig or a dict",
                ));
            }),
        };
        let source = match weights {
            None => RawSource::Seed(seed),
            Some(w) => {
                if let Ok(m) = w.cast::<PyMapping>() {
                    let mut arrays = HashMap::new();
                    for item in m.items()?.iter() {
                        let (k, v): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item.extract()?;
                        let key = k
                            .cast::<PyString>()
                            .map_err(|_| PyTypeError::new_err("weights mapping keys must be str"))?
                            .to_string();
                        let arr = convert::as_ndarray(&v, &format!("weights[{key:?}]"))?;
                        if arr.dtype().kind() != b'f' {
                            return Err(Error::Weights(format!(
                                "tensor {key:?} has a non-floating dtype"
                            ))
                            .into());
                        }
                        arrays.insert(
                            key.clone(),
                            convert::read_f32(&arr, &format!("weights[{key:?}]"))?,
                        );
                    }
                    RawSource::Arrays(arrays)
                } else if w.is_instance_of::<PyString>() || w.hasattr("__fspath__").unwrap_or(false)
                {
                    let path: PathBuf = py.import("os")?.call_method1("fspath", (w,))?.extract()?;
                    if path.is_dir() {
                        let json = path.join("config.json");
                        if cfg.is_none() && json.is_file() {
                            let text =
                                std::fs::read_to_string(&json).map_err(|e| Error::WeightsIo {
                                    msg: format!("cannot read {}", json.display()),
                                    source: e,
                                })?;
                            let d =
                                py.import("json")?
                                    .call_method1("loads", (text,))
                                    .map_err(|e| {
                                        Error::Weights(format!(
                                            "{} is not valid JSON: {}",
                                            json.display(),
                                            e.value(py)
                                        ))
                                    })?;
                            let d = d.cast::<PyDict>().map_err(|_| {
                                Error::Weights(format!("{} is not a JSON object", json.display()))
                            })?;
                            cfg = Some(CodecConfig::from_hf(d, num_codebooks)?);
                        }
                        let file = path.join("model.safetensors");
                        if !file.is_file() {
                            return Err(Error::Weights(format!(
                                "directory {} has no model.safetensors",
                                path.display()
                            ))
                            .into());
                        }
                        RawSource::File(file)
                    } else {
                        RawSource::File(path)
                    }
                } else {
                    return Err(PyTypeError::new_err(format!(
                        "weights must be a checkpoint path (file or directory), a mapping of \
                         names to numpy arrays, or None; got {}",
                        w.get_type().name()?
                    )));
                }
            }
        };
        let mut cfg = cfg.unwrap_or_else(|| CodecConfig::mimi_preset(8));
        if let Some(n) = num_codebooks {
            if n == 0 {
                return Err(Error::config("num_codebooks", "must be at least 1").into());
            }
            cfg.quantizer_n_q = n;
        }
        let tr_params: u64 = crate::weights::expected_tensors(&cfg.transformer)
            .iter()
            .map(|(_, s)| s.iter().map(|&d| d as u64).product::<u64>())
            .sum();
        let codebooks = (cfg.quantizer_n_q as u64)
            .saturating_mul(cfg.quantizer_bins as u64)
            .saturating_mul(cfg.quantizer_dim as u64 + 2);
        device::check_memory(
            (2 * tr_params + codebooks).saturating_mul(12),
            "this codec's weights",
            "check the config's sizes (quantizer_bins, quantizer_dim, transformer)",
        )?;
        let device_spec = device.to_string();
        let (codec, device_name, layout) = py.detach(move || {
            guarded(|| {
                let (dev, device_name) = device::parse_device(&device_spec)?;
                let (weights, layout) = match source {
                    RawSource::Seed(s) => (CodecWeights::Seed(s), None),
                    other => {
                        let (raw, origin) = match other {
                            RawSource::File(p) => (read_file_tensors(&p)?, format!("checkpoint {}", p.display())),
                            RawSource::Arrays(a) => {
                                let mut m = HashMap::new();
                                for (k, v) in a {
                                    let t = Tensor::from_vec(v.data, v.shape.as_slice(), &Device::Cpu)?;
                                    m.insert(k, t);
                                }
                                (m, "weights mapping".to_string())
                            }
                            RawSource::Seed(_) => unreachable!(),
                        };
                        let layout = codec::detect_layout(raw.keys()).ok_or_else(|| {
                            Error::Weights(format!(
                                "{origin}: not a Mimi checkpoint: expected the tensor names of \
                                 kyutai/mimi's model.safetensors (encoder.layers.*, \
                                 encoder_transformer.layers.*) or of Kyutai's moshi checkpoint \
                                 (encoder.model.*, encoder_transformer.transformer.layers.*)"
                            ))
                        })?;
                        let tensors = codec::normalize_checkpoint(raw, layout, &cfg)?;
                        let available = codec::available_codebooks(&tensors);
                        if cfg.quantizer_n_q > available {
                            return Err(Error::Weights(format!(
                                "{origin}: asked for {} codebooks but the checkpoint has {available}",
                                cfg.quantizer_n_q
                            )));
                        }
                        (CodecWeights::Tensors(tensors, origin), Some(layout))
                    }
                };
                let codec = Codec::new(&cfg, weights, &dev, dtype)?;
                Ok((codec, device_name, layout))
            })
        })?;
        Ok(Self {
            codec: Arc::new(codec),
            enc: Mutex::new(None),
            dec: Mutex::new(None),
            device_name,
            dtype_name,
            layout,
        })
    }

    /// Audio to codes. ``pcm``: (batch, channels, samples) or (samples,), any real float
    /// dtype, at ``sample_rate``. Returns uint32 codes of shape (batch, num_codebooks,
    /// ceil(samples / frame_size)); a last partial frame is zero-padded.
    fn encode<'py>(&self, py: Python<'py>, pcm: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let host = self.read_pcm(pcm)?;
        let (b, k) = (host.shape[0], self.codec.config().quantizer_n_q);
        if host.shape[2] == 0 {
            return u32_to_numpy(py, vec![], &[b, k, 0]);
        }
        let codec = self.codec.clone();
        let (data, shape) = interruptible(py, move |cancel| {
            let x = Tensor::from_vec(host.data, host.shape.as_slice(), codec.device())?
                .to_dtype(codec.dtype())?;
            tensor_u32(&codec.encode(&x, Some(cancel))?)
        })?;
        u32_to_numpy(py, data, &shape)
    }

    /// Pre-quantization latents: (batch, dimension, frames) float32.
    fn encode_latents<'py>(
        &self,
        py: Python<'py>,
        pcm: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let host = self.read_pcm(pcm)?;
        if host.shape[2] == 0 {
            let dim = self.codec.config().seanet.dimension;
            return Ok(convert::to_numpy(py, vec![], &[host.shape[0], dim, 0])?);
        }
        let codec = self.codec.clone();
        let (data, shape) = interruptible(py, move |cancel| {
            let x = Tensor::from_vec(host.data, host.shape.as_slice(), codec.device())?
                .to_dtype(codec.dtype())?;
            tensor_f32(&codec.encode_pre_quantize(&x, Some(cancel))?)
        })?;
        Ok(convert::to_numpy(py, data, &shape)?)
    }

    /// The quantizer's reconstruction of codes: (batch, dimension, frames) float32.
    fn decode_latents<'py>(
        &self,
        py: Python<'py>,
        codes: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (data, shape) = self.read_codes_arg(codes)?;
        let codec = self.codec.clone();
        let (data, shape) = py.detach(move || {
            guarded(|| {
                let c = Tensor::from_vec(data, shape.as_slice(), codec.device())?;
                tensor_f32(&codec.decode_latent(&c)?)
            })
        })?;
        Ok(convert::to_numpy(py, data, &shape)?)
    }

    /// Codes to audio. ``codes``: integers of shape (batch, num_codebooks, frames) in
    /// [0, cardinality). Returns float32 audio (batch, channels, frames * frame_size).
    fn decode<'py>(
        &self,
        py: Python<'py>,
        codes: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (data, shape) = self.read_codes_arg(codes)?;
        self.check_decode_size(&shape)?;
        if shape[2] == 0 {
            return Ok(convert::to_numpy(
                py,
                vec![],
                &[shape[0], self.n_channels(), 0],
            )?);
        }
        let codec = self.codec.clone();
        let (data, shape) = interruptible(py, move |cancel| {
            let c = Tensor::from_vec(data, shape.as_slice(), codec.device())?;
            tensor_f32(&codec.decode(&c, Some(cancel))?)
        })?;
        Ok(convert::to_numpy(py, data, &shape)?)
    }

    /// Streams audio in: returns the uint32 codes (batch, num_codebooks, n) of every frame this
    /// chunk completes, or ``None`` if it completes none. Chunks may have any length; the
    /// remainder is buffered. Frames are emitted as soon as they are complete, so a stream
    /// gives ``floor(samples / frame_size)`` frames, each equal to the offline codes.
    #[pyo3(signature = (pcm))]
    fn encode_step<'py>(
        &self,
        py: Python<'py>,
        pcm: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(pcm) = pcm else { return Ok(None) };
        let host = self.read_pcm(pcm)?;
        let codec = self.codec.clone();
        let enc = &self.enc;
        let out = py.detach(move || {
            guarded(|| {
                let mut g = lock(enc);
                let stream = g.get_or_insert_with(|| codec.encode_stream());
                if let Some(sb) = stream.batch() {
                    if sb != host.shape[0] {
                        return Err(Error::Shape(format!(
                            "this encoder stream holds state for batch size {sb}, got batch size {}; \
                             call reset_state() before streaming another batch size",
                            host.shape[0]
                        )));
                    }
                }
                if host.shape[2] == 0 {
                    return Ok(None);
                }
                let x = Tensor::from_vec(host.data, host.shape.as_slice(), codec.device())?.to_dtype(codec.dtype())?;
                match codec.encode_step(stream, &x)? {
                    None => Ok(None),
                    Some(c) => Ok(Some(tensor_u32(&c)?)),
                }
            })
        })?;
        match out {
            None => Ok(None),
            Some((d, s)) => Ok(Some(u32_to_numpy(py, d, &s)?)),
        }
    }

    /// Streams codes in: returns the float32 audio (batch, channels, n * frame_size) they
    /// complete, or ``None``. ``decode_step(None)`` returns ``None``.
    #[pyo3(signature = (codes))]
    fn decode_step<'py>(
        &self,
        py: Python<'py>,
        codes: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(codes) = codes else { return Ok(None) };
        let (data, shape) = self.read_codes_arg(codes)?;
        self.check_decode_size(&shape)?;
        let codec = self.codec.clone();
        let dec = &self.dec;
        let out = py.detach(move || {
            guarded(|| {
                let mut g = lock(dec);
                let stream = g.get_or_insert_with(|| codec.decode_stream());
                if let Some(sb) = stream.batch() {
                    if sb != shape[0] {
                        return Err(Error::Shape(format!(
                            "this decoder stream holds state for batch size {sb}, got batch size {}; \
                             call reset_state() before streaming another batch size",
                            shape[0]
                        )));
                    }
                }
                if shape[2] == 0 {
                    return Ok(None);
                }
                let c = Tensor::from_vec(data, shape.as_slice(), codec.device())?;
                match codec.decode_step(stream, &c)? {
                    None => Ok(None),
                    Some(a) => Ok(Some(tensor_f32(&a)?)),
                }
            })
        })?;
        match out {
            None => Ok(None),
            Some((d, s)) => Ok(Some(convert::to_numpy(py, d, &s)?)),
        }
    }

    /// Starts fresh encoder and decoder streams.
    fn reset_state(&self, py: Python<'_>) {
        let (enc, dec) = (&self.enc, &self.dec);
        py.detach(|| {
            *lock(enc) = None;
            *lock(dec) = None;
        });
    }

    #[getter]
    fn sample_rate(&self) -> usize {
        self.codec.config().sample_rate.round() as usize
    }

    #[getter]
    fn frame_rate(&self) -> f64 {
        self.codec.config().frame_rate
    }

    /// Samples per code frame (1920 for the real model: 80 ms at 24 kHz).
    #[getter]
    fn frame_size(&self) -> usize {
        self.codec.config().frame_size()
    }

    #[getter]
    fn num_codebooks(&self) -> usize {
        self.codec.config().quantizer_n_q
    }

    /// Entries per codebook: codes are in [0, cardinality).
    #[getter]
    fn cardinality(&self) -> usize {
        self.codec.config().quantizer_bins
    }

    #[getter]
    fn channels(&self) -> usize {
        self.n_channels()
    }

    #[getter]
    fn config(&self) -> CodecConfig {
        self.codec.config().clone()
    }

    #[getter]
    fn device(&self) -> String {
        self.device_name.clone()
    }

    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype_name
    }

    /// The layout the weights were read in: "hf", "moshi", or None for seeded weights.
    #[getter]
    fn checkpoint_layout(&self) -> Option<&'static str> {
        self.layout.map(|l| l.name())
    }

    fn __reduce__(&self) -> PyResult<()> {
        Err(PyTypeError::new_err(
            "a MimiCodec cannot be pickled; rebuild it from its checkpoint",
        ))
    }

    fn __repr__(&self) -> String {
        let c = self.codec.config();
        format!(
            "MimiCodec(sample_rate={}, frame_rate={}, num_codebooks={}, cardinality={}, device='{}', dtype='{}')",
            c.sample_rate, c.frame_rate, c.quantizer_n_q, c.quantizer_bins, self.device_name, self.dtype_name
        )
    }
}
