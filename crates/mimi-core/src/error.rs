//! The one error type of the core, and cooperative cancellation.
//!
//! Conditions are checked *before* candle sees the data, so the classification never depends
//! on candle's message strings. Anything candle still reports ends up as [`Error::Candle`].
//! The binding (`crate::py::errors`) maps each variant to one Python exception class.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};

/// Every failure mimi_py can report.
#[derive(Debug)]
pub enum Error {
    /// An invalid configuration value; `field` names the offending keyword.
    Config { field: String, msg: String },
    /// `kv_repeat != 1`: Mimi's streaming attention only supports `kv_repeat = 1`.
    UnsupportedKvRepeat { kv_repeat: usize },
    /// `copy_state` between transformers of different depths.
    DepthMismatch { dst: usize, src: usize },
    /// `copy_state` between streams whose states have other incompatible shapes.
    IncompatibleState(String),
    /// An input of the wrong shape.
    Shape(String),
    /// An input of a dtype that cannot be converted.
    DType(String),
    /// An input with values outside what is accepted (codes out of range, non-finite audio).
    InvalidInput(String),
    /// Not enough memory for what was asked (checked up front where possible).
    Resource(String),
    /// A missing, mis-shaped or mistyped tensor, or an unreadable checkpoint.
    Weights(String),
    /// A checkpoint that could not be read from disk (a `WeightsError` chained from an
    /// `OSError` in Python).
    WeightsIo { msg: String, source: std::io::Error },
    /// A device that is unknown, not compiled in, or fails to initialise.
    Device(String),
    /// Any other failure reported by candle.
    Candle(candle::Error),
    /// A bug: a Rust panic caught at the boundary, or a poisoned lock.
    Internal(String),
    /// The caller set the call's cancellation flag (Ctrl-C in Python).
    Cancelled,
}

/// The core's result type.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// A [`Error::Config`] naming `field`.
    pub fn config(field: &str, msg: impl Into<String>) -> Self {
        Error::Config {
            field: field.to_string(),
            msg: msg.into(),
        }
    }

    /// The same error with its config field put under `prefix` (`transformer.d_model`).
    pub fn nested(self, prefix: &str) -> Self {
        match self {
            Error::Config { field, msg } => Error::Config {
                field: format!("{prefix}.{field}"),
                msg,
            },
            e => e,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config { field, msg } => write!(f, "invalid config field `{field}`: {msg}"),
            Error::UnsupportedKvRepeat { kv_repeat } => write!(
                f,
                "kv_repeat={kv_repeat} is not supported: Mimi's streaming attention only \
                 supports kv_repeat=1 (one key/value head per query head); set kv_repeat=1"
            ),
            Error::DepthMismatch { dst, src } => write!(
                f,
                "cannot copy the streaming state of a transformer with {src} layers into one \
                 with {dst} layers; build both transformers from the same config"
            ),
            Error::IncompatibleState(msg)
            | Error::Shape(msg)
            | Error::DType(msg)
            | Error::InvalidInput(msg)
            | Error::Resource(msg)
            | Error::Weights(msg)
            | Error::Device(msg) => write!(f, "{msg}"),
            Error::WeightsIo { msg, source } => write!(f, "{msg}: {source}"),
            Error::Candle(e) => write!(f, "candle error: {e}"),
            Error::Internal(msg) => write!(f, "internal error (please report it): {msg}"),
            Error::Cancelled => write!(f, "the call was cancelled"),
        }
    }
}

impl std::error::Error for Error {}

impl From<candle::Error> for Error {
    fn from(e: candle::Error) -> Self {
        Error::Candle(e)
    }
}

/// A cancellation flag for long offline calls: `None` when the call cannot be cancelled.
pub type Cancel<'a> = Option<&'a AtomicBool>;

/// Returns [`Error::Cancelled`] if `cancel` was set (the caller was interrupted).
pub fn check_cancel(cancel: Cancel) -> Result<()> {
    if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
        return Err(Error::Cancelled);
    }
    Ok(())
}
