//! Weights: the names and shapes a transformer reads, loading them from a safetensors file,
//! a mapping of arrays or a seed, and the q/k rotary-layout conversion.
//!
//! Every expected tensor is checked (present, real floating dtype, right shape) before candle
//! sees it, and all problems are reported at once in one `WeightsError`.

use crate::config::TransformerConfig;
use crate::convert::HostArray;
use crate::errors::{Error, Result};
use candle::{DType, Device, Tensor};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// How q_proj/k_proj rows are ordered inside each head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkLayout {
    /// Rotary pair `j` is features `(2j, 2j+1)`: Kyutai's original checkpoints, candle's
    /// `rope_i`. This is the layout mimi_py computes with.
    Interleaved,
    /// Rotary pair `j` is features `(j, j + head_dim/2)`: Hugging Face checkpoints
    /// (kyutai/mimi `model.safetensors`), for `rotate_half`.
    Hf,
}

impl QkLayout {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "interleaved" => Ok(Self::Interleaved),
            "hf" => Ok(Self::Hf),
            _ => Err(Error::config(
                "qk_layout",
                format!("expected \"interleaved\" or \"hf\", got {s:?}"),
            )),
        }
    }
}

/// Where the weights come from.
pub enum WeightSource {
    File(PathBuf),
    Arrays(HashMap<String, HostArray>),
    /// Tensors already read (e.g. a whole codec checkpoint), under full names.
    Tensors(HashMap<String, Tensor>),
    Seed(u64),
}

/// Names (without prefix) and shapes of every tensor a transformer with `cfg` reads.
pub fn expected_tensors(cfg: &TransformerConfig) -> Vec<(String, Vec<usize>)> {
    let d = cfg.d_model;
    let kv = (cfg.num_heads / cfg.kv_repeat) * cfg.head_dim();
    let mut out = Vec::new();
    for i in 0..cfg.num_layers {
        let p = |s: &str| format!("layers.{i}.{s}");
        for (name, rows) in [("q_proj", d), ("k_proj", kv), ("v_proj", kv), ("o_proj", d)] {
            out.push((p(&format!("self_attn.{name}.weight")), vec![rows, d]));
            if cfg.bias_attn {
                out.push((p(&format!("self_attn.{name}.bias")), vec![rows]));
            }
        }
        if cfg.gating.is_some() {
            let h = cfg.gated_hidden();
            out.push((p("gating.linear_in.weight"), vec![2 * h, d]));
            out.push((p("gating.linear_out.weight"), vec![d, h]));
        } else {
            let ff = cfg.dim_feedforward;
            out.push((p("mlp.fc1.weight"), vec![ff, d]));
            out.push((p("mlp.fc2.weight"), vec![d, ff]));
            if cfg.bias_ff {
                out.push((p("mlp.fc1.bias"), vec![ff]));
                out.push((p("mlp.fc2.bias"), vec![d]));
            }
        }
        if cfg.norm == "rms_norm" {
            out.push((p("input_rmsnorm.alpha"), vec![1, 1, d]));
            out.push((p("post_attention_rmsnorm.alpha"), vec![1, 1, d]));
        } else {
            for n in ["input_layernorm", "post_attention_layernorm"] {
                out.push((p(&format!("{n}.weight")), vec![d]));
                out.push((p(&format!("{n}.bias")), vec![d]));
            }
        }
        if cfg.layer_scale.is_some() {
            out.push((p("self_attn_layer_scale.scale"), vec![d]));
            out.push((p("mlp_layer_scale.scale"), vec![d]));
        }
    }
    out
}

/// Deterministic generator (splitmix64), independent of platform and device.
struct SplitMix(u64);

impl SplitMix {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        let (u1, u2) = (self.uniform(), self.uniform());
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x1000_0000_01b3)
    })
}

/// Seeded weights with the initialisation of a fresh model: linear weights N(0, 1/fan_in),
/// biases 0, norm weights 1, layer scales `layer_scale`. Each tensor has its own stream
/// derived from (seed, name), so the result does not depend on visiting order.
fn random_tensor(cfg: &TransformerConfig, seed: u64, name: &str, shape: &[usize]) -> Vec<f32> {
    let n: usize = shape.iter().product();
    if name.ends_with("layer_scale.scale") {
        return vec![cfg.layer_scale.unwrap_or(1.0) as f32; n];
    }
    if name.ends_with(".alpha") || name.ends_with("layernorm.weight") {
        return vec![1.0; n];
    }
    if name.ends_with(".bias") {
        return vec![0.0; n];
    }
    let fan_in = *shape.last().unwrap_or(&1) as f64;
    let std = 1.0 / fan_in.sqrt();
    let mut rng = SplitMix(seed ^ fnv1a(name));
    (0..n).map(|_| (rng.normal() * std) as f32).collect()
}

/// Row permutation taking the half-split (HF) layout to the interleaved one, per head:
/// interleaved row `h*hd + 2j + c` is half-split row `h*hd + c*hd/2 + j`.
pub fn halves_to_interleaved_index(rows: usize, head_dim: usize) -> Vec<u32> {
    let half = head_dim / 2;
    (0..rows)
        .map(|r| {
            let (h, w) = (r / head_dim, r % head_dim);
            let (j, c) = (w / 2, w % 2);
            (h * head_dim + c * half + j) as u32
        })
        .collect()
}

fn permute_rows(t: &Tensor, head_dim: usize) -> Result<Tensor> {
    let rows = t.dim(0)?;
    let idx = halves_to_interleaved_index(rows, head_dim);
    let idx = Tensor::from_vec(idx, rows, t.device())?;
    Ok(t.index_select(&idx, 0)?)
}

fn is_float(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
}

fn describe_problems(problems: &[String], origin: &str) -> Error {
    let shown = problems
        .iter()
        .take(8)
        .cloned()
        .collect::<Vec<_>>()
        .join("; ");
    let more = if problems.len() > 8 {
        format!(" (and {} more)", problems.len() - 8)
    } else {
        String::new()
    };
    Error::Weights(format!("{origin}: {shown}{more}"))
}

/// Loads (or generates) every tensor a transformer with `cfg` reads, checks it, converts the
/// q/k layout if needed, and returns them under their names without prefix, in `dtype` on
/// `device`.
pub fn load(
    cfg: &TransformerConfig,
    source: WeightSource,
    prefix: &str,
    layout: QkLayout,
    device: &Device,
    dtype: DType,
) -> Result<BTreeMap<String, Tensor>> {
    let expected = expected_tensors(cfg);
    let mut raw: BTreeMap<String, Tensor> = BTreeMap::new();
    let mut problems = Vec::new();
    let origin;
    match source {
        WeightSource::Seed(seed) => {
            origin = format!("seeded weights (seed={seed})");
            for (name, shape) in &expected {
                let data = random_tensor(cfg, seed, name, shape);
                raw.insert(
                    name.clone(),
                    Tensor::from_vec(data, shape.as_slice(), &Device::Cpu)?,
                );
            }
        }
        WeightSource::Arrays(arrays) => {
            origin = "weights mapping".to_string();
            for (name, shape) in &expected {
                let full = format!("{prefix}{name}");
                match arrays.get(&full) {
                    None => problems.push(format!(
                        "missing tensor {full:?} (expected shape {shape:?})"
                    )),
                    Some(a) if a.shape != *shape => problems.push(format!(
                        "tensor {full:?} has shape {:?}, expected {shape:?}",
                        a.shape
                    )),
                    Some(a) => {
                        raw.insert(
                            name.clone(),
                            Tensor::from_slice(&a.data, shape.as_slice(), &Device::Cpu)?,
                        );
                    }
                }
            }
            let unexpected = unexpected_names(arrays.keys().map(String::as_str), prefix, &expected);
            problems.extend(unexpected);
        }
        WeightSource::Tensors(tensors) => {
            origin = "checkpoint".to_string();
            for (name, shape) in &expected {
                let full = format!("{prefix}{name}");
                match tensors.get(&full) {
                    None => problems.push(format!(
                        "missing tensor {full:?} (expected shape {shape:?})"
                    )),
                    Some(t) if !is_float(t.dtype()) => problems.push(format!(
                        "tensor {full:?} has dtype {:?}, expected a floating dtype",
                        t.dtype()
                    )),
                    Some(t) if t.dims() != shape.as_slice() => problems.push(format!(
                        "tensor {full:?} has shape {:?}, expected {shape:?}",
                        t.dims()
                    )),
                    Some(t) => {
                        raw.insert(name.clone(), t.clone());
                    }
                }
            }
            problems.extend(unexpected_names(
                tensors.keys().map(String::as_str),
                prefix,
                &expected,
            ));
        }
        WeightSource::File(path) => {
            origin = format!("checkpoint {}", path.display());
            let st = open_safetensors(&path)?;
            for (name, shape) in &expected {
                let full = format!("{prefix}{name}");
                match st.get(&full) {
                    Err(_) => problems.push(format!(
                        "missing tensor {full:?} (expected shape {shape:?})"
                    )),
                    Ok(view) => {
                        let found = view.shape().to_vec();
                        let dt = DType::try_from(view.dtype()).ok();
                        if !dt.is_some_and(is_float) {
                            problems.push(format!(
                                "tensor {full:?} has dtype {:?}, expected a floating dtype (F32, F16, BF16 or F64)",
                                view.dtype()
                            ));
                        } else if found != *shape {
                            problems.push(format!(
                                "tensor {full:?} has shape {found:?}, expected {shape:?}"
                            ));
                        } else {
                            let t = st.load(&full, &Device::Cpu).map_err(|e| {
                                Error::Weights(format!(
                                    "{origin}: could not read tensor {full:?}: {e}"
                                ))
                            })?;
                            raw.insert(name.clone(), t);
                        }
                    }
                }
            }
            let names: Vec<String> = st.tensors().into_iter().map(|(n, _)| n).collect();
            problems.extend(unexpected_names(
                names.iter().map(String::as_str),
                prefix,
                &expected,
            ));
        }
    }
    if !problems.is_empty() {
        return Err(describe_problems(&problems, &origin));
    }
    let head_dim = cfg.head_dim();
    let mut out = BTreeMap::new();
    for (name, t) in raw {
        let needs_perm = layout == QkLayout::Hf
            && (name.ends_with("self_attn.q_proj.weight")
                || name.ends_with("self_attn.q_proj.bias")
                || name.ends_with("self_attn.k_proj.weight")
                || name.ends_with("self_attn.k_proj.bias"));
        let t = if needs_perm {
            permute_rows(&t, head_dim)?
        } else {
            t
        };
        let t = t.to_dtype(dtype)?.to_device(device)?;
        out.insert(name, t);
    }
    Ok(out)
}

/// Tensors in the transformer's own namespace (`{prefix}layers.`) that it does not read:
/// usually a config that does not match the checkpoint (depth, gating, biases).
fn unexpected_names<'a>(
    names: impl Iterator<Item = &'a str>,
    prefix: &str,
    expected: &[(String, Vec<usize>)],
) -> Vec<String> {
    let layers = format!("{prefix}layers.");
    let known: std::collections::HashSet<String> = expected
        .iter()
        .map(|(n, _)| format!("{prefix}{n}"))
        .collect();
    let mut extra: Vec<&str> = names
        .filter(|n| n.starts_with(&layers) && !known.contains(*n))
        .collect();
    extra.sort_unstable();
    extra
        .into_iter()
        .map(|n| {
            format!(
                "unexpected tensor {n:?} (the config does not read it: check num_layers, \
                 gating, norm, bias_attn, bias_ff and layer_scale against the checkpoint)"
            )
        })
        .collect()
}

/// Tells the kernel that the whole pages inside `bytes`, part of a read-only file mapping,
/// are not needed any more: they leave this process's resident memory (a later read would
/// fault them back in from the page cache). A hint only; nothing happens off Linux.
pub fn release_mapped(bytes: &[u8]) {
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        let start = (bytes.as_ptr() as usize).next_multiple_of(PAGE);
        let end = (bytes.as_ptr() as usize + bytes.len()) / PAGE * PAGE;
        if end > start {
            // SAFETY: [start, end) lies inside `bytes`, a read-only shared file mapping that
            // nothing writes; MADV_DONTNEED on it only drops page-table entries, and a later
            // read refaults the same file contents.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = bytes;
}

pub fn open_safetensors(path: &Path) -> Result<candle::safetensors::MmapedSafetensors> {
    let meta = std::fs::metadata(path).map_err(|e| Error::WeightsIo {
        msg: format!("cannot read checkpoint {}", path.display()),
        source: e,
    })?;
    if meta.is_dir() {
        return Err(Error::Weights(format!(
            "checkpoint {} is a directory; pass the path of a .safetensors file",
            path.display()
        )));
    }
    // Probe readability first so an I/O failure is reported as such.
    std::fs::File::open(path).map_err(|e| Error::WeightsIo {
        msg: format!("cannot open checkpoint {}", path.display()),
        source: e,
    })?;
    // SAFETY: the file is memory-mapped read-only; mimi_py never writes to it. As with every
    // mmap-based loader, modifying the file while it is mapped is undefined behaviour.
    unsafe { candle::safetensors::MmapedSafetensors::new(path) }.map_err(|e| {
        Error::Weights(format!(
            "checkpoint {} is not a valid safetensors file: {e}",
            path.display()
        ))
    })
}
