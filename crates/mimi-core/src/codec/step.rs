//! The streaming steps: one order of stages for both engines. Encoding: the SEANet
//! encoder, the transformer, the downsampling, the quantizer; decoding: the quantizer, the
//! upsampling, the transformer, the SEANet decoder. The stages pass the engine's own
//! [`Activations`]: the native engine's rows' frames go through the transformer's and the
//! quantizer's host entry points ([`Transformer::step_host`],
//! [`crate::quantizer::Quantizer::encode_tokens`], `decode_tokens`), so a native step
//! converts its data only at its two ends (none at all from [`super::host_calls`]) when it
//! quantizes up to [`crate::kernels::GEMV_MAX_ROWS`] tokens with a transformer that takes
//! the host step. More tokens (to keep the tensor path's codes) or a gated transformer go
//! through one tensor round trip at that stage.

use super::activations::{Activations, Codes};
use super::bridge::{from_tokens, tokens};
use super::engine::EngineKind;
use super::model::Codec;
use super::stream::{DecodeStream, EncodeStream, Stream};
use super::transform::transform_step;
use crate::conv::Frames;
use crate::error::{Error, Result};
use crate::host::HostArray;
use crate::quantizer::Quantizer;
use crate::rows::Rows;
use crate::runtime::device::cast;
use crate::runtime::profile::time;
use candle::DType;

impl Codec {
    /// Refuses a last chunk of `b` rows the stream cannot take: another batch size, or rows
    /// that hold different partial frames.
    pub(crate) fn check_encode_last(&self, s: &EncodeStream, b: usize) -> Result<()> {
        s.check_batch(b, "encoder")?;
        if s.uneven(self.parts.cfg.frame_size()) {
            return Err(Error::Shape(
                "last=True ends every row at once, but the rows hold different partial frames \
                 (after a per-row reset)"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Refuses a step the stream cannot take, before anything changes: another batch size,
    /// or a chunk of `n` samples that would make
    /// rows emit different numbers of frames (masked steps take whole frames, and so does
    /// any step once rows hold different partial frames after a per-row reset).
    pub(crate) fn check_encode_rows(&self, s: &EncodeStream, n: usize, rows: &Rows) -> Result<()> {
        s.check_batch(rows.batch(), "encoder")?;
        let f = self.parts.cfg.frame_size();
        if !n.is_multiple_of(f) && (rows.is_masked() || s.uneven(f)) {
            return Err(Error::Shape(format!(
                "chunks must be a whole number of frames (multiples of frame_size={f} samples) \
                 {}, got {n} samples",
                if rows.is_masked() {
                    "when active= is given"
                } else {
                    "while rows hold different partial frames (after a per-row reset)"
                }
            )));
        }
        Ok(())
    }

    /// A checked encoder step of `n` samples for `rows` (`pcm`: those rows, in the engine's
    /// form; with `last`, every row, ending here): the stages in the pool, then the rows'
    /// counters.
    pub(crate) fn step_encode(
        &self,
        s: &mut EncodeStream,
        pcm: Activations,
        (n, rows): (usize, &Rows),
        last: bool,
    ) -> Result<Option<Codes>> {
        s.start(rows.batch());
        if rows.count() == 0 {
            return Ok(None);
        }
        let out = crate::kernels::in_pool_on(&self.parts.device, || -> Result<Option<Codes>> {
            match self.latents_step(s, pcm, rows, last)? {
                Some(x) => time(|| "quantizer.encode".into(), || self.quantize(x).map(Some)),
                None => Ok(None),
            }
        })?;
        s.advance(&rows.indices(), n);
        Ok(out)
    }

    /// The latents (before quantization) of the frames this chunk completes: the SEANet,
    /// the transformer, the downsampling. With `last`, the audio ends here and the last
    /// partial frame is padded as offline.
    fn latents_step(
        &self,
        s: &mut EncodeStream,
        pcm: Activations,
        rows: &Rows,
        last: bool,
    ) -> Result<Option<Activations>> {
        let p = &self.parts;
        let dtype = match &pcm {
            Activations::Tensor(t) => t.dtype(),
            Activations::Frames(_) => DType::F32,
        };
        let x = match s.convs.seanet(rows, pcm, last)? {
            Some(x) => time(
                || "enc.transformer".into(),
                || transform_step(&p.enc_tr, &mut s.tr, x, (rows, None)),
            )?,
            // Nothing new for the transformer, but the last chunk still flushes the
            // downsampling's padding.
            None if last => {
                let shape = (rows.count(), p.cfg.seanet.dimension);
                self.engine.no_activations(shape, (&p.device, dtype))?
            }
            None => return Ok(None),
        };
        time(|| "downsample".into(), || s.convs.downsample(rows, x, last))
    }

    /// The codes of latents: the native engine's frames on the quantizer's slice path
    /// (up to [`crate::kernels::GEMV_MAX_ROWS`] frames in all, on the CPU), the rest on its
    /// tensor path (the bits of an offline call).
    fn quantize(&self, x: Activations) -> Result<Codes> {
        let xs = match x {
            Activations::Frames(xs) if self.parts.device.is_cpu() => xs,
            x => {
                let x = x.into_tensor(&self.parts.device)?;
                return Ok(Codes::Tensor(
                    self.quantizer.encode(&cast(&x, DType::F32)?)?,
                ));
            }
        };
        let (b, t) = (xs.len(), xs.first().map_or(0, |f| f.len));
        if !Quantizer::takes_tokens(b * t) {
            let x = Activations::Frames(xs).into_tensor(&self.parts.device)?;
            return Ok(Codes::Tensor(self.quantizer.encode(&x)?));
        }
        // The codes by token `(b * t, n_q)`, then as the output `(b, n_q, t)`: the same
        // layout when each row has one frame.
        let n_q = self.quantizer.n_q();
        let mut codes = vec![0u32; b * t * n_q];
        if t == 1 {
            self.quantizer
                .encode_tokens(&tokens(&xs).data, b, &mut codes)?;
        } else {
            let mut by_token = vec![0u32; b * t * n_q];
            self.quantizer
                .encode_tokens(&tokens(&xs).data, b * t, &mut by_token)?;
            for (i, c) in by_token.chunks_exact(n_q).enumerate() {
                let (row, frame) = (i / t, i % t);
                for (j, &code) in c.iter().enumerate() {
                    codes[(row * n_q + j) * t + frame] = code;
                }
            }
        }
        Ok(Codes::Host(HostArray::new(codes, vec![b, n_q, t])))
    }

    /// [`Self::decode_step_rows`] on codes `(rows, n_q, T)` in either form: the stages in
    /// the pool, then the rows' counters.
    pub(crate) fn step_decode(
        &self,
        s: &mut DecodeStream,
        codes: Codes,
        rows: &Rows,
    ) -> Result<Option<Activations>> {
        s.check_batch(rows.batch(), "decoder")?;
        let t = codes.frames()?;
        s.start(rows.batch());
        if rows.count() == 0 {
            return Ok(None);
        }
        let p = &self.parts;
        let out = crate::kernels::in_pool_on(&p.device, || -> Result<Option<Activations>> {
            let x = time(|| "quantizer.decode".into(), || self.dequantize(codes))?;
            let Some(x) = time(|| "upsample".into(), || s.convs.upsample(rows, x))? else {
                return Ok(None);
            };
            let x = time(
                || "dec.transformer".into(),
                || transform_step(&p.dec_tr, &mut s.tr, x, (rows, None)),
            )?;
            s.convs.seanet(rows, x)
        })?;
        s.advance(&rows.indices(), t);
        Ok(out)
    }

    /// The latents of codes in the engine's form: the native engine's rows' frames from the
    /// quantizer's slice path (on the CPU), the candle engine's tensor in the codec's dtype.
    fn dequantize(&self, codes: Codes) -> Result<Activations> {
        let p = &self.parts;
        if self.engine.kind() == EngineKind::Native && p.device.is_cpu() {
            let c = codes.into_host()?;
            let (b, k, t) = (c.shape[0], c.shape[1], c.shape[2]);
            let dim = p.cfg.seanet.dimension;
            let mut x = Frames::uninit(b * t, dim);
            self.quantizer
                .decode_tokens(&c.data, (b, k, t), &mut x.data)?;
            return Ok(Activations::Frames(from_tokens(&x.data, b, dim)));
        }
        let x = self.decode_latents(&codes.into_tensor(&p.device)?)?;
        let x = Activations::Tensor(cast(&x, p.dtype)?);
        match self.engine.kind() {
            EngineKind::Native => Ok(Activations::Frames(x.into_frames()?)),
            EngineKind::Candle => Ok(x),
        }
    }

    /// A fresh encoder stream.
    pub fn encode_stream(&self) -> EncodeStream {
        Stream::new(self.engine.clone().encode_convs())
    }

    /// A fresh decoder stream.
    pub fn decode_stream(&self) -> DecodeStream {
        Stream::new(self.engine.clone().decode_convs())
    }
}
