//! Reading a codec checkpoint: the two real layouts (Hugging Face kyutai/mimi and Kyutai's
//! moshi file), their conversion to candle's names with q/k interleaved, the number of
//! codebooks a file holds, and checkpoint directories (`model.safetensors` + `config.json`).

use crate::config::{CodecConfig, Value};
use crate::error::{Error, Result};
use crate::weights::{self, TensorSource};
use candle::Tensor;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

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
pub(crate) fn moshi_name(name: &str) -> String {
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

/// A codec checkpoint's tensors (either real layout) as a source for the codec's builder:
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

/// A checkpoint as found on disk or in memory, ready for the codec's builder.
pub struct Checkpoint {
    /// The tensors, in candle's names with q/k interleaved.
    pub source: TensorSource,
    /// The layout the file was in.
    pub layout: CheckpointLayout,
}

impl Checkpoint {
    /// Reads a checkpoint's tensors (a file: see [`weights::read_all`]) for `cfg`.
    pub fn read(path: &Path, cfg: &CodecConfig) -> Result<Self> {
        let raw = weights::read_all(path)?;
        Self::from_tensors(raw, format!("checkpoint {}", path.display()), cfg)
    }

    /// A checkpoint's tensors handed over in memory; `origin` names them in messages.
    pub fn from_tensors(
        raw: HashMap<String, Tensor>,
        origin: String,
        cfg: &CodecConfig,
    ) -> Result<Self> {
        let (source, layout) = checkpoint_source(raw, origin, cfg)?;
        Ok(Self { source, layout })
    }
}

/// A checkpoint directory, as on the Hugging Face hub: `model.safetensors`, and the codec's
/// config from `config.json` when the directory has one.
pub struct CheckpointDir {
    /// The weights file.
    pub weights: PathBuf,
    /// The config the directory describes, with `num_codebooks` applied (`None` without a
    /// `config.json`).
    pub config: Option<CodecConfig>,
}

impl CheckpointDir {
    /// Reads `dir`; `num_codebooks` overrides the config's number of codebooks.
    pub fn open(dir: &Path, num_codebooks: Option<usize>) -> Result<Self> {
        let weights = dir.join("model.safetensors");
        if !weights.is_file() {
            return Err(Error::Weights(format!(
                "directory {} has no model.safetensors",
                dir.display()
            )));
        }
        let json = dir.join("config.json");
        let config = if json.is_file() {
            Some(read_hf_config(&json, num_codebooks)?)
        } else {
            None
        };
        Ok(Self { weights, config })
    }
}

/// Parses a Hugging Face `config.json` (transformers' `MimiConfig`) into a codec config.
pub fn read_hf_config(json: &Path, num_codebooks: Option<usize>) -> Result<CodecConfig> {
    let text = std::fs::read_to_string(json).map_err(|e| Error::WeightsIo {
        msg: format!("cannot read {}", json.display()),
        source: e,
    })?;
    parse_hf_config(&text, &json.display().to_string(), num_codebooks)
}

/// [`read_hf_config`] on a file's text; `origin` names it in messages.
pub fn parse_hf_config(
    text: &str,
    origin: &str,
    num_codebooks: Option<usize>,
) -> Result<CodecConfig> {
    let parsed: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| Error::Weights(format!("{origin} is not valid JSON: {e}")))?;
    if !parsed.is_object() {
        return Err(Error::Weights(format!("{origin} is not a JSON object")));
    }
    CodecConfig::from_hf(&json_value(&parsed), num_codebooks)
}

/// A JSON value as a config [`Value`] (how a `config.json` reaches the config readers).
pub fn json_value(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match v {
        J::Null => Value::None,
        J::Bool(b) => Value::Bool(*b),
        J::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Value::Int(i.into()),
            (None, Some(u)) => Value::Int(u.into()),
            _ => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        J::String(s) => Value::Str(s.clone()),
        J::Array(a) => Value::List(a.iter().map(json_value).collect()),
        J::Object(o) => Value::Dict(o.iter().map(|(k, v)| (k.clone(), json_value(v))).collect()),
    }
}
