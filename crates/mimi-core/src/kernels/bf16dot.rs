//! Products with bf16 inputs and float32 sums, in the order AVX-512 BF16's `vdpbf16ps`
//! defines, with the same bits on every machine: the arithmetic of the `"medium"` precision
//! (issue 49; not yet wired to a model).
//!
//! `y[r][o] = bias[o] + sum over pairs i of (x[r][2i+1] w[o][2i+1], then x[r][2i] w[o][2i])`:
//! each term is one float32 fused multiply-add (a product of two bf16 values is exact in
//! float32, so only the sum rounds, to nearest even), pairs in order, one accumulator per
//! output, denormals flushed to zero. That is Intel's pseudocode for `vdpbf16ps` ("FP32 FMA
//! with DAZ in, FTZ out and RNE rounding", odd element first), so three paths give the same
//! bits ([`Path`]): the instruction itself; AVX2 FMAs with MXCSR's flush bits set for the
//! call; and plain Rust with the flushes written out. Inputs are rounded to bf16 (to nearest
//! even, denormals flushed) when packed ([`PairPacked::pack`]) or rounded ([`round_pairs`]),
//! so no input is ever denormal and only the sums need flushing.
//!
//! Weights are packed once in the layout `vdpbf16ps` reads: panels of [`LANES`] outputs, each
//! a run of `k / 2` pair vectors (`LANES` u32, the even element in the low half), k padded to
//! even with zeros, the outputs past `n` zero.

/// Outputs per panel: one 512-bit vector of f32 sums.
pub const LANES: usize = 16;

/// Rows of one register tile of the native and portable paths: 8 rows x 2 panels are 16
/// independent AVX-512 sums, enough to hide `vdpbf16ps`'s latency (6 cycles on Zen 4) at two
/// a cycle. Fewer rows take tiles of 4, 2 and 1.
const ROWS: usize = 8;

/// A register tile's sums: `[row][panel]`, 16 lanes each.
type Acc = [[f32; LANES]; 2];

/// How a product is computed; every path gives the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// `vdpbf16ps` (AVX-512 BF16).
    Native,
    /// AVX-512 FMAs, two per pair, MXCSR's flush-to-zero and denormals-are-zero set.
    Avx512,
    /// AVX2 FMAs, two per pair, MXCSR's flush-to-zero and denormals-are-zero set for the call.
    Avx2,
    /// Plain Rust, the flushes explicit.
    Portable,
}

impl Path {
    /// The instructions the path needs.
    pub fn level(self) -> super::cpu::Level {
        use super::cpu::Level;
        match self {
            Path::Native => Level::Avx512Bf16,
            Path::Avx512 => Level::Avx512,
            Path::Avx2 => Level::Avx2,
            Path::Portable => Level::Portable,
        }
    }

    /// Whether this CPU (and `MIMI_PY_ISA`) runs the path.
    pub fn available(self) -> bool {
        super::cpu::has(self.level())
    }

    /// The path products take here (the same bits on each): the instruction on AMD, whose
    /// Zen 4 and 5 run it at twice the f32 FMA rate; elsewhere the widest emulation first.
    /// On Intel, `vdpbf16ps` runs at half the f32 FMA rate, and its emulation by two
    /// AVX-512 FMAs per pair measured faster (`paths_speed`, a Xeon with AVX-512 BF16, one
    /// core: 108-164 against 91-112 GFLOP/s since it reads its input widened, [`Wide`]).
    pub fn best() -> Path {
        static BEST: std::sync::OnceLock<Path> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            let order = match super::cpu::vendor_is_amd() {
                true => [Path::Native, Path::Avx512, Path::Avx2],
                false => [Path::Avx512, Path::Native, Path::Avx2],
            };
            (order.into_iter().find(|p| p.available())).unwrap_or(Path::Portable)
        })
    }
}

/// `x` rounded to bf16, to nearest even; a denormal result is a zero of its sign, NaN stays
/// a NaN (quiet). Branch-free, so that loops over it vectorize. The sum cannot wrap for a
/// finite `x` (the largest, `0xff7f_ffff`, plus `0x8000` stays below 2^32).
#[inline(always)]
pub fn to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16;
    let nan = (b & 0x7fff_ffff) > 0x7f80_0000;
    let r = if nan { (b >> 16) | 0x40 } else { rounded };
    // a denormal (or zero): flushed, as DAZ would
    (if r & 0x7f80 == 0 { r & 0x8000 } else { r }) as u16
}

/// The f32 a bf16 stands for.
#[inline(always)]
fn widen(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// `x`'s rows (`m`, each `k` long) as bf16 pairs, `k` padded to even with zeros: `m * k.div_ceil(2)`
/// u32, the even element in the low half.
pub fn round_pairs(x: &[f32], m: usize, k: usize, out: &mut Vec<u32>) {
    assert_eq!(x.len(), m * k, "round_pairs: x is not m x k");
    let kp = k.div_ceil(2);
    out.clear();
    out.reserve(m * kp);
    for row in x.chunks_exact(k.max(1)).take(m) {
        let odd = |i: usize| row.get(2 * i + 1).map_or(0.0, |&v| v);
        out.extend((0..kp).map(|i| pair(row[2 * i], odd(i))));
    }
}

/// A product's input rounded to pairs, `m` rows of `kp` pairs: row `r`'s pair `i` at
/// `r * row + i * pair` ([`Self::rows`]: row-major, as [`round_pairs`] writes; [`Self::columns`]:
/// pair-major, as a convolution's tile gathers its columns).
#[derive(Clone, Copy, Debug)]
pub struct PairInput<'a> {
    data: &'a [u32],
    row: usize,
    pair: usize,
}

impl<'a> PairInput<'a> {
    /// Row-major: `data[r * kp + i]`.
    pub fn rows(data: &'a [u32], kp: usize) -> Self {
        Self {
            data,
            row: kp,
            pair: 1,
        }
    }

    /// Pair-major: `data[i * m + r]`.
    pub fn columns(data: &'a [u32], m: usize) -> Self {
        Self {
            data,
            row: 1,
            pair: m,
        }
    }

    /// The input from row `r0` on.
    fn skip_rows(self, r0: usize) -> Self {
        Self {
            data: &self.data[r0 * self.row..],
            ..self
        }
    }

    /// Row `r`'s pair `i`.
    ///
    /// # Safety
    /// `(r, i)` is inside the product's input (checked once per product, `PairPacked::check`).
    #[inline(always)]
    unsafe fn at(&self, r: usize, i: usize) -> u32 {
        *self.data.get_unchecked(r * self.row + i * self.pair)
    }
}

/// A product's input as its path reads it.
#[derive(Clone, Copy)]
enum Input<'a> {
    /// The rounded pairs.
    Pairs(PairInput<'a>),
    /// The pairs widened to f32 (the AVX2 and AVX-512 emulation paths).
    #[cfg(target_arch = "x86_64")]
    Wide(Wide<'a>),
}

/// Rows per register tile of the AVX2 path: 6 rows x 2 vectors of 8 lanes are 12 sums, of its
/// 16 registers (AVX2 has 16 vector registers, not 32: an 8-row tile would spill).
#[cfg(target_arch = "x86_64")]
const AVX2_ROWS: usize = 6;

/// Rows per register tile of the AVX-512 emulation path: 12 rows x 2 panels are 24 sums, of
/// its 32 registers, with 4 for the weights' odd and even halves. Timed against 8 x 2, 10 x 2
/// and 6 x 4 over the products of `paths_speed` and streaming steps (a Xeon, one core): the
/// fastest or within 3% of it on each, but where 6 x 4 won on a product of 1 to 4 rows
/// ([`PairPacked::panels_avx512`] takes 4 panels there).
#[cfg(target_arch = "x86_64")]
const AVX512_ROWS: usize = 12;

/// The widened paths' blocks of row tiles: at most this many bytes of widened input, which an
/// L2 cache holds (256 KiB on the smallest AVX2 machines) while every panel takes the block.
/// Timed over the products of a `"medium"` codec (a Xeon, one core, warm weights): 64 and 128
/// KiB 1-5% faster than 512 KiB or each panel taking every row tile; within the noise of
/// each other at the codec level. The AVX-512 path's tiles of 12 rows, timed the same way
/// (every layer at `"medium"`, 5 interleaved rounds): 64 and 256 KiB within 1% of 128.
#[cfg(target_arch = "x86_64")]
const BLOCK_BYTES: usize = 128 << 10;

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// The AVX2 and AVX-512 paths' widened input, kept between calls.
    static WIDE: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The AVX2 path's row tiles of an `m`-row product, `(first row, rows)`: `m.div_ceil(6)`
/// tiles as even as can be (8 rows are two tiles of 4, not 6 and 2: a tile of few rows
/// leaves the FMAs waiting on their latency).
#[cfg(target_arch = "x86_64")]
fn avx2_tiles(m: usize) -> impl Iterator<Item = (usize, usize)> {
    row_tiles(m, AVX2_ROWS)
}

/// An `m`-row product's row tiles of at most `most` rows, `(first row, rows)`, as even as
/// can be ([`avx2_tiles`]).
#[cfg(target_arch = "x86_64")]
fn row_tiles(m: usize, most: usize) -> impl Iterator<Item = (usize, usize)> {
    let t = m.div_ceil(most);
    (0..t).map(move |j| (j * m / t, (j + 1) * m / t - j * m / t))
}

/// A [`PairInput`] widened to f32 for the AVX2 and AVX-512 emulation paths, once per product
/// for every panel: their kernels broadcast each value from memory (a load), where widening
/// in registers takes two shuffles per value on the port the broadcasts need (and, for
/// 512-bit vectors on Intel, one of the two FMA ports). Laid out tile by tile ([`row_tiles`]
/// of at most `most` rows, the path's): tile `(r0, rows)` at `2 kp r0`, each pair `i` then
/// `rows` odd elements and `rows` even ones, so the kernel reads one contiguous run. (Read
/// in place, a convolution's pair-major input would stride by `4 m` bytes from pair to pair:
/// with `m` a multiple of 1024, every pair in the same cache set.)
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Wide<'a> {
    data: &'a [f32],
    kp: usize,
    most: usize,
}

#[cfg(target_arch = "x86_64")]
impl<'a> Wide<'a> {
    fn new(x: PairInput, m: usize, kp: usize, most: usize, buf: &'a mut Vec<f32>) -> Self {
        buf.truncate(2 * m * kp);
        buf.resize(2 * m * kp, 0.0);
        for (r0, rows) in row_tiles(m, most) {
            let (x, block) = (x.skip_rows(r0), &mut buf[2 * kp * r0..][..2 * kp * rows]);
            match rows {
                12 => widen_tile::<12>(x, kp, block),
                11 => widen_tile::<11>(x, kp, block),
                10 => widen_tile::<10>(x, kp, block),
                9 => widen_tile::<9>(x, kp, block),
                8 => widen_tile::<8>(x, kp, block),
                7 => widen_tile::<7>(x, kp, block),
                6 => widen_tile::<6>(x, kp, block),
                5 => widen_tile::<5>(x, kp, block),
                4 => widen_tile::<4>(x, kp, block),
                3 => widen_tile::<3>(x, kp, block),
                2 => widen_tile::<2>(x, kp, block),
                _ => widen_tile::<1>(x, kp, block),
            }
        }
        Self {
            data: buf,
            kp,
            most,
        }
    }

    /// The row tiles of an `m`-row product.
    fn tiles(self, m: usize) -> impl Iterator<Item = (usize, usize)> {
        row_tiles(m, self.most)
    }

    /// Tile `(r0, rows)`'s run.
    fn tile(self, (r0, rows): (usize, usize)) -> &'a [f32] {
        &self.data[2 * self.kp * r0..][..2 * self.kp * rows]
    }
}

/// `R` rows of `x` (the input's rows from the tile's first) widened into `block`, [`Wide`]'s
/// layout.
#[cfg(target_arch = "x86_64")]
fn widen_tile<const R: usize>(x: PairInput, kp: usize, block: &mut [f32]) {
    for (i, d) in block.chunks_exact_mut(2 * R).enumerate().take(kp) {
        let (odd, even) = d.split_at_mut(R);
        for r in 0..R {
            // SAFETY: the tile's rows and pairs (`check`).
            let p = unsafe { x.at(r, i) };
            odd[r] = f32::from_bits(p & 0xffff_0000);
            even[r] = f32::from_bits(p << 16);
        }
    }
}

/// A weight `(n, k)` rounded to bf16 and packed in panels of [`LANES`] outputs of pairs.
#[derive(Debug, Clone)]
pub struct PairPacked {
    n: usize,
    k: usize,
    data: Vec<u32>,
}

impl PairPacked {
    /// Rounds and packs `w` (row-major, `n` rows of `k`).
    pub fn pack(w: &[f32], n: usize, k: usize) -> Self {
        assert_eq!(w.len(), n * k, "PairPacked::pack: w is not n x k");
        let kp = k.div_ceil(2);
        let panels = n.div_ceil(LANES);
        let mut data = vec![0u32; panels * kp * LANES];
        for o in 0..n {
            let row = &w[o * k..(o + 1) * k];
            let panel = &mut data[(o / LANES) * kp * LANES..][..kp * LANES];
            for i in 0..kp {
                let odd = row.get(2 * i + 1).map_or(0.0, |&v| v);
                panel[i * LANES + o % LANES] = pair(row[2 * i], odd);
            }
        }
        Self { n, k, data }
    }

    /// `(n, k)`.
    pub fn dims(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// Bytes held (the panels' padding included).
    pub fn nbytes(&self) -> usize {
        4 * self.data.len()
    }

    /// The weight `(n, k)` row-major again, as the bf16 values it holds, widened.
    pub fn unpack(&self) -> Vec<f32> {
        let kp = self.k.div_ceil(2);
        let mut w = Vec::with_capacity(self.n * self.k);
        for o in 0..self.n {
            let panel = &self.data[(o / LANES) * kp * LANES..][..kp * LANES];
            for j in 0..self.k {
                let pair = panel[(j / 2) * LANES + o % LANES];
                w.push(widen((pair >> (16 * (j % 2))) as u16));
            }
        }
        w
    }

    /// `y (m, n) = bias + x (m, k) . w^T` on this CPU's fastest path ([`Path::best`]), the
    /// panels spread over the pool when the product is large (the bits do not change).
    pub fn matmul(&self, x: PairInput, m: usize, bias: Option<&[f32]>, y: &mut [f32]) {
        self.check(x, m, bias, y);
        let parallel = 2 * m * self.n * self.k.div_ceil(2) >= 1 << 18;
        self.run(Path::best(), x, m, bias, y, parallel);
    }

    /// `y (m, n) = bias + x (m, k) . w^T` on `path`, on this thread, from `x` already rounded
    /// ([`round_pairs`]). A path this CPU does not run is refused (a panic: callers check
    /// [`Path::available`]).
    pub fn matmul_on(
        &self,
        path: Path,
        x: PairInput,
        m: usize,
        bias: Option<&[f32]>,
        y: &mut [f32],
    ) {
        self.check(x, m, bias, y);
        assert!(
            path.available(),
            "PairPacked: {path:?} is not available on this CPU"
        );
        self.run(path, x, m, bias, y, false);
    }

    /// The product on `path` (shapes checked, a path this CPU runs): on this thread, or in
    /// tasks of [`TASK_PANELS`] panels over the pool when `parallel`. The AVX2 and AVX-512
    /// paths widen the input to f32 first, once for all tasks ([`Wide`]).
    fn run(
        &self,
        path: Path,
        x: PairInput,
        m: usize,
        bias: Option<&[f32]>,
        y: &mut [f32],
        parallel: bool,
    ) {
        if crate::runtime::profile::products_skipped() {
            return;
        }
        let panels = self.n.div_ceil(LANES);
        let task = if parallel { TASK_PANELS } else { panels.max(1) };
        let out = Out(y.as_mut_ptr());
        let go = |x: Input| {
            let run = |t: usize| {
                let p1 = ((t + 1) * task).min(panels);
                // SAFETY: panels t * task .. p1 write only their own columns of `y` (m x n,
                // checked), which outlives the tasks; the caller checked the path runs here.
                unsafe { self.panels(path, (t * task, p1), x, m, bias, out) }
            };
            match parallel {
                true => super::for_each_index(panels.div_ceil(task), run),
                false => (0..panels.div_ceil(task)).for_each(run),
            }
        };
        #[cfg(target_arch = "x86_64")]
        if let Some(most) = match path {
            Path::Avx2 => Some(AVX2_ROWS),
            Path::Avx512 => Some(AVX512_ROWS),
            _ => None,
        } {
            let kp = self.k.div_ceil(2);
            return super::with_scratch(&WIDE, |buf| {
                go(Input::Wide(Wide::new(x, m, kp, most, buf)))
            });
        }
        go(Input::Pairs(x))
    }

    fn check(&self, x: PairInput, m: usize, bias: Option<&[f32]>, y: &[f32]) {
        let (n, kp) = (self.n, self.k.div_ceil(2));
        let layout = (x.row, x.pair) == (kp, 1) || (x.row, x.pair) == (1, m);
        assert!(
            layout && x.data.len() == m * kp && y.len() == m * n,
            "PairPacked: shapes"
        );
        assert!(bias.is_none_or(|b| b.len() == n), "PairPacked: bias length");
    }

    /// Panels `p0..p1` of the product, every row.
    ///
    /// # Safety
    /// `y` is `m x n` and no other thread writes these panels' columns; `path` runs here.
    unsafe fn panels(
        &self,
        path: Path,
        (p0, p1): (usize, usize),
        x: Input,
        m: usize,
        bias: Option<&[f32]>,
        y: Out,
    ) {
        let x = match x {
            #[cfg(target_arch = "x86_64")]
            Input::Wide(x) if path == Path::Avx2 => {
                return self.panels_avx2((p0, p1), x, m, bias, y)
            }
            #[cfg(target_arch = "x86_64")]
            Input::Wide(x) if m <= 4 => return self.panels_avx512::<4>((p0, p1), x, m, bias, y),
            #[cfg(target_arch = "x86_64")]
            Input::Wide(x) => return self.panels_avx512::<2>((p0, p1), x, m, bias, y),
            Input::Pairs(x) => x,
        };
        let (n, kp) = (self.n, self.k.div_ceil(2));
        let mut p = p0;
        while p < p1 {
            let np = (p1 - p).min(2);
            let w = [p, p + np - 1].map(|q| &self.data[q * kp * LANES..][..kp * LANES]);
            let mut b = [[0f32; LANES]; 2];
            for (j, bj) in b.iter_mut().enumerate().take(np) {
                let o = (p + j) * LANES;
                if let Some(bias) = bias {
                    (bj.iter_mut().zip(&bias[o..n.min(o + LANES)]))
                        .for_each(|(d, &v)| *d = flush(v));
                }
            }
            let mut r = 0;
            while r < m {
                let rows = [ROWS, 4, 2, 1]
                    .into_iter()
                    .find(|&t| t <= m - r)
                    .unwrap_or(1);
                #[cfg(not(target_arch = "x86_64"))]
                let _ = path; // the portable path only
                #[cfg(target_arch = "x86_64")]
                if path == Path::Native {
                    // SAFETY: `matmul_on` / `matmul` checked the CPU runs the path; the rows
                    // and panels are inside `y`, this call's.
                    tile_native_sized((rows, np), w, x.skip_rows(r), kp, &b, (y, n, r, p));
                    r += rows;
                    continue;
                }
                let mut acc = [b; ROWS];
                tile_portable(w, np, x.skip_rows(r), kp, &mut acc[..rows]);
                for (i, a) in acc[..rows].iter().enumerate() {
                    for (j, aj) in a.iter().enumerate().take(np) {
                        let o = (p + j) * LANES;
                        let dst = y.0.add((r + i) * n + o);
                        std::ptr::copy_nonoverlapping(aj.as_ptr(), dst, LANES.min(n - o));
                    }
                }
                r += rows;
            }
            p += np;
        }
    }

    /// [`Self::panels`] on the AVX2 path, MXCSR's flush bits set once: the row tiles
    /// ([`avx2_tiles`]) in blocks of [`BLOCK_BYTES`] of widened input, each block taking
    /// every panel in turn, each panel every tile of the block (its weights stay in L1).
    ///
    /// # Safety
    /// As [`Self::panels`]; this CPU runs AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    unsafe fn panels_avx2(
        &self,
        (p0, p1): (usize, usize),
        x: Wide,
        m: usize,
        bias: Option<&[f32]>,
        y: Out,
    ) {
        let (n, kp) = (self.n, self.k.div_ceil(2));
        let _flush = FlushDenormals::set();
        let per_block = (BLOCK_BYTES / (8 * AVX2_ROWS * kp).max(1)).max(1);
        for b0 in (0..m.div_ceil(AVX2_ROWS)).step_by(per_block) {
            for p in p0..p1 {
                let (w, b) = (
                    &self.data[p * kp * LANES..][..kp * LANES],
                    bias_lanes(bias, p, n),
                );
                for (r, rows) in avx2_tiles(m).skip(b0).take(per_block) {
                    let (x, out) = (x.tile((r, rows)), (y, n, r, p));
                    match rows {
                        6 => tile_avx2::<6>(w, x, kp, &b, out),
                        5 => tile_avx2::<5>(w, x, kp, &b, out),
                        4 => tile_avx2::<4>(w, x, kp, &b, out),
                        3 => tile_avx2::<3>(w, x, kp, &b, out),
                        2 => tile_avx2::<2>(w, x, kp, &b, out),
                        _ => tile_avx2::<1>(w, x, kp, &b, out),
                    }
                }
            }
        }
    }

    /// [`Self::panels`] on the AVX-512 emulation path, MXCSR's flush bits set once: as
    /// [`Self::panels_avx2`], with tiles of up to [`AVX512_ROWS`] rows and `NP` panels (the
    /// last panels of an uneven count one at a time). The caller takes `NP = 4` for a product
    /// of up to 4 rows, so that it still has up to 16 independent sums (1 row x 2 panels would
    /// leave 2 FMA chains waiting on their latency), and 2 otherwise.
    ///
    /// # Safety
    /// As [`Self::panels`]; this CPU runs AVX-512F.
    #[cfg(target_arch = "x86_64")]
    unsafe fn panels_avx512<const NP: usize>(
        &self,
        (p0, p1): (usize, usize),
        x: Wide,
        m: usize,
        bias: Option<&[f32]>,
        y: Out,
    ) {
        let kp = self.k.div_ceil(2);
        let _flush = FlushDenormals::set();
        let per_block = (BLOCK_BYTES / (8 * AVX512_ROWS * kp).max(1)).max(1);
        for b0 in (0..m.div_ceil(AVX512_ROWS)).step_by(per_block) {
            let mut p = p0;
            while p < p1 {
                let tiles = (b0, per_block);
                p += match p1 - p >= NP {
                    true => self.group_avx512::<NP>(p, x, m, tiles, bias, y),
                    false => self.group_avx512::<1>(p, x, m, tiles, bias, y),
                };
            }
        }
    }

    /// Panels `p..p + NP` of row tiles `b0..b0 + count` ([`Wide::tiles`]) on the AVX-512
    /// path; returns `NP`, the panels done.
    ///
    /// # Safety
    /// As [`Self::panels_avx512`], the panels inside the product.
    #[cfg(target_arch = "x86_64")]
    unsafe fn group_avx512<const NP: usize>(
        &self,
        p: usize,
        x: Wide,
        m: usize,
        (b0, count): (usize, usize),
        bias: Option<&[f32]>,
        y: Out,
    ) -> usize {
        let (n, kp) = (self.n, self.k.div_ceil(2));
        let w: [&[u32]; NP] =
            std::array::from_fn(|j| &self.data[(p + j) * kp * LANES..][..kp * LANES]);
        let b: [[f32; LANES]; NP] = std::array::from_fn(|j| bias_lanes(bias, p + j, n));
        for (r, rows) in x.tiles(m).skip(b0).take(count) {
            let (xt, out) = (x.tile((r, rows)), (y, n, r, p));
            match rows {
                12 => tile_avx512::<12, NP>(w, xt, kp, &b, out),
                11 => tile_avx512::<11, NP>(w, xt, kp, &b, out),
                10 => tile_avx512::<10, NP>(w, xt, kp, &b, out),
                9 => tile_avx512::<9, NP>(w, xt, kp, &b, out),
                8 => tile_avx512::<8, NP>(w, xt, kp, &b, out),
                7 => tile_avx512::<7, NP>(w, xt, kp, &b, out),
                6 => tile_avx512::<6, NP>(w, xt, kp, &b, out),
                5 => tile_avx512::<5, NP>(w, xt, kp, &b, out),
                4 => tile_avx512::<4, NP>(w, xt, kp, &b, out),
                3 => tile_avx512::<3, NP>(w, xt, kp, &b, out),
                2 => tile_avx512::<2, NP>(w, xt, kp, &b, out),
                _ => tile_avx512::<1, NP>(w, xt, kp, &b, out),
            }
        }
        NP
    }
}

/// AVX-512: `R` rows (up to [`AVX512_ROWS`]) of `NP` panels, from the widened input: each
/// value broadcast from memory (a load, not a shuffle), the weights' odd and even halves
/// widened in registers (exact), each sum starting from its bias lane `b` and taking its odd
/// product, then its even one, pair by pair; the sums go from the registers straight to `y`
/// (`out`: `y`, its row length `n`, the tile's first row and first panel; a last panel past
/// `n` masked). MXCSR's flush bits are set by the caller.
///
/// # Safety
/// This CPU runs AVX-512F; the rows and panels are inside `y`, and this thread owns them.
#[allow(clippy::needless_range_loop)] // register-indexed loops mirror the accumulators
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn tile_avx512<const R: usize, const NP: usize>(
    w: [&[u32]; NP],
    x: &[f32],
    kp: usize,
    b: &[[f32; LANES]; NP],
    out: (Out, usize, usize, usize),
) {
    use std::arch::x86_64::*;
    debug_assert!(x.len() == 2 * R * kp && (out.3 + NP - 1) * LANES < out.1);
    let hi = _mm512_set1_epi32(0xffff_0000u32 as i32);
    let bias: [__m512; NP] = std::array::from_fn(|j| _mm512_loadu_ps(b[j].as_ptr()));
    let mut s = [bias; R];
    for i in 0..kp {
        let xi = x.as_ptr().add(2 * R * i);
        let wv: [__m512i; NP] =
            std::array::from_fn(|j| _mm512_loadu_si512(w[j].as_ptr().add(i * LANES).cast()));
        // each sum takes its odd product first, then its even one
        let wo = wv.map(|v| _mm512_castsi512_ps(_mm512_and_si512(v, hi)));
        for r in 0..R {
            let v = _mm512_set1_ps(*xi.add(r));
            for j in 0..NP {
                s[r][j] = _mm512_fmadd_ps(wo[j], v, s[r][j]);
            }
        }
        let we = wv.map(|v| _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
        for r in 0..R {
            let v = _mm512_set1_ps(*xi.add(R + r));
            for j in 0..NP {
                s[r][j] = _mm512_fmadd_ps(we[j], v, s[r][j]);
            }
        }
    }
    store_sums(&s, out);
}

/// Writes an AVX-512 tile's sums `s` (`R` rows of `NP` panels) to `y` (`out`: `y`, its row
/// length `n`, the tile's first row and first panel), lanes past `n` masked.
///
/// # Safety
/// This CPU runs AVX-512F; the rows and panels are inside `y`, and this thread owns them.
#[allow(clippy::needless_range_loop)] // register-indexed loops mirror the accumulators
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn store_sums<const R: usize, const NP: usize>(
    s: &[[std::arch::x86_64::__m512; NP]; R],
    (y, n, r0, p): (Out, usize, usize, usize),
) {
    for j in 0..NP {
        let o = (p + j) * LANES;
        let mask = match n - o >= LANES {
            true => !0,
            false => (1u16 << (n - o)) - 1,
        };
        for r in 0..R {
            std::arch::x86_64::_mm512_mask_storeu_ps(y.0.add((r0 + r) * n + o), mask, s[r][j]);
        }
    }
}

/// Panel `p`'s bias lanes, flushed as DAZ would (zero past `n`, or without a bias).
#[cfg(target_arch = "x86_64")]
fn bias_lanes(bias: Option<&[f32]>, p: usize, n: usize) -> [f32; LANES] {
    let mut b = [0f32; LANES];
    if let Some(bias) = bias.filter(|_| p * LANES < n) {
        let o = p * LANES;
        (b.iter_mut().zip(&bias[o..n.min(o + LANES)])).for_each(|(d, &v)| *d = flush(v));
    }
    b
}

/// Panels per parallel task of [`PairPacked::matmul`].
const TASK_PANELS: usize = 4;

/// The output of a product split over tasks, each writing its own columns.
#[derive(Clone, Copy)]
struct Out(*mut f32);

// SAFETY: tasks write disjoint columns of an output that outlives them (`matmul`).
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

/// Two values as one bf16 pair (the even element in the low half).
#[inline(always)]
pub fn pair(even: f32, odd: f32) -> u32 {
    to_bf16(even) as u32 | (to_bf16(odd) as u32) << 16
}

/// A denormal as a zero of its sign (FTZ / DAZ).
#[inline(always)]
fn flush(v: f32) -> f32 {
    match v.is_subnormal() {
        true => 0f32.copysign(v),
        false => v,
    }
}

/// `acc[r][j] += x[r] . w[j]` for the tile's rows (1, 2, 4 or [`ROWS`]) and `np` panels
/// (`x`: rows of `kp` pairs), in plain Rust, the flushes explicit.
fn tile_portable(w: [&[u32]; 2], np: usize, x: PairInput, kp: usize, acc: &mut [Acc]) {
    for (r, a) in acc.iter_mut().enumerate() {
        for (aj, wj) in a.iter_mut().zip(w).take(np) {
            for (i, wv) in wj.chunks_exact(LANES).enumerate().take(kp) {
                // SAFETY: the tile's rows and pairs (`check`).
                let xp = unsafe { x.at(r, i) };
                let (xe, xo) = (widen(xp as u16), widen((xp >> 16) as u16));
                for (s, &wp) in aj.iter_mut().zip(wv) {
                    let (we, wo) = (widen(wp as u16), widen((wp >> 16) as u16));
                    *s = flush(xo.mul_add(wo, *s));
                    *s = flush(xe.mul_add(we, *s));
                }
            }
        }
    }
}

/// [`tile_native`] of `rows` rows (1, 2, 4 or [`ROWS`]) and `np` panels (1 or 2).
///
/// # Safety
/// As [`tile_native`].
#[cfg(target_arch = "x86_64")]
unsafe fn tile_native_sized(
    (rows, np): (usize, usize),
    w: [&[u32]; 2],
    x: PairInput,
    kp: usize,
    b: &Acc,
    out: (Out, usize, usize, usize),
) {
    match (rows, np) {
        (8, 2) => tile_native::<8, 2>(w, x, kp, b, out),
        (8, _) => tile_native::<8, 1>(w, x, kp, b, out),
        (4, 2) => tile_native::<4, 2>(w, x, kp, b, out),
        (4, _) => tile_native::<4, 1>(w, x, kp, b, out),
        (2, 2) => tile_native::<2, 2>(w, x, kp, b, out),
        (2, _) => tile_native::<2, 1>(w, x, kp, b, out),
        (_, 2) => tile_native::<1, 2>(w, x, kp, b, out),
        _ => tile_native::<1, 1>(w, x, kp, b, out),
    }
}

/// Native: `R` rows of `NP` panels by `vdpbf16ps`. Each pair is broadcast as the
/// instruction's memory operand (`{1to16}`, a load, no shuffle), so the pairs need no
/// widening ([`Wide`]). Each sum starts from its bias lane `b` in a register, and goes from
/// the register straight to `y` (`out`: `y`, its row length `n`, the tile's first row and
/// first panel; lanes past `n` masked).
///
/// # Safety
/// This CPU runs AVX-512 BF16; the rows and panels are inside `y`, and this thread owns them.
#[allow(clippy::needless_range_loop)] // register-indexed loops mirror the accumulators
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn tile_native<const R: usize, const NP: usize>(
    w: [&[u32]; 2],
    x: PairInput,
    kp: usize,
    b: &Acc,
    out: (Out, usize, usize, usize),
) {
    use std::arch::x86_64::*;
    debug_assert!((out.3 + NP - 1) * LANES < out.1);
    let bias: [__m512; NP] = std::array::from_fn(|j| _mm512_loadu_ps(b[j].as_ptr()));
    let mut s = [bias; R];
    for i in 0..kp {
        let wv: [__m512bh; NP] = std::array::from_fn(|j| {
            std::mem::transmute(_mm512_loadu_si512(w[j].as_ptr().add(i * LANES).cast()))
        });
        for r in 0..R {
            let xp: __m512bh = std::mem::transmute(_mm512_set1_epi32(x.at(r, i) as i32));
            for j in 0..NP {
                s[r][j] = _mm512_dpbf16_ps(s[r][j], wv[j], xp);
            }
        }
    }
    store_sums(&s, out);
}

/// Sets MXCSR's flush-to-zero and denormals-are-zero bits for its lifetime (this thread).
#[cfg(target_arch = "x86_64")]
struct FlushDenormals(u32);

#[cfg(target_arch = "x86_64")]
impl FlushDenormals {
    fn set() -> Self {
        let mut old = 0u32;
        // SAFETY: reads and writes this thread's MXCSR; restored on drop.
        unsafe {
            std::arch::asm!("stmxcsr [{}]", in(reg) &mut old, options(nostack));
            let new = old | 0x8040; // FTZ (bit 15), DAZ (bit 6)
            std::arch::asm!("ldmxcsr [{}]", in(reg) &new, options(nostack));
        }
        Self(old)
    }
}

#[cfg(target_arch = "x86_64")]
impl Drop for FlushDenormals {
    fn drop(&mut self) {
        // SAFETY: restores the MXCSR this thread had.
        unsafe { std::arch::asm!("ldmxcsr [{}]", in(reg) &self.0, options(nostack)) };
    }
}

/// AVX2: `R` rows (up to [`AVX2_ROWS`]) of one panel (two 8-lane halves), from the widened
/// input: 12 sums in the 16 registers, two for the panel's weights (widened in registers,
/// exact) and one for an input broadcast from memory. Each sum starts from its bias lane `b`
/// and takes its odd product, then its even one, pair by pair; the sums go from the registers
/// straight to `y` (`out`: `y`, its row length `n`, the tile's first row and the panel; lanes
/// past `n` masked). MXCSR's flush bits are set by the caller. (Weights kept widened at load,
/// two f32 planes and twice the bytes, measured no faster.)
///
/// # Safety
/// This CPU runs AVX2 and FMA; the rows and the panel are inside `y`, and this thread owns them.
#[allow(clippy::needless_range_loop)] // register-indexed loops mirror the accumulators
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2<const R: usize>(
    panel: &[u32],
    x: &[f32],
    kp: usize,
    b: &[f32; LANES],
    (y, n, r0, p): (Out, usize, usize, usize),
) {
    use std::arch::x86_64::*;
    debug_assert!(panel.len() == kp * LANES && x.len() == 2 * R * kp && p * LANES < n);
    let hi = _mm256_set1_epi32(0xffff_0000u32 as i32);
    let bias: [__m256; 2] = std::array::from_fn(|h| _mm256_loadu_ps(b.as_ptr().add(8 * h)));
    let mut s = [bias; R];
    for i in 0..kp {
        let (w, xi) = (
            panel.as_ptr().add(i * LANES).cast::<__m256i>(),
            x.as_ptr().add(2 * R * i),
        );
        // each sum takes its odd product first, then its even one
        let wo: [__m256; 2] = std::array::from_fn(|h| {
            _mm256_castsi256_ps(_mm256_and_si256(_mm256_loadu_si256(w.add(h)), hi))
        });
        for r in 0..R {
            let v = _mm256_broadcast_ss(&*xi.add(r));
            for h in 0..2 {
                s[r][h] = _mm256_fmadd_ps(wo[h], v, s[r][h]);
            }
        }
        let we: [__m256; 2] = std::array::from_fn(|h| {
            _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256(w.add(h)), 16))
        });
        for r in 0..R {
            let v = _mm256_broadcast_ss(&*xi.add(R + r));
            for h in 0..2 {
                s[r][h] = _mm256_fmadd_ps(we[h], v, s[r][h]);
            }
        }
    }
    let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for h in 0..2 {
        let o = p * LANES + 8 * h;
        let live = n.saturating_sub(o).min(8);
        if live == 0 {
            continue;
        }
        let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(live as i32), lane);
        for r in 0..R {
            let dst = y.0.add((r0 + r) * n + o);
            match live {
                8 => _mm256_storeu_ps(dst, s[r][h]),
                _ => _mm256_maskstore_ps(dst, mask, s[r][h]),
            }
        }
    }
}

/// The instruction set a model's products run with, for `precision` on `device` in `dtype`
/// (`None` off the native CPU engine): `"avx512bf16"`, `"avx512"`, `"avx2"` or `"portable"`,
/// capped by `MIMI_PY_ISA`. float32 products use AVX-512 at most; bf16-stored weights also
/// `vdpbf16ps` in the matrix-vector kernel; `"medium"` runs
/// [`Path::best`]. Asked of the kernels by the layer that reports
/// it (the binding's `kernel_isa`), so that `runtime/` names no kernel.
pub fn kernel_isa(
    precision: crate::runtime::precision::Precision,
    device: &candle::Device,
    dtype: candle::DType,
) -> Option<&'static str> {
    use super::cpu::{level, Level};
    use crate::runtime::precision::Precision;
    let isa = match precision {
        Precision::Highest => level().min(Level::Avx512),
        Precision::High => level(),
        Precision::Medium => Path::best().level(),
    };
    (device.is_cpu() && dtype == candle::DType::F32).then(|| isa.name())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::test_input;
    use half::bf16;
    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|f| f.to_bits()).collect()
    }

    fn paths() -> Vec<Path> {
        [Path::Native, Path::Avx512, Path::Avx2, Path::Portable]
            .into_iter()
            .filter(|p| p.available())
            .collect()
    }

    fn product(
        path: Path,
        x: &[f32],
        w: &[f32],
        b: Option<&[f32]>,
        (m, k, n): (usize, usize, usize),
    ) -> Vec<f32> {
        let packed = PairPacked::pack(w, n, k);
        let mut xp = Vec::new();
        round_pairs(x, m, k, &mut xp);
        let mut y = vec![f32::NAN; m * n];
        packed.matmul_on(path, PairInput::rows(&xp, k.div_ceil(2)), m, b, &mut y);
        // pair-major input, and the pool's product: the same bits
        let kp = k.div_ceil(2);
        let cols: Vec<u32> = (0..kp * m).map(|j| xp[(j % m) * kp + j / m]).collect();
        let mut y2 = vec![f32::NAN; m * n];
        packed.matmul_on(path, PairInput::columns(&cols, m), m, b, &mut y2);
        assert_eq!(bits(&y2), bits(&y), "{path:?}: pair-major input");
        if path == Path::best() {
            packed.matmul(PairInput::rows(&xp, kp), m, b, &mut y2);
            assert_eq!(bits(&y2), bits(&y), "the pool's product");
        }
        y
    }

    /// Rounding to nearest even as `half` does, denormals flushed, NaN kept.
    #[test]
    fn rounding_is_to_nearest_even_with_denormals_flushed() {
        for v in test_input(1, 1, 4096, 3).iter().map(|v| v * 1e3) {
            assert_eq!(to_bf16(v), bf16::from_f32(v).to_bits(), "{v}");
        }
        assert_eq!(to_bf16(1e-40), 0);
        assert_eq!(to_bf16(-1e-40), 0x8000);
        assert!(widen(to_bf16(f32::NAN)).is_nan());
        assert_eq!(to_bf16(f32::INFINITY), 0x7f80);
    }

    /// Every path this CPU runs gives the same bits, on every shape (odd k, n past a panel,
    /// a partial row tile), with and without a bias; and each is within bf16's rounding of the
    /// float64 product.
    #[test]
    fn every_path_gives_the_same_bits() {
        assert!(paths().contains(&Path::Portable));
        // (50, 1030, 70): the AVX2 path's tiles of 5 and 6 rows, the AVX-512 path's of 10, in
        // blocks; (2, 40, 70): the AVX-512 path's 4 panels and a last one; (24, 9, 33): its
        // tiles of 12 rows
        let shapes = [(1, 2, 1), (3, 7, 17), (5, 64, 33), (9, 513, 40), (4, 1, 16)];
        let more = [(50, 1030, 70), (2, 40, 70), (24, 9, 33)];
        for (m, k, n) in shapes.into_iter().chain(more) {
            let (x, w) = (test_input(1, m, k, 11), test_input(1, n, k, 12));
            let bias = test_input(1, 1, n, 13);
            for b in [None, Some(&bias[..])] {
                let want = product(Path::Portable, &x, &w, b, (m, k, n));
                for path in paths() {
                    let got = product(path, &x, &w, b, (m, k, n));
                    assert_eq!(bits(&got), bits(&want), "{path:?} m {m} k {k} n {n}");
                }
                for (i, &y) in want.iter().enumerate() {
                    let (r, o) = (i / n, i % n);
                    let exact: f64 = (0..k)
                        .map(|j| x[r * k + j] as f64 * w[o * k + j] as f64)
                        .sum::<f64>()
                        + b.map_or(0.0, |b| b[o] as f64);
                    let tol = 2f64.powi(-7) * (k as f64).sqrt() + 1e-6;
                    assert!(
                        (y as f64 - exact).abs() <= tol,
                        "m {m} k {k} n {n} ({r}, {o}): {y} vs {exact}"
                    );
                }
            }
        }
    }

    /// The order `vdpbf16ps` defines: the odd element's product first. With a sum of 1, terms
    /// of 1.5 x 2^-24 (odd) and 2^-24 (even) give 1 + 2^-22; the other order gives 1 + 2^-23.
    #[test]
    fn the_odd_element_is_summed_first() {
        let e = 2f32.powi(-24);
        let (x, w) = ([1.0f32, 1.5], [e, e]);
        for path in paths() {
            let y = product(path, &x, &w, Some(&[1.0]), (1, 2, 1));
            assert_eq!(y[0], 1.0 + 2f32.powi(-22), "{path:?}");
        }
    }

    /// A sum that would be denormal is a zero (FTZ), on every path.
    #[test]
    fn denormal_sums_are_flushed() {
        let t = 2f32.powi(-70);
        for path in paths() {
            let y = product(path, &[t, 0.0], &[t, 0.0], None, (1, 2, 1));
            assert_eq!(y[0].to_bits(), 0, "{path:?}: {}", y[0]);
            let y = product(path, &[-t, 0.0], &[t, 0.0], None, (1, 2, 1));
            assert_eq!(y[0].to_bits(), 0x8000_0000, "{path:?}: {}", y[0]);
        }
    }

    /// The native path is tested where the CPU has it (reported ignored elsewhere).
    #[test]
    #[cfg_attr(not(mimi_cpu_avx512bf16), ignore = "no AVX-512 BF16 on this CPU")]
    fn the_native_path_runs_here() {
        assert!(paths().contains(&Path::Native));
    }

    /// Times each path on Mimi-like shapes (`cargo test --release -- --ignored --nocapture
    /// paths_speed`): what [`Path::best`]'s order rests on. The last shape's input is
    /// pair-major, as a convolution's tile of 2048 frames gathers it.
    #[test]
    #[ignore = "a timing, run by hand"]
    #[allow(clippy::print_stdout)] // its output is the point
    fn paths_speed() {
        let shapes = [
            (256, 512, 512),
            (8, 2048, 512),
            (256, 192, 64),
            (2048, 256, 256),
        ];
        for ((m, k, n), cols) in shapes.into_iter().zip([false, false, false, true]) {
            let (x, w) = (test_input(1, m, k, 1), test_input(1, n, k, 2));
            let packed = PairPacked::pack(&w, n, k);
            let (mut xp, kp) = (Vec::new(), k.div_ceil(2));
            round_pairs(&x, m, k, &mut xp);
            if cols {
                xp = (0..kp * m).map(|j| xp[(j % m) * kp + j / m]).collect();
            }
            let input = match cols {
                true => PairInput::columns(&xp, m),
                false => PairInput::rows(&xp, kp),
            };
            let mut y = vec![0f32; m * n];
            for path in paths() {
                let t = std::time::Instant::now();
                let reps = 20;
                for _ in 0..reps {
                    packed.matmul_on(path, input, m, None, &mut y);
                }
                let s = t.elapsed().as_secs_f64() / reps as f64;
                let gf = 2.0 * (m * n * k) as f64 / s / 1e9;
                let c = if cols { " pair-major" } else { "" };
                println!(
                    "{m}x{k}x{n}{c} {path:?}: {:.1} us, {gf:.1} GFLOP/s",
                    s * 1e6
                );
            }
        }
    }
}
