//! The `weights=` argument, read once for every class: a checkpoint path (any `os.PathLike`),
//! a mapping of names to numpy arrays, or `None` for seeded weights.

use crate::py::convert;
use crate::py::errors::PyResult;
use mimi_core::error::Error;
use mimi_core::HostArray;
use numpy::{PyArrayDescrMethods, PyUntypedArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyMapping, PyString};
use std::collections::HashMap;
use std::path::PathBuf;

/// What a `weights=` argument names.
pub enum WeightsArg {
    /// `None`: seeded weights.
    Seed(u64),
    /// A path (file or directory; the caller decides what it accepts).
    Path(PathBuf),
    /// A mapping, read into float32 host arrays under its own keys.
    Mapping(HashMap<String, HostArray<f32>>),
}

fn type_name(v: &Bound<'_, PyAny>) -> String {
    v.get_type()
        .name()
        .map_or_else(|_| "object".into(), |n| n.to_string())
}

/// Reads `weights`; a mapping keeps only the keys under `prefix`. `expected` completes the
/// message for an argument of another type ("a path to a .safetensors file").
pub fn read(
    weights: Option<&Bound<'_, PyAny>>,
    seed: u64,
    prefix: &str,
    expected: &str,
) -> PyResult<WeightsArg> {
    let Some(w) = weights else {
        return Ok(WeightsArg::Seed(seed));
    };
    if let Ok(m) = w.cast::<PyMapping>() {
        return Ok(WeightsArg::Mapping(read_mapping(m, prefix)?));
    }
    if w.is_instance_of::<PyString>() || w.hasattr("__fspath__").unwrap_or(false) {
        let path = w.py().import("os")?.call_method1("fspath", (w,))?;
        let path: PathBuf = path
            .extract()
            .map_err(|_| PyTypeError::new_err("weights path must be a str path"))?;
        return Ok(WeightsArg::Path(path));
    }
    Err(PyTypeError::new_err(format!(
        "weights must be {expected}, a mapping of names to numpy arrays, or None; got {}",
        type_name(w)
    ))
    .into())
}

fn read_mapping(
    mapping: &Bound<'_, PyMapping>,
    prefix: &str,
) -> PyResult<HashMap<String, HostArray<f32>>> {
    let mut out = HashMap::new();
    for item in mapping.items()?.iter() {
        let (k, v): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item.extract()?;
        let key = k.cast::<PyString>().map_err(|_| {
            PyTypeError::new_err(format!(
                "weights mapping keys must be str, got {}",
                type_name(&k)
            ))
        })?;
        let key = key.to_string();
        if !key.starts_with(prefix) {
            continue;
        }
        let what = format!("weights[{key:?}]");
        let arr = convert::as_ndarray(&v, &what)?;
        if arr.dtype().kind() != b'f' {
            let dtype = arr
                .dtype()
                .str()
                .map_or_else(|_| "?".into(), |s| s.to_string());
            return Err(Error::Weights(format!(
                "tensor {key:?} has a non-floating dtype {dtype}; weights must be float16, float32 or float64"
            ))
            .into());
        }
        out.insert(key, convert::read_f32(&arr, &what)?);
    }
    Ok(out)
}
