//! The Mimi codec (audio <-> tokens), computed with candle.
//!
//! Reused from candle-transformers' `mimi`: on GPUs, the SEANet encoder/decoder and the learnt
//! down/upsampling convolutions. On the CPU those convolutional parts run on this crate's
//! native engine ([`crate::seanet`], the same functions, several times faster). Owned
//! here: the two transformers (this crate's [`Transformer`], exact window, unbounded streams),
//! the quantizer ([`Quantizer`]), the wiring, the checkpoint readers for both real layouts, and
//! the streaming state.
//!
//! Offline calls use fresh, private state and never touch the streaming state; streaming
//! calls go through [`EncodeStream`] / [`DecodeStream`].

use crate::config::{CodecConfig, PadMode};
use crate::conv::{self, Conv1d, ConvSpec, ConvTr1d, Frames};
use crate::error::{Cancel, Error, Result};
use crate::quantizer::Quantizer;
use crate::seanet;
use crate::transformer::{State, Transformer};
use crate::weights::{self, QkLayout, TensorSource};
use candle::{DType, Device, Module, StreamTensor, StreamingModule, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::mimi::conv::{ConvDownsample1d, ConvTrUpsample1d};
use candle_transformers::models::mimi::seanet::{SeaNetDecoder, SeaNetEncoder};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use rayon::prelude::*;

/// The two real checkpoint layouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointLayout {
    /// Hugging Face kyutai/mimi `model.safetensors`: candle's names, q/k half-split.
    Hf,
    /// Kyutai's moshi checkpoint (`tokenizer-e351c8d8-checkpoint125.safetensors`):
    /// `encoder.model.*`, `in_proj_weight`, `linear1`, `norm1`, ...; q/k interleaved.
    Moshi,
}

impl CheckpointLayout {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Hf => "hf",
            Self::Moshi => "moshi",
        }
    }
}

/// Tells the layouts apart by their tensor names.
pub fn detect_layout<'a>(names: impl Iterator<Item = &'a String>) -> Option<CheckpointLayout> {
    let (mut hf, mut moshi) = (0usize, 0usize);
    for n in names {
        if n.starts_with("encoder.model.")
            || n.contains("_transformer.transformer.layers.")
            || n.starts_with("quantizer.rvq_")
        {
            moshi += 1;
        } else if n.starts_with("encoder.layers.")
            || (n.contains("_transformer.layers.") && !n.contains(".transformer.layers."))
            || n.starts_with("quantizer.semantic_residual_vector_quantizer.")
        {
            hf += 1;
        }
    }
    match (hf > 0, moshi > 0) {
        (true, false) => Some(CheckpointLayout::Hf),
        (false, true) => Some(CheckpointLayout::Moshi),
        _ => None,
    }
}

/// Candle's name(s) for one moshi-checkpoint tensor; `in_proj_*` maps to q/k/v (split later).
fn moshi_name(name: &str) -> String {
    let mut n = name.to_string();
    for (side, _) in [("encoder", ()), ("decoder", ())] {
        let p = format!("{side}.model.");
        if let Some(rest) = n.strip_prefix(&p) {
            let rest = rest
                .replace(".conv.conv.", ".conv.")
                .replace(".convtr.convtr.", ".conv.");
            n = format!("{side}.layers.{rest}");
        }
    }
    if n == "downsample.conv.conv.conv.weight" {
        return "downsample.conv.weight".into();
    }
    if n == "upsample.convtr.convtr.convtr.weight" {
        return "upsample.conv.weight".into();
    }
    for side in ["encoder_transformer", "decoder_transformer"] {
        let p = format!("{side}.transformer.layers.");
        if let Some(rest) = n.strip_prefix(&p) {
            let (idx, field) = rest.split_once('.').unwrap_or((rest, ""));
            let field = match field {
                "self_attn.out_proj.weight" => "self_attn.o_proj.weight",
                "self_attn.out_proj.bias" => "self_attn.o_proj.bias",
                "linear1.weight" => "mlp.fc1.weight",
                "linear1.bias" => "mlp.fc1.bias",
                "linear2.weight" => "mlp.fc2.weight",
                "linear2.bias" => "mlp.fc2.bias",
                "norm1.weight" => "input_layernorm.weight",
                "norm1.bias" => "input_layernorm.bias",
                "norm2.weight" => "post_attention_layernorm.weight",
                "norm2.bias" => "post_attention_layernorm.bias",
                "layer_scale_1.scale" => "self_attn_layer_scale.scale",
                "layer_scale_2.scale" => "mlp_layer_scale.scale",
                other => other,
            };
            return format!("{side}.layers.{idx}.{field}");
        }
    }
    for (from, to) in [
        (
            "quantizer.rvq_first.",
            "quantizer.semantic_residual_vector_quantizer.",
        ),
        (
            "quantizer.rvq_rest.",
            "quantizer.acoustic_residual_vector_quantizer.",
        ),
    ] {
        if let Some(rest) = n.strip_prefix(from) {
            let rest = match rest.strip_prefix("vq.layers.") {
                Some(r) => {
                    let r = r
                        .replace("._codebook.embedding_sum", ".codebook.embed_sum")
                        .replace("._codebook.embed_sum", ".codebook.embed_sum")
                        .replace("._codebook.cluster_usage", ".codebook.cluster_usage")
                        .replace("._codebook._initialized", ".codebook.initialized");
                    format!("layers.{r}")
                }
                None => rest.to_string(),
            };
            return format!("{to}{rest}");
        }
    }
    n
}

/// Converts a checkpoint's tensors to candle's names with q/k in the interleaved layout.
pub fn normalize_checkpoint(
    raw: HashMap<String, Tensor>,
    layout: CheckpointLayout,
    cfg: &CodecConfig,
) -> Result<HashMap<String, Tensor>> {
    let d = cfg.transformer.d_model;
    let hd = cfg.transformer.head_dim();
    let mut out = HashMap::with_capacity(raw.len() + 64);
    for (name, t) in raw {
        match layout {
            CheckpointLayout::Moshi => {
                let mapped = moshi_name(&name);
                if let Some(base) = mapped
                    .strip_suffix(".self_attn.in_proj_weight")
                    .or_else(|| mapped.strip_suffix(".self_attn.in_proj_bias"))
                {
                    let kind = if mapped.ends_with("weight") {
                        "weight"
                    } else {
                        "bias"
                    };
                    if t.dim(0)? != 3 * d {
                        return Err(Error::Weights(format!(
                            "tensor {name:?} has shape {:?}, expected {} rows (q, k and v of d_model={d})",
                            t.dims(),
                            3 * d
                        )));
                    }
                    for (i, p) in ["q_proj", "k_proj", "v_proj"].iter().enumerate() {
                        out.insert(
                            format!("{base}.self_attn.{p}.{kind}"),
                            t.narrow(0, i * d, d)?,
                        );
                    }
                } else {
                    out.insert(mapped, t);
                }
            }
            CheckpointLayout::Hf => {
                let is_qk = name.contains("_transformer.layers.")
                    && (name.contains(".self_attn.q_proj.") || name.contains(".self_attn.k_proj."));
                let t = if is_qk && t.dim(0)? % hd == 0 && hd.is_multiple_of(2) {
                    let rows = t.dim(0)?;
                    let idx = weights::halves_to_interleaved_index(rows, hd);
                    t.index_select(&Tensor::from_vec(idx, rows, t.device())?, 0)?
                } else {
                    t
                };
                out.insert(name, t);
            }
        }
    }
    Ok(out)
}

/// A codec checkpoint's tensors (either real layout) as a source for [`Codec::new`]:
/// detects the layout, converts names and q/k rows, and checks that the checkpoint holds
/// `cfg.quantizer_n_q` codebooks. `origin` names the checkpoint in messages.
pub fn checkpoint_source(
    raw: HashMap<String, Tensor>,
    origin: String,
    cfg: &CodecConfig,
) -> Result<(TensorSource, CheckpointLayout)> {
    let layout = detect_layout(raw.keys()).ok_or_else(|| {
        Error::Weights(format!(
            "{origin}: not a Mimi checkpoint: expected the tensor names of kyutai/mimi's \
             model.safetensors (encoder.layers.*, encoder_transformer.layers.*) or of Kyutai's \
             moshi checkpoint (encoder.model.*, encoder_transformer.transformer.layers.*)"
        ))
    })?;
    let tensors = normalize_checkpoint(raw, layout, cfg)?;
    let available = available_codebooks(&tensors);
    if cfg.quantizer_n_q > available {
        return Err(Error::Weights(format!(
            "{origin}: asked for {} codebooks but the checkpoint has {available}",
            cfg.quantizer_n_q
        )));
    }
    Ok((TensorSource::tensors(tensors, origin), layout))
}

/// Number of codebooks a (normalized) checkpoint holds.
pub fn available_codebooks(tensors: &HashMap<String, Tensor>) -> usize {
    let has_first = tensors
        .keys()
        .any(|k| k.starts_with("quantizer.semantic_residual_vector_quantizer.layers.0."));
    let rest = (0..)
        .take_while(|i| {
            tensors.contains_key(&format!(
                "quantizer.acoustic_residual_vector_quantizer.layers.{i}.codebook.embed_sum"
            ))
        })
        .count();
    usize::from(has_first) + rest
}

/// Which implementation computes the convolutional parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// This crate's CPU engine ([`crate::seanet`]); CPU and f32 only.
    Native,
    /// candle's modules (any device).
    Candle,
}

// One per codec, never in a collection: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
enum Convs {
    Native {
        encoder: seanet::Encoder,
        decoder: seanet::Decoder,
        downsample: Conv1d,
        upsample: ConvTr1d,
    },
    Candle {
        encoder: SeaNetEncoder,
        decoder: SeaNetDecoder,
        downsample: ConvDownsample1d,
        upsample: ConvTrUpsample1d,
    },
}

impl Convs {
    /// The SEANet and the down/upsampling of `engine`.
    fn load(cfg: &CodecConfig, vb: &VarBuilder, engine: Engine) -> Result<Self> {
        let dim = cfg.seanet.dimension;
        let stride = cfg.downsample_stride();
        Ok(match engine {
            Engine::Native => Convs::Native {
                encoder: seanet::Encoder::load(&cfg.seanet, vb.pp("encoder"))?,
                decoder: seanet::Decoder::load(&cfg.seanet, vb.pp("decoder"))?,
                downsample: Conv1d::load(
                    vb.pp("downsample"),
                    ConvSpec::new(dim, dim, 2 * stride)
                        .stride(stride)
                        .no_bias()
                        .pad(PadMode::Replicate),
                )?,
                upsample: ConvTr1d::load_depthwise(vb.pp("upsample"), dim, stride)?,
            },
            Engine::Candle => {
                let ccfg = cfg.seanet.to_candle();
                Convs::Candle {
                    encoder: SeaNetEncoder::new(&ccfg, vb.pp("encoder"))?,
                    decoder: SeaNetDecoder::new(&ccfg, vb.pp("decoder"))?,
                    downsample: ConvDownsample1d::new(
                        stride,
                        dim,
                        true,
                        true,
                        vb.pp("downsample"),
                    )?,
                    upsample: ConvTrUpsample1d::new(stride, dim, true, true, vb.pp("upsample"))?,
                }
            }
        })
    }
}

/// The codec's weights and modules; immutable once built, shared between threads.
pub struct Codec {
    cfg: CodecConfig,
    /// How offline calls are cut on the native engine.
    offline: Offline,
    convs: Convs,
    enc_tr: Transformer,
    dec_tr: Transformer,
    quantizer: Quantizer,
    device: Device,
    dtype: DType,
}

/// One batch item's state on the native engine: the SEANet encoder's and the downsampling's.
type EncodeItem = (seanet::EncoderState, conv::ConvState);
/// One batch item's state on the native engine: the upsampling's and the SEANet decoder's.
type DecodeItem = (conv::ConvState, seanet::DecoderState);

// One per stream: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum EncodeConvs {
    /// Per batch item: the SEANet encoder's and the downsampling's states.
    Native(Vec<EncodeItem>),
    Candle(SeaNetEncoder, ConvDownsample1d),
}

pub enum DecodeConvs {
    /// Per batch item: the upsampling's and the SEANet decoder's states.
    Native(Vec<DecodeItem>),
    /// One module per batch item: candle 0.11.1's CPU `conv_transpose1d` gives wrong
    /// results for batch items after the first (its col2im path), so transposed
    /// convolutions always run on batch size 1.
    Candle(Vec<(ConvTrUpsample1d, SeaNetDecoder)>),
}

/// Per-row streaming (`active` masks, per-row resets) keeps one state per batch item, which
/// the native engine does and candle's batched modules do not.
fn rows_need_native() -> Error {
    Error::Device(
        "per-row streaming (active=, reset_state(rows=)) needs the native CPU engine \
         (device=\"cpu\", float32)"
            .into(),
    )
}

/// The convolution states of a stream, by engine.
pub trait Convolutions: Sized {
    /// Whether each batch item has a state of its own (the native engine).
    fn per_row(&self) -> bool;
    /// Returns batch item `r` to a fresh state (if it has one yet).
    fn reset_item(&mut self, r: usize);
    /// An independent copy.
    fn deep_copy(&self) -> Self;
}

impl Convolutions for EncodeConvs {
    fn per_row(&self) -> bool {
        matches!(self, EncodeConvs::Native(_))
    }
    fn reset_item(&mut self, r: usize) {
        if let EncodeConvs::Native(items) = self {
            if let Some(item) = items.get_mut(r) {
                *item = Default::default();
            }
        }
    }
    fn deep_copy(&self) -> Self {
        match self {
            EncodeConvs::Native(items) => EncodeConvs::Native(items.clone()),
            EncodeConvs::Candle(e, d) => EncodeConvs::Candle(e.clone(), d.clone()),
        }
    }
}

impl Convolutions for DecodeConvs {
    fn per_row(&self) -> bool {
        matches!(self, DecodeConvs::Native(_))
    }
    fn reset_item(&mut self, r: usize) {
        if let DecodeConvs::Native(items) = self {
            if let Some(item) = items.get_mut(r) {
                *item = Default::default();
            }
        }
    }
    fn deep_copy(&self) -> Self {
        match self {
            DecodeConvs::Native(items) => DecodeConvs::Native(items.clone()),
            DecodeConvs::Candle(items) => DecodeConvs::Candle(items.clone()),
        }
    }
}

/// A streaming state: the convolutions' buffers, the transformer's state, and each row's
/// count since its own start or reset (audio samples for the encoder, code frames for the
/// decoder).
pub struct Stream<C> {
    convs: C,
    tr: State,
    batch: Option<usize>,
    counts: Vec<u64>,
}

/// Streaming encoder state (counts: samples).
pub type EncodeStream = Stream<EncodeConvs>;
/// Streaming decoder state (counts: code frames).
pub type DecodeStream = Stream<DecodeConvs>;

impl<C: Convolutions> Stream<C> {
    fn new(convs: C) -> Self {
        Self {
            convs,
            tr: State::default(),
            batch: None,
            counts: Vec::new(),
        }
    }

    /// The batch size, once the stream has started.
    pub fn batch(&self) -> Option<usize> {
        self.batch
    }

    /// Each row's samples (encoder) or frames (decoder) since its own start or reset.
    pub fn counts(&self) -> &[u64] {
        &self.counts
    }

    /// Starts the stream at batch size `b` (no-op once started).
    pub fn start(&mut self, b: usize) {
        if self.batch.is_none() {
            self.batch = Some(b);
            self.counts = vec![0; b];
        }
    }

    /// Returns `rows` to a fresh stream; the other rows continue untouched.
    pub fn reset_rows(&mut self, rows: &[usize]) -> Result<()> {
        if !self.convs.per_row() {
            return Err(rows_need_native());
        }
        let n = self.counts.len();
        for &r in rows.iter().filter(|&&r| r < n) {
            self.convs.reset_item(r);
            self.counts[r] = 0;
        }
        self.tr.reset_rows(rows);
        Ok(())
    }

    /// An independent copy (new buffers, same contents).
    pub fn deep_copy(&self) -> Result<Self> {
        Ok(Self {
            convs: self.convs.deep_copy(),
            tr: self.tr.deep_copy()?,
            batch: self.batch,
            counts: self.counts.clone(),
        })
    }
}

/// (B, D, T) -> transformer over time -> (B, D, T).
fn run_transformer(model: &Transformer, state: &mut State, xs: &Tensor) -> Result<Tensor> {
    run_transformer_c(model, state, xs, None)
}

fn run_transformer_c(
    model: &Transformer,
    state: &mut State,
    xs: &Tensor,
    cancel: Cancel,
) -> Result<Tensor> {
    let x = xs.transpose(1, 2)?.contiguous()?;
    let y = model.forward_cancellable(state, &x, cancel)?;
    Ok(y.transpose(1, 2)?.contiguous()?)
}

/// [`run_transformer`] for the batch rows `rows` of a stream of `batch` rows (all rows if
/// `None`).
fn run_transformer_rows(
    model: &Transformer,
    state: &mut State,
    xs: &Tensor,
    rows: Option<(&[usize], usize)>,
) -> Result<Tensor> {
    let Some((rows, batch)) = rows else {
        return run_transformer(model, state, xs);
    };
    model.start(state, batch)?;
    let x = xs.transpose(1, 2)?.contiguous()?;
    let y = model.forward_rows(state, &x, rows)?;
    Ok(y.transpose(1, 2)?.contiguous()?)
}

/// Applies `f` to each batch item separately and concatenates the results.
fn per_item(x: &Tensor, f: impl Fn(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
    let b = x.dim(0)?;
    if b == 1 {
        return f(x);
    }
    let ys = (0..b)
        .map(|i| f(&x.narrow(0, i, 1)?))
        .collect::<Result<Vec<_>>>()?;
    Ok(Tensor::cat(&ys, 0)?)
}

/// The batch items of a (B, C, T) f32 tensor as frames.
fn to_frames(x: &Tensor) -> Result<Vec<Frames>> {
    let (b, c, t) = x.dims3()?;
    let data = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    if b == 1 {
        return Ok(vec![Frames::new(c, t, data)]);
    }
    Ok((0..b)
        .map(|i| Frames::new(c, t, data[i * c * t..(i + 1) * c * t].to_vec()))
        .collect())
}

/// Stacks frames of equal shape into a (B, C, T) tensor; `None` when they are empty.
fn from_frames(xs: Vec<Frames>, dev: &Device) -> Result<Option<Tensor>> {
    let (b, c, t) = (xs.len(), xs[0].channels, xs[0].len);
    if t == 0 {
        return Ok(None);
    }
    let data: Vec<f32> = if b == 1 {
        xs.into_iter()
            .next()
            .map(Frames::into_data)
            .unwrap_or_default()
    } else {
        xs.iter().flat_map(|f| f.data.iter().copied()).collect()
    };
    Ok(Some(Tensor::from_vec(data, (b, c, t), dev)?))
}

/// One per-item stage of the native engine (a SEANet, a down/upsampling) on each row of
/// `x`: row `i` continues the state `items[rows[i]]`. `None` when no frame comes out.
fn per_row<I>(
    items: &mut [I],
    rows: &[usize],
    x: &Tensor,
    dev: &Device,
    mut stage: impl FnMut(&mut I, &Frames) -> candle::Result<Frames>,
) -> Result<Option<Tensor>> {
    let mut ys = Vec::with_capacity(rows.len());
    for (f, &r) in to_frames(x)?.iter().zip(rows) {
        ys.push(stage(&mut items[r], f)?);
    }
    from_frames(ys, dev)
}

/// Runs an offline call inside the rayon pool, then frees the recycled buffers it left on
/// the pool's threads.
fn offline_call<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    crate::kernels::in_pool(|| {
        let r = f();
        rayon::broadcast(|_| conv::release_buffers());
        r
    })
}

fn empty() -> Error {
    Error::Shape("the input is too short to produce any output".into())
}

/// How the native engine cuts an offline call. The SEANets run as streams over chunks,
/// which bounds memory; the transformers take blocks of tokens, which amortises reading and
/// packing their weights; and each block's SEANet pass is cut along time into segments that
/// run in parallel (see [`split`]). Every cut depends on the input's length only, never on
/// the number of threads, so results are the same bits on any machine.
#[derive(Clone, Copy, Debug)]
struct Offline {
    /// SEANet encoder input samples per streaming call of its high-rate layers (0.5 s; the
    /// frame-rate tail takes each segment in one call, see `Encoder::tail`). With one segment
    /// in flight per thread, 10 s encode + decode at 2 threads peaked at 586 MB (VmHWM,
    /// moshi-layout file, before the tail was split off); 1 s chunks gave 604 MB and 2 s
    /// 690 MB, at speeds within the noise.
    encode_chunk: usize,
    /// SEANet decoder code frames per streaming call of the layers after its first
    /// up-sampling (~1 s; the first convolution and up-sampling take each segment in one
    /// call, see `Decoder::head`). Longer calls would re-pack the other transposed
    /// convolutions' weights less often, but 2 s chunks raised the peak to 627 MB and 4 s to
    /// 745 MB, at speeds within the noise.
    decode_chunk: usize,
    /// Transformer tokens per call. Mimi, 2 threads: 250 tokens in one call 135 ms, in five
    /// calls of 50 216 ms. Memory: 0.5 MB per batch item.
    block: usize,
    /// SEANet frames (transformer tokens) per segment.
    segment: usize,
}

impl Default for Offline {
    fn default() -> Self {
        // Segments of 5 s: a 10 s clip is two jobs. The warm-up each segment but the first
        // recomputes costs 3.2% of the encoder SEANet's work (3840 samples) and 6.4% of the
        // decoder's (8 frames); on 2 threads the split took 10 s encode from 637 to 520 ms
        // and decode from 539 to 478 ms (benches/README.md).
        Self {
            encode_chunk: 12_000,
            decode_chunk: 12,
            block: 250,
            segment: 125,
        }
    }
}

/// Cuts `[a, b)` into segments of `len` (the last one shorter).
fn segments(a: usize, b: usize, len: usize) -> Vec<(usize, usize)> {
    (a..b)
        .step_by(len.max(1))
        .map(|s| (s, (s + len.max(1)).min(b)))
        .collect()
}

/// Runs a SEANet pass over `[a, b)` (in the pass's input units) for every batch item, as
/// parallel jobs: one per item and segment of `seg` units. The SEANets have no recurrence,
/// so an output depends on a bounded window of input (`warm` units before it):
/// `job(item, s0, s1)` runs a fresh stream from `s0 - warm` and returns the outputs from
/// `s0` on, which are the offline ones. Each job runs on one thread (an idle thread steals
/// its parallel loops), so two cores work on two halves of a clip with no hand-off per
/// layer. Returns each item's output in time order.
fn split<J>(batch: usize, (a, b): (usize, usize), seg: usize, job: J) -> Result<Vec<Frames>>
where
    J: Fn(usize, usize, usize) -> Result<Frames> + Sync,
{
    let segs = segments(a, b, seg);
    let jobs: Vec<(usize, usize, usize)> = (0..batch)
        .flat_map(|i| segs.iter().map(move |&(s0, s1)| (i, s0, s1)))
        .collect();
    let outs = jobs
        .par_iter()
        .map(|&(i, s0, s1)| job(i, s0, s1))
        .collect::<Result<Vec<_>>>()?;
    Ok(outs
        .chunks(segs.len())
        .map(|parts| Frames::cat(parts[0].channels, parts))
        .collect())
}

/// A fresh stream of `step(chunk, is_final)` over `x[start..end]` in chunks of `chunk`
/// frames, without the first `skip` output frames.
fn stream_window(
    x: &Frames,
    (start, end): (usize, usize),
    chunk: usize,
    skip: usize,
    cout: usize,
    mut step: impl FnMut(&Frames, bool) -> Result<Frames>,
) -> Result<Frames> {
    let mut outs = Vec::new();
    let mut t = start;
    while t < end {
        let n = chunk.max(1).min(end - t);
        outs.push(step(&x.window(t, t + n), t + n == end)?);
        t += n;
    }
    let y = Frames::cat(cout, &outs);
    Ok(y.window(skip.min(y.len), y.len))
}

fn nonempty(x: StreamTensor) -> Result<Option<Tensor>> {
    match x.as_option() {
        Some(t) if t.dim(candle::D::Minus1)? > 0 => Ok(Some(t.clone())),
        _ => Ok(None),
    }
}

impl Codec {
    /// The native engine on the CPU in f32, candle's modules otherwise.
    pub fn new(
        cfg: &CodecConfig,
        source: TensorSource,
        device: &Device,
        dtype: DType,
    ) -> Result<Self> {
        let engine = if device.is_cpu() && dtype == DType::F32 {
            Engine::Native
        } else {
            Engine::Candle
        };
        Self::with_engine(cfg, source, device, dtype, engine)
    }

    /// Builds the codec on `engine`, reading every weight from `source` (already in
    /// candle's names, q/k interleaved: see [`normalize_checkpoint`]).
    pub fn with_engine(
        cfg: &CodecConfig,
        source: TensorSource,
        device: &Device,
        dtype: DType,
        engine: Engine,
    ) -> Result<Self> {
        cfg.transformer.check_supported()?;
        let source = Arc::new(source);
        let vb = source.var_builder(dtype, device);
        let convs = Convs::load(cfg, &vb, engine)?;
        // The quantizer always computes in f32, whatever the codec's dtype: a code is an
        // argmin over distances to nearby centroids, so it is kept at full precision, and the
        // latents are cast to f32 on the way in (and back to `dtype` on the way out).
        let quantizer =
            Quantizer::load(cfg, &source.var_builder(DType::F32, device).pp("quantizer"))?;
        let [enc_w, dec_w] = Self::transformer_weights(cfg, &source, device, dtype)?;
        Self::report_unread(cfg, &source);
        source.finish()?;
        Ok(Self {
            cfg: cfg.clone(),
            offline: Offline::default(),
            convs,
            enc_tr: Transformer::new(&cfg.transformer, enc_w, device, dtype)?,
            dec_tr: Transformer::new(&cfg.transformer, dec_w, device, dtype)?,
            quantizer,
            device: device.clone(),
            dtype,
        })
    }

    /// The encoder's and decoder's transformer weights. A seeded source gives each its own
    /// seed (`seed + 1`, `seed + 2`) over unprefixed names.
    fn transformer_weights(
        cfg: &CodecConfig,
        source: &TensorSource,
        device: &Device,
        dtype: DType,
    ) -> Result<[BTreeMap<String, Tensor>; 2]> {
        let tcfg = &cfg.transformer;
        let load = |i: u64, prefix| {
            let spec = weights::LoadSpec {
                prefix,
                layout: QkLayout::Interleaved,
                device,
                dtype,
            };
            match source.seed() {
                Some(seed) => {
                    let own = TensorSource::seeded(seed.wrapping_add(1 + i), tcfg.layer_scale);
                    weights::load_transformer(tcfg, &own, &weights::LoadSpec { prefix: "", ..spec })
                }
                None => weights::load_transformer(tcfg, source, &spec),
            }
        };
        Ok([
            load(0, "encoder_transformer.")?,
            load(1, "decoder_transformer.")?,
        ])
    }

    /// Records the checkpoint's tensors that nobody read: a checkpoint that does not match
    /// the config. Unused codebooks (`num_codebooks` below what the file holds) are fine.
    fn report_unread(cfg: &CodecConfig, source: &TensorSource) {
        let unused_codebook = |n: &str| {
            n.strip_prefix("quantizer.acoustic_residual_vector_quantizer.layers.")
                .and_then(|r| r.split('.').next())
                .and_then(|i| i.parse::<usize>().ok())
                .is_some_and(|i| i + 1 >= cfg.quantizer_n_q)
        };
        source.report_unread(|n| !unused_codebook(n), "the config does not read it");
    }

    pub fn config(&self) -> &CodecConfig {
        &self.cfg
    }

    pub fn engine(&self) -> Engine {
        match self.convs {
            Convs::Native { .. } => Engine::Native,
            Convs::Candle { .. } => Engine::Candle,
        }
    }

    /// Estimated peak bytes of an offline call on `batch` items of `samples` samples each.
    pub fn offline_memory(&self, batch: usize, samples: usize) -> u64 {
        // SEANet's activations take about 2 KB per sample of audio in flight (measured on
        // the real model, 64 filters); the native engine has one chunk in flight per running
        // segment job (two chunks counted, as on 2 threads), plus the input, the latents and
        // the output (tens of bytes per sample).
        let per_sample = (2048 * self.cfg.seanet.n_filters as u64 / 64).max(64);
        let (in_flight, rest) = match self.engine() {
            Engine::Native => (
                samples.min(2 * self.offline.encode_chunk) as u64,
                64 * samples as u64,
            ),
            Engine::Candle => (samples as u64, 0),
        };
        (batch as u64).saturating_mul(in_flight.saturating_mul(per_sample).saturating_add(rest))
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Latents before quantization: (B, C, S) -> (B, dimension, frames).
    pub fn encode_pre_quantize(&self, pcm: &Tensor, cancel: Cancel) -> Result<Tensor> {
        offline_call(|| self.encode_pre_quantize_inner(pcm, cancel))
    }

    fn encode_pre_quantize_inner(&self, pcm: &Tensor, cancel: Cancel) -> Result<Tensor> {
        match &self.convs {
            Convs::Native { .. } => self.encode_native(pcm, cancel),
            Convs::Candle {
                encoder,
                downsample,
                ..
            } => {
                let x = encoder.forward(pcm)?;
                crate::error::check_cancel(cancel)?;
                let x = run_transformer_c(&self.enc_tr, &mut State::default(), &x, cancel)?;
                crate::error::check_cancel(cancel)?;
                Ok(downsample.forward(&x)?)
            }
        }
    }

    /// (B, C, S) -> codes (B, n_q, ceil(S / frame_size)) u32. The last partial frame is
    /// padded, as in candle and transformers.
    pub fn encode(&self, pcm: &Tensor, cancel: Cancel) -> Result<Tensor> {
        let latents = self.encode_pre_quantize(pcm, cancel)?;
        self.quantizer.encode(&latents.to_dtype(DType::F32)?)
    }

    /// The quantizer's reconstruction of codes: (B, n_q, T) -> (B, dimension, T).
    pub fn decode_latent(&self, codes: &Tensor) -> Result<Tensor> {
        self.quantizer.decode(codes)
    }

    /// codes (B, n_q, T) u32 -> audio (B, C, T * frame_size).
    pub fn decode(&self, codes: &Tensor, cancel: Cancel) -> Result<Tensor> {
        offline_call(|| self.decode_inner(codes, cancel))
    }

    fn decode_inner(&self, codes: &Tensor, cancel: Cancel) -> Result<Tensor> {
        let x = self.decode_latent(codes)?.to_dtype(self.dtype)?;
        match &self.convs {
            Convs::Native { .. } => self.decode_native(&x, cancel),
            Convs::Candle {
                decoder, upsample, ..
            } => {
                let x = per_item(&x, |xi| Ok(upsample.forward(xi)?))?;
                let x = run_transformer_c(&self.dec_tr, &mut State::default(), &x, cancel)?;
                per_item(&x, |xi| {
                    crate::error::check_cancel(cancel)?;
                    Ok(decoder.forward(xi)?)
                })
            }
        }
    }

    /// Offline encode on the native engine. Per block of `offline.block` tokens: the
    /// SEANet encoder over the block's samples (split along time, see [`split`]; the last
    /// segment flushes the offline right padding), one transformer call, then the
    /// downsampling, whose stream runs on across blocks.
    fn encode_native(&self, pcm: &Tensor, cancel: Cancel) -> Result<Tensor> {
        let Convs::Native {
            encoder,
            downsample,
            ..
        } = &self.convs
        else {
            unreachable!("native engine")
        };
        let (b, len) = (pcm.dim(0)?, pcm.dim(2)?);
        let (hop, warm, o) = (encoder.hop(), encoder.warmup(), &self.offline);
        let audio = to_frames(pcm)?;
        let mut st = self.encode_stream();
        st.start(b);
        let (EncodeConvs::Native(items), tr) = (&mut st.convs, &mut st.tr) else {
            unreachable!("a native stream")
        };
        items.resize_with(b, Default::default);
        let all: Vec<usize> = (0..b).collect();
        let mut parts = Vec::new();
        let mut b0 = 0;
        while b0 < len {
            crate::error::check_cancel(cancel)?;
            let b1 = (b0 + o.block.max(1) * hop).min(len);
            let last = b1 == len;
            // The SEANet's high-rate layers stream over chunks (which bounds memory); its
            // tail, at the frame rate with large weights, takes the segment in one call.
            let job = |i: usize, s0: usize, s1: usize| {
                let start = s0.saturating_sub(warm);
                let mut es = seanet::EncoderState::default();
                let head = stream_window(
                    &audio[i],
                    (start, s1),
                    o.encode_chunk,
                    0,
                    encoder.head_channels(),
                    |x, end| Ok(encoder.head(&mut es, x, last && end, cancel)?),
                )?;
                let y = encoder.tail(&mut es, &head, last);
                let skip = ((s0 - start) / hop).min(y.len);
                Ok(y.window(skip, y.len))
            };
            let x = split(b, (b0, b1), o.segment * hop, job)?;
            // The transformer's output; empty frames still flush the downsampling's padding.
            let x = match from_frames(x, &self.device)? {
                Some(x) => run_transformer_c(&self.enc_tr, tr, &x, cancel)?,
                None => Tensor::zeros((b, self.cfg.seanet.dimension, 0), DType::F32, &self.device)?,
            };
            let down = |it: &mut EncodeItem, f: &Frames| {
                Ok(downsample.step(&mut it.1, f, None, None, last))
            };
            parts.extend(per_row(items, &all, &x, &self.device, down)?);
            b0 = b1;
        }
        if parts.is_empty() {
            return Err(empty());
        }
        Ok(Tensor::cat(&parts, 2)?)
    }

    /// Offline decode on the native engine (the decoder pads nothing on the right, so a
    /// stream gives the offline result). Per block of `offline.block` tokens: the upsampling
    /// (a stream across blocks) and one transformer call, then the SEANet decoder over the
    /// block, split along time (see [`split`]); each item keeps the transformer's last
    /// frames as the next block's warm-up.
    fn decode_native(&self, x: &Tensor, cancel: Cancel) -> Result<Tensor> {
        let Convs::Native {
            decoder, upsample, ..
        } = &self.convs
        else {
            unreachable!("native engine")
        };
        let (b, len) = (x.dim(0)?, x.dim(2)?);
        let per_frame = self.cfg.downsample_stride();
        let (hop, warm, o) = (decoder.hop(), decoder.warmup(), &self.offline);
        let mut st = self.decode_stream();
        st.start(b);
        let (DecodeConvs::Native(items), tr) = (&mut st.convs, &mut st.tr) else {
            unreachable!("a native stream")
        };
        items.resize_with(b, Default::default);
        let all: Vec<usize> = (0..b).collect();
        let up = |it: &mut DecodeItem, f: &Frames| Ok(upsample.step(&mut it.0, f, None));
        let dim = self.cfg.seanet.dimension;
        let mut tails = vec![Frames::empty(dim); b];
        let mut audio: Vec<Vec<Frames>> = (0..b).map(|_| Vec::new()).collect();
        let block = o.block.div_ceil(per_frame).max(1);
        for t0 in (0..len).step_by(block) {
            crate::error::check_cancel(cancel)?;
            let n = block.min(len - t0);
            let Some(u) = per_row(items, &all, &x.narrow(2, t0, n)?, &self.device, up)? else {
                continue;
            };
            let y = to_frames(&run_transformer_c(&self.dec_tr, tr, &u, cancel)?)?;
            // Each item's frames: the warm-up kept from earlier blocks, then this block's.
            let ext: Vec<Frames> = tails
                .iter()
                .zip(y)
                .map(|(t, y)| Frames::cat(dim, &[t.window(0, t.len), y]))
                .collect();
            let (off, end) = (tails[0].len, ext[0].len);
            // The SEANet's first layers (frame rate, large weights) take the segment in one
            // call; the rest streams over chunks, which bounds memory.
            let job = |i: usize, s0: usize, s1: usize| {
                let start = s0.saturating_sub(warm);
                let mut ds = seanet::DecoderState::default();
                let head = decoder.head(&mut ds, &ext[i].window(start, s1));
                let chunk = o.decode_chunk * per_frame * decoder.head_stride();
                stream_window(
                    &head,
                    (0, head.len),
                    chunk,
                    (s0 - start) * hop,
                    self.cfg.seanet.channels,
                    |x, _| Ok(decoder.rest(&mut ds, x, cancel)?),
                )
            };
            for (out, y) in audio.iter_mut().zip(split(b, (off, end), o.segment, job)?) {
                out.push(y);
            }
            tails = ext.iter().map(|e| e.tail(warm)).collect();
        }
        let audio = audio
            .into_iter()
            .map(|parts| Frames::cat(self.cfg.seanet.channels, &parts))
            .collect();
        from_frames(audio, &self.device)?.ok_or_else(empty)
    }

    pub fn encode_stream(&self) -> EncodeStream {
        let convs = match &self.convs {
            Convs::Native { .. } => EncodeConvs::Native(Vec::new()),
            Convs::Candle {
                encoder,
                downsample,
                ..
            } => EncodeConvs::Candle(encoder.clone(), downsample.clone()),
        };
        Stream::new(convs)
    }

    pub fn decode_stream(&self) -> DecodeStream {
        let convs = match &self.convs {
            Convs::Native { .. } => DecodeConvs::Native(Vec::new()),
            Convs::Candle { .. } => DecodeConvs::Candle(Vec::new()),
        };
        Stream::new(convs)
    }

    /// Feeds audio (B, C, n) to the streaming encoder; returns the codes of every frame
    /// completed by this chunk (possibly none).
    pub fn encode_step(&self, s: &mut EncodeStream, pcm: &Tensor) -> Result<Option<Tensor>> {
        self.encode_step_rows(s, pcm, None)
    }

    /// [`Self::encode_step`] for the batch rows `rows` only of a stream of `batch` rows
    /// (`rows` sorted, distinct, below `batch`; `pcm` holds those rows): each continues its
    /// own stream, the others are untouched. With `rows`, chunks must be whole frames.
    pub fn encode_step_rows(
        &self,
        s: &mut EncodeStream,
        pcm: &Tensor,
        rows: Option<(&[usize], usize)>,
    ) -> Result<Option<Tensor>> {
        let n = pcm.dim(2)?;
        self.check_encode_rows(s, n, rows.map(|r| r.0))?;
        let rows = match rows {
            Some((rows, batch)) => {
                s.start(batch);
                if rows.is_empty() {
                    return Ok(None);
                }
                Some(rows)
            }
            None => None,
        };
        let out = crate::kernels::in_pool(|| -> Result<Option<Tensor>> {
            match self.latents_step_rows(s, pcm, false, rows)? {
                Some(x) => Ok(Some(self.quantizer.encode(&x.to_dtype(DType::F32)?)?)),
                None => Ok(None),
            }
        })?;
        let all: Vec<usize> = (0..s.counts.len()).collect();
        for &r in rows.unwrap_or(&all) {
            s.counts[r] += n as u64;
        }
        Ok(out)
    }

    /// The stream's last chunk (possibly empty): the codes of every frame it completes, then
    /// of the last partial frame, padded as the offline `encode` pads it (every layer's right
    /// padding). The concatenated codes of a stream ended this way are `encode`'s. The stream
    /// is spent afterwards: start a new one. Native engine only.
    pub fn encode_last(&self, s: &mut EncodeStream, pcm: &Tensor) -> Result<Option<Tensor>> {
        if !matches!(self.convs, Convs::Native { .. }) {
            return Err(Error::Device(
                "ending a stream with last=True needs the native CPU engine (device=\"cpu\", \
                 float32)"
                    .into(),
            ));
        }
        let mut partial = s.counts.iter().map(|&x| x % self.cfg.frame_size() as u64);
        if partial.next().is_some_and(|p0| partial.any(|p| p != p0)) {
            return Err(Error::Shape(
                "last=True ends every row at once, but the rows hold different partial frames \
                 (after a per-row reset)"
                    .into(),
            ));
        }
        let n = pcm.dim(2)?;
        let out = crate::kernels::in_pool(|| -> Result<Option<Tensor>> {
            match self.latents_step(s, pcm, true)? {
                Some(x) => Ok(Some(self.quantizer.encode(&x.to_dtype(DType::F32)?)?)),
                None => Ok(None),
            }
        })?;
        s.counts.iter_mut().for_each(|x| *x += n as u64);
        Ok(out)
    }

    /// Refuses a chunk of `n` samples that would make rows emit different numbers of frames:
    /// masked steps take whole frames, and so does any step once rows hold different
    /// partial frames (after a per-row reset).
    fn check_encode_rows(&self, s: &EncodeStream, n: usize, rows: Option<&[usize]>) -> Result<()> {
        let f = self.cfg.frame_size();
        if rows.is_some() && !matches!(self.convs, Convs::Native { .. }) {
            return Err(rows_need_native());
        }
        let mut partial = s.counts.iter().map(|&x| x % f as u64);
        let uneven = partial.next().is_some_and(|p0| partial.any(|p| p != p0));
        if !n.is_multiple_of(f) && (rows.is_some() || uneven) {
            return Err(Error::Shape(format!(
                "chunks must be a whole number of frames (multiples of frame_size={f} samples) \
                 {}, got {n} samples",
                if rows.is_some() {
                    "when active= is given"
                } else {
                    "while rows hold different partial frames (after a per-row reset)"
                }
            )));
        }
        Ok(())
    }

    /// The latents (before quantization) of the frames this chunk completes. With `last`
    /// (native engine), the audio ends here and the last partial frame is padded as offline.
    fn latents_step(
        &self,
        s: &mut EncodeStream,
        pcm: &Tensor,
        last: bool,
    ) -> Result<Option<Tensor>> {
        s.start(pcm.dim(0)?);
        self.latents_step_rows(s, pcm, last, None)
    }

    /// [`Self::latents_step`] for the batch rows `rows` (all if `None`).
    fn latents_step_rows(
        &self,
        s: &mut EncodeStream,
        pcm: &Tensor,
        last: bool,
        rows: Option<&[usize]>,
    ) -> Result<Option<Tensor>> {
        let b = pcm.dim(0)?;
        s.start(b);
        let all: Vec<usize> = (0..b).collect();
        let rows_or_all = rows.unwrap_or(&all);
        match (&self.convs, &mut s.convs) {
            (
                Convs::Native {
                    encoder,
                    downsample,
                    ..
                },
                EncodeConvs::Native(items),
            ) => {
                items.resize_with(s.counts.len(), Default::default);
                let seanet =
                    |it: &mut EncodeItem, f: &Frames| encoder.apply(&mut it.0, f, last, None);
                let x = match per_row(items, rows_or_all, pcm, &self.device, seanet)? {
                    Some(x) => {
                        let rows = rows.map(|r| (r, s.counts.len()));
                        run_transformer_rows(&self.enc_tr, &mut s.tr, &x, rows)?
                    }
                    // Nothing new for the transformer, but the last chunk still flushes the
                    // downsampling's padding.
                    None if last => {
                        Tensor::zeros((b, self.cfg.seanet.dimension, 0), DType::F32, &self.device)?
                    }
                    None => return Ok(None),
                };
                let down = |it: &mut EncodeItem, f: &Frames| {
                    Ok(downsample.step(&mut it.1, f, None, None, last))
                };
                per_row(items, rows_or_all, &x, &self.device, down)
            }
            (Convs::Candle { .. }, EncodeConvs::Candle(encoder, downsample)) => {
                let Some(x) = nonempty(encoder.step(&pcm.clone().into())?)? else {
                    return Ok(None);
                };
                let x = run_transformer(&self.enc_tr, &mut s.tr, &x)?;
                nonempty(downsample.step(&x.into())?)
            }
            _ => unreachable!("a stream is made by its codec"),
        }
    }

    /// Feeds codes (B, n_q, T) to the streaming decoder; returns the audio they complete.
    pub fn decode_step(&self, s: &mut DecodeStream, codes: &Tensor) -> Result<Option<Tensor>> {
        self.decode_step_rows(s, codes, None)
    }

    /// [`Self::decode_step`] for the batch rows `rows` only of a stream of `batch` rows (see
    /// [`Self::encode_step_rows`]).
    pub fn decode_step_rows(
        &self,
        s: &mut DecodeStream,
        codes: &Tensor,
        rows: Option<(&[usize], usize)>,
    ) -> Result<Option<Tensor>> {
        if rows.is_some() && !matches!(self.convs, Convs::Native { .. }) {
            return Err(rows_need_native());
        }
        let rows = match rows {
            Some((rows, batch)) => {
                s.start(batch);
                if rows.is_empty() {
                    return Ok(None);
                }
                Some(rows)
            }
            None => None,
        };
        let t = codes.dim(2)?;
        let out = crate::kernels::in_pool(|| {
            let x = self.decode_latent(codes)?.to_dtype(self.dtype)?;
            self.latents_decode_step_rows(s, &x, rows)
        })?;
        let all: Vec<usize> = (0..s.counts.len()).collect();
        for &r in rows.unwrap_or(&all) {
            s.counts[r] += t as u64;
        }
        Ok(out)
    }

    /// The decode step from the quantizer's latents (B, dimension, T), for the batch rows
    /// `rows` (all if `None`).
    fn latents_decode_step_rows(
        &self,
        s: &mut DecodeStream,
        x: &Tensor,
        rows: Option<&[usize]>,
    ) -> Result<Option<Tensor>> {
        let b = x.dim(0)?;
        s.start(b);
        let all: Vec<usize> = (0..b).collect();
        let rows_or_all = rows.unwrap_or(&all);
        match (&self.convs, &mut s.convs) {
            (
                Convs::Native {
                    decoder, upsample, ..
                },
                DecodeConvs::Native(items),
            ) => {
                items.resize_with(s.counts.len(), Default::default);
                let up = |it: &mut DecodeItem, f: &Frames| Ok(upsample.step(&mut it.0, f, None));
                let Some(x) = per_row(items, rows_or_all, x, &self.device, up)? else {
                    return Ok(None);
                };
                let rows = rows.map(|r| (r, s.counts.len()));
                let x = run_transformer_rows(&self.dec_tr, &mut s.tr, &x, rows)?;
                let seanet = |it: &mut DecodeItem, f: &Frames| decoder.apply(&mut it.1, f, None);
                per_row(items, rows_or_all, &x, &self.device, seanet)
            }
            (
                Convs::Candle {
                    decoder, upsample, ..
                },
                DecodeConvs::Candle(items),
            ) => {
                while items.len() < b {
                    items.push((upsample.clone(), decoder.clone()));
                }
                let mut ups = Vec::with_capacity(b);
                for (i, (up, _)) in items.iter_mut().enumerate() {
                    match nonempty(up.step(&x.narrow(0, i, 1)?.into())?)? {
                        Some(y) => ups.push(y),
                        None => return Ok(None),
                    }
                }
                let x = run_transformer(&self.dec_tr, &mut s.tr, &Tensor::cat(&ups, 0)?)?;
                let mut outs = Vec::with_capacity(b);
                for (i, (_, dec)) in items.iter_mut().enumerate() {
                    match nonempty(dec.step(&x.narrow(0, i, 1)?.into())?)? {
                        Some(y) => outs.push(y),
                        None => return Ok(None),
                    }
                }
                Ok(Some(Tensor::cat(&outs, 0)?))
            }
            _ => unreachable!("a stream is made by its codec"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moshi_names_map_to_candle_names() {
        for (m, c) in [
            (
                "encoder.model.0.conv.conv.weight",
                "encoder.layers.0.conv.weight",
            ),
            (
                "encoder.model.1.block.3.conv.conv.bias",
                "encoder.layers.1.block.3.conv.bias",
            ),
            (
                "decoder.model.2.convtr.convtr.weight",
                "decoder.layers.2.conv.weight",
            ),
            ("downsample.conv.conv.conv.weight", "downsample.conv.weight"),
            (
                "upsample.convtr.convtr.convtr.weight",
                "upsample.conv.weight",
            ),
            (
                "encoder_transformer.transformer.layers.3.linear1.weight",
                "encoder_transformer.layers.3.mlp.fc1.weight",
            ),
            (
                "decoder_transformer.transformer.layers.0.norm2.bias",
                "decoder_transformer.layers.0.post_attention_layernorm.bias",
            ),
            (
                "decoder_transformer.transformer.layers.0.layer_scale_1.scale",
                "decoder_transformer.layers.0.self_attn_layer_scale.scale",
            ),
            (
                "quantizer.rvq_first.input_proj.weight",
                "quantizer.semantic_residual_vector_quantizer.input_proj.weight",
            ),
            (
                "quantizer.rvq_rest.vq.layers.2._codebook.embedding_sum",
                "quantizer.acoustic_residual_vector_quantizer.layers.2.codebook.embed_sum",
            ),
            (
                "quantizer.rvq_rest.vq.layers.2._codebook._initialized",
                "quantizer.acoustic_residual_vector_quantizer.layers.2.codebook.initialized",
            ),
        ] {
            assert_eq!(moshi_name(m), c, "{m}");
        }
    }
}

#[cfg(test)]
mod conv_transpose_tests {
    use super::*;

    use crate::testutil::max_abs_diff as max_diff;

    /// candle 0.11.1's CPU conv_transpose1d is wrong for batch items after the first; the
    /// codec works around it (`per_item`, per-item decode streams). If this test starts
    /// failing on a candle upgrade, candle fixed it and the workaround can go.
    #[test]
    fn candle_conv_transpose1d_batch_bug_is_worked_around() {
        let dev = Device::Cpu;
        let vb = Arc::new(TensorSource::seeded(1, None)).var_builder(DType::F32, &dev);
        let up = ConvTrUpsample1d::new(2, 8, true, true, vb.pp("upsample")).unwrap();
        let x = Tensor::from_vec(crate::testutil::test_input(2, 5, 8, 3), (2, 8, 5), &dev).unwrap();
        let single = up.forward(&x.narrow(0, 1, 1).unwrap()).unwrap();
        let batched = up.forward(&x).unwrap().narrow(0, 1, 1).unwrap();
        assert!(
            max_diff(&batched, &single) > 1e-3,
            "candle's batched conv_transpose1d is fixed"
        );
        let worked = per_item(&x, |xi| Ok(up.forward(xi)?))
            .unwrap()
            .narrow(0, 1, 1)
            .unwrap();
        assert!(max_diff(&worked, &single) == 0.0);
    }
}

#[cfg(test)]
mod engine_tests {
    use super::*;
    use crate::testutil::test_input;

    fn small(replicate: bool) -> CodecConfig {
        let mut c = CodecConfig::mimi(4);
        c.seanet.n_filters = 8;
        c.seanet.dimension = 64;
        if replicate {
            c.seanet.pad_mode = PadMode::Replicate;
            c.seanet.true_skip = false;
        }
        c.transformer.d_model = 64;
        c.transformer.num_heads = 4;
        c.transformer.num_layers = 2;
        c.transformer.dim_feedforward = 128;
        c.quantizer_bins = 64;
        c.quantizer_dim = 32;
        c
    }

    fn both(cfg: &CodecConfig) -> (Codec, Codec) {
        let dev = Device::Cpu;
        let mk = |e| {
            Codec::with_engine(
                cfg,
                TensorSource::seeded(7, cfg.transformer.layer_scale),
                &dev,
                DType::F32,
                e,
            )
            .unwrap()
        };
        (mk(Engine::Native), mk(Engine::Candle))
    }

    fn diff(a: &Tensor, b: &Tensor) -> f32 {
        assert_eq!(a.dims(), b.dims());
        crate::testutil::max_abs_diff(a, b)
    }

    /// The native engine computes candle's functions: latents, codes and audio, offline and
    /// streaming, batch 2, both pad modes, lengths that are not whole frames.
    #[test]
    fn native_engine_matches_candle_modules() {
        for replicate in [false, true] {
            let cfg = small(replicate);
            let (native, candle_) = both(&cfg);
            let dev = Device::Cpu;
            let len = 3 * 1920 + 700;
            let pcm = Tensor::from_vec(test_input(2, len, 1, 3), (2, 1, len), &dev).unwrap();
            let ln = native.encode_pre_quantize(&pcm, None).unwrap();
            let lc = candle_.encode_pre_quantize(&pcm, None).unwrap();
            assert!(diff(&ln, &lc) < 1e-4, "latents {}", diff(&ln, &lc));
            let codes = candle_.encode(&pcm, None).unwrap();
            let cn = native.encode(&pcm, None).unwrap();
            assert_eq!(
                cn.to_vec3::<u32>().unwrap(),
                codes.to_vec3::<u32>().unwrap()
            );
            let an = native.decode(&codes, None).unwrap();
            let ac = candle_.decode(&codes, None).unwrap();
            assert!(diff(&an, &ac) < 1e-4, "audio {}", diff(&an, &ac));

            // Streaming in uneven chunks: the codes of whole frames, then the same audio.
            let (mut sn, mut sc) = (native.encode_stream(), candle_.encode_stream());
            let (mut outn, mut outc) = (Vec::new(), Vec::new());
            let mut t0 = 0;
            for n in [1, 700, 1919, 2, 3000].iter().cycle() {
                if t0 >= len {
                    break;
                }
                let n = (*n).min(len - t0);
                let x = pcm.narrow(2, t0, n).unwrap();
                outn.extend(native.encode_step(&mut sn, &x).unwrap());
                outc.extend(candle_.encode_step(&mut sc, &x).unwrap());
                t0 += n;
            }
            let jn = Tensor::cat(&outn, 2).unwrap();
            let jc = Tensor::cat(&outc, 2).unwrap();
            assert_eq!(jn.to_vec3::<u32>().unwrap(), jc.to_vec3::<u32>().unwrap());
            assert_eq!(
                jn.to_vec3::<u32>().unwrap(),
                codes.narrow(2, 0, 3).unwrap().to_vec3::<u32>().unwrap()
            );
            let (mut dn, mut dc) = (native.decode_stream(), candle_.decode_stream());
            let (mut yn, mut yc) = (Vec::new(), Vec::new());
            for t in 0..codes.dim(2).unwrap() {
                let c = codes.narrow(2, t, 1).unwrap();
                yn.extend(native.decode_step(&mut dn, &c).unwrap());
                yc.extend(candle_.decode_step(&mut dc, &c).unwrap());
            }
            let yn = Tensor::cat(&yn, 2).unwrap();
            let yc = Tensor::cat(&yc, 2).unwrap();
            assert!(diff(&yn, &yc) < 1e-4, "stream audio {}", diff(&yn, &yc));
            assert!(
                diff(&yn, &an) < 1e-4,
                "stream vs offline {}",
                diff(&yn, &an)
            );

            // Offline calls are streams over chunks: any chunk size gives one pass's result.
            let mut native = native;
            for (ce, cd, block) in [(1, 1, 1), (959, 2, 3), (1920, 3, 250), (5000, 1000, 7)] {
                native.offline = Offline {
                    encode_chunk: ce,
                    decode_chunk: cd,
                    block,
                    segment: 1 << 20,
                };
                let l = native.encode_pre_quantize(&pcm, None).unwrap();
                assert!(diff(&l, &ln) < 1e-5, "encode chunk {ce}: {}", diff(&l, &ln));
                let a = native.decode(&codes, None).unwrap();
                assert!(diff(&a, &an) < 1e-5, "decode chunk {cd}: {}", diff(&a, &an));
            }
        }
    }

    /// The receptive fields behind the offline split: Mimi's SEANet encoder reads 3320
    /// samples back (rounded up to 4 frames of 960), its decoder 8 frames.
    #[test]
    fn seanet_warmup_is_the_receptive_field() {
        let cfg = CodecConfig::mimi(8);
        let (native, _) = both(&small(false));
        let Convs::Native {
            encoder, decoder, ..
        } = &native.convs
        else {
            unreachable!()
        };
        assert_eq!(
            (encoder.hop(), decoder.hop()),
            (cfg.seanet.hop_length(), 960)
        );
        assert_eq!((encoder.warmup(), decoder.warmup()), (3840, 8));
    }

    /// Offline calls split along time (segments down to one frame, blocks that cut
    /// segments, both pad modes, batch 2) give the unsplit result: the warm-up covers the
    /// receptive field.
    #[test]
    fn offline_segments_give_the_one_pass_result() {
        for replicate in [false, true] {
            let (mut native, _) = both(&small(replicate));
            let dev = Device::Cpu;
            let len = 23 * 960 + 333;
            let pcm = Tensor::from_vec(test_input(2, len, 1, 5), (2, 1, len), &dev).unwrap();
            native.offline.segment = 1 << 20;
            let l1 = native.encode_pre_quantize(&pcm, None).unwrap();
            let codes = native.encode(&pcm, None).unwrap();
            let a1 = native.decode(&codes, None).unwrap();
            for (segment, block) in [(11, 250), (7, 250), (3, 9), (1, 3)] {
                native.offline.segment = segment;
                native.offline.block = block;
                let l = native.encode_pre_quantize(&pcm, None).unwrap();
                assert!(diff(&l, &l1) < 1e-5, "{segment}/{block}: {}", diff(&l, &l1));
                let a = native.decode(&codes, None).unwrap();
                assert!(diff(&a, &a1) < 1e-5, "{segment}/{block}: {}", diff(&a, &a1));
            }
        }
    }

    /// Offline results are the same bits on 1, 2 or 3 threads: the cuts depend on the
    /// input only.
    #[test]
    fn offline_results_do_not_depend_on_the_thread_count() {
        let (mut native, _) = both(&small(false));
        native.offline.segment = 5;
        let len = 17 * 960 + 100;
        let pcm = Tensor::from_vec(test_input(2, len, 1, 9), (2, 1, len), &Device::Cpu).unwrap();
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                let codes = native.encode(&pcm, None).unwrap();
                let audio = native.decode(&codes, None).unwrap();
                let latents = native.encode_pre_quantize(&pcm, None).unwrap();
                let flat = |t: Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                (codes.to_vec3::<u32>().unwrap(), flat(latents), flat(audio))
            })
        };
        let one = run(1);
        for threads in [2, 3] {
            assert!(run(threads) == one, "{threads} threads");
        }
    }

    /// Half precision runs candle's modules in that dtype, with the quantizer in f32: codes
    /// mostly agree with the f32 native engine's, offline and streaming, and audio comes back
    /// in the codec's dtype. (Bounds on real data: tests/test_half.py.)
    #[test]
    fn half_precision_codec_runs_and_agrees_with_f32() {
        let cfg = small(false);
        let dev = Device::Cpu;
        let len = 3 * 1920 + 700;
        let pcm = Tensor::from_vec(test_input(2, len, 1, 3), (2, 1, len), &dev).unwrap();
        let (native, _) = both(&cfg);
        let reference = native.encode(&pcm, None).unwrap().flatten_all().unwrap();
        let reference = reference.to_vec1::<u32>().unwrap();
        for dtype in [DType::F16, DType::BF16] {
            let seeded = TensorSource::seeded(7, cfg.transformer.layer_scale);
            let half = Codec::new(&cfg, seeded, &dev, dtype).unwrap();
            assert_eq!(half.engine(), Engine::Candle);
            let pcm = pcm.to_dtype(dtype).unwrap();
            let codes = half.encode(&pcm, None).unwrap();
            let flat = codes.flatten_all().unwrap().to_vec1::<u32>().unwrap();
            let equal = flat.iter().zip(&reference).filter(|(a, b)| a == b).count();
            assert!(
                equal * 10 >= reference.len() * 9,
                "{dtype:?}: {equal}/{}",
                flat.len()
            );
            let audio = half.decode(&codes, None).unwrap();
            assert_eq!(
                (audio.dims(), audio.dtype()),
                (&[2, 1, 4 * 1920][..], dtype)
            );
            let mut s = half.encode_stream();
            let frame = half
                .encode_step(&mut s, &pcm.narrow(2, 0, 1920).unwrap())
                .unwrap();
            let frame = frame.unwrap().to_vec3::<u32>().unwrap();
            assert_eq!(
                frame,
                codes.narrow(2, 0, 1).unwrap().to_vec3::<u32>().unwrap()
            );
        }
    }
}
