//! Host arrays: C-ordered values with their shape, as a caller without candle holds them
//! (the Python binding's numpy arrays, a Rust user's `Vec`s), and the rules every input
//! array obeys (its size, finite values).

use crate::error::{Error, Result};

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
        let e = check_finite(&[0.0, f32::NAN, 1.0, 2.0], &[2, 2], Some(&[1]), "pcm");
        assert!(e.is_ok(), "an inactive row may hold NaN");
        assert!(check_finite(&[0.0, f32::NAN, 1.0, 2.0], &[2, 2], None, "pcm").is_err());
    }
}
