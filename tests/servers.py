"""The real server in a subprocess, for the serve tests: ``mimi-py serve`` on a free port of
127.0.0.1, its address read from its first stdout line (``ws://`` or ``wss://``), stopped with
SIGTERM at the end."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from fixtures import CODEC_DIR


def small_checkpoint(folder: Path) -> Path:
    """The small fixture codec as a checkpoint directory (config.json + model.safetensors)."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(CODEC_DIR / "mimi_small_hf_config.json", folder / "config.json")
    shutil.copy(CODEC_DIR / "mimi_small.safetensors", folder / "model.safetensors")
    return folder


@contextlib.contextmanager
def running_server(args: list[str], log: Path, env: dict | None = None):
    """Yields (ws base url, process); SIGTERM at the end, and the process must exit 0 by itself."""
    cmd = [sys.executable, "-m", "mimi_py", "serve", "--port", "0", *args]
    env = None if env is None else {**os.environ, **env}
    with (
        open(log, "w") as err,
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env) as proc,
    ):
        try:
            line = proc.stdout.readline()
            assert line.startswith(("listening on ws://", "listening on wss://")), line + log.read_text()
            yield line.split()[2], proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            finally:
                proc.kill()


def health(url: str) -> dict:
    """GET /health of a server at ws://HOST:PORT."""
    with urllib.request.urlopen(url.replace("ws://", "http://") + "/health", timeout=10) as r:
        return json.load(r)


def http_get(url: str, path: str) -> tuple[int, str, bytes]:
    """(status, content type, body) of GET path, errors included."""
    try:
        with urllib.request.urlopen(url.replace("ws://", "http://") + path, timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read()
