//! The codec's streaming calls on host arrays, with an optional row mask: the codec selects
//! the stepping rows, steps them, and scatters the result back into a whole batch (inactive
//! rows' output is zeros), so a caller without candle gets the same per-row semantics.

use super::{host_f32, host_u32, Codec, DecodeStream, EncodeStream, Rows};
use crate::error::Result;
use crate::host::HostArray;
use candle::Tensor;

impl Codec {
    /// One encoder step of `pcm` (B, C, n) for the rows `rows` (all if `None`): the codes
    /// (B, n_q, frames) of the frames it completes, `None` if none.
    pub fn encode_step_host(
        &self,
        s: &mut EncodeStream,
        pcm: HostArray<f32>,
        rows: Option<Rows>,
    ) -> Result<Option<HostArray<u32>>> {
        let (b, c, n) = (pcm.shape[0], pcm.shape[1], pcm.shape[2]);
        let rows = Rows::or_all(rows, b)?;
        if !rows.is_masked() && n == 0 {
            s.check_batch(b, "encoder")?;
            return Ok(None);
        }
        let x = rows.select(&pcm.data, c * n);
        let x = Tensor::from_vec(x, (rows.count(), c, n), self.device())?.to_dtype(self.dtype())?;
        let out = self.encode_step_rows(s, &x, &rows)?;
        if !rows.is_masked() {
            return out.map(|c| host_u32(&c)).transpose();
        }
        let k = self.config().quantizer_n_q;
        let frames = n / self.config().frame_size();
        if frames == 0 {
            return Ok(None);
        }
        let codes = match out {
            Some(codes) => host_u32(&codes)?.data,
            None => vec![0; rows.count() * k * frames],
        };
        Ok(Some(HostArray::new(
            rows.scatter(codes, k * frames),
            vec![b, k, frames],
        )))
    }

    /// The stream's last chunk on a host array (see [`Self::encode_last`]).
    pub fn encode_last_host(
        &self,
        s: &mut EncodeStream,
        pcm: HostArray<f32>,
    ) -> Result<Option<HostArray<u32>>> {
        let x = Tensor::from_vec(pcm.data, pcm.shape.as_slice(), self.device())?;
        self.encode_last(s, &x.to_dtype(self.dtype())?)?
            .map(|c| host_u32(&c))
            .transpose()
    }

    /// One decoder step of `codes` (B, n_q, T) for the rows `rows` (all if `None`): the audio
    /// (B, C, T * frame_size) they complete, `None` if none.
    pub fn decode_step_host(
        &self,
        s: &mut DecodeStream,
        codes: HostArray<u32>,
        rows: Option<Rows>,
    ) -> Result<Option<HostArray<f32>>> {
        let (b, k, t) = (codes.shape[0], codes.shape[1], codes.shape[2]);
        let rows = Rows::or_all(rows, b)?;
        s.check_batch(b, "decoder")?;
        if t == 0 {
            return Ok(None); // no frames: the stream is not bound to this batch size
        }
        let x = Tensor::from_vec(
            rows.select(&codes.data, k * t),
            (rows.count(), k, t),
            self.device(),
        )?;
        let out = self.decode_step_rows(s, &x, &rows)?;
        if !rows.is_masked() {
            return out.map(|a| host_f32(&a)).transpose();
        }
        let (ch, len) = (self.config().channels, t * self.config().frame_size());
        let audio = match out {
            Some(a) => host_f32(&a)?.data,
            None => vec![0.0; rows.count() * ch * len],
        };
        Ok(Some(HostArray::new(
            rows.scatter(audio, ch * len),
            vec![b, ch, len],
        )))
    }
}
