//! Native (no Python) timing of one transformer step on the Mimi shape, for two engines on
//! the same seeded weights:
//!
//! * `candle`: candle-transformers' own `mimi::transformer::StreamingTransformer`;
//! * `mimi_py`: this crate's transformer (exact sliding window, owned state).
//!
//! `cargo run --release --no-default-features --bin mimi_native_bench -- [steps] [batch]`
//! prints one JSON line per engine with the median and p99 step time in microseconds, plus
//! the time of one 250-step chunk. `benches/` runs it next to the Python binding to measure
//! the binding's overhead.

#![allow(clippy::print_stdout)] // a CLI benchmark: stdout is its output

use candle::{DType, Device, StreamingModule, Tensor};
use mimi_core::config::TransformerConfig;
use mimi_core::transformer::{State, Transformer, Workspace};
use mimi_core::weights::{LoadSpec, QkLayout, TensorSource};
use mimi_core::HostArray;
use std::collections::HashMap;
use std::time::Instant;

fn stats(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let med = v[v.len() / 2];
    let p99 = v[((v.len() as f64 * 0.99) as usize).min(v.len() - 1)];
    (med, p99)
}

fn input(b: usize, t: usize, d: usize, seed: u64) -> Tensor {
    let mut s = seed;
    let data: Vec<f32> = (0..b * t * d)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    Tensor::from_vec(data, (b, t, d), &Device::Cpu).unwrap()
}

fn main() -> mimi_core::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let steps: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(300);
    let batch: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1);
    // "both" (default), "candle" or "mimi_py": which engines to time.
    let which = args.get(3).cloned().unwrap_or_else(|| "both".to_string());
    let cfg = TransformerConfig::default();
    let dev = Device::Cpu;
    let seeded = TensorSource::seeded(0, cfg.layer_scale);
    let spec = LoadSpec {
        prefix: "",
        layout: QkLayout::Interleaved,
        device: &dev,
        dtype: DType::F32,
        precision: Default::default(),
    };
    let model =
        Transformer::load(&cfg, &seeded, &spec).map_err(|e| candle::Error::Msg(e.to_string()))?;
    let map: HashMap<String, Tensor> = model
        .weights()
        .map_err(|e| candle::Error::Msg(e.to_string()))?
        .into_iter()
        .collect();
    let vb = candle_nn::VarBuilder::from_tensors(map, DType::F32, &dev);
    let mut reference = candle_transformers::models::mimi::transformer::StreamingTransformer::new(
        &cfg.to_candle(),
        vb,
    )?;
    let d = cfg.d_model;
    let warm = 20;
    let xs = input(batch, steps + warm, d, 1);

    let chunk = input(batch, 250, d, 2);
    if which != "mimi_py" {
        // candle's own transformer (its state stays valid while steps + warm < max_seq_len)
        let mut times = Vec::with_capacity(steps);
        for i in 0..steps + warm {
            let x = xs.narrow(1, i, 1)?;
            let t0 = Instant::now();
            let _y = reference.step(&x.into())?;
            if i >= warm {
                times.push(t0.elapsed().as_secs_f64() * 1e6);
            }
        }
        let (med, p99) = stats(times);
        reference.reset_state();
        let t0 = Instant::now();
        reference.forward(&chunk)?;
        let chunk_us = t0.elapsed().as_secs_f64() * 1e6;
        println!(
        "{{\"engine\": \"candle\", \"batch\": {batch}, \"steps\": {steps}, \"step_median_us\": {med:.1}, \"step_p99_us\": {p99:.1}, \"chunk250_us\": {chunk_us:.1}}}"
    );
    }
    if which == "candle" {
        return Ok(());
    }
    // Ours through its host entry, each step's input made before the timing.
    let host = |t: &Tensor| -> mimi_core::Result<HostArray<f32>> {
        let data = t.flatten_all()?.to_vec1::<f32>()?;
        Ok(HostArray::new(data, t.dims().to_vec()))
    };
    let (mut state, mut ws) = (State::default(), Workspace::new());
    let mut times = Vec::with_capacity(steps);
    for i in 0..steps + warm {
        let x = host(&xs.narrow(1, i, 1)?)?;
        let t0 = Instant::now();
        let _y = model.forward_host((&mut state, &mut ws), x, None)?;
        if i >= warm {
            times.push(t0.elapsed().as_secs_f64() * 1e6);
        }
    }
    let (med, p99) = stats(times);
    let mut state = State::default();
    let chunk = host(&chunk)?;
    let t0 = Instant::now();
    model.forward_host((&mut state, &mut ws), chunk, None)?;
    let chunk_us = t0.elapsed().as_secs_f64() * 1e6;
    println!(
        "{{\"engine\": \"mimi_py-native\", \"batch\": {batch}, \"steps\": {steps}, \"step_median_us\": {med:.1}, \"step_p99_us\": {p99:.1}, \"chunk250_us\": {chunk_us:.1}}}"
    );
    Ok(())
}
