"""A real headless Chromium (Debian's ``chromium``) driven over the DevTools protocol, for the
page test: start it on a URL with a fake microphone playing a wav file, evaluate JavaScript in
the page, and stop it (the whole process group)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import urllib.request
from pathlib import Path


def chromium() -> str | None:
    """The browser binary, if installed (`.ci/run` installs Debian's chromium)."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


@contextlib.contextmanager
def headless(url: str, fake_audio: Path, profile: Path, trust_spki: str | None = None):
    """Yields the DevTools port of a headless Chromium showing `url`, microphone = `fake_audio`;
    `trust_spki`: the base64 SHA-256 of a public key whose (self-signed) certificates it accepts."""
    trust = [f"--ignore-certificate-errors-spki-list={trust_spki}"] if trust_spki else []
    cmd = [
        chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--remote-debugging-port=0", f"--user-data-dir={profile}",
        "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={fake_audio}", "--autoplay-policy=no-user-gesture-required",
        *trust, url,
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, start_new_session=True
    )
    try:
        for line in proc.stderr:
            if m := re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line):
                break
        else:
            raise RuntimeError(f"chromium exited ({proc.wait()}) without a DevTools port")
        yield int(m.group(1))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        proc.stderr.close()


class Page:
    """One page's DevTools session: ``await page.eval(js)`` returns the value of `js`."""

    def __init__(self, ws):
        self.ws, self.n = ws, 0

    async def call(self, method: str, **params) -> dict:
        self.n += 1
        await self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            reply = json.loads(await self.ws.recv())
            if reply.get("id") == self.n:
                return reply

    async def eval(self, js: str, gesture: bool = False):
        r = await self.call(
            "Runtime.evaluate", expression=js, awaitPromise=True, returnByValue=True, userGesture=gesture
        )
        if "exceptionDetails" in r.get("result", {}) or "error" in r:
            raise RuntimeError(f"{js}: {r}")
        return r["result"]["result"].get("value")


@contextlib.asynccontextmanager
async def page(port: int, ready_js: str):
    """The first page target, once `ready_js` is true in a loaded http(s) document."""
    import websockets

    for _ in range(100):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            targets = [t for t in json.load(r) if t["type"] == "page"]
        if targets:
            break
        await asyncio.sleep(0.1)
    async with websockets.connect(targets[0]["webSocketDebuggerUrl"], max_size=2**24) as ws:
        p = Page(ws)
        for _ in range(100):
            with contextlib.suppress(RuntimeError):
                if await p.eval(
                    f"location.protocol.startsWith('http') && document.readyState == 'complete' && ({ready_js})"
                ):
                    break
            await asyncio.sleep(0.1)
        else:
            raise RuntimeError(f"the page never became ready ({ready_js})")
        yield p
