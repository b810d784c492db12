"""Mimi weights from the Hugging Face Hub: ``MimiCodec.from_pretrained`` and ``hf:`` specs.

Needs the ``hub`` extra (``pip install 'mimi_py[hub]'``, which is ``huggingface_hub``).
Files are downloaded once into the Hugging Face cache and read from there afterwards; with
``HF_HUB_OFFLINE=1`` nothing is downloaded and only the cache is read. Files are found only
through huggingface_hub's public API (``snapshot_download``, ``scan_cache_dir``), never by
reading the cache's folder layout, and handed on as plain paths. Every failure is a
one-line :class:`~mimi_py.WeightsError` chained to the underlying error.

Two repository layouts are supported:

* Hugging Face (``kyutai/mimi``): ``config.json`` + ``model.safetensors``, the default.
* Kyutai's moshi repositories (``kyutai/moshiko-pytorch-bf16``): one checkpoint file, named
  with ``filename=`` (``tokenizer-e351c8d8-checkpoint125.safetensors``); the config is the
  real Mimi codec's.

On the command line (and in :func:`load_codec`) a checkpoint on the Hub is written
``hf:REPO_ID[@REVISION][:FILENAME]``, e.g. ``hf:kyutai/mimi`` or
``hf:kyutai/moshiko-pytorch-bf16:tokenizer-e351c8d8-checkpoint125.safetensors``.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, NamedTuple

from ._core import MimiCodec
from .errors import WeightsError

__all__ = [
    "DEFAULT_REPO_ID",
    "HF_CONFIG",
    "HF_FILES",
    "HF_WEIGHTS",
    "WeightsSpec",
    "from_pretrained",
    "load_codec",
    "parse_weights_spec",
]

DEFAULT_REPO_ID = "kyutai/mimi"
"""The Hugging Face repository of the Mimi codec."""
HF_CONFIG = "config.json"
"""The config file of a Hugging Face layout repository."""
HF_WEIGHTS = "model.safetensors"
"""The weights file of a Hugging Face layout repository."""
HF_FILES = (HF_WEIGHTS, HF_CONFIG)
"""The files of a Hugging Face layout repository, the weights first."""

_INSTALL = "pip install 'mimi_py[hub]'"
_SPEC = re.compile(
    r"hf:(?P<repo>[A-Za-z0-9][A-Za-z0-9_.-]*(?:/[A-Za-z0-9][A-Za-z0-9_.-]*)?)"
    r"(?:@(?P<revision>[^@:\s]+))?"
    r"(?::(?P<filename>[^:\s]+))?"
)


class WeightsSpec(NamedTuple):
    """The parts of an ``hf:REPO_ID[@REVISION][:FILENAME]`` weights spec."""

    repo_id: str
    revision: str | None = None
    filename: str | None = None


def parse_weights_spec(spec: str) -> WeightsSpec:
    """Split ``hf:REPO_ID[@REVISION][:FILENAME]`` into its parts.

    ``REPO_ID`` is ``NAME`` or ``ORG/NAME``; ``REVISION`` is a branch, tag or commit hash (it
    may contain ``/``, e.g. ``refs/pr/1``); ``FILENAME`` is a path inside the repository.
    Raises :class:`~mimi_py.WeightsError` for anything else.
    """
    m = _SPEC.fullmatch(spec)
    if m is None or ".." in (m["filename"] or "").split("/") or (m["filename"] or "").startswith("/"):
        raise WeightsError(
            f"malformed weights spec {spec!r}: expected hf:REPO_ID[@REVISION][:FILENAME], "
            "e.g. hf:kyutai/mimi or hf:kyutai/mimi@main"
        )
    return WeightsSpec(m["repo"], m["revision"], m["filename"])


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def _hub(repo_id: str):
    """huggingface_hub and whether it is offline, or a WeightsError saying what to install."""
    try:
        import huggingface_hub
        from huggingface_hub import constants
    except ImportError as e:
        raise WeightsError(
            f"loading {repo_id!r} from the Hugging Face Hub needs huggingface_hub: {_INSTALL}"
        ) from e
    # huggingface_hub reads HF_HUB_OFFLINE once, at import; honour it when set later too.
    return huggingface_hub, bool(constants.HF_HUB_OFFLINE) or _env_true("HF_HUB_OFFLINE")


def _cache_dir(cache_dir: str | os.PathLike[str] | None) -> str:
    """The cache folder to use: ``cache_dir``, else huggingface_hub's (read now, not at its import)."""
    from huggingface_hub import constants

    return os.fspath(cache_dir) if cache_dir is not None else constants.HF_HUB_CACHE


def _unavailable(
    repo_id: str,
    revision: str | None,
    names: Sequence[str],
    why: str,
    cache_dir: str | os.PathLike[str] | None,
    hint_files: str,
) -> WeightsError:
    """The one-line error for files that are neither in the cache nor downloadable."""
    cache = _cache_dir(cache_dir)
    args = f"download {repo_id} {hint_files}"
    args += f" --revision {revision}" if revision else ""
    args += f" --cache-dir {cache}" if cache_dir is not None else ""
    return WeightsError(
        f"{repo_id}{'@' + revision if revision else ''}: cannot get {', '.join(names)}: {why}; cache "
        f"{cache}; download it with `hf {args}` (huggingface_hub < 0.34: `huggingface-cli {args}`) "
        "or pass a local path"
    )


def snapshot(
    repo_id: str,
    names: Sequence[str],
    revision: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    hint_files: str | None = None,
) -> Path:
    """The folder of one snapshot (one commit) of ``repo_id`` holding the files ``names``, from
    ``huggingface_hub.snapshot_download`` (downloaded if needed, the cache only when offline).

    ``hint_files`` are the files the error message tells the user to download (default ``names``).
    """
    hf, offline = _hub(repo_id)
    hint = hint_files if hint_files is not None else " ".join(names)
    try:
        folder = hf.snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=_cache_dir(cache_dir),
            allow_patterns=[glob.escape(n) for n in names],  # exact names, not patterns
            local_files_only=offline,
            library_name="mimi_py",
        )
    except Exception as e:  # its errors differ across versions and transports; all mean "not available"
        why = "not in the cache and HF_HUB_OFFLINE is set" if offline else "not in the cache, download failed"
        raise _unavailable(repo_id, revision, names, f"{why} ({type(e).__name__})", cache_dir, hint) from e
    folder = Path(str(folder))
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        why = "not in the cache's snapshot and HF_HUB_OFFLINE is set" if offline else "not in the repository"
        raise _unavailable(repo_id, revision, missing, why, cache_dir, hint)
    return folder


def snapshot_commit(repo_id: str, folder: Path, cache_dir: str | os.PathLike[str] | None = None) -> str:
    """The commit hash of a snapshot folder :func:`snapshot` returned, from
    ``huggingface_hub.scan_cache_dir`` (the cache's own description of its revisions)."""
    hf, _ = _hub(repo_id)
    info = hf.scan_cache_dir(_cache_dir(cache_dir))
    target = folder.resolve()
    for repo in info.repos:
        if repo.repo_id == repo_id and repo.repo_type == "model":
            for rev in repo.revisions:
                if Path(rev.snapshot_path).resolve() == target:
                    return rev.commit_hash
    raise WeightsError(f"{repo_id}: {folder} is not a snapshot of the Hugging Face cache")  # pragma: no cover


def from_pretrained(
    repo_id: str = DEFAULT_REPO_ID,
    *,
    revision: str | None = None,
    filename: str | None = None,
    num_codebooks: int | None = None,
    device: str = "cpu",
    dtype: Literal["float32", "float16", "bfloat16"] = "float32",
    cache_dir: str | os.PathLike[str] | None = None,
    precision: Literal["highest", "high", "medium"] | None = None,
    weights_dtype: Literal["float32", "bfloat16"] | None = None,
) -> MimiCodec:
    """A :class:`~mimi_py.MimiCodec` with weights from the Hugging Face Hub (or its cache).

    Without ``filename``: the Hugging Face layout, ``config.json`` and ``model.safetensors`` of
    ``repo_id`` at ``revision`` (default: the main branch), both from the same commit. With
    ``filename``: that one checkpoint (e.g. Kyutai's moshi-format
    ``tokenizer-e351c8d8-checkpoint125.safetensors``), with the real Mimi codec's config.
    ``cache_dir`` defaults to huggingface_hub's (``HF_HUB_CACHE``, ``HF_HOME``);
    ``HF_HUB_OFFLINE=1`` reads the cache only. The other arguments are
    :class:`~mimi_py.MimiCodec`'s. Raises :class:`~mimi_py.WeightsError` when ``huggingface_hub``
    is missing or the files can be neither downloaded nor found in the cache.
    """
    if filename is not None:
        found = snapshot(repo_id, [filename], revision, cache_dir) / filename
    else:
        found = snapshot(repo_id, HF_FILES, revision, cache_dir, hint_files=f"{HF_CONFIG} {HF_WEIGHTS}")
    return MimiCodec(
        found,
        num_codebooks=num_codebooks,
        device=device,
        dtype=dtype,
        precision=precision,
        weights_dtype=weights_dtype,
    )


def load_codec(
    weights: str | os.PathLike[str] | None,
    *,
    num_codebooks: int | None = None,
    device: str = "cpu",
    dtype: Literal["float32", "float16", "bfloat16"] = "float32",
    precision: Literal["highest", "high", "medium"] | None = None,
    weights_dtype: Literal["float32", "bfloat16"] | None = None,
    seed: int = 0,
) -> MimiCodec:
    """A codec from a ``--weights`` value: ``hf:REPO_ID[@REVISION][:FILENAME]``, a local path
    (file or directory, as :class:`~mimi_py.MimiCodec` takes), or None for seeded random weights
    of the real architecture (``seed``)."""
    if isinstance(weights, str) and weights.startswith("hf:"):
        spec = parse_weights_spec(weights)
        return from_pretrained(
            spec.repo_id,
            revision=spec.revision,
            filename=spec.filename,
            num_codebooks=num_codebooks,
            device=device,
            dtype=dtype,
            precision=precision,
            weights_dtype=weights_dtype,
        )
    return MimiCodec(
        weights,
        num_codebooks=num_codebooks,
        seed=seed,
        device=device,
        dtype=dtype,
        precision=precision,
        weights_dtype=weights_dtype,
    )
