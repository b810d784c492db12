//! The convolutions against candle's modules (`StreamableConv1d`,
//! `StreamableConvTranspose1d`, `ConvTrUpsample1d`), offline and in streaming chunks, and
//! the padded gather and the ELU against their definitions.

use crate::rows::RowList;
use candle::{DType, Device, Module, Result, StreamingModule, Tensor};
use candle_nn::{VarBuilder, VarMap};
use candle_transformers::models::mimi::conv as cconv;

use super::activation::copy_act;
use super::frames::{Frames, Padded};
use super::{Conv1d, ConvSpec, ConvState, ConvTr1d};
use crate::config::PadMode;

use crate::testutil::max_abs_diff_slices as max_diff;

fn frames_of(t: &Tensor) -> Frames {
    let (_, c, l) = t.dims3().unwrap();
    Frames::new(c, l, t.flatten_all().unwrap().to_vec1().unwrap())
}

fn random_vb(seed: u64) -> (VarMap, VarBuilder<'static>) {
    let vm = VarMap::new();
    let _ = seed;
    let vb = VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu);
    (vm, vb)
}

#[test]
fn gather_matches_naive_indexing() {
    let x = Frames::new(2, 7, (0..14).map(|v| v as f32 + 1.0).collect());
    for (left, right) in [(0, 0), (3, 0), (0, 4), (5, 6)] {
        let p = Padded {
            x: &x,
            left,
            right,
            lval: Some(vec![-1.0, -2.0]),
            rval: Some(vec![-3.0, -4.0]),
        };
        for start in 0..p.len() {
            for step in 1..5 {
                for m in 0..=(p.len() - start).div_ceil(step) {
                    if m > 0 && start + (m - 1) * step >= p.len() {
                        continue;
                    }
                    let mut got = vec![0f32; m];
                    p.gather(1, start, step, &mut got);
                    let want: Vec<f32> = (0..m)
                        .map(|i| {
                            let q = start + i * step;
                            if q < left {
                                -2.0
                            } else if q < left + 7 {
                                x.row(1)[q - left]
                            } else {
                                -4.0
                            }
                        })
                        .collect();
                    assert_eq!(got, want, "{left} {right} {start} {step} {m}");
                }
            }
        }
    }
}

#[test]
fn elu_matches_exp() {
    for i in -20000..=2000 {
        let x = i as f32 * 0.005;
        let mut y = [0f32];
        copy_act(&[x], &mut y, Some(1.0));
        let want = if x > 0.0 {
            x
        } else {
            (x as f64).exp_m1() as f32
        };
        assert!((y[0] - want).abs() <= 2e-7, "x={x}: {} vs {want}", y[0]);
    }
    let mut y = [0f32; 2];
    copy_act(&[-1e30, f32::MIN], &mut y, Some(0.5));
    assert_eq!(y, [-0.5, -0.5]);
}

/// Our convolution against candle's `StreamableConv1d`, offline and in streaming chunks.
#[test]
fn conv1d_matches_candle() -> Result<()> {
    let cases = [
        // cin, cout, k, stride, dilation, len, replicate
        (3, 5, 7, 1, 1, 50, false),
        (8, 16, 3, 1, 2, 300, false),
        (16, 8, 8, 4, 1, 301, false),
        (8, 8, 4, 2, 1, 37, true),
        (40, 24, 10, 5, 1, 2000, false),
        // Phase-split (cin * stride >= 32): a kernel that is not a multiple of the
        // stride (zero taps), replicate padding, and few frames (matrix-vector path).
        (16, 12, 7, 3, 1, 400, true),
        (32, 8, 8, 4, 1, 19, false),
        (4, 6, 1, 1, 1, 9, false),
        // Few output frames with padding: the matrix-vector path's strided gather.
        (6, 4, 5, 2, 1, 5, true),
        (6, 4, 3, 1, 2, 3, false),
    ];
    for ((cin, cout, k, s, d, len, rep), packed) in
        cases.into_iter().flat_map(|c| [(c, false), (c, true)])
    {
        let (_vm, vb) = random_vb(0);
        let pad = if rep {
            cconv::PadMode::Replicate
        } else {
            cconv::PadMode::Constant
        };
        let theirs =
            cconv::StreamableConv1d::new(cin, cout, k, s, d, 1, true, true, None, pad, vb.clone())?;
        let mut ours = Conv1d::load(
            vb,
            ConvSpec::new(cin, cout, k)
                .stride(s)
                .dilation(d)
                .pad(if rep {
                    PadMode::Replicate
                } else {
                    PadMode::Constant
                }),
        )?;
        if packed {
            ours.force_pack();
        }
        let x = Tensor::randn(0f32, 1., (1, cin, len), &Device::Cpu)?;
        let want = theirs.forward(&x)?;
        let got = ours.forward(&frames_of(&x), None, None);
        assert_eq!(got.len, want.dim(2)?, "case {cin} {cout} {k} {s} {d} {len}");
        let dd = max_diff(&got.data, &frames_of(&want).data);
        assert!(
            dd < 1e-4,
            "offline {dd}: case {cin} {cout} {k} {s} {d} {len} {rep} packed {packed}"
        );
        // Streaming, uneven chunks, against candle's streaming.
        let mut theirs = theirs;
        let mut st = ConvState::default();
        let mut t0 = 0;
        let mut chunk = 1;
        while t0 < len {
            let n = chunk.min(len - t0);
            let xc = x.narrow(2, t0, n)?;
            let want = theirs.step(&xc.clone().into())?;
            let got = ours.step(&mut st, &frames_of(&xc), None, None, false);
            match want.as_option() {
                Some(w) if w.dim(2)? > 0 => {
                    assert_eq!(got.len, w.dim(2)?);
                    let dd = max_diff(&got.data, &frames_of(w).data);
                    assert!(dd < 1e-4, "step {dd}");
                }
                _ => assert_eq!(got.len, 0),
            }
            t0 += n;
            chunk = chunk * 3 % 97 + 1;
        }
    }
    Ok(())
}

#[test]
fn conv_tr1d_matches_candle() -> Result<()> {
    for (cin, cout, k, s, len, packed) in [
        (6, 4, 8, 4, 9),
        (16, 8, 16, 8, 40),
        (5, 3, 3, 2, 3),
        (32, 16, 4, 2, 700),
    ]
    .into_iter()
    .flat_map(|c| [(c, false), (c, true)])
    .map(|((cin, cout, k, s, len), p)| (cin, cout, k, s, len, p))
    {
        let (_vm, vb) = random_vb(0);
        let theirs = cconv::StreamableConvTranspose1d::new(
            cin,
            cout,
            k,
            s,
            1,
            true,
            true,
            None,
            vb.clone(),
        )?;
        let mut ours = ConvTr1d::load(vb, ConvSpec::new(cin, cout, k).stride(s))?;
        if packed {
            ours.force_pack();
        }
        let x = Tensor::randn(0f32, 1., (1, cin, len), &Device::Cpu)?;
        let want = theirs.forward(&x)?;
        let got = ours.forward(&frames_of(&x), None);
        assert_eq!(got.len, want.dim(2)?);
        let dd = max_diff(&got.data, &frames_of(&want).data);
        assert!(dd < 1e-4, "offline {dd}");
        let mut st = ConvState::default();
        let mut outs = Vec::new();
        for t0 in (0..len).step_by(3) {
            let n = 3.min(len - t0);
            outs.push(ours.step(&mut st, &frames_of(&x.narrow(2, t0, n)?), None));
        }
        let mut joined = vec![Vec::new(); cout];
        for o in &outs {
            for (c, j) in joined.iter_mut().enumerate() {
                j.extend_from_slice(o.row(c));
            }
        }
        let dd = max_diff(&joined.concat(), &got.data);
        assert!(dd < 1e-5, "stream {dd}");
    }
    Ok(())
}

#[test]
fn depthwise_upsample_matches_candle() -> Result<()> {
    let (_vm, vb) = random_vb(0);
    let theirs = cconv::ConvTrUpsample1d::new(2, 12, true, true, vb.clone())?;
    let ours = ConvTr1d::load_depthwise(vb, 12, 2)?;
    let x = Tensor::randn(0f32, 1., (1, 12, 11), &Device::Cpu)?;
    let want = theirs.forward(&x)?;
    let got = ours.forward(&frames_of(&x), None);
    let dd = max_diff(&got.data, &frames_of(&want).data);
    assert!(dd < 1e-5, "{dd}");
    Ok(())
}

/// Weights N(0, 0.2) for `conv.weight` of `shape` and `conv.bias` of `bias`.
fn randn_vb(shape: (usize, usize, usize), bias: usize) -> Result<(VarMap, VarBuilder<'static>)> {
    let vm = VarMap::new();
    let vb = VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu);
    let init = candle_nn::Init::Randn {
        mean: 0.,
        stdev: 0.2,
    };
    vb.pp("conv").get_with_hints(shape, "weight", init)?;
    vb.pp("conv").get_with_hints(bias, "bias", init)?;
    Ok((vm, vb))
}

/// Several rows stepped together share the matrix-vector kernel's calls: each row must get
/// the bits of its own step (rows of different lengths, over chunks, f32 and bf16 weights,
/// row-major or packed).
#[test]
fn rows_stepped_together_match_their_own_steps() -> Result<()> {
    let (cin, cout, k, s) = (16, 24, 4, 2);
    let modes = [
        (false, false, false),
        (true, false, false),
        (false, true, false),
        (true, true, false),
        (false, false, true),
    ];
    for (bf16, packed, pairs) in modes {
        let (_vm, vb) = randn_vb((cout, cin, k), cout)?;
        let mut conv = Conv1d::load(vb, ConvSpec::new(cin, cout, k).stride(s))?;
        let (_vm, vb) = randn_vb((cin, cout, k), cout)?;
        let mut tr = ConvTr1d::load(vb, ConvSpec::new(cin, cout, k).stride(s))?;
        if pairs {
            conv.pair_pack();
            tr.pair_pack();
        }
        if bf16 {
            conv.force_bf16();
            tr.force_bf16();
        }
        if packed {
            conv.force_pack();
            tr.force_pack();
        }
        let rows = 5;
        let (mut together, mut alone) = (
            vec![ConvState::default(); rows],
            vec![ConvState::default(); rows],
        );
        let (mut tr_together, mut tr_alone) = (together.clone(), alone.clone());
        for (chunk, last) in [(0, false), (1, false), (2, false), (3, false), (4, true)] {
            let xs: Vec<Frames> = (0..rows)
                .map(|r| {
                    // Chunks 1-3 hold more frames than the matrix-vector kernel takes.
                    let len = match chunk {
                        1..=3 => 20 + 3 * r,
                        _ => (r + chunk) % 4 * 2 + 1,
                    };
                    let x = Tensor::randn(0f32, 1., (1, cin, len), &Device::Cpu).unwrap();
                    frames_of(&x)
                })
                .collect();
            // Chunks 1 and 2 as one group of rows (`as_group`): rows one by one, then side by
            // side on one thread, as weights too large to stay in cache run.
            let group = |f: &mut dyn FnMut()| match chunk {
                0 | 3 | 4 => f(),
                _ => {
                    let limit = [usize::MAX, 0][chunk - 1];
                    let old = super::tiles::test_hooks::CACHED_LIMIT.replace(limit);
                    super::as_group(f);
                    super::tiles::test_hooks::CACHED_LIMIT.set(old);
                }
            };
            let (mut got, mut got_tr) = (RowList::new(), RowList::new());
            group(&mut || {
                let mut sts: Vec<&mut ConvState> = together.iter_mut().collect();
                got = conv.step_rows(&mut sts, &xs, Some(1.0), last);
                let mut sts: Vec<&mut ConvState> = tr_together.iter_mut().collect();
                got_tr = tr.step_rows(&mut sts, &xs, Some(1.0));
            });
            for r in 0..rows {
                let want = conv.step(&mut alone[r], &xs[r], Some(1.0), None, last);
                assert_eq!(
                    (got[r].len, &got[r].data),
                    (want.len, &want.data),
                    "bf16 {bf16} packed {packed} pairs {pairs} row {r}"
                );
                let want = tr.step(&mut tr_alone[r], &xs[r], Some(1.0));
                assert_eq!(
                    (got_tr[r].len, &got_tr[r].data),
                    (want.len, &want.data),
                    "bf16 {bf16} packed {packed} pairs {pairs} row {r}"
                );
            }
        }
    }
    Ok(())
}

/// The tiles, computed from their index, cover every output element exactly once, column
/// block after column block, with row blocks only when there are too few column blocks for
/// the threads (2 here) and the product is large, and narrower column blocks (multiples of
/// 16) when the rows run out: a fused residual block's one row of 1,920 frames.
#[test]
fn tiles_cover_each_element_once() {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build();
    pool.expect("a pool").install(|| {
        for (rows, cols, max_cols, flops) in [
            (0, 5, 4, 0),
            (3, 0, 4, 0),
            (1, 1, 32, 1),
            (37, 100, 32, 1),
            (512, 30, 32, 1 << 22),
            (64, 7000, 2048, 1 << 22),
            (1, 1920, 2048, 1 << 22),
            (1, 79, 40, 1 << 22),
            (1, 40, 2048, 1 << 22),
        ] {
            let t = super::tiles::tiles(rows, cols, max_cols, flops);
            let mut seen = vec![0u8; rows * cols];
            let mut last_c0 = 0;
            for i in 0..t.len() {
                let (r0, rn, c0, cn) = t.get(i);
                assert!(
                    rn > 0 && cn > 0 && cn <= max_cols && c0 >= last_c0,
                    "{t:?} {i}"
                );
                last_c0 = c0;
                for r in r0..r0 + rn {
                    seen[r * cols + c0..r * cols + c0 + cn]
                        .iter_mut()
                        .for_each(|s| *s += 1);
                }
            }
            assert!(seen.iter().all(|&s| s == 1), "{rows} x {cols}: {t:?}");
            let row_blocks = (0..t.len()).filter(|&i| t.get(i).2 == 0).count();
            assert_eq!(row_blocks > 1, (rows, cols) == (512, 30), "{t:?}");
            let split = t.len() > cols.div_ceil(max_cols);
            let expect_split = matches!((rows, cols), (512, 30) | (1, 1920));
            assert_eq!(split, expect_split, "{rows} x {cols}: {t:?}");
            if (rows, cols) == (1, 1920) {
                assert_eq!(t.len(), 4, "{t:?}");
                assert!((0..3).all(|i| t.get(i).3.is_multiple_of(16)), "{t:?}");
            }
        }
    });
}

/// A residual block's frames too few to cut into tiles for two threads (a B = 1 step's
/// low-rate blocks) run in two passes split by channels, and frames just enough run in
/// narrower tiles: both give the bits of the block's one tile on one thread, on the direct
/// kernel's shapes (256 channels, where the CPU has AVX-512) and past them (512: `gemm`).
#[test]
fn fused_block_keeps_its_bits_on_two_threads() -> Result<()> {
    let pool = |threads| rayon::ThreadPoolBuilder::new().num_threads(threads).build();
    let constant = cconv::PadMode::Constant;
    for (c, k, n) in [(256, 3, 16), (256, 3, 96), (512, 3, 16), (512, 3, 96)] {
        let (_vm, vb) = random_vb(0);
        let (va, vb2) = (vb.pp("a"), vb.pp("b"));
        cconv::StreamableConv1d::new(c, c / 2, k, 1, 1, 1, true, true, None, constant, va.clone())?;
        cconv::StreamableConv1d::new(
            c / 2,
            c,
            1,
            1,
            1,
            1,
            true,
            true,
            None,
            constant,
            vb2.clone(),
        )?;
        let first = Conv1d::load(va, ConvSpec::new(c, c / 2, k))?;
        let second = Conv1d::load(vb2, ConvSpec::new(c / 2, c, 1))?;
        let x = frames_of(&Tensor::randn(0f32, 1., (1, c, n + k - 1), &Device::Cpu)?);
        let skip = frames_of(&Tensor::randn(0f32, 1., (1, c, n), &Device::Cpu)?);
        let run = |threads| {
            let pool = pool(threads).expect("a pool");
            pool.install(|| first.run_fused(&x, &second, 1.0, &skip).data.to_vec())
        };
        let (one, two) = (run(1), run(2));
        assert_eq!(one.len(), c * n);
        let same = one
            .iter()
            .zip(&two)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{c} channels, {n} frames: {}", max_diff(&one, &two));
    }
    Ok(())
}

/// `precision="medium"` (`pairs.rs`): within bf16's rounding of the f32 convolution, and a
/// stream in uneven chunks, ended with `last`, gives the offline output bit for bit (plain,
/// dilated, phase-split with zero taps, replicate padding, one frame).
#[test]
fn pair_packed_convolutions_stream_bit_exactly() -> Result<()> {
    let cases = [
        // cin, cout, k, stride, dilation, len, replicate
        (3, 5, 7, 1, 1, 50, false),
        (8, 16, 3, 1, 2, 300, false),
        (16, 12, 7, 3, 1, 400, true),
        (40, 24, 10, 5, 1, 2000, false),
        (6, 4, 5, 2, 1, 5, true),
        (64, 64, 3, 1, 1, 3000, false),
    ];
    for (cin, cout, k, s, d, len, rep) in cases {
        let (_vm, vb) = randn_vb((cout, cin, k), cout)?;
        let pad = [PadMode::Constant, PadMode::Replicate][rep as usize];
        let spec = ConvSpec::new(cin, cout, k).stride(s).dilation(d).pad(pad);
        let f32 = Conv1d::load(vb, spec)?;
        let mut ours = f32.clone();
        ours.pair_pack();
        let x = frames_of(&Tensor::randn(0f32, 1., (1, cin, len), &Device::Cpu)?);
        let (want, got) = (
            f32.forward(&x, Some(1.0), None),
            ours.forward(&x, Some(1.0), None),
        );
        let scale = want.data.iter().fold(0f32, |m, v| m.max(v.abs()));
        let dd = max_diff(&got.data, &want.data);
        assert!(
            dd <= 2e-2 * scale,
            "case {cin} {cout} {k} {s} {d}: {dd} of {scale}"
        );
        let (mut st, mut out, mut t0, mut chunk) = (ConvState::default(), vec![], 0, 1);
        while t0 < len {
            let n = chunk.min(len - t0);
            let y = ours.step(
                &mut st,
                &x.window(t0, t0 + n),
                Some(1.0),
                None,
                t0 + n == len,
            );
            out.push(y);
            (t0, chunk) = (t0 + n, chunk * 3 % 97 + 1);
        }
        let streamed = (out.iter()).fold(Frames::empty(cout), |a, y| a.concat_act(y, None));
        assert_eq!(
            streamed.data, got.data,
            "case {cin} {cout} {k} {s} {d} {len}"
        );
    }
    for (cin, cout, k, s, len) in [(16, 8, 8, 4, 200), (64, 32, 16, 8, 90), (3, 2, 4, 2, 7)] {
        let (_vm, vb) = randn_vb((cin, cout, k), cout)?;
        let f32 = ConvTr1d::load(vb, ConvSpec::new(cin, cout, k).stride(s))?;
        let mut ours = f32.clone();
        ours.pair_pack();
        let x = frames_of(&Tensor::randn(0f32, 1., (1, cin, len), &Device::Cpu)?);
        let (want, got) = (f32.forward(&x, None), ours.forward(&x, None));
        let scale = want.data.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(
            max_diff(&got.data, &want.data) <= 2e-2 * scale,
            "tr {cin} {cout} {k} {s}"
        );
        let mut st = ConvState::default();
        let streamed = (0..len).step_by(3).fold(Frames::empty(cout), |a, t| {
            a.concat_act(
                &ours.step(&mut st, &x.window(t, (t + 3).min(len)), None),
                None,
            )
        });
        assert_eq!(
            streamed.data,
            got.data[..streamed.data.len()],
            "tr {cin} {cout} {k} {s}"
        );
    }
    Ok(())
}

/// `y (n, cout) = cols (n, kk) . w^T` with each row of f32 columns rounded to pairs by
/// itself ([`round_pairs`](crate::kernels::bf16dot::round_pairs)): the medium product by its
/// definition, for [`pair_products_are_those_of_rounded_columns`].
fn rounded_product(w: &crate::kernels::bf16dot::PairPacked, cols: &[f32], n: usize) -> Vec<f32> {
    use crate::kernels::bf16dot::{round_pairs, PairInput};
    let (cout, kk) = w.dims();
    let mut xp = Vec::new();
    round_pairs(cols, n, kk, &mut xp);
    let mut y = vec![0f32; n * cout];
    w.matmul(PairInput::rows(&xp, kk.div_ceil(2)), n, None, &mut y);
    y
}

/// The medium convolutions round each input once and gather its pairs
/// (`pairs.rs`'s `Rounded`): their bits are those of f32 im2col columns (the padded gather,
/// replicate values, phase-split layout, zero taps, odd depth) each rounded to pairs and
/// multiplied, with the bias added after.
#[test]
fn pair_products_are_those_of_rounded_columns() -> Result<()> {
    for (cin, cout, k, s, d, len) in [
        (3, 5, 7, 1, 1, 50),
        (8, 16, 3, 1, 2, 90),
        (16, 12, 7, 3, 1, 100),
        (5, 4, 5, 2, 1, 9),
    ] {
        let (_vm, vb) = randn_vb((cout, cin, k), cout)?;
        let mut conv = Conv1d::load(vb, ConvSpec::new(cin, cout, k).stride(s).dilation(d))?;
        conv.pair_pack();
        let w = conv.pairs.clone().expect("packed");
        let x = frames_of(&Tensor::randn(0f32, 1., (1, cin, len), &Device::Cpu)?);
        let (lval, rval) = ((0..cin).map(|c| c as f32 - 2.5).collect(), vec![0.3; cin]);
        let (lval, rval) = (Some(lval), Some(rval));
        let p = Padded {
            x: &x,
            left: 4,
            right: 3,
            lval,
            rval,
        };
        let (n, kk) = (conv.frames(p.len()), w.dims().1);
        let mut cols = vec![0f32; n * kk];
        for (t, row) in cols.chunks_exact_mut(kk).enumerate() {
            for (c, v) in row.iter_mut().enumerate() {
                if let Some((ci, off)) = conv.pair_column(c) {
                    p.gather(ci, t * s + off, 1, std::slice::from_mut(v));
                }
            }
        }
        let y = rounded_product(&w, &cols, n);
        let b = conv.b.clone().expect("a bias");
        let got = conv.run_pairs(&w, &p, n, None);
        for (co, t) in (0..cout).flat_map(|co| (0..n).map(move |t| (co, t))) {
            let want = y[t * cout + co] + b[co] + 0.0;
            let at = format!("conv {cin} {cout} {k} {s} {d}: ({co}, {t})");
            assert_eq!(got.data[co * n + t].to_bits(), want.to_bits(), "{at}");
        }
    }
    for (cin, cout, k, s, len) in [(16, 8, 8, 4, 40), (3, 2, 4, 2, 7), (5, 3, 6, 3, 11)] {
        let (_vm, vb) = randn_vb((cin, cout, k), cout)?;
        let mut tr = ConvTr1d::load(vb, ConvSpec::new(cin, cout, k).stride(s))?;
        tr.pair_pack();
        let w = tr.pairs.clone().expect("packed");
        let taps = tr.taps;
        let x = frames_of(&Tensor::randn(
            0f32,
            1.,
            (1, cin, len + taps - 1),
            &Device::Cpu,
        )?);
        let (n, kk) = (len, w.dims().1);
        let mut cols = vec![0f32; n * kk];
        for (t, row) in cols.chunks_exact_mut(kk).enumerate() {
            for (c, v) in row.iter_mut().enumerate() {
                let (m, ci) = (c / cin, c % cin);
                *v = x.row(ci)[taps - 1 + t - m];
            }
        }
        let y = rounded_product(&w, &cols, n);
        let b = tr.b.clone().expect("a bias");
        let got = tr.run_pairs(&w, &x, n);
        for (co, t, j) in (0..cout).flat_map(|co| (0..n * s).map(move |t| (co, t / s, t % s))) {
            let want = y[t * s * cout + co * s + j] + b[co];
            let at = format!("tr {cin} {cout} {k} {s}: ({co}, {t}, {j})");
            assert_eq!(
                got.data[co * n * s + t * s + j].to_bits(),
                want.to_bits(),
                "{at}"
            );
        }
    }
    Ok(())
}
