"""Mimi weights from the Hugging Face Hub: ``MimiCodec.from_pretrained`` and ``hf:`` specs.

Needs the ``hub`` extra (``pip install 'mimi_py[hub]'``, which is ``huggingface_hub``).
Files are downloaded once into the Hugging Face cache and read from there afterwards; with
``HF_HUB_OFFLINE=1`` nothing is downloaded and only the cache is read. Every failure is a
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

import os
import re
from pathlib import Path
from typing import Literal, NamedTuple

from ._core import MimiCodec
from .errors import WeightsError

__all__ = [
    "DEFAULT_REPO_ID",
    "HF_CONFIG",
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


def _download(
    repo_id: str,
    filename: str,
    revision: str | None,
    cache_dir: str | os.PathLike[str] | None,
    files: str,
) -> Path:
    """Path of ``filename`` of ``repo_id`` in the Hugging Face cache, downloaded if needed.

    ``files`` are the files the error message tells the user to download.
    """
    try:
        import huggingface_hub
        from huggingface_hub import constants
    except ImportError as e:
        raise WeightsError(
            f"loading {repo_id!r} from the Hugging Face Hub needs huggingface_hub: {_INSTALL}"
        ) from e
    # huggingface_hub reads HF_HUB_OFFLINE once, at import; honour it when set later too.
    offline = bool(constants.HF_HUB_OFFLINE) or _env_true("HF_HUB_OFFLINE")
    try:
        path = huggingface_hub.hf_hub_download(
            repo_id,
            filename,
            revision=revision,
            cache_dir=None if cache_dir is None else os.fspath(cache_dir),
            local_files_only=offline,
            library_name="mimi_py",
        )
    except Exception as e:  # its errors differ across versions and transports; all mean "not available"
        cache = cache_dir if cache_dir is not None else constants.HF_HUB_CACHE
        args = f"download {repo_id} {files}"
        args += f" --revision {revision}" if revision else ""
        args += f" --cache-dir {cache}" if cache_dir is not None else ""
        why = "not in the cache and HF_HUB_OFFLINE is set" if offline else "not in the cache, download failed"
        raise WeightsError(
            f"{repo_id}{'@' + revision if revision else ''}: cannot get {filename}: {why} "
            f"({type(e).__name__}; cache {cache}); download it with `hf {args}` "
            f"(huggingface_hub < 0.34: `huggingface-cli {args}`) or pass a local path"
        ) from e
    return Path(str(path))


def from_pretrained(
    repo_id: str = DEFAULT_REPO_ID,
    *,
    revision: str | None = None,
    filename: str | None = None,
    num_codebooks: int | None = None,
    device: str = "cpu",
    dtype: Literal["float32"] = "float32",
    cache_dir: str | os.PathLike[str] | None = None,
) -> MimiCodec:
    """A :class:`~mimi_py.MimiCodec` with weights from the Hugging Face Hub (or its cache).

    Without ``filename``: the Hugging Face layout, ``config.json`` and ``model.safetensors`` of
    ``repo_id`` at ``revision`` (default: the main branch). With ``filename``: that one checkpoint
    (e.g. Kyutai's moshi-format ``tokenizer-e351c8d8-checkpoint125.safetensors``), with the real
    Mimi codec's config. ``cache_dir`` defaults to huggingface_hub's (``HF_HUB_CACHE``,
    ``HF_HOME``); ``HF_HUB_OFFLINE=1`` reads the cache only. The other arguments are
    :class:`~mimi_py.MimiCodec`'s. Raises :class:`~mimi_py.WeightsError` when ``huggingface_hub``
    is missing or the files can be neither downloaded nor found in the cache.
    """
    if filename is not None:
        path = _download(repo_id, filename, revision, cache_dir, filename)
        return MimiCodec(path, num_codebooks=num_codebooks, device=device, dtype=dtype)
    files = f"{HF_CONFIG} {HF_WEIGHTS}"
    weights = _download(repo_id, HF_WEIGHTS, revision, cache_dir, files)
    # Pin the config to the snapshot (commit) the weights came from.
    config = _download(repo_id, HF_CONFIG, weights.parent.name, cache_dir, files)
    if config.parent != weights.parent:  # pragma: no cover - a cache not laid out by huggingface_hub
        raise WeightsError(f"{repo_id}: {HF_CONFIG} and {HF_WEIGHTS} are not in one snapshot folder")
    return MimiCodec(weights.parent, num_codebooks=num_codebooks, device=device, dtype=dtype)


def load_codec(
    weights: str | os.PathLike[str] | None,
    *,
    num_codebooks: int | None = None,
    device: str = "cpu",
    dtype: Literal["float32"] = "float32",
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
        )
    return MimiCodec(weights, num_codebooks=num_codebooks, seed=seed, device=device, dtype=dtype)
