//! The process-wide switches, declared once: each is one entry of `switches!` below (its field
//! of [`Settings`], its row of [`TABLE`], how it is read and shown). Every environment variable
//! mimi_py reads is in [`TABLE`], and this is the only module that reads one
//! (`mimi_py.settings()` in Python shows the effective values; docs/settings.md's table is
//! checked against [`TABLE`]).
//!
//! Each value is read once, on first use, so a switch must be set before the first call that
//! needs it (in practice: before the process starts, or before `import mimi_py`).

use std::sync::OnceLock;

/// One environment switch: its name, its default, and what it does.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    /// The environment variable.
    pub name: &'static str,
    /// The value in effect when the variable is unset, as written in docs/settings.md.
    pub default: &'static str,
    /// What it changes.
    pub doc: &'static str,
}

/// Declares every switch once: its field of [`Settings`], its row of [`TABLE`], how it is read
/// from the environment and how its effective value is shown (`mimi_py.settings()`).
macro_rules! switches {
    ($( $(#[$attr:meta])* $field:ident: $ty:ty = $name:literal, default $default:literal,
        read $read:expr, show $show:expr, doc $doc:expr; )*) => {
        /// Every switch, in the order docs/settings.md lists them.
        pub const TABLE: &[Setting] = &[$(Setting { name: $name, default: $default, doc: $doc }),*];

        /// The effective values of the switches the core reads.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct Settings {
            $( $(#[$attr])* pub $field: $ty, )*
        }

        impl Settings {
            /// Reads the environment now (tests and [`get`]).
            pub fn from_env() -> Self {
                Settings { $( $field: ($read)($name), )* }
            }

            /// `(name, effective value)` for every row of [`TABLE`], in its order.
            pub fn entries(&self) -> Vec<(&'static str, String)> {
                vec![$( ($name, ($show)(&self.$field)) ),*]
            }
        }
    };
}

switches! {
    /// Threads of the compute pool.
    threads: usize = "RAYON_NUM_THREADS", default "the available cores",
        read |_: &str| rayon::current_num_threads(), show |v: &usize| v.to_string(),
        doc "threads of the compute pool (read once, by rayon, when the pool starts)";
    /// Whether the pool's workers spin for the length of a call.
    spin: bool = "MIMI_PY_SPIN", default "1", read |n| flag(n, true), show on,
        doc "1: the pool's other workers spin for the length of a call (fewer context \
             switches); 0: they park between parallel loops (same results)";
    /// Whether stride-1 convolutions may use the AVX-512 direct kernel.
    direct_conv: bool = "MIMI_PY_DIRECT_CONV", default "1", read |n| flag(n, true), show on,
        doc "1: stride-1 convolutions use the AVX-512 direct kernel where the CPU has it; \
             0: always gemm (same codes within float rounding; for comparing the two)";
    /// The most the CPU kernels use, lower case (`kernels::cpu` reads it).
    isa: String = "MIMI_PY_ISA", default "auto", read |n| word(n, "auto"),
        show |v: &String| v.clone(),
        doc "the most the CPU kernels use: auto (what the CPU has), avx512bf16, avx512, avx2 \
             or portable; a value above the CPU's runs the CPU's best, anything else is auto. \
             For tests and comparisons (gemm, in the convolutions, picks its own)";
    /// The layer groups `precision="medium"` covers (`runtime::precision::MediumLayers`).
    medium_layers: String = "MIMI_PY_MEDIUM_LAYERS",
        default "frame_rate,transformers,decoder_convs",
        read |n| word(n, "frame_rate,transformers,decoder_convs"), show |v: &String| v.clone(),
        doc "the layers precision=\"medium\" computes with bf16 inputs: a comma-separated list \
             of encoder_convs, frame_rate, transformers, decoder_convs, or all; the default \
             keeps the encoder's convolutions in float32, where bf16 moved the most codes \
             (read when a codec is built; docs/precision.md)";
    /// Whether the candle path steps in fixed shapes (`transformer::fixed`).
    fixed_step: bool = "MIMI_PY_FIXED_STEP", default "1", read |n| flag(n, true), show on,
        doc "1: streaming steps of up to 4 tokens on the candle path (GPUs, half precision, \
             gated feed-forward) run in fixed shapes over rings of context + 3 slots (rounded \
             up to 16), written in place; 0: the earlier paths over rings of context slots \
             (same results within rounding; for comparing the two)";
    /// Working memory an offline call may keep (MB).
    heap_keep_mb: u64 = "MIMI_PY_HEAP_KEEP_MB", default "256", read |n| number(n, 256),
        show |v: &u64| v.to_string(),
        doc "working memory an offline call may leave to the next one (MB); a call that grew \
             the process by more gives its free memory back to the OS; 0: always give back";
    /// Whether float32 products on CUDA may use TF32.
    cuda_tf32: bool = "MIMI_PY_CUDA_TF32", default "0", read |n| flag(n, false), show on,
        doc "1: float32 matrix products on CUDA may use TF32 (faster on Ampere and later, \
             about 10 significant bits, flips some codes); 0: full float32 (read when a CUDA \
             device is opened)";
    /// What the CUDA memory pool keeps when a call synchronizes (MB; `None`: all).
    cuda_pool_keep_mb: Option<u64> = "MIMI_PY_CUDA_POOL_KEEP_MB", default "all",
        read |n| std::env::var(n).ok().and_then(|v| v.trim().parse::<u64>().ok()),
        show |v: &Option<u64>| v.map_or("all".into(), |mb| mb.to_string()),
        doc "memory the CUDA pool keeps when a call synchronizes (MB), for the next call to \
             reuse; 0: hand it all back to the driver each time, CUDA's own default (read \
             when a CUDA device is opened)";
    /// Whether CUDA allocations record events for cross-stream use.
    cuda_events: bool = "MIMI_PY_CUDA_EVENTS", default "1", read |n| flag(n, true), show on,
        doc "0: no CUDA event per allocation (cross-stream tracking, which no call needs: \
             each runs on its thread's stream and waits for it); 1: candle's default (read \
             when a CUDA device is opened)";
    /// Whether the candle engine's convolutions on CUDA run through cuDNN (`gpu::cudnn`).
    cuda_cudnn: bool = "MIMI_PY_CUDA_CUDNN", default "0", read |n| flag(n, false), show on,
        doc "1: convolutions on CUDA run as cuDNN forward convolutions, their descriptors, \
             algorithm and workspace planned once per layer and shape, float32 in FMA math \
             (TF32 only with MIMI_PY_CUDA_TF32=1); 0: candle's im2col and cuBLAS. Off until a \
             device run shows it faster and exact (docs/devices.md); without libcudnn a \
             call falls back to candle's path";
    /// Whether streaming steps on CUDA are captured as CUDA graphs and replayed (`gpu::graphs`).
    cuda_graphs: bool = "MIMI_PY_CUDA_GRAPHS", default "0", read |n| flag(n, false), show on,
        doc "1: the candle path's fixed-shape transformer steps are captured as a CUDA graph \
             per stream and shape, and replayed with the step's tables written to fixed \
             buffers first (the CPU runs the same plan without capture); turns off \
             MIMI_PY_CUDA_EVENTS. 0: every step launched eagerly. Off until a device run shows \
             it faster and bit-equal (docs/devices.md)";
    /// Whether `mimi_py/_cuda.py` skips preloading pip's nvidia-* libraries.
    no_cuda_preload: bool = "MIMI_PY_NO_CUDA_PRELOAD", default "0", read |n| flag(n, false),
        show on,
        doc "1: a CUDA build does not preload pip's nvidia-* libraries at import \
             (read by mimi_py/_cuda.py, before the extension loads)";
}

/// A switch that is on unless set to `0` (`on_by_default` false: off unless set to non-`0`).
fn flag(name: &str, on_by_default: bool) -> bool {
    match std::env::var_os(name) {
        None => on_by_default,
        Some(v) if v.is_empty() => on_by_default,
        Some(v) => v != "0",
    }
}

fn number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(default)
}

/// A word, trimmed and in lower case (`default` when unset or empty).
fn word(name: &str, default: &str) -> String {
    std::env::var(name)
        .map(|v| v.trim().to_ascii_lowercase())
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.into())
}

/// A flag's effective value as shown: `1` or `0`.
fn on(v: &bool) -> String {
    u8::from(*v).to_string()
}

/// The settings of this process, read once.
pub fn get() -> &'static Settings {
    static SETTINGS: OnceLock<Settings> = OnceLock::new();
    SETTINGS.get_or_init(Settings::from_env)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_has_a_value_and_the_defaults_hold() {
        let s = Settings::from_env();
        let entries = s.entries();
        assert_eq!(entries.len(), TABLE.len());
        for (row, (name, _)) in TABLE.iter().zip(&entries) {
            assert_eq!(row.name, *name);
        }
        assert_eq!(
            entries
                .iter()
                .find(|(n, _)| *n == "MIMI_PY_CUDA_TF32")
                .map(|e| e.1.as_str()),
            Some(if s.cuda_tf32 { "1" } else { "0" })
        );
        assert!(flag("MIMI_PY_TEST_UNSET_SWITCH", true));
        assert!(!flag("MIMI_PY_TEST_UNSET_SWITCH", false));
        assert_eq!(number("MIMI_PY_TEST_UNSET_SWITCH", 256), 256);
    }
}
