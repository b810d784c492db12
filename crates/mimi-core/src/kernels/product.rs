//! [`product`]: the convolutions' matrix product `dst (m, n) (+)= lhs (m, k) . rhs (k, n)`
//! on one thread, register-tiled, with every row stride given: `lhs` is a layer's weights
//! (output channels x depth), `rhs` a tile's im2col columns or its phase-split input (depth
//! x frames), `dst` the output channels x frames. It replaces the `gemm` crate on x86-64
//! with AVX2 + FMA or AVX-512, where `gemm` allocated its packing buffers on every call.
//!
//! Each block of up to [`PANEL_COLS`] columns of `rhs` is copied once into a thread's panel
//! (depth x width, contiguous, zero past `n`), and every block of output rows reads it from
//! there: one vector load per panel vector and depth step, one broadcast per output row,
//! `rows x vectors` accumulators in registers (as [`Packed`](super::Packed) does with its
//! weights). Every output element is one chain of fused multiply-adds over `i = 0..k` in
//! order, from zero, then (`acc`) added to `dst`: its bits depend only on its own row of
//! `lhs` and column of `rhs`, not on the shape of the call, the block it fell in, or the
//! instruction set. A streaming step's tiles and an offline call's get the same bits.

use std::cell::Cell;

/// Columns of `rhs` per panel (two AVX-512 vectors, four AVX2 ones).
pub const PANEL_COLS: usize = 32;

thread_local! {
    /// This thread's panel, kept between calls (a warm call allocates nothing).
    static PANEL: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// The instruction set a product runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Isa {
    Avx512,
    Avx2,
}

fn isa() -> Option<Isa> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            return Some(Isa::Avx512);
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            return Some(Isa::Avx2);
        }
    }
    None
}

/// Whether this CPU has a [`product`] kernel (elsewhere the caller keeps `gemm`).
pub fn available() -> bool {
    isa().is_some()
}

/// The operands of one call; row strides in elements, every column stride 1.
#[derive(Clone, Copy)]
pub struct Operands {
    pub dst: *mut f32,
    pub dst_rs: usize,
    /// Add the product to `dst` instead of overwriting it.
    pub acc: bool,
    pub lhs: *const f32,
    pub lhs_rs: usize,
    pub rhs: *const f32,
    pub rhs_rs: usize,
}

/// `dst (m, n) (+)= lhs (m, k) . rhs (k, n)` (see the module doc), on this thread.
///
/// # Safety
/// [`available`] is true; the pointers cover the strided extents described, and `dst`
/// overlaps neither operand.
pub unsafe fn product((m, n, k): (usize, usize, usize), ops: Operands) {
    let Some(isa) = isa() else {
        panic!("kernels::product needs AVX2 + FMA or AVX-512 (check `available`)");
    };
    super::with_scratch(&PANEL, |panel| {
        if panel.len() < k * PANEL_COLS {
            panel.resize(k * PANEL_COLS, 0.0);
        }
        let mut c0 = 0;
        while c0 < n {
            let cw = PANEL_COLS.min(n - c0);
            fill_panel(
                &mut panel[..k * PANEL_COLS],
                ops.rhs.add(c0),
                ops.rhs_rs,
                cw,
            );
            let block = Operands {
                dst: ops.dst.add(c0),
                ..ops
            };
            rows(isa, m, k, cw, panel.as_ptr(), block);
            c0 += cw;
        }
    })
}

/// Copies columns `0..cw` of `k` rows of `rhs` (row stride `rs`) into `panel`, zero past `cw`.
///
/// SAFETY: `rhs` covers `k` rows of `cw` columns at stride `rs`.
unsafe fn fill_panel(panel: &mut [f32], rhs: *const f32, rs: usize, cw: usize) {
    for (i, row) in panel.chunks_exact_mut(PANEL_COLS).enumerate() {
        row[..cw].copy_from_slice(std::slice::from_raw_parts(rhs.add(i * rs), cw));
        row[cw..].fill(0.0);
    }
}

/// All output rows against one panel of `cw` columns, in register tiles of rows.
///
/// SAFETY: as [`product`], with `ops.dst` at the panel's first column.
unsafe fn rows(isa: Isa, m: usize, k: usize, cw: usize, panel: *const f32, ops: Operands) {
    let tile = match isa {
        Isa::Avx512 => 8,
        Isa::Avx2 => 3,
    };
    let mut r0 = 0;
    while r0 < m {
        let mr = tile.min(m - r0);
        let o = Operands {
            dst: ops.dst.add(r0 * ops.dst_rs),
            lhs: ops.lhs.add(r0 * ops.lhs_rs),
            ..ops
        };
        macro_rules! go {
            ($m:ident) => {
                match mr {
                    1 => $m::tile::<1>(k, cw, panel, o),
                    2 => $m::tile::<2>(k, cw, panel, o),
                    3 => $m::tile::<3>(k, cw, panel, o),
                    4 => $m::tile::<4>(k, cw, panel, o),
                    5 => $m::tile::<5>(k, cw, panel, o),
                    6 => $m::tile::<6>(k, cw, panel, o),
                    7 => $m::tile::<7>(k, cw, panel, o),
                    _ => $m::tile::<8>(k, cw, panel, o),
                }
            };
        }
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => go!(avx512),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => go!(avx2),
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!("no product kernel off x86-64"),
        }
        r0 += mr;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Operands, PANEL_COLS};
    use std::arch::x86_64::*;

    const V: usize = PANEL_COLS / 16;

    /// `M` output rows x one panel: `M x 2` accumulators.
    #[allow(clippy::needless_range_loop)] // indexed loops mirror the registers
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile<const M: usize>(k: usize, cw: usize, p: *const f32, o: Operands) {
        let mut acc = [[_mm512_setzero_ps(); V]; M];
        for i in 0..k {
            let b: [__m512; V] =
                std::array::from_fn(|v| _mm512_loadu_ps(p.add(i * PANEL_COLS + 16 * v)));
            for r in 0..M {
                let a = _mm512_set1_ps(*o.lhs.add(r * o.lhs_rs + i));
                for v in 0..V {
                    acc[r][v] = _mm512_fmadd_ps(a, b[v], acc[r][v]);
                }
            }
        }
        for v in 0..V {
            let lanes = cw.saturating_sub(16 * v).min(16);
            if lanes == 0 {
                break;
            }
            let mask: __mmask16 = (((1u32 << lanes) - 1) & 0xffff) as u16;
            for r in 0..M {
                let d = o.dst.add(r * o.dst_rs + 16 * v);
                let mut s = acc[r][v];
                if o.acc {
                    s = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, d), s);
                }
                _mm512_mask_storeu_ps(d, mask, s);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Operands, PANEL_COLS};
    use std::arch::x86_64::*;

    const V: usize = PANEL_COLS / 8;

    /// `M` (at most 3) output rows x one panel: `M x 4` accumulators, `M` broadcasts and one
    /// panel vector at a time, AVX2's 16 registers.
    #[allow(clippy::needless_range_loop)] // indexed loops mirror the registers
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile<const M: usize>(k: usize, cw: usize, p: *const f32, o: Operands) {
        let mut acc = [[_mm256_setzero_ps(); V]; M];
        for i in 0..k {
            let a: [__m256; M] =
                std::array::from_fn(|r| _mm256_set1_ps(*o.lhs.add(r * o.lhs_rs + i)));
            for v in 0..V {
                let b = _mm256_loadu_ps(p.add(i * PANEL_COLS + 8 * v));
                for r in 0..M {
                    acc[r][v] = _mm256_fmadd_ps(a[r], b, acc[r][v]);
                }
            }
        }
        for r in 0..M {
            let mut lanes = [0f32; PANEL_COLS];
            for v in 0..V {
                _mm256_storeu_ps(lanes.as_mut_ptr().add(8 * v), acc[r][v]);
            }
            let d = o.dst.add(r * o.dst_rs);
            for (c, &s) in lanes.iter().enumerate().take(cw) {
                // The same rounding as a vector add of `dst` and the sum.
                *d.add(c) = if o.acc { *d.add(c) + s } else { s };
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// Each output element as one fused chain over the depth, in order, then `+ dst`.
    fn reference(
        lhs: &[f32],
        rhs: &[f32],
        dst: &[f32],
        (m, n, k): (usize, usize, usize),
        acc: bool,
    ) -> Vec<f32> {
        let mut out = dst.to_vec();
        for r in 0..m {
            for c in 0..n {
                let s = (0..k).fold(0f32, |s, i| lhs[r * k + i].mul_add(rhs[i * n + c], s));
                out[r * n + c] = if acc { dst[r * n + c] + s } else { s };
            }
        }
        out
    }

    fn values(len: usize, seed: u32) -> Vec<f32> {
        (0..len)
            .map(|i| {
                ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 2001) as f32 / 1000.0
                    - 1.0
            })
            .collect()
    }

    #[test]
    fn product_is_the_fused_chain_on_every_shape_and_isa() {
        for isa in [Isa::Avx512, Isa::Avx2] {
            let ok = match isa {
                Isa::Avx512 => std::is_x86_feature_detected!("avx512f"),
                Isa::Avx2 => {
                    std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
                }
            };
            if !ok {
                continue;
            }
            for &(m, n, k) in &[
                (1, 1, 1),
                (3, 17, 5),
                (8, 32, 64),
                (13, 70, 300),
                (17, 33, 700),
            ] {
                for acc in [false, true] {
                    let (lhs, rhs, dst0) = (values(m * k, 1), values(k * n, 2), values(m * n, 3));
                    let mut dst = dst0.clone();
                    let ops = Operands {
                        dst: dst.as_mut_ptr(),
                        dst_rs: n,
                        acc,
                        lhs: lhs.as_ptr(),
                        lhs_rs: k,
                        rhs: rhs.as_ptr(),
                        rhs_rs: n,
                    };
                    // SAFETY: the buffers have these shapes; `isa` runs on this CPU.
                    unsafe {
                        let mut c0 = 0;
                        let mut panel = vec![0f32; k * PANEL_COLS];
                        while c0 < n {
                            let cw = PANEL_COLS.min(n - c0);
                            fill_panel(&mut panel, rhs.as_ptr().add(c0), n, cw);
                            rows(
                                isa,
                                m,
                                k,
                                cw,
                                panel.as_ptr(),
                                Operands {
                                    dst: ops.dst.add(c0),
                                    ..ops
                                },
                            );
                            c0 += cw;
                        }
                    }
                    let want = reference(&lhs, &rhs, &dst0, (m, n, k), acc);
                    let same = dst
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{isa:?} (m, n, k) = {:?}, acc {acc}", (m, n, k));
                }
            }
        }
    }

    #[test]
    fn a_column_keeps_its_bits_in_any_block() {
        if !available() {
            return;
        }
        let (m, n, k) = (9, 75, 40);
        let (lhs, rhs) = (values(m * k, 4), values(k * n, 5));
        let mut whole = vec![0f32; m * n];
        let mut parts = vec![0f32; m * n];
        let ops = |dst: *mut f32, c0: usize| Operands {
            dst,
            dst_rs: n,
            acc: false,
            lhs: lhs.as_ptr(),
            lhs_rs: k,
            rhs: unsafe { rhs.as_ptr().add(c0) },
            rhs_rs: n,
        };
        // SAFETY: the buffers have these shapes.
        unsafe {
            product((m, n, k), ops(whole.as_mut_ptr(), 0));
            for (c0, w) in [(0, 5), (5, 40), (45, 30)] {
                product((m, w, k), ops(parts.as_mut_ptr().add(c0), c0));
            }
        }
        assert!(whole
            .iter()
            .zip(&parts)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}
