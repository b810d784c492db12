//! [`WindowAttention`]: the attention of an offline transformer block (many queries at
//! once) on the CPU in f32, over exactly the keys each query's window holds, heads in
//! parallel, instead of candle's full masked products. Each head runs `attend_head`: with
//! AVX2/FMA (chosen at run time) in phases, each an `avx2` helper (scores, by rows or
//! against the keys transposed; the masked softmax; the weighted sum of values), or the
//! portable `attend_head_generic`.

use super::elementwise::exp_nonpos;
use candle::{CpuStorage, Layout, Result, Shape};

/// `softmax(q k^T + mask) v` for queries at positions `pos..pos + t`, over keys at
/// positions `key_pos` (any order: a ring buffer's old keys, then the new ones): query `p`
/// sees the keys at positions `(p - context, p]`. Inputs, all f32 and contiguous: the new
/// rows `(q, k, v)` stacked (3, b, heads, t, hd), q already scaled; the key and value rings
/// (b, heads, slots, hd), whose first `key_pos.len() - t` slots per head are the old keys
/// (read in place: no copy of the rings per call). Per query it computes only the span of
/// keys it can see (half of the work of the masked product for a pass from position 0), with
/// no (t, n) mask tensor, and the heads run in parallel.
pub struct WindowAttention {
    pos: u64,
    context: u64,
    key_pos: Vec<u64>,
    /// Per query, the first and one-past-last key it sees (`(0, 0)` for none).
    spans: Vec<(usize, usize)>,
}

impl WindowAttention {
    /// The op for `t` queries at positions `pos..pos + t`, each seeing the keys of the last
    /// `context` positions among `key_pos` (the positions of the call's keys, in ring order).
    pub fn new(pos: u64, t: usize, context: usize, key_pos: Vec<u64>) -> Self {
        let mut op = Self {
            pos,
            context: context as u64,
            key_pos,
            spans: Vec::new(),
        };
        op.spans = op.spans(t);
        op
    }

    /// Whether query `i` sees key `j`.
    fn sees(&self, i: usize, j: usize) -> bool {
        let (q, k) = (self.pos + i as u64, self.key_pos[j]);
        k <= q && q - k < self.context
    }

    fn spans(&self, t: usize) -> Vec<(usize, usize)> {
        (0..t)
            .map(|i| {
                let mut seen = (0..self.key_pos.len()).filter(|&j| self.sees(i, j));
                match seen.next() {
                    None => (0, 0),
                    Some(lo) => (lo, seen.next_back().unwrap_or(lo) + 1),
                }
            })
            .collect()
    }
}

/// The keys (or values) of one head, in key order: the ring's `n_old` oldest slots, then
/// the call's new rows; read in place, so a streaming step copies no ring.
#[derive(Clone, Copy)]
struct HeadRows<'a> {
    old: &'a [f32],
    new: &'a [f32],
    hd: usize,
}

impl<'a> HeadRows<'a> {
    fn len(&self) -> usize {
        (self.old.len() + self.new.len()) / self.hd
    }

    #[inline(always)]
    fn row(&self, j: usize) -> &'a [f32] {
        let n_old = self.old.len() / self.hd;
        match j.checked_sub(n_old) {
            None => &self.old[j * self.hd..][..self.hd],
            Some(i) => &self.new[i * self.hd..][..self.hd],
        }
    }

    fn iter(&self) -> impl Iterator<Item = &'a [f32]> {
        let (old, new) = (self.old, self.new);
        old.chunks_exact(self.hd).chain(new.chunks_exact(self.hd))
    }
}

/// `kt` (hd rows of `stride`, zero past the `n` keys) = the keys `k` (n, hd) transposed.
#[inline(always)]
fn transpose_keys(k: HeadRows, hd: usize, stride: usize, kt: &mut Vec<f32>) {
    kt.clear();
    kt.resize(hd * stride, 0.0);
    for (j, row) in k.iter().enumerate() {
        for (d, &x) in row.iter().enumerate() {
            kt[d * stride + j] = x;
        }
    }
}

/// Query `i`'s scores `s` of keys `lo..`, masked (keys its window does not hold, in a ring's
/// order, get -inf) and exponentiated in place; returns 1 / their sum.
#[inline(always)]
fn softmax_span(op: &WindowAttention, i: usize, lo: usize, s: &mut [f32]) -> f32 {
    for (j, sj) in (lo..).zip(s.iter_mut()) {
        if !op.sees(i, j) {
            *sj = f32::NEG_INFINITY;
        }
    }
    softmax_in_place(s)
}

/// `s` exponentiated in place after subtracting its maximum; returns 1 / their sum.
#[inline(always)]
fn softmax_in_place(s: &mut [f32]) -> f32 {
    let max = s.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    s.iter_mut().for_each(|x| *x = exp_nonpos(*x - max));
    let mut lanes = [0f32; 8];
    for c in s.chunks(8) {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l += x;
        }
    }
    1.0 / lanes.iter().sum::<f32>()
}

/// One query `q` (hd, already scaled) over every row of one head's keys `k` and values `v`
/// (n rows of hd each, all visible: a streaming step's ring slots), into `out` (hd):
/// `softmax(q k^T) v`. `scores` holds at least n values. The sums run in a fixed order, so
/// a query's bits depend only on its own row's keys.
pub(crate) fn attend_visible(q: &[f32], k: &[f32], v: &[f32], scores: &mut [f32], out: &mut [f32]) {
    let hd = q.len();
    let n = k.len() / hd;
    let rows = |x| HeadRows {
        old: x,
        new: &[],
        hd,
    };
    let s = &mut scores[..n];
    #[cfg(target_arch = "x86_64")]
    {
        if super::cpu::has(super::cpu::Level::Avx2) {
            // SAFETY: the CPU supports the features the functions were compiled for.
            unsafe { scores_by_eights_avx2(q, k, s) };
            let inv = softmax_in_place(s);
            let w = Weights { lo: 0, s, inv };
            // SAFETY: as above.
            return unsafe { weighted_values_avx2(w, rows(v), out) };
        }
    }
    for (sj, kj) in s.iter_mut().zip(k.chunks_exact(hd)) {
        let mut lanes = [0f32; 8];
        for (qc, kc) in q.chunks(8).zip(kj.chunks(8)) {
            for ((l, &a), &b) in lanes.iter_mut().zip(qc).zip(kc) {
                *l += a * b;
            }
        }
        *sj = lanes.iter().sum();
    }
    let inv = softmax_in_place(s);
    out.fill(0.0);
    for (&w, vj) in s.iter().zip(v.chunks_exact(hd)) {
        for (o, &x) in out.iter_mut().zip(vj) {
            *o += w * x;
        }
    }
    out.iter_mut().for_each(|o| *o *= inv);
}

/// One head's inputs for [`attend_head`]: its queries `q` (t, hd), keys and values.
#[derive(Clone, Copy)]
struct Head<'a> {
    q: &'a [f32],
    k: HeadRows<'a>,
    v: HeadRows<'a>,
    hd: usize,
}

/// A head's scratch, reused across its queries: `kt` for the keys transposed (hd rows),
/// `scores` for one query's scores.
#[derive(Default)]
struct AttentionScratch {
    kt: Vec<f32>,
    scores: Vec<f32>,
}

/// One head of [`WindowAttention`], portable, into `out` (t, hd).
#[inline(always)]
fn attend_head_generic(op: &WindowAttention, h: Head, sc: &mut AttentionScratch, out: &mut [f32]) {
    let Head { q, k, v, hd } = h;
    let AttentionScratch { kt, scores } = sc;
    let n = k.len();
    transpose_keys(k, hd, n, kt);
    scores.resize(n, 0.0);
    for (i, (qi, oi)) in q.chunks_exact(hd).zip(out.chunks_exact_mut(hd)).enumerate() {
        let (lo, hi) = op.spans[i];
        oi.fill(0.0);
        if lo == hi {
            continue;
        }
        // Scores of the span, 8 keys at a time: s[j] += q[d] * kt[d][j].
        let s = &mut scores[lo..hi];
        s.fill(0.0);
        for (d, &qd) in qi.iter().enumerate() {
            for (sj, &kj) in s.iter_mut().zip(&kt[d * n + lo..d * n + hi]) {
                *sj += qd * kj;
            }
        }
        let inv = softmax_span(op, i, lo, s);
        for (&w, vj) in s.iter().zip((lo..hi).map(|j| v.row(j))) {
            for (o, &x) in oi.iter_mut().zip(vj) {
                *o += w * x;
            }
        }
        oi.iter_mut().for_each(|o| *o *= inv);
    }
}

/// [`attend_head_generic`] with AVX2/FMA: 32 scores at a time in registers over the head
/// dimension, and the weighted sum of values in registers, 64 dimensions at a time. Each
/// phase of a query is a helper compiled with the same features (so it can be inlined here).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_head_avx2(
    op: &WindowAttention,
    h: Head,
    sc: &mut AttentionScratch,
    out: &mut [f32],
) {
    let Head { q, k, v, hd } = h;
    let n = k.len();
    // Keys transposed, rows padded so that 32 scores from any multiple of 8 stay inside;
    // for a few queries (a streaming step) transposing costs more than it saves, and each
    // score is a dot product of rows.
    let transposed = q.len() / hd >= 8;
    let np = n.next_multiple_of(8) + 32;
    if transposed {
        transpose_keys(k, hd, np, &mut sc.kt);
    }
    sc.scores.clear();
    sc.scores.resize(np, 0.0);
    for (i, (qi, oi)) in q.chunks_exact(hd).zip(out.chunks_exact_mut(hd)).enumerate() {
        let (lo, hi) = op.spans[i];
        oi.fill(0.0);
        if lo == hi {
            continue;
        }
        if transposed {
            scores_transposed_avx2(qi, sc, np, (lo, hi));
        } else {
            scores_by_rows_avx2(qi, k, (lo, hi), &mut sc.scores);
        }
        let s = &mut sc.scores[lo..hi];
        let inv = softmax_span(op, i, lo, s);
        let weights = Weights { lo, s, inv };
        weighted_values_avx2(weights, v, oi);
    }
}

/// Scores `scores[j]` of query `qi` for the keys `j` of `span`, each a dot product of rows
/// (no transposed keys): 8 dimensions at a time in a register, then the tail.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
#[allow(clippy::needless_range_loop)] // j indexes the keys and the scores alike
unsafe fn scores_by_rows_avx2(qi: &[f32], k: HeadRows, span: (usize, usize), scores: &mut [f32]) {
    use std::arch::x86_64::*;
    let hd = qi.len();
    let (lo, hi) = span;
    for j in lo..hi {
        let kj = k.row(j);
        let (qp, kp) = (qi.as_ptr(), kj.as_ptr());
        let mut acc = _mm256_setzero_ps();
        let mut d = 0;
        while d + 8 <= hd {
            // SAFETY: d + 8 <= hd, within query i and key row j.
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(d)), _mm256_loadu_ps(kp.add(d)), acc);
            d += 8;
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        let tail: f32 = (d..hd).map(|e| qi[e] * kj[e]).sum();
        scores[j] = lanes.iter().sum::<f32>() + tail;
    }
}

/// Scores `scores[j]` of query `q` for every row `j` of `k` (rows of `q.len()`), eight
/// keys at a time: eight dot products in registers, summed across lanes together by
/// horizontal adds; the last keys (and a head size that is not a multiple of 8) one by one.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn scores_by_eights_avx2(q: &[f32], k: &[f32], scores: &mut [f32]) {
    use std::arch::x86_64::*;
    let hd = q.len();
    let n = k.len() / hd;
    let (qp, kp) = (q.as_ptr(), k.as_ptr());
    let mut j0 = 0;
    while hd.is_multiple_of(8) && j0 + 8 <= n {
        let mut acc = [_mm256_setzero_ps(); 8];
        let mut d = 0;
        while d < hd {
            let qv = _mm256_loadu_ps(qp.add(d));
            for (r, a) in acc.iter_mut().enumerate() {
                // SAFETY: key j0 + r < n and d + 8 <= hd: within k.
                *a = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kp.add((j0 + r) * hd + d)), *a);
            }
            d += 8;
        }
        let t0 = _mm256_hadd_ps(
            _mm256_hadd_ps(acc[0], acc[1]),
            _mm256_hadd_ps(acc[2], acc[3]),
        );
        let t1 = _mm256_hadd_ps(
            _mm256_hadd_ps(acc[4], acc[5]),
            _mm256_hadd_ps(acc[6], acc[7]),
        );
        let sums = _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(t0, t1),
            _mm256_permute2f128_ps::<0x31>(t0, t1),
        );
        // SAFETY: j0 + 8 <= n <= scores.len().
        _mm256_storeu_ps(scores.as_mut_ptr().add(j0), sums);
        j0 += 8;
    }
    let rows = HeadRows {
        old: k,
        new: &[],
        hd,
    };
    scores_by_rows_avx2(q, rows, (j0, n), scores);
}

/// Scores `sc.scores[j]` of query `qi` against the keys transposed in `sc.kt` (hd rows of
/// `np`), 32 keys at a time from the multiple of 8 at or below the span's start (the
/// padding of `kt` and `scores` takes the overshoot).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn scores_transposed_avx2(
    qi: &[f32],
    sc: &mut AttentionScratch,
    np: usize,
    span: (usize, usize),
) {
    use std::arch::x86_64::*;
    let (ktp, sp) = (sc.kt.as_ptr(), sc.scores.as_mut_ptr());
    let (lo, hi) = span;
    let mut j0 = lo / 8 * 8;
    while j0 < hi {
        let mut acc = [_mm256_setzero_ps(); 4];
        for (d, &qd) in qi.iter().enumerate() {
            let qv = _mm256_set1_ps(qd);
            // SAFETY: j0 + 32 <= np, and kt has hd rows of np.
            let row = ktp.add(d * np + j0);
            for (r, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(qv, _mm256_loadu_ps(row.add(8 * r)), *a);
            }
        }
        for (r, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(sp.add(j0 + 8 * r), *a);
        }
        j0 += 32;
    }
}

/// A query's softmax weights: `s[j - lo]` for keys `lo..lo + s.len()`, not yet divided by
/// their sum; `inv` is 1 / that sum.
#[derive(Clone, Copy)]
struct Weights<'a> {
    lo: usize,
    s: &'a [f32],
    inv: f32,
}

/// `oi` (hd) = the values `v` weighted by `w`, divided by their sum: 64 dimensions (8
/// registers) at a time, then the rest by lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
#[allow(clippy::needless_range_loop)] // indices mirror the registers
unsafe fn weighted_values_avx2(w: Weights, v: HeadRows, oi: &mut [f32]) {
    use std::arch::x86_64::*;
    let Weights { lo, s, inv } = w;
    let (hd, hi) = (oi.len(), lo + s.len());
    let mut d0 = 0;
    while d0 + 8 <= hd {
        let w8 = ((hd - d0) / 8).min(8);
        let mut acc = [_mm256_setzero_ps(); 8];
        for (j, &w) in (lo..hi).zip(s.iter()) {
            let wv = _mm256_set1_ps(w);
            // SAFETY: d0 + 8 * w8 <= hd, within value row j.
            let row = v.row(j).as_ptr().add(d0);
            for (r, a) in acc.iter_mut().enumerate().take(w8) {
                *a = _mm256_fmadd_ps(wv, _mm256_loadu_ps(row.add(8 * r)), *a);
            }
        }
        let iv = _mm256_set1_ps(inv);
        for (r, a) in acc.iter().enumerate().take(w8) {
            _mm256_storeu_ps(oi.as_mut_ptr().add(d0 + 8 * r), _mm256_mul_ps(*a, iv));
        }
        d0 += 8 * w8;
    }
    for d in d0..hd {
        let dot: f32 = (lo..hi).zip(s.iter()).map(|(j, &w)| w * v.row(j)[d]).sum();
        oi[d] = dot * inv;
    }
}

/// One head of [`WindowAttention`] into `out` (t, hd): [`attend_head_avx2`] where the CPU
/// has AVX2 and FMA, [`attend_head_generic`] elsewhere.
fn attend_head(op: &WindowAttention, h: Head, sc: &mut AttentionScratch, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if super::cpu::has(super::cpu::Level::Avx2) {
            // SAFETY: the CPU supports the features the function was compiled for.
            return unsafe { attend_head_avx2(op, h, sc, out) };
        }
    }
    attend_head_generic(op, h, sc, out)
}

impl WindowAttention {
    /// `(b, h, t, hd)` of a call's stacked new rows `l1` and `(slots, n_old)` of its rings
    /// `l2`, `l3`, once they agree with each other and with the keys the op was built for.
    fn dims(&self, l1: &Layout, l2: &Layout, l3: &Layout) -> Result<([usize; 4], usize, usize)> {
        let (three, b, h, t, hd) = l1.shape().dims5()?;
        let (b2, h2, slots, hd2) = l2.shape().dims4()?;
        let n_old = self.key_pos.len().checked_sub(t);
        let fits = n_old.is_some_and(|n_old| n_old <= slots);
        if three != 3 || (b2, h2, hd2) != (b, h, hd) || l3.shape() != l2.shape() || !fits {
            candle::bail!(
                "mimi-window-attention: shapes {:?} {:?} for {} keys",
                l1.shape(),
                l2.shape(),
                self.key_pos.len()
            )
        }
        Ok(([b, h, t, hd], slots, n_old.unwrap_or(0)))
    }
}

impl candle::CustomOp3 for WindowAttention {
    fn name(&self) -> &'static str {
        "mimi-window-attention"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let ([b, h, t, hd], slots, n_old) = self.dims(l1, l2, l3)?;
        let (CpuStorage::F32(new), CpuStorage::F32(k), CpuStorage::F32(v)) = (s1, s2, s3) else {
            candle::bail!("mimi-window-attention: f32 only")
        };
        let offsets = (
            l1.contiguous_offsets(),
            l2.contiguous_offsets(),
            l3.contiguous_offsets(),
        );
        let (Some((na, nb)), Some((ka, kb)), Some((va, vb))) = offsets else {
            candle::bail!("mimi-window-attention: contiguous inputs only")
        };
        if t != self.spans.len() {
            candle::bail!(
                "mimi-window-attention: {t} queries, built for {}",
                self.spans.len()
            )
        }
        let (new, k, v) = (&new[na..nb], &k[ka..kb], &v[va..vb]);
        let (q, knew, vnew) = (
            &new[..b * h * t * hd],
            &new[b * h * t * hd..2 * b * h * t * hd],
            &new[2 * b * h * t * hd..],
        );
        let mut out = vec![0f32; b * h * t * hd];
        let head = |(i, o): (usize, &mut [f32])| {
            let (qs, ring) = (t * hd, slots * hd);
            let k = HeadRows {
                old: &k[i * ring..][..n_old * hd],
                new: &knew[i * qs..][..qs],
                hd,
            };
            let v = HeadRows {
                old: &v[i * ring..][..n_old * hd],
                new: &vnew[i * qs..][..qs],
                hd,
            };
            let q = &q[i * qs..][..qs];
            attend_head(
                self,
                Head { q, k, v, hd },
                &mut AttentionScratch::default(),
                o,
            );
        };
        if b * h > 1 && rayon::current_num_threads() > 1 {
            super::for_each_chunk_mut(&mut out, t * hd, |i, o| head((i, o)));
        } else {
            out.chunks_mut(t * hd).enumerate().for_each(head);
        }
        Ok((CpuStorage::F32(out), Shape::from((b, h, t, hd))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle::{Device, Tensor};

    /// One call: queries at `pos..pos + t` of head size `hd`, windows of `context`, keys at
    /// `key_pos` (in ring order: the `key_pos.len() - t` old ones first).
    struct Case {
        pos: u64,
        t: usize,
        context: usize,
        key_pos: Vec<u64>,
        hd: usize,
    }

    /// A case's queries, keys and values, (2, 3, t or n, hd) each.
    struct Qkv {
        q: Tensor,
        k: Tensor,
        v: Tensor,
    }

    fn rows(x: &Tensor) -> Vec<Vec<f32>> {
        x.flatten_to(2).unwrap().to_vec2::<f32>().unwrap()
    }

    /// candle's masked softmax product (NaN for a query that sees no key).
    fn candle_reference(c: &Case, x: &Qkv) -> Vec<Vec<f32>> {
        let (pos, context) = (c.pos, c.context);
        let mask: Vec<f32> = (0..c.t as u64)
            .flat_map(|i| {
                c.key_pos.iter().map(move |&kp| {
                    let p = pos + i;
                    if kp <= p && p - kp < context as u64 {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    }
                })
            })
            .collect();
        let mask = Tensor::from_vec(mask, (c.t, c.key_pos.len()), &Device::Cpu).unwrap();
        let scores =
            x.q.matmul(&x.k.t().unwrap())
                .unwrap()
                .broadcast_add(&mask)
                .unwrap();
        rows(
            &candle_nn::ops::softmax_last_dim(&scores)
                .unwrap()
                .matmul(&x.v)
                .unwrap(),
        )
    }

    /// The op as a block calls it: the old keys read from rings with spare slots (which must
    /// not be read: NaN), the new ones from the stacked (q, k, v).
    fn run_op(c: &Case, x: &Qkv, op: &WindowAttention) -> Vec<Vec<f32>> {
        let n_old = c.key_pos.len() - c.t;
        let ring = |x: &Tensor| {
            let spare = (x.narrow(2, 0, n_old.min(1)).unwrap() * f64::NAN).unwrap();
            Tensor::cat(&[&x.narrow(2, 0, n_old).unwrap(), &spare], 2).unwrap()
        };
        let new = |x: &Tensor| x.narrow(2, n_old, c.t).unwrap();
        let stacked = Tensor::stack(&[&x.q, &new(&x.k), &new(&x.v)], 0).unwrap();
        rows(
            &stacked
                .apply_op3_no_bwd(&ring(&x.k), &ring(&x.v), op)
                .unwrap(),
        )
    }

    /// The portable fallback, head by head, computes the same as the op's rows `got`.
    fn check_generic(c: &Case, x: &Qkv, op: &WindowAttention, got: &[Vec<f32>]) {
        let (t, hd, pos) = (c.t, c.hd, c.pos);
        let n = c.key_pos.len();
        let n_old = n - t;
        let (qf, kf, vf) = (
            rows(&x.q).concat(),
            rows(&x.k).concat(),
            rows(&x.v).concat(),
        );
        for h in 0..6 {
            let mut o = vec![0f32; t * hd];
            fn split(x: &[f32], at: usize, hd: usize) -> HeadRows<'_> {
                let (old, new) = x.split_at(at * hd);
                HeadRows { old, new, hd }
            }
            let (kh, vh) = (&kf[h * n * hd..][..n * hd], &vf[h * n * hd..][..n * hd]);
            let q = &qf[h * t * hd..][..t * hd];
            let (k, v) = (split(kh, n_old, hd), split(vh, n_old, hd));
            let head = Head { q, k, v, hd };
            attend_head_generic(op, head, &mut AttentionScratch::default(), &mut o);
            for (a, b) in o.iter().zip(got[h * t..(h + 1) * t].concat()) {
                assert!(
                    (a - b).abs() <= 1e-5,
                    "generic, hd {hd} pos {pos}: {a} vs {b}"
                );
            }
        }
    }

    /// The window kernel against candle's masked softmax product, on odd head sizes (the
    /// register blocks' remainders), keys in ring order, and queries that see no key.
    #[test]
    fn window_attention_matches_candle_masked_softmax() {
        let input = |seed, shape: (usize, usize, usize, usize)| {
            let (a, b, c, d) = shape;
            let data = crate::testutil::test_input(a * b, c, d, seed);
            Tensor::from_vec(data, shape, &Device::Cpu).unwrap()
        };
        // (pos, t, context, key positions): a fresh pass; a ring of 5 old keys (slot order)
        // then 7 new ones; keys a query cannot see at all.
        let cases: [(u64, usize, usize, Vec<u64>); 3] = [
            (0, 37, 250, (0..37).collect()),
            (12, 7, 5, vec![10, 11, 7, 8, 9, 12, 13, 14, 15, 16, 17, 18]),
            (100, 3, 2, vec![1, 2, 100, 101, 102]),
        ];
        for hd in [5, 13, 64, 72] {
            for (pos, t, context, key_pos) in cases.iter().cloned() {
                let n = key_pos.len();
                let x = Qkv {
                    q: input(1, (2, 3, t, hd)),
                    k: input(2, (2, 3, n, hd)),
                    v: input(3, (2, 3, n, hd)),
                };
                let c = Case {
                    pos,
                    t,
                    context,
                    key_pos,
                    hd,
                };
                let want = candle_reference(&c, &x);
                let op = WindowAttention::new(pos, t, context, c.key_pos.clone());
                let got4 = run_op(&c, &x, &op);
                check_generic(&c, &x, &op, &got4);
                // Queries that see no key: zeros (candle gives NaN there).
                for (row, (g, w)) in got4.iter().zip(&want).enumerate() {
                    for (a, b) in g.iter().zip(w) {
                        let ok = if b.is_nan() {
                            *a == 0.0
                        } else {
                            (a - b).abs() <= 1e-5
                        };
                        assert!(ok, "hd {hd} pos {pos} row {row}: {a} vs {b}");
                    }
                }
            }
        }
    }

    /// A streaming step's attention over every visible ring slot against a plain softmax
    /// in f64: eight keys at a time and the remainders (n not a multiple of 8, head sizes
    /// that are not multiples of 8).
    #[test]
    fn attend_visible_matches_a_plain_softmax() {
        for (n, hd) in [
            (1, 64),
            (7, 64),
            (8, 64),
            (13, 64),
            (250, 64),
            (9, 12),
            (17, 5),
        ] {
            let val = |i: usize, s: u64| ((i as u64 * 2654435761 + s) % 1000) as f32 / 500.0 - 1.0;
            let q: Vec<f32> = (0..hd).map(|i| val(i, 1)).collect();
            let k: Vec<f32> = (0..n * hd).map(|i| val(i, 2)).collect();
            let v: Vec<f32> = (0..n * hd).map(|i| val(i, 3)).collect();
            let (mut scores, mut out) = (vec![0f32; n], vec![0f32; hd]);
            attend_visible(&q, &k, &v, &mut scores, &mut out);
            let s: Vec<f64> = (k.chunks(hd))
                .map(|kj| kj.iter().zip(&q).map(|(&a, &b)| a as f64 * b as f64).sum())
                .collect();
            let max = s.iter().cloned().fold(f64::MIN, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
            let total: f64 = e.iter().sum();
            for d in 0..hd {
                let want: f64 = (0..n).map(|j| e[j] * v[j * hd + d] as f64).sum::<f64>() / total;
                let diff = (out[d] as f64 - want).abs();
                assert!(diff < 1e-5, "n={n} hd={hd} d={d}: {} vs {want}", out[d]);
            }
        }
    }
}
