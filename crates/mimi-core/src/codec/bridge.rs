//! The bridge between candle tensors and the native engine's [`Frames`]: a `(B, C, T)`
//! tensor as one `Frames` per batch item and back (the offline calls, and a streaming step's
//! tensor ends), the rows' frames as tokens and back (the transformer's and the quantizer's
//! host entry points), and the stepping rows' states selected together.

use crate::conv::Frames;
use crate::error::Result;
use crate::host::HostArray;
use crate::rows::RowList;
use crate::runtime::device::cast;
use candle::{DType, Device, Tensor};

/// The batch items of a (B, C, T) f32 tensor as frames.
pub(crate) fn to_frames(x: &Tensor) -> Result<RowList<Frames>> {
    let (b, c, t) = x.dims3()?;
    let data = cast(x, DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    if b == 1 {
        return Ok(std::iter::once(Frames::new(c, t, data)).collect());
    }
    Ok((0..b)
        .map(|i| Frames::new(c, t, data[i * c * t..(i + 1) * c * t].to_vec()))
        .collect())
}

/// Stacks frames of equal shape into a (B, C, T) tensor; `None` when they are empty.
pub(crate) fn from_frames(xs: RowList<Frames>, dev: &Device) -> Result<Option<Tensor>> {
    crate::runtime::profile::tensor_made();
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

/// The items of `rows` (ascending and distinct, as [`crate::rows::Rows`] holds them),
/// mutably and in that order.
pub(crate) fn select_mut<'a, I>(items: &'a mut [I], rows: &[usize]) -> Result<RowList<&'a mut I>> {
    let mut want = rows.iter().peekable();
    let n = items.len();
    let mut out = RowList::with_capacity(rows.len());
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

/// The rows' frames `(channels, frames)` as tokens: `(rows, frames, channels)` values, row
/// after row, each frame's channels together (what the transformer's and the quantizer's
/// host entry points take), in a buffer of the stock: a [`Frames`] of one "channel" per
/// token (`data` is the values).
pub(crate) fn tokens(xs: &[Frames]) -> Frames {
    let (c, t) = xs.first().map_or((0, 0), |f| (f.channels, f.len));
    let mut out = Frames::uninit(xs.len() * t, c);
    for (f, o) in (xs.iter()).zip(out.data.chunks_exact_mut((t * c).max(1))) {
        for (ch, row) in f.data.chunks_exact(t.max(1)).enumerate() {
            for (j, &v) in row.iter().enumerate() {
                o[j * c + ch] = v;
            }
        }
    }
    out
}

/// [`tokens`] back: `rows` rows of `frames` tokens of `channels` values as one [`Frames`]
/// `(channels, frames)` each.
pub(crate) fn from_tokens(data: &[f32], rows: usize, channels: usize) -> RowList<Frames> {
    let t = data.len() / (rows * channels).max(1);
    (0..rows)
        .map(|i| {
            let x = &data[i * t * channels..(i + 1) * t * channels];
            let mut out = Frames::uninit(channels, t);
            for (j, tok) in x.chunks_exact(channels).enumerate() {
                for (ch, &v) in tok.iter().enumerate() {
                    out.data[ch * t + j] = v;
                }
            }
            out
        })
        .collect()
}

/// A tensor's values on the host, as f32 or u32.
pub(crate) fn host_f32(t: &Tensor) -> Result<HostArray<f32>> {
    let data = cast(t, DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    Ok(HostArray::new(data, t.dims().to_vec()))
}

pub(crate) fn host_u32(t: &Tensor) -> Result<HostArray<u32>> {
    Ok(HostArray::new(
        t.flatten_all()?.to_vec1::<u32>()?,
        t.dims().to_vec(),
    ))
}
