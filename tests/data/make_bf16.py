"""Write codec/mimi_small_moshi_bf16.safetensors: a bfloat16 copy of codec/mimi_small_moshi.safetensors.

    python tests/data/make_bf16.py

Reproducible (pure numpy, no randomness): numpy has no bfloat16, so each float32 value is
rounded to nearest-even on its upper 16 bits (what ``torch.Tensor.to(torch.bfloat16)`` does)
and stored under the safetensors dtype ``"BF16"``. Tensor order, names, shapes and the
``__metadata__`` entry are those of the source file.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))  # the safetensors writer
from safetensors_file import read_header, write_raw  # noqa: E402

CODEC = Path(__file__).resolve().parent / "codec"
SOURCE = CODEC / "mimi_small_moshi.safetensors"
TARGET = CODEC / "mimi_small_moshi_bf16.safetensors"


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """The bfloat16 bit patterns (uint16) of float32 ``x``, rounded to nearest, ties to even."""
    bits = np.ascontiguousarray(x, dtype="<f4").view("<u4")
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = np.isnan(x)
    rounded[nan] = (bits[nan] >> np.uint32(16)) | np.uint32(0x0040)  # stay a (quiet) NaN
    return rounded.astype("<u2")


def convert(source: Path, target: Path) -> int:
    """Write the bfloat16 copy of float32 safetensors file ``source`` to ``target``; returns the tensor count."""
    header, data = read_header(source)
    if "__metadata__" in header and next(iter(header)) != "__metadata__":  # write_raw puts it first
        raise ValueError(f"{source}: __metadata__ is not the first entry of the header")
    metadata = header.pop("__metadata__", None)
    out = {}
    for name, info in header.items():  # json keeps the file's order
        if info["dtype"] != "F32":
            raise ValueError(f"{name}: expected F32, got {info['dtype']}")
        a, b = info["data_offsets"]
        out[name] = ("BF16", info["shape"], to_bf16_bits(np.frombuffer(data[a:b], dtype="<f4")).tobytes())
    write_raw(target, out, metadata)
    return len(out)


def main() -> None:
    """Convert SOURCE to TARGET and print a one-line summary."""
    n = convert(SOURCE, TARGET)
    print(f"{TARGET.name}: {n} tensors, {TARGET.stat().st_size} bytes")


if __name__ == "__main__":
    main()
