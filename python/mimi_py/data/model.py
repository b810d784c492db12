"""The model of a job: what every actor needs to build the same codec (:class:`Model`, picklable),
and the weights' identity recorded in ``.MANIFEST.json`` (sha256 of the files, or the Hub
commit, or the seed), with which a resumed job is checked to use the same model."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path, PurePath
from typing import Any, Literal, NamedTuple

from .._core import CodecConfig, MimiCodec, get_float32_matmul_precision
from ..errors import ConfigError
from ..hub import HF_CONFIG, HF_FILES, load_codec, parse_weights_spec, snapshot, snapshot_commit
from ..options import PRECISIONS

__all__: list[str] = []  # all shared inside mimi_py.data only


class Model(NamedTuple):
    """What an actor needs to build its codec; picklable."""

    weights: str | None  # absolute path, pinned hf: spec, or None (seeded)
    config: dict[str, Any] | None
    num_codebooks: int | None  # None: the checkpoint's (or config's) own number
    seed: int
    weights_dtype: Literal["float32", "bfloat16"] | None = None  # "bfloat16": precision "high"
    precision: Literal["highest", "high", "medium"] | None = None  # pinned by the driver

    def load(self) -> MimiCodec:
        if self.config is not None:
            if self.weights is not None and self.weights.startswith("hf:"):
                raise ConfigError("`config` applies to local weights; hf: weights bring their own config")
            return MimiCodec(
                self.weights,
                config=self.config,
                num_codebooks=self.num_codebooks,
                seed=self.seed,
                precision=self.precision,
                weights_dtype=self.weights_dtype,
            )
        return load_codec(
            self.weights,
            num_codebooks=self.num_codebooks,
            seed=self.seed,
            precision=self.precision,
            weights_dtype=self.weights_dtype,
        )


def _config_dict(config: CodecConfig | Mapping[str, Any] | None) -> dict[str, Any] | None:
    if config is None:
        return None
    if isinstance(config, CodecConfig):
        return config.to_dict()
    return CodecConfig(**dict(config)).to_dict()


def make_model(
    weights: str | os.PathLike[str] | None,
    config: CodecConfig | Mapping[str, Any] | None,
    num_codebooks: int | None,
    seed: int,
    weights_dtype: Literal["float32", "bfloat16"] | None = None,
    precision: Literal["highest", "high", "medium"] | None = None,
) -> Model:
    """The model every actor builds. Neither ``weights_dtype`` nor ``precision`` given: the
    driver's :func:`mimi_py.get_float32_matmul_precision`, pinned here (actors are other
    processes)."""
    spec = None
    if weights is not None:
        spec = os.fspath(weights)
        if not spec.startswith("hf:"):
            spec = os.path.abspath(spec)
    if weights_dtype is None and precision is None:
        precision = get_float32_matmul_precision()
    return Model(spec, _config_dict(config), num_codebooks, seed, weights_dtype, precision)


def _sha256(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _pin_hf(model: Model) -> tuple[Model, dict[str, Any]]:
    """``hf:`` weights pinned to the commit the driver sees, so that every node loads the same
    files, and their identity (repo, revision, commit, sha256 of each file)."""
    assert model.weights is not None
    spec = parse_weights_spec(model.weights)
    names = [spec.filename] if spec.filename else list(HF_FILES)
    folder = snapshot(spec.repo_id, names, spec.revision)
    commit = snapshot_commit(spec.repo_id, folder)
    pinned = f"hf:{spec.repo_id}@{commit}" + (f":{spec.filename}" if spec.filename else "")
    ident = {
        "kind": "hf",
        "spec": pinned,
        "repo_id": spec.repo_id,
        "revision": spec.revision,
        "commit": commit,
        "files": {name: _sha256(folder / name) for name in names},
    }
    return model._replace(weights=pinned), ident


def resolve_weights(model: Model) -> tuple[Model, dict[str, Any]]:
    """Pin ``hf:`` weights to the commit the driver sees (so every node loads the same files)
    and describe the weights: file names and sha256, or repo and commit, or the seed."""
    w = model.weights
    if w is None:
        return model, {"kind": "seeded", "spec": None, "seed": model.seed}
    if w.startswith("hf:"):
        return _pin_hf(model)
    p = Path(w)
    if p.is_dir():
        files = {n: _sha256(p / n) for n in HF_FILES if (p / n).is_file()}
        return model, {"kind": "directory", "spec": w, "files": files}
    if p.is_file():
        return model, {"kind": "file", "spec": w, "files": {p.name: _sha256(p)}}
    return model, {"kind": "file", "spec": w, "files": {}}  # the codec load reports it


def _weight_hashes(ident: Mapping[str, Any]) -> list[str]:
    """The sha256 of the weight files (not config.json: the configs are compared as configs)."""
    return sorted(h for name, h in (ident.get("files") or {}).items() if PurePath(name).name != HF_CONFIG)


def same_model(old: Mapping[str, Any], new: Mapping[str, Any]) -> str | None:
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
    oc = dict(oc, precision=recorded_precision(oc))
    for key, default in (("num_codebooks", None), ("precision", "highest"), ("codec", None)):
        if oc.get(key, default) != nc.get(key, default):
            return f"{key} {oc.get(key, default)!r} then {nc.get(key, default)!r}"
    return None


def recorded_precision(config: Mapping[str, Any]) -> Literal["highest", "high", "medium"]:
    """The precision a manifest's ``config`` records; manifests before it was recorded have
    their ``weights_dtype`` (bfloat16: "high"), or neither (float32: "highest")."""
    recorded = config.get("precision")
    if recorded in PRECISIONS:
        return recorded
    if recorded is not None:
        raise ConfigError(f"the manifest records precision {recorded!r}, which this mimi_py does not know")
    return "high" if config.get("weights_dtype") == "bfloat16" else "highest"
