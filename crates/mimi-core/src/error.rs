//! The one error type of the core, and cooperative cancellation.
//!
//! Conditions are checked *before* candle sees the data, so the classification never depends
//! on candle's message strings. Anything candle still reports ends up as [`Error::Candle`].
//! Each variant has one [`ErrorKind`], and each kind names the one exception class a binding
//! raises: the table is declared here, once.

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

/// The kinds of failure: one per exception class a binding raises (the Python package's
/// `mimi_py.errors`, whose classes carry these names). The table is declared here, once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    Config,
    UnsupportedKvRepeat,
    DepthMismatch,
    IncompatibleState,
    Shape,
    DType,
    InvalidInput,
    Resource,
    Weights,
    Device,
    Compute,
    Internal,
}

impl ErrorKind {
    /// Every kind.
    pub const ALL: [ErrorKind; 12] = [
        ErrorKind::Config,
        ErrorKind::UnsupportedKvRepeat,
        ErrorKind::DepthMismatch,
        ErrorKind::IncompatibleState,
        ErrorKind::Shape,
        ErrorKind::DType,
        ErrorKind::InvalidInput,
        ErrorKind::Resource,
        ErrorKind::Weights,
        ErrorKind::Device,
        ErrorKind::Compute,
        ErrorKind::Internal,
    ];

    /// The name of the class a binding raises for this kind.
    pub fn class_name(self) -> &'static str {
        match self {
            ErrorKind::Config => "ConfigError",
            ErrorKind::UnsupportedKvRepeat => "UnsupportedKvRepeatError",
            ErrorKind::DepthMismatch => "DepthMismatchError",
            ErrorKind::IncompatibleState => "IncompatibleStateError",
            ErrorKind::Shape => "ShapeError",
            ErrorKind::DType => "DTypeError",
            ErrorKind::InvalidInput => "InvalidInputError",
            ErrorKind::Resource => "ResourceError",
            ErrorKind::Weights => "WeightsError",
            ErrorKind::Device => "DeviceError",
            ErrorKind::Compute => "ComputeError",
            ErrorKind::Internal => "InternalError",
        }
    }
}

impl Error {
    /// This error's kind (the class a binding raises).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Config { .. } => ErrorKind::Config,
            Error::UnsupportedKvRepeat { .. } => ErrorKind::UnsupportedKvRepeat,
            Error::DepthMismatch { .. } => ErrorKind::DepthMismatch,
            Error::IncompatibleState(_) => ErrorKind::IncompatibleState,
            Error::Shape(_) => ErrorKind::Shape,
            Error::DType(_) => ErrorKind::DType,
            Error::InvalidInput(_) => ErrorKind::InvalidInput,
            Error::Resource(_) => ErrorKind::Resource,
            Error::Weights(_) | Error::WeightsIo { .. } => ErrorKind::Weights,
            Error::Device(_) => ErrorKind::Device,
            Error::Candle(_) => ErrorKind::Compute,
            Error::Internal(_) => ErrorKind::Internal,
            // Never seen in Python: an interrupted call raises the signal handler's exception.
            Error::Cancelled => ErrorKind::Internal,
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

/// `m`'s guard, also when a panic poisoned it: for the core's locks whose critical sections
/// leave their data consistent at every point (counts, lists, a stock of buffers), so a
/// panic elsewhere while one was held breaks nothing.
pub(crate) fn locked<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Returns [`Error::Cancelled`] if `cancel` was set (the caller was interrupted).
pub fn check_cancel(cancel: Cancel) -> Result<()> {
    if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
        return Err(Error::Cancelled);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every variant has a kind in [`ErrorKind::ALL`], and every kind of the table is used.
    #[test]
    fn the_kind_table_covers_every_error() {
        let io = || std::io::Error::other("x");
        let every = [
            Error::config("f", "m"),
            Error::UnsupportedKvRepeat { kv_repeat: 2 },
            Error::DepthMismatch { dst: 1, src: 2 },
            Error::IncompatibleState("x".into()),
            Error::Shape("x".into()),
            Error::DType("x".into()),
            Error::InvalidInput("x".into()),
            Error::Resource("x".into()),
            Error::Weights("x".into()),
            Error::WeightsIo {
                msg: "x".into(),
                source: io(),
            },
            Error::Device("x".into()),
            Error::Candle(candle::Error::Msg("x".into())),
            Error::Internal("x".into()),
            Error::Cancelled,
        ];
        for e in &every {
            assert!(ErrorKind::ALL.contains(&e.kind()), "{e:?}");
        }
        for k in ErrorKind::ALL {
            assert!(every.iter().any(|e| e.kind() == k), "{k:?} is never raised");
        }
        let mut names: Vec<&str> = ErrorKind::ALL.iter().map(|k| k.class_name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ErrorKind::ALL.len(), "one class per kind");
    }
}
