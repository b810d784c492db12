"""What every stage of :mod:`mimi_py.data` shares: the optional imports, the output schema and
its codes column, the per-file error text, and the run's progress line.

No other module of the package is imported here, so every one of them can import this.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover - typing only; an optional dependency
    import pyarrow as pa

__all__ = ["MANIFEST_NAME", "Progress", "codes_to_numpy", "output_schema"]

MANIFEST_NAME = ".MANIFEST.json"
"""The job's record in ``OUTPUT_DIR``: config, weights identity, versions, counts. A hidden file
(leading ``.``), so that pyarrow, pandas and HF ``datasets`` read the folder as Parquet only."""
LEGACY_MANIFEST_NAME = "MANIFEST.json"  # before 0.1: read to resume, then replaced
MANIFEST_FORMAT = "mimi_py.tokenize/1"  # .MANIFEST.json's "format"
_INSTALL = "pip install 'mimi_py[data]'"
PART_NAME = re.compile(r"part-[0-9A-Za-z_-]+\.parquet")
MAX_INLINE_SECONDS = 3600.0  # longer files are streamed from disk by the codec stage itself


def need(name: str):
    """Import an optional dependency of the data extra, or say how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        extra = "ray[data]" if name.startswith("ray") else name
        raise ImportError(f"mimi_py.data needs {extra}: {_INSTALL}") from e


def check_positive(**values: float | None) -> None:
    for name, v in values.items():
        if v is not None and not v > 0:
            raise ConfigError(f"`{name}` must be positive, got {v!r}")


def check_cardinality(codec: Any) -> None:
    """Codes are stored as uint16."""
    if codec.cardinality > 1 << 16:
        raise ConfigError(f"codes of cardinality {codec.cardinality} do not fit uint16")


def error_text(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def timestamp() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def batch_column(batch: Any, name: str) -> list[Any] | None:
    """A column of a pyarrow Table or a dict of columns as a Python list, or None if absent."""
    if hasattr(batch, "column_names"):
        return batch.column(name).to_pylist() if name in batch.column_names else None
    if name not in batch:
        return None
    col = batch[name]
    return col.tolist() if hasattr(col, "tolist") else list(col)


def output_schema() -> pa.Schema:
    """The Arrow schema of the Parquet rows :func:`~mimi_py.data.tokenize` writes (one row per
    input file).

    ``path`` (the input path as given), ``sample_rate`` (the file's own rate), ``duration_s``
    (the source duration), ``num_frames``, ``num_codebooks``, ``codes`` (list<list<uint16>>,
    ``num_codebooks`` lists of ``num_frames`` codes; null on error) and ``error`` (null when the
    file was tokenized). ``sample_rate`` and ``duration_s`` are null when the file could not be
    opened; ``num_frames`` is null on error.
    """
    pa = need("pyarrow")
    return pa.schema(
        [
            pa.field("path", pa.string(), nullable=False),
            pa.field("sample_rate", pa.int32()),
            pa.field("duration_s", pa.float64()),
            pa.field("num_frames", pa.int32()),
            pa.field("num_codebooks", pa.int32(), nullable=False),
            pa.field("codes", pa.list_(pa.list_(pa.uint16()))),
            pa.field("error", pa.string()),
        ]
    )


def list_column(
    arrays: Sequence[np.ndarray | None], value_type: Any, dtype: Any, large: bool = False
) -> pa.Array:
    """A list<value_type> (or large_list) column from 1-D numpy arrays (None: a null row)."""
    pa = need("pyarrow")
    lengths = np.array([0 if a is None else len(a) for a in arrays], np.int64)
    offsets = np.zeros(len(arrays) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    parts = [a for a in arrays if a is not None and len(a)]
    values = pa.array(
        np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype), value_type
    )
    mask = pa.array(np.array([a is None for a in arrays], bool))
    if large:
        return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), values, mask=mask)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values, mask=mask)


def codes_column(codes: Sequence[np.ndarray | None]) -> pa.Array:
    """list<list<uint16>> from (num_codebooks, num_frames) arrays (None: a null row)."""
    pa = need("pyarrow")
    inner = [row for c in codes if c is not None for row in c]
    inner_col = list_column(inner, pa.uint16(), np.uint16)
    counts = np.array([0 if c is None else c.shape[0] for c in codes], np.int64)
    offsets = np.zeros(len(codes) + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    mask = pa.array(np.array([c is None for c in codes], bool))
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), inner_col, mask=mask)


def codes_to_numpy(column: Any) -> list[np.ndarray | None]:
    """The ``codes`` column of :func:`~mimi_py.data.tokenize`'s output as (num_codebooks,
    num_frames) uint16 arrays (None for error rows). ``column`` is a pyarrow (Chunked)Array or a
    list of lists."""
    out: list[np.ndarray | None] = []
    chunks = column.chunks if hasattr(column, "chunks") else [column]
    for chunk in chunks:
        for v in chunk:
            if hasattr(v, "is_valid"):  # a pyarrow scalar
                if not v.is_valid:
                    out.append(None)
                    continue
                inner = v.values
                flat = inner.flatten().to_numpy(zero_copy_only=False)
                out.append(flat.astype(np.uint16, copy=False).reshape(len(inner), -1))
            else:
                out.append(None if v is None else np.asarray(v, np.uint16).reshape(len(v), -1))
    return out


class Progress(NamedTuple):
    """Where a :func:`~mimi_py.data.tokenize` run stands (passed to ``on_part`` after each part
    file)."""

    files: int
    """Rows written by this run."""
    errors: int
    """Of which error rows."""
    total: int
    """Files this run has to do (after ``resume`` skipped the done ones)."""
    audio_seconds: float
    """Source duration of the files tokenized by this run."""
    wall_seconds: float
    """Since the run started (including Ray's start-up and the model loads)."""
    parts: int
    """Part files written by this run."""

    def line(self) -> str:
        """A one-line summary: files, errors, hours of audio, hours of audio per wall hour."""
        rate = self.audio_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0
        wall = str(_dt.timedelta(seconds=round(self.wall_seconds)))
        return (
            f"tokenize: {self.files}/{self.total} files ({self.errors} errors), "
            f"{self.audio_seconds / 3600:.3f} h of audio, {rate:.1f} h/h, {wall}"
        )
