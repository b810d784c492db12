"""Writes the fuzz targets' seed corpora (fuzz/corpus/<target>/) from the test data, so that
libFuzzer starts from inputs that reach deep: the checkpoint target's from the fixtures' small
codec (tests/data/codec, both layouts) shrunk to the micro config of fuzz/src/lib.rs (every
width divided by 4, the structure and names unchanged); the config target's from the fixtures'
configs (Hugging Face config.json, candle dicts, transformer configs). The structured targets
(host_calls, streams) start from a few fixed byte strings. Deterministic: rerunning rewrites the
same files.

    python fuzz/make_corpus.py
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from safetensors_file import read_header  # noqa: E402

CORPUS = ROOT / "fuzz" / "corpus"
CODEC = ROOT / "tests" / "data" / "codec"
WIDTH_DIVISOR = 4


def shrunk(shape: list[int]) -> list[int]:
    """A fixture tensor's shape in the micro config: every width divided by 4 (1 stays 1); a
    convolution's kernel (the last of three dimensions) unchanged."""
    widths = shape[:-1] if len(shape) == 3 else shape
    out = [w // WIDTH_DIVISOR if w >= WIDTH_DIVISOR else w for w in widths]
    return out + shape[-1:] if len(shape) == 3 else out


def micro_checkpoint(source: Path, dtype: str, seed: int) -> bytes:
    """``source``'s names in order, shrunk, with seeded values in ``dtype`` (F32 or F16)."""
    header, _ = read_header(source)
    rng = np.random.default_rng(seed)
    np_dtype = {"F32": "<f4", "F16": "<f2"}[dtype]
    out, blobs, offset = {}, [], 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        shape = shrunk(entry["shape"])
        data = (rng.standard_normal(int(np.prod(shape))) * 0.1).astype(np_dtype).tobytes()
        out[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(out, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw + b"".join(blobs)


def write(target: str, name: str, data: bytes) -> None:
    folder = CORPUS / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)


def checkpoints() -> None:
    """The first byte picks how the target opens the file (engine, precision)."""
    seeds = [
        ("hf_f16_native", "mimi_small.safetensors", "F16", 0),
        ("moshi_f16_high", "mimi_small_moshi.safetensors", "F16", 1),
        ("moshi_f32_candle", "mimi_small_moshi.safetensors", "F32", 2),
        ("hf_f16_medium", "mimi_small.safetensors", "F16", 3),
    ]
    for name, source, dtype, selector in seeds:
        write("checkpoint", name, bytes([selector]) + micro_checkpoint(CODEC / source, dtype, selector))
    write("checkpoint", "empty_header", bytes([0]) + (2).to_bytes(8, "little") + b"{}")


def configs() -> None:
    write("config", "hf_config.json", (CODEC / "mimi_small_hf_config.json").read_bytes())
    write("config", "candle_config.json", (CODEC / "mimi_small_candle_config.json").read_bytes())
    for case in ["small_rope", "small_sin_rms_gated", "depth2"]:
        cfg = json.loads((ROOT / "tests" / "data" / "transformer" / f"{case}.json").read_text())["config"]
        write("config", f"transformer_{case}.json", json.dumps(cfg, indent=1).encode())


def structured() -> None:
    rng = random.Random(7)
    for target in ["host_calls", "streams"]:
        for i, n in enumerate([16, 64, 256, 1024]):
            write(target, f"random_{i}", bytes(rng.randrange(256) for _ in range(n)))


if __name__ == "__main__":
    checkpoints()
    configs()
    structured()
    for folder in sorted(CORPUS.iterdir()):
        files = list(folder.iterdir())
        print(f"{folder.name}: {len(files)} files, {sum(f.stat().st_size for f in files)} bytes")
