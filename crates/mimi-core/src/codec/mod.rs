//! The Mimi codec (audio <-> tokens): [`Codec`], its doors and its calls on host arrays.
//!
//! Owned here: the two transformers (this crate's [`Transformer`](crate::transformer::Transformer),
//! exact window, unbounded streams), the quantizer ([`crate::quantizer::Quantizer`]), the
//! wiring, the checkpoint readers for both real layouts ([`checkpoint`]), the streams
//! ([`stream`]) and their rows ([`Rows`]). The convolutional parts (SEANet encoder/decoder,
//! down/upsampling) run on one of two engines behind one interface ([`engine`]): the
//! [`native`] CPU engine, or the [`candle_engine`] (its own layers on candle's tensor
//! operations) on GPUs and in half precision. Both keep one streaming state per batch row.
//!
//! Offline calls use fresh, private state and never touch the streaming state; streaming
//! calls go through [`EncodeStream`] / [`DecodeStream`]. This file only declares: each
//! module below imports from its siblings, never from here, and no two import each other.

pub mod activations;
mod bridge;
pub mod candle_engine;
pub mod checkpoint;
pub mod engine;
pub mod host_calls;
pub mod inputs;
pub mod lengths;
pub mod model;
pub mod native;
mod offline;
pub mod open;
mod quantize;
pub mod step;
pub mod stream;
#[cfg(test)]
mod tensors;
#[cfg(test)]
mod tests;
mod transform;

pub use crate::rows::Rows;
pub use checkpoint::{Checkpoint, CheckpointDir, CheckpointLayout};
pub use engine::EngineKind;
pub use host_calls::EncodeStep;
pub use inputs::Input;
pub use model::{Codec, CodecInfo};
pub use open::OpenOptions;
pub use stream::{DecodeStream, EncodeStream};
