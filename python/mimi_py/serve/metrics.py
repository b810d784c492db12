"""What the server counts, and how operators read it: ``GET /health`` (JSON) and ``GET /metrics``
(Prometheus' text format, written by ``prometheus_client``).

:class:`Stats` is the one place each count lives; both endpoints read it. Each
:class:`~mimi_py.serve.server.Server` has its own ``CollectorRegistry`` (not the process-wide
one), so that several servers in one process do not collide. ``prometheus_client`` is part of
the ``serve`` extra, imported when a server is made.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import Counter, deque

from .protocol import serve_extra

__all__ = ["STEP_BUCKETS", "Stats", "metrics_text"]

log = logging.getLogger("mimi_py.serve")

# Step-time histogram buckets (seconds), around the 80 ms tick and its 70% budget.
STEP_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.056, 0.06, 0.07, 0.08, 0.1, 0.12, 0.16, 0.25, 0.5, 1.0)


def prometheus():
    """prometheus_client, with ``core`` (the collector's metric families): see ``serve_extra``."""
    return serve_extra("prometheus_client", "core")


class Stats:
    """Ticks, late ticks, frames served, step times, close codes sent and refusals, for one server."""

    def __init__(self, registry, window: int = 1000):
        self.ticks = self.late_ticks = self.frames_served = 0
        self.step_ms: deque[float] = deque(maxlen=window)
        self.closed: Counter = Counter()  # close codes sent, by code
        self.refused: Counter = Counter()  # connections turned away, by Refusal
        self.step_seconds = prometheus().Histogram(
            "mimi_serve_step_seconds",
            "Compute time of one tick's steps (encode and decode)",
            buckets=STEP_BUCKETS,
            registry=registry,
        )
        self._late_logged = 0.0

    def step(self, seconds: float) -> None:
        """One step's compute time (encode and decode of one tick)."""
        self.step_ms.append(1000 * seconds)
        self.step_seconds.observe(seconds)

    def late(self, behind: float) -> None:
        """A tick that started late (the previous one overran); logged at most once a second."""
        self.late_ticks += 1
        now = time.monotonic()
        if now - self._late_logged >= 1.0:
            self._late_logged = now
            log.warning(
                "late tick: %.1f ms behind its deadline (%d late so far)", 1000 * behind, self.late_ticks
            )

    def summary(self) -> dict:
        """Step time median and p99 (ms) over the recent window."""
        ms = sorted(self.step_ms)
        pick = (lambda q: round(ms[min(len(ms) - 1, int(q * len(ms)))], 3)) if ms else (lambda q: None)
        return {"median": round(statistics.median(ms), 3) if ms else None, "p99": pick(0.99)}


class ServerCollector:
    """A ``prometheus_client`` collector reading a server's :class:`Stats` and slots at scrape time."""

    def __init__(self, server):
        self.server = server

    def collect(self):
        core = prometheus().core
        s, stats = self.server, self.server.stats
        yield core.GaugeMetricFamily(
            "mimi_serve_slots", "Slots: rows of the batched codec", value=len(s.rows)
        )
        yield core.GaugeMetricFamily("mimi_serve_slots_busy", "Slots held by a stream", value=s.busy())
        yield core.GaugeMetricFamily(
            "mimi_serve_behind", "1 while the ticks run late and new streams get 1013", value=int(s.behind())
        )
        yield core.CounterMetricFamily(
            "mimi_serve_frames_served", "Frames sent to clients", stats.frames_served
        )
        yield core.CounterMetricFamily("mimi_serve_ticks", "Ticks stepped", stats.ticks)
        yield core.CounterMetricFamily("mimi_serve_late_ticks", "Ticks that started late", stats.late_ticks)
        closed = core.CounterMetricFamily("mimi_serve_closed", "Close codes sent, by code", labels=["code"])
        for code, n in sorted(stats.closed.items()):
            closed.add_metric([str(code)], n)
        yield closed
        refused = core.CounterMetricFamily(
            "mimi_serve_refused", "Connections turned away, by reason", labels=["reason"]
        )
        for reason, n in sorted((r.value, n) for r, n in stats.refused.items()):
            refused.add_metric([reason], n)
        yield refused


def metrics_text(registry) -> tuple[bytes, str]:
    """``GET /metrics``: the registry in Prometheus' text format, and its content type."""
    p = prometheus()
    return p.generate_latest(registry), p.CONTENT_TYPE_LATEST
