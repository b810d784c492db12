//! The codec's tests: checkpoint names, the candle bug the candle engine avoids, and the
//! native engine against the candle engine and candle's modules.

mod names {
    use super::super::checkpoint::moshi_name;

    #[test]
    fn moshi_names_map_to_candle_names() {
        for (m, c) in [
            (
                "encoder.model.0.conv.conv.weight",
                "encoder.layers.0.conv.weight",
            ),
            (
                "encoder.model.1.block.3.conv.conv.bias",
                "encoder.layers.1.block.3.conv.bias",
            ),
            (
                "decoder.model.2.convtr.convtr.weight",
                "decoder.layers.2.conv.weight",
            ),
            ("downsample.conv.conv.conv.weight", "downsample.conv.weight"),
            (
                "upsample.convtr.convtr.convtr.weight",
                "upsample.conv.weight",
            ),
            (
                "encoder_transformer.transformer.layers.3.linear1.weight",
                "encoder_transformer.layers.3.mlp.fc1.weight",
            ),
            (
                "decoder_transformer.transformer.layers.0.norm2.bias",
                "decoder_transformer.layers.0.post_attention_layernorm.bias",
            ),
            (
                "decoder_transformer.transformer.layers.0.layer_scale_1.scale",
                "decoder_transformer.layers.0.self_attn_layer_scale.scale",
            ),
            (
                "quantizer.rvq_first.input_proj.weight",
                "quantizer.semantic_residual_vector_quantizer.input_proj.weight",
            ),
            (
                "quantizer.rvq_rest.vq.layers.2._codebook.embedding_sum",
                "quantizer.acoustic_residual_vector_quantizer.layers.2.codebook.embed_sum",
            ),
            (
                "quantizer.rvq_rest.vq.layers.2._codebook._initialized",
                "quantizer.acoustic_residual_vector_quantizer.layers.2.codebook.initialized",
            ),
        ] {
            assert_eq!(moshi_name(m), c, "{m}");
        }
    }
}

mod conv_transpose {
    use crate::codec::{Codec, EngineKind};
    use crate::config::CodecConfig;
    use crate::weights::TensorSource;
    use candle::{DType, Device, Module, Tensor};
    use candle_transformers::models::mimi::conv::ConvTrUpsample1d;
    use std::sync::Arc;

    use crate::testutil::max_abs_diff as max_diff;

    /// candle 0.11.1's CPU conv_transpose1d is wrong for batch items after the first, which
    /// is why the candle engine computes transposed convolutions as ordinary convolutions
    /// of their phases. If this test starts failing on a candle upgrade, candle fixed it.
    #[test]
    fn candle_conv_transpose1d_batch_bug_is_still_there() {
        let dev = Device::Cpu;
        let vb = Arc::new(TensorSource::seeded(1, None)).var_builder(DType::F32, &dev);
        let up = ConvTrUpsample1d::new(2, 8, true, true, vb.pp("upsample")).unwrap();
        let x = Tensor::from_vec(crate::testutil::test_input(2, 5, 8, 3), (2, 8, 5), &dev).unwrap();
        let single = up.forward(&x.narrow(0, 1, 1).unwrap()).unwrap();
        let batched = up.forward(&x).unwrap().narrow(0, 1, 1).unwrap();
        assert!(
            max_diff(&batched, &single) > 1e-3,
            "candle's batched conv_transpose1d is fixed"
        );
    }

    /// The candle engine's batched decode gives each item's own audio: its transposed
    /// convolutions do not go through `conv_transpose1d`.
    #[test]
    fn the_candle_engine_decodes_a_batch_as_its_items() {
        let mut cfg = CodecConfig::mimi(2);
        cfg.seanet.n_filters = 4;
        cfg.seanet.dimension = 16;
        cfg.transformer.d_model = 16;
        cfg.transformer.num_heads = 2;
        cfg.transformer.num_layers = 1;
        cfg.transformer.dim_feedforward = 32;
        cfg.quantizer_bins = 16;
        cfg.quantizer_dim = 8;
        let dev = Device::Cpu;
        let c = Codec::seeded_on(&cfg, 3, DType::F32, EngineKind::Candle);
        let codes: Vec<u32> = (0..2 * 2 * 3).map(|i| (i * 7 % 16) as u32).collect();
        let codes = Tensor::from_vec(codes, (2, 2, 3), &dev).unwrap();
        let batched = c.decode(&codes, None).unwrap();
        for i in 0..2 {
            let one = c.decode(&codes.narrow(0, i, 1).unwrap(), None).unwrap();
            let d = max_diff(&batched.narrow(0, i, 1).unwrap(), &one);
            assert!(d < 1e-5, "item {i}: {d}");
        }
    }
}

mod engines {
    use super::super::native::cut::Offline;
    use super::super::native::Native;
    use super::super::{Codec, EngineKind, Rows};
    use crate::config::{CodecConfig, PadMode};
    use crate::testutil::test_input;
    use crate::weights::TensorSource;
    use candle::{DType, Device, Tensor};
    use std::sync::Arc;

    fn small(replicate: bool) -> CodecConfig {
        let mut c = CodecConfig::tiny();
        if replicate {
            c.seanet.pad_mode = PadMode::Replicate;
            c.seanet.true_skip = false;
        }
        c
    }

    fn both(cfg: &CodecConfig) -> (Codec, Codec) {
        let mk = |e| Codec::seeded_on(cfg, 7, DType::F32, e);
        (mk(EngineKind::Native), mk(EngineKind::Candle))
    }

    fn diff(a: &Tensor, b: &Tensor) -> f32 {
        assert_eq!(a.dims(), b.dims());
        crate::testutil::max_abs_diff(a, b)
    }

    /// The native engine and the candle engine compute the same functions: latents, codes and
    /// audio, offline and streaming, batch 2, both pad modes, lengths that are not whole
    /// frames (the candle engine's layers against candle's modules: `candle/tests.rs`).
    #[test]
    fn native_engine_matches_the_candle_engine() {
        for replicate in [false, true] {
            let cfg = small(replicate);
            let (native, candle_) = both(&cfg);
            let dev = Device::Cpu;
            let len = 3 * 1920 + 700;
            let pcm = Tensor::from_vec(test_input(2, len, 1, 3), (2, 1, len), &dev).unwrap();
            let ln = native.encode_latents(&pcm, None).unwrap();
            let lc = candle_.encode_latents(&pcm, None).unwrap();
            assert!(diff(&ln, &lc) < 1e-4, "latents {}", diff(&ln, &lc));
            let codes = candle_.encode(&pcm, None).unwrap();
            let cn = native.encode(&pcm, None).unwrap();
            assert_eq!(
                cn.to_vec3::<u32>().unwrap(),
                codes.to_vec3::<u32>().unwrap()
            );
            let an = native.decode(&codes, None).unwrap();
            let ac = candle_.decode(&codes, None).unwrap();
            assert!(diff(&an, &ac) < 1e-4, "audio {}", diff(&an, &ac));

            // Streaming in uneven chunks: the codes of whole frames, then the same audio.
            let (mut sn, mut sc) = (native.encode_stream(), candle_.encode_stream());
            let (mut outn, mut outc) = (Vec::new(), Vec::new());
            let mut t0 = 0;
            for n in [1, 700, 1919, 2, 3000].iter().cycle() {
                if t0 >= len {
                    break;
                }
                let n = (*n).min(len - t0);
                let x = pcm.narrow(2, t0, n).unwrap();
                outn.extend(native.encode_step(&mut sn, &x).unwrap());
                outc.extend(candle_.encode_step(&mut sc, &x).unwrap());
                t0 += n;
            }
            let jn = Tensor::cat(&outn, 2).unwrap();
            let jc = Tensor::cat(&outc, 2).unwrap();
            assert_eq!(jn.to_vec3::<u32>().unwrap(), jc.to_vec3::<u32>().unwrap());
            assert_eq!(
                jn.to_vec3::<u32>().unwrap(),
                codes.narrow(2, 0, 3).unwrap().to_vec3::<u32>().unwrap()
            );
            let (mut dn, mut dc) = (native.decode_stream(), candle_.decode_stream());
            let (mut yn, mut yc) = (Vec::new(), Vec::new());
            for t in 0..codes.dim(2).unwrap() {
                let c = codes.narrow(2, t, 1).unwrap();
                yn.extend(native.decode_step(&mut dn, &c).unwrap());
                yc.extend(candle_.decode_step(&mut dc, &c).unwrap());
            }
            let yn = Tensor::cat(&yn, 2).unwrap();
            let yc = Tensor::cat(&yc, 2).unwrap();
            assert!(diff(&yn, &yc) < 1e-4, "stream audio {}", diff(&yn, &yc));
            assert!(
                diff(&yn, &an) < 1e-4,
                "stream vs offline {}",
                diff(&yn, &an)
            );

            // Offline calls are streams over chunks: any chunk size gives one pass's result.
            let mut native = native;
            for (ce, cd, block) in [(1, 1, 1), (959, 2, 3), (1920, 3, 250), (5000, 1000, 7)] {
                native.parts.offline = Offline {
                    encode_chunk: ce,
                    decode_chunk: cd,
                    block,
                    segment: 1 << 20,
                };
                let l = native.encode_latents(&pcm, None).unwrap();
                assert!(diff(&l, &ln) < 1e-5, "encode chunk {ce}: {}", diff(&l, &ln));
                let a = native.decode(&codes, None).unwrap();
                assert!(diff(&a, &an) < 1e-5, "decode chunk {cd}: {}", diff(&a, &an));
            }
        }
    }

    /// The SEANets' high-rate layers of several rows, stepped together (each layer's rows
    /// side by side in one product), give each row the bits of its own pass, over steps
    /// that carry state; the filters are wide enough that the products are deeper than one
    /// `gemm` depth block (768 > 512).
    #[test]
    fn seanet_rows_stepped_together_keep_their_own_bits() {
        use crate::conv::Frames;
        use crate::seanet::{Decoder, DecoderState, Encoder, EncoderState};
        let mut cfg = small(false);
        cfg.seanet.n_filters = 32;
        let vb = Arc::new(TensorSource::seeded(5, None)).var_builder(DType::F32, &Device::Cpu);
        let enc = Encoder::load(&cfg.seanet, vb.pp("encoder")).unwrap();
        let dec = Decoder::load(&cfg.seanet, vb.pp("decoder")).unwrap();
        let b = 3;
        let mut es: Vec<EncoderState> = vec![Default::default(); b];
        let mut ds: Vec<DecoderState> = vec![Default::default(); b];
        let (mut es1, mut ds1) = (es.clone(), ds.clone());
        let ch = cfg.seanet.n_filters << (cfg.seanet.ratios.len() - 1);
        for (step, last) in [(0u64, false), (1, false), (2, true)] {
            let seed = |r: usize| 10 * step + r as u64;
            let xs: Vec<Frames> = (0..b)
                .map(|r| Frames::new(1, 1920, test_input(1, 1920, 1, seed(r))))
                .collect();
            let mut sts: Vec<&mut EncoderState> = es.iter_mut().collect();
            let got = enc.high_rate_rows(&mut sts, &xs, last, None).unwrap();
            let ys: Vec<Frames> = (0..b)
                .map(|r| Frames::new(ch, 16, test_input(1, 16, ch, seed(r))))
                .collect();
            let mut sts: Vec<&mut DecoderState> = ds.iter_mut().collect();
            let got_dec = dec.high_rate_rows(&mut sts, &ys, None).unwrap();
            for r in 0..b {
                let want = enc.high_rate(&mut es1[r], &xs[r], last, None).unwrap();
                assert_eq!(got[r], want, "encoder, step {step} row {r}");
                let want = dec.high_rate(&mut ds1[r], &ys[r], None).unwrap();
                assert_eq!(got_dec[r], want, "decoder, step {step} row {r}");
            }
        }
    }

    /// A batched streaming step runs every layer once for all its rows (the high-rate
    /// layers side by side, the frame-rate ones on shared matrix-vector calls): each row's
    /// codes must be those of its own stream, and its audio too, step after step, with rows
    /// of different histories (a row reset, masked steps).
    #[test]
    fn batched_rows_are_their_own_streams() {
        let mut cfg = small(false);
        cfg.seanet.n_filters = 32;
        let dev = Device::Cpu;
        let codec = Codec::seeded_on(&cfg, 5, DType::F32, EngineKind::Native);
        let (b, f) = (3, cfg.frame_size());
        let (mut enc, mut dec) = (codec.encode_stream(), codec.decode_stream());
        let mut alone: Vec<_> = (0..b)
            .map(|_| (codec.encode_stream(), codec.decode_stream()))
            .collect();
        let masks = [
            [true; 3],
            [true, false, true],
            [true; 3],
            [false, true, true],
        ];
        for (step, mask) in masks.iter().enumerate() {
            if step == 2 {
                enc.reset_rows(&[1]).unwrap();
                dec.reset_rows(&[1]).unwrap();
                alone[1] = (codec.encode_stream(), codec.decode_stream());
            }
            let rows = Rows::from_mask(mask);
            let k = rows.count();
            let pcm = Tensor::from_vec(test_input(k, 2 * f, 1, step as u64), (k, 1, 2 * f), &dev)
                .unwrap();
            let codes = codec
                .encode_step_rows(&mut enc, &pcm, &rows)
                .unwrap()
                .unwrap();
            let audio = codec
                .decode_step_rows(&mut dec, &codes, &rows)
                .unwrap()
                .unwrap();
            for (i, &r) in rows.indices().iter().enumerate() {
                let (e, d) = &mut alone[r];
                let one = codec
                    .encode_step(e, &pcm.narrow(0, i, 1).unwrap())
                    .unwrap()
                    .unwrap();
                let got = codes.narrow(0, i, 1).unwrap();
                assert_eq!(got.to_vec3::<u32>().unwrap(), one.to_vec3::<u32>().unwrap());
                let y = codec.decode_step(d, &one).unwrap().unwrap();
                // Bit-exact: the SEANets, the quantizer and the transformer's planned step
                // keep each row's bits, masked or not.
                let d = diff(&audio.narrow(0, i, 1).unwrap(), &y);
                assert_eq!(d, 0.0, "step {step} row {r}: {d}");
            }
        }
    }

    /// The receptive fields behind the offline split: Mimi's SEANet encoder reads 3320
    /// samples back (rounded up to 4 frames of 960), its decoder 8 frames.
    #[test]
    fn seanet_warmup_is_the_receptive_field() {
        let cfg = CodecConfig::mimi(8);
        let small = small(false);
        let vb = Arc::new(TensorSource::seeded(7, None)).var_builder(DType::F32, &Device::Cpu);
        let Native {
            encoder, decoder, ..
        } = Native::load(&small, &vb, Default::default(), None).unwrap();
        assert_eq!(
            (encoder.hop(), decoder.hop()),
            (cfg.seanet.hop_length(), 960)
        );
        assert_eq!((encoder.warmup(), decoder.warmup()), (3840, 8));
    }

    /// Offline calls split along time (segments down to one frame, blocks that cut
    /// segments, both pad modes, batch 2) give the unsplit result: the warm-up covers the
    /// receptive field.
    #[test]
    fn offline_segments_give_the_one_pass_result() {
        for replicate in [false, true] {
            let (mut native, _) = both(&small(replicate));
            let dev = Device::Cpu;
            let len = 23 * 960 + 333;
            let pcm = Tensor::from_vec(test_input(2, len, 1, 5), (2, 1, len), &dev).unwrap();
            native.parts.offline.segment = 1 << 20;
            let l1 = native.encode_latents(&pcm, None).unwrap();
            let codes = native.encode(&pcm, None).unwrap();
            let a1 = native.decode(&codes, None).unwrap();
            for (segment, block) in [(11, 250), (7, 250), (3, 9), (1, 3)] {
                native.parts.offline.segment = segment;
                native.parts.offline.block = block;
                let l = native.encode_latents(&pcm, None).unwrap();
                assert!(diff(&l, &l1) < 1e-5, "{segment}/{block}: {}", diff(&l, &l1));
                let a = native.decode(&codes, None).unwrap();
                assert!(diff(&a, &a1) < 1e-5, "{segment}/{block}: {}", diff(&a, &a1));
            }
        }
    }

    /// Offline results are the same bits on 1, 2 or 3 threads: the cuts depend on the
    /// input only.
    #[test]
    fn offline_results_do_not_depend_on_the_thread_count() {
        let (mut native, _) = both(&small(false));
        native.parts.offline.segment = 5;
        let len = 17 * 960 + 100;
        let pcm = Tensor::from_vec(test_input(2, len, 1, 9), (2, 1, len), &Device::Cpu).unwrap();
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                let codes = native.encode(&pcm, None).unwrap();
                let audio = native.decode(&codes, None).unwrap();
                let latents = native.encode_latents(&pcm, None).unwrap();
                let flat = |t: Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                (codes.to_vec3::<u32>().unwrap(), flat(latents), flat(audio))
            })
        };
        let one = run(1);
        for threads in [2, 3] {
            assert!(run(threads) == one, "{threads} threads");
        }
    }

    /// Half precision runs the candle engine in that dtype, with the quantizer in f32: codes
    /// mostly agree with the f32 native engine's, offline and streaming, and audio comes back
    /// in the codec's dtype. (Bounds on real data: tests/codec/test_half.py.)
    #[test]
    fn half_precision_codec_runs_and_agrees_with_f32() {
        let cfg = small(false);
        let dev = Device::Cpu;
        let len = 3 * 1920 + 700;
        let pcm = Tensor::from_vec(test_input(2, len, 1, 3), (2, 1, len), &dev).unwrap();
        let (native, _) = both(&cfg);
        let reference = native.encode(&pcm, None).unwrap().flatten_all().unwrap();
        let reference = reference.to_vec1::<u32>().unwrap();
        for dtype in [DType::F16, DType::BF16] {
            let half = Codec::seeded_on(&cfg, 7, dtype, EngineKind::Candle);
            assert_eq!(half.info().engine, EngineKind::Candle);
            let pcm = pcm.to_dtype(dtype).unwrap();
            let codes = half.encode(&pcm, None).unwrap();
            let flat = codes.flatten_all().unwrap().to_vec1::<u32>().unwrap();
            let equal = flat.iter().zip(&reference).filter(|(a, b)| a == b).count();
            assert!(
                equal * 10 >= reference.len() * 9,
                "{dtype:?}: {equal}/{}",
                flat.len()
            );
            let audio = half.decode(&codes, None).unwrap();
            assert_eq!(
                (audio.dims(), audio.dtype()),
                (&[2, 1, 4 * 1920][..], dtype)
            );
            let mut s = half.encode_stream();
            let frame = half
                .encode_step(&mut s, &pcm.narrow(2, 0, 1920).unwrap())
                .unwrap();
            let frame = frame.unwrap().to_vec3::<u32>().unwrap();
            assert_eq!(
                frame,
                codes.narrow(2, 0, 1).unwrap().to_vec3::<u32>().unwrap()
            );
        }
    }
}

/// The calls on host arrays refuse bad input with the typed error the Python package raises,
/// before anything runs or any state changes.
mod host_calls {
    use crate::codec::{Codec, EncodeStep, OpenOptions, Rows};
    use crate::config::CodecConfig;
    use crate::error::Error;
    use crate::host::HostArray;
    use candle::{DType, Tensor};

    fn tiny() -> Codec {
        let options = OpenOptions {
            config: Some(CodecConfig::tiny()),
            ..Default::default()
        };
        Codec::seeded(1, &options).unwrap()
    }

    #[test]
    fn bad_inputs_get_typed_errors_and_change_nothing() {
        let c = tiny();
        let f = c.config().frame_size();
        let pcm = |shape: Vec<usize>| HostArray::new(vec![0.01; shape.iter().product()], shape);
        let shape_err = c.encode_host(pcm(vec![1, 2, f]), None, None);
        assert!(matches!(shape_err, Err(Error::Shape(_))));
        let mut nan = pcm(vec![2, 1, f]);
        nan.data[f + 3] = f32::NAN;
        assert!(matches!(
            c.encode_host(nan.clone(), None, None),
            Err(Error::InvalidInput(_))
        ));
        let short = HostArray {
            data: vec![0.0; 3],
            shape: vec![1, 1, 4],
        };
        assert!(matches!(
            c.encode_host(short, None, None),
            Err(Error::Shape(_))
        ));
        // A masked step reads only its active rows: row 1's NaN is not looked at.
        let mut s = c.encode_stream();
        let step = |active: Option<Rows>, last| EncodeStep { active, last };
        let masked = step(Some(Rows::from_mask(&[true, false])), false);
        assert!(c.encode_step_host(&mut s, nan.clone(), masked).is_ok());
        assert_eq!(s.counts(), &[f as u64, 0]);
        // last with a mask, or NaN in a stepping row: refused, the stream unchanged.
        let both = step(Some(Rows::from_mask(&[true, true])), true);
        let refused = c.encode_step_host(&mut s, pcm(vec![2, 1, f]), both);
        assert!(matches!(refused, Err(Error::InvalidInput(_))));
        let refused = c.encode_step_host(&mut s, nan, step(None, false));
        assert!(matches!(refused, Err(Error::InvalidInput(_))));
        assert_eq!(s.counts(), &[f as u64, 0]);
        // Codes: in [0, bins), their shape (batch, num_codebooks, frames).
        let (k, bins) = (c.config().quantizer_n_q, c.config().quantizer_bins as u32);
        let codes = |v: u32| HostArray::new(vec![v; k * 2], vec![1, k, 2]);
        assert_eq!(
            c.decode_host(codes(bins - 1), None, None).unwrap().shape,
            [1, 1, 2 * f]
        );
        let out_of_range = c.decode_host(codes(bins), None, None);
        assert!(matches!(out_of_range, Err(Error::InvalidInput(m)) if m.contains("out of range")));
        let wrong = HostArray::new(vec![0; k], vec![1, 1, k]);
        assert!(matches!(
            c.decode_host(wrong, None, None),
            Err(Error::Shape(_))
        ));
        // A state copy between codecs of other configs is refused.
        let mut other = CodecConfig::tiny();
        other.quantizer_n_q = 2;
        let options = OpenOptions {
            config: Some(other),
            ..Default::default()
        };
        let other = Codec::seeded(1, &options).unwrap();
        assert!(c.info().check_state_source(&tiny().info()).is_ok());
        assert!(matches!(
            c.info().check_state_source(&other.info()),
            Err(Error::IncompatibleState(_))
        ));
    }

    #[test]
    fn empty_inputs_give_empty_outputs_of_each_calls_channels() {
        let c = tiny();
        let (k, dim) = (c.config().quantizer_n_q, c.config().seanet.dimension);
        let pcm = HostArray::new(vec![], vec![2, 1, 0]);
        let codes = c.encode_host(pcm.clone(), Some(&[0, 0]), None).unwrap();
        assert_eq!((codes.shape, codes.data.len()), (vec![2, k, 0], 0));
        let latents = c.encode_latents_host(pcm, None, None).unwrap();
        assert_eq!((latents.shape, latents.data.len()), (vec![2, dim, 0], 0));
        let codes = HostArray::new(vec![], vec![2, k, 0]);
        let audio = c.decode_host(codes.clone(), None, None).unwrap();
        assert_eq!((audio.shape, audio.data.len()), (vec![2, 1, 0], 0));
        // The quantizer's own answer on no frames is the same empty array.
        let direct = c.decode_latents(&Tensor::zeros((2, k, 0), DType::U32, c.device()).unwrap());
        let direct = direct.unwrap();
        let latents = c.decode_latents_host(codes, Some(&[0, 0])).unwrap();
        assert_eq!(latents.shape, direct.dims());
        assert_eq!((latents.shape, latents.data.len()), (vec![2, dim, 0], 0));
        // A masked step of no samples on several active rows: no codes, no audio, the
        // streams unchanged (each row's frames come apart from one empty array).
        let mut s = c.encode_stream();
        let active = Some(Rows::from_mask(&[true, false, true]));
        let step = EncodeStep {
            active: active.clone(),
            last: false,
        };
        let none = c.encode_step_host(&mut s, HostArray::new(vec![], vec![3, 1, 0]), step);
        assert!(matches!(none, Ok(None)), "{none:?}");
        assert_eq!(s.counts(), &[0, 0, 0]);
        let mut d = c.decode_stream();
        let none = c.decode_step_host(&mut d, HostArray::new(vec![], vec![3, k, 0]), active);
        assert!(matches!(none, Ok(None)), "{none:?}");
    }

    /// An input with no values but an enormous batch (a numpy array of shape
    /// `(2**31, k, 0)` costs nothing) is refused by its shape, before any work per row: the
    /// fuzzer found that it passed every size rule (it holds 0 values) and then a list of
    /// its 2^31 rows was allocated (16 GiB), which aborted the process.
    #[test]
    fn an_empty_input_of_an_enormous_batch_is_refused_before_any_work_per_row() {
        let c = tiny();
        let k = c.config().quantizer_n_q;
        let huge = 1usize << 31;
        let pcm = || HostArray::new(vec![], vec![huge, 1, 0]);
        let codes = || HostArray::new(vec![], vec![huge, k, 0]);
        let shape_error = |r: Result<(), Error>, what: &str| match r {
            Err(Error::Shape(m)) => assert!(m.contains("batch"), "{what}: {m}"),
            other => panic!("{what}: {other:?}"),
        };
        shape_error(c.encode_host(pcm(), None, None).map(drop), "encode");
        shape_error(
            c.encode_latents_host(pcm(), None, None).map(drop),
            "latents",
        );
        shape_error(c.decode_host(codes(), None, None).map(drop), "decode");
        shape_error(
            c.decode_latents_host(codes(), None).map(drop),
            "decode_latents",
        );
        let mut s = c.encode_stream();
        shape_error(
            c.encode_step_host(&mut s, pcm(), EncodeStep::default())
                .map(drop),
            "step",
        );
        assert_eq!(s.batch(), None, "a refused step starts no stream");
        let mut d = c.decode_stream();
        shape_error(
            c.decode_step_host(&mut d, codes(), None).map(drop),
            "decode_step",
        );
        assert_eq!(d.batch(), None, "a refused step starts no stream");
    }
}

/// The streaming steps' stages on the engines' own activations.
mod steps {
    use super::super::activations::Activations;
    use super::super::transform::transform_step;
    use crate::codec::{Codec, EncodeStep, EngineKind, Rows};
    use crate::config::CodecConfig;
    use crate::host::HostArray;
    use crate::testutil::test_input;
    use crate::transformer::{State, Workspace};
    use candle::{DType, Device, Tensor};

    fn tiny(engine: EngineKind) -> Codec {
        let cfg = CodecConfig::tiny();
        Codec::seeded_on(&cfg, 4, DType::F32, engine)
    }

    /// The native engine's frames through the transformer's host entry point give the bits
    /// of its tensor entry point, masked or not, over several steps of a stream.
    #[test]
    fn the_transformer_on_frames_gives_the_bits_of_its_tensor_entry() {
        let codec = tiny(EngineKind::Native);
        let model = &codec.parts.enc_tr;
        assert!(model.takes_host_step());
        let d = codec.config().seanet.dimension;
        let (mut on_frames, mut on_tensor) = (State::default(), State::default());
        let mut ws = Workspace::new();
        let masks = [[true; 3], [true, false, true], [false, true, false]];
        for (step, mask) in masks.iter().enumerate() {
            let rows = Rows::from_mask(mask);
            let (k, t) = (rows.count(), step + 1);
            let x = Tensor::from_vec(test_input(k, d, t, step as u64), (k, d, t), &Device::Cpu)
                .unwrap();
            let frames = Activations::Frames(super::super::bridge::to_frames(&x).unwrap());
            let a =
                transform_step(model, (&mut on_frames, &mut ws), frames, (&rows, None)).unwrap();
            assert!(matches!(a, Activations::Frames(_)));
            let a = a.into_tensor(&Device::Cpu).unwrap();
            let b = transform_step(
                model,
                (&mut on_tensor, &mut ws),
                Activations::Tensor(x),
                (&rows, None),
            )
            .unwrap()
            .expect_tensor()
            .unwrap();
            let (a, b) = (a.flatten_all().unwrap(), b.flatten_all().unwrap());
            assert_eq!(
                a.to_vec1::<f32>().unwrap(),
                b.to_vec1::<f32>().unwrap(),
                "step {step}"
            );
        }
    }

    /// On either engine, the host calls (activations made from host values, no tensor on
    /// the native engine) give the bits of the tensor calls: masked steps, a last chunk,
    /// and the decoder over the codes.
    #[test]
    fn host_steps_give_the_bits_of_tensor_steps() {
        for engine in [EngineKind::Native, EngineKind::Candle] {
            let c = tiny(engine);
            let (f, dev) = (c.config().frame_size(), Device::Cpu);
            let (mut hs, mut ts) = (c.encode_stream(), c.encode_stream());
            let (mut hd, mut td) = (c.decode_stream(), c.decode_stream());
            let masks: [Option<[bool; 2]>; 3] = [None, Some([false, true]), None];
            for (step, mask) in masks.iter().enumerate() {
                let rows = mask.map_or(Rows::all(2), |m| Rows::from_mask(&m));
                let n = 2 * f;
                let data = test_input(2, n, 1, 10 + step as u64);
                let active = mask.map(|m| Rows::from_mask(&m));
                let step_of = EncodeStep {
                    active: active.clone(),
                    last: false,
                };
                let host = HostArray::new(data.clone(), vec![2, 1, n]);
                let got = c.encode_step_host(&mut hs, host, step_of).unwrap().unwrap();
                let k = rows.count();
                let x = Tensor::from_vec(rows.select(&data, n), (k, 1, n), &dev).unwrap();
                let want = c.encode_step_rows(&mut ts, &x, &rows).unwrap().unwrap();
                let want_codes = want.flatten_all().unwrap().to_vec1::<u32>().unwrap();
                let per_row = want_codes.len() / k;
                assert_eq!(
                    got.data,
                    rows.scatter(want_codes, per_row),
                    "{engine:?} {step}"
                );
                let codes = HostArray::new(rows.select(&got.data, per_row), want.dims().to_vec());
                let audio = c.decode_step_host(&mut hd, got, active).unwrap().unwrap();
                let want = c.decode_step_rows(&mut td, &want, &rows).unwrap().unwrap();
                let want = want.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                assert_eq!(
                    rows.select(&audio.data, want.len() / k),
                    want,
                    "{engine:?} {step}"
                );
                assert_eq!(codes.shape[0], k);
            }
            let data = test_input(2, f / 2, 1, 99);
            let last = EncodeStep {
                active: None,
                last: true,
            };
            let host = HostArray::new(data.clone(), vec![2, 1, f / 2]);
            let got = c.encode_step_host(&mut hs, host, last).unwrap().unwrap();
            let x = Tensor::from_vec(data, (2, 1, f / 2), &dev).unwrap();
            let want = c.encode_last(&mut ts, &x).unwrap().unwrap();
            assert_eq!(
                got.data,
                want.flatten_all().unwrap().to_vec1::<u32>().unwrap()
            );
        }
    }

    /// The tensor calls refuse inputs whose rows do not match the step's and codes that are
    /// not integers, before anything changes; integer codes of any width decode alike.
    #[test]
    fn tensor_steps_check_rows_and_code_dtypes() {
        use crate::error::Error;
        for engine in [EngineKind::Native, EngineKind::Candle] {
            let c = tiny(engine);
            let (f, dev) = (c.config().frame_size(), Device::Cpu);
            let one = Rows::from_mask(&[false, true]);
            let mut enc = c.encode_stream();
            let pcm = Tensor::from_vec(test_input(2, f, 1, 3), (2, 1, f), &dev).unwrap();
            let err = c.encode_step_rows(&mut enc, &pcm, &one).unwrap_err();
            assert!(matches!(err, Error::Shape(_)), "{engine:?}: {err}");
            let codes = c.encode_step(&mut enc, &pcm).unwrap().unwrap();
            let (mut a, mut b) = (c.decode_stream(), c.decode_stream());
            let err = c.decode_step_rows(&mut a, &codes, &one).unwrap_err();
            assert!(matches!(err, Error::Shape(_)), "{engine:?}: {err}");
            let floats = codes.to_dtype(DType::F32).unwrap();
            let err = c.decode_step(&mut a, &floats).unwrap_err();
            assert!(matches!(err, Error::DType(_)), "{engine:?}: {err}");
            let want = c.decode_step(&mut a, &codes).unwrap().unwrap();
            let wide = codes.to_dtype(DType::I64).unwrap();
            let got = c.decode_step(&mut b, &wide).unwrap().unwrap();
            let bits = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(bits(&got), bits(&want), "{engine:?}");
        }
    }
}
