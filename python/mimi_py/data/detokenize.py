"""The reverse of :func:`~mimi_py.data.tokenize`: the code rows of an output folder back to wav
files, for listening checks (:class:`MimiDecoder` actors on Ray Data)."""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import PurePath
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .._core import CodecConfig
from ..audio import CHUNK_SECONDS, open_writer
from ..errors import ConfigError
from .common import (
    MAX_INLINE_SECONDS,
    batch_column,
    check_positive,
    codes_to_numpy,
    error_text,
    need,
)
from .model import Model, make_model, recorded_precision
from .output import Output, read_manifest
from .runtime import ray_session, ray_stage_args, threads_env

if TYPE_CHECKING:  # pragma: no cover - typing only; an optional dependency
    import pyarrow as pa

__all__ = ["MimiDecoder", "detokenize", "wav_name", "wav_names"]


def wav_name(path: str, keep_extension: bool = False) -> str:
    """The relative file name :func:`detokenize` writes ``path``'s audio to: the path without
    its root (``..`` parts become ``__``), as ``<stem>.wav`` (``a/b.flac`` -> ``a/b.wav``). With
    ``keep_extension`` the source's extension stays in the name (``a/b.flac.wav``): what
    :func:`wav_names` gives inputs that would otherwise share a name."""
    parts = [
        ("__" if p == ".." else p) for p in PurePath(path).parts if p not in (PurePath(path).anchor, ".")
    ]
    name = os.path.join(*parts) if parts else "audio"
    if name.lower().endswith(".wav"):
        return name
    stem, ext = os.path.splitext(name)
    return name + ".wav" if keep_extension or not ext else stem + ".wav"


def wav_names(paths: list[str]) -> dict[str, str]:
    """:func:`wav_name` of every path, with the source extension kept for the paths whose
    ``<stem>.wav`` another path also maps to (``a.wav`` and ``a.flac`` in one folder)."""
    taken: dict[str, int] = {}
    for p in set(paths):
        taken[wav_name(p)] = taken.get(wav_name(p), 0) + 1
    return {p: wav_name(p, keep_extension=taken[wav_name(p)] > 1) for p in paths}


class MimiDecoder:
    """The decoding stage of :func:`detokenize`: a callable class for ``ds.map_batches`` on an
    actor pool that turns :func:`~mimi_py.data.output_schema` rows into wav files (float32, mono,
    at the codec's sample rate) in ``wav_dir`` (a local or shared folder), named by
    :func:`wav_name`.

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
        num_codebooks: int | None = None,
        seed: int = 0,
        weights_dtype: Literal["float32", "bfloat16"] | None = None,
        precision: Literal["highest", "high", "medium"] | None = None,
        threads: int | None = None,
        batch_seconds: float = CHUNK_SECONDS,
        max_inline_seconds: float = MAX_INLINE_SECONDS,
    ) -> None:
        threads_env(threads)
        self.wav_dir = os.fspath(wav_dir)
        self.codec = make_model(weights, config, num_codebooks, seed, weights_dtype, precision).load()
        self._chunk = max(1, round(batch_seconds * self.codec.frame_rate))
        self._inline = max_inline_seconds * self.codec.frame_rate

    def _decode_into(self, f: Any, codes: np.ndarray, samples: int) -> None:
        """Writes the first ``samples`` samples of the audio of ``codes`` to the open sound
        file ``f``: whole, or streamed."""
        if codes.shape[1] <= self._inline:
            f.write(self.codec.decode(codes[None].astype(np.uint32))[0, 0, :samples])
            return
        self.codec.reset_state()
        left = samples
        for s in range(0, codes.shape[1], self._chunk):
            pcm = self.codec.decode_step(codes[None, :, s : s + self._chunk].astype(np.uint32))
            if pcm is not None and left > 0:
                f.write(pcm[0, 0, :left])
                left -= min(left, pcm.shape[-1])
        self.codec.reset_state()

    def write(self, codes: np.ndarray, target: str, duration_s: float | None = None) -> float:
        """Decode (num_codebooks, num_frames) ``codes`` into the wav file ``target``, trimmed to
        ``duration_s`` (the source's duration: the codes of its last frame cover padding);
        returns the written duration in seconds."""
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
        tmp = f"{target}.{uuid.uuid4().hex[:8]}.tmp"
        sr = self.codec.sample_rate
        full = codes.shape[1] * self.codec.frame_size
        samples = full if duration_s is None else min(full, int(round(duration_s * sr)))
        try:
            with open_writer(tmp, sr, subtype="FLOAT", format="WAV") as f:
                self._decode_into(f, codes, samples)
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return samples / sr

    def __call__(self, batch: Any) -> pa.Table:
        """Decode a batch of :func:`~mimi_py.data.output_schema` rows into wav files."""
        pa = need("pyarrow")
        paths = batch_column(batch, "path") or []
        errors = batch_column(batch, "error") or [None] * len(paths)
        source_durs = batch_column(batch, "duration_s") or [None] * len(paths)
        names = batch_column(batch, "wav") or [wav_name(p) for p in paths]
        codes = codes_to_numpy(batch.column("codes") if hasattr(batch, "column") else batch["codes"])
        wavs: list[str | None] = []
        durs: list[float | None] = []
        out_err: list[str | None] = []
        for name, err, c, source_dur in zip(names, errors, codes, source_durs):
            wav = dur = fail = None
            if err is None and c is not None:
                try:
                    wav = os.path.join(self.wav_dir, name)
                    dur = self.write(c, wav, source_dur)
                except Exception as e:
                    fail, wav = error_text(e), None
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


def _recorded_model(
    manifest: Mapping[str, Any],
    weights: str | os.PathLike[str] | None,
    config: CodecConfig | Mapping[str, Any] | None,
    seed: int | None,
) -> Model:
    """The model to decode with: the one ``.MANIFEST.json`` records (weights, config, seed) unless
    any of them is given; always the recorded number of codebooks and precision (see
    ``recorded_precision``)."""
    recorded = manifest.get("config") or {}
    if weights is None and config is None and seed is None and manifest:
        w = manifest.get("weights") or {}
        weights, seed = w.get("spec"), int(w.get("seed", 0) or 0)
        if weights is not None and not str(weights).startswith("hf:"):
            config = recorded.get("codec")
    precision = recorded_precision(recorded)
    return make_model(weights, config, recorded.get("num_codebooks"), seed or 0, precision=precision)


def _code_refs(out: Output, parts: list[str], limit: int | None, n_workers: int) -> list[Any]:
    """The code rows, read by the driver and put in Ray's object store in blocks of a few rows:
    no read tasks, which would wait for the CPUs the decoder actors hold."""
    ray, pq, pa = need("ray"), need("pyarrow.parquet"), need("pyarrow")
    tables, rows = [], 0
    for part in parts:
        t = pq.read_table(part, columns=["path", "duration_s", "codes", "error"], filesystem=out.fs)
        if limit is not None:
            t = t.slice(0, max(0, limit - rows))
        rows += t.num_rows
        tables.append(t)
    names = wav_names([p for t in tables for p in t.column("path").to_pylist()])
    refs = []
    for t in tables:
        t = t.append_column("wav", pa.array([names[p] for p in t.column("path").to_pylist()], pa.string()))
        step = max(1, min(16, -(-t.num_rows // (4 * n_workers))))
        refs += [ray.put(t.slice(i, step)) for i in range(0, t.num_rows, step)]
    return refs


def _tally(batch: pa.Table, counts: dict[str, Any], say: Callable[[str], None]) -> None:
    """Adds a batch of :class:`MimiDecoder` rows to ``counts``; says why a row failed."""
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


def _decode_all(
    out: Output, parts: list[str], decoder: dict[str, Any], run: dict[str, Any], say: Callable[[str], None]
) -> dict[str, Any]:
    """Runs the :class:`MimiDecoder` stage over the code rows (``decoder``: its constructor's
    arguments; ``run``: address, workers, threads_per_worker, limit, progress_every)."""
    counts = {"files": 0, "skipped": 0, "failed": 0, "audio_seconds": 0.0}
    every = run["progress_every"]
    with ray_session(run["address"], quiet_bars=every is not None) as cpus:
        threads = run["threads_per_worker"]
        n_workers = run["workers"] or max(1, int(cpus // threads))
        ds = need("ray.data").from_arrow_refs(_code_refs(out, parts, run["limit"], n_workers))
        ds = ds.map_batches(
            MimiDecoder,
            batch_format="pyarrow",
            batch_size=1,
            fn_constructor_kwargs=dict(decoder, threads=threads),
            **ray_stage_args(n_workers, threads, cpus),
        )
        last = time.perf_counter()
        for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None):
            _tally(batch, counts, say)
            if time.perf_counter() - last >= (every or 0):
                last = time.perf_counter()
                say(f"detokenize: {counts['files']} files, {counts['audio_seconds'] / 3600:.3f} h of audio")
    return counts


def detokenize(
    output_dir: str | os.PathLike[str],
    wav_dir: str | os.PathLike[str],
    *,
    weights: str | os.PathLike[str] | None = None,
    config: CodecConfig | Mapping[str, Any] | None = None,
    seed: int | None = None,
    workers: int | None = None,
    threads_per_worker: int = 1,
    batch_seconds: float = CHUNK_SECONDS,
    max_inline_seconds: float = MAX_INLINE_SECONDS,
    address: str | None = None,
    limit: int | None = None,
    progress_every: float | None = 5.0,
) -> dict[str, Any]:
    """Decode the rows of a :func:`~mimi_py.data.tokenize` output back to wav files in
    ``wav_dir``, for listening checks (names: :func:`wav_name`; error rows are skipped;
    ``limit``: only the first rows, part file by part file).

    ``weights`` defaults to the ones recorded in ``.MANIFEST.json`` (with their config and seed);
    otherwise as in :func:`~mimi_py.data.tokenize`. Runs on Ray like
    :func:`~mimi_py.data.tokenize`, with :class:`MimiDecoder` actors. Returns counts: ``files``
    written, ``skipped`` error rows, ``failed`` rows, ``audio_seconds``.
    """
    check_positive(threads_per_worker=threads_per_worker, batch_seconds=batch_seconds, workers=workers)
    if limit is not None and limit < 0:
        raise ConfigError(f"`limit` must be >= 0, got {limit!r}")
    t_start = time.perf_counter()
    out = Output(output_dir)
    manifest = read_manifest(out) or {}
    parts = out.parts()
    if not parts:
        raise FileNotFoundError(f"{out.uri}: no part-*.parquet files (is it a tokenize output folder?)")
    model = _recorded_model(manifest, weights, config, seed)
    model.load()  # fail here, once
    wav_root = os.path.abspath(os.fspath(wav_dir))
    os.makedirs(wav_root, exist_ok=True)
    say = _say if progress_every is not None else _quiet
    decoder = dict(model._asdict(), wav_dir=wav_root, batch_seconds=batch_seconds)
    decoder["max_inline_seconds"] = max_inline_seconds
    run = dict(address=address, workers=workers, threads_per_worker=threads_per_worker, limit=limit)
    counts = _decode_all(out, parts, decoder, dict(run, progress_every=progress_every), say)
    counts["wall_s"] = round(time.perf_counter() - t_start, 3)
    say(
        f"detokenize: {counts['files']} files ({counts['skipped']} error rows skipped), "
        f"{counts['audio_seconds'] / 3600:.3f} h of audio, {wav_root}"
    )
    return counts


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _quiet(line: str) -> None:
    pass
