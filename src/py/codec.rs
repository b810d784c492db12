//! `MimiCodec`: the Python class around [`Codec`].

use crate::core::codec::{self, CheckpointLayout, Codec, DecodeStream, EncodeStream};
use crate::core::config::CodecConfig;
use crate::core::device;
use crate::core::error::{Error, Result};
use crate::core::weights::{self, TensorSource};
use crate::py::config::{self as pyconfig, value_of, PyCodecConfig};
use crate::py::convert::{self, HostArray};
use crate::py::guard::{self, interruptible, Detached, Reset, Shared};
use crate::py::weights::WeightsArg;
use candle::{DType, Tensor};
use numpy::{
    PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The Mimi audio codec: 24 kHz audio <-> discrete codes at 12.5 Hz, offline and streaming.
///
/// Offline calls (``encode``/``decode``) use private state: they never disturb, and are not
/// disturbed by, the streaming state, and several threads may run them on one codec at once
/// (the GIL is released). Streaming calls (``encode_step``/``decode_step``) continue one
/// encoder stream and one decoder stream; calls on each serialize.
#[pyclass(name = "MimiCodec", module = "mimi_py._core", frozen)]
pub struct PyMimiCodec {
    codec: Arc<Codec>,
    enc: Shared<Option<EncodeStream>>,
    dec: Shared<Option<DecodeStream>>,
    device_name: String,
    dtype_name: &'static str,
    layout: Option<CheckpointLayout>,
}

/// A stream that has not started yet is `None`.
impl<T> Reset for Option<T> {
    fn reset(&mut self) {
        *self = None;
    }
}

/// The codec computes in float32 only: candle's SEANet convolutions mix float32 padding
/// with the weights' dtype and fail at the first call.
fn float32_only(dtype: &str) -> Result<&'static str> {
    let (dtype, name) = device::parse_dtype(dtype)?;
    if dtype != DType::F32 {
        return Err(Error::config(
            "dtype",
            format!(
                "the codec computes in float32 only for now, got {name:?}; use dtype=\"float32\""
            ),
        ));
    }
    Ok(name)
}

/// A checkpoint directory (`config.json` + `model.safetensors`, as on the Hugging Face hub):
/// its file, and its config unless one was given.
fn read_dir(
    py: Python<'_>,
    dir: &Path,
    cfg: Option<CodecConfig>,
    num_codebooks: Option<usize>,
) -> PyResult<(PathBuf, Option<CodecConfig>)> {
    let json = dir.join("config.json");
    let cfg = match cfg {
        Some(c) => Some(c),
        None if json.is_file() => Some(read_hf_config(py, &json, num_codebooks)?),
        None => None,
    };
    let file = dir.join("model.safetensors");
    if !file.is_file() {
        return Err(Error::Weights(format!(
            "directory {} has no model.safetensors",
            dir.display()
        ))
        .into());
    }
    Ok((file, cfg))
}

fn read_hf_config(
    py: Python<'_>,
    json: &Path,
    num_codebooks: Option<usize>,
) -> PyResult<CodecConfig> {
    let text = std::fs::read_to_string(json).map_err(|e| Error::WeightsIo {
        msg: format!("cannot read {}", json.display()),
        source: e,
    })?;
    let parsed = py
        .import("json")?
        .call_method1("loads", (text,))
        .map_err(|e| {
            Error::Weights(format!(
                "{} is not valid JSON: {}",
                json.display(),
                e.value(py)
            ))
        })?;
    if !parsed.is_instance_of::<pyo3::types::PyDict>() {
        return Err(Error::Weights(format!("{} is not a JSON object", json.display())).into());
    }
    Ok(CodecConfig::from_hf(&value_of(&parsed), num_codebooks)?)
}

/// Refuses configs whose weights cannot fit in memory.
fn check_weights_memory(cfg: &CodecConfig) -> Result<()> {
    let tr_params = weights::transformer_params(&cfg.transformer);
    let codebooks = (cfg.quantizer_n_q as u64)
        .saturating_mul(cfg.quantizer_bins as u64)
        .saturating_mul(cfg.quantizer_dim as u64 + 2);
    device::check_memory(
        (2 * tr_params + codebooks).saturating_mul(12),
        "this codec's weights",
        "check the config's sizes (quantizer_bins, quantizer_dim, transformer)",
    )
}

/// Builds the codec (detached): opens the device, reads the weights, loads the model.
fn build(
    cfg: &CodecConfig,
    arg: WeightsArg,
    device_spec: &str,
) -> Result<(Codec, String, Option<CheckpointLayout>)> {
    let (dev, device_name) = device::parse_device(device_spec)?;
    let checkpoint = |raw, origin| codec::checkpoint_source(raw, origin, cfg);
    let (source, layout) = match arg {
        WeightsArg::Seed(s) => (TensorSource::seeded(s, cfg.transformer.layer_scale), None),
        WeightsArg::Path(p) => {
            let (s, l) = checkpoint(
                weights::read_all(&p)?,
                format!("checkpoint {}", p.display()),
            )?;
            (s, Some(l))
        }
        WeightsArg::Mapping(m) => {
            let (s, l) = checkpoint(m, "weights mapping".to_string())?;
            (s, Some(l))
        }
    };
    let codec = Codec::new(cfg, source, &dev, DType::F32)?;
    Ok((codec, device_name, layout))
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

fn tensor_f32(t: &Tensor) -> Result<(Vec<f32>, Vec<usize>)> {
    Ok((
        t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?,
        t.dims().to_vec(),
    ))
}

fn tensor_u32(t: &Tensor) -> Result<(Vec<u32>, Vec<usize>)> {
    Ok((t.flatten_all()?.to_vec1::<u32>()?, t.dims().to_vec()))
}

impl PyMimiCodec {
    /// Test hook: panics while holding the encoder stream's lock (see `_poison_for_tests`).
    pub(crate) fn poison(&self, d: &Detached) -> Result<()> {
        let _held = self.enc.lock(d)?;
        panic!("forced panic while holding the stream's lock")
    }

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
impl PyMimiCodec {
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
        let dtype_name = float32_only(dtype)?;
        let seed = seed.map(|s| pyconfig::arg::<u64>("seed", s)).transpose()?;
        let num_codebooks = pyconfig::codebooks(num_codebooks)?;
        let mut cfg = pyconfig::codec_config(config)?;
        let expected = "a checkpoint path (file or directory)";
        let mut arg = crate::py::weights::read(weights, seed.unwrap_or(0), "", expected)?;
        if let WeightsArg::Path(dir) = &arg {
            if dir.is_dir() {
                let (file, c) = read_dir(py, dir, cfg, num_codebooks)?;
                (arg, cfg) = (WeightsArg::Path(file), c);
            }
        }
        let mut cfg = cfg.unwrap_or_default();
        if let Some(n) = num_codebooks {
            cfg.quantizer_n_q = n;
        }
        check_weights_memory(&cfg)?;
        let device_spec = device.to_string();
        let (codec, device_name, layout) =
            guard::detached(py, move |_| build(&cfg, arg, &device_spec))?;
        Ok(Self {
            codec: Arc::new(codec),
            enc: Shared::default(),
            dec: Shared::default(),
            device_name,
            dtype_name,
            layout,
        })
    }

    /// The real checkpoint by name, through the Hugging Face cache (needs the `hub` extra):
    /// ``config.json`` + ``model.safetensors`` of ``repo_id`` (Hugging Face layout), or the
    /// named ``filename`` (for example Kyutai's moshi-layout tokenizer file). Works offline
    /// from the cache. See ``mimi_py.hub.from_pretrained``.
    #[classmethod]
    #[pyo3(signature = (repo_id="kyutai/mimi", *, revision=None, filename=None, num_codebooks=None, device="cpu", dtype="float32", cache_dir=None))]
    #[allow(clippy::too_many_arguments)]
    fn from_pretrained<'py>(
        cls: &Bound<'py, pyo3::types::PyType>,
        repo_id: &str,
        revision: Option<&Bound<'py, PyAny>>,
        filename: Option<&Bound<'py, PyAny>>,
        num_codebooks: Option<&Bound<'py, PyAny>>,
        device: &str,
        dtype: &str,
        cache_dir: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = cls.py();
        let kwargs = pyo3::types::PyDict::new(py);
        kwargs.set_item("revision", revision)?;
        kwargs.set_item("filename", filename)?;
        kwargs.set_item("num_codebooks", num_codebooks)?;
        kwargs.set_item("device", device)?;
        kwargs.set_item("dtype", dtype)?;
        kwargs.set_item("cache_dir", cache_dir)?;
        py.import("mimi_py.hub")?
            .getattr("from_pretrained")?
            .call((repo_id,), Some(&kwargs))
    }

    /// Audio to codes. ``pcm``: (batch, channels, samples) or (samples,), any real float
    /// dtype, at ``sample_rate``. Returns uint32 codes of shape (batch, num_codebooks,
    /// ceil(samples / frame_size)); a last partial frame is zero-padded.
    fn encode<'py>(&self, py: Python<'py>, pcm: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let host = self.read_pcm(pcm)?;
        let (b, k) = (host.shape[0], self.codec.config().quantizer_n_q);
        if host.shape[2] == 0 {
            return Ok(convert::to_numpy(py, Vec::<u32>::new(), &[b, k, 0])?);
        }
        let codec = self.codec.clone();
        let (data, shape) = interruptible(py, move |cancel| {
            let x = Tensor::from_vec(host.data, host.shape.as_slice(), codec.device())?
                .to_dtype(codec.dtype())?;
            tensor_u32(&codec.encode(&x, Some(cancel))?)
        })?;
        Ok(convert::to_numpy(py, data, &shape)?)
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
            return Ok(convert::to_numpy(
                py,
                Vec::<f32>::new(),
                &[host.shape[0], dim, 0],
            )?);
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
        let (data, shape) = guard::detached(py, move |_| {
            let c = Tensor::from_vec(data, shape.as_slice(), codec.device())?;
            tensor_f32(&codec.decode_latent(&c)?)
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
                Vec::<f32>::new(),
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
        let out = guard::detached(py, move |d| {
            let mut g = enc.lock(d)?;
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
            let x = Tensor::from_vec(host.data, host.shape.as_slice(), codec.device())?
                .to_dtype(codec.dtype())?;
            match codec.encode_step(stream, &x)? {
                None => Ok(None),
                Some(c) => Ok(Some(tensor_u32(&c)?)),
            }
        })?;
        match out {
            None => Ok(None),
            Some((d, s)) => Ok(Some(convert::to_numpy(py, d, &s)?)),
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
        let out = guard::detached(py, move |d| {
            let mut g = dec.lock(d)?;
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
        })?;
        match out {
            None => Ok(None),
            Some((d, s)) => Ok(Some(convert::to_numpy(py, d, &s)?)),
        }
    }

    /// Starts fresh encoder and decoder streams.
    fn reset_state(&self, py: Python<'_>) -> PyResult<()> {
        let (enc, dec) = (&self.enc, &self.dec);
        guard::detached(py, |d| {
            enc.reset(d);
            dec.reset(d);
            Ok(())
        })
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
    fn config(&self) -> PyCodecConfig {
        PyCodecConfig(self.codec.config().clone())
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
