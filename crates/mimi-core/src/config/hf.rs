//! A Hugging Face `MimiConfig` (`config.json` of kyutai/mimi) read into a codec config.

use super::*;

/// The fields of a Hugging Face `MimiConfig` (`config.json` of kyutai/mimi), as
/// `(json key, our field path)`.
const HF_FIELDS: &[(&str, &str)] = &[
    ("audio_channels", "channels"),
    ("audio_channels", "seanet.channels"),
    ("sampling_rate", "sample_rate"),
    ("hidden_size", "seanet.dimension"),
    ("hidden_size", "transformer.d_model"),
    ("num_filters", "seanet.n_filters"),
    ("num_residual_layers", "seanet.n_residual_layers"),
    ("kernel_size", "seanet.kernel_size"),
    ("residual_kernel_size", "seanet.residual_kernel_size"),
    ("last_kernel_size", "seanet.last_kernel_size"),
    ("dilation_growth_rate", "seanet.dilation_base"),
    ("compress", "seanet.compress"),
    ("pad_mode", "seanet.pad_mode"),
    ("upsampling_ratios", "seanet.ratios"),
    ("num_attention_heads", "transformer.num_heads"),
    ("num_hidden_layers", "transformer.num_layers"),
    ("intermediate_size", "transformer.dim_feedforward"),
    ("sliding_window", "transformer.context"),
    ("max_position_embeddings", "transformer.max_seq_len"),
    ("layer_scale_initial_scale", "transformer.layer_scale"),
    ("codebook_size", "quantizer_bins"),
    ("vector_quantization_hidden_dimension", "quantizer_dim"),
    ("num_quantizers", "quantizer_n_q"),
    ("frame_rate", "frame_rate"),
    ("_frame_rate", "frame_rate"),
];

impl CodecConfig {
    /// A config from a Hugging Face `MimiConfig` (`config.json` of kyutai/mimi), with
    /// `n_q` codebooks if given (else the file's `num_quantizers`).
    pub fn from_hf(json: &Value, n_q: Option<usize>) -> Result<Self> {
        let present = |k: &str| json.get(k).filter(|v| **v != Value::None);
        let mut c = Self::default();
        for (key, path) in HF_FIELDS {
            if let Some(v) = present(key) {
                c.set_path(path, v)
                    .map_err(|e| rename_field(e, &format!("config.json:{key}")))?;
            }
        }
        if let Some(v) = present("use_causal_conv") {
            if !bool::parse("config.json:use_causal_conv", v)? {
                return Err(Error::config(
                    "config.json:use_causal_conv",
                    "a non-causal SEANet is not supported",
                ));
            }
        }
        let theta = json
            .get("rope_parameters")
            .and_then(|p| p.get("rope_theta"))
            .or_else(|| present("rope_theta"));
        if let Some(t) = theta {
            let t = f64::parse("config.json:rope_theta", t)?;
            c.transformer.max_period = positive("config.json:rope_theta", t)? as usize;
        }
        if let Some(n) = n_q {
            c.quantizer_n_q = n;
        }
        c.transformer
            .validate()
            .map_err(|e| e.nested("transformer"))?;
        c.validate()?;
        Ok(c)
    }

    /// Sets a field by its dotted path (`seanet.ratios`).
    fn set_path(&mut self, path: &str, v: &Value) -> Result<()> {
        match path.split_once('.') {
            Some(("seanet", f)) => self.seanet.set(f, v),
            Some(("transformer", f)) => self.transformer.set(f, v),
            _ => self.set(path, v),
        }
    }
}

fn rename_field(e: Error, field: &str) -> Error {
    match e {
        Error::Config { msg, .. } => Error::config(field, msg),
        e => e,
    }
}
