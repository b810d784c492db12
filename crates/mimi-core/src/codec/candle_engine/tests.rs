//! The candle engine's tests: its layers against candle-transformers' modules, and its
//! per-row streams (masked steps, a row reset at a partial frame, `last`) against the native
//! engine in f32 and against rows streamed alone in half precision.

use super::layers::LayerState;
use super::seanet::States;
use super::step_rows::StepRows;
use super::Candle;
use crate::codec::{Codec, EncodeStep, EngineKind, Rows};
use crate::config::{CodecConfig, PadMode};
use crate::host::HostArray;
use crate::testutil::{max_abs_diff, test_input};
use crate::weights::TensorSource;
use candle::{DType, Device, Module, Tensor};
use candle_transformers::models::mimi::{conv, seanet};
use std::sync::Arc;

const FRAME: usize = 1920;

fn small(replicate: bool) -> CodecConfig {
    let mut c = CodecConfig::tiny();
    if replicate {
        c.seanet.pad_mode = PadMode::Replicate;
        c.seanet.true_skip = false;
    }
    c
}

fn codec(cfg: &CodecConfig, dtype: DType, engine: EngineKind) -> Codec {
    Codec::seeded_on(cfg, 7, dtype, engine)
}

/// The engine's SEANets and down/upsampling compute candle-transformers' offline functions
/// (batch 2 where candle's result is right, both pad modes, lengths not whole frames).
#[test]
fn layers_compute_candle_transformers_modules() {
    for replicate in [false, true] {
        let cfg = small(replicate);
        let dev = Device::Cpu;
        let vb = Arc::new(TensorSource::seeded(7, None)).var_builder(DType::F32, &dev);
        let ours = Candle::load(&cfg, &vb).unwrap();
        let ccfg = cfg.seanet.to_candle();
        let enc = seanet::SeaNetEncoder::new(&ccfg, vb.pp("encoder")).unwrap();
        let dec = seanet::SeaNetDecoder::new(&ccfg, vb.pp("decoder")).unwrap();
        let (dim, stride) = (cfg.seanet.dimension, cfg.downsample_stride());
        let down = conv::ConvDownsample1d::new(stride, dim, true, true, vb.pp("downsample"));
        let up = conv::ConvTrUpsample1d::new(stride, dim, true, true, vb.pp("upsample"));
        let (down, up) = (down.unwrap(), up.unwrap());
        let len = 2 * FRAME + 777;
        let pcm = Tensor::from_vec(test_input(2, len, 1, 3), (2, 1, len), &dev).unwrap();
        let all = StepRows::new(&Rows::all(2), &dev).unwrap();
        let latent = ours
            .encoder
            .step(&mut States::new(), &all, &pcm, true, None)
            .unwrap();
        let d = max_abs_diff(&latent, &enc.forward(&pcm).unwrap());
        assert!(d < 1e-4, "encoder {d}");
        let z = ours
            .downsample
            .step(&mut LayerState::default(), &all, &latent, true)
            .unwrap();
        let d = max_abs_diff(&z, &down.forward(&latent).unwrap());
        assert!(d < 1e-4, "downsample {d}");
        let one = StepRows::new(&Rows::all(1), &dev).unwrap();
        let z1 = z.narrow(0, 1, 1).unwrap();
        let u = ours.upsample.step(&mut LayerState::default(), &one, &z1);
        let d = max_abs_diff(&u.unwrap(), &up.forward(&z1).unwrap());
        assert!(d < 1e-5, "upsample {d}");
        let x = latent.narrow(0, 1, 1).unwrap();
        let audio = ours.decoder.step(&mut States::new(), &one, &x, None);
        let d = max_abs_diff(&audio.unwrap(), &dec.forward(&x).unwrap());
        assert!(d < 1e-4, "decoder {d}");
    }
}

/// Every convolution kernel is contiguous (candle's CUDA convolutions compute wrong results
/// for non-contiguous kernels), weight-norm pairs and transposed phases included.
#[test]
fn every_kernel_is_contiguous() {
    let cfg = small(true);
    let vb = Arc::new(TensorSource::seeded(7, None)).var_builder(DType::F16, &Device::Cpu);
    let c = Candle::load(&cfg, &vb).unwrap();
    let mut kernels = c.encoder.kernels();
    kernels.extend(c.decoder.kernels());
    kernels.push(c.downsample.kernel());
    assert!(kernels.len() > 30, "{} kernels", kernels.len());
    for (i, k) in kernels.iter().enumerate() {
        assert!(k.is_contiguous(), "kernel {i} {:?}", k.shape());
    }
}

/// A step's output per row (`None` for inactive rows).
type Steps = Vec<Vec<Option<Vec<u32>>>>;

/// Three rows' steps: samples, the rows that step. Row 1 is reset after the first step (at a
/// partial frame), so every later step takes whole frames.
const PLAN: [(usize, [bool; 3]); 6] = [
    (700, [true; 3]),
    (FRAME, [true, false, true]),
    (FRAME, [false, true, false]),
    (2 * FRAME, [true; 3]),
    (FRAME, [false, false, true]),
    (FRAME, [true, true, false]),
];

/// [`PLAN`] on `c`: each step's codes per row. Row `r` reads its next samples of `audio[r]`
/// whenever it steps.
fn masked_encode(c: &Codec, audio: &[Vec<f32>]) -> Steps {
    let mut s = c.encode_stream();
    let mut pos = [0usize; 3];
    let mut out = Vec::new();
    for (i, (n, mask)) in PLAN.into_iter().enumerate() {
        if i == 1 {
            s.reset_rows(&[1]).unwrap();
            pos[1] = 0;
        }
        let mut x = vec![0f32; 3 * n];
        for r in (0..3).filter(|&r| mask[r]) {
            x[r * n..(r + 1) * n].copy_from_slice(&audio[r][pos[r]..pos[r] + n]);
            pos[r] += n;
        }
        let active = (i > 0).then(|| Rows::from_mask(&mask));
        let step = EncodeStep {
            active,
            last: false,
        };
        let codes = c.encode_step_host(&mut s, HostArray::new(x, vec![3, 1, n]), step);
        let codes = codes.unwrap();
        let per = codes.as_ref().map_or(0, |c| c.data.len() / 3);
        out.push(
            (0..3)
                .map(|r| match (&codes, mask[r]) {
                    (Some(c), true) => Some(c.data[r * per..(r + 1) * per].to_vec()),
                    _ => None,
                })
                .collect(),
        );
    }
    out
}

/// Row `r`'s chunks of [`PLAN`] streamed alone (row 1 from its reset on).
fn alone(c: &Codec, audio: &[f32], r: usize) -> Vec<u32> {
    let mut s = c.encode_stream();
    let (mut pos, mut out) = (0, Vec::new());
    for (i, (n, mask)) in PLAN.into_iter().enumerate() {
        if !mask[r] || (r == 1 && i == 0) {
            continue;
        }
        let x = HostArray::new(audio[pos..pos + n].to_vec(), vec![1, 1, n]);
        pos += n;
        out.extend(
            c.encode_step_host(&mut s, x, EncodeStep::default())
                .unwrap()
                .map_or(vec![], |c| c.data),
        );
    }
    out
}

fn audio3(len: usize) -> Vec<Vec<f32>> {
    (0..3)
        .map(|r| test_input(1, len, 1, 10 + r as u64))
        .collect()
}

/// In f32, the candle engine's masked steps and row resets give the native engine's codes,
/// and its masked decode steps (with a row reset) the native engine's audio.
#[test]
fn per_row_streams_match_the_native_engine() {
    for replicate in [false, true] {
        let cfg = small(replicate);
        let (native, ours) = (
            codec(&cfg, DType::F32, EngineKind::Native),
            codec(&cfg, DType::F32, EngineKind::Candle),
        );
        let audio = audio3(8 * FRAME);
        let steps = masked_encode(&ours, &audio);
        assert_eq!(steps.iter().flatten().flatten().count(), 9);
        assert_eq!(steps, masked_encode(&native, &audio));
        let (mut sn, mut so) = (native.decode_stream(), ours.decode_stream());
        for (t, mask) in [[true; 2], [true, false], [false, true], [true; 2]]
            .iter()
            .enumerate()
        {
            if t == 2 {
                sn.reset_rows(&[0]).unwrap();
                so.reset_rows(&[0]).unwrap();
            }
            let codes: Vec<u32> = (0..2 * 4).map(|i| ((i * 5 + t * 3) % 64) as u32).collect();
            let step = |c: &Codec, s| {
                let x = HostArray::new(codes.clone(), vec![2, 4, 1]);
                let a = c.decode_step_host(s, x, Some(Rows::from_mask(mask)));
                a.unwrap().unwrap().data
            };
            let (an, ao) = (step(&native, &mut sn), step(&ours, &mut so));
            let d = crate::testutil::max_abs_diff_slices(&an, &ao);
            assert!(d < 1e-4, "decode step {t}: {d}");
        }
    }
}

/// In half precision, masked batched rows (with a reset of one at a partial frame) give the
/// codes of each row streamed alone (at least 99.5% of them), and a stream ended with `last`
/// gives `encode`'s codes.
#[test]
fn half_precision_rows_stream_as_independent_streams() {
    let cfg = small(false);
    for dtype in [DType::F16, DType::BF16] {
        let c = codec(&cfg, dtype, EngineKind::Candle);
        let audio = audio3(8 * FRAME);
        let steps = masked_encode(&c, &audio);
        for (r, row) in audio.iter().enumerate() {
            let batched: Vec<u32> = steps
                .iter()
                .filter_map(|s| s[r].clone())
                .flatten()
                .collect();
            let own = alone(&c, row, r);
            assert_eq!(batched.len(), own.len(), "{dtype:?} row {r}");
            let equal = batched.iter().zip(&own).filter(|(a, b)| a == b).count();
            assert!(
                equal * 1000 >= own.len() * 995,
                "{dtype:?} row {r}: {equal}/{}",
                own.len()
            );
        }
        let len = 3 * FRAME + 1234;
        let pcm = Tensor::from_vec(test_input(2, len, 1, 4), (2, 1, len), &Device::Cpu).unwrap();
        let pcm = pcm.to_dtype(dtype).unwrap();
        let mut s = c.encode_stream();
        let mut parts = c
            .encode_step(&mut s, &pcm.narrow(2, 0, 5000).unwrap())
            .unwrap();
        let tail = pcm.narrow(2, 5000, len - 5000).unwrap();
        let end = c.encode_last(&mut s, &tail).unwrap();
        let parts: Vec<Tensor> = parts.take().into_iter().chain(end).collect();
        let streamed = Tensor::cat(&parts, 2).unwrap().flatten_all().unwrap();
        let offline = c.encode(&pcm, None).unwrap().flatten_all().unwrap();
        let (a, b) = (
            streamed.to_vec1::<u32>().unwrap(),
            offline.to_vec1::<u32>().unwrap(),
        );
        assert_eq!(a.len(), b.len());
        let equal = a.iter().zip(&b).filter(|(x, y)| x == y).count();
        assert!(
            equal * 1000 >= b.len() * 995,
            "{dtype:?} last: {equal}/{}",
            b.len()
        );
    }
}
