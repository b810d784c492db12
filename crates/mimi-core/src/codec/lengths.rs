//! Offline calls on batches of items of different lengths (`lengths=`): each item is computed
//! alone, on its own length, so its result is exactly the one it would get in a batch of one
//! ([`per_item`]); the batch runs its items in parallel (each item's segments too), and the
//! output is padded with zeros to the longest item.

use crate::error::{Error, Result};
use crate::host::HostArray;
use rayon::prelude::*;

/// The rule for `lengths=`, declared once (the Python binding reads the integers and calls
/// it too): one entry per batch item, each in `[0, max]` (`what` names the unit in the
/// message: samples, frames). Returns them as `usize`.
pub fn checked_lengths<T>(values: &[T], batch: usize, max: usize, what: &str) -> Result<Vec<usize>>
where
    T: Copy + std::fmt::Display + TryInto<usize>,
{
    if values.len() != batch {
        return Err(Error::Shape(format!(
            "lengths must hold one entry per batch item ({batch}), got {}",
            values.len()
        )));
    }
    let one = |(i, &v): (usize, &T)| match v.try_into() {
        Ok(l) if l <= max => Ok(l),
        _ => Err(Error::Shape(format!(
            "lengths[{i}] = {v} is outside [0, {max}] (the input's {what})"
        ))),
    };
    values.iter().enumerate().map(one).collect()
}

/// [`checked_lengths`] of lengths already in `usize`.
pub fn check_lengths(lengths: &[usize], batch: usize, max: usize, what: &str) -> Result<()> {
    checked_lengths(lengths, batch, max, what).map(drop)
}

/// `f` on each item's first `lengths[i]` columns (the last axis) alone, as a batch of one,
/// in parallel on the CPU (`on_cpu`); each output padded with zeros along its last axis to
/// the longest (`out_len` of each length), then stacked. An item of length 0 gives zeros.
pub(crate) fn per_item<T, U>(
    x: &HostArray<T>,
    lengths: &[usize],
    (channels, out_len, on_cpu): (usize, &(dyn Fn(usize) -> usize + Sync), bool),
    f: &(dyn Fn(HostArray<T>) -> Result<HostArray<U>> + Sync),
) -> Result<HostArray<U>>
where
    T: Copy + Send + Sync,
    U: Copy + Default + Send,
{
    let (c, n) = (x.shape[1], x.shape[2]);
    let item = |(i, &l): (usize, &usize)| -> Result<Option<HostArray<U>>> {
        if l == 0 {
            return Ok(None);
        }
        let rows = (0..c).map(|ch| &x.data[(i * c + ch) * n..(i * c + ch) * n + l]);
        f(HostArray::new(
            rows.flatten().copied().collect(),
            vec![1, c, l],
        ))
        .map(Some)
    };
    // On a GPU the items stay on this thread (see `kernels::in_pool_on`).
    let outs: Vec<Option<HostArray<U>>> = match on_cpu {
        true => lengths
            .par_iter()
            .enumerate()
            .map(item)
            .collect::<Result<_>>()?,
        false => lengths
            .iter()
            .enumerate()
            .map(item)
            .collect::<Result<_>>()?,
    };
    let width = lengths.iter().map(|&l| out_len(l)).max().unwrap_or(0);
    let mut data = vec![U::default(); lengths.len() * channels * width];
    for (i, y) in outs.iter().enumerate() {
        let Some(y) = y else { continue };
        let w = y.shape[2];
        for (ch, row) in y.data.chunks_exact(w.max(1)).take(channels).enumerate() {
            let at = (i * channels + ch) * width;
            data[at..at + w].copy_from_slice(row);
        }
    }
    Ok(HostArray::new(data, vec![lengths.len(), channels, width]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_one_per_item_and_within_the_input() {
        assert!(check_lengths(&[3, 5], 2, 5, "samples").is_ok());
        assert!(matches!(
            check_lengths(&[3], 2, 5, "samples"),
            Err(Error::Shape(_))
        ));
        assert!(matches!(
            check_lengths(&[3, 6], 2, 5, "samples"),
            Err(Error::Shape(_))
        ));
        match checked_lengths(&[3i64, -1], 2, 5, "frames") {
            Err(Error::Shape(m)) => assert!(m.contains("lengths[1] = -1 is outside [0, 5]"), "{m}"),
            other => panic!("expected a shape error, got {other:?}"),
        }
        assert_eq!(checked_lengths(&[0i64, 5], 2, 5, "frames").unwrap(), [0, 5]);
    }
}
