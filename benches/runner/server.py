"""The `server` suite: streams held end to end through `mimi-py serve`, beside the codec-only
figure of the `serving` suite.

For each slot count N, a fresh server (`--slots N`, the bench's thread count; real-size seeded
weights, or the fixtures' small codec with --tiny) takes N real WebSocket clients
(mimi_py.serve.loadgen) streaming at real-time pace, all at once. A frame's latency runs from
the message holding its last sample to its codes. N streams are held when every client got all
its frames (`done` = its frame count) and the p99 latency is at most two frame periods (160 ms).
Client i starts (i + 1/2)/N of a tick after the first, so that the frames' phases against the
server's ticks are spread evenly. The clients run in this process, on the same cores as the server. The clients only encode, so a
tick is one `encode_step` (the serving suite's frame is an encode and a decode step).

Each of these runs once per precision of `--precisions` (`mimi-py serve --precision`).
Then, for each precision, the `auto` run: a server with `--slots auto` (the default) measures
its own slots at start-up; as many real-time clients as it chose stream at once, and two more
come once they are seated. The calibrated slots are held when every admitted client got all its
frames, p99 ≤ 250 ms and the last second's median ≤ the first second's + 30 ms; the two extra
clients must get 1013 at once (no frame). The machine is named beside the result.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import common
from precisions import OLD_WEIGHTS, precision_of

from . import log

HELD_P99_MS = 160.0  # two frame periods
# The auto run's targets (issue 34): p99, and how much the median may grow from the first second to the last.
AUTO_P99_MS, AUTO_GROWTH_MS, AUTO_EXTRA = 250.0, 30.0, 2


def _speech(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 24000)) / 24000
    return (0.3 * np.sin(2 * np.pi * (140 + 30 * seed) * t) + 0.05 * rng.standard_normal(len(t))).astype(
        np.float32
    )


def _small_checkpoint(folder: Path) -> Path:
    import shutil

    shutil.copy(common.CODEC_FIXTURES / "mimi_small_hf_config.json", folder / "config.json")
    shutil.copy(common.CODEC_FIXTURES / "mimi_small.safetensors", folder / "model.safetensors")
    return folder


def _one(slots: int, seconds: float, threads: int, weights: list[str]) -> dict:
    """N = `slots` clients through a fresh server with N slots."""
    from mimi_py.serve import loadgen

    cmd = [sys.executable, "-m", "mimi_py", "serve", "--port", "0", "--slots", str(slots)]
    cmd += ["--threads", str(threads), *weights]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as proc:
        try:
            url = proc.stdout.readline().split()[2]
            audios = [_speech(seconds, i) for i in range(slots)]
            # One warm-up stream, so that the first measured frame is not the first step.
            asyncio.run(loadgen.encode_stream(url, audios[0][:4800], realtime=False))

            async def client(i, a):
                # Phases spread evenly over a tick: a client's frames end anywhere between two ticks.
                await asyncio.sleep((i + 0.5) / slots * 0.080)
                return await loadgen.encode_stream(url, a)

            async def clients():
                return await asyncio.gather(*(client(i, a) for i, a in enumerate(audios)))

            results = asyncio.run(asyncio.wait_for(clients(), timeout=seconds * 4 + 60))
            health = loadgen.json.loads(_get(url + "/health"))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    frames = int(np.ceil(seconds * 12.5))
    lat = [x for r in results for x in r.latencies]
    summary = loadgen.latency_summary(lat)
    per = [r.summary() for r in results]
    complete = all(r.done == frames and r.close_code == 1000 and not r.out_of_order for r in results)
    return {
        "slots": slots,
        "frames_per_client": frames,
        "complete": complete,
        **summary,
        "first_second_median_ms": round(float(np.median([p["first_second_median_ms"] for p in per])), 1),
        "last_second_median_ms": round(float(np.median([p["last_second_median_ms"] for p in per])), 1),
        "late_ticks": health["late_ticks"],
        "step_ms": health["step_ms"],
        "held": bool(complete and summary["p99_ms"] <= HELD_P99_MS),
    }


def _get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url.replace("ws://", "http://"), timeout=10) as r:
        return r.read().decode()


def _auto_clients(url: str, slots: int, seconds: float, chunk: int) -> tuple[list, list]:
    """`slots` real-time clients, phases spread over a tick; once they stream, AUTO_EXTRA more.
    Returns (the admitted clients' results, [(extra result, seconds to its close)])."""
    import time

    from mimi_py.serve import loadgen

    audios = [_speech(seconds, i) for i in range(slots + AUTO_EXTRA)]

    async def client(i):
        await asyncio.sleep((i + 0.5) / slots * 0.080)
        return await loadgen.encode_stream(url, audios[i], chunk=chunk)

    async def extra(i):
        t = time.perf_counter()
        r = await loadgen.encode_stream(url, audios[i], chunk=chunk)
        return r, round(time.perf_counter() - t, 3)

    async def run():
        admitted = [asyncio.create_task(client(i)) for i in range(slots)]
        await asyncio.sleep(0.5)  # every admitted client has connected and streams
        extras = await asyncio.gather(*(extra(slots + i) for i in range(AUTO_EXTRA)))
        return await asyncio.gather(*admitted), extras

    return asyncio.run(asyncio.wait_for(run(), timeout=seconds * 4 + 60))


def _auto(seconds: float, threads: int, weights: list[str], tiny: bool) -> dict:
    """A `--slots auto` server: its measured slots, that many clients, then two more."""
    from mimi_py.serve import loadgen

    cmd = [sys.executable, "-m", "mimi_py", "serve", "--port", "0", "--slots", "auto"]
    cmd += ["--threads", str(threads), *weights]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as proc:
        try:
            url = proc.stdout.readline().split()[2]
            cal = loadgen.json.loads(_get(url + "/health"))["calibration"]
            asyncio.run(loadgen.encode_stream(url, _speech(0.4, 99), realtime=False))  # warm-up
            # Tiny: the fixture codec fits every batch tried; one message per frame keeps the clients light.
            results, extras = _auto_clients(url, cal["slots"], seconds, 1920 if tiny else 480)
            health = loadgen.json.loads(_get(url + "/health"))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    frames = int(np.ceil(seconds * 12.5))
    summary = loadgen.latency_summary([x for r in results for x in r.latencies])
    per = [r.summary() for r in results]
    first = round(float(np.median([p["first_second_median_ms"] for p in per])), 1)
    last = round(float(np.median([p["last_second_median_ms"] for p in per])), 1)
    complete = all(r.done == frames and r.close_code == 1000 and not r.out_of_order for r in results)
    turned_away = all(r.close_code == 1013 and not r.frames for r, _ in extras)
    return {
        "calibrated_slots": cal["slots"],
        "calibration": cal,
        "clients": len(results),
        "frames_per_client": frames,
        "complete": complete,
        **summary,
        "first_second_median_ms": first,
        "last_second_median_ms": last,
        "extra_close_codes": [r.close_code for r, _ in extras],
        "extra_close_s": [t for _, t in extras],
        "extra_turned_away": turned_away,
        "late_ticks": health["late_ticks"],
        "step_ms": health["step_ms"],
        "held": bool(complete and summary["p99_ms"] <= AUTO_P99_MS and last <= first + AUTO_GROWTH_MS),
    }


def _slot_runs(args, weights: list[str], seconds: float, precision: str) -> list[dict]:
    """One precision's runs at each slot count, stopping once one is not held (tiny: all)."""
    runs = []
    for n in [1, 2] if args.tiny else [1, 2, 4, 6, 8, 10, 12]:
        log(f"server: {precision}, {n} slot(s) and client(s), {seconds:g} s, {args.main_threads} threads")
        try:
            r = _one(n, seconds, args.main_threads, [*weights, "--precision", precision])
        except Exception as e:  # a failed run is reported, not hidden
            r = {"slots": n, "error": f"{type(e).__name__}: {e}", "held": False}
        runs.append(dict(r, precision=precision))
        if not r["held"] and not args.tiny:
            break
    return runs


def suite_server(args) -> dict:
    """Streams held through the server at each slot count and precision (see the module
    docstring); the slot counts of a precision stop growing once one is not held."""
    seconds = 1.6 if args.tiny else 6.0  # whole frames
    runs, auto = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        weights = ["--weights", str(_small_checkpoint(Path(tmp)))] if args.tiny else []
        for p in args.precisions:
            runs += _slot_runs(args, weights, seconds, p)
        for p in args.precisions:
            log(f"server: {p}, --slots auto, {seconds:g} s, {args.main_threads} threads")
            try:
                auto[p] = _auto(seconds, args.main_threads, [*weights, "--precision", p], args.tiny)
            except Exception as e:  # a failed run is reported, not hidden
                auto[p] = {"error": f"{type(e).__name__}: {e}", "held": False}
    held = {
        p: max([r["slots"] for r in runs if r.get("held") and r["precision"] == p], default=0)
        for p in args.precisions
    }
    machine = f"{common.cpu_model()}, {common.cpu_count_available()} cores available"
    return {
        "threads": args.main_threads,
        "seconds": seconds,
        "machine": machine,
        "runs": runs,
        "streams_held": held,
        "auto": auto,
    }


def render_server(L: list, s: dict, serving: dict | None) -> None:
    """The server suite's table (appended to L), with the codec-only streams held beside it."""
    L += ["", "### Server: streams held end to end through `mimi-py serve`", ""]
    if s.get("skipped") or not s.get("runs"):
        L.append(f"_skipped: {s.get('skipped')}_")
        return
    L.append(
        f"N real-time WebSocket clients on a server with N slots, {s['seconds']:g} s each, "
        f"{s['threads']} threads; latency = last sample sent → codes received. Held: every frame "
        f"arrived and p99 ≤ {HELD_P99_MS:g} ms."
    )
    L += [
        "",
        "| precision | slots = clients | median ms | p99 ms | first s / last s median ms | late ticks | step median / p99 ms | held |",
    ]
    L.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in s["runs"]:
        if "error" in r:
            L.append(f"| {precision_of(r)} | {r['slots']} | error: {r['error']} | | | | | no |")
            continue
        st = r["step_ms"]
        L.append(
            f"| {precision_of(r)} | {r['slots']} | {r['median_ms']} | {r['p99_ms']} | {r['first_second_median_ms']} / "
            f"{r['last_second_median_ms']} | {r['late_ticks']} | {st['median']} / {st['p99']} | "
            f"{'yes' if r['held'] else 'no'} |"
        )
    codec_only = {
        f"{precision_of(r)}, {r['threads']} threads": r["streams_held"]
        for r in (serving or {}).get("runs", [])
        if r.get("ok")
    }
    through = ", ".join(f"{OLD_WEIGHTS.get(p, p)} {n}" for p, n in s["streams_held"].items())
    beside = ", ".join(f"{k}: {n}" for k, n in codec_only.items())
    L += ["", f"Streams held through the server: {through}."]
    L += [f"The codec alone (serving suite, p99 frame ≤ 80 ms, same run): {beside}." if beside else "", ""]
    _render_auto(L, s)


def _render_auto(L: list, s: dict) -> None:
    """The `--slots auto` runs: the measured slots, that many clients, and two more turned away."""
    if not s.get("auto"):
        return
    L += [
        f"`--slots auto` on {s.get('machine', 'this machine')}, {s['threads']} threads: the server measures "
        f"its slots at start-up (p99 step ≤ 70% of a tick), then takes that many real-time clients "
        f"and {AUTO_EXTRA} more. Held: every frame arrived, p99 ≤ {AUTO_P99_MS:g} ms and the last "
        f"second's median ≤ the first's + {AUTO_GROWTH_MS:g} ms.",
        "",
        "| precision | measured p99 step ms by B | slots = clients | median ms | p99 ms | first s / last s median ms | late ticks | extra clients | held |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key, r in s["auto"].items():
        p = OLD_WEIGHTS.get(key, key)  # an older file keys them by weight type
        if "error" in r:
            L.append(f"| {p} | error: {r['error']} | | | | | | | no |")
            continue
        table = ", ".join(f"{t['batch']}: {t['p99_ms']}" for t in r["calibration"]["table"])
        extra = ", ".join(f"{c} in {t} s" for c, t in zip(r["extra_close_codes"], r["extra_close_s"]))
        L.append(
            f"| {p} | {table} | {r['calibrated_slots']} | {r['median_ms']} | {r['p99_ms']} | "
            f"{r['first_second_median_ms']} / {r['last_second_median_ms']} | {r['late_ticks']} | {extra} | "
            f"{'yes' if r['held'] else 'no'} |"
        )
    L.append("")
