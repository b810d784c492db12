//! Per-row arguments of the batched streaming calls: `active=` (which rows step) and
//! `rows=` (which rows `reset_state` resets), read and checked once for both classes.

use crate::py::convert;
use crate::py::errors::PyResult;
use mimi_core::error::{Error, Result};
use numpy::{PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;

/// A row selection as given: a boolean mask or row indices.
pub enum Rows {
    Mask(Vec<bool>),
    Indices(Vec<i64>),
}

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

/// `active=`: a boolean array of shape `(batch,)`; the sorted indices of the active rows.
pub fn active(obj: Option<&Bound<'_, PyAny>>, batch: usize) -> PyResult<Option<Vec<usize>>> {
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
    if a.shape() != [batch] {
        return Err(Error::Shape(format!(
            "active must have shape (batch,) = ({batch},), got {:?}",
            a.shape()
        ))
        .into());
    }
    let mask = read_bools(&a)?;
    Ok(Some((0..batch).filter(|&r| mask[r]).collect()))
}

/// `rows=`: `None`, a boolean mask, or a sequence of row indices.
pub fn rows(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Rows>> {
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
        b'b' => Ok(Some(Rows::Mask(read_bools(&a)?))),
        b'i' | b'u' => Ok(Some(Rows::Indices(read_ints(&a)?))),
        // An empty list arrives as float64.
        _ if a.len() == 0 => Ok(Some(Rows::Indices(Vec::new()))),
        _ => Err(
            Error::DType("rows must be row indices (integers) or a boolean mask".to_string())
                .into(),
        ),
    }
}

/// The sorted, distinct rows a selection names in a batch of `batch` rows (`None`: the
/// stream has not started, so any index is accepted and names nothing yet).
pub fn resolve(rows: &Rows, batch: Option<usize>) -> Result<Vec<usize>> {
    let out_of_range = |r: String| {
        Error::Shape(format!(
            "row {r} is out of range for a stream of batch size {}",
            batch.map_or("?".into(), |b| b.to_string())
        ))
    };
    let mut out: Vec<usize> = match rows {
        Rows::Mask(m) => {
            if let Some(b) = batch.filter(|&b| b != m.len()) {
                return Err(Error::Shape(format!(
                    "a boolean rows mask must have one entry per row ({b}), got {}",
                    m.len()
                )));
            }
            (0..m.len()).filter(|&r| m[r]).collect()
        }
        Rows::Indices(ix) => ix
            .iter()
            .map(|&r| match usize::try_from(r) {
                Ok(r) if batch.is_none_or(|b| r < b) => Ok(r),
                _ => Err(out_of_range(r.to_string())),
            })
            .collect::<Result<_>>()?,
    };
    out.sort_unstable();
    out.dedup();
    Ok(out)
}
