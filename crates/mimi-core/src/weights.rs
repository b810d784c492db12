//! Weights: one validating tensor source for every model, the names and shapes a
//! transformer reads, seeded initialisation, and the q/k rotary-layout conversion.
//!
//! A [`TensorSource`] hands out tensors by name and shape, from a safetensors file, from
//! tensors already in memory (a Python mapping, a whole codec checkpoint) or from a seed.
//! Every request is checked (present, real floating dtype, right shape) before candle sees
//! it; problems are collected, not raised one by one, so [`TensorSource::finish`] reports
//! all of them in one `WeightsError`. The same source backs candle's `VarBuilder` (the
//! codec's convolutions and quantizer) through [`TensorSource::var_builder`].

use crate::config::{Norm, TransformerConfig};
use crate::error::{locked, Error, Result};
use crate::host::HostArray;
use crate::runtime::precision::Precision;
use candle::safetensors::MmapedSafetensors;
use candle::{DType, Device, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::VarBuilder;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

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
        if cfg.norm == Norm::RmsNorm {
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

/// Where a source's tensors live.
enum Store {
    /// A memory-mapped safetensors file (and its path), read tensor by tensor on request.
    Mapped(MmapedSafetensors, std::path::PathBuf),
    /// Tensors already read, under their full names. Each one leaves the map when it is
    /// read ([`Taken`]), so a model that copies it into its own layout does not hold both.
    Tensors(Mutex<Taken>),
    /// Seeded weights with the initialisation of a fresh model (see [`seeded_tensor`]).
    Seeded { seed: u64, layer_scale: f32 },
}

/// The tensors of [`Store::Tensors`] not read yet, and the names of those that were.
struct Taken {
    left: HashMap<String, Tensor>,
    read: HashSet<String>,
}

impl Taken {
    fn contains(&self, name: &str) -> bool {
        self.left.contains_key(name) || self.read.contains(name)
    }

    /// The tensor `name`, handed over once: a second read is a loader bug, reported as a
    /// problem (never a silently different tensor).
    fn take(&mut self, name: &str) -> std::result::Result<Option<Tensor>, String> {
        match self.left.remove(name) {
            Some(t) => {
                self.read.insert(name.to_string());
                Ok(Some(t))
            }
            None if self.read.contains(name) => Err(format!(
                "tensor {name:?} was read twice while loading (internal error, please report)"
            )),
            None => Ok(None),
        }
    }
}

/// A validating source of named tensors (see the module doc).
pub struct TensorSource {
    store: Store,
    origin: String,
    problems: Mutex<Vec<String>>,
    requested: Mutex<HashSet<String>>,
}

/// Most problems listed in one error message.
const MAX_PROBLEMS_SHOWN: usize = 10;

fn is_float(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
}

/// The one check of a stored tensor: a floating dtype (`dtype`, `None` if candle has no such
/// dtype; `shown` is the stored dtype for the message) and the expected shape.
fn check_tensor(
    name: &str,
    dtype: Option<DType>,
    dims: &[usize],
    shape: &[usize],
    shown: impl std::fmt::Debug,
) -> std::result::Result<(), String> {
    if !dtype.is_some_and(is_float) {
        Err(format!(
            "tensor {name:?} has dtype {shown:?}, expected a floating dtype (F32, F16, BF16 or F64)"
        ))
    } else if dims != shape {
        Err(format!(
            "tensor {name:?} has shape {dims:?}, expected {shape:?}"
        ))
    } else {
        Ok(())
    }
}

impl TensorSource {
    fn new(store: Store, origin: String) -> Self {
        Self {
            store,
            origin,
            problems: Mutex::default(),
            requested: Mutex::default(),
        }
    }

    /// A safetensors file, mapped and read lazily.
    pub fn file(path: &Path) -> Result<Self> {
        let st = open_safetensors(path)?;
        Ok(Self::new(
            Store::Mapped(st, path.to_path_buf()),
            format!("checkpoint {}", path.display()),
        ))
    }

    /// Tensors already in memory, under their full names; `origin` names them in messages.
    /// The source owns them and lets each go once it has been read.
    pub fn tensors(tensors: HashMap<String, Tensor>, origin: impl Into<String>) -> Self {
        let taken = Taken {
            left: tensors,
            read: HashSet::new(),
        };
        Self::new(Store::Tensors(Mutex::new(taken)), origin.into())
    }

    /// Host arrays (f32, C order) under their full names, as [`Self::tensors`].
    pub fn host(
        arrays: HashMap<String, HostArray<f32>>,
        origin: impl Into<String>,
    ) -> Result<Self> {
        Ok(Self::tensors(host_tensors(arrays)?, origin))
    }

    /// Seeded weights; layer scales get `layer_scale` (1 if `None`).
    pub fn seeded(seed: u64, layer_scale: Option<f64>) -> Self {
        let layer_scale = layer_scale.unwrap_or(1.0) as f32;
        Self::new(
            Store::Seeded { seed, layer_scale },
            format!("seeded weights (seed={seed})"),
        )
    }

    /// The file, for a source read from one ([`Self::file`]).
    pub fn file_path(&self) -> Option<&Path> {
        match &self.store {
            Store::Mapped(_, path) => Some(path),
            _ => None,
        }
    }

    /// The seed, for seeded sources.
    pub fn seed(&self) -> Option<u64> {
        match self.store {
            Store::Seeded { seed, .. } => Some(seed),
            _ => None,
        }
    }

    /// Every name the source provides (none for a seeded source).
    pub fn names(&self) -> Vec<String> {
        match &self.store {
            Store::Mapped(st, _) => st.tensors().into_iter().map(|(n, _)| n).collect(),
            Store::Tensors(t) => {
                let t = locked(t);
                t.left.keys().chain(t.read.iter()).cloned().collect()
            }
            Store::Seeded { .. } => Vec::new(),
        }
    }

    /// Records a problem (once).
    pub fn problem(&self, msg: String) {
        let mut p = locked(&self.problems);
        if !p.contains(&msg) {
            p.push(msg);
        }
    }

    /// The tensor `name` of shape `shape`, on the CPU in its stored dtype; `None` (and a
    /// recorded problem) if it is missing, not floating or of another shape.
    pub fn get(&self, name: &str, shape: &[usize]) -> Option<Tensor> {
        locked(&self.requested).insert(name.to_string());
        match self.fetch(name, shape) {
            Ok(t) => Some(t),
            Err(msg) => {
                self.problem(msg);
                None
            }
        }
    }

    fn fetch(&self, name: &str, shape: &[usize]) -> std::result::Result<Tensor, String> {
        let missing = || format!("missing tensor {name:?} (expected shape {shape:?})");
        match &self.store {
            Store::Seeded { seed, layer_scale } => {
                let data = seeded_tensor(*seed, *layer_scale, name, shape);
                Tensor::from_vec(data, shape, &Device::Cpu).map_err(|e| e.to_string())
            }
            Store::Tensors(map) => {
                let mut map = locked(map);
                // Checked before it is taken: a mis-shaped tensor stays for the report.
                let t = map.left.get(name);
                if let Some(t) = t {
                    check_tensor(name, Some(t.dtype()), t.dims(), shape, t.dtype())?;
                }
                map.take(name)?.ok_or_else(missing)
            }
            Store::Mapped(st, _) => {
                let view = st.get(name).map_err(|_| missing())?;
                let dtype = DType::try_from(view.dtype()).ok();
                check_tensor(name, dtype, view.shape(), shape, view.dtype())?;
                let t = st
                    .load(name, &Device::Cpu)
                    .map_err(|e| format!("could not read tensor {name:?}: {e}"))?;
                // Copied out: its pages of the mapping need not stay resident.
                release_mapped(view.data());
                Ok(t)
            }
        }
    }

    /// Whether the source holds `name` (a seeded source makes plain weights only).
    pub fn contains(&self, name: &str) -> bool {
        match &self.store {
            Store::Mapped(st, _) => st.get(name).is_ok(),
            Store::Tensors(t) => locked(t).contains(name),
            Store::Seeded { .. } => !name.ends_with("_g") && !name.ends_with("_v"),
        }
    }

    /// Records every provided tensor that no one asked for and `relevant` selects:
    /// usually a config that does not match the checkpoint. `hint` says what to check.
    pub fn report_unread(&self, relevant: impl Fn(&str) -> bool, hint: &str) {
        let mut extra: Vec<String> = {
            let requested = locked(&self.requested);
            self.names()
                .into_iter()
                .filter(|n| !requested.contains(n) && relevant(n))
                .collect()
        };
        extra.sort_unstable();
        for n in extra {
            self.problem(format!("unexpected tensor {n:?} ({hint})"));
        }
    }

    /// `Ok` if every request was satisfied, else one `WeightsError` listing the problems.
    pub fn finish(&self) -> Result<()> {
        let problems = locked(&self.problems);
        if problems.is_empty() {
            return Ok(());
        }
        let shown = problems[..problems.len().min(MAX_PROBLEMS_SHOWN)].join("; ");
        let more = match problems.len().saturating_sub(MAX_PROBLEMS_SHOWN) {
            0 => String::new(),
            n => format!(" (and {n} more)"),
        };
        Err(Error::Weights(format!("{}: {shown}{more}", self.origin)))
    }

    /// A candle `VarBuilder` reading from this source, in `dtype` on `device`.
    pub fn var_builder(self: &Arc<Self>, dtype: DType, device: &Device) -> VarBuilder<'static> {
        VarBuilder::from_backend(Box::new(Backend(self.clone())), dtype, device.clone())
    }
}

/// candle's view of a [`TensorSource`]. A problem yields zeros so that loading goes on and
/// every problem is found; [`TensorSource::finish`] then reports them.
struct Backend(Arc<TensorSource>);

impl SimpleBackend for Backend {
    fn get(
        &self,
        s: Shape,
        name: &str,
        _h: candle_nn::Init,
        dtype: DType,
        dev: &Device,
    ) -> candle::Result<Tensor> {
        let src = &self.0;
        // A missing weight-normed conv asks for weight_g then weight_v: report it once, as
        // the plain weight, with the shape of weight_v.
        if name.ends_with(".weight_g") && !src.contains(name) {
            return Tensor::zeros(s, dtype, dev);
        }
        if let Some(plain) = name.strip_suffix("_v").filter(|_| !src.contains(name)) {
            locked(&src.requested).insert(name.to_string());
            src.problem(format!(
                "missing tensor {plain:?} (expected shape {:?})",
                s.dims()
            ));
            return Tensor::zeros(s, dtype, dev);
        }
        match src.get(name, s.dims()) {
            Some(t) => t.to_dtype(dtype)?.to_device(dev),
            None => Tensor::zeros(s, dtype, dev),
        }
    }

    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> candle::Result<Tensor> {
        match &self.0.store {
            Store::Tensors(t) => match locked(t).take(name) {
                Ok(Some(t)) => t.to_dtype(dtype)?.to_device(dev),
                Ok(None) => candle::bail!("missing tensor {name:?}"),
                Err(msg) => candle::bail!("{msg}"),
            },
            _ => candle::bail!("tensor {name:?} needs a shape"),
        }
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.0.contains(name)
    }
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

/// Seeded weights with the initialisation of a fresh model: weights N(0, 1/fan_in) (fan_in
/// = all dims but the first), codebooks N(0, 1), biases 0, norm weights and codebook usage 1,
/// layer scales `layer_scale`. Each tensor has its own stream derived from (seed, name), so
/// the result does not depend on visiting order.
pub fn seeded_tensor(seed: u64, layer_scale: f32, name: &str, shape: &[usize]) -> Vec<f32> {
    let n: usize = shape.iter().product();
    let ones = [".alpha", "layernorm.weight", "cluster_usage", "initialized"];
    if name.ends_with("layer_scale.scale") {
        return vec![layer_scale; n];
    }
    if ones.iter().any(|s| name.ends_with(s)) {
        return vec![1.0; n];
    }
    if name.ends_with(".bias") {
        return vec![0.0; n];
    }
    let fan_in = if name.ends_with("embed_sum") {
        1
    } else {
        shape
            .get(1..)
            .map_or(1, |d| d.iter().product::<usize>())
            .max(1)
    };
    let std = 1.0 / (fan_in as f64).sqrt();
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

fn is_qk(name: &str) -> bool {
    [
        "q_proj.weight",
        "q_proj.bias",
        "k_proj.weight",
        "k_proj.bias",
    ]
    .iter()
    .any(|s| name.ends_with(&format!("self_attn.{s}")))
}

/// Where a transformer's tensors are read from and where they go.
#[derive(Clone, Copy, Debug)]
pub struct LoadSpec<'a> {
    /// Prefix of the tensor names in the source (`encoder_transformer.`).
    pub prefix: &'a str,
    /// How the source orders the q/k rows.
    pub layout: QkLayout,
    pub device: &'a Device,
    pub dtype: DType,
    /// How the matrices (rank-2 tensors: the linear layers) are stored (bf16 below
    /// `"highest"`); the rest (norms, biases, scales) is in `dtype`. A tensor already stored
    /// so is not converted. `"medium"` packs them in pairs once built ([`Transformer::load`]).
    ///
    /// [`Transformer::load`]: crate::transformer::Transformer::load
    pub precision: Precision,
}

/// Reads every tensor a transformer with `cfg` reads from `src` under `prefix`, converts
/// the q/k layout if needed, and returns them under their names without prefix, in `dtype`
/// on `device`. Problems are recorded in `src`; call [`TensorSource::finish`] before use.
pub fn load_transformer(
    cfg: &TransformerConfig,
    src: &TensorSource,
    spec: &LoadSpec,
) -> Result<BTreeMap<String, Tensor>> {
    let LoadSpec {
        prefix,
        layout,
        device,
        dtype,
        precision,
    } = *spec;
    let mut out = BTreeMap::new();
    for (name, shape) in expected_tensors(cfg) {
        let Some(t) = src.get(&format!("{prefix}{name}"), &shape) else {
            continue;
        };
        let t = match layout {
            QkLayout::Hf if is_qk(&name) => permute_rows(&t, cfg.head_dim())?,
            _ => t,
        };
        let to = match precision.stores_bf16() && shape.len() == 2 {
            true => DType::BF16,
            false => dtype,
        };
        out.insert(name, t.to_dtype(to)?.to_device(device)?);
    }
    Ok(out)
}

/// [`load_transformer`] for a source that holds one transformer: also refuses tensors in
/// its namespace (`{prefix}layers.`) that the config does not read, then reports.
pub fn load_transformer_only(
    cfg: &TransformerConfig,
    src: &TensorSource,
    spec: &LoadSpec,
) -> Result<BTreeMap<String, Tensor>> {
    let out = load_transformer(cfg, src, spec)?;
    let layers = format!("{}layers.", spec.prefix);
    src.report_unread(
        |n| n.starts_with(&layers),
        "the config does not read it: check num_layers, gating, norm, bias_attn, bias_ff and \
         layer_scale against the checkpoint",
    );
    src.finish()?;
    Ok(out)
}

/// Bytes a parameter may take while a model loads: the f32 read, its converted copy and the
/// packed copy. The one factor every weight-memory check uses.
pub const LOAD_BYTES_PER_PARAM: u64 = 12;

/// Refuses a model of `params` parameters that cannot load in the memory available.
pub fn check_load_memory(params: u64, what: &str, hint: &str) -> Result<()> {
    crate::runtime::memory::check_memory(params.saturating_mul(LOAD_BYTES_PER_PARAM), what, hint)
}

/// Number of parameters a transformer with `cfg` holds.
pub fn transformer_params(cfg: &TransformerConfig) -> u64 {
    expected_tensors(cfg)
        .iter()
        .map(|(_, s)| s.iter().map(|&d| d as u64).product::<u64>())
        .sum()
}

/// Reads every tensor of a safetensors file into memory, giving each tensor's mapped pages
/// back as soon as it is copied, so that the file does not add its whole size to the peak
/// memory of loading.
pub fn read_all(path: &Path) -> Result<HashMap<String, Tensor>> {
    let st = open_safetensors(path)?;
    let mut out = HashMap::new();
    for (name, view) in st.tensors() {
        let t = st.load(&name, &Device::Cpu).map_err(|e| {
            Error::Weights(format!(
                "checkpoint {}: could not read tensor {name:?}: {e}",
                path.display()
            ))
        })?;
        release_mapped(view.data());
        out.insert(name, t);
    }
    Ok(out)
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

/// Host arrays as f32 CPU tensors under the same names; refuses an array whose values do not
/// fill its shape.
pub fn host_tensors(arrays: HashMap<String, HostArray<f32>>) -> Result<HashMap<String, Tensor>> {
    (arrays.into_iter())
        .map(|(name, a)| {
            if a.shape.iter().product::<usize>() != a.data.len() {
                return Err(Error::Weights(format!(
                    "tensor {name:?} holds {} values but its shape {:?} needs {}",
                    a.data.len(),
                    a.shape,
                    a.shape.iter().product::<usize>()
                )));
            }
            let t = Tensor::from_vec(a.data, a.shape.as_slice(), &Device::Cpu)?;
            Ok((name, t))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source() -> TensorSource {
        let t = Tensor::arange(0f32, 6., &Device::Cpu).unwrap();
        let t = t.reshape((2, 3)).unwrap();
        TensorSource::tensors(HashMap::from([("w".to_string(), t)]), "test tensors")
    }

    #[test]
    fn in_memory_tensors_are_handed_over_once() {
        let src = source();
        let t = src.get("w", &[2, 3]).expect("first read");
        assert_eq!(t.to_vec2::<f32>().unwrap()[1], [3., 4., 5.]);
        // Read, the tensor is gone from the source, but its name is still provided.
        assert!(src.contains("w"));
        assert_eq!(src.names(), ["w"]);
        assert!(src.finish().is_ok());
        // A second read is reported, not answered with something else.
        assert!(src.get("w", &[2, 3]).is_none());
        let msg = src.finish().unwrap_err().to_string();
        assert!(msg.contains("read twice"), "{msg}");
    }

    #[test]
    fn a_mis_shaped_tensor_is_reported_and_kept() {
        let src = source();
        assert!(src.get("w", &[3, 2]).is_none());
        let msg = src.finish().unwrap_err().to_string();
        assert!(msg.contains("has shape [2, 3], expected [3, 2]"), "{msg}");
        assert!(src.get("nope", &[1]).is_none());
        assert!(src
            .finish()
            .unwrap_err()
            .to_string()
            .contains("missing tensor \"nope\""));
    }
}
