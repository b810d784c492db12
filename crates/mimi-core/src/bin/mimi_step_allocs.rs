//! Heap allocations of the codec's warm streaming step on the real-size Mimi shape (seeded
//! f32 weights, native engine): for each batch size B, one `encode_step_host` of B rows (80 ms
//! of audio each) then one `decode_step_host` of its codes, after 5 untimed frames, counted by
//! a global allocator that forwards to the system's. The input array is made before counting;
//! the output arrays are counted (a host call returns new arrays: each its values and its
//! shape, `RETURNED` in all). `in_gemm` counts those made inside calls into the `gemm` crate
//! (`mimi_core::runtime::profile::inside_gemm`: its flags on every call, its packing
//! buffers for some shapes), and `other` what is left once both are taken off: what a
//! planned step brings to 0 (`tests/step_alloc.rs` asserts it).
//!
//! `cargo run --release -p mimi-core --bin mimi_step_allocs -- [batches] [float32|bfloat16]`
//! (default `1,8`, float32 weights) prints one JSON line per B. With `MIMI_ALLOC_SITES=1` it also prints, per B, where they
//! were made (the first frame outside the standard library, which may be a dependency's,
//! and the first `mimi_core` frame of each allocation's backtrace, by count): the list of
//! what is left to plan. The counts on that line then include the other thread's
//! allocations while a backtrace is taken; the list does not.

#![allow(clippy::print_stdout)] // a CLI benchmark: stdout is its output

use mimi_core::runtime::precision::Precision;
use mimi_core::runtime::profile::CountingAlloc;
use mimi_core::{Codec, CodecConfig, EncodeStep, HostArray, OpenOptions, Result};
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// The allocations of the two returned arrays (codes, audio): each its values and its shape.
const RETURNED: usize = 4;

static SITES_ON: AtomicBool = AtomicBool::new(false);
static SITES: Mutex<Option<HashMap<String, usize>>> = Mutex::new(None);

thread_local! {
    /// This thread is recording a site (the backtrace allocates too).
    static RECORDING: Cell<bool> = const { Cell::new(false) };
}

/// Adds the calling allocation's site to [`SITES`] (when on, and not from within itself):
/// the first frame outside the standard library and this allocator (which may be a
/// dependency's), then the first `mimi_core` frame, each with its file and line.
fn record() {
    if !SITES_ON.load(Ordering::Relaxed) || RECORDING.with(|c| c.replace(true)) {
        return;
    }
    let trace = std::backtrace::Backtrace::force_capture().to_string();
    let lines: Vec<&str> = trace.lines().map(str::trim).collect();
    // (function, "at file:line") of each frame.
    let frames: Vec<(&str, &str)> = (lines.iter().enumerate())
        .filter_map(|(i, l)| l.split_once(": ").map(|(_, f)| (i, f)))
        .map(|(i, f)| {
            let at = lines.get(i + 1).filter(|a| a.starts_with("at "));
            (f, at.map_or("", |a| a.rsplit('/').next().unwrap_or(a)))
        })
        .collect();
    let outside = |f: &str| {
        ![
            "std::",
            "core::",
            "alloc::",
            "mimi_step_allocs::",
            "<alloc::",
            "__rust",
        ]
        .iter()
        .any(|p| f.starts_with(p))
            && !f.contains("backtrace")
            && !f.contains("CountingAlloc")
    };
    let first = frames.iter().find(|(f, _)| outside(f));
    let ours = (frames.iter()).find(|(f, _)| f.contains("mimi_core::") && outside(f));
    let site = [first, ours]
        .iter()
        .flatten()
        .map(|(f, at)| format!("{f} @ {at}"))
        .collect::<Vec<_>>()
        .join(" < ");
    if let Ok(mut sites) = SITES.lock() {
        *sites
            .get_or_insert_with(HashMap::new)
            .entry(site)
            .or_default() += 1;
    }
    RECORDING.with(|c| c.set(false));
}

#[global_allocator]
static COUNTING: CountingAlloc = CountingAlloc::with_hook(Some(record));

/// Allocations of one frame of `b` rows after 5 warm ones: (encode, decode, inside gemm).
fn count_frame(codec: &Codec, b: usize, sites: bool) -> Result<(usize, usize, usize)> {
    let f = codec.config().frame_size();
    let (mut enc, mut dec) = (codec.encode_stream(), codec.decode_stream());
    let pcm: Vec<f32> = (0..b * f).map(|i| (i % 13) as f32 * 0.01 - 0.06).collect();
    let mut counts = (0, 0, 0);
    for i in 0..6 {
        let x = HostArray::new(pcm.clone(), vec![b, 1, f]);
        let c0 = COUNTING.counts();
        SITES_ON.store(sites && i == 5, Ordering::SeqCst);
        let codes = codec.encode_step_host(&mut enc, x, EncodeStep::default())?;
        let c1 = COUNTING.counts();
        if let Some(codes) = codes {
            codec.decode_step_host(&mut dec, codes, None)?;
        }
        SITES_ON.store(false, Ordering::SeqCst);
        let c2 = COUNTING.counts();
        counts = ((c1 - c0).total, (c2 - c1).total, (c2 - c0).in_gemm);
    }
    Ok(counts)
}

fn main() -> Result<()> {
    let batches: Vec<usize> = (std::env::args()
        .nth(1)
        .as_deref()
        .unwrap_or("1,8")
        .split(','))
    .filter_map(|s| s.trim().parse().ok())
    .collect();
    let sites = std::env::var("MIMI_ALLOC_SITES").is_ok_and(|v| v == "1");
    let name = std::env::args().nth(2).unwrap_or_else(|| "highest".into());
    let precision = Precision::parse(&name).or_else(|_| Precision::from_weights_dtype(&name))?;
    let options = OpenOptions {
        config: Some(CodecConfig::mimi(8)),
        precision,
        ..Default::default()
    };
    let codec = Codec::seeded(0, &options)?;
    for b in batches {
        let (enc, dec, gemm) = count_frame(&codec, b, sites)?;
        let other = (enc + dec).saturating_sub(gemm + RETURNED);
        println!(
            "{{\"batch\": {b}, \"encode_step\": {enc}, \"decode_step\": {dec}, \"in_gemm\": {gemm}, \"other\": {other}}}"
        );
        let mut list: Vec<(String, usize)> = (SITES.lock().ok())
            .and_then(|mut s| s.take())
            .map(|s| s.into_iter().collect())
            .unwrap_or_default();
        list.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        list.iter()
            .for_each(|(site, n)| println!("  {n:5}  {site}"));
    }
    Ok(())
}
