"""The server's page in a real headless Chromium: its fake microphone plays a wav file the test
writes; the page streams it over /encode, draws the codes, sends them over /decode and plays the
decoded audio. The test reads the page's counters over the DevTools protocol. It runs over
plain http, and over https/wss with a token that the page takes from its URL's fragment."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest

from support.browser import chromium, headless, page
from support.extras import optional
from support.servers import health, make_tls, running_server, small_checkpoint

pytestmark = [pytest.mark.extra("serve"), pytest.mark.extra("audio")]
with optional("audio"):
    import soundfile as sf

if chromium() is None:
    # .ci/run installs the browser and sets MIMI_TEST_REQUIRE_BROWSER; elsewhere the test says what is missing.
    if os.environ.get("MIMI_TEST_REQUIRE_BROWSER"):
        pytest.fail("chromium is not installed (apt-get install chromium)", pytrace=False)
    pytest.skip("chromium is not installed (apt-get install chromium)", allow_module_level=True)


TOKEN = "page-token-0123456789"


@pytest.mark.parametrize("secure", [False, True], ids=["http", "https+token"])
def test_the_page_streams_the_microphone_draws_codes_and_plays_the_round_trip(tmp_path, secure):
    t = np.arange(24000 * 3) / 24000
    voice = 0.3 * np.sin(2 * np.pi * 180 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 2 * t))
    sf.write(tmp_path / "voice.wav", voice.astype(np.float32), 24000, subtype="PCM_16")
    ckpt = small_checkpoint(tmp_path / "codec")

    async def drive(port):
        async with page(port, "typeof mimiStart == 'function'") as p:
            await p.eval("mimiStart('mic')", gesture=True)
            for _ in range(100):  # up to 10 s for 2 s of frames through both endpoints
                s = await p.eval("window.mimi")
                if s["error"] or (s["encoded"] >= 25 and s["played"] >= 25 * 1920):
                    break
                await asyncio.sleep(0.1)
            await p.eval("mimiStop()")
            for _ in range(50):
                s = await p.eval("window.mimi")
                if s["done"] is not None:
                    break
                await asyncio.sleep(0.1)
            s["protocol"] = await p.eval("location.protocol")
            return s, await p.eval("document.getElementById('latency').textContent + ' | ' + "
                                   "document.getElementById('bitrate').textContent")  # fmt: skip

    args, tls, fragment = ["--slots", "2", "--weights", str(ckpt)], None, ""
    if secure:
        tls = make_tls(tmp_path / "tls")
        args += ["--certfile", str(tls.certfile), "--keyfile", str(tls.keyfile), "--token", TOKEN]
        fragment = f"#token={TOKEN}"
    with running_server(args, tmp_path / "log") as (url, _):
        assert url.startswith("wss://" if secure else "ws://")
        http = url.replace("ws", "http", 1) + "/" + fragment
        spki = tls.spki if tls else None
        with headless(http, tmp_path / "voice.wav", tmp_path / "profile", spki) as port:
            s, shown = asyncio.run(asyncio.wait_for(drive(port), timeout=60))
        h = health(url, tls.client if tls else None)
    print(f"page: {s['encoded']} frames, latency {shown}")
    assert s["error"] is None, s["error"]
    assert s["encoded"] >= 25 and s["done"] == s["sent"] == s["encoded"], s
    assert len(s["latencies"]) == s["encoded"] and all(0 < x < 10_000 for x in s["latencies"])
    assert s["decoded"] >= 25 * 1920 and s["played"] >= 25 * 1920, "the decoded audio must have played"
    assert "kbit/s (4 codebooks)" in shown and " ms / " in shown
    assert h["frames_served"] >= s["encoded"] + s["decoded"] // 1920  # the frames the page got, both ways
    assert h["refused"] == {}  # both streams passed the Origin and token checks
    assert s["protocol"] == ("https:" if secure else "http:")
