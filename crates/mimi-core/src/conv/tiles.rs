//! The tiled matrix products every large convolution is made of: output elements split
//! into tiles spread over the rayon pool ([`tiles`], [`for_tiles`]), each tile's product on
//! one thread with the `gemm` crate ([`matmul`]), bias and residual added while the tile is
//! still in cache ([`epilogue`]), and the raw pointer the tiles share ([`SharedMut`]).

/// A raw pointer shared by tiles that write disjoint parts of one buffer.
#[derive(Clone, Copy)]
pub(super) struct SharedMut(pub(super) *mut f32);
// SAFETY: every tile writes a disjoint set of elements, and the buffer outlives the tiles.
unsafe impl Send for SharedMut {}
unsafe impl Sync for SharedMut {}

impl SharedMut {
    /// The element `i` (a method, so that closures capture the whole `SharedMut`).
    pub(super) fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

/// A block of output elements: `(first row, rows, first column, columns)`.
pub(super) type Tile = (usize, usize, usize, usize);

thread_local! {
    /// Whether this thread runs one group of rows while the other threads run the others
    /// ([`as_group`]).
    static GROUPED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` as one group of a batch's rows while the other threads run the other groups (a
/// streaming step's high-rate layers): its layers' tiles are not cut into row blocks to keep
/// the threads busy, since the other groups do that. A row block builds its own copy of the
/// tile's input columns, and `gemm` packs them again for each: at 4 rows of 480 frames, the
/// decoder's last up-sampling built them four times. Results do not depend on the tiles.
pub(crate) fn as_group<R>(f: impl FnOnce() -> R) -> R {
    crate::kernels::with_flag(&GROUPED, f)
}

/// Whether this thread runs one group of rows ([`as_group`]).
pub(crate) fn grouped() -> bool {
    GROUPED.get()
}

/// Weights up to this size run a group's rows one by one: measured at B = 8 on a Xeon (2 MB
/// of L2), the 1.3 MB layers ran faster so, and the 6 MB ones joined.
const CACHED_WEIGHT_BYTES: usize = 4 << 20;

/// Whether a layer of `weight_bytes` runs a group's rows one by one ([`as_group`]): when
/// its weights stay in cache between rows. A larger layer joins the group's rows side by
/// side instead, so that its weights are read once per group, not once per row (at B = 8,
/// the encoder's third down-sampling, 6 MB in f32, read them 8 times a frame).
pub(crate) fn rows_alone_in_group(weight_bytes: usize) -> bool {
    #[cfg(test)]
    let limit = test_hooks::CACHED_LIMIT.get();
    #[cfg(not(test))]
    let limit = CACHED_WEIGHT_BYTES;
    grouped() && weight_bytes <= limit
}

#[cfg(test)]
pub(super) mod test_hooks {
    thread_local! {
        /// [`super::CACHED_WEIGHT_BYTES`], which a test may lower to join small layers.
        pub(in crate::conv) static CACHED_LIMIT: std::cell::Cell<usize> =
            const { std::cell::Cell::new(super::CACHED_WEIGHT_BYTES) };
    }
}

/// The tiles of `rows x cols` output elements: column blocks of `cstep`, each cut into row
/// blocks of `rstep`, in that order. Computed from their index, not stored: a step plans a
/// few hundred of them and allocates none.
#[derive(Clone, Copy, Debug)]
pub(super) struct Tiles {
    rows: usize,
    cols: usize,
    rstep: usize,
    cstep: usize,
}

impl Tiles {
    /// How many tiles.
    pub(super) fn len(&self) -> usize {
        match self.rows == 0 || self.cols == 0 {
            true => 0,
            false => self.cols.div_ceil(self.cstep) * self.rows.div_ceil(self.rstep),
        }
    }

    /// Tile `i` (of [`Self::len`]).
    pub(super) fn get(&self, i: usize) -> Tile {
        let per = self.rows.div_ceil(self.rstep);
        let (r0, c0) = ((i % per) * self.rstep, (i / per) * self.cstep);
        let (rn, cn) = (
            self.rstep.min(self.rows - r0),
            self.cstep.min(self.cols - c0),
        );
        (r0, rn, c0, cn)
    }
}

/// Columns of the narrowest tile [`tiles`] cuts to keep the threads busy: one block of the
/// direct kernel (64 frames). Fewer frames run a fused block in two passes instead
/// (`Conv1d::run_fused`), which measured faster at 96 frames than tiles of 32 frames (blocks
/// half empty).
const MIN_SPLIT_COLS: usize = 64;

/// Splits `rows x cols` output elements into tiles for the pool: column blocks of at most
/// `max_cols`; when they are too few to keep every thread busy (not in a group:
/// [`as_group`]), row blocks, then, where the rows run out (a fused residual block's tiles
/// have one row of all its channels), narrower column blocks, multiples of 16 frames and
/// at least [`MIN_SPLIT_COLS`]. Before the narrower columns, a B = 1 step ran each residual
/// block (1,920 frames at most, under `max_cols`) on one thread while the other waited.
pub(super) fn tiles(rows: usize, cols: usize, max_cols: usize, flops: usize) -> Tiles {
    let threads = match GROUPED.get() {
        true => 1,
        false => rayon::current_num_threads(),
    };
    let mut col_tiles = cols.div_ceil(max_cols.max(1));
    let mut row_tiles = 1;
    let mut cstep_unit = 1;
    if threads > 1 && flops > 1 << 21 && col_tiles < 2 * threads {
        row_tiles = (2 * threads)
            .div_ceil(col_tiles)
            .min(rows.div_ceil(16))
            .max(1);
        let finer = (2 * threads).div_ceil(row_tiles).min(cols / MIN_SPLIT_COLS);
        if col_tiles * row_tiles < 2 * threads && finer > col_tiles {
            (col_tiles, cstep_unit) = (finer, 16);
        }
    }
    let rstep = rows
        .div_ceil(row_tiles)
        .next_multiple_of(8)
        .min(rows.max(1));
    let cstep = (cols.div_ceil(col_tiles.max(1)))
        .next_multiple_of(cstep_unit)
        .min(max_cols.max(1))
        .max(1);
    Tiles {
        rows,
        cols,
        rstep,
        cstep,
    }
}

thread_local! {
    /// Each thread's im2col block, kept between calls.
    static SCRATCH: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Runs `f` on every tile, in parallel when that pays.
pub(super) fn for_tiles<F>(tiles: &Tiles, flops: usize, f: F)
where
    F: Fn(&mut Vec<f32>, Tile) + Sync,
{
    let run = |i: usize| {
        crate::kernels::with_scratch(&SCRATCH, |s| f(s, tiles.get(i)));
    };
    if tiles.len() > 1 && rayon::current_num_threads() > 1 && flops > 1 << 21 {
        crate::kernels::for_each_index(tiles.len(), run);
    } else {
        (0..tiles.len()).for_each(run);
    }
}

/// The depth of one `gemm` call. `gemm` blocks a product's depth by a size it derives from
/// the whole shape `(m, n, k)`, and a column's sum is rounded block by block, so the same
/// column would get other bits in a wider or narrower tile. A call of depth at most this is
/// one block whatever its shape; [`gemm_acc`] sums longer products block by block, in order.
/// A column's result then depends only on its own inputs: the rows of a batched streaming
/// step can share one product (see `Conv1d::step_rows`) and keep the bits of their own steps.
pub(super) const DEPTH_BLOCK: usize = 512;

/// `dst (m, n) (+)= lhs (m, k) . rhs (k, n)` on one thread, in depth blocks of
/// [`DEPTH_BLOCK`] (`acc`: add to `dst` rather than overwrite it). Row strides `dst_rs`,
/// `lhs_rs`, `rhs_rs`; every column stride is 1.
///
/// SAFETY: the pointers must cover the strided extents described.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm_acc(
    (m, n, k): (usize, usize, usize),
    dst: *mut f32,
    dst_rs: usize,
    acc: bool,
    lhs: *const f32,
    lhs_rs: usize,
    rhs: *const f32,
    rhs_rs: usize,
) {
    if crate::runtime::profile::products_skipped() {
        return;
    }
    for b in 0..k.div_ceil(DEPTH_BLOCK).max(1) {
        let k0 = b * DEPTH_BLOCK;
        let kb = DEPTH_BLOCK.min(k - k0);
        crate::runtime::profile::in_gemm(|| {
            gemm::gemm(
                m,
                n,
                kb,
                dst,
                1,
                dst_rs as isize,
                acc || b > 0,
                lhs.add(k0),
                1,
                lhs_rs as isize,
                rhs.add(k0 * rhs_rs),
                1,
                rhs_rs as isize,
                1f32,
                1f32,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        });
    }
}

/// `dst (m, n) = lhs (m, k) . rhs (k, n)` on one thread ([`gemm_acc`]); `dst` has row
/// stride `dst_rs`, `lhs` row stride `lhs_rs`, `rhs` is contiguous.
///
/// SAFETY: the pointers must cover the strided extents described.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn matmul(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut f32,
    dst_rs: usize,
    lhs: *const f32,
    lhs_rs: usize,
    rhs: *const f32,
) {
    gemm_acc((m, n, k), dst, dst_rs, false, lhs, lhs_rs, rhs, n)
}

/// Adds `bias[row]` and `residual` to the tile `rows x cols` of `out (_, stride)`.
///
/// SAFETY: the tile lies inside `out`, and no other thread writes it.
pub(super) unsafe fn epilogue(
    out: SharedMut,
    stride: usize,
    (r0, rn, c0, cn): Tile,
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
pub(super) fn max_cols(k: usize) -> usize {
    ((1usize << 19) / k.max(1)).clamp(32, 2048)
}
