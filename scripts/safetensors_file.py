"""The repository's one safetensors writer and reader (little-endian, C order), shared by the
tests (``pythonpath`` in pyproject.toml) and the benchmarks (``benches/common.py``), so that
neither needs an extra package nor imports the other's code. A file is an 8-byte little-endian
header length, a JSON header padded with spaces to 8 bytes (``__metadata__`` first, if any,
then the tensors in the order written), and the tensors' bytes one after the other."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np

# What ``write_raw`` takes as a tensor's data: bytes, or an array exposing its buffer.
Buffer = bytes | bytearray | memoryview | np.ndarray

# The safetensors dtype of each numpy dtype written here.
DTYPES = {
    np.dtype("float32"): "F32",
    np.dtype("float16"): "F16",
    np.dtype("float64"): "F64",
    np.dtype("int64"): "I64",
    np.dtype("int32"): "I32",
    np.dtype("uint8"): "U8",
}


def _head(layout: list[tuple[str, str, Sequence[int], int]], metadata: dict | None) -> tuple[bytes, int]:
    """(the header with its length prefix, the size of the data) for ``(name, dtype, shape,
    nbytes)`` tensors stored one after the other in that order."""
    header: dict = {} if metadata is None else {"__metadata__": metadata}
    offset = 0
    for name, dtype, shape, nbytes in layout:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, offset


def _bytes(b: Buffer) -> memoryview:
    """The bytes of ``b`` (C-contiguous), without a copy."""
    m = memoryview(b)
    return m.cast("B") if m.nbytes else memoryview(b"")


def write_raw(
    path, tensors: dict[str, tuple[str, Sequence[int], Buffer]], metadata: dict | None = None
) -> None:
    """Writes ``{name: (safetensors dtype, shape, little-endian C-order bytes or a C-contiguous
    array)}`` in the order given, with ``metadata`` as the ``__metadata__`` entry if given. The
    file is written beside ``path`` and moved into place, so another process (the benchmarks'
    workers share a cache of weight files) never reads a partial file."""
    views = {name: (d, shape, _bytes(b)) for name, (d, shape, b) in tensors.items()}
    head, _ = _head([(name, d, shape, v.nbytes) for name, (d, shape, v) in views.items()], metadata)
    tmp = Path(f"{path}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(head)
        for _, _, v in views.values():
            f.write(v)
    os.replace(tmp, path)


def write_safetensors(path, tensors: dict[str, np.ndarray]) -> None:
    """Writes numpy arrays (any layout and byte order) in sorted name order; little-endian
    C-ordered arrays are written without a copy."""
    raw = {}
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        raw[name] = (DTYPES[a.dtype], a.shape, a)
    write_raw(path, raw)


def write_zeros(path, shapes: dict[str, Sequence[int]]) -> None:
    """A checkpoint of float32 zeros with these names and shapes (sorted), sparse on disk: a
    real-size checkpoint costs only its header."""
    layout = [(name, "F32", shape, 4 * int(np.prod(shape))) for name, shape in sorted(shapes.items())]
    head, size = _head(layout, None)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + size)


def read_shapes(path) -> dict[str, list[int]]:
    """``{name: shape}`` from a file's header alone (its data is not read)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return {k: v["shape"] for k, v in header.items() if k != "__metadata__"}


def read_header(path) -> tuple[dict, bytes]:
    """(the header, in the file's order, ``__metadata__`` included; the data after it)."""
    raw = Path(path).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def read_safetensors(path) -> dict[str, np.ndarray]:
    """The floating tensors of a safetensors file as float32 (F32, F16, or BF16 upcast exactly)."""
    header, raw = read_header(path)
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        data = raw[a:b]
        if v["dtype"] == "BF16":  # the upper 16 bits of a float32
            x = (np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            x = np.frombuffer(data, dtype={"F32": "<f4", "F16": "<f2"}[v["dtype"]]).astype(np.float32)
        out[k] = x.reshape(v["shape"])
    return out
