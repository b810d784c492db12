//! The causal convolution ([`Conv1d`], candle's `StreamableConv1d`): weights, padding and
//! streaming state, and four ways to compute it, picked per call by [`Conv1d::run`]:
//!
//! * phase-split (`run_phased`): a strided convolution with enough channels, its input
//!   split once into its `stride` phases, a few accumulated products, no im2col;
//! * direct (`run_direct`): a stride-1 layer with few channels, AVX-512 microkernel;
//! * matrix-vector (`run_gemv`): a streaming step of a few frames;
//! * tiled im2col (`run_tiled`): the rest, tiles over the pool calling `gemm`.
//!
//! [`Conv1d::run_fused`] computes a SEANet residual block (a convolution, the ELU, a
//! pointwise convolution, the residual) tile by tile, the hidden activations in cache.

use crate::rows::RowList;
use candle::Result;
use candle_nn::VarBuilder;

use super::activation::{copy_act, elu_in_place};
use super::frames::{par_rows, place, Frames, Joined, Padded};
use super::spec::{conv_weight, to_vec, ConvSpec, ConvState, Matrix};
use super::tiles::{
    epilogue, for_tiles, gemm_acc, grouped, matmul, max_cols, rows_alone_in_group, tiles,
    SharedMut, Tiles,
};
use crate::config::PadMode;
use crate::kernels::direct;

/// The smallest product depth per tap (`cin * stride`) for which a strided convolution is
/// computed on its phase-split input.
const MIN_PHASE_K: usize = 32;

/// `w (cout, cin, k)` reordered to columns `(m, ci, r)` for tap `j = m * stride + r`, zero
/// where `j >= k`: per tap `m`, a `(cout, cin * stride)` block of each row.
fn phase_major(w: &[f32], spec: &ConvSpec) -> Vec<f32> {
    let (cout, cin, k, stride) = (spec.cout, spec.cin, spec.k, spec.stride);
    let taps = k.div_ceil(stride);
    let kk = taps * cin * stride;
    let mut out = vec![0f32; cout * kk];
    for co in 0..cout {
        for m in 0..taps {
            for ci in 0..cin {
                for r in 0..stride {
                    let j = m * stride + r;
                    if j < k {
                        out[co * kk + (m * cin + ci) * stride + r] = w[(co * cin + ci) * k + j];
                    }
                }
            }
        }
    }
    out
}

/// A causal 1-d convolution (`StreamableConv1d`).
#[derive(Clone, Debug)]
pub struct Conv1d {
    /// `(cout, cin * k)` row-major, columns `(ci, j)`; for a phase-split convolution
    /// (`phases > 0`), columns `(m, ci, r)` for tap `j = m * stride + r` (zero past `k`).
    pub(super) w: Matrix,
    /// The weights in bf16 pairs, same layout (`precision="medium"`, `pairs.rs`); `w` is
    /// then empty.
    pub(super) pairs: Option<std::sync::Arc<crate::kernels::bf16dot::PairPacked>>,
    /// Taps per phase of a strided convolution computed on its phase-split input (see
    /// [`Conv1d::run_phased`]); 0 for the plain layout.
    pub(super) phases: usize,
    pub(super) b: Option<Vec<f32>>,
    pub(crate) cin: usize,
    pub(crate) cout: usize,
    pub(crate) k: usize,
    pub(crate) stride: usize,
    pub(super) dilation: usize,
    replicate: bool,
}

impl Conv1d {
    /// Bytes of its weights and bias, as stored.
    pub fn weights_nbytes(&self) -> usize {
        let pairs = self.pairs.as_ref().map_or(0, |p| p.nbytes());
        self.w.nbytes() + pairs + 4 * self.b.as_ref().map_or(0, Vec::len)
    }
}

impl Conv1d {
    /// Reads the weights of `spec` from `vb` (`conv.weight` or its weight-norm pair).
    pub fn load(vb: VarBuilder, spec: ConvSpec) -> Result<Self> {
        let ConvSpec {
            cin,
            cout,
            k,
            stride,
            dilation,
            bias,
            pad,
        } = spec;
        if k < stride {
            candle::bail!("kernel-size {k} is smaller than stride {stride}")
        }
        let vb = vb.pp("conv");
        let w = to_vec(&conv_weight(&vb, (cout, cin, k))?)?;
        let b = if bias {
            Some(to_vec(&vb.get(cout, "bias")?)?)
        } else {
            None
        };
        let phases = if stride > 1 && dilation == 1 && cin * stride >= MIN_PHASE_K {
            k.div_ceil(stride)
        } else {
            0
        };
        let w = if phases > 0 {
            phase_major(&w, &spec)
        } else {
            w
        };
        Ok(Self {
            w: Matrix::F32(w),
            pairs: None,
            phases,
            b,
            cin,
            cout,
            k,
            stride,
            dilation,
            replicate: pad == PadMode::Replicate,
        })
    }

    /// Stores a large layer's weights in bf16 (see [`super::spec::BF16_MIN_WEIGHTS`]).
    pub(crate) fn store_bf16(&mut self) {
        self.w.store_bf16()
    }

    /// Test hook: bf16 weights whatever the layer's size.
    #[cfg(test)]
    pub(crate) fn force_bf16(&mut self) {
        self.w.store_bf16_from(0)
    }

    /// Packs a large layer's weights for the packed product (see [`Matrix::pack`]).
    pub(crate) fn pack(&mut self) {
        let kk = self.w.len() / self.cout.max(1);
        self.w.pack(kk)
    }

    /// Test hook: packed weights whatever the layer's size.
    #[cfg(test)]
    pub(crate) fn force_pack(&mut self) {
        let kk = self.w.len() / self.cout.max(1);
        self.w.pack_from(0, kk)
    }

    fn keff(&self) -> usize {
        (self.k - 1) * self.dilation + 1
    }

    /// The first input frame that output frame `out` reads (negative: the left padding).
    pub(crate) fn first_input(&self, out: i64) -> i64 {
        let (s, keff) = (self.stride as i64, self.keff() as i64);
        out * s + s - keff
    }

    fn pad_total(&self) -> usize {
        self.keff() - self.stride
    }

    pub(super) fn frames(&self, len: usize) -> usize {
        if len < self.keff() {
            0
        } else {
            (len - self.keff()) / self.stride + 1
        }
    }

    /// Per-channel values of frame `i` of `x` after `act` (replicate padding).
    fn frame_values(&self, x: &Frames, i: usize, act: Option<f32>) -> Vec<f32> {
        let col: Vec<f32> = (0..x.channels).map(|c| x.row(c)[i]).collect();
        let mut out = vec![0f32; col.len()];
        copy_act(&col, &mut out, act);
        out
    }

    /// candle's `get_extra_padding_for_conv1d`: the right padding that completes the last
    /// stride of an input of `len` frames.
    fn extra_padding(&self, len: usize) -> usize {
        let (pt, keff) = (self.pad_total(), self.keff());
        let n_frames = (len + pt).saturating_sub(keff) as f64 / self.stride as f64 + 1.0;
        let ideal = ((n_frames.ceil() as usize - 1) * self.stride + keff).saturating_sub(pt);
        ideal.saturating_sub(len)
    }

    /// Offline: candle's `StreamableConv1d::forward` (causal padding, extra right padding,
    /// both in the layer's pad mode), without copying the padding.
    pub fn forward(&self, x: &Frames, act: Option<f32>, residual: Option<&Frames>) -> Frames {
        let a;
        let x = if act.is_some() {
            a = Frames::empty(x.channels).concat_act(x, act);
            &a
        } else {
            x
        };
        let len = x.len;
        let (lval, rval) = if self.replicate && len > 0 {
            (
                Some(self.frame_values(x, 0, None)),
                Some(self.frame_values(x, len - 1, None)),
            )
        } else {
            (None, None)
        };
        let input = Padded {
            x,
            left: self.pad_total(),
            right: self.extra_padding(len),
            lval,
            rval,
        };
        self.run(&input, residual)
    }

    /// Streaming: the output frames this chunk completes. With `last`, the input ends here:
    /// the right padding of the offline path is added, so that the chunks' outputs together
    /// are exactly the offline output.
    pub fn step(
        &self,
        st: &mut ConvState,
        x: &Frames,
        act: Option<f32>,
        residual: Option<&Frames>,
        last: bool,
    ) -> Frames {
        match self.prepare(st, x, act, last) {
            None => Frames::empty(self.cout),
            Some(full) => self.run(&Padded::plain(&full), residual),
        }
    }

    /// The streaming input of this chunk: the state's frames then the activated chunk (and
    /// the right padding with `last`). Keeps what the next chunk needs in the state.
    pub(crate) fn prepare(
        &self,
        st: &mut ConvState,
        x: &Frames,
        act: Option<f32>,
        last: bool,
    ) -> Option<Frames> {
        if x.len == 0 && !(last && st.prev.is_some()) {
            return None;
        }
        let prev = st.prev.take().unwrap_or_else(|| {
            let n = self.pad_total();
            let mut data = vec![0f32; self.cin * n];
            if self.replicate {
                let v = self.frame_values(x, 0, act);
                for c in 0..self.cin {
                    data[c * n..(c + 1) * n].fill(v[c]);
                }
            }
            Frames::new(self.cin, n, data)
        });
        st.seen += x.len;
        let mut full = prev.concat_act(x, act);
        if last {
            let extra = self.extra_padding(st.seen);
            if extra > 0 {
                let mut pad = vec![0f32; self.cin * extra];
                if self.replicate && full.len > 0 {
                    let v = self.frame_values(&full, full.len - 1, None);
                    for c in 0..self.cin {
                        pad[c * extra..(c + 1) * extra].fill(v[c]);
                    }
                }
                full = full.concat_act(&Frames::new(self.cin, extra, pad), None);
            }
        }
        let n = self.frames(full.len);
        st.prev = Some(full.tail(full.len - n * self.stride));
        Some(full)
    }

    /// `second(elu(self(x))) + residual` for a stride-1 `self` and a pointwise `second`
    /// (a SEANet residual block), tile by tile: the hidden activations of a tile never leave
    /// the cache. The same arithmetic as the two convolutions one after the other.
    pub(crate) fn run_fused(
        &self,
        x: &Frames,
        second: &Conv1d,
        alpha: f32,
        residual: &Frames,
    ) -> Frames {
        if self.pairs.is_some() || second.pairs.is_some() {
            // `pairs.rs`: one convolution after the other, the same bits as unfused.
            let h = self.run(&Padded::plain(x), None);
            return second.forward(&h, Some(alpha), Some(residual));
        }
        let n = self.frames(x.len);
        let (kk, hidden, cout) = (self.cin * self.k, self.cout, second.cout);
        assert_eq!(
            (residual.channels, residual.len),
            (cout, n),
            "residual shape"
        );
        assert!(self.stride == 1 && second.k == 1 && second.cin == hidden);
        let mut out = Frames::uninit(cout, n);
        let fused = Fused {
            first: self,
            second,
            x,
            alpha,
            residual,
            out: SharedMut(out.data.as_mut_ptr()),
            n,
        };
        let flops = 2 * n * (hidden * kk + cout * hidden);
        let tiles = tiles(1, n, max_cols(kk + hidden), flops);
        // The direct kernel where the CPU has AVX-512 and it measured faster (see
        // direct::MAX_DIRECT_K): Mimi's residual blocks up to 256 channels.
        let direct = kk <= direct::MAX_DIRECT_K && direct::available();
        if tiles.len() < 2 && flops > 1 << 21 && rayon::current_num_threads() > 1 && !grouped() {
            fused.run_split(direct);
        } else if direct {
            fused.run_direct(&tiles, flops);
        } else {
            for_tiles(&tiles, flops, |scratch, (_, _, t0, tn)| {
                fused.gemm_tile(scratch, t0, tn)
            });
        }
        out
    }

    /// A strided convolution without im2col. The input is split once into its `stride`
    /// phases, row `(ci, r)` holding frames `u * stride + r`; tap `j = m * stride + r` of
    /// output frame `t` reads frame `t + m` of phase row `(ci, r)`. So for each of the
    /// `phases` taps `m`, the products of all `(ci, r)` are one matrix product with the phase
    /// rows shifted by `m`, a strided view `gemm` packs itself: `phases` products of depth
    /// `cin * stride`, accumulated, instead of an im2col copy `k` times the input (Mimi's
    /// down-sampling: `k = 2 * stride`, two products).
    fn run_phased(&self, x: &Padded, n: usize, residual: Option<&Frames>) -> Frames {
        let (cin, cout, s, taps) = (self.cin, self.cout, self.stride, self.phases);
        let (cs, kk, len) = (cin * s, self.w.len() / cout, n + taps - 1);
        let w = self.w.f32();
        let mut ph = Frames::uninit(cs, len);
        par_rows(&mut ph.data, len, |row, dst| {
            x.gather(row / s, row % s, s, dst)
        });
        let mut out = Frames::uninit(cout, n);
        let ptr = SharedMut(out.data.as_mut_ptr());
        let flops = 2 * cout * kk * n;
        let residual = residual.map(|r| r.data.as_slice());
        let tiles = tiles(cout, n, max_cols(kk), flops);
        for_tiles(&tiles, flops, |_, (r0, rn, t0, tn)| {
            for m in 0..taps {
                // SAFETY: the tile is inside `out` (cout x n) and disjoint from other tiles;
                // the weight block m of rows r0.. has rn rows of cs (row stride kk); the phase
                // rows are read at frames t0 + m .. t0 + m + tn <= len.
                unsafe {
                    gemm_acc(
                        (rn, tn, cs),
                        ptr.at(r0 * n + t0),
                        n,
                        m > 0,
                        w.as_ptr().add(r0 * kk + m * cs),
                        kk,
                        ph.data.as_ptr().add(t0 + m),
                        len,
                    );
                }
            }
            // SAFETY: as above.
            unsafe { epilogue(ptr, n, (r0, rn, t0, tn), self.b.as_deref(), residual) };
        });
        out
    }

    /// The direct kernel's operands for output channels `r0 .. r0 + rn`, with the weights
    /// `w` as f32 (`self.w.f32()`).
    fn direct_rows<'a>(&'a self, w: &'a [f32], (r0, rn): (usize, usize)) -> direct::Direct<'a> {
        let kk = self.cin * self.k;
        direct::Direct {
            w: &w[r0 * kk..(r0 + rn) * kk],
            cout: rn,
            cin: self.cin,
            k: self.k,
            dilation: self.dilation,
            bias: self.b.as_deref().map(|b| &b[r0..r0 + rn]),
        }
    }

    /// A stride-1 convolution of (padded, activated) frames with the direct kernel, tiles of
    /// frames over the pool: SEANet's outer layers. The decoder's last (64 -> 1, k 7 at
    /// 24 kHz, one output row) took 4.8 ms per second of audio through gemm, 1.9-2.8 ms now
    /// (most of it the activation of its 64-channel input); 1 thread (`mimi_kernel_bench`).
    fn run_direct(&self, x: &Frames, n: usize, residual: Option<&Frames>) -> Frames {
        let w = self.w.f32();
        let p = self.direct_rows(&w, (0, self.cout));
        let mut out = Frames::uninit(self.cout, n);
        let ptr = SharedMut(out.data.as_mut_ptr());
        let res = residual.map(|r| r.data.as_ptr() as usize);
        let flops = 2 * self.cout * self.cin * self.k * n;
        let tiles = tiles(1, n, max_cols(self.cin * self.k), flops);
        for_tiles(&tiles, flops, |_, (_, _, t0, tn)| {
            // SAFETY: AVX-512 is available; x has cin rows of x.len frames, readable up to
            // t0 + tn + (k - 1) * dilation <= x.len; the tile's columns t0 .. t0 + tn of `out`
            // (and of the residual, cout x n) are this tile's only.
            unsafe {
                let add = res.map(|r| ((r as *const f32).add(t0), n));
                direct::conv(&p, x.data.as_ptr(), x.len, t0, tn, ptr.at(t0), n, add);
            }
        });
        out
    }

    /// The convolution of padded, activated frames, plus `residual`: picks the phase-split,
    /// direct, matrix-vector or tiled im2col strategy.
    fn run(&self, x: &Padded, residual: Option<&Frames>) -> Frames {
        let n = self.frames(x.len());
        if let Some(w) = &self.pairs {
            if let Some(r) = residual {
                assert_eq!((r.channels, r.len), (self.cout, n), "residual shape");
            }
            return self.run_pairs(w, x, n, residual.map(|r| r.data.as_slice()));
        }
        let step = self.w.gemv_frames();
        if self.phases > 0 && n > step {
            return self.run_phased(x, n, residual);
        }
        if self.stride == 1
            && x.left == 0
            && x.right == 0
            && n > step
            && self.cin * self.k <= direct::MAX_DIRECT_K
            && direct::available()
        {
            return self.run_direct(x.x, n, residual);
        }
        let cout = self.cout;
        if let Some(r) = residual {
            assert_eq!((r.channels, r.len), (cout, n), "residual shape");
        }
        let residual = residual.map(|r| r.data.as_slice());
        if n == 0 {
            return Frames::empty(cout);
        }
        if n <= step {
            self.run_gemv(x, n, residual)
        } else {
            self.run_tiled(x, n, residual)
        }
    }

    /// A streaming step (a few output frames, at least one): bound by reading
    /// the weights once; the matrix-vector kernel, then bias and `residual` (`cout x n`).
    fn run_gemv(&self, x: &Padded, n: usize, residual: Option<&[f32]>) -> Frames {
        let kk = self.w.len() / self.cout.max(1);
        let cols = self.gemv_cols(x, n, kk);
        self.gemv_out(&self.w.gemv(&cols.data, n, kk, self.cout).data, n, residual)
    }

    /// [`Self::step`] of several rows, each continuing its own state (`sts[r]`, `xs[r]`), in
    /// shared products: see [`Self::run_rows`]. Row `r` gets the bits `step` gives it alone.
    pub(crate) fn step_rows(
        &self,
        sts: &mut [&mut ConvState],
        xs: &[Frames],
        act: Option<f32>,
        last: bool,
    ) -> RowList<Frames> {
        let fulls: RowList<Option<Frames>> = (sts.iter_mut().zip(xs))
            .map(|(st, x)| self.prepare(st, x, act, last))
            .collect();
        self.run_rows(&fulls)
    }

    /// The outputs of several rows' prepared inputs (`None`: no output). When every row
    /// takes the same strategy, the rows share its products: the matrix-vector kernel's
    /// calls (a few frames each: the weights are read once per call, not once per row), or
    /// one run over the rows side by side ([`Joined`]; many frames: fewer, larger tiles).
    /// A strategy computes each output frame from its own inputs alone (the kernel's rows do
    /// not depend on their neighbours, nor a tile's columns: [`super::tiles::DEPTH_BLOCK`]),
    /// so row `r` gets the bits its own run gives.
    fn run_rows(&self, fulls: &[Option<Frames>]) -> RowList<Frames> {
        let ns: RowList<usize> = (fulls.iter())
            .map(|f| f.as_ref().map_or(0, |f| self.frames(f.len)))
            .collect();
        let live: RowList<&Frames> = (fulls.iter().zip(&ns))
            .filter_map(|(f, &n)| f.as_ref().filter(|_| n > 0))
            .collect();
        let step = self.w.gemv_frames();
        let run = |f: &Option<Frames>| match f {
            None => Frames::empty(self.cout),
            Some(full) => self.run(&Padded::plain(full), None),
        };
        if let (Some(w), true) = (&self.pairs, live.len() > 1) {
            let xs: RowList<Option<Padded>> = fulls
                .iter()
                .map(|f| f.as_ref().map(Padded::plain))
                .collect();
            let xs: RowList<Option<&Padded>> = xs.iter().map(Option::as_ref).collect();
            return self.run_pairs_rows(w, &xs, &ns, &[]);
        }
        if live.len() < 2 {
            return fulls.iter().map(run).collect();
        }
        if ns.iter().all(|&n| n <= step) {
            return self.gemv_rows(fulls, &ns);
        }
        // Rows that take different strategies run alone, and so do the layers with a single
        // input or output channel (the SEANet's outer layers, next to the audio): little
        // arithmetic per frame, so joining their rows costs more in copies than it saves.
        // So do a group's rows, unless the weights are too large to stay in cache.
        let alone = rows_alone_in_group(self.w.nbytes());
        if ns.iter().any(|&n| n > 0 && n <= step) || self.cin.min(self.cout) == 1 || alone {
            return fulls.iter().map(run).collect();
        }
        let s = self.stride;
        let joined = Joined::new(&live, self.cin, s);
        let y = self.run(&Padded::plain(&joined.frames), None);
        let mut starts = joined.starts.iter();
        (ns.iter())
            .map(|&n| match n {
                0 => Frames::empty(self.cout),
                _ => {
                    let t0 = starts.next().map_or(0, |&o| o / s);
                    y.window(t0, t0 + n)
                }
            })
            .collect()
    }

    /// [`Self::run_rows`] on the matrix-vector kernel (every row `ns[r] <= gemv_frames`).
    fn gemv_rows(&self, fulls: &[Option<Frames>], ns: &[usize]) -> RowList<Frames> {
        let kk = self.w.len() / self.cout.max(1);
        let cols: RowList<Frames> = (fulls.iter().zip(ns))
            .map(|(f, &n)| match f {
                Some(full) if n > 0 => self.gemv_cols(&Padded::plain(full), n, kk),
                _ => Frames::empty(kk),
            })
            .collect();
        (self.w).gemv_rows(&cols, ns, (kk, self.cout), |y, n| match n {
            0 => Frames::empty(self.cout),
            _ => self.gemv_out(y, n, None),
        })
    }

    /// [`Self::run_fused`] of several rows' prepared inputs and residuals, side by side in
    /// one run ([`Joined`]): row `r` gets the bits its own run gives (see [`Self::run_rows`]).
    pub(crate) fn run_fused_rows(
        &self,
        fulls: &[Frames],
        second: &Conv1d,
        alpha: f32,
        residuals: &[&Frames],
    ) -> RowList<Frames> {
        let parts: RowList<&Frames> = fulls.iter().collect();
        let joined = Joined::new(&parts, self.cin, 1);
        let n = self.frames(joined.frames.len);
        let residual = place(residuals, second.cout, &joined.starts, n);
        let y = self.run_fused(&joined.frames, second, alpha, &residual);
        (joined.starts.iter().zip(residuals))
            .map(|(&t0, r)| y.window(t0, t0 + r.len))
            .collect()
    }

    /// `y (n, cout)` of the matrix-vector kernel as frames, plus bias and `residual`.
    fn gemv_out(&self, y: &[f32], n: usize, residual: Option<&[f32]>) -> Frames {
        let cout = self.cout;
        let bias = self.b.as_deref();
        let mut out = Frames::uninit(cout, n);
        for co in 0..cout {
            let b = bias.map_or(0.0, |b| b[co]);
            for t in 0..n {
                let r = residual.map_or(0.0, |r| r[co * n + t]);
                out.data[co * n + t] = y[t * cout + co] + b + r;
            }
        }
        out
    }

    /// The `(n, kk)` im2col rows of a streaming step, columns in the weights' layout (a
    /// buffer of the stock: `n` rows of `kk`).
    fn gemv_cols(&self, x: &Padded, n: usize, kk: usize) -> Frames {
        let (cin, k, s, d) = (self.cin, self.k, self.stride, self.dilation);
        let mut frames = Frames::uninit(n, kk);
        let (cols, mut g) = (&mut frames.data, Frames::uninit(1, n));
        let g = &mut g.data;
        if self.phases > 0 {
            // Columns (m, ci, r), as the phase-major weights; zero for the taps past `k`.
            cols.fill(0.0);
            let (taps, cs) = (self.phases, cin * s);
            for m in 0..taps {
                for ci in 0..cin {
                    for r in (0..s).filter(|r| m * s + r < k) {
                        x.gather(ci, m * s + r, s, g);
                        for (t, v) in g.iter().enumerate() {
                            cols[t * kk + m * cs + ci * s + r] = *v;
                        }
                    }
                }
            }
        } else if x.left == 0 && x.right == 0 && d == 1 {
            // A streaming step: each (frame, channel) window is contiguous.
            for t in 0..n {
                for ci in 0..cin {
                    cols[t * kk + ci * k..t * kk + (ci + 1) * k]
                        .copy_from_slice(&x.x.row(ci)[t * s..t * s + k]);
                }
            }
        } else {
            for ci in 0..cin {
                for j in 0..k {
                    x.gather(ci, j * d, s, g);
                    for (t, v) in g.iter().enumerate() {
                        cols[t * kk + ci * k + j] = *v;
                    }
                }
            }
        }
        frames
    }

    /// Tiles of (output channels x frames) over the pool, each building its own im2col
    /// block and calling `gemm`, then adding bias and `residual` (`cout x n`).
    fn run_tiled(&self, x: &Padded, n: usize, residual: Option<&[f32]>) -> Frames {
        let (cin, cout, k, s, d) = (self.cin, self.cout, self.k, self.stride, self.dilation);
        let kk = self.w.len() / cout.max(1);
        let w = self.w.f32();
        let bias = self.b.as_deref();
        let mut out = Frames::uninit(cout, n);
        let ptr = SharedMut(out.data.as_mut_ptr());
        let flops = 2 * cout * kk * n;
        let tiles = tiles(cout, n, max_cols(kk), flops);
        for_tiles(&tiles, flops, |scratch, tile| {
            let (r0, rn, t0, tn) = tile;
            if scratch.len() < kk * tn {
                scratch.resize(kk * tn, 0.0);
            }
            let cols = &mut scratch[..kk * tn];
            for ci in 0..cin {
                for j in 0..k {
                    let row = ci * k + j;
                    x.gather(ci, t0 * s + j * d, s, &mut cols[row * tn..(row + 1) * tn]);
                }
            }
            // SAFETY: the tile is inside `out` (cout x n) and disjoint from other tiles; the
            // weights have cout rows of kk, the columns block kk rows of tn.
            unsafe {
                matmul(
                    rn,
                    tn,
                    kk,
                    ptr.0.add(r0 * n + t0),
                    n,
                    w.as_ptr().add(r0 * kk),
                    kk,
                    cols.as_ptr(),
                );
                epilogue(ptr, n, tile, bias, residual);
            }
        });
        out
    }
}

/// The operands of [`Conv1d::run_fused`] that every tile reads, and the output it writes.
struct Fused<'a> {
    /// The stride-1 convolution (`cin -> hidden`), before the ELU.
    first: &'a Conv1d,
    /// The pointwise convolution (`hidden -> cout`).
    second: &'a Conv1d,
    x: &'a Frames,
    alpha: f32,
    /// `(cout, n)`, added to the output.
    residual: &'a Frames,
    /// `(cout, n)`; each tile writes its own columns.
    out: SharedMut,
    n: usize,
}

impl Fused<'_> {
    /// Every tile with the direct kernel (AVX-512): the first convolution into the tile's
    /// hidden block, its ELU, the second convolution plus the residual into `out`.
    fn run_direct(&self, tiles: &Tiles, flops: usize) {
        let (a, b) = (self.first, self.second);
        let (x, n, hidden) = (self.x, self.n, a.cout);
        let (wa, wb) = (a.w.f32(), b.w.f32());
        let (first, second) = (
            a.direct_rows(&wa, (0, hidden)),
            b.direct_rows(&wb, (0, b.cout)),
        );
        let res = self.residual.data.as_ptr() as usize;
        for_tiles(tiles, flops, |scratch, (_, _, t0, tn)| {
            scratch.resize(hidden * tn, 0.0);
            let h = &mut scratch[..hidden * tn];
            // SAFETY: AVX-512 is available; x has cin rows of x.len frames, readable up to
            // t0 + tn + (k - 1) * d = at most x.len; h is hidden x tn; the tile's columns
            // t0 .. t0 + tn of `out` (and of the residual, cout x n) are this tile's only.
            unsafe {
                direct::conv(
                    &first,
                    x.data.as_ptr(),
                    x.len,
                    t0,
                    tn,
                    h.as_mut_ptr(),
                    tn,
                    None,
                );
                h.chunks_mut(tn)
                    .for_each(|row| elu_in_place(row, self.alpha));
                let add = (res as *const f32).add(t0);
                direct::conv(
                    &second,
                    h.as_ptr(),
                    tn,
                    0,
                    tn,
                    self.out.at(t0),
                    n,
                    Some((add, n)),
                );
            }
        });
    }

    /// The block in two passes over the pool, for frames too few to cut into tiles for
    /// the threads (a B = 1 step's low-rate blocks: 96 and 16 frames, which ran on one
    /// thread): the first convolution, bias and ELU into the hidden frames with its output
    /// channels in row blocks, then the second plus the residual likewise. Each output is
    /// the sum a tile of all the frames gives (same kernel, same order over the inputs; the
    /// rows of a product do not depend on each other), so the bits do not change.
    fn run_split(&self, direct: bool) {
        let (a, b) = (self.first, self.second);
        let (n, hidden, kk) = (self.n, a.cout, a.cin * a.k);
        let (wa, wb) = (a.w.f32(), b.w.f32());
        let mut h = Frames::uninit(hidden, n);
        let hp = SharedMut(h.data.as_mut_ptr());
        // The im2col columns of every frame, once (the `gemm` path only).
        let mut cols = Frames::uninit(if direct { 0 } else { kk }, n);
        if !direct {
            self.columns(0, n, &mut cols.data);
        }
        let flops = 2 * n * hidden * kk;
        let first = tiles(hidden, n, n, flops);
        for_tiles(&first, flops, |_, (r0, rn, _, _)| {
            let part = a.direct_rows(&wa, (r0, rn));
            // SAFETY: rows r0 .. r0 + rn of h (hidden x n) are this block's alone; x has
            // cin rows readable up to n + (k - 1) * d; the weights have rn rows of kk.
            let rows = unsafe {
                if direct {
                    direct::conv(
                        &part,
                        self.x.data.as_ptr(),
                        self.x.len,
                        0,
                        n,
                        hp.at(r0 * n),
                        n,
                        None,
                    );
                } else {
                    matmul(
                        rn,
                        n,
                        kk,
                        hp.at(r0 * n),
                        n,
                        part.w.as_ptr(),
                        kk,
                        cols.data.as_ptr(),
                    );
                }
                std::slice::from_raw_parts_mut(hp.at(r0 * n), rn * n)
            };
            for (r, row) in rows.chunks_mut(n).enumerate() {
                if !direct {
                    let bias = part.bias.map_or(0.0, |b| b[r]);
                    row.iter_mut().for_each(|v| *v += bias);
                }
                elu_in_place(row, self.alpha);
            }
        });
        self.run_split_second(&h, &wb, direct);
    }

    /// The second pass of [`Self::run_split`]: `second(h) + residual` in row blocks.
    fn run_split_second(&self, h: &Frames, wb: &[f32], direct: bool) {
        let b = self.second;
        let (n, hidden, cout) = (self.n, h.channels, b.cout);
        let flops = 2 * n * cout * hidden;
        let res = self.residual.data.as_ptr() as usize;
        for_tiles(&tiles(cout, n, n, flops), flops, |_, (r0, rn, _, _)| {
            let part = b.direct_rows(wb, (r0, rn));
            // SAFETY: rows r0 .. r0 + rn of `out` (and of the residual), cout x n, are this
            // block's alone; h is hidden x n; the weights have rn rows of hidden.
            unsafe {
                if direct {
                    let add = (res as *const f32).add(r0 * n);
                    direct::conv(
                        &part,
                        h.data.as_ptr(),
                        n,
                        0,
                        n,
                        self.out.at(r0 * n),
                        n,
                        Some((add, n)),
                    );
                } else {
                    let out = self.out.at(r0 * n);
                    matmul(
                        rn,
                        n,
                        hidden,
                        out,
                        n,
                        part.w.as_ptr(),
                        hidden,
                        h.data.as_ptr(),
                    );
                    let residual = Some(self.residual.data.as_slice());
                    epilogue(self.out, n, (r0, rn, 0, n), b.b.as_deref(), residual);
                }
            }
        });
    }

    /// The first convolution's im2col columns for output frames `t0 .. t0 + tn` into `cols`
    /// (`cin * k` rows of `tn`: row `ci * k + j` holds input frames from `t0 + j * dilation`).
    fn columns(&self, t0: usize, tn: usize, cols: &mut [f32]) {
        let a = self.first;
        for ci in 0..a.cin {
            let src = self.x.row(ci);
            for j in 0..a.k {
                let (row, start) = (ci * a.k + j, t0 + j * a.dilation);
                cols[row * tn..(row + 1) * tn].copy_from_slice(&src[start..start + tn]);
            }
        }
    }

    /// The tile of frames `t0 .. t0 + tn` with `gemm`: im2col block, first product, bias and
    /// ELU, second product into `out`, then its bias and the residual.
    fn gemm_tile(&self, scratch: &mut Vec<f32>, t0: usize, tn: usize) {
        let (a, b) = (self.first, self.second);
        let (cin, k, hidden, cout) = (a.cin, a.k, a.cout, b.cout);
        let (kk, n) = (cin * k, self.n);
        let (nc, nh) = (kk * tn, hidden * tn);
        if scratch.len() < nc + nh {
            scratch.resize(nc + nh, 0.0);
        }
        let (cols, h) = scratch[..nc + nh].split_at_mut(nc);
        let (wa, wb) = (a.w.f32(), b.w.f32());
        self.columns(t0, tn, cols);
        // SAFETY: h is hidden x tn; the weights have hidden rows of kk.
        unsafe {
            matmul(
                hidden,
                tn,
                kk,
                h.as_mut_ptr(),
                tn,
                wa.as_ptr(),
                kk,
                cols.as_ptr(),
            );
        }
        let b1 = a.b.as_deref();
        for (r, row) in h.chunks_mut(tn).enumerate() {
            let b = b1.map_or(0.0, |b| b[r]);
            row.iter_mut().for_each(|v| *v += b);
            elu_in_place(row, self.alpha);
        }
        // SAFETY: the tile's columns t0 .. t0 + tn of every row of `out` are written by
        // this tile only; second's weights have cout rows of hidden.
        unsafe {
            matmul(
                cout,
                tn,
                hidden,
                self.out.at(t0),
                n,
                wb.as_ptr(),
                hidden,
                h.as_ptr(),
            );
            let residual = Some(self.residual.data.as_slice());
            epilogue(self.out, n, (0, cout, t0, tn), b.b.as_deref(), residual);
        }
    }
}
