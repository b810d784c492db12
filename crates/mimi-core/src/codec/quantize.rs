//! The quantizer over a stage's activations, in each engine's form: the native engine's rows'
//! frames as tokens on the quantizer's slice path (any number of tokens, in chunks of
//! [`crate::kernels::GEMV_MAX_ROWS`]), the candle engine's tensor on its tensor path. Offline
//! and streaming calls both use it.

use super::activations::{Activations, Codes};
use super::bridge::{from_tokens, tokens};
use super::engine::EngineKind;
use super::model::Codec;
use crate::conv::Frames;
use crate::error::Result;
use crate::host::HostArray;
use crate::runtime::device::cast;
use candle::DType;

impl Codec {
    /// The codes of latents: the native engine's frames on the quantizer's slice path, the
    /// candle engine's tensor on its tensor path.
    pub(crate) fn quantize(&self, x: Activations) -> Result<Codes> {
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
        // The codes by token `(b * t, n_q)`, then as the output `(b, n_q, t)`: the same
        // layout when each row has one frame.
        let n_q = self.quantizer.n_q();
        let mut codes = vec![0u32; b * t * n_q];
        if t == 1 {
            self.quantizer
                .encode_token_chunks(&tokens(&xs).data, b, &mut codes)?;
        } else {
            let mut by_token = vec![0u32; b * t * n_q];
            self.quantizer
                .encode_token_chunks(&tokens(&xs).data, b * t, &mut by_token)?;
            for (i, c) in by_token.chunks_exact(n_q).enumerate() {
                let (row, frame) = (i / t, i % t);
                for (j, &code) in c.iter().enumerate() {
                    codes[(row * n_q + j) * t + frame] = code;
                }
            }
        }
        Ok(Codes::Host(HostArray::new(codes, vec![b, n_q, t])))
    }

    /// The latents of codes in the engine's form: the native engine's rows' frames from the
    /// quantizer's slice path (the native engine computes on the CPU), the candle engine's
    /// tensor in the codec's dtype.
    pub(crate) fn dequantize(&self, codes: Codes) -> Result<Activations> {
        let p = &self.parts;
        if self.engine.kind() == EngineKind::Candle {
            let x = self.quantizer.decode(&codes.into_tensor(&p.device)?)?;
            return Ok(Activations::Tensor(cast(&x, p.dtype)?));
        }
        let c = codes.into_host()?;
        let (b, k, t) = (c.shape[0], c.shape[1], c.shape[2]);
        let dim = p.cfg.seanet.dimension;
        let mut x = Frames::uninit(b * t, dim);
        self.quantizer
            .decode_tokens(&c.data, (b, k, t), &mut x.data)?;
        Ok(Activations::Frames(from_tokens(&x.data, b, dim)))
    }
}
