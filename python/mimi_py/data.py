"""Tokenize a corpus: a folder of audio to Mimi codes in Parquet, on one machine or a Ray cluster.

Needs the ``data`` extra (``pip install 'mimi_py[data]'``: ``ray[data]``, ``pyarrow``,
``soundfile``, ``soxr``); they are imported when first used, so ``import mimi_py`` stays
numpy-only. The pipeline runs on Ray Data, the same code on a laptop (a local Ray instance) and
on a cluster (``address=`` or ``RAY_ADDRESS``):

1. :func:`read_audio_batch`, a task stage: each file is decoded with soundfile, downmixed to mono
   (the mean of the channels) and resampled to the codec's 24 kHz with soxr, block by block.
   Files longer than ``max_inline_seconds`` (default one hour) are not decoded here: the
   encoder streams them from disk itself, so no row holds more than that much audio.
2. :class:`MimiEncoder`, an actor stage: one :class:`~mimi_py.MimiCodec` per actor, loaded once,
   with ``RAYON_NUM_THREADS`` set to ``threads_per_worker`` in the actor's environment. Each file
   is encoded with ``MimiCodec.encode`` (streams over short chunks inside the codec, so its
   working memory does not grow with the file), so its codes equal ``MimiCodec.encode`` of the
   file's (resampled, mono) audio exactly. Longer files stream through ``encode_step`` in chunks
   of ``batch_seconds``, ended with ``last=True``, which pads the last partial frame as
   ``encode`` does: exact too (:meth:`MimiEncoder.encode_blocks`).
3. The driver (:func:`tokenize`) writes the rows to Parquet part files in ``OUTPUT_DIR``, each
   under a temporary name and then renamed, and keeps ``MANIFEST.json`` up to date.

Output: one row per input file (:func:`output_schema`): ``path``, ``sample_rate``,
``duration_s``, ``num_frames``, ``num_codebooks``, ``codes`` (list<list<uint16>>, shape
(num_codebooks, num_frames)) and ``error``. A file that cannot be decoded (truncated, not
audio, no samples, NaN samples) gets a row with ``error`` set and ``codes`` null; it never stops
the job. ``resume=True`` skips the paths that already have a row.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import glob
import hashlib
import json
import os
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ._core import CodecConfig, MimiCodec, __version__, candle_version
from .errors import ConfigError, InvalidInputError, MimiError
from .hub import HF_CONFIG, HF_WEIGHTS, load_codec, parse_weights_spec

if TYPE_CHECKING:  # pragma: no cover - typing only; both are optional dependencies
    import pyarrow as pa
    from ray.data import Dataset

__all__ = [
    "AUDIO_EXTENSIONS",
    "AudioInfo",
    "AudioReader",
    "MANIFEST_NAME",
    "MimiDecoder",
    "MimiEncoder",
    "Progress",
    "codes_to_numpy",
    "detokenize",
    "encode_batches",
    "find_audio",
    "output_schema",
    "read_audio_batch",
    "read_codes",
    "tokenize",
    "wav_name",
]

AUDIO_EXTENSIONS = (".aif", ".aiff", ".flac", ".mp3", ".oga", ".ogg", ".opus", ".wav")
"""File name endings (lower case) a folder ``INPUT`` is searched for."""
MANIFEST_NAME = "MANIFEST.json"
"""The job's record in ``OUTPUT_DIR``: config, weights identity, versions, counts."""
_FORMAT = "mimi_py.tokenize/1"  # MANIFEST.json's "format"

_INSTALL = "pip install 'mimi_py[data]'"
_PART = re.compile(r"part-[0-9A-Za-z_-]+\.parquet")
# libsndfile's log line for a data chunk shorter than its header says: "data : 192000 (should be 95978)".
_SHORT_CHUNK = re.compile(r"^data\s*:\s*(\d+)\s*\(should be (\d+)\)", re.MULTILINE)
# Data sizes that streaming writers put in a header when they do not know the length.
_UNKNOWN_SIZES = {0, 0xFFFFFFFF, 0x7FFFFFFF, 0xFFFFFFFE}


# ---------------------------------------------------------------------------------------------
# optional dependencies


def _need(name: str):
    """Import an optional dependency of the data extra, or say how to install it."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as e:
        extra = "ray[data]" if name.startswith("ray") else name
        raise ImportError(f"mimi_py.data needs {extra}: {_INSTALL}") from e


def _pa():
    return _need("pyarrow")


def output_schema() -> pa.Schema:
    """The Arrow schema of the Parquet rows :func:`tokenize` writes (one row per input file).

    ``path`` (the input path as given), ``sample_rate`` (the file's own rate), ``duration_s``
    (the source duration), ``num_frames``, ``num_codebooks``, ``codes`` (list<list<uint16>>,
    ``num_codebooks`` lists of ``num_frames`` codes; null on error) and ``error`` (null when the
    file was tokenized). ``sample_rate`` and ``duration_s`` are null when the file could not be
    opened; ``num_frames`` is null on error.
    """
    pa = _pa()
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


def _audio_schema() -> pa.Schema:
    """The rows between the two stages: :func:`read_audio_batch` output."""
    pa = _pa()
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


# ---------------------------------------------------------------------------------------------
# input discovery


def _manifest_paths(manifest: Path) -> list[str]:
    out = []
    with open(manifest, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            s = line.strip()
            if not s or (manifest.suffix.lower() == ".txt" and s.startswith("#")):
                continue
            if manifest.suffix.lower() == ".txt":
                out.append(s)
                continue
            try:
                obj = json.loads(s)
            except json.JSONDecodeError as e:
                raise InvalidInputError(f"{manifest}:{i}: not a JSON line: {e}") from e
            path = obj.get("path", obj.get("audio_filepath")) if isinstance(obj, dict) else obj
            if isinstance(path, str):
                out.append(path)
            else:
                raise InvalidInputError(
                    f'{manifest}:{i}: expected a JSON string or an object with a "path" '
                    '(or "audio_filepath") string'
                )
    return out


def find_audio(input: str | os.PathLike[str] | Sequence[str]) -> list[tuple[str, str]]:
    """The input files of a job, as ``(path as given, path to open)`` pairs, without duplicates.

    ``input`` is a folder (searched recursively for :data:`AUDIO_EXTENSIONS`, sorted), a glob
    (``corpus/**/*.flac``), a ``.jsonl`` manifest (one JSON string or object with ``"path"`` or
    NeMo's ``"audio_filepath"`` per line), a ``.txt`` manifest (one path per line, ``#``
    comments), a single audio file, or a list of paths. Relative paths in a manifest are relative
    to the manifest's folder; the path to open is absolute, so cluster workers find it whatever
    their working directory. Raises :class:`FileNotFoundError` when nothing matches.
    """
    if not isinstance(input, (str, os.PathLike)):
        pairs = [(str(p), os.path.abspath(p)) for p in input]
    else:
        s = os.fspath(input)
        p = Path(s)
        if p.is_dir():
            found = []
            for root, dirs, files in os.walk(s):
                dirs.sort()
                found += [os.path.join(root, f) for f in files if f.lower().endswith(AUDIO_EXTENSIONS)]
            pairs = [(f, os.path.abspath(f)) for f in sorted(found)]
            if not pairs:
                raise FileNotFoundError(f"{s}: no audio files ({' '.join(AUDIO_EXTENSIONS)}) in this folder")
        elif p.is_file() and p.suffix.lower() in (".jsonl", ".txt"):
            base = p.resolve().parent
            pairs = [(q, str(base / q) if not os.path.isabs(q) else q) for q in _manifest_paths(p)]
            if not pairs:
                raise FileNotFoundError(f"{s}: the manifest lists no paths")
        elif p.is_file():
            pairs = [(s, os.path.abspath(s))]
        elif glob.has_magic(s):
            found = sorted(f for f in glob.glob(s, recursive=True) if os.path.isfile(f))
            pairs = [(f, os.path.abspath(f)) for f in found]
            if not pairs:
                raise FileNotFoundError(f"{s}: no file matches this glob")
        else:
            raise FileNotFoundError(f"{s}: no such folder, file or glob")
    seen: set[str] = set()
    out = []
    for given, source in pairs:
        if given not in seen:
            seen.add(given)
            out.append((given, source))
    return out


# ---------------------------------------------------------------------------------------------
# audio


class AudioInfo(NamedTuple):
    """What a sound file's header says: its own sample rate, channel and frame counts."""

    sample_rate: int
    channels: int
    frames: int

    @property
    def duration_s(self) -> float:
        """The source duration in seconds."""
        return self.frames / self.sample_rate


class AudioReader:
    """A sound file read block by block as mono float32 at ``sample_rate`` (bounded memory).

    Channels are averaged (downmix to mono) and other rates are resampled with soxr's streaming
    resampler, whose output equals ``soxr.resample`` of the whole file exactly. Raises
    :class:`~mimi_py.InvalidInputError` for a file that is not audio, has no samples, is
    truncated (its header promises more data than the file holds, or fewer frames can be read
    than it declares) or holds NaN/Inf samples (while iterating), and :class:`FileNotFoundError`
    for a missing file. Use as a context manager, or call :meth:`close`.
    """

    def __init__(
        self, path: str | os.PathLike[str], sample_rate: int = 24000, *, block_seconds: float = 10.0
    ) -> None:
        sf = _need("soundfile")
        self.path = os.fspath(path)
        self.sample_rate = int(sample_rate)
        if not os.path.isfile(self.path):
            raise FileNotFoundError(f"{self.path}: no such file")
        try:
            self._file = sf.SoundFile(self.path)
        except Exception as e:  # soundfile's own error types (LibsndfileError, TypeError...)
            raise InvalidInputError(f"not a readable audio file: {e}") from e
        f = self._file
        self.info = AudioInfo(int(f.samplerate), int(f.channels), int(f.frames))
        try:
            for declared, actual in _SHORT_CHUNK.findall(f.extra_info or ""):
                if int(declared) > int(actual) and int(declared) not in _UNKNOWN_SIZES:
                    raise InvalidInputError(
                        f"truncated: the header declares {int(declared)} bytes of audio, "
                        f"the file holds {int(actual)}"
                    )
            if self.info.frames <= 0:
                raise InvalidInputError("no audio samples")
        except BaseException:
            f.close()
            raise
        self._block = max(1, int(block_seconds * self.info.sample_rate))

    def __iter__(self) -> Iterator[np.ndarray]:
        """Blocks of mono float32 samples at ``sample_rate``, from the start of the file."""
        info, f = self.info, self._file
        stream = None
        if info.sample_rate != self.sample_rate:
            soxr = _need("soxr")
            stream = soxr.ResampleStream(info.sample_rate, self.sample_rate, 1, dtype="float32")
        f.seek(0)
        read = 0
        blocks = f.blocks(blocksize=self._block, dtype="float32", always_2d=True)
        while True:
            try:
                block = next(blocks)
            except StopIteration:
                break
            except Exception as e:  # soundfile's own error types
                at = read / info.sample_rate
                raise InvalidInputError(f"cannot decode the audio after {at:.3f} s: {e}") from e
            mono = block[:, 0] if info.channels == 1 else block.mean(axis=1, dtype=np.float32)
            mono = np.ascontiguousarray(mono, dtype=np.float32)
            if not np.isfinite(mono).all():
                at = read + int(np.argmin(np.isfinite(mono)))
                raise InvalidInputError(f"NaN or Inf samples (first at {at / info.sample_rate:.3f} s)")
            read += len(mono)
            yield stream.resample_chunk(mono) if stream is not None else mono
        if read < info.frames:
            raise InvalidInputError(f"truncated: read {read} of the {info.frames} frames the header declares")
        if stream is not None:
            tail = stream.resample_chunk(np.zeros(0, np.float32), last=True)
            if len(tail):
                yield tail

    def read(self) -> np.ndarray:
        """The whole file: mono float32 samples at ``sample_rate``."""
        blocks = list(self)
        return np.concatenate(blocks) if blocks else np.zeros(0, np.float32)

    def close(self) -> None:
        """Close the file."""
        self._file.close()

    def __enter__(self) -> AudioReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _error_text(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _column(batch: Any, name: str) -> list[Any] | None:
    """A column of a pyarrow Table or a dict of columns as a Python list, or None if absent."""
    if hasattr(batch, "column_names"):
        return batch.column(name).to_pylist() if name in batch.column_names else None
    if name not in batch:
        return None
    col = batch[name]
    return col.tolist() if hasattr(col, "tolist") else list(col)


def _audio_column(batch: Any, n: int) -> list[np.ndarray | None]:
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
    batch: Any, *, sample_rate: int = 24000, max_inline_seconds: float = 3600.0, block_seconds: float = 10.0
) -> pa.Table:
    """The decoding stage (``ds.map_batches(read_audio_batch, batch_format="pyarrow")``).

    Takes rows with ``path`` (and optionally ``source``, the path to open) and returns a pyarrow
    Table with ``path``, ``source``, ``sample_rate`` and ``duration_s`` (the file's own),
    ``audio`` (mono float32 at ``sample_rate``; null for files longer than
    ``max_inline_seconds``, which :class:`MimiEncoder` streams from disk itself) and ``error``
    (why the file could not be read, else null). Never raises for a bad file.
    """
    pa = _pa()
    paths = _column(batch, "path") or []
    sources = _column(batch, "source") or paths
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
            err, pcm = _error_text(e), None
        for k, v in zip(rows, (path, source, sr, dur, err)):
            rows[k].append(v)
        audio.append(pcm)
    return pa.Table.from_arrays(
        [
            pa.array(rows["path"], pa.string()),
            pa.array(rows["source"], pa.string()),
            pa.array(rows["sample_rate"], pa.int32()),
            pa.array(rows["duration_s"], pa.float64()),
            _list_column(audio, pa.float32(), np.float32, large=True),
            pa.array(rows["error"], pa.string()),
        ],
        schema=_audio_schema(),
    )


def _list_column(
    arrays: Sequence[np.ndarray | None], value_type: Any, dtype: Any, large: bool = False
) -> pa.Array:
    """A list<value_type> (or large_list) column from 1-D numpy arrays (None: a null row)."""
    pa = _pa()
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


def _codes_column(codes: Sequence[np.ndarray | None]) -> pa.Array:
    """list<list<uint16>> from (num_codebooks, num_frames) arrays (None: a null row)."""
    pa = _pa()
    inner = [row for c in codes if c is not None for row in c]
    inner_col = _list_column(inner, pa.uint16(), np.uint16)
    counts = np.array([0 if c is None else c.shape[0] for c in codes], np.int64)
    offsets = np.zeros(len(codes) + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    mask = pa.array(np.array([c is None for c in codes], bool))
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), inner_col, mask=mask)


def codes_to_numpy(column: Any) -> list[np.ndarray | None]:
    """The ``codes`` column of :func:`tokenize`'s output as (num_codebooks, num_frames) uint16
    arrays (None for error rows). ``column`` is a pyarrow (Chunked)Array or a list of lists."""
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


# ---------------------------------------------------------------------------------------------
# weights


class _Model(NamedTuple):
    """What an actor needs to build its codec; picklable."""

    weights: str | None  # absolute path, pinned hf: spec, or None (seeded)
    config: dict[str, Any] | None
    num_codebooks: int | None
    seed: int

    def load(self) -> MimiCodec:
        if self.config is not None:
            if self.weights is not None and self.weights.startswith("hf:"):
                raise ConfigError("`config` applies to local weights; hf: weights bring their own config")
            return MimiCodec(
                self.weights, config=self.config, num_codebooks=self.num_codebooks, seed=self.seed
            )
        return load_codec(self.weights, num_codebooks=self.num_codebooks, seed=self.seed)


def _config_dict(config: CodecConfig | Mapping[str, Any] | None) -> dict[str, Any] | None:
    if config is None:
        return None
    if isinstance(config, CodecConfig):
        return config.to_dict()
    return CodecConfig(**dict(config)).to_dict()


def _model(
    weights: str | os.PathLike[str] | None,
    config: CodecConfig | Mapping[str, Any] | None,
    num_codebooks: int | None,
    seed: int,
) -> _Model:
    spec = None
    if weights is not None:
        spec = os.fspath(weights)
        if not spec.startswith("hf:"):
            spec = os.path.abspath(spec)
    return _Model(spec, _config_dict(config), num_codebooks, seed)


def _sha256(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _resolve_weights(model: _Model) -> tuple[_Model, dict[str, Any]]:
    """Pin ``hf:`` weights to the commit the driver sees (so every node loads the same files)
    and describe the weights: file names and sha256, or repo and commit, or the seed."""
    w = model.weights
    if w is None:
        return model, {"kind": "seeded", "spec": None, "seed": model.seed}
    if w.startswith("hf:"):
        from .hub import _download

        spec = parse_weights_spec(w)
        names = [spec.filename] if spec.filename else [HF_WEIGHTS, HF_CONFIG]
        first = _download(spec.repo_id, names[0], spec.revision, None, " ".join(names))
        snapshot = first.parents[len(PurePath(names[0]).parts) - 1]
        commit = snapshot.name
        files = {names[0]: _sha256(first)}
        for name in names[1:]:
            files[name] = _sha256(_download(spec.repo_id, name, commit, None, " ".join(names)))
        pinned = f"hf:{spec.repo_id}@{commit}" + (f":{spec.filename}" if spec.filename else "")
        ident = {
            "kind": "hf",
            "spec": pinned,
            "repo_id": spec.repo_id,
            "revision": spec.revision,
            "commit": commit,
            "files": files,
        }
        return model._replace(weights=pinned), ident
    p = Path(w)
    if p.is_dir():
        files = {n: _sha256(p / n) for n in (HF_WEIGHTS, HF_CONFIG) if (p / n).is_file()}
        return model, {"kind": "directory", "spec": w, "files": files}
    if p.is_file():
        return model, {"kind": "file", "spec": w, "files": {p.name: _sha256(p)}}
    return model, {"kind": "file", "spec": w, "files": {}}  # the codec load reports it


def _weight_hashes(ident: Mapping[str, Any]) -> list[str]:
    """The sha256 of the weight files (not config.json: the configs are compared as configs)."""
    return sorted(h for name, h in (ident.get("files") or {}).items() if PurePath(name).name != HF_CONFIG)


def _same_model(old: Mapping[str, Any], new: Mapping[str, Any]) -> str | None:
    """Why two manifests' models differ (None if they do not)."""
    ow, nw = old.get("weights", {}), new["weights"]

    def name(w: Mapping[str, Any]) -> str:
        return f"seeded weights (seed {w.get('seed')})" if w.get("kind") == "seeded" else str(w.get("spec"))

    if ow.get("kind") == "seeded" or nw["kind"] == "seeded":
        if (ow.get("kind"), ow.get("seed")) != (nw["kind"], nw.get("seed")):
            return f"{name(ow)} then {name(nw)}"
    elif _weight_hashes(ow) != _weight_hashes(nw):
        return f"{name(ow)} then {name(nw)} (different sha256)"
    oc, nc = old.get("config", {}), new["config"]
    for key in ("num_codebooks", "codec"):
        if oc.get(key) != nc[key]:
            return f"{key} {oc.get(key)!r} then {nc[key]!r}"
    return None


# ---------------------------------------------------------------------------------------------
# the codec stages


def _threads_env(threads: int | None) -> None:
    """Set the thread count for mimi_py's (rayon's) pool; only effective before its first use."""
    if threads is not None:
        os.environ["RAYON_NUM_THREADS"] = str(int(threads))


class MimiEncoder:
    """The encoding stage: a callable class for ``ds.map_batches`` on an actor pool.

    ``ds.map_batches(MimiEncoder, fn_constructor_kwargs={"weights": ..., "num_codebooks": 8},
    compute=ray.data.ActorPoolStrategy(size=N), batch_format="pyarrow")``. Each actor loads one
    :class:`~mimi_py.MimiCodec` (``weights``: a path, ``hf:REPO[@REV][:FILE]`` or None for seeded
    weights; ``config``: a :class:`~mimi_py.CodecConfig` or its dict, for local weights) once.

    Input rows have ``path`` and optionally ``source`` (the path to open), ``audio`` (mono
    float32 at 24 kHz, as :func:`read_audio_batch` makes it), ``sample_rate``, ``duration_s``
    and ``error``. A row with an error is passed through. Output rows follow
    :func:`output_schema`.

    A row with audio is encoded with :meth:`~mimi_py.MimiCodec.encode` (which runs as
    streams over short chunks inside, so its working memory is bounded): its codes equal
    ``MimiCodec.encode`` of the file's audio exactly. A row without audio (a file longer than
    ``max_inline_seconds``) is read from ``source`` here, block by block, and streamed through
    ``encode_step`` in chunks of ``batch_seconds`` (see :meth:`encode_blocks`), so memory does
    not grow with the file.

    ``threads`` sets ``RAYON_NUM_THREADS`` before the codec is created; it only takes effect if
    mimi_py has not computed anything in this process yet, so also pass it in the actors'
    environment (``runtime_env={"env_vars": {"RAYON_NUM_THREADS": "1"}}``), as
    :func:`encode_batches` does.
    """

    def __init__(
        self,
        weights: str | os.PathLike[str] | None = None,
        *,
        config: CodecConfig | Mapping[str, Any] | None = None,
        num_codebooks: int | None = 8,
        seed: int = 0,
        threads: int | None = None,
        batch_seconds: float = 10.0,
    ) -> None:
        _threads_env(threads)
        self.codec = _model(weights, config, num_codebooks, seed).load()
        fs = self.codec.frame_size
        self._chunk = max(1, round(batch_seconds * self.codec.sample_rate / fs)) * fs
        self._batch_seconds = batch_seconds
        if self.codec.cardinality > 1 << 16:
            raise ConfigError(f"codes of cardinality {self.codec.cardinality} do not fit uint16")

    def encode(self, pcm: np.ndarray) -> np.ndarray:
        """The codes of one file's mono 24 kHz audio: (num_codebooks, num_frames) uint16, from
        ``MimiCodec.encode``."""
        if len(pcm) == 0:
            raise InvalidInputError("no audio samples")
        return self.codec.encode(np.asarray(pcm, np.float32))[0].astype(np.uint16)

    def encode_blocks(self, blocks: Iterable[np.ndarray]) -> np.ndarray:
        """The codes of one file given as consecutive blocks of mono audio at 24 kHz, streamed
        through ``encode_step`` from a fresh state: (num_codebooks, num_frames) uint16.

        The stream ends with ``encode_step(..., last=True)``, which pads the last partial frame
        as ``MimiCodec.encode`` does, so the codes equal ``encode``'s exactly, with memory
        bounded by the chunk whatever the file's length.
        """
        codec, fs = self.codec, self.codec.frame_size
        codec.reset_state()
        out = []
        n = 0
        for block in blocks:
            for s in range(0, len(block), self._chunk):
                piece = block[s : s + self._chunk]
                n += len(piece)
                codes = codec.encode_step(piece[None, None])
                if codes is not None:
                    out.append(codes[0])
        if n == 0:
            raise InvalidInputError("no audio samples")
        codes = codec.encode_step(np.zeros((1, 1, 0), np.float32), last=True)
        if codes is not None:
            out.append(codes[0])
        codec.reset_state()
        q = self.codec.num_codebooks
        codes = np.concatenate(out, axis=1) if out else np.zeros((q, 0), np.uint32)
        if codes.shape != (q, -(-n // fs)):  # pragma: no cover - an invariant of encode_step
            raise MimiError(f"internal: {codes.shape} codes for {n} samples")
        return codes.astype(np.uint16)

    def __call__(self, batch: Any) -> pa.Table:
        """Encode a batch of rows (see the class docstring) into :func:`output_schema` rows."""
        pa = _pa()
        paths = _column(batch, "path") or []
        n = len(paths)
        sources = _column(batch, "source") or paths
        errors = _column(batch, "error") or [None] * n
        srs = _column(batch, "sample_rate") or [None] * n
        durs = _column(batch, "duration_s") or [None] * n
        audio = _audio_column(batch, n)
        codes: list[np.ndarray | None] = []
        for i in range(n):
            c = None
            if errors[i] is None:
                try:
                    pcm = audio[i]
                    if pcm is not None:
                        c = self.encode(pcm)
                    else:
                        with AudioReader(
                            sources[i], self.codec.sample_rate, block_seconds=self._batch_seconds
                        ) as r:
                            srs[i], durs[i] = r.info.sample_rate, r.info.duration_s
                            c = self.encode_blocks(r)
                except Exception as e:  # one bad file is one error row
                    errors[i], c = _error_text(e), None
                    self.codec.reset_state()
            codes.append(c)
        q = self.codec.num_codebooks
        return pa.Table.from_arrays(
            [
                pa.array(paths, pa.string()),
                pa.array(srs, pa.int32()),
                pa.array(durs, pa.float64()),
                pa.array([None if c is None else c.shape[1] for c in codes], pa.int32()),
                pa.array([q] * n, pa.int32()),
                _codes_column(codes),
                pa.array(errors, pa.string()),
            ],
            schema=output_schema(),
        )


def _ray_stage_args(workers: int, threads: int, cluster_cpus: float | None) -> dict[str, Any]:
    ray_data = _need("ray.data")
    if cluster_cpus is not None and workers * threads > cluster_cpus:
        # More than the cluster has now: start what fits and let the pool grow (autoscaling).
        compute = ray_data.ActorPoolStrategy(min_size=1, max_size=workers)
    else:
        compute = ray_data.ActorPoolStrategy(size=workers)
    env = {str(k): str(threads) for k in ("RAYON_NUM_THREADS", "OMP_NUM_THREADS")}
    return {"compute": compute, "num_cpus": threads, "runtime_env": {"env_vars": env}}


def encode_batches(
    ds: Dataset,
    *,
    weights: str | os.PathLike[str] | None = None,
    config: CodecConfig | Mapping[str, Any] | None = None,
    num_codebooks: int | None = 8,
    seed: int = 0,
    workers: int = 1,
    threads_per_worker: int = 1,
    batch_seconds: float = 10.0,
    max_inline_seconds: float = 3600.0,
    read_tasks: int | None = None,
) -> Dataset:
    """Add the two stages to a Ray Dataset of ``path`` rows; returns a Dataset of
    :func:`output_schema` rows (in no particular order).

    The decoding stage (:func:`read_audio_batch`, one file per call) runs as up to
    ``read_tasks`` tasks (default: one per 8 workers, at least 2) that reserve no CPU: decoding
    costs a few percent of encoding, and the encoder actors may hold every CPU. The encoding
    stage (:class:`MimiEncoder`) runs on ``workers`` actors of ``threads_per_worker`` CPUs
    each, with ``RAYON_NUM_THREADS`` set in their environment (an autoscaling pool of 1 to
    ``workers`` actors if the cluster has fewer CPUs than that). A ``source`` column, if
    present, is the path to open (``path`` is kept as given).
    """
    ray = _need("ray")
    ray_data = _need("ray.data")
    model = _model(weights, config, num_codebooks, seed)
    tasks = read_tasks if read_tasks is not None else max(2, -(-workers // 8))
    cpus = ray.cluster_resources().get("CPU") if ray.is_initialized() else None
    ds = ds.map_batches(
        read_audio_batch,
        batch_format="pyarrow",
        batch_size=1,  # one file per call: Ray cuts the task's output into bounded blocks
        fn_kwargs={
            "sample_rate": 24000,
            "max_inline_seconds": max_inline_seconds,
            "block_seconds": batch_seconds,
        },
        num_cpus=0,
        compute=ray_data.TaskPoolStrategy(size=tasks),
    )
    return ds.map_batches(
        MimiEncoder,
        batch_format="pyarrow",
        fn_constructor_kwargs={
            "weights": model.weights,
            "config": model.config,
            "num_codebooks": num_codebooks,
            "seed": seed,
            "threads": threads_per_worker,
            "batch_seconds": batch_seconds,
        },
        **_ray_stage_args(workers, threads_per_worker, cpus),
    )


# ---------------------------------------------------------------------------------------------
# output folder


class _Output:
    """OUTPUT_DIR through a pyarrow filesystem (local path, or s3:// gs:// ... URI)."""

    def __init__(self, output_dir: str | os.PathLike[str]) -> None:
        fs_mod = _need("pyarrow.fs")
        s = os.fspath(output_dir)
        if "://" in s:
            self.fs, self.base = fs_mod.FileSystem.from_uri(s)
        else:
            self.fs, self.base = fs_mod.LocalFileSystem(), os.path.abspath(s)
        self.base = self.base.rstrip("/")
        self.uri = s

    def path(self, name: str) -> str:
        return f"{self.base}/{name}"

    def listing(self) -> list[str]:
        fs_mod = _need("pyarrow.fs")
        infos = self.fs.get_file_info(fs_mod.FileSelector(self.base, allow_not_found=True))
        return sorted(i.base_name for i in infos if i.type == fs_mod.FileType.File)

    def parts(self) -> list[str]:
        return [self.path(n) for n in self.listing() if _PART.fullmatch(n)]

    def mkdir(self) -> None:
        self.fs.create_dir(self.base, recursive=True)

    def remove_temporaries(self) -> int:
        stale = [n for n in self.listing() if n.startswith(".") and n.endswith(".tmp")]
        for n in stale:
            self.fs.delete_file(self.path(n))
        return len(stale)

    def _atomic(self, name: str, write: Callable[[str], None]) -> None:
        tmp = self.path(f".{name}.{uuid.uuid4().hex[:8]}.tmp")
        write(tmp)
        self.fs.move(tmp, self.path(name))

    def write_table(self, name: str, table: pa.Table) -> None:
        pq = _need("pyarrow.parquet")
        self._atomic(name, lambda p: pq.write_table(table, p, filesystem=self.fs))

    def write_json(self, name: str, obj: Any) -> None:
        data = (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode()

        def write(p: str) -> None:
            with self.fs.open_output_stream(p) as f:
                f.write(data)

        self._atomic(name, write)

    def read_json(self, name: str) -> dict[str, Any] | None:
        fs_mod = _need("pyarrow.fs")
        if self.fs.get_file_info(self.path(name)).type == fs_mod.FileType.NotFound:
            return None
        with self.fs.open_input_stream(self.path(name)) as f:
            return json.loads(f.read().decode())

    def read(self, columns: list[str] | None = None) -> pa.Table:
        pa, pq = _pa(), _need("pyarrow.parquet")
        tables = [pq.read_table(p, columns=columns, filesystem=self.fs) for p in self.parts()]
        if not tables:
            schema = output_schema()
            if columns is not None:
                schema = pa.schema([schema.field(c) for c in columns])
            return schema.empty_table()
        return pa.concat_tables(tables)


def read_codes(output_dir: str | os.PathLike[str], columns: list[str] | None = None) -> pa.Table:
    """All rows :func:`tokenize` wrote to ``output_dir`` (its ``part-*.parquet`` files) as one
    pyarrow Table; ``columns`` selects columns. ``ray.data.read_parquet(output_dir)`` reads the
    same files; ``pyarrow.parquet.read_table(output_dir)`` would also try ``MANIFEST.json``."""
    return _Output(output_dir).read(columns)


# ---------------------------------------------------------------------------------------------
# the job


class Progress(NamedTuple):
    """Where a :func:`tokenize` run stands (passed to ``on_part`` after each part file)."""

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


def _init_ray(address: str | None) -> bool:
    """Connect to (or start) Ray; True when this call started it (and should shut it down)."""
    ray = _need("ray")
    if ray.is_initialized():
        return False
    import logging

    if address is None and not os.environ.get("RAY_ADDRESS"):
        ray.init(include_dashboard=False, logging_level=logging.WARNING)
    else:
        ray.init(address=address, logging_level=logging.WARNING)
    return True


def _now() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def _counts(out: _Output, inputs: Sequence[str]) -> dict[str, Any]:
    t = out.read(["path", "duration_s", "num_frames", "error"])
    paths = t.column("path").to_pylist()
    errors = t.column("error").to_pylist()
    durs = t.column("duration_s").to_pylist()
    frames = t.column("num_frames").to_pylist()
    ok = [e is None for e in errors]
    wanted = set(inputs)
    have = set(paths)
    return {
        "inputs": len(inputs),
        "rows": len(paths),
        "ok": sum(ok),
        "errors": len(paths) - sum(ok),
        "missing": len(wanted - have),
        "duplicates": len(paths) - len(have),
        "extra_rows": len(have - wanted),
        "audio_hours": round(sum(d for d, g in zip(durs, ok) if g and d is not None) / 3600, 6),
        "frames": int(sum(f for f, g in zip(frames, ok) if g and f is not None)),
    }


def _check_positive(**values: float | None) -> None:
    for name, v in values.items():
        if v is not None and not v > 0:
            raise ConfigError(f"`{name}` must be positive, got {v!r}")


def tokenize(
    input: str | os.PathLike[str] | Sequence[str],
    output_dir: str | os.PathLike[str],
    *,
    weights: str | os.PathLike[str] | None = None,
    config: CodecConfig | Mapping[str, Any] | None = None,
    num_codebooks: int = 8,
    seed: int = 0,
    workers: int | None = None,
    threads_per_worker: int = 1,
    batch_seconds: float = 10.0,
    address: str | None = None,
    resume: bool = False,
    rows_per_file: int = 4096,
    flush_seconds: float = 60.0,
    max_inline_seconds: float = 3600.0,
    progress_every: float | None = 5.0,
    on_part: Callable[[Progress], None] | None = None,
) -> dict[str, Any]:
    """Tokenize every audio file of ``input`` into Parquet rows in ``output_dir``.

    ``input``: see :func:`find_audio`. ``output_dir``: a local folder or a pyarrow filesystem
    URI (``s3://bucket/codes``); it must hold no part files unless ``resume`` is set, which skips
    the paths that already have a row (the model must be the same: checked against
    ``MANIFEST.json``). ``weights``: a path (file or folder, as :class:`~mimi_py.MimiCodec`
    takes), ``hf:REPO_ID[@REVISION][:FILENAME]`` (pinned to the commit the driver resolves, so
    every node loads the same files) or None (seeded random weights); ``config``: a
    :class:`~mimi_py.CodecConfig` for local weights without a ``config.json``.

    Runs on Ray: an existing connection, else ``address`` / ``RAY_ADDRESS``, else a local
    instance (shut down at the end). ``workers`` encoder actors (default: the cluster's CPUs ÷
    ``threads_per_worker``) each use ``threads_per_worker`` threads and stream files through
    the codec in chunks of ``batch_seconds``. Rows are written by the driver, ``rows_per_file``
    rows or ``flush_seconds`` at most per part file, each file under a temporary name and then
    renamed, so a killed job loses only the rows not yet written. A summary line goes to stderr
    every ``progress_every`` seconds (None: quiet); ``on_part`` is called after each part file.

    Returns the ``MANIFEST.json`` content: config, weights identity, versions, counts.
    """
    _check_positive(
        threads_per_worker=threads_per_worker,
        batch_seconds=batch_seconds,
        workers=workers,
        rows_per_file=rows_per_file,
        flush_seconds=flush_seconds,
        max_inline_seconds=max_inline_seconds,
        num_codebooks=num_codebooks,
    )
    for module in ("pyarrow", "pyarrow.parquet", "ray", "ray.data", "soundfile", "soxr"):
        _need(module)  # before anything is written
    t_start = time.perf_counter()
    pairs = find_audio(input)
    inputs = [p for p, _ in pairs]
    out = _Output(output_dir)
    model, ident = _resolve_weights(_model(weights, config, num_codebooks, seed))
    settings = {
        "batch_seconds": batch_seconds,
        "threads_per_worker": threads_per_worker,
        "max_inline_seconds": max_inline_seconds,
    }
    manifest = _new_manifest(input, inputs, model, ident, settings)
    done = _open_output(out, manifest, resume)
    todo = [(p, s) for p, s in pairs if p not in done]
    run: dict[str, Any] = {"started": _now(), "resumed": bool(resume), "skipped": len(pairs) - len(todo)}
    manifest["runs"].append(run)
    manifest["counts"] = _counts(out, inputs)
    out.write_json(MANIFEST_NAME, manifest)
    writer = _PartWriter(out, len(todo), t_start, rows_per_file, flush_seconds, progress_every, on_part)
    if todo:
        stage = dict(settings, weights=model.weights, config=model.config)
        stage.update(num_codebooks=num_codebooks, seed=seed, workers=workers)
        try:
            _run_pipeline(todo, stage, address, writer, run, manifest)
        except BaseException as e:  # Ctrl-C, a Ray failure: keep the rows already computed
            with contextlib.suppress(Exception):
                writer.flush()
                run.update(interrupted=_now(), why=_error_text(e), files=writer.files, parts=writer.parts)
                manifest["status"] = "interrupted"
                manifest["counts"] = _counts(out, inputs)
                out.write_json(MANIFEST_NAME, manifest)
            raise
    return _finish(out, inputs, manifest, run, writer)


def _new_manifest(
    input: Any, inputs: Sequence[str], model: _Model, ident: dict[str, Any], settings: dict[str, Any]
) -> dict[str, Any]:
    """A fresh ``MANIFEST.json`` for a job; loads the model once, so that a bad checkpoint fails
    here rather than in every actor."""
    codec = model.load()
    if codec.cardinality > 1 << 16:
        raise ConfigError(f"codes of cardinality {codec.cardinality} do not fit uint16")
    described = os.fspath(input) if isinstance(input, (str, os.PathLike)) else f"{len(inputs)} paths"
    return {
        "format": _FORMAT,
        "status": "running",
        "updated": _now(),
        "config": {
            "input": described,
            "num_codebooks": codec.num_codebooks,
            "sample_rate": codec.sample_rate,
            "frame_rate": codec.frame_rate,
            "frame_size": codec.frame_size,
            "cardinality": codec.cardinality,
            **settings,
            "codec": codec.config.to_dict(),
        },
        "weights": ident,
        "mimi_py": {"version": __version__, "candle": candle_version},
        "schema": {f.name: str(f.type) for f in output_schema()},
        "counts": {},
        "runs": [],
    }


def _open_output(out: _Output, manifest: dict[str, Any], resume: bool) -> set[str]:
    """Creates ``out`` or checks it can be resumed (same model); returns the paths done."""
    out.mkdir()
    old = out.read_json(MANIFEST_NAME)
    parts = out.parts()
    if parts and not resume:
        raise FileExistsError(
            f"{out.uri}: already holds {len(parts)} part file(s); pass resume=True (--resume) to "
            "finish that job, or choose an empty folder"
        )
    done: set[str] = set()
    if resume:
        if old is not None:
            why = _same_model(old, manifest)
            if why:
                raise ConfigError(f"{out.uri} was tokenized with another model, cannot resume: {why}")
            manifest["runs"] = list(old.get("runs", []))
        done = set(out.read(["path"]).column("path").to_pylist())
    out.remove_temporaries()  # half-written files of a killed run
    return done


class _PartWriter:
    """Collects result rows and writes them as part files (``rows_per_file`` rows or
    ``flush_seconds`` at most each); counts and reports progress."""

    def __init__(
        self,
        out: _Output,
        total: int,
        t_start: float,
        rows_per_file: int,
        flush_seconds: float,
        progress_every: float | None,
        on_part: Callable[[Progress], None] | None,
    ) -> None:
        self.out, self.total, self.t_start = out, total, t_start
        self.rows_per_file, self.flush_seconds = rows_per_file, flush_seconds
        self.progress_every, self.on_part = progress_every, on_part
        self.run_id = _dt.datetime.now().strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
        self.files = self.errors = self.parts = 0
        self.audio_s = 0.0
        self.pending: list[pa.Table] = []
        self.pending_rows = 0
        self.last_flush = self.last_say = time.perf_counter()

    def say(self, line: str) -> None:
        """A summary line on stderr, unless quiet."""
        if self.progress_every is not None:
            print(line, file=sys.stderr, flush=True)

    def progress(self) -> Progress:
        """Where the run stands."""
        wall = time.perf_counter() - self.t_start
        return Progress(self.files, self.errors, self.total, self.audio_s, wall, self.parts)

    def add(self, batch: pa.Table) -> None:
        """Takes a batch of result rows; writes a part file and reports when it is time."""
        self.pending.append(batch)
        self.pending_rows += batch.num_rows
        ok = batch.filter(batch.column("error").is_null())
        self.errors += batch.num_rows - ok.num_rows
        self.audio_s += float(sum(d for d in ok.column("duration_s").to_pylist() if d is not None))
        now = time.perf_counter()
        if self.pending_rows >= self.rows_per_file or now - self.last_flush >= self.flush_seconds:
            self.flush()
        if now - self.last_say >= (self.progress_every or 0):
            self.last_say = now
            p = self.progress()
            self.say(p._replace(files=p.files + self.pending_rows).line())

    def flush(self) -> None:
        """Writes the pending rows as one part file (temporary name, then renamed)."""
        self.last_flush = time.perf_counter()
        if not self.pending:
            return
        table = _pa().concat_tables(self.pending)
        self.out.write_table(f"part-{self.run_id}-{self.parts:05d}.parquet", table)
        self.parts += 1
        self.files += table.num_rows
        self.pending, self.pending_rows = [], 0
        if self.on_part is not None:
            self.on_part(self.progress())


def _run_pipeline(
    todo: Sequence[tuple[str, str]],
    stage: dict[str, Any],
    address: str | None,
    writer: _PartWriter,
    run: dict[str, Any],
    manifest: dict[str, Any],
) -> None:
    """Runs the Ray Data pipeline over ``todo`` ((path, source) pairs), handing the result rows
    to ``writer``; starts (and then stops) a local Ray unless one is up or ``address`` is set."""
    started_ray = _init_ray(address)
    try:
        ray, ray_data = _need("ray"), _need("ray.data")
        ctx = ray_data.DataContext.get_current()
        bars = ctx.enable_progress_bars
        if writer.progress_every is not None:
            ctx.enable_progress_bars = False  # our summary line instead
        cpus = float(ray.cluster_resources().get("CPU", 1))
        n_workers = stage["workers"] or max(1, int(cpus // stage["threads_per_worker"]))
        run.update(workers=n_workers, ray_cpus=cpus)
        manifest["config"]["workers"] = n_workers
        # Blocks of a few files: small enough to spread over the workers, large enough that
        # per-block overhead stays small on million-file corpora.
        blocks = min(len(todo), max(8 * n_workers, -(-len(todo) // 32)))
        ds = ray_data.from_items([{"path": p, "source": s} for p, s in todo], override_num_blocks=blocks)
        ds = encode_batches(ds, **dict(stage, workers=n_workers))
        try:
            for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None):
                writer.add(batch)
            writer.flush()
        finally:
            ctx.enable_progress_bars = bars
    finally:
        if started_ray:
            _need("ray").shutdown()


def _finish(
    out: _Output,
    inputs: Sequence[str],
    manifest: dict[str, Any],
    run: dict[str, Any],
    writer: _PartWriter,
) -> dict[str, Any]:
    """Records the run and the final counts in ``MANIFEST.json``; returns it."""
    final = writer.progress()
    writer.say(final.line())
    run.update(
        finished=_now(),
        files=final.files,
        errors=final.errors,
        audio_hours=round(final.audio_seconds / 3600, 6),
        wall_s=round(final.wall_seconds, 3),
        parts=final.parts,
    )
    manifest["counts"] = c = _counts(out, inputs)
    manifest["status"] = "complete" if c["missing"] == 0 and c["duplicates"] == 0 else "incomplete"
    manifest["updated"] = _now()
    out.write_json(MANIFEST_NAME, manifest)
    return manifest


# ---------------------------------------------------------------------------------------------
# the reverse


def wav_name(path: str) -> str:
    """The relative file name :func:`detokenize` writes ``path``'s audio to: the path without
    its root (``..`` parts become ``__``), with ``.wav`` appended unless it ends in ``.wav``."""
    parts = [
        ("__" if p == ".." else p) for p in PurePath(path).parts if p not in (PurePath(path).anchor, ".")
    ]
    name = os.path.join(*parts) if parts else "audio"
    return name if name.lower().endswith(".wav") else name + ".wav"


class MimiDecoder:
    """The decoding stage of :func:`detokenize`: a callable class for ``ds.map_batches`` on an
    actor pool that turns :func:`output_schema` rows into wav files (float32, 24 kHz, mono) in
    ``wav_dir`` (a local or shared folder), named by :func:`wav_name`.

    Rows of up to ``max_inline_seconds`` are decoded with ``MimiCodec.decode`` (the same
    samples); longer rows stream through ``decode_step`` in chunks of ``batch_seconds`` and are
    written as they come (within float rounding of ``decode``, bounded memory). Each file is
    written under a temporary name and then renamed. Returns rows of ``path``, ``wav`` (the
    written file; null for error rows, which are skipped), ``duration_s`` and ``error`` (why
    decoding failed; null for written and skipped rows).
    """

    def __init__(
        self,
        wav_dir: str | os.PathLike[str],
        weights: str | os.PathLike[str] | None = None,
        *,
        config: CodecConfig | Mapping[str, Any] | None = None,
        num_codebooks: int | None = 8,
        seed: int = 0,
        threads: int | None = None,
        batch_seconds: float = 10.0,
        max_inline_seconds: float = 3600.0,
    ) -> None:
        _threads_env(threads)
        self.wav_dir = os.fspath(wav_dir)
        self.codec = _model(weights, config, num_codebooks, seed).load()
        self._chunk = max(1, round(batch_seconds * self.codec.frame_rate))
        self._inline = max_inline_seconds * self.codec.frame_rate

    def write(self, codes: np.ndarray, target: str) -> float:
        """Decode (num_codebooks, num_frames) ``codes`` into the wav file ``target``; returns its
        duration in seconds."""
        sf = _need("soundfile")
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
        tmp = f"{target}.{uuid.uuid4().hex[:8]}.tmp"
        sr = self.codec.sample_rate
        try:
            with sf.SoundFile(tmp, "w", samplerate=sr, channels=1, subtype="FLOAT", format="WAV") as f:
                if codes.shape[1] <= self._inline:
                    f.write(self.codec.decode(codes[None].astype(np.uint32))[0, 0])
                else:
                    self.codec.reset_state()
                    for s in range(0, codes.shape[1], self._chunk):
                        pcm = self.codec.decode_step(codes[None, :, s : s + self._chunk].astype(np.uint32))
                        if pcm is not None:
                            f.write(pcm[0, 0])
                    self.codec.reset_state()
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return codes.shape[1] * self.codec.frame_size / sr

    def __call__(self, batch: Any) -> pa.Table:
        """Decode a batch of :func:`output_schema` rows into wav files."""
        pa = _pa()
        paths = _column(batch, "path") or []
        errors = _column(batch, "error") or [None] * len(paths)
        codes = codes_to_numpy(batch.column("codes") if hasattr(batch, "column") else batch["codes"])
        wavs: list[str | None] = []
        durs: list[float | None] = []
        out_err: list[str | None] = []
        for path, err, c in zip(paths, errors, codes):
            wav = dur = fail = None
            if err is None and c is not None:
                try:
                    wav = os.path.join(self.wav_dir, wav_name(path))
                    dur = self.write(c, wav)
                except Exception as e:
                    fail, wav = _error_text(e), None
            wavs.append(wav)
            durs.append(dur)
            out_err.append(fail)
        return pa.table(
            {
                "path": pa.array(paths, pa.string()),
                "wav": pa.array(wavs, pa.string()),
                "duration_s": pa.array(durs, pa.float64()),
                "error": pa.array(out_err, pa.string()),
            }
        )


def detokenize(
    output_dir: str | os.PathLike[str],
    wav_dir: str | os.PathLike[str],
    *,
    weights: str | os.PathLike[str] | None = None,
    config: CodecConfig | Mapping[str, Any] | None = None,
    seed: int | None = None,
    workers: int | None = None,
    threads_per_worker: int = 1,
    batch_seconds: float = 10.0,
    max_inline_seconds: float = 3600.0,
    address: str | None = None,
    limit: int | None = None,
    progress_every: float | None = 5.0,
) -> dict[str, Any]:
    """Decode the rows of a :func:`tokenize` output back to wav files in ``wav_dir``, for
    listening checks (names: :func:`wav_name`; error rows are skipped; ``limit``: only the
    first rows, part file by part file).

    ``weights`` defaults to the ones recorded in ``MANIFEST.json`` (with their config and seed);
    otherwise as in :func:`tokenize`. Runs on Ray like :func:`tokenize`, with
    :class:`MimiDecoder` actors. Returns counts: ``files`` written, ``skipped`` error rows,
    ``failed`` rows, ``audio_seconds``.
    """
    _check_positive(threads_per_worker=threads_per_worker, batch_seconds=batch_seconds, workers=workers)
    if limit is not None and limit < 0:
        raise ConfigError(f"`limit` must be >= 0, got {limit!r}")
    t_start = time.perf_counter()
    out = _Output(output_dir)
    manifest = out.read_json(MANIFEST_NAME) or {}
    parts = out.parts()
    if not parts:
        raise FileNotFoundError(f"{out.uri}: no part-*.parquet files (is it a tokenize output folder?)")
    num_codebooks = (manifest.get("config") or {}).get("num_codebooks")
    if weights is None and config is None and seed is None and manifest:
        w = manifest.get("weights") or {}
        weights, seed = w.get("spec"), int(w.get("seed", 0) or 0)
        if weights is not None and not str(weights).startswith("hf:"):
            config = (manifest.get("config") or {}).get("codec")
    model = _model(weights, config, num_codebooks, seed or 0)
    model.load()  # fail here, once
    wav_root = os.path.abspath(os.fspath(wav_dir))
    os.makedirs(wav_root, exist_ok=True)
    say = (
        (lambda s: print(s, file=sys.stderr, flush=True)) if progress_every is not None else (lambda s: None)
    )
    counts = {"files": 0, "skipped": 0, "failed": 0, "audio_seconds": 0.0}
    started = _init_ray(address)
    try:
        ray = _need("ray")
        ray_data = _need("ray.data")
        ctx = ray_data.DataContext.get_current()
        bars = ctx.enable_progress_bars
        if progress_every is not None:
            ctx.enable_progress_bars = False
        try:
            cpus = float(ray.cluster_resources().get("CPU", 1))
            n_workers = workers or max(1, int(cpus // threads_per_worker))
            # The driver reads the (small) code rows and hands them over in blocks of a few rows:
            # no read tasks, which would wait for the CPUs the decoder actors hold.
            pq = _need("pyarrow.parquet")
            refs, rows = [], 0
            for part in parts:
                t = pq.read_table(part, columns=["path", "codes", "error"], filesystem=out.fs)
                if limit is not None:
                    t = t.slice(0, max(0, limit - rows))
                rows += t.num_rows
                step = max(1, min(16, -(-t.num_rows // (4 * n_workers))))
                refs += [ray.put(t.slice(i, step)) for i in range(0, t.num_rows, step)]
            ds = ray_data.from_arrow_refs(refs)
            ds = ds.map_batches(
                MimiDecoder,
                batch_format="pyarrow",
                batch_size=1,
                fn_constructor_kwargs={
                    "wav_dir": wav_root,
                    "weights": model.weights,
                    "config": model.config,
                    "num_codebooks": model.num_codebooks,
                    "seed": model.seed,
                    "threads": threads_per_worker,
                    "batch_seconds": batch_seconds,
                    "max_inline_seconds": max_inline_seconds,
                },
                **_ray_stage_args(n_workers, threads_per_worker, cpus),
            )
            last = time.perf_counter()
            for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None):
                for wav, dur, err in zip(
                    batch.column("wav").to_pylist(),
                    batch.column("duration_s").to_pylist(),
                    batch.column("error").to_pylist(),
                ):
                    if wav is not None:
                        counts["files"] += 1
                        counts["audio_seconds"] += dur
                    elif err is not None:
                        counts["failed"] += 1
                        say(f"detokenize: {err}")
                    else:
                        counts["skipped"] += 1
                if time.perf_counter() - last >= (progress_every or 0):
                    last = time.perf_counter()
                    say(
                        f"detokenize: {counts['files']} files, {counts['audio_seconds'] / 3600:.3f} h of audio"
                    )
        finally:
            ctx.enable_progress_bars = bars
    finally:
        if started:
            _need("ray").shutdown()
    counts["wall_s"] = round(time.perf_counter() - t_start, 3)
    say(
        f"detokenize: {counts['files']} files ({counts['skipped']} error rows skipped), "
        f"{counts['audio_seconds'] / 3600:.3f} h of audio, {wav_root}"
    )
    return counts
