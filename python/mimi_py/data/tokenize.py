"""The tokenize job: a folder of audio to Mimi codes in Parquet, on one machine or a Ray cluster.

:func:`tokenize` lists the inputs (:func:`~mimi_py.data.find_audio`), pins and records the model
(``.MANIFEST.json``), runs the two stages of :func:`~mimi_py.data.encode_batches` on Ray Data and
writes the result rows from the driver as part files (:class:`~mimi_py.data.output.PartWriter`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, NamedTuple

from .._core import CodecConfig
from ..audio import CHUNK_SECONDS
from .common import MAX_INLINE_SECONDS, Progress, check_positive, error_text, need, timestamp
from .encode import encode_batches
from .model import Model, make_model, resolve_weights
from .output import Output, PartWriter, manifest_counts, new_manifest, open_output, write_manifest
from .read import find_audio
from .runtime import ray_session

__all__ = ["tokenize"]

_MODULES = ("pyarrow", "pyarrow.parquet", "ray", "ray.data", "soundfile", "soxr")


class _Job(NamedTuple):
    """One run of :func:`tokenize`: its output folder, inputs, what is left, and the records."""

    out: Output
    inputs: list[str]
    todo: list[tuple[str, str]]
    model: Model
    manifest: dict[str, Any]
    run: dict[str, Any]


def _start_job(
    input: str | os.PathLike[str] | Sequence[str],
    output_dir: str | os.PathLike[str],
    model: Model,
    settings: dict[str, Any],
    resume: bool,
) -> _Job:
    """Lists the inputs, pins the model, opens (or resumes) the output folder and records the
    new run in ``.MANIFEST.json``."""
    pairs = find_audio(input)
    inputs = [p for p, _ in pairs]
    out = Output(output_dir)
    model, ident = resolve_weights(model)
    manifest = new_manifest(input, inputs, model, ident, settings)
    done = open_output(out, manifest, resume)
    todo = [(p, s) for p, s in pairs if p not in done]
    run: dict[str, Any] = {"started": timestamp(), "resumed": bool(resume), "skipped": len(pairs) - len(todo)}
    manifest["runs"].append(run)
    manifest["counts"] = manifest_counts(out, inputs)
    write_manifest(out, manifest)
    return _Job(out, inputs, todo, model, manifest, run)


def _run_pipeline(job: _Job, stage: dict[str, Any], address: str | None, writer: PartWriter) -> None:
    """Runs the Ray Data pipeline over ``job.todo`` ((path, source) pairs), handing the result
    rows to ``writer``; starts (and then stops) a local Ray unless one is up or ``address`` is set."""
    with ray_session(address, quiet_bars=writer.progress_every is not None) as cpus:
        ray_data = need("ray.data")
        n_workers = stage["workers"] or max(1, int(cpus // stage["threads_per_worker"]))
        job.run.update(workers=n_workers, ray_cpus=cpus)
        job.manifest["config"]["workers"] = n_workers
        # Blocks of a few files: small enough to spread over the workers, large enough that
        # per-block overhead stays small on million-file corpora.
        blocks = min(len(job.todo), max(8 * n_workers, -(-len(job.todo) // 32)))
        items = [{"path": p, "source": s} for p, s in job.todo]
        ds = encode_batches(
            ray_data.from_items(items, override_num_blocks=blocks), **dict(stage, workers=n_workers)
        )
        for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None):
            writer.add(batch)
        writer.flush()


def _record_interruption(job: _Job, writer: PartWriter, e: BaseException) -> None:
    """Ctrl-C or a Ray failure: keep the rows already computed and say so in ``.MANIFEST.json``."""
    with contextlib.suppress(Exception):
        writer.flush()
        job.run.update(interrupted=timestamp(), why=error_text(e), files=writer.files, parts=writer.parts)
        job.manifest["status"] = "interrupted"
        job.manifest["counts"] = manifest_counts(job.out, job.inputs)
        write_manifest(job.out, job.manifest)


def _finish(job: _Job, writer: PartWriter) -> dict[str, Any]:
    """Records the run and the final counts in ``.MANIFEST.json``; returns it."""
    final = writer.progress()
    writer.say(final.line())
    job.run.update(
        finished=timestamp(),
        files=final.files,
        errors=final.errors,
        audio_hours=round(final.audio_seconds / 3600, 6),
        wall_s=round(final.wall_seconds, 3),
        parts=final.parts,
    )
    manifest = job.manifest
    manifest["counts"] = c = manifest_counts(job.out, job.inputs)
    manifest["status"] = "complete" if c["missing"] == 0 and c["duplicates"] == 0 else "incomplete"
    manifest["updated"] = timestamp()
    write_manifest(job.out, manifest)
    return manifest


def tokenize(
    input: str | os.PathLike[str] | Sequence[str],
    output_dir: str | os.PathLike[str],
    *,
    weights: str | os.PathLike[str] | None = None,
    config: CodecConfig | Mapping[str, Any] | None = None,
    num_codebooks: int | None = None,
    seed: int = 0,
    workers: int | None = None,
    threads_per_worker: int = 1,
    batch_seconds: float = CHUNK_SECONDS,
    address: str | None = None,
    resume: bool = False,
    rows_per_file: int = 4096,
    flush_seconds: float = 60.0,
    max_inline_seconds: float = MAX_INLINE_SECONDS,
    progress_every: float | None = 5.0,
    on_part: Callable[[Progress], None] | None = None,
    weights_dtype: Literal["float32", "bfloat16"] | None = None,
    precision: Literal["highest", "high", "medium"] | None = None,
) -> dict[str, Any]:
    """Tokenize every audio file of ``input`` into Parquet rows in ``output_dir``.

    ``input``: see :func:`find_audio`. ``output_dir``: a local folder or a pyarrow filesystem
    URI (``s3://bucket/codes``); it must hold no part files unless ``resume`` is set, which skips
    the paths that already have a row (the model must be the same: checked against
    ``.MANIFEST.json``). ``weights``: a path (file or folder, as :class:`~mimi_py.MimiCodec`
    takes), ``hf:REPO_ID[@REVISION][:FILENAME]`` (pinned to the commit the driver resolves, so
    every node loads the same files) or None (seeded random weights); ``config``: a
    :class:`~mimi_py.CodecConfig` for local weights without a ``config.json``;
    ``num_codebooks``: None for the checkpoint's (or config's) own number; ``precision`` and
    ``weights_dtype``: how every actor's codec computes (``MimiCodec``'s; neither: the driver's
    ``mimi_py.get_float32_matmul_precision()``; recorded in the manifest, and a resumed job must
    use the same).

    Runs on Ray: an existing connection, else ``address`` / ``RAY_ADDRESS``, else a local
    instance (shut down at the end). ``workers`` encoder actors (default: the cluster's CPUs ÷
    ``threads_per_worker``) each use ``threads_per_worker`` threads and stream files through
    the codec in chunks of ``batch_seconds``. Rows are written by the driver, ``rows_per_file``
    rows or ``flush_seconds`` at most per part file, each file under a temporary name and then
    renamed, so a killed job loses only the rows not yet written. A summary line goes to stderr
    every ``progress_every`` seconds (None: quiet); ``on_part`` is called after each part file.

    Returns the ``.MANIFEST.json`` content: config, weights identity, versions, counts.
    """
    check_positive(
        threads_per_worker=threads_per_worker,
        batch_seconds=batch_seconds,
        workers=workers,
        rows_per_file=rows_per_file,
        flush_seconds=flush_seconds,
        max_inline_seconds=max_inline_seconds,
        num_codebooks=num_codebooks,
    )
    for module in _MODULES:
        need(module)  # before anything is written
    t_start = time.perf_counter()
    settings = {
        "batch_seconds": batch_seconds,
        "threads_per_worker": threads_per_worker,
        "max_inline_seconds": max_inline_seconds,
    }
    model = make_model(weights, config, num_codebooks, seed, weights_dtype, precision)
    job = _start_job(input, output_dir, model, settings, resume)
    writer = PartWriter(
        job.out, len(job.todo), t_start, rows_per_file, flush_seconds, progress_every, on_part
    )
    if job.todo:
        stage = dict(settings, weights=job.model.weights, config=job.model.config, workers=workers)
        stage.update(
            num_codebooks=num_codebooks,
            seed=seed,
            sample_rate=job.manifest["config"]["sample_rate"],
            weights_dtype=job.model.weights_dtype,
            precision=job.model.precision,
        )
        try:
            _run_pipeline(job, stage, address, writer)
        except BaseException as e:  # Ctrl-C, a Ray failure: keep the rows already computed
            _record_interruption(job, writer, e)
            raise
    return _finish(job, writer)
