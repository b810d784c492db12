//! [`product`]: the convolutions' matrix product `dst (m, n) (+)= lhs (m, k) . rhs (k, n)`
//! on one thread, register-tiled, with every row stride given: `lhs` is a layer's weights
//! (output channels x depth), `rhs` a tile's im2col columns or its phase-split input (depth
//! x frames), `dst` the output channels x frames. It replaces the `gemm` crate on x86-64
//! with AVX2 + FMA or AVX-512, where `gemm` allocated its packing buffers on every call.
//!
//! The depth is cut into chunks whose slice of `lhs` stays in L2 ([`depth_chunk`]); each
//! chunk's block of up to [`PANEL_COLS`] columns of `rhs` is copied once into a thread's panel
//! (depth x width, contiguous, zero past `n`), and every block of output rows reads it from
//! there: one vector load per panel vector and depth step, one broadcast per output row,
//! `rows x vectors` accumulators in registers (as [`Packed`](super::Packed) does with its
//! weights), stored to `dst` and loaded again by the next chunk (exact: they are f32).
//! Every output element is one chain of fused multiply-adds over `i = 0..k` in order, from
//! zero (or, `acc`, from `dst`): its bits depend only on its own row of `lhs`, column of
//! `rhs` and starting value, not on the shape of the call, the block or chunk it fell in, or
//! the instruction set. A streaming step's tiles and an offline call's get the same bits,
//! and a product accumulated in parts (a phase-split convolution's taps) is the one chain.

use std::cell::Cell;

/// Columns of `rhs` per panel (two AVX-512 vectors, four AVX2 ones).
pub const PANEL_COLS: usize = 32;

thread_local! {
    /// This thread's panel of columns, kept between calls (a warm call allocates nothing).
    static PANEL: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    /// This thread's packed rows of `lhs`, kept likewise.
    static BLOCKS: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
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

/// Depth steps per chunk for `m` output rows: their packed slice of `lhs` about 512 KB, so
/// that it stays in L2 while every panel of columns passes it; 128 to 512 steps.
fn depth_chunk(m: usize) -> usize {
    ((1usize << 17) / m.max(1)).clamp(128, 512)
}

/// Output rows per register tile (and per block of the packed `lhs`).
fn tile_rows(isa: Isa) -> usize {
    match isa {
        Isa::Avx512 => avx512::ROWS,
        Isa::Avx2 => avx2::ROWS,
    }
}

/// `dst (m, n) (+)= lhs (m, k) . rhs (k, n)` (see the module doc), on this thread.
///
/// # Safety
/// [`available`] is true; the pointers cover the strided extents described, and `dst`
/// overlaps neither operand.
pub unsafe fn product(dims: (usize, usize, usize), ops: Operands) {
    let Some(isa) = isa() else {
        panic!("kernels::product needs AVX2 + FMA or AVX-512 (check `available`)");
    };
    product_on(isa, dims, ops)
}

/// [`product`] with `isa`, which must run on this CPU.
unsafe fn product_on(isa: Isa, (m, n, k): (usize, usize, usize), ops: Operands) {
    let (mr, kc) = (tile_rows(isa), depth_chunk(m).min(k));
    let packed_rows = m.div_ceil(mr) * mr;
    super::with_scratch(&PANEL, |panel| {
        super::with_scratch(&BLOCKS, |blocks| {
            if panel.len() < kc * PANEL_COLS {
                panel.resize(kc * PANEL_COLS, 0.0);
            }
            if blocks.len() < packed_rows * kc {
                blocks.resize(packed_rows * kc, 0.0);
            }
            let mut k0 = 0;
            loop {
                let kb = kc.min(k - k0);
                let blocks = &mut blocks[..packed_rows * kb];
                pack_rows(blocks, ops.lhs.add(k0), ops.lhs_rs, (m, kb, mr));
                let out = Out {
                    acc: ops.acc || k0 > 0,
                    ..Out::of(&ops)
                };
                let rhs = ops.rhs.add(k0 * ops.rhs_rs);
                let mut c0 = 0;
                while c0 < n {
                    let cw = PANEL_COLS.min(n - c0);
                    let panel = &mut panel[..kb * PANEL_COLS];
                    fill_panel(panel, rhs.add(c0), ops.rhs_rs, cw);
                    let out = Out {
                        dst: out.dst.add(c0),
                        ..out
                    };
                    rows(isa, (m, kb, cw), panel.as_ptr(), blocks.as_ptr(), out);
                    c0 += cw;
                }
                k0 += kb;
                if k0 >= k {
                    break;
                }
            }
        })
    })
}

/// Where a tile writes: `dst` at its first row and column, row stride, and whether the
/// chains start from `dst`.
#[derive(Clone, Copy)]
struct Out {
    dst: *mut f32,
    dst_rs: usize,
    acc: bool,
}

impl Out {
    fn of(ops: &Operands) -> Self {
        Self {
            dst: ops.dst,
            dst_rs: ops.dst_rs,
            acc: ops.acc,
        }
    }
}

/// Copies `m` rows of `kb` steps of `lhs` (row stride `rs`) into `blocks` of `mr` rows:
/// block `b` holds, for each step `i`, rows `b * mr ..` side by side (zero past `m`), so that
/// a tile's broadcasts read one contiguous stream.
///
/// SAFETY: `lhs` covers `m` rows of `kb` steps at stride `rs`.
unsafe fn pack_rows(
    blocks: &mut [f32],
    lhs: *const f32,
    rs: usize,
    (m, kb, mr): (usize, usize, usize),
) {
    for (b, block) in blocks.chunks_exact_mut(kb * mr).enumerate() {
        for r in 0..mr {
            let row = b * mr + r;
            if row < m {
                let src = std::slice::from_raw_parts(lhs.add(row * rs), kb);
                for (i, &v) in src.iter().enumerate() {
                    block[i * mr + r] = v;
                }
            } else {
                (0..kb).for_each(|i| block[i * mr + r] = 0.0);
            }
        }
    }
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

/// All `m` output rows against one panel of `cw` columns, a register tile per block of the
/// packed rows.
///
/// SAFETY: as [`product`]; `blocks` holds the packed rows of this depth chunk (`k` steps),
/// `out.dst` is at the panel's first column.
unsafe fn rows(
    isa: Isa,
    (m, k, cw): (usize, usize, usize),
    panel: *const f32,
    blocks: *const f32,
    out: Out,
) {
    let mr = tile_rows(isa);
    let mut r0 = 0;
    while r0 < m {
        let rows = mr.min(m - r0);
        let lp = blocks.add(r0 * k);
        let o = Out {
            dst: out.dst.add(r0 * out.dst_rs),
            ..out
        };
        macro_rules! go {
            ($m:ident) => {
                match rows {
                    1 => $m::tile::<1>(k, cw, panel, lp, o),
                    2 => $m::tile::<2>(k, cw, panel, lp, o),
                    3 => $m::tile::<3>(k, cw, panel, lp, o),
                    4 => $m::tile::<4>(k, cw, panel, lp, o),
                    5 => $m::tile::<5>(k, cw, panel, lp, o),
                    6 => $m::tile::<6>(k, cw, panel, lp, o),
                    7 => $m::tile::<7>(k, cw, panel, lp, o),
                    _ => $m::tile::<8>(k, cw, panel, lp, o),
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
        r0 += rows;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Out, PANEL_COLS};
    use std::arch::x86_64::*;

    /// Rows per tile: `ROWS x 2` accumulators of AVX-512's 32 registers.
    pub(super) const ROWS: usize = 8;
    const V: usize = PANEL_COLS / 16;

    /// `M` output rows (of a block of [`ROWS`]) x one panel.
    #[allow(clippy::needless_range_loop)] // indexed loops mirror the registers
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile<const M: usize>(
        k: usize,
        cw: usize,
        p: *const f32,
        lp: *const f32,
        o: Out,
    ) {
        let masks: [__mmask16; V] = std::array::from_fn(|v| {
            let lanes = cw.saturating_sub(16 * v).min(16);
            ((1u32 << lanes) - 1) as u16
        });
        let mut acc = [[_mm512_setzero_ps(); V]; M];
        if o.acc {
            for r in 0..M {
                for v in 0..V {
                    let d = o.dst.add(r * o.dst_rs + 16 * v);
                    acc[r][v] = _mm512_maskz_loadu_ps(masks[v], d);
                }
            }
        }
        for i in 0..k {
            let b: [__m512; V] =
                std::array::from_fn(|v| _mm512_loadu_ps(p.add(i * PANEL_COLS + 16 * v)));
            for r in 0..M {
                let a = _mm512_set1_ps(*lp.add(i * ROWS + r));
                for v in 0..V {
                    acc[r][v] = _mm512_fmadd_ps(a, b[v], acc[r][v]);
                }
            }
        }
        for r in 0..M {
            for v in 0..V {
                let d = o.dst.add(r * o.dst_rs + 16 * v);
                _mm512_mask_storeu_ps(d, masks[v], acc[r][v]);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Out, PANEL_COLS};
    use std::arch::x86_64::*;

    /// Rows per tile: `ROWS x 4` accumulators, `ROWS` broadcasts and one panel vector at a
    /// time, AVX2's 16 registers.
    pub(super) const ROWS: usize = 3;
    const V: usize = PANEL_COLS / 8;

    /// `M` output rows (at most [`ROWS`]) x one panel.
    #[allow(clippy::needless_range_loop)] // indexed loops mirror the registers
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile<const M: usize>(
        k: usize,
        cw: usize,
        p: *const f32,
        lp: *const f32,
        o: Out,
    ) {
        let mut acc = [[_mm256_setzero_ps(); V]; M];
        if o.acc {
            for r in 0..M {
                let mut lanes = [0f32; PANEL_COLS];
                lanes[..cw]
                    .copy_from_slice(std::slice::from_raw_parts(o.dst.add(r * o.dst_rs), cw));
                for v in 0..V {
                    acc[r][v] = _mm256_loadu_ps(lanes.as_ptr().add(8 * v));
                }
            }
        }
        for i in 0..k {
            let a: [__m256; M] = std::array::from_fn(|r| _mm256_set1_ps(*lp.add(i * ROWS + r)));
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
            std::slice::from_raw_parts_mut(o.dst.add(r * o.dst_rs), cw)
                .copy_from_slice(&lanes[..cw]);
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// Each output element as one fused chain over the depth, in order, from `dst` if `acc`.
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
                let s0 = if acc { dst[r * n + c] } else { 0.0 };
                out[r * n + c] = (0..k).fold(s0, |s, i| lhs[r * k + i].mul_add(rhs[i * n + c], s));
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
                (300, 40, 700),
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
                    unsafe { product_on(isa, (m, n, k), ops) };
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
    fn a_column_keeps_its_bits_in_any_block_and_depth_chunk() {
        assert!(available(), "the CI machines have AVX2 + FMA");
        // 300 rows: depth chunks of 436, so 700 steps take two.
        let (m, n, k) = (300, 75, 700);
        let (lhs, rhs, dst0) = (values(m * k, 4), values(k * n, 5), values(m * n, 6));
        for acc in [false, true] {
            let (mut whole, mut parts) = (dst0.clone(), dst0.clone());
            let ops = |dst: *mut f32, c0: usize| Operands {
                dst,
                dst_rs: n,
                acc,
                lhs: lhs.as_ptr(),
                lhs_rs: k,
                rhs: rhs.as_ptr().wrapping_add(c0),
                rhs_rs: n,
            };
            // SAFETY: the buffers have these shapes.
            unsafe {
                product((m, n, k), ops(whole.as_mut_ptr(), 0));
                for (c0, w) in [(0, 5), (5, 40), (45, 30)] {
                    product((m, w, k), ops(parts.as_mut_ptr().add(c0), c0));
                }
            }
            let want = reference(&lhs, &rhs, &dst0, (m, n, k), acc);
            let same = |a: &[f32]| a.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same(&whole) && same(&parts), "acc {acc}");
        }
    }
}
