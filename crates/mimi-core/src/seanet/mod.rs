//! The SEANet encoder and decoder (candle's `mimi::seanet`), assembled from the native
//! convolutions of [`crate::conv`]: residual blocks, strided down/upsampling and the
//! outer convolutions, with their streaming states, built from the one [`Topology`]. The codec's Rust tests compare the whole
//! SEANet with the candle engine's, offline and streaming, and that with candle's modules.

use crate::error::Result;
use candle_nn::VarBuilder;

use crate::config::SeanetConfig;
use crate::conv::{Conv1d, ConvState, ConvTr1d, Frames};
use crate::error::Cancel;
use crate::rows::RowList;
use crate::runtime::precision::MediumLayers;
use crate::runtime::profile::time;

pub mod topology;
pub use topology::Topology;

/// The native engine's layers ([`topology::Layers`]): `conv` layers, the ELU applied by the
/// encoder and decoder (their `alpha`).
struct NativeLayers;

impl topology::Layers for NativeLayers {
    type Conv = Conv1d;
    type ConvTr = ConvTr1d;
    type Block = ResBlock;

    fn conv(&self, vb: &VarBuilder, l: &topology::Layer) -> Result<Conv1d> {
        Ok(Conv1d::load(vb.pp(l.index), l.spec)?)
    }

    fn conv_tr(&self, vb: &VarBuilder, l: &topology::Layer) -> Result<ConvTr1d> {
        Ok(ConvTr1d::load(vb.pp(l.index), l.spec)?)
    }

    fn block(&self, vb: &VarBuilder, b: &topology::Block) -> Result<ResBlock> {
        ResBlock::load(vb, b)
    }
}

#[derive(Clone, Debug)]
struct ResBlock {
    convs: Vec<Conv1d>,
    shortcut: Option<Conv1d>,
}

#[derive(Clone, Debug, Default)]
pub struct ResState {
    convs: Vec<ConvState>,
}

impl ResBlock {
    /// Its convolutions in bf16 pairs (`precision="medium"`).
    fn pair_pack(&mut self) {
        self.convs.iter_mut().for_each(Conv1d::pair_pack);
        self.shortcut.iter_mut().for_each(Conv1d::pair_pack);
    }

    fn weights_nbytes(&self) -> usize {
        let convs: usize = self.convs.iter().map(Conv1d::weights_nbytes).sum();
        convs + self.shortcut.as_ref().map_or(0, Conv1d::weights_nbytes)
    }
}

/// Bytes of a stage's residual blocks.
fn blocks_nbytes(blocks: &[ResBlock]) -> usize {
    blocks.iter().map(ResBlock::weights_nbytes).sum()
}

impl ResBlock {
    /// The block `b` of the topology, under `vb` (the checkpoint's `layers`).
    fn load(vb: &VarBuilder, b: &topology::Block) -> Result<Self> {
        let vb = vb.pp(b.index);
        let convs = vec![
            Conv1d::load(vb.pp("block").pp(1), b.conv1)?,
            Conv1d::load(vb.pp("block").pp(3), b.conv2)?,
        ];
        let shortcut = match b.shortcut {
            None => None,
            Some(spec) => Some(Conv1d::load(vb.pp("shortcut"), spec)?),
        };
        Ok(Self { convs, shortcut })
    }

    /// The first input frame that output frame `out` depends on.
    fn first_input(&self, out: i64) -> i64 {
        self.convs.iter().rev().fold(out, |o, c| c.first_input(o))
    }

    fn apply(&self, st: &mut ResState, x: &Frames, alpha: f32, last: bool) -> Frames {
        // k = 1 shortcut: no padding, no state.
        let shortcut = self.shortcut.as_ref().map(|sc| sc.forward(x, None, None));
        let skip = shortcut.as_ref().unwrap_or(x);
        st.convs.resize_with(2, ConvState::default);
        let (a, b) = st.convs.split_at_mut(1);
        let (c1, c2) = (&self.convs[0], &self.convs[1]);
        if x.len > crate::conv::STEP_FRAMES && c1.stride == 1 && c2.k == 1 {
            // The pointwise second convolution keeps no state: fuse the two.
            return match c1.prepare(&mut a[0], x, Some(alpha), last) {
                None => Frames::empty(c2.cout),
                Some(full) => c1.run_fused(&full, c2, alpha, skip),
            };
        }
        let h = c1.step(&mut a[0], x, Some(alpha), None, last);
        c2.step(&mut b[0], &h, Some(alpha), Some(skip), last)
    }

    /// [`Self::apply`] of several rows: a fused block's rows side by side in one run
    /// ([`Conv1d::run_fused_rows`]), row `r` getting the bits `apply` gives it alone.
    fn apply_rows(
        &self,
        sts: &mut [&mut ResState],
        xs: &[Frames],
        alpha: f32,
        last: bool,
    ) -> RowList<Frames> {
        let (c1, c2) = (&self.convs[0], &self.convs[1]);
        let fused = c1.stride == 1 && c2.k == 1 && self.shortcut.is_none();
        let bytes = c1.weights_nbytes() + c2.weights_nbytes();
        let alone = xs.iter().any(|x| x.len <= crate::conv::STEP_FRAMES)
            || crate::conv::rows_alone_in_group(bytes);
        if xs.len() < 2 || !fused || alone {
            return (sts.iter_mut().zip(xs))
                .map(|(st, x)| self.apply(st, x, alpha, last))
                .collect();
        }
        // Every row has frames, so every row's prepared input is there.
        let fulls: RowList<Frames> = (sts.iter_mut().zip(xs))
            .filter_map(|(st, x)| {
                st.convs.resize_with(2, ConvState::default);
                c1.prepare(&mut st.convs[0], x, Some(alpha), last)
            })
            .collect();
        let skips: RowList<&Frames> = xs.iter().collect();
        c1.run_fused_rows(&fulls, c2, alpha, &skips)
    }
}

/// The SEANet encoder (`SeaNetEncoder`): audio (channels, samples) -> (dimension, frames).
#[derive(Clone, Debug)]
pub struct Encoder {
    init: Conv1d,
    layers: Vec<(Vec<ResBlock>, Conv1d)>,
    last: Conv1d,
    alpha: f32,
}

/// The streaming state of an [`Encoder`] (one batch item).
#[derive(Clone, Debug, Default)]
pub struct EncoderState {
    init: ConvState,
    layers: Vec<(Vec<ResState>, ConvState)>,
    last: ConvState,
}

impl Encoder {
    /// Bytes of its weights, as stored.
    pub fn weights_nbytes(&self) -> usize {
        let stages: usize = (self.layers.iter())
            .map(|(blocks, down)| blocks_nbytes(blocks) + down.weights_nbytes())
            .sum();
        self.init.weights_nbytes() + stages + self.last.weights_nbytes()
    }
}

impl Encoder {
    pub fn load(cfg: &SeanetConfig, vb: VarBuilder) -> Result<Self> {
        let built = topology::build_encoder(cfg, &NativeLayers, vb)?;
        Ok(Self {
            init: built.init,
            layers: built.stages,
            last: built.last,
            alpha: cfg.activation.0 as f32,
        })
    }

    /// Stores the frame-rate layers' large weights in bf16 (`weights_dtype="bfloat16"`): the
    /// last down-sampling and the last convolution. The high-rate layers stay f32: a streaming
    /// step gives them many frames per row, which the f32 strategies take faster than the
    /// matrix-vector kernel reads bf16 (the 256 -> 512 down-sampling, 1.6 M weights, took
    /// twice as long in bf16 at 8 rows: `benches/README.md`).
    pub fn store_bf16(&mut self) {
        self.last.store_bf16();
        if let Some((_, down)) = self.layers.last_mut() {
            down.store_bf16();
        }
    }

    /// `precision="medium"`: the groups of `layers` in bf16 pairs. The first convolution
    /// (the audio, one channel) stays f32; `frame_rate` is the last down-sampling and the
    /// last convolution, `encoder_convs` the other residual blocks and down-samplings.
    pub fn pair_pack(&mut self, layers: MediumLayers) {
        let n = self.layers.len();
        for (i, (blocks, down)) in self.layers.iter_mut().enumerate() {
            if layers.encoder_convs {
                blocks.iter_mut().for_each(ResBlock::pair_pack);
            }
            let frame_rate = i + 1 == n;
            if (frame_rate && layers.frame_rate) || (!frame_rate && layers.encoder_convs) {
                down.pair_pack();
            }
        }
        if layers.frame_rate {
            self.last.pair_pack();
        }
    }

    /// Packs the frame-rate layers' large weights (those [`Self::store_bf16`] takes) for
    /// the packed product.
    pub fn pack(&mut self) {
        self.last.pack();
        if let Some((_, down)) = self.layers.last_mut() {
            down.pack();
        }
    }

    /// Samples per output frame.
    pub fn hop(&self) -> usize {
        self.layers.iter().map(|(_, down)| down.stride).product()
    }

    /// How many samples before a frame boundary a fresh stream must start for its frames
    /// from that boundary on to be the offline ones: the receptive field to the left, in
    /// whole frames (there is no recurrence, so it is finite). Mimi: 3320 samples, so 3840 (4 frames).
    pub fn warmup(&self) -> usize {
        let f = 1 << 20;
        let mut first = self.last.first_input(f);
        for (res, down) in self.layers.iter().rev() {
            first = down.first_input(first);
            first = res.iter().rev().fold(first, |o, r| r.first_input(o));
        }
        let first = self.init.first_input(first);
        let hop = self.hop() as i64;
        ((f * hop - first).max(0) as usize).next_multiple_of(hop as usize)
    }

    /// Streaming: the frames this chunk of audio completes; with `last`, the audio ends
    /// here (see [`Conv1d::step`]). Offline = one chunk with `last`, or any chunking of it.
    /// The same as [`Self::frame_rate`] of [`Self::high_rate`].
    pub fn apply(
        &self,
        st: &mut EncoderState,
        x: &Frames,
        last: bool,
        cancel: Cancel,
    ) -> Result<Frames> {
        let h = self.high_rate(st, x, last, cancel)?;
        Ok(self.frame_rate(st, &h, last))
    }

    /// The layers at the higher rates: all but the last down-sampling and the last
    /// convolution. Output: [`Self::high_rate_channels`] at `ratios[0]` times the frame rate.
    pub fn high_rate(
        &self,
        st: &mut EncoderState,
        x: &Frames,
        last: bool,
        cancel: Cancel,
    ) -> Result<Frames> {
        let mut out = self.high_rate_rows(&mut [st], std::slice::from_ref(x), last, cancel)?;
        Ok(out
            .pop()
            .unwrap_or_else(|| Frames::empty(self.high_rate_channels())))
    }

    /// [`Self::high_rate`] of several rows (`sts[r]`, `xs[r]`), each layer's rows in shared
    /// products ([`Conv1d::step_rows`]); row `r` gets the bits `high_rate` gives it alone.
    pub fn high_rate_rows(
        &self,
        sts: &mut [&mut EncoderState],
        xs: &[Frames],
        last: bool,
        cancel: Cancel,
    ) -> Result<RowList<Frames>> {
        let a = Some(self.alpha);
        for st in sts.iter_mut() {
            st.layers.resize_with(self.layers.len(), Default::default);
            for ((res, _), ls) in self.layers.iter().zip(st.layers.iter_mut()) {
                ls.0.resize_with(res.len(), Default::default);
            }
        }
        let mut cs: RowList<&mut ConvState> = sts.iter_mut().map(|st| &mut st.init).collect();
        let mut x = time(
            || "enc.init".into(),
            || self.init.step_rows(&mut cs, xs, None, last),
        );
        drop(cs); // (a `RowList` holds its borrows to its end)
        let stages = self.layers.len();
        for (i, (res, down)) in self.layers.iter().enumerate() {
            crate::error::check_cancel(cancel)?;
            for (j, r) in res.iter().enumerate() {
                let mut rs: RowList<&mut ResState> =
                    sts.iter_mut().map(|st| &mut st.layers[i].0[j]).collect();
                x = time(
                    || format!("enc.s{i}.res{j}"),
                    || r.apply_rows(&mut rs, &x, self.alpha, last),
                );
            }
            if i + 1 < stages {
                let mut cs: RowList<&mut ConvState> =
                    sts.iter_mut().map(|st| &mut st.layers[i].1).collect();
                x = time(
                    || format!("enc.s{i}.down"),
                    || down.step_rows(&mut cs, &x, a, last),
                );
            }
        }
        Ok(x)
    }

    /// The channels of [`Self::high_rate`]'s output.
    pub fn high_rate_channels(&self) -> usize {
        // residual blocks keep their stage's width: the last down-sampling's input
        self.layers
            .last()
            .map_or(self.init.cout, |(_, down)| down.cin)
    }

    /// The last down-sampling and the last convolution, after [`Self::high_rate`]. Few frames
    /// and large weights (Mimi: 40 MB, which `gemm` packs on every call), so an offline call
    /// runs them once per segment rather than per chunk: 1 thread, per second of audio, 9.2
    /// ms in 0.5 s chunks against 4.8 ms in 5 s (`mimi_kernel_bench`).
    pub fn frame_rate(&self, st: &mut EncoderState, x: &Frames, last: bool) -> Frames {
        let a = Some(self.alpha);
        st.layers.resize_with(self.layers.len(), Default::default);
        let down = match (self.layers.last(), st.layers.last_mut()) {
            (Some((_, down)), Some(ls)) => Some(down.step(&mut ls.1, x, a, None, last)),
            _ => None,
        };
        self.last
            .step(&mut st.last, down.as_ref().unwrap_or(x), a, None, last)
    }

    /// [`Self::frame_rate`] of several rows (`sts[r]`, `xs[r]`) at once: their products
    /// share the matrix-vector kernel's calls ([`Conv1d::step_rows`]), and row `r` gets the
    /// bits `frame_rate` gives it alone.
    pub fn frame_rate_rows(
        &self,
        sts: &mut [&mut EncoderState],
        xs: &[Frames],
        last: bool,
    ) -> RowList<Frames> {
        let a = Some(self.alpha);
        for st in sts.iter_mut() {
            st.layers.resize_with(self.layers.len(), Default::default);
        }
        let down = self.layers.last().map(|(_, down)| {
            let mut cs: RowList<&mut ConvState> = (sts.iter_mut())
                .filter_map(|st| st.layers.last_mut().map(|l| &mut l.1))
                .collect();
            let i = self.layers.len() - 1;
            time(
                || format!("enc.s{i}.down"),
                || down.step_rows(&mut cs, xs, a, last),
            )
        });
        let mut cs: RowList<&mut ConvState> = sts.iter_mut().map(|st| &mut st.last).collect();
        time(
            || "enc.last".into(),
            || {
                self.last
                    .step_rows(&mut cs, down.as_deref().unwrap_or(xs), a, last)
            },
        )
    }
}

/// The SEANet decoder (`SeaNetDecoder`): (dimension, frames) -> audio (channels, samples).
#[derive(Clone, Debug)]
pub struct Decoder {
    init: Conv1d,
    layers: Vec<(ConvTr1d, Vec<ResBlock>)>,
    last: Conv1d,
    alpha: f32,
}

/// The streaming state of a [`Decoder`] (one batch item).
#[derive(Clone, Debug, Default)]
pub struct DecoderState {
    init: ConvState,
    layers: Vec<(ConvState, Vec<ResState>)>,
    last: ConvState,
}

impl Decoder {
    /// Bytes of its weights, as stored.
    pub fn weights_nbytes(&self) -> usize {
        let stages: usize = (self.layers.iter())
            .map(|(up, blocks)| up.weights_nbytes() + blocks_nbytes(blocks))
            .sum();
        self.init.weights_nbytes() + stages + self.last.weights_nbytes()
    }
}

impl Decoder {
    /// Stores the frame-rate layers' large weights in bf16: the first convolution and the
    /// first up-sampling (see [`Encoder::store_bf16`]).
    pub fn store_bf16(&mut self) {
        self.init.store_bf16();
        if let Some((up, _)) = self.layers.first_mut() {
            up.store_bf16();
        }
    }

    /// `precision="medium"`: the groups of `layers` in bf16 pairs. The last stage's residual
    /// blocks and the last convolution (next to the waveform) stay f32; `frame_rate` is the
    /// first convolution and the first up-sampling, `decoder_convs` the other up-samplings
    /// and residual blocks.
    pub fn pair_pack(&mut self, layers: MediumLayers) {
        let n = self.layers.len();
        for (i, (up, blocks)) in self.layers.iter_mut().enumerate() {
            if (i == 0 && layers.frame_rate) || (i > 0 && layers.decoder_convs) {
                up.pair_pack();
            }
            if i + 1 < n && layers.decoder_convs {
                blocks.iter_mut().for_each(ResBlock::pair_pack);
            }
        }
        if layers.frame_rate {
            self.init.pair_pack();
        }
    }

    /// Packs the frame-rate layers' large weights (those [`Self::store_bf16`] takes) for
    /// the packed product.
    pub fn pack(&mut self) {
        self.init.pack();
        if let Some((up, _)) = self.layers.first_mut() {
            up.pack();
        }
    }

    pub fn load(cfg: &SeanetConfig, vb: VarBuilder) -> Result<Self> {
        let built = topology::build_decoder(cfg, &NativeLayers, vb)?;
        Ok(Self {
            init: built.init,
            layers: built.stages,
            last: built.last,
            alpha: cfg.activation.0 as f32,
        })
    }

    /// Samples per input frame.
    pub fn hop(&self) -> usize {
        self.layers.iter().map(|(up, _)| up.stride()).product()
    }

    /// How many input frames before a boundary a fresh stream must start for its audio
    /// from that boundary on to be the offline audio: the receptive field to the left (no
    /// recurrence, so finite). Mimi: 8 frames.
    pub fn warmup(&self) -> usize {
        let hop = self.hop() as i64;
        let f = 1 << 20;
        let mut first = self.last.first_input(f * hop);
        for (up, res) in self.layers.iter().rev() {
            first = res.iter().rev().fold(first, |o, r| r.first_input(o));
            first = up.first_input(first);
        }
        (f - self.init.first_input(first)).max(0) as usize
    }

    /// Streaming: the audio these frames complete. The decoder pads nothing on the right,
    /// so any chunking gives the offline output. The same as [`Self::high_rate`] of
    /// [`Self::frame_rate`].
    pub fn apply(&self, st: &mut DecoderState, x: &Frames, cancel: Cancel) -> Result<Frames> {
        let h = self.frame_rate(st, x);
        self.high_rate(st, &h, cancel)
    }

    /// The first convolution and the first up-sampling: few frames and large weights (Mimi:
    /// 48 MB, which `gemm` packs on every call), so an offline call runs them once per
    /// segment rather than per chunk. Output: [`Self::frame_rate_stride`] frames per input frame.
    pub fn frame_rate(&self, st: &mut DecoderState, x: &Frames) -> Frames {
        st.layers.resize_with(self.layers.len(), Default::default);
        let x = self.init.step(&mut st.init, x, None, None, false);
        match (self.layers.first(), st.layers.first_mut()) {
            (Some((up, _)), Some(ls)) => up.step(&mut ls.0, &x, Some(self.alpha)),
            _ => x,
        }
    }

    /// [`Self::frame_rate`] of several rows at once, as [`Encoder::frame_rate_rows`].
    pub fn frame_rate_rows(&self, sts: &mut [&mut DecoderState], xs: &[Frames]) -> RowList<Frames> {
        for st in sts.iter_mut() {
            st.layers.resize_with(self.layers.len(), Default::default);
        }
        let mut cs: RowList<&mut ConvState> = sts.iter_mut().map(|st| &mut st.init).collect();
        let x = time(
            || "dec.init".into(),
            || self.init.step_rows(&mut cs, xs, None, false),
        );
        drop(cs); // (a `RowList` holds its borrows to its end)
        match self.layers.first() {
            Some((up, _)) => {
                let mut cs: RowList<&mut ConvState> = (sts.iter_mut())
                    .filter_map(|st| st.layers.first_mut().map(|l| &mut l.0))
                    .collect();
                time(
                    || "dec.s0.up".into(),
                    || up.step_rows(&mut cs, &x, Some(self.alpha)),
                )
            }
            None => x,
        }
    }

    /// Output frames of [`Self::frame_rate`] per input frame.
    pub fn frame_rate_stride(&self) -> usize {
        self.layers.first().map_or(1, |(up, _)| up.stride())
    }

    /// The layers after [`Self::frame_rate`], at the higher rates: audio.
    pub fn high_rate(&self, st: &mut DecoderState, x: &Frames, cancel: Cancel) -> Result<Frames> {
        let mut out = self.high_rate_rows(&mut [st], std::slice::from_ref(x), cancel)?;
        Ok(out.pop().unwrap_or_else(|| Frames::empty(self.last.cout)))
    }

    /// [`Self::high_rate`] of several rows, as [`Encoder::high_rate_rows`].
    pub fn high_rate_rows(
        &self,
        sts: &mut [&mut DecoderState],
        xs: &[Frames],
        cancel: Cancel,
    ) -> Result<RowList<Frames>> {
        let a = Some(self.alpha);
        for st in sts.iter_mut() {
            st.layers.resize_with(self.layers.len(), Default::default);
            for ((_, res), ls) in self.layers.iter().zip(st.layers.iter_mut()) {
                ls.1.resize_with(res.len(), Default::default);
            }
        }
        let mut y: Option<RowList<Frames>> = None; // the latest layer's output (`xs` before any)
        for (i, (up, res)) in self.layers.iter().enumerate() {
            crate::error::check_cancel(cancel)?;
            if i > 0 {
                let mut cs: RowList<&mut ConvState> =
                    sts.iter_mut().map(|st| &mut st.layers[i].0).collect();
                y = Some(time(
                    || format!("dec.s{i}.up"),
                    || up.step_rows(&mut cs, y.as_deref().unwrap_or(xs), a),
                ));
            }
            for (j, r) in res.iter().enumerate() {
                let mut rs: RowList<&mut ResState> =
                    sts.iter_mut().map(|st| &mut st.layers[i].1[j]).collect();
                y = Some(time(
                    || format!("dec.s{i}.res{j}"),
                    || r.apply_rows(&mut rs, y.as_deref().unwrap_or(xs), self.alpha, false),
                ));
            }
        }
        let mut cs: RowList<&mut ConvState> = sts.iter_mut().map(|st| &mut st.last).collect();
        Ok(time(
            || "dec.last".into(),
            || {
                self.last
                    .step_rows(&mut cs, y.as_deref().unwrap_or(xs), a, false)
            },
        ))
    }
}
