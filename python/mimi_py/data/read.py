"""Discover and read the input audio of a job: :func:`find_audio` lists the files, and
:func:`read_audio_batch` is the decoding stage, which reads them with
:class:`mimi_py.audio.AudioReader` (mono float32, resampled to the codec's rate)."""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..audio import CHUNK_SECONDS, MIMI_SAMPLE_RATE, AudioInfo, AudioReader
from ..errors import InvalidInputError
from .common import MAX_INLINE_SECONDS, batch_column, error_text, list_column, need

if TYPE_CHECKING:  # pragma: no cover - typing only; an optional dependency
    import pyarrow as pa

__all__ = ["AUDIO_EXTENSIONS", "AudioInfo", "AudioReader", "find_audio", "read_audio_batch"]

AUDIO_EXTENSIONS = (".aif", ".aiff", ".flac", ".mp3", ".oga", ".ogg", ".opus", ".wav")
"""File name endings (lower case) a folder ``INPUT`` is searched for."""


def _manifest_line(manifest: Path, i: int, s: str) -> str:
    """The path on line ``i`` of a ``.jsonl`` manifest: a JSON string, or an object's ``path``
    (NeMo: ``audio_filepath``)."""
    try:
        obj = json.loads(s)
    except json.JSONDecodeError as e:
        raise InvalidInputError(f"{manifest}:{i}: not a JSON line: {e}") from e
    path = obj.get("path", obj.get("audio_filepath")) if isinstance(obj, dict) else obj
    if not isinstance(path, str):
        raise InvalidInputError(
            f'{manifest}:{i}: expected a JSON string or an object with a "path" (or "audio_filepath") string'
        )
    return path


def _manifest_paths(manifest: Path) -> list[str]:
    """The paths a ``.txt`` (one a line, ``#`` comments) or ``.jsonl`` manifest lists."""
    text = manifest.suffix.lower() == ".txt"
    out = []
    with open(manifest, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            s = line.strip()
            if s and not (text and s.startswith("#")):
                out.append(s if text else _manifest_line(manifest, i, s))
    return out


def _folder_pairs(s: str) -> list[tuple[str, str]]:
    found = []
    for root, dirs, files in os.walk(s):
        dirs.sort()
        found += [os.path.join(root, f) for f in files if f.lower().endswith(AUDIO_EXTENSIONS)]
    if not found:
        raise FileNotFoundError(f"{s}: no audio files ({' '.join(AUDIO_EXTENSIONS)}) in this folder")
    return [(f, os.path.abspath(f)) for f in sorted(found)]


def _input_pairs(s: str) -> list[tuple[str, str]]:
    """``(path as given, path to open)`` for a folder, manifest, file or glob ``s``."""
    p = Path(s)
    if p.is_dir():
        return _folder_pairs(s)
    if p.is_file() and p.suffix.lower() in (".jsonl", ".txt"):
        base = p.resolve().parent
        pairs = [(q, str(base / q) if not os.path.isabs(q) else q) for q in _manifest_paths(p)]
        if not pairs:
            raise FileNotFoundError(f"{s}: the manifest lists no paths")
        return pairs
    if p.is_file():
        return [(s, os.path.abspath(s))]
    if glob.has_magic(s):
        found = sorted(f for f in glob.glob(s, recursive=True) if os.path.isfile(f))
        if not found:
            raise FileNotFoundError(f"{s}: no file matches this glob")
        return [(f, os.path.abspath(f)) for f in found]
    raise FileNotFoundError(f"{s}: no such folder, file or glob")


def find_audio(input: str | os.PathLike[str] | Sequence[str]) -> list[tuple[str, str]]:
    """The input files of a job, as ``(path as given, path to open)`` pairs, without duplicates.

    ``input`` is a folder (searched recursively for :data:`AUDIO_EXTENSIONS`, sorted), a glob
    (``corpus/**/*.flac``), a ``.jsonl`` manifest (one JSON string or object with ``"path"`` or
    NeMo's ``"audio_filepath"`` per line), a ``.txt`` manifest (one path per line, ``#``
    comments), a single audio file, or a list of paths. Relative paths in a manifest are relative
    to the manifest's folder; the path to open is absolute, so cluster workers find it whatever
    their working directory. Raises :class:`FileNotFoundError` when nothing matches.
    """
    if isinstance(input, (str, os.PathLike)):
        pairs = _input_pairs(os.fspath(input))
    else:
        pairs = [(str(p), os.path.abspath(p)) for p in input]
    seen: set[str] = set()
    out = []
    for given, source in pairs:
        if given not in seen:
            seen.add(given)
            out.append((given, source))
    return out


def _audio_schema() -> pa.Schema:
    """The rows between the two stages: :func:`read_audio_batch` output."""
    pa = need("pyarrow")
    return pa.schema(
        [
            pa.field("path", pa.string(), nullable=False),
            pa.field("source", pa.string(), nullable=False),
            pa.field("sample_rate", pa.int32()),
            pa.field("duration_s", pa.float64()),
            pa.field("audio", pa.large_list(pa.float32())),
            pa.field("error", pa.string()),
        ]
    )


def audio_column(batch: Any, n: int) -> list[np.ndarray | None]:
    """The ``audio`` column as float32 arrays (None where null or absent)."""
    if hasattr(batch, "column_names"):
        if "audio" not in batch.column_names:
            return [None] * n
        out: list[np.ndarray | None] = []
        for v in batch.column("audio"):
            out.append(
                v.values.to_numpy(zero_copy_only=False).astype(np.float32, copy=False) if v.is_valid else None
            )
        return out
    if "audio" not in batch:
        return [None] * n
    return [None if a is None else np.asarray(a, np.float32) for a in batch["audio"]]


def read_audio_batch(
    batch: Any,
    *,
    sample_rate: int = MIMI_SAMPLE_RATE,
    max_inline_seconds: float = MAX_INLINE_SECONDS,
    block_seconds: float = CHUNK_SECONDS,
) -> pa.Table:
    """The decoding stage (``ds.map_batches(read_audio_batch, batch_format="pyarrow")``).

    Takes rows with ``path`` (and optionally ``source``, the path to open) and returns a pyarrow
    Table with ``path``, ``source``, ``sample_rate`` and ``duration_s`` (the file's own),
    ``audio`` (mono float32 at ``sample_rate``, which should be the codec's; null for files
    longer than ``max_inline_seconds``, which :class:`~mimi_py.data.MimiEncoder` streams from
    disk itself) and ``error`` (why the file could not be read, else null). Never raises for a
    bad file.
    """
    pa = need("pyarrow")
    paths = batch_column(batch, "path") or []
    sources = batch_column(batch, "source") or paths
    rows: dict[str, list[Any]] = {k: [] for k in ("path", "source", "sample_rate", "duration_s", "error")}
    audio: list[np.ndarray | None] = []
    for path, source in zip(paths, sources):
        sr = dur = err = None
        pcm = None
        try:
            with AudioReader(source, sample_rate, block_seconds=block_seconds) as r:
                sr, dur = r.info.sample_rate, r.info.duration_s
                if dur <= max_inline_seconds:
                    pcm = r.read()
        except Exception as e:  # every failure of one file becomes its error row
            err, pcm = error_text(e), None
        for k, v in zip(rows, (path, source, sr, dur, err)):
            rows[k].append(v)
        audio.append(pcm)
    return pa.Table.from_arrays(
        [
            pa.array(rows["path"], pa.string()),
            pa.array(rows["source"], pa.string()),
            pa.array(rows["sample_rate"], pa.int32()),
            pa.array(rows["duration_s"], pa.float64()),
            list_column(audio, pa.float32(), np.float32, large=True),
            pa.array(rows["error"], pa.string()),
        ],
        schema=_audio_schema(),
    )
