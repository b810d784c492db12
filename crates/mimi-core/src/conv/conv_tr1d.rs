//! The causal transposed convolution ([`ConvTr1d`], candle's `StreamableConvTranspose1d`,
//! or the depthwise one of `ConvTrUpsample1d`). A stride-`s` transposed convolution is split
//! into its `s` phases, each an ordinary convolution over the last `ceil(k/s)` input frames,
//! written straight into the strided output (no col2im, no overlap-add): one matrix product
//! for all phases, per tile ([`ConvTr1d::run_tiled`]) or, for a streaming step, with the
//! matrix-vector kernel.

use crate::rows::RowList;
use candle::Result;
use candle_nn::VarBuilder;

use super::frames::{Frames, Joined};
use super::spec::{conv_weight, to_vec, ConvSpec, ConvState, Matrix};
use super::tiles::{for_tiles, matmul, max_cols, rows_alone_in_group, tiles, SharedMut};

/// A causal transposed convolution (`StreamableConvTranspose1d`), or the depthwise one of
/// `ConvTrUpsample1d` (`depthwise`, no bias).
#[derive(Clone, Debug)]
pub struct ConvTr1d {
    /// Row `(co, j)` (output channel, phase) of `taps * cin` columns `(m, ci)` holds
    /// `W[ci, co, j + m * stride]` (zero past the kernel). Depthwise: `w[c, j + m * stride]`
    /// at `(j * cout + c) * taps + m`.
    pub(super) w: Matrix,
    /// The weights in bf16 pairs, same layout (`precision="medium"`, `pairs.rs`); `w` is
    /// then empty.
    pub(super) pairs: Option<std::sync::Arc<crate::kernels::bf16dot::PairPacked>>,
    pub(super) b: Option<Vec<f32>>,
    pub(super) cin: usize,
    pub(super) cout: usize,
    pub(super) stride: usize,
    pub(super) taps: usize,
    pub(super) depthwise: bool,
}

impl ConvTr1d {
    /// Bytes of its weights and bias, as stored.
    pub fn weights_nbytes(&self) -> usize {
        let pairs = self.pairs.as_ref().map_or(0, |p| p.nbytes());
        self.w.nbytes() + pairs + 4 * self.b.as_ref().map_or(0, Vec::len)
    }
}

impl ConvTr1d {
    /// Reads the weights of `spec` from `vb` (dilation and padding do not apply).
    pub fn load(vb: VarBuilder, spec: ConvSpec) -> Result<Self> {
        let ConvSpec {
            cin,
            cout,
            k,
            stride,
            bias,
            ..
        } = spec;
        let vb = vb.pp("conv");
        let raw = to_vec(&conv_weight(&vb, (cin, cout, k))?)?;
        let b = if bias {
            Some(to_vec(&vb.get(cout, "bias")?)?)
        } else {
            None
        };
        let taps = k.div_ceil(stride);
        let tk = taps * cin;
        let mut w = vec![0f32; stride * cout * tk];
        for j in 0..stride {
            for co in 0..cout {
                for m in 0..taps {
                    let kk = j + m * stride;
                    if kk >= k {
                        continue;
                    }
                    for ci in 0..cin {
                        w[(co * stride + j) * tk + m * cin + ci] = raw[(ci * cout + co) * k + kk];
                    }
                }
            }
        }
        Ok(Self {
            w: Matrix::F32(w),
            pairs: None,
            b,
            cin,
            cout,
            stride,
            taps,
            depthwise: false,
        })
    }

    /// `ConvTrUpsample1d`: groups = channels, kernel `2 * stride`, no bias.
    pub fn load_depthwise(vb: VarBuilder, dim: usize, stride: usize) -> Result<Self> {
        let k = 2 * stride;
        let raw = to_vec(&vb.pp("conv").get((dim, 1, k), "weight")?)?;
        let taps = k.div_ceil(stride);
        let mut w = vec![0f32; stride * dim * taps];
        for j in 0..stride {
            for c in 0..dim {
                for m in 0..taps {
                    if j + m * stride < k {
                        w[(j * dim + c) * taps + m] = raw[c * k + j + m * stride];
                    }
                }
            }
        }
        Ok(Self {
            w: Matrix::F32(w),
            pairs: None,
            b: None,
            cin: dim,
            cout: dim,
            stride,
            taps,
            depthwise: true,
        })
    }

    /// Offline: candle's `forward` with the causal trim (`len * stride` frames out).
    #[cfg(test)]
    pub fn forward(&self, x: &Frames, act: Option<f32>) -> Frames {
        self.step(&mut ConvState::default(), x, act)
    }

    /// Streaming: `len * stride` output frames per chunk, the same as offline.
    pub fn step(&self, st: &mut ConvState, x: &Frames, act: Option<f32>) -> Frames {
        if x.len == 0 {
            return Frames::empty(self.cout);
        }
        let full = self.prepare(st, x, act);
        self.run(&full, x.len)
    }

    /// The state's last `taps - 1` frames then the activated chunk; keeps the new last
    /// `taps - 1` in the state.
    fn prepare(&self, st: &mut ConvState, x: &Frames, act: Option<f32>) -> Frames {
        let prev = st.prev.take().unwrap_or_else(|| {
            let n = self.taps - 1;
            Frames::new(self.cin, n, vec![0f32; self.cin * n])
        });
        let full = prev.concat_act(x, act);
        st.prev = Some(full.tail(self.taps - 1));
        full
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

    /// Packs a large layer's weights for the packed product (see [`Matrix::pack`]); the
    /// depthwise upsampling keeps its own loop.
    pub(crate) fn pack(&mut self) {
        if !self.depthwise {
            self.w.pack(self.taps * self.cin)
        }
    }

    /// Test hook: packed weights whatever the layer's size.
    #[cfg(test)]
    pub(crate) fn force_pack(&mut self) {
        if !self.depthwise {
            self.w.pack_from(0, self.taps * self.cin)
        }
    }

    pub(crate) fn stride(&self) -> usize {
        self.stride
    }

    /// The first input frame that output frame `out` reads (negative: before the input).
    pub(crate) fn first_input(&self, out: i64) -> i64 {
        out.div_euclid(self.stride as i64) - (self.taps as i64 - 1)
    }

    /// `x` holds `taps - 1` earlier frames then `n` new ones; returns `(cout, n * stride)`.
    fn run(&self, x: &Frames, n: usize) -> Frames {
        if let Some(w) = &self.pairs {
            self.run_pairs(w, x, n)
        } else if self.depthwise {
            self.run_depthwise(x, n)
        } else if n <= self.w.gemv_frames() {
            self.run_gemv(x, n)
        } else {
            self.run_tiled(x, n)
        }
    }

    /// The depthwise upsampling: per channel and phase, a sum over the taps.
    fn run_depthwise(&self, x: &Frames, n: usize) -> Frames {
        let (cout, s, taps) = (self.cout, self.stride, self.taps);
        let out_len = n * s;
        let w = self.w.f32();
        let mut out = Frames::uninit(cout, out_len);
        for c in 0..cout {
            let src = x.row(c);
            for t in 0..n {
                for j in 0..s {
                    let mut acc = 0f32;
                    for m in 0..taps {
                        acc += w[(j * cout + c) * taps + m] * src[taps - 1 + t - m];
                    }
                    out.data[c * out_len + t * s + j] = acc;
                }
            }
        }
        out
    }

    /// A streaming step (a few input frames): the matrix-vector kernel over
    /// all phases at once, then interleaved into the output with the bias.
    fn run_gemv(&self, x: &Frames, n: usize) -> Frames {
        let tk = self.taps * self.cin;
        let cols = self.gemv_cols(x, n);
        let y = self.w.gemv(&cols.data, n, tk, self.stride * self.cout);
        self.gemv_out(&y.data, n)
    }

    /// The `(n, taps * cin)` rows of a streaming step's product (a buffer of the stock).
    fn gemv_cols(&self, x: &Frames, n: usize) -> Frames {
        let (cin, taps, len) = (self.cin, self.taps, x.len);
        let tk = taps * cin;
        let mut frames = Frames::uninit(n, tk);
        let cols = &mut frames.data;
        for t in 0..n {
            for m in 0..taps {
                for ci in 0..cin {
                    cols[t * tk + m * cin + ci] = x.data[ci * len + taps - 1 + t - m];
                }
            }
        }
        frames
    }

    /// Rows `(co, j)` of the product, `y (n, cout * stride)`, interleaved with the bias.
    fn gemv_out(&self, y: &[f32], n: usize) -> Frames {
        let (cout, s) = (self.cout, self.stride);
        let out_len = n * s;
        let mut out = Frames::uninit(cout, out_len);
        let bias = self.b.as_deref();
        for co in 0..cout {
            let b = bias.map_or(0.0, |b| b[co]);
            for t in 0..n {
                for j in 0..s {
                    out.data[co * out_len + t * s + j] = y[t * s * cout + co * s + j] + b;
                }
            }
        }
        out
    }

    /// [`Self::step`] of several rows, each continuing its own state: like
    /// [`super::Conv1d::step_rows`], the rows share the matrix-vector kernel's calls (a few
    /// frames each) or one tiled run side by side ([`Joined`]), and row `r` gets the bits
    /// `step` gives it alone.
    pub(crate) fn step_rows(
        &self,
        sts: &mut [&mut ConvState],
        xs: &[Frames],
        act: Option<f32>,
    ) -> RowList<Frames> {
        let step = self.w.gemv_frames();
        let few = xs.iter().all(|x| x.len <= step);
        let many = xs.iter().all(|x| x.len > step);
        let alone = rows_alone_in_group(self.w.nbytes());
        if let (Some(w), true) = (&self.pairs, xs.len() > 1) {
            let fulls: RowList<Option<Frames>> = (sts.iter_mut().zip(xs))
                .map(|(st, x)| (x.len > 0).then(|| self.prepare(st, x, act)))
                .collect();
            let ns: RowList<usize> = xs.iter().map(|x| x.len).collect();
            let fulls: RowList<Option<&Frames>> = fulls.iter().map(Option::as_ref).collect();
            return self.run_pairs_rows(w, &fulls, &ns);
        }
        if self.depthwise || xs.len() < 2 || !(few || many) || (many && alone) {
            return (sts.iter_mut().zip(xs))
                .map(|(st, x)| self.step(st, x, act))
                .collect();
        }
        let fulls: RowList<Option<Frames>> = (sts.iter_mut().zip(xs))
            .map(|(st, x)| (x.len > 0).then(|| self.prepare(st, x, act)))
            .collect();
        let ns: RowList<usize> = xs.iter().map(|x| x.len).collect();
        if many {
            return self.run_joined(&fulls, &ns);
        }
        let tk = self.taps * self.cin;
        let cols: RowList<Frames> = (fulls.iter().zip(&ns))
            .map(|(f, &n)| {
                f.as_ref()
                    .map_or_else(|| Frames::empty(tk), |full| self.gemv_cols(full, n))
            })
            .collect();
        let n_out = self.stride * self.cout;
        (self.w).gemv_rows(&cols, &ns, (tk, n_out), |y, n| match n {
            0 => Frames::empty(self.cout),
            _ => self.gemv_out(y, n),
        })
    }

    /// Rows' prepared inputs (each `taps - 1` earlier frames then `ns[r]` new ones) side by
    /// side in one tiled run: output frame `t` reads input frames `t .. t + taps`, so row
    /// `r`'s outputs start at its start's.
    fn run_joined(&self, fulls: &[Option<Frames>], ns: &[usize]) -> RowList<Frames> {
        let parts: RowList<&Frames> = fulls.iter().flatten().collect();
        let joined = Joined::new(&parts, self.cin, 1);
        let y = self.run(&joined.frames, joined.frames.len + 1 - self.taps);
        let s = self.stride;
        let mut starts = joined.starts.iter();
        (fulls.iter().zip(ns))
            .map(|(f, &n)| match f.as_ref().and(starts.next()) {
                Some(&t0) => y.window(t0 * s, (t0 + n) * s),
                None => Frames::empty(self.cout),
            })
            .collect()
    }

    /// Tiles of (output channels x input frames) over the pool: one product for all phases
    /// per tile, `z ((co, j), t) = w[(co, j)] . cols[t]`, then interleaved into
    /// `out[co, t * s + j]` with the bias.
    fn run_tiled(&self, x: &Frames, n: usize) -> Frames {
        let (cin, cout, s, taps) = (self.cin, self.cout, self.stride, self.taps);
        let (len, out_len, tk) = (x.len, n * s, taps * cin);
        let mut out = Frames::uninit(cout, out_len);
        let bias = self.b.as_deref();
        let ptr = SharedMut(out.data.as_mut_ptr());
        let flops = 2 * s * cout * tk * n;
        let w = self.w.f32();
        let tiles = tiles(cout, n, max_cols(tk), flops);
        for_tiles(&tiles, flops, |scratch, (r0, rn, t0, tn)| {
            let (nc, nz) = (tk * tn, rn * s * tn);
            if scratch.len() < nc + nz {
                scratch.resize(nc + nz, 0.0);
            }
            let (cols, z) = scratch[..nc + nz].split_at_mut(nc);
            for m in 0..taps {
                for ci in 0..cin {
                    let start = ci * len + taps - 1 + t0 - m;
                    cols[(m * cin + ci) * tn..(m * cin + ci + 1) * tn]
                        .copy_from_slice(&x.data[start..start + tn]);
                }
            }
            // SAFETY: z holds rn * s rows of tn; the weights rows (r0, 0) .. (r0 + rn, 0)
            // are contiguous, tk each; cols holds tk rows of tn.
            unsafe {
                matmul(
                    rn * s,
                    tn,
                    tk,
                    z.as_mut_ptr(),
                    tn,
                    w.as_ptr().add(r0 * s * tk),
                    tk,
                    cols.as_ptr(),
                );
            }
            for co in r0..r0 + rn {
                let b = bias.map_or(0.0, |b| b[co]);
                // SAFETY: the tile's output columns of row co, t0 * s .. (t0 + tn) * s, are
                // inside `out` and written by this tile only.
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(ptr.at(co * out_len + t0 * s), tn * s)
                };
                let zr = &z[(co - r0) * s * tn..(co - r0 + 1) * s * tn];
                for j in 0..s {
                    let zj = &zr[j * tn..(j + 1) * tn];
                    for (t, v) in zj.iter().enumerate() {
                        dst[t * s + j] = v + b;
                    }
                }
            }
        });
        out
    }
}
