"""Audio -> Mimi tokens -> audio: the codec's job, on a generated speech-like signal.

    python examples/tokenize_audio.py                            # seeded random weights, no download
    python examples/tokenize_audio.py --weights hf:kyutai/mimi   # the real codec (pip install 'mimi_py[hub]')

--weights also takes a local path (kyutai/mimi's model.safetensors, its directory, or Kyutai's
moshi-format checkpoint) or hf:REPO[@REVISION][:FILENAME]. With the seeded weights the codes are
real codes of a random model, so the reconstruction is poor; with the real weights it is speech.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from mimi_py.hub import load_codec


def speech_like(seconds: float, sr: int) -> np.ndarray:
    """A deterministic vowel-like signal: a gliding pitch, moving formants and syllable bursts."""
    t = np.arange(int(seconds * sr)) / sr
    f0 = 120 + 25 * np.sin(2 * np.pi * 0.7 * t) + 15 * t / seconds  # pitch contour (Hz)
    phase = 2 * np.pi * np.cumsum(f0) / sr
    f1 = 500 + 200 * np.sin(2 * np.pi * 0.9 * t)  # formants drift: the vowel changes
    f2 = 1500 + 500 * np.sin(2 * np.pi * 0.4 * t + 1.0)
    x = np.zeros_like(t)
    for k in range(1, 40):  # harmonics shaped by two formant resonances and a -6 dB/octave tilt
        fk = k * f0
        gain = np.exp(-(((fk - f1) / 150) ** 2)) + 0.5 * np.exp(-(((fk - f2) / 250) ** 2)) + 0.05
        x += np.where(fk < sr / 2, gain / k, 0.0) * np.sin(k * phase)
    syllables = np.clip(np.sin(2 * np.pi * 3.0 * t), 0, None) ** 0.5  # ~6 syllables/s, with gaps
    breath = 0.01 * np.random.default_rng(0).standard_normal(t.size)
    x = x * syllables + breath
    return (0.3 * x / np.abs(x).max()).astype(np.float32)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--weights", default=None, help="hf:kyutai/mimi or a path (default: seeded weights)")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--num-codebooks", type=int, default=None, help="default: the checkpoint's (its config's)")
    args = p.parse_args()

    codec = load_codec(args.weights, num_codebooks=args.num_codebooks, seed=0)
    pcm = speech_like(args.seconds, codec.sample_rate)

    t0 = time.perf_counter()
    codes = codec.encode(pcm)  # (1, num_codebooks, frames) uint32 in [0, cardinality)
    t1 = time.perf_counter()
    audio = codec.decode(codes)[0, 0, : pcm.size]  # (1, 1, frames * frame_size) float32
    t2 = time.perf_counter()

    snr = 10 * np.log10(np.sum(pcm**2) / np.sum((pcm - audio) ** 2))
    corr = np.corrcoef(pcm, audio)[0, 1]
    print(f"weights: {args.weights or 'seeded random (seed 0)'}")
    print(
        f"{args.seconds:.1f} s at {codec.sample_rate} Hz -> {codes.shape[-1]} frames at {codec.frame_rate} Hz"
    )
    print(f"codes {codes.shape} {codes.dtype}, {codec.num_codebooks} codebooks of {codec.cardinality}")
    print(f"first frame: {codes[0, :, 0].tolist()}")
    print(f"encode {t1 - t0:.2f} s (real-time factor {args.seconds / (t1 - t0):.1f}x)")
    print(f"decode {t2 - t1:.2f} s (real-time factor {args.seconds / (t2 - t1):.1f}x)")
    print(f"reconstruction: SNR {snr:.1f} dB, correlation {corr:.3f}")
    if args.weights is None:
        print(
            "(seeded random weights: the codes are real codes of an untrained model, so the audio "
            "that comes back is noise, SNR near or below 0 dB; --weights hf:kyutai/mimi gives speech)"
        )


if __name__ == "__main__":
    main()
