//! Per-row arguments of the batched streaming calls: `active=` (which rows step) and
//! `rows=` (which rows `reset_state` resets), read and checked once for both classes.

use crate::py::convert;
use crate::py::errors::PyResult;
use mimi_core::error::Error;
use numpy::{PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;

use mimi_core::rows::RowSelection;

fn read_bools(a: &Bound<'_, numpy::PyUntypedArray>) -> PyResult<Vec<bool>> {
    let a = a.cast::<PyArrayDyn<bool>>().map_err(PyErr::from)?;
    let ro = a.try_readonly()?;
    Ok(ro.as_array().iter().copied().collect())
}

fn read_ints(a: &Bound<'_, numpy::PyUntypedArray>) -> PyResult<Vec<i64>> {
    let conv = a.call_method1("astype", ("int64", "C"))?;
    let a = conv.cast_into::<PyArrayDyn<i64>>().map_err(PyErr::from)?;
    let ro = a.try_readonly()?;
    Ok(ro.as_array().iter().copied().collect())
}

/// `active=`: a boolean array of shape `(batch,)`: the rows that step (its dtype and rank
/// are read here; its length is the core's rule, [`mimi_core::rows::Rows::or_all`]).
pub fn active(
    obj: Option<&Bound<'_, PyAny>>,
    batch: usize,
) -> PyResult<Option<mimi_core::codec::Rows>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    let a = convert::as_ndarray(obj, "active")?;
    if a.dtype().kind() != b'b' {
        return Err(Error::DType(format!(
            "active must be a boolean array of shape (batch,), got dtype {}",
            a.dtype()
                .str()
                .map_or_else(|_| "?".into(), |s| s.to_string())
        ))
        .into());
    }
    if a.ndim() != 1 {
        return Err(mimi_core::codec::Rows::active_shape_error(batch, a.shape()).into());
    }
    Ok(Some(mimi_core::codec::Rows::from_mask(&read_bools(&a)?)))
}

/// `rows=`: `None`, a boolean mask, or a sequence of row indices.
pub fn rows(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<RowSelection>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    let a = convert::as_ndarray(obj, "rows")?;
    if a.ndim() != 1 {
        return Err(Error::Shape(format!(
            "rows must be a 1-d sequence of row indices or a boolean mask, got shape {:?}",
            a.shape()
        ))
        .into());
    }
    match a.dtype().kind() {
        b'b' => Ok(Some(RowSelection::Mask(read_bools(&a)?))),
        b'i' | b'u' => Ok(Some(RowSelection::Indices(read_ints(&a)?))),
        // An empty list arrives as float64.
        _ if a.len() == 0 => Ok(Some(RowSelection::Indices(Vec::new()))),
        _ => Err(
            Error::DType("rows must be row indices (integers) or a boolean mask".to_string())
                .into(),
        ),
    }
}

/// `lengths=`: `None`, or one non-negative integer per batch item, each at most `max` (in
/// `unit`s: samples or frames), for an input of `(batch, max)`. Read while attached, before
/// anything runs; the call checks them ([`mimi_core::codec::lengths::check_lengths`]), and
/// integers no `usize` holds are refused here with the same rule's message.
pub fn lengths(
    obj: Option<&Bound<'_, PyAny>>,
    (batch, max): (usize, usize),
    unit: &str,
) -> PyResult<Option<Vec<usize>>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    let not_ints = |got: String| {
        Error::DType(format!(
            "lengths must be integers ({unit} per batch item), got {got}"
        ))
    };
    let a = convert::as_ndarray(obj, "lengths").map_err(|_| {
        not_ints(format!(
            "a {}",
            obj.get_type().name().map_or("?".into(), |n| n.to_string())
        ))
    })?;
    // An empty list arrives as float64: it is an (empty) list of integers.
    let integers = matches!(a.dtype().kind(), b'i' | b'u') || (a.len() == 0 && a.ndim() == 1);
    if !integers {
        return Err(Error::DType(format!(
            "lengths must be integers ({unit} per batch item), got dtype {}",
            a.dtype()
                .str()
                .map_or_else(|_| "?".into(), |s| s.to_string())
        ))
        .into());
    }
    if a.ndim() != 1 {
        return Err(Error::Shape(format!(
            "lengths must have shape (batch,) = ({batch},), got {:?}",
            a.shape()
        ))
        .into());
    }
    let values = read_ints(&a)?;
    match values.iter().map(|&v| usize::try_from(v)).collect() {
        Ok(lengths) => Ok(Some(lengths)),
        // A negative length: the rule's own message.
        Err(_) => Ok(Some(mimi_core::codec::lengths::checked_lengths(
            &values, batch, max, unit,
        )?)),
    }
}
