"""The encoding stage: :class:`MimiEncoder` (one codec per Ray actor) and :func:`encode_batches`,
which adds the decoding and encoding stages to a Ray Dataset."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .._core import CodecConfig
from ..audio import CHUNK_SECONDS, AudioReader, encode_blocks
from ..errors import InvalidInputError, MimiError
from .common import (
    MAX_INLINE_SECONDS,
    batch_column,
    check_cardinality,
    codes_column,
    error_text,
    need,
    output_schema,
)
from .model import make_model
from .read import audio_column, read_audio_batch
from .runtime import ray_stage_args, threads_env

if TYPE_CHECKING:  # pragma: no cover - typing only; both are optional dependencies
    import pyarrow as pa
    from ray.data import Dataset

__all__ = ["MimiEncoder", "encode_batches"]


class MimiEncoder:
    """The encoding stage: a callable class for ``ds.map_batches`` on an actor pool.

    ``ds.map_batches(MimiEncoder, fn_constructor_kwargs={"weights": ...},
    compute=ray.data.ActorPoolStrategy(size=N), batch_format="pyarrow")``. Each actor loads one
    :class:`~mimi_py.MimiCodec` (``weights``: a path, ``hf:REPO[@REV][:FILE]`` or None for seeded
    weights; ``config``: a :class:`~mimi_py.CodecConfig` or its dict, for local weights;
    ``num_codebooks``: None for the checkpoint's or config's own number) once.

    Input rows have ``path`` and optionally ``source`` (the path to open), ``audio`` (mono
    float32 at the codec's sample rate, as :func:`read_audio_batch` makes it), ``sample_rate``,
    ``duration_s`` and ``error``. A row with an error is passed through. Output rows follow
    :func:`output_schema`.

    Rows with audio are encoded together: clips of similar length are padded into batches of
    at most ``batch_seconds`` of audio and go through ``MimiCodec.encode(pcm, lengths=...)``
    (:meth:`encode_many`), which gives each clip exactly the codes of ``MimiCodec.encode`` of
    its audio alone. A row without audio (a file longer than
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
        num_codebooks: int | None = None,
        seed: int = 0,
        threads: int | None = None,
        batch_seconds: float = CHUNK_SECONDS,
        weights_dtype: Literal["float32", "bfloat16"] | None = None,
        precision: Literal["highest", "high", "medium"] | None = None,
    ) -> None:
        threads_env(threads)
        self.codec = make_model(weights, config, num_codebooks, seed, weights_dtype, precision).load()
        fs = self.codec.frame_size
        self._chunk = max(1, round(batch_seconds * self.codec.sample_rate / fs)) * fs
        self._batch_seconds = batch_seconds
        check_cardinality(self.codec)

    def encode(self, pcm: np.ndarray) -> np.ndarray:
        """The codes of one file's mono audio at the codec's rate: (num_codebooks, num_frames)
        uint16, from ``MimiCodec.encode``."""
        if len(pcm) == 0:
            raise InvalidInputError("no audio samples")
        return self.codec.encode(np.asarray(pcm, np.float32))[0].astype(np.uint16)

    def encode_blocks(self, blocks: Iterable[np.ndarray]) -> np.ndarray:
        """The codes of one file given as consecutive blocks of mono audio at the codec's rate,
        streamed through ``encode_step`` from a fresh state: (num_codebooks, num_frames) uint16.

        The stream ends with ``encode_step(..., last=True)``, which pads the last partial frame
        as ``MimiCodec.encode`` does, so the codes equal ``encode``'s exactly, with memory
        bounded by the chunk whatever the file's length.
        """
        fs, n = self.codec.frame_size, 0

        def counted() -> Iterable[np.ndarray]:
            nonlocal n
            for block in blocks:
                n += len(block)
                yield block

        codes = encode_blocks(self.codec, counted(), self._chunk)[0]
        if n == 0:
            raise InvalidInputError("no audio samples")
        q = self.codec.num_codebooks
        if codes.shape != (q, -(-n // fs)):  # pragma: no cover - an invariant of encode_step
            raise MimiError(f"internal: {codes.shape} codes for {n} samples")
        return codes.astype(np.uint16)

    def encode_many(self, clips: list[np.ndarray]) -> list[np.ndarray]:
        """The codes of several short clips, batched: groups of clips whose padded batch holds
        at most ``batch_seconds`` of audio go through one ``encode(pcm, lengths=...)`` call,
        which gives each clip exactly its codes alone (and runs the clips of a group in
        parallel). Clips are grouped by length, so little padding is encoded."""
        budget = self._chunk
        order = sorted(range(len(clips)), key=lambda i: len(clips[i]))
        out: list[np.ndarray] = [np.zeros((0, 0), np.uint16)] * len(clips)
        group: list[int] = []
        for i in order + [-1]:
            longest = max([len(clips[j]) for j in group + ([i] if i >= 0 else [])], default=0)
            if group and (i < 0 or longest * (len(group) + 1) > budget):
                width = max(len(clips[j]) for j in group)
                pcm = np.zeros((len(group), 1, width), np.float32)
                for r, j in enumerate(group):
                    pcm[r, 0, : len(clips[j])] = clips[j]
                codes = self.codec.encode(pcm, lengths=[len(clips[j]) for j in group])
                fs = self.codec.frame_size
                for r, j in enumerate(group):
                    out[j] = codes[r, :, : -(-len(clips[j]) // fs)].astype(np.uint16)
                group = []
            if i >= 0:
                group.append(i)
        return out

    def _encode_inline(self, audio: list, errors: list) -> dict[int, np.ndarray]:
        """The codes of every row with its audio in the batch, batched (see
        :meth:`encode_many`); a batch that fails is retried clip by clip, so that one bad clip
        is one error row."""
        rows = [i for i, pcm in enumerate(audio) if pcm is not None and errors[i] is None]
        clips = [np.asarray(audio[i], np.float32) for i in rows]
        for i, c in zip(rows, clips):
            if len(c) == 0:
                errors[i] = error_text(InvalidInputError("no audio samples"))
        keep = [(i, c) for i, c in zip(rows, clips) if len(c) > 0]
        try:
            return dict(zip([i for i, _ in keep], self.encode_many([c for _, c in keep])))
        except Exception:
            done = {}
            for i, c in keep:
                try:
                    done[i] = self.encode(c)
                except Exception as e:  # one bad file is one error row
                    errors[i] = error_text(e)
            return done

    def __call__(self, batch: Any) -> pa.Table:
        """Encode a batch of rows (see the class docstring) into :func:`output_schema` rows."""
        pa = need("pyarrow")
        paths = batch_column(batch, "path") or []
        n = len(paths)
        sources = batch_column(batch, "source") or paths
        errors = batch_column(batch, "error") or [None] * n
        srs = batch_column(batch, "sample_rate") or [None] * n
        durs = batch_column(batch, "duration_s") or [None] * n
        audio = audio_column(batch, n)
        inline = self._encode_inline(audio, errors)
        codes: list[np.ndarray | None] = []
        for i in range(n):
            c = inline.get(i)
            if errors[i] is None and c is None:
                try:
                    if audio[i] is None:
                        with AudioReader(
                            sources[i], self.codec.sample_rate, block_seconds=self._batch_seconds
                        ) as r:
                            srs[i], durs[i] = r.info.sample_rate, r.info.duration_s
                            c = self.encode_blocks(r)
                except Exception as e:  # one bad file is one error row
                    errors[i], c = error_text(e), None
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
                codes_column(codes),
                pa.array(errors, pa.string()),
            ],
            schema=output_schema(),
        )


def encode_batches(
    ds: Dataset,
    *,
    weights: str | os.PathLike[str] | None = None,
    config: CodecConfig | Mapping[str, Any] | None = None,
    num_codebooks: int | None = None,
    seed: int = 0,
    workers: int = 1,
    threads_per_worker: int = 1,
    batch_seconds: float = CHUNK_SECONDS,
    max_inline_seconds: float = MAX_INLINE_SECONDS,
    read_tasks: int | None = None,
    sample_rate: int | None = None,
    weights_dtype: Literal["float32", "bfloat16"] | None = None,
    precision: Literal["highest", "high", "medium"] | None = None,
) -> Dataset:
    """Add the two stages to a Ray Dataset of ``path`` rows; returns a Dataset of
    :func:`output_schema` rows (in no particular order).

    The decoding stage (:func:`read_audio_batch`, one file per call) runs as up to
    ``read_tasks`` tasks (default: one per 8 workers, at least 2) that reserve no CPU: decoding
    costs a few percent of encoding, and the encoder actors may hold every CPU. It resamples to
    ``sample_rate``, the codec's (default: read from the codec, which is loaded once here for
    that). The encoding stage (:class:`MimiEncoder`) runs on ``workers`` actors of
    ``threads_per_worker`` CPUs each, with ``RAYON_NUM_THREADS`` set in their environment (an
    autoscaling pool of 1 to ``workers`` actors if the cluster has fewer CPUs than that). A
    ``source`` column, if present, is the path to open (``path`` is kept as given).
    """
    ray = need("ray")
    ray_data = need("ray.data")
    model = make_model(weights, config, num_codebooks, seed, weights_dtype, precision)
    if sample_rate is None:
        sample_rate = model.load().sample_rate
    tasks = read_tasks if read_tasks is not None else max(2, -(-workers // 8))
    cpus = ray.cluster_resources().get("CPU") if ray.is_initialized() else None
    ds = ds.map_batches(
        read_audio_batch,
        batch_format="pyarrow",
        batch_size=1,  # one file per call: Ray cuts the task's output into bounded blocks
        fn_kwargs={
            "sample_rate": sample_rate,
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
            "weights_dtype": model.weights_dtype,
            "precision": model.precision,
        },
        **ray_stage_args(workers, threads_per_worker, cpus),
    )
