"""A Hugging Face cache folder laid out as huggingface_hub lays it out, for the offline hub tests
(``MimiCodec.from_pretrained``, ``--weights hf:...``). Needs no huggingface_hub itself."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path


def make_hf_cache(cache, repo_id, snapshots, refs=None) -> Path:
    """Lay out ``repo_id`` in the Hugging Face cache folder ``cache`` as huggingface_hub does.

    ``snapshots`` maps a commit hash (40 hex digits) to ``{name in the repo: source}``, where a
    source is a file to copy or a function that writes the file at the path it is given.
    ``refs`` maps a branch or tag to a commit hash (default: ``main`` -> the first snapshot).
    Each file is stored once as ``blobs/<sha256>``, and ``snapshots/<hash>/<name>`` is a
    relative symlink to it. Returns the repository's folder (``models--ORG--NAME``).
    """
    repo = Path(cache) / ("models--" + repo_id.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for commit, files in snapshots.items():
        for name, src in files.items():
            part = repo / "blobs" / "download.incomplete"
            src(part) if callable(src) else shutil.copyfile(src, part)
            digest = hashlib.sha256()
            with open(part, "rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
            blob = repo / "blobs" / digest.hexdigest()
            os.replace(part, blob)
            link = repo / "snapshots" / commit / name
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob, link.parent))
    for ref, commit in (refs or {"main": next(iter(snapshots))}).items():
        (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)  # no newline, as huggingface_hub writes it
    return repo
