//! A codec stream: the convolutions' states (by engine), the transformer's state and the
//! workspace its steps compute in, and each row's count since its own start or reset. The
//! codec's streaming calls take one.

use super::engine::{Convolutions, DecodeConvs, EncodeConvs};
use crate::error::{Error, Result};
use crate::rows::RowSelection;
use crate::transformer::{State, Workspace};

/// A streaming state. Made by [`super::Codec::encode_stream`] / [`super::Codec::decode_stream`].
pub struct Stream<C> {
    pub(crate) convs: C,
    pub(crate) tr: State,
    /// The transformer step's working memory (not part of the stream's contents: a copy
    /// starts with an empty one).
    pub(crate) ws: Workspace,
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
            ws: Workspace::new(),
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
            ws: Workspace::new(),
            batch: self.batch,
            counts: self.counts.clone(),
        })
    }
}

/// A codec's two streams, as a binding holds them (each under its own lock; `None`: not
/// started). The rules for both at once live here, each once: reset, copy and positions.
pub struct StreamPair<'a> {
    pub enc: &'a mut Option<EncodeStream>,
    pub dec: &'a mut Option<DecodeStream>,
}

impl StreamPair<'_> {
    /// Returns `rows` of both streams to fresh ones (whole streams: set both to `None`). The
    /// selection is checked against each started stream before either changes.
    pub fn reset_rows(&mut self, rows: &RowSelection) -> Result<()> {
        let enc_rows = rows.resolve(self.enc.as_ref().and_then(Stream::batch))?;
        let dec_rows = rows.resolve(self.dec.as_ref().and_then(Stream::batch))?;
        if let Some(s) = self.enc.as_mut() {
            s.reset_rows(&enc_rows)?;
        }
        if let Some(s) = self.dec.as_mut() {
            s.reset_rows(&dec_rows)?;
        }
        Ok(())
    }

    /// Replaces both streams with `copies` (another codec's, deep-copied), refusing a batch
    /// other than a started stream's before anything changes.
    pub fn replace(&mut self, copies: (Option<EncodeStream>, Option<DecodeStream>)) -> Result<()> {
        let (enc, dec) = copies;
        check_copied_batch(
            enc.as_ref().and_then(Stream::batch),
            self.enc.as_ref().and_then(Stream::batch),
        )?;
        check_copied_batch(
            dec.as_ref().and_then(Stream::batch),
            self.dec.as_ref().and_then(Stream::batch),
        )?;
        (*self.enc, *self.dec) = (enc, dec);
        Ok(())
    }
}

/// Deep copies of a codec's two streams (see [`StreamPair::replace`]).
pub fn copy_pair(
    enc: Option<&EncodeStream>,
    dec: Option<&DecodeStream>,
) -> Result<(Option<EncodeStream>, Option<DecodeStream>)> {
    Ok((
        enc.map(Stream::deep_copy).transpose()?,
        dec.map(Stream::deep_copy).transpose()?,
    ))
}

impl EncodeStream {
    /// Each row's code frames emitted since its own start or reset (`frame_size` samples a
    /// frame; empty before the first call).
    pub fn frame_positions(&self, frame_size: usize) -> Vec<u64> {
        self.counts.iter().map(|&n| n / frame_size as u64).collect()
    }
}

/// Refuses to copy a stream of `theirs` rows into a started stream of `ours` rows.
pub fn check_copied_batch(theirs: Option<usize>, ours: Option<usize>) -> Result<()> {
    match (theirs, ours) {
        (Some(t), Some(o)) if t != o => Err(Error::IncompatibleState(format!(
            "cannot copy the streaming state: the source streams a batch of {t} rows and this \
             codec a batch of {o}; reset_state() first"
        ))),
        _ => Ok(()),
    }
}
