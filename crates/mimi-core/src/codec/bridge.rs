//! The bridge between candle tensors and the native engine's [`Frames`]: a `(B, C, T)`
//! tensor as one `Frames` per batch item and back, one per-row stage over them, and the
//! stepping rows' states selected together.

use crate::conv::Frames;
use crate::error::Result;
use candle::{DType, Device, Tensor};

/// The batch items of a (B, C, T) f32 tensor as frames.
pub(crate) fn to_frames(x: &Tensor) -> Result<Vec<Frames>> {
    let (b, c, t) = x.dims3()?;
    let data = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    if b == 1 {
        return Ok(vec![Frames::new(c, t, data)]);
    }
    Ok((0..b)
        .map(|i| Frames::new(c, t, data[i * c * t..(i + 1) * c * t].to_vec()))
        .collect())
}

/// Stacks frames of equal shape into a (B, C, T) tensor; `None` when they are empty.
pub(crate) fn from_frames(xs: Vec<Frames>, dev: &Device) -> Result<Option<Tensor>> {
    let (b, c, t) = (xs.len(), xs[0].channels, xs[0].len);
    if t == 0 {
        return Ok(None);
    }
    let data: Vec<f32> = if b == 1 {
        xs.into_iter()
            .next()
            .map(Frames::into_data)
            .unwrap_or_default()
    } else {
        xs.iter().flat_map(|f| f.data.iter().copied()).collect()
    };
    Ok(Some(Tensor::from_vec(data, (b, c, t), dev)?))
}

/// One per-item stage of the native engine (a SEANet, a down/upsampling) on each row of
/// `x`: row `i` continues the state `items[rows[i]]`. `None` when no frame comes out.
pub(crate) fn per_row<I>(
    items: &mut [I],
    rows: &[usize],
    x: &Tensor,
    mut stage: impl FnMut(&mut I, &Frames) -> Result<Frames>,
) -> Result<Option<Tensor>> {
    let mut ys = Vec::with_capacity(rows.len());
    for (f, &r) in to_frames(x)?.iter().zip(rows) {
        ys.push(stage(&mut items[r], f)?);
    }
    from_frames(ys, x.device())
}

/// The items of `rows` (ascending and distinct, as [`crate::rows::Rows`] holds them),
/// mutably and in that order.
pub(crate) fn select_mut<'a, I>(items: &'a mut [I], rows: &[usize]) -> Result<Vec<&'a mut I>> {
    let mut want = rows.iter().peekable();
    let n = items.len();
    let mut out = Vec::with_capacity(rows.len());
    for (i, it) in items.iter_mut().enumerate() {
        if want.peek() == Some(&&i) {
            out.push(it);
            want.next();
        }
    }
    if out.len() != rows.len() {
        return Err(crate::error::Error::Internal(format!(
            "rows {rows:?} are not ascending indices below {n}"
        )));
    }
    Ok(out)
}
