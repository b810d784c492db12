"""wav -> codes -> wav with the Mimi codec.

    python examples/roundtrip.py [IN.wav] [OUT.wav] [--weights PATH]

With no --weights this uses seeded random weights of the real architecture, so it runs with
no downloads but the decoded audio is noise: the codes are real codes of a random model. For
real use pass kyutai/mimi's checkpoint: --weights path/to/model.safetensors (or its directory
with config.json, or Kyutai's moshi-format tokenizer checkpoint). With no input file a 3 s
chirp is synthesised. Needs the audio extra: pip install '.[audio]'.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import soundfile as sf

import mimi_py


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("input", nargs="?")
    p.add_argument("output", nargs="?", default="roundtrip.wav")
    p.add_argument("--weights", default=None)
    p.add_argument("--num-codebooks", type=int, default=None, help="default: the checkpoint's (its config's)")
    args = p.parse_args()

    codec = mimi_py.MimiCodec(args.weights, num_codebooks=args.num_codebooks)
    if args.weights is None:
        print(
            "warning: seeded random weights: the decoded audio will be noise "
            "(pass --weights model.safetensors for the real model)",
            file=sys.stderr,
        )
    sr = codec.sample_rate
    if args.input:
        pcm, file_sr = sf.read(args.input, dtype="float32", always_2d=True)
        pcm = pcm.mean(axis=1)
        if file_sr != sr:
            import soxr

            pcm = soxr.resample(pcm, file_sr, sr).astype(np.float32)
    else:
        t = np.arange(3 * sr) / sr
        pcm = (0.3 * np.sin(2 * np.pi * (110 + 500 * t) * t)).astype(np.float32)

    t0 = time.perf_counter()
    codes = codec.encode(pcm)  # (1, num_codebooks, frames) uint32
    t1 = time.perf_counter()
    audio = codec.decode(codes)  # (1, 1, frames * frame_size) float32
    t2 = time.perf_counter()
    seconds = len(pcm) / sr
    print(
        f"{seconds:.2f} s of audio -> codes {codes.shape} ({codec.frame_rate} Hz, "
        f"{codec.num_codebooks} codebooks of {codec.cardinality})"
    )
    print(
        f"encode {t1 - t0:.2f} s (x{seconds / (t1 - t0):.1f} real time), "
        f"decode {t2 - t1:.2f} s (x{seconds / (t2 - t1):.1f} real time)"
    )
    sf.write(args.output, audio[0, 0], sr, subtype="FLOAT")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
