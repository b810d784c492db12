"""The parts of benches/run.py, by concern: child processes (children), the native bench binary
(native), the suites (suites, corpus, efficiency), the targets (targets), machine facts
(machine) and the markdown report (report). The modules import benches/common.py and
benches/worker.py as top-level modules: run.py puts benches/ on sys.path first."""

from __future__ import annotations

import sys
import time


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def ratio(a, b, nd=3):
    try:
        if a is None or b is None or b == 0:
            return None
        return round(a / b, nd)
    except TypeError:
        return None
