"""The output folder of a job: part files written atomically (:class:`Output`,
:class:`PartWriter`), ``.MANIFEST.json`` (:func:`new_manifest`, :func:`open_output`,
:func:`manifest_counts`) and :func:`read_codes`, which reads the rows back."""

from __future__ import annotations

import datetime as _dt
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .._core import __version__, candle_version
from ..errors import ConfigError
from .common import (
    LEGACY_MANIFEST_NAME,
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    PART_NAME,
    Progress,
    check_cardinality,
    need,
    output_schema,
    timestamp,
)
from .model import Model, same_model

if TYPE_CHECKING:  # pragma: no cover - typing only; an optional dependency
    import pyarrow as pa

__all__ = ["read_codes"]


class Output:
    """OUTPUT_DIR through a pyarrow filesystem (local path, or s3:// gs:// ... URI)."""

    def __init__(self, output_dir: str | os.PathLike[str]) -> None:
        fs_mod = need("pyarrow.fs")
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
        fs_mod = need("pyarrow.fs")
        infos = self.fs.get_file_info(fs_mod.FileSelector(self.base, allow_not_found=True))
        return sorted(i.base_name for i in infos if i.type == fs_mod.FileType.File)

    def parts(self) -> list[str]:
        return [self.path(n) for n in self.listing() if PART_NAME.fullmatch(n)]

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
        pq = need("pyarrow.parquet")
        self._atomic(name, lambda p: pq.write_table(table, p, filesystem=self.fs))

    def write_json(self, name: str, obj: Any) -> None:
        data = (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode()

        def write(p: str) -> None:
            with self.fs.open_output_stream(p) as f:
                f.write(data)

        self._atomic(name, write)

    def read_json(self, name: str) -> dict[str, Any] | None:
        fs_mod = need("pyarrow.fs")
        if self.fs.get_file_info(self.path(name)).type == fs_mod.FileType.NotFound:
            return None
        with self.fs.open_input_stream(self.path(name)) as f:
            return json.loads(f.read().decode())

    def read(self, columns: list[str] | None = None) -> pa.Table:
        pa, pq = need("pyarrow"), need("pyarrow.parquet")
        tables = [pq.read_table(p, columns=columns, filesystem=self.fs) for p in self.parts()]
        if not tables:
            schema = output_schema()
            if columns is not None:
                schema = pa.schema([schema.field(c) for c in columns])
            return schema.empty_table()
        return pa.concat_tables(tables)


def read_codes(output_dir: str | os.PathLike[str], columns: list[str] | None = None) -> pa.Table:
    """All rows :func:`~mimi_py.data.tokenize` wrote to ``output_dir`` (its ``part-*.parquet``
    files) as one pyarrow Table; ``columns`` selects columns. ``ray.data.read_parquet(output_dir)``,
    ``pyarrow.parquet.read_table(output_dir)``, pandas and HF ``datasets`` read the same files
    (they skip the hidden ``.MANIFEST.json``: :data:`~mimi_py.data.common.MANIFEST_NAME`)."""
    return Output(output_dir).read(columns)


def manifest_counts(out: Output, inputs: Sequence[str]) -> dict[str, Any]:
    """The rows in ``out`` against the ``inputs``: for ``.MANIFEST.json``'s ``counts``."""
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


def new_manifest(
    input: Any, inputs: Sequence[str], model: Model, ident: dict[str, Any], settings: dict[str, Any]
) -> dict[str, Any]:
    """A fresh ``.MANIFEST.json`` for a job; loads the model once, so that a bad checkpoint fails
    here rather than in every actor."""
    codec = model.load()
    check_cardinality(codec)
    described = os.fspath(input) if isinstance(input, (str, os.PathLike)) else f"{len(inputs)} paths"
    return {
        "format": MANIFEST_FORMAT,
        "status": "running",
        "updated": timestamp(),
        "config": {
            "input": described,
            "num_codebooks": codec.num_codebooks,
            "sample_rate": codec.sample_rate,
            "frame_rate": codec.frame_rate,
            "frame_size": codec.frame_size,
            "cardinality": codec.cardinality,
            "weights_dtype": codec.weights_dtype,
            "precision": codec.precision,
            **settings,
            "codec": codec.config.to_dict(),
        },
        "weights": ident,
        "mimi_py": {"version": __version__, "candle": candle_version},
        "schema": {f.name: str(f.type) for f in output_schema()},
        "counts": {},
        "runs": [],
    }


def read_manifest(out: Output) -> dict[str, Any] | None:
    """``out``'s manifest, under its name or the one earlier versions wrote (which no Parquet
    reader skips: it is removed once the new one is written)."""
    return out.read_json(MANIFEST_NAME) or out.read_json(LEGACY_MANIFEST_NAME)


def write_manifest(out: Output, manifest: dict[str, Any]) -> None:
    """Writes ``out``'s manifest (atomically), dropping a legacy-named one."""
    out.write_json(MANIFEST_NAME, manifest)
    if out.read_json(LEGACY_MANIFEST_NAME) is not None:
        out.fs.delete_file(out.path(LEGACY_MANIFEST_NAME))


def open_output(out: Output, manifest: dict[str, Any], resume: bool) -> set[str]:
    """Creates ``out`` or checks it can be resumed (same model); returns the paths done."""
    out.mkdir()
    old = read_manifest(out)
    parts = out.parts()
    if parts and not resume:
        raise FileExistsError(
            f"{out.uri}: already holds {len(parts)} part file(s); pass resume=True (--resume) to "
            "finish that job, or choose an empty folder"
        )
    done: set[str] = set()
    if resume:
        if old is not None:
            why = same_model(old, manifest)
            if why:
                raise ConfigError(f"{out.uri} was tokenized with another model, cannot resume: {why}")
            manifest["runs"] = list(old.get("runs", []))
        done = set(out.read(["path"]).column("path").to_pylist())
    out.remove_temporaries()  # half-written files of a killed run
    return done


class PartWriter:
    """Collects result rows and writes them as part files (``rows_per_file`` rows or
    ``flush_seconds`` at most each); counts and reports progress."""

    def __init__(
        self,
        out: Output,
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
        table = need("pyarrow").concat_tables(self.pending)
        self.out.write_table(f"part-{self.run_id}-{self.parts:05d}.parquet", table)
        self.parts += 1
        self.files += table.num_rows
        self.pending, self.pending_rows = [], 0
        if self.on_part is not None:
            self.on_part(self.progress())
