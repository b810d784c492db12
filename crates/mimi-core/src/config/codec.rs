//! The codec config's rules, its derived sizes and the small test config.

use super::*;

impl CodecConfig {
    /// The codebooks the real Mimi model (kyutai/mimi) holds.
    pub const MIMI_CODEBOOKS: usize = 32;

    /// The real Mimi codec with `n_q` codebooks.
    pub fn mimi(n_q: usize) -> Self {
        Self {
            quantizer_n_q: n_q,
            ..Self::default()
        }
    }

    /// The real Mimi codec with `n_q` of its [`Self::MIMI_CODEBOOKS`] codebooks (the
    /// config's default number when `None`), refusing a number outside that range.
    pub fn mimi_checked(n_q: Option<usize>) -> Result<Self> {
        let n = n_q.unwrap_or(Self::default().quantizer_n_q);
        if n == 0 || n > Self::MIMI_CODEBOOKS {
            return Err(Error::config(
                "num_codebooks",
                format!(
                    "the real Mimi model has 1 to {} codebooks, got {n}",
                    Self::MIMI_CODEBOOKS
                ),
            ));
        }
        Ok(Self::mimi(n))
    }

    /// Refuses a requested number of codebooks below 1 (above what a checkpoint holds is
    /// refused when it is read).
    pub fn check_codebooks(n: Option<usize>) -> Result<Option<usize>> {
        if n == Some(0) {
            return Err(Error::config("num_codebooks", "must be at least 1"));
        }
        Ok(n)
    }

    /// Checks the fields together.
    pub fn validate(&self) -> Result<()> {
        self.seanet.validate().map_err(|e| e.nested("seanet"))?;
        require_nonzero(&[
            ("channels", self.channels),
            ("quantizer_n_q", self.quantizer_n_q),
            ("quantizer_bins", self.quantizer_bins),
            ("quantizer_dim", self.quantizer_dim),
        ])?;
        positive("sample_rate", self.sample_rate)?;
        positive("frame_rate", self.frame_rate)?;
        if self.channels != self.seanet.channels {
            return Err(Error::config(
                "channels",
                format!(
                    "channels={} must equal seanet.channels={}",
                    self.channels, self.seanet.channels
                ),
            ));
        }
        if self.transformer.d_model != self.seanet.dimension {
            return Err(Error::config(
                "transformer.d_model",
                format!(
                    "must equal seanet.dimension={} (got {})",
                    self.seanet.dimension, self.transformer.d_model
                ),
            ));
        }
        if self.quantizer_bins > u32::MAX as usize {
            return Err(Error::config("quantizer_bins", "must fit in uint32"));
        }
        self.validate_stride()
    }

    fn validate_stride(&self) -> Result<()> {
        let stride = self.downsample_stride_f();
        if (stride - stride.round()).abs() > 1e-9 || stride.round() < 1.0 {
            return Err(Error::config(
                "frame_rate",
                format!(
                    "sample_rate / prod(seanet.ratios) / frame_rate = {} / {} / {} must be a \
                     positive integer",
                    self.sample_rate,
                    self.seanet.hop_length(),
                    self.frame_rate
                ),
            ));
        }
        Ok(())
    }

    fn downsample_stride_f(&self) -> f64 {
        self.sample_rate / self.seanet.hop_length() as f64 / self.frame_rate
    }

    /// Stride of the latent downsampling (2 for the real model).
    pub fn downsample_stride(&self) -> usize {
        self.downsample_stride_f().round() as usize
    }

    /// Samples per code frame (1920 for the real model).
    pub fn frame_size(&self) -> usize {
        self.seanet.hop_length() * self.downsample_stride()
    }

    /// The real Mimi's shape with every width cut down (8 filters, 64 channels, a 2-layer
    /// transformer, 64 bins of 32 dimensions, 4 codebooks): the one small codec of the tests,
    /// the examples and the benchmarks' smoke runs. Same frame rate and frame size as the
    /// real model.
    pub fn tiny() -> Self {
        let mut c = Self::mimi(4);
        c.seanet.n_filters = 8;
        c.seanet.dimension = 64;
        c.transformer.d_model = 64;
        c.transformer.num_heads = 4;
        c.transformer.num_layers = 2;
        c.transformer.dim_feedforward = 128;
        c.quantizer_bins = 64;
        c.quantizer_dim = 32;
        c
    }
}
