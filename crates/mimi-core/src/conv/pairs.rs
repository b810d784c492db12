//! The convolutions at `precision="medium"`: products with bf16 inputs and f32 sums in
//! `vdpbf16ps`'s order ([`crate::kernels::bf16dot`]), for a [`Conv1d`] or [`ConvTr1d`] whose
//! weights were pair-packed at load (`pair_pack`).
//!
//! One strategy serves every call, offline and streaming: tiles of output frames over the
//! pool, each gathering its im2col columns in the weights' layout, rounding them to bf16
//! pairs, and multiplying; then bias and residual are added in f32. A frame's output depends
//! on its own inputs alone, and each output sums its pairs in one fixed order, so streaming
//! equals offline and a batched row equals the row alone, bit for bit, on every CPU.

use std::sync::Arc;

use crate::rows::RowList;

use super::conv1d::Conv1d;
use super::conv_tr1d::ConvTr1d;
use super::frames::{Frames, Padded};
use super::spec::Matrix;
use super::tiles::{for_tiles, max_cols, tiles, SharedMut};
use crate::kernels::bf16dot::{pair, PairInput, PairPacked, Path};
use crate::kernels::with_scratch;

thread_local! {
    /// A tile's columns as pairs, kept between calls.
    static PAIRS: std::cell::Cell<Vec<u32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// `cols` (`kk` rows of `tn` frames) as `kk / 2` rows of `tn` pairs (odd `kk`: a zero
/// last): the pair-major input of the product ([`PairInput::columns`]), each row one
/// vectorizable pass.
fn pair_columns(cols: &[f32], kk: usize, tn: usize, out: &mut Vec<u32>) {
    let kp = kk.div_ceil(2);
    out.clear();
    out.resize(tn * kp, 0);
    for (i, dst) in out.chunks_exact_mut(tn.max(1)).enumerate().take(kp) {
        let even = &cols[2 * i * tn..][..tn];
        match cols.get((2 * i + 1) * tn..(2 * i + 2) * tn) {
            Some(odd) => {
                (dst.iter_mut().zip(even.iter().zip(odd))).for_each(|(d, (&e, &o))| *d = pair(e, o))
            }
            None => (dst.iter_mut().zip(even)).for_each(|(d, &e)| *d = pair(e, 0.0)),
        }
    }
}

/// The product of `w` `(n, kk)` with `frames` frames of columns, tile by tile over the pool:
/// `gather(t0, tn, cols)` fills a tile's columns (`kk` rows of `tn`), `store(t0, tn, y)`
/// takes its products (`tn` rows of `n`). A single tile spreads its product's panels over the
/// pool instead (a streaming step's few frames). The bits do not depend on the tiling.
fn product_tiles(
    w: &PairPacked,
    frames: usize,
    gather: impl Fn(usize, usize, &mut [f32]) + Sync,
    store: impl Fn(usize, usize, &[f32]) + Sync,
) {
    let (n, kk) = w.dims();
    let flops = 2 * n * kk * frames;
    let tiles = tiles(1, frames, max_cols(kk), flops);
    let (path, single) = (Path::best(), tiles.len() == 1);
    for_tiles(&tiles, flops, |scratch, (_, _, t0, tn)| {
        with_scratch(&PAIRS, |xp| {
            scratch.resize((kk * tn).max(n * tn), 0.0);
            gather(t0, tn, &mut scratch[..kk * tn]);
            pair_columns(&scratch[..kk * tn], kk, tn, xp);
            let (x, y) = (PairInput::columns(xp, tn), &mut scratch[..n * tn]);
            match single {
                true => w.matmul(x, tn, None, y),
                false => w.matmul_on(path, x, tn, None, y),
            }
            store(t0, tn, y);
        })
    });
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
    fn pair_column(&self, r: usize) -> Option<(usize, usize)> {
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
        let gather = |t0: usize, tn: usize, cols: &mut [f32]| {
            for (r, f0, fn_, at) in rows.parts(t0, tn) {
                let x = xs[r].expect("a row with frames has an input");
                for (c, dst) in cols.chunks_exact_mut(tn).enumerate() {
                    let dst = &mut dst[at..at + fn_];
                    match self.pair_column(c) {
                        Some((ci, off)) => x.gather(ci, f0 * s + off, s, dst),
                        None => dst.fill(0.0),
                    }
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
        if rows.frames() > 0 {
            product_tiles(w, rows.frames(), gather, store);
        }
        outs
    }
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
        let gather = |t0: usize, tn: usize, cols: &mut [f32]| {
            for (r, f0, fn_, at) in rows.parts(t0, tn) {
                let x = fulls[r].expect("a row with frames has an input");
                for (c, dst) in cols.chunks_exact_mut(tn).enumerate() {
                    let (m, ci) = (c / cin, c % cin);
                    let src = &x.data[ci * x.len + taps - 1 + f0 - m..][..fn_];
                    dst[at..at + fn_].copy_from_slice(src);
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
        if rows.frames() > 0 {
            product_tiles(w, rows.frames(), gather, store);
        }
        outs
    }
}
