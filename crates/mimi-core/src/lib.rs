//! # mimi-core
//!
//! Kyutai's Mimi codec (24 kHz audio ⇄ 12.5 Hz tokens) and its streaming transformer in Rust,
//! on Hugging Face candle. This crate is the whole computation; the Python package `mimi_py`
//! is a thin binding over it (its `src/` crate), and nothing here depends on Python.
//!
//! What it adds to candle's `mimi`: an exact sliding-window attention whose streaming state
//! is owned per stream and per row (copies are independent, resets are complete, results do
//! not depend on how the input is chunked), a native CPU engine for the convolutions, both
//! real checkpoint layouts, typed errors ([`Error`]) and up-front checks.
//!
//! ```
//! use mimi_core::{Codec, CodecConfig, EncodeStep, HostArray, OpenOptions};
//!
//! # fn main() -> mimi_core::Result<()> {
//! // A small seeded codec (no download); `Codec::open(path, &OpenOptions::default())`
//! // opens a checkpoint file or folder (either layout).
//! let options = OpenOptions { config: Some(CodecConfig::tiny()), ..Default::default() };
//! let codec = Codec::seeded(0, &options)?;
//!
//! // Offline: (batch, channels, samples) -> codes (batch, codebooks, frames).
//! let samples: Vec<f32> = (0..4 * 1920).map(|i| (i as f32 * 0.01).sin()).collect();
//! let pcm = HostArray::new(samples.clone(), vec![1, 1, 4 * 1920]);
//! let codes = codec.encode_host(pcm, None, None)?;
//! assert_eq!(codes.shape, [1, 4, 4]);
//!
//! // Streaming: any chunking gives the offline codes of every whole frame.
//! let mut stream = codec.encode_stream();
//! let mut streamed = 0;
//! for chunk in [&samples[..3000], &samples[3000..]] {
//!     let pcm = HostArray::new(chunk.to_vec(), vec![1, 1, chunk.len()]);
//!     let out = codec.encode_step_host(&mut stream, pcm, EncodeStep::default())?;
//!     streamed += out.map_or(0, |c| c.shape[2]);
//! }
//! assert_eq!(streamed, 4);
//! # Ok(())
//! # }
//! ```
//!
//! Modules, each importing only those above it: [`error`] → [`config`], [`runtime`] →
//! [`gpu`] → [`kernels`] → [`weights`] → [`conv`] → [`seanet`], [`quantizer`], [`transformer`] →
//! [`codec`]. ARCHITECTURE.md in the repository is the map.

pub mod codec;
pub mod config;
pub mod conv;
pub mod error;
pub mod gpu;
pub mod host;
pub mod kernels;
pub mod quantizer;
pub mod rows;
pub mod runtime;
pub mod seanet;
pub mod transformer;
pub mod weights;

#[cfg(test)]
pub(crate) mod testutil;

/// The candle this crate computes with (re-exported, so a user's tensors are the same type).
pub use candle;
pub use codec::{Codec, DecodeStream, EncodeStep, EncodeStream, OpenOptions};
pub use config::{CodecConfig, TransformerConfig};
pub use error::{Error, Result};
pub use host::HostArray;
pub use weights::TensorSource;

/// The version of candle this crate is built on (checked against Cargo.lock by a test).
pub const CANDLE_VERSION: &str = "0.11.1";

#[cfg(test)]
mod tests {
    #[test]
    fn candle_version_is_the_locked_one() {
        let lock = include_str!("../../../Cargo.lock");
        let pos = lock
            .find("name = \"candle-core\"")
            .expect("candle-core in Cargo.lock");
        let version = lock[pos..].lines().nth(1).expect("a version line");
        assert_eq!(version, format!("version = \"{}\"", super::CANDLE_VERSION));
    }
}
