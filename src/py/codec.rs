//! `MimiCodec`: the Python class around [`Codec`].

use crate::py::config::{self as pyconfig, PyCodecConfig};
use crate::py::convert;
use crate::py::errors::PyResult;
use crate::py::guard::{self, interruptible, Detached, Reset, Shared};
use crate::py::row_args;
use crate::py::weights::WeightsArg;
use mimi_core::codec::inputs::code_value;
use mimi_core::codec::stream::{copy_pair, StreamPair};
use mimi_core::codec::{Codec, DecodeStream, EncodeStep, EncodeStream, Input, OpenOptions, Rows};
use mimi_core::error::{Error, Result};
use mimi_core::host::HostInput;
use mimi_core::runtime::device;
use mimi_core::runtime::precision::Precision;
use numpy::{
    PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
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
}

/// The `(batch, length)` of a checked input `(batch, _, length)`: what `lengths=` counts along.
fn batch_and_length<T>(x: &HostInput<T>) -> (usize, usize) {
    (x.shape()[0], x.shape()[2])
}

/// A stream that has not started yet is `None`.
impl<T> Reset for Option<T> {
    fn reset(&mut self) {
        *self = None;
    }
}

/// Builds the codec (detached) through the core's doors: [`Codec::open`] for a checkpoint
/// path, [`Codec::open_arrays`] for a mapping, [`Codec::seeded`] otherwise.
fn build(arg: WeightsArg, options: &OpenOptions) -> Result<Codec> {
    match arg {
        WeightsArg::Path(path) => Codec::open(&path, options),
        WeightsArg::Mapping(m) => Codec::open_arrays(m, options),
        WeightsArg::Seed(s) => Codec::seeded(s, options),
    }
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

/// Reads integer codes into u32, the caller having checked their dtype and shape. With
/// `rows`, only those batch rows are read (an inactive row of a masked step may hold
/// anything); the others are 0. A value no `u32` holds is refused here, with the core's
/// message ([`code_value`]); the range `[0, bins)` is the core's rule, checked in the call.
fn read_codes(
    a: &Bound<'_, PyUntypedArray>,
    bins: usize,
    rows: Option<&[usize]>,
) -> PyResult<Vec<u32>> {
    let values: Vec<i128> = if a.dtype().kind() == b'u' {
        let conv = a.call_method1("astype", ("uint64", "C"))?;
        let arr = conv.cast_into::<PyArrayDyn<u64>>().map_err(PyErr::from)?;
        let ro = arr.try_readonly()?;
        ro.as_array().iter().map(|&v| v as i128).collect()
    } else {
        let conv = a.call_method1("astype", ("int64", "C"))?;
        let arr = conv.cast_into::<PyArrayDyn<i64>>().map_err(PyErr::from)?;
        let ro = arr.try_readonly()?;
        ro.as_array().iter().map(|&v| v as i128).collect()
    };
    let row_len = a.shape()[1..].iter().product::<usize>().max(1);
    let read = |r: usize| rows.is_none_or(|rows| rows.binary_search(&r).is_ok());
    let mut out = Vec::with_capacity(values.len());
    for (i, &v) in values.iter().enumerate() {
        out.push(match read(i / row_len) {
            true => u32::try_from(v).or_else(|_| code_value(v, bins))?,
            false => 0,
        });
    }
    Ok(out)
}

impl PyMimiCodec {
    /// Copies of both streams, taken one lock at a time.
    #[allow(clippy::type_complexity)]
    fn snapshot(&self, d: &Detached) -> Result<(Option<EncodeStream>, Option<DecodeStream>)> {
        copy_pair(self.enc.lock(d)?.as_ref(), self.dec.lock(d)?.as_ref())
    }

    fn fork(&self, py: Python<'_>) -> PyResult<Self> {
        let (enc, dec) = guard::detached(py, |d| self.snapshot(d))?;
        Ok(Self {
            codec: self.codec.clone(),
            enc: Shared::new(enc),
            dec: Shared::new(dec),
        })
    }

    /// An offline call's audio and `lengths=` (samples per item).
    #[allow(clippy::type_complexity)]
    fn read_offline_pcm(
        &self,
        pcm: &Bound<'_, PyAny>,
        lengths: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(HostInput<f32>, Option<Vec<usize>>)> {
        let (host, _) = self.read_pcm_rows(pcm, None)?;
        let lengths = row_args::lengths(lengths, batch_and_length(&host), "samples")?;
        Ok((host, lengths))
    }

    /// An offline call's codes and `lengths=` (frames per item).
    #[allow(clippy::type_complexity)]
    fn read_offline_codes(
        &self,
        codes: &Bound<'_, PyAny>,
        lengths: Option<&Bound<'_, PyAny>>,
        decoded: bool,
    ) -> PyResult<(HostInput<u32>, Option<Vec<usize>>)> {
        let (codes, _) = self.read_codes_rows(codes, None, decoded)?;
        let lengths = row_args::lengths(lengths, batch_and_length(&codes), "frames")?;
        Ok((codes, lengths))
    }

    /// Test hook: panics while holding the encoder stream's lock (see `_poison_for_tests`).
    pub(crate) fn poison(&self, d: &Detached) -> Result<()> {
        let _held = self.enc.lock(d)?;
        panic!("forced panic while holding the stream's lock")
    }

    fn n_channels(&self) -> usize {
        self.codec.config().channels
    }

    /// pcm: (batch, channels, samples) or (samples,), read as f32 once its dtype and shape
    /// pass the core's rules (the call checks the rest); with `active=`, its rows.
    fn read_pcm_rows(
        &self,
        x: &Bound<'_, PyAny>,
        active: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(HostInput<f32>, Option<Rows>)> {
        let arr = convert::as_ndarray(x, "pcm")?;
        if !convert::is_int_pcm(&arr) {
            convert::check_float(&arr, "pcm")?;
        }
        let shape = self
            .codec
            .input_shape(Input::Pcm, &convert::shape_of(&arr))?;
        let rows = row_args::active(active, shape.dims()[0])?;
        let data = convert::copy_pcm(&arr, "pcm")?;
        Ok((HostInput::Shaped(shape, data), rows))
    }

    /// codes: (batch, num_codebooks, frames) integers, read as u32 once their dtype and
    /// shape pass the core's rules (`decoded`: the audio they decode to, too); with
    /// `active=`, its rows (only those are read and range-checked).
    fn read_codes_rows(
        &self,
        x: &Bound<'_, PyAny>,
        active: Option<&Bound<'_, PyAny>>,
        decoded: bool,
    ) -> PyResult<(HostInput<u32>, Option<Rows>)> {
        let arr = convert::as_ndarray(x, "codes")?;
        check_codes_dtype(&arr)?;
        let input = if decoded {
            Input::CodesToDecode
        } else {
            Input::Codes
        };
        let shape = self.codec.input_shape(input, &convert::shape_of(&arr))?;
        let rows = row_args::active(active, shape.dims()[0])?;
        let stepping = rows.as_ref().map(|r| r.indices());
        let bins = self.codec.config().quantizer_bins;
        let data = read_codes(&arr, bins, stepping.as_deref())?;
        Ok((HostInput::Shaped(shape, data), rows))
    }
}

#[pymethods]
impl PyMimiCodec {
    #[new]
    #[pyo3(signature = (weights=None, *, config=None, num_codebooks=None, seed=None, device="cpu", dtype="float32", precision=None, weights_dtype=None))]
    #[allow(clippy::too_many_arguments)]
    fn py_new(
        py: Python<'_>,
        weights: Option<&Bound<'_, PyAny>>,
        config: Option<&Bound<'_, PyAny>>,
        num_codebooks: Option<&Bound<'_, PyAny>>,
        seed: Option<&Bound<'_, PyAny>>,
        device: &str,
        dtype: &str,
        precision: Option<String>,
        weights_dtype: Option<String>,
    ) -> PyResult<Self> {
        let (dtype, _) = device::parse_dtype(dtype)?;
        let seed = seed.map(|s| pyconfig::arg::<u64>("seed", s)).transpose()?;
        let num_codebooks = pyconfig::codebooks(num_codebooks)?;
        let cfg = pyconfig::codec_config(config)?;
        let expected = "a checkpoint path (file or directory)";
        let arg = crate::py::weights::read(weights, seed.unwrap_or(0), "", expected)?;
        let device_spec = device.to_string();
        let codec = guard::detached(py, move |_| {
            let device = device::parse_device(&device_spec)?.0;
            let (p, w) = (precision.as_deref(), weights_dtype.as_deref());
            let precision = Precision::from_args(p, w, &device, dtype)?;
            let options = OpenOptions {
                device,
                dtype,
                precision,
                num_codebooks,
                engine: None,
                config: cfg,
            };
            build(arg, &options)
        })?;
        Ok(Self {
            codec: Arc::new(codec),
            enc: Shared::default(),
            dec: Shared::default(),
        })
    }

    /// The real checkpoint by name, through the Hugging Face cache (needs the `hub` extra):
    /// ``config.json`` + ``model.safetensors`` of ``repo_id`` (Hugging Face layout), or the
    /// named ``filename`` (for example Kyutai's moshi-layout tokenizer file). Works offline
    /// from the cache. The arguments are ``mimi_py.hub.from_pretrained``'s, declared there
    /// once: this passes them on as given.
    #[classmethod]
    #[pyo3(signature = (*args, **kwargs))]
    fn from_pretrained<'py>(
        cls: &Bound<'py, pyo3::types::PyType>,
        args: &Bound<'py, pyo3::types::PyTuple>,
        kwargs: Option<&Bound<'py, pyo3::types::PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let hub = cls.py().import("mimi_py.hub")?;
        Ok(hub.getattr("from_pretrained")?.call(args, kwargs)?)
    }

    /// Audio to codes. ``pcm``: (batch, channels, samples) or (samples,), any real float
    /// dtype, or int16 / int32 PCM (scaled by 1/32768 and 1/2**31), at ``sample_rate``.
    /// Returns uint32 codes of shape (batch, num_codebooks, ceil(samples / frame_size)); a
    /// last partial frame is zero-padded.
    ///
    /// ``lengths``: one sample count per batch item (a padded batch of clips of different
    /// lengths). Item i then gets ``ceil(lengths[i] / frame_size)`` frames, exactly the codes
    /// of ``encode(pcm[i:i+1, :, :lengths[i]])``, then zeros up to the longest item.
    #[pyo3(signature = (pcm, *, lengths=None))]
    fn encode<'py>(
        &self,
        py: Python<'py>,
        pcm: &Bound<'py, PyAny>,
        lengths: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (host, lengths) = self.read_offline_pcm(pcm, lengths)?;
        let codec = self.codec.clone();
        let out = interruptible(py, move |cancel| {
            codec.encode_host(host, lengths.as_deref(), Some(cancel))
        })?;
        Ok(convert::to_numpy(py, out.data, &out.shape)?)
    }

    /// Pre-quantization latents: (batch, dimension, frames) float32. ``lengths``: as in
    /// ``encode``.
    #[pyo3(signature = (pcm, *, lengths=None))]
    fn encode_latents<'py>(
        &self,
        py: Python<'py>,
        pcm: &Bound<'py, PyAny>,
        lengths: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (host, lengths) = self.read_offline_pcm(pcm, lengths)?;
        let codec = self.codec.clone();
        let out = interruptible(py, move |cancel| {
            codec.encode_latents_host(host, lengths.as_deref(), Some(cancel))
        })?;
        Ok(convert::to_numpy(py, out.data, &out.shape)?)
    }

    /// The quantizer's reconstruction of codes: (batch, dimension, frames) float32.
    /// ``lengths``: one frame count per batch item (as in ``decode``).
    #[pyo3(signature = (codes, *, lengths=None))]
    fn decode_latents<'py>(
        &self,
        py: Python<'py>,
        codes: &Bound<'py, PyAny>,
        lengths: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (codes, lengths) = self.read_offline_codes(codes, lengths, false)?;
        let codec = self.codec.clone();
        let out = guard::detached(py, move |_| {
            codec.decode_latents_host(codes, lengths.as_deref())
        })?;
        Ok(convert::to_numpy(py, out.data, &out.shape)?)
    }

    /// Codes to audio. ``codes``: integers of shape (batch, num_codebooks, frames) in
    /// [0, cardinality). Returns float32 audio (batch, channels, frames * frame_size).
    ///
    /// ``lengths``: one frame count per batch item. Item i's first ``lengths[i] *
    /// frame_size`` samples are then exactly ``decode(codes[i:i+1, :, :lengths[i]])``, then
    /// zeros up to the longest item (codes past an item's length must still be in range).
    #[pyo3(signature = (codes, *, lengths=None))]
    fn decode<'py>(
        &self,
        py: Python<'py>,
        codes: &Bound<'py, PyAny>,
        lengths: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (codes, lengths) = self.read_offline_codes(codes, lengths, true)?;
        let codec = self.codec.clone();
        let out = interruptible(py, move |cancel| {
            codec.decode_host(codes, lengths.as_deref(), Some(cancel))
        })?;
        Ok(convert::to_numpy(py, out.data, &out.shape)?)
    }

    /// Streams audio in: returns the uint32 codes (batch, num_codebooks, n) of every frame this
    /// chunk completes, or ``None`` if it completes none. Chunks may have any length; the
    /// remainder is buffered. Frames are emitted as soon as they are complete, so a stream
    /// gives ``floor(samples / frame_size)`` frames, each equal to the offline codes.
    ///
    /// ``active``: a boolean array of shape ``(batch,)``; only those rows step (the others
    /// keep their state bit for bit, whatever ``pcm`` holds there, and their codes are zeros).
    /// With ``active``, chunks must be a whole number of frames.
    ///
    /// ``last=True`` ends the stream with this chunk (which may be empty): the last partial
    /// frame is padded as ``encode`` pads it, so the codes of the whole stream equal
    /// ``encode``'s exactly; the next call starts a fresh encoder stream.
    #[pyo3(signature = (pcm, *, active=None, last=false))]
    fn encode_step<'py>(
        &self,
        py: Python<'py>,
        pcm: Option<&Bound<'py, PyAny>>,
        active: Option<&Bound<'py, PyAny>>,
        last: bool,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(pcm) = pcm else { return Ok(None) };
        let (host, active) = self.read_pcm_rows(pcm, active)?;
        let (codec, enc) = (self.codec.clone(), &self.enc);
        let out = guard::detached(py, move |d| {
            let mut g = enc.lock(d)?;
            let stream = g.get_or_insert_with(|| codec.encode_stream());
            codec.encode_step_host(stream, host, EncodeStep { active, last })
        })?;
        match out {
            None => Ok(None),
            Some(a) => Ok(Some(convert::to_numpy(py, a.data, &a.shape)?)),
        }
    }

    /// Streams codes in: returns the float32 audio (batch, channels, n * frame_size) they
    /// complete, or ``None``. ``decode_step(None)`` returns ``None``. ``active``: as in
    /// ``encode_step`` (inactive rows' codes are not read; their audio is zeros).
    #[pyo3(signature = (codes, *, active=None))]
    fn decode_step<'py>(
        &self,
        py: Python<'py>,
        codes: Option<&Bound<'py, PyAny>>,
        active: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(codes) = codes else { return Ok(None) };
        let (codes, rows) = self.read_codes_rows(codes, active, true)?;
        let (codec, dec) = (self.codec.clone(), &self.dec);
        let out = guard::detached(py, move |d| {
            let mut g = dec.lock(d)?;
            let stream = g.get_or_insert_with(|| codec.decode_stream());
            codec.decode_step_host(stream, codes, rows)
        })?;
        match out {
            None => Ok(None),
            Some(a) => Ok(Some(convert::to_numpy(py, a.data, &a.shape)?)),
        }
    }

    /// Starts fresh encoder and decoder streams. ``rows`` (row indices or a boolean mask
    /// over the batch) resets only those rows of both streams; the others continue untouched.
    #[pyo3(signature = (rows=None))]
    fn reset_state(&self, py: Python<'_>, rows: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let rows = row_args::rows(rows)?;
        let (enc, dec) = (&self.enc, &self.dec);
        guard::detached(py, |d| {
            let Some(rows) = rows else {
                // Whole streams: reset even a lock that a panic poisoned.
                enc.reset(d);
                dec.reset(d);
                return Ok(());
            };
            let (mut e, mut de) = (enc.lock(d)?, dec.lock(d)?);
            StreamPair {
                enc: &mut e,
                dec: &mut de,
            }
            .reset_rows(&rows)
        })
    }

    /// Each row's code frames emitted by the encoder stream since its own start or reset,
    /// int64 of shape ``(batch,)`` (empty before the first call).
    #[getter]
    fn positions<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let (enc, f) = (&self.enc, self.codec.config().frame_size());
        let pos = guard::detached(py, |d| {
            let s = enc.lock(d)?;
            Ok(s.as_ref().map_or_else(Vec::new, |s| s.frame_positions(f)))
        })?;
        let pos: Vec<i64> = pos.into_iter().map(|n| n as i64).collect();
        let n = pos.len();
        Ok(convert::to_numpy(py, pos, &[n])?)
    }

    /// Each row's code frames consumed by the decoder stream since its own start or reset,
    /// int64 of shape ``(batch,)`` (empty before the first call).
    #[getter]
    fn decode_positions<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let dec = &self.dec;
        let pos = guard::detached(py, |d| {
            Ok(dec
                .lock(d)?
                .as_ref()
                .map_or_else(Vec::new, |s| s.counts().iter().map(|&n| n as i64).collect()))
        })?;
        let n = pos.len();
        Ok(convert::to_numpy(py, pos, &[n])?)
    }

    /// Makes this codec continue exactly as ``other`` would: copies both of ``other``'s
    /// streams (buffered samples, convolution and transformer states) into this one. A copy,
    /// O(state), independent afterwards; the weights are not copied. Raises
    /// ``IncompatibleStateError`` for another config, checkpoint layout, batch size, device or
    /// dtype; neither codec changes then.
    fn copy_state(&self, py: Python<'_>, other: &Bound<'_, PyMimiCodec>) -> PyResult<()> {
        let other = other.get();
        if std::ptr::eq(other, self) {
            return Ok(());
        }
        self.codec.info().check_state_source(&other.codec.info())?;
        let (src, dst) = (other, self);
        guard::detached(py, move |d| {
            let copies = src.snapshot(d)?;
            let (mut de, mut dd) = (dst.enc.lock(d)?, dst.dec.lock(d)?);
            StreamPair {
                enc: &mut de,
                dec: &mut dd,
            }
            .replace(copies)
        })
    }

    /// A new codec sharing these (immutable) weights, with a copy of both streams; the two
    /// are independent afterwards.
    fn clone(&self, py: Python<'_>) -> PyResult<Self> {
        self.fork(py)
    }

    fn __copy__(&self, py: Python<'_>) -> PyResult<Self> {
        self.fork(py)
    }

    fn __deepcopy__(&self, py: Python<'_>, _memo: &Bound<'_, PyAny>) -> PyResult<Self> {
        self.fork(py)
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
        device::device_name(self.codec.info().device)
    }

    #[getter]
    fn dtype(&self) -> &'static str {
        device::dtype_name(self.codec.info().dtype)
    }

    /// How the weight matrices are stored: "float32" or "bfloat16".
    #[getter]
    fn weights_dtype(&self) -> &'static str {
        self.codec.info().precision.weights_dtype()
    }

    /// How the products compute: "highest", "high" or "medium".
    #[getter]
    fn precision(&self) -> &'static str {
        self.codec.info().precision.name()
    }

    /// The instruction set the products run with ("avx512bf16", "avx512", "avx2",
    /// "portable"); `None` off the CPU.
    #[getter]
    fn kernel_isa(&self) -> Option<&'static str> {
        let c = self.codec.info();
        mimi_core::kernels::bf16dot::kernel_isa(c.precision, c.device, c.dtype)
    }

    /// Bytes of the weights one frame (an encode and a decode step) reads, as stored: both
    /// transformers, the convolutions and the quantizer. Divided by the memory bandwidth, it
    /// is the floor of a one-stream frame's time.
    #[getter]
    fn weights_nbytes(&self) -> usize {
        self.codec.info().weights_nbytes
    }

    /// The layout the weights were read in: "hf", "moshi", or None for seeded weights.
    #[getter]
    fn checkpoint_layout(&self) -> Option<&'static str> {
        self.codec.info().checkpoint_layout.map(|l| l.name())
    }

    fn __reduce__(&self) -> PyResult<()> {
        Err(
            PyTypeError::new_err("a MimiCodec cannot be pickled; rebuild it from its checkpoint")
                .into(),
        )
    }

    fn __repr__(&self) -> String {
        let c = self.codec.config();
        format!(
            "MimiCodec(sample_rate={}, frame_rate={}, num_codebooks={}, cardinality={}, device='{}', dtype='{}')",
            c.sample_rate, c.frame_rate, c.quantizer_n_q, c.quantizer_bins, self.device(), self.dtype()
        )
    }
}
