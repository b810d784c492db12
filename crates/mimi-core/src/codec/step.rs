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
use super::model::Codec;
use super::stream::{DecodeStream, EncodeStream, Stream};
use super::transform::transform_step;
use crate::error::{Error, Result};
use crate::rows::Rows;
use crate::runtime::profile::time;

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
        let x = match s.convs.seanet(rows, pcm, last)? {
            Some(x) => time(
                || "enc.transformer".into(),
                || transform_step(&p.enc_tr, (&mut s.tr, &mut s.ws), x, (rows, None)),
            )?,
            // Nothing new for the transformer, but the last chunk still flushes the
            // downsampling's padding.
            None if last => {
                let shape = (rows.count(), p.cfg.seanet.dimension);
                self.engine.no_activations(shape, (&p.device, p.dtype))?
            }
            None => return Ok(None),
        };
        time(|| "downsample".into(), || s.convs.downsample(rows, x, last))
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
                || transform_step(&p.dec_tr, (&mut s.tr, &mut s.ws), x, (rows, None)),
            )?;
            s.convs.seanet(rows, x)
        })?;
        s.advance(&rows.indices(), t);
        Ok(out)
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
