//! The activations the convolutions pass along ([`Frames`], `(channels, frames)` row-major,
//! buffers from the [`buffers`](super::buffers)), a row-parallel helper, and a causal
//! convolution's padded view of its input ([`Padded`], padding never copied).

use super::activation::copy_act;
use super::buffers;
use crate::rows::RowList;

/// `(channels, frames)` activations of one batch item, row-major.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Frames {
    /// Rows.
    pub channels: usize,
    /// Frames per row.
    pub len: usize,
    /// `channels * len` values, row `c` at `c * len`.
    pub data: Vec<f32>,
}

impl Drop for Frames {
    fn drop(&mut self) {
        buffers::give(std::mem::take(&mut self.data));
    }
}

impl Frames {
    /// `data` as `channels` rows of `len` frames.
    pub fn new(channels: usize, len: usize, data: Vec<f32>) -> Self {
        debug_assert_eq!(data.len(), channels * len);
        Self {
            channels,
            len,
            data,
        }
    }

    /// A buffer of the given shape with unspecified contents (every element is written by
    /// the caller).
    pub(crate) fn uninit(channels: usize, len: usize) -> Self {
        Self::new(channels, len, buffers::take(channels * len))
    }

    /// The values, row-major (the buffer leaves the pool).
    pub fn into_data(mut self) -> Vec<f32> {
        let mut v = std::mem::take(&mut self.data);
        v.shrink_to_fit();
        v
    }

    pub(crate) fn empty(channels: usize) -> Self {
        Self::new(channels, 0, Vec::new())
    }

    /// Row `c`.
    pub(super) fn row(&self, c: usize) -> &[f32] {
        &self.data[c * self.len..(c + 1) * self.len]
    }

    /// `[self | other]` along time, with `act` applied to `other`.
    pub(super) fn concat_act(&self, other: &Frames, act: Option<f32>) -> Frames {
        let len = self.len + other.len;
        let mut out = Frames::uninit(self.channels, len);
        if len > 0 {
            par_rows(&mut out.data, len, |c, row| {
                row[..self.len].copy_from_slice(self.row(c));
                copy_act(other.row(c), &mut row[self.len..], act);
            });
        }
        out
    }

    /// Frames `t0..t1`, copied.
    pub fn window(&self, t0: usize, t1: usize) -> Frames {
        let n = t1 - t0;
        let mut out = Frames::uninit(self.channels, n);
        for c in 0..self.channels {
            out.data[c * n..(c + 1) * n].copy_from_slice(&self.row(c)[t0..t1]);
        }
        out
    }

    /// `parts` (of `channels` channels each) one after the other along time.
    pub fn cat(channels: usize, parts: &[Frames]) -> Frames {
        if let [one] = parts {
            return one.window(0, one.len);
        }
        let len = parts.iter().map(|p| p.len).sum();
        let mut out = Frames::uninit(channels, len);
        for c in 0..channels {
            let mut t = c * len;
            for p in parts {
                out.data[t..t + p.len].copy_from_slice(p.row(c));
                t += p.len;
            }
        }
        out
    }

    /// The last `n` frames.
    pub(crate) fn tail(&self, n: usize) -> Frames {
        self.window(self.len - n.min(self.len), self.len)
    }
}

/// Several batch rows' frames side by side along time in one buffer: row `r` from frame
/// `starts[r]`, zeros between. A batched streaming step runs its rows through a layer as one
/// product over this (see `Conv1d::step_rows`).
pub(super) struct Joined {
    pub(super) frames: Frames,
    pub(super) starts: RowList<usize>,
}

impl Joined {
    /// `parts` one after the other, each starting at a multiple of `align` (a strided
    /// convolution's rows then start at whole output frames).
    pub(super) fn new(parts: &[&Frames], channels: usize, align: usize) -> Self {
        let mut starts = RowList::with_capacity(parts.len());
        let mut len = 0;
        for p in parts {
            starts.push(len);
            len += p.len.next_multiple_of(align.max(1));
        }
        let frames = place(parts, channels, &starts, len);
        Self { frames, starts }
    }
}

/// `(channels, len)` zeros with `parts[r]` written from frame `starts[r]`.
pub(super) fn place(parts: &[&Frames], channels: usize, starts: &[usize], len: usize) -> Frames {
    let mut out = Frames::uninit(channels, len);
    par_rows(&mut out.data, len, |c, row| {
        let mut end = 0;
        for (p, &t0) in parts.iter().zip(starts) {
            row[end..t0].fill(0.0);
            row[t0..t0 + p.len].copy_from_slice(p.row(c));
            end = t0 + p.len;
        }
        row[end..].fill(0.0);
    });
    out
}

/// The values of one task of [`par_rows`].
const ROWS_TASK: usize = 1 << 13;

/// `f(row index, row)` over the rows of `data`, in parallel when large: tasks of about
/// [`ROWS_TASK`] values (a few µs of copying, against ~1 µs to hand a task over).
pub(super) fn par_rows<T: Send>(data: &mut [T], len: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    if data.len() >= 2 * ROWS_TASK && rayon::current_num_threads() > 1 {
        let per = ROWS_TASK / len.max(1) + 1; // rows per task
        crate::kernels::for_each_chunk_mut(data, per * len.max(1), |i, rows| {
            (rows.chunks_mut(len).enumerate()).for_each(|(j, row)| f(i * per + j, row))
        });
    } else {
        data.chunks_mut(len)
            .enumerate()
            .for_each(|(c, row)| f(c, row));
    }
}

/// A causal convolution's input as the convolution sees it: `left` padding frames, the
/// frames of `x`, `right` padding frames; padding is zeros, or per-channel values.
pub(super) struct Padded<'a> {
    pub(super) x: &'a Frames,
    pub(super) left: usize,
    pub(super) right: usize,
    pub(super) lval: Option<Vec<f32>>,
    pub(super) rval: Option<Vec<f32>>,
}

impl<'a> Padded<'a> {
    /// `x` without padding.
    pub(super) fn plain(x: &'a Frames) -> Self {
        Self {
            x,
            left: 0,
            right: 0,
            lval: None,
            rval: None,
        }
    }

    /// Frames, padding included.
    pub(super) fn len(&self) -> usize {
        self.left + self.x.len + self.right
    }

    /// `dst[i] = input[c, start + i * step]`.
    pub(super) fn gather(&self, c: usize, start: usize, step: usize, dst: &mut [f32]) {
        let row = self.x.row(c);
        let lv = self.lval.as_ref().map_or(0.0, |v| v[c]);
        let rv = self.rval.as_ref().map_or(0.0, |v| v[c]);
        let (l, n) = (self.left, self.x.len);
        if step == 1 && start >= l && start + dst.len() <= l + n {
            dst.copy_from_slice(&row[start - l..start - l + dst.len()]);
            return;
        }
        // Split the outputs into those reading the left padding, the frames, the right
        // padding, so that the main loop has no branches.
        let m = dst.len();
        let first = if start >= l {
            0
        } else {
            (l - start).div_ceil(step)
        }
        .min(m);
        let end = if start >= l + n {
            0
        } else {
            (l + n - start).div_ceil(step)
        }
        .clamp(first, m);
        dst[..first].fill(lv);
        if end > first {
            let p0 = start + first * step - l;
            for (d, v) in dst[first..end]
                .iter_mut()
                .zip(row[p0..].iter().step_by(step))
            {
                *d = *v;
            }
        }
        dst[end..].fill(rv);
    }
}
