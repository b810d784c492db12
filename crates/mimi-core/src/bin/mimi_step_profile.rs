//! Per-layer profile of the codec's batched streaming step on the real-size Mimi shape
//! (seeded weights, native engine): for each batch size B, `frames` frames of a masked
//! `encode_step` then `decode_step` of B rows (80 ms of audio per row), with
//! [`mimi_core::runtime::profile`]'s timers on.
//!
//! `cargo run --release -p mimi-core --bin mimi_step_profile -- [batches] [frames] [weights] [overhead]`
//! (defaults `1,4,8,16`, 20, `float32`; B = 0 is the offline path, below; `overhead` adds the
//! plan's overhead, [`overhead`]) prints one JSON line per B: the median frame time
//! and, per layer, milliseconds per frame (all rows) and calls per frame. `benches/run.py
//! --suites layers` runs it and writes the table into its report.

#![allow(clippy::print_stdout)] // a CLI benchmark: stdout is its output

use mimi_core::runtime::precision::Precision;
use mimi_core::runtime::profile::{self, Entry};
use mimi_core::{Codec, CodecConfig, EncodeStep, HostArray, OpenOptions, Result};
use std::time::Instant;

/// Uniform noise in [-0.1, 0.1) from a linear congruential generator (no extra crates).
fn noise(n: usize, seed: &mut u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2
        })
        .collect()
}

/// The median of `v` (the upper one of an even count).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Every label of the timers' tables `frames` (one table per frame), in order of first
/// appearance.
fn labels(frames: &[Vec<Entry>]) -> Vec<String> {
    let mut labels: Vec<String> = Vec::new();
    for e in frames.iter().flatten() {
        if !labels.contains(&e.label) {
            labels.push(e.label.clone());
        }
    }
    labels
}

/// `label`'s milliseconds in each of `frames` (0 in a frame without it).
fn layer_ms(frames: &[Vec<Entry>], label: &str) -> Vec<f64> {
    (frames.iter())
        .map(|t| {
            let e = t.iter().find(|e| e.label == label);
            e.map_or(0.0, |e| e.total.as_secs_f64() * 1e3)
        })
        .collect()
}

/// Times `frames` frames of B rows (after 3 untimed ones); returns the JSON line.
fn profile_batch(codec: &Codec, batch: usize, frames: usize, seed: &mut u64) -> Result<String> {
    let f = codec.config().frame_size();
    let (mut enc, mut dec) = (codec.encode_stream(), codec.decode_stream());
    let mut times = Vec::new();
    for i in 0..frames + 3 {
        let pcm = HostArray::new(noise(batch * f, seed), vec![batch, 1, f]);
        profile::take();
        profile::enable(i >= 3);
        let t0 = Instant::now();
        if let Some(codes) = codec.encode_step_host(&mut enc, pcm, EncodeStep::default())? {
            codec.decode_step_host(&mut dec, codes, None)?;
        }
        let dt = t0.elapsed().as_secs_f64() * 1e3;
        profile::enable(false);
        if i >= 3 {
            times.push((dt, profile::take()));
        }
    }
    let (frame_ms, tables): (Vec<f64>, Vec<Vec<Entry>>) = times.into_iter().unzip();
    // Per label of the first frame: the median over frames of its milliseconds in that frame.
    let layers: Vec<String> = (labels(&tables[..1]).iter())
        .map(|l| {
            let calls = tables[0]
                .iter()
                .find(|e| &e.label == l)
                .map_or(0, |e| e.calls);
            format!(
                "{{\"layer\": \"{l}\", \"ms\": {:.3}, \"calls\": {calls}}}",
                median(layer_ms(&tables, l))
            )
        })
        .collect();
    Ok(format!(
        "{{\"batch\": {batch}, \"frames\": {frames}, \"frame_median_ms\": {:.3}, \"layers\": [{}]}}",
        median(frame_ms),
        layers.join(", ")
    ))
}

/// Batch size 0 profiles the offline path instead: `frames` frames of one row, one `encode`
/// then one `decode`, each layer's time divided by the frames (ms per frame).
fn profile_offline(codec: &Codec, frames: usize, seed: &mut u64) -> Result<String> {
    let n = frames * codec.config().frame_size();
    let pcm = HostArray::new(noise(n, seed), vec![1, 1, n]);
    codec.decode_host(codec.encode_host(pcm.clone(), None, None)?, None, None)?; // warm-up
    profile::take();
    profile::enable(true);
    let t0 = Instant::now();
    codec.decode_host(codec.encode_host(pcm, None, None)?, None, None)?;
    let dt = t0.elapsed().as_secs_f64() * 1e3 / frames as f64;
    profile::enable(false);
    let layers: Vec<String> = (profile::take().iter())
        .map(|e| {
            let ms = e.total.as_secs_f64() * 1e3 / frames as f64;
            format!(
                "{{\"layer\": \"{}\", \"ms\": {ms:.3}, \"calls\": {}}}",
                e.label, e.calls
            )
        })
        .collect();
    Ok(format!(
        "{{\"batch\": 0, \"frames\": {frames}, \"frame_median_ms\": {dt:.3}, \"layers\": [{}]}}",
        layers.join(", ")
    ))
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let batches: Vec<usize> = args
        .get(1)
        .map_or("1,4,8,16", String::as_str)
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let frames: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(20);
    let name = args.get(3).map_or("highest", String::as_str);
    let precision = Precision::parse(name).or_else(|_| Precision::from_weights_dtype(name))?;
    let options = OpenOptions {
        config: Some(CodecConfig::mimi(8)),
        precision,
        ..Default::default()
    };
    let codec = Codec::seeded(0, &options)?;
    let mut seed = 1u64;
    for b in batches {
        let line = match b {
            0 => profile_offline(&codec, frames.max(1), &mut seed)?,
            _ => profile_batch(&codec, b, frames.max(1), &mut seed)?,
        };
        println!("{line}");
    }
    if args.get(4).is_some_and(|a| a == "overhead") {
        println!("{}", overhead(&codec, frames.max(1), &mut seed)?);
    }
    Ok(())
}

/// The plan's overhead (`overhead` as the fourth argument): B = 1 frames with every matrix
/// product skipped ([`profile::skip_products`]) against whole frames, alternating, in one
/// process. Prints the two medians and their ratio.
fn overhead(codec: &Codec, frames: usize, seed: &mut u64) -> Result<String> {
    let f = codec.config().frame_size();
    let (mut enc, mut dec) = (codec.encode_stream(), codec.decode_stream());
    let (mut whole, mut skipped) = (Vec::new(), Vec::new());
    let mut tables = Vec::new(); // the skipped frames' timers
    for i in 0..2 * (frames + 3) {
        let pcm = HostArray::new(noise(f, seed), vec![1, 1, f]);
        profile::skip_products(i % 2 == 1);
        profile::take();
        profile::enable(i % 2 == 1 && i >= 6);
        let t0 = Instant::now();
        if let Some(mut codes) = codec.encode_step_host(&mut enc, pcm, EncodeStep::default())? {
            // Skipped products leave the latents as they were: codes may be anything.
            let top = codec.config().quantizer_bins as u32 - 1;
            codes.data.iter_mut().for_each(|c| *c = (*c).min(top));
            codec.decode_step_host(&mut dec, codes, None)?;
        }
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        profile::enable(false);
        let table = profile::take();
        if i >= 6 {
            [&mut whole, &mut skipped][i % 2].push(ms);
            if i % 2 == 1 {
                tables.push(table);
            }
        }
    }
    profile::skip_products(false);
    // Per label: its milliseconds per skipped frame (the mean over them), largest first.
    let mut layers: Vec<(String, f64)> = (labels(&tables).into_iter())
        .map(|l| {
            let ms = layer_ms(&tables, &l)
                .iter()
                .map(|ms| ms / frames as f64)
                .sum();
            (l, ms)
        })
        .collect();
    layers.sort_by(|a, b| b.1.total_cmp(&a.1));
    let top: Vec<String> = (layers.iter().take(8))
        .map(|(l, ms)| format!("{{\"layer\": \"{l}\", \"ms\": {ms:.3}}}"))
        .collect();
    let (w, s) = (median(whole), median(skipped));
    Ok(format!(
        "{{\"overhead\": {{\"batch\": 1, \"frame_median_ms\": {w:.3}, \"no_products_median_ms\": {s:.3}, \"ratio\": {:.4}, \"top_layers\": [{}]}}}}",
        s / w,
        top.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a small codec: the line names the batch and frames, every layer of both directions
    /// is timed, and the timers are off again afterwards.
    #[test]
    fn a_batched_frame_is_timed_layer_by_layer() -> Result<()> {
        let options = OpenOptions {
            config: Some(CodecConfig::tiny()),
            ..Default::default()
        };
        let codec = Codec::seeded(0, &options)?;
        let line = profile_batch(&codec, 3, 2, &mut 1)?;
        assert!(line.starts_with("{\"batch\": 3, \"frames\": 2,"), "{line}");
        for layer in [
            "enc.init",
            "enc.s3.res0",
            "enc.last",
            "enc.transformer",
            "downsample",
        ] {
            assert!(
                line.contains(&format!("{{\"layer\": \"{layer}\"")),
                "{layer}: {line}"
            );
        }
        for layer in [
            "quantizer.encode",
            "upsample",
            "dec.transformer",
            "dec.s0.up",
            "dec.last",
        ] {
            assert!(
                line.contains(&format!("{{\"layer\": \"{layer}\"")),
                "{layer}: {line}"
            );
        }
        assert!(line.contains("\"calls\": 1}"), "{line}");
        assert!(!profile::enabled(), "the timers are off again");
        // The overhead mode (in the same test: the timers and the skip are process-wide).
        let line = overhead(&codec, 2, &mut 1)?;
        let head = "{\"overhead\": {\"batch\": 1, \"frame_median_ms\": ";
        assert!(line.starts_with(head), "{line}");
        assert!(line.contains("\"top_layers\": [{\"layer\": \""), "{line}");
        assert!(!profile::enabled() && !profile::products_skipped());
        Ok(())
    }

    #[test]
    fn medians_and_labels_read_every_frames_table() {
        let entry = |label: &str, ms: u64| Entry {
            label: label.into(),
            total: std::time::Duration::from_millis(ms),
            calls: 1,
        };
        let tables = vec![vec![entry("a", 1)], vec![entry("b", 2), entry("a", 3)]];
        assert_eq!(labels(&tables), ["a", "b"]);
        assert_eq!(labels(&tables[..1]), ["a"]);
        assert_eq!(layer_ms(&tables, "b"), [0.0, 2.0]);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0]), 4.0);
    }
}
