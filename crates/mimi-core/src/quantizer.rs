//! The split residual vector quantizer (Mimi's: a semantic quantizer of one codebook and an
//! acoustic one of `n_q - 1`, both fed the latents), computed as candle-transformers'
//! `mimi::quantization` computes it, plus a CPU path for streaming steps.
//!
//! candle's module holds every codebook twice (`embed_sum` and the centroids), and its encode
//! runs ~8 small ops per codebook through its general kernels: ~2 ms of a streaming frame for
//! one or two latent frames. Here the centroids are held once, and the general path performs
//! candle's tensor ops in candle's order (the same bits: a Rust test compares both with
//! candle's module). For up to [`GEMV_MAX_ROWS`] frames on the CPU in f32, encode computes the
//! same steps on slices instead: the products with the packed kernel (each codebook packed
//! once at load, and read once per step for all rows), then argmin and the residual update in
//! one pass.

use crate::config::CodecConfig;
use crate::error::{Error, Result};
use crate::kernels::{gemv_into, with_scratch, Packed, GEMV_MAX_ROWS};
use candle::{DType, Module, Tensor, D};
use candle_nn::{Conv1d, VarBuilder};
use std::cell::Cell;

thread_local! {
    /// The slice path's working buffers, kept between steps (a warm step allocates none):
    /// the projected rows and the codebook products of an encode; the centroid sums and
    /// the acoustic part of a decode.
    static PROJECTED: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    static PRODUCTS: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    static SUMS: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    static ACOUSTIC: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// candle's floor on a centroid's usage count when it averages `embed_sum`.
const USAGE_EPSILON: f64 = 1e-5;

/// One codebook: its centroids (bins, dim) and half their squared norms (bins); on the CPU in
/// f32, the centroids packed again for the slice path's products.
struct Codebook {
    centroids: Tensor,
    half_norms: Tensor,
    packed: Option<Packed<f32>>,
}

/// One of the split pair: its projections in (input_dim -> dim) and out, and its codebooks.
struct Residual {
    input_proj: Conv1d,
    output_proj: Conv1d,
    codebooks: Vec<Codebook>,
}

pub struct Quantizer {
    /// The semantic quantizer, then the acoustic one.
    parts: [Residual; 2],
}

/// The f32 data of a contiguous CPU tensor, for `f`.
fn with_slice<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    let (storage, layout) = t.storage_and_layout();
    match (&*storage, layout.contiguous_offsets()) {
        (candle::Storage::Cpu(candle::CpuStorage::F32(v)), Some((a, b))) => Ok(f(&v[a..b])),
        _ => Err(Error::Internal(
            "the quantizer's CPU path needs contiguous f32 CPU tensors".into(),
        )),
    }
}

/// The index of the first smallest value, as candle's `argmin` picks it.
fn argmin(v: impl Iterator<Item = f32>) -> usize {
    let (mut at, mut best) = (0, f32::NAN);
    for (i, x) in v.enumerate() {
        if i == 0 || best > x {
            (at, best) = (i, x);
        }
    }
    at
}

impl Codebook {
    /// Centroids `embed_sum / max(cluster_usage, eps)`, as candle computes them.
    fn load(vb: &VarBuilder, bins: usize, dim: usize) -> Result<Self> {
        vb.get(1, "initialized")?; // part of the layout, unused
        let usage = vb.get(bins, "cluster_usage")?;
        let centroids = vb
            .get((bins, dim), "embed_sum")?
            .broadcast_div(&usage.maximum(USAGE_EPSILON)?.unsqueeze(1)?)?;
        let half_norms = ((&centroids * &centroids)?.sum(D::Minus1)? / 2.0)?;
        let packed = match centroids.device().is_cpu() && centroids.dtype() == DType::F32 {
            true => Some(with_slice(&centroids, |e| Packed::pack(&[e], dim))?),
            false => None,
        };
        Ok(Self {
            centroids,
            half_norms,
            packed,
        })
    }

    /// The centroids of codes (B, T): (B, dim, T).
    fn lookup(&self, codes: &Tensor) -> Result<Tensor> {
        let (b, t) = codes.dims2()?;
        let rows = self.centroids.index_select(&codes.flatten_all()?, 0)?;
        Ok(rows.reshape((b, t, self.centroids.dim(1)?))?.t()?)
    }

    /// The nearest centroid of each row of `x` (B, dim, T): codes (B, T).
    fn nearest(&self, x: &Tensor) -> Result<Tensor> {
        let (b, _, t) = x.dims3()?;
        let dots = x.t()?.flatten_to(1)?.matmul(&self.centroids.t()?)?;
        let codes = self.half_norms.broadcast_sub(&dots)?.argmin(D::Minus1)?;
        Ok(codes.reshape((b, t))?)
    }
}

/// Bytes of a tensor as stored.
fn tensor_nbytes(t: &Tensor) -> usize {
    t.elem_count() * t.dtype().size_in_bytes()
}

impl Residual {
    fn weights_nbytes(&self) -> usize {
        let books: usize = (self.codebooks.iter())
            .map(|c| tensor_nbytes(&c.centroids) + tensor_nbytes(&c.half_norms))
            .sum();
        books + tensor_nbytes(self.input_proj.weight()) + tensor_nbytes(self.output_proj.weight())
    }
}

impl Residual {
    fn load(vb: &VarBuilder, n: usize, cfg: &CodecConfig) -> Result<Self> {
        let (dim, input_dim, bins) = (cfg.quantizer_dim, cfg.seanet.dimension, cfg.quantizer_bins);
        let conv = |shape, name| -> Result<Conv1d> {
            Ok(Conv1d::new(vb.get(shape, name)?, None, Default::default()))
        };
        Ok(Self {
            input_proj: conv((dim, input_dim, 1), "input_proj.weight")?,
            output_proj: conv((input_dim, dim, 1), "output_proj.weight")?,
            codebooks: (0..n)
                .map(|i| Codebook::load(&vb.pp(format!("layers.{i}.codebook")), bins, dim))
                .collect::<Result<_>>()?,
        })
    }

    /// Codes (B, n, T) of latents `x` (B, input_dim, T), each codebook quantizing what the
    /// ones before it left.
    fn encode(&self, x: &Tensor) -> Result<Tensor> {
        let mut residual = self.input_proj.forward(x)?;
        let mut codes = Vec::with_capacity(self.codebooks.len());
        for book in &self.codebooks {
            let c = book.nearest(&residual)?;
            residual = (residual - book.lookup(&c)?)?;
            codes.push(c);
        }
        Ok(Tensor::stack(&codes, 1)?)
    }

    /// [`Self::encode`] of `rows <= GEMV_MAX_ROWS` rows `xs` (rows, input_dim) on slices:
    /// writes codebook `j`'s code of row `i` at `codes[i * stride + j]`.
    fn encode_rows(&self, xs: &[f32], rows: usize, codes: &mut [u32], stride: usize) -> Result<()> {
        let (dim, k) = self.input_proj.weight().dims3().map(|(o, i, _)| (o, i))?;
        with_scratch(&PROJECTED, |r| {
            r.resize(rows * dim, 0.0);
            with_slice(self.input_proj.weight(), |w| {
                gemv_into(xs, w, (rows, k, dim), r)
            })?;
            // One buffer for every codebook's products.
            with_scratch(&PRODUCTS, |dots| {
                self.quantize_rows(r, rows, dots, (codes, stride))
            })
        })
    }

    /// [`Self::encode_rows`] after the input projection: each codebook's code of each of
    /// the `rows` projected rows `r`, which it leaves as the last residuals.
    fn quantize_rows(
        &self,
        r: &mut [f32],
        rows: usize,
        dots: &mut Vec<f32>,
        (codes, stride): (&mut [u32], usize),
    ) -> Result<()> {
        let dim = r.len() / rows.max(1);
        for (j, book) in self.codebooks.iter().enumerate() {
            let packed = (book.packed.as_ref()).ok_or_else(|| {
                Error::Internal("the quantizer's slice path needs the CPU".into())
            })?;
            with_slice(&book.half_norms, |half| {
                with_slice(&book.centroids, |e| {
                    dots.resize(rows * half.len(), 0.0);
                    packed.matmul(r, rows, None, dots);
                    for (i, row) in dots.chunks_exact(half.len()).enumerate() {
                        let code = argmin(half.iter().zip(row).map(|(h, d)| h - d));
                        codes[i * stride + j] = code as u32;
                        let centroid = &e[code * dim..(code + 1) * dim];
                        let residual = &mut r[i * dim..(i + 1) * dim];
                        residual.iter_mut().zip(centroid).for_each(|(a, c)| *a -= c);
                    }
                })
            })??;
        }
        Ok(())
    }

    /// Latents (B, input_dim, T) of codes (B, n, T): the centroids summed in order.
    fn decode(&self, codes: &Tensor) -> Result<Tensor> {
        let mut sum: Option<Tensor> = None;
        for (j, book) in self.codebooks.iter().enumerate() {
            let q = book.lookup(&codes.narrow(1, j, 1)?.squeeze(1)?)?;
            sum = Some(match sum {
                None => q,
                Some(s) => (s + q)?,
            });
        }
        let sum = sum.ok_or_else(|| Error::Internal("decoding with no codebook".into()))?;
        let (b, _, t) = sum.dims3()?;
        if !sum.device().is_cpu() || sum.dtype() != DType::F32 {
            return Ok(self.output_proj.forward(&sum)?);
        }
        let xs = sum.t()?.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
        let out = self.output_proj.weight().dim(0)?;
        let mut y = vec![0f32; b * t * out];
        self.project_out(&xs, &mut y)?;
        Ok(Tensor::from_vec(y, (b, t, out), sum.device())?
            .t()?
            .contiguous()?)
    }

    /// The output projection of tokens `xs` (tokens, dim): (tokens, input_dim). On the
    /// matrix-vector kernel, GEMV_MAX_ROWS rows a call: its rows do not depend on each
    /// other, so a frame decodes to the same bits in any batch (a batched step's row as its
    /// own step) and any call length.
    fn project_out(&self, xs: &[f32], y: &mut [f32]) -> Result<()> {
        let (out, dim, _) = self.output_proj.weight().dims3()?;
        if y.len() != xs.len() / dim.max(1) * out {
            return Err(Error::Internal(format!(
                "{} values for the projection of {} tokens of {out}",
                y.len(),
                xs.len() / dim.max(1)
            )));
        }
        with_slice(self.output_proj.weight(), |w| {
            let ys = y.chunks_mut(GEMV_MAX_ROWS * out);
            for (rows, y) in xs.chunks(GEMV_MAX_ROWS * dim).zip(ys) {
                gemv_into(rows, w, (rows.len() / dim, dim, out), y);
            }
        })
    }

    /// [`Self::decode`] on slices: the codebooks `first..` of `codes` (rows, n_q, frames)
    /// give the latents' tokens (rows × frames, input_dim) in `y`, the same bits as `decode`
    /// on the CPU in f32 (the centroids summed in the same order).
    fn decode_tokens(
        &self,
        codes: &[u32],
        (rows, n_q, t): (usize, usize, usize),
        first: usize,
        y: &mut [f32],
    ) -> Result<()> {
        let dim = self.output_proj.weight().dim(1)?;
        with_scratch(&SUMS, |sum| {
            sum.resize(rows * t * dim, 0.0);
            self.sum_centroids(codes, (n_q, t, first), sum)?;
            self.project_out(sum, y)
        })
    }

    /// The centroids that `codes` (see [`Self::decode_tokens`]) name, summed over the
    /// codebooks in order, into `sum` (tokens, dim).
    fn sum_centroids(
        &self,
        codes: &[u32],
        (n_q, t, first): (usize, usize, usize),
        sum: &mut [f32],
    ) -> Result<()> {
        let dim = self.output_proj.weight().dim(1)?;
        for (j, book) in self.codebooks.iter().enumerate() {
            with_slice(&book.centroids, |e| {
                let bins = e.len() / dim.max(1);
                for (i, s) in sum.chunks_exact_mut(dim).enumerate() {
                    let (row, frame) = (i / t, i % t);
                    let code = codes[(row * n_q + first + j) * t + frame] as usize;
                    if code >= bins {
                        return Err(Error::InvalidInput(format!(
                            "code {code} is out of range for a codebook of {bins} entries"
                        )));
                    }
                    let c = &e[code * dim..(code + 1) * dim];
                    match j {
                        0 => s.copy_from_slice(c),
                        _ => s.iter_mut().zip(c).for_each(|(a, c)| *a += c),
                    }
                }
                Ok(())
            })??;
        }
        if self.codebooks.is_empty() {
            return Err(Error::Internal("decoding with no codebook".into()));
        }
        Ok(())
    }
}

impl Quantizer {
    /// Bytes of its projections and codebooks, as stored.
    pub fn weights_nbytes(&self) -> usize {
        self.parts.iter().map(Residual::weights_nbytes).sum()
    }
}

impl Quantizer {
    /// Reads the quantizer's tensors from `vb` (at `quantizer.`, f32).
    pub fn load(cfg: &CodecConfig, vb: &VarBuilder) -> Result<Self> {
        let n_acoustic = cfg.quantizer_n_q.saturating_sub(1);
        Ok(Self {
            parts: [
                Residual::load(&vb.pp("semantic_residual_vector_quantizer"), 1, cfg)?,
                Residual::load(
                    &vb.pp("acoustic_residual_vector_quantizer"),
                    n_acoustic,
                    cfg,
                )?,
            ],
        })
    }

    /// The codebooks of both parts.
    pub(crate) fn n_q(&self) -> usize {
        self.parts.iter().map(|p| p.codebooks.len()).sum()
    }

    /// Codes (B, n_q, T) u32 of latents (B, input_dim, T) f32.
    pub fn encode(&self, x: &Tensor) -> Result<Tensor> {
        let (b, _, t) = x.dims3()?;
        let rows = b * t;
        if rows == 0 {
            return Ok(Tensor::zeros((b, self.n_q(), t), DType::U32, x.device())?);
        }
        if rows > GEMV_MAX_ROWS || !x.device().is_cpu() || x.dtype() != DType::F32 {
            return self.encode_tensor(x);
        }
        let xs = x.t()?.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
        let mut codes = vec![0u32; rows * self.n_q()];
        self.encode_tokens(&xs, rows, &mut codes)?;
        let codes = Tensor::from_vec(codes, (b, t, self.n_q()), x.device())?;
        Ok(codes.t()?.contiguous()?)
    }

    /// [`Self::encode`] on candle's tensor ops, whatever the rows (the path of more than
    /// [`GEMV_MAX_ROWS`] tokens, other devices and dtypes).
    fn encode_tensor(&self, x: &Tensor) -> Result<Tensor> {
        let parts = self
            .parts
            .iter()
            .filter(|p| !p.codebooks.is_empty())
            .map(|p| p.encode(x))
            .collect::<Result<Vec<_>>>()?;
        Ok(Tensor::cat(&parts, 1)?)
    }

    /// Whether [`Self::encode_tokens`] takes `rows` tokens: one to [`GEMV_MAX_ROWS`]
    /// (more take [`Self::encode`]'s tensor path).
    pub fn takes_tokens(rows: usize) -> bool {
        (1..=GEMV_MAX_ROWS).contains(&rows)
    }

    /// Codes of `rows` tokens `xs` (rows, input_dim) on slices into `codes` (rows, n_q),
    /// each token's codes together; the bits of [`Self::encode`] on the CPU in f32. Refuses
    /// more rows than [`Self::takes_tokens`] allows. Once warm, it allocates nothing.
    pub fn encode_tokens(&self, xs: &[f32], rows: usize, codes: &mut [u32]) -> Result<()> {
        let n_q = self.n_q();
        if !Self::takes_tokens(rows) || codes.len() != rows * n_q {
            return Err(Error::Internal(format!(
                "the quantizer's slice path takes 1 to {GEMV_MAX_ROWS} rows and room for \
                 their {n_q} codes each, got {rows} rows and {} codes",
                codes.len()
            )));
        }
        self.parts[0].encode_rows(xs, rows, codes, n_q)?;
        self.parts[1].encode_rows(xs, rows, &mut codes[1..], n_q)
    }

    /// [`Self::encode_tokens`] of any number of tokens, in chunks of [`GEMV_MAX_ROWS`]: a
    /// token's codes depend on it alone, so they are the same bits in any chunk.
    pub fn encode_token_chunks(&self, xs: &[f32], rows: usize, codes: &mut [u32]) -> Result<()> {
        let (n_q, dim) = (self.n_q(), xs.len() / rows.max(1));
        let chunks = xs.chunks(GEMV_MAX_ROWS * dim.max(1));
        for (x, c) in chunks.zip(codes.chunks_mut(GEMV_MAX_ROWS * n_q)) {
            self.encode_tokens(x, x.len() / dim.max(1), c)?;
        }
        Ok(())
    }

    /// The reconstruction of codes `(rows, k, frames)` (C order; the first `n_q` of the `k`
    /// read) on slices: the latents' tokens (rows × frames, input_dim) into `y`, the bits of
    /// [`Self::decode`] on the CPU in f32. Once warm, it allocates nothing.
    pub fn decode_tokens(
        &self,
        codes: &[u32],
        (rows, k, frames): (usize, usize, usize),
        y: &mut [f32],
    ) -> Result<()> {
        if k < self.n_q() || codes.len() != rows * k * frames {
            return Err(Error::Shape(format!(
                "expected codes of shape ({rows}, >= {}, {frames}), got {} values in ({rows}, {k}, {frames})",
                self.n_q(),
                codes.len()
            )));
        }
        let shape = (rows, k, frames);
        self.parts[0].decode_tokens(codes, shape, 0, y)?;
        if self.n_q() > 1 {
            with_scratch(&ACOUSTIC, |acoustic| {
                acoustic.resize(y.len(), 0.0);
                self.parts[1].decode_tokens(codes, shape, 1, acoustic)?;
                y.iter_mut().zip(&*acoustic).for_each(|(s, a)| *s += a);
                Ok::<(), Error>(())
            })?;
        }
        Ok(())
    }

    /// The reconstruction of codes (B, n_q, T): latents (B, input_dim, T).
    pub fn decode(&self, codes: &Tensor) -> Result<Tensor> {
        let semantic = self.parts[0].decode(&codes.narrow(1, 0, 1)?)?;
        if self.n_q() == 1 {
            return Ok(semantic);
        }
        let acoustic = self.parts[1].decode(&codes.narrow(1, 1, self.n_q() - 1)?)?;
        Ok((semantic + acoustic)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::test_input;
    use crate::weights::TensorSource;
    use candle::Device;
    use candle_transformers::models::mimi::quantization::SplitResidualVectorQuantizer as Split;
    use std::sync::Arc;

    /// Both paths give candle's codes and decoding (to rounding: the slice path sums in
    /// another order), on the real shapes (512 -> 256, 2048 bins, 8 codebooks): the slice
    /// path up to 32 rows, the tensor path above (33 rows); each item decodes as it would
    /// alone.
    #[test]
    fn encode_matches_candles_module() {
        let dev = Device::Cpu;
        let source = Arc::new(TensorSource::seeded(3, None));
        for n_q in [1, 8] {
            let cfg = CodecConfig::mimi(n_q);
            let vb = source.var_builder(DType::F32, &dev).pp("quantizer");
            let ours = Quantizer::load(&cfg, &vb).unwrap();
            let (dim, d, bins) = (cfg.quantizer_dim, cfg.seanet.dimension, cfg.quantizer_bins);
            let reference = Split::new(dim, Some(d), Some(d), n_q, bins, vb).unwrap();
            // (batch, frames): the slice path up to GEMV_MAX_ROWS (32) rows, the tensor path
            // past it, none
            let shapes = [
                (1, 1),
                (1, 2),
                (2, 2),
                (1, 4),
                (3, 1),
                (2, 4),
                (1, 9),
                (3, 11),
                (2, 0),
            ];
            for (b, t) in shapes {
                // latents at about their real scale
                let seed = b as u64 * 10 + t as u64;
                let x = Tensor::from_vec(test_input(b, d, t, seed), (b, d, t), &dev).unwrap();
                let x = (x * 4.0).unwrap();
                let got = ours.encode(&x).unwrap();
                assert_eq!(got.dims(), &[b, n_q, t]);
                if t == 0 {
                    continue; // candle's module fails on no frames
                }
                let want = reference.encode(&x).unwrap();
                assert_eq!(
                    got.to_vec3::<u32>().unwrap(),
                    want.to_vec3::<u32>().unwrap(),
                    "n_q {n_q} b {b} t {t}"
                );
                let back = ours.decode(&got).unwrap();
                let back_ref = reference.decode(&want).unwrap();
                // The slice path sums in the matrix-vector kernel's order, not candle's.
                assert!(crate::testutil::max_abs_diff(&back, &back_ref) < 1e-5);
                // A batch item decodes to the bits of its own decoding (a batched step's row),
                // on either path.
                let one = ours.decode(&got.narrow(0, b - 1, 1).unwrap()).unwrap();
                let last = back.narrow(0, b - 1, 1).unwrap();
                assert_eq!(
                    crate::testutil::max_abs_diff(&last, &one),
                    0.0,
                    "b {b} t {t}"
                );
            }
        }
    }

    /// The slice paths a native streaming step takes give the bits of the tensor paths:
    /// encoding any number of tokens the slice path takes (against the tensor path itself,
    /// which `encode` takes past `GEMV_MAX_ROWS` tokens), decoding any number of frames
    /// (more codebooks in the codes than the quantizer reads included); a code out of range
    /// is refused.
    #[test]
    fn token_paths_give_the_tensor_paths_bits() {
        let dev = Device::Cpu;
        let cfg = CodecConfig::mimi(4);
        let source = Arc::new(TensorSource::seeded(5, None));
        let q =
            Quantizer::load(&cfg, &source.var_builder(DType::F32, &dev).pp("quantizer")).unwrap();
        let d = cfg.seanet.dimension;
        for (b, t) in [(1, 1), (2, 3), (4, 8), (3, 11)] {
            let x = Tensor::from_vec(test_input(b, d, t, 7), (b, d, t), &dev).unwrap();
            let x = (x * 4.0).unwrap();
            let codes = q.encode_tensor(&x).unwrap();
            assert_eq!(q.encode(&x).unwrap().dims3().unwrap(), (b, 4, t));
            if Quantizer::takes_tokens(b * t) {
                let xs = x.t().unwrap().contiguous().unwrap().flatten_all().unwrap();
                let mut got = vec![0u32; b * t * 4];
                (q.encode_tokens(&xs.to_vec1::<f32>().unwrap(), b * t, &mut got)).unwrap();
                // A slice of another size is refused.
                assert!(q
                    .encode_tokens(&xs.to_vec1::<f32>().unwrap(), b * t, &mut [0])
                    .is_err());
                let want = codes
                    .t()
                    .unwrap()
                    .contiguous()
                    .unwrap()
                    .flatten_all()
                    .unwrap();
                assert_eq!(got, want.to_vec1::<u32>().unwrap(), "b {b} t {t}");
            }
            for extra in [0, 2] {
                let k = 4 + extra;
                let pad = Tensor::zeros((b, extra, t), DType::U32, &dev).unwrap();
                let wide = Tensor::cat(&[&codes, &pad], 1).unwrap();
                let host = wide.flatten_all().unwrap().to_vec1::<u32>().unwrap();
                let mut got = vec![f32::NAN; b * t * d];
                q.decode_tokens(&host, (b, k, t), &mut got).unwrap();
                let want = q.decode(&wide).unwrap().t().unwrap().contiguous().unwrap();
                assert_eq!(got, want.flatten_all().unwrap().to_vec1::<f32>().unwrap());
            }
        }
        let bins = cfg.quantizer_bins as u32;
        let mut y = vec![0f32; d];
        assert!(q
            .decode_tokens(&[0, 1, bins, 2], (1, 4, 1), &mut y)
            .is_err());
        assert!(q.decode_tokens(&[0, 1, 2], (1, 3, 1), &mut y).is_err());
        assert!(q
            .decode_tokens(&[0, 1, 2, 3], (1, 4, 1), &mut y[1..])
            .is_err());
        assert!(q.encode_tokens(&[], 0, &mut []).is_err());
    }

    #[test]
    fn argmin_picks_the_first_smallest() {
        assert_eq!(argmin([3.0, 1.0, 2.0, 1.0].into_iter()), 1);
        assert_eq!(argmin([0.5].into_iter()), 0);
        assert_eq!(argmin([2.0, f32::NAN, 1.0].into_iter()), 2);
    }
}
