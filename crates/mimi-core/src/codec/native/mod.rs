//! The native engine: the convolutional parts on this crate's CPU convolutions (float32
//! compute, float32 or bf16 weights: [`crate::seanet`], [`crate::conv`]), with one state
//! per batch row, and offline calls cut into parallel segments ([`cut`]). A
//! batched streaming step runs each layer once for all its rows: the frame-rate layers (few
//! frames, large weights) on shared matrix-vector calls, so their weights are read once per
//! step rather than once per row, the high-rate layers on the rows side by side.

pub(crate) mod cut;

use super::activations::Activations;
use super::bridge::select_mut;
use super::engine::{
    DecodeBlocks, DecodeConvs, EncodeBlocks, EncodeConvs, Engine, EngineKind, Parts,
};
use crate::config::{CodecConfig, PadMode};
use crate::conv::{Conv1d, ConvSpec, ConvState, ConvTr1d, Frames};
use crate::error::{locked, Cancel, Error, Result};
use crate::rows::{RowList, Rows};
use crate::runtime::precision::{MediumLayers, Precision};
use crate::seanet;
use candle::{DType, Device};
use candle_nn::VarBuilder;
use cut::{empty, segments, split, stream_window};
use std::sync::{Arc, Mutex};

/// One batch item's encoder state: the SEANet encoder's and the downsampling's.
type EncodeItem = (seanet::EncoderState, ConvState);
/// One batch item's decoder state: the upsampling's and the SEANet decoder's.
type DecodeItem = (ConvState, seanet::DecoderState);

/// The native engine's weights.
pub(crate) struct Native {
    pub(crate) encoder: seanet::Encoder,
    pub(crate) decoder: seanet::Decoder,
    downsample: Conv1d,
    upsample: ConvTr1d,
}

impl Native {
    /// The SEANets and the down/upsampling, from `vb` (f32); at `precision="high"`, the
    /// large layers then converted to bf16, one at a time; at `"medium"`, the groups of
    /// `medium` (`MIMI_PY_MEDIUM_LAYERS`, which the caller read; None at the other
    /// precisions) in bf16 pairs.
    pub(crate) fn load(
        cfg: &CodecConfig,
        vb: &VarBuilder,
        precision: Precision,
        medium: Option<MediumLayers>,
    ) -> Result<Self> {
        let bf16 = precision == Precision::High;
        let dim = cfg.seanet.dimension;
        let stride = cfg.downsample_stride();
        let down = ConvSpec::new(dim, dim, 2 * stride)
            .stride(stride)
            .no_bias()
            .pad(PadMode::Replicate);
        let mut encoder = seanet::Encoder::load(&cfg.seanet, vb.pp("encoder"))?;
        let mut downsample = Conv1d::load(vb.pp("downsample"), down)?;
        if bf16 {
            encoder.store_bf16();
            downsample.store_bf16();
        }
        let mut decoder = seanet::Decoder::load(&cfg.seanet, vb.pp("decoder"))?;
        let mut upsample = ConvTr1d::load_depthwise(vb.pp("upsample"), dim, stride)?;
        if bf16 {
            decoder.store_bf16();
            upsample.store_bf16();
        }
        // The frame-rate layers' weights, packed once (each converted to bf16 first).
        encoder.pack();
        downsample.pack();
        decoder.pack();
        upsample.pack();
        if let Some(layers) = medium {
            encoder.pair_pack(layers);
            decoder.pair_pack(layers);
            if layers.frame_rate {
                downsample.pair_pack();
                upsample.pair_pack();
            }
        }
        Ok(Self {
            encoder,
            decoder,
            downsample,
            upsample,
        })
    }

    /// The SEANet encoder over `[b0, b1)` of every item, split into parallel segments: the
    /// high-rate layers stream over chunks (which bounds memory); the frame-rate layers,
    /// with large weights, take each segment in one call.
    fn encode_block(
        &self,
        p: &Parts,
        audio: &[Frames],
        (b0, b1): (usize, usize),
        last: bool,
        cancel: Cancel,
    ) -> Result<Vec<Frames>> {
        let (enc, o) = (&self.encoder, &p.offline);
        let (hop, warm) = (enc.hop(), enc.warmup());
        let job = |i: usize, s0: usize, s1: usize| {
            let start = s0.saturating_sub(warm);
            let mut es = seanet::EncoderState::default();
            let high = stream_window(
                &audio[i],
                (start, s1),
                o.encode_chunk,
                0,
                enc.high_rate_channels(),
                |x, end| enc.high_rate(&mut es, x, last && end, cancel),
            )?;
            let y = enc.frame_rate(&mut es, &high, last);
            let skip = ((s0 - start) / hop).min(y.len);
            Ok(y.window(skip, y.len))
        };
        split(audio.len(), (b0, b1), o.segment * hop, job)
    }

    /// The SEANet decoder over `ext` (each item's transformer frames, the warm-up kept from
    /// before included) from frame `off` on, split into parallel segments: the frame-rate
    /// layers take each segment in one call, the rest streams over chunks.
    fn decode_block(
        &self,
        p: &Parts,
        ext: &[Frames],
        off: usize,
        cancel: Cancel,
    ) -> Result<Vec<Frames>> {
        let (dec, o) = (&self.decoder, &p.offline);
        let (hop, warm) = (dec.hop(), dec.warmup());
        let per_frame = p.cfg.downsample_stride();
        let job = |i: usize, s0: usize, s1: usize| {
            let start = s0.saturating_sub(warm);
            let mut ds = seanet::DecoderState::default();
            let low = dec.frame_rate(&mut ds, &ext[i].window(start, s1));
            let chunk = o.decode_chunk * per_frame * dec.frame_rate_stride();
            stream_window(
                &low,
                (0, low.len),
                chunk,
                (s0 - start) * hop,
                p.cfg.seanet.channels,
                |x, _| dec.high_rate(&mut ds, x, cancel),
            )
        };
        split(ext.len(), (off, ext[0].len), o.segment, job)
    }
}

impl Engine for Native {
    fn kind(&self) -> EngineKind {
        EngineKind::Native
    }

    fn weights_nbytes(&self) -> usize {
        (self.encoder.weights_nbytes() + self.decoder.weights_nbytes())
            + (self.downsample.weights_nbytes() + self.upsample.weights_nbytes())
    }

    /// Blocks of `offline.block` tokens: the SEANet encoder over each block's samples
    /// ([`Self::encode_block`]; the last segment flushes the offline right padding), and
    /// the downsampling, whose stream runs on across blocks.
    fn encode_blocks<'a>(
        &'a self,
        p: &'a Parts,
        pcm: Activations,
        cancel: Cancel<'a>,
    ) -> Result<Box<dyn EncodeBlocks + 'a>> {
        let audio = pcm.into_frames()?.into_vec();
        Ok(Box::new(NativeEncodeBlocks {
            engine: self,
            p,
            items: (0..audio.len()).map(|_| Default::default()).collect(),
            audio,
            cancel,
        }))
    }

    /// The decoder pads nothing on the right, so a stream gives the offline result. Blocks
    /// of `offline.block` tokens: the upsampling (a stream across blocks), then the SEANet
    /// decoder over the block ([`Self::decode_block`]); each item keeps the transformer's
    /// last frames as the next block's warm-up.
    fn decode_blocks<'a>(
        &'a self,
        p: &'a Parts,
        latents: Activations,
        cancel: Cancel<'a>,
    ) -> Result<Box<dyn DecodeBlocks + 'a>> {
        let latents = latents.into_frames()?.into_vec();
        let b = latents.len();
        Ok(Box::new(NativeDecodeBlocks {
            engine: self,
            p,
            latents,
            items: (0..b).map(|_| Default::default()).collect(),
            tails: vec![Frames::empty(p.cfg.seanet.dimension); b],
            cancel,
        }))
    }

    /// SEANet activations take about 2 KB per sample of audio in flight (measured on the
    /// real model, 64 filters); one chunk is in flight per running segment job (two chunks
    /// counted, as on 2 threads), plus the input, the latents and the output (tens of bytes
    /// per sample).
    fn in_flight(&self, p: &Parts, samples: usize) -> (u64, u64) {
        (
            samples.min(2 * p.offline.encode_chunk) as u64,
            64 * samples as u64,
        )
    }

    fn activations(
        &self,
        data: Vec<f32>,
        shape: (usize, usize, usize),
        _on: (&Device, DType),
    ) -> Result<Activations> {
        Activations::host_frames(data, shape)
    }

    fn no_activations(&self, shape: (usize, usize), _on: (&Device, DType)) -> Result<Activations> {
        Ok(Activations::no_frames(shape))
    }

    fn encode_convs(self: Arc<Self>) -> Box<dyn EncodeConvs> {
        Box::new(NativeEncode::new(self))
    }

    fn decode_convs(self: Arc<Self>) -> Box<dyn DecodeConvs> {
        Box::new(NativeDecode::new(self))
    }
}

/// Each item's blocks (one [`Activations`] of frames per block) joined along time.
fn join_blocks(parts: Vec<Activations>, items: usize, channels: usize) -> Result<Vec<Frames>> {
    let mut per_item: Vec<Vec<Frames>> = (0..items).map(|_| Vec::new()).collect();
    for part in parts {
        for (out, f) in per_item.iter_mut().zip(part.into_frames()?) {
            out.push(f);
        }
    }
    Ok(per_item
        .iter()
        .map(|fs| Frames::cat(channels, fs))
        .collect())
}

/// An offline encode on the native engine: the audio as frames and each item's states.
struct NativeEncodeBlocks<'a> {
    engine: &'a Native,
    p: &'a Parts,
    audio: Vec<Frames>,
    items: Vec<EncodeItem>,
    cancel: Cancel<'a>,
}

impl EncodeBlocks for NativeEncodeBlocks<'_> {
    fn blocks(&self) -> Vec<(usize, usize)> {
        let len = self.audio.first().map_or(0, |f| f.len);
        let hop = self.engine.encoder.hop();
        segments(0, len, self.p.offline.block.max(1) * hop)
    }

    fn seanet(&mut self, block: (usize, usize), last: bool) -> Result<Option<Activations>> {
        let x = (self.engine).encode_block(self.p, &self.audio, block, last, self.cancel)?;
        Activations::Frames(x.into()).nonempty()
    }

    fn downsample(&mut self, x: Activations, last: bool) -> Result<Option<Activations>> {
        let down = &self.engine.downsample;
        let ys = (self.items.iter_mut().zip(x.into_frames()?))
            .map(|(it, f)| down.step(&mut it.1, &f, None, None, last))
            .collect();
        Activations::Frames(ys).nonempty()
    }

    fn finish(&self, parts: Vec<Activations>) -> Result<Activations> {
        let dim = self.p.cfg.seanet.dimension;
        let latents = join_blocks(parts, self.items.len(), dim)?;
        Activations::Frames(latents.into())
            .nonempty()?
            .ok_or_else(empty)
    }
}

/// An offline decode on the native engine: the latents as frames, each item's states and
/// the transformer's last frames (the next block's warm-up).
struct NativeDecodeBlocks<'a> {
    engine: &'a Native,
    p: &'a Parts,
    latents: Vec<Frames>,
    items: Vec<DecodeItem>,
    tails: Vec<Frames>,
    cancel: Cancel<'a>,
}

impl DecodeBlocks for NativeDecodeBlocks<'_> {
    fn blocks(&self) -> Vec<(usize, usize)> {
        let len = self.latents.first().map_or(0, |f| f.len);
        let per_block = self
            .p
            .offline
            .block
            .div_ceil(self.p.cfg.downsample_stride());
        segments(0, len, per_block.max(1))
    }

    fn upsample(&mut self, (t0, t1): (usize, usize)) -> Result<Option<Activations>> {
        let up = &self.engine.upsample;
        let ys = (self.items.iter_mut().zip(&self.latents))
            .map(|(it, f)| up.step(&mut it.0, &f.window(t0, t1), None))
            .collect();
        Activations::Frames(ys).nonempty()
    }

    fn seanet(&mut self, x: Activations) -> Result<Activations> {
        let dim = self.p.cfg.seanet.dimension;
        // Each item's frames: the warm-up kept from earlier blocks, then this block's.
        let ext: Vec<Frames> = (self.tails.iter().zip(x.into_frames()?))
            .map(|(t, y)| Frames::cat(dim, &[t.window(0, t.len), y]))
            .collect();
        let off = self.tails.first().map_or(0, |t| t.len);
        let audio = (self.engine).decode_block(self.p, &ext, off, self.cancel)?;
        let warm = self.engine.decoder.warmup();
        self.tails = ext.iter().map(|e| e.tail(warm)).collect();
        Ok(Activations::Frames(audio.into()))
    }

    fn finish(&self, parts: Vec<Activations>) -> Result<Activations> {
        let audio = join_blocks(parts, self.items.len(), self.p.cfg.seanet.channels)?;
        Activations::Frames(audio.into())
            .nonempty()?
            .ok_or_else(empty)
    }
}

/// A stream on the native engine: one state per batch row (`EncodeItem`s for the encoder,
/// `DecodeItem`s for the decoder), grown to the batch on its first step.
struct RowStates<I> {
    engine: Arc<Native>,
    items: Vec<I>,
}

type NativeEncode = RowStates<EncodeItem>;
type NativeDecode = RowStates<DecodeItem>;

impl<I: Default + Clone> RowStates<I> {
    fn new(engine: Arc<Native>) -> Self {
        let items = Vec::new();
        Self { engine, items }
    }

    /// Row `r` back to a fresh stream (a row the stream has not reached yet already is).
    fn reset(&mut self, r: usize) {
        if let Some(item) = self.items.get_mut(r) {
            *item = I::default();
        }
    }

    /// A copy with its own states and the same engine.
    fn copy(&self) -> Self {
        let (engine, items) = (self.engine.clone(), self.items.clone());
        Self { engine, items }
    }
}

impl EncodeConvs for NativeEncode {
    /// Every layer's rows in shared products, each row still its own stream (see
    /// [`seanet::Encoder::high_rate_rows`], [`seanet::Encoder::frame_rate_rows`]).
    fn seanet(&mut self, rows: &Rows, pcm: Activations, last: bool) -> Result<Option<Activations>> {
        self.items.resize_with(rows.batch(), Default::default);
        let enc = &self.engine.encoder;
        let mut items = select_mut(&mut self.items, &rows.indices())?;
        let mut sts: RowList<&mut seanet::EncoderState> =
            items.iter_mut().map(|it| &mut it.0).collect();
        let run = |sts: &mut [&mut seanet::EncoderState], xs: &[Frames]| {
            enc.high_rate_rows(sts, xs, last, None)
        };
        let high = by_groups(&mut sts, &pcm.into_frames()?, &run)?;
        Activations::Frames(enc.frame_rate_rows(&mut sts, &high, last)).nonempty()
    }

    fn downsample(
        &mut self,
        rows: &Rows,
        x: Activations,
        last: bool,
    ) -> Result<Option<Activations>> {
        let down = &self.engine.downsample;
        let mut items = select_mut(&mut self.items, &rows.indices())?;
        let mut sts: RowList<&mut ConvState> = items.iter_mut().map(|it| &mut it.1).collect();
        let ys = down.step_rows(&mut sts, &x.into_frames()?, None, last);
        Activations::Frames(ys).nonempty()
    }

    fn reset_row(&mut self, r: usize) {
        self.reset(r)
    }

    fn deep_copy(&self) -> Box<dyn EncodeConvs> {
        Box::new(self.copy())
    }
}

/// `f` over the rows (`sts[r]`, `xs[r]`) in one group per thread, the groups at once: the
/// high-rate layers (small weights, many frames per row) keep both threads busier split by
/// rows than by the output channels of each layer in turn, as the offline path splits by
/// segments. The groups are one team loop (`kernels::for_each_index`: no fork/join, and
/// nothing allocated up to [`crate::rows::ROWS_INLINE`] rows); each group's own loops run in
/// place. A row's bits do not depend on its group.
fn by_groups<S: Send, T: Send>(
    sts: &mut [S],
    xs: &[Frames],
    f: &(impl Fn(&mut [S], &[Frames]) -> Result<RowList<T>> + Sync),
) -> Result<RowList<T>> {
    let threads = rayon::current_num_threads().max(1);
    let size = sts.len().div_ceil(threads).max(1);
    if sts.len() <= size {
        return match threads {
            // One thread: the rows one by one, as a group's (no joined copies).
            1 => crate::conv::as_group(|| f(sts, xs)),
            // One group: its layers' tiles keep the threads busy.
            _ => f(sts, xs),
        };
    }
    // Each group's states, and each row's output; the first error.
    let groups: RowList<Mutex<&mut [S]>> = sts.chunks_mut(size).map(Mutex::new).collect();
    let outs: RowList<Mutex<Option<T>>> = xs.iter().map(|_| Mutex::new(None)).collect();
    let failed: Mutex<Option<Error>> = Mutex::new(None);
    crate::kernels::for_each_index(groups.len(), |g| {
        let mut group = locked(&groups[g]);
        let rows = g * size..g * size + group.len();
        match crate::conv::as_group(|| f(&mut group, &xs[rows.clone()])) {
            Ok(ys) => (ys.into_iter().zip(&outs[rows])).for_each(|(y, o)| *locked(o) = Some(y)),
            Err(e) => *locked(&failed) = Some(e),
        }
    });
    if let Some(e) = locked(&failed).take() {
        return Err(e);
    }
    (outs.into_iter())
        .map(|o| o.into_inner().ok().flatten())
        .collect::<Option<RowList<T>>>()
        .ok_or_else(|| Error::Internal("a group of rows left a row without output".into()))
}

impl DecodeConvs for NativeDecode {
    /// Each row through its own upsampling state.
    fn upsample(&mut self, rows: &Rows, x: Activations) -> Result<Option<Activations>> {
        self.items.resize_with(rows.batch(), Default::default);
        let up = &self.engine.upsample;
        let items = select_mut(&mut self.items, &rows.indices())?;
        let ys = (items.into_iter().zip(x.into_frames()?))
            .map(|(it, f)| up.step(&mut it.0, &f, None))
            .collect();
        Activations::Frames(ys).nonempty()
    }

    /// The frame-rate layers, then the high-rate layers, each layer's rows in shared
    /// products (see [`seanet::Decoder::high_rate_rows`]).
    fn seanet(&mut self, rows: &Rows, x: Activations) -> Result<Option<Activations>> {
        let dec = &self.engine.decoder;
        let mut items = select_mut(&mut self.items, &rows.indices())?;
        let mut sts: RowList<&mut seanet::DecoderState> =
            items.iter_mut().map(|it| &mut it.1).collect();
        let low = dec.frame_rate_rows(&mut sts, &x.into_frames()?);
        let run = |sts: &mut [&mut seanet::DecoderState], xs: &[Frames]| {
            dec.high_rate_rows(sts, xs, None)
        };
        Activations::Frames(by_groups(&mut sts, &low, &run)?).nonempty()
    }

    fn reset_row(&mut self, r: usize) {
        self.reset(r)
    }

    fn deep_copy(&self) -> Box<dyn DecodeConvs> {
        Box::new(self.copy())
    }
}
