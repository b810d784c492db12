//! The convolutions at `precision="medium"`: products with bf16 inputs and f32 sums in
//! `vdpbf16ps`'s order ([`crate::kernels::bf16dot`]), for a [`Conv1d`] or [`ConvTr1d`] whose
//! weights were pair-packed at load (`pair_pack`).
//!
//! One strategy serves every call, offline and streaming: each row's input is rounded to
//! bf16 once, padding included ([`Rounded`]: half the bytes, and no rounding left in the
//! tiles); then tiles of output frames over the pool each gather their im2col columns as
//! pairs of those values, in the weights' layout, and multiply; then bias and residual are
//! added in f32. A frame's output depends on its own inputs alone, and each output sums its
//! pairs in one fixed order, so streaming equals offline and a batched row equals the row
//! alone, bit for bit, on every CPU.

use std::sync::Arc;

use crate::rows::RowList;

use super::conv1d::Conv1d;
use super::conv_tr1d::ConvTr1d;
use super::frames::{par_rows, Frames, Padded};
use super::spec::Matrix;
use super::tiles::{for_tiles, max_cols, tiles, SharedMut};
use crate::kernels::bf16dot::{to_bf16, PairInput, PairPacked, Path};
use crate::kernels::with_scratch;

thread_local! {
    /// A tile's columns as pairs, kept between calls.
    static PAIRS: std::cell::Cell<Vec<u32>> = const { std::cell::Cell::new(Vec::new()) };
    /// The rows' inputs rounded to bf16 ([`Rounded`]), kept between calls.
    static ROUNDED: std::cell::Cell<Vec<u16>> = const { std::cell::Cell::new(Vec::new()) };
}

/// `dst[i] = to_bf16(src[i])`.
fn round_into(src: &[f32], dst: &mut [u16]) {
    (dst.iter_mut().zip(src)).for_each(|(d, &x)| *d = to_bf16(x));
}

/// Several rows' inputs rounded to bf16 once, padding included, one after the other: row
/// `r`'s channel `c` at `at[r] + c * len[r]` of `data`. The tiles read 2 bytes an input where
/// they read 4, and round nothing: a pair of two rounded values is the pair of the two f32s.
struct Rounded<'a> {
    data: &'a [u16],
    at: RowList<usize>,
    len: RowList<usize>,
}

impl<'a> Rounded<'a> {
    /// The rows (`None`: no input), each `(channels, frames)` and written channel by channel
    /// by `fill(row, channel, dst)`, into `buf` (grown as needed, in parallel when large).
    fn new(
        buf: &'a mut Vec<u16>,
        shapes: &[Option<(usize, usize)>],
        fill: impl Fn(usize, usize, &mut [u16]) + Sync,
    ) -> Self {
        let (mut at, mut len) = (RowList::new(), RowList::new());
        let mut total = 0;
        for &(channels, n) in shapes.iter().map(|s| s.as_ref().unwrap_or(&(0, 0))) {
            at.push(total);
            len.push(n);
            total += channels * n;
        }
        if buf.len() < total {
            buf.resize(total, 0);
        }
        for (r, shape) in shapes.iter().enumerate() {
            if let Some((channels, n)) = *shape {
                let row = &mut buf[at[r]..at[r] + channels * n];
                par_rows(row, n, |c, dst| fill(r, c, dst));
            }
        }
        Self {
            data: &buf[..total],
            at,
            len,
        }
    }

    /// Where channel `c` of row `r`, frame `t`, is in [`Self::data`].
    fn index(&self, r: usize, c: usize, t: usize) -> usize {
        self.at[r] + c * self.len[r] + t
    }

    /// `dst[t]` = the pair of values `t * step` after `even` and after `odd` (`None`: zero).
    fn pairs(&self, even: Option<usize>, odd: Option<usize>, step: usize, dst: &mut [u32]) {
        let n = dst.len();
        let lanes = |o: Option<usize>| o.map(|o| self.data[o..].iter().step_by(step).take(n));
        let word = |e: u16, o: u16| e as u32 | (o as u32) << 16;
        match (even, odd) {
            (Some(e), Some(o)) if step == 1 => {
                let (e, o) = (&self.data[e..e + n], &self.data[o..o + n]);
                (dst.iter_mut().zip(e.iter().zip(o))).for_each(|(d, (&e, &o))| *d = word(e, o))
            }
            _ => match (lanes(even), lanes(odd)) {
                (Some(e), Some(o)) => {
                    (dst.iter_mut().zip(e.zip(o))).for_each(|(d, (&e, &o))| *d = word(e, o))
                }
                (Some(e), None) => (dst.iter_mut().zip(e)).for_each(|(d, &e)| *d = word(e, 0)),
                (None, Some(o)) => (dst.iter_mut().zip(o)).for_each(|(d, &o)| *d = word(0, o)),
                (None, None) => dst.fill(0),
            },
        }
    }
}

/// The product of `w` `(n, kk)` with `frames` frames of columns, tile by tile over the pool:
/// `gather(t0, tn, pairs)` fills a tile's columns as pairs (`kk / 2` rows of `tn`, odd `kk`:
/// a zero last; the pair-major input of [`PairInput::columns`]), `store(t0, tn, y)` takes its
/// products (`tn` rows of `n`). A single tile spreads its product's panels over the pool
/// instead (a streaming step's few frames). The bits do not depend on the tiling.
fn product_tiles(
    w: &PairPacked,
    frames: usize,
    gather: impl Fn(usize, usize, &mut [u32]) + Sync,
    store: impl Fn(usize, usize, &[f32]) + Sync,
) {
    let (n, kk) = w.dims();
    let flops = 2 * n * kk * frames;
    let tiles = tiles(1, frames, max_cols(kk), flops);
    let (path, single) = (Path::best(), tiles.len() == 1);
    for_tiles(&tiles, flops, |scratch, (_, _, t0, tn)| {
        with_scratch(&PAIRS, |xp| {
            let kp = kk.div_ceil(2);
            if xp.len() < kp * tn {
                xp.resize(kp * tn, 0);
            }
            gather(t0, tn, &mut xp[..kp * tn]);
            scratch.resize(n * tn, 0.0);
            let (x, y) = (
                PairInput::columns(&xp[..kp * tn], tn),
                &mut scratch[..n * tn],
            );
            match single {
                true => w.matmul(x, tn, None, y),
                false => w.matmul_on(path, x, tn, None, y),
            }
            store(t0, tn, y);
        })
    });
}

/// [`product_tiles`] on rows' inputs rounded once: row `r` is `shapes[r]` (`None`: no input),
/// filled by `fill` ([`Rounded::new`]), and `gather` reads its pairs from them.
fn rounded_product(
    w: &PairPacked,
    frames: usize,
    (shapes, fill): (
        &[Option<(usize, usize)>],
        impl Fn(usize, usize, &mut [u16]) + Sync,
    ),
    gather: impl Fn(&Rounded, usize, usize, &mut [u32]) + Sync,
    store: impl Fn(usize, usize, &[f32]) + Sync,
) {
    if frames == 0 {
        return;
    }
    with_scratch(&ROUNDED, |buf| {
        let x = Rounded::new(buf, shapes, fill);
        product_tiles(w, frames, |t0, tn, xp| gather(&x, t0, tn, xp), store)
    })
}

/// Several rows' frames side by side on one axis (row `r`'s at `starts[r] ..
/// starts[r] + ns[r]`), so that their products share calls: the weights are read once per
/// tile for every row, as a batched step needs. Each output frame is computed from its own
/// row's inputs, so a row gets the bits it gets alone.
struct Stacked {
    starts: Vec<usize>,
    ns: Vec<usize>,
}

impl Stacked {
    fn new(ns: Vec<usize>) -> Self {
        let starts = (ns.iter())
            .scan(0, |t, &n| {
                *t += n;
                Some(*t - n)
            })
            .collect();
        Self { starts, ns }
    }

    fn frames(&self) -> usize {
        self.ns.iter().sum()
    }

    /// `(row, first frame of the row, frames, offset in the tile)` for each row that frames
    /// `t0 .. t0 + tn` of the axis cover.
    fn parts(
        &self,
        t0: usize,
        tn: usize,
    ) -> impl Iterator<Item = (usize, usize, usize, usize)> + '_ {
        (self.starts.iter().zip(&self.ns).enumerate()).filter_map(move |(r, (&a, &n))| {
            let (lo, hi) = (a.max(t0), (a + n).min(t0 + tn));
            (lo < hi).then(|| (r, lo - a, hi - lo, lo - t0))
        })
    }
}

impl Conv1d {
    /// Holds the weights in bf16 pairs (`precision="medium"`), in the layout the other
    /// strategies use (phase-major for a phase-split layer); the f32 matrix is let go.
    pub(crate) fn pair_pack(&mut self) {
        let w = self.w.f32().into_owned();
        let kk = w.len() / self.cout.max(1);
        self.pairs = Some(Arc::new(PairPacked::pack(&w, self.cout, kk)));
        self.w = Matrix::F32(Vec::new());
    }

    /// Weight column `r`'s input: (channel, first frame read) for output frame 0; `None`
    /// for a phase-major column past the kernel (a zero weight).
    pub(super) fn pair_column(&self, r: usize) -> Option<(usize, usize)> {
        let (k, s) = (self.k, self.stride);
        if self.phases == 0 {
            return Some((r / k, (r % k) * self.dilation));
        }
        let cs = self.cin * s;
        let (m, ci, rr) = (r / cs, (r % cs) / s, r % s);
        (m * s + rr < k).then_some((ci, m * s + rr))
    }

    /// `n` output frames of `x` (padded, activated) plus bias and `residual` (`cout x n`):
    /// [`Self::run_pairs_rows`] of one row.
    pub(super) fn run_pairs(
        &self,
        w: &PairPacked,
        x: &Padded,
        n: usize,
        residual: Option<&[f32]>,
    ) -> Frames {
        let mut outs = self.run_pairs_rows(w, &[Some(x)], &[n], &[residual]);
        outs.pop().expect("one row")
    }

    /// The outputs of several rows' padded, activated inputs (`None`: no output), `ns[r]`
    /// frames each, plus bias and each row's `residual` (`cout x ns[r]`), in shared products
    /// ([`Stacked`]); a row's bits do not depend on the others.
    pub(super) fn run_pairs_rows(
        &self,
        w: &PairPacked,
        xs: &[Option<&Padded>],
        ns: &[usize],
        residuals: &[Option<&[f32]>],
    ) -> RowList<Frames> {
        let (cout, s) = (self.cout, self.stride);
        let ns = (xs.iter().zip(ns)).map(|(x, &n)| if x.is_some() { n } else { 0 });
        let rows = Stacked::new(ns.collect());
        let mut outs: RowList<Frames> = rows.ns.iter().map(|&n| Frames::uninit(cout, n)).collect();
        let ptrs: Vec<SharedMut> = outs
            .iter_mut()
            .map(|o| SharedMut(o.data.as_mut_ptr()))
            .collect();
        let bias = self.b.as_deref();
        let kk = w.dims().1;
        let shapes: RowList<Option<(usize, usize)>> =
            xs.iter().map(|x| x.map(|x| (self.cin, x.len()))).collect();
        let fill = |r: usize, c: usize, dst: &mut [u16]| {
            round_padded(xs[r].expect("a row's shape is its input's"), c, dst)
        };
        let gather = |x: &Rounded, t0: usize, tn: usize, xp: &mut [u32]| {
            for (r, f0, fn_, at) in rows.parts(t0, tn) {
                let src = |col: usize| {
                    let (ci, off) = (col < kk).then(|| self.pair_column(col))??;
                    Some(x.index(r, ci, f0 * s + off))
                };
                for (i, dst) in xp.chunks_exact_mut(tn).enumerate() {
                    x.pairs(src(2 * i), src(2 * i + 1), s, &mut dst[at..at + fn_]);
                }
            }
        };
        let store = |t0: usize, tn: usize, y: &[f32]| {
            for (r, f0, fn_, at) in rows.parts(t0, tn) {
                let (n, residual) = (rows.ns[r], residuals.get(r).copied().flatten());
                for co in 0..cout {
                    let b = bias.map_or(0.0, |b| b[co]);
                    for t in 0..fn_ {
                        let i = co * n + f0 + t;
                        let add = residual.map_or(0.0, |res| res[i]);
                        // SAFETY: frames f0 .. f0 + fn_ of row r's output are this tile's only.
                        unsafe { *ptrs[r].at(i) = y[(at + t) * cout + co] + b + add };
                    }
                }
            }
        };
        rounded_product(w, rows.frames(), (&shapes, fill), gather, store);
        outs
    }
}

/// Channel `c` of `x` with its padding, rounded to bf16 (`dst` is `x.len()` long).
fn round_padded(x: &Padded, c: usize, dst: &mut [u16]) {
    let (l, n) = (x.left, x.x.len);
    let pad = |v: &Option<Vec<f32>>| to_bf16(v.as_ref().map_or(0.0, |v| v[c]));
    dst[..l].fill(pad(&x.lval));
    round_into(x.x.row(c), &mut dst[l..l + n]);
    dst[l + n..].fill(pad(&x.rval));
}

impl ConvTr1d {
    /// Holds the weights in bf16 pairs (`precision="medium"`); a depthwise layer (a few
    /// products per output) stays f32.
    pub(crate) fn pair_pack(&mut self) {
        if self.depthwise {
            return;
        }
        let w = self.w.f32().into_owned();
        let tk = self.taps * self.cin;
        self.pairs = Some(Arc::new(PairPacked::pack(&w, self.stride * self.cout, tk)));
        self.w = Matrix::F32(Vec::new());
    }

    /// `n * stride` output frames of `x` (`taps - 1` earlier frames, then `n`), with the bias:
    /// [`Self::run_pairs_rows`] of one row.
    pub(super) fn run_pairs(&self, w: &PairPacked, x: &Frames, n: usize) -> Frames {
        let mut outs = self.run_pairs_rows(w, &[Some(x)], &[n]);
        outs.pop().expect("one row")
    }

    /// Several rows' prepared inputs (`None`: no new frames; else `taps - 1` earlier frames
    /// then `ns[r]` new ones) in shared products ([`Stacked`]); a row's bits do not depend
    /// on the others.
    pub(super) fn run_pairs_rows(
        &self,
        w: &PairPacked,
        fulls: &[Option<&Frames>],
        ns: &[usize],
    ) -> RowList<Frames> {
        let (cin, cout, s, taps) = (self.cin, self.cout, self.stride, self.taps);
        let ns = (fulls.iter().zip(ns))
            .map(|(f, &n)| if f.is_some() { n } else { 0 })
            .collect();
        let rows = Stacked::new(ns);
        let mut outs: RowList<Frames> = rows
            .ns
            .iter()
            .map(|&n| Frames::uninit(cout, n * s))
            .collect();
        let ptrs: Vec<SharedMut> = outs
            .iter_mut()
            .map(|o| SharedMut(o.data.as_mut_ptr()))
            .collect();
        let bias = self.b.as_deref();
        let kk = w.dims().1;
        let shapes: RowList<Option<(usize, usize)>> =
            fulls.iter().map(|f| f.map(|f| (cin, f.len))).collect();
        let fill = |r: usize, c: usize, dst: &mut [u16]| {
            round_into(fulls[r].expect("a row's shape is its input's").row(c), dst)
        };
        let gather = |x: &Rounded, t0: usize, tn: usize, xp: &mut [u32]| {
            for (r, f0, fn_, at) in rows.parts(t0, tn) {
                let src = |col: usize| {
                    let (m, ci) = (col / cin, col % cin);
                    (col < kk).then(|| x.index(r, ci, taps - 1 + f0 - m))
                };
                for (i, dst) in xp.chunks_exact_mut(tn).enumerate() {
                    x.pairs(src(2 * i), src(2 * i + 1), 1, &mut dst[at..at + fn_]);
                }
            }
        };
        let store = |t0: usize, tn: usize, y: &[f32]| {
            for (r, f0, fn_, at) in rows.parts(t0, tn) {
                let out_len = rows.ns[r] * s;
                for co in 0..cout {
                    let b = bias.map_or(0.0, |b| b[co]);
                    for t in 0..fn_ {
                        for j in 0..s {
                            let i = co * out_len + (f0 + t) * s + j;
                            // SAFETY: row r's frames (f0 .. f0 + fn_) * s are this tile's only.
                            unsafe { *ptrs[r].at(i) = y[(at + t) * s * cout + co * s + j] + b };
                        }
                    }
                }
            }
        };
        rounded_product(w, rows.frames(), (&shapes, fill), gather, store);
        outs
    }
}
