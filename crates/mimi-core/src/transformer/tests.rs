//! The transformer's tests: the exact window against candle's transformer, chunking,
//! rows, states and the planned step.

use super::block::RingRows;
use super::fixed;
use super::model::Transformer;
use super::positions::{ring_slots, STEP_TOKENS};
use super::state::State;
use super::state::{ring_slot, LayerCache};
use super::step_buffers::Workspace;
use crate::config::TransformerConfig;
use crate::config::{Field, Value};
use crate::error::{Error, Result};
use crate::rows::Rows;
use crate::testutil::{max_abs_diff, test_input};
use crate::weights::{self, QkLayout, TensorSource};
use candle::StreamingModule;
use candle::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use std::collections::HashMap;

fn small_cfg(pe: &str, norm: &str, gating: Option<&str>, context: usize) -> TransformerConfig {
    let parse = |v: &str| Value::Str(v.into());
    let c = TransformerConfig {
        d_model: 32,
        num_heads: 4,
        num_layers: 2,
        dim_feedforward: 64,
        context,
        max_seq_len: 512,
        positional_embedding: Field::parse("positional_embedding", &parse(pe)).unwrap(),
        norm: Field::parse("norm", &parse(norm)).unwrap(),
        gating: gating.map(|g| Field::parse("gating", &parse(g)).unwrap()),
        bias_attn: gating.is_some(),
        layer_scale: if gating.is_some() { None } else { Some(0.3) },
        ..Default::default()
    };
    c.validate().unwrap();
    c
}

fn spec(dev: &Device) -> weights::LoadSpec<'_> {
    weights::LoadSpec {
        prefix: "",
        layout: QkLayout::Interleaved,
        device: dev,
        dtype: DType::F32,
        precision: Default::default(),
    }
}

/// Inverse of the loader's conversion: interleaved -> half-split rows, per head.
fn to_halves(t: &Tensor, head_dim: usize) -> Tensor {
    let rows = t.dim(0).unwrap();
    let fwd = weights::halves_to_interleaved_index(rows, head_dim);
    let mut inv = vec![0u32; rows];
    for (new, &old) in fwd.iter().enumerate() {
        inv[old as usize] = new as u32;
    }
    t.index_select(&Tensor::new(inv, &Device::Cpu).unwrap(), 0)
        .unwrap()
}

/// candle's own transformer is right when fed one step at a time (before `max_seq_len`):
/// ours must agree with it on the same weights. candle 0.11.1 applies the half-split
/// rope, so it gets the weights in the HF layout.
#[test]
fn matches_candle_step_by_step() {
    for (pe, norm, gating) in [
        ("rope", "layer_norm", None),
        ("sin", "rms_norm", Some("silu")),
        ("sin", "rms_norm", None),
        ("none", "layer_norm", Some("gelu")),
    ] {
        let cfg = small_cfg(pe, norm, gating, 6);
        let dev = Device::Cpu;
        let w = weights::load_transformer_only(
            &cfg,
            &TensorSource::seeded(7, cfg.layer_scale),
            &spec(&dev),
        )
        .unwrap();
        let hd = cfg.head_dim();
        let hf: HashMap<String, Tensor> = w
            .iter()
            .map(|(k, v)| {
                let v = if k.contains("q_proj") || k.contains("k_proj") {
                    to_halves(v, hd)
                } else {
                    v.clone()
                };
                (k.clone(), v)
            })
            .collect();
        let vb = VarBuilder::from_tensors(hf, DType::F32, &dev);
        let mut reference =
            candle_transformers::models::mimi::transformer::StreamingTransformer::new(
                &cfg.to_candle(),
                vb,
            )
            .unwrap();
        let model = Transformer::new(&cfg, w, &dev, DType::F32).unwrap();
        let mut state = State::default();
        let (b, t, d) = (2, 20, cfg.d_model);
        let x = Tensor::from_vec(test_input(b, t, d, 3), (b, t, d), &dev).unwrap();
        for i in 0..t {
            let xi = x.narrow(1, i, 1).unwrap();
            let ours = model.forward(&mut state, &xi, None, None).unwrap();
            let theirs = reference
                .step(&xi.into())
                .unwrap()
                .as_option()
                .unwrap()
                .clone();
            let diff = max_abs_diff(&ours, &theirs);
            assert!(
                diff < 1e-4,
                "{pe}/{norm}/{gating:?} step {i}: max abs diff {diff}"
            );
        }
        assert_eq!(state.position(), t as u64);
    }
}

/// `step_host` refuses, before anything changes: a state not started, rows out of order,
/// repeated or out of range, lengths that do not match, a gated model, a foreign state.
#[test]
fn the_host_step_refuses_bad_calls_before_anything_changes() {
    let dev = Device::Cpu;
    let load = |cfg: &TransformerConfig| {
        let w = weights::load_transformer_only(
            cfg,
            &TensorSource::seeded(4, cfg.layer_scale),
            &spec(&dev),
        )
        .unwrap();
        Transformer::new(cfg, w, &dev, DType::F32).unwrap()
    };
    let model = load(&small_cfg("rope", "layer_norm", None, 4));
    let d = model.config().d_model;
    let (x, mut out) = (vec![0.1f32; 2 * d], vec![0f32; 2 * d]);
    let (mut s, mut ws) = (State::default(), Workspace::new());
    let shape = |r: Result<()>| matches!(r, Err(Error::Shape(_)));
    assert!(shape(model.step_host(
        &mut s,
        &mut ws,
        &x,
        &[0],
        &mut out,
        None
    )));
    model.start(&mut s, 2).unwrap();
    for rows in [&[1usize, 0][..], &[0, 0], &[2], &[]] {
        assert!(
            shape(model.step_host(&mut s, &mut ws, &x, rows, &mut out, None)),
            "{rows:?}"
        );
    }
    assert!(shape(model.step_host(
        &mut s,
        &mut ws,
        &x[..d + 1],
        &[0],
        &mut out[..d + 1],
        None
    )));
    assert!(shape(model.step_host(
        &mut s,
        &mut ws,
        &x,
        &[0],
        &mut out[..d],
        None
    )));
    let gated = load(&small_cfg("rope", "layer_norm", Some("silu"), 4));
    let r = gated.step_host(&mut State::default(), &mut ws, &x, &[0], &mut out, None);
    assert!(matches!(r, Err(Error::InvalidInput(_))), "{r:?}");
    let other = load(&small_cfg("rope", "layer_norm", None, 6));
    let r = other.step_host(&mut s, &mut ws, &x, &[0, 1], &mut out, None);
    assert!(matches!(r, Err(Error::IncompatibleState(_))), "{r:?}");
    assert_eq!(s.positions(), &[0, 0], "a refused call changes nothing");
    model
        .step_host(&mut s, &mut ws, &x, &[0, 1], &mut out, None)
        .unwrap();
    assert_eq!(s.positions(), &[1, 1]);
}

/// Any chunking gives the step-by-step result.
#[test]
fn chunk_invariant() {
    let cfg = small_cfg("rope", "layer_norm", None, 5);
    let dev = Device::Cpu;
    let w = weights::load_transformer_only(
        &cfg,
        &TensorSource::seeded(1, cfg.layer_scale),
        &spec(&dev),
    )
    .unwrap();
    let model = Transformer::new(&cfg, w, &dev, DType::F32).unwrap();
    let (b, t, d) = (1, 40, cfg.d_model);
    let x = Tensor::from_vec(test_input(b, t, d, 9), (b, t, d), &dev).unwrap();
    let mut s = State::default();
    let steps: Vec<Tensor> = (0..t)
        .map(|i| {
            model
                .forward(&mut s, &x.narrow(1, i, 1).unwrap(), None, None)
                .unwrap()
        })
        .collect();
    let steps = Tensor::cat(&steps, 1).unwrap();
    for chunks in [
        vec![40],
        vec![3, 9, 1, 12, 15],
        vec![5, 5, 5, 25],
        vec![2, 38],
        vec![7, 1, 1, 31],
    ] {
        let mut s = State::default();
        let mut outs = Vec::new();
        let mut start = 0;
        for c in &chunks {
            outs.push(
                model
                    .forward(&mut s, &x.narrow(1, start, *c).unwrap(), None, None)
                    .unwrap(),
            );
            start += c;
        }
        let y = Tensor::cat(&outs, 1).unwrap();
        // The planned step: a token's bits do not depend on how the calls cut the input.
        let diff = max_abs_diff(&y, &steps);
        assert_eq!(diff, 0.0, "chunks {chunks:?}: max abs diff {diff}");
    }
}

/// Rows stepped with masks, reset on their own and fed chunks of several steps behave
/// exactly like independent single-row streams fed only their own inputs (the planned step).
#[test]
fn rows_are_independent_streams() {
    for pe in ["rope", "sin"] {
        let model = rows_model(pe, DType::F32);
        assert!(
            model.planned(),
            "{pe}: an f32 model on the CPU takes the planned step"
        );
        // Bit-exact: a row's norms, angles and attention are its own, and the packed
        // product's rows do not depend on their neighbours.
        check_rows_independent(&model, pe, 0.0);
    }
}

/// The planned step's workspace holds nothing a result depends on: the streams of two
/// models (rotary, sinusoidal) stepped in turn in one shared workspace, in calls of several
/// lengths (past the ring's wrap), give the bits of each stream in a workspace of its own,
/// and a copy of a state (deep or clone) steps on in a fresh workspace to the original's bits.
#[test]
fn the_workspace_holds_nothing_a_result_depends_on() {
    let models = [
        rows_model("rope", DType::F32),
        rows_model("sin", DType::F32),
    ];
    let d = models[0].config().d_model;
    let mut shared = Workspace::new();
    let mut own = [Workspace::new(), Workspace::new()];
    let mut states: [[State; 2]; 2] = Default::default();
    let mut copies: Vec<(State, Workspace)> = Vec::new();
    for (call, t) in [3, 1, 6, 1, 2].into_iter().enumerate() {
        let x = test_input(2, t, d, call as u64);
        for (i, model) in models.iter().enumerate() {
            let [in_shared, in_own] = &mut states[i];
            let (mut ys, mut zs) = (vec![0f32; x.len()], vec![0f32; x.len()]);
            for (s, ws, out) in [
                (in_shared, &mut shared, &mut ys),
                (in_own, &mut own[i], &mut zs),
            ] {
                model.start(s, 2).unwrap();
                model.step_host(s, ws, &x, &[0, 1], out, None).unwrap();
            }
            assert_eq!(ys, zs, "model {i} call {call}");
            if i == 0 {
                for (s, ws) in &mut copies {
                    model.step_host(s, ws, &x, &[0, 1], &mut zs, None).unwrap();
                    assert_eq!(ys, zs, "a copy, call {call}");
                }
            }
        }
        if call == 1 {
            let s = &states[0][0];
            copies.push((s.deep_copy().unwrap(), Workspace::new()));
            copies.push((s.clone(), Workspace::new()));
        }
    }
    assert!(shared.nbytes() >= own[0].nbytes().max(own[1].nbytes()));
}

/// The same on candle's path (what a GPU or half precision runs: one gather of the rows'
/// rings, one batched attention with a mask per row, one scatter of the new keys per
/// buffer), in f16 on the CPU: rows that are not adjacent, resets, blocks longer than the
/// context. Within four f16 ulps of the peak: candle's products round a batch of rows and a
/// row alone differently (the same before the gather and scatter).
#[test]
fn rows_are_independent_streams_on_candles_path() {
    for pe in ["rope", "sin"] {
        for fixed in [true, false] {
            let model = rows_model(pe, DType::F16).with_fixed_step(fixed);
            assert!(!model.planned(), "{pe}: an f16 model takes candle's path");
            check_rows_independent(&model, pe, 4e-3);
        }
    }
}

/// The fixed-shape step (`fixed.rs`) against the earlier candle paths, in f32 (the gated
/// feed-forward keeps an f32 model on candle's path): streams of every step length up to
/// past the ring's wrap, masked rows, resets and blocks longer than the context give the same
/// outputs within float32 rounding (1e-5 of the peak: the sums run over the ring in another
/// order), and the fixed step's rings hold at least `context + STEP_TOKENS - 1` slots.
#[test]
fn the_fixed_step_matches_the_earlier_paths() {
    for pe in ["rope", "sin"] {
        let cfg = small_cfg(pe, "rms_norm", Some("silu"), 4);
        let dev = Device::Cpu;
        let w = weights::load_transformer_only(&cfg, &TensorSource::seeded(5, None), &spec(&dev))
            .unwrap();
        let fixed = Transformer::new(&cfg, w.clone(), &dev, DType::F32).unwrap();
        let fixed = fixed.with_fixed_step(true);
        let old = Transformer::new(&cfg, w, &dev, DType::F32).unwrap();
        let old = old.with_fixed_step(false);
        let (b, d) = (2, cfg.d_model);
        let (mut sf, mut so) = (State::default(), State::default());
        for (call, t) in [1, 2, 3, 4, 1, 4, 2, 7, 1, 1, 3, 2, 9, 2]
            .into_iter()
            .enumerate()
        {
            let x = Tensor::from_vec(test_input(b, t, d, 40 + call as u64), (b, t, d), &dev);
            let x = x.unwrap();
            let (yf, yo) = match call % 3 {
                2 => {
                    let (row, one) = (x.narrow(0, 1, 1).unwrap(), Rows::from_mask(&[false, true]));
                    (
                        fixed.forward(&mut sf, &row, Some(&one), None),
                        old.forward(&mut so, &row, Some(&one), None),
                    )
                }
                _ => (
                    fixed.forward(&mut sf, &x, None, None),
                    old.forward(&mut so, &x, None, None),
                ),
            };
            let (yf, yo) = (yf.unwrap(), yo.unwrap());
            let peak = max_abs_diff(&yo, &yo.zeros_like().unwrap());
            let diff = max_abs_diff(&yf, &yo);
            assert!(
                peak.is_finite() && diff <= 1e-5 * peak,
                "{pe} call {call} (t = {t}): {diff} against a peak of {peak}"
            );
            assert_eq!(sf.positions(), so.positions());
            if call == 5 {
                sf.reset_rows(&[0]);
                so.reset_rows(&[0]);
            }
        }
        let slots = |s: &State| s.layout().unwrap().1[2];
        assert_eq!(slots(&sf), ring_slots(cfg.context, true));
        assert!(slots(&sf) >= cfg.context + STEP_TOKENS - 1);
        assert_eq!(slots(&so), cfg.context);
    }
}

/// The fixed step's mask, against a ring simulated slot by slot: after a row at `p` wrote
/// its `t` new keys, the query at `p + i` sees exactly the slots holding positions
/// `max(0, p + i - context + 1) ..= p + i`, whatever slots a young row has not filled.
#[test]
fn the_fixed_steps_mask_shows_exactly_each_querys_window() {
    let context = 5;
    let slots = ring_slots(context, true);
    for t in 1..=STEP_TOKENS {
        for p in 0..3 * slots as u64 {
            let mut ring = vec![None; slots]; // the position each slot holds
            for k in 0..p + t as u64 {
                ring[ring_slot(k, slots)] = Some(k);
            }
            let mask = fixed::step_mask(&[p], t, context, slots);
            for i in 0..t as u64 {
                let q = p + i;
                for (j, held) in ring.iter().enumerate() {
                    let sees = held.is_some_and(|k| k <= q && q - k < context as u64);
                    let m = mask[i as usize * slots + j];
                    assert_eq!(m == 0.0, sees, "t {t} p {p} query {q} slot {j}: {m}");
                }
            }
        }
    }
}

fn rows_model(pe: &str, dtype: DType) -> Transformer {
    let cfg = small_cfg(pe, "layer_norm", None, 4);
    let dev = Device::Cpu;
    let source = TensorSource::seeded(3, cfg.layer_scale);
    let w = weights::load_transformer_only(
        &cfg,
        &source,
        &weights::LoadSpec {
            dtype,
            ..spec(&dev)
        },
    )
    .unwrap();
    Transformer::new(&cfg, w, &dev, dtype).unwrap()
}

/// Steps 3 rows through a schedule of masks, resets and chunk lengths, against each row
/// alone: every output within `tol` times the row's peak (max abs), every position equal.
fn check_rows_independent(model: &Transformer, pe: &str, tol: f32) {
    let (b, d, dev) = (3, model.config().d_model, Device::Cpu);
    let mut batched = State::default();
    let mut single: Vec<State> = (0..b).map(|_| State::default()).collect();
    // (active rows, steps, rows reset before the call)
    let schedule: [(&[usize], usize, &[usize]); 10] = [
        (&[0, 1, 2], 2, &[]),
        (&[0, 2], 1, &[0, 2]), // every stepping row fresh: no ring slot to attend to
        (&[0, 2], 1, &[]),
        (&[1], 3, &[]),
        (&[0, 1, 2], 1, &[1]),
        (&[0, 2], 1, &[2]),
        (&[0, 1, 2], 5, &[]),
        (&[1, 2], 1, &[0]),
        (&[0, 1, 2], 1, &[]),
        (&[0, 1], 2, &[2]),
    ];
    for (call, &(rows, t, resets)) in schedule.iter().enumerate() {
        batched.reset_rows(resets);
        for &r in resets {
            single[r].reset();
        }
        let x = Tensor::from_vec(test_input(b, t, d, call as u64), (b, t, d), &dev).unwrap();
        let x = x.to_dtype(model.dtype()).unwrap();
        let idx = Tensor::new(rows.iter().map(|&r| r as u32).collect::<Vec<_>>(), &dev).unwrap();
        let xs = x.index_select(&idx, 0).unwrap();
        let ys = match call {
            0 => model.forward(&mut batched, &xs, None, None).unwrap(),
            _ => {
                let mask: Vec<bool> = (0..b).map(|r| rows.contains(&r)).collect();
                let rows = Rows::from_mask(&mask);
                model.forward(&mut batched, &xs, Some(&rows), None).unwrap()
            }
        };
        let ys = ys.to_dtype(DType::F32).unwrap();
        for (i, &r) in rows.iter().enumerate() {
            let alone = model.forward(&mut single[r], &x.narrow(0, r, 1).unwrap(), None, None);
            let alone = alone.unwrap();
            let alone = alone.to_dtype(DType::F32).unwrap();
            let diff = max_abs_diff(&ys.narrow(0, i, 1).unwrap(), &alone);
            let peak = max_abs_diff(&alone, &alone.zeros_like().unwrap());
            assert!(
                peak.is_finite() && diff <= tol * peak,
                "{pe} call {call} row {r}: max abs diff {diff} > {tol} x the peak {peak}"
            );
            assert_eq!(batched.positions()[r], single[r].position());
        }
    }
}

/// A masked block's ring write (`RingRows`): each stepping row's `t` new keys land in their
/// ring slots (wrapping), and every other value, the rows that do not step included, keeps
/// its bits. It relies on candle's scatter skipping the index `u32::MAX`.
#[test]
fn ring_rows_write_only_the_stepping_rows_slots() {
    let cfg = small_cfg("rope", "layer_norm", None, 4);
    let (b, h, c, hd, t, dev) = (
        3,
        cfg.num_heads,
        cfg.context,
        cfg.head_dim(),
        2,
        Device::Cpu,
    );
    let n = b * h * c * hd;
    let old: Vec<f32> = (0..n).map(|i| -(i as f32) - 1.0).collect();
    let cache = LayerCache {
        k: Tensor::from_vec(old.clone(), (b, h, c, hd), &dev).unwrap(),
        v: Tensor::from_vec(old.clone(), (b, h, c, hd), &dev).unwrap(),
    };
    let (rows, pos) = ([0usize, 2], [7u64, 1]); // row 0 wraps: slots 3 then 0
    let new_at =
        |i: usize, hh: usize, j: usize, x: usize| (1000 * i + 100 * hh + 10 * j + x) as f32;
    let new: Vec<f32> = (0..rows.len() * h * t * hd)
        .map(|f| new_at(f / (h * t * hd), f / (t * hd) % h, f / hd % t, f % hd))
        .collect();
    let new = Tensor::from_vec(new, (rows.len(), h, t, hd), &dev).unwrap();
    let caches = std::slice::from_ref(&cache);
    let ring = RingRows::new(&rows, &pos, t, caches, &cfg, &dev).unwrap();
    ring.write(&cache, &new, &(&new * 2.0).unwrap()).unwrap();
    let (k, v) = (
        cache.k.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        cache.v.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
    );
    for f in 0..n {
        let (r, hh, slot, x) = (f / (h * c * hd), f / (c * hd) % h, f / hd % c, f % hd);
        let stepped = rows.iter().position(|&q| q == r).and_then(|i| {
            let j = (0..t).find(|&j| ring_slot(pos[i] + j as u64, c) == slot)?;
            Some(new_at(i, hh, j, x))
        });
        assert_eq!(
            k[f],
            stepped.unwrap_or(old[f]),
            "k row {r} head {hh} slot {slot}"
        );
        assert_eq!(
            v[f],
            stepped.map_or(old[f], |y| 2.0 * y),
            "v row {r} head {hh} slot {slot}"
        );
    }
}

/// The graph plan (`MIMI_PY_CUDA_GRAPHS`) on the CPU, where it runs without capture: the
/// same steps through a warm-up, a capture and replays, with the tables written into the
/// captured buffers, give the ordinary steps' outputs bit for bit (unmasked, masked with one
/// or the other row, after a row's reset and in a deep copy, which records its own), in f32
/// and f16, rotary and sinusoidal; the replays really happened (the plan's counters).
#[test]
fn graph_replays_equal_eager_steps_bit_for_bit() {
    use crate::gpu::graphs::graph_counts;
    let replayed = || graph_counts()[2].1;
    for (pe, dtype) in [
        ("rope", DType::F32),
        ("sin", DType::F32),
        ("rope", DType::F16),
    ] {
        let cfg = small_cfg(pe, "rms_norm", Some("silu"), 4);
        let dev = Device::Cpu;
        let w = weights::load_transformer_only(&cfg, &TensorSource::seeded(9, None), &spec(&dev))
            .unwrap();
        let w: std::collections::BTreeMap<_, _> = w
            .into_iter()
            .map(|(k, v)| (k, v.to_dtype(dtype).unwrap()))
            .collect();
        let eager = Transformer::new(&cfg, w.clone(), &dev, dtype).unwrap();
        let eager = eager.with_fixed_step(true).with_graphs(false);
        let graphs = Transformer::new(&cfg, w, &dev, dtype).unwrap();
        let graphs = graphs.with_fixed_step(true).with_graphs(true);
        let (b, d) = (3, cfg.d_model);
        let (mut se, mut sg) = (State::default(), State::default());
        let before = replayed();
        for call in 0..24u64 {
            let x = Tensor::from_vec(test_input(b, 1, d, 70 + call), (b, 1, d), &dev).unwrap();
            let x = x.to_dtype(dtype).unwrap();
            let mask = match call % 4 {
                3 => Some(Rows::from_mask(&[true, false, true])),
                2 if call > 8 => Some(Rows::from_mask(&[false, true, true])),
                _ => None,
            };
            let x = match &mask {
                Some(rows) => {
                    let ids: Vec<u32> = rows.indices().iter().map(|&r| r as u32).collect();
                    x.index_select(&Tensor::new(ids, &dev).unwrap(), 0).unwrap()
                }
                None => x,
            };
            let ye = eager.forward(&mut se, &x, mask.as_ref(), None).unwrap();
            let yg = graphs.forward(&mut sg, &x, mask.as_ref(), None).unwrap();
            let bits = |y: &Tensor| y.to_dtype(DType::F32).unwrap().flatten_all().unwrap();
            let (ye, yg) = (
                bits(&ye).to_vec1::<f32>().unwrap(),
                bits(&yg).to_vec1::<f32>().unwrap(),
            );
            assert!(
                ye.iter().all(|v| v.is_finite()),
                "{pe} {dtype:?} call {call}"
            );
            assert_eq!(
                ye, yg,
                "{pe} {dtype:?} call {call}: graph replay differs from eager"
            );
            assert_eq!(se.positions(), sg.positions());
            if call == 12 {
                se.reset_rows(&[1]);
                sg.reset_rows(&[1]);
            }
            if call == 17 {
                se = se.deep_copy().unwrap();
                sg = sg.deep_copy().unwrap();
            }
        }
        assert!(
            replayed() >= before + 10,
            "{pe} {dtype:?}: the plan replayed too little"
        );
    }
}

/// An input with no values but an enormous batch (`(2**31, 0, d)`) is refused by its shape
/// before any work per row (the fuzzer's finding: it held 0 values, passed the size rule,
/// then a list of its 2^31 rows was allocated and the process aborted); the stream stays
/// unstarted.
#[test]
fn an_empty_input_of_an_enormous_batch_is_refused_before_any_work_per_row() {
    let cfg = small_cfg("rope", "layer_norm", None, 4);
    let dev = Device::Cpu;
    let w = weights::load_transformer_only(
        &cfg,
        &TensorSource::seeded(1, cfg.layer_scale),
        &spec(&dev),
    );
    let model = Transformer::new(&cfg, w.unwrap(), &dev, DType::F32).unwrap();
    let (mut state, mut ws) = (State::default(), Workspace::new());
    let x = crate::host::HostArray::new(vec![], vec![1 << 31, 0, cfg.d_model]);
    match model.forward_host((&mut state, &mut ws), x, None) {
        Err(Error::Shape(m)) => assert!(m.contains("batch"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(state.batch(), None);
}
