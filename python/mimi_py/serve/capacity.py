"""How many streams the server takes: the slots measured at start-up (``--slots auto``), and
the run-time check that turns new clients away while the ticks run late.

:func:`calibrate` times batched steps of the loaded codec at growing batch sizes B. A tick with
B busy slots is one of three shapes: B encode rows, B decode rows, or half of each (a masked
encode step, then a masked decode step); B fits when the p99 of each shape is at most
:data:`BUDGET` of a tick. The server takes the largest B that fits (1 if none does, with a
warning). :class:`Lateness` keeps the late ticks of the last few seconds: new streams are
turned away while they add up to more than ``MAX_LATE_SECONDS`` and the ticker is still behind.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import asdict, dataclass, field

import numpy as np

from .protocol import LATE_WINDOW, MAX_LATE_SECONDS

__all__ = ["AUTO_BATCHES", "BUDGET", "Calibration", "Lateness", "calibrate"]

log = logging.getLogger("mimi_py.serve")

# The batch sizes tried, in order, until one does not fit; the largest is the most slots auto picks.
AUTO_BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
# A tick's steps must take at most this share of a tick (p99): the rest absorbs jitter.
BUDGET = 0.7
# Timed steps of each shape per batch size, after WARMUP untimed ones.
STEPS, WARMUP = 12, 2


@dataclass
class Calibration:
    """The measured table (one row per batch size tried) and the slots chosen."""

    slots: int
    budget_ms: float
    seconds: float
    table: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        """The start-up log line: each B's p99 step and the choice."""
        rows = ", ".join(f"B={r['batch']} {r['p99_ms']:.1f}" for r in self.table)
        return (
            f"slots auto: p99 step ms {rows} (budget {self.budget_ms:.1f} ms); "
            f"{self.slots} slots, measured in {self.seconds:.1f} s"
        )


def _shape_times(codec, b: int, shape: str, steps: int, warmup: int, rng, clock) -> list[float]:
    """Seconds of `steps` ticks of one shape at batch size b (after `warmup` untimed ones)."""
    enc = np.zeros(b, bool)
    if shape == "encode":
        enc[:] = True
    elif shape == "mixed":
        enc[: (b + 1) // 2] = True
    dec = ~enc
    times = []
    for i in range(warmup + steps):
        pcm = (0.1 * rng.standard_normal((b, 1, codec.frame_size))).astype(np.float32)
        codes = rng.integers(0, codec.cardinality, (b, codec.num_codebooks, 1), dtype=np.uint32)
        t = clock()
        if enc.any():
            codec.encode_step(pcm, active=enc)
        if dec.any():
            codec.decode_step(codes, active=dec)
        if i >= warmup:
            times.append(clock() - t)
    return times


def calibrate(
    codec,
    tick: float,
    batches=AUTO_BATCHES,
    steps: int = STEPS,
    warmup: int = WARMUP,
    budget: float = BUDGET,
    clock=time.perf_counter,
) -> Calibration:
    """Times the tick's three shapes at each B of `batches` until one does not fit; the codec's
    streams are reset before each B and at the end. `clock` gives the seconds (tests pass a
    clock that their codec advances)."""
    t0, rng = clock(), np.random.default_rng(0)
    limit_ms = 1000 * budget * tick
    table = []
    for b in batches:
        p99s, medians = {}, {}
        for shape in ("encode", "decode", "mixed"):
            codec.reset_state()
            ms = 1000 * np.asarray(_shape_times(codec, b, shape, steps, warmup, rng, clock))
            p99s[shape], medians[shape] = float(np.quantile(ms, 0.99)), float(np.median(ms))
        worst = max(p99s, key=p99s.__getitem__)
        row = {"batch": b, "p99_ms": round(p99s[worst], 2), "median_ms": round(medians[worst], 2)}
        table.append(dict(row, shape=worst, fits=p99s[worst] <= limit_ms))
        if not table[-1]["fits"]:
            break
    codec.reset_state()
    fits = [r["batch"] for r in table if r["fits"]]
    if not fits:
        log.warning("slots auto: even one stream's step is over %.1f ms: real time is out of reach", limit_ms)
    return Calibration(max(fits, default=1), round(limit_ms, 2), round(clock() - t0, 2), table)


class Lateness:
    """The spans of wall time the ticker spent on late ticks, over the last `window` seconds."""

    def __init__(self, window: float = LATE_WINDOW, limit: float = MAX_LATE_SECONDS):
        self.window, self.limit = window, limit
        self.spans: deque[tuple[float, float]] = deque()  # (start, end) of each late tick
        self.current: float | None = None  # the running tick's start, if it started late

    def tick(self, now: float, late: bool) -> None:
        """A tick starts at `now` (monotonic seconds); `late` if it started after its due time."""
        if self.current is not None:
            self.spans.append((self.current, now))
        self.current = now if late else None
        while self.spans and self.spans[0][1] < now - self.window:
            self.spans.popleft()

    def seconds(self, now: float) -> float:
        """Seconds of the last `window` spent on late ticks (the running one included)."""
        lo = now - self.window
        s = sum(max(0.0, e - max(b, lo)) for b, e in self.spans)
        return s + (now - max(self.current, lo) if self.current is not None else 0.0)

    def behind(self, now: float) -> bool:
        """More than `limit` seconds of the window ran late, and the ticker has not caught up
        (its latest tick started late)."""
        return self.current is not None and self.seconds(now) > self.limit
