"""Peak memory: a fresh process loads the codec, encodes a clip and decodes its codes; its peak
resident set (VmHWM), and mimi_py also with seeded weights (no file mapped)."""

from __future__ import annotations

import common
from suites import engine_jobs
from suites.offline import clip

PEERS = ("rustymimi", "moshi", "transformers")
SIZES = {"tiny": {"seconds": 0.2}, "full": {"seconds": 10.0}}
COLUMNS = "engine=label | peak RSS MB=peak_rss_mb | after import MB=import_rss_mb | after load MB=load_rss_mb"


def jobs(ctx, sizes):
    out, skipped = engine_jobs(ctx, PEERS, [dict(sizes, kind="rss")], per_precision=False)
    seeded = dict(out[0], label="mimi_py (seeded weights)", seeded=True) if out else None
    return out[:1] + ([seeded] if seeded and not ctx.tiny else []) + out[1:], skipped


def measure(w, task) -> dict:
    mb = 1e6
    before = common.rss_now_bytes()
    eng = w.engine()
    loaded = common.rss_now_bytes()
    eng.decode(eng.encode(clip(task["seconds"])))
    return {
        "peak_rss_mb": round(common.rss_peak_bytes() / mb, 1),
        "import_rss_mb": round(before / mb, 1),
        "load_rss_mb": round(loaded / mb, 1),
    }
