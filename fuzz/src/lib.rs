//! What the fuzz targets share: the small seeded models they run (built once per process, so
//! that an execution costs microseconds, not a model build), the rule every target asserts
//! on an error (a typed [`Error`], never an internal or a bare candle one), and the values a
//! structured input picks from (NaN, infinities, huge, tiny).
//!
//! The models are far smaller than any real one but keep every part: a codec with a
//! 16-sample frame (two SEANet stages, one transformer layer, three codebooks) and two
//! transformers of one shape (rope and layer norm; sin and RMS norm), whose states may be
//! copied into each other.

use arbitrary::Arbitrary;
use mimi_core::candle::{DType, Device};
use mimi_core::config::{Norm, PositionalEmbedding};
use mimi_core::runtime::precision::Precision;
use mimi_core::transformer::Transformer;
use mimi_core::weights::{load_transformer_only, LoadSpec, QkLayout};
use mimi_core::{Codec, CodecConfig, Error, OpenOptions, TensorSource, TransformerConfig};
use std::sync::OnceLock;

/// Panics (a finding) unless `e` is one of the typed errors a caller can act on: an
/// internal error, a candle error leaking through, or a cancellation nobody asked for is a
/// bug in a door.
pub fn assert_typed(e: &Error, what: &str) {
    match e {
        Error::Internal(_) | Error::Candle(_) | Error::Cancelled => {
            panic!("{what}: untyped error {e:?} ({e})")
        }
        _ => {
            let msg = e.to_string();
            assert!(!msg.is_empty(), "{what}: an error without a message");
        }
    }
}

/// The codec's config: a 16-sample frame at 400 Hz (ratios 4 and 2, a stride-2 down
/// sampling), 8 channels wide, one transformer layer of context 5, three codebooks of 16.
pub fn pico_codec_config() -> CodecConfig {
    let mut c = CodecConfig::tiny();
    c.sample_rate = 400.0;
    c.frame_rate = 25.0;
    c.seanet.ratios = vec![4, 2];
    c.seanet.n_filters = 2;
    c.seanet.dimension = 8;
    c.seanet.kernel_size = 3;
    c.transformer.d_model = 8;
    c.transformer.num_heads = 2;
    c.transformer.num_layers = 1;
    c.transformer.dim_feedforward = 16;
    c.transformer.context = 5;
    c.quantizer_n_q = 3;
    c.quantizer_bins = 16;
    c.quantizer_dim = 4;
    c
}

/// The seeded codec of [`pico_codec_config`], built once.
pub fn pico_codec() -> &'static Codec {
    static CODEC: OnceLock<Codec> = OnceLock::new();
    CODEC.get_or_init(|| {
        let options = OpenOptions {
            config: Some(pico_codec_config()),
            ..Default::default()
        };
        Codec::seeded(11, &options).expect("the pico codec builds")
    })
}

/// The two transformers' config: d 8, 2 heads, 2 layers, context 4; `sin` switches to
/// sinusoidal positions and RMS norm (the state's shape stays the same).
pub fn small_transformer_config(sin: bool) -> TransformerConfig {
    let mut c = TransformerConfig {
        d_model: 8,
        num_heads: 2,
        num_layers: 2,
        dim_feedforward: 16,
        context: 4,
        ..Default::default()
    };
    if sin {
        c.positional_embedding = PositionalEmbedding::Sin;
        c.norm = Norm::RmsNorm;
    }
    c
}

fn seeded_transformer(sin: bool, seed: u64) -> Transformer {
    let cfg = small_transformer_config(sin);
    let dev = Device::Cpu;
    let spec = LoadSpec {
        prefix: "",
        layout: QkLayout::Interleaved,
        device: &dev,
        dtype: DType::F32,
        precision: Precision::default(),
    };
    let src = TensorSource::seeded(seed, cfg.layer_scale);
    let w = load_transformer_only(&cfg, &src, &spec).expect("seeded weights");
    Transformer::new(&cfg, w, &dev, DType::F32).expect("the small transformer builds")
}

/// The two small transformers (rope/layer norm, sin/RMS norm), built once.
pub fn small_transformers() -> &'static [Transformer; 2] {
    static MODELS: OnceLock<[Transformer; 2]> = OnceLock::new();
    MODELS.get_or_init(|| [seeded_transformer(false, 3), seeded_transformer(true, 4)])
}

/// The config the checkpoint corpus was written for (`fuzz/make_corpus.py`): the test
/// fixtures' small codec (`tests/data/codec`) with every width divided by 4.
pub fn micro_checkpoint_config() -> CodecConfig {
    let mut c = CodecConfig::tiny();
    c.seanet.n_filters = 2;
    c.seanet.dimension = 16;
    c.transformer.d_model = 16;
    c.transformer.dim_feedforward = 32;
    c.quantizer_bins = 16;
    c.quantizer_dim = 8;
    c
}

/// A value a structured input picks: ordinary ones most of the time, and the hostile ones.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum Val {
    Small(i8),
    Nan,
    Inf,
    NegInf,
    Huge,
    Tiny,
    Max,
}

impl Val {
    /// The value as f32 (`Small(i)`: i / 64).
    pub fn f32(self) -> f32 {
        match self {
            Val::Small(i) => f32::from(i) / 64.0,
            Val::Nan => f32::NAN,
            Val::Inf => f32::INFINITY,
            Val::NegInf => f32::NEG_INFINITY,
            Val::Huge => 1e30,
            Val::Tiny => f32::MIN_POSITIVE / 4.0,
            Val::Max => f32::MAX,
        }
    }
}

/// `n` values cycling through `vals` (zeros when empty).
pub fn fill(vals: &[Val], n: usize) -> Vec<f32> {
    match vals.len() {
        0 => vec![0.0; n],
        k => (0..n).map(|i| vals[i % k].f32()).collect(),
    }
}

/// Deterministic small values in [-1, 1) for a stream's input (an LCG from `seed`).
pub fn signal(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005) ^ 0x9e37_79b9_7f4a_7c15;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// A row mask of `batch` entries from the bits of `bits`.
pub fn mask(bits: u8, batch: usize) -> Vec<bool> {
    (0..batch).map(|r| bits >> r & 1 == 1).collect()
}
