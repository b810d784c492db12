//! Host arrays: C-ordered values with their shape, as a caller without candle holds them
//! (the Python binding's numpy arrays, a Rust user's `Vec`s), the rules every input
//! array obeys (its size, finite values), and [`HostInput`]: an input whose shape its model
//! has already checked, so that each rule runs once per call.

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};

/// C-ordered `data` of shape `shape`.
#[derive(Clone, Debug, PartialEq)]
pub struct HostArray<T> {
    pub data: Vec<T>,
    pub shape: Vec<usize>,
}

impl<T> HostArray<T> {
    pub fn new(data: Vec<T>, shape: Vec<usize>) -> Self {
        debug_assert_eq!(data.len(), shape.iter().product::<usize>());
        Self { data, shape }
    }
}

/// A shape its model accepted for one kind of input (shape, size, memory): made by the
/// model's check (`Codec::input_shape`, `Transformer::check_call`) while a binding still
/// holds the caller's array, before copying it. Handed back with the values
/// ([`HostInput::Shaped`]), it spares the call those checks; the values' own rules (finite
/// samples, codes in range) still run, once, in the call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckedShape {
    dims: Vec<usize>,
    /// The model that checked it ([`owner_id`]) and the kind of input, as it names them.
    owner: (u64, u8),
}

impl CheckedShape {
    pub(crate) fn new(dims: Vec<usize>, owner: (u64, u8)) -> Self {
        Self { dims, owner }
    }

    /// The shape, as the model reads the input (for example `(batch, channels, samples)`).
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }
}

/// An input array as a model's calls take it: one they check whole, or values whose shape
/// the model has checked ([`CheckedShape`]). A `HostArray` converts into the first.
#[derive(Clone, Debug, PartialEq)]
pub enum HostInput<T> {
    Unchecked(HostArray<T>),
    Shaped(CheckedShape, Vec<T>),
}

impl<T> From<HostArray<T>> for HostInput<T> {
    fn from(a: HostArray<T>) -> Self {
        HostInput::Unchecked(a)
    }
}

impl<T> HostInput<T> {
    /// The input's shape: its model's reading of it when checked, else as given.
    pub fn shape(&self) -> &[usize] {
        match self {
            HostInput::Shaped(s, _) => s.dims(),
            HostInput::Unchecked(a) => &a.shape,
        }
    }

    /// The array, its shape checked by `check` (which may rewrite it, as the model reads it)
    /// unless `owner` checked it already (a shape checked by another model or for another
    /// kind of input is checked again); refuses values that do not fill the shape.
    pub(crate) fn resolve(
        self,
        owner: (u64, u8),
        what: &str,
        check: impl FnOnce(&mut Vec<usize>) -> Result<()>,
    ) -> Result<HostArray<T>> {
        let (data, mut shape, checked) = match self {
            HostInput::Shaped(s, data) => (data, s.dims, s.owner == owner),
            HostInput::Unchecked(a) => (a.data, a.shape, false),
        };
        check_len(data.len(), &shape, what)?;
        if !checked {
            check(&mut shape)?;
        }
        Ok(HostArray { data, shape })
    }
}

/// A fresh identity for a model whose checks a [`CheckedShape`] records.
pub(crate) fn owner_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Refuses values that do not fill their shape (a Rust caller's mistake).
fn check_len(len: usize, shape: &[usize], what: &str) -> Result<()> {
    let n = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    if n != Some(len) {
        return Err(Error::Shape(format!(
            "{what} holds {len} values but its shape {shape:?} needs {}",
            n.map_or("more than usize::MAX".into(), |n| n.to_string())
        )));
    }
    Ok(())
}

/// The most values one call reads: 2^31 (8 GiB as f32). Larger inputs (for example a
/// zero-stride view, which costs nothing to create) are refused before they are read.
pub const MAX_ELEMENTS: usize = 1 << 31;

/// Refuses an input of `shape` with more than [`MAX_ELEMENTS`] values.
pub fn check_size(shape: &[usize], what: &str) -> Result<()> {
    let n = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    match n {
        Some(n) if n <= MAX_ELEMENTS => Ok(()),
        _ => Err(Error::Shape(format!(
            "{what} of shape {shape:?} is too large: at most {MAX_ELEMENTS} values are accepted \
             in one call; split it into chunks (the streaming calls accept any chunking)"
        ))),
    }
}

/// The most rows one call or stream takes: 2^16. A call does work and keeps state per row
/// whatever the row's length, so the batch is bounded on its own: an empty input of an
/// enormous batch (a numpy array of shape `(2**31, k, 0)` costs nothing) holds no values and
/// passes [`check_size`].
pub const MAX_BATCH: usize = 1 << 16;

/// Refuses a batch of more than [`MAX_BATCH`] rows (`what`: the input, for the message).
pub fn check_batch_size(batch: usize, what: &str) -> Result<()> {
    if batch > MAX_BATCH {
        return Err(Error::Shape(format!(
            "{what} has a batch of {batch} rows: at most {MAX_BATCH} are accepted in one call \
             or stream; split the batch"
        )));
    }
    Ok(())
}

/// Refuses NaN and Inf in the batch rows `rows` of `(data, shape)` (all rows if `None`):
/// the inactive rows of a masked step may hold anything.
pub fn check_finite(
    data: &[f32],
    shape: &[usize],
    rows: Option<&[usize]>,
    what: &str,
) -> Result<()> {
    let row_len = shape[1..].iter().product::<usize>();
    let bad = |r: usize| {
        let row = &data[r * row_len..(r + 1) * row_len];
        row.iter()
            .position(|v| !v.is_finite())
            .map(|i| r * row_len + i)
    };
    let first = match rows {
        Some(rows) => rows.iter().find_map(|&r| bad(r)),
        None => (0..shape.first().copied().unwrap_or(0)).find_map(bad),
    };
    match first {
        Some(i) => Err(Error::InvalidInput(format!(
            "{what} contains NaN or Inf (first at flat index {i}); mimi_py refuses non-finite \
             inputs because they would silently poison the stream"
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_bounded_and_values_finite_in_the_stepping_rows() {
        assert!(check_size(&[2, 3], "x").is_ok());
        assert!(matches!(
            check_size(&[1 << 20, 1 << 20], "x"),
            Err(Error::Shape(_))
        ));
        assert!(check_batch_size(MAX_BATCH, "x").is_ok());
        assert!(matches!(
            check_batch_size(MAX_BATCH + 1, "x"),
            Err(Error::Shape(m)) if m.contains("batch of 65537 rows")
        ));
        let e = check_finite(&[0.0, f32::NAN, 1.0, 2.0], &[2, 2], Some(&[1]), "pcm");
        assert!(e.is_ok(), "an inactive row may hold NaN");
        assert!(check_finite(&[0.0, f32::NAN, 1.0, 2.0], &[2, 2], None, "pcm").is_err());
    }

    #[test]
    fn a_checked_shape_spares_only_its_own_models_check() {
        let checks = std::cell::Cell::new(0);
        let check = |shape: &mut Vec<usize>| {
            checks.set(checks.get() + 1);
            *shape = vec![1, 1, shape.iter().product()];
            Ok(())
        };
        let own = (owner_id(), 0);
        let shaped =
            |owner| HostInput::Shaped(CheckedShape::new(vec![1, 1, 3], owner), vec![0f32; 3]);
        let a = shaped(own).resolve(own, "x", check).unwrap();
        assert_eq!((a.shape, checks.get()), (vec![1, 1, 3], 0));
        for other in [(owner_id(), 0), (own.0, 1)] {
            shaped(other).resolve(own, "x", check).unwrap();
        }
        let flat = HostInput::from(HostArray::new(vec![0f32; 3], vec![3]));
        assert_eq!(flat.resolve(own, "x", check).unwrap().shape, [1, 1, 3]);
        assert_eq!(
            checks.get(),
            3,
            "other models, other kinds and plain arrays are checked"
        );
        let short = HostInput::Unchecked(HostArray {
            data: vec![0f32; 2],
            shape: vec![3],
        });
        assert!(matches!(
            short.resolve(own, "x", check),
            Err(Error::Shape(_))
        ));
        let short = HostInput::Shaped(CheckedShape::new(vec![1, 1, 3], own), vec![0f32; 2]);
        assert!(matches!(
            short.resolve(own, "x", check),
            Err(Error::Shape(_))
        ));
    }
}
