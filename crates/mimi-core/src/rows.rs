//! The rows of a batched stream that a call touches, as one named type: a step's `active`
//! mask, a reset's rows, and the select/scatter between a whole batch and those rows.

use crate::error::{Error, Result};

/// Rows a step keeps its per-row lists for on the stack: the rows' indices, states and
/// frames ([`RowList`]). A warm step of up to this many rows allocates none of them.
pub const ROWS_INLINE: usize = 32;

/// A step's list of one item per row: on the stack up to [`ROWS_INLINE`] rows, on the heap
/// past it.
pub type RowList<T> = smallvec::SmallVec<[T; ROWS_INLINE]>;

/// A row selection as a caller gives it (a reset's `rows=`): a boolean mask or row indices,
/// not yet resolved against a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RowSelection {
    Mask(Vec<bool>),
    Indices(Vec<i64>),
}

impl RowSelection {
    /// The sorted, distinct rows it names in a stream of `batch` rows (`None`: the stream has
    /// not started, so any index is accepted and names nothing yet).
    pub fn resolve(&self, batch: Option<usize>) -> Result<Vec<usize>> {
        match self {
            Self::Mask(m) => Rows::resolve_mask(m, batch),
            Self::Indices(ix) => Rows::resolve_indices(ix, batch),
        }
    }
}

/// Which rows of a stream of `batch` rows a step advances: all of them (an unmasked step) or
/// a sorted, distinct subset (a masked step; the others are untouched bit for bit).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rows {
    batch: usize,
    active: Option<Vec<usize>>,
}

impl Rows {
    /// Every row of a batch of `batch` (an unmasked step).
    pub fn all(batch: usize) -> Self {
        Self {
            batch,
            active: None,
        }
    }

    /// The rows whose `mask` entry is true (a masked step over `mask.len()` rows).
    pub fn from_mask(mask: &[bool]) -> Self {
        Self {
            batch: mask.len(),
            active: Some((0..mask.len()).filter(|&r| mask[r]).collect()),
        }
    }

    /// The sorted, distinct rows that `indices` name in a stream of `batch` rows (`None`: the
    /// stream has not started, so any index is accepted and names nothing yet).
    pub fn resolve_indices(indices: &[i64], batch: Option<usize>) -> Result<Vec<usize>> {
        let mut out = indices
            .iter()
            .map(|&r| match usize::try_from(r) {
                Ok(r) if batch.is_none_or(|b| r < b) => Ok(r),
                _ => Err(Error::Shape(format!(
                    "row {r} is out of range for a stream of batch size {}",
                    batch.map_or("?".into(), |b| b.to_string())
                ))),
            })
            .collect::<Result<Vec<_>>>()?;
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    /// The rows a boolean `mask` names in a stream of `batch` rows (see
    /// [`Self::resolve_indices`]).
    pub fn resolve_mask(mask: &[bool], batch: Option<usize>) -> Result<Vec<usize>> {
        if let Some(b) = batch.filter(|&b| b != mask.len()) {
            return Err(Error::Shape(format!(
                "a boolean rows mask must have one entry per row ({b}), got {}",
                mask.len()
            )));
        }
        Ok(Self::from_mask(mask).indices().to_vec())
    }

    /// `rows`, or every row of a batch of `batch` when `None`; refuses a mask of another
    /// length (the step's input has `batch` rows).
    pub fn or_all(rows: Option<Rows>, batch: usize) -> Result<Rows> {
        match rows {
            None => Ok(Rows::all(batch)),
            Some(r) if r.batch == batch => Ok(r),
            Some(r) => Err(Self::active_shape_error(batch, &[r.batch])),
        }
    }

    /// The error for an `active` mask of shape `got` on an input of `batch` rows.
    pub fn active_shape_error(batch: usize, got: &[usize]) -> Error {
        Error::Shape(format!(
            "active must have shape (batch,) = ({batch},), got {got:?}"
        ))
    }

    /// The stream's batch size.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Whether this is a masked step (even one whose mask is all true).
    pub fn is_masked(&self) -> bool {
        self.active.is_some()
    }

    /// The rows that step, sorted.
    pub fn indices(&self) -> RowList<usize> {
        match &self.active {
            Some(rows) => RowList::from_slice(rows),
            None => (0..self.batch).collect(),
        }
    }

    /// How many rows step.
    pub fn count(&self) -> usize {
        self.active.as_ref().map_or(self.batch, Vec::len)
    }

    /// The stepping rows of a `(batch, ...)` buffer of `row_len` values per row.
    pub fn select<T: Copy>(&self, data: &[T], row_len: usize) -> Vec<T> {
        match &self.active {
            None => data.to_vec(),
            Some(rows) => rows
                .iter()
                .flat_map(|&r| data[r * row_len..(r + 1) * row_len].iter().copied())
                .collect(),
        }
    }

    /// A `(batch, ...)` buffer of zeros with the stepping rows taken from `data` (their rows
    /// in order): the output of a masked step.
    pub fn scatter<T: Copy + Default>(&self, data: Vec<T>, row_len: usize) -> Vec<T> {
        let Some(rows) = &self.active else {
            return data;
        };
        let mut out = vec![T::default(); self.batch * row_len];
        for (i, &r) in rows.iter().enumerate() {
            out[r * row_len..(r + 1) * row_len]
                .copy_from_slice(&data[i * row_len..(i + 1) * row_len]);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn select_and_scatter_are_inverse_on_the_active_rows() {
        let rows = Rows::from_mask(&[false, true, false, true]);
        let data: Vec<u32> = (0..8).collect();
        let picked = rows.select(&data, 2);
        assert_eq!(picked, vec![2, 3, 6, 7]);
        assert_eq!(rows.scatter(picked, 2), vec![0, 0, 2, 3, 0, 0, 6, 7]);
        assert_eq!(Rows::all(4).select(&data, 2), data);
    }

    #[test]
    fn indices_are_sorted_distinct_and_in_range() {
        assert_eq!(
            Rows::resolve_indices(&[3, 1, 3], Some(4)).unwrap(),
            vec![1, 3]
        );
        assert!(matches!(
            Rows::resolve_indices(&[4], Some(4)),
            Err(Error::Shape(_))
        ));
        assert!(Rows::resolve_indices(&[-1], None).is_err());
        assert!(Rows::resolve_mask(&[true], Some(2)).is_err());
    }
}
