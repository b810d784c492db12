//! Per-layer timing of the native convolution engine on the shapes of Mimi's SEANet, one
//! second of audio per layer: the numbers behind the kernel choices in `conv/conv1d.rs` and
//! `kernels/direct.rs` (benches/README.md → Profile).
//!
//! `RAYON_NUM_THREADS=1 cargo run --release -p mimi-core --bin mimi_kernel_bench -- [repeats]`
//! prints one JSON line per layer: the best time of `repeats` (default 20) streaming calls on
//! a fresh state (the offline engine's path: activation, then the convolution), and GFLOP/s.
//! `MIMI_PY_DIRECT_CONV=0` turns the AVX-512 direct kernel off, so stride-1 layers take the
//! im2col + `gemm` path: run it both ways to compare. `SECS=0.5` runs each layer on that much
//! audio per call instead (times still per second of audio): the frame-rate layers lose half
//! their speed in short calls, because `gemm` packs their large weights on every call.
//!
//! `... --bin mimi_kernel_bench -- gemv [megabytes]` times the matrix-vector kernel instead
//! (every linear layer of a streaming step): 1 to 32 input rows, f32 and bf16 weights, against the transformer's
//! weight shapes, cycling through `megabytes` (default 400: more than this machine's cache,
//! as in a streaming codec frame; 100 is one transformer's weights) of distinct matrices, and
//! prints the weight bytes read per second.

#![allow(clippy::print_stdout)] // a CLI benchmark: stdout is its output

use candle::{DType, Device};
use candle_nn::{VarBuilder, VarMap};
use mimi_core::conv::{Conv1d, ConvSpec, ConvState, ConvTr1d, Frames};
use mimi_core::kernels::{gemv, in_pool, Isa, Packed, Weight};
use std::time::Instant;

/// (name, cin, cout, k, stride, input frames per second of audio, transposed)
const LAYERS: &[(&str, usize, usize, usize, usize, usize, bool)] = &[
    ("enc init", 1, 64, 7, 1, 24000, false),
    ("enc res 64 conv1", 64, 32, 3, 1, 24000, false),
    ("enc down 64->128 s4", 64, 128, 8, 4, 24000, false),
    ("enc res 128 conv1", 128, 64, 3, 1, 6000, false),
    ("enc down 128->256 s5", 128, 256, 10, 5, 6000, false),
    ("enc res 256 conv1", 256, 128, 3, 1, 1200, false),
    ("enc down 256->512 s6", 256, 512, 12, 6, 1200, false),
    ("enc res 512 conv1", 512, 256, 3, 1, 200, false),
    ("enc down 512->1024 s8", 512, 1024, 16, 8, 200, false),
    ("enc last", 1024, 512, 3, 1, 25, false),
    ("dec init", 512, 1024, 7, 1, 25, false),
    ("dec up 1024->512 s8", 1024, 512, 16, 8, 25, true),
    ("dec up 512->256 s6", 512, 256, 12, 6, 200, true),
    ("dec up 256->128 s5", 256, 128, 10, 5, 1200, true),
    ("dec up 128->64 s4", 128, 64, 8, 4, 6000, true),
    ("dec last", 64, 1, 7, 1, 24000, false),
];

/// Best time of 15 passes of `gemv` over every matrix of `ws`, `m` input rows, each pass
/// inside `in_pool` as a step runs it (outside, every call would wake a parked worker).
fn time_gemv<W: Weight>(ws: &[Vec<W>], m: usize, k: usize, n: usize) -> f64 {
    let x: Vec<f32> = (0..m * k).map(|j| (j % 5) as f32).collect();
    let mut best = f64::MAX;
    for _ in 0..15 {
        let pass = in_pool(|| {
            let t = Instant::now();
            for w in ws {
                std::hint::black_box(gemv(&x, w, m, k, n));
            }
            t.elapsed().as_secs_f64()
        });
        best = best.min(pass);
    }
    best
}

/// Distinct `(n, k)` matrices filling `megabytes` (at least one), in f32 and the same values
/// rounded to bf16.
fn matrices(megabytes: usize, n: usize, k: usize) -> (Vec<Vec<f32>>, Vec<Vec<half::bf16>>) {
    let mats = (megabytes * 1_000_000 / (n * k * 4)).max(1);
    let ws: Vec<Vec<f32>> = (0..mats)
        .map(|i| {
            (0..n * k)
                .map(|j| ((i * 7 + j) % 13) as f32 * 0.01)
                .collect()
        })
        .collect();
    let ws16 = (ws.iter())
        .map(|w| w.iter().map(|&v| half::bf16::from_f32(v)).collect())
        .collect();
    (ws, ws16)
}

/// Best time of 9 passes of the packed product over every matrix of `ws`, `m` input rows,
/// each inside `in_pool` (see [`time_gemv`]).
fn time_packed<W: Weight + Default>(ws: &[Packed<W>], m: usize) -> f64 {
    let (n, k) = (ws[0].n(), ws[0].k());
    let x: Vec<f32> = (0..m * k).map(|j| (j % 5) as f32).collect();
    let mut y = vec![0f32; m * n];
    let mut best = f64::MAX;
    for _ in 0..9 {
        let pass = in_pool(|| {
            let t = Instant::now();
            for w in ws {
                w.matmul(&x, m, None, &mut y);
                std::hint::black_box(&y);
            }
            t.elapsed().as_secs_f64()
        });
        best = best.min(pass);
    }
    best
}

/// The packed product (`... -- packed [megabytes]`) on the transformer's shapes and the
/// frame-rate convolutions' as packed (1024 x 8192 and 512 x 3072 in the encoder, 1024 x 3584
/// and 4096 x 2048 in the decoder), 1 to 256 rows, f32 and bf16 weights,
/// cycling through `megabytes` of distinct matrices: GFLOP/s and weight GB/s.
fn bench_packed(megabytes: usize) {
    for (n, k) in [
        (1536usize, 512usize),
        (2048, 512),
        (512, 2048),
        (1024, 8192),
        (512, 3072),
        (4096, 2048),
        (1024, 3584),
    ] {
        let (raw, raw16) = matrices(megabytes, n, k);
        let mats = raw.len();
        let ws: Vec<Packed<f32>> = raw.iter().map(|w| Packed::pack(&[w], k)).collect();
        let ws16: Vec<Packed<half::bf16>> = raw16.iter().map(|w| Packed::pack(&[w], k)).collect();
        drop((raw, raw16));
        for m in [1usize, 2, 4, 8, 16, 32, 64, 256] {
            let (f32_s, bf16_s) = (time_packed(&ws, m), time_packed(&ws16, m));
            let (gb, gflop) = (
                (mats * n * k * 4) as f64 / 1e9,
                (2 * mats * n * k * m) as f64 / 1e9,
            );
            println!(
                "{{\"packed\": \"{n}x{k}\", \"rows\": {m}, \"f32_ms\": {:.2}, \"f32_gflops\": {:.1}, \
                 \"f32_gb_per_s\": {:.1}, \"bf16_ms\": {:.2}, \"bf16_gflops\": {:.1}}}",
                f32_s * 1e3,
                gflop / f32_s,
                gb / f32_s,
                bf16_s * 1e3,
                gflop / bf16_s,
            );
        }
    }
}

/// The matrix-vector kernel on the transformer's shapes (see the module docs), with f32
/// and with bf16 weights (the same values, rounded).
fn bench_gemv(megabytes: usize) {
    for (n, k) in [(1536usize, 512usize), (512, 512), (2048, 512), (512, 2048)] {
        let (ws, ws16) = matrices(megabytes, n, k);
        let mats = ws.len();
        for m in [1usize, 2, 4, 8, 16, 32] {
            let (f32_s, bf16_s) = (time_gemv(&ws, m, k, n), time_gemv(&ws16, m, k, n));
            let gb = (mats * n * k * 4) as f64 / 1e9;
            println!(
                "{{\"gemv\": \"{n}x{k}\", \"rows\": {m}, \"f32_ms\": {:.2}, \"f32_gb_per_s\": {:.1}, \
                 \"bf16_ms\": {:.2}, \"bf16_gb_per_s\": {:.1}, \"bf16_isa\": \"{:?}\"}}",
                f32_s * 1e3,
                gb / f32_s,
                bf16_s * 1e3,
                gb / 2.0 / bf16_s,
                Isa::detect::<half::bf16>()
            );
        }
    }
}

fn main() -> mimi_core::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("gemv") {
        bench_gemv(args.get(2).and_then(|s| s.parse().ok()).unwrap_or(400));
        return Ok(());
    }
    if args.get(1).map(String::as_str) == Some("packed") {
        bench_packed(args.get(2).and_then(|s| s.parse().ok()).unwrap_or(400));
        return Ok(());
    }
    let repeats: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(20);
    let secs: f64 = std::env::var("SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1.0);
    for &(name, cin, cout, k, stride, len, transposed) in LAYERS {
        let len = (len as f64 * secs) as usize;
        let vm = VarMap::new();
        let vb = VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu);
        let spec = ConvSpec::new(cin, cout, k).stride(stride);
        let data: Vec<f32> = (0..cin * len)
            .map(|i| (i % 13) as f32 * 0.01 - 0.06)
            .collect();
        let x = Frames::new(cin, len, data);
        let mut run: Box<dyn FnMut() -> Frames> = if transposed {
            let conv = ConvTr1d::load(vb, spec)?;
            Box::new(move || conv.step(&mut ConvState::default(), &x, Some(1.0)))
        } else {
            let conv = Conv1d::load(vb, spec)?;
            Box::new(move || conv.step(&mut ConvState::default(), &x, Some(1.0), None, false))
        };
        let mut best = f64::MAX;
        for _ in 0..repeats {
            let t = Instant::now();
            std::hint::black_box(run());
            best = best.min(t.elapsed().as_secs_f64());
        }
        // Multiply-adds: every output frame reads cin * k inputs (a transposed convolution
        // reads cin * k / stride per output frame).
        let flops = if transposed {
            2.0 * (cin * cout * k * len) as f64
        } else {
            2.0 * (cin * cout * k * (len / stride)) as f64
        };
        println!(
            "{{\"layer\": \"{name}\", \"best_us\": {:.0}, \"gflops\": {:.1}}}",
            best * 1e6 / secs,
            flops / best / 1e9
        );
    }
    Ok(())
}
