//! `TransformerConfig` and `CodecConfig` for Python: thin wrappers over the core's config
//! tables. Every field's getter, `to_dict`, `replace`, `__repr__`, pickling and equality come
//! from the one table in `mimi_core::config`; this module only converts Python values to
//! and from the core's dynamic [`Value`].

use crate::py::errors::PyResult;
use mimi_core::config::{CodecConfig, Field, TransformerConfig, Value};
use mimi_core::error::{Error, Result};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

/// A Python value as the core sees it (configs become dicts of their fields).
pub fn value_of(v: &Bound<'_, PyAny>) -> Value {
    if v.is_none() {
        Value::None
    } else if let Ok(b) = v.cast::<PyBool>() {
        Value::Bool(b.is_true())
    } else if v.is_instance_of::<PyFloat>() {
        v.extract().map_or_else(|_| other(v), Value::Float)
    } else if let Ok(s) = v.cast::<PyString>() {
        Value::Str(s.to_string())
    } else if let Ok(c) = v.cast::<PyTransformerConfig>() {
        c.get().0.value()
    } else if let Ok(d) = v.cast::<PyDict>() {
        Value::Dict(d.iter().map(|(k, v)| (key_of(&k), value_of(&v))).collect())
    } else if let Some(items) = sequence(v) {
        Value::List(items.iter().map(|i| value_of(i)).collect())
    } else {
        int_of(v).unwrap_or_else(|| other(v))
    }
}

/// Python ints and numpy integers (anything with `__index__`), but not numpy bools.
fn int_of(v: &Bound<'_, PyAny>) -> Option<Value> {
    let numpy_bool = v.get_type().name().is_ok_and(|n| n == "bool_");
    let index = v.is_instance_of::<PyInt>() || v.hasattr("__index__").unwrap_or(false);
    if numpy_bool || !index {
        return None;
    }
    v.call_method0("__index__")
        .ok()?
        .extract()
        .ok()
        .map(Value::Int)
}

fn sequence<'py>(v: &Bound<'py, PyAny>) -> Option<Vec<Bound<'py, PyAny>>> {
    if let Ok(l) = v.cast::<PyList>() {
        return Some(l.iter().collect());
    }
    v.cast::<PyTuple>().ok().map(|t| t.iter().collect())
}

fn key_of(k: &Bound<'_, PyAny>) -> String {
    k.extract().unwrap_or_else(|_| repr(&other(k)))
}

/// Python's `repr` of a config value.
pub fn repr(v: &Value) -> String {
    let join = |items: Vec<String>| items.join(", ");
    match v {
        Value::None => "None".into(),
        Value::Bool(b) => (if *b { "True" } else { "False" }).into(),
        Value::Int(i) => i.to_string(),
        Value::Float(f) if f.is_nan() => "nan".into(),
        Value::Float(f) if f.is_infinite() => (if *f > 0.0 { "inf" } else { "-inf" }).into(),
        Value::Float(f) => format!("{f:?}"),
        Value::Str(s) => format!("'{s}'"),
        Value::List(l) => format!("[{}]", join(l.iter().map(repr).collect())),
        Value::Dict(d) => format!(
            "{{{}}}",
            join(
                d.iter()
                    .map(|(k, v)| format!("'{k}': {}", repr(v)))
                    .collect()
            )
        ),
        Value::Other { repr, .. } => repr.clone(),
    }
}

fn other(v: &Bound<'_, PyAny>) -> Value {
    let type_name = v
        .get_type()
        .name()
        .map_or_else(|_| "?".into(), |n| n.to_string());
    let repr = v
        .repr()
        .map_or_else(|_| type_name.clone(), |r| r.to_string());
    Value::Other { type_name, repr }
}

/// The core's value as a Python object.
pub fn to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::None => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Int(i) => i.into_pyobject(py)?.into_any(),
        Value::Float(f) => f.into_pyobject(py)?.into_any(),
        Value::Str(s) | Value::Other { repr: s, .. } => s.into_pyobject(py)?.into_any(),
        Value::List(l) => PyList::new(
            py,
            l.iter()
                .map(|i| to_py(py, i))
                .collect::<PyResult<Vec<_>>>()?,
        )?
        .into_any(),
        Value::Dict(d) => {
            let out = PyDict::new(py);
            for (k, v) in d {
                out.set_item(k, to_py(py, v)?)?;
            }
            out.into_any()
        }
    })
}

/// A keyword argument read as a field of type `T` (named `field` in errors).
pub fn arg<T: Field>(field: &str, v: &Bound<'_, PyAny>) -> Result<T> {
    T::parse(field, &value_of(v))
}

/// `**kwargs` as `(name, value)` pairs.
fn kwarg_values(kwargs: Option<&Bound<'_, PyDict>>) -> Result<Vec<(String, Value)>> {
    let Some(kw) = kwargs else {
        return Ok(Vec::new());
    };
    kw.iter()
        .map(|(k, v)| {
            let key: String = k
                .extract()
                .map_err(|_| Error::config("?", "keyword names must be strings"))?;
            Ok((key, value_of(&v)))
        })
        .collect()
}

fn dict_of<'py>(
    py: Python<'py>,
    values: Vec<(&'static str, Value)>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in values {
        d.set_item(k, to_py(py, &v)?)?;
    }
    Ok(d)
}

/// Defines a Python config class over a core config table: constructor from keyword
/// arguments, `to_dict`, `replace`, `__repr__`, pickling, and one getter per field (from the
/// table's field macro).
macro_rules! py_config {
    ($py:ident, $core:ident, $fields:ident, $field_to_py:path) => {
        impl $py {
            fn from_kwargs(kwargs: Option<&Bound<'_, PyDict>>) -> Result<Self> {
                let values = kwarg_values(kwargs)?;
                $core::from_values(values.iter().map(|(k, v)| (k.as_str(), v))).map(Self)
            }
        }

        #[pymethods]
        impl $py {
            #[new]
            #[pyo3(signature = (**kwargs))]
            fn py_new(kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
                Ok(Self::from_kwargs(kwargs)?)
            }

            /// The fields as a plain dict; `Config(**cfg.to_dict()) == cfg`.
            fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
                dict_of(py, self.0.values())
            }

            /// A copy with some fields changed (validated like the constructor).
            #[pyo3(signature = (**changes))]
            fn replace(&self, changes: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
                let mut values: Vec<(String, Value)> = self
                    .0
                    .values()
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect();
                values.extend(kwarg_values(changes)?);
                Ok($core::from_values(values.iter().map(|(k, v)| (k.as_str(), v))).map(Self)?)
            }

            fn __repr__(&self) -> String {
                let fields: Vec<String> = self
                    .0
                    .values()
                    .into_iter()
                    .map(|(k, v)| format!("{k}={}", repr(&v)))
                    .collect();
                format!("{}({})", stringify!($core), fields.join(", "))
            }

            /// Pickle / copy support: rebuilt from keyword arguments.
            fn __getnewargs_ex__<'py>(
                &self,
                py: Python<'py>,
            ) -> PyResult<(Bound<'py, PyTuple>, Bound<'py, PyDict>)> {
                Ok((PyTuple::empty(py), dict_of(py, self.0.values())?))
            }
        }

        mimi_core::$fields!(py_getters, $py, $field_to_py);
    };
}

/// One `#[getter]` per field of a config table (called back by the table's field macro).
macro_rules! py_getters {
    ([$py:ident $to_py:path] $(#[$m:meta])* pub struct $name:ident {
        $($(#[doc = $doc:expr])* $field:ident: $ty:ty = $default:expr,)+
    }) => {
        #[pymethods]
        impl $py {
            $(
                #[getter]
                fn $field<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
                    $to_py(py, stringify!($field), Field::value(&self.0.$field))
                }
            )+
        }
    };
}

/// Configuration of a Mimi streaming transformer.
///
/// Keyword arguments are named exactly as the fields of candle's
/// `mimi::transformer::Config`. Every argument has the default of the real Mimi
/// encoder/decoder transformer, so `TransformerConfig()` equals `TransformerConfig.mimi()`.
/// Invalid values raise `ConfigError` naming the field.
#[pyclass(
    name = "TransformerConfig",
    module = "mimi_py._core",
    frozen,
    eq,
    from_py_object
)]
#[derive(Clone, Debug, PartialEq, Default)]
pub struct PyTransformerConfig(pub TransformerConfig);

fn plain_field<'py>(py: Python<'py>, _field: &str, v: Value) -> PyResult<Bound<'py, PyAny>> {
    to_py(py, &v)
}

py_config!(
    PyTransformerConfig,
    TransformerConfig,
    transformer_fields,
    plain_field
);

#[pymethods]
impl PyTransformerConfig {
    /// The real Mimi encoder/decoder transformer (d_model 512, 8 heads, 8 layers, context 250).
    #[staticmethod]
    fn mimi() -> Self {
        Self::default()
    }

    /// Size of one attention head.
    #[getter]
    fn head_dim(&self) -> usize {
        self.0.head_dim()
    }
}

/// Configuration of the Mimi codec.
///
/// `CodecConfig()` / `CodecConfig.mimi(num_codebooks=8)` is the real model (24 kHz, 12.5 Hz
/// frames, 2048-entry codebooks of dimension 256). Invalid values raise `ConfigError` naming
/// the field (nested ones as `seanet.ratios`, `transformer.d_model`, ...).
#[pyclass(
    name = "CodecConfig",
    module = "mimi_py._core",
    frozen,
    eq,
    from_py_object
)]
#[derive(Clone, Debug, PartialEq, Default)]
pub struct PyCodecConfig(pub CodecConfig);

/// The nested `transformer` is a `TransformerConfig`; every other field a plain value.
fn codec_field<'py>(py: Python<'py>, field: &str, v: Value) -> PyResult<Bound<'py, PyAny>> {
    if field != "transformer" {
        return to_py(py, &v);
    }
    let Value::Dict(d) = &v else {
        return to_py(py, &v);
    };
    let cfg = TransformerConfig::from_values(d.iter().map(|(k, v)| (k.as_str(), v)))?;
    Ok(Bound::new(py, PyTransformerConfig(cfg))?.into_any())
}

py_config!(PyCodecConfig, CodecConfig, codec_fields, codec_field);

/// A codebook count: 1 to 32, the real model's range.
pub fn real_codebooks(v: Option<&Bound<'_, PyAny>>) -> Result<usize> {
    let n = v.map(|v| arg::<usize>("num_codebooks", v)).transpose()?;
    Ok(CodecConfig::mimi_checked(n)?.quantizer_n_q)
}

/// An optional codebook count of at least 1.
pub fn codebooks(v: Option<&Bound<'_, PyAny>>) -> Result<Option<usize>> {
    CodecConfig::check_codebooks(v.map(|v| arg::<usize>("num_codebooks", v)).transpose()?)
}

#[pymethods]
impl PyCodecConfig {
    /// The real Mimi codec (kyutai/mimi) using `num_codebooks` of its 32 codebooks.
    #[staticmethod]
    #[pyo3(signature = (num_codebooks=None))]
    fn mimi(num_codebooks: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        Ok(Self(CodecConfig::mimi(real_codebooks(num_codebooks)?)))
    }

    /// A config from a Hugging Face `MimiConfig` dict (the `config.json` of kyutai/mimi).
    #[staticmethod]
    #[pyo3(signature = (config, num_codebooks=None))]
    fn from_hf(
        config: &Bound<'_, PyDict>,
        num_codebooks: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let n = codebooks(num_codebooks)?;
        Ok(Self(CodecConfig::from_hf(&value_of(config.as_any()), n)?))
    }

    /// Samples per code frame (`sample_rate / frame_rate`, 1920 for the real model).
    #[getter]
    fn frame_size(&self) -> usize {
        self.0.frame_size()
    }
}

/// A config argument: an instance of the class, a dict of its fields, or `None` (defaults).
pub fn transformer_config(v: Option<&Bound<'_, PyAny>>) -> PyResult<TransformerConfig> {
    match v {
        None => Ok(TransformerConfig::default()),
        Some(c) => match c.cast::<PyTransformerConfig>() {
            Ok(c) => Ok(c.get().0.clone()),
            Err(_) => match c.cast::<PyDict>() {
                Ok(d) => Ok(PyTransformerConfig::from_kwargs(Some(d))?.0),
                Err(_) => Err(pyo3::exceptions::PyTypeError::new_err(format!(
                    "config must be a TransformerConfig or a dict, got {}",
                    c.get_type().name()?
                ))
                .into()),
            },
        },
    }
}

/// A codec config argument: a `CodecConfig`, a dict of its fields, or `None`.
pub fn codec_config(v: Option<&Bound<'_, PyAny>>) -> PyResult<Option<CodecConfig>> {
    let Some(c) = v else {
        return Ok(None);
    };
    if let Ok(c) = c.cast::<PyCodecConfig>() {
        return Ok(Some(c.get().0.clone()));
    }
    match c.cast::<PyDict>() {
        Ok(d) => Ok(Some(PyCodecConfig::from_kwargs(Some(d))?.0)),
        Err(_) => Err(pyo3::exceptions::PyTypeError::new_err(
            "config must be a CodecConfig or a dict",
        )
        .into()),
    }
}
