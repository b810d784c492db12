//! A codec stream: the convolutions' states (by engine), the transformer's state, and each
//! row's count since its own start or reset. The codec's streaming calls take one.

use super::engine::{Convolutions, DecodeConvs, EncodeConvs};
use crate::error::{Error, Result};
use crate::transformer::State;

/// A streaming state. Made by [`super::Codec::encode_stream`] / [`super::Codec::decode_stream`].
pub struct Stream<C> {
    pub(crate) convs: C,
    pub(crate) tr: State,
    batch: Option<usize>,
    /// Each row's count: audio samples (encoder) or code frames (decoder).
    pub(crate) counts: Vec<u64>,
}

/// Streaming encoder state (counts: samples).
pub type EncodeStream = Stream<Box<dyn EncodeConvs>>;
/// Streaming decoder state (counts: code frames).
pub type DecodeStream = Stream<Box<dyn DecodeConvs>>;

impl<C: Convolutions> Stream<C> {
    pub(crate) fn new(convs: C) -> Self {
        Self {
            convs,
            tr: State::default(),
            batch: None,
            counts: Vec::new(),
        }
    }

    /// The batch size, once the stream has started.
    pub fn batch(&self) -> Option<usize> {
        self.batch
    }

    /// Each row's samples (encoder) or frames (decoder) since its own start or reset.
    pub fn counts(&self) -> &[u64] {
        &self.counts
    }

    /// Refuses an input of `b` rows for a stream that holds another batch size.
    pub fn check_batch(&self, b: usize, which: &str) -> Result<()> {
        match self.batch {
            Some(sb) if sb != b => Err(Error::Shape(format!(
                "this {which} stream holds state for batch size {sb}, got batch size {b}; \
                 call reset_state() before streaming another batch size"
            ))),
            _ => Ok(()),
        }
    }

    /// Starts the stream at batch size `b` (no-op once started).
    pub fn start(&mut self, b: usize) {
        if self.batch.is_none() {
            self.batch = Some(b);
            self.counts = vec![0; b];
        }
    }

    /// Adds `n` to the count of each row in `rows`.
    pub(crate) fn advance(&mut self, rows: &[usize], n: usize) {
        for &r in rows {
            self.counts[r] += n as u64;
        }
    }

    /// Whether the rows hold different partial frames of `frame` samples (after a reset).
    pub(crate) fn uneven(&self, frame: usize) -> bool {
        let mut partial = self.counts.iter().map(|&x| x % frame as u64);
        partial.next().is_some_and(|p0| partial.any(|p| p != p0))
    }

    /// Returns `rows` to a fresh stream; the other rows continue untouched.
    pub fn reset_rows(&mut self, rows: &[usize]) -> Result<()> {
        let n = self.counts.len();
        for &r in rows.iter().filter(|&&r| r < n) {
            self.convs.reset_row(r);
            self.counts[r] = 0;
        }
        self.tr.reset_rows(rows);
        Ok(())
    }

    /// An independent copy (new buffers, same contents).
    pub fn deep_copy(&self) -> Result<Self> {
        Ok(Self {
            convs: self.convs.copy(),
            tr: self.tr.deep_copy()?,
            batch: self.batch,
            counts: self.counts.clone(),
        })
    }
}
