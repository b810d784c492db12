"""Shared helpers: the reference data in tests/data (loaded by fixtures.py) and small utilities."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from fixtures import TRANSFORMER_DIR, load_case

REPO = Path(__file__).resolve().parents[1]

if not TRANSFORMER_DIR.is_dir():  # pragma: no cover - a broken checkout, not a skip
    raise RuntimeError(f"reference data not found at {TRANSFORMER_DIR}")

# Cases with arrays (npz); gqa must be refused (kv_repeat=2).
NUMERIC_CASES = ["small_rope", "small_sin_rms_gated", "mimi"]


def assert_close(actual, expected, atol=1e-4, rtol=1e-4, what=""):
    """The fixtures' rule: |actual - expected| <= atol + rtol * |expected|, elementwise."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    err = np.abs(actual - expected)
    bound = atol + rtol * np.abs(expected)
    bad = err > bound
    assert not bad.any(), (
        f"{what}: {bad.sum()} of {bad.size} values out of tolerance; "
        f"max abs err {err.max():.3g} (atol={atol}, rtol={rtol})"
    )


def write_safetensors(path, tensors: dict[str, np.ndarray]) -> None:
    """A minimal safetensors writer (little-endian, C order), so tests need no extra package."""
    codes = {
        np.dtype("float32"): "F32",
        np.dtype("float16"): "F16",
        np.dtype("float64"): "F64",
        np.dtype("int64"): "I64",
        np.dtype("int32"): "I32",
        np.dtype("uint8"): "U8",
    }
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        data = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {
            "dtype": codes[a.dtype],
            "shape": list(a.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for b in blobs:
            f.write(b)


def read_safetensors(path) -> dict[str, np.ndarray]:
    """The floating tensors of a safetensors file as float32 (F32, F16, or BF16 upcast exactly)."""
    raw = Path(path).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        data = raw[8 + n + a : 8 + n + b]
        if v["dtype"] == "BF16":  # the upper 16 bits of a float32
            x = (np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            x = np.frombuffer(data, dtype={"F32": "<f4", "F16": "<f2"}[v["dtype"]]).astype(np.float32)
        out[k] = x.reshape(v["shape"])
    return out


def make_hf_cache(cache, repo_id, snapshots, refs=None) -> Path:
    """Lay out ``repo_id`` in the Hugging Face cache folder ``cache`` as huggingface_hub does.

    ``snapshots`` maps a commit hash (40 hex digits) to ``{name in the repo: source}``, where a
    source is a file to copy or a function that writes the file at the path it is given.
    ``refs`` maps a branch or tag to a commit hash (default: ``main`` -> the first snapshot).
    Each file is stored once as ``blobs/<sha256>``, and ``snapshots/<hash>/<name>`` is a
    relative symlink to it. Returns the repository's folder (``models--ORG--NAME``).
    """
    repo = Path(cache) / ("models--" + repo_id.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for commit, files in snapshots.items():
        for name, src in files.items():
            part = repo / "blobs" / "download.incomplete"
            src(part) if callable(src) else shutil.copyfile(src, part)
            digest = hashlib.sha256()
            with open(part, "rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
            blob = repo / "blobs" / digest.hexdigest()
            os.replace(part, blob)
            link = repo / "snapshots" / commit / name
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob, link.parent))
    for ref, commit in (refs or {"main": next(iter(snapshots))}).items():
        (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)  # no newline, as huggingface_hub writes it
    return repo


@pytest.fixture(scope="session")
def small_case():
    return load_case("small_rope")
