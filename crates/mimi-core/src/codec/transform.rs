//! The transformer over a stage's activations, in each engine's form: the native engine's
//! rows' frames as tokens through the host step ([`Transformer::step_host`]), the candle
//! engine's tensor through the tensor entry point. Offline and streaming calls both use it.

use super::activations::Activations;
use super::bridge::{from_tokens, tokens};
use crate::conv::Frames;
use crate::error::{Cancel, Result};
use crate::rows::Rows;
use crate::transformer::{State, Transformer, Workspace};
use candle::Tensor;

/// (B, D, T) -> the transformer over time -> (B, D, T), continuing `state`.
pub(crate) fn transform(
    model: &Transformer,
    state: &mut State,
    xs: &Tensor,
    cancel: Cancel,
) -> Result<Tensor> {
    let x = xs.transpose(1, 2)?.contiguous()?;
    let y = model.forward(state, &x, None, cancel)?;
    Ok(y.transpose(1, 2)?.contiguous()?)
}

/// [`transform`] for the rows of a stream that step (`xs` holds those rows).
fn transform_rows(
    model: &Transformer,
    state: &mut State,
    xs: &Tensor,
    (rows, cancel): (&Rows, Cancel),
) -> Result<Tensor> {
    if !rows.is_masked() {
        return transform(model, state, xs, cancel);
    }
    let x = xs.transpose(1, 2)?.contiguous()?;
    let y = model.forward(state, &x, Some(rows), cancel)?;
    Ok(y.transpose(1, 2)?.contiguous()?)
}

/// The transformer over the stepping rows' activations: the native engine's frames as
/// tokens through [`Transformer::step_host`] in the caller's workspace `ws` (the bits of
/// the tensor entry point, which takes the same step on the same values), the candle
/// engine's tensor through [`transform_rows`]. A model without the planned step (gating,
/// another dtype or device) takes the native engine's frames as a tensor.
pub(crate) fn transform_step(
    model: &Transformer,
    (state, ws): (&mut State, &mut Workspace),
    x: Activations,
    (rows, cancel): (&Rows, Cancel),
) -> Result<Activations> {
    let xs = match x {
        Activations::Tensor(t) => {
            let y = transform_rows(model, state, &t, (rows, cancel))?;
            return Ok(Activations::Tensor(y));
        }
        Activations::Frames(xs) if !model.takes_host_step() => {
            let dev = model.device().clone();
            let t = Activations::Frames(xs).into_tensor(&dev)?;
            let y = transform_rows(model, state, &t, (rows, cancel))?;
            return Ok(Activations::Frames(Activations::Tensor(y).into_frames()?));
        }
        Activations::Frames(xs) => xs,
    };
    let d = xs.first().map_or(0, |f| f.channels);
    if xs.first().is_none_or(|f| f.len == 0) {
        return Ok(Activations::Frames(xs));
    }
    model.start(state, rows.batch())?;
    let x = tokens(&xs);
    drop(xs);
    let mut out = Frames::uninit(x.channels, x.len);
    model.step_host(state, ws, &x.data, &rows.indices(), &mut out.data, cancel)?;
    Ok(Activations::Frames(from_tokens(&out.data, rows.count(), d)))
}
