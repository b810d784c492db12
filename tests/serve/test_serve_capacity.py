"""Admission that follows capacity, with a codec whose step time the test controls (the real
small codec, each step padded to `per_row` seconds per active row, or slowed down at will; the
slots are measured on a clock the paced codec advances, so that a busy machine does not move them):
``--slots auto``'s measurement picks the slots that fit, the clients beyond them get 1013 at once
while the admitted ones stay real-time and exact; when the ticks keep running late, new clients
get 1013 until the ticker catches up, and the clients already admitted get every frame."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

import mimi_py
from support.extras import optional
from support.servers import TICK, assert_real_time, until

pytestmark = pytest.mark.extra("serve")
with optional("serve"):
    from prometheus_client.parser import text_string_to_metric_families

    from mimi_py.serve import Server, loadgen, run_server
    from mimi_py.serve.capacity import Lateness, calibrate
    from mimi_py.serve.metrics import metrics_text
    from mimi_py.serve.protocol import LATE_WINDOW, MAX_LATE_SECONDS


class Clock:
    """Seconds that pass only when a `Paced` codec steps: what `calibrate` times it with, so
    that its table does not depend on how busy the machine is."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Paced:
    """The real codec; each step lasts `per_row` seconds per active row (at least `floor`): of
    wall time, or of `clock`'s time when one is given."""

    def __init__(self, codec, per_row: float, floor: float = 0.0, clock: Clock | None = None):
        self.codec, self.per_row, self.floor, self.clock = codec, per_row, floor, clock

    def __getattr__(self, name):
        return getattr(self.codec, name)

    def _paced(self, fn, x, active):
        t = time.perf_counter()
        y = fn(x, active=active)
        rows = len(x) if active is None else int(np.count_nonzero(active))
        lasts = max(self.floor, self.per_row * rows)
        if self.clock is not None:
            self.clock.now += lasts
        elif (left := lasts - (time.perf_counter() - t)) > 0:
            time.sleep(left)
        return y

    def encode_step(self, x, active=None):
        return self._paced(self.codec.encode_step, x, active)

    def decode_step(self, x, active=None):
        return self._paced(self.codec.decode_step, x, active)


def noise(frames: int, seed: int) -> np.ndarray:
    return (0.2 * np.random.default_rng(seed).standard_normal(frames * 1920)).astype(np.float32)


async def serving(server: Server, scenario):
    """Runs `server` on a free port of 127.0.0.1 around `scenario(url)`."""
    stop, ports = asyncio.Event(), asyncio.Queue()
    task = asyncio.create_task(run_server(server, "127.0.0.1", 0, stop, ports.put_nowait))
    try:
        return await scenario(f"ws://127.0.0.1:{await ports.get()}")
    finally:
        stop.set()
        await task


def paced_calibration(checkpoint, per_row: float, **kw):
    """`calibrate` of the real codec paced at `per_row` on a `Clock`: the codec really steps,
    and each B's table holds exactly B rows' time."""
    clock = Clock()
    return calibrate(Paced(mimi_py.MimiCodec(checkpoint), per_row, clock=clock), TICK, clock=clock, **kw)


def test_the_measured_slots_are_the_most_whose_steps_fit_in_70_percent_of_a_tick(serve_checkpoint):
    cal = paced_calibration(serve_checkpoint, 0.010, steps=4, warmup=1)  # 56 ms budget: 4 rows fit, 6 do not
    assert cal.slots == 4 and cal.budget_ms == 56.0, cal.line()
    assert [r["batch"] for r in cal.table] == [1, 2, 3, 4, 6]
    assert [r["fits"] for r in cal.table] == [True] * 4 + [False]
    for r in cal.table:  # each B's worst shape (all three take B rows' time) at B rows' time
        assert r["p99_ms"] == pytest.approx(10 * r["batch"]) == r["median_ms"], r
    assert "4 slots" in cal.line() and "B=6 " in cal.line()
    assert paced_calibration(serve_checkpoint, 0.1, steps=2, warmup=0).slots == 1  # none fit


def test_clients_beyond_the_measured_slots_get_1013_and_the_admitted_stay_real_time(
    serve_checkpoint, serve_offline
):
    cal = paced_calibration(serve_checkpoint, 0.010, steps=4, warmup=1)
    server = Server(Paced(mimi_py.MimiCodec(serve_checkpoint), per_row=0.010), cal.slots, calibration=cal)
    audios = [noise(40, i) for i in range(cal.slots + 2)]  # 3.2 s each

    async def scenario(url):
        admitted = [asyncio.create_task(loadgen.encode_stream(url, a)) for a in audios[: cal.slots]]
        await until(lambda: server.busy() == cal.slots, "all slots busy")
        extra = await asyncio.gather(*(loadgen.encode_stream(url, a) for a in audios[cal.slots :]))
        still_streaming = sum(not t.done() for t in admitted)  # the extra ones were turned away at once
        return await asyncio.gather(*admitted), extra, still_streaming

    results, extra, still_streaming = asyncio.run(asyncio.wait_for(serving(server, scenario), timeout=60))
    assert still_streaming == cal.slots == 4
    for r in extra:
        assert r.close_code == 1013 and "all 4 slots are busy" in r.close_reason and not r.frames, r
    for i, r in enumerate(results):
        np.testing.assert_array_equal(r.codes(), serve_offline.encode(audios[i])[0], err_msg=f"client {i}")
        assert r.close_code == 1000 and r.done == 40 and len(r.latencies) == 40
    assert_real_time(results, server.stats.late_ticks)  # steps of half a tick keep up
    assert server.stats.refused[mimi_py.serve.protocol.Refusal.SLOTS] == 2
    assert server.health()["calibration"]["slots"] == 4


def test_while_ticks_run_late_new_clients_get_1013_and_the_admitted_get_every_frame(
    serve_checkpoint, serve_offline
):
    codec = Paced(mimi_py.MimiCodec(serve_checkpoint), per_row=0.005)
    server = Server(codec, 4)
    first, later = noise(75, 1), noise(10, 2)  # 6 s at real time; 0.8 s

    async def scenario(url):
        streaming = asyncio.create_task(loadgen.encode_stream(url, first))
        await until(lambda: server.stats.frames_served >= 1, "served the first client")
        codec.floor = 0.12  # every step now takes 1.5 ticks
        await until(server.behind, "behind")
        turned_away = await loadgen.encode_stream(url, later, realtime=False)
        codec.floor = 0.0
        await until(lambda: not server.behind(), "caught up")
        after = await loadgen.encode_stream(url, later, realtime=False)
        return await streaming, turned_away, after

    kept, turned_away, after = asyncio.run(asyncio.wait_for(serving(server, scenario), timeout=60))
    assert turned_away.close_code == 1013 and "the server is behind" in turned_away.close_reason
    assert not turned_away.frames
    assert kept.close_code == 1000 and kept.done == 75  # never dropped for it
    np.testing.assert_array_equal(kept.codes(), serve_offline.encode(first)[0])
    assert after.close_code == 1000 and after.done == 10
    np.testing.assert_array_equal(after.codes(), serve_offline.encode(later)[0])
    assert server.stats.late_ticks >= MAX_LATE_SECONDS / 0.12
    assert server.stats.refused == {mimi_py.serve.protocol.Refusal.LATE: 1}
    # both endpoints report the server's one count of late ticks
    samples = {
        s.name: s.value
        for f in text_string_to_metric_families(metrics_text(server.registry)[0].decode())
        for s in f.samples
    }
    assert samples["mimi_serve_late_ticks_total"] == server.health()["late_ticks"] == server.stats.late_ticks


def test_lateness_counts_the_wall_time_of_late_ticks_over_the_window():
    lat, t = Lateness(), 100.0
    for _ in range(20):  # 20 late ticks of 0.12 s each
        lat.tick(t, late=True)
        t += 0.12
    assert lat.seconds(t) == pytest.approx(2.4) and lat.behind(t)
    lat.tick(t, late=False)  # a tick on time: caught up, though the window still holds 2.4 s
    assert lat.seconds(t) == pytest.approx(2.4) and not lat.behind(t)
    t += LATE_WINDOW
    assert lat.seconds(t) == pytest.approx(0.0)  # aged out of the window
    lat.tick(t, late=True)
    assert lat.seconds(t + 0.5) == pytest.approx(0.5) and not lat.behind(t + 0.5)
    assert lat.behind(t + MAX_LATE_SECONDS + 0.01)  # one tick running late for over 2 s
    assert not Lateness().behind(0.0)
