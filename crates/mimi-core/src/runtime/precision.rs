//! [`Precision`]: how the native CPU engine computes its matrix products and stores their
//! weights, declared once (`precision=` in Python, with the names PyTorch users know from
//! `torch.set_float32_matmul_precision`), and the process default new models take.
//!
//! * `"highest"`: float32 weights and products (the default; bit-exact with the fixtures).
//! * `"high"`: the transformers' matrices and the large frame-rate convolutions stored in
//!   bf16, products in float32 (half the bytes a streaming step reads). This is what
//!   `weights_dtype="bfloat16"` has always meant, and that argument now names it.
//! * `"medium"`: products with bf16 inputs and float32 sums, in `vdpbf16ps`'s order
//!   (`kernels/bf16dot.rs`), the same bits on every CPU, over the layers
//!   [`MediumLayers`] names; the precision-sensitive ones stay float32 (docs/precision.md:
//!   the quantizer, the encoder's convolutions, which flip codes, the decoder's last
//!   residual block and last convolution, norms, softmax and attention).
//!
//! Only the native engine (the CPU in float32) has these modes; candle's engine computes in
//! the `dtype` it is given.

use crate::error::{Error, Result};
use candle::{DType, Device};
use std::sync::atomic::{AtomicU8, Ordering};

/// How products are computed and their weights stored (module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Precision {
    /// float32 weights and products.
    #[default]
    Highest,
    /// bf16-stored matrices, float32 products.
    High,
    /// bf16 inputs, float32 sums, `vdpbf16ps`'s order.
    Medium,
}

/// Every precision, highest first.
pub const PRECISIONS: [Precision; 3] = [Precision::Highest, Precision::High, Precision::Medium];

impl Precision {
    /// Parses `precision=`: `"highest"`, `"high"` or `"medium"`.
    pub fn parse(spec: &str) -> Result<Self> {
        let found = PRECISIONS.into_iter().find(|p| p.name() == spec.trim());
        found.ok_or_else(|| {
            Error::config(
                "precision",
                format!("expected \"highest\", \"high\" or \"medium\", got {spec:?}"),
            )
        })
    }

    /// Parses the older `weights_dtype=`: `"float32"` is `"highest"`, `"bfloat16"` `"high"`.
    pub fn from_weights_dtype(spec: &str) -> Result<Self> {
        match spec.trim().to_ascii_lowercase().as_str() {
            "float32" | "f32" => Ok(Self::Highest),
            "bfloat16" | "bf16" => Ok(Self::High),
            _ => Err(Error::config(
                "weights_dtype",
                format!("expected \"float32\" or \"bfloat16\", got {spec:?}"),
            )),
        }
    }

    /// The canonical name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Highest => "highest",
            Self::High => "high",
            Self::Medium => "medium",
        }
    }

    /// How the large matrices are stored: `"float32"` or `"bfloat16"` (`weights_dtype`).
    pub fn weights_dtype(self) -> &'static str {
        match self {
            Self::Highest => "float32",
            Self::High | Self::Medium => "bfloat16",
        }
    }

    /// Whether the large matrices are stored in bf16.
    pub fn stores_bf16(self) -> bool {
        self != Self::Highest
    }

    /// Refuses a reduced precision for a model that would not compute with the native CPU
    /// kernels (another device, or a half-precision `dtype`, which is candle's engine).
    pub fn check_engine(self, device: &Device, dtype: DType) -> Result<()> {
        if self != Self::Highest && !(device.is_cpu() && dtype == DType::F32) {
            return Err(Error::config(
                "precision",
                format!(
                    "precision={:?} needs the native CPU engine (device=\"cpu\", \
                     dtype=\"float32\"), got device {:?} and dtype {dtype:?}; for half-precision \
                     compute on candle's engine pass dtype=\"bfloat16\" instead",
                    self.name(),
                    device.location()
                ),
            ));
        }
        Ok(())
    }
}

impl Precision {
    /// Reads the two arguments a model takes: `precision` (`None`: not given) and the older
    /// `weights_dtype` (`None`: not given). Both given must agree on how the weights are
    /// stored; neither: [`resolve`]'s process default.
    pub fn from_args(
        precision: Option<&str>,
        weights_dtype: Option<&str>,
        device: &Device,
        dtype: DType,
    ) -> Result<Self> {
        let p = precision.map(Self::parse).transpose()?;
        let w = weights_dtype.map(Self::from_weights_dtype).transpose()?;
        let chosen = match (p, w) {
            (Some(p), Some(w)) if p.weights_dtype() != w.weights_dtype() => {
                return Err(Error::config(
                    "weights_dtype",
                    format!(
                        "weights_dtype={:?} contradicts precision={:?}, which stores its \
                         weights in {}; pass precision alone",
                        w.weights_dtype(),
                        p.name(),
                        p.weights_dtype()
                    ),
                ))
            }
            (Some(p), _) => p,
            (None, Some(w)) => w,
            (None, None) => resolve(None, device, dtype),
        };
        chosen.check_engine(device, dtype)?;
        Ok(chosen)
    }
}

static DEFAULT: AtomicU8 = AtomicU8::new(0);

/// The precision models built from now on take when none is given
/// (`mimi_py.set_float32_matmul_precision`); `"highest"` until set.
pub fn set_default(p: Precision) {
    DEFAULT.store(p as u8, Ordering::Relaxed)
}

/// See [`set_default`].
pub fn default() -> Precision {
    PRECISIONS[DEFAULT.load(Ordering::Relaxed) as usize]
}

/// `explicit`, else the process default where the native engine runs (`device` the CPU,
/// `dtype` f32), else `"highest"`: a process default never makes a GPU model fail.
pub fn resolve(explicit: Option<Precision>, device: &Device, dtype: DType) -> Precision {
    match explicit {
        Some(p) => p,
        None if device.is_cpu() && dtype == DType::F32 => default(),
        None => Precision::Highest,
    }
}

/// The layer groups `"medium"` covers (`MIMI_PY_MEDIUM_LAYERS`): by default all but the
/// encoder's convolutions, which moved the most codes in the agreement table of
/// docs/precision.md (`all` takes them too).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MediumLayers {
    /// The encoder's SEANet convolutions after the first (residual blocks, down-sampling).
    pub encoder_convs: bool,
    /// The frame-rate convolutions: the encoder's last convolution and the down-sampling to
    /// 12.5 Hz; the decoder's first convolution and its first up-sampling.
    pub frame_rate: bool,
    /// Both transformers' linear layers.
    pub transformers: bool,
    /// The decoder's SEANet convolutions before its last residual block (up-sampling,
    /// residual blocks).
    pub decoder_convs: bool,
}

/// The names of [`MediumLayers`]' groups, in `MIMI_PY_MEDIUM_LAYERS`.
pub const MEDIUM_GROUPS: [&str; 4] = [
    "encoder_convs",
    "frame_rate",
    "transformers",
    "decoder_convs",
];

impl MediumLayers {
    /// Every group.
    pub const ALL: Self = Self {
        encoder_convs: true,
        frame_rate: true,
        transformers: true,
        decoder_convs: true,
    };

    /// The groups `"medium"` takes unless told: all but the encoder's convolutions.
    pub const DEFAULT: Self = Self {
        encoder_convs: false,
        ..Self::ALL
    };

    /// `"all"`, or a comma-separated list of [`MEDIUM_GROUPS`]; anything else is
    /// [`Self::DEFAULT`].
    pub fn parse(spec: &str) -> Self {
        if spec.trim() == "all" {
            return Self::ALL;
        }
        let names: Vec<&str> = spec.split(',').map(str::trim).collect();
        if !names.iter().all(|n| MEDIUM_GROUPS.contains(n)) {
            return Self::DEFAULT;
        }
        Self {
            encoder_convs: names.contains(&"encoder_convs"),
            frame_rate: names.contains(&"frame_rate"),
            transformers: names.contains(&"transformers"),
            decoder_convs: names.contains(&"decoder_convs"),
        }
    }

    /// The groups `MIMI_PY_MEDIUM_LAYERS` names.
    pub fn from_settings() -> Self {
        Self::parse(&crate::runtime::settings::get().medium_layers)
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_refuse() {
        for p in PRECISIONS {
            assert_eq!(Precision::parse(p.name()).unwrap(), p);
        }
        assert_eq!(
            Precision::from_weights_dtype("BF16").unwrap(),
            Precision::High
        );
        assert_eq!(
            Precision::from_weights_dtype("float32").unwrap(),
            Precision::Highest
        );
        for (bad, field) in [("low", "precision"), ("int8", "weights_dtype")] {
            let got = match field {
                "precision" => Precision::parse(bad),
                _ => Precision::from_weights_dtype(bad),
            };
            match got {
                Err(Error::Config { field: f, msg }) => {
                    assert_eq!(f, field);
                    assert!(msg.contains(bad), "{msg}");
                }
                other => panic!("expected a config error, got {other:?}"),
            }
        }
        let cpu = Device::Cpu;
        assert!(Precision::Medium.check_engine(&cpu, DType::F32).is_ok());
        assert!(Precision::Highest.check_engine(&cpu, DType::BF16).is_ok());
        assert!(Precision::High.check_engine(&cpu, DType::BF16).is_err());
        assert!(Precision::Medium.check_engine(&cpu, DType::F16).is_err());
    }

    #[test]
    fn layer_groups_parse() {
        assert_eq!(MediumLayers::parse("all"), MediumLayers::ALL);
        assert_eq!(MediumLayers::parse("nonsense"), MediumLayers::DEFAULT);
        let default = "frame_rate,transformers,decoder_convs";
        assert_eq!(MediumLayers::parse(default), MediumLayers::DEFAULT);
        assert!(!MediumLayers::parse(default).encoder_convs);
        let t = MediumLayers::parse("transformers");
        assert!(t.transformers && !t.encoder_convs && !t.frame_rate && !t.decoder_convs);
        let two = MediumLayers::parse("encoder_convs, decoder_convs");
        assert!(two.encoder_convs && two.decoder_convs && !two.transformers);
    }
}
