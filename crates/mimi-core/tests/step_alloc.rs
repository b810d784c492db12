//! A warm streaming codec step allocates nothing of its own: a global allocator counts every
//! allocation around `encode_step_host` + `decode_step_host` (native engine, seeded tiny
//! codec), at 1, 2 and 5 rows (more than one group of rows per thread), from outside the
//! pool (the keepers of `in_pool`) and inside a one-thread pool. What it may allocate is
//! the two arrays it returns (each its values and its shape) and what the `gemm` crate
//! allocates inside its own calls (`runtime::profile::inside_gemm`: its flags on every call,
//! and packing buffers for some shapes), which this test counts apart. (The only test of this
//! binary, so no other test allocates while it counts.)

use mimi_core::runtime::profile::CountingAlloc;
use mimi_core::{Codec, CodecConfig, EncodeStep, HostArray, Result};

#[global_allocator]
static COUNTING: CountingAlloc = CountingAlloc::new();

/// Allocations of one frame's two returned arrays (codes, audio), each values and shape.
const RETURNED: usize = 4;

/// Frames per counted window.
const WINDOW: usize = 4;

/// Allocations outside `gemm` in each window of [`WINDOW`] warm frames of `b` rows, until
/// one window makes only the returned arrays' (at most 6 windows); and the codes of the
/// last frame. The counter sees every thread, and rayon's deques may allocate now and then
/// on their own (crossbeam's deferred frees), so one clean window is the proof: an
/// allocation made by the step itself would show in every window.
fn windows(codec: &Codec, b: usize) -> Result<(Vec<usize>, Vec<u32>)> {
    let f = codec.config().frame_size();
    let (mut enc, mut dec) = (codec.encode_stream(), codec.decode_stream());
    let pcm: Vec<f32> = (0..b * f)
        .map(|i| ((i % 29) as f32 * 0.3).sin() * 0.2)
        .collect();
    let inputs: Vec<HostArray<f32>> = (0..3 + 6 * WINDOW)
        .map(|_| HostArray::new(pcm.clone(), vec![b, 1, f]))
        .collect();
    let mut inputs = inputs.into_iter();
    // The last frame's codes, copied into room made before counting.
    let mut last = Vec::with_capacity(b * codec.config().quantizer_n_q);
    let mut frame = |last: &mut Vec<u32>| -> Result<()> {
        let x = inputs.next().expect("enough inputs");
        let codes = codec.encode_step_host(&mut enc, x, EncodeStep::default())?;
        let codes = codes.expect("one frame of codes");
        last.clear();
        last.extend_from_slice(&codes.data);
        let audio = codec.decode_step_host(&mut dec, codes, None)?;
        assert_eq!(audio.map(|a| a.shape).as_deref(), Some(&[b, 1, f][..]));
        Ok(())
    };
    for _ in 0..3 {
        frame(&mut last)?;
    }
    let mut made = Vec::new();
    while made.len() < 6 && made.last() != Some(&(RETURNED * WINDOW)) {
        let before = COUNTING.counts();
        for _ in 0..WINDOW {
            frame(&mut last)?;
        }
        made.push((COUNTING.counts() - before).outside_gemm());
    }
    Ok((made, last))
}

#[test]
fn a_warm_codec_step_allocates_only_what_it_returns() -> Result<()> {
    let cfg = CodecConfig::tiny();
    let options = mimi_core::OpenOptions {
        config: Some(cfg.clone()),
        ..Default::default()
    };
    let codec = Codec::seeded(3, &options)?;
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .map_err(|e| mimi_core::Error::Internal(e.to_string()))?;
    for b in [1, 2, 5] {
        let gemm = COUNTING.counts().in_gemm;
        let (made, codes) = windows(&codec, b)?;
        assert_eq!(
            made.last(),
            Some(&(RETURNED * WINDOW)),
            "{b} rows: allocations outside gemm in each window of {WINDOW} warm frames \
             (the returned arrays make {RETURNED} a frame): {made:?}"
        );
        // The same frames on one thread, inside its pool: the same codes (a row's bits do not
        // depend on the threads), and again only the returned arrays.
        let (made_one, codes_one) = one.install(|| windows(&codec, b))?;
        assert_eq!(made_one.last(), Some(&(RETURNED * WINDOW)), "{made_one:?}");
        assert_eq!(codes, codes_one, "{b} rows");
        // The counter does see `gemm`'s own allocations (the test would otherwise prove
        // nothing about them being told apart).
        assert!(
            COUNTING.counts().in_gemm > gemm,
            "{b} rows: no gemm call counted"
        );
    }
    Ok(())
}
