//! The rows one streaming step touches, as device index tensors built once per step: which
//! batch rows to read from a layer's state (`select`) and how to put the updated rows back
//! (`put`), so a masked step leaves every other row's state bit for bit as it was.

use crate::error::Result;
use crate::rows::Rows;
use candle::{Device, Tensor};

/// A step's rows on a device: their batch indices and, for a masked step, the index tensors
/// that select them from a `(batch, ...)` state and write them back.
pub(super) struct StepRows {
    /// The stepping rows' batch indices, sorted.
    pub idx: Vec<usize>,
    /// The stream's batch size.
    pub batch: usize,
    /// `(count,)` u32: the stepping rows (`None`: every row, in order).
    select: Option<Tensor>,
    /// `(batch,)` u32 into `[state ++ new rows]`: row `r` of the updated state.
    put: Option<Tensor>,
}

impl StepRows {
    /// The device indices of `rows` (none for an unmasked step).
    pub fn new(rows: &Rows, dev: &Device) -> Result<Self> {
        let (idx, batch) = (rows.indices().to_vec(), rows.batch());
        if !rows.is_masked() || idx.len() == batch {
            return Ok(Self {
                idx,
                batch,
                select: None,
                put: None,
            });
        }
        let b = rows.batch();
        let mut put: Vec<u32> = (0..b as u32).collect();
        for (j, &r) in idx.iter().enumerate() {
            put[r] = (b + j) as u32;
        }
        let select: Vec<u32> = idx.iter().map(|&r| r as u32).collect();
        Ok(Self {
            select: Some(Tensor::from_vec(select, idx.len(), dev)?),
            put: Some(Tensor::from_vec(put, b, dev)?),
            idx,
            batch,
        })
    }

    /// The stepping rows of a whole-batch state.
    pub fn select(&self, all: &Tensor) -> Result<Tensor> {
        Ok(match &self.select {
            None => all.clone(),
            Some(s) => all.index_select(s, 0)?,
        })
    }

    /// The whole-batch state with the stepping rows replaced by `part` (the others copied
    /// exactly).
    pub fn put(&self, all: &Tensor, part: &Tensor) -> Result<Tensor> {
        Ok(match &self.put {
            None => part.clone(),
            Some(p) => Tensor::cat(&[all, part], 0)?.index_select(p, 0)?,
        })
    }
}

/// `(rows, ...)` rows of `x` at `positions` (an index tensor on `x`'s device).
pub(super) fn take(x: &Tensor, positions: &[usize]) -> Result<Tensor> {
    let ids: Vec<u32> = positions.iter().map(|&p| p as u32).collect();
    let n = ids.len();
    Ok(x.index_select(&Tensor::from_vec(ids, n, x.device())?, 0)?)
}

/// `parts` joined along time (the last dimension), skipping empty ones.
pub(super) fn cat_time(parts: &[Tensor]) -> Result<Tensor> {
    let full: Vec<&Tensor> = parts
        .iter()
        .filter(|t| t.dims().last().is_some_and(|&n| n > 0))
        .collect();
    Ok(match full.as_slice() {
        [] => parts[0].clone(),
        [one] => (*one).clone(),
        _ => Tensor::cat(&full, candle::D::Minus1)?,
    })
}
