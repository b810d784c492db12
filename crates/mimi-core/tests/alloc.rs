//! A planned transformer step allocates nothing once warm: a global allocator that counts
//! every allocation around `Transformer::step_host`, at 1 and 2 threads. (The only test
//! of this binary, so no other test allocates while it counts.)

use mimi_core::candle::{DType, Device};
use mimi_core::runtime::precision::Precision;
use mimi_core::runtime::profile::CountingAlloc;
use mimi_core::transformer::{State, Transformer, Workspace};
use mimi_core::weights::{load_transformer_only, LoadSpec, QkLayout};
use mimi_core::{Result, TensorSource, TransformerConfig};

#[global_allocator]
static COUNTING: CountingAlloc = CountingAlloc::new();

/// A small f32 transformer on the CPU (the planned step), seeded.
fn model() -> Result<Transformer> {
    let cfg = TransformerConfig {
        d_model: 64,
        num_heads: 4,
        num_layers: 2,
        dim_feedforward: 128,
        context: 6,
        ..Default::default()
    };
    let dev = Device::Cpu;
    let spec = LoadSpec {
        prefix: "",
        layout: QkLayout::Interleaved,
        device: &dev,
        dtype: DType::F32,
        precision: Precision::default(),
    };
    let w = load_transformer_only(&cfg, &TensorSource::seeded(2, cfg.layer_scale), &spec)?;
    Transformer::new(&cfg, w, &dev, DType::F32)
}

#[test]
fn a_warm_planned_step_allocates_nothing() -> Result<()> {
    let model = model()?;
    let d = model.config().d_model;
    for threads in [1, 2] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .map_err(|e| mimi_core::Error::Internal(e.to_string()))?;
        pool.install(|| -> Result<()> {
            let (mut state, mut ws) = (State::default(), Workspace::new());
            model.start(&mut state, 3)?;
            // Rows 0 and 2 (row 1 rests), two tokens each; the same shape every step.
            let rows = [0usize, 2];
            let x: Vec<f32> = (0..rows.len() * 2 * d)
                .map(|i| (i % 7) as f32 * 0.1)
                .collect();
            let mut out = vec![0f32; x.len()];
            for _ in 0..3 {
                model.step_host(&mut state, &mut ws, &x, &rows, &mut out, None)?;
            }
            // Windows of 10 warm steps (past the context: the rings wrap around). The counter
            // sees every thread, and rayon's deques may allocate now and then on their own
            // (crossbeam's deferred frees), so one window without any allocation is the proof:
            // an allocation made by the step itself would show in every window.
            let mut made = Vec::new();
            for _ in 0..5 {
                let before = COUNTING.counts();
                for _ in 0..10 {
                    model.step_host(&mut state, &mut ws, &x, &rows, &mut out, None)?;
                }
                made.push((COUNTING.counts() - before).total);
                if made.last() == Some(&0) {
                    break;
                }
            }
            assert_eq!(
                made.last(),
                Some(&0),
                "{threads} threads: allocations in each window of 10 warm steps: {made:?}"
            );
            let steps = 2 * (3 + 10 * made.len() as u64);
            assert_eq!(state.positions(), &[steps, 0, steps]);
            assert!(out.iter().all(|v| v.is_finite()));
            Ok(())
        })?;
    }
    Ok(())
}
