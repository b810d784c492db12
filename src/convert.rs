//! numpy <-> host buffers.
//!
//! Inputs: any real floating array (float16/32/64, C-ordered, Fortran-ordered or strided,
//! negative strides included) is read in logical order into one `Vec<f32>` while the GIL is
//! held (one copy, which candle needs anyway); everything after that runs detached.
//! Objects that are not arrays but expose `__array__` go through `numpy.asarray` first.
//! Outputs: a `Vec<f32>` moved into a new numpy array without a copy.

use crate::errors::{Error, Result};
use numpy::ndarray::{ArrayD, IxDyn};
use numpy::{
    IntoPyArray, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::prelude::*;

/// A float32 array read from Python, in C order.
#[derive(Debug, Clone)]
pub struct HostArray {
    pub data: Vec<f32>,
    pub shape: Vec<usize>,
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "object".to_string())
}

/// Returns `obj` as a numpy array, converting array-likes with `numpy.asarray`.
pub fn as_ndarray<'py>(
    obj: &Bound<'py, PyAny>,
    what: &str,
) -> PyResult<Bound<'py, PyUntypedArray>> {
    if let Ok(a) = obj.cast::<PyUntypedArray>() {
        return Ok(a.clone());
    }
    let py = obj.py();
    let np = py.import("numpy")?;
    match np.call_method1("asarray", (obj,)) {
        Ok(a) => match a.cast_into::<PyUntypedArray>() {
            // Strings, objects and records are not array-likes of numbers.
            Ok(a) if !b"USOV".contains(&a.dtype().kind()) => Ok(a),
            _ => Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "{what} must be a numpy array, got {}",
                type_name(obj)
            ))),
        },
        Err(e) => {
            let err = pyo3::exceptions::PyTypeError::new_err(format!(
                "{what} must be a numpy array (or convertible with numpy.asarray), got {}",
                type_name(obj)
            ));
            err.set_cause(py, Some(e));
            Err(err)
        }
    }
}

/// The shape of a numpy array.
pub fn shape_of(a: &Bound<'_, PyUntypedArray>) -> Vec<usize> {
    a.shape().to_vec()
}

/// Checks that `a` holds real floating values (float16/32/64, longdouble).
pub fn check_float(a: &Bound<'_, PyUntypedArray>, what: &str) -> PyResult<()> {
    let dtype = a.dtype();
    let kind = dtype.kind();
    if kind != b'f' {
        let name = dtype
            .str()
            .map(|s| s.to_string())
            .unwrap_or_else(|_| "?".into());
        return Err(Error::DType(format!(
            "{what} must be a real floating-point array (float16, float32 or float64), \
             got dtype {name}; convert it with .astype(numpy.float32)"
        ))
        .into());
    }
    Ok(())
}

/// Reads a real floating array into a C-ordered `Vec<f32>`.
pub fn read_f32(a: &Bound<'_, PyUntypedArray>, what: &str) -> PyResult<HostArray> {
    check_float(a, what)?;
    let shape = shape_of(a);
    if let Ok(arr) = a.cast::<PyArrayDyn<f32>>() {
        let ro = arr.try_readonly()?;
        let data = match ro.as_slice() {
            Ok(s) => s.to_vec(),
            Err(_) => ro.as_array().iter().copied().collect(),
        };
        return Ok(HostArray { data, shape });
    }
    if let Ok(arr) = a.cast::<PyArrayDyn<f64>>() {
        let ro = arr.try_readonly()?;
        let data = ro.as_array().iter().map(|&v| v as f32).collect();
        return Ok(HostArray { data, shape });
    }
    // float16, longdouble, ...: let numpy convert once.
    let conv = a.call_method1("astype", ("float32",))?;
    let conv = conv.cast_into::<PyArrayDyn<f32>>().map_err(PyErr::from)?;
    let ro = conv.try_readonly()?;
    let data = match ro.as_slice() {
        Ok(s) => s.to_vec(),
        Err(_) => ro.as_array().iter().copied().collect(),
    };
    Ok(HostArray { data, shape })
}

/// Moves a C-ordered `Vec<f32>` into a new numpy array.
pub fn to_numpy<'py>(
    py: Python<'py>,
    data: Vec<f32>,
    shape: &[usize],
) -> Result<Bound<'py, PyAny>> {
    let arr = ArrayD::from_shape_vec(IxDyn(shape), data)
        .map_err(|e| Error::Shape(format!("internal shape error: {e}")))?;
    Ok(arr.into_pyarray(py).into_any())
}
