//! Mimi's convolutions computed natively on the CPU in f32: the causal convolution and
//! transposed convolution every SEANet layer and the frame-rate down/upsampling are made of.
//!
//! candle's modules (`candle_transformers::models::mimi::{seanet, conv}`) are correct but slow
//! on the CPU: every convolution materialises a full im2col copy of its input, transposed
//! convolutions go through a col2im scatter (whose batched form is wrong in candle 0.11.1),
//! the depthwise upsampling is expanded into a dense `dim x dim` kernel, and everything except
//! the matrix products runs on one thread. This module computes the same functions:
//!
//! * a convolution is a matrix product `W (cout, cin*k) x cols (cin*k, frames)`, tiled over
//!   (output channels x frames) and spread over the rayon pool; each tile builds its own small
//!   im2col block (a few MB at most) and calls the `gemm` crate (the kernel candle uses) on
//!   one thread; bias and the residual are added while the tile is still in cache;
//! * a transposed convolution with stride `s` is split into its `s` phases, each an ordinary
//!   convolution over the last `ceil(k/s)` input frames, written straight into the strided
//!   output (no col2im, no overlap-add);
//! * the ELU is computed once per element with a vectorisable exponential;
//! * few frames (a streaming step) use the matrix-vector kernel of [`crate::kernels`].
//!
//! Streaming and offline share the code: a layer's state is the tail of its (activated) input
//! that the next frames still need. The offline path pads like candle's `forward` (causal left
//! padding plus the extra right padding that completes the last stride); the streaming path
//! keeps the tail instead, so its outputs are those of the offline path for every complete
//! frame. Rust tests below compare both against candle's modules. [`crate::seanet`]
//! assembles these into the encoder and decoder.

use candle::{DType, Device, Result, Tensor};
use candle_nn::VarBuilder;
use rayon::prelude::*;

use crate::config::PadMode;
use crate::kernels::direct;

/// A raw pointer shared by tiles that write disjoint parts of one buffer.
#[derive(Clone, Copy)]
struct SharedMut(*mut f32);
// SAFETY: every tile writes a disjoint set of elements, and the buffer outlives the tiles.
unsafe impl Send for SharedMut {}
unsafe impl Sync for SharedMut {}

impl SharedMut {
    /// The element `i` (a method, so that closures capture the whole `SharedMut`).
    fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

/// Recycled activation buffers, per thread. Large fresh allocations cost a page fault per
/// 4 KiB (glibc maps them fresh and unmaps them on free): reusing a layer's buffers for the
/// next layers removes most of that. Offline calls run on a worker thread of their own, so
/// the buffers go when the call ends; a streaming thread keeps a few small ones.
mod pool {
    use std::cell::RefCell;

    /// Buffers below this many floats are left to the allocator.
    const MIN: usize = 1 << 14;
    /// At most this many buffers are kept per thread.
    const KEEP: usize = 6;

    thread_local! {
        static FREE: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
    }

    /// A buffer of `n` floats with unspecified (initialised) contents.
    pub fn take(n: usize) -> Vec<f32> {
        if n >= MIN {
            let found = FREE.with(|f| {
                let mut f = f.borrow_mut();
                // The smallest buffer that fits, if it is not much larger than needed (the
                // buffer may end up owned by a tensor, capacity and all).
                let best = (0..f.len())
                    .filter(|&i| f[i].len() >= n && f[i].capacity() <= 2 * n)
                    .min_by_key(|&i| f[i].len());
                best.map(|i| f.swap_remove(i))
            });
            if let Some(mut v) = found {
                v.truncate(n);
                return v;
            }
        }
        vec![0f32; n]
    }

    /// Frees this thread's buffers (the end of an offline call).
    pub fn clear() {
        FREE.with(|f| f.borrow_mut().clear());
    }

    pub fn give(v: Vec<f32>) {
        if v.len() < MIN {
            return;
        }
        FREE.with(|f| {
            let mut f = f.borrow_mut();
            f.push(v);
            if f.len() > KEEP {
                let smallest = (0..f.len()).min_by_key(|&i| f[i].len()).unwrap_or(0);
                f.swap_remove(smallest);
            }
        });
    }
}

/// Frees the recycled buffers of the calling thread.
pub fn release_buffers() {
    pool::clear();
}

/// `(channels, frames)` activations of one batch item, row-major.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Frames {
    pub channels: usize,
    pub len: usize,
    pub data: Vec<f32>,
}

impl Drop for Frames {
    fn drop(&mut self) {
        pool::give(std::mem::take(&mut self.data));
    }
}

impl Frames {
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
    fn uninit(channels: usize, len: usize) -> Self {
        Self::new(channels, len, pool::take(channels * len))
    }

    pub fn into_data(mut self) -> Vec<f32> {
        let mut v = std::mem::take(&mut self.data);
        v.shrink_to_fit();
        v
    }

    pub(crate) fn empty(channels: usize) -> Self {
        Self::new(channels, 0, Vec::new())
    }

    fn row(&self, c: usize) -> &[f32] {
        &self.data[c * self.len..(c + 1) * self.len]
    }

    /// `[self | other]` along time, with `act` applied to `other`.
    fn concat_act(&self, other: &Frames, act: Option<f32>) -> Frames {
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

/// `f(row index, row)` over the rows of `data`, in parallel when large.
fn par_rows(data: &mut [f32], len: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    if data.len() >= 1 << 16 && rayon::current_num_threads() > 1 {
        data.par_chunks_mut(len)
            .with_min_len((1 << 15) / len.max(1) + 1)
            .enumerate()
            .for_each(|(c, row)| f(c, row));
    } else {
        data.chunks_mut(len)
            .enumerate()
            .for_each(|(c, row)| f(c, row));
    }
}

/// A causal convolution's input as the convolution sees it: `left` padding frames, the
/// frames of `x`, `right` padding frames; padding is zeros, or per-channel values.
struct Padded<'a> {
    x: &'a Frames,
    left: usize,
    right: usize,
    lval: Option<Vec<f32>>,
    rval: Option<Vec<f32>>,
}

impl<'a> Padded<'a> {
    fn plain(x: &'a Frames) -> Self {
        Self {
            x,
            left: 0,
            right: 0,
            lval: None,
            rval: None,
        }
    }

    fn len(&self) -> usize {
        self.left + self.x.len + self.right
    }

    /// `dst[i] = input[c, start + i * step]`.
    fn gather(&self, c: usize, start: usize, step: usize, dst: &mut [f32]) {
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

// ---------------------------------------------------------------------------------------
// ELU

/// `e^x - 1` for `x <= 0`, vectorisable.
#[inline(always)]
fn expm1_nonpos(x: f32) -> f32 {
    crate::kernels::exp_nonpos(x) - 1.0
}

#[inline(always)]
fn copy_act_generic(src: &[f32], dst: &mut [f32], alpha: f32) {
    for (d, &x) in dst.iter_mut().zip(src) {
        let e = alpha * expm1_nonpos(x);
        *d = if x > 0.0 { x } else { e };
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn copy_act_avx2(src: &[f32], dst: &mut [f32], alpha: f32) {
    copy_act_generic(src, dst, alpha)
}

#[inline(always)]
fn elu_in_place_generic(v: &mut [f32], alpha: f32) {
    for x in v.iter_mut() {
        let e = alpha * expm1_nonpos(*x);
        *x = if *x > 0.0 { *x } else { e };
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn elu_in_place_avx2(v: &mut [f32], alpha: f32) {
    elu_in_place_generic(v, alpha)
}

fn elu_in_place(v: &mut [f32], alpha: f32) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports the features the function was compiled for.
            return unsafe { elu_in_place_avx2(v, alpha) };
        }
    }
    elu_in_place_generic(v, alpha)
}

/// `dst = elu(src)` (or a plain copy without activation).
fn copy_act(src: &[f32], dst: &mut [f32], act: Option<f32>) {
    let Some(alpha) = act else {
        dst.copy_from_slice(src);
        return;
    };
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports the features the function was compiled for.
            return unsafe { copy_act_avx2(src, dst, alpha) };
        }
    }
    copy_act_generic(src, dst, alpha)
}

// ---------------------------------------------------------------------------------------
// Tiled products

/// Splits `rows x cols` output elements into tiles for the pool: column blocks of at most
/// `max_cols`, and row blocks when there are too few column blocks to keep every thread busy.
fn tiles(
    rows: usize,
    cols: usize,
    max_cols: usize,
    flops: usize,
) -> Vec<(usize, usize, usize, usize)> {
    let threads = rayon::current_num_threads();
    let col_tiles = cols.div_ceil(max_cols.max(1));
    let mut row_tiles = 1;
    if threads > 1 && flops > 1 << 21 && col_tiles < 2 * threads {
        row_tiles = (2 * threads)
            .div_ceil(col_tiles)
            .min(rows.div_ceil(16))
            .max(1);
    }
    let rstep = rows
        .div_ceil(row_tiles)
        .next_multiple_of(8)
        .min(rows.max(1));
    let cstep = cols.div_ceil(col_tiles.max(1));
    let mut out = Vec::new();
    let mut c0 = 0;
    while c0 < cols {
        let cn = cstep.min(cols - c0);
        let mut r0 = 0;
        while r0 < rows {
            let rn = rstep.min(rows - r0);
            out.push((r0, rn, c0, cn));
            r0 += rn;
        }
        c0 += cn;
    }
    out
}

thread_local! {
    /// Each thread's im2col block, kept between calls.
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` on every tile, in parallel when that pays.
fn for_tiles<F>(tiles: &[(usize, usize, usize, usize)], flops: usize, f: F)
where
    F: Fn(&mut Vec<f32>, (usize, usize, usize, usize)) + Sync,
{
    let run = |&t: &(usize, usize, usize, usize)| {
        SCRATCH.with(|s| f(&mut s.borrow_mut(), t));
    };
    if tiles.len() > 1 && rayon::current_num_threads() > 1 && flops > 1 << 21 {
        tiles.par_iter().for_each(run);
    } else {
        tiles.iter().for_each(run);
    }
}

/// `dst (m, n) = lhs (m, k) . rhs (k, n)` on one thread; `dst` has row stride `dst_rs` and
/// column stride `dst_cs`, `lhs` row stride `lhs_rs`, `rhs` is contiguous.
///
/// SAFETY: the pointers must cover the strided extents described.
#[allow(clippy::too_many_arguments)]
unsafe fn matmul(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut f32,
    dst_rs: usize,
    dst_cs: usize,
    lhs: *const f32,
    lhs_rs: usize,
    rhs: *const f32,
) {
    gemm::gemm(
        m,
        n,
        k,
        dst,
        dst_cs as isize,
        dst_rs as isize,
        false,
        lhs,
        1,
        lhs_rs as isize,
        rhs,
        1,
        n as isize,
        0f32,
        1f32,
        false,
        false,
        false,
        gemm::Parallelism::None,
    )
}

/// Adds `bias[row]` and `residual` to the tile `rows x cols` of `out (_, stride)`.
///
/// SAFETY: the tile lies inside `out`, and no other thread writes it.
unsafe fn epilogue(
    out: SharedMut,
    stride: usize,
    (r0, rn, c0, cn): (usize, usize, usize, usize),
    bias: Option<&[f32]>,
    residual: Option<&[f32]>,
) {
    if bias.is_none() && residual.is_none() {
        return;
    }
    for r in r0..r0 + rn {
        let row = std::slice::from_raw_parts_mut(out.0.add(r * stride + c0), cn);
        if let Some(b) = bias {
            let b = b[r];
            row.iter_mut().for_each(|v| *v += b);
        }
        if let Some(res) = residual {
            let res = &res[r * stride + c0..r * stride + c0 + cn];
            row.iter_mut().zip(res).for_each(|(v, &x)| *v += x);
        }
    }
}

/// Columns per tile so that a tile's im2col block stays near 2 MB.
fn max_cols(k: usize) -> usize {
    ((1usize << 19) / k.max(1)).clamp(32, 2048)
}

// ---------------------------------------------------------------------------------------
// Weights

/// A convolution weight as candle's Mimi modules read it: `weight`, or the weight-norm pair
/// `weight_g`/`weight_v` (norm over all but the first dimension).
fn conv_weight(vb: &VarBuilder, shape: (usize, usize, usize)) -> Result<Tensor> {
    if vb.contains_tensor("weight") {
        return vb.get(shape, "weight");
    }
    let g = vb.get((shape.0, 1, 1), "weight_g")?;
    let v = vb.get(shape, "weight_v")?;
    let norm = v.sqr()?.sum_keepdim((1, 2))?.sqrt()?;
    v.broadcast_mul(&g)?.broadcast_div(&norm)
}

fn to_vec(t: &Tensor) -> Result<Vec<f32>> {
    t.to_dtype(DType::F32)?
        .to_device(&Device::Cpu)?
        .flatten_all()?
        .to_vec1::<f32>()
}

// ---------------------------------------------------------------------------------------
// Convolution

/// The streaming state of one convolution: the activated input frames the next output
/// frames still need.
#[derive(Clone, Debug, Default)]
pub struct ConvState {
    prev: Option<Frames>,
    /// Input frames received so far (what the offline padding of the last chunk needs).
    seen: usize,
}

/// The shape of one convolution: channels, kernel, stride, dilation, bias, padding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvSpec {
    pub cin: usize,
    pub cout: usize,
    pub k: usize,
    pub stride: usize,
    pub dilation: usize,
    pub bias: bool,
    pub pad: PadMode,
}

impl ConvSpec {
    /// `cin -> cout` with kernel `k`: stride 1, no dilation, a bias, zero padding.
    pub fn new(cin: usize, cout: usize, k: usize) -> Self {
        Self {
            cin,
            cout,
            k,
            stride: 1,
            dilation: 1,
            bias: true,
            pad: PadMode::Constant,
        }
    }

    /// The same with stride `stride`.
    pub fn stride(self, stride: usize) -> Self {
        Self { stride, ..self }
    }

    /// The same with dilation `dilation`.
    pub fn dilation(self, dilation: usize) -> Self {
        Self { dilation, ..self }
    }

    /// The same without a bias.
    pub fn no_bias(self) -> Self {
        Self {
            bias: false,
            ..self
        }
    }

    /// The same with left padding `pad`.
    pub fn pad(self, pad: PadMode) -> Self {
        Self { pad, ..self }
    }
}

/// The smallest product depth per tap (`cin * stride`) for which a strided convolution is
/// computed on its phase-split input.
const MIN_PHASE_K: usize = 32;

/// `w (cout, cin, k)` reordered to columns `(m, ci, r)` for tap `j = m * stride + r`, zero
/// where `j >= k`: per tap `m`, a `(cout, cin * stride)` block of each row.
fn phase_major(w: &[f32], cout: usize, cin: usize, k: usize, stride: usize) -> Vec<f32> {
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
    w: Vec<f32>,
    /// Taps per phase of a strided convolution computed on its phase-split input (see
    /// [`Conv1d::run_phased`]); 0 for the plain layout.
    phases: usize,
    b: Option<Vec<f32>>,
    pub(crate) cin: usize,
    pub(crate) cout: usize,
    pub(crate) k: usize,
    pub(crate) stride: usize,
    dilation: usize,
    replicate: bool,
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
            phase_major(&w, cout, cin, k, stride)
        } else {
            w
        };
        Ok(Self {
            w,
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

    fn frames(&self, len: usize) -> usize {
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
        let n = self.frames(x.len);
        let (cin, k, d, hidden, cout) = (self.cin, self.k, self.dilation, self.cout, second.cout);
        let kk = cin * k;
        assert_eq!(
            (residual.channels, residual.len),
            (cout, n),
            "residual shape"
        );
        assert!(self.stride == 1 && second.k == 1 && second.cin == hidden);
        let mut out = Frames::uninit(cout, n);
        let ptr = SharedMut(out.data.as_mut_ptr());
        let flops = 2 * n * (hidden * kk + cout * hidden);
        let tiles = tiles(1, n, max_cols(kk + hidden), flops);
        let (b1, b2) = (self.b.as_deref(), second.b.as_deref());
        // The direct kernel where the CPU has AVX-512 and it measured faster (see
        // direct::MAX_DIRECT_K): Mimi's residual blocks up to 256 channels.
        if kk <= direct::MAX_DIRECT_K && crate::kernels::direct::available() {
            let first = direct::Direct {
                w: &self.w,
                cout: hidden,
                cin,
                k,
                dilation: d,
                bias: b1,
            };
            let second = direct::Direct {
                w: &second.w,
                cout,
                cin: hidden,
                k: 1,
                dilation: 1,
                bias: b2,
            };
            let res = residual.data.as_ptr() as usize;
            for_tiles(&tiles, flops, |scratch, (_, _, t0, tn)| {
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
                    h.chunks_mut(tn).for_each(|row| elu_in_place(row, alpha));
                    let add = (res as *const f32).add(t0);
                    direct::conv(
                        &second,
                        h.as_ptr(),
                        tn,
                        0,
                        tn,
                        ptr.at(t0),
                        n,
                        Some((add, n)),
                    );
                }
            });
            return out;
        }
        for_tiles(&tiles, flops, |scratch, (_, _, t0, tn)| {
            let (nc, nh) = (kk * tn, hidden * tn);
            if scratch.len() < nc + nh {
                scratch.resize(nc + nh, 0.0);
            }
            let (cols, h) = scratch[..nc + nh].split_at_mut(nc);
            for ci in 0..cin {
                let src = x.row(ci);
                for j in 0..k {
                    let row = ci * k + j;
                    let start = t0 + j * d;
                    cols[row * tn..(row + 1) * tn].copy_from_slice(&src[start..start + tn]);
                }
            }
            // SAFETY: h is hidden x tn; the weights have hidden rows of kk.
            unsafe {
                matmul(
                    hidden,
                    tn,
                    kk,
                    h.as_mut_ptr(),
                    tn,
                    1,
                    self.w.as_ptr(),
                    kk,
                    cols.as_ptr(),
                );
            }
            for (r, row) in h.chunks_mut(tn).enumerate() {
                let b = b1.map_or(0.0, |b| b[r]);
                row.iter_mut().for_each(|v| *v += b);
                elu_in_place(row, alpha);
            }
            // SAFETY: the tile's columns t0 .. t0 + tn of every row of `out` are written by
            // this tile only; second's weights have cout rows of hidden.
            unsafe {
                matmul(
                    cout,
                    tn,
                    hidden,
                    ptr.at(t0),
                    n,
                    1,
                    second.w.as_ptr(),
                    hidden,
                    h.as_ptr(),
                );
                epilogue(ptr, n, (0, cout, t0, tn), b2, Some(&residual.data));
            }
        });
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
                    gemm::gemm(
                        rn,
                        tn,
                        cs,
                        ptr.at(r0 * n + t0),
                        1,
                        n as isize,
                        m > 0,
                        self.w.as_ptr().add(r0 * kk + m * cs),
                        1,
                        kk as isize,
                        ph.data.as_ptr().add(t0 + m),
                        1,
                        len as isize,
                        1f32,
                        1f32,
                        false,
                        false,
                        false,
                        gemm::Parallelism::None,
                    );
                }
            }
            // SAFETY: as above.
            unsafe { epilogue(ptr, n, (r0, rn, t0, tn), self.b.as_deref(), residual) };
        });
        out
    }

    /// A stride-1 convolution of (padded, activated) frames with the direct kernel, tiles of
    /// frames over the pool: SEANet's outer layers. The decoder's last (64 -> 1, k 7 at
    /// 24 kHz, one output row) took 4.8 ms per second of audio through gemm, 1.9-2.8 ms now
    /// (most of it the activation of its 64-channel input); 1 thread (`mimi_kernel_bench`).
    fn run_direct(&self, x: &Frames, n: usize, residual: Option<&Frames>) -> Frames {
        let p = direct::Direct {
            w: &self.w,
            cout: self.cout,
            cin: self.cin,
            k: self.k,
            dilation: self.dilation,
            bias: self.b.as_deref(),
        };
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

    /// The convolution of padded, activated frames, plus `residual`.
    fn run(&self, x: &Padded, residual: Option<&Frames>) -> Frames {
        let n = self.frames(x.len());
        if self.phases > 0 && n > crate::kernels::GEMV_MAX_ROWS {
            return self.run_phased(x, n, residual);
        }
        if self.stride == 1
            && x.left == 0
            && x.right == 0
            && n > crate::kernels::GEMV_MAX_ROWS
            && self.cin * self.k <= direct::MAX_DIRECT_K
            && direct::available()
        {
            return self.run_direct(x.x, n, residual);
        }
        let (cin, cout, k, s, d) = (self.cin, self.cout, self.k, self.stride, self.dilation);
        let kk = self.w.len() / cout.max(1);
        if let Some(r) = residual {
            assert_eq!((r.channels, r.len), (cout, n), "residual shape");
        }
        let residual = residual.map(|r| r.data.as_slice());
        if n == 0 {
            return Frames::empty(cout);
        }
        let bias = self.b.as_deref();
        let mut out = Frames::uninit(cout, n);
        if n <= crate::kernels::GEMV_MAX_ROWS {
            // A streaming step: bound by reading the weights once; matrix-vector kernel.
            let mut cols = vec![0f32; n * kk];
            if self.phases > 0 {
                // Columns (m, ci, r), as the phase-major weights.
                let mut g = vec![0f32; n];
                let (taps, cs) = (self.phases, cin * s);
                for m in 0..taps {
                    for ci in 0..cin {
                        for r in (0..s).filter(|r| m * s + r < k) {
                            x.gather(ci, m * s + r, s, &mut g);
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
                let mut g = vec![0f32; n];
                for ci in 0..cin {
                    for j in 0..k {
                        x.gather(ci, j * d, s, &mut g);
                        for (t, v) in g.iter().enumerate() {
                            cols[t * kk + ci * k + j] = *v;
                        }
                    }
                }
            }
            let y = crate::kernels::gemv(&cols, &self.w, n, kk, cout);
            for co in 0..cout {
                let b = bias.map_or(0.0, |b| b[co]);
                for t in 0..n {
                    let r = residual.map_or(0.0, |r| r[co * n + t]);
                    out.data[co * n + t] = y[t * cout + co] + b + r;
                }
            }
            return out;
        }
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
                    1,
                    self.w.as_ptr().add(r0 * kk),
                    kk,
                    cols.as_ptr(),
                );
                epilogue(ptr, n, tile, bias, residual);
            }
        });
        out
    }
}

/// A causal transposed convolution (`StreamableConvTranspose1d`), or the depthwise one of
/// `ConvTrUpsample1d` (`depthwise`, no bias).
#[derive(Clone, Debug)]
pub struct ConvTr1d {
    /// Row `(co, j)` (output channel, phase) of `taps * cin` columns `(m, ci)` holds
    /// `W[ci, co, j + m * stride]` (zero past the kernel). Depthwise: `w[c, j + m * stride]`
    /// at `(j * cout + c) * taps + m`.
    w: Vec<f32>,
    b: Option<Vec<f32>>,
    cin: usize,
    cout: usize,
    stride: usize,
    taps: usize,
    depthwise: bool,
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
            w,
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
            w,
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
        let prev = st.prev.take().unwrap_or_else(|| {
            let n = self.taps - 1;
            Frames::new(self.cin, n, vec![0f32; self.cin * n])
        });
        let full = prev.concat_act(x, act);
        let y = self.run(&full, x.len);
        st.prev = Some(full.tail(self.taps - 1));
        y
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
        let (cin, cout, s, taps) = (self.cin, self.cout, self.stride, self.taps);
        let len = x.len;
        let out_len = n * s;
        let mut out = Frames::uninit(cout, out_len);
        if self.depthwise {
            for c in 0..cout {
                let src = x.row(c);
                for t in 0..n {
                    for j in 0..s {
                        let mut acc = 0f32;
                        for m in 0..taps {
                            acc += self.w[(j * cout + c) * taps + m] * src[taps - 1 + t - m];
                        }
                        out.data[c * out_len + t * s + j] = acc;
                    }
                }
            }
            return out;
        }
        let tk = taps * cin;
        let bias = self.b.as_deref();
        if n <= crate::kernels::GEMV_MAX_ROWS {
            let mut cols = vec![0f32; n * tk];
            for t in 0..n {
                for m in 0..taps {
                    for ci in 0..cin {
                        cols[t * tk + m * cin + ci] = x.data[ci * len + taps - 1 + t - m];
                    }
                }
            }
            // Rows (co, j): y (n, cout * stride).
            let y = crate::kernels::gemv(&cols, &self.w, n, tk, s * cout);
            for co in 0..cout {
                let b = bias.map_or(0.0, |b| b[co]);
                for t in 0..n {
                    for j in 0..s {
                        out.data[co * out_len + t * s + j] = y[t * s * cout + co * s + j] + b;
                    }
                }
            }
            return out;
        }
        let ptr = SharedMut(out.data.as_mut_ptr());
        let flops = 2 * s * cout * tk * n;
        let tiles = tiles(cout, n, max_cols(tk), flops);
        for_tiles(&tiles, flops, |scratch, (r0, rn, t0, tn)| {
            // One product for all phases: z ((co, j), t) = w[(co, j)] . cols[t], then
            // interleaved into out[co, t * s + j].
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
                    1,
                    self.w.as_ptr().add(r0 * s * tk),
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

#[cfg(test)]
mod tests {
    use super::*;
    use candle::{Module, StreamingModule};
    use candle_nn::VarMap;
    use candle_transformers::models::mimi::conv as cconv;

    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    fn frames_of(t: &Tensor) -> Frames {
        let (_, c, l) = t.dims3().unwrap();
        Frames::new(c, l, t.flatten_all().unwrap().to_vec1().unwrap())
    }

    fn random_vb(seed: u64) -> (VarMap, VarBuilder<'static>) {
        let vm = VarMap::new();
        let _ = seed;
        let vb = VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu);
        (vm, vb)
    }

    #[test]
    fn gather_matches_naive_indexing() {
        let x = Frames::new(2, 7, (0..14).map(|v| v as f32 + 1.0).collect());
        for (left, right) in [(0, 0), (3, 0), (0, 4), (5, 6)] {
            let p = Padded {
                x: &x,
                left,
                right,
                lval: Some(vec![-1.0, -2.0]),
                rval: Some(vec![-3.0, -4.0]),
            };
            for start in 0..p.len() {
                for step in 1..5 {
                    for m in 0..=(p.len() - start).div_ceil(step) {
                        if m > 0 && start + (m - 1) * step >= p.len() {
                            continue;
                        }
                        let mut got = vec![0f32; m];
                        p.gather(1, start, step, &mut got);
                        let want: Vec<f32> = (0..m)
                            .map(|i| {
                                let q = start + i * step;
                                if q < left {
                                    -2.0
                                } else if q < left + 7 {
                                    x.row(1)[q - left]
                                } else {
                                    -4.0
                                }
                            })
                            .collect();
                        assert_eq!(got, want, "{left} {right} {start} {step} {m}");
                    }
                }
            }
        }
    }

    #[test]
    fn elu_matches_exp() {
        for i in -20000..=2000 {
            let x = i as f32 * 0.005;
            let mut y = [0f32];
            copy_act(&[x], &mut y, Some(1.0));
            let want = if x > 0.0 {
                x
            } else {
                (x as f64).exp_m1() as f32
            };
            assert!((y[0] - want).abs() <= 2e-7, "x={x}: {} vs {want}", y[0]);
        }
        let mut y = [0f32; 2];
        copy_act(&[-1e30, f32::MIN], &mut y, Some(0.5));
        assert_eq!(y, [-0.5, -0.5]);
    }

    /// Our convolution against candle's `StreamableConv1d`, offline and in streaming chunks.
    #[test]
    fn conv1d_matches_candle() -> Result<()> {
        let cases = [
            // cin, cout, k, stride, dilation, len, replicate
            (3, 5, 7, 1, 1, 50, false),
            (8, 16, 3, 1, 2, 300, false),
            (16, 8, 8, 4, 1, 301, false),
            (8, 8, 4, 2, 1, 37, true),
            (40, 24, 10, 5, 1, 2000, false),
            // Phase-split (cin * stride >= 32): a kernel that is not a multiple of the
            // stride (zero taps), replicate padding, and few frames (matrix-vector path).
            (16, 12, 7, 3, 1, 400, true),
            (32, 8, 8, 4, 1, 19, false),
            (4, 6, 1, 1, 1, 9, false),
            // Few output frames with padding: the matrix-vector path's strided gather.
            (6, 4, 5, 2, 1, 5, true),
            (6, 4, 3, 1, 2, 3, false),
        ];
        for (cin, cout, k, s, d, len, rep) in cases {
            let (_vm, vb) = random_vb(0);
            let pad = if rep {
                cconv::PadMode::Replicate
            } else {
                cconv::PadMode::Constant
            };
            let theirs = cconv::StreamableConv1d::new(
                cin,
                cout,
                k,
                s,
                d,
                1,
                true,
                true,
                None,
                pad,
                vb.clone(),
            )?;
            let ours = Conv1d::load(
                vb,
                ConvSpec::new(cin, cout, k)
                    .stride(s)
                    .dilation(d)
                    .pad(if rep {
                        PadMode::Replicate
                    } else {
                        PadMode::Constant
                    }),
            )?;
            let x = Tensor::randn(0f32, 1., (1, cin, len), &Device::Cpu)?;
            let want = theirs.forward(&x)?;
            let got = ours.forward(&frames_of(&x), None, None);
            assert_eq!(got.len, want.dim(2)?, "case {cin} {cout} {k} {s} {d} {len}");
            let dd = max_diff(&got.data, &frames_of(&want).data);
            assert!(
                dd < 1e-4,
                "offline {dd}: case {cin} {cout} {k} {s} {d} {len} {rep}"
            );
            // Streaming, uneven chunks, against candle's streaming.
            let mut theirs = theirs;
            let mut st = ConvState::default();
            let mut t0 = 0;
            let mut chunk = 1;
            while t0 < len {
                let n = chunk.min(len - t0);
                let xc = x.narrow(2, t0, n)?;
                let want = theirs.step(&xc.clone().into())?;
                let got = ours.step(&mut st, &frames_of(&xc), None, None, false);
                match want.as_option() {
                    Some(w) if w.dim(2)? > 0 => {
                        assert_eq!(got.len, w.dim(2)?);
                        let dd = max_diff(&got.data, &frames_of(w).data);
                        assert!(dd < 1e-4, "step {dd}");
                    }
                    _ => assert_eq!(got.len, 0),
                }
                t0 += n;
                chunk = chunk * 3 % 97 + 1;
            }
        }
        Ok(())
    }

    #[test]
    fn conv_tr1d_matches_candle() -> Result<()> {
        for (cin, cout, k, s, len) in [
            (6, 4, 8, 4, 9),
            (16, 8, 16, 8, 40),
            (5, 3, 3, 2, 3),
            (32, 16, 4, 2, 700),
        ] {
            let (_vm, vb) = random_vb(0);
            let theirs = cconv::StreamableConvTranspose1d::new(
                cin,
                cout,
                k,
                s,
                1,
                true,
                true,
                None,
                vb.clone(),
            )?;
            let ours = ConvTr1d::load(vb, ConvSpec::new(cin, cout, k).stride(s))?;
            let x = Tensor::randn(0f32, 1., (1, cin, len), &Device::Cpu)?;
            let want = theirs.forward(&x)?;
            let got = ours.forward(&frames_of(&x), None);
            assert_eq!(got.len, want.dim(2)?);
            let dd = max_diff(&got.data, &frames_of(&want).data);
            assert!(dd < 1e-4, "offline {dd}");
            let mut st = ConvState::default();
            let mut outs = Vec::new();
            for t0 in (0..len).step_by(3) {
                let n = 3.min(len - t0);
                outs.push(ours.step(&mut st, &frames_of(&x.narrow(2, t0, n)?), None));
            }
            let mut joined = vec![Vec::new(); cout];
            for o in &outs {
                for (c, j) in joined.iter_mut().enumerate() {
                    j.extend_from_slice(o.row(c));
                }
            }
            let dd = max_diff(&joined.concat(), &got.data);
            assert!(dd < 1e-5, "stream {dd}");
        }
        Ok(())
    }

    #[test]
    fn depthwise_upsample_matches_candle() -> Result<()> {
        let (_vm, vb) = random_vb(0);
        let theirs = cconv::ConvTrUpsample1d::new(2, 12, true, true, vb.clone())?;
        let ours = ConvTr1d::load_depthwise(vb, 12, 2)?;
        let x = Tensor::randn(0f32, 1., (1, 12, 11), &Device::Cpu)?;
        let want = theirs.forward(&x)?;
        let got = ours.forward(&frames_of(&x), None);
        let dd = max_diff(&got.data, &frames_of(&want).data);
        assert!(dd < 1e-5, "{dd}");
        Ok(())
    }
}
