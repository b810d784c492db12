//! A direct (im2col-free) convolution microkernel for stride-1 layers, with AVX-512.
//!
//! The SEANet residual blocks are stride-1 convolutions with few channels (32–512) at high
//! frame rates. Through `gemm` they cost an im2col copy of the input (`cin * k` rows) plus
//! `gemm`'s packing of both operands, which on these small `K` took about as long as the
//! multiply-adds themselves (profile in benches/README.md). This kernel reads the input rows
//! in place instead: a block of 4 output channels x 64 frames lives in 16 AVX-512
//! accumulators, each weight is broadcast once per block, and each input vector feeds 4 FMAs.
//! Bias and a residual are added when the block is stored.
//!
//! It is used only where the CPU has AVX-512F (chosen at run time); elsewhere the tiled-GEMM
//! path of [`crate::conv`] runs, unchanged. Tests compare both on odd shapes.

/// Output channels per register block: 6 x 64 frames = 24 of the 32 AVX-512 registers.
/// Each (input channel, tap) step loads 4 input vectors (which straddle cache lines for the
/// taps past the first) and 6 broadcast weights for 24 FMAs; with 4 channels, 8 loads fed
/// only 16 FMAs and the load ports, not the FMA units, set the pace.
const ROWS: usize = 6;

/// The largest `cin * k` for which stride-1 layers use this kernel. Measured per layer with
/// `src/bin/mimi_kernel_bench.rs` (1 thread, 1 s of audio, best of 30, against
/// `MIMI_PY_DIRECT_CONV=0`), with 6 output channels per block: 64 -> 32, k 3 76 against
/// 61 GFLOP/s; 128 -> 64 110 against 79; 256 -> 128 86-128 against 105-107; 512 -> 256
/// (1536) 81-117 against 125, so `gemm` there. Isolated, 2048 frames: 136-161 GFLOP/s up to
/// 256 -> 128, where 4 channels per block (until 2026-12) gave 93-134.
pub const MAX_DIRECT_K: usize = 768;

/// Whether this CPU runs the AVX-512 kernel (`MIMI_PY_DIRECT_CONV=0` turns it off, to
/// compare the two paths).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AVX512: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AVX512.get_or_init(|| {
            crate::runtime::settings::get().direct_conv
                && super::cpu::has(super::cpu::Level::Avx512)
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// A stride-1 convolution's operands for [`conv`]: `x` holds `cin` rows of row stride
/// `x_rs`, already padded and activated; `w` is `(cout, cin * k)` row-major.
pub struct Direct<'a> {
    pub w: &'a [f32],
    pub cout: usize,
    pub cin: usize,
    pub k: usize,
    pub dilation: usize,
    pub bias: Option<&'a [f32]>,
}

/// `out[co * out_rs + t] = bias[co] + sum_{ci, j} w[co, ci * k + j] * x[ci * x_rs + t0 + t +
/// j * dilation] (+ add[co * add_rs + t])` for `t < tn`, `co < cout`.
///
/// # Safety
/// [`available`] must be true. `x` must hold `cin` rows of stride `x_rs`, each readable up to
/// `t0 + tn + (k - 1) * dilation`; `out` (and `add`) must hold `cout` rows of their strides,
/// `tn` long; no other thread may write those parts of `out`.
#[allow(clippy::too_many_arguments)]
#[cfg(target_arch = "x86_64")]
pub unsafe fn conv(
    p: &Direct,
    x: *const f32,
    x_rs: usize,
    t0: usize,
    tn: usize,
    out: *mut f32,
    out_rs: usize,
    add: Option<(*const f32, usize)>,
) {
    debug_assert!(available() && p.w.len() >= p.cout * p.cin * p.k);
    if crate::runtime::profile::products_skipped() {
        return;
    }
    // Each block of 64 frames is first copied into a small contiguous buffer: rows of the
    // input are far apart (often a multiple of 4 KB), and read in place they evict each other
    // from the L1 cache; packed, the block stays in cache for every group of output channels.
    let span = 64 + (p.k - 1) * p.dilation;
    let xs = span.next_multiple_of(16);
    // Kept for the thread's next call: a step allocates none.
    super::with_scratch(&PACKED, |packed| {
        packed.resize(p.cin * xs, 0.0);
        let mut t = 0;
        while t < tn {
            let n = (tn - t).min(64);
            let have = n + (p.k - 1) * p.dilation;
            for ci in 0..p.cin {
                let src = std::slice::from_raw_parts(x.add(ci * x_rs + t0 + t), have);
                packed[ci * xs..ci * xs + have].copy_from_slice(src);
            }
            let mut co = 0;
            while co < p.cout {
                let r = (p.cout - co).min(ROWS);
                let blk = Block {
                    co,
                    t,
                    n,
                    x: packed.as_ptr(),
                    x_rs: xs,
                    out,
                    out_rs,
                    add,
                };
                match r {
                    6 => block::<6>(p, &blk),
                    5 => block::<5>(p, &blk),
                    4 => block::<4>(p, &blk),
                    3 => block::<3>(p, &blk),
                    2 => block::<2>(p, &blk),
                    _ => block::<1>(p, &blk),
                }
                co += r;
            }
            t += n;
        }
    })
}

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// Each thread's packed input block of [`conv`], kept between calls
    /// ([`super::with_scratch`]).
    static PACKED: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Fallback for other architectures: never called, since [`available`] is false there.
#[allow(clippy::too_many_arguments)]
#[cfg(not(target_arch = "x86_64"))]
pub unsafe fn conv(
    _: &Direct,
    _: *const f32,
    _: usize,
    _: usize,
    _: usize,
    _: *mut f32,
    _: usize,
    _: Option<(*const f32, usize)>,
) {
    unreachable!("the direct kernel needs AVX-512")
}

/// One block: output channels `co .. co + R`, frames `t .. t + n` (n <= 64) of the output;
/// `x` is the packed input block of those frames (row stride `x_rs`).
#[cfg(target_arch = "x86_64")]
struct Block {
    co: usize,
    t: usize,
    n: usize,
    x: *const f32,
    x_rs: usize,
    out: *mut f32,
    out_rs: usize,
    add: Option<(*const f32, usize)>,
}

#[allow(clippy::needless_range_loop)] // register-indexed loops mirror the accumulators
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn block<const R: usize>(p: &Direct, b: &Block) {
    use std::arch::x86_64::*;
    // Lane masks of the 4 vectors of 16 frames (all ones in a full block).
    let masks: [__mmask16; 4] = std::array::from_fn(|v| {
        let lanes = b.n.saturating_sub(16 * v).min(16);
        ((1u32 << lanes) - 1) as __mmask16
    });
    let full = b.n == 64;
    let kk = p.cin * p.k;
    let w = p.w.as_ptr().add(b.co * kk);
    let mut acc = [[_mm512_setzero_ps(); 4]; R];
    for ci in 0..p.cin {
        let xr = b.x.add(ci * b.x_rs);
        let wr = w.add(ci * p.k);
        for j in 0..p.k {
            let xp = xr.add(j * p.dilation);
            let xv: [__m512; 4] = if full {
                std::array::from_fn(|v| _mm512_loadu_ps(xp.add(16 * v)))
            } else {
                std::array::from_fn(|v| _mm512_maskz_loadu_ps(masks[v], xp.add(16 * v)))
            };
            for r in 0..R {
                let wv = _mm512_set1_ps(*wr.add(r * kk + j));
                for v in 0..4 {
                    acc[r][v] = _mm512_fmadd_ps(wv, xv[v], acc[r][v]);
                }
            }
        }
    }
    for r in 0..R {
        let co = b.co + r;
        let bias = _mm512_set1_ps(p.bias.map_or(0.0, |bs| bs[co]));
        let dst = b.out.add(co * b.out_rs + b.t);
        for v in 0..4 {
            if masks[v] == 0 {
                break;
            }
            let mut y = _mm512_add_ps(acc[r][v], bias);
            if let Some((a, a_rs)) = b.add {
                y = _mm512_add_ps(
                    y,
                    _mm512_maskz_loadu_ps(masks[v], a.add(co * a_rs + b.t + 16 * v)),
                );
            }
            _mm512_mask_storeu_ps(dst.add(16 * v), masks[v], y);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The direct kernel against the plain sum, on odd shapes: channel counts that are not
    /// multiples of 4, frame counts that are not multiples of 16 or 64, dilation, strided
    /// rows, bias and residual.
    #[test]
    #[cfg_attr(
        not(mimi_cpu_avx512),
        ignore = "no AVX-512 on this CPU: the kernel never runs"
    )]
    fn direct_conv_matches_the_definition() {
        assert!(
            available(),
            "the direct kernel is off here (MIMI_PY_DIRECT_CONV=0, MIMI_PY_ISA below avx512, \
             or a test build from a machine with AVX-512)"
        );
        let mut seed = 1u64;
        let mut rnd = move || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        };
        for &(cin, cout, k, d, tn, t0) in &[
            (1, 1, 1, 1, 1, 0),
            (3, 5, 3, 1, 17, 2),
            (8, 7, 3, 2, 64, 0),
            (5, 9, 7, 3, 130, 5),
            (32, 64, 1, 1, 100, 0),
            (64, 32, 3, 1, 257, 1),
        ] {
            let x_rs = t0 + tn + (k - 1) * d + 3;
            let x: Vec<f32> = (0..cin * x_rs).map(|_| rnd()).collect();
            let w: Vec<f32> = (0..cout * cin * k).map(|_| rnd()).collect();
            let bias: Vec<f32> = (0..cout).map(|_| rnd()).collect();
            let out_rs = tn + 2;
            let add: Vec<f32> = (0..cout * out_rs).map(|_| rnd()).collect();
            let mut out = vec![f32::NAN; cout * out_rs];
            let p = Direct {
                w: &w,
                cout,
                cin,
                k,
                dilation: d,
                bias: Some(&bias),
            };
            // SAFETY: AVX-512 is available; the buffers cover the extents described.
            unsafe {
                conv(
                    &p,
                    x.as_ptr(),
                    x_rs,
                    t0,
                    tn,
                    out.as_mut_ptr(),
                    out_rs,
                    Some((add.as_ptr(), out_rs)),
                )
            };
            for co in 0..cout {
                for t in 0..tn {
                    let mut s = bias[co] + add[co * out_rs + t];
                    for ci in 0..cin {
                        for j in 0..k {
                            s += w[co * cin * k + ci * k + j] * x[ci * x_rs + t0 + t + j * d];
                        }
                    }
                    let got = out[co * out_rs + t];
                    assert!(
                        (got - s).abs() < 1e-4,
                        "{cin} {cout} {k} {d} {tn}: {got} vs {s}"
                    );
                }
                // Nothing written past the block.
                assert!(out[co * out_rs + tn].is_nan());
            }
        }
    }
}
