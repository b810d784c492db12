"""The real server in a subprocess, for the serve tests: ``mimi-py serve`` on a free port of
127.0.0.1, its address read from its first stdout line (``ws://`` or ``wss://``), stopped with
SIGTERM at the end."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from mimi_py.serve.loadgen import http_url
from support.paths import CODEC_DIR


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


def health(url: str, tls: ssl.SSLContext | None = None) -> dict:
    """GET /health of a server at ws://HOST:PORT (or wss://, trusting `tls`)."""
    with urllib.request.urlopen(http_url(url) + "/health", timeout=10, context=tls) as r:
        return json.load(r)


def http_get(
    url: str, path: str, headers: dict | None = None, tls: ssl.SSLContext | None = None
) -> tuple[int, str, bytes]:
    """(status, content type, body) of GET path, errors included."""
    req = urllib.request.Request(http_url(url) + path, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10, context=tls) as r:
            return r.status, r.headers["Content-Type"], r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read()


@dataclass
class Tls:
    """A self-signed CA's certificate for 127.0.0.1 and localhost (trustme): the server's PEM
    files, a client context that trusts it, and the base64 SHA-256 of its public key (SPKI,
    what Chromium's --ignore-certificate-errors-spki-list takes)."""

    certfile: Path
    keyfile: Path
    client: ssl.SSLContext
    spki: str


def make_tls(folder: Path) -> Tls:
    import trustme
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    folder.mkdir(parents=True, exist_ok=True)
    certfile, keyfile = folder / "cert.pem", folder / "key.pem"
    for i, blob in enumerate(cert.cert_chain_pems):
        blob.write_to_path(str(certfile), append=i > 0)
    cert.private_key_pem.write_to_path(str(keyfile))
    client = ssl.create_default_context()
    ca.configure_trust(client)
    key = x509.load_pem_x509_certificate(cert.cert_chain_pems[0].bytes()).public_key()
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return Tls(certfile, keyfile, client, base64.b64encode(hashlib.sha256(der).digest()).decode())
