//! numpy <-> host buffers.
//!
//! Inputs: any real floating array (float16/32/64, C-ordered, Fortran-ordered or strided,
//! negative strides included) is read in logical order into one `Vec<f32>` while the GIL is
//! held (one copy); everything after that runs detached, in the core's host calls.
//! Objects that are not arrays but expose `__array__` go through `numpy.asarray` first.
//! Outputs: a `Vec<f32>` moved into a new numpy array without a copy.

use crate::py::errors::PyResult;
use mimi_core::error::{Error, Result};
use numpy::ndarray::{ArrayD, IxDyn};
use numpy::{
    IntoPyArray, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::prelude::*;

/// A float32 array read from Python, in C order.
pub type HostArray = mimi_core::HostArray<f32>;

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
            ))
            .into()),
        },
        Err(e) => {
            // The cause is the message a user can act on (a tensor that requires grad, a
            // dtype numpy lacks such as bfloat16, a ragged list): it goes into the text.
            let why = e.value(py).to_string();
            let err = pyo3::exceptions::PyTypeError::new_err(format!(
                "{what} must be a numpy array (or convertible with numpy.asarray), got {}: \
                 numpy.asarray failed: {why}",
                type_name(obj)
            ));
            err.set_cause(py, Some(e));
            Err(err.into())
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
        let hint = if kind == b'i' || kind == b'u' {
            "; integer samples must be scaled to [-1, 1): x.astype(numpy.float32) / 32768 \
             for 16-bit PCM, / 2**31 for 32-bit"
        } else {
            "; convert it with .astype(numpy.float32)"
        };
        return Err(Error::DType(format!(
            "{what} must be a real floating-point array (float16, float32 or float64), \
             got dtype {name}{hint}"
        ))
        .into());
    }
    Ok(())
}

/// Copies audio samples, whose dtype and shape the caller has checked: a real floating
/// array as [`copy_f32`] does, or integer PCM with the standard scaling, int16 ÷ 32768 and
/// int32 ÷ 2³¹ (other integer types are refused by [`check_float`], with the scaling to apply).
pub fn copy_pcm(a: &Bound<'_, PyUntypedArray>, what: &str) -> PyResult<Vec<f32>> {
    if let Ok(arr) = a.cast::<PyArrayDyn<i16>>() {
        let ro = arr.try_readonly()?;
        return collect_c_order(ro.as_array(), |v| (f64::from(v) / 32768.0) as f32, what);
    }
    if let Ok(arr) = a.cast::<PyArrayDyn<i32>>() {
        let ro = arr.try_readonly()?;
        return collect_c_order(
            ro.as_array(),
            |v| (f64::from(v) / 2147483648.0) as f32,
            what,
        );
    }
    copy_f32(a, what)
}

/// Whether `a` is integer PCM that [`copy_pcm`] scales (int16 or int32, native byte order).
pub fn is_int_pcm(a: &Bound<'_, PyUntypedArray>) -> bool {
    a.cast::<PyArrayDyn<i16>>().is_ok() || a.cast::<PyArrayDyn<i32>>().is_ok()
}

/// Refuses arrays too large to read (the core's rule, [`mimi_core::host::check_size`]):
/// checked before reading, so that a zero-stride view of a huge shape costs nothing.
pub fn check_size(shape: &[usize], what: &str) -> PyResult<()> {
    Ok(mimi_core::host::check_size(shape, what)?)
}

/// Copies an array view into a C-ordered vector (logical order, whatever the strides),
/// reporting an allocation failure as an error instead of aborting.
fn collect_c_order<T: Copy, U>(
    view: numpy::ndarray::ArrayViewD<'_, T>,
    f: impl Fn(T) -> U,
    what: &str,
) -> PyResult<Vec<U>> {
    let mut out = Vec::new();
    out.try_reserve_exact(view.len()).map_err(|_| {
        Error::Resource(format!(
            "not enough memory to read {what} ({} values)",
            view.len()
        ))
    })?;
    // `as_slice` is only Some for standard (C-contiguous) layout; Fortran-ordered and strided
    // arrays are iterated in logical order.
    match view.as_slice() {
        Some(s) => out.extend(s.iter().map(|&v| f(v))),
        None => out.extend(view.iter().map(|&v| f(v))),
    }
    Ok(out)
}

/// Reads a real floating array (any layout, float16 to float64) into a C-ordered `Vec<f32>`,
/// refusing another dtype and a size past the limits, for a caller with no model's check of
/// its shape. Finite values are the core's rule (`host::check_finite`, with the rows a call
/// steps), not checked here.
pub fn read_f32(a: &Bound<'_, PyUntypedArray>, what: &str) -> PyResult<HostArray> {
    check_float(a, what)?;
    let shape = shape_of(a);
    check_size(&shape, what)?;
    Ok(HostArray {
        data: copy_f32(a, what)?,
        shape,
    })
}

/// Copies a real floating array whose dtype and shape the caller has checked (see
/// [`read_f32`]) into a C-ordered `Vec<f32>`.
pub fn copy_f32(a: &Bound<'_, PyUntypedArray>, what: &str) -> PyResult<Vec<f32>> {
    if let Ok(arr) = a.cast::<PyArrayDyn<f32>>() {
        let ro = arr.try_readonly()?;
        collect_c_order(ro.as_array(), |v| v, what)
    } else if let Ok(arr) = a.cast::<PyArrayDyn<f64>>() {
        let ro = arr.try_readonly()?;
        collect_c_order(ro.as_array(), |v| v as f32, what)
    } else {
        // float16, longdouble, non-native byte order: let numpy convert once, in C order.
        let conv = a.call_method1("astype", ("float32", "C"))?;
        let conv = conv.cast_into::<PyArrayDyn<f32>>().map_err(PyErr::from)?;
        let ro = conv.try_readonly()?;
        collect_c_order(ro.as_array(), |v| v, what)
    }
}

/// Moves a C-ordered vector (float32 audio, uint32 codes) into a new numpy array, no copy.
pub fn to_numpy<'py, T: numpy::Element>(
    py: Python<'py>,
    data: Vec<T>,
    shape: &[usize],
) -> Result<Bound<'py, PyAny>> {
    let arr = ArrayD::from_shape_vec(IxDyn(shape), data)
        .map_err(|e| Error::Shape(format!("internal shape error: {e}")))?;
    Ok(arr.into_pyarray(py).into_any())
}
