"""What every suite shares: statistics, memory and machine facts, test signals, and random
weights of the real Mimi architecture in Kyutai's moshi checkpoint layout (the tests build
the same weights through this file: tests/support/real_size.py).

Pure Python + numpy: the worker processes import this before any engine, so nothing here may
start a thread pool.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from pathlib import Path

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
# The repository's one safetensors writer and reader, shared with the tests.
if str(REPO / "scripts") not in sys.path:
    sys.path.insert(0, str(REPO / "scripts"))
from safetensors_file import read_shapes, write_safetensors  # noqa: E402

# The test suite's copy of the reference data (tests/data/README.md): manifests and the small codec.
CODEC_FIXTURES = REPO / "tests" / "data" / "codec"
MOSHI_MANIFEST = CODEC_FIXTURES / "kyutai_moshi_mimi_manifest.json"
SMALL_MOSHI_FILE = CODEC_FIXTURES / "mimi_small_moshi.safetensors"
SMALL_HF_CONFIG = CODEC_FIXTURES / "mimi_small_hf_config.json"
# Generated weight files; MIMI_BENCH_CACHE moves them (the smoke test uses a temp folder).
CACHE_DIR = Path(os.environ.get("MIMI_BENCH_CACHE", BENCH_DIR / ".cache"))

SAMPLE_RATE = 24_000
FRAME_SIZE = 1920  # 80 ms at 24 kHz, one Mimi frame

# Bump when the weight recipe below changes, so cached files are regenerated.
WEIGHTS_RECIPE = "v1: N(0,1/fan_in) weights, zero biases, unit norms, layer scale 0.01, N(0,1) codebooks"


def percentile(values, q: float) -> float:
    """Nearest-rank percentile, the native bench's rule: sorted[floor(n*q)]."""
    v = sorted(values)
    return float(v[min(int(len(v) * q), len(v) - 1)]) if v else float("nan")


def median(values) -> float:
    return percentile(values, 0.5)


def summary_us(values_s) -> dict:
    """median / p99 / mean / min / max in microseconds of durations in seconds."""
    us = [x * 1e6 for x in values_s] or [float("nan")]
    out = {"n": len(values_s), "median_us": median(us), "p99_us": percentile(us, 0.99)}
    out.update(mean_us=sum(us) / len(us), min_us=min(us), max_us=max(us))
    return {k: round(v, 1) if k != "n" else v for k, v in out.items()}


def _proc_status_bytes(field: str) -> int | None:
    """A `/proc/self/status` line in bytes (VmRSS, VmHWM), or None off Linux."""
    try:
        with open("/proc/self/status") as f:
            return next(int(x.split()[1]) * 1024 for x in f if x.startswith(field))
    except (OSError, StopIteration):
        return None


def rss_now_bytes() -> int | None:
    return _proc_status_bytes("VmRSS:")


def rss_peak_bytes() -> int | None:
    """Peak resident set size of this process (VmHWM)."""
    return _proc_status_bytes("VmHWM:")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(x.split(":", 1)[1].strip() for x in f if x.lower().startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def cpu_count_available() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        return os.cpu_count() or 1


def smooth_noise(num_samples: int, seed: int = 0) -> np.ndarray:
    """A smooth random signal: white noise low-passed at ~1 kHz (2nd order, in the frequency
    domain) plus a 100 Hz sine, scaled to an RMS of 0.1. float32, shape (num_samples,)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(num_samples)
    f = np.fft.rfftfreq(num_samples, 1.0 / SAMPLE_RATE)
    y = np.fft.irfft(np.fft.rfft(w) / (1.0 + (f / 1000.0) ** 2), n=num_samples)
    t = np.arange(num_samples) / SAMPLE_RATE
    y = y / (y.std() + 1e-12) + 0.5 * np.sin(2 * np.pi * 100.0 * t)
    y = 0.1 * y / (y.std() + 1e-12)
    return y.astype(np.float32)


def manifest_shapes(manifest_path) -> dict[str, list[int]]:
    """{name: shape} of a fixtures manifest (`tensors: {name: {shape, dtype}}`)."""
    m = json.loads(Path(manifest_path).read_text())
    out = {}
    for name, spec in m["tensors"].items():
        shape = spec["shape"] if isinstance(spec, dict) else spec
        out[name] = [int(d) for d in shape]
    if "num_tensors" in m and len(out) != m["num_tensors"]:
        raise ValueError(f"{manifest_path}: {len(out)} tensors listed, num_tensors={m['num_tensors']}")
    return out


def random_tensor(name: str, shape: list[int], rng: np.random.Generator) -> np.ndarray:
    """One random tensor of the moshi layout, with values that keep every stage O(1)."""
    n = int(np.prod(shape)) if shape else 1
    if name.endswith("cluster_usage") or name.endswith("_initialized"):
        return np.ones(shape, np.float32)
    if name.endswith(".bias"):
        return np.zeros(shape, np.float32)
    if ".norm1." in name or ".norm2." in name:  # layer norm weights (biases handled above)
        return np.ones(shape, np.float32)
    if "layer_scale" in name:
        return np.full(shape, 0.01, np.float32)
    if name.endswith("embedding_sum"):
        return rng.standard_normal(n, dtype=np.float32).reshape(shape)
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    x = rng.standard_normal(n, dtype=np.float32).reshape(shape)
    x *= np.float32(1.0 / np.sqrt(max(fan_in, 1)))
    return x


def random_weights_file(shapes: dict[str, list[int]], tag: str, seed: int = 0) -> Path:
    """Write (once; cached under benches/.cache) a safetensors file with random values for every
    tensor of `shapes`, and return its path."""
    key = json.dumps([WEIGHTS_RECIPE, seed, sorted(shapes.items())])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    path = CACHE_DIR / f"{tag}-{digest}.safetensors"
    if path.exists():
        return path
    rng = np.random.default_rng(seed)
    tensors = {name: random_tensor(name, shapes[name], rng) for name in sorted(shapes)}
    write_safetensors(path, tensors)
    return path


def bench_weights(small: bool) -> dict:
    """The weights every codec engine loads, as the results record them: random, in the moshi
    checkpoint layout, of the fixtures' small codec (tiny sizes) or the real Mimi (32 codebooks
    stored, 8 used)."""
    if small:
        path = random_weights_file(read_shapes(SMALL_MOSHI_FILE), "mimi-small-moshi-random")
        w = {
            "hf_config": str(SMALL_HF_CONFIG),
            "num_codebooks": 4,
            "architecture": "the fixtures' small Mimi codec",
        }
    else:
        path = random_weights_file(manifest_shapes(MOSHI_MANIFEST), "mimi-moshi-random")
        w = {
            "hf_config": None,
            "num_codebooks": 8,
            "architecture": "real Mimi (kyutai_moshi_mimi_manifest.json)",
        }
    return dict(w, path=str(path), recipe=WEIGHTS_RECIPE)
