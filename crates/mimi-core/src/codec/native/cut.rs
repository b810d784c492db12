//! How the native engine cuts an offline call ([`Offline`]: chunks, transformer blocks,
//! parallel segments), the segment jobs ([`split`]) and a fresh stream over a window
//! ([`stream_window`]). Every cut depends on the input's length only.

use crate::conv::Frames;
use crate::error::{Error, Result};
use rayon::prelude::*;

/// The error of an input too short to give any output.
pub(crate) fn empty() -> Error {
    Error::Shape("the input is too short to produce any output".into())
}

/// How the native engine cuts an offline call. The SEANets run as streams over chunks,
/// which bounds memory; the transformers take blocks of tokens, which amortises reading and
/// packing their weights; and each block's SEANet pass is cut along time into segments that
/// run in parallel (see [`split`]). Every cut depends on the input's length only, never on
/// the number of threads, so results are the same bits on any machine.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Offline {
    /// SEANet encoder input samples per streaming call of its high-rate layers (0.5 s; the
    /// frame-rate tail takes each segment in one call, see `Encoder::frame_rate`). With one segment
    /// in flight per thread, 10 s encode + decode at 2 threads peaked at 586 MB (VmHWM,
    /// moshi-layout file, before the tail was split off); 1 s chunks gave 604 MB and 2 s
    /// 690 MB, at speeds within the noise.
    pub encode_chunk: usize,
    /// SEANet decoder code frames per streaming call of the layers after its first
    /// up-sampling (~1 s; the first convolution and up-sampling take each segment in one
    /// call, see `Decoder::frame_rate`). Longer calls would re-pack the other transposed
    /// convolutions' weights less often, but 2 s chunks raised the peak to 627 MB and 4 s to
    /// 745 MB, at speeds within the noise.
    pub decode_chunk: usize,
    /// Transformer tokens per call. Mimi, 2 threads: 250 tokens in one call 135 ms, in five
    /// calls of 50 216 ms. Memory: 0.5 MB per batch item.
    pub block: usize,
    /// SEANet frames (transformer tokens) per segment.
    pub segment: usize,
}

impl Default for Offline {
    fn default() -> Self {
        // Segments of 5 s: a 10 s clip is two jobs. The warm-up each segment but the first
        // recomputes costs 3.2% of the encoder SEANet's work (3840 samples) and 6.4% of the
        // decoder's (8 frames); on 2 threads the split took 10 s encode from 637 to 520 ms
        // and decode from 539 to 478 ms (benches/README.md).
        Self {
            encode_chunk: 12_000,
            decode_chunk: 12,
            block: 250,
            segment: 125,
        }
    }
}

/// Cuts `[a, b)` into segments of `len` (the last one shorter).
pub(crate) fn segments(a: usize, b: usize, len: usize) -> Vec<(usize, usize)> {
    (a..b)
        .step_by(len.max(1))
        .map(|s| (s, (s + len.max(1)).min(b)))
        .collect()
}

/// Runs a SEANet pass over `[a, b)` (in the pass's input units) for every batch item, as
/// parallel jobs: one per item and segment of `seg` units. The SEANets have no recurrence,
/// so an output depends on a bounded window of input (`warm` units before it):
/// `job(item, s0, s1)` runs a fresh stream from `s0 - warm` and returns the outputs from
/// `s0` on, which are the offline ones. Each job runs on one thread (an idle thread steals
/// its parallel loops), so two cores work on two halves of a clip with no hand-off per
/// layer. Returns each item's output in time order.
pub(crate) fn split<J>(
    batch: usize,
    (a, b): (usize, usize),
    seg: usize,
    job: J,
) -> Result<Vec<Frames>>
where
    J: Fn(usize, usize, usize) -> Result<Frames> + Sync,
{
    let segs = segments(a, b, seg);
    let jobs: Vec<(usize, usize, usize)> = (0..batch)
        .flat_map(|i| segs.iter().map(move |&(s0, s1)| (i, s0, s1)))
        .collect();
    let outs = jobs
        .par_iter()
        .map(|&(i, s0, s1)| job(i, s0, s1))
        .collect::<Result<Vec<_>>>()?;
    Ok(outs
        .chunks(segs.len())
        .map(|parts| Frames::cat(parts[0].channels, parts))
        .collect())
}

/// A fresh stream of `step(chunk, is_final)` over `x[start..end]` in chunks of `chunk`
/// frames, without the first `skip` output frames.
pub(crate) fn stream_window(
    x: &Frames,
    (start, end): (usize, usize),
    chunk: usize,
    skip: usize,
    cout: usize,
    mut step: impl FnMut(&Frames, bool) -> Result<Frames>,
) -> Result<Frames> {
    let mut outs = Vec::new();
    let mut t = start;
    while t < end {
        let n = chunk.max(1).min(end - t);
        outs.push(step(&x.window(t, t + n), t + n == end)?);
        t += n;
    }
    let y = Frames::cat(cout, &outs);
    Ok(y.window(skip.min(y.len), y.len))
}
